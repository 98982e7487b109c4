"""UniLM (objectives/unilm.py): each of the four attention masks against an explicit
construction, the masks leaking nothing through a real model, the LM types drawn at their rates
with their token types, UniLM's n-gram draw at 80% one word, and the seq2seq and
left-to-right masks equal to T5's prefix-LM and causal ones."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import linen as nn

from bertfam_jax.models import pretraining, t5
from bertfam_jax.objectives import noise, unilm

from helpers import tiny

LENGTH = 12
# Row layout: [CLS] A A A [SEP] B B B [SEP] pad pad pad (source = the first 5 tokens).
SOURCE, REAL = 5, 9


def explicit_mask(lm_type: int) -> np.ndarray:
  """[L, L] bool by the definitions (Dong et al. 2019 Fig. 1), one (query, key) at a time."""
  mask = np.zeros((LENGTH, LENGTH), bool)
  for i in range(LENGTH):
    for j in range(REAL):
      if lm_type == unilm.BIDIRECTIONAL:
        mask[i, j] = True
      elif lm_type == unilm.LEFT_TO_RIGHT:
        mask[i, j] = j <= i
      elif lm_type == unilm.RIGHT_TO_LEFT:
        mask[i, j] = j >= i
      else:   # seq2seq: the source sees the source; the target sees the source and itself back
        mask[i, j] = j < SOURCE or (i >= SOURCE and j <= i)
  return mask


def rows(types):
  input_mask = (np.arange(LENGTH) < REAL).astype(np.int32)
  segment = (np.arange(LENGTH) >= SOURCE).astype(np.int32)
  ids = np.array([unilm.LM_TYPE_IDS[t] for t in range(4)])
  segment_ids = np.stack([np.where(input_mask > 0, ids[t][segment], 0) for t in types])
  return (jnp.asarray(types, jnp.int32), jnp.asarray(segment_ids),
          jnp.asarray(np.tile(input_mask, (len(types), 1))))


def test_each_mask_is_its_definition():
  masks = np.asarray(unilm.attention_masks(*rows([0, 1, 2, 3])))
  assert masks.shape == (4, 1, LENGTH, LENGTH)
  for t in range(4):
    np.testing.assert_array_equal(masks[t, 0], explicit_mask(t), err_msg=unilm.LM_TYPES[t])


@pytest.mark.parametrize("lm_type", range(4))
def test_no_token_sees_what_its_mask_hides(lm_type):
  """Through a 2-layer encoder, changing token k moves exactly the outputs whose masks reach it:
  left-to-right positions i >= k, right-to-left i <= k, seq2seq every position for a source
  token and target positions i >= k for a target token, bidirectional every position."""
  config = ml_collections.FrozenConfigDict(tiny.encoder(type_vocab_size=6, max_positions=LENGTH,
                                                        dropout=0.0, attention_dropout=0.0))
  model = pretraining.MaskedLM(config)
  types, segment_ids, input_mask = rows([lm_type])
  ids = jnp.asarray(np.random.default_rng(0).integers(5, tiny.VOCAB, (1, LENGTH)), jnp.int32)
  positions = jnp.arange(LENGTH)[None]
  params = nn.meta.unbox(model.init(jax.random.key(0), ids, input_mask, segment_ids, positions,
                                    deterministic=True))["params"]
  masks = unilm.attention_masks(types, segment_ids, input_mask)
  out = lambda x: np.asarray(model.apply(  # noqa: E731
      {"params": params}, x, input_mask, segment_ids, positions, deterministic=True,
      attention_mask=masks)["mlm_logits"])[0]
  reference = out(ids)
  for k in range(REAL):
    changed = out(ids.at[0, k].set(5 + (ids[0, k] - 4) % (tiny.VOCAB - 5)))
    moved = ~np.isclose(changed, reference, atol=1e-6).all(axis=-1)[:REAL]
    if lm_type == unilm.LEFT_TO_RIGHT:
      assert not moved[:k].any() and moved[k:].all()
    elif lm_type == unilm.RIGHT_TO_LEFT:
      assert not moved[k + 1:].any() and moved[:k + 1].all()
    elif lm_type == unilm.SEQ2SEQ:
      expected = np.arange(REAL) >= (k if k >= SOURCE else 0)
      np.testing.assert_array_equal(moved, expected)
    else:
      assert moved.all()


def test_lm_types_are_drawn_at_their_rates_with_their_token_types():
  n = 6000
  examples = dict(input_ids=np.full((n, LENGTH), 9, np.int32),
                  input_mask=np.tile((np.arange(LENGTH) < REAL).astype(np.int32), (n, 1)),
                  segment_ids=np.tile((np.arange(LENGTH) >= SOURCE).astype(np.int32), (n, 1)))
  examples["segment_ids"] *= examples["input_mask"]
  probs = np.array([1 / 3, 1 / 6, 1 / 6, 1 / 3])
  out = unilm.unilm_features(examples, np.random.default_rng(0), masked=lambda x, rng: dict(x),
                             probs=probs)
  share = np.bincount(out["lm_type"], minlength=4) / n
  np.testing.assert_allclose(share, probs, atol=4 * np.sqrt(0.25 / n))   # 4 standard errors
  for t in range(4):
    row = out["segment_ids"][out["lm_type"] == t][0]
    first, second = unilm.LM_TYPE_IDS[t]
    np.testing.assert_array_equal(row, [first] * SOURCE + [second] * (REAL - SOURCE)
                                  + [0] * (LENGTH - REAL))


def test_unilm_ngrams_are_one_word_eight_times_in_ten():
  """Dong et al. §2.3: 80% of the masked units are one token (word), 20% a bigram or trigram."""
  rows_, length = 400, 64
  maskable = np.ones((rows_, length), bool)
  word_start = np.ones((rows_, length), bool)
  draws = noise.draw_ngrams(maskable, word_start, np.full(rows_, 10), np.random.default_rng(0),
                            max_n=3, probs=noise.ngram_probs("unilm", 3))
  drawn = np.asarray(draws.drawn_words)
  share = np.bincount(drawn, minlength=4)[1:] / drawn.size
  np.testing.assert_allclose(share, [0.8, 0.1, 0.1], atol=0.02)


def test_seq2seq_and_left_to_right_are_t5s_prefix_lm_and_causal_masks():
  """UniLM's seq2seq mask is the prefix LM of T5's decoder-only seam (`models.t5.prefix_lm_mask`,
  t5x's decoder_causal_attention = 1 over the inputs) and its left-to-right mask T5's causal
  one, on every real query of rows with several source and target lengths; T5 masks pad queries
  out entirely, UniLM leaves them unread (no loss there)."""
  length = 16
  for source, real in ((2, 16), (5, 9), (7, 12), (15, 16)):
    positions = np.arange(length)
    input_mask = (positions < real).astype(np.int32)[None]
    in_source = positions < source
    for lm_type, prefix in ((unilm.SEQ2SEQ, in_source), (unilm.LEFT_TO_RIGHT, None)):
      ids = unilm.LM_TYPE_IDS[lm_type]
      segment_ids = np.where(input_mask > 0, np.where(in_source, ids[0], ids[1]), 0)
      ours = np.asarray(unilm.attention_masks(jnp.asarray([lm_type]), jnp.asarray(segment_ids),
                                              jnp.asarray(input_mask)))[0, 0]
      t5_mask = (t5.causal_mask(length) if prefix is None
                 else t5.prefix_lm_mask(jnp.asarray(prefix[None].astype(np.int32))))
      t5_mask = np.asarray(t5_mask & t5.segment_mask(jnp.asarray(input_mask),
                                                     jnp.asarray(input_mask)))[0, 0]
      np.testing.assert_array_equal(ours[:real], t5_mask[:real],
                                    err_msg=f"{unilm.LM_TYPES[lm_type]}, source {source}")
      assert not t5_mask[real:].any()
