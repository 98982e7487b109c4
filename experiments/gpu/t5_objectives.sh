#!/usr/bin/env bash
# One seed of the T5 objective comparison at its gpu scale, on a bare GPU machine that was
# given `.carry` (experiments/gpu/prepare.sh). Each call is one resumable command; results
# accumulate in RESULTS (default experiments/results/t5_objectives/gpu), whose results.jsonl
# carries finished rows from earlier calls, which are skipped:
#
#   bash experiments/gpu/t5_objectives.sh SEED [ROWS]     # ROWS: comma-separated row names
#
# Copies results.jsonl, table.md, meta.json and the plots to $OUT when the machine sets it.
set -euo pipefail
cd "$(dirname "$0")/../.."
SEED=${1:?usage: t5_objectives.sh SEED [ROWS]}
RESULTS=${RESULTS:-experiments/results/t5_objectives/gpu}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
  .carry/wheels/*.whl
export PYTHONPATH="/tmp/site:$PWD/.carry/site:$PWD" PYTHONUNBUFFERED=1
export BERTFAM_CACHE="$PWD/.carry/cache"
mkdir -p "$RESULTS"
# Whatever happens below, the rows that finished come back.
trap 'if [ -n "${OUT:-}" ]; then cp "$RESULTS"/results.jsonl "$RESULTS"/log-seed* \
  "$RESULTS"/table.md "$RESULTS"/meta.json "$RESULTS"/*.png "$OUT"/ 2>/dev/null || true; fi' EXIT
python3 -m experiments.t5_objectives --scale=gpu --seeds="$SEED" ${2:+--rows="$2"} \
  --out="$RESULTS" --workdirs=/tmp/t5_objectives_runs 2>&1 | tee -a "$RESULTS/log-seed$SEED.txt"
