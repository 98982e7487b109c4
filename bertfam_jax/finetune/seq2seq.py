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

A decoder-only or prefix-LM T5 (`model.architecture`, Raffel et al. §3.2) fine-tunes on the same
tasks with each example's inputs + EOS and targets + EOS as one sequence
(`featurize_decoder_only`: seqio's PrefixLMFeatureConverter, one example a row), the loss on the
targets, the prefix LM's inputs attending both ways; its gold targets are scored the same way (one
teacher-forced call), and it decodes (greedy or beam search) from a KV cache prefilled by one call
over the inputs (`finetune.decoding`).

`make_recipe` is what `finetune.run` trains for a T5 `init` (`python -m bertfam_jax.main
--config=configs/finetune.py:task=NAME,init=<T5 workdir>`, or `run.fine_tune` in memory): the
one train loop through `finetune/recipe.py`, parameters and Adafactor state sharded by the
model's logical axes, decoding and scoring of the evaluation split after every epoch and the
last step; the workdir gets what an encoder's fine-tuning writes.
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

from bertfam_jax.config_lib import ConfigError
from bertfam_jax.data import packing
from bertfam_jax.finetune import decoding
from bertfam_jax.finetune import metrics as metrics_lib
from bertfam_jax.finetune import optim
from bertfam_jax.finetune import recipe as recipe_lib
from bertfam_jax.finetune import text_tasks
from bertfam_jax.models import t5 as t5_lib
from bertfam_jax.objectives import losses
from bertfam_jax.objectives import t5 as t5_objective
from bertfam_jax.train import metrics as train_metrics
from bertfam_jax.train import step as step_lib

BATCH_KEYS = ("input_ids", "input_segment_ids", "decoder_input_ids", "decoder_target_ids",
              "decoder_segment_ids", "decoder_loss_weights")


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


DECODER_ONLY_KEYS = ("decoder_input_ids", "decoder_target_ids", "decoder_segment_ids",
                     "decoder_causal_attention", "decoder_loss_weights")


def featurize_decoder_only(tokenizer, examples: Sequence[dict], *, inputs_length: int,
                           targets_length: int) -> dict[str, np.ndarray]:
  """Examples → one sequence a row (`packing.pack_decoder_only`, rows of inputs_length +
  targets_length): DECODER_ONLY_KEYS and prefix_tokens [n] int32, the row's inputs with their
  EOS (where decoding starts)."""
  inputs = encode_texts(tokenizer, [e["inputs"] for e in examples], inputs_length)
  targets = encode_texts(tokenizer, [e["targets"] for e in examples], targets_length)
  input_lengths, target_lengths = (inputs != 0).sum(1), (targets != 0).sum(1)
  rows = packing.pack_decoder_only(inputs, input_lengths, targets, target_lengths,
                                   inputs_length=inputs_length, targets_length=targets_length,
                                   examples_per_row=1)
  return dict({k: rows[k] for k in DECODER_ONLY_KEYS},
              prefix_tokens=input_lengths.astype(np.int32))


def decoder_only_loss_fn(model, params, batch, rng, config, *, deterministic=False):
  """The targets' token cross-entropy + z-loss of a decoder-only / prefix-LM row (as
  `objectives.t5.loss_fn`, without pre-training's fill metrics)."""
  logits = model.apply(params, None, batch["decoder_input_ids"], None,
                       batch["decoder_segment_ids"], deterministic=deterministic,
                       rngs={"dropout": rng}, **_prefix(config.model, batch))
  total, z_total, correct, count = losses.token_cross_entropy(
      logits, batch["decoder_target_ids"], batch["decoder_loss_weights"],
      config.objective.z_loss)
  metrics = {"t5_loss": (total - z_total, count), "t5_accuracy": (correct, count),
             "z_loss": (z_total, count)}
  return total / jnp.maximum(count, 1.0), metrics


def _prefix(model_config, batch) -> dict:
  """The prefix LM's decoder_causal_attention keyword, {} for a decoder-only LM."""
  return t5_lib.prefix_lm_keyword(model_config, batch.get("decoder_causal_attention"))


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
  if model_config.get("kind") != "t5":
    raise ConfigError("Text-to-text fine-tuning needs a T5 (model.kind='t5'); pass the workdir of "
                      "a T5 pre-training run as finetune.init.")
  return t5_lib.T5(ml_collections.FrozenConfigDict(model_config))


def encoder_decoder(model_config) -> bool:
  return model_config.architecture == "encoder_decoder"


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


def make_recipe(config, tokenizer, params, mesh) -> recipe_lib.Recipe:
  """What trains (`recipe.Recipe`) for the resolved config of a T5 `init`: the task's examples
  (module docstring), the T5 of `config.model` (its dropout applies), T5's fine-tuning Adafactor,
  pre-training's loss (it reads `config.objective.z_loss`), `params` (the pre-trained 'params'
  tree, or None: from scratch), and decoding as the score.

  Reads finetune.{task, data_dir, max_train_examples, max_eval_examples, max_seq_len (the inputs
  length), epochs, targets_length (0 = the task's max_target_tokens), beam_size, alpha},
  optimizer (T5's: adafactor at a constant peak_lr) and train.{batch_size, eval_batch_size
  (decoding batches), total_steps (0 = from epochs)}."""
  ft = config.finetune
  head_only = [f"finetune.{name}={ft.get(name, off)}" for name, off in (
      ("method", "full"), ("freeze_layers", 0), ("layer_decay", 1.0), ("unfreeze_every", 0))
      if ft.get(name, off) != off]
  if head_only:
    raise ConfigError(f"{', '.join(head_only)}: these shape an encoder's fine-tuning; a T5 "
                      f"fine-tunes text-to-text with every weight at one rate. Leave them at "
                      f"their defaults (full, 0, 1.0, 0).")
  task = text_tasks.get(ft.task)
  if task.kind == "generation":   # scored with ROUGE and BLEU: fail now, not after training
    metrics_lib.require_generation_scores()
  start = time.time()
  batch_size = config.train.batch_size
  targets_length = ft.targets_length or task.max_target_tokens
  two_stacks = encoder_decoder(config.model)
  train_data, eval_examples, eval_data = load_data(
      task, tokenizer, inputs_length=ft.max_seq_len, targets_length=targets_length,
      batch_size=batch_size, max_train_examples=ft.max_train_examples or None,
      max_eval_examples=ft.max_eval_examples or None, data_dir=ft.data_dir or None,
      featurize_fn=featurize if two_stacks else featurize_decoder_only)
  num_train = len(train_data[BATCH_KEYS[0] if two_stacks else DECODER_ONLY_KEYS[0]])
  total_steps = config.train.total_steps or max(1, int(num_train / batch_size * ft.epochs))
  train_metrics.print_progress(
      f"{ft.task} (text-to-text): {num_train} train / {len(eval_examples)} {task.eval_split} "
      f"examples; {total_steps} steps of {batch_size}; mesh {dict(mesh.shape)}; data ready in "
      f"{time.time() - start:.1f} s.")
  model = build_model(config.model)
  ids = np.zeros((1, 8), np.int32)   # parameter shapes depend on neither length
  if two_stacks:
    example = dict(input_ids=ids, decoder_input_ids=ids)
  else:
    example = dict(input_ids=None, decoder_input_ids=ids, **_prefix(config.model, dict(
        decoder_causal_attention=ids)))
  tx, schedule = step_lib.make_optimizer(optim.base_optimizer(config.optimizer, total_steps),
                                         model, example)
  keys = dict(search_keys=("input_ids",), gold_keys=GOLD_KEYS) if two_stacks else dict(
      search_keys=("decoder_target_ids", "prefix_tokens"), gold_keys=DECODER_ONLY_KEYS)
  return recipe_lib.Recipe(
      model=model, example=example, tx=tx, schedule=schedule,
      loss_fn=t5_objective.loss_fn if two_stacks else decoder_only_loss_fn,
      transfer=None if params is None else functools.partial(fit_pretrained, pretrained=params),
      train_data={k: train_data[k] for k in (BATCH_KEYS if two_stacks else DECODER_ONLY_KEYS)},
      total_steps=total_steps, steps_per_epoch=num_train // batch_size,
      tokens_per_row=ft.max_seq_len if two_stacks else ft.max_seq_len + targets_length,
      make_predict=lambda shardings: (
          make_search(model, shardings.params, mesh, max_length=targets_length,
                      eos_id=tokenizer.eos_id, beam_size=ft.beam_size, alpha=ft.alpha),
          make_gold_scorer(model, shardings.params, mesh)),
      score=functools.partial(evaluate, task, eval_examples=eval_examples,
                              eval_data=eval_data, tokenizer=tokenizer,
                              batch_size=config.train.eval_batch_size, mesh=mesh, **keys),
      extra={})


# ------------------------------------------------------------------------------------- decoding


def make_search(model, param_shardings, mesh, *, max_length: int, eos_id: int,
                beam_size: int = 1, alpha: float = 0.6) -> Callable:
  """Jitted `search(variables, {'input_ids': [batch, Li]}) -> [batch, max_length]` generated ids
  on `mesh` (`recipe.sharded_predict`: parameters as `param_shardings`, the batch split over the
  batch axes, outputs replicated): greedy when beam_size is 1, else beam search with length
  penalty alpha (`finetune.decoding`); a decoder-only T5's over {'decoder_target_ids',
  'prefix_tokens'} (`featurize_decoder_only`'s rows: the inputs in their first
  width − max_length columns, which is all decoding reads)."""
  if beam_size == 1:
    search = functools.partial(decoding.greedy_decode, max_length=max_length, eos_id=eos_id)
  else:
    search = functools.partial(decoding.beam_search, max_length=max_length, eos_id=eos_id,
                               beam_size=beam_size, alpha=alpha)
  if encoder_decoder(model.config):
    predict = lambda variables, batch: search(  # noqa: E731
        model, variables["params"], batch["input_ids"])
  else:
    predict = lambda variables, batch: search(  # noqa: E731
        model, variables["params"], batch["decoder_target_ids"][:, :-max_length],
        prefix_tokens=batch["prefix_tokens"])
  return recipe_lib.sharded_predict(predict, param_shardings, mesh)


GOLD_KEYS = ("input_ids", "input_segment_ids", "decoder_input_ids", "decoder_target_ids",
             "decoder_segment_ids", "decoder_loss_weights")


def make_gold_scorer(model, param_shardings, mesh) -> Callable:
  """Jitted `score(variables, batch) -> [batch, 2]`: per example, the summed cross-entropy
  (nats) of its gold target tokens under teacher forcing, EOS included, and their count; the
  batch as `featurize` lays it out (`GOLD_KEYS`; a decoder-only T5's: `DECODER_ONLY_KEYS`, its
  target positions only)."""
  def score(variables, batch):
    if encoder_decoder(model.config):
      logits = model.apply(variables, batch["input_ids"], batch["decoder_input_ids"],
                           batch["input_segment_ids"], batch["decoder_segment_ids"],
                           deterministic=True)
    else:
      logits = model.apply(variables, None, batch["decoder_input_ids"], None,
                           batch["decoder_segment_ids"], deterministic=True,
                           **_prefix(model.config, batch))
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32))
    nll = -jnp.take_along_axis(log_probs, batch["decoder_target_ids"][..., None], -1)[..., 0]
    weights = batch["decoder_loss_weights"]
    return jnp.stack([jnp.sum(nll * weights, -1), jnp.sum(weights, -1)], -1)
  return recipe_lib.sharded_predict(score, param_shardings, mesh)


def evaluate(task: text_tasks.TextTask, predictors: tuple[Callable, Callable], params, *,
             eval_examples, eval_data: dict[str, np.ndarray], tokenizer, batch_size: int,
             mesh, search_keys=("input_ids",), gold_keys=GOLD_KEYS) -> dict[str, Any]:
  """Decodes eval_data's inputs [n, Li] with the search of `predictors` (`make_search`,
  `make_gold_scorer`) in batches of batch_size and scores the texts against eval_examples;
  scores the gold targets (`featurize`d, cut at the targets length) under teacher forcing.

  Returns task, split, examples, main_metric, scores {metric: value, and target_loss: the gold
  targets' mean cross-entropy per token, a metric that moves before greedy outputs do},
  distinct_predictions (a model emitting one constant text has 1) and predictions (per
  example: index, id, inputs, prediction, references, target_nll per token, and scores
  {metric: value in [0, 1]} of the metrics that average over examples:
  `text_tasks.example_scores`, what a paired bootstrap resamples)."""
  search, gold = predictors
  generated = recipe_lib.predict_all(search, params, eval_data, batch_size, mesh,
                                     keys=search_keys)
  predictions = decode_texts(tokenizer, generated)
  nll, tokens = recipe_lib.predict_all(gold, params, eval_data, batch_size, mesh,
                                       keys=gold_keys).T
  scores = dict(task.score(eval_examples, predictions),
                target_loss=float(nll.sum() / max(tokens.sum(), 1.0)))
  per_example = text_tasks.example_scores(task, eval_examples, predictions)
  return dict(task=task.name, split=task.eval_split, examples=len(eval_examples),
              main_metric=task.main_metric, scores=scores,
              distinct_predictions=len(set(predictions)),
              predictions=[dict(index=i, id=e["id"], inputs=e["inputs"], prediction=p,
                                references=e["references"], target_nll=float(n / max(t, 1.0)),
                                scores={k: float(v[i]) for k, v in per_example.items()})
                           for i, (e, p, n, t) in enumerate(zip(eval_examples, predictions, nll,
                                                                tokens))])


# ------------------------------------------------------------------------------------ fine-tune


def load_data(task: text_tasks.TextTask, tokenizer, *, inputs_length: int, targets_length: int,
              batch_size: int, max_train_examples: int | None, max_eval_examples: int | None,
              data_dir: str | None, featurize_fn: Callable = None):
  """(train_data {BATCH_KEYS: [n, ...]} (`featurize`, or `featurize_fn`), the evaluation
  examples, and theirs featurized (inputs and gold targets)); ConfigError when the training
  split has fewer than batch_size examples."""
  featurize_fn = featurize_fn or featurize
  train_examples = task.load(task.train_split, data_dir, max_train_examples)
  eval_examples = task.load(task.eval_split, data_dir, max_eval_examples)
  if len(train_examples) < batch_size:
    raise ConfigError(f"{task.name} has {len(train_examples)} training examples, fewer than "
                      f"batch_size={batch_size}; lower the batch size.")
  train_data = featurize_fn(tokenizer, train_examples, inputs_length=inputs_length,
                            targets_length=targets_length)
  eval_data = featurize_fn(tokenizer, eval_examples, inputs_length=inputs_length,
                           targets_length=targets_length)
  return train_data, eval_examples, eval_data
