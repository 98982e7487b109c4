"""The one training loop. Pre-training (`train.run`), fine-tuning of encoders and of T5s
(`finetune.run`, on the command line and in process for the experiments) all step through
`train`; what differs between them is what they hand it:

  source      the batches: an iterator of this process's rows of each global batch, with
              `state() -> {name: int}` (its position after the last batch handed out, saved with
              every checkpoint) and `restore([state of every process])`. Pre-training's
              `data.pipeline.Pipeline` and fine-tuning's `EpochSource` are two.
  train_step  `step(state, batch) -> (state, metrics)`, jitted (`train.step.make_train_step`).
  evaluators  `Evaluator(every, evaluate)`: `evaluate(step, params) -> {metric: value}` every
              `every` steps and after the last; the values are logged as eval_<metric>.

Every run gets the same behaviour: the stop at the first non-finite loss (its last checkpoint,
all finite, kept), progress lines with tokens/s, MFU and ETA, metrics.jsonl and TensorBoard,
checkpoints holding the data position, preemption (SIGTERM: save and stop at a step every
process agrees on) and exact resume.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

import jax
import numpy as np
from absl import logging

from bertfam_jax import config_lib
from bertfam_jax import flops as flops_lib
from bertfam_jax.data import pipeline as pipeline_lib
from bertfam_jax.train import metrics as metrics_lib
from bertfam_jax.train import preemption
from bertfam_jax.train import sharding as sharding_lib
from bertfam_jax.train import step as step_lib


class NonFiniteLossError(RuntimeError):
  """Raised when the loss becomes NaN/inf; the last checkpoint (all finite) is kept."""


class BatchSource(Protocol):
  """What `train` draws batches from (module docstring)."""

  def __next__(self) -> dict[str, np.ndarray]: ...

  def state(self) -> dict[str, int]: ...

  def restore(self, process_states: Sequence[Mapping[str, int]]) -> None: ...


@dataclasses.dataclass(frozen=True)
class Evaluator:
  """`evaluate(step, params) -> {metric: value}` every `every` steps and after the last."""
  every: int
  evaluate: Callable[[int, Any], dict[str, float]]


class EpochSource:
  """Batches of in-memory rows, a fresh permutation each epoch: the global batch of step s holds
  the rows `epoch_order(rows, batch_size, seed, s)`, this process its contiguous share. Its state
  is the step, so a resumed run sees the batches an uninterrupted one would."""

  def __init__(self, data: dict[str, np.ndarray], batch_size: int, seed: int, step: int = 0):
    """`data`: {name: [rows, ...]} (every process holds all rows); `batch_size`: global."""
    self.data, self.batch_size, self.seed, self.step = data, batch_size, seed, step
    self.num_rows = len(next(iter(data.values())))

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    rows = local_rows(epoch_order(self.num_rows, self.batch_size, self.seed, self.step))
    self.step += 1
    return {k: v[rows] for k, v in self.data.items()}

  def state(self) -> dict[str, int]:
    return {"step": self.step}

  def restore(self, process_states: Sequence[Mapping[str, int]]) -> None:
    self.step = int(process_states[0]["step"])


def epoch_order(num_rows: int, batch_size: int, seed: int, step: int) -> np.ndarray:
  """The [batch_size] row indices of global step `step` (0-based): epoch e = step // per_epoch
  is a fresh permutation from (seed, e), its last partial batch dropped (run_classifier.py's
  shuffle + drop_remainder). A pure function of (seed, step)."""
  per_epoch = num_rows // batch_size
  epoch, index = divmod(step, per_epoch)
  order = np.random.default_rng([seed, epoch]).permutation(num_rows)
  return order[index * batch_size:(index + 1) * batch_size]


def local_rows(global_rows: np.ndarray) -> np.ndarray:
  """This process's contiguous share of a global batch's rows."""
  share = len(global_rows) // jax.process_count()
  return global_rows[jax.process_index() * share:(jax.process_index() + 1) * share]


class Profiler:
  """A jax.profiler trace of steps first+1..last (`train.profile_steps` 'first:last') in
  `directory`, for TensorBoard's profile plugin or Perfetto. The trace starts before step
  first+1 is dispatched and stops once step `last` has finished (or the run stops earlier); a
  run that starts past `first` takes none, and says so. Starting and stopping are left out of
  the logged throughput."""

  def __init__(self, first: int, last: int, directory: str):
    self.first, self.last, self.directory = first, last, directory
    self.active = False

  @classmethod
  def of(cls, config, workdir: str) -> "Profiler | None":
    """The profiler `config.train.profile_steps` asks for, writing to WORKDIR/profile."""
    bounds = config_lib.parse_profile_steps(config.train.get("profile_steps", ""))
    return None if bounds is None else cls(*bounds, os.path.join(workdir, "profile"))

  def begin(self, step: int) -> None:
    """At the loop's start, with the steps already done."""
    if step > self.first:
      metrics_lib.print_progress(f"No profiler trace: train.profile_steps starts at step "
                                 f"{self.first}, and this run starts at step {step}.")

  def before(self, step: int) -> bool:
    """Before the next step is dispatched, with the steps done; True when it started a trace."""
    if step != self.first:
      return False
    jax.profiler.start_trace(self.directory)
    self.active = True
    return True

  def after(self, step: int, state) -> bool:
    """Once a step was dispatched, with the steps done; True when it stopped the trace."""
    if not (self.active and step >= self.last):
      return False
    self.stop(step, state)
    return True

  def stop(self, step: int, state) -> None:
    """Waits for `state` (the last traced step), stops the trace and says which steps it holds."""
    if self.active:
      jax.block_until_ready(state)
      jax.profiler.stop_trace()
      self.active = False
      metrics_lib.print_progress(f"Profiler trace of steps {self.first + 1}-{step} in "
                                 f"{self.directory}.")


@dataclasses.dataclass
class Sinks:
  """Where a run's records go: `writer` (metrics.jsonl and the configured writers),
  `checkpointer` (`train.checkpoint.Checkpointer`) and `profiler` (a trace of some steps), all
  None for an in-memory run (no workdir)."""
  writer: metrics_lib.MetricsWriter | None = None
  checkpointer: Any = None
  profiler: Profiler | None = None


def train(state: step_lib.TrainState, train_step: Callable, source: BatchSource, *, mesh,
          total_steps: int, log_every: int, checkpoint_every: int, tokens_per_step: int,
          flops_per_token: float | None = None, evaluators: Sequence[Evaluator] = (),
          sinks: Sinks = Sinks()) -> tuple[step_lib.TrainState, dict[str, float]]:
  """Steps `state` from `state.step` to `total_steps` (module docstring).

  Metrics are fetched every `log_every` steps, before every checkpoint and after the last step,
  not every step, so dispatch runs ahead of the host; a checkpoint is saved every
  `checkpoint_every` steps (after that step's evaluations), after the last and at a preemption
  notice (at once: that step is not evaluated), after a check that every step since the
  previous one was finite. Returns the state and the last logged scalars (train
  and eval_*); a run whose state is already at `total_steps` runs nothing and returns {}.
  """
  step = int(jax.device_get(state.step))
  if step >= total_steps:
    metrics_lib.print_progress(f"Already finished at step {step} (train.total_steps="
                               f"{total_steps}).")
    return state, {}
  log = _Logger(sinks, step, total_steps, tokens_per_step, flops_per_token)
  window, last = None, {}
  checkpointer, profiler = sinks.checkpointer, sinks.profiler
  if profiler is not None:
    profiler.begin(step)
  traced = [step, state]   # the steps done and the state, for a trace stopped by an early end
  with preemption.Watch(enabled=checkpointer is not None) as preempted, _stopping(profiler,
                                                                                   traced):
    while step < total_steps:
      if profiler is not None and profiler.before(step):
        log.exclude_pause()
      local = next(source)
      data_state = source.state()
      batch = pipeline_lib.make_global_batch(local, mesh, sharding_lib.BATCH_SPEC)
      state, metrics = train_step(state, batch)
      step += 1
      traced[:] = [step, state]
      if profiler is not None and profiler.after(step, state):
        log.exclude_pause()
      window = metrics if window is None else step_lib.accumulate_metrics(window, metrics)
      log.stepped(metrics)
      stop = preempted.reached(step)  # the same step on every process
      save = checkpointer is not None and (
          step % checkpoint_every == 0 or step == total_steps or stop)
      if step % log_every == 0 or step == total_steps or save:
        window["param_norm"] = (step_lib.param_norm(state.params), 1.0)  # at this step
        last = log.train(step, jax.device_get(window))
        window = None
      if stop:  # saved at once, not after an evaluation that could outlast the grace period
        checkpointer.save(step, state, data_state)
        logging.warning("Preemption notice (SIGTERM): saved step %d and stopped.", step)
        break
      due = [e for e in evaluators if step % e.every == 0 or step == total_steps]
      for evaluator in due:
        last.update(log.evaluation(step, evaluator.evaluate(step, state.params)))
      if save:
        checkpointer.save(step, state, data_state)
      if save or due:
        log.exclude_pause()
  log.summary(step, last)
  return state, last


@contextlib.contextmanager
def _stopping(profiler: Profiler | None, traced: list):
  """Stops a trace still running when the loop ends before its last step (a preemption, a stop
  step, an error); `traced` holds the steps done and the state then. After an error the state
  is not waited for: a failed step may have consumed (donated) it, and the error is the news."""
  try:
    yield
  except BaseException:
    if profiler is not None:
      profiler.stop(traced[0], None)
    raise
  if profiler is not None:
    profiler.stop(*traced)


# The ETA's step time is smoothed exponentially, per step: a log window of n steps weighs
# 1 − DECAY^n against the past (0.22 for 50 steps), so one slow or fast window barely moves it.
_STEP_TIME_DECAY = 0.995


class _Logger:
  """Train and eval records: the non-finite check, throughput from the end of the first
  (compiling) step, MFU, an ETA from the smoothed step time, the progress line and the writer."""

  def __init__(self, sinks: Sinks, start_step: int, total_steps: int, tokens_per_step: int,
               flops_per_token: float | None):
    self.sinks, self.total_steps, self.tokens_per_step = sinks, total_steps, tokens_per_step
    peak = flops_lib.peak_flops_per_device()
    self.mfu_denominator = (peak * jax.device_count() / flops_per_token
                            if peak and flops_per_token else None)
    self.timer, self.timed_steps, self.last_logged = None, 0, start_step
    self.smoothed_step_time = None   # seconds per training step, exponentially smoothed
    self.best_eval = None            # (step, eval loss) of the lowest eval loss so far
    self.started = time.perf_counter()
    self.run_steps, self.run_seconds = 0, 0.0   # the timed training steps of the whole run

  def stepped(self, metrics) -> None:
    if self.timer is None:  # the first step compiles: time throughput from its end
      jax.block_until_ready(metrics)
      self.timer = time.perf_counter()
    else:
      self.timed_steps += 1

  def summary(self, step: int, last: dict[str, float]) -> None:
    """The run's last line: where it stopped, its wall time, its training throughput (the timed
    steps: compilation, evaluations and checkpoints excluded), its best (lowest loss) and last
    evaluations, and its workdir."""
    rate = self.tokens_per_step * self.run_steps / self.run_seconds if self.run_seconds else 0.0
    evals = ", ".join(f"{k[5:]} {v:.4f}" for k, v in sorted(last.items()) if k.startswith("eval_"))
    ended = "Finished" if step >= self.total_steps else "Stopped"
    parts = [f"{ended} at step {step}/{self.total_steps} in "
             f"{metrics_lib.format_duration(time.perf_counter() - self.started)}",
             f"{rate / 1e3:.1f}k tok/s while training"]
    if self.best_eval is not None:
      parts.append(f"best eval loss {self.best_eval[1]:.4f} at step {self.best_eval[0]}")
    if evals:
      parts.append(f"last eval: {evals}")
    if self.sinks.writer is not None:
      parts.append(f"workdir {self.sinks.writer.workdir}")
    metrics_lib.print_progress("; ".join(parts) + ".")

  def exclude_pause(self) -> None:
    """Restarts the throughput timer after an evaluation or a checkpoint, so that tokens/s and
    the ETA count training steps only (the steps since the last log are dropped from the
    window, with their time)."""
    if self.timer is not None:
      self.timer, self.timed_steps = time.perf_counter(), 0

  def train(self, step: int, host) -> dict[str, float]:
    first = self.last_logged + 1
    if not all(math.isfinite(float(s)) for s, _ in host.values()):
      checkpointer = self.sinks.checkpointer
      latest = checkpointer.latest_step() if checkpointer is not None else None
      kept = (f"the last checkpoint (step {latest}) is kept" if latest is not None
              else "no checkpoint was written")
      raise NonFiniteLossError(
          f"Non-finite loss, gradients or parameters between steps {first} and {step}; "
          f"{kept}. Lower --config.optimizer.peak_lr or check the data.")
    now = time.perf_counter()
    # A window of only the compiling step (the first log after a start or a resume) has no
    # timed step: its throughput is the smoothed one, or unknown (null, and not printed).
    seconds_per_step = self._smooth(now) if self.timed_steps else self.smoothed_step_time
    self.timer, self.timed_steps, self.last_logged = now, 0, step
    scalars = step_lib.finalize_metrics(host)
    scalars["tokens_per_sec"] = (self.tokens_per_step / seconds_per_step if seconds_per_step
                                 else math.nan)
    if self.mfu_denominator:
      scalars["mfu"] = scalars["tokens_per_sec"] / self.mfu_denominator
    if self.sinks.writer is not None:
      self.sinks.writer.write(step, scalars)
    eta = (self.total_steps - step) * (self.smoothed_step_time or math.nan)
    metrics_lib.print_progress(metrics_lib.progress_line(step, self.total_steps, scalars, eta))
    return scalars

  def _smooth(self, now: float) -> float:
    """This window's seconds per step, folded into the smoothed step time; returns the window's
    (tokens/s reports the window, the ETA the smoothed time)."""
    window = (now - self.timer) / self.timed_steps
    self.run_steps += self.timed_steps
    self.run_seconds += now - self.timer
    weight = 1.0 - _STEP_TIME_DECAY ** self.timed_steps
    previous = window if self.smoothed_step_time is None else self.smoothed_step_time
    self.smoothed_step_time = (1.0 - weight) * previous + weight * window
    return window

  def evaluation(self, step: int, scalars: dict[str, float]) -> dict[str, float]:
    if not scalars:
      return {}
    loss = scalars.get("loss")
    if loss is not None and (self.best_eval is None or loss < self.best_eval[1]):
      self.best_eval = (step, loss)
    if self.sinks.writer is not None:
      self.sinks.writer.write(step, scalars, prefix="eval_")
    metrics_lib.print_progress(f"eval @ {step}: " + ", ".join(
        f"{k} {v:.4f}" for k, v in sorted(scalars.items())))
    return {f"eval_{k}": v for k, v in scalars.items()}
