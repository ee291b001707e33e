#!/usr/bin/env bash
# Measures, for every mutant of palisade-core, how long the fuzzer needs to find it:
# each mutant is fuzzed on the target that exercises it, one at a time (one core), for at
# most SECONDS (default 300). FUZZ_SEEDS=none starts from an empty corpus instead of the
# checked-in seeds. Prints one `fuzz: …` line per mutant (see run.sh) and appends them to
# fuzz/logs/mutants-<seeds|empty>.txt.
set -euo pipefail
cd "$(dirname "$0")"
seconds=${1:-300}
mode=seeds
[[ ${FUZZ_SEEDS:-} == none ]] && mode=empty
out=logs/mutants-$mode.txt
mkdir -p logs
: >"$out"
survived=0
while read -r mutant target; do
    ./run.sh "$target" "$seconds" "$mutant" | grep '^fuzz:' | tee -a "$out" || survived=1
done < <(cd .. && cargo run -q -p palisade-fuzz-entry --example list-mutants)
exit $survived
