#!/usr/bin/env bash
# An A/B in one run: a command against a base commit's code and the working tree's, in turn.
#
#   here:   .venv/bin/python scripts/gpu_prepare.py --base REV   (REV's code in .gpu/base/)
#   there:  source scripts/gpu_env.sh
#           bash scripts/gpu_ab.sh ROUNDS 'COMMAND'   (carry .gpu)
#
# Each round runs COMMAND twice, base first: in .gpu/base (its engine, simulator and
# benchmarks on PYTHONPATH, .gpu reachable there) with AB=base, then in the tree with AB=new;
# AB_ROUND is the round (1..ROUNDS) and TREE the tree's root, so the command names its outputs
# and can run the tree's benchmark against the base's engine:
#
#   bash scripts/gpu_ab.sh 2 'python3 $TREE/benchmarks/gpu/interactive.py --model qwen3-0.6b \
#       --prompts 1024 --logprobs 1 --out $OUT/${AB}_$AB_ROUND.json'
#
# AB_BASE names another base folder. A round's failure is reported and the next one runs;
# the exit status is that of the last failure (0 when none failed).
set -uo pipefail
if [ $# -ne 2 ] || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: scripts/gpu_ab.sh ROUNDS 'COMMAND'" >&2
    exit 2
fi
rounds=$1
command=$2
TREE=$(cd "$(dirname "$0")/.." && pwd)
base=$(cd "${AB_BASE:-$TREE/.gpu/base}" 2> /dev/null && pwd) || {
    echo "no base at ${AB_BASE:-$TREE/.gpu/base}: run scripts/gpu_prepare.py --base REV here" >&2
    exit 2
}
[ -e "$base/.gpu" ] || [ ! -d "$TREE/.gpu" ] || ln -s "$TREE/.gpu" "$base/.gpu"
site=${SITE:+:$SITE}
export TREE
status=0
for round in $(seq 1 "$rounds"); do
    for ab in base new; do
        if [ $ab = base ]; then dir=$base; else dir=$TREE; fi
        echo "== $ab, round $round ($(cat "$dir/.ab_rev" 2> /dev/null || echo tree))"
        (cd "$dir" && AB=$ab AB_ROUND=$round PYTHONPATH="$dir$site" bash -c "$command")
        rc=$?
        [ $rc = 0 ] || { echo "exit $rc"; status=$rc; }
    done
done
exit $status
