#!/usr/bin/env bash
# One seed of an experiment's sweep at its gpu scale, on a bare GPU machine that was given
# `.carry` (experiments/gpu/prepare.sh). Each call is one resumable command of at most ~10
# minutes; results accumulate in RESULTS (default experiments/results/EXPERIMENT/gpu), whose
# results.jsonl carries finished rows from earlier calls, which are skipped:
#
#   bash experiments/gpu/sweep.sh EXPERIMENT SEED [ROWS]   # EXPERIMENT: t5_objectives,
#                                                          # masking_schemes, electra_ablation;
#                                                          # ROWS: comma-separated row names
#
# Copies results.jsonl, table.md, meta.json and the plots to $OUT when the machine sets it.
set -euo pipefail
cd "$(dirname "$0")/../.."
EXPERIMENT=${1:?usage: sweep.sh EXPERIMENT SEED [ROWS]}
SEED=${2:?usage: sweep.sh EXPERIMENT SEED [ROWS]}
RESULTS=${RESULTS:-experiments/results/$EXPERIMENT/gpu}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
  .carry/wheels/*.whl
export PYTHONPATH="/tmp/site:$PWD/.carry/site:$PWD" PYTHONUNBUFFERED=1
export BERTFAM_CACHE="$PWD/.carry/cache"
mkdir -p "$RESULTS"
# Whatever happens below, the rows that finished come back.
trap 'if [ -n "${OUT:-}" ]; then cp "$RESULTS"/results.jsonl "$RESULTS"/log-seed* \
  "$RESULTS"/table.md "$RESULTS"/meta.json "$RESULTS"/*.png "$OUT"/ 2>/dev/null || true; fi' EXIT
python3 -m "experiments.$EXPERIMENT" --scale=gpu --seeds="$SEED" ${3:+--rows="$3"} \
  --out="$RESULTS" --workdirs="/tmp/${EXPERIMENT}_runs" 2>&1 | tee -a "$RESULTS/log-seed$SEED.txt"
