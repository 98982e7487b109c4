"""What a run wrote to its workdir, read back for tests: metrics.jsonl's records, a copy of the
workdir as an interrupted run would have left it, and the resume check that trains on from such
a copy."""

import json
import os
import shutil

from bertfam_jax.train import train


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


def assert_resume_reproduces(config, uninterrupted, workdir, at: int = 15,
                             steps=(20, 25, 30)) -> None:
  """`uninterrupted` copied to `workdir` as of its checkpoint at step `at` and trained on with
  `config`: its train losses at `steps` equal the uninterrupted run's bit for bit."""
  copy_until(uninterrupted, workdir, at)
  train.run(config, workdir)
  resumed, reference = train_records(workdir), train_records(uninterrupted)
  assert [resumed[s]["loss"] for s in steps] == [reference[s]["loss"] for s in steps]


def damage_array_files(checkpoint: str) -> int:
  """Overwrites every array data file of a checkpoint step directory (state/ocdbt.process_<i>/
  d/<hash>) with 64 bytes of 0xff; returns how many files it damaged."""
  damaged = 0
  for dirpath, _, filenames in os.walk(os.path.join(checkpoint, "state")):
    if dirpath.endswith("/d") and "ocdbt.process_" in dirpath:
      for name in filenames:
        with open(os.path.join(dirpath, name), "r+b") as f:
          f.write(b"\xff" * 64)
          f.truncate(64)
        damaged += 1
  return damaged
