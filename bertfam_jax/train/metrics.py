"""Metrics sinks: WORKDIR/metrics.jsonl (one object per logged step), TensorBoard events, and the
progress line on stdout. Only process 0 writes."""

from __future__ import annotations

import json
import math
import os
import sys

import jax
from absl import logging

from bertfam_jax import errors
from bertfam_jax.errors import ConfigError


class MetricsWriter:
  """metrics.jsonl and TensorBoard events (process 0 only). The events file is opened at the
  first record, so a run that records nothing (re-run after it finished) adds none."""

  def __init__(self, workdir: str, *, resume_step: int | None):
    self.enabled = jax.process_index() == 0
    self.workdir = workdir
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._tb_dir = os.path.join(workdir, "tensorboard")
    self._tb = None
    if self.enabled:   # a fresh start (None) drops what a start that never checkpointed logged
      _truncate_after(self.path, resume_step or 0)

  def write(self, step: int, scalars: dict[str, float], prefix: str = "") -> None:
    if not self.enabled:
      return
    # Non-finite values (e.g. throughput of a window holding only the compile step) become null.
    record = {"step": step, **{prefix + k: (v if math.isfinite(v) else None)
                               for k, v in scalars.items()}}
    try:
      with open(self.path, "a") as f:
        f.write(json.dumps(record) + "\n")
    except OSError as e:
      if errors.no_space(e) is None:
        raise
      raise errors.no_space_error(e, os.path.dirname(self.path), self.path) from e
    if self._tb is None:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      self._tb = SummaryWriter(self._tb_dir)
    for k, v in scalars.items():
      if math.isfinite(v):
        self._tb.add_scalar(prefix + k, v, step)
    self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def _truncate_after(path: str, step: int) -> None:
  """Drops lines logged after the restored checkpoint (all of them on a fresh start): those
  steps run again and are logged again, so the file stays one record per step. A last line cut
  short (the run was killed while writing it) is dropped with a warning; a damaged line before
  it is a ConfigError naming the file and line."""
  if not os.path.exists(path):
    return
  with open(path) as f:
    lines = [(number, line) for number, line in enumerate(f, 1) if line.strip()]
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
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.writelines(kept)
  os.replace(tmp, path)


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
