"""The BERT-family selection schemes and span corruption of objectives/noise.py against spec
§1.5, §3 (ALBERT n-grams), §4 (SpanBERT spans, per-span 80/10/10, SBO) and §8 (ERNIE units,
StructBERT's trigram shuffle).

Statistical checks allow 5 standard deviations of the count under the reference rule (chi-square
checks a threshold with p ≈ 1e-6), so a false failure is rare while a wrong distribution fails.
"""

import numpy as np
import pytest

from bertfam_jax.objectives import noise

SDS = 5.0
PAD, CLS, SEP, MASK = 0, 1, 2, 3
BODY = (10, 100)  # Body ids; 77% of them are word-initial, so a word has ~1.3 pieces.
V = 132  # Ids in [100, V) never occur in a body: a "random" replacement is then unambiguous.
WORD_START_TABLE = np.zeros(V, bool)
WORD_START_TABLE[BODY[0]:BODY[1]] = np.random.default_rng(0).random(BODY[1] - BODY[0]) < 0.77
WORD_START_TABLE[[CLS, SEP]] = True
# SpanBERT's truncated geometric length pmf, p = 0.2 on 1..10 words (spec §4 step 2).
SPAN_PMF = 0.2 * 0.8 ** np.arange(10) / (1 - 0.8 ** 10)


def _batch(n, seq_len, seed, *, min_len=None):
  """[CLS] A [SEP] B [SEP] pad... rows; returns (input_ids, input_mask, maskable, word_start)."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(min_len or seq_len // 2, seq_len + 1, n)
  rows = np.arange(n)
  input_mask = np.arange(seq_len) < lengths[:, None]
  ids = np.where(input_mask, rng.integers(*BODY, (n, seq_len)), PAD)
  ids[:, 0] = CLS
  ids[rows, lengths // 2] = SEP
  ids[rows, lengths - 1] = SEP
  maskable = input_mask & (ids != CLS) & (ids != SEP)
  return (ids.astype(np.int32), input_mask.astype(np.int32), maskable,
          noise.word_starts(ids, maskable, WORD_START_TABLE))


def _word_ids(maskable, word_start):
  """[n, L] word number of each maskable token (-1 elsewhere), by a plain loop over tokens."""
  ids = np.full(maskable.shape, -1)
  for i in range(maskable.shape[0]):
    word = -1
    for j in range(maskable.shape[1]):
      if maskable[i, j]:
        word += bool(word_start[i, j])
        ids[i, j] = word
  return ids


def _word_coverage(chosen, words):
  """([n, W] chosen tokens per word, [n, W] tokens per word)."""
  n, width = chosen.shape[0], words.max() + 1
  rows, cols = np.nonzero(words >= 0)
  flat = rows * width + words[rows, cols]
  size = np.bincount(flat, minlength=n * width).reshape(n, width)
  hit = np.bincount(flat, weights=chosen[rows, cols], minlength=n * width).reshape(n, width)
  return hit.astype(int), size


def _assert_close(observed, mean, var, what):
  tol = SDS * np.sqrt(var)
  assert abs(observed - mean) <= tol, f"{what}: {observed}, expected {mean:.2f} ± {tol:.2f}"


def _assert_chi_square(counts, probs, what):
  """Pearson's χ² of `counts` against `probs`, below its 1 - 1e-6 quantile (Wilson-Hilferty)."""
  expected = counts.sum() * np.asarray(probs)
  statistic = ((counts - expected) ** 2 / expected).sum()
  dof = counts.size - 1
  limit = dof * (1 - 2 / (9 * dof) + 4.75 * np.sqrt(2 / (9 * dof))) ** 3
  assert statistic < limit, f"{what}: {counts} vs {expected.round(1)}: χ² {statistic:.1f}"


def _units(maskable, word_start, seed):
  """unit_ids [n, L]: runs of 1-3 whole words, about a third of the words, ids 1, 2, ..."""
  rng = np.random.default_rng(seed)
  words = _word_ids(maskable, word_start)
  unit_ids = np.zeros(maskable.shape, np.int32)
  for i in range(maskable.shape[0]):
    w, next_id = 0, 1
    while w <= words[i].max():
      span = rng.integers(1, 4)
      if rng.random() < 0.2:
        in_unit = (words[i] >= w) & (words[i] < w + span) & maskable[i]
        # A unit must not straddle [SEP]: keep only its first maskable run.
        cols = np.nonzero(in_unit)[0]
        if cols.size:
          cols = cols[:np.argmax(np.append(np.diff(cols) > 1, True)) + 1]
          unit_ids[i, cols] = next_id
          next_id += 1
      w += span
  return unit_ids


def _select(name, maskable, word_start, budget, seed, unit_ids=None):
  params = dict(unit_ids=unit_ids) if name == "units" else {}
  return noise.SELECTORS[name](maskable, word_start, budget, np.random.default_rng(seed), **params)


BATCH = _batch(256, 128, seed=1)
UNIT_IDS = _units(BATCH[2], BATCH[3], seed=2)
WORDS = _word_ids(BATCH[2], BATCH[3])


def test_word_starts_marks_word_initial_pieces_and_run_starts():
  table = np.zeros(V, bool)
  table[[20, CLS, SEP]] = True
  ids = np.array([[CLS, 20, 30, 31, 20, SEP, 30, 20, SEP, PAD]])
  maskable = np.array([[0, 1, 1, 1, 1, 0, 1, 1, 0, 0]], bool)
  # 30 after [SEP] is not word-initial but follows a non-maskable token, so it starts a word.
  np.testing.assert_array_equal(noise.word_starts(ids, maskable, table),
                                [[0, 1, 0, 0, 1, 0, 1, 1, 0, 0]])


@pytest.mark.parametrize("name", sorted(noise.SELECTORS))
def test_never_beyond_the_budget_nor_outside_maskable(name):
  _, input_mask, maskable, word_start = BATCH
  for budget in (noise.bert_num_to_predict(input_mask, 0.15, 20), np.full(256, 7)):
    chosen = _select(name, maskable, word_start, budget, seed=3, unit_ids=UNIT_IDS)
    assert not (chosen & ~maskable).any()
    assert (chosen.sum(1) <= budget).all()
    assert chosen.sum() > 0.9 * budget.sum()  # Nearly filled, so the two checks above have teeth.


@pytest.mark.parametrize("name", ["token", "span"])
def test_budget_is_exact_for_token_and_span_selection(name):
  _, _, maskable, word_start = BATCH
  budget = noise.span_num_to_predict(maskable, 0.15)
  budget[:3] = 10_000  # More than the row holds: everything maskable is chosen.
  chosen = _select(name, maskable, word_start, budget, seed=4)
  np.testing.assert_array_equal(chosen.sum(1), np.minimum(budget, maskable.sum(1)))


def test_span_num_to_predict_is_ceil_of_the_block():
  maskable = np.arange(128) < np.array([0, 1, 20, 100, 101, 126])[:, None]
  np.testing.assert_array_equal(noise.span_num_to_predict(maskable, 0.15), [0, 1, 3, 15, 16, 19])


@pytest.mark.parametrize("name", ["whole_word", "ngram", "units"])
def test_words_are_chosen_whole(name):
  _, input_mask, maskable, word_start = BATCH
  chosen = _select(name, maskable, word_start, noise.bert_num_to_predict(input_mask, 0.15, 20),
                   seed=5, unit_ids=UNIT_IDS)
  hit, size = _word_coverage(chosen, WORDS)
  assert ((hit == 0) | (hit == size)).all()
  assert (size[hit > 0] > 1).any()  # Multi-piece words were chosen, so the check has teeth.


def test_whole_words_only_skip_words_that_overflow_the_budget():
  # BERT walks every word and skips only those that would overflow: when a row ends short of
  # its budget, every unchosen word is longer than what is left.
  _, _, maskable, word_start = BATCH
  # Budgets near the row's size: the last words left often do not fit.
  budget = maskable.sum(1) - np.random.default_rng(6).integers(1, 8, 256)
  chosen = _select("whole_word", maskable, word_start, budget, seed=6)
  hit, size = _word_coverage(chosen, WORDS)
  left = budget - chosen.sum(1)
  unchosen_fitting = (hit == 0) & (size > 0) & (size <= left[:, None])
  assert not unchosen_fitting.any()
  assert (left > 0).any()  # Some rows did end short.


def test_whole_word_selection_is_uniform_over_words():
  # One word of 1 piece per position; budget 5 of 20 single-piece words: each word has p = 1/4.
  n, width = 8000, 22
  maskable = np.ones((n, width), bool)
  maskable[:, [0, -1]] = False
  chosen = noise.select_whole_words(maskable, maskable, np.full(n, 5), np.random.default_rng(7))
  for position in range(1, width - 1):
    _assert_close(chosen[:, position].sum(), n / 4, n * 3 / 16, f"position {position}")


def test_ngram_lengths_follow_one_over_n():
  # The first n-gram of a row is always accepted (nothing is covered yet, and a budget of 40
  # fits any 3 words here), so its length is the drawn n unless it starts in the last 2 words.
  _, _, maskable, word_start = _batch(6000, 128, seed=8)
  words = _word_ids(maskable, word_start)
  budget = np.full(6000, 40)
  for favor_shorter, probs in ((True, [6 / 11, 3 / 11, 2 / 11]), (False, [2 / 11, 3 / 11, 6 / 11])):
    draws = noise.draw_ngrams(maskable, word_start, budget, np.random.default_rng(9),
                              favor_shorter_ngram=favor_shorter)
    _, first = np.unique(draws.row, return_index=True)
    start_word = words[draws.row, draws.start]
    room = words.max(1)[draws.row] - start_word + 1
    first = first[room[first] >= 3]
    np.testing.assert_array_equal(draws.words[first], draws.drawn_words[first])
    _assert_chi_square(np.bincount(draws.words[first], minlength=4)[1:], probs,
                       f"first n-gram lengths, favor_shorter_ngram={favor_shorter}")


def test_ngrams_are_contiguous_words_never_overlap_and_shrink_to_fit():
  _, input_mask, maskable, word_start = BATCH
  budget = noise.bert_num_to_predict(input_mask, 0.15, 20)
  draws = noise.draw_ngrams(maskable, word_start, budget, np.random.default_rng(10))
  start_word, end_word = WORDS[draws.row, draws.start], WORDS[draws.row, draws.end]
  np.testing.assert_array_equal(end_word - start_word + 1, draws.words)
  assert (draws.words <= draws.drawn_words).all() and (draws.words < draws.drawn_words).any()
  assert word_start[draws.row, draws.start].all()
  covered = np.zeros(maskable.shape, int)
  for row, start, end in zip(draws.row, draws.start, draws.end):
    covered[row, start:end + 1] += maskable[row, start:end + 1]
  assert covered.max() == 1  # No token in two n-grams.
  np.testing.assert_array_equal(covered > 0, draws.chosen)


def test_span_lengths_follow_the_truncated_geometric():
  # The drawn length of an accepted span is independent of its anchor, so it follows the pmf.
  _, _, maskable, word_start = _batch(1500, 256, seed=11)
  draws = noise.draw_spans(maskable, word_start, noise.span_num_to_predict(maskable, 0.15),
                           np.random.default_rng(12))
  np.testing.assert_allclose(SPAN_PMF[:4], [.224, .179, .143, .115], atol=6e-4)
  _assert_chi_square(np.bincount(draws.drawn_words, minlength=11)[1:], SPAN_PMF, "span lengths")
  mean = (SPAN_PMF * np.arange(1, 11)).sum()
  assert mean == pytest.approx(3.8, abs=0.01)
  _assert_close(draws.drawn_words.sum(), len(draws.row) * mean,
                len(draws.row) * (SPAN_PMF * (np.arange(1, 11) - mean) ** 2).sum(), "length sum")


def test_spans_are_whole_words_except_the_last_of_a_row():
  _, _, maskable, word_start = BATCH
  budget = noise.span_num_to_predict(maskable, 0.15)
  draws = noise.draw_spans(maskable, word_start, budget, np.random.default_rng(13))
  last_of_row = np.append(draws.row[1:] != draws.row[:-1], True)
  start_word, end_word = WORDS[draws.row, draws.start], WORDS[draws.row, draws.end]
  words_left = WORDS.max(1)[draws.row] - start_word + 1
  assert word_start[draws.row, draws.start].all()
  np.testing.assert_array_equal(end_word - start_word + 1, draws.words)
  # Not the last span of its row: exactly min(drawn, words left) whole words.
  whole = ~last_of_row
  np.testing.assert_array_equal(draws.words[whole],
                                np.minimum(draws.drawn_words, words_left)[whole])
  ends_word = np.append(WORDS[:, 1:] != WORDS[:, :-1], np.ones((256, 1), bool), axis=1)
  assert ends_word[draws.row[whole], draws.end[whole]].all()
  assert not ends_word[draws.row[last_of_row], draws.end[last_of_row]].all()  # Some end mid-word.
  # The chosen map is the union of the spans, and at most one word per row is cut.
  union = np.zeros(maskable.shape, bool)
  for row, start, end in zip(draws.row, draws.start, draws.end):
    union[row, start:end + 1] = maskable[row, start:end + 1]
  np.testing.assert_array_equal(union, draws.chosen)
  hit, size = _word_coverage(draws.chosen, WORDS)
  assert (((hit > 0) & (hit < size)).sum(1) <= 1).all()


def test_units_are_masked_whole_or_not_at_all():
  _, input_mask, maskable, word_start = BATCH
  budget = noise.bert_num_to_predict(input_mask, 0.15, 20)
  chosen = _select("units", maskable, word_start, budget, seed=14, unit_ids=UNIT_IDS)
  rows, cols = np.nonzero(UNIT_IDS)
  key = rows * 1000 + UNIT_IDS[rows, cols]
  _, unit = np.unique(key, return_inverse=True)
  size = np.bincount(unit)
  hit = np.bincount(unit, weights=chosen[rows, cols]).astype(int)
  assert ((hit == 0) | (hit == size)).all()
  assert (size[hit > 0] > 1).any()


def test_units_stop_only_when_nothing_fits():
  _, _, maskable, word_start = BATCH
  budget = maskable.sum(1) - np.random.default_rng(15).integers(1, 8, 256)
  chosen = _select("units", maskable, word_start, budget, seed=15, unit_ids=UNIT_IDS)
  left = budget - chosen.sum(1)
  assert (left > 0).sum() >= 5  # Some rows end short, so the loop below has work.
  # Candidates: units, and words outside units; none unchosen may fit what is left.
  candidate = np.where(UNIT_IDS > 0, 1000 + UNIT_IDS, WORDS)
  for i in np.nonzero(left > 0)[0]:
    ids, size = np.unique(candidate[i][maskable[i]], return_counts=True)
    untouched = [not chosen[i][maskable[i] & (candidate[i] == c)].any() for c in ids]
    assert not (np.array(untouched) & (size <= left[i])).any(), f"row {i}"


def test_units_mix_per_draw_not_per_sequence():
  # Single-token words, every other word a unit of one token: each of the 19 draws of a row
  # picks a unit with p = unit_prob, so the unit count of a row is Binomial(19, unit_prob). A
  # per-sequence coin would give variance 19² / 4 instead of 19 / 4.
  n, width = 3000, 128
  maskable = np.ones((n, width), bool)
  maskable[:, [0, -1]] = False
  unit_ids = np.where(maskable & (np.arange(width) % 2 == 0), np.arange(width), 0)
  for unit_prob in (0.5, 0.2):
    chosen = noise.select_units(maskable, maskable, np.full(n, 19), np.random.default_rng(16),
                                unit_ids=unit_ids, unit_prob=unit_prob)
    in_units = (chosen & (unit_ids > 0)).sum(1)
    np.testing.assert_array_equal(chosen.sum(1), 19)
    p = unit_prob
    _assert_close(in_units.sum(), n * 19 * p, n * 19 * p * (1 - p), f"unit tokens, p={p}")
    var = 19 * p * (1 - p)  # The sample variance has standard deviation ≈ var * sqrt(2 / n).
    assert abs(in_units.var() - var) < SDS * var * np.sqrt(2 / n), (in_units.var(), var)


def test_units_must_be_whole_maskable_words():
  _, _, maskable, word_start = _batch(4, 32, seed=17)
  inside_word = np.nonzero(maskable[0] & ~word_start[0])[0][0]
  unit_ids = np.zeros(maskable.shape, np.int32)
  unit_ids[0, inside_word] = 1
  with pytest.raises(ValueError, match="whole words"):
    noise.select_units(maskable, word_start, np.full(4, 3), np.random.default_rng(0),
                       unit_ids=unit_ids)
  unit_ids[0, :] = 0
  unit_ids[0, 0] = 1  # [CLS].
  with pytest.raises(ValueError, match="not maskable"):
    noise.select_units(maskable, word_start, np.full(4, 3), np.random.default_rng(0),
                       unit_ids=unit_ids)


@pytest.mark.parametrize("name", sorted(noise.SELECTORS))
def test_deterministic_for_a_seed_and_different_across_seeds(name):
  _, input_mask, maskable, word_start = BATCH
  budget = noise.bert_num_to_predict(input_mask, 0.15, 20)
  first, again, other = (_select(name, maskable, word_start, budget, seed, UNIT_IDS)
                         for seed in (5, 5, 6))
  np.testing.assert_array_equal(first, again)
  assert (first != other).any()


def test_span_index_numbers_maximal_runs():
  chosen = np.array([[0, 1, 1, 0, 1, 1, 1, 0, 1], [1, 0, 0, 0, 0, 0, 0, 1, 1]], bool)
  np.testing.assert_array_equal(noise.span_index(chosen), [[0, 1, 1, 0, 2, 2, 2, 0, 3],
                                                           [1, 0, 0, 0, 0, 0, 0, 2, 2]])


def _span_masked(seed, replace_probs=noise.BERT_REPLACE_PROBS, random_token_weights=None):
  ids, _, maskable, word_start = _batch(2000, 128, seed=seed)
  chosen = noise.select_spans(maskable, word_start, noise.span_num_to_predict(maskable, 0.15),
                              np.random.default_rng(seed))
  packed = noise.pack_predictions(chosen, ids, 20)
  spans = noise.span_index(chosen)
  noised = noise.corrupt_spans(ids, packed["mlm_positions"], packed["mlm_weights"], spans,
                               np.random.default_rng(seed + 1), mask_id=MASK, vocab_size=V,
                               replace_probs=replace_probs,
                               random_token_weights=random_token_weights)
  return ids, chosen, spans, noised


def test_one_replacement_draw_per_merged_span():
  weights = np.zeros(V)
  weights[BODY[1]:] = 1.0  # Random tokens never equal a body token: every fate is visible.
  ids, chosen, spans, noised = _span_masked(18, random_token_weights=weights)
  fate = np.select([noised == MASK, noised == ids], [0, 1], 2)  # [MASK], kept, random.
  rows, cols = np.nonzero(chosen)
  span = rows * 1000 + spans[rows, cols]
  _, span = np.unique(span, return_inverse=True)
  fates = np.zeros((span.max() + 1, 3), int)
  np.add.at(fates, (span, fate[rows, cols]), 1)
  assert ((fates > 0).sum(1) == 1).all(), "a merged span mixes fates"
  assert (np.bincount(span) > 1).mean() > 0.5  # Mostly multi-token spans, so this has teeth.
  num_spans = fates.shape[0]
  for k, p in enumerate(noise.BERT_REPLACE_PROBS):
    _assert_close((fates[:, k] > 0).sum(), num_spans * p, num_spans * p * (1 - p), f"fate {k}")
  np.testing.assert_array_equal(noised[~chosen], ids[~chosen])


def test_random_span_tokens_follow_the_unigram_counts():
  stream = np.random.default_rng(19).zipf(1.5, 200_000) % V  # A skewed token stream.
  counts = noise.unigram_counts(stream, stream != PAD, V)
  assert counts[PAD] == 0 and counts.sum() == (stream != PAD).sum()
  ids, chosen, _, noised = _span_masked(20, replace_probs=(0.0, 0.0, 1.0),
                                        random_token_weights=counts)
  observed = np.bincount(noised[chosen], minlength=V)
  probs = counts / counts.sum()
  frequent = probs * chosen.sum() > 20
  observed = np.append(observed[frequent], observed[~frequent].sum())
  _assert_chi_square(observed, np.append(probs[frequent], probs[~frequent].sum()),
                     "random token ids")
  assert (chosen & (noised == ids)).mean() < 0.2  # Replaced (a draw may equal the original).


def test_corrupt_spans_refuses_a_prediction_outside_every_span():
  ids = np.full((1, 8), 20, np.int32)
  spans = np.zeros((1, 8), np.int32)
  spans[0, 2] = 1
  with pytest.raises(ValueError, match="outside every span"):
    noise.corrupt_spans(ids, np.array([[2, 5]]), np.ones((1, 2)), spans, np.random.default_rng(0),
                        mask_id=MASK, vocab_size=V)


def test_span_boundary_slots_on_the_worked_example():
  ids = np.array([[CLS, 11, 12, 13, 14, 15, 16, 17, SEP, PAD]])
  maskable = np.array([[0, 1, 1, 1, 1, 1, 1, 1, 0, 0]], bool)
  chosen = np.array([[0, 1, 0, 1, 1, 0, 1, 1, 0, 0]], bool)
  packed = noise.pack_predictions(chosen, ids, 6)  # Positions 1, 3, 4, 6, 7 and one pad slot.
  args = (packed["mlm_positions"], packed["mlm_weights"], noise.span_index(chosen), maskable)
  out = noise.span_boundary_slots(*args)
  np.testing.assert_array_equal(out["sbo_weights"], [[0, 1, 1, 0, 0, 0]])
  np.testing.assert_array_equal(out["sbo_boundaries"][0, :3], [[0, 0], [2, 5], [2, 5]])
  np.testing.assert_array_equal(out["sbo_offsets"], [[0, 0, 1, 0, 0, 0]])
  assert out["sbo_boundaries"].dtype == out["sbo_offsets"].dtype == np.int32
  np.testing.assert_array_equal(noise.span_boundary_slots(*args, max_targets=1)["sbo_weights"],
                                [[0, 1, 0, 0, 0, 0]])


def test_span_boundary_slots_match_the_spans_of_a_batch():
  """Against a per-span loop over SpanBERT's rule: each run whose boundaries lie in the block
  yields (s - 1, e + 1, offset, original token) for its first 15 tokens, and nothing else."""
  ids, _, maskable, word_start = BATCH
  chosen = noise.select_spans(maskable, word_start, np.full(256, 40), np.random.default_rng(24),
                              max_words=30, geometric_p=0.02)  # Long spans, some over 15 tokens.
  packed = noise.pack_predictions(chosen, ids, 40)
  slots = noise.span_boundary_slots(packed["mlm_positions"], packed["mlm_weights"],
                                    noise.span_index(chosen), maskable)
  rows, slot = np.nonzero(slots["sbo_weights"])
  from_slots = sorted(zip(rows, *slots["sbo_boundaries"][rows, slot].T,
                          slots["sbo_offsets"][rows, slot], packed["mlm_targets"][rows, slot]))
  expected, cut = [], 0
  for i in range(len(ids)):
    for start, end in _runs(chosen[i]):
      if maskable[i, start - 1] and maskable[i, end + 1]:
        expected += [(i, start - 1, end + 1, k, ids[i, start + k])
                     for k in range(min(end - start + 1, 15))]
        cut += end - start + 1 > 15
  assert len(expected) > 1000 and cut > 0   # some spans were cut to 15 targets
  assert from_slots == sorted(expected)


def _runs(row):
  """(start, end) inclusive of each maximal run of True in a [L] bool row."""
  edges = np.diff(np.concatenate([[0], row.astype(int), [0]]))
  return zip(np.nonzero(edges == 1)[0], np.nonzero(edges == -1)[0] - 1)


def test_shuffle_trigrams():
  ids, input_mask, maskable, word_start = _batch(2000, 128, seed=22)
  ids = np.where(maskable, np.arange(128) + 200, ids)  # Distinct tokens: any reorder shows.
  chosen = noise.select_tokens(maskable, word_start, noise.bert_num_to_predict(input_mask, .15, 20),
                               np.random.default_rng(22))
  out = noise.shuffle_trigrams(ids, maskable, chosen, 0.05, np.random.default_rng(23),
                               max_predictions=12)
  shuffled = np.zeros(ids.shape, bool)
  rows, slots = np.nonzero(out["shuffle_weights"])
  shuffled[rows, out["shuffle_positions"][rows, slots]] = True
  np.testing.assert_array_equal(out["shuffle_targets"][rows, slots],
                                ids[rows, out["shuffle_positions"][rows, slots]])
  expected = 3 * np.minimum(np.round(0.05 * maskable.sum(1) / 3), 4)
  np.testing.assert_array_equal(shuffled.sum(1), expected)
  assert not (shuffled & (chosen | ~maskable)).any()
  np.testing.assert_array_equal(out["input_ids"][~shuffled], ids[~shuffled])
  orders = []
  for i in range(2000):  # A run of shuffled tokens is one or more whole trigrams.
    for start, end in _runs(shuffled[i]):
      assert (end - start + 1) % 3 == 0
      for s in range(start, end + 1, 3):
        orders.append(tuple(out["input_ids"][i, s:s + 3] - ids[i, s]))
  orders = np.array(orders)
  assert (np.sort(orders, axis=1) == [0, 1, 2]).all()  # A permutation of the trigram...
  assert not (orders == [0, 1, 2]).all(axis=1).any()  # ...never the identity...
  _, counts = np.unique(orders, axis=0, return_counts=True)
  assert len(counts) == 5  # ...and all 5 others, uniformly.
  _assert_chi_square(counts, np.full(5, 0.2), "trigram permutations")
