"""GPT fine-tuning (models/finetune.FineTuneModel on a causal backbone): the head reads each
row's extract token (its last real one) through no pooler; padding after it changes nothing;
pair_orders=2 sums the two orders' extract states; with_lm gives the backbone's LM logits; an
example's choices share the classifier's dropout mask."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import linen as nn

from bertfam_jax.config_lib import ConfigError
from bertfam_jax.models import finetune as finetune_models
from bertfam_jax.models import heads, layers, pretraining

from helpers import tiny

LENGTHS = np.array([5, 9, 12])


def rows(seed=0, length=16):
  ids = np.random.default_rng(seed).integers(4, tiny.VOCAB, (len(LENGTHS), length))
  mask = (np.arange(length)[None] < LENGTHS[:, None]).astype(np.int32)
  return jnp.asarray(ids * mask, jnp.int32), jnp.asarray(mask), jnp.zeros_like(ids)


def init(model, ids, mask, types):
  return nn.meta.unbox(model.init(jax.random.key(0), ids, mask, types,
                                  deterministic=True))["params"]


def last_layer(config, encoder_params, ids, mask):
  """The causal stack's last layer [rows, length, hidden], as pre-training computes it."""
  return np.asarray(pretraining.CausalLM(config).apply(
      {"params": {"encoder": encoder_params}}, ids, mask, deterministic=True,
      method=lambda m, i, k, deterministic: m.encoder(i, k, deterministic=deterministic)))


def test_the_head_reads_the_extract_token_without_a_pooler():
  config = ml_collections.FrozenConfigDict(tiny.gpt(version=2))
  model = finetune_models.FineTuneModel(config, "classification", 3, backbone="causal")
  ids, mask, types = rows()
  params = init(model, ids, mask, types)
  assert set(params["classification_head"]) == {"classifier"}
  logits = model.apply({"params": params}, ids, mask, types, deterministic=True)
  extract = last_layer(config, params["encoder"], ids, mask)[np.arange(3), LENGTHS - 1]
  head = jax.tree.map(np.asarray, params["classification_head"]["classifier"])
  np.testing.assert_allclose(logits, extract @ head["kernel"] + head["bias"][None], rtol=1e-5,
                             atol=1e-5)
  noisy = ids.at[:, -1].set(7)   # past every row's extract token
  np.testing.assert_array_equal(model.apply({"params": params}, noisy, mask, types,
                                            deterministic=True), logits)


def test_an_examples_choices_share_the_classifier_dropout():
  """train.py: clf_h [batch, 2, n_embd] dropped with noise_shape [batch, 1, n_embd], so an
  example's choices keep the same features. Equal choices score equally in training with the
  shared mask (and not with a mask per row, BERT's); FineTuneModel draws the shared mask, one
  [examples, 1, hidden], for GPT's multiple choice only."""
  config = ml_collections.FrozenConfigDict(tiny.gpt(dropout=0.5))
  head = heads.MultipleChoiceHead(config, 1)
  states = np.random.default_rng(0).normal(size=(4, 1, 32)).astype(np.float32)
  x = jnp.asarray(np.repeat(states, 2, axis=0))        # 4 examples × 2 equal choices
  params = head.init(jax.random.key(0), x, deterministic=True)
  score = lambda **kw: np.asarray(head.apply(  # noqa: E731
      params, x, deterministic=False, rngs={"dropout": jax.random.key(1)}, **kw)).reshape(4, 2)
  np.testing.assert_array_equal(score(choices=2)[:, 0], score(choices=2)[:, 1])
  assert not np.allclose(score()[:, 0], score()[:, 1])

  ids, mask, types = rows()
  stacked = [jnp.stack([t, t], axis=1) for t in (ids, mask, types)]
  for backbone, kernel, shape in (("causal", config, (3, 1, 32)),
                                  ("encoder", tiny.encoder(dropout=0.5), (6, 32))):
    model = finetune_models.FineTuneModel(ml_collections.FrozenConfigDict(kernel),
                                          "multiple_choice", backbone=backbone)
    _, state = model.apply({"params": init(model, *stacked)}, *stacked, deterministic=False,
                           rngs={"dropout": jax.random.key(1)},
                           capture_intermediates=lambda m, _: isinstance(m, layers.Dropout)
                           and m.scope.path[0] == "choice_head")
    dropped, = jax.tree.leaves(state["intermediates"])
    assert dropped.shape == shape, backbone


def test_both_orders_sum_their_extract_states_and_lm_logits_come_along():
  config = ml_collections.FrozenConfigDict(tiny.gpt())
  both = finetune_models.FineTuneModel(config, "regression", backbone="causal", orders=2)
  (ids, mask, types), (ids2, _, _) = rows(0), rows(1)
  ids2 = ids2 * mask
  pair = [jnp.stack([x, y], axis=1) for x, y in ((ids, ids2), (mask, mask), (types, types))]
  params = init(both, *pair)
  out, lm = both.apply({"params": params}, *pair, deterministic=True, with_lm=True)
  assert out.shape == (3,) and lm.shape == (3, 2, 16, tiny.VOCAB)

  rows_ = np.arange(3)
  summed = sum(last_layer(config, params["encoder"], x, mask)[rows_, LENGTHS - 1]
               for x in (ids, ids2))
  head = jax.tree.map(np.asarray, params["classification_head"]["classifier"])
  np.testing.assert_allclose(out, (summed @ head["kernel"])[:, 0] + head["bias"][0], rtol=1e-5,
                             atol=1e-5)
  full = pretraining.CausalLM(config).apply({"params": {"encoder": params["encoder"]}}, ids, mask,
                                            deterministic=True)
  np.testing.assert_allclose(lm[:, 0], full, rtol=1e-5, atol=1e-5)


def test_token_tasks_and_gpt_fields_on_other_backbones_are_refused():
  ids, mask, types = rows()
  tagger = finetune_models.FineTuneModel(ml_collections.FrozenConfigDict(tiny.gpt()),
                                         "token_classification", 4, backbone="causal")
  with pytest.raises(ConfigError, match="sequence-level"):
    init(tagger, ids, mask, types)
  bert = finetune_models.FineTuneModel(ml_collections.FrozenConfigDict(tiny.encoder()),
                                       "regression", orders=2)
  with pytest.raises(ConfigError, match="GPT's"):
    init(bert, ids[:, None].repeat(2, 1), mask[:, None].repeat(2, 1), types[:, None].repeat(2, 1))


def test_gpts_fine_tuning_tokens_start_fresh():
  """train.py appends [start] [delim] [extract] as new N(0, 0.02) rows: after the transfer, the
  rows of our cls, sep and mask ids are the fresh initialisation's, every other row the
  pre-trained one's."""
  from bertfam_jax.finetune import run as finetune_run  # pylint: disable=import-outside-toplevel
  fresh_table = np.random.default_rng(0).normal(0, 0.02, (10, 4)).astype(np.float32)
  given_table = np.random.default_rng(1).normal(0, 1.0, (10, 4)).astype(np.float32)
  fresh = {"encoder": {"word_embeddings": {"embedding": fresh_table}, "other": np.zeros(2)},
           "classification_head": {"classifier": np.ones(3)}}
  copy = lambda tree: dict(tree, encoder=dict(  # noqa: E731  the pre-trained encoder copied in
      tree["encoder"], word_embeddings={"embedding": jnp.asarray(given_table)}))
  params = finetune_run.with_fresh_token_rows(copy, (2, 3, 4))(fresh)
  table = np.asarray(params["encoder"]["word_embeddings"]["embedding"])
  np.testing.assert_array_equal(table[2:5], fresh_table[2:5])
  np.testing.assert_array_equal(table[[0, 1, 5, 6, 7, 8, 9]], given_table[[0, 1, 5, 6, 7, 8, 9]])
  assert params["classification_head"] is fresh["classification_head"]
