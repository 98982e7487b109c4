"""Masked language modelling (+ NSP): BERT (Devlin et al., 2019) and RoBERTa (Liu et al., 2019).

BERT: static 80/10/10 masking that never touches [CLS]/[SEP], budget
`min(max_predictions, max(1, round(0.15 · len)))` (create_pretraining_data.py), plus next-sentence
prediction; loss = MLM + NSP, the MLM part `Σ w·CE / (Σ w + 1e-5)` (run_pretraining.py).
RoBERTa: fairseq's MaskTokensDataset, dynamic (re-drawn every epoch), probabilistic budget over all
positions, random tokens never special; no NSP; loss = Σ CE / #masked.
"""

from __future__ import annotations

import functools

import jax

from bertfam_jax.models import pretraining
from bertfam_jax.objectives import losses, noise

# BERT's run_pretraining.py adds 1e-5 to the MLM weight sum so an all-padding batch is finite.
_MLM_DENOMINATOR_EPS = 1e-5


def build_model(config):
  sentence_classes = 2 if config.objective.sentence_task else 0
  return pretraining.MaskedLM(config.model, sentence_classes=sentence_classes)


def make_features(config, tokenizer):
  """Returns the host-side noising `fn(examples, rng) -> batch` (see objectives/__init__.py)."""
  o = config.objective
  common = dict(mask_rate=o.mask_rate, max_predictions=o.max_predictions,
                mask_id=tokenizer.mask_id, vocab_size=config.model.vocab_size)
  if o.mask_style == "bert":
    return functools.partial(noise.bert_mask, special_ids=tokenizer.special_ids, **common)
  if o.mask_style == "fairseq":
    # fairseq zero-weights its first 4 entries (<s>, <pad>, </s>, <unk>) for random replacement;
    # <mask> stays drawable. Our layout puts the same four first: pad 0, unk 1, [CLS] 2, [SEP] 3.
    num_special = 1 + max(tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id)
    return functools.partial(noise.roberta_mask, num_special=num_special, **common)
  raise ValueError(f"objective.mask_style={o.mask_style!r}; choose 'bert' or 'fairseq'.")


def loss_fn(model, params, batch, rng, config, *, deterministic=False):
  """Returns (MLM [+ NSP] loss, {metric: (sum, count)})."""
  outputs = model.apply(
      params, batch["input_ids"], batch["input_mask"], batch["segment_ids"], batch["mlm_positions"],
      deterministic=deterministic, rngs={"dropout": rng})
  mlm_sum, mlm_correct, mlm_count = losses.weighted_cross_entropy(
      logits=outputs["mlm_logits"], targets=batch["mlm_targets"], weights=batch["mlm_weights"])
  loss = mlm_sum / (mlm_count + _MLM_DENOMINATOR_EPS)
  metrics = {"mlm_loss": (mlm_sum, mlm_count), "mlm_accuracy": (mlm_correct, mlm_count)}
  if config.objective.sentence_task:
    labels = batch["sentence_label"]
    ones = jax.numpy.ones(labels.shape, jax.numpy.float32)
    sent_sum, sent_correct, sent_count = losses.weighted_cross_entropy(
        logits=outputs["sentence_logits"], targets=labels, weights=ones)
    loss = loss + sent_sum / sent_count
    name = config.objective.sentence_task
    metrics[f"{name}_loss"] = (sent_sum, sent_count)
    metrics[f"{name}_accuracy"] = (sent_correct, sent_count)
  return loss, metrics
