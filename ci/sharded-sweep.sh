#!/usr/bin/env bash
# The sharded sweep of .github/workflows/sweep.yml on one machine: N shards of
# `palisade sweep --shard I/N`, each a separate process, then `palisade merge`.
#
#   ci/sharded-sweep.sh N [-o DIR] [-- SWEEP_ARGS...]
#
# Shard I writes its report to DIR/shard-I/ and its output to DIR/shard-I.log; the merged
# report (summary.json, summary.md, junit.xml, failures/) goes to DIR/merged/. DIR defaults
# to target/sharded-sweep; an earlier run's output there is replaced. SWEEP_ARGS go to every
# shard, e.g. `-- --seed-range 0..500 --mutant double-replay-block`; --shard and --report-dir
# are this script's to set. Without SWEEP_ARGS the shards split the README's main job.
#
# Environment:
#   PALISADE     the palisade binary to run (default: built here by `cargo build --release`)
#   SHARD_PROCS  how many shards run at once (default: the number of cores); each gets
#                --jobs cores/SHARD_PROCS unless SWEEP_ARGS set --jobs
#
# Exit code: the merge's. 0 every seed held; 1 a seed failed or a required coverage mark
# was never hit; 2 bad usage, or a shard that ended without a report (its log is shown).
set -euo pipefail

usage() {
    echo "usage: ci/sharded-sweep.sh N [-o DIR] [-- SWEEP_ARGS...]" >&2
    exit 2
}

[[ $# -ge 1 ]] || usage
count=$1
shift
# A GitHub Actions matrix holds at most 256 jobs; the script keeps the same bound.
if ! [[ $count =~ ^[1-9][0-9]*$ ]] || ((count > 256)); then
    echo "sharded-sweep: N must be a whole number from 1 to 256, not '$count'" >&2
    usage
fi
out=
while [[ $# -gt 0 ]]; do
    case $1 in
    -o)
        [[ $# -ge 2 ]] || usage
        out=$2
        shift 2
        ;;
    --)
        shift
        break
        ;;
    *) usage ;;
    esac
done
sweep_args=("$@")
jobs_given=0
for a in ${sweep_args[@]+"${sweep_args[@]}"}; do
    case $a in
    --shard | --shard=* | --report-dir | --report-dir=*)
        echo "sharded-sweep: $a is set by the script; leave it out of SWEEP_ARGS" >&2
        exit 2
        ;;
    --jobs | --jobs=*) jobs_given=1 ;;
    esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
out=${out:-$root/target/sharded-sweep}

# Only what an earlier run of this script wrote is removed.
if [[ -e $out && ! -e $out/.sharded-sweep ]] && [[ -n $(ls -A "$out" 2>/dev/null) ]]; then
    echo "sharded-sweep: $out is not empty and was not written by this script; choose another -o" >&2
    exit 2
fi

palisade=${PALISADE:-}
if [[ -z $palisade ]]; then
    # From the workspace root: its .cargo/config.toml sets the madsim cfg the sim needs.
    palisade=$(cd "$root" && cargo build --release -p palisade-sim --bin palisade \
        --message-format=json-render-diagnostics |
        sed -n 's/.*"executable":"\([^"]*\/palisade\)".*/\1/p' | tail -n 1) || palisade=
    [[ -n $palisade ]] || {
        echo "sharded-sweep: cannot build the palisade binary (see cargo's output above)" >&2
        exit 2
    }
fi

cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
procs=${SHARD_PROCS:-$cores}
if ! [[ $procs =~ ^[1-9][0-9]*$ ]]; then
    echo "sharded-sweep: SHARD_PROCS must be a whole number >= 1, not '$procs'" >&2
    exit 2
fi
((procs <= count)) || procs=$count
if [[ $jobs_given == 0 ]]; then
    sweep_args+=(--jobs "$((cores / procs > 0 ? cores / procs : 1))")
fi

mkdir -p "$out"
rm -rf "$out"/shard-* "$out"/merged
touch "$out/.sharded-sweep"

# run_shard I SWEEP_ARGS...: one shard, as its own process; its exit code goes to
# DIR/shard-I.rc, so the pool below never stops early. xargs calls it.
# shellcheck disable=SC2329
run_shard() {
    local i=$1 rc=0
    shift
    "$PALISADE_BIN" sweep --shard "$i/$SHARD_COUNT" --report-dir "$SHARD_OUT/shard-$i" "$@" \
        >"$SHARD_OUT/shard-$i.log" 2>&1 || rc=$?
    echo "$rc" >"$SHARD_OUT/shard-$i.rc"
}
export -f run_shard
export PALISADE_BIN=$palisade SHARD_COUNT=$count SHARD_OUT=$out
# xargs -P is the process pool (GNU and BSD alike; `wait -n` needs bash 4.3).
seq 0 $((count - 1)) |
    xargs -P "$procs" -I{} bash -c 'run_shard "$@"' run_shard {} "${sweep_args[@]}"

# 0 and 1 are verdicts, and the shard wrote its report; anything else means it did not.
broken=0
summaries=()
for ((i = 0; i < count; i++)); do
    rc=$(cat "$out/shard-$i.rc" 2>/dev/null || echo "?")
    if [[ $rc == 0 || $rc == 1 ]]; then
        echo "shard $i/$count: $(tail -n 1 "$out/shard-$i.log")"
        summaries+=("$out/shard-$i/summary.json")
    else
        echo "shard $i/$count: exited $rc; the end of $out/shard-$i.log:" >&2
        tail -n 20 "$out/shard-$i.log" | sed 's/^/    /' >&2
        broken=1
    fi
done
if [[ $broken != 0 ]]; then
    exit 2
fi

rc=0
"$palisade" merge "${summaries[@]}" --report-dir "$out/merged" || rc=$?
# The merged summary.md names each failure file where it now is; so does this list.
shopt -s nullglob
files=("$out"/merged/failures/*.json)
if [[ ${#files[@]} -gt 0 ]]; then
    echo "replay a failure with:"
    for f in "${files[@]}"; do
        echo "  palisade replay $f"
    done
fi
exit "$rc"
