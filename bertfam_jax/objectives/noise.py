"""Host-side masked-LM noising: choose positions, corrupt them, pack the predictions.

Everything here is vectorised numpy over a batch of packed examples (`n` rows of length `L`) and
takes an explicit `np.random.Generator`, so a mask is a pure function of (batch, generator state).

The masking is three composable steps, each with its own function:

  1. select    `select_uniform`: which units to predict, as a boolean map. A unit is one token
               today; whole-word / n-gram / span schemes choose words or spans and expand them to
               a token map `[n, L]`, then reuse steps 2 and 3 unchanged.
  2. pack      `pack_predictions`: a token map `[n, L]` -> `mlm_positions / mlm_targets /
               mlm_weights` `[n, P]` (positions ascending, zero-padded; see objectives/__init__).
  3. corrupt   `corrupt_positions`: the per-token [MASK] / keep / random-token draw.

`mask_tokens` composes the three; `bert_mask` and `roberta_mask` are the two reference rules
(spec §1.1 step 9, §2 "Data" item 2) expressed as a candidate map, a per-row budget and a
random-token distribution.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
  `mask_rate * len`. There is no floor of 1 and no cap here: `mask_tokens` caps by P.

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
  p_mask, p_keep, p_random = replace_probs
  if min(replace_probs) < 0 or not np.isclose(p_mask + p_keep + p_random, 1.0):
    raise ValueError(f"replace_probs={tuple(replace_probs)} must be non-negative and sum to 1.")
  real = weights > 0
  r = rng.random(positions.shape)
  to_mask = real & (r < p_mask)
  to_random = real & (r >= p_mask + p_keep)
  rows = np.broadcast_to(np.arange(positions.shape[0])[:, None], positions.shape)
  noised = input_ids.astype(np.int32, copy=True)
  noised[rows[to_mask], positions[to_mask]] = mask_id
  noised[rows[to_random], positions[to_random]] = sample_tokens(
      int(np.count_nonzero(to_random)), rng, vocab_size=vocab_size, weights=random_token_weights)
  return noised


def mask_tokens(input_ids: np.ndarray, maskable: np.ndarray, num_to_predict: np.ndarray,
                rng: np.random.Generator, *, max_predictions: int, mask_id: int,
                replace_probs: Sequence[float] = BERT_REPLACE_PROBS,
                random_token_weights: np.ndarray | None = None,
                vocab_size: int) -> dict[str, np.ndarray]:
  """Token-level masked-LM noising: select, pack, corrupt.

  Chooses `min(num_to_predict, #maskable, max_predictions)` positions per row uniformly without
  replacement among `maskable`, then corrupts each chosen position with `replace_probs`.

  Args:
    input_ids: [n, L] int32 original tokens.
    maskable: [n, L] bool, positions that may be chosen (never padding).
    num_to_predict: [n] int32 per-row budget; anything above `max_predictions` is dropped.
    rng: the generator; the result is a pure function of its state and the inputs.
    max_predictions: P, the number of prediction slots.
    mask_id: the [MASK] id.
    replace_probs: (p_mask, p_keep, p_random).
    random_token_weights: [V] weights for random replacement tokens; None = uniform over V.
    vocab_size: V.

  Returns:
    input_ids [n, L] int32 (noised), mlm_positions [n, P] int32, mlm_targets [n, P] int32,
    mlm_weights [n, P] float32.
  """
  budget = np.minimum(num_to_predict, max_predictions)
  chosen = select_uniform(maskable, budget, rng)
  predictions = pack_predictions(chosen, input_ids, max_predictions)
  noised = corrupt_positions(
      input_ids, predictions["mlm_positions"], predictions["mlm_weights"], rng, mask_id=mask_id,
      replace_probs=replace_probs, vocab_size=vocab_size,
      random_token_weights=random_token_weights)
  return dict(input_ids=noised, **predictions)


def bert_mask(examples: Mapping[str, np.ndarray], rng: np.random.Generator, *, mask_rate: float,
              max_predictions: int, special_ids: Sequence[int], mask_id: int,
              vocab_size: int) -> dict[str, np.ndarray]:
  """BERT's static masking rule (create_pretraining_data.py create_masked_lm_predictions).

  Candidates are the non-pad tokens that are not in `special_ids` ([CLS]/[SEP] are never
  predicted); the budget is `bert_num_to_predict`; random replacements are uniform over the whole
  vocabulary, specials included (BERT draws from the full vocab list).

  Args:
    examples: batch with input_ids [n, L] and input_mask [n, L]; other keys (segment_ids,
      sentence_label, ...) pass through unchanged.
    rng: the generator.
    mask_rate: 0.15 in BERT.
    max_predictions: P (`max_predictions_per_seq`).
    special_ids: ids that are never predicted, e.g. (cls_id, sep_id).
    mask_id: the [MASK] id.
    vocab_size: V.

  Returns:
    `examples` with input_ids replaced by the noised ids and mlm_positions / mlm_targets /
    mlm_weights [n, P] added.
  """
  input_ids, input_mask = examples["input_ids"], examples["input_mask"]
  maskable = (input_mask > 0) & ~np.isin(input_ids, np.asarray(special_ids))
  num_to_predict = bert_num_to_predict(input_mask, mask_rate, max_predictions)
  return {**examples, **mask_tokens(
      input_ids, maskable, num_to_predict, rng, max_predictions=max_predictions,
      mask_id=mask_id, vocab_size=vocab_size)}


def roberta_mask(examples: Mapping[str, np.ndarray], rng: np.random.Generator, *,
                 mask_rate: float, max_predictions: int, mask_id: int, vocab_size: int,
                 num_special: int) -> dict[str, np.ndarray]:
  """fairseq's dynamic masking rule (fairseq/data/mask_tokens_dataset.py, RoBERTa defaults).

  Candidates are ALL non-pad tokens (`<s>` and `</s>` can be predicted); the budget is
  `fairseq_num_to_predict`; random replacements are uniform over the dictionary with its first
  `num_special` entries zero-weighted (`<s>`, `<pad>`, `</s>`, `<unk>` in fairseq).

  Args:
    examples: batch with input_ids [n, L] and input_mask [n, L]; other keys pass through.
    rng: the generator.
    mask_rate: 0.15 in RoBERTa.
    max_predictions: P; a budget above it is truncated (the caller logs the effective rate).
    mask_id: the `<mask>` id.
    vocab_size: V, the dictionary size.
    num_special: leading dictionary entries never drawn as random replacements.

  Returns:
    `examples` with input_ids replaced by the noised ids and mlm_positions / mlm_targets /
    mlm_weights [n, P] added.
  """
  input_ids, input_mask = examples["input_ids"], examples["input_mask"]
  num_to_predict = fairseq_num_to_predict(input_mask, mask_rate, rng)
  random_token_weights = np.ones(vocab_size)
  random_token_weights[:num_special] = 0.0
  return {**examples, **mask_tokens(
      input_ids, input_mask > 0, num_to_predict, rng, max_predictions=max_predictions,
      mask_id=mask_id, random_token_weights=random_token_weights, vocab_size=vocab_size)}
