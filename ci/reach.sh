#!/usr/bin/env bash
# What the main job reaches of the production crates (core, wire, engine, embed), and what
# the fuzz targets' checked-in seeds reach beyond it: source-based coverage (LLVM's
# `-C instrument-coverage`) of one run of each, then the functions of each crate that the
# main job never ran, each with whether the fuzz seeds run it. Writes OUT/reach.md and the
# raw reports beside it. `reports/reach.md` is this script's output, committed.
#
#   ci/reach.sh [OUT]        (default OUT: target/reach)
#
# Needs llvm-profdata and llvm-cov of LLVM 19 or later: from rustup's llvm-tools
# (`rustup component add llvm-tools`) or a distribution's package (Debian: llvm-19); set
# LLVM_BIN to their directory when they are not found. Takes an instrumented build (a few
# minutes) and a main job about twice as slow as the plain one.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-target/reach}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
TARGET=${REACH_TARGET_DIR:-target/coverage}

find_llvm() {
    if [[ -n "${LLVM_BIN:-}" ]]; then echo "$LLVM_BIN"; return; fi
    local sysroot
    sysroot=$(rustc --print sysroot)
    for dir in "$sysroot"/lib/rustlib/*/bin /usr/lib/llvm-2[0-9]/bin /usr/lib/llvm-19/bin; do
        if [[ -x "$dir/llvm-profdata" && -x "$dir/llvm-cov" ]]; then echo "$dir"; return; fi
    done
    echo "ci/reach.sh: no llvm-profdata and llvm-cov found; install rustup's llvm-tools or LLVM 19+, or set LLVM_BIN" >&2
    exit 2
}
LLVM=$(find_llvm)

rm -rf "$OUT"
mkdir -p "$OUT/profiles/sweep" "$OUT/profiles/fuzz"
# The madsim cfg the workspace's .cargo/config.toml sets is replaced by RUSTFLAGS: keep it.
export RUSTFLAGS="--cfg madsim -C instrument-coverage"
export CARGO_TARGET_DIR="$TARGET"

# Build scripts and proc macros are instrumented too: their profiles go here, unread.
export LLVM_PROFILE_FILE="$OUT/profiles/build/%p-%m.profraw"
echo "reach: building the instrumented palisade binary and fuzz-corpus test" >&2
cargo build --release --locked -q -p palisade-sim --bin palisade
fuzz_test=$(cargo test --release --locked -q -p palisade-fuzz-entry --test corpus --no-run \
    --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "corpus":
        print(m["executable"])')

echo "reach: the main job" >&2
LLVM_PROFILE_FILE="$OUT/profiles/sweep/%p-%m.profraw" \
    "$TARGET/release/palisade" sweep --report-dir "$OUT/sweep-reports" >&2
echo "reach: the fuzz targets' checked-in seeds (no mutant on)" >&2
LLVM_PROFILE_FILE="$OUT/profiles/fuzz/%p-%m.profraw" \
    "$fuzz_test" --exact every_corpus_file_passes_its_target >&2

"$LLVM/llvm-profdata" merge -sparse "$OUT"/profiles/sweep/*.profraw -o "$OUT/sweep.profdata"
"$LLVM/llvm-profdata" merge -sparse "$OUT"/profiles/fuzz/*.profraw -o "$OUT/fuzz.profdata"

sources=(core/src wire/src engine/src embed/src)
"$LLVM/llvm-cov" report "$TARGET/release/palisade" -instr-profile="$OUT/sweep.profdata" \
    "${sources[@]}" > "$OUT/sweep-files.txt"
"$LLVM/llvm-cov" export -format=text -skip-expansions "$TARGET/release/palisade" \
    -instr-profile="$OUT/sweep.profdata" "${sources[@]}" > "$OUT/sweep.json"
"$LLVM/llvm-cov" export -format=text -skip-expansions "$fuzz_test" \
    -instr-profile="$OUT/fuzz.profdata" core/src > "$OUT/fuzz.json"
python3 ci/reach.py "$OUT/sweep.json" "$OUT/fuzz.json" "$(git describe --always --dirty)" > "$OUT/reach.md"
echo "reach: $OUT/reach.md" >&2
