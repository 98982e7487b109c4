"""UniLM's sequence-to-sequence fine-tuning and decoding (Dong et al. 2019 §3.2; the released
unilm-v1 biunilm/run_seq2seq.py and decode_seq2seq.py): one encoder, the seq2seq mask, a text
task of `finetune.text_tasks`.

Rows are `[CLS] source [SEP] target [SEP]`, padded after, with UniLM's seq2seq token types (4 on
the source with its [CLS] and [SEP], 5 on the target and its [SEP]): the source is cut to
`finetune.max_seq_len` − 2 tokens and the target to `finetune.targets_length` − 1 (0: the
task's `max_target_tokens`) before its [SEP]. Fine-tuning masks, as seq2seq_loader.py's
Preprocess4Seq2seq, exactly max(1, round(`finetune.mask_prob` × n)) of a row's target tokens,
n the target's tokens before its [SEP] (the paper's 0.7; Python's round, on the host), drawn
uniformly among the target tokens and the final [SEP] (so that the model learns to stop),
80/10/10 as in pre-training; the draw is on the device from the step's key (new masks every
step), and the loss is the cross-entropy of the masked tokens with label smoothing
`finetune.label_smoothing` (0.1). The reference's `--max_pred` cap is not built: three of its
README's four commands set it at or above 0.7 × `--max_len_b` (64 / 48 / 140 for targets of 64 /
64 / 200 tokens), where it never binds; its question generation's 48 with no `--max_len_b`
would bind on targets of more than 68 tokens. Decoding is greedy: at step t the row gets [MASK] after its
source and t generated tokens, the seq2seq mask lets it see the source and them, and its
prediction replaces the [MASK], until [SEP]. `finetune.beam_size` > 1 decodes with beams instead
(decode_seq2seq.py's --beam_size; the paper's summarisation used 5), with `finetune.alpha` the
length penalty exponent of `decoding.search_beams` (decode_seq2seq.py's --length_penalty is
another form, and its n-gram blocking is not built). Each step recomputes the whole row (no
cache: a [MASK] stands where the token will be).

Scores: the task's (`text_tasks`), with `distinct_predictions` (1 = one constant output).
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bertfam_jax.config_lib import ConfigError
from bertfam_jax.finetune import decoding
from bertfam_jax.finetune import metrics as metrics_lib
from bertfam_jax.finetune import optim
from bertfam_jax.finetune import recipe as recipe_lib
from bertfam_jax.finetune import text_tasks
from bertfam_jax.models import pretraining
from bertfam_jax.objectives import unilm
from bertfam_jax.train import metrics as train_metrics
from bertfam_jax.train import step as step_lib

SOURCE_TYPE, TARGET_TYPE = unilm.LM_TYPE_IDS[unilm.SEQ2SEQ]
BATCH_KEYS = ("input_ids", "input_mask", "segment_ids", "target_predictions")
REPLACE_PROBS = (0.8, 0.1, 0.1)   # [MASK] / random / kept, as pre-training's


def featurize(tokenizer, examples: Sequence[dict], *, source_length: int, target_length: int,
              mask_prob: float) -> dict[str, np.ndarray]:
  """Examples ({inputs, targets, ...}) → input_ids, input_mask, segment_ids [n, source_length +
  target_length] int32 (`[CLS] source [SEP] target [SEP]`, padded with pad_id), source_tokens
  [n] int32 (the row's [CLS] source [SEP]) and target_predictions [n] int32 (how many target
  tokens fine-tuning masks: max(1, round(mask_prob × the target's tokens before [SEP])))."""
  width = source_length + target_length
  ids = np.full((len(examples), width), tokenizer.pad_id, np.int32)
  segments = np.zeros_like(ids)
  sources = tokenizer.encode([e["inputs"] for e in examples])
  targets = tokenizer.encode([e["targets"] for e in examples])
  source_tokens = np.zeros(len(examples), np.int32)
  target_predictions = np.zeros(len(examples), np.int32)
  for row, (a, b) in enumerate(zip(sources, targets)):
    source = [tokenizer.cls_id, *a[:source_length - 2], tokenizer.sep_id]
    target = [*b[:target_length - 1], tokenizer.sep_id]
    ids[row, :len(source) + len(target)] = source + target
    segments[row, :len(source)] = SOURCE_TYPE
    segments[row, len(source):len(source) + len(target)] = TARGET_TYPE
    source_tokens[row] = len(source)
    target_predictions[row] = max(1, int(round((len(target) - 1) * mask_prob)))
  return dict(input_ids=ids, input_mask=(segments > 0).astype(np.int32), segment_ids=segments,
              source_tokens=source_tokens, target_predictions=target_predictions)


def seq2seq_masks(segment_ids_BL, input_mask_BL):
  """UniLM's seq2seq attention masks [batch, 1, L, L] of these rows (objectives/unilm.py)."""
  kinds_B = jnp.full(segment_ids_BL.shape[:1], unilm.SEQ2SEQ, jnp.int32)
  return unilm.attention_masks(kinds_B, segment_ids_BL, input_mask_BL)


def mask_targets(rng, batch, *, mask_id: int, vocab_size: int):
  """The target tokens masked on the device: batch['target_predictions'] [B] of each row's
  target tokens (its final [SEP] included), uniformly without replacement, then [MASK] / a
  random token / unchanged at 0.8 / 0.1 / 0.1. Returns (noised ids [B, L], chosen [B, L])."""
  choose_rng, how_rng, random_rng = jax.random.split(rng, 3)
  ids = batch["input_ids"]
  target = batch["segment_ids"] == TARGET_TYPE
  scores = jnp.where(target, jax.random.uniform(choose_rng, ids.shape), 2.0)
  rank = jnp.argsort(jnp.argsort(scores, axis=-1), axis=-1)   # the targets first, shuffled
  chosen = target & (rank < batch["target_predictions"][:, None])
  how = jax.random.uniform(how_rng, ids.shape)
  random_ids = jax.random.randint(random_rng, ids.shape, 0, vocab_size, ids.dtype)
  noised = jnp.where(how < REPLACE_PROBS[0], mask_id,
                     jnp.where(how < REPLACE_PROBS[0] + REPLACE_PROBS[1], random_ids, ids))
  return jnp.where(chosen, noised, ids), chosen


def _logits_at_every_position(model, params, ids, batch, *, deterministic, rng=None):
  """The MLM head's logits [B, L, vocab] under the seq2seq masks."""
  every_BL = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
  masks = seq2seq_masks(batch["segment_ids"], batch["input_mask"])
  return model.apply(params, ids, batch["input_mask"], batch["segment_ids"], every_BL,
                     deterministic=deterministic, rngs=None if rng is None else {"dropout": rng},
                     attention_mask=masks)["mlm_logits"]


def make_loss_fn(*, label_smoothing: float, mask_id: int, vocab_size: int) -> Callable:
  """`loss_fn(model, params, batch, rng, config, *, deterministic)`: the masked target tokens'
  label-smoothed cross-entropy (mean over them); logs loss and accuracy of those tokens."""

  def loss_fn(model, params, batch, rng, config, *, deterministic=False):
    del config
    mask_rng, dropout_rng = jax.random.split(rng)
    ids, chosen = mask_targets(mask_rng, batch, mask_id=mask_id, vocab_size=vocab_size)
    logits = _logits_at_every_position(model, params, ids, batch, deterministic=deterministic,
                                       rng=dropout_rng).astype(jnp.float32)
    targets = jax.nn.one_hot(batch["input_ids"], logits.shape[-1])
    smoothed = optax.smooth_labels(targets, label_smoothing)
    per_token = optax.softmax_cross_entropy(logits, smoothed)
    weights = chosen.astype(jnp.float32)
    count = jnp.sum(weights)
    correct = jnp.sum((jnp.argmax(logits, -1) == batch["input_ids"]) * weights)
    total = jnp.sum(per_token * weights)
    return total / jnp.maximum(count, 1.0), {"loss": (total, count), "accuracy": (correct, count)}

  return loss_fn


def greedy_decode(model, params, batch, *, target_length: int, mask_id: int, sep_id: int,
                  pad_id: int):
  """[B, target_length] generated ids (pad_id after [SEP]) for rows whose source is
  batch['input_ids'][:, :source_tokens] (module docstring)."""
  source_B = batch["source_tokens"]
  width = batch["input_ids"].shape[1]
  positions_L = jnp.arange(width)
  is_source = positions_L[None] < source_B[:, None]
  ids = jnp.where(is_source, batch["input_ids"], pad_id)
  rows = jnp.arange(ids.shape[0])

  def step(t, carry):
    ids, done, out = carry
    at_B = source_B + t
    ids = ids.at[rows, at_B].set(mask_id)
    live = positions_L[None] <= at_B[:, None]
    segments = jnp.where(is_source, SOURCE_TYPE, jnp.where(live, TARGET_TYPE, 0))
    state = dict(input_mask=live.astype(jnp.int32), segment_ids=segments)
    logits = _logits_at_every_position(model, {"params": params}, ids, state, deterministic=True)
    token_B = jnp.argmax(logits[rows, at_B], -1).astype(ids.dtype)
    token_B = jnp.where(done, pad_id, token_B)
    ids = ids.at[rows, at_B].set(token_B)
    return ids, done | (token_B == sep_id), out.at[:, t].set(token_B)

  init = (ids, jnp.zeros(ids.shape[:1], jnp.bool_),
          jnp.full((ids.shape[0], target_length), pad_id, ids.dtype))
  return jax.lax.fori_loop(0, target_length, step, init)[2]


def beam_decode(model, params, batch, *, target_length: int, beam_size: int, alpha: float,
                mask_id: int, sep_id: int, pad_id: int):
  """[B, target_length] ids of the best beam (`decoding.search_beams`: beam_size rows per
  example, length penalty `alpha`, [SEP] ends a beam; 0 after it) for the rows of
  `greedy_decode`. Each step rebuilds every beam's row, source then its tokens then [MASK], and
  reads the [MASK]'s logits (no cache, as `greedy_decode`); beam_size 1 with alpha 0 is greedy
  decoding (tested)."""
  del pad_id   # search_beams writes 0 after [SEP]: our pad id
  k, (b, width) = beam_size, batch["input_ids"].shape
  source_N = jnp.repeat(batch["source_tokens"], k)
  positions_L = jnp.arange(width)
  is_source = positions_L[None] < source_N[:, None]
  source_ids = jnp.where(is_source, jnp.repeat(batch["input_ids"], k, axis=0), 0)
  rows = jnp.arange(b * k)
  steps_T = jnp.arange(target_length)

  def step_fn(sequences_NT, step, state):
    written = jnp.where(steps_T[None] < step, sequences_NT, 0)
    ids = source_ids.at[rows[:, None], source_N[:, None] + steps_T[None]].set(written)
    at_N = source_N + step
    ids = ids.at[rows, at_N].set(mask_id)
    live = positions_L[None] <= at_N[:, None]
    segments = jnp.where(is_source, SOURCE_TYPE, jnp.where(live, TARGET_TYPE, 0))
    logits = _logits_at_every_position(model, {"params": params}, ids,
                                       dict(input_mask=live.astype(jnp.int32),
                                            segment_ids=segments), deterministic=True)
    return logits[rows, at_N], state

  return decoding.search_beams(step_fn, (), lambda state, parents: state, batch_size=b,
                               beam_size=k, max_length=target_length, eos_id=sep_id, alpha=alpha)


def decode_texts(tokenizer, ids: np.ndarray) -> list[str]:
  """Generated ids → texts, cut at the first [SEP]."""
  texts = []
  for row in np.asarray(ids):
    ends = np.flatnonzero(row == tokenizer.sep_id)
    row = row[:ends[0]] if len(ends) else row
    texts.append(tokenizer.decode(row[row != tokenizer.pad_id]))
  return texts


def check_config(ft, model_config, width: int) -> None:
  if ft.method != "full" or ft.freeze_layers or ft.unfreeze_every or ft.layer_decay != 1.0:
    raise ConfigError("UniLM's seq2seq fine-tuning trains every weight at one rate: leave "
                      "finetune.method, freeze_layers, unfreeze_every and layer_decay at their "
                      "defaults (full, 0, 0, 1.0).")
  if width > model_config.max_positions:
    raise ConfigError(f"finetune.max_seq_len + targets_length = {width} exceeds the model's "
                      f"{model_config.max_positions} positions; lower them.")
  if not 0 < ft.mask_prob <= 1 or not 0 <= ft.label_smoothing < 1:
    raise ConfigError(f"finetune.mask_prob={ft.mask_prob} must be in (0, 1] and "
                      f"label_smoothing={ft.label_smoothing} in [0, 1).")


def make_recipe(config, tokenizer, params, mesh) -> recipe_lib.Recipe:
  """What trains for the resolved config of a UniLM `init` and a text task: the pre-trained
  MaskedLM (encoder and MLM head), BERT's AdamW of the fine-tuning optimizer section, the masked
  target loss, greedy decoding as the score. Reads finetune.{task, max_seq_len (source),
  targets_length, mask_prob, label_smoothing, epochs, max_*_examples}."""
  ft = config.finetune
  task = text_tasks.get(ft.task)
  if task.kind == "generation":
    metrics_lib.require_generation_scores()
  target_length = ft.targets_length or task.max_target_tokens
  check_config(ft, config.model, ft.max_seq_len + target_length)
  start = time.time()
  batch_size = config.train.batch_size
  train_examples = task.load(task.train_split, ft.data_dir or None, ft.max_train_examples or None)
  eval_examples = task.load(task.eval_split, ft.data_dir or None, ft.max_eval_examples or None)
  if len(train_examples) < batch_size:
    raise ConfigError(f"{task.name} has {len(train_examples)} training examples, fewer than "
                      f"train.batch_size={batch_size}; lower the batch size.")
  lengths = dict(source_length=ft.max_seq_len, target_length=target_length,
                 mask_prob=ft.mask_prob)
  train_data = featurize(tokenizer, train_examples, **lengths)
  eval_data = featurize(tokenizer, eval_examples, **lengths)
  num_train = len(train_data["input_ids"])
  total_steps = config.train.total_steps or max(1, int(num_train / batch_size * ft.epochs))
  train_metrics.print_progress(
      f"{ft.task} (UniLM seq2seq): {num_train} train / {len(eval_examples)} {task.eval_split} "
      f"examples; {total_steps} steps of {batch_size}; mesh {dict(mesh.shape)}; data ready in "
      f"{time.time() - start:.1f} s.")
  model = pretraining.MaskedLM(ml_collections.FrozenConfigDict(config.model))
  ids = np.zeros((1, 8), np.int32)
  example = dict(input_ids=ids, input_mask=np.ones_like(ids), segment_ids=ids,
                 mlm_positions=ids)
  tx, schedule = step_lib.make_optimizer(optim.base_optimizer(config.optimizer, total_steps),
                                         model, example)
  search = (functools.partial(beam_decode, beam_size=ft.beam_size, alpha=ft.alpha)
            if ft.beam_size > 1 else greedy_decode)
  decode = functools.partial(search, model, target_length=target_length,
                             mask_id=tokenizer.mask_id, sep_id=tokenizer.sep_id,
                             pad_id=tokenizer.pad_id)
  keep = {"encoder", "mlm_head"}
  return recipe_lib.Recipe(
      model=model, example=example, tx=tx, schedule=schedule,
      loss_fn=make_loss_fn(label_smoothing=ft.label_smoothing, mask_id=tokenizer.mask_id,
                           vocab_size=config.model.vocab_size),
      transfer=None if params is None else functools.partial(
          _transfer, pretrained={k: v for k, v in params.items() if k in keep}),
      train_data={k: train_data[k] for k in BATCH_KEYS}, total_steps=total_steps,
      steps_per_epoch=num_train // batch_size, tokens_per_row=ft.max_seq_len + target_length,
      make_predict=lambda shardings: recipe_lib.sharded_predict(
          lambda variables, batch: decode(variables["params"], batch), shardings.params, mesh),
      score=functools.partial(evaluate, task, eval_examples=eval_examples, eval_data=eval_data,
                              tokenizer=tokenizer, batch_size=config.train.eval_batch_size,
                              mesh=mesh),
      extra={})


def _transfer(fresh, pretrained):
  """The fresh MaskedLM parameters with the pre-trained encoder and MLM head in (shapes
  checked)."""
  flat_fresh = jax.tree_util.tree_flatten_with_path(fresh)[0]
  flat_given = dict(jax.tree_util.tree_flatten_with_path(pretrained)[0])
  differ = [jax.tree_util.keystr(path) for path, leaf in flat_fresh
            if path not in flat_given or np.shape(flat_given[path]) != np.shape(leaf)]
  if differ:
    raise ConfigError(f"The pre-trained UniLM does not fit the fine-tuning model ({differ[:3]}); "
                      "the model section comes from finetune.init, do not override it.")
  return jax.tree.map(lambda f, g: jnp.asarray(g, f.dtype), fresh, pretrained)


def evaluate(task: text_tasks.TextTask, predict, params, *, eval_examples, eval_data, tokenizer,
             batch_size: int, mesh) -> dict[str, Any]:
  """Greedy outputs of the evaluation split, scored by the task; per example its prediction,
  references and the task's per-example scores."""
  generated = recipe_lib.predict_all(predict, params, eval_data, batch_size, mesh,
                                     keys=("input_ids", "source_tokens"))
  predictions = decode_texts(tokenizer, generated)
  per_example = text_tasks.example_scores(task, eval_examples, predictions)
  return dict(task=task.name, split=task.eval_split, examples=len(eval_examples),
              main_metric=task.main_metric, scores=task.score(eval_examples, predictions),
              distinct_predictions=len(set(predictions)),
              predictions=[dict(index=i, id=e["id"], inputs=e["inputs"], prediction=p,
                                references=e["references"],
                                scores={k: float(v[i]) for k, v in per_example.items()})
                           for i, (e, p) in enumerate(zip(eval_examples, predictions))])
