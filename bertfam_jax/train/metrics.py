"""Metrics sinks: WORKDIR/metrics.jsonl (one object per logged step, always: resume and the
experiments read it), and the writers `train.metric_writers` names besides it: TensorBoard events
(WORKDIR/tensorboard) and Weights & Biases (`[wandb]` extra; offline by default, files in
WORKDIR/wandb); and the progress line on stdout. Only process 0 writes.

A writer is anything with `write(step, record)` (record: {name: float or None}, the `step` key
excluded) and `close()`; `MetricsWriter` sends each record to all of them."""

from __future__ import annotations

import importlib
import json
import math
import os
import secrets
import sys
import tempfile
import time
from typing import Any, Protocol

import jax
from absl import logging

from bertfam_jax import config_lib, errors, fileio
from bertfam_jax.errors import ConfigError

METRICS_FILE = "metrics.jsonl"
WANDB_RUN_FILE = "wandb_run.json"   # the W&B run id, so that a resumed run continues it


class Writer(Protocol):
  def write(self, step: int, record: dict[str, float | None]) -> None: ...
  def close(self) -> None: ...


PART_RECORDS = 1000       # records per part of metrics.jsonl in an object store (JsonlWriter)
UPLOAD_SECONDS = 2.0      # at most one upload of the open part per this many seconds


class JsonlWriter:
  """WORKDIR/metrics.jsonl, one JSON object per logged step; a disk that is full is one line.

  An object store has no append: there the records of this start go to parts,
  metrics.jsonl.part-00000, -00001, … beside it, each rewritten whole (one upload) and closed
  after PART_RECORDS records, so an upload costs at most that many lines. The open part is
  uploaded at most every UPLOAD_SECONDS (GCS takes about one write per second per object), at a
  part's end and at `close`: a crash loses at most that much of the log, and those steps ran after
  the last checkpoint in all but that window. `read_lines` reads the file and its parts in order;
  the next start folds them into metrics.jsonl."""

  def __init__(self, path: str):
    self.path = path
    self._part, self._lines, self._uploaded, self._dirty = 0, [], 0.0, False

  def write(self, step: int, record: dict[str, float | None]) -> None:
    line = json.dumps({"step": step, **record}) + "\n"
    if fileio.is_remote(self.path):
      self._lines.append(line)
      self._dirty = True
      if len(self._lines) == PART_RECORDS or time.time() - self._uploaded >= UPLOAD_SECONDS:
        self._upload()
      return
    try:
      with open(self.path, "a") as f:
        f.write(line)
    except OSError as e:
      if errors.no_space(e) is None:
        raise
      raise errors.no_space_error(e, os.path.dirname(self.path), self.path) from e

  def _upload(self) -> None:
    fileio.write_atomically(_part_path(self.path, self._part), "".join(self._lines).encode())
    self._uploaded, self._dirty = time.time(), False
    if len(self._lines) == PART_RECORDS:
      self._part, self._lines = self._part + 1, []

  def close(self) -> None:
    if self._dirty:
      self._upload()


def _part_path(path: str, part: int) -> str:
  return f"{path}.part-{part:05d}"


def _parts(path: str) -> list[str]:
  """The parts of `path` (`JsonlWriter`; a workdir copied from an object store has them
  locally too), in order."""
  directory, prefix = os.path.dirname(path), os.path.basename(path) + ".part-"
  if not fileio.isdir(directory):
    return []
  numbered = [(int(name[len(prefix):]), name) for name in fileio.listdir(directory)
              if name.startswith(prefix) and name[len(prefix):].isdigit()]
  return [os.path.join(directory, name) for _, name in sorted(numbered)]


def read_lines(path: str) -> list[str]:
  """The lines of metrics.jsonl at `path`, then those of its parts (`JsonlWriter`) logged after
  its last step: a start that died between folding the parts into the file and removing them
  left them behind, and they must not count twice."""
  lines = fileio.read_text(path).splitlines(keepends=True) if fileio.exists(path) else []
  last = max((_step(line) for line in lines), default=-1)
  for part in _parts(path):
    lines += [line for line in fileio.read_text(part).splitlines(keepends=True)
              if _step(line) > last]
  return lines


def _step(line: str) -> int:
  """The step of a metrics.jsonl line; -1 for one that is not a whole record."""
  try:
    return int(json.loads(line)["step"])
  except (ValueError, KeyError, TypeError):
    return -1


def read_records(workdir: str) -> list[dict]:
  """Every record of WORKDIR/metrics.jsonl (local or in an object store), in order."""
  return [json.loads(line) for line in read_lines(os.path.join(workdir, METRICS_FILE))
          if line.strip()]


class TensorBoardWriter:
  """TensorBoard event files (tensorboardX); the file is opened at the first record, so a run
  that records nothing (re-run after it finished) adds none."""

  def __init__(self, directory: str):
    self.directory = directory
    self._writer = None

  def write(self, step: int, record: dict[str, float | None]) -> None:
    if self._writer is None:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      self._writer = SummaryWriter(self.directory)
    for name, value in record.items():
      if value is not None:
        self._writer.add_scalar(name, value, step)
    self._writer.flush()

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()


class WandbWriter:
  """A Weights & Biases run under WORKDIR/wandb, started at the first record (a re-run of a
  finished workdir starts none): `mode` offline (the default; `wandb sync` the
  WORKDIR/wandb/offline-run-* directories later) or online (needs `wandb login` or
  WANDB_API_KEY, checked here, before training). The run's id is kept in WORKDIR/wandb_run.json:
  online, a resumed run logs into the same W&B run (W&B keeps the first value of a step logged
  again after a restore); offline, each start writes its own directory under that id."""

  def __init__(self, workdir: str, *, project: str, mode: str, run_config: dict[str, Any]):
    self._wandb = importlib.import_module("wandb")   # installed: parse_metric_writers
    if mode == "online" and not _wandb_logged_in():
      raise ConfigError("train.wandb_mode=online needs a W&B login: run `wandb login` or set "
                        "WANDB_API_KEY, or use --config.train.wandb_mode=offline.")
    self.workdir, self.project, self.mode, self.run_config = workdir, project, mode, run_config
    self.run = None

  def _start(self):
    id_path = os.path.join(self.workdir, WANDB_RUN_FILE)
    if fileio.exists(id_path):
      run_id = json.loads(fileio.read_text(id_path))["id"]
    else:
      run_id = secrets.token_hex(6)   # W&B ids: letters and digits
      fileio.write_atomically(id_path, json.dumps({"id": run_id, "project": self.project}).encode())
    wandb = self._wandb
    # W&B writes local files only: a workdir in an object store keeps them in the temp directory.
    directory = (os.path.join(tempfile.gettempdir(), "bertfam_wandb", run_id)
                 if fileio.is_remote(self.workdir) else self.workdir)
    os.makedirs(directory, exist_ok=True)
    return wandb.init(project=self.project, mode=self.mode, dir=directory, id=run_id,
                      resume="allow", name=os.path.basename(os.path.normpath(self.workdir)),
                      config=self.run_config, settings=wandb.Settings(silent=True,
                                                                      console="off"))

  def write(self, step: int, record: dict[str, float | None]) -> None:
    if self.run is None:
      self.run = self._start()
    self.run.log({k: v for k, v in record.items() if v is not None}, step=step)

  def close(self) -> None:
    if self.run is not None:
      self.run.finish()


def _wandb_logged_in() -> bool:
  """An API key in WANDB_API_KEY or in ~/.netrc for W&B's host (where `wandb login` puts it)."""
  if os.environ.get("WANDB_API_KEY"):
    return True
  netrc = os.path.join(os.path.expanduser("~"), ".netrc")
  if not os.path.exists(netrc):
    return False
  with open(netrc) as f:
    return "api.wandb.ai" in f.read()


class MetricsWriter:
  """metrics.jsonl and the writers of `config.train.metric_writers` (TensorBoard when no config
  is given), process 0 only."""

  def __init__(self, workdir: str, *, resume_step: int | None, config=None):
    self.enabled = jax.process_index() == 0
    self.workdir = workdir
    self.path = os.path.join(workdir, METRICS_FILE)
    self.writers: list[Writer] = []
    if not self.enabled:
      return
    train = config.train if config is not None else {}
    names = config_lib.parse_metric_writers(train.get("metric_writers", "tensorboard"))
    # A fresh start (None) drops what a start that never checkpointed logged.
    _truncate_after(self.path, resume_step or 0)
    self.writers.append(JsonlWriter(self.path))
    if "tensorboard" in names:
      self.writers.append(TensorBoardWriter(os.path.join(workdir, "tensorboard")))
    if "wandb" in names:
      self.writers.append(WandbWriter(
          workdir, project=train.get("wandb_project", "bertfam_jax"),
          mode=train.get("wandb_mode", "offline"), run_config=config.to_dict()))

  def write(self, step: int, scalars: dict[str, float], prefix: str = "") -> None:
    if not self.enabled:
      return
    # Non-finite values (e.g. throughput of a window holding only the compile step) become null.
    record = {prefix + k: (v if math.isfinite(v) else None) for k, v in scalars.items()}
    for writer in self.writers:
      writer.write(step, record)

  def close(self) -> None:
    for writer in self.writers:
      writer.close()


def _truncate_after(path: str, step: int) -> None:
  """Drops lines logged after the restored checkpoint (all of them on a fresh start): those
  steps run again and are logged again, so the file stays one record per step. A last line cut
  short (the run was killed while writing it) is dropped with a warning; a damaged line before
  it is a ConfigError naming the file and line."""
  parts = _parts(path)
  if not fileio.exists(path) and not parts:
    return
  lines = [(number, line) for number, line in enumerate(read_lines(path), 1) if line.strip()]
  kept = []
  for index, (number, line) in enumerate(lines):
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      if index + 1 < len(lines):
        raise ConfigError(f"{path} line {number} is not a JSON record ({line[:60]!r}); repair or "
                          f"delete that line to resume.") from None
      logging.warning("%s: dropped its last line, cut short (%r).", path, line[:60])
      continue
    if record["step"] <= step:
      kept.append(line if line.endswith("\n") else line + "\n")
  if fileio.is_remote(path):
    fileio.write_atomically(path, "".join(kept).encode())
  else:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
      f.writelines(kept)
    os.replace(tmp, path)
  for part in parts:   # folded into metrics.jsonl (`read_lines` skips them should this stop here)
    fileio.remove(part)


def format_duration(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  seconds = int(seconds)
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def progress_line(step: int, total: int, scalars: dict[str, float], eta_seconds: float) -> str:
  """'step 10/100 | loss 6.1234 | mlm_acc 0.012 | ... | lr 1.00e-04 | 12.3k tok/s [| MFU 41.0%]
  | ETA 1m40s': the loss, every `*_accuracy` the objective reports, and throughput."""
  parts = [f"step {step}/{total}", f"loss {scalars['loss']:.4f}"]
  parts += [f"{key.replace('_accuracy', '_acc')} {scalars[key]:.3f}"
            for key in sorted(scalars) if key.endswith("_accuracy")]
  parts.append(f"lr {scalars['learning_rate']:.2e}")
  if math.isfinite(scalars["tokens_per_sec"]):   # unknown in a window of only the compile step
    parts.append(f"{scalars['tokens_per_sec'] / 1e3:.1f}k tok/s")
    if "mfu" in scalars:
      parts.append(f"MFU {100 * scalars['mfu']:.1f}%")
  if math.isfinite(eta_seconds):
    parts.append(f"ETA {format_duration(eta_seconds)}")
  return " | ".join(parts)


def print_progress(line: str) -> None:
  if jax.process_index() == 0:
    print(line, flush=True, file=sys.stdout)
