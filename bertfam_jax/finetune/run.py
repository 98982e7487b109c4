"""The fine-tuning run behind `python -m bertfam_jax.main --config=configs/finetune.py:task=NAME,
init=PATH --workdir=W`: one task, one pre-trained encoder, one head.

  init      a pre-training workdir of ours, one written by `python -m bertfam_jax.hf import`, or a
            transformers checkpoint directory (imported in memory)
  task      `finetune/tasks.py` (raw examples) → `finetune/features.py` (arrays) →
            `models/finetune.py` (encoder + the task's head) → `finetune/losses.py`
  optimizer `finetune/optim.py`: BERT's AdamW, warmup + linear decay, layer-wise decay, frozen
            layers, adapters

Training runs on the configured mesh with the train loop's sharded step (`train/step.py`);
checkpoints after every epoch, and at a preemption notice (SIGTERM, `train/preemption.py`), make
a stopped run resume exactly (batches are a pure function of seed and step). After every epoch
the evaluation split is predicted and scored; the workdir gets

  config.json          the resolved config (the encoder's `model` and `tokenizer` included)
  metrics.jsonl        training records every `train.log_every` steps and eval_* per epoch
  eval_results.json    the last evaluation: task, split, step, examples, scores, trained fraction
  predictions.jsonl    one line per evaluation example: its id / index, prediction and gold label
  checkpoints/<step>/  the fine-tuned state (latest `train.keep_checkpoints`)

A T5 `init` is fine-tuned text-to-text by `finetune/seq2seq.py` through the same
`train_and_evaluate` (a `Recipe` of its model, optimizer and loss, and its decoding as the score).
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from typing import Any, Callable, NamedTuple

from absl import logging
import flax.linen as nn
from flax import traverse_util
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from bertfam_jax import config_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.data import pipeline as pipeline_lib
from bertfam_jax.finetune import classify, features, optim, tasks
from bertfam_jax.finetune import losses as finetune_losses
from bertfam_jax.models import finetune as finetune_models
from bertfam_jax.train import checkpoint as checkpoint_lib
from bertfam_jax.train import metrics as train_metrics
from bertfam_jax.train import preemption
from bertfam_jax.train import sharding as sharding_lib
from bertfam_jax.train import step as step_lib
from bertfam_jax.train import train as train_lib

INPUT_KEYS = ("input_ids", "input_mask", "segment_ids")
LABEL_KEYS = ("label", "labels", "label_weights", "start_position", "end_position")


# ------------------------------------------------------------------------------------ the encoder


def model_config(init_model: ml_collections.ConfigDict, ft) -> ml_collections.ConfigDict:
  """The pre-trained `model` section with the fine-tuning changes: adapters when
  `method='adapters'`."""
  m = ml_collections.ConfigDict(init_model.to_dict())
  if ft.method == "adapters":
    m.adapter_size = ft.adapter_size
  return m


def transfer_pretrained(fresh, pretrained, *, reuse_pooler: bool):
  """The fresh fine-tuning parameters with every pre-trained encoder leaf copied in.

  Args:
    fresh: {'encoder', <head>, ['scalar_mix']} of the fine-tuning model.
    pretrained: the pre-trained run's parameters ({'encoder', 'mlm_head', ['sentence_head']...}).
    reuse_pooler: copy the pre-trained pooler (`sentence_head/pooler`, BERT's NSP pooler) into
      the head's pooler, as run_classifier.py and HF's *ForSequenceClassification do.

  Leaves the fresh encoder has and the pre-trained one lacks must be adapters (added for
  fine-tuning); any other difference is a ConfigError.
  """
  flat_fresh = traverse_util.flatten_dict(fresh["encoder"], sep="/")
  flat_given = traverse_util.flatten_dict(pretrained["encoder"], sep="/")
  unexpected = sorted(set(flat_given) - set(flat_fresh))
  missing = sorted(k for k in set(flat_fresh) - set(flat_given) if "adapter" not in k)
  wrong = sorted(k for k in set(flat_fresh) & set(flat_given)
                 if np.shape(flat_fresh[k]) != np.shape(flat_given[k]))
  if unexpected or missing or wrong:
    detail = "; ".join(f"{name}: {keys[:3]}" for name, keys in
                       (("unexpected", unexpected), ("missing", missing), ("shape", wrong)) if keys)
    raise ConfigError(f"The pre-trained encoder does not fit the fine-tuning model ({detail}); "
                      f"the model section comes from `finetune.init`, do not override it.")
  merged = dict(fresh)
  merged["encoder"] = traverse_util.unflatten_dict(
      {k: jnp.asarray(flat_given.get(k, v), dtype=v.dtype) for k, v in flat_fresh.items()},
      sep="/")
  pooler = pretrained.get("sentence_head", {}).get("pooler")
  for head in ("classification_head", "choice_head"):
    if reuse_pooler and pooler is not None and head in merged:
      merged[head] = dict(merged[head], pooler=jax.tree.map(jnp.asarray, pooler))
  return merged


# ---------------------------------------------------------------------------------------- batches


def epoch_order(num_examples: int, batch_size: int, seed: int, step: int) -> np.ndarray:
  """The [batch_size] example indices of global step `step` (0-based): epoch e = step // per_epoch
  is a fresh permutation from (seed, e), its last partial batch dropped (run_classifier.py's
  shuffle + drop_remainder). A pure function of (seed, step), so a resumed run sees the batches an
  uninterrupted one would."""
  per_epoch = num_examples // batch_size
  epoch, index = divmod(step, per_epoch)
  order = np.random.default_rng([seed, epoch]).permutation(num_examples)
  return order[index * batch_size:(index + 1) * batch_size]


def local_rows(global_rows: np.ndarray) -> np.ndarray:
  """This process's contiguous share of a global batch's rows."""
  share = len(global_rows) // jax.process_count()
  return global_rows[jax.process_index() * share:(jax.process_index() + 1) * share]


def take(data: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
  return {k: v[rows] for k, v in data.items()}


# ------------------------------------------------------------------------------------------- run


def prepare_workdir(workdir: str, task: str) -> None:
  """`train.prepare_workdir`, then refuses, before anything in it is read or written, a workdir
  that holds another run than a fine-tuning on `task` (a pre-training run, or a fine-tuning on
  another task): its checkpoints would otherwise be resumed as this run's."""
  train_lib.prepare_workdir(workdir)
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    return
  with open(path) as f:
    saved = json.load(f).get("finetune", {}).get("task")
  if saved != task:
    held = f"a fine-tuning on {saved!r}" if saved else "a pre-training run"
    raise ConfigError(f"--workdir={workdir} holds {held}, not a fine-tuning on {task!r}, and "
                      f"is left untouched; use a new --workdir.")


def check_batches(config, mesh) -> None:
  """`train.check_batch` for the training batches, and the same divisibility for the evaluation
  batches (`train.eval_batch_size`), which are split over the mesh's batch axes too."""
  train_lib.check_batch(config, mesh)
  eval_batch, dp = config.train.eval_batch_size, sharding_lib.data_parallel_size(mesh)
  multiple = math.lcm(dp, jax.process_count())
  if eval_batch % multiple:
    raise ConfigError(f"train.eval_batch_size={eval_batch} is not divisible by the data-parallel "
                      f"size {dp} (mesh data×fsdp) and the {jax.process_count()} processes; use a "
                      f"multiple of {multiple}.")


def is_text_to_text(init: str) -> bool:
  """Whether `init` is a T5, fine-tuned text-to-text (`finetune/seq2seq.py`): one of our T5
  workdirs, or a transformers T5 checkpoint directory (config.json's model_type 't5')."""
  path = os.path.join(init, "config.json")
  if not os.path.exists(path):
    return False
  with open(path) as f:
    config = json.load(f)
  if classify.is_transformers_checkpoint(init):
    return config.get("model_type") == "t5"
  return config.get("model", {}).get("kind") == "t5"


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Fine-tunes and evaluates `config.finetune` in `workdir`; returns the last eval_results."""
  ft = config.finetune
  config_lib.validate_finetune(config)
  if is_text_to_text(ft.init):
    from bertfam_jax.finetune import seq2seq  # pylint: disable=g-import-not-at-top
    return seq2seq.run(config, workdir)
  task = tasks.get(ft.task)
  prepare_workdir(workdir, ft.task)
  init_config, tokenizer, pretrained = classify.load_pretrained(ft.init)
  if init_config.model.get("kind") == "xlnet":
    if ft.method == "adapters":
      raise ConfigError("Adapters are built into the BERT-family encoder only; fine-tune XLNet "
                        "with --config.finetune.method=full.")
    # The XLNet module is the whole pre-trained model: all but the output bias is the backbone
    # (its mask_emb, the query stream's start, is kept and unused).
    pretrained = {"encoder": {k: v for k, v in pretrained.items() if k != "lm_loss"}}
  resolved = resolved_config(config, init_config)
  if ft.max_seq_len > resolved.model.get("max_positions", ft.max_seq_len):
    raise ConfigError(f"finetune.max_seq_len={ft.max_seq_len} exceeds the encoder's "
                      f"max_positions={resolved.model.max_positions}; pass "
                      f"--config.finetune.max_seq_len={resolved.model.max_positions} or less.")
  mesh = sharding_lib.make_mesh(config.mesh)
  check_batches(resolved, mesh)
  checkpoint_lib.check_or_write_config(workdir, resolved)
  _keep_hf_source(ft.init, init_config, workdir)

  start = time.time()
  load = lambda split, limit: task.load(split, data_dir=ft.data_dir,  # noqa: E731
                                        max_examples=limit or None)
  train_examples = load(ft.train_split or task.train_split, ft.max_train_examples)
  eval_examples = load(ft.eval_split or task.eval_split, ft.max_eval_examples)
  train_data = featurize(task, tokenizer, train_examples, resolved, training=True)
  eval_data = featurize(task, tokenizer, eval_examples, resolved, training=False)
  num_train = len(train_data["input_ids"])
  batch_size = config.train.batch_size
  if num_train < batch_size:
    raise ConfigError(f"{ft.task} has {num_train} training rows, fewer than train.batch_size="
                      f"{batch_size}; lower the batch size or raise finetune.max_train_examples.")
  total_steps = max(1, int(num_train / batch_size * ft.epochs))
  steps_per_epoch = num_train // batch_size
  train_metrics.print_progress(
      f"{ft.task} ({task.kind}): {len(train_examples)} train examples → {num_train} rows, "
      f"{len(eval_examples)} {ft.eval_split or task.eval_split} examples; {total_steps} steps of "
      f"{batch_size} ({ft.epochs:g} epochs); data ready in {time.time() - start:.1f} s.")

  model, example = build_model(resolved)
  shapes = _abstract_params(model, example)
  tx, schedule = make_optimizer(resolved, shapes, total_steps)
  fraction = optim.trainable_fraction(ft, resolved.model, shapes)
  train_metrics.print_progress(f"method {ft.method}: {100 * fraction:.2f}% of the parameters "
                               f"are trained.")
  transfer = None if ft.from_scratch else functools.partial(
      transfer_pretrained, pretrained=pretrained, reuse_pooler=ft.reuse_pooler)

  def make_score(shardings):
    return functools.partial(evaluate, task, _make_predict(model, shardings, mesh),
                             eval_data=eval_data, eval_examples=eval_examples,
                             tokenizer=tokenizer, config=resolved, mesh=mesh)

  return train_and_evaluate(
      resolved, workdir, mesh, Recipe(model, example, tx, schedule, _make_loss_fn(task.kind)),
      transfer=transfer, make_score=make_score, train_data=train_data, total_steps=total_steps,
      steps_per_epoch=steps_per_epoch, extra=dict(trained_fraction=fraction))


def featurize(task, tokenizer, examples, config, training: bool) -> dict[str, np.ndarray]:
  """`features.featurize`, then every array the train step does not read dropped from training
  data, and the segment ids zeroed for encoders with one token type (RoBERTa: its pairs are
  `<s> A </s></s> B </s>`, all type 0)."""
  data = features.featurize(task, tokenizer, examples, config.finetune, training)
  if config.model.get("type_vocab_size", 2) <= 1:  # XLNet's relative segments: A vs B matters
    data["segment_ids"] = np.zeros_like(data["segment_ids"])
  if training:
    data = {k: v for k, v in data.items() if k in INPUT_KEYS + LABEL_KEYS}
  return data


def _keep_hf_source(init: str, init_config, workdir: str) -> None:
  """A run of an imported or transformers checkpoint keeps that checkpoint's record (family and
  config.json, `hf.workdir.hf_source`) in its workdir, so that exporting it does not depend on
  `init` staying where it is."""
  if init_config.tokenizer.kind != "hf" or jax.process_index() != 0:
    return
  from bertfam_jax.hf import workdir as hf_workdir  # pylint: disable=g-import-not-at-top
  record = hf_workdir.hf_source(init)
  if record:
    path = os.path.join(workdir, hf_workdir.IMPORT_RECORD)
    with open(path + ".tmp", "w") as f:
      json.dump(record, f, indent=2)
    os.replace(path + ".tmp", path)


def resolved_config(config, init_config) -> ml_collections.ConfigDict:
  """The fine-tuning config plus the pre-trained run's model, tokenizer and objective sections
  (the tokenizer path made absolute), as written to config.json."""
  resolved = ml_collections.ConfigDict(config.to_dict())
  resolved.model = model_config(init_config.model, config.finetune)
  resolved.tokenizer = ml_collections.ConfigDict(init_config.tokenizer.to_dict())
  resolved.tokenizer.model_path = classify.tokenizer_location(init_config, config.finetune.init)
  resolved.objective = ml_collections.ConfigDict(init_config.objective.to_dict())
  return resolved


def build_model(config) -> tuple[finetune_models.FineTuneModel, dict[str, np.ndarray]]:
  """The fine-tuning model of a resolved config and inputs that trace its `init` ([1, 8] rows;
  [1, 2, 8] for multiple choice): parameter shapes depend on neither length."""
  task = tasks.get(config.finetune.task)
  model = finetune_models.FineTuneModel(
      ml_collections.FrozenConfigDict(config.model), task.kind, task.num_outputs,
      features=config.finetune.features, backbone=finetune_models.backbone_for(config.model))
  shape = (1, 2, 8) if task.kind == "multiple_choice" else (1, 8)
  example = dict(input_ids=np.zeros(shape, np.int32), input_mask=np.ones(shape, np.int32),
                 segment_ids=np.zeros(shape, np.int32))
  return model, example


def make_optimizer(config, param_shapes, total_steps: int):
  """(tx, schedule) of `finetune/optim.py` for the model's parameter tree (shapes suffice)."""
  return optim.make_finetune_optimizer(config.finetune, config.model, param_shapes, total_steps)


def model_and_optimizer(config):
  """(model, tx, init inputs) of a fine-tuning run's config: what its checkpoints hold (the
  optimizer state's structure does not depend on the schedule's length), a T5's included."""
  if config.model.get("kind") == "t5":
    from bertfam_jax.finetune import seq2seq  # pylint: disable=g-import-not-at-top
    recipe = seq2seq.make_recipe(config.model, 1, config.finetune.peak_lr)
    return recipe.model, recipe.tx, recipe.example
  model, example = build_model(config)
  tx, _ = make_optimizer(config, _abstract_params(model, example), total_steps=1)
  return model, tx, example


def _abstract_params(model, example):
  rng = jax.random.key(0)
  boxed = jax.eval_shape(lambda: model.init({"params": rng}, *(example[k] for k in INPUT_KEYS),
                                            deterministic=True))
  return nn.meta.unbox(boxed)


def _make_loss_fn(kind: str) -> Callable:
  def loss_fn(model, params, batch, rng, config, *, deterministic=False):
    del config
    outputs = model.apply(params, *(batch[k] for k in INPUT_KEYS), deterministic=deterministic,
                          rngs={"dropout": rng})
    return finetune_losses.task_loss(kind, outputs, batch)
  return loss_fn


def _make_predict(model, shardings, mesh):
  """Jitted `predict(params, inputs) -> outputs` of the encoder (`sharded_predict`)."""
  def predict(params, inputs):
    return model.apply(params, *(inputs[k] for k in INPUT_KEYS), deterministic=True)
  return sharded_predict(predict, shardings.params, mesh)


def sharded_predict(predict: Callable, param_shardings, mesh):
  """`predict(params, inputs) -> outputs` jitted on `mesh`: parameters as `param_shardings`,
  inputs split over the batch axes, outputs replicated on every device (and process)."""
  return step_lib.with_mesh_context(jax.jit(
      predict, in_shardings=(param_shardings, sharding_lib.batch_sharding(mesh)),
      out_shardings=NamedSharding(mesh, P())), mesh)


# -------------------------------------------------------------------- the shared training loop


class Recipe(NamedTuple):
  """What a fine-tuning run trains, for `step.make_train_step`: the model, the keyword inputs
  that trace its `init`, the optimizer and its schedule, and
  `loss_fn(model, params, batch, rng, config, *, deterministic) -> (loss, {metric: (sum, n)})`."""
  model: Any
  example: dict[str, np.ndarray]
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  loss_fn: Callable


def sharded_setup(recipe: Recipe, config, mesh):
  """(abstract state, its shardings, jitted `train_step(state, batch)`) of `recipe` on `mesh`:
  parameters and optimizer state sharded by the model's logical axes (`step.abstract_state`)."""
  abstract, shardings = step_lib.with_mesh_context(step_lib.abstract_state, mesh)(
      recipe.model, recipe.tx, config, mesh, recipe.example)
  train_step = step_lib.make_train_step(recipe.model, recipe.tx, recipe.schedule, recipe.loss_fn,
                                        config, shardings, mesh)
  return abstract, shardings, train_step


def fresh_state(recipe: Recipe, config, shardings, mesh,
                transfer: Callable | None) -> step_lib.TrainState:
  """A new state in `shardings`: parameters initialised from `config.seed`, then, unless
  `transfer` is None, replaced by `transfer(the fresh 'params' tree on the host)` (the
  pre-trained weights) under a fresh optimizer state."""
  with_ctx = lambda fn: step_lib.with_mesh_context(fn, mesh)  # noqa: E731
  state = with_ctx(step_lib.init_state)(recipe.model, recipe.tx, config, shardings, config.seed,
                                        recipe.example)
  if transfer is None:
    return state
  params = transfer(jax.device_get(state.params["params"]))
  return with_ctx(_fresh_optimizer_state)(recipe.tx, {"params": params}, shardings)


def _fresh_optimizer_state(tx, params, shardings) -> step_lib.TrainState:
  return jax.jit(lambda p: step_lib.TrainState(step=jnp.zeros([], jnp.int32), params=p,
                                               opt_state=tx.init(p)),
                 out_shardings=shardings)(params)


def train_and_evaluate(config, workdir: str, mesh, recipe: Recipe, *, transfer: Callable | None,
                       make_score: Callable, train_data: dict[str, np.ndarray],
                       total_steps: int, steps_per_epoch: int, extra: dict) -> dict[str, Any]:
  """The resumable, sharded fine-tuning run in `workdir` (the encoder's and the T5's).

  Args:
    config: the resolved config (seed, train, mesh, ... as written to config.json).
    mesh: the device mesh of `config.mesh`.
    recipe: what trains (`Recipe`).
    transfer: `fresh_state`'s pre-trained weights, or None to train from scratch.
    make_score: `make_score(state shardings) -> score(params)`, the evaluation of `_loop`.
    train_data: {name: [rows, ...]} training arrays, batches drawn by `epoch_order`.
    total_steps, steps_per_epoch: updates in all, and between evaluations and checkpoints.
    extra: entries added to every evaluation's results.

  The latest checkpoint in WORKDIR/checkpoints is restored when there is one (any mesh), else
  the state starts fresh. Returns the last evaluation's results, without its predictions.
  """
  abstract, shardings, train_step = sharded_setup(recipe, config, mesh)
  checkpointer = checkpoint_lib.Checkpointer(os.path.join(workdir, "checkpoints"),
                                             config.train.keep_checkpoints)
  writer = None
  try:
    latest = checkpointer.latest_step()
    if latest is not None:
      state, _ = checkpointer.restore(latest, abstract)
      train_metrics.print_progress(f"Resumed from step {latest}.")
    else:
      state = fresh_state(recipe, config, shardings, mesh, transfer)
    writer = train_metrics.MetricsWriter(workdir, resume_step=latest)
    return _loop(config, state, train_step, make_score(shardings), train_data, total_steps,
                 steps_per_epoch, mesh, checkpointer, writer, workdir, extra)
  finally:
    checkpointer.close()
    if writer is not None:
      writer.close()


def train_loop(state, train_step, train_data: dict[str, np.ndarray], *, config, total_steps: int,
               mesh, on_log: Callable | None = None, every: int = 0,
               on_every: Callable | None = None, stop: Callable | None = None,
               on_stop: Callable | None = None):
  """Steps `state` from `state.step` to `total_steps` and returns it.

  Global step s trains on the rows `epoch_order(rows, train.batch_size, seed, s)` of train_data
  ({name: [rows, ...]}), split over the mesh's batch axes: a resumed run sees the batches an
  uninterrupted one would. `on_log(step, {metric: mean})` follows every `train.log_every` steps
  and the last (metrics are fetched only then, so dispatch runs ahead of the host);
  `on_every(step, state)` every `every` steps and after the last. `stop(step)` is asked after
  every step (`preemption.Watch.reached`); when it says True, `on_stop(step, state)` follows
  (after that step's `on_every`, if any) and the loop ends there.
  """
  t = config.train
  step = int(jax.device_get(state.step))
  num_rows = len(next(iter(train_data.values())))
  window = None
  while step < total_steps:
    rows = local_rows(epoch_order(num_rows, t.batch_size, config.seed, step))
    batch = pipeline_lib.make_global_batch(take(train_data, rows), mesh, sharding_lib.BATCH_SPEC)
    state, metrics = train_step(state, batch)
    step += 1
    window = metrics if window is None else step_lib.accumulate_metrics(window, metrics)
    stopping = stop is not None and stop(step)
    if on_log is not None and (step % t.log_every == 0 or step == total_steps or stopping):
      on_log(step, step_lib.finalize_metrics(jax.device_get(window)))
      window = None
    if on_every is not None and (step % every == 0 or step == total_steps):
      on_every(step, state)
    if stopping:
      on_stop(step, state)
      break
  return state


def _loop(config, state, train_step, score: Callable, train_data, total_steps: int,
          steps_per_epoch: int, mesh, checkpointer, writer, workdir: str, extra: dict):
  """`train_loop` to `total_steps`, its metrics logged; after every epoch (and the last step)
  `score(params)` evaluates, the results are logged and written, and a checkpoint saved.
  Returns the last results."""
  t = config.train
  results, timer = {}, time.perf_counter()

  def log(step: int, scalars: dict[str, float]) -> None:
    nonlocal timer
    seconds = time.perf_counter() - timer
    writer.write(step, scalars)
    train_metrics.print_progress(
        f"step {step}/{total_steps} | loss {scalars['loss']:.4f} | lr "
        f"{scalars['learning_rate']:.2e} | ETA "
        f"{train_metrics.format_duration(seconds / t.log_every * (total_steps - step))}")
    timer = time.perf_counter()

  def evaluate_and_write(step: int, params) -> dict[str, Any]:
    results = dict(score(params), step=step, **extra)
    writer.write(step, results["scores"], prefix="eval_")
    train_metrics.print_progress(f"eval @ {step}: " + ", ".join(
        f"{k} {v:.4f}" for k, v in sorted(results["scores"].items())))
    write_results(workdir, results)
    return results

  def end_of_epoch(step: int, state) -> None:
    nonlocal results
    results = evaluate_and_write(step, state.params)
    checkpointer.save(step, state, {"step": step})

  def preempted(step: int, state) -> None:
    if step % steps_per_epoch and step != total_steps:  # else end_of_epoch has just saved it
      checkpointer.save(step, state, {"step": step})
    logging.warning("Preemption notice (SIGTERM): saved step %d and stopped.", step)

  with preemption.Watch() as watch:
    state = train_loop(state, train_step, train_data, config=config, total_steps=total_steps,
                       mesh=mesh, on_log=log, every=steps_per_epoch, on_every=end_of_epoch,
                       stop=watch.reached, on_stop=preempted)
  step = int(jax.device_get(state.step))
  if step >= total_steps and not results:  # resumed after the last step: score it again
    results = evaluate_and_write(step, state.params)
  # (preempted before the end: the results so far; the resumed run evaluates the rest)
  return {k: v for k, v in results.items() if k != "predictions"}


# ------------------------------------------------------------------------------------ evaluation


def predict_all(predict, params, data: dict[str, np.ndarray], batch_size: int, mesh,
                keys: tuple[str, ...] = INPUT_KEYS):
  """Model outputs for every row of `data` (its `keys` are the inputs), as host numpy
  [rows, ...]. Each call has the same global shape: the last batch is padded by repeating its
  final row."""
  rows = len(data["input_ids"])
  outputs = []
  for start in range(0, rows, batch_size):
    index = np.arange(start, start + batch_size).clip(max=rows - 1)
    batch = pipeline_lib.make_global_batch(take({k: data[k] for k in keys},
                                                local_rows(index)), mesh, sharding_lib.BATCH_SPEC)
    outputs.append(predict(params, batch))
  outputs = jax.device_get(outputs)
  return np.concatenate(outputs)[:rows]


def evaluate(task, predict, params, *, eval_data, eval_examples, tokenizer, config, mesh
             ) -> dict[str, Any]:
  """Predicts the evaluation split and scores it with the task's metrics.

  Returns: task, split, examples, scores {metric: value}, main_metric, predictions (one dict per
  example: its index (and id where the task has one), prediction, gold label)."""
  ft = config.finetune
  outputs = predict_all(predict, params, eval_data, config.train.eval_batch_size, mesh)
  predictions = features.decode_predictions(task, outputs, eval_data, eval_examples, tokenizer, ft)
  scores = task.score(eval_examples, predictions)
  return dict(task=ft.task, split=ft.eval_split or task.eval_split, examples=len(eval_examples),
              main_metric=task.main_metric, scores=scores,
              predictions=[dict(index=i, **({"id": e["id"]} if "id" in e else {}),
                                prediction=_jsonable(p), label=_jsonable(g))
                           for i, (e, p, g) in enumerate(zip(eval_examples, predictions,
                                                             task.gold(eval_examples)))])


def _jsonable(value):
  if isinstance(value, np.ndarray):
    return value.tolist()
  if isinstance(value, np.generic):
    return value.item()
  return value


def write_results(workdir: str, results: dict) -> None:
  if jax.process_index() != 0:
    return
  summary = {k: v for k, v in results.items() if k != "predictions"}
  for name, payload in (("eval_results.json", json.dumps(summary, indent=2) + "\n"),
                        ("predictions.jsonl", "".join(json.dumps(p) + "\n"
                                                      for p in results["predictions"]))):
    path = os.path.join(workdir, name)
    with open(path + ".tmp", "w") as f:
      f.write(payload)
    os.replace(path + ".tmp", path)
