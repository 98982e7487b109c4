"""Tests of objectives/t5_noise.py against t5/data/preprocessors.py (spec t5_objectives.md §3) and
fairseq denoising_dataset.py (spec objectives.md §8).

The random-span mask and the noise permutation are compared bit for bit with slow per-example
transcriptions of the reference fed the same uniform draws (the draw layout each function
documents). Statistical checks allow 5 standard deviations of the count (false failure ~6e-7 per
check).
"""

import functools
import math

import numpy as np
import pytest

from bertfam_jax import config_lib
from bertfam_jax.objectives import t5_noise

SDS = 5.0
SENTINEL_START = 999  # <extra_id_0> of a 1000-id vocabulary.
VOCAB = 1000


def within(count, expected_count, total):
  """count is within SDS binomial standard deviations of expected_count out of total."""
  p = expected_count / total
  return abs(count - expected_count) <= SDS * math.sqrt(total * p * (1 - p)) + 1e-9


# ---------------------------------------------------------------------------------------------
# random_spans_helper (spec §3.4).
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("inputs_length,density,mean,expected", [
    (64, 0.20, 2.0, (70, 22)), (64, 0.20, 1.0, (63, 27)),
    (512, 0.15, 3.0, (568, 114)), (512, 0.15, 2.0, (552, 126)), (512, 0.15, 5.0, (581, 105)),
    (512, 0.15, 10.0, (591, 99)), (512, 0.10, 3.0, (548, 74)), (512, 0.25, 3.0, (614, 206)),
    (512, 0.50, 3.0, (766, 512)), (128, 0.15, 3.0, (141, 29)), (256, 0.15, 3.0, (284, 58)),
    (1024, 0.15, 3.0, (1137, 229)),
])
def test_random_spans_helper_matches_spec_table(inputs_length, density, mean, expected):
  assert t5_noise.random_spans_helper(inputs_length, density, mean) == expected


# ---------------------------------------------------------------------------------------------
# random_spans_noise_mask (spec §3.1).
# ---------------------------------------------------------------------------------------------


def reference_random_spans_mask(length, noise_density, mean_noise_span_length, u_noise,
                                u_nonnoise, roll_offset):
  """preprocessors.py random_spans_noise_mask for one example, transcribed line by line (TF ops
  -> numpy, float32 like `to_float`), with `stateless_uniform` replaced by the given draws."""
  orig_length = length
  length = max(length, 2)
  num_noise_tokens = int(np.round(np.float32(length) * np.float32(noise_density)))
  num_noise_tokens = min(max(num_noise_tokens, 1), length - 1)
  num_noise_spans = int(np.round(np.float32(num_noise_tokens) /
                                 np.float32(mean_noise_span_length)))
  num_noise_spans = max(num_noise_spans, 1)
  num_nonnoise_tokens = length - num_noise_tokens

  def random_segmentation(num_items, num_segments, uniforms):
    flags = (np.arange(num_items - 1) < num_segments - 1).astype(np.int64)
    shuffled = flags[np.argsort(uniforms[:num_items - 1], kind="stable")]
    first_in_segment = np.pad(shuffled, [[1, 0]])
    segment_id = np.cumsum(first_in_segment)
    return np.bincount(segment_id, minlength=num_segments)    # segment_sum of ones

  noise_span_lengths = random_segmentation(num_noise_tokens, num_noise_spans, u_noise)
  nonnoise_span_lengths = random_segmentation(num_nonnoise_tokens, num_noise_spans, u_nonnoise)
  interleaved = np.stack([nonnoise_span_lengths, noise_span_lengths], axis=1).reshape(-1)
  span_starts = np.cumsum(interleaved)[:-1]
  span_start_indicator = np.bincount(span_starts, minlength=length)[:length]
  span_num = np.cumsum(span_start_indicator)
  mask = (span_num % 2 == 1)[:orig_length]
  if roll_offset is not None:
    mask = np.roll(mask, roll_offset)
  return mask


@pytest.mark.parametrize("density,mean,random_roll", [
    (0.15, 3.0, False), (0.25, 2.0, False), (0.5, 2.0, False), (0.1, 1.0, False),
    (0.15, 3.0, True),
    (0.3, 10.0, True),
])
def test_random_spans_mask_matches_reference_transcription(density, mean, random_roll):
  max_len = 40
  lengths = np.concatenate([np.arange(max_len + 1), np.random.default_rng(1).integers(
      0, max_len + 1, 100)])
  seed = 7
  mask = t5_noise.random_spans_noise_mask(lengths, max_len, np.random.default_rng(seed),
                                          noise_density=density, mean_noise_span_length=mean,
                                          random_roll=random_roll)
  # The draw layout documented by random_spans_noise_mask.
  rng = np.random.default_rng(seed)
  n = len(lengths)
  u_noise, u_nonnoise = rng.random((n, max_len - 1)), rng.random((n, max_len - 1))
  offsets = rng.integers(0, np.maximum(lengths, 2)) if random_roll else [None] * n
  for i, length in enumerate(lengths):
    expected = reference_random_spans_mask(int(length), density, mean, u_noise[i],
                                           u_nonnoise[i], offsets[i])
    np.testing.assert_array_equal(mask[i, :length], expected, err_msg=f"length {length}")
    assert not mask[i, length:].any()


def test_random_spans_leaves_one_token_clean_in_short_dense_rows():
  """preprocessors.py: num_noise_tokens = min(max(round(length·density), 1), length − 1). At
  density 0.9 rows of 2-4 tokens round to every token (2, 3, 4) and are clamped to length − 1;
  rows of 0 and 1 token count as 2 (the reference's `maximum(length, 2)`), then are cut back."""
  lengths = np.array([2, 3, 4] * 20 + [1, 0])
  mask = t5_noise.random_spans_noise_mask(lengths, 4, np.random.default_rng(0),
                                          noise_density=0.9, mean_noise_span_length=3.0)
  np.testing.assert_array_equal(mask[:60].sum(axis=1), lengths[:60] - 1)
  assert all(len(spans_of(row)) == 1 for row in mask[:60])
  assert not mask[-1].any() and mask[-2].sum() <= 1


def spans_of(row_mask):
  """Lengths of the runs of True in a 1-d bool array."""
  padded = np.concatenate([[False], row_mask, [False]]).astype(np.int8)
  edges = np.flatnonzero(np.diff(padded))
  return edges[1::2] - edges[::2]


def test_random_spans_counts_and_position():
  # preprocessors_test.py: length 32, density 0.25, mean 2 -> 8 noise tokens in 4 spans.
  mask = t5_noise.random_spans_noise_mask(np.full(50, 32), 32, np.random.default_rng(0),
                                          noise_density=0.25, mean_noise_span_length=2.0)
  for row in mask:
    assert row.sum() == 8 and len(spans_of(row)) == 4
    assert not row[0] and row[-1]         # starts non-noise, ends noise (no random_roll)
  # The default row of span corruption: 568 tokens -> 85 noise tokens in 28 spans, mean 85/28.
  mask = t5_noise.random_spans_noise_mask(np.array([568, 500]), 568, np.random.default_rng(0),
                                          noise_density=0.15, mean_noise_span_length=3.0)
  assert mask[0].sum() == 85 and len(spans_of(mask[0])) == 28
  assert mask[1].sum() == 75 and len(spans_of(mask[1])) == 25 and not mask[1, 500:].any()


def test_random_spans_lengths_are_a_uniform_composition():
  # 100 tokens at 15%, mean 3: 15 noise tokens in 5 spans. A uniform composition of N into S
  # positive parts gives P(first part = k) = C(N - k - 1, S - 2) / C(N - 1, S - 1).
  n, num_noise, num_spans = 4000, 15, 5
  mask = t5_noise.random_spans_noise_mask(np.full(n, 100), 100, np.random.default_rng(3),
                                          noise_density=0.15, mean_noise_span_length=3.0)
  first = np.array([spans_of(row)[0] for row in mask])
  for k in range(1, num_noise - num_spans + 2):
    p = math.comb(num_noise - k - 1, num_spans - 2) / math.comb(num_noise - 1, num_spans - 1)
    assert within(np.count_nonzero(first == k), n * p, n), k


def test_random_spans_rejects_more_spans_than_nonnoise_tokens():
  with pytest.raises(config_lib.ConfigError, match="noise_density"):
    t5_noise.random_spans_noise_mask(np.array([10]), 10, np.random.default_rng(0),
                                     noise_density=0.9, mean_noise_span_length=1.0)


# ---------------------------------------------------------------------------------------------
# iid and prefix masks (spec §3.2).
# ---------------------------------------------------------------------------------------------


def test_iid_noise_mask_rate_and_padding():
  lengths = np.random.default_rng(0).integers(0, 65, 500)
  mask = t5_noise.iid_noise_mask(lengths, 64, np.random.default_rng(1), noise_density=0.15)
  valid = np.arange(64)[None, :] < lengths[:, None]
  assert not mask[~valid].any()
  assert within(mask.sum(), 0.15 * valid.sum(), valid.sum())


def test_random_prefix_mask_is_a_uniform_prefix():
  n, length = 6000, 7
  mask = t5_noise.random_prefix_noise_mask(np.full(n, length), 9, np.random.default_rng(0),
                                           noise_density=0.5)
  prefix = mask.sum(axis=1)
  np.testing.assert_array_equal(mask, np.arange(9)[None, :] < prefix[:, None])
  assert prefix.min() == 1 and prefix.max() == length - 1       # uniform on [1, L - 1]
  for k in range(1, length):
    assert within(np.count_nonzero(prefix == k), n / (length - 1), n)
  # density 0.25: at least round(0.5 * (L - 1)) = 3 input tokens.
  quarter = t5_noise.random_prefix_noise_mask(np.full(500, length), 9, np.random.default_rng(1),
                                              noise_density=0.25).sum(axis=1)
  assert set(quarter.tolist()) == {3, 4, 5, 6}
  with pytest.raises(config_lib.ConfigError, match="noise_density"):
    t5_noise.random_prefix_noise_mask(np.full(2, length), 9, np.random.default_rng(0),
                                      noise_density=0.6)


# ---------------------------------------------------------------------------------------------
# Encodings (spec §3.3, paper Table 3).
# ---------------------------------------------------------------------------------------------

# "Thank you for inviting me to your party last week ." with one id per word (10..20); the noise
# of the paper's Table 3 / Figure 2 is "for inviting" and "last".
SENTENCE = np.arange(10, 21)[None, :]
SENTENCE_NOISE = np.isin(SENTENCE, [12, 13, 18])
X, Y, Z, M = SENTINEL_START, SENTINEL_START - 1, SENTINEL_START - 2, SENTINEL_START


def encode(name, tokens=SENTENCE, noise=SENTENCE_NOISE, **params):
  out, lengths = t5_noise.ENCODINGS[name](tokens, np.array([tokens.shape[1]]), noise,
                                          np.random.default_rng(0), sentinel_start=SENTINEL_START,
                                          vocab_size=VOCAB, **params)
  return out[0, :lengths[0]].tolist()


def test_encodings_reproduce_paper_table_3():
  # I.i.d. noise, replace spans: `Thank you <X> me to your party <Y> week .` / `<X> for inviting
  # <Y> last <Z>`.
  assert encode("noise_span_to_unique_sentinel") == [10, 11, X, 14, 15, 16, 17, Y, 19, 20]
  assert encode("nonnoise_span_to_unique_sentinel") == [X, 12, 13, Y, 18, Z]
  # I.i.d. noise, drop tokens.
  assert encode("drop_noise_tokens") == [10, 11, 14, 15, 16, 17, 19, 20]
  assert encode("drop_nonnoise_tokens") == [12, 13, 18]
  # MASS-style: `Thank you <M> <M> me to your party <M> week .` / the original text.
  assert encode("noise_token_to_sentinel") == [10, 11, M, M, 14, 15, 16, 17, M, 19, 20]
  assert encode("original") == list(range(10, 21))
  # The shared-sentinel span encodings ("s").
  assert encode("noise_span_to_sentinel") == [10, 11, M, 14, 15, 16, 17, M, 19, 20]
  assert encode("nonnoise_span_to_sentinel") == [M, 12, 13, M, 18, M]
  # Prefix LM: `Thank you for inviting` / `me to your party last week .`
  prefix = np.arange(11)[None, :] < 4
  assert encode("drop_nonnoise_tokens", noise=prefix) == [10, 11, 12, 13]
  assert encode("drop_noise_tokens", noise=prefix) == list(range(14, 21))


def test_unique_sentinel_spec_example():
  # preprocessors_test.py: vocab 1000, tokens [10..15], mask TTFFTF -> [999, 12, 13, 998, 15].
  tokens, noise = np.arange(10, 16)[None, :], np.array([[1, 1, 0, 0, 1, 0]], bool)
  assert encode("noise_span_to_unique_sentinel", tokens, noise) == [999, 12, 13, 998, 15]
  assert encode("nonnoise_span_to_unique_sentinel", tokens, noise) == [10, 11, 999, 14, 998]


def is_sentinel(token):
  return token > SENTINEL_START - 100


def reconstruct(inputs, targets):
  """Inverts unique-sentinel corruption. Both sides number their own spans from <extra_id_0>:
  when the row starts with non-noise (always, for the span mask without roll), input sentinel k
  is filled by the tokens after target sentinel k; when it starts with noise (possible with the
  i.i.d. mask or random_roll, the reference's behaviour), by the tokens before target sentinel k.
  """
  chunks, sentinels = [[]], []
  for token in targets:
    if is_sentinel(token):
      sentinels.append(token)
      chunks.append([])
    else:
      chunks[-1].append(token)
  shift = 0 if is_sentinel(inputs[0]) else 1
  fills = {SENTINEL_START - k: chunks[k + shift] for k in range(len(chunks) - shift)}
  return [t for token in inputs for t in (fills[token] if is_sentinel(token) else [token])]


@pytest.mark.parametrize("mask_name,params", [
    ("random_spans", dict(mean_noise_span_length=3.0)),
    ("random_spans", dict(mean_noise_span_length=3.0, random_roll=True)),
    ("iid", {}),
])
def test_span_corruption_round_trip(mask_name, params):
  rng = np.random.default_rng(0)
  lengths = rng.integers(1, 61, 200)
  tokens = np.where(np.arange(60)[None, :] < lengths[:, None], rng.integers(5, 500, (200, 60)), 0)
  out = t5_noise.denoise(tokens, lengths, rng, noise_density=0.15,
                         noise_mask_fn=functools.partial(t5_noise.NOISE_MASKS[mask_name],
                                                         **params),
                         inputs_fn=t5_noise.noise_span_to_unique_sentinel,
                         targets_fn=t5_noise.nonnoise_span_to_unique_sentinel,
                         sentinel_start=SENTINEL_START, vocab_size=VOCAB)
  for i in range(200):
    inputs = out["inputs"][i, :out["input_lengths"][i]].tolist()
    targets = out["targets"][i, :out["target_lengths"][i]].tolist()
    assert not out["inputs"][i, out["input_lengths"][i]:].any()
    # Sentinels unique and descending from <extra_id_0> on both sides; the non-noise spans
    # alternate with the noise spans, so their counts differ by at most one.
    for side in (inputs, targets):
      sentinels = [t for t in side if is_sentinel(t)]
      assert sentinels == list(range(SENTINEL_START, SENTINEL_START - len(sentinels), -1))
    assert abs(sum(map(is_sentinel, inputs)) - sum(map(is_sentinel, targets))) <= 1
    assert reconstruct(inputs, targets) == tokens[i, :lengths[i]].tolist()
    if mask_name == "random_spans" and not params.get("random_roll"):
      assert targets[-1] < 500 or lengths[i] == 1    # ends with a noise span: no final sentinel


def test_span_corruption_default_lengths_fill_512_and_114():
  # Spec §3.4 check: 568 raw tokens -> inputs exactly 512, targets 114 with EOS; 28 sentinels.
  eos, sentinel_start = 3, 32099
  raw, targets_length = t5_noise.random_spans_helper(512, 0.15, 3.0)
  rng = np.random.default_rng(0)
  tokens = rng.integers(5, 32000, (8, raw))
  out = t5_noise.denoise(tokens, np.full(8, raw), rng, noise_density=0.15,
                         noise_mask_fn=t5_noise.random_spans_noise_mask,
                         inputs_fn=t5_noise.noise_span_to_unique_sentinel,
                         targets_fn=t5_noise.nonnoise_span_to_unique_sentinel,
                         sentinel_start=sentinel_start, vocab_size=32100)
  inputs, input_lengths = t5_noise.append_eos_after_trim(out["inputs"], out["input_lengths"],
                                                         512, eos)
  targets, target_lengths = t5_noise.append_eos_after_trim(out["targets"], out["target_lengths"],
                                                           targets_length, eos)
  assert (input_lengths == 512).all() and (target_lengths == 114).all()
  np.testing.assert_array_equal(inputs[:, -2:], np.tile([32072, eos], (8, 1)))
  assert (targets[:, 0] == sentinel_start).all() and (targets[:, -1] == eos).all()


def test_append_eos_after_trim():
  tokens = np.array([[5, 6, 7, 8, 9], [5, 6, 0, 0, 0], [0, 0, 0, 0, 0]])
  out, lengths = t5_noise.append_eos_after_trim(tokens, np.array([5, 2, 0]), 4, eos_id=1)
  np.testing.assert_array_equal(out, [[5, 6, 7, 1], [5, 6, 1, 0], [1, 0, 0, 0]])
  np.testing.assert_array_equal(lengths, [4, 3, 1])


def test_permute_noise_tokens_matches_reference_and_is_uniform():
  rng = np.random.default_rng(0)
  n, width = 300, 12
  lengths = rng.integers(0, width + 1, n)
  tokens = np.where(np.arange(width)[None, :] < lengths[:, None],
                    np.arange(width)[None, :] + 10, 0)
  noise = t5_noise.iid_noise_mask(lengths, width, rng, noise_density=0.5)
  out, out_lengths = t5_noise.permute_noise_tokens(tokens, lengths, noise,
                                                   np.random.default_rng(5),
                                                   sentinel_start=SENTINEL_START,
                                                   vocab_size=VOCAB)
  uniforms = np.random.default_rng(5).random((n, width))
  for i in range(n):
    # preprocessors.py: permuted = stateless_shuffle(noise tokens); noise position j gets
    # permuted[j].
    expected = tokens[i, :lengths[i]].copy()
    noise_tokens = expected[noise[i, :lengths[i]]]
    expected[noise[i, :lengths[i]]] = noise_tokens[np.argsort(uniforms[i, :len(noise_tokens)])]
    np.testing.assert_array_equal(out[i, :out_lengths[i]], expected)
  # Deshuffling (all_permute.gin: density 1.0): every order of 3 tokens equally likely.
  n = 6000
  everything = t5_noise.iid_noise_mask(np.full(n, 3), 3, rng, noise_density=1.0)
  shuffled, _ = t5_noise.permute_noise_tokens(np.tile([1, 2, 3], (n, 1)), np.full(n, 3),
                                              everything, rng, sentinel_start=SENTINEL_START,
                                              vocab_size=VOCAB)
  _, counts = np.unique(shuffled, axis=0, return_counts=True)
  assert len(counts) == 6 and all(within(c, n / 6, n) for c in counts)


def test_random_token_encodings():
  rng = np.random.default_rng(0)
  n, width = 400, 50
  tokens = np.full((n, width), 7)
  lengths = np.full(n, width)
  noise = t5_noise.iid_noise_mask(lengths, width, rng, noise_density=0.3)
  out, _ = t5_noise.noise_token_to_random_token(tokens, lengths, noise, rng,
                                                sentinel_start=SENTINEL_START, vocab_size=VOCAB)
  assert (out[~noise] == 7).all()
  assert out[noise].min() == 3 and out[noise].max() == VOCAB - 1   # [3, vocab), sentinels too
  # BERT-style: 10% random, 90% the shared sentinel, never unchanged.
  out, _ = t5_noise.noise_token_to_random_token_or_sentinel(
      tokens, lengths, noise, rng, sentinel_start=SENTINEL_START, vocab_size=VOCAB)
  assert (out[~noise] == 7).all()
  not_sentinel = np.count_nonzero(out[noise] != SENTINEL_START)
  assert within(not_sentinel, noise.sum() * 0.1 * (1 - 1 / (VOCAB - 3)), noise.sum())


@pytest.mark.parametrize("user_symbols, reserved", [((), 5), (("<eod>",), 6)])
def test_random_tokens_never_draw_a_special_id(user_symbols, reserved):
  """The reference reserves T5's pad, EOS and unk (ids 0-2). Our vocabulary puts <pad> <unk>
  [CLS] [SEP]=EOS [MASK] (and XLNet's <eod>) first: the objective reserves all of them, so a
  BERT-style random token is never EOS or [MASK]."""
  from bertfam_jax.data import tokenizers  # pylint: disable=g-import-not-at-top
  from bertfam_jax.objectives import t5  # pylint: disable=g-import-not-at-top
  sentences = [" ".join(f"w{(i * 7 + j) % 97}x" for j in range(12)) for i in range(300)]
  tokenizer = tokenizers.Tokenizer(
      tokenizers.train_sentencepiece(sentences, 160, "bpe", user_symbols), extra_ids=10)
  assert t5.reserved_ids(tokenizer) == reserved
  special = set(tokenizer.special_ids[:reserved - 1].tolist()) | {tokenizer.unk_id}
  assert {tokenizer.eos_id, tokenizer.mask_id, tokenizer.pad_id} <= special
  rng = np.random.default_rng(0)
  tokens = np.full((200, 50), 7)
  lengths = np.full(200, 50)
  noise = np.ones_like(tokens, bool)
  out, _ = t5_noise.noise_token_to_random_token_or_sentinel(
      tokens, lengths, noise, rng, sentinel_start=tokenizer.sentinel_start,
      vocab_size=tokenizer.vocab_size, random_prob=1.0, num_reserved_tokens=reserved)
  assert out.min() == reserved and not special & set(out.ravel().tolist())


# ---------------------------------------------------------------------------------------------
# BART (spec objectives.md §8).
# ---------------------------------------------------------------------------------------------


def test_poisson_span_distribution():
  probs = t5_noise.poisson_span_distribution(3.0)
  assert len(probs) == 18                                 # k = 0..17; pmf(17) < 1e-7
  assert probs[0] == pytest.approx(0.0498, abs=1e-4)
  unnormalised = [math.exp(-3) * 3**k / math.factorial(k) for k in range(18)]
  np.testing.assert_allclose(probs, np.array(unnormalised) / sum(unnormalised), rtol=1e-12)


def test_span_length_draw_matches_fairseq_loop():
  probs = t5_noise.poisson_span_distribution(3.0)
  budget = np.random.default_rng(0).integers(0, 12, 300)
  lengths, used = t5_noise._draw_span_lengths(budget, probs, np.random.default_rng(1))
  # Replay the draws: each row's i.i.d. sequence is its row of the drawn blocks.
  rng, block = np.random.default_rng(1), max(int(budget.max()), 1)
  draws = np.zeros((300, 0), np.int64)
  while (draws.sum(axis=1) < budget).any():
    draws = np.concatenate([draws, np.minimum(np.searchsorted(
        np.cumsum(probs), rng.random((300, block)), side="right"), len(probs) - 1)], axis=1)
  for i in range(300):
    if budget[i] == 0:               # fairseq returns the source untouched
      assert used[i] == 0
      continue
    cum = np.cumsum(draws[i])
    last = int(np.argmax(cum >= budget[i]))
    expected = draws[i, :last + 1].copy()
    expected[last] = budget[i] - (cum[last - 1] if last else 0)
    np.testing.assert_array_equal(lengths[i, :used[i]], expected)
    assert used[i] == last + 1 and lengths[i].sum() == budget[i]


def _infill(tokens, lengths, word_start, seed, **overrides):
  params = dict(mask_ratio=0.3, poisson_lambda=3.0, mask_id=4, random_ratio=0.0,
                vocab_size=VOCAB)
  params.update(overrides)
  return t5_noise.bart_text_infilling(tokens, lengths, word_start, np.random.default_rng(seed),
                                      **params)


def test_text_infilling_masks_whole_words_within_budget():
  # Bare segments (fairseq's <s> and </s> are outside them), random word boundaries, unique ids.
  rng = np.random.default_rng(0)
  n, width = 300, 40
  lengths = rng.integers(1, width + 1, n)
  tokens = np.where(np.arange(width)[None, :] < lengths[:, None], np.arange(width) + 10, 0)
  word_start = rng.random((n, width)) < 0.5
  word_start[:, 0] = True
  out, out_lengths = _infill(tokens, lengths, word_start, seed=1)
  for i in range(n):
    row, length = out[i, :out_lengths[i]], lengths[i]
    kept = row[row != 4]
    assert (np.diff(kept) > 0).all()                                    # order preserved
    word = np.cumsum(word_start[i, :length]) - 1
    present = np.isin(tokens[i, :length], kept)
    for w in range(word[-1] + 1):         # each word entirely kept or entirely removed
      assert present[word == w].all() or not present[word == w].any()
    removed_words = len(set(word[~present].tolist()))
    num_word_starts = word_start[i, :length].sum()
    assert removed_words <= math.ceil(np.float32(num_word_starts) * np.float32(0.3))


def test_text_infilling_budget_is_float32_like_fairseq():
  # 50 word starts: fairseq's float32 tensor product 50 * 0.3 rounds to 15.000001, so the budget
  # is 16 words (a float64 product would give 15; checked against torch for 1..1999 words).
  n = 1000
  tokens = np.tile(np.arange(10, 60), (n, 1))
  out, out_lengths = _infill(tokens, np.full(n, 50), np.ones((n, 50), bool), seed=2)
  removed = np.array([50 - np.isin(tokens[0], out[i, :out_lengths[i]]).sum() for i in range(n)])
  assert removed.max() == 16


def test_text_infilling_single_word_budget_and_insertions():
  # A bare segment of 3 words -> budget ceil(0.9) = 1: zero-length draws are insertions
  # (geometric count, P(0 insertions) = 1 - P(0)), then one 1-word span becomes one <mask>. The
  # segment's first and last words are maskable, and insertions may open or close it: fairseq's
  # frame <s> ... </s> lies outside the segment.
  n = 6000
  tokens = np.tile([10, 11, 12], (n, 1))
  out, out_lengths = _infill(tokens, np.full(n, 3), np.ones((n, 3), bool), seed=3)
  inserts = out_lengths - 3
  assert ((out == 4).sum(axis=1) == 1 + inserts).all()
  p_zero = t5_noise.poisson_span_distribution(3.0)[0]
  assert within(np.count_nonzero(inserts == 0), n * (1 - p_zero), n)
  masked_word = np.array([sorted({10, 11, 12} - set(row.tolist()))[0] for row in out])
  for w in (10, 11, 12):                                   # the span start is uniform
    assert within(np.count_nonzero(masked_word == w), n / 3, n)
  last = out[np.arange(n), out_lengths - 1]
  assert np.any((out[:, 0] == 4) & (masked_word != 10))    # an insertion opens the segment
  assert np.any((last == 4) & (masked_word != 12))          # one closes it
  # random_ratio 1 (same draws): every mask and insertion becomes a random id in [1, vocab).
  rand, rand_lengths = _infill(tokens, np.full(n, 3), np.ones((n, 3), bool), seed=3,
                               random_ratio=1.0)
  np.testing.assert_array_equal(rand_lengths, out_lengths)
  np.testing.assert_array_equal(rand[out != 4], out[out != 4])
  assert (rand[out == 4] >= 1).all() and (rand[out == 4] < VOCAB).all()
  assert np.mean(rand[out == 4] != 4) > 0.99


def test_text_infilling_masks_one_token_per_span_and_draws_random_spans_at_the_ratio():
  """replace_length 1: a span of several tokens becomes one <mask> (the rest deleted), not one
  per token; each span is random with probability random_ratio (a coin per span)."""
  n = 4000
  text = np.arange(10, 22)
  tokens = np.tile(text, (n, 1))                       # 4 words of 3 tokens: budget 2 words
  word_start = np.tile(np.arange(12) % 3 == 0, (n, 1))
  # λ = 6: a zero length (an insertion) is rare, the first length almost always covers 2 words.
  out, out_lengths = _infill(tokens, np.full(n, 12), word_start, seed=4, poisson_lambda=6.0)
  kept = np.array([np.isin(text, row[:k]).sum() for row, k in zip(out, out_lengths)])
  one_span = ((out == 4).sum(axis=1) == 1) & (out_lengths == kept + 1)
  # 2 words (the last one alone where a span starts there): 6 or 3 tokens → one <mask>.
  assert one_span.mean() > 0.9 and set(kept[one_span].tolist()) == {6, 9}
  rand, _ = _infill(tokens, np.full(n, 12), word_start, seed=4, poisson_lambda=6.0,
                    random_ratio=0.1)
  span_tokens = rand[one_span][out[one_span] == 4]
  assert within(np.count_nonzero(span_tokens != 4), 0.1 * span_tokens.size, span_tokens.size)


def test_permute_sentences():
  n = 6000
  # Three sentences of 1, 2 and 3 tokens.
  tokens = np.tile([10, 20, 21, 30, 31, 32, 0], (n, 1))
  starts = np.zeros((n, 7), bool)
  starts[:, [0, 1, 3]] = True
  out = t5_noise.bart_permute_sentences(tokens, np.full(n, 6), starts, np.random.default_rng(0))
  assert (out[:, 6] == 0).all()
  orders, counts = np.unique(out, axis=0, return_counts=True)
  sentences = [[10], [20, 21], [30, 31, 32]]
  expected_rows = {tuple(sum((sentences[j] for j in p), []) + [0])
                   for p in [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)]}
  assert {tuple(r) for r in orders.tolist()} == expected_rows       # whole sentences move
  assert all(within(c, n / 6, n) for c in counts)                    # uniformly
  # A segment cut mid-sentence: its leading fragment (not marked as a start) moves as a sentence,
  # as fairseq's first sentence runs from after <s> to the first full stop.
  starts[:, 0] = False
  out = t5_noise.bart_permute_sentences(tokens, np.full(n, 6), starts, np.random.default_rng(0))
  slot = np.argmax(out == 10, axis=1)                               # 0, 2 or 5
  for place in (0, 2, 3, 5):
    expected = n / 3 if place in (0, 5) else n / 6                  # 2 of 6 orders each at 0 / 5
    assert within(np.count_nonzero(slot == place), expected, n), place
  # ratio 0.5 of 4 sentences: ceil(4 * 2 * 0.5 / 2) = 2 are permuted, a uniform pair swapped.
  tokens = np.tile([10, 20, 30, 40], (n, 1))
  out = t5_noise.bart_permute_sentences(tokens, np.full(n, 4), np.ones((n, 4), bool),
                                        np.random.default_rng(1), ratio=0.5)
  moved = (out != tokens).sum(axis=1)
  assert set(moved.tolist()) == {0, 2}
  assert within(np.count_nonzero(moved == 0), n / 2, n)
  pairs = [tuple(np.flatnonzero(row)) for row in (out != tokens)[moved == 2]]
  for pair in ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)):     # a random subset, not a prefix
    assert within(pairs.count(pair), len(pairs) / 6, len(pairs)), pair


def test_gathered_token_comes_from_the_same_row():
  rng = np.random.default_rng(0)
  n, width = 200, 10
  lengths = rng.integers(1, width + 1, n)
  tokens = np.where(np.arange(width)[None, :] < lengths[:, None],
                    np.arange(n)[:, None] * 100 + np.arange(width)[None, :] + 1, 0)
  noise = t5_noise.iid_noise_mask(lengths, width, rng, noise_density=0.5)
  out, out_lengths = t5_noise.noise_token_to_gathered_token(
      tokens, lengths, noise, rng, sentinel_start=SENTINEL_START, vocab_size=VOCAB)
  np.testing.assert_array_equal(out_lengths, lengths)
  np.testing.assert_array_equal(out[~noise], tokens[~noise])
  rows = np.nonzero(noise)[0]
  assert ((out[noise] - 1) // 100 == rows).all()                     # same row, a real token
  assert ((out[noise] - 1) % 100 < lengths[rows]).all()


def test_a_mask_that_starts_with_noise_shifts_the_target_numbering_as_the_reference():
  """docs/t5.md: with the first token noise, target sentinel k precedes the tokens that input
  sentinel k + 1 replaced (the reference's sentinel numbering, kept as it is)."""
  tokens, lengths = np.arange(10, 16)[None], np.array([6])
  noise = np.array([[True, False, False, True, True, False]])
  encode = dict(sentinel_start=999, vocab_size=1000)
  inputs, _ = t5_noise.noise_span_to_unique_sentinel(tokens, lengths, noise, None, **encode)
  targets, _ = t5_noise.nonnoise_span_to_unique_sentinel(tokens, lengths, noise, None, **encode)
  assert inputs[0, :5].tolist() == [999, 11, 12, 998, 15]
  assert targets[0, :5].tolist() == [10, 999, 13, 14, 998]


def test_mass_fragment_is_one_run_of_half_placed_as_mass_places_it():
  """MASS-unsupNMT `restricted_mask_sent` / `shuffle_segments`: one contiguous fragment of
  round(0.5 · ℓ) tokens; 0.2 at the start, 0.2 at the end, and 0.6 shuffled among the ℓ − m other
  tokens, ℓ − m + 1 places with both ends: P(start 0) = P(end at ℓ) = 0.2 + 0.6 / (ℓ − m + 1)."""
  n, length = 20_000, 40
  lengths = np.full(n, length)
  lengths[:10] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
  mask = t5_noise.mass_fragment_noise_mask(lengths, 48, np.random.default_rng(0),
                                           noise_density=0.5)
  assert not mask[:, length:].any()
  for row, ell in enumerate(lengths[:10]):
    run = np.flatnonzero(mask[row])
    assert len(run) == max(1, round(0.5 * ell)) and np.all(np.diff(run) == 1), (ell, run)
  rows = mask[10:]
  assert (rows.sum(axis=1) == 20).all()
  starts = rows.argmax(axis=1)
  assert np.all(np.diff(np.flatnonzero(rows[0])) == 1)
  np.testing.assert_allclose(np.mean(starts == 0), 0.2 + 0.6 / 21, atol=0.01)
  np.testing.assert_allclose(np.mean(starts == 20), 0.2 + 0.6 / 21, atol=0.01)
  inner = np.bincount(starts[(starts > 0) & (starts < 20)], minlength=20)[1:]
  np.testing.assert_allclose(inner / len(starts), 0.6 / 21, atol=0.006)   # each inner place


def test_mass_inputs_are_80_masked_10_kept_10_random():
  n, length, vocab, sentinel = 400, 50, 1000, 999
  tokens = np.random.default_rng(1).integers(10, 900, (n, length)).astype(np.int32)
  lengths = np.full(n, length)
  noise = t5_noise.mass_fragment_noise_mask(lengths, length, np.random.default_rng(2),
                                            noise_density=0.5)
  inputs, input_lengths = t5_noise.noise_token_to_sentinel_keep_or_random(
      tokens, lengths, noise, np.random.default_rng(3), sentinel_start=sentinel,
      vocab_size=vocab, random_prob=0.1, keep_prob=0.1, num_reserved_tokens=5)
  assert (input_lengths == length).all()
  assert np.array_equal(inputs[~noise], tokens[~noise])
  masked, kept = inputs[noise] == sentinel, inputs[noise] == tokens[noise]
  other = ~masked & ~kept
  shares = np.array([masked.mean(), kept.mean(), other.mean()])
  np.testing.assert_allclose(shares, [0.8, 0.1, 0.1], atol=0.01)
  assert inputs[noise][other].min() >= 5


def test_bart_noising_of_packed_segments_reaches_their_edges_and_keeps_the_target():
  """objectives/t5.noise_segments with BART's settings, on segments as packing cuts them (bare
  text, most starting mid-sentence): the inputs can open and close with <mask> and with any
  sentence of the segment, the leading fragment included; the target is the segment as it was."""
  from bertfam_jax.objectives import t5  # pylint: disable=g-import-not-at-top
  n = 3000
  tokens = np.tile(np.arange(10, 22), (n, 1))
  lengths = np.full(n, 12)
  sentence_start = np.zeros((n, 12), bool)
  sentence_start[:, [4, 8]] = True                      # a fragment, then two sentences of 4
  config = config_lib.t5_objective(noise_mask="bart_infilling", noise_density=0.3,
                                   poisson_lambda=3.0, permute_sentences=1.0,
                                   targets_encoding="original")
  (inputs, input_lengths), (targets, target_lengths) = t5.noise_segments(
      tokens, lengths, sentence_start, np.random.default_rng(0), config=config,
      sentinel_start=VOCAB - 1, vocab_size=VOCAB, mask_id=4,
      word_start_table=np.ones(VOCAB, bool))
  np.testing.assert_array_equal(targets, tokens)
  np.testing.assert_array_equal(target_lengths, lengths)
  first = inputs[:, 0]
  last = inputs[np.arange(n), input_lengths - 1]
  assert 0.1 < np.mean(first == 4) < 0.5 and 0.1 < np.mean(last == 4) < 0.5
  for opening in (10, 14, 18):                          # each sentence can open the inputs
    assert np.mean(first == opening) > 0.1, opening


@pytest.mark.parametrize("objective", [dict(noise_mask="bart_infilling"),
                                       dict(permute_sentences=1.0)])
def test_bart_noising_needs_the_original_target(objective):
  """BART's target is the segment in order: another targets encoding would be silently unread."""
  import os  # pylint: disable=g-import-not-at-top
  from bertfam_jax.objectives import t5  # pylint: disable=g-import-not-at-top
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  config = config_lib.load_config(os.path.join(root, "configs", "t5.py"), "runlocal")
  config.objective.update(objective)
  with pytest.raises(config_lib.ConfigError, match="targets_encoding=original"):
    t5.validate(config)
  config.objective.targets_encoding = "original"
  t5.validate(config)
