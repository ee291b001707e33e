#!/usr/bin/env bash
# Runs cargo-fuzz targets of palisade-core for a time budget.
#
#   fuzz/run.sh TARGET SECONDS [MUTANT]   one target (callback_orderings, classify,
#                                         snapshot_restore, delivery)
#   fuzz/run.sh all SECONDS               every target, FUZZ_JOBS (default 2) at a time
#
# Without a mutant: fuzzes the real core from fuzz/corpus/TARGET (new inputs are kept
# there; .gitignore keeps them out of git unless renamed seed-*), writes crashes to
# fuzz/artifacts/TARGET/, and exits 1 on any crash, timeout (an input running longer
# than 10 s: a loop) or out-of-memory (2 GiB: growth past a bound).
#
# With a mutant (a name from palisade_core::mutants::Mutant, e.g. toctou-generation):
# measures how long the fuzzer needs to find it. Starts from the checked-in seeds (set
# FUZZ_SEEDS=none to start from an empty corpus), keeps its corpus and artifacts in a
# temporary folder, and exits 0 when the mutant was caught, 1 when it survived.
#
# Every run ends with one line:
#   fuzz: TARGET [MUTANT] (crash|clean|caught|survived) after S s, N execs, R execs/s
#
# Needs `cargo +nightly` and cargo-fuzz (`cargo install cargo-fuzz --locked`).
set -euo pipefail
cd "$(dirname "$0")"
# The binaries are looked up under fuzz/target, where cargo-fuzz builds by default.
unset CARGO_TARGET_DIR

TARGETS=(callback_orderings classify snapshot_restore delivery)

usage() {
    echo "usage: fuzz/run.sh TARGET|all SECONDS [MUTANT]" >&2
    echo "targets: ${TARGETS[*]}" >&2
    exit 2
}

[[ $# -ge 2 && $# -le 3 ]] || usage
target=$1
seconds=$2
mutant=${3:-}
[[ $seconds =~ ^[0-9]+$ ]] || usage
if [[ $target != all ]]; then
    known=0
    for t in "${TARGETS[@]}"; do [[ $t == "$target" ]] && known=1; done
    [[ $known == 1 ]] || usage
fi
[[ $target != all || -z $mutant ]] || usage

# Release with debug assertions and overflow checks; no sanitizer: the core forbids
# unsafe code, and without ASan the harness runs about twice as fast.
build_flags=(-O -a -s none)
host=$(rustc +nightly -vV | sed -n 's/^host: //p')
bin_dir=target/$host/release
mkdir -p logs

if [[ $target == all ]]; then
    cargo +nightly fuzz build "${build_flags[@]}"
else
    cargo +nightly fuzz build "${build_flags[@]}" "$target"
fi

# run_one TARGET SECONDS [MUTANT]: fuzzes, prints the summary line, returns 0 when the
# run went as hoped (clean without a mutant, caught with one).
run_one() {
    local t=$1 secs=$2 m=${3:-}
    local corpus artifacts log scratch=""
    local -a dirs
    if [[ -n $m ]]; then
        scratch=$(mktemp -d)
        corpus=$scratch/corpus
        artifacts=$scratch/artifacts/
        mkdir -p "$corpus" "$artifacts"
        dirs=("$corpus")
        [[ ${FUZZ_SEEDS:-} == none ]] || dirs+=("corpus/$t")
        log=logs/$t-$m.log
    else
        corpus=corpus/$t
        artifacts=artifacts/$t/
        mkdir -p "$corpus" "$artifacts"
        dirs=("$corpus")
        log=logs/$t.log
    fi
    local start end rc=0
    start=$(date +%s.%N)
    PALISADE_MUTANT=$m "$bin_dir/$t" "${dirs[@]}" \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$artifacts" >"$log" 2>&1 || rc=$?
    end=$(date +%s.%N)
    local elapsed execs rate verdict ok
    elapsed=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    if [[ $rc == 0 ]]; then
        verdict=clean
        [[ -n $m ]] && verdict=survived
    else
        verdict=crash
        [[ -n $m ]] && verdict=caught
    fi
    ok=1
    [[ -z $m && $rc != 0 ]] && ok=0
    [[ -n $m && $rc == 0 ]] && ok=0
    echo "fuzz: $t${m:+ $m} $verdict after $elapsed s, ${execs:-?} execs, ${rate:-?} execs/s"
    if [[ $verdict == crash || $verdict == caught ]]; then
        # What broke, and where the input is.
        grep -m1 -A2 "panicked at" "$log" | sed 's/^/    /' || true
        grep -m1 -E "^==[0-9]+== ERROR" "$log" | sed 's/^/    /' || true
        grep -m1 "Test unit written to" "$log" | sed 's/^/    /' || true
    fi
    if [[ -n $scratch ]]; then
        # Keep the input that exposed the mutant beside its log.
        cp "$artifacts"crash-* "logs/$t-$m.crash" 2>/dev/null || true
        rm -rf "$scratch"
    fi
    [[ $ok == 1 ]]
}

if [[ $target != all ]]; then
    run_one "$target" "$seconds" "$mutant"
    exit $?
fi

# Every target, FUZZ_JOBS at a time (each libFuzzer process uses one core).
jobs=${FUZZ_JOBS:-2}
failed=0
pids=()
for t in "${TARGETS[@]}"; do
    run_one "$t" "$seconds" &
    pids+=($!)
    if [[ ${#pids[@]} -ge $jobs ]]; then
        wait "${pids[0]}" || failed=1
        pids=("${pids[@]:1}")
    fi
done
for p in "${pids[@]}"; do
    wait "$p" || failed=1
done
if [[ $failed != 0 ]]; then
    echo "fuzz: a target crashed; logs in fuzz/logs/, inputs in fuzz/artifacts/" >&2
    exit 1
fi
