"""Text-to-text fine-tuning of a T5 (Raffel et al. 2020, §3.1.4): one task of
`finetune.text_tasks`, teacher-forced maximum likelihood, then decoding and scoring.

Recipe (what T5 / t5x do when fine-tuning, scaled to a step budget):
  examples   `inputs + EOS` for the encoder, `targets + EOS` for the decoder, each trimmed to its
             length minus one before EOS is appended (seqio `append_eos_after_trim`); decoder
             inputs are the targets shifted right with BOS = 0 (`make_autoregressive_inputs`).
             One example per row: fine-tuning batches are not packed here (t5x packs them for
             throughput; the loss is the same sum over the same tokens).
  loss       pre-training's (`objectives.t5.loss_fn`): token cross-entropy over the non-pad
             targets (EOS included) plus the z-loss (t5x: 1e-4), averaged over the batch's
             target tokens; logged as t5_loss, z_loss and t5_accuracy (teacher-forced).
  optimizer  T5's Adafactor (`config_lib.t5_adafactor`: decay rate 0.8, update clipping 1.0,
             parameter-scaled updates, factored second moments, no momentum) at a constant
             learning rate, 1e-3 in the paper and in t5x's finetune.gin; a fresh optimizer state
             (t5x restores the pre-training one, whose second-moment decay is already near 1).
  decoding   greedy as the paper (beam_size 1), or beam search with length penalty `alpha`
             (`finetune.decoding`); ids after the first EOS, pads and sentinels are dropped
             before detokenising.

Training and decoding run on a device mesh with the encoder fine-tuning's machinery
(`finetune.run`): parameters and Adafactor state sharded by the model's logical axes
(`train.step.abstract_state`), batches split over the batch axes, the train step
`train.step.make_train_step`, the loop `run.train_loop`. `run(config, workdir)` is the
`python -m bertfam_jax.main --config=configs/finetune.py:task=NAME,init=<T5 workdir>` path on
`config.mesh`: `run.train_and_evaluate` decodes and scores the evaluation split after every epoch
(and the last step), checkpoints there, and a re-run with the same workdir resumes exactly; the
workdir gets config.json, metrics.jsonl, eval_results.json, predictions.jsonl and checkpoints/
as `finetune.run`'s. A workdir that holds another run (another task or model, a pre-training run)
is refused before anything in it is touched. `fine_tune` is the same training in memory (no
workdir; every device, data-parallel, unless given a mesh), for experiments.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import traverse_util

from bertfam_jax import config_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.finetune import classify
from bertfam_jax.finetune import decoding
from bertfam_jax.finetune import run as run_lib
from bertfam_jax.finetune import text_tasks
from bertfam_jax.models import t5 as t5_lib
from bertfam_jax.objectives import t5 as t5_objective
from bertfam_jax.train import checkpoint as checkpoint_lib
from bertfam_jax.train import metrics as train_metrics
from bertfam_jax.train import optimizer as optimizer_lib
from bertfam_jax.train import sharding as sharding_lib
from bertfam_jax.train import train as train_lib

BATCH_KEYS = ("input_ids", "input_segment_ids", "decoder_input_ids", "decoder_target_ids",
              "decoder_segment_ids", "decoder_loss_weights")
Z_LOSS = 1e-4   # t5x's default z-loss coefficient


# ------------------------------------------------------------------------------------ features


def encode_texts(tokenizer, texts: Sequence[str], length: int) -> np.ndarray:
  """[texts, length] int32: each text's pieces cut to length - 1, then EOS (`eos_id`), then pads
  (0): seqio's tokenize + append_eos_after_trim + padding."""
  if length < 2:
    raise ConfigError(f"A sequence length of {length} leaves no room for a token and EOS; "
                      f"use >= 2.")
  ids = np.zeros((len(texts), length), np.int32)
  for row, pieces in enumerate(tokenizer.encode(list(texts))):
    kept = list(pieces[:length - 1]) + [tokenizer.eos_id]
    ids[row, :len(kept)] = kept
  return ids


def shift_right(targets: np.ndarray) -> np.ndarray:
  """[n, L] decoder inputs of unpacked [n, L] targets: BOS 0, then the targets but the last."""
  return np.pad(targets[:, :-1], ((0, 0), (1, 0)))


def featurize(tokenizer, examples: Sequence[dict], *, inputs_length: int,
              targets_length: int) -> dict[str, np.ndarray]:
  """Examples ({inputs, targets, ...}) -> the pre-training batch layout (`objectives.t5`), one
  example a row: input_ids, input_segment_ids [n, inputs_length] int32; decoder_target_ids,
  decoder_input_ids, decoder_segment_ids [n, targets_length] int32; decoder_loss_weights
  [n, targets_length] float32. Segment ids and loss weights are 1 on every non-pad token (EOS
  included), 0 on padding."""
  inputs = encode_texts(tokenizer, [e["inputs"] for e in examples], inputs_length)
  targets = encode_texts(tokenizer, [e["targets"] for e in examples], targets_length)
  return dict(input_ids=inputs, input_segment_ids=(inputs != 0).astype(np.int32),
              decoder_input_ids=shift_right(targets), decoder_target_ids=targets,
              decoder_segment_ids=(targets != 0).astype(np.int32),
              decoder_loss_weights=(targets != 0).astype(np.float32))


def decode_texts(tokenizer, ids: np.ndarray) -> list[str]:
  """[n, L] generated ids -> n texts: everything from the first EOS on is dropped, and so are
  pads and ids that are no SentencePiece piece (sentinels, padded vocabulary rows)."""
  texts = []
  for row in np.asarray(ids):
    ends = np.flatnonzero(row == tokenizer.eos_id)
    row = row[:ends[0]] if len(ends) else row
    texts.append(tokenizer.decode(row[(row != 0) & (row < tokenizer.num_pieces)]))
  return texts


# ----------------------------------------------------------------------------------- the model


def build_model(model_config) -> t5_lib.T5:
  if model_config.get("kind") != "t5" or model_config.architecture != "encoder_decoder":
    raise ConfigError("Text-to-text fine-tuning needs an encoder-decoder T5 (model.kind='t5', "
                      "architecture='encoder_decoder'); pass the workdir of a T5 pre-training "
                      "run as finetune.init.")
  return t5_lib.T5(ml_collections.FrozenConfigDict(model_config))


def fit_pretrained(fresh, pretrained):
  """`pretrained` (the T5's 'params' tree) checked against the `fresh` parameters' shapes
  (arrays or ShapeDtypeStructs) and cast to their dtypes."""
  flat_fresh = traverse_util.flatten_dict(fresh, sep="/")
  flat_given = traverse_util.flatten_dict(pretrained, sep="/")
  wrong = sorted(set(flat_fresh) ^ set(flat_given)) or sorted(
      k for k in flat_fresh if np.shape(flat_fresh[k]) != np.shape(flat_given[k]))
  if wrong:
    raise ConfigError(f"The pre-trained parameters do not fit the T5 of model_config (first "
                      f"differences: {wrong[:3]}); pass the model section they were trained with.")
  return traverse_util.unflatten_dict(
      {k: jnp.asarray(flat_given[k], v.dtype) for k, v in flat_fresh.items()}, sep="/")


def pretrained_transfer(pretrained) -> Callable | None:
  """`run.fresh_state`'s `transfer`: the fresh parameters replaced by `pretrained`
  (`fit_pretrained`); None (train from scratch) when `pretrained` is None."""
  return None if pretrained is None else functools.partial(fit_pretrained, pretrained=pretrained)


def optimizer_config(total_steps: int, peak_lr: float) -> ml_collections.FrozenConfigDict:
  """T5's fine-tuning optimizer: Adafactor at a constant `peak_lr` (`config_lib.t5_adafactor`)."""
  return ml_collections.FrozenConfigDict(dict(
      optimizer=config_lib.t5_adafactor(peak_lr=peak_lr, schedule="constant", warmup_steps=0),
      train=dict(total_steps=total_steps)))


def make_recipe(model_config, total_steps: int, peak_lr: float) -> run_lib.Recipe:
  """What trains (`run.Recipe`): the T5 of `model_config` (its dropout applies), T5's fine-tuning
  Adafactor and pre-training's loss, which reads `config.objective.z_loss`."""
  tx, schedule = optimizer_lib.make_optimizer(optimizer_config(total_steps, peak_lr))
  ids = np.zeros((1, 8), np.int32)   # parameter shapes depend on neither length
  return run_lib.Recipe(build_model(model_config), dict(input_ids=ids, decoder_input_ids=ids),
                        tx, schedule, t5_objective.loss_fn)


# ------------------------------------------------------------------------------------- decoding


def make_search(model, param_shardings, mesh, *, max_length: int, eos_id: int,
                beam_size: int = 1, alpha: float = 0.6) -> Callable:
  """Jitted `search(variables, {'input_ids': [batch, Li]}) -> [batch, max_length]` generated ids
  on `mesh` (`run.sharded_predict`: parameters as `param_shardings`, the batch split over the
  batch axes, outputs replicated): greedy when beam_size is 1, else beam search with length
  penalty alpha (`finetune.decoding`)."""
  if beam_size == 1:
    search = functools.partial(decoding.greedy_decode, max_length=max_length, eos_id=eos_id)
  else:
    search = functools.partial(decoding.beam_search, max_length=max_length, eos_id=eos_id,
                               beam_size=beam_size, alpha=alpha)
  return run_lib.sharded_predict(
      lambda variables, batch: search(model, variables["params"], batch["input_ids"]),
      param_shardings, mesh)


def evaluate(task: text_tasks.TextTask, search: Callable, params, *, eval_examples,
             eval_inputs: np.ndarray, tokenizer, batch_size: int, mesh) -> dict[str, Any]:
  """Decodes eval_inputs [n, Li] with `search` (`make_search`) in batches of batch_size and
  scores the texts against eval_examples. Returns task, split, examples, main_metric, scores
  {metric: value} and predictions (per example: index, id, inputs, prediction, references)."""
  generated = run_lib.predict_all(search, params, dict(input_ids=eval_inputs), batch_size, mesh,
                                  keys=("input_ids",))
  predictions = decode_texts(tokenizer, generated)
  return dict(task=task.name, split=task.eval_split, examples=len(eval_examples),
              main_metric=task.main_metric, scores=task.score(eval_examples, predictions),
              predictions=[dict(index=i, id=e["id"], inputs=e["inputs"], prediction=p,
                                references=e["references"])
                           for i, (e, p) in enumerate(zip(eval_examples, predictions))])


def scorer(task, model, tokenizer, eval_examples, eval_inputs: np.ndarray, mesh, *,
           batch_size: int, max_length: int, beam_size: int, alpha: float) -> Callable:
  """`make_score(state shardings) -> score(variables)` (`run.train_and_evaluate`): `evaluate`
  with the search of `make_search` on those shardings."""
  def make_score(shardings):
    search = make_search(model, shardings.params, mesh, max_length=max_length,
                         eos_id=tokenizer.eos_id, beam_size=beam_size, alpha=alpha)
    return functools.partial(evaluate, task, search, eval_examples=eval_examples,
                             eval_inputs=eval_inputs, tokenizer=tokenizer, batch_size=batch_size,
                             mesh=mesh)
  return make_score


# ------------------------------------------------------------------------------------ fine-tune


def load_data(task: text_tasks.TextTask, tokenizer, *, inputs_length: int, targets_length: int,
              batch_size: int, max_train_examples: int | None, max_eval_examples: int | None,
              data_dir: str | None):
  """(train_data {BATCH_KEYS: [n, ...]} (`featurize`), the evaluation examples, their encoder
  inputs [m, inputs_length]); ConfigError when the training split has fewer than batch_size
  examples."""
  train_examples = task.load(task.train_split, data_dir, max_train_examples)
  eval_examples = task.load(task.eval_split, data_dir, max_eval_examples)
  if len(train_examples) < batch_size:
    raise ConfigError(f"{task.name} has {len(train_examples)} training examples, fewer than "
                      f"batch_size={batch_size}; lower the batch size.")
  train_data = featurize(tokenizer, train_examples, inputs_length=inputs_length,
                         targets_length=targets_length)
  eval_inputs = encode_texts(tokenizer, [e["inputs"] for e in eval_examples], inputs_length)
  return train_data, eval_examples, eval_inputs


def fine_tune(model_config, params, tokenizer, task: text_tasks.TextTask, *, steps: int,
              batch_size: int, peak_lr: float, inputs_length: int, targets_length: int,
              seed: int, beam_size: int = 1, alpha: float = 0.6,
              max_train_examples: int | None = None, max_eval_examples: int | None = None,
              data_dir: str | None = None, z_loss: float = Z_LOSS, log_every: int = 50,
              on_log: Callable[[int, dict[str, float]], None] | None = None,
              mesh: jax.sharding.Mesh | None = None) -> dict[str, Any]:
  """Fine-tunes a T5 on `task` in memory and scores its decoded evaluation split; deterministic
  given seed (and the mesh).

  Args:
    model_config: the T5's `model` section (`config_lib.t5_model`); its dropout applies.
    params: the pre-trained T5 parameters (the 'params' tree), or None to train from scratch.
    tokenizer: the pre-training run's tokenizer (`eos_id`, `num_pieces`, encode, decode).
    task: a `text_tasks.TextTask`; trains on task.train_split, scores task.eval_split.
    steps: updates; batch_size: examples per update (and per decoding call), a multiple of the
      mesh's data-parallel size.
    peak_lr: the constant Adafactor learning rate (T5: 1e-3).
    inputs_length, targets_length: encoder and decoder lengths (EOS included); decoding generates
      targets_length tokens at most.
    seed: parameter initialisation (from scratch), dropout and the data order (`run.epoch_order`).
    beam_size, alpha: greedy when beam_size is 1, else beam search with length penalty alpha.
    max_train_examples, max_eval_examples: the first examples of each split only.
    data_dir: the TFDS data dir of TFDS tasks, or WordNet's directory.
    z_loss: the z-loss coefficient (t5x: 1e-4).
    log_every, on_log: `on_log(step, {t5_loss, z_loss, t5_accuracy, loss, learning_rate,
      grad_norm, param_norm})`, means over every window of log_every updates (and the last,
      shorter one).
    mesh: the device mesh (`sharding.make_mesh`); None: every device, data-parallel.

  Returns:
    task, split, examples, main_metric, scores {metric: value}, predictions (per evaluation
    example: index, id, inputs, prediction, references), steps and params (the fine-tuned T5
    tree, sharded on the mesh).
  """
  if steps < 1 or batch_size < 1:
    raise ConfigError(f"steps={steps} and batch_size={batch_size} must both be >= 1.")
  mesh = sharding_lib.make_mesh(sharding_lib.STRATEGIES["data"]) if mesh is None else mesh
  config = ml_collections.ConfigDict(dict(
      seed=seed, objective=dict(z_loss=z_loss),
      train=dict(batch_size=batch_size, grad_accum_steps=1, log_every=log_every)))
  train_lib.check_batch(config, mesh)
  train_data, eval_examples, eval_inputs = load_data(
      task, tokenizer, inputs_length=inputs_length, targets_length=targets_length,
      batch_size=batch_size, max_train_examples=max_train_examples,
      max_eval_examples=max_eval_examples, data_dir=data_dir)
  recipe = make_recipe(model_config, steps, peak_lr)
  _, shardings, train_step = run_lib.sharded_setup(recipe, config, mesh)
  state = run_lib.fresh_state(recipe, config, shardings, mesh, pretrained_transfer(params))
  state = run_lib.train_loop(state, train_step, train_data, config=config, total_steps=steps,
                             mesh=mesh, on_log=on_log)
  score = scorer(task, recipe.model, tokenizer, eval_examples, eval_inputs, mesh,
                 batch_size=batch_size, max_length=targets_length, beam_size=beam_size,
                 alpha=alpha)(shardings)
  return dict(score(state.params), steps=steps, params=state.params["params"])


# ------------------------------------------------------------------------------------------ run


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Fine-tunes the T5 of `config.finetune.init` on the text-to-text task `config.finetune.task`
  in `workdir`, sharded on `config.mesh` and resumed from the workdir's latest checkpoint
  (module docstring); returns the last eval_results (without the predictions).

  Reads finetune.{task, init, from_scratch, data_dir, max_train_examples, max_eval_examples,
  max_seq_len (the inputs length), peak_lr, epochs, steps (0 = from epochs), targets_length (0 =
  the task's max_target_tokens), beam_size, alpha}; train.{batch_size, eval_batch_size (decoding
  batches), grad_accum_steps, log_every, keep_checkpoints}; mesh; seed. The z-loss coefficient
  is the pre-training run's (`objective.z_loss`).
  """
  ft = config.finetune
  config_lib.validate_finetune(config)
  task = text_tasks.get(ft.task)
  run_lib.prepare_workdir(workdir, ft.task)
  init_config, tokenizer, pretrained = classify.load_pretrained(ft.init)
  resolved = run_lib.resolved_config(config, init_config)
  mesh = sharding_lib.make_mesh(config.mesh)
  run_lib.check_batches(resolved, mesh)
  checkpoint_lib.check_or_write_config(workdir, resolved)

  start = time.time()
  batch_size = config.train.batch_size
  targets_length = ft.targets_length or task.max_target_tokens
  train_data, eval_examples, eval_inputs = load_data(
      task, tokenizer, inputs_length=ft.max_seq_len, targets_length=targets_length,
      batch_size=batch_size, max_train_examples=ft.max_train_examples or None,
      max_eval_examples=ft.max_eval_examples or None, data_dir=ft.data_dir or None)
  num_train = len(train_data["input_ids"])
  total_steps = ft.steps or max(1, int(num_train / batch_size * ft.epochs))
  train_metrics.print_progress(
      f"{ft.task} (text-to-text): {num_train} train / {len(eval_examples)} {task.eval_split} "
      f"examples; {total_steps} steps of {batch_size}; mesh {dict(mesh.shape)}; data ready in "
      f"{time.time() - start:.1f} s.")

  recipe = make_recipe(resolved.model, total_steps, ft.peak_lr)
  make_score = scorer(task, recipe.model, tokenizer, eval_examples, eval_inputs, mesh,
                      batch_size=config.train.eval_batch_size, max_length=targets_length,
                      beam_size=ft.beam_size, alpha=ft.alpha)
  return run_lib.train_and_evaluate(
      resolved, workdir, mesh, recipe,
      transfer=pretrained_transfer(None if ft.from_scratch else pretrained),
      make_score=make_score, train_data=train_data, total_steps=total_steps,
      steps_per_epoch=num_train // batch_size, extra={})
