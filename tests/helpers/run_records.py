"""What a run wrote to its workdir, read back for tests: metrics.jsonl's records, and a copy of
the workdir as an interrupted run would have left it."""

import json
import os
import shutil


def metric_records(workdir, complete_only: bool = False) -> list[dict]:
  """Every record of `workdir`/metrics.jsonl, in file order (train and eval lines).
  `complete_only`, for a run still writing: none before the file exists, and not a last line
  still being written."""
  path = os.path.join(workdir, "metrics.jsonl")
  if complete_only and not os.path.exists(path):
    return []
  with open(path) as f:
    text = f.read()
  lines = text.split("\n")[:-1] if complete_only else text.splitlines()
  return [json.loads(line) for line in lines if line.strip()]


def train_records(workdir) -> dict[int, dict]:
  """{step: record} of the train records (those with a `loss`)."""
  return {r["step"]: r for r in metric_records(workdir) if "loss" in r}


def copy_until(src, dst, step: int) -> None:
  """A copy of the workdir `src` at `dst` as it was right after the checkpoint at `step` (later
  checkpoints removed; other files kept)."""
  shutil.copytree(src, dst)
  for name in os.listdir(os.path.join(dst, "checkpoints")):
    if name.isdigit() and int(name) > step:
      shutil.rmtree(os.path.join(dst, "checkpoints", name))
