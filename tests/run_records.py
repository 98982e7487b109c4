"""What a run wrote to its workdir, read back for tests: metrics.jsonl's records."""

import json
import os


def metric_records(workdir) -> list[dict]:
  """Every record of `workdir`/metrics.jsonl, in file order (train and eval lines)."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def train_records(workdir) -> dict[int, dict]:
  """{step: record} of the train records (those with a `loss`)."""
  return {r["step"]: r for r in metric_records(workdir) if "loss" in r}
