"""The masked-LM family: BERT, RoBERTa, ALBERT, SpanBERT and StructBERT as configuration.

One objective, composed from host-side pieces in `objectives/noise.py`, each a config field:

  candidates + budget   `mask_style`  bert: never [CLS]/[SEP], `min(P, max(1, round(0.15·len)))`
                                      (google-research/bert create_pretraining_data.py);
                                      fairseq: every token, `int(0.15·len + U)` (RoBERTa's
                                      MaskTokensDataset); spanbert: never [CLS]/[SEP],
                                      `ceil(0.15·#block)` (SpanBERT masking.py).
  which units           `mask_scheme` token | token_with_replacement (ELECTRA) | whole_word |
                                      ngram (ALBERT) | span (SpanBERT) | units (ERNIE / SpanBERT
                                      phrases and entities, `span_source`).
  how they are noised   `replace_per` 80/10/10 per token (BERT) or once per merged span
                                      (SpanBERT `--replacement-method span`); the split is
                                      `mask_token_prob` / `random_token_prob` (ELECTRA 85/15/0);
                                      `random_tokens` uniform or by corpus unigram frequency
                                      (SpanBERT).
  extra predictions     `sbo`         SpanBERT's span boundary objective on every masked token;
                        `word_shuffle_rate`  StructBERT's shuffled trigrams.
  sentence task         `sentence_task`  nsp (BERT) | sop (ALBERT) | structbert (3-way) | none,
                                      built by `data.packing.sentence_pairs`.

Loss = MLM + sentence task + SBO + word structure, each a mean over its own predictions:
MLM `Σ w·CE / (Σ w + 1e-5)` (BERT run_pretraining.py); SBO `Σ CE / (#targets + 1)` (SpanBERT
criterions/spanbert_loss.py); sentence and word-structure tasks plain means.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

from bertfam_jax import config_lib, flops
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.data import packing, spans, tokenizers
from bertfam_jax.models import pretraining
from bertfam_jax.objectives import losses, noise

# BERT's run_pretraining.py adds 1e-5 to the MLM weight sum so an all-padding batch is finite.
MLM_DENOMINATOR_EPS = 1e-5
# SpanBERT's spanbert_loss.py divides the pair-target loss by (#targets + 1).
SBO_DENOMINATOR_OFFSET = 1.0


def build_model(config):
  o = config.objective
  return pretraining.MaskedLM(
      config.model, sentence_classes=packing.PAIR_CLASSES.get(o.sentence_task, 0),
      sbo_max_targets=o.sbo_max_targets if o.sbo else 0, sbo_position_size=o.sbo_position_size)


# The masked-LM family's choices (mask_scheme's are noise.SELECTORS's names).
CHOICES = dict(
    mask_style=("bert", "fairseq", "spanbert"),
    replace_per=("token", "span"),
    random_tokens=("uniform", "unigram"),
    sentence_task=("", "nsp", "sop", "structbert"),
    span_source=("", "entities", "noun_phrases"),
    word_start_rule=tokenizers.WORD_START_RULES,
    ngram_distribution=("albert", "unilm"),
)


FIELD_RULES = {
    **{f"objective.{key}": choices
       for key, choices in dict(CHOICES, mask_scheme=tuple(noise.SELECTORS)).items()},
    "objective.mask_rate": config_lib.Range(0, 1, low_open=True, high_open=True),
    "objective.max_predictions": config_lib.AT_LEAST_1,
    "objective.mask_token_prob": config_lib.PROBABILITY,
    "objective.random_token_prob": config_lib.PROBABILITY,
    "objective.unit_prob": config_lib.PROBABILITY,
    "objective.dupe_factor": config_lib.AT_LEAST_1,
    "objective.max_ngram": config_lib.AT_LEAST_1,
    "objective.span_p": config_lib.Range(0, 1, low_open=True),
    "objective.span_max_words": config_lib.AT_LEAST_1,
    "objective.sbo_max_targets": config_lib.AT_LEAST_1,
    "objective.sbo_position_size": config_lib.AT_LEAST_1,
    "objective.word_shuffle_rate": config_lib.Range(0, 0.5, high_open=True),
}


def validate(config) -> None:
  """The MLM family's combinations of fields (each field's own range: FIELD_RULES)."""
  o = config.objective
  for key in ("max_predictions", "max_ngram", "span_max_words"):
    if o[key] > config.data.seq_len:
      raise ConfigError(f"objective.{key}={o[key]} exceeds data.seq_len={config.data.seq_len}; "
                        f"lower --config.objective.{key}.")
  if o.get("ngram_distribution", "albert") == "unilm" and o.max_ngram < 2:
    raise ConfigError(f"objective.ngram_distribution='unilm' masks bigrams and trigrams; set "
                      f"--config.objective.max_ngram=3 (it is {o.max_ngram}).")
  if o.mask_token_prob + o.random_token_prob > 1.0:
    raise ConfigError(f"objective.mask_token_prob={o.mask_token_prob} and random_token_prob="
                      f"{o.random_token_prob} must be >= 0 with a sum <= 1 (the rest stay "
                      "unchanged).")
  if o.sentence_task and config.data.packing != "sentence_pairs":
    raise ConfigError(f"objective.sentence_task={o.sentence_task!r} needs sentence pairs: set "
                      f"--config.data.packing=sentence_pairs or --config.objective.sentence_task=''.")
  if (o.mask_scheme == "units") != bool(o.span_source):
    raise ConfigError("objective.mask_scheme='units' needs --config.objective.span_source="
                      "entities|noun_phrases, and span_source is only used by mask_scheme='units'.")


def init_inputs(config) -> dict[str, jnp.ndarray]:
  """One row of the masked-LM batch (input_ids, input_mask, segment_ids [1, L], mlm_positions
  [1, P]), to trace `MaskedLM.init`."""
  length, predictions = config.data.seq_len, config.objective.max_predictions
  i32 = jnp.int32
  return dict(input_ids=jnp.zeros((1, length), i32), input_mask=jnp.ones((1, length), i32),
              segment_ids=jnp.zeros((1, length), i32),
              mlm_positions=jnp.zeros((1, predictions), i32))


def describe(config) -> str:
  """The masked-LM family's header: how much of a sequence is predicted."""
  o = config.objective
  return (f"Effective mask rate: {100 * config_lib.effective_mask_rate(config):.2f}% of "
          f"{config.data.seq_len} tokens (mask_rate {o.mask_rate}, max_predictions "
          f"{o.max_predictions})")


def flops_per_token(config) -> float:
  """Model training FLOPs per token for MFU (bertfam_jax/flops.py): encoder, MLM head over the MLM and
  word-order slots, SBO head over the MLM slots, sentence head."""
  o = config.objective
  predictions = o.max_predictions * (2 if o.word_shuffle_rate else 1)
  classes = packing.PAIR_CLASSES.get(o.sentence_task, 0)
  return flops.encoder_train_flops_per_token(
      config.model, config.data.seq_len, predictions, bool(classes), sentence_classes=classes,
      sbo_predictions_per_seq=o.max_predictions if o.sbo else 0,
      sbo_position_size=o.sbo_position_size)


def _scheme_params(o) -> dict:
  """The selection function's keyword arguments for `objective.mask_scheme`."""
  if o.mask_scheme == "ngram":
    return dict(max_n=o.max_ngram,
                probs=noise.ngram_probs(o.get("ngram_distribution", "albert"), o.max_ngram))
  if o.mask_scheme == "span":
    return dict(geometric_p=o.span_p, max_words=o.span_max_words)
  if o.mask_scheme == "units":
    return dict(unit_prob=o.unit_prob)
  return {}


def make_features(config, tokenizer):
  """Returns the host-side noising `fn(examples, rng) -> batch` (see objectives/__init__.py)."""
  config_lib.check_fields(config, FIELD_RULES)
  o = config.objective
  unit_source = spans.make_span_source(o.span_source, tokenizer) if o.span_source else None
  return functools.partial(
      mlm_features, config=o, vocab_size=config.model.vocab_size,
      special_ids=np.asarray(tokenizer.special_ids), mask_id=tokenizer.mask_id,
      word_start_table=tokenizer.word_start_for(o.word_start_rule),
      scheme_params=_scheme_params(o),
      unit_source=unit_source,
      # fairseq never draws its first 4 entries (<s>, <pad>, </s>, <unk>) as random tokens; our
      # layout puts the same four first: pad 0, unk 1, [CLS] 2, [SEP] 3.
      num_never_random=(1 + max(tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id,
                                tokenizer.sep_id)) if o.mask_style == "fairseq" else 0)


def _budget(o, input_mask, maskable, rng) -> np.ndarray:
  """[n] tokens to predict per row under `mask_style`, capped by max_predictions."""
  if o.mask_style == "bert":
    budget = noise.bert_num_to_predict(input_mask, o.mask_rate, o.max_predictions)
  elif o.mask_style == "fairseq":
    budget = noise.fairseq_num_to_predict(input_mask, o.mask_rate, rng)
  else:
    budget = noise.span_num_to_predict(maskable, o.mask_rate)
  return np.minimum(budget, o.max_predictions)


def _select_per_segment(o, real, maskable, segment_ids, word_start, params, rng) -> np.ndarray:
  """[n, L] bool: the tokens to predict, each segment of a row budgeted and selected on its own.

  SpanBERT's sentence-pair data (`span_bert_dataset.py`) masks block A and block B separately
  and then joins them: the budget is ⌈rate·|A|⌉ + ⌈rate·|B|⌉, and no span runs across the middle
  [SEP]. Each (segment, row) is one row of the selection here (segment-major, [S·n, L]), the
  segments' budgets capped together at max_predictions in segment order. A batch of one segment
  draws exactly what the joint selection draws.

  Args:
    real: [n, L] bool, non-padding tokens; maskable, word_start: [n, L] bool.
    segment_ids: [n, L] int, 0 for the first segment.
    params: the selector's keyword arguments; an [n, L] array among them (unit_ids) keeps, in
      each segment's row, that segment's entries (0 elsewhere: no unit outside the segment).
  """
  n, length = maskable.shape
  in_segment = segment_ids[None] == np.arange(segment_ids.max(initial=0) + 1)[:, None, None]

  def per_segment(x):  # [n, L] -> [S·n, L]
    return np.broadcast_to(x, in_segment.shape).reshape(-1, length)

  segment_maskable = (maskable & in_segment).reshape(-1, length)
  budget = _budget(o, (real & in_segment).reshape(-1, length), segment_maskable, rng)
  budget = budget.reshape(-1, n)
  spent_before = np.cumsum(budget, axis=0) - budget
  budget = np.clip(o.max_predictions - spent_before, 0, budget).reshape(-1)
  params = {k: np.where(in_segment, v, 0).reshape(-1, length)
            if isinstance(v, np.ndarray) and v.shape == (n, length) else v
            for k, v in params.items()}
  chosen = noise.SELECTORS[o.mask_scheme](segment_maskable, per_segment(word_start), budget,
                                          rng, **params)
  return chosen.reshape(-1, n, length).any(axis=0)


def replace_probs(o) -> tuple[float, float, float]:
  """(p_mask, p_keep, p_random) of a predicted token (BERT 0.8 / 0.1 / 0.1, ELECTRA 0.85 / 0.15 /
  0), from `mask_token_prob` and `random_token_prob`."""
  return (o.mask_token_prob, 1.0 - o.mask_token_prob - o.random_token_prob, o.random_token_prob)


def _random_token_weights(o, input_ids, maskable, vocab_size, num_never_random):
  """[V] weights of random replacement tokens, or None for uniform over the vocabulary."""
  if o.random_tokens == "unigram":
    # SpanBERT draws from the corpus token stream; the chunk being noised (thousands of
    # sequences) stands in for it, counted without padding and [CLS]/[SEP].
    return noise.unigram_counts(input_ids, maskable, vocab_size)
  if num_never_random:
    weights = np.ones(vocab_size)
    weights[:num_never_random] = 0.0
    return weights
  return None


def mlm_features(examples, rng: np.random.Generator, *, config, vocab_size: int,
                 special_ids: np.ndarray, mask_id: int, word_start_table: np.ndarray,
                 scheme_params: dict, unit_source, num_never_random: int) -> dict:
  """Noises packed examples for the masked-LM family (see the module docstring).

  Args:
    examples: input_ids / input_mask / segment_ids [n, L] (+ sentence_label [n]) from packing.
    rng: the only randomness.
    config: the `objective` config section.
    vocab_size, special_ids, mask_id, word_start_table: from the tokenizer / model config.
    scheme_params: keyword arguments of the `noise.SELECTORS` entry.
    unit_source: `fn(input_ids, maskable, word_start) -> unit_ids` for mask_scheme='units'.
    num_never_random: leading vocabulary ids never drawn as random tokens (fairseq).

  Returns:
    `examples` with input_ids noised and mlm_positions / mlm_targets / mlm_weights [n, P]; with
    `sbo`, sbo_boundaries [n, P, 2] / sbo_offsets [n, P] / sbo_weights [n, P]; with a word
    shuffle, shuffle_positions / shuffle_targets / shuffle_weights [n, P].
  """
  o = config
  input_ids, input_mask = examples["input_ids"], examples["input_mask"]
  real = input_mask > 0
  maskable = real if o.mask_style == "fairseq" else real & ~np.isin(input_ids, special_ids)
  word_start = noise.word_starts(input_ids, maskable, word_start_table)
  params = dict(scheme_params)
  if unit_source is not None:
    params["unit_ids"] = unit_source(input_ids, maskable, word_start)
  if o.mask_per_segment:
    chosen = _select_per_segment(o, real, maskable, examples["segment_ids"], word_start, params,
                                 rng)
  else:
    budget = _budget(o, input_mask, maskable, rng)
    chosen = noise.SELECTORS[o.mask_scheme](maskable, word_start, budget, rng, **params)
  predictions = noise.pack_predictions(chosen, input_ids, o.max_predictions)
  corrupt = dict(mask_id=mask_id, vocab_size=vocab_size, replace_probs=replace_probs(o),
                 random_token_weights=_random_token_weights(o, input_ids, maskable, vocab_size,
                                                            num_never_random))
  positions, weights = predictions["mlm_positions"], predictions["mlm_weights"]
  span_ids = noise.span_index(chosen)
  if o.replace_per == "span":
    noised = noise.corrupt_spans(input_ids, positions, weights, span_ids, rng, **corrupt)
  else:
    noised = noise.corrupt_positions(input_ids, positions, weights, rng, **corrupt)
  features = {**examples, **predictions, "input_ids": noised}
  if o.sbo:
    features.update(noise.span_boundary_slots(positions, weights, span_ids, maskable,
                                              max_targets=o.sbo_max_targets))
  if o.word_shuffle_rate:
    shuffled = noise.shuffle_trigrams(noised, maskable, chosen, o.word_shuffle_rate, rng,
                                      max_predictions=o.max_predictions)
    features.update(shuffled)
  return features


def loss_fn(model, params, batch, rng, config, *, deterministic=False):
  """Returns (MLM [+ sentence task] [+ SBO] [+ word structure] loss, {metric: (sum, count)})."""
  o = config.objective
  positions = batch["mlm_positions"]
  if o.word_shuffle_rate:  # One pass of the tied head over both kinds of predictions.
    positions = jnp.concatenate([positions, batch["shuffle_positions"]], axis=1)
  outputs = model.apply(
      params, batch["input_ids"], batch["input_mask"], batch["segment_ids"], positions,
      sbo_boundaries=batch.get("sbo_boundaries"), sbo_offsets=batch.get("sbo_offsets"),
      deterministic=deterministic, rngs={"dropout": rng})
  mlm_logits = outputs["mlm_logits"]
  num_mlm = batch["mlm_positions"].shape[1]
  metrics = {}
  mean_ce = losses.mean_cross_entropy
  loss = mean_ce(mlm_logits[:, :num_mlm], batch["mlm_targets"], batch["mlm_weights"], metrics,
                 "mlm", MLM_DENOMINATOR_EPS)
  if o.sentence_task:
    labels = batch["sentence_label"]
    loss += mean_ce(outputs["sentence_logits"], labels, jnp.ones(labels.shape, jnp.float32),
                    metrics, o.sentence_task)
  if o.sbo:
    loss += mean_ce(outputs["sbo_logits"], batch["mlm_targets"], batch["sbo_weights"], metrics,
                    "sbo", SBO_DENOMINATOR_OFFSET)
  if o.word_shuffle_rate:
    loss += mean_ce(mlm_logits[:, num_mlm:], batch["shuffle_targets"], batch["shuffle_weights"],
                    metrics, "word_order", MLM_DENOMINATOR_EPS)
  return loss, metrics
