"""UniLM (Dong et al., 2019, arXiv:1905.03197): one Transformer, four self-attention masks, one
cloze objective.

Each row of `[CLS] A [SEP] B [SEP]` (B the text that follows A: `data.packing='sentence_pairs'`
with `objective.random_next_prob=0`; a chunk of one sentence still takes B from another document,
as BERT's packing does) is masked as BERT's (15%, 80/10/10; 80% of the units one
word, 20% a bigram or trigram: `mask_scheme='ngram'`, `ngram_distribution='unilm'`) and gets
one language-model type, drawn per row with `objective.{bidirectional, left_to_right,
right_to_left, seq2seq}_prob` (the paper's 1/3, 1/6, 1/6, 1/3), which decides what each token
attends to (`attention_masks`, built on the device from two [n, L] arrays):

  bidirectional    every real token
  left-to-right    real tokens j <= i
  right-to-left    real tokens j >= i
  seq2seq          [CLS] A [SEP] (the source) sees the source; B [SEP] (the target) sees the
                   source and the target up to itself

and which token types the row has, the types doubling as LM identifiers (`LM_TYPE_IDS`, the
released unilm-v1 seq2seq_loader.py's `new_segment_ids`: 4 / 5 for the source / target of
seq2seq, 2 for a unidirectional row; 0 / 1 bidirectional as BERT's; 3 for right-to-left is our
reading, the released code fine-tunes no right-to-left LM). The loss is the masked tokens'
cross-entropy (logged per LM type too).

Deviations: no next-sentence prediction on the bidirectional rows (the paper adds it; B here is
A's continuation but in one-sentence chunks, which the seq2seq and unidirectional rows need), and
masks on the
XLA path only (`attention_impl='cudnn'` takes padding as lengths).

Batch keys: the masked LM's (objectives/__init__.py) plus lm_type [n] int32 (LM_TYPES' index).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

from bertfam_jax import config_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.models import pretraining
from bertfam_jax.objectives import losses, mlm

LM_TYPES = ("bidirectional", "left_to_right", "right_to_left", "seq2seq")
BIDIRECTIONAL, LEFT_TO_RIGHT, RIGHT_TO_LEFT, SEQ2SEQ = range(4)
# Token type ids of each LM type: (segment A with [CLS] and the first [SEP], segment B).
LM_TYPE_IDS = {BIDIRECTIONAL: (0, 1), LEFT_TO_RIGHT: (2, 2), RIGHT_TO_LEFT: (3, 3),
               SEQ2SEQ: (4, 5)}
NUM_TOKEN_TYPES = 6

FIELD_RULES = {
    **mlm.FIELD_RULES,
    **{f"objective.{name}_prob": config_lib.PROBABILITY for name in LM_TYPES},
    "objective.random_next_prob": config_lib.PROBABILITY,
}


def build_model(config):
  return pretraining.MaskedLM(config.model)


def validate(config) -> None:
  """The masked LM's combinations, then UniLM's: a probability per LM type summing to 1, six
  token types, sentence pairs without a sentence task, the XLA attention path."""
  o, m = config.objective, config.model
  mlm.validate(config)
  if abs(sum(lm_probs(o)) - 1) > 1e-6:
    raise ConfigError(f"objective.{{{', '.join(LM_TYPES)}}}_prob = {lm_probs(o)} must sum to 1 "
                      "(the paper's 1/3, 1/6, 1/6, 1/3).")
  if o.sentence_task or config.data.packing != "sentence_pairs":
    raise ConfigError("UniLM reads sentence pairs without a sentence task: set "
                      "--config.data.packing=sentence_pairs and --config.objective.sentence_task=''.")
  if m.type_vocab_size < NUM_TOKEN_TYPES:
    raise ConfigError(f"model.type_vocab_size={m.type_vocab_size}: UniLM's token types name the LM "
                      f"type too ({NUM_TOKEN_TYPES} ids); set --config.model.type_vocab_size=6.")
  if m.attention_impl == "cudnn":
    raise ConfigError("UniLM's attention masks are per row; cuDNN's path takes padding lengths "
                      "only: set --config.model.attention_impl=''.")


def lm_probs(o) -> tuple[float, ...]:
  """The probability of each of LM_TYPES, in that order."""
  return tuple(float(o[f"{name}_prob"]) for name in LM_TYPES)


def init_inputs(config) -> dict[str, jnp.ndarray]:
  return mlm.init_inputs(config)


def make_features(config, tokenizer):
  """The masked LM's noising, then an LM type per row and its token types."""
  masked = mlm.make_features(config, tokenizer)
  return functools.partial(unilm_features, masked=masked, probs=np.asarray(lm_probs(
      config.objective)))


def unilm_features(examples, rng: np.random.Generator, *, masked, probs: np.ndarray) -> dict:
  """`examples` (sentence pairs: segment_ids 0 for [CLS] A [SEP], 1 for B [SEP]) masked by the
  masked LM's `masked`, with lm_type [n] drawn from `probs` and segment_ids rewritten to the
  type's ids (padding 0)."""
  features = masked(examples, rng)
  n = len(features["input_ids"])
  lm_type = np.minimum(np.searchsorted(np.cumsum(probs), rng.random(n), side="right"),
                       len(probs) - 1).astype(np.int32)
  ids = np.array([LM_TYPE_IDS[t] for t in range(len(LM_TYPES))], np.int32)   # [types, 2]
  segment = examples["segment_ids"]
  typed = ids[lm_type[:, None], segment]
  features["segment_ids"] = np.where(examples["input_mask"] > 0, typed, 0).astype(np.int32)
  features["lm_type"] = lm_type
  return features


def attention_masks(lm_type_B, segment_ids_BL, input_mask_BL):
  """[batch] LM types, the rows' token types and padding → [batch, 1, L, L] bool: may query i
  attend to key j (module docstring)."""
  length = input_mask_BL.shape[1]
  positions = jnp.arange(length)
  left_1QK = (positions[None, :] <= positions[:, None])[None]    # key j <= query i
  right_1QK = (positions[None, :] >= positions[:, None])[None]
  real_B1K = (input_mask_BL > 0)[:, None, :]
  source_B1K = (segment_ids_BL == LM_TYPE_IDS[SEQ2SEQ][0])[:, None, :]
  kind_B11 = lm_type_B[:, None, None]
  allowed_BQK = jnp.where(
      kind_B11 == LEFT_TO_RIGHT, left_1QK,
      jnp.where(kind_B11 == RIGHT_TO_LEFT, right_1QK,
                jnp.where(kind_B11 == SEQ2SEQ, source_B1K | left_1QK,
                          jnp.ones((1, length, length), jnp.bool_))))
  return (allowed_BQK & real_B1K)[:, None]


def loss_fn(model, params, batch, rng, config, *, deterministic=False):
  """The masked tokens' mean cross-entropy under each row's mask; mlm_loss / mlm_accuracy and
  mlm_loss_<type> per LM type."""
  del config
  masks = attention_masks(batch["lm_type"], batch["segment_ids"], batch["input_mask"])
  outputs = model.apply(params, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                        batch["mlm_positions"], deterministic=deterministic,
                        rngs={"dropout": rng}, attention_mask=masks)
  metrics = {}
  logits, targets, weights = outputs["mlm_logits"], batch["mlm_targets"], batch["mlm_weights"]
  loss = losses.mean_cross_entropy(logits, targets, weights, metrics, "mlm",
                                   mlm.MLM_DENOMINATOR_EPS)
  for index, name in enumerate(LM_TYPES):
    of_type = weights * (batch["lm_type"] == index)[:, None]
    total, _, count = losses.weighted_cross_entropy(logits=logits, targets=targets,
                                                    weights=of_type)
    metrics[f"mlm_loss_{name}"] = (total, count)
  return loss, metrics


def flops_per_token(config) -> float:
  return mlm.flops_per_token(config)


def describe(config) -> str:
  probs = ", ".join(f"{name} {p:.3g}" for name, p in zip(LM_TYPES, lm_probs(config.objective)))
  return f"UniLM cloze with per-row masks ({probs}); {mlm.describe(config)}"
