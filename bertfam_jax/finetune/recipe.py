"""A fine-tuning run on the one train loop (`train/loop.py`), for an encoder's task
(`finetune/run.py`) and a T5's text-to-text task (`finetune/seq2seq.py`) alike.

A `Recipe` says what trains (model, optimizer, loss, the pre-trained weights), on what rows, and
how it is scored; `train_and_evaluate` runs it: sharded on a mesh, rows drawn by
`loop.EpochSource` (a fresh permutation every epoch, a pure function of seed and step), an
evaluation of the whole evaluation split after every epoch and the last step, and, with a
workdir, metrics, checkpoints at those evaluations and at a preemption notice, exact resume, and
the evaluation's eval_results.json / predictions.jsonl. Without a workdir (an experiment's
in-process fine-tuning) nothing is written.

The jitted train step and prediction function are cached by everything they are traced from (the
config without its seed, the number of steps, the mesh), so a sweep over seeds compiles once.
"""

from __future__ import annotations

import collections
import json
import os
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from bertfam_jax import fileio
from bertfam_jax.data import pipeline as pipeline_lib
from bertfam_jax.finetune import prune
from bertfam_jax.train import checkpoint as checkpoint_lib
from bertfam_jax.train import loop as loop_lib
from bertfam_jax.train import metrics as metrics_lib
from bertfam_jax.train import sharding as sharding_lib
from bertfam_jax.train import step as step_lib


class Recipe(NamedTuple):
  """What a fine-tuning run trains and how it is scored.

  model, example: the network and the keyword inputs of one row that trace its `init`.
  tx, schedule: the optimizer over `total_steps` updates.
  loss_fn: `loss_fn(model, params, batch, rng, config, *, deterministic) -> (loss, {metric:
    (sum, n)})`.
  transfer: `transfer(fresh 'params' tree on the host) -> 'params'` putting the pre-trained
    weights in, or None to train from the fresh initialisation.
  train_data: {name: [rows, ...]} training arrays (every process holds all rows).
  total_steps, steps_per_epoch: updates in all, and between evaluations (and checkpoints).
  tokens_per_row: input tokens of one row, for tokens/s.
  make_predict: `make_predict(param shardings) -> predict(params, inputs)`, jitted on the mesh.
  score: `score(predict, params) -> results` (task, split, examples, main_metric, scores
    {metric: value}, predictions [one dict per example]).
  extra: entries added to every evaluation's results.
  constants: variable collections other than 'params' that the loss reads and nothing trains
    (TinyBERT's teacher, finetune/distill.py), as host arrays; {} for none.
  mutable: collections the loss updates without gradients (Q8BERT's ranges,
    finetune/quantize.py; `step.make_train_step(mutable=...)`).
  """
  model: Any
  example: dict[str, np.ndarray]
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  loss_fn: Callable
  transfer: Callable | None
  train_data: dict[str, np.ndarray]
  total_steps: int
  steps_per_epoch: int
  tokens_per_row: int
  make_predict: Callable
  score: Callable
  extra: dict
  constants: dict = {}
  mutable: tuple[str, ...] = ()


class _Compiled(NamedTuple):
  abstract: Any
  shardings: Any
  train_step: step_lib.SeededStep
  predict: Callable


_CACHE: collections.OrderedDict = collections.OrderedDict()
_CACHE_SIZE = 16


def _compiled(recipe: Recipe, config, mesh) -> _Compiled:
  """The abstract state, its shardings, the train step (bound to `config.seed`) and the predict
  function of `recipe`, built once per (config without seed and init, total_steps, mesh)."""
  key = (_trace_key(config), recipe.total_steps, mesh)
  if key not in _CACHE:
    abstract, shardings = step_lib.with_mesh_context(step_lib.abstract_state, mesh)(
        recipe.model, recipe.tx, mesh, recipe.example)
    train_step = step_lib.make_train_step(recipe.model, recipe.tx, recipe.schedule,
                                          recipe.loss_fn, config, shardings, mesh,
                                          mutable=recipe.mutable)
    _CACHE[key] = _Compiled(abstract, shardings, train_step, recipe.make_predict(shardings))
    while len(_CACHE) > _CACHE_SIZE:
      _CACHE.popitem(last=False)
  _CACHE.move_to_end(key)
  entry = _CACHE[key]
  return entry._replace(train_step=entry.train_step.with_seed(config.seed))


def _trace_key(config) -> str:
  """The config as JSON without what the traced programs do not read: the seed (bound at call
  time), the tokenizer and where the weights came from, and the pre-training objective but for
  the one field a fine-tuning loss reads (T5's z-loss), so that the rows of an experiment
  (pre-trained with different objectives) share one compilation per shape."""
  tree = json.loads(config.to_json())
  tree.pop("seed", None)
  tree.pop("tokenizer", None)
  tree.get("finetune", {}).pop("init", None)
  tree["objective"] = {"z_loss": tree.get("objective", {}).get("z_loss")}
  return json.dumps(tree, sort_keys=True)


def sharded_predict(predict: Callable, param_shardings, mesh):
  """`predict(params, inputs) -> outputs` jitted on `mesh`: parameters as `param_shardings`,
  inputs split over the batch axes, outputs replicated on every device (and process)."""
  return step_lib.with_mesh_context(jax.jit(
      predict, in_shardings=(param_shardings, sharding_lib.batch_sharding(mesh)),
      out_shardings=NamedSharding(mesh, P())), mesh)


def predict_all(predict, params, data: dict[str, np.ndarray], batch_size: int, mesh,
                keys: tuple[str, ...]):
  """Model outputs for every row of `data` (its `keys` are the inputs), as host numpy
  [rows, ...] (each leaf, where the model returns a tree). Each call has the same global shape:
  the last batch is padded by repeating its final row."""
  rows = len(data[keys[0]])
  outputs = []
  for start in range(0, rows, batch_size):
    index = loop_lib.local_rows(np.arange(start, start + batch_size).clip(max=rows - 1))
    batch = pipeline_lib.make_global_batch({k: data[k][index] for k in keys}, mesh,
                                           sharding_lib.BATCH_SPEC)
    outputs.append(predict(params, batch))
  outputs = jax.device_get(outputs)
  return jax.tree.map(lambda *parts: np.concatenate(parts)[:rows], *outputs)


def _fresh_state(recipe: Recipe, config, shardings, mesh) -> step_lib.TrainState:
  """A new state in `shardings`: parameters initialised from `config.seed`, then, unless
  `recipe.transfer` is None, replaced by the pre-trained weights, magnitude-pruned with
  `finetune.prune_sparsity` (finetune/prune.py), beside `recipe.constants` and the fresh
  state's other collections, under a fresh optimizer state."""
  state = step_lib.with_mesh_context(step_lib.init_state, mesh)(
      recipe.model, recipe.tx, shardings, config.seed, recipe.example)
  sparsity = config.finetune.get("prune_sparsity", 0.0)
  heads = config.finetune.get("prune_heads", 0.0)
  if recipe.transfer is None and not sparsity and not heads and not recipe.constants:
    return state
  variables = {**jax.device_get(state.params), **recipe.constants}
  params = variables["params"]
  if recipe.transfer is not None:
    params = recipe.transfer(params)
  if sparsity:
    params = prune.magnitude_prune(params, sparsity)
  if heads:
    others = {k: v for k, v in variables.items() if k != "params"}
    params, removed = prune.prune_heads(params, heads,
                                        _importance_gradients(recipe, config, mesh, others))
    metrics_lib.print_progress("Pruned attention heads (Michel et al.'s importance): " + "; ".join(
        f"{path}: {found}" for path, found in removed.items()))
  params = {**variables, "params": params}

  def with_fresh_optimizer(params):
    return step_lib.TrainState(step=jnp.zeros([], jnp.int32), params=params,
                               opt_state=recipe.tx.init(step_lib.trained(params)))

  return step_lib.with_mesh_context(jax.jit(with_fresh_optimizer, out_shardings=shardings),
                                    mesh)(params)


# The training batches a head's importance is summed over (heads_pruning.py reads its whole
# training set once per round; a bound keeps a round's cost near this many steps).
IMPORTANCE_BATCHES = 8


def _importance_gradients(recipe: Recipe, config, mesh, others: dict):
  """`gradients_of(params)` for `prune.prune_heads`: the fine-tuning loss's gradient (no dropout)
  on each of the first IMPORTANCE_BATCHES full training batches, as host numpy trees. `others`:
  the variable collections besides 'params' (a teacher, Q8BERT's ranges), an argument of the
  jitted gradient rather than constants compiled into it."""
  rows = len(next(iter(recipe.train_data.values())))
  size = config.train.batch_size
  batches = [{k: v[i:i + size] for k, v in recipe.train_data.items()}
             for i in range(0, min(rows, IMPORTANCE_BATCHES * size) - size + 1, size)]
  grad = step_lib.with_mesh_context(jax.jit(jax.grad(lambda p, c, b: recipe.loss_fn(
      recipe.model, {**c, "params": p}, b, jax.random.key(0), config, deterministic=True)[0])),
                                    mesh)

  def gradients_of(params):
    for batch in batches:
      yield jax.device_get(grad(params, others, batch))
  return gradients_of


def train_and_evaluate(config, recipe: Recipe, mesh, workdir: str | None = None
                       ) -> dict[str, Any]:
  """Fine-tunes and evaluates `recipe` (module docstring). `config`: the resolved config (seed,
  train, mesh, ... as written to config.json); `workdir`: where the run is recorded and
  resumed from (the latest checkpoint, onto any mesh), or None to run in memory.

  Returns the last evaluation's results, its predictions included (a run resumed after its last
  step is scored again), and `train`: the last logged training scalars ({} when nothing ran)."""
  compiled = _compiled(recipe, config, mesh)
  sinks = loop_lib.Sinks()
  try:
    latest = None
    if workdir is not None:
      sinks.checkpointer = checkpoint_lib.Checkpointer(os.path.join(workdir, "checkpoints"),
                                                       config.train.keep_checkpoints)
      latest = sinks.checkpointer.latest_step()
    if latest is not None:
      state, _ = sinks.checkpointer.restore(latest, compiled.abstract)
      metrics_lib.print_progress(f"Resumed from step {latest}.")
    else:
      state = _fresh_state(recipe, config, compiled.shardings, mesh)
    if workdir is not None:
      sinks.writer = metrics_lib.MetricsWriter(workdir, resume_step=latest, config=config)
      sinks.profiler = loop_lib.Profiler.of(config, workdir)
    results = {}

    def evaluate(step: int, params) -> dict[str, float]:
      nonlocal results
      results = dict(recipe.score(compiled.predict, params), step=step, **recipe.extra)
      if workdir is not None:
        write_results(workdir, results)
      return results["scores"]

    t = config.train
    source = loop_lib.EpochSource(recipe.train_data, t.batch_size, config.seed,
                                  step=latest or 0)
    state, last = loop_lib.train(
        state, compiled.train_step, source, mesh=mesh, total_steps=recipe.total_steps,
        log_every=t.log_every, checkpoint_every=recipe.steps_per_epoch,
        tokens_per_step=t.batch_size * recipe.tokens_per_row,
        # In memory only the end is scored; with a workdir every epoch is, and checkpointed.
        evaluators=[loop_lib.Evaluator(
            recipe.total_steps if workdir is None else recipe.steps_per_epoch, evaluate)],
        sinks=sinks)
    step = int(jax.device_get(state.step))
    if step >= recipe.total_steps and not results:  # resumed after the last step: score it again
      evaluate(step, state.params)
    # (preempted before the end: the results so far; the resumed run evaluates the rest)
    return dict(results, train={k: v for k, v in last.items() if not k.startswith("eval_")})
  finally:
    if sinks.checkpointer is not None:
      sinks.checkpointer.close()
    if sinks.writer is not None:
      sinks.writer.close()


def write_results(workdir: str, results: dict) -> None:
  """eval_results.json (the results without predictions) and predictions.jsonl (one line per
  example), each replaced atomically; process 0 only."""
  if jax.process_index() != 0:
    return
  summary = {k: v for k, v in results.items() if k != "predictions"}
  for name, payload in (("eval_results.json", json.dumps(summary, indent=2) + "\n"),
                        ("predictions.jsonl", "".join(json.dumps(p) + "\n"
                                                      for p in results["predictions"]))):
    fileio.write_atomically(os.path.join(workdir, name), payload.encode("utf-8"))
