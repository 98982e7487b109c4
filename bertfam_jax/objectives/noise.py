"""Host-side masked-LM noising: choose positions, corrupt them, pack the predictions.

Everything here is vectorised numpy over a batch of packed examples (`n` rows of length `L`) and
takes an explicit `np.random.Generator`, so a mask is a pure function of (batch, generator state).

The masking is three composable steps, each with its own functions:

  1. select    which tokens to predict, as a boolean map `[n, L]`. Every scheme in `SELECTORS`
               has the signature `select_x(maskable, word_start, num_to_predict, rng, **params)`:
               `select_tokens` (BERT, RoBERTa), `select_whole_words` (BERT WWM),
               `select_ngrams` (ALBERT), `select_spans` (SpanBERT), `select_units` (ERNIE phrase /
               entity masking, SpanBERT's NER spans). None chooses more than `num_to_predict`
               tokens of a row, nor a token outside `maskable`; `word_starts` builds `word_start`.
  2. pack      `pack_predictions`: a token map `[n, L]` -> `mlm_positions / mlm_targets /
               mlm_weights` `[n, P]` (positions ascending, zero-padded; see objectives/__init__).
  3. corrupt   `corrupt_positions`: the per-token [MASK] / keep / random-token draw;
               `corrupt_spans`: one draw per merged span (`span_index`), SpanBERT's
               `--replacement-method span`, with random tokens by `unigram_counts`.

Before selecting, a per-row budget: `bert_num_to_predict` (BERT), `fairseq_num_to_predict`
(RoBERTa), `span_num_to_predict` (SpanBERT). Beside the MLM predictions: `span_boundary_slots`
(SpanBERT's SBO inputs) and `shuffle_trigrams` (StructBERT's word objective). objectives/mlm.py
`mlm_features` composes these pieces from the `objective` config; the BERT and RoBERTa reference
rules (spec §1.1 step 9, §2 "Data" item 2) are two of its settings.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

# BERT's create_pretraining_data.py: 80% [MASK], 10% keep the original, 10% a random token.
# fairseq's MaskTokensDataset uses the same split (leave_unmasked_prob = random_token_prob = 0.1).
BERT_REPLACE_PROBS = (0.8, 0.1, 0.1)


def bert_num_to_predict(input_mask: np.ndarray, mask_rate: float,
                        max_predictions: int) -> np.ndarray:
  """BERT's per-sequence budget `min(max_predictions, max(1, round(mask_rate * len)))`.

  `len` counts every non-pad token, [CLS] and [SEP] included (create_pretraining_data.py takes
  `len(tokens)` after adding them). `np.round` rounds half to even, like Python 3's `round`.

  Args:
    input_mask: [n, L] 1 for real tokens, 0 for padding.
    mask_rate: fraction of tokens to predict (0.15 in BERT).
    max_predictions: the cap P (`max_predictions_per_seq`).

  Returns:
    [n] int32 number of tokens to predict per row (before capping by the candidate count).
  """
  lengths = np.count_nonzero(input_mask, axis=1)
  budget = np.round(lengths * mask_rate)
  return np.clip(budget, 1, max_predictions).astype(np.int32)


def fairseq_num_to_predict(input_mask: np.ndarray, mask_rate: float,
                           rng: np.random.Generator) -> np.ndarray:
  """fairseq's probabilistic rounding `int(mask_rate * len + U[0, 1))` (MaskTokensDataset).

  `len` counts every non-pad token, `<s>` and `</s>` included; the expectation is exactly
  `mask_rate * len`. There is no floor of 1 and no cap here: the caller caps by P.

  Args:
    input_mask: [n, L] 1 for real tokens, 0 for padding.
    mask_rate: fraction of tokens to predict (0.15 in RoBERTa).
    rng: consumes n uniforms.

  Returns:
    [n] int32 number of tokens to predict per row.
  """
  lengths = np.count_nonzero(input_mask, axis=1)
  return np.floor(lengths * mask_rate + rng.random(lengths.shape[0])).astype(np.int32)


def select_uniform(candidates: np.ndarray, num_to_select: np.ndarray,
                   rng: np.random.Generator) -> np.ndarray:
  """Chooses `min(num_to_select, #candidates)` units per row uniformly without replacement.

  Equivalent to BERT's "shuffle the candidates, take the first k" and to fairseq's
  `np.random.choice(sz, num_mask, replace=False)`: every candidate gets an i.i.d. uniform key and
  the k smallest keys of a row win. Works on any unit axis (tokens now, words for WWM).

  Args:
    candidates: [n, U] bool, True where a unit may be chosen.
    num_to_select: [n] int, how many units each row wants.
    rng: consumes n * U uniforms.

  Returns:
    [n, U] bool, True at the chosen units.
  """
  n, num_units = candidates.shape
  keys = np.where(candidates, rng.random((n, num_units)), np.inf)
  k = np.minimum(num_to_select, np.count_nonzero(candidates, axis=1))
  chosen = np.zeros((n, num_units), dtype=bool)
  k_max = int(k.max(initial=0))
  if k_max == 0:
    return chosen
  # The k_max smallest keys per row, unordered (O(U)), then ordered by key (O(k_max log k_max)).
  smallest = np.argpartition(keys, k_max - 1, axis=1)[:, :k_max]
  by_key = np.argsort(np.take_along_axis(keys, smallest, axis=1), axis=1)
  smallest = np.take_along_axis(smallest, by_key, axis=1)
  take = np.arange(k_max) < k[:, None]
  rows = np.broadcast_to(np.arange(n)[:, None], take.shape)
  chosen[rows[take], smallest[take]] = True
  return chosen


def select_tokens(maskable: np.ndarray, word_start: np.ndarray, num_to_predict: np.ndarray,
                  rng: np.random.Generator) -> np.ndarray:
  """Token-level selection (BERT, RoBERTa) in the `SELECTORS` signature; `word_start` is unused.

  `select_uniform` over tokens: BERT's create_pretraining_data.py without `do_whole_word_mask`.

  Returns:
    [n, L] bool, `min(num_to_predict, #maskable)` tokens per row.
  """
  del word_start  # Tokens are the units.
  return select_uniform(maskable, num_to_predict, rng)


def select_tokens_with_replacement(maskable: np.ndarray, word_start: np.ndarray,
                                   num_to_predict: np.ndarray,
                                   rng: np.random.Generator) -> np.ndarray:
  """ELECTRA's position sampling (pretrain/pretrain_helpers.py `mask`): `num_to_predict` draws
  per row from the uniform distribution over the maskable tokens, WITH replacement.

  The reference keeps duplicate draws as separate prediction slots (the generator loss counts
  each copy, and the written-back sample is the floor-mean of the copies' samples); here a
  position drawn twice is one prediction, so a row predicts the number of distinct draws
  (≈ 17.6 of 19 at 128 tokens). `word_start` is unused.

  Args:
    maskable: [n, L] bool, the candidates.
    word_start: unused ([n, L]).
    num_to_predict: [n] int draws per row.
    rng: consumes n * max(num_to_predict) uniforms.

  Returns:
    [n, L] bool, at most `num_to_predict` distinct tokens per row.
  """
  del word_start  # Tokens are the units.
  n, length = maskable.shape
  counts = np.count_nonzero(maskable, axis=1)
  draws = np.where(counts > 0, num_to_predict, 0)
  chosen = np.zeros((n, length), dtype=bool)
  max_draws = int(draws.max(initial=0))
  if max_draws == 0:
    return chosen
  candidates_first = np.argsort(~maskable, axis=1, kind="stable")  # [n, L] maskable columns first
  index = np.floor(rng.random((n, max_draws)) * counts[:, None]).astype(np.int64)
  columns = np.take_along_axis(candidates_first, np.minimum(index, length - 1), axis=1)
  take = np.arange(max_draws) < draws[:, None]
  rows = np.broadcast_to(np.arange(n)[:, None], take.shape)
  chosen[rows[take], columns[take]] = True
  return chosen


def _run_starts(maskable: np.ndarray) -> np.ndarray:
  """[n, L] bool: maskable tokens that open the row or follow a non-maskable token."""
  follows_maskable = np.zeros_like(maskable)
  follows_maskable[:, 1:] = maskable[:, :-1]
  return maskable & ~follows_maskable


def word_starts(input_ids: np.ndarray, maskable: np.ndarray,
                word_start_table: np.ndarray) -> np.ndarray:
  """Marks the maskable tokens that begin a word.

  A maskable token begins a word when its piece is word-initial (`Tokenizer.word_start`: ALBERT's
  `_is_start_piece_sp`; BERT's "does not start with ##") or when its predecessor is not
  maskable, so no word straddles [CLS], [SEP] or padding. A word is its start token plus the
  maskable non-start tokens that follow it. (BERT's create_pretraining_data.py appends a "##"
  piece right after the middle [SEP] to the last word before it; here it starts a word.)

  Args:
    input_ids: [n, L] int token ids.
    maskable: [n, L] bool, the tokens that may be predicted (no padding, [CLS] or [SEP]).
    word_start_table: [V] bool, True for word-initial pieces.

  Returns:
    [n, L] bool.
  """
  return maskable & (word_start_table[input_ids] | _run_starts(maskable))


class _Words(NamedTuple):
  """The words of each row, numbered 0, 1, ... left to right; W = most words in a row (≥ 1)."""
  index: np.ndarray  # [n, L] int: the word of each maskable token, -1 elsewhere.
  count: np.ndarray  # [n] int: words in the row.
  first: np.ndarray  # [n, W] int: first token of each word (0 past `count`).
  last: np.ndarray  # [n, W] int: last token of each word (0 past `count`).
  tokens_before: np.ndarray  # [n, W + 1] int: tokens in the words before word w (prefix sums).


def _words(maskable: np.ndarray, word_start: np.ndarray) -> _Words:
  """Numbers the words of `maskable` delimited by `word_start` (and by non-maskable tokens)."""
  n = maskable.shape[0]
  starts = maskable & (word_start | _run_starts(maskable))
  index = np.where(maskable, np.cumsum(starts, axis=1) - 1, -1)
  count = np.count_nonzero(starts, axis=1)
  num_words = max(int(count.max(initial=0)), 1)
  continues = np.zeros_like(maskable)  # The next token belongs to the same word.
  continues[:, :-1] = maskable[:, 1:] & ~starts[:, 1:]
  first = np.zeros((n, num_words), np.int64)
  last = np.zeros((n, num_words), np.int64)
  for boundary, table in ((starts, first), (maskable & ~continues, last)):
    rows, cols = np.nonzero(boundary)
    table[rows, index[rows, cols]] = cols
  rows, cols = np.nonzero(maskable)
  sizes = np.bincount(rows * num_words + index[rows, cols], minlength=n * num_words)
  tokens_before = np.zeros((n, num_words + 1), np.int64)
  tokens_before[:, 1:] = np.cumsum(sizes.reshape(n, num_words), axis=1)
  return _Words(index, count, first, last, tokens_before)


class SpanDraws(NamedTuple):
  """The spans a sequential scheme accepted (`draw_ngrams`, `draw_spans`), one entry per span.

  Entries are sorted by row, then in the order the scheme accepted them within the row; spans
  may overlap or touch (`span_index` merges them).
  """
  chosen: np.ndarray  # [n, L] bool: the union of the spans.
  row: np.ndarray  # [D] int: the row of each span.
  start: np.ndarray  # [D] int: its first token (always a word start).
  end: np.ndarray  # [D] int: its last token, inclusive.
  drawn_words: np.ndarray  # [D] int: the length drawn, in words, before shrinking or clipping.
  words: np.ndarray  # [D] int: the words it covers (the last one possibly in part).


def _span_draws(chosen: np.ndarray, records: list[tuple[np.ndarray, ...]]) -> SpanDraws:
  """Sorts per-round `(round, row, start, end, drawn_words, words)` records into `SpanDraws`."""
  fields = [np.concatenate(f) for f in zip(*records)] if records else [np.zeros(0, int)] * 6
  order = np.lexsort((fields[0], fields[1]))  # By row, then by round.
  return SpanDraws(chosen, *(f[order].astype(np.int64) for f in fields[1:]))


def _sample_lengths(probs: np.ndarray, shortest: int, num: int,
                    rng: np.random.Generator) -> np.ndarray:
  """[num] int lengths `shortest + i` drawn with probability `probs[i]` (num uniforms)."""
  cdf = np.cumsum(probs / probs.sum())
  return shortest + np.minimum(np.searchsorted(cdf, rng.random(num), side="right"), probs.size - 1)


def draw_ngrams(maskable: np.ndarray, word_start: np.ndarray, num_to_predict: np.ndarray,
                rng: np.random.Generator, *, max_n: int = 3,
                favor_shorter_ngram: bool = True, probs=None) -> SpanDraws:
  """ALBERT's n-gram masking (create_pretraining_data.py create_masked_lm_predictions, spec §3).

  1. Every word of a row starts one candidate n-gram; the starts are shuffled.
  2. Walking the starts in that order, while the row has budget left: draw n with
     p(n) ∝ 1/n over 1..max_n (6/11, 3/11, 2/11 for max_n=3; reversed without
     `favor_shorter_ngram`). The n-gram is words start..start+n-1, cut at the last word of the
     row (ALBERT slices the word list, so n is always drawn over all of 1..max_n).
  3. While it would overflow the budget, shrink n by one; skip the start if even one word
     overflows, or if any of its words is already covered; else cover all its tokens.
  Words are numbered over the whole row, so an n-gram may straddle the middle [SEP] as in ALBERT.
  ALBERT draws n from numpy's *global* RNG (unseeded by `--random_seed`); here every draw comes
  from `rng`. n is pre-drawn for every start (n * W uniforms) whether or not the walk reaches it.

  The walk is vectorised over rows: step r considers the r-th shuffled start of every row.

  Args:
    maskable: [n, L] bool, tokens that may be chosen.
    word_start: [n, L] bool, word-initial tokens (see `word_starts`).
    num_to_predict: [n] int per-row budget.
    rng: consumes n * W uniforms for the order, then n * W for the lengths.
    max_n: the longest n-gram, in words (ALBERT's `--ngram`=3).
    favor_shorter_ngram: p(n) ∝ 1/n if True, ∝ 1/(max_n + 1 - n) otherwise.
    probs: [max_n] p(n) for n = 1..max_n instead (UniLM's 0.8 / 0.1 / 0.1: `ngram_probs`).

  Returns:
    `SpanDraws`: `drawn_words` is the drawn n, `words` the n-gram length actually covered.
  """
  words = _words(maskable, word_start)
  n_rows, num_words = words.first.shape
  keys = np.where(np.arange(num_words) < words.count[:, None], rng.random((n_rows, num_words)),
                  np.inf)
  order = np.argsort(keys, axis=1)  # The shuffled starts of each row first, then the padding.
  if probs is None:
    probs = 1.0 / np.arange(1, max_n + 1)
    if not favor_shorter_ngram:
      probs = probs[::-1]
  probs = np.asarray(probs, np.float64)
  drawn = _sample_lengths(probs, 1, n_rows * num_words, rng).reshape(n_rows, num_words)
  offsets = np.arange(max_n)
  covered = np.zeros((n_rows, num_words + max_n), bool)  # Padded so that start + offset fits.
  count = np.zeros(n_rows, np.int64)
  records = []
  for step in range(num_words):
    rows = np.nonzero((step < words.count) & (count < num_to_predict))[0]
    if rows.size == 0:
      break
    start = order[rows, step]
    available = np.minimum(drawn[rows, step], words.count[rows] - start)
    stop = np.minimum(start[:, None] + offsets + 1, words.count[rows, None])  # [a, max_n]
    sizes = words.tokens_before[rows[:, None], stop] - words.tokens_before[rows, start][:, None]
    left = num_to_predict[rows] - count[rows]
    fits = (offsets < available[:, None]) & (sizes <= left[:, None])
    n = np.count_nonzero(fits, axis=1)  # Sizes grow with n, so the fitting n form a prefix.
    in_gram = offsets < n[:, None]
    gram_words = (rows[:, None], start[:, None] + offsets)
    accept = (n > 0) & ~(covered[gram_words] & in_gram).any(axis=1)
    covered[gram_words] |= in_gram & accept[:, None]
    rows, start, n, sizes = rows[accept], start[accept], n[accept], sizes[accept]
    count[rows] += sizes[np.arange(rows.size), n - 1]
    records.append((np.full(rows.size, step), rows, words.first[rows, start],
                    words.last[rows, start + n - 1], drawn[rows, step], n))
  chosen = maskable & np.take_along_axis(covered, np.maximum(words.index, 0), axis=1)
  return _span_draws(chosen, records)


def select_ngrams(maskable: np.ndarray, word_start: np.ndarray, num_to_predict: np.ndarray,
                  rng: np.random.Generator, *, max_n: int = 3,
                  favor_shorter_ngram: bool = True, probs=None) -> np.ndarray:
  """ALBERT n-gram masking as a [n, L] bool map; see `draw_ngrams`."""
  return draw_ngrams(maskable, word_start, num_to_predict, rng, max_n=max_n,
                     favor_shorter_ngram=favor_shorter_ngram, probs=probs).chosen


def ngram_probs(distribution: str, max_n: int) -> np.ndarray | None:
  """p(n) for n = 1..max_n: 'albert' None (`draw_ngrams`' 1/n); 'unilm' 0.8 for one word and
  0.2 shared equally by 2..max_n (Dong et al. 2019 §2.3: "80% of the time we randomly mask one
  token, and 20% of the time we mask a bigram or a trigram")."""
  if distribution == "albert":
    return None
  if distribution != "unilm" or max_n < 2:
    raise ValueError(f"ngram distribution {distribution!r} with max_n={max_n}; 'unilm' needs "
                     "max_n >= 2.")
  return np.concatenate([[0.8], np.full(max_n - 1, 0.2 / (max_n - 1))])


def select_whole_words(maskable: np.ndarray, word_start: np.ndarray, num_to_predict: np.ndarray,
                       rng: np.random.Generator) -> np.ndarray:
  """BERT's whole-word masking (create_pretraining_data.py `do_whole_word_mask`, spec §1.5).

  Words are visited in a uniformly random order; a word that would overflow the budget is
  skipped and the walk goes on with the next. This is `draw_ngrams` with max_n=1.

  Returns:
    [n, L] bool: whole words, at most `num_to_predict` tokens per row.
  """
  return draw_ngrams(maskable, word_start, num_to_predict, rng, max_n=1).chosen


def span_num_to_predict(maskable: np.ndarray, mask_rate: float) -> np.ndarray:
  """SpanBERT's budget `ceil(mask_rate * #maskable)` (masking.py PairWithSpanMaskingScheme).

  SpanBERT masks the block without [CLS]/[SEP]; the product is taken in float64 exactly as
  `math.ceil(sent_length * mask_ratio)`. Cap it by `max_predictions` before selecting.

  Args:
    maskable: [n, L] bool, the block's tokens.
    mask_rate: 0.15 in SpanBERT.

  Returns:
    [n] int32.
  """
  return np.ceil(np.count_nonzero(maskable, axis=1) * mask_rate).astype(np.int32)


def draw_spans(maskable: np.ndarray, word_start: np.ndarray, num_to_predict: np.ndarray,
               rng: np.random.Generator, *, geometric_p: float = 0.2, min_words: int = 1,
               max_words: int = 10) -> SpanDraws:
  """SpanBERT's span masking (pretraining/fairseq/data/masking.py PairWithSpanMaskingScheme).

  Until the row holds `min(num_to_predict, #maskable)` tokens: draw a span length ℓ in words
  with p(ℓ) ∝ p (1 - p)^(ℓ - min_words) on min_words..max_words (the README command's
  `--geometric-p 0.2 --span-lower 1 --span-upper 10`: mean 3.8 words), an anchor token, then
  walk from the first token of the anchor's word through ℓ words (fewer at the row's end),
  adding tokens until the budget is reached, so the row's last span may end mid-word. A span
  may run into earlier spans; its tokens count once. Words are numbered over the whole row, so
  a span may continue past a middle [SEP] unless each segment is selected as a row of its own
  (`objective.mask_per_segment`, SpanBERT's sentence pairs).

  SpanBERT draws (ℓ, anchor) uniformly and redraws both when the anchor is already masked; the
  accepted pair is then ℓ from the pmf and an anchor uniform over the unmasked tokens, which is
  how it is drawn here (no rejected rounds). The rounds are vectorised over rows (one span per
  row per round).

  Args:
    maskable: [n, L] bool, the block (SpanBERT: all tokens between [CLS] and [SEP]).
    word_start: [n, L] bool, word-initial tokens (see `word_starts`).
    num_to_predict: [n] int budget (`span_num_to_predict`, capped by max_predictions).
    rng: consumes two uniforms per active row per round.
    geometric_p: p of the geometric length distribution (0.2 in the SpanBERT command; 0.3 is
      the argparse default).
    min_words, max_words: the length range in words (`--span-lower`, `--span-upper`).

  Returns:
    `SpanDraws`: `drawn_words` is ℓ, `words` the words the span touches.
  """
  words = _words(maskable, word_start)
  length = maskable.shape[1]
  lengths = np.arange(min_words, max_words + 1)
  budget = np.minimum(num_to_predict, np.count_nonzero(maskable, axis=1))
  chosen = np.zeros(maskable.shape, bool)
  count = np.zeros(maskable.shape[0], np.int64)
  records = []
  for round_number in itertools.count():
    rows = np.nonzero(count < budget)[0]
    if rows.size == 0:
      break
    span_words = _sample_lengths(geometric_p * (1 - geometric_p) ** (lengths - min_words),
                                 min_words, rows.size, rng)
    free_up_to = np.cumsum(maskable[rows] & ~chosen[rows], axis=1)
    kth_free = np.floor(rng.random(rows.size) * free_up_to[:, -1])
    anchor = np.argmax(free_up_to > kth_free[:, None], axis=1)
    index = words.index[rows]
    first_word = index[np.arange(rows.size), anchor]
    last_word = np.minimum(first_word + span_words, words.count[rows]) - 1
    in_span = (index >= first_word[:, None]) & (index <= last_word[:, None])
    new = in_span & ~chosen[rows]
    new_before = np.cumsum(new, axis=1) - new
    visited = in_span & (new_before < (budget - count)[rows, None])
    chosen[rows] |= visited
    count[rows] += np.count_nonzero(visited & new, axis=1)
    end = length - 1 - np.argmax(visited[:, ::-1], axis=1)
    records.append((np.full(rows.size, round_number), rows, words.first[rows, first_word], end,
                    span_words, index[np.arange(rows.size), end] - first_word + 1))
  return _span_draws(chosen, records)


def select_spans(maskable: np.ndarray, word_start: np.ndarray, num_to_predict: np.ndarray,
                 rng: np.random.Generator, *, geometric_p: float = 0.2, min_words: int = 1,
                 max_words: int = 10) -> np.ndarray:
  """SpanBERT span masking as a [n, L] bool map; see `draw_spans`."""
  return draw_spans(maskable, word_start, num_to_predict, rng, geometric_p=geometric_p,
                    min_words=min_words, max_words=max_words).chosen


def select_units(maskable: np.ndarray, word_start: np.ndarray, num_to_predict: np.ndarray,
                 rng: np.random.Generator, *, unit_ids: np.ndarray,
                 unit_prob: float = 0.5) -> np.ndarray:
  """Whole-unit masking: ERNIE 1.0 phrase / entity masking, SpanBERT's NER spans.

  A unit is a maximal run of equal positive `unit_ids` (a phrase or an entity, always whole
  words); every word outside the units is a candidate of its own. Each draw, per row: with
  probability `unit_prob` pick uniformly among the row's unchosen units that fit the remaining
  budget, else among its unchosen free words that fit (the other kind when one kind has none
  left); choose all its tokens. A row stops when its budget is met or nothing fits.

  The mixing follows SpanBERT's pretraining/fairseq/data/masking.py NERSpanMaskingScheme: a
  coin per span draw (`ner_masking_prob` 0.5), not per sequence. It differs from it in three
  ways, so that units stay whole as ERNIE's paper asks: the non-unit draw is one whole word
  (SpanBERT draws a geometric span, which may cut an entity); a unit that would overflow is
  skipped (SpanBERT truncates it at the budget); and no draw is wasted (SpanBERT picks among
  all entities, including already masked ones, and does nothing for a row without entities).
  ERNIE's paper gives no sampling constants (spec §8).

  Args:
    maskable: [n, L] bool, tokens that may be chosen.
    word_start: [n, L] bool, word-initial tokens (see `word_starts`).
    num_to_predict: [n] int per-row budget.
    rng: consumes, per round, one uniform per active row and one per (active row, candidate).
    unit_ids: [n, L] int, 0 outside units; inside units only maskable tokens, and every unit
      boundary is a word boundary.
    unit_prob: the chance that a draw picks a unit (SpanBERT's `ner_masking_prob`).

  Returns:
    [n, L] bool: whole units and whole words, at most `num_to_predict` tokens per row.

  Raises:
    ValueError: a unit covers a non-maskable token or starts or ends inside a word.
  """
  starts = maskable & (word_start | _run_starts(maskable))
  in_unit = unit_ids > 0
  if (in_unit & ~maskable).any():
    raise ValueError("unit_ids marks a token that is not maskable ([CLS], [SEP] or padding).")
  same_unit_as_previous = np.zeros_like(maskable)
  same_unit_as_previous[:, 1:] = maskable[:, :-1] & (unit_ids[:, 1:] == unit_ids[:, :-1])
  if (maskable & ~same_unit_as_previous & ~starts).any():
    raise ValueError("A unit of unit_ids starts or ends inside a word; units must be whole words.")
  candidate_starts = starts & ~(in_unit & same_unit_as_previous)
  candidate = np.where(maskable, np.cumsum(candidate_starts, axis=1) - 1, -1)
  n_rows = maskable.shape[0]
  num_candidates = max(int(np.count_nonzero(candidate_starts, axis=1).max(initial=0)), 1)
  rows, cols = np.nonzero(maskable)
  size = np.bincount(rows * num_candidates + candidate[rows, cols],
                     minlength=n_rows * num_candidates).reshape(n_rows, num_candidates)
  is_unit = np.zeros((n_rows, num_candidates), bool)
  rows, cols = np.nonzero(candidate_starts)
  is_unit[rows, candidate[rows, cols]] = in_unit[rows, cols]
  taken = np.zeros((n_rows, num_candidates), bool)
  count = np.zeros(n_rows, np.int64)
  open_rows = np.ones(n_rows, bool)
  while True:
    rows = np.nonzero(open_rows & (count < num_to_predict))[0]
    fits = ~taken[rows] & (size[rows] > 0) & (size[rows] <= (num_to_predict - count)[rows, None])
    open_rows[rows[~fits.any(axis=1)]] = False
    rows, fits = rows[fits.any(axis=1)], fits[fits.any(axis=1)]
    if rows.size == 0:
      break
    want_unit = rng.random(rows.size) < unit_prob
    of_kind = fits & (is_unit[rows] == want_unit[:, None])
    of_kind = np.where(of_kind.any(axis=1)[:, None], of_kind, fits)
    pick = np.argmin(np.where(of_kind, rng.random(of_kind.shape), np.inf), axis=1)
    taken[rows, pick] = True
    count[rows] += size[rows, pick]
  return maskable & np.take_along_axis(taken, np.maximum(candidate, 0), axis=1)


# The selection schemes by name, all `fn(maskable, word_start, num_to_predict, rng, **params)`.
SELECTORS = {
    "token": select_tokens,
    "token_with_replacement": select_tokens_with_replacement,
    "whole_word": select_whole_words,
    "ngram": select_ngrams,
    "span": select_spans,
    "units": select_units,
}


def pack_predictions(chosen: np.ndarray, input_ids: np.ndarray,
                     max_predictions: int) -> dict[str, np.ndarray]:
  """Lists the chosen tokens of each row as zero-padded prediction slots.

  Args:
    chosen: [n, L] bool, the tokens to predict; at most `max_predictions` per row.
    input_ids: [n, L] int, the original (un-noised) tokens.
    max_predictions: P, the number of prediction slots per row.

  Returns:
    mlm_positions [n, P] int32 (ascending, 0-padded), mlm_targets [n, P] int32 (original ids,
    0-padded), mlm_weights [n, P] float32 (1.0 for a real prediction).

  Raises:
    ValueError: a row has more than `max_predictions` chosen tokens.
  """
  n = chosen.shape[0]
  counts = np.count_nonzero(chosen, axis=1)
  if counts.max(initial=0) > max_predictions:
    raise ValueError(f"A row chose {counts.max()} tokens but max_predictions={max_predictions}; "
                     "the selection step must respect the cap.")
  rows, cols = np.nonzero(chosen)  # Row-major, so `cols` ascend within each row.
  slot = np.arange(rows.size) - np.repeat(np.cumsum(counts) - counts, counts)
  positions = np.zeros((n, max_predictions), dtype=np.int32)
  targets = np.zeros((n, max_predictions), dtype=np.int32)
  weights = np.zeros((n, max_predictions), dtype=np.float32)
  positions[rows, slot] = cols
  targets[rows, slot] = input_ids[rows, cols]
  weights[rows, slot] = 1.0
  return dict(mlm_positions=positions, mlm_targets=targets, mlm_weights=weights)


def sample_tokens(num: int, rng: np.random.Generator, *, vocab_size: int,
                  weights: np.ndarray | None = None) -> np.ndarray:
  """Draws `num` token ids uniformly from [0, vocab_size) or in proportion to `weights` [V].

  Returns:
    [num] int32 token ids.
  """
  if weights is None:
    return rng.integers(0, vocab_size, size=num, dtype=np.int32)
  if weights.shape != (vocab_size,):
    raise ValueError(f"random_token_weights has shape {weights.shape}; expected ({vocab_size},).")
  cdf = np.cumsum(weights, dtype=np.float64)
  cdf /= cdf[-1]
  # side='right' never lands on a zero-weight id: its cdf entry equals its predecessor's.
  return np.searchsorted(cdf, rng.random(num), side="right").astype(np.int32)


def _check_replace_probs(replace_probs: Sequence[float]) -> None:
  if min(replace_probs) < 0 or not np.isclose(sum(replace_probs), 1.0):
    raise ValueError(f"replace_probs={tuple(replace_probs)} must be non-negative and sum to 1.")


def _replace(input_ids: np.ndarray, positions: np.ndarray, weights: np.ndarray,
             decision: np.ndarray, rng: np.random.Generator, *, mask_id: int,
             replace_probs: Sequence[float], vocab_size: int,
             random_token_weights: np.ndarray | None) -> np.ndarray:
  """Applies [MASK] / keep / random per slot from its uniform `decision` [n, P]; returns [n, L]."""
  p_mask, p_keep, _ = replace_probs
  real = weights > 0
  to_mask = real & (decision < p_mask)
  to_random = real & (decision >= p_mask + p_keep)
  rows = np.broadcast_to(np.arange(positions.shape[0])[:, None], positions.shape)
  noised = input_ids.astype(np.int32, copy=True)
  noised[rows[to_mask], positions[to_mask]] = mask_id
  noised[rows[to_random], positions[to_random]] = sample_tokens(
      int(np.count_nonzero(to_random)), rng, vocab_size=vocab_size, weights=random_token_weights)
  return noised


def corrupt_positions(input_ids: np.ndarray, positions: np.ndarray, weights: np.ndarray,
                      rng: np.random.Generator, *, mask_id: int,
                      replace_probs: Sequence[float] = BERT_REPLACE_PROBS, vocab_size: int,
                      random_token_weights: np.ndarray | None = None) -> np.ndarray:
  """Replaces each predicted token independently by [MASK], itself, or a random token.

  One uniform per slot against the cumulative `replace_probs`, equivalent in distribution to
  BERT's nested draws (r < 0.8 -> [MASK]; else r' < 0.5 -> keep; else random) and to fairseq's
  `rand_or_unmask` / `decision` pair.

  Args:
    input_ids: [n, L] int, the original tokens (not modified).
    positions: [n, P] int, the predicted positions.
    weights: [n, P] float, 1.0 for a real prediction; padding slots are left alone.
    rng: consumes n * P uniforms, then one draw per random replacement.
    mask_id: the [MASK] id.
    replace_probs: (p_mask, p_keep, p_random), summing to 1.
    vocab_size: V, the range of uniform random tokens.
    random_token_weights: [V] non-negative weights for random tokens, or None for uniform.

  Returns:
    [n, L] int32, the noised input_ids.
  """
  _check_replace_probs(replace_probs)
  return _replace(input_ids, positions, weights, rng.random(positions.shape), rng,
                  mask_id=mask_id, replace_probs=replace_probs, vocab_size=vocab_size,
                  random_token_weights=random_token_weights)


def span_index(chosen: np.ndarray) -> np.ndarray:
  """Numbers the maximal runs of chosen tokens: 0 outside, k for the k-th run of the row (1-based).

  A run is SpanBERT's merged span: masking.py `merge_intervals` joins overlapping **and
  adjacent** spans, so the merged spans are exactly the maximal runs.

  Args:
    chosen: [n, L] bool.

  Returns:
    [n, L] int32.
  """
  run_starts = chosen.copy()
  run_starts[:, 1:] &= ~chosen[:, :-1]
  return np.where(chosen, np.cumsum(run_starts, axis=1), 0).astype(np.int32)


def corrupt_spans(input_ids: np.ndarray, positions: np.ndarray, weights: np.ndarray,
                  spans: np.ndarray, rng: np.random.Generator, *, mask_id: int,
                  replace_probs: Sequence[float] = BERT_REPLACE_PROBS, vocab_size: int,
                  random_token_weights: np.ndarray | None = None) -> np.ndarray:
  """One [MASK] / keep / random draw per span, applied to all its predicted tokens.

  SpanBERT's `--replacement-method span` (masking.py span_masking): one uniform per merged span;
  each token of a span sent to "random" still gets its own random token. SpanBERT draws random
  tokens from the corpus token stream: pass `unigram_counts` as `random_token_weights`.

  Args:
    input_ids: [n, L] int, the original tokens (not modified).
    positions: [n, P] int, the predicted positions.
    weights: [n, P] float, 1.0 for a real prediction; padding slots are left alone.
    spans: [n, L] int, `span_index` of the chosen tokens; every predicted position is in a span.
    rng: consumes n * (most spans in a row) uniforms, then one draw per random replacement.
    mask_id: the [MASK] id.
    replace_probs: (p_mask, p_keep, p_random), summing to 1.
    vocab_size: V.
    random_token_weights: [V] non-negative weights for random tokens, or None for uniform.

  Returns:
    [n, L] int32, the noised input_ids.

  Raises:
    ValueError: a predicted position lies outside every span.
  """
  _check_replace_probs(replace_probs)
  rows = np.broadcast_to(np.arange(positions.shape[0])[:, None], positions.shape)
  span_of_slot = spans[rows, positions]
  if ((weights > 0) & (span_of_slot == 0)).any():
    raise ValueError("A predicted position lies outside every span; pass span_index(chosen).")
  span_decision = rng.random((spans.shape[0], max(int(spans.max(initial=0)), 1)))
  decision = span_decision[rows, np.maximum(span_of_slot - 1, 0)]
  return _replace(input_ids, positions, weights, decision, rng, mask_id=mask_id,
                  replace_probs=replace_probs, vocab_size=vocab_size,
                  random_token_weights=random_token_weights)


def unigram_counts(input_ids: np.ndarray, counted: np.ndarray, vocab_size: int) -> np.ndarray:
  """Token frequencies, the weights for SpanBERT's random replacements.

  SpanBERT samples a random token as `np.random.choice(tokens)` over the corpus token stream
  (masking.py span_masking), i.e. by unigram frequency; count a large sample of the corpus here.

  Args:
    input_ids: [...] int token ids.
    counted: [...] bool, the tokens to count (e.g. `maskable`: no padding or [CLS]/[SEP], which
      SpanBERT's stream does not contain).
    vocab_size: V.

  Returns:
    [V] int64 counts, usable as `random_token_weights`.
  """
  return np.bincount(input_ids[counted], minlength=vocab_size).astype(np.int64)


def _span_bounds(spans: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """First and last token of the span (run of `spans`) each token is in: two [n, L] int maps."""
  n, length = spans.shape
  after = np.pad(spans, ((0, 0), (0, 1)))[:, 1:]
  before = np.pad(spans, ((0, 0), (1, 0)))[:, :-1]
  columns = np.broadcast_to(np.arange(length), (n, length))
  first = np.maximum.accumulate(np.where((spans > 0) & (spans != before), columns, 0), axis=1)
  last_reversed = np.where((spans > 0) & (spans != after), columns, length)[:, ::-1]
  return first, np.minimum.accumulate(last_reversed, axis=1)[:, ::-1]


def _boundaries_in_block(maskable: np.ndarray, rows: np.ndarray, left: np.ndarray,
                         right: np.ndarray) -> np.ndarray:
  """Whether both boundary tokens lie in the block: SpanBERT's `start > 0 and end < len - 1`."""
  length = maskable.shape[1]
  return ((left >= 0) & (right < length) & maskable[rows, np.maximum(left, 0)] &
          maskable[rows, np.minimum(right, length - 1)])


def span_boundary_slots(positions: np.ndarray, weights: np.ndarray, spans: np.ndarray,
                        maskable: np.ndarray, *, max_targets: int = 15) -> dict[str, np.ndarray]:
  """SpanBERT's span-boundary-objective inputs, one per MLM prediction slot.

  SpanBERT (masking.py span_masking, `--endpoints external`) predicts, for every merged span
  whose boundary tokens s - 1 and e + 1 both lie inside the block, each of its first
  `max_targets` tokens (`--max-pair-targets` 15) from the two boundary states and the token's
  offset in the span; a span whose boundary would be [CLS], [SEP] or beyond is left out. Every
  such token is also an MLM prediction with the same target, so the SBO inputs are laid out on
  the MLM slots and `mlm_targets` serves as the SBO target (the head projects P rows instead of
  SpanBERT's spans × max_targets). Positions are in sequence coordinates (SpanBERT adds 1 for
  [CLS] after masking the block).

  Args:
    positions: [n, P] int, mlm_positions.
    weights: [n, P] float, mlm_weights.
    spans: [n, L] int, `span_index` of the predicted tokens.
    maskable: [n, L] bool, the block.
    max_targets: predictions per span (SpanBERT's pair-position table has this many rows).

  Returns:
    sbo_boundaries [n, P, 2] int32 (s - 1, e + 1) of the slot's span; sbo_offsets [n, P] int32,
    the slot's position minus s; sbo_weights [n, P] float32, 1.0 for an SBO prediction. All 0
    where the weight is 0.
  """
  rows = np.broadcast_to(np.arange(positions.shape[0])[:, None], positions.shape)
  first, last = _span_bounds(spans)
  left, right = first[rows, positions] - 1, last[rows, positions] + 1
  offsets = positions - left - 1
  predicted = ((weights > 0) & (spans[rows, positions] > 0) & (offsets < max_targets) &
               _boundaries_in_block(maskable, rows, left, right))
  return dict(sbo_boundaries=np.where(predicted[..., None], np.stack([left, right], -1),
                                      0).astype(np.int32),
              sbo_offsets=np.where(predicted, offsets, 0).astype(np.int32),
              sbo_weights=predicted.astype(np.float32))


# The 5 orders of a trigram other than the identity: position i receives token perm[i].
_TRIGRAM_SHUFFLES = np.array([[0, 2, 1], [1, 0, 2], [2, 1, 0], [1, 2, 0], [2, 0, 1]])


def shuffle_trigrams(input_ids: np.ndarray, maskable: np.ndarray, chosen: np.ndarray,
                     rate: float, rng: np.random.Generator, *,
                     max_predictions: int) -> dict[str, np.ndarray]:
  """StructBERT's word-structural objective (paper only; no pretraining code was released).

  Among the maskable tokens not chosen for MLM, pick `round(rate * #maskable / 3)` trigrams per
  row (≈ `rate` of the tokens; "5%" in the paper, unverified; at most max_predictions // 3),
  non-overlapping and free of MLM tokens, one uniformly random valid start at a time; reorder
  each by one of the 5 non-identity permutations, uniformly; predict the original token at all
  three positions of every trigram (a transposition leaves one of them in place).

  Args:
    input_ids: [n, L] int, original or MLM-noised ids (shuffled positions are outside `chosen`,
      so they hold original tokens either way).
    maskable: [n, L] bool, tokens that may be shuffled (no padding, [CLS] or [SEP]).
    chosen: [n, L] bool, the MLM predictions, left alone.
    rate: fraction of the maskable tokens to shuffle.
    rng: consumes one uniform per active row per trigram, then one integer per trigram.
    max_predictions: P', the prediction slots of the result.

  Returns:
    input_ids [n, L] int32 with the trigrams reordered; shuffle_positions [n, P'] int32,
    shuffle_targets [n, P'] int32 (original ids), shuffle_weights [n, P'] float32, laid out as
    `pack_predictions`.
  """
  free = maskable & ~chosen
  num_trigrams = np.minimum(np.round(rate * np.count_nonzero(maskable, axis=1) / 3),
                            max_predictions // 3).astype(np.int64)
  shuffled = np.zeros(maskable.shape, bool)
  trigram_rows, trigram_starts = [], []
  for step in range(int(num_trigrams.max(initial=0))):
    rows = np.nonzero(num_trigrams > step)[0]
    available = free[rows] & ~shuffled[rows]
    valid_up_to = np.cumsum(available[:, :-2] & available[:, 1:-1] & available[:, 2:], axis=1)
    rows, valid_up_to = rows[valid_up_to[:, -1] > 0], valid_up_to[valid_up_to[:, -1] > 0]
    kth_valid = np.floor(rng.random(rows.size) * valid_up_to[:, -1])
    start = np.argmax(valid_up_to > kth_valid[:, None], axis=1)
    shuffled[rows[:, None], start[:, None] + np.arange(3)] = True
    trigram_rows.append(rows)
    trigram_starts.append(start)
  rows = np.concatenate(trigram_rows or [np.zeros(0, np.int64)])[:, None]
  starts = np.concatenate(trigram_starts or [np.zeros(0, np.int64)])[:, None]
  order = _TRIGRAM_SHUFFLES[rng.integers(0, len(_TRIGRAM_SHUFFLES), rows.shape[0])]
  noised = input_ids.astype(np.int32, copy=True)
  noised[rows, starts + np.arange(3)] = input_ids[rows, starts + order]
  packed = pack_predictions(shuffled, input_ids, max_predictions)
  return dict(input_ids=noised, shuffle_positions=packed["mlm_positions"],
              shuffle_targets=packed["mlm_targets"], shuffle_weights=packed["mlm_weights"])

