"""UniLM's seq2seq fine-tuning (finetune/unilm_seq2seq.py): rows and token types, target masking
of seq2seq_loader.py's fixed count on the target only, and greedy decoding equal to a step-by-step loop that builds
each row and its seq2seq mask by hand."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import linen as nn

from bertfam_jax.finetune import unilm_seq2seq
from bertfam_jax.models import pretraining

from helpers import tiny


class Tokenizer:
  """Whitespace ids: 'wN' → N; the specials as our SentencePiece layout has them."""
  pad_id, cls_id, sep_id, mask_id = 0, 2, 3, 4

  def encode(self, texts):
    return [np.array([int(w[1:]) for w in t.split()], np.int32) for t in texts]

  def decode(self, ids):
    return " ".join(f"w{i}" for i in ids)


def test_rows_are_cls_source_sep_target_sep_with_seq2seq_types():
  examples = [dict(inputs="w10 w11 w12", targets="w20 w21"),
              dict(inputs="w10 w11 w12 w13 w14 w15", targets="w20 w21 w22 w23 w24")]
  data = unilm_seq2seq.featurize(Tokenizer(), examples, source_length=6, target_length=4,
                                 mask_prob=0.7)
  np.testing.assert_array_equal(data["input_ids"], [
      [2, 10, 11, 12, 3, 20, 21, 3, 0, 0],
      [2, 10, 11, 12, 13, 3, 20, 21, 22, 3]])
  np.testing.assert_array_equal(data["segment_ids"], [
      [4, 4, 4, 4, 4, 5, 5, 5, 0, 0], [4, 4, 4, 4, 4, 4, 5, 5, 5, 5]])
  np.testing.assert_array_equal(data["source_tokens"], [5, 6])
  np.testing.assert_array_equal(data["input_mask"], data["segment_ids"] > 0)
  np.testing.assert_array_equal(data["target_predictions"], [1, 2])   # round(0.7 · 2), (0.7 · 3)


def test_prediction_counts_are_the_references_rounded_seventy_percent():
  """Preprocess4Seq2seq: n_pred = max(1, int(round(len(tokens_b) · 0.7))), Python's round of
  the float64 product, halves to even (5 · 0.7 = 3.5 → 4, 15 · 0.7 = 10.5 → 10)."""
  examples = [dict(inputs="w10", targets=" ".join(["w20"] * n)) for n in range(1, 16)]
  data = unilm_seq2seq.featurize(Tokenizer(), examples, source_length=4, target_length=16,
                                 mask_prob=0.7)
  np.testing.assert_array_equal(data["target_predictions"],
                                [1, 1, 2, 3, 4, 4, 5, 6, 6, 7, 8, 8, 9, 10, 10])


def test_each_row_masks_its_count_uniformly_over_its_target_and_sep():
  n, width = 4000, 16
  segment = np.tile(np.array([4] * 6 + [5] * 8 + [0] * 2), (n, 1))   # 7 target tokens + [SEP]
  counts = np.where(np.arange(n) % 2, 5, 1).astype(np.int32)
  batch = dict(input_ids=jnp.full((n, width), 9, jnp.int32), segment_ids=jnp.asarray(segment),
               target_predictions=jnp.asarray(counts))
  noised, chosen = unilm_seq2seq.mask_targets(jax.random.key(0), batch, mask_id=4, vocab_size=50)
  noised, chosen = np.asarray(noised), np.asarray(chosen)
  assert not chosen[segment != 5].any() and (noised[segment != 5] == 9).all()
  np.testing.assert_array_equal(chosen.sum(-1), counts)
  for count in (1, 5):   # every target place, the final [SEP] included, equally likely
    share = chosen[counts == count][:, 6:14].mean(0)
    np.testing.assert_allclose(share, count / 8, atol=0.035)
  picked = noised[chosen]
  assert abs((picked == 4).mean() - 0.8) < 0.015
  assert abs((picked == 9).mean() - 0.1 - 0.1 / 50) < 0.015   # kept, or drawn as itself


def _model_and_rows(width=20, target_length=6):
  """A tiny UniLM MaskedLM, its parameters, and two featurized rows (sources of 3 and 9)."""
  config = ml_collections.FrozenConfigDict(tiny.encoder(type_vocab_size=6, dropout=0.0,
                                                        attention_dropout=0.0))
  model = pretraining.MaskedLM(config)
  rng = np.random.default_rng(0)
  examples = [dict(inputs=" ".join(f"w{i}" for i in rng.integers(5, 100, size)), targets="w5")
              for size in (3, 9)]
  data = unilm_seq2seq.featurize(Tokenizer(), examples, source_length=width - target_length,
                                 target_length=target_length, mask_prob=0.7)
  ids = jnp.zeros((1, width), jnp.int32)
  params = nn.meta.unbox(model.init(jax.random.key(1), ids, jnp.ones_like(ids), ids, ids,
                                    deterministic=True))["params"]
  return model, params, data


def test_greedy_decoding_equals_a_loop_over_hand_built_rows():
  target_length = 6
  model, params, data = _model_and_rows(target_length=target_length)
  batch = {k: jnp.asarray(v) for k, v in data.items()}
  out = np.asarray(unilm_seq2seq.greedy_decode(model, params, batch, target_length=target_length,
                                               mask_id=4, sep_id=3, pad_id=0))
  for row in range(2):
    source = list(data["input_ids"][row, :data["source_tokens"][row]])
    generated = []
    for _ in range(target_length):
      tokens = source + generated + [4]
      n, s = len(tokens), len(source)
      mask = np.zeros((n, n), bool)
      mask[:, :s] = True                        # everyone sees the source
      mask[s:, s:] = np.tril(np.ones((n - s, n - s), bool))   # targets see back to themselves
      x = jnp.asarray([tokens])
      logits = model.apply({"params": params}, x, jnp.ones_like(x),
                           jnp.asarray([[4] * s + [5] * (n - s)]), jnp.arange(n)[None],
                           deterministic=True, attention_mask=jnp.asarray(mask)[None, None])
      token = int(np.argmax(logits["mlm_logits"][0, -1]))
      generated.append(token)
      if token == 3:
        break
    expected = generated + [0] * (target_length - len(generated))
    np.testing.assert_array_equal(out[row], expected)


def _log_likelihood(model, params, data, row, tokens):
  """Σ log p of `tokens` (up to and with [SEP]) under greedy_decode's rows, step by step."""
  source = list(data["input_ids"][row, :data["source_tokens"][row]])
  total, written = 0.0, []
  for token in tokens:
    x = source + written + [4]
    n, s = len(x), len(source)
    mask = np.zeros((n, n), bool)
    mask[:, :s] = True
    mask[s:, s:] = np.tril(np.ones((n - s, n - s), bool))
    logits = model.apply({"params": params}, jnp.asarray([x]), jnp.ones((1, n), jnp.int32),
                         jnp.asarray([[4] * s + [5] * (n - s)]), jnp.arange(n)[None],
                         deterministic=True, attention_mask=jnp.asarray(mask)[None, None])
    total += float(jax.nn.log_softmax(logits["mlm_logits"][0, -1])[token])
    written.append(int(token))
    if token == 3:
      break
  return total


def test_beam_decoding():
  """Beam size 1 (alpha 0) is greedy decoding exactly; beam size 4 returns sequences that end
  in [SEP] (or fill the length) with 0 after, whose log-likelihood, recomputed row by row, is
  at least that of the greedy output (alpha 0: no length penalty)."""
  target_length = 4
  model, params, data = _model_and_rows(target_length=target_length)
  batch = {k: jnp.asarray(v) for k, v in data.items()}
  common = dict(target_length=target_length, mask_id=4, sep_id=3, pad_id=0)
  greedy = np.asarray(unilm_seq2seq.greedy_decode(model, params, batch, **common))
  one = np.asarray(unilm_seq2seq.beam_decode(model, params, batch, beam_size=1, alpha=0.0,
                                             **common))
  np.testing.assert_array_equal(one, greedy)
  four = np.asarray(unilm_seq2seq.beam_decode(model, params, batch, beam_size=4, alpha=0.0,
                                              **common))
  for row in range(2):
    tokens = list(four[row])
    end = tokens.index(3) + 1 if 3 in tokens else target_length
    assert not any(tokens[end:])
    beam = _log_likelihood(model, params, data, row, tokens[:end])
    g = list(greedy[row])
    best_greedy = _log_likelihood(model, params, data, row, g[:g.index(3) + 1] if 3 in g else g)
    assert beam >= best_greedy - 1e-4
