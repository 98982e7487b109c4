#!/usr/bin/env bash
# Runs the same command on every worker of a Cloud TPU VM or pod slice (big_vision's run_tpu.sh
# pattern): copies this checkout to each worker, installs it, then starts the command on all
# workers at once and streams their output. jax.distributed finds the coordinator, process count
# and index from the TPU metadata, so the command is the single-host one.
#
#   tpu/run_all_workers.sh [--dry-run] TPU_NAME ZONE -- python -m bertfam_jax.main \
#       --config=configs/roberta.py --workdir=/mnt/shared/roberta \
#       --config.data.tfds_data_dir=/mnt/shared/tensorflow_datasets
#
# The workdir must be a filesystem every worker sees (e.g. a Filestore/NFS mount): every process
# writes its shards of each checkpoint there. (gs:// workdirs are not supported yet.)
# --dry-run prints every gcloud command instead of running it.
set -euo pipefail

run() { if [[ "$DRY_RUN" == 1 ]]; then printf '%q ' "$@"; echo; else "$@"; fi; }

DRY_RUN=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY_RUN=1; shift; fi
if [[ $# -lt 4 || "$3" != "--" ]]; then
  echo "usage: $0 [--dry-run] TPU_NAME ZONE -- COMMAND..." >&2
  exit 2
fi
TPU_NAME=$1; ZONE=$2; shift 3
REPO_DIR=$(cd "$(dirname "$0")/.." && pwd)
REMOTE_DIR='~/bertfam_jax'
printf -v COMMAND '%q ' "$@"

ssh_all() { run gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all --command="$1"; }

ssh_all "mkdir -p $REMOTE_DIR"
run gcloud compute tpus tpu-vm scp --recurse --zone="$ZONE" --worker=all \
  "$REPO_DIR/setup.cfg" "$REPO_DIR/pyproject.toml" "$REPO_DIR/README.md" \
  "$REPO_DIR/bertfam_jax" "$REPO_DIR/configs" "$TPU_NAME:$REMOTE_DIR"
ssh_all "cd $REMOTE_DIR && python3 -m pip install -q -e '.[tfds]' 'jax[tpu]'"
ssh_all "cd $REMOTE_DIR && $COMMAND"
