"""A preemption notice (SIGTERM: Cloud TPU maintenance, `scontrol requeue`, Kubernetes) turned into
a checkpoint at a step boundary that every process of the job agrees on.

One process: a SIGTERM handler sets a flag that the train loops read after every step.

Several processes (`jax.distributed`): a flag per process is not enough. The notice reaches the
hosts at different steps, and the host loops run ahead of their devices, so each would read its
flag at a different step; a process that starts saving (orbax's saves synchronise all processes)
while another has dispatched the next step's collectives hangs both until the job is killed.
JAX's preemption sync manager answers instead: its notifier catches SIGTERM on any process, and
the processes agree on the step after the largest one any of them has reached
(`multihost_utils.reached_preemption_sync_point`), which must be asked at every step, by every
process, from the same starting step: the train loops do.
"""

from __future__ import annotations

import signal

import jax
from absl import logging
from jax.experimental import multihost_utils


class Watch:
  """`reached(step)`: whether the loop should checkpoint `step` and stop (the module docstring).

  Use as a context manager around the loop: the single-process SIGTERM handler is installed on
  entry and the previous one restored on exit. A disabled watch (a run with nowhere to save,
  e.g. an experiment's in-memory fine-tuning) never fires and leaves SIGTERM alone.
  """

  def __init__(self, enabled: bool = True):
    self._enabled = enabled
    self._notified = False
    self._previous = None
    self._synchronised = jax.distributed.is_initialized()

  def __enter__(self) -> "Watch":
    if self._enabled and not self._synchronised:  # JAX's notifier owns SIGTERM once jax.distributed is up
      try:
        self._previous = signal.signal(signal.SIGTERM, self._handle)
      except ValueError:  # not the main thread (a test runner's): SIGTERM keeps its default
        pass
    return self

  def __exit__(self, *exc_info) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None

  def _handle(self, signum, frame) -> None:
    del signum, frame
    self._notified = True

  def reached(self, step: int) -> bool:
    """Called once after every step (its 1-based global number), by every process."""
    if not self._enabled:
      return False
    if not self._synchronised:
      return self._notified
    try:
      return multihost_utils.reached_preemption_sync_point(step)
    except RuntimeError:  # jax_enable_preemption_service is off: SIGTERM ends the job unsaved
      logging.warning("JAX's preemption service is off (jax_enable_preemption_service): a "
                      "SIGTERM stops this job without a checkpoint.")
      self._synchronised = False  # and no handler: the flag stays down
      return False
