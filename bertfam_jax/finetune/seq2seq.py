"""Text-to-text fine-tuning of a T5 (Raffel et al. 2020, §3.1.4): one task of
`finetune.text_tasks`, teacher-forced maximum likelihood, then decoding and scoring.

Recipe (what T5 / t5x do when fine-tuning, scaled to a step budget):
  examples   `inputs + EOS` for the encoder, `targets + EOS` for the decoder, each trimmed to its
             length minus one before EOS is appended (seqio `append_eos_after_trim`); decoder
             inputs are the targets shifted right with BOS = 0 (`make_autoregressive_inputs`).
             One example per row: fine-tuning batches are not packed here (t5x packs them for
             throughput; the loss is the same sum over the same tokens).
  loss       token cross-entropy over the non-pad targets (EOS included) plus t5x's z-loss
             1e-4, averaged over the batch's target tokens (`objectives.losses`).
  optimizer  T5's Adafactor (`config_lib.t5_adafactor`: decay rate 0.8, update clipping 1.0,
             parameter-scaled updates, factored second moments, no momentum) at a constant
             learning rate, 1e-3 in the paper and in t5x's finetune.gin; a fresh optimizer state
             (t5x restores the pre-training one, whose second-moment decay is already near 1).
  decoding   greedy as the paper (beam_size 1), or beam search with length penalty `alpha`
             (`finetune.decoding`); ids after the first EOS, pads and sentinels are dropped
             before detokenising.

`fine_tune` runs on the default device from arrays in memory; `run(config, workdir)` is the
`python -m bertfam_jax.main --config=configs/finetune.py:task=NAME,init=<T5 workdir>` path, and
writes config.json, metrics.jsonl, eval_results.json and predictions.jsonl as `finetune.run`.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, Sequence

import flax.linen as nn
from flax import traverse_util
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bertfam_jax import config_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.finetune import classify
from bertfam_jax.finetune import decoding
from bertfam_jax.finetune import run as run_lib
from bertfam_jax.finetune import text_tasks
from bertfam_jax.models import t5 as t5_lib
from bertfam_jax.objectives import losses
from bertfam_jax.train import checkpoint as checkpoint_lib
from bertfam_jax.train import metrics as train_metrics
from bertfam_jax.train import optimizer as optimizer_lib
from bertfam_jax.train import step as step_lib
from bertfam_jax.train import train as train_lib

BATCH_KEYS = ("input_ids", "decoder_input_ids", "decoder_target_ids", "decoder_loss_weights")
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
  """Examples ({inputs, targets, ...}) -> the encoder-decoder batch layout, one example a row:
  input_ids [n, inputs_length]; decoder_target_ids, decoder_input_ids [n, targets_length] int32;
  decoder_loss_weights [n, targets_length] float32, 1 on every non-pad target (EOS included)."""
  targets = encode_texts(tokenizer, [e["targets"] for e in examples], targets_length)
  return dict(input_ids=encode_texts(tokenizer, [e["inputs"] for e in examples], inputs_length),
              decoder_input_ids=shift_right(targets), decoder_target_ids=targets,
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


def init_params(model: t5_lib.T5, rng: jax.Array, pretrained=None):
  """Fresh parameters of `model`, or `pretrained` (the T5's params tree) checked against their
  shapes and cast to their dtypes."""
  inputs = np.zeros((1, 8), np.int32)
  init = lambda r: nn.meta.unbox(model.init(  # noqa: E731
      {"params": r}, inputs, inputs, deterministic=True)["params"])
  if pretrained is None:
    return jax.jit(init)(rng)
  flat_fresh = traverse_util.flatten_dict(jax.eval_shape(init, rng), sep="/")
  flat_given = traverse_util.flatten_dict(pretrained, sep="/")
  wrong = sorted(set(flat_fresh) ^ set(flat_given)) or sorted(
      k for k in flat_fresh if np.shape(flat_fresh[k]) != np.shape(flat_given[k]))
  if wrong:
    raise ConfigError(f"The pre-trained parameters do not fit the T5 of model_config (first "
                      f"differences: {wrong[:3]}); pass the model section they were trained with.")
  return traverse_util.unflatten_dict(
      {k: jnp.asarray(flat_given[k], v.dtype) for k, v in flat_fresh.items()}, sep="/")


def optimizer_config(total_steps: int, peak_lr: float) -> ml_collections.FrozenConfigDict:
  """T5's fine-tuning optimizer: Adafactor at a constant `peak_lr` (`config_lib.t5_adafactor`)."""
  return ml_collections.FrozenConfigDict(dict(
      optimizer=config_lib.t5_adafactor(peak_lr=peak_lr, schedule="constant", warmup_steps=0),
      train=dict(total_steps=total_steps)))


def loss_terms(model, params, batch, rng, *, z_loss: float, deterministic: bool):
  """`losses.token_cross_entropy` of the teacher-forced logits: (loss_sum, z_loss_sum,
  correct_sum, weight_sum) float32 scalars."""
  rngs = None if deterministic else {"dropout": rng}
  logits = model.apply({"params": params}, batch["input_ids"], batch["decoder_input_ids"],
                       deterministic=deterministic, rngs=rngs)
  return losses.token_cross_entropy(logits, batch["decoder_target_ids"],
                                    batch["decoder_loss_weights"], z_loss)


@functools.partial(jax.jit, static_argnames=("model", "optimizer", "z_loss"),
                   donate_argnames=("state",))
def train_step(state: step_lib.TrainState, batch, dropout_rng, *, model, optimizer, z_loss):
  """One update on `batch` (BATCH_KEYS) → (state, [4] float32 (loss_sum, z_loss_sum,
  correct_sum, weight_sum)); dropout keyed by fold_in(dropout_rng, step); `state` is donated."""
  tx, _ = optimizer_lib.make_optimizer(optimizer)
  rng = jax.random.fold_in(dropout_rng, state.step)

  def loss(params):
    terms = loss_terms(model, params, batch, rng, z_loss=z_loss, deterministic=False)
    return terms[0] / jnp.maximum(terms[3], 1.0), jnp.stack(terms)

  (_, terms), grads = jax.value_and_grad(loss, has_aux=True)(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  return step_lib.TrainState(step=state.step + 1, params=params, opt_state=opt_state), terms


@functools.partial(jax.jit, static_argnames=("optimizer",))
def init_state(params, *, optimizer) -> step_lib.TrainState:
  tx, _ = optimizer_lib.make_optimizer(optimizer)
  return step_lib.TrainState(step=jnp.zeros([], jnp.int32), params=params,
                             opt_state=tx.init(params))


def _summary(terms: np.ndarray) -> dict[str, float]:
  """[..., 4] summed (loss_sum, z_loss_sum, correct_sum, weight_sum) -> per-token loss (the
  cross-entropy alone), z_loss and accuracy."""
  loss_sum, z_sum, correct, weight = np.asarray(terms, np.float64).reshape(-1, 4).sum(axis=0)
  weight = max(weight, 1.0)
  return dict(loss=(loss_sum - z_sum) / weight, z_loss=z_sum / weight, accuracy=correct / weight)


# ------------------------------------------------------------------------------------- decoding


def generate(model, params, input_ids: np.ndarray, *, batch_size: int, max_length: int,
             eos_id: int, beam_size: int = 1, alpha: float = 0.6) -> np.ndarray:
  """[n, max_length] generated ids for [n, Li] encoder inputs, greedy when beam_size is 1, else
  beam search with length penalty alpha (`finetune.decoding`). Every call has the shape of the
  first: the last batch is padded by repeating its final row."""
  if beam_size == 1:
    search = functools.partial(decoding.greedy_decode, max_length=max_length, eos_id=eos_id)
  else:
    search = functools.partial(decoding.beam_search, max_length=max_length, eos_id=eos_id,
                               beam_size=beam_size, alpha=alpha)
  search = jax.jit(functools.partial(search, model))
  rows, outputs = len(input_ids), []
  for start in range(0, rows, batch_size):
    index = np.arange(start, start + batch_size).clip(max=rows - 1)
    outputs.append(search(params, input_ids[index]))
  return np.concatenate(jax.device_get(outputs))[:rows]


# ------------------------------------------------------------------------------------ fine-tune


def fine_tune(model_config, params, tokenizer, task: text_tasks.TextTask, *, steps: int,
              batch_size: int, peak_lr: float, inputs_length: int, targets_length: int,
              seed: int, beam_size: int = 1, alpha: float = 0.6,
              max_train_examples: int | None = None, max_eval_examples: int | None = None,
              data_dir: str | None = None, z_loss: float = Z_LOSS, log_every: int = 50,
              on_log: Callable[[int, dict[str, float]], None] | None = None) -> dict[str, Any]:
  """Fine-tunes a T5 on `task` and scores its decoded evaluation split; deterministic given seed.

  Args:
    model_config: the T5's `model` section (`config_lib.t5_model`); its dropout applies.
    params: the pre-trained T5 parameters (the 'params' tree), or None to train from scratch.
    tokenizer: the pre-training run's tokenizer (`eos_id`, `num_pieces`, encode, decode).
    task: a `text_tasks.TextTask`; trains on task.train_split, scores task.eval_split.
    steps: updates; batch_size: examples per update (and per decoding call).
    peak_lr: the constant Adafactor learning rate (T5: 1e-3).
    inputs_length, targets_length: encoder and decoder lengths (EOS included); decoding generates
      targets_length tokens at most.
    seed: parameter initialisation (from scratch), dropout and the data order (`run.epoch_order`).
    beam_size, alpha: greedy when beam_size is 1, else beam search with length penalty alpha.
    max_train_examples, max_eval_examples: the first examples of each split only.
    data_dir: the TFDS data dir of TFDS tasks, or WordNet's directory.
    z_loss: the z-loss coefficient (t5x: 1e-4).
    log_every, on_log: `on_log(step, {loss, z_loss, accuracy})` over every window of log_every
      updates (and the last, shorter one).

  Returns:
    task, split, examples, main_metric, scores {metric: value}, steps, train_loss_curve
    [min(10, steps)] float32 (mean per-token loss over consecutive tenths of the updates),
    predictions (per evaluation example: index, id, inputs, prediction, references) and params
    (the fine-tuned T5 tree).
  """
  if steps < 1 or batch_size < 1:
    raise ConfigError(f"steps={steps} and batch_size={batch_size} must both be >= 1.")
  train_examples = task.load(task.train_split, data_dir, max_train_examples)
  eval_examples = task.load(task.eval_split, data_dir, max_eval_examples)
  if len(train_examples) < batch_size:
    raise ConfigError(f"{task.name} has {len(train_examples)} training examples, fewer than "
                      f"batch_size={batch_size}; lower the batch size.")
  lengths = dict(inputs_length=inputs_length, targets_length=targets_length)
  train_data = featurize(tokenizer, train_examples, **lengths)
  eval_inputs = encode_texts(tokenizer, [e["inputs"] for e in eval_examples], inputs_length)

  model = build_model(model_config)
  init_rng, dropout_rng = jax.random.split(jax.random.key(seed))
  optimizer = optimizer_config(steps, peak_lr)
  state = init_state(init_params(model, init_rng, params), optimizer=optimizer)
  step_terms, window = [], []
  for step in range(steps):
    rows = run_lib.epoch_order(len(train_examples), batch_size, seed, step)
    state, terms = train_step(state, run_lib.take(train_data, rows), dropout_rng, model=model,
                              optimizer=optimizer, z_loss=z_loss)
    step_terms.append(terms)  # fetched at log time, so dispatch runs ahead of the host
    window.append(terms)
    if on_log is not None and ((step + 1) % log_every == 0 or step + 1 == steps):
      on_log(step + 1, _summary(jax.device_get(window)))
      window = []

  step_terms = np.asarray(jax.device_get(step_terms), np.float64)
  curve = [_summary(chunk)["loss"] for chunk in np.array_split(step_terms, min(10, steps))]
  generated = generate(model, state.params, eval_inputs, batch_size=batch_size,
                       max_length=targets_length, eos_id=tokenizer.eos_id, beam_size=beam_size,
                       alpha=alpha)
  predictions = decode_texts(tokenizer, generated)
  return dict(task=task.name, split=task.eval_split, examples=len(eval_examples),
              main_metric=task.main_metric, scores=task.score(eval_examples, predictions),
              steps=steps, train_loss_curve=np.asarray(curve, np.float32),
              predictions=[dict(index=i, id=e["id"], inputs=e["inputs"], prediction=p,
                                references=e["references"])
                           for i, (e, p) in enumerate(zip(eval_examples, predictions))],
              params=state.params)


# ------------------------------------------------------------------------------------------ run


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Fine-tunes the T5 of `config.finetune.init` on the text-to-text task `config.finetune.task`
  and writes the workdir (module docstring); returns eval_results (without the predictions).

  Reads finetune.{task, init, data_dir, max_train_examples, max_eval_examples, max_seq_len (the
  inputs length), peak_lr, epochs} and, where present, finetune.{steps (0 = from epochs),
  targets_length (0 = the task's max_target_tokens), beam_size (1), alpha (0.6)};
  train.{batch_size, log_every}; seed.
  """
  ft = config.finetune
  config_lib.validate_finetune(config)
  task = text_tasks.get(ft.task)
  train_lib.prepare_workdir(workdir)
  init_config, tokenizer, pretrained = classify.load_pretrained(ft.init)
  resolved = ml_collections.ConfigDict(config.to_dict())
  resolved.model = ml_collections.ConfigDict(init_config.model.to_dict())
  resolved.tokenizer = ml_collections.ConfigDict(init_config.tokenizer.to_dict())
  resolved.tokenizer.model_path = classify.tokenizer_location(init_config, ft.init)
  checkpoint_lib.check_or_write_config(workdir, resolved)

  batch_size = config.train.batch_size
  steps = ft.get("steps", 0) or max(1, int(
      len(task.load(task.train_split, ft.data_dir or None, ft.max_train_examples or None))
      / batch_size * ft.epochs))
  targets_length = ft.get("targets_length", 0) or task.max_target_tokens
  writer = train_metrics.MetricsWriter(workdir, resume_step=None)
  start = time.perf_counter()

  def log(step: int, scalars: dict[str, float]) -> None:
    writer.write(step, scalars)
    train_metrics.print_progress(f"step {step}/{steps} | loss {scalars['loss']:.4f} | "
                                 f"{time.perf_counter() - start:.0f} s")

  try:
    results = fine_tune(
        resolved.model, pretrained, tokenizer, task, steps=steps, batch_size=batch_size,
        peak_lr=ft.peak_lr, inputs_length=ft.max_seq_len, targets_length=targets_length,
        seed=config.seed, beam_size=ft.get("beam_size", 1), alpha=ft.get("alpha", 0.6),
        max_train_examples=ft.max_train_examples or None,
        max_eval_examples=ft.max_eval_examples or None, data_dir=ft.data_dir or None,
        log_every=config.train.log_every, on_log=log)
    writer.write(steps, results["scores"], prefix="eval_")
  finally:
    writer.close()
  results = {k: v for k, v in results.items() if k not in ("params", "train_loss_curve")}
  run_lib.write_results(workdir, results)
  train_metrics.print_progress(f"eval @ {steps}: " + ", ".join(
      f"{k} {v:.4f}" for k, v in sorted(results["scores"].items())))
  return {k: v for k, v in results.items() if k != "predictions"}
