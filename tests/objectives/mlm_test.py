"""The MLM objective's wiring: which masking rule each config gets, and the loss it returns."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertfam_jax import config_lib as cl
from bertfam_jax.objectives import mlm

# The project tokenizer layout: <pad> 0, <unk> 1, [CLS] 2, [SEP] 3, [MASK] 4.
VOCAB, LENGTH, ROWS = 50, 64, 4000
TOKENIZER = types.SimpleNamespace(pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4,
                                  special_ids=np.array([0, 2, 3, 4]),
                                  word_start=np.ones(VOCAB, bool),
                                  word_start_for=lambda rule: np.ones(VOCAB, bool))


def examples():
  rng = np.random.default_rng(0)
  ids = rng.integers(5, VOCAB, (ROWS, LENGTH)).astype(np.int32)
  ids[:, 0], ids[:, 31], ids[:, -1] = 2, 3, 3
  return dict(input_ids=ids, input_mask=np.ones_like(ids), segment_ids=np.zeros_like(ids))


def features(mask_style):
  config = cl.base_config()
  config.model.vocab_size = VOCAB
  config.objective.update(mask_style=mask_style, max_predictions=12)
  return mlm.make_features(config, TOKENIZER)(examples(), np.random.default_rng(1))


def replaced_with_random(batch):
  """Ids put at predicted positions that are neither [MASK] nor the original token."""
  rows = np.arange(ROWS)[:, None]
  placed = batch["input_ids"][rows, batch["mlm_positions"]]
  real = batch["mlm_weights"] > 0
  return placed[real & (placed != 4) & (placed != batch["mlm_targets"])]


def test_bert_style_never_predicts_cls_or_sep():
  batch = features("bert")
  targets = batch["mlm_targets"][batch["mlm_weights"] > 0]
  assert not np.isin(targets, [2, 3]).any()
  assert (batch["mlm_weights"].sum(1) == round(0.15 * LENGTH)).all()  # 10 of 64, below the cap


def test_fairseq_style_masks_specials_but_never_draws_the_first_four():
  batch = features("fairseq")
  targets = batch["mlm_targets"][batch["mlm_weights"] > 0]
  assert np.isin(targets, [2, 3]).any()          # <s>/</s> may be predicted (fairseq)
  random_ids = replaced_with_random(batch)
  assert random_ids.size > 100
  assert random_ids.min() >= 4                    # <pad> <unk> <s> </s> never drawn
  # ...while <mask> (id 4, indistinguishable from masking in the output) stays drawable.
  config = cl.base_config()
  config.objective.mask_style = "fairseq"
  assert mlm.make_features(config, TOKENIZER).keywords["num_never_random"] == 4


def test_unknown_mask_style():
  with pytest.raises(ValueError, match="mask_style"):
    features("electra")


def test_loss_is_bert_mlm_plus_nsp():
  config = cl.base_config()
  config.model.update(hidden=16, layers=1, heads=2, mlp=32, vocab_size=VOCAB, max_positions=8)
  config.data.seq_len = 8
  config.objective.max_predictions = 3
  model = mlm.build_model(config)
  rng = np.random.default_rng(0)
  batch = dict(input_ids=rng.integers(5, VOCAB, (2, 8)).astype(np.int32),
               input_mask=np.ones((2, 8), np.int32), segment_ids=np.zeros((2, 8), np.int32),
               mlm_positions=np.array([[1, 2, 0], [3, 0, 0]], np.int32),
               mlm_targets=np.array([[7, 8, 0], [9, 0, 0]], np.int32),
               mlm_weights=np.array([[1, 1, 0], [1, 0, 0]], np.float32),
               sentence_label=np.array([0, 1], np.int32))
  params = model.init(jax.random.key(0), batch["input_ids"], batch["input_mask"],
                      batch["segment_ids"], batch["mlm_positions"], deterministic=True)
  loss, metrics = mlm.loss_fn(model, params, batch, jax.random.key(1), config, deterministic=True)
  out = model.apply(params, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                    batch["mlm_positions"], deterministic=True)
  ce = optax.softmax_cross_entropy_with_integer_labels(out["mlm_logits"], batch["mlm_targets"])
  expected_mlm = jnp.sum(ce * batch["mlm_weights"]) / (3 + 1e-5)   # padding predictions dropped
  expected_nsp = optax.softmax_cross_entropy_with_integer_labels(
      out["sentence_logits"], batch["sentence_label"]).mean()
  np.testing.assert_allclose(loss, expected_mlm + expected_nsp, rtol=1e-6)
  assert float(metrics["mlm_loss"][1]) == 3 and float(metrics["nsp_loss"][1]) == 2
