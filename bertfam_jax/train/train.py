"""Pre-training: a config's objective, data and model set up for the one loop (`train/loop.py`).

Resume precedence: a checkpoint in WORKDIR/checkpoints → `config.train.init_from` (its parameters,
or with `train.init_state='all'` its step and optimizer state too, continuing one schedule) →
fresh initialisation. A run stops at `train.stop_step` (0: `train.total_steps`), while its
learning-rate schedule spans `train.total_steps`. The data position is stored with each checkpoint, so a resumed run sees
exactly the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

import os

import jax
from absl import logging
from jax.experimental import multihost_utils

from bertfam_jax import config_lib, objectives
from bertfam_jax import workdir as workdir_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.data import pipeline as pipeline_lib
from bertfam_jax.data import sources, tokenizers
from bertfam_jax.train import checkpoint as checkpoint_lib
from bertfam_jax.train import loop as loop_lib
from bertfam_jax.train import metrics as metrics_lib
from bertfam_jax.train import sharding as sharding_lib
from bertfam_jax.train import step as step_lib


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


def _tokenizer(config, train_docs, workdir, resuming: bool):
  """A resumed run's tokenizer is the one its workdir holds (never retrained, whatever the cache
  or the corpus now give; a workdir from before workdirs held it: the one cached for its corpus,
  else refused) unless the config names one (`workdir.check_resumable` then compares
  them); otherwise `tokenizers.load_or_train`: process 0 trains (or loads) it first, the others
  then find it in a shared cache, or train the identical model themselves where hosts have
  separate disks."""
  if resuming and not config.tokenizer.model_path:
    return workdir_lib.load_tokenizer(config, workdir)   # refuses one it cannot find
  if not tokenizers.is_available(config):
    metrics_lib.print_progress(f"Training a {tokenizers.num_pieces(config)}-piece SentencePiece "
                               f"tokenizer on the corpus (cached for later runs)...")
  if jax.process_count() == 1:
    return tokenizers.load_or_train(config, train_docs, workdir)
  if jax.process_index() == 0:
    tokenizer = tokenizers.load_or_train(config, train_docs, workdir)
  multihost_utils.sync_global_devices("bertfam_jax:tokenizer")
  if jax.process_index() != 0:
    tokenizer = tokenizers.load_or_train(config, train_docs, workdir)
  return tokenizer


def check_memory(config) -> None:
  """Refuses a config whose memory floor (`config_lib.memory_floor_bytes`) exceeds what the
  devices have (host memory for CPU devices, which share it), before anything is allocated.
  Each process sees its own devices; the whole job is taken as that many times as large."""
  devices = jax.local_devices()
  limits = [(d.memory_stats() or {}).get("bytes_limit") for d in devices]
  if all(limits) and devices[0].platform != "cpu":
    available, where = sum(limits) * jax.process_count(), f"the {jax.device_count()} devices"
  else:
    available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * jax.process_count()
    where = f"the {jax.process_count()} host(s)"
  needed = config_lib.memory_floor_bytes(config)
  if needed > available:
    raise ConfigError(
        f"This model and batch need at least {needed / 2**30:,.1f} GiB (parameters, gradients and "
        f"one activation per layer and token) but {where} have {available / 2**30:,.1f} GiB: "
        f"lower model.hidden / layers / mlp / vocab_size or train.batch_size / data.seq_len (or "
        f"raise train.grad_accum_steps).")


def _initial_state(config, model, tx, abstract, shardings, checkpointer, inputs, carry):
  """Returns (state, data_states, resumed_step) following the resume precedence, data_states
  being the checkpoint's data positions of every process (None when starting); `inputs` trace
  `model.init` (`objectives.init_inputs`), `carry` is its abstract step-to-step state."""
  latest = checkpointer.latest_step()
  if latest is not None:
    state, data_states = checkpointer.restore_every_process(latest, abstract)
    return state, data_states, latest
  start = None if config.train.init_from else objectives.initial_params(
      objectives.get(config.objective.name), config, workdir_lib.restore_params)
  if start is not None:   # the objective's own starting point (DistilBERT: its teacher's)
    return (step_lib.state_of(step_lib.place(start, abstract.params), tx, shardings, carry),
            None, None)
  state = step_lib.init_state(model, tx, shardings, config.seed, inputs, carry)
  if config.train.init_from:
    source = checkpoint_lib.Checkpointer(config.train.init_from, keep=1, read_only=True)
    step = source.latest_step()
    restored, _ = source.restore(step, abstract)
    source.close()
    continuing = config.train.init_state == "all"
    state = restored if continuing else state.replace(params=restored.params)
    logging.info("Initialised %s from %s step %d.", "the state (step, optimizer)" if continuing
                 else "parameters", config.train.init_from, step)
  return state, None, None


def run(config, workdir: str) -> dict[str, float]:
  """Trains `config` in `workdir`; returns the last logged train scalars (and eval ones).

  Everything that can refuse the run (the config's values, the workdir, the corpus, the
  tokenizer, a resume that does not match, the model's memory, the data pipeline) runs before
  anything is written; the workdir's files are written once set-up has succeeded
  (`workdir.record`), and stay provisional until the first checkpoint."""
  objectives.validate(config)
  workdir_lib.check_writable(workdir)
  mesh = sharding_lib.make_mesh(config.mesh)
  local_batch = check_batch(config, mesh)
  objective = objectives.get(config.objective.name)

  metrics_lib.print_progress(f"Reading the corpus (data.source={config.data.source})...")
  train_docs = sources.get_documents(config.data, "train")
  eval_docs = sources.get_documents(config.data, "eval")
  if not len(train_docs):
    raise ConfigError(f"The corpus has no training documents (all {len(eval_docs)} are held out "
                      f"by data.eval_fraction={config.data.eval_fraction}); give it more text or "
                      f"lower --config.data.eval_fraction.")
  check_memory(config)
  data_identity = sources.data_identity(config.data)
  # Read once, on every process (orbax's reader syncs them): the workdir holds a checkpoint.
  resuming = workdir_lib.latest_step(workdir) is not None
  tokenizer = _tokenizer(config, train_docs, workdir, resuming)
  workdir_lib.check_resumable(workdir, config, tokenizer, data_identity, resuming=resuming)
  init_from = config.train.init_from
  if init_from and not resuming and checkpoint_lib.read_latest_step(init_from) is None:
    raise ConfigError(f"train.init_from={init_from} holds no checkpoint; point it at a run's "
                      f"checkpoints directory.")
  metrics_lib.print_progress(f"{objectives.describe(objective, config)}; {len(train_docs)} train "
                             f"/ {len(eval_docs)} eval documents; mesh {dict(mesh.shape)}.")

  model, tx, schedule, inputs, carry, abstract, shardings = step_lib.train_parts(config, mesh,
                                                                                  objective)

  features_fn = objective.make_features(config, tokenizer)
  pipe_args = dict(process_index=jax.process_index(), process_count=jax.process_count(),
                   local_batch_size=local_batch, **objectives.pipeline_options(objective, config))
  train_pipe = pipeline_lib.Pipeline(config, tokenizer, train_docs, features_fn, **pipe_args)
  try:
    evaluators = []
    if len(eval_docs) and config.train.eval_batches:
      eval_pipe = pipeline_lib.Pipeline(config, tokenizer, eval_docs, features_fn, **pipe_args)
      eval_batches = [pipeline_lib.make_global_batch(b, mesh, sharding_lib.BATCH_SPEC)
                      for b in eval_pipe.eval_batches(config.train.eval_batches)]
      eval_pipe.close()
      eval_step = step_lib.make_eval_step(model, objective.loss_fn, config, shardings, mesh)
      evaluators.append(loop_lib.Evaluator(config.train.eval_every, lambda _, params: evaluate(
          eval_step, params, eval_batches)))
    train_step = step_lib.make_train_step(model, tx, schedule, objective.loss_fn, config,
                                          shardings, mesh)
    train_pipe.peek()   # a corpus too small for one batch is refused here
    # Set-up is complete: from here on the workdir is written.
    workdir_lib.record(workdir, config, tokenizer, data_identity, resuming=resuming)
    return _train(config, workdir, objective, train_pipe, train_step, evaluators, mesh,
                  (model, tx, abstract, shardings, inputs, carry))
  finally:
    train_pipe.close()


def _train(config, workdir, objective, train_pipe, train_step, evaluators, mesh, built):
  """The checkpointer, the initial or restored state, the metrics writer, and the loop."""
  model, tx, abstract, shardings, inputs, carry = built
  with_ctx = lambda fn: step_lib.with_mesh_context(fn, mesh)  # noqa: E731
  checkpointer = checkpoint_lib.Checkpointer(os.path.join(workdir, workdir_lib.CHECKPOINTS),
                                             config.train.keep_checkpoints)
  writer = None
  try:
    t = config.train
    stop = t.stop_step or t.total_steps  # the schedule spans total_steps whatever the stop
    # The step compiles while the state is drawn or restored, not after (step.compile_ahead);
    # a finished run compiles nothing.
    latest = checkpointer.latest_step()
    compiling = (step_lib.compile_ahead(train_step, abstract, step_lib.abstract_batch(
        train_pipe.peek(), mesh, jax.process_count()), mesh)
                 if latest is None or latest < stop else None)
    state, data_states, resumed_step = with_ctx(_initial_state)(
        config, model, tx, abstract, shardings, checkpointer, inputs, carry)
    if data_states is not None:
      train_pipe.restore(data_states)
    writer = metrics_lib.MetricsWriter(workdir, resume_step=resumed_step, config=config)
    if compiling is not None:
      metrics_lib.print_progress("Compiling the train step (the first step)...")
      compiling.result()
    _, last = loop_lib.train(
        state, train_step, train_pipe, mesh=mesh, total_steps=stop,
        log_every=t.log_every, checkpoint_every=t.checkpoint_every,
        tokens_per_step=t.batch_size * config.data.seq_len,
        flops_per_token=objective.flops_per_token(config), evaluators=evaluators,
        sinks=loop_lib.Sinks(writer, checkpointer, loop_lib.Profiler.of(config, workdir)))
    return last
  finally:
    checkpointer.close()
    if writer is not None:
      writer.close()


def evaluate(eval_step, params, batches) -> dict[str, float]:
  """The mean of `eval_step(params, batch)`'s {metric: (sum, count)} over the held-out batches."""
  total = None
  for batch in batches:
    m = eval_step(params, batch)
    total = m if total is None else step_lib.accumulate_metrics(total, m)
  return step_lib.finalize_metrics(jax.device_get(total))
