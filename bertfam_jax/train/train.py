"""The one train loop, for every objective.

Resume precedence: a checkpoint in WORKDIR/checkpoints → `config.train.init_from` (parameters only)
→ fresh initialisation. The data position is stored with each checkpoint, so a resumed run sees
exactly the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

import math
import os
import time

import jax
from absl import logging
from jax.experimental import multihost_utils

from bertfam_jax import config_lib, objectives
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.data import pipeline as pipeline_lib
from bertfam_jax.data import sources, tokenizers
from bertfam_jax.train import checkpoint as checkpoint_lib
from bertfam_jax.train import flops as flops_lib
from bertfam_jax.train import metrics as metrics_lib
from bertfam_jax.train import optimizer as optimizer_lib
from bertfam_jax.train import preemption
from bertfam_jax.train import sharding as sharding_lib
from bertfam_jax.train import step as step_lib


class NonFiniteLossError(RuntimeError):
  """Raised when the loss becomes NaN/inf; the last checkpoint (all finite) is kept."""


def prepare_workdir(workdir: str) -> None:
  """Creates WORKDIR if needed and checks it is writable, without touching anything inside."""
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, f".write_probe_{os.getpid()}")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise ConfigError(f"--workdir={workdir} is not writable ({e.strerror}); choose a directory "
                      f"you can write to.") from e


def check_batch(config, mesh) -> int:
  """Returns the per-process batch size after checking divisibility."""
  batch, dp = config.train.batch_size, sharding_lib.data_parallel_size(mesh)
  per_micro = batch // config.train.grad_accum_steps
  if per_micro % dp:
    raise ConfigError(f"train.batch_size={batch} (÷ grad_accum_steps={config.train.grad_accum_steps}"
                      f") is not divisible by the data-parallel size {dp} (mesh data×fsdp); use a "
                      f"multiple of {dp * config.train.grad_accum_steps}.")
  if batch % jax.process_count():
    raise ConfigError(f"train.batch_size={batch} is not divisible by the {jax.process_count()} "
                      f"processes.")
  return batch // jax.process_count()


def _load_tokenizer(config, train_docs, workdir):
  """Process 0 trains (or loads) the tokenizer first; the others then find it in a shared cache,
  or train the identical model themselves where hosts have separate disks."""
  if jax.process_count() == 1:
    return tokenizers.load_or_train(config, train_docs, workdir)
  if jax.process_index() == 0:
    tokenizer = tokenizers.load_or_train(config, train_docs, workdir)
  multihost_utils.sync_global_devices("bertfam_jax:tokenizer")
  if jax.process_index() != 0:
    tokenizer = tokenizers.load_or_train(config, train_docs, workdir)
  return tokenizer


def _initial_state(config, model, tx, abstract, shardings, checkpointer, inputs, carry):
  """Returns (state, data_states, resumed_step) following the resume precedence, data_states
  being the checkpoint's data positions of every process (None when starting); `inputs` trace
  `model.init` (the objective's `init_inputs`), `carry` is its abstract step-to-step state."""
  latest = checkpointer.latest_step()
  if latest is not None:
    state, data_states = checkpointer.restore_every_process(latest, abstract)
    return state, data_states, latest
  state = step_lib.init_state(model, tx, config, shardings, config.seed, inputs, carry)
  if config.train.init_from:
    source = checkpoint_lib.Checkpointer(config.train.init_from, keep=1, read_only=True)
    step = source.latest_step()
    if step is None:
      raise ConfigError(f"train.init_from={config.train.init_from} holds no checkpoint; point it at "
                        f"a run's checkpoints directory.")
    restored, _ = source.restore(step, abstract)
    source.close()
    state = state.replace(params=restored.params)
    logging.info("Initialised parameters from %s step %d.", config.train.init_from, step)
  return state, None, None


def run(config, workdir: str) -> dict[str, float]:
  """Trains `config` in `workdir`; returns the last logged train scalars (and eval ones)."""
  config_lib.validate(config)
  prepare_workdir(workdir)
  mesh = sharding_lib.make_mesh(config.mesh)
  local_batch = check_batch(config, mesh)
  objective = objectives.get(config.objective.name)

  train_docs = sources.get_documents(config.data, "train")
  eval_docs = sources.get_documents(config.data, "eval")
  tokenizer = _load_tokenizer(config, train_docs, workdir)
  checkpoint_lib.check_or_write_config(workdir, config)
  describe = getattr(objective, "describe", _describe_masking)
  metrics_lib.print_progress(f"{describe(config)}; {len(train_docs)} train / {len(eval_docs)} "
                             f"eval documents; mesh {dict(mesh.shape)}.")

  model = objective.build_model(config)
  tx, schedule = optimizer_lib.make_optimizer(config)
  with_ctx = lambda fn: step_lib.with_mesh_context(fn, mesh)  # noqa: E731
  inputs = step_lib.objective_init_inputs(objective, config)
  carry = step_lib.objective_carry(objective, config)
  abstract, shardings = with_ctx(step_lib.abstract_state)(model, tx, config, mesh, inputs, carry)
  checkpointer = checkpoint_lib.Checkpointer(os.path.join(workdir, "checkpoints"),
                                             config.train.keep_checkpoints)
  state, data_states, resumed_step = with_ctx(_initial_state)(
      config, model, tx, abstract, shardings, checkpointer, inputs, carry)

  features_fn = objective.make_features(config, tokenizer)
  pipe_args = dict(process_index=jax.process_index(), process_count=jax.process_count(),
                   local_batch_size=local_batch,
                   **getattr(objective, "pipeline_options", lambda _: {})(config))
  train_pipe = pipeline_lib.Pipeline(config, tokenizer, train_docs, features_fn, **pipe_args)
  if data_states is not None:
    train_pipe.restore(data_states)
  eval_batches = []
  if len(eval_docs) and config.train.eval_batches:
    eval_pipe = pipeline_lib.Pipeline(config, tokenizer, eval_docs, features_fn, **pipe_args)
    eval_batches = [pipeline_lib.make_global_batch(b, mesh, sharding_lib.BATCH_SPEC)
                    for b in eval_pipe.eval_batches(config.train.eval_batches)]
    eval_pipe.close()

  train_step = step_lib.make_train_step(model, tx, schedule, objective.loss_fn, config, shardings,
                                        mesh)
  eval_step = step_lib.make_eval_step(model, objective.loss_fn, config, shardings, mesh)
  writer = metrics_lib.MetricsWriter(workdir, resume_step=resumed_step)
  loop = _Loop(config, writer, train_step, eval_step, eval_batches, checkpointer)
  try:
    return loop.run(state, train_pipe, mesh)
  finally:
    train_pipe.close()
    checkpointer.close()
    writer.close()


def _describe_masking(config) -> str:
  """The masked-LM family's progress header: how much of a sequence is predicted."""
  o = config.objective
  return (f"Effective mask rate: {100 * config_lib.effective_mask_rate(config):.2f}% of "
          f"{config.data.seq_len} tokens (mask_rate {o.mask_rate}, max_predictions "
          f"{o.max_predictions})")


class _Loop:
  """Step dispatch, metric windows, eval, checkpoints and stopping conditions."""

  def __init__(self, config, writer, train_step, eval_step, eval_batches, checkpointer):
    self.config = config
    self.writer = writer
    self.train_step = train_step
    self.eval_step = eval_step
    self.eval_batches = eval_batches
    self.checkpointer = checkpointer
    t = config.train
    self.tokens_per_step = t.batch_size * config.data.seq_len
    flops_per_token = objectives.get(config.objective.name).flops_per_token(config)
    peak = flops_lib.peak_flops_per_device()
    self.mfu_denominator = peak * jax.device_count() / flops_per_token if peak else None

  def run(self, state, train_pipe, mesh):
    t = self.config.train
    step = int(jax.device_get(state.step))
    last_logged = step
    window, timed_steps, timer = None, 0, None
    last = {}
    batches = iter(train_pipe)
    with preemption.Watch() as preempted:
      while step < t.total_steps:
        local = next(batches)
        data_state = train_pipe.state()
        batch = pipeline_lib.make_global_batch(local, mesh, sharding_lib.BATCH_SPEC)
        state, metrics = self.train_step(state, batch)
        step += 1
        window = metrics if window is None else step_lib.accumulate_metrics(window, metrics)
        if timer is None:  # the first step compiles: time throughput from its end
          jax.block_until_ready(metrics)
          timer = time.perf_counter()
        else:
          timed_steps += 1
        stop = preempted.reached(step)  # the same step on every process
        save = step % t.checkpoint_every == 0 or step == t.total_steps or stop
        if step % t.log_every == 0 or save:
          # Metrics are fetched only here (not every step) so dispatch runs ahead of the host; a
          # checkpoint always follows a check that every step since the last one was finite.
          now = time.perf_counter()
          last = self._log_train(step, last_logged, jax.device_get(window),
                                 (now - timer) / timed_steps if timed_steps else float("nan"))
          window, timed_steps, last_logged, timer = None, 0, step, now
        if step % t.eval_every == 0 or step == t.total_steps:
          last.update(self._evaluate(step, state.params))
        if save:
          self.checkpointer.save(step, state, data_state)
        if stop:
          logging.warning("Preemption notice (SIGTERM): saved step %d and stopped.", step)
          break
    return last

  def _log_train(self, step, last_logged, host, seconds_per_step):
    if not all(math.isfinite(float(s)) for s, _ in host.values()):
      latest = self.checkpointer.latest_step()
      kept = f"the last checkpoint (step {latest}) is kept" if latest else "no checkpoint was written"
      raise NonFiniteLossError(
          f"Non-finite loss, gradients or parameters between steps {last_logged + 1} and {step}; "
          f"{kept}. Lower --config.optimizer.peak_lr or check the data.")
    scalars = step_lib.finalize_metrics(host)
    scalars["tokens_per_sec"] = self.tokens_per_step / seconds_per_step
    if self.mfu_denominator:
      scalars["mfu"] = scalars["tokens_per_sec"] / self.mfu_denominator
    eta = (self.config.train.total_steps - step) * seconds_per_step
    self.writer.write(step, scalars)
    metrics_lib.print_progress(metrics_lib.progress_line(step, self.config.train.total_steps,
                                                         scalars, eta))
    return scalars

  def _evaluate(self, step, params):
    if not self.eval_batches:
      return {}
    total = None
    for batch in self.eval_batches:
      m = self.eval_step(params, batch)
      total = m if total is None else step_lib.accumulate_metrics(total, m)
    scalars = step_lib.finalize_metrics(jax.device_get(total))
    self.writer.write(step, scalars, prefix="eval_")
    metrics_lib.print_progress(f"eval @ {step}: " + ", ".join(
        f"{k} {v:.4f}" for k, v in sorted(scalars.items())))
    return {f"eval_{k}": v for k, v in scalars.items()}

