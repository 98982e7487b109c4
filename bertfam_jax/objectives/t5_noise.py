"""Host-side denoising for encoder-decoder objectives: T5's objective comparison and BART.

T5 (Raffel et al. 2020, §3.3) composes every unsupervised objective from three pieces of
google-research/text-to-text-transfer-transformer t5/data/preprocessors.py (spec
t5_objectives.md §3), here vectorised numpy over a batch of `n` rows:

  1. a noise mask   `NOISE_MASKS[name](lengths [n], max_len, rng, *, noise_density, **params)
                     -> [n, max_len] bool` (False on padding): `random_spans_noise_mask`,
                     `iid_noise_mask`, `random_prefix_noise_mask`;
  2. an inputs and a targets encoding
                    `ENCODINGS[name](tokens [n, L], lengths [n], noise_mask [n, L], rng, *,
                     sentinel_start, vocab_size, **params) -> (tokens [n, L'], lengths [n])`,
                     left-aligned and zero-padded: sentinels, drops, permutations, random tokens,
                     or `original` (the full uncorrupted sequence);
  3. `denoise` (the reference's `single_example_denoise`) draws the mask, then the inputs, then
     the targets, from one generator; `append_eos_after_trim` (seqio) then closes both sides.
The `ENCODINGS` keys are the reference function names and the `NOISE_MASKS` keys those names
without "_noise_mask" ("random_spans", "iid", "random_prefix"), so an objective row reads as the
gin file's `noise_mask_fn` / `inputs_fn` / `targets_fn`; extra parameters
(`mean_noise_span_length`, `random_prob`, ...) are passed as keywords or bound with
functools.partial. `random_spans_helper` gives the raw segment length and the targets length of
span corruption.

Sentinel k (k = 0, 1, ...) is `sentinel_start - k` (`<extra_id_k>`; the reference's
`vocab_size - 1 - k`). The reference draws with stateless per-example TF seeds; here every draw
comes from one `np.random.Generator`, in the reference's order (mask, inputs, targets), so the
distributions are the reference's and the exact draws are this module's (documented per function).

BART (fairseq/data/denoising_dataset.py, spec objectives.md §8) needs insertions, so it has its own
two functions: `bart_permute_sentences` and `bart_text_infilling`.
"""

from __future__ import annotations

import math

import numpy as np

from bertfam_jax.errors import ConfigError

# fairseq truncates the Poisson span-length distribution at the first k whose pmf is below this.
POISSON_PMF_CUTOFF = 1e-7
POISSON_MAX_LENGTH = 128


# ---------------------------------------------------------------------------------------------
# Shared helpers.
# ---------------------------------------------------------------------------------------------


def _valid(lengths: np.ndarray, width: int) -> np.ndarray:
  """[n, width] bool: True at the first lengths[i] columns of row i."""
  return np.arange(width)[None, :] < np.asarray(lengths)[:, None]


def _compact(tokens: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Left-aligns the kept tokens of every row (the reference's `tf.boolean_mask`).

  Args:
    tokens: [n, L] int ids.
    keep: [n, L] bool.

  Returns:
    ([n, L] int32 kept tokens in order, 0 after them; [n] int32 counts).
  """
  out = np.zeros(tokens.shape, np.int32)
  rows, cols = np.nonzero(keep)
  out[rows, (np.cumsum(keep, axis=1) - 1)[rows, cols]] = tokens[rows, cols]
  return out, np.count_nonzero(keep, axis=1).astype(np.int32)


def _smallest_keys_first(keys: np.ndarray) -> np.ndarray:
  """[n, U] int: per row, the columns ordered by ascending key (`seqio.stateless_shuffle` and
  `torch.randperm` are argsorts of uniform draws; invalid columns carry +inf and come last)."""
  return np.argsort(keys, axis=1, kind="stable")


# ---------------------------------------------------------------------------------------------
# Lengths.
# ---------------------------------------------------------------------------------------------


def random_spans_helper(inputs_length: int, noise_density: float, mean_noise_span_length: float,
                        extra_tokens_per_span_inputs: int = 1,
                        extra_tokens_per_span_targets: int = 1) -> tuple[int, int]:
  """The raw segment length whose span-corrupted inputs fill `inputs_length` (spec §3.4).

  preprocessors.py `random_spans_helper`: the largest raw length T (searching up from
  inputs_length - 1) whose encoded inputs, EOS included, still fit; for noise_density 0.5 the
  reference's "minor hack" then gives back one token when the targets would be the longer side.
  Python's `round` (half to even) as the reference; no clamps (unlike the mask function).

  Returns:
    (tokens_length: raw tokens to cut per example, targets_length: encoded targets with EOS).
  """
  def encoded_lengths(tokens_length):
    num_noise_tokens = int(round(tokens_length * noise_density))
    num_nonnoise_tokens = tokens_length - num_noise_tokens
    num_noise_spans = int(round(num_noise_tokens / mean_noise_span_length))
    return (num_nonnoise_tokens + num_noise_spans * extra_tokens_per_span_inputs + 1,
            num_noise_tokens + num_noise_spans * extra_tokens_per_span_targets + 1)

  tokens_length = inputs_length - 1
  while encoded_lengths(tokens_length + 1)[0] <= inputs_length:
    tokens_length += 1
  encoded_inputs_length, targets_length = encoded_lengths(tokens_length)
  if noise_density == 0.5 and targets_length > encoded_inputs_length:
    tokens_length -= 1
    targets_length -= 1
  return tokens_length, targets_length


# ---------------------------------------------------------------------------------------------
# Noise masks: fn(lengths [n], max_len, rng, *, noise_density, **params) -> [n, max_len] bool.
# ---------------------------------------------------------------------------------------------


def _random_segmentation(num_items: np.ndarray, num_segments: np.ndarray,
                         uniforms: np.ndarray) -> np.ndarray:
  """Per row, a uniformly random composition of num_items into num_segments positive parts.

  preprocessors.py `_random_segmentation`: the flags `[1] * (segments - 1) + [0] * (items -
  segments)` over the items - 1 gaps are shuffled by `stateless_shuffle` (gather at the argsort of
  uniform draws); a 1 at gap j starts a new segment at item j + 1. Row i shuffles with
  uniforms[i, :num_items[i] - 1], so the same draws give the reference's segmentation.

  Args:
    num_items: [n] int >= 1.
    num_segments: [n] int in [1, num_items].
    uniforms: [n, G] floats in [0, 1), G >= max(num_items) - 1.

  Returns:
    [n, max(num_segments)] int segment lengths, 0 past num_segments[i].
  """
  n, num_gaps = uniforms.shape
  gap = np.arange(num_gaps)[None, :]
  in_row = gap < num_items[:, None] - 1
  order = _smallest_keys_first(np.where(in_row, uniforms, np.inf))
  cut = in_row & (order < num_segments[:, None] - 1)
  starts_segment = np.concatenate([np.ones((n, 1), bool), cut], axis=1)   # [n, G + 1] items
  segment = np.cumsum(starts_segment, axis=1) - 1
  item_valid = _valid(num_items, num_gaps + 1)
  max_segments = int(num_segments.max(initial=1))
  flat = (np.arange(n)[:, None] * max_segments + segment)[item_valid]
  return np.bincount(flat, minlength=n * max_segments).reshape(n, max_segments)


def random_spans_noise_mask(lengths: np.ndarray, max_len: int, rng: np.random.Generator, *,
                            noise_density: float, mean_noise_span_length: float = 3.0,
                            random_roll: bool = False) -> np.ndarray:
  """T5 span corruption's mask: alternating non-noise / noise spans, non-noise first (spec §3.1).

  preprocessors.py `random_spans_noise_mask`, per row of length ℓ (raised to 2 to avoid
  degeneracy): noise = round(ℓ · density) clamped to [1, ℓ - 1] (float32 round half to even as
  `tf.round`), spans = max(1, round(noise / mean)); the noise tokens and the non-noise tokens are
  each split into `spans` random non-empty parts (`_random_segmentation`) and interleaved, so the
  mask starts with non-noise and ends with noise. `random_roll` rolls each row's mask by an offset
  uniform in [0, ℓ). A density of 0 gives no noise.

  Draws: 2 · n · (max(max_len, 2) - 1) uniforms (noise parts, then non-noise parts), then n
  integers if `random_roll`.

  Args:
    lengths: [n] int tokens per row.
    max_len: the mask width (>= max(lengths)).
    rng: the randomness.
    noise_density: fraction of tokens to corrupt (0.15).
    mean_noise_span_length: mean noise span length in tokens (3.0).
    random_roll: roll the mask (the reference's opt-in fix for its position bias).

  Returns:
    [n, max_len] bool, False on padding.
  """
  lengths = np.asarray(lengths, np.int64)
  n = lengths.shape[0]
  if noise_density == 0 or n == 0:
    return np.zeros((n, max_len), bool)
  length = np.maximum(lengths, 2)
  num_noise = np.round(length.astype(np.float32) * np.float32(noise_density)).astype(np.int64)
  num_noise = np.minimum(np.maximum(num_noise, 1), length - 1)
  num_spans = np.round(num_noise.astype(np.float32) / np.float32(mean_noise_span_length))
  num_spans = np.maximum(num_spans.astype(np.int64), 1)
  num_nonnoise = length - num_noise
  too_many = num_spans > num_nonnoise
  if too_many.any():
    i = int(np.argmax(too_many))
    raise ConfigError(
        f"random_spans_noise_mask: a row of {lengths[i]} tokens at noise_density={noise_density} "
        f"has {num_spans[i]} noise spans but only {num_nonnoise[i]} non-noise tokens to separate "
        "them; lower noise_density (<= 0.5) or raise mean_noise_span_length.")
  width = max(max_len, 2)
  noise_parts = _random_segmentation(num_noise, num_spans, rng.random((n, width - 1)))
  nonnoise_parts = _random_segmentation(num_nonnoise, num_spans, rng.random((n, width - 1)))
  interleaved = np.stack([nonnoise_parts, noise_parts], axis=2).reshape(n, -1)
  is_noise = np.tile(np.array([False, True]), interleaved.size // 2)
  flat = np.repeat(is_noise, interleaved.ravel())
  rows = np.repeat(np.arange(n), length)
  cols = np.arange(length.sum()) - np.repeat(np.cumsum(length) - length, length)
  mask = np.zeros((n, width), bool)
  mask[rows, cols] = flat
  if random_roll:
    offset = rng.integers(0, length)
    source = (np.arange(width)[None, :] - offset[:, None]) % np.maximum(lengths, 1)[:, None]
    mask = np.take_along_axis(mask, source, axis=1)
  return mask[:, :max_len] & _valid(lengths, max_len)


def iid_noise_mask(lengths: np.ndarray, max_len: int, rng: np.random.Generator, *,
                   noise_density: float) -> np.ndarray:
  """Each token is noise independently with probability noise_density (spec §3.2).

  preprocessors.py `iid_noise_mask` (`uniform < density`). Draws n · max_len uniforms.

  Returns:
    [n, max_len] bool, False on padding.
  """
  lengths = np.asarray(lengths)
  return (rng.random((lengths.shape[0], max_len)) < noise_density) & _valid(lengths, max_len)


def random_prefix_noise_mask(lengths: np.ndarray, max_len: int, rng: np.random.Generator, *,
                             noise_density: float = 0.5) -> np.ndarray:
  """Prefix LM: the first k tokens are the "noise" (the inputs), the rest the targets (§3.2).

  preprocessors.py `random_prefix_noise_mask`: with m = ℓ - 1, k is uniform on
  [min(m, max(1, round((1 - 2·density)·m))), m]; at density 0.5 (the paper's prefix LM) k is
  uniform on [1, ℓ - 1], so both sides are non-empty. Draws n integers.

  Returns:
    [n, max_len] bool, True on the prefix.
  """
  if noise_density > 0.5:
    raise ConfigError(
        f"random_prefix_noise_mask: noise_density={noise_density}; the prefix LM mask needs "
        "noise_density <= 0.5 (0.5 in T5's prefix_lm).")
  lengths = np.asarray(lengths, np.int64)
  max_inputs = lengths - 1
  min_inputs = np.minimum(max_inputs,
                          np.maximum(1, np.round((1 - 2 * noise_density) * max_inputs)))
  num_inputs = rng.integers(min_inputs.astype(np.int64), max_inputs + 1)
  return np.arange(max_len)[None, :] < num_inputs[:, None]


def mass_fragment_noise_mask(lengths: np.ndarray, max_len: int, rng: np.random.Generator, *,
                             noise_density: float = 0.5) -> np.ndarray:
  """MASS (Song et al. 2019; MASS-unsupNMT trainer.py `restricted_mask_sent` and
  `shuffle_segments`): one contiguous fragment of m = max(1, round(density · ℓ)) tokens,
  starting at the segment's first token with probability 0.2, ending at its last with 0.2, else
  at a start uniform on [0, ℓ − m], both ends included (there the fragment is shuffled among the
  ℓ − m unmasked tokens: ℓ − m + 1 places). So P(start 0) = P(end at ℓ) = 0.2 + 0.6 / (ℓ − m + 1).
  (MASS-supNMT's `mask_start`, `randint(1, end)`, never draws the last start: not this one.)
  Draws n uniforms, then n integers.

  Returns:
    [n, max_len] bool, True on the fragment.
  """
  lengths = np.asarray(lengths, np.int64)
  span = np.maximum(1, np.round(noise_density * lengths)).astype(np.int64)
  span = np.minimum(span, np.maximum(lengths, 1))
  coin = rng.random(len(lengths))
  last = lengths - span
  uniform = rng.integers(0, np.maximum(last, 0) + 1)   # an empty row (last −1) draws 0
  start = np.where(coin >= 0.8, 0, np.where(coin >= 0.6, last, uniform))
  columns = np.arange(max_len)[None, :]
  return (columns >= start[:, None]) & (columns < (start + span)[:, None]) & _valid(lengths,
                                                                                    max_len)


# Keys: the reference function names without "_noise_mask".
NOISE_MASKS = {
    "random_spans": random_spans_noise_mask,
    "iid": iid_noise_mask,
    "random_prefix": random_prefix_noise_mask,
    "mass_fragment": mass_fragment_noise_mask,
}
# objective.noise_mask's choices: these masks, and BART's text infilling (Poisson spans, each
# replaced by one mask; objectives/t5.py).
MASK_CHOICES = (*NOISE_MASKS, "bart_infilling")


# ---------------------------------------------------------------------------------------------
# Encodings: fn(tokens [n, L], lengths [n], noise_mask [n, L], rng, *, sentinel_start,
# vocab_size, **params) -> (tokens [n, L'], lengths [n]), left-aligned, 0-padded.
# ---------------------------------------------------------------------------------------------


def _span_starts(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """([n, L] bool first token of each run of `mask`, [n, L] bool its later tokens)."""
  previous = np.zeros_like(mask)
  previous[:, 1:] = mask[:, :-1]
  return mask & ~previous, mask & previous


def original(tokens, lengths, noise_mask, rng, *, sentinel_start, vocab_size):
  """The uncorrupted sequence (the reference's `targets_fn=None`: the "full" target)."""
  del noise_mask, rng, sentinel_start, vocab_size
  return _compact(tokens, _valid(lengths, tokens.shape[1]))


def noise_token_to_sentinel(tokens, lengths, noise_mask, rng, *, sentinel_start, vocab_size):
  """Every noise token -> the one shared sentinel `sentinel_start` (MASS-style, encoding "m")."""
  del rng, vocab_size
  return _compact(np.where(noise_mask, sentinel_start, tokens), _valid(lengths, tokens.shape[1]))


def noise_span_to_sentinel(tokens, lengths, noise_mask, rng, *, sentinel_start, vocab_size):
  """Each run of noise tokens -> one shared sentinel `sentinel_start` (encoding "s")."""
  del rng, vocab_size
  _, later = _span_starts(noise_mask)
  return _compact(np.where(noise_mask, sentinel_start, tokens),
                  _valid(lengths, tokens.shape[1]) & ~later)


def nonnoise_span_to_sentinel(tokens, lengths, noise_mask, rng, *, sentinel_start, vocab_size):
  """`noise_span_to_sentinel` on the complement (non-noise runs -> the shared sentinel)."""
  complement = ~noise_mask & _valid(lengths, tokens.shape[1])
  return noise_span_to_sentinel(tokens, lengths, complement, rng, sentinel_start=sentinel_start,
                                vocab_size=vocab_size)


def noise_span_to_unique_sentinel(tokens, lengths, noise_mask, rng, *, sentinel_start,
                                  vocab_size):
  """The k-th run of noise (k = 0, 1, ...) -> sentinel `sentinel_start - k`; its later tokens
  are dropped (encoding "u"). E.g. sentinel_start 999, `[10..15]`, mask TTFFTF ->
  `[999, 12, 13, 998, 15]`."""
  del rng, vocab_size
  first, later = _span_starts(noise_mask)
  sentinel = sentinel_start + 1 - np.cumsum(first, axis=1)
  return _compact(np.where(first, sentinel, tokens), _valid(lengths, tokens.shape[1]) & ~later)


def nonnoise_span_to_unique_sentinel(tokens, lengths, noise_mask, rng, *, sentinel_start,
                                     vocab_size):
  """`noise_span_to_unique_sentinel` on the complement; numbering restarts at sentinel_start,
  so sentinel k of the targets precedes the tokens that sentinel k replaced in the inputs."""
  complement = ~noise_mask & _valid(lengths, tokens.shape[1])
  return noise_span_to_unique_sentinel(tokens, lengths, complement, rng,
                                       sentinel_start=sentinel_start, vocab_size=vocab_size)


def drop_noise_tokens(tokens, lengths, noise_mask, rng, *, sentinel_start, vocab_size):
  """Keeps the non-noise tokens only (encoding "d" inputs; prefix LM targets)."""
  del rng, sentinel_start, vocab_size
  return _compact(tokens, _valid(lengths, tokens.shape[1]) & ~noise_mask)


def drop_nonnoise_tokens(tokens, lengths, noise_mask, rng, *, sentinel_start, vocab_size):
  """Keeps the noise tokens only (encoding "d" targets; prefix LM inputs)."""
  del rng, sentinel_start, vocab_size
  return _compact(tokens, _valid(lengths, tokens.shape[1]) & noise_mask)


def permute_noise_tokens(tokens, lengths, noise_mask, rng, *, sentinel_start, vocab_size):
  """Shuffles the noise tokens among the noise positions; the rest stay (deshuffling).

  preprocessors.py `permute_noise_tokens`: the j-th noise position receives the noise token at
  index argsort(u)[j] of the row's noise tokens, u its first (#noise) uniforms of n · L drawn.
  """
  del sentinel_start, vocab_size
  n, width = tokens.shape
  noise_only, num_noise = _compact(tokens, noise_mask)
  order = _smallest_keys_first(np.where(_valid(num_noise, width), rng.random((n, width)),
                                        np.inf))
  shuffled = np.take_along_axis(noise_only, order, axis=1)
  rank = np.maximum(np.cumsum(noise_mask, axis=1) - 1, 0)
  permuted = np.where(noise_mask, np.take_along_axis(shuffled, rank, axis=1), tokens)
  return _compact(permuted, _valid(lengths, width))


def noise_token_to_gathered_token(tokens, lengths, noise_mask, rng, *, sentinel_start,
                                  vocab_size):
  """Each noise token -> the token at a uniformly random position of its row (encoding "g").
  Draws n · L integers."""
  del sentinel_start, vocab_size
  n, width = tokens.shape
  source = rng.integers(0, np.maximum(lengths, 1)[:, None], size=(n, width))
  gathered = np.where(noise_mask, np.take_along_axis(tokens, source, axis=1), tokens)
  return _compact(gathered, _valid(lengths, width))


def noise_token_to_random_token(tokens, lengths, noise_mask, rng, *, sentinel_start, vocab_size,
                                num_reserved_tokens=3):
  """Each noise token -> an id uniform on [num_reserved_tokens, vocab_size) (encoding "r").

  The reference reserves T5's pad, EOS and unk (ids 0-2); the objective passes the number of
  leading special ids of its own vocabulary (`objectives.t5.reserved_ids`: 5 in ours, where EOS
  is [SEP] = 3 and [MASK] = 4), so that no special token is ever drawn. As the reference,
  vocab_size includes the sentinels, so a random token may be a sentinel. Draws n · L integers.
  """
  del sentinel_start
  random_tokens = rng.integers(num_reserved_tokens, vocab_size, size=tokens.shape)
  return _compact(np.where(noise_mask, random_tokens, tokens), _valid(lengths, tokens.shape[1]))


def noise_token_to_random_token_or_sentinel(tokens, lengths, noise_mask, rng, *, sentinel_start,
                                            vocab_size, random_prob=0.1, num_reserved_tokens=3):
  """BERT-style (iid_15_r10s90_f): each noise token -> a random token with probability
  random_prob, else the shared sentinel; never left unchanged (spec §3.3).

  Draws n · L uniforms (the per-position coin, as the reference draws it for every position),
  then the `noise_token_to_random_token` draws: `noise_token_to_sentinel_keep_or_random` with
  nothing kept.
  """
  return noise_token_to_sentinel_keep_or_random(
      tokens, lengths, noise_mask, rng, sentinel_start=sentinel_start, vocab_size=vocab_size,
      random_prob=random_prob, keep_prob=0.0, num_reserved_tokens=num_reserved_tokens)


def noise_token_to_sentinel_keep_or_random(tokens, lengths, noise_mask, rng, *, sentinel_start,
                                           vocab_size, random_prob=0.1, keep_prob=0.1,
                                           num_reserved_tokens=3):
  """BERT's and MASS's 80/10/10 (MASS `word_mask_keep_rand` 0.8,0.1,0.1): each noise token ->
  a random token with probability random_prob, itself with keep_prob, else the shared sentinel
  (the [MASK]). Draws n · L uniforms, then `noise_token_to_random_token`'s."""
  coin = rng.random(tokens.shape)
  random_tokens, _ = noise_token_to_random_token(tokens, lengths, noise_mask, rng,
                                                 sentinel_start=sentinel_start,
                                                 vocab_size=vocab_size,
                                                 num_reserved_tokens=num_reserved_tokens)
  sentinels, sentinel_lengths = noise_token_to_sentinel(
      tokens, lengths, noise_mask, rng, sentinel_start=sentinel_start, vocab_size=vocab_size)
  kept = np.where(coin < random_prob + keep_prob, tokens, sentinels)
  return np.where(coin < random_prob, random_tokens, kept).astype(np.int32), sentinel_lengths


ENCODINGS = {
    "original": original,
    "noise_token_to_sentinel": noise_token_to_sentinel,
    "noise_span_to_sentinel": noise_span_to_sentinel,
    "nonnoise_span_to_sentinel": nonnoise_span_to_sentinel,
    "noise_span_to_unique_sentinel": noise_span_to_unique_sentinel,
    "nonnoise_span_to_unique_sentinel": nonnoise_span_to_unique_sentinel,
    "drop_noise_tokens": drop_noise_tokens,
    "drop_nonnoise_tokens": drop_nonnoise_tokens,
    "permute_noise_tokens": permute_noise_tokens,
    "noise_token_to_gathered_token": noise_token_to_gathered_token,
    "noise_token_to_random_token": noise_token_to_random_token,
    "noise_token_to_random_token_or_sentinel": noise_token_to_random_token_or_sentinel,
    "noise_token_to_sentinel_keep_or_random": noise_token_to_sentinel_keep_or_random,
}


# ---------------------------------------------------------------------------------------------
# Composition.
# ---------------------------------------------------------------------------------------------


def denoise(tokens: np.ndarray, lengths: np.ndarray, rng: np.random.Generator, *,
            noise_density: float, noise_mask_fn, inputs_fn, targets_fn=original,
            sentinel_start: int, vocab_size: int) -> dict[str, np.ndarray]:
  """One denoising objective over a batch (preprocessors.py `denoise` / `single_example_denoise`).

  Draws the noise mask, then encodes the inputs, then the targets (the default, `original`, is
  the reference's `targets_fn=None`: the full sequence), all from `rng` in that order.

  Args:
    tokens: [n, L] int raw token ids (no EOS), 0-padded.
    lengths: [n] int tokens per row.
    rng: the randomness.
    noise_density: passed to the mask function.
    noise_mask_fn: a `NOISE_MASKS` function (other parameters bound with functools.partial).
    inputs_fn, targets_fn: `ENCODINGS` functions.
    sentinel_start: id of `<extra_id_0>`; sentinel k is sentinel_start - k.
    vocab_size: ids drawn as random tokens lie below it.

  Returns:
    dict(inputs [n, Li'] int32, input_lengths [n] int32, targets [n, Lt'] int32,
    target_lengths [n] int32), without EOS (see `append_eos_after_trim`).
  """
  lengths = np.asarray(lengths)
  noise_mask = noise_mask_fn(lengths, tokens.shape[1], rng, noise_density=noise_density)
  encode = dict(sentinel_start=sentinel_start, vocab_size=vocab_size)
  inputs, input_lengths = inputs_fn(tokens, lengths, noise_mask, rng, **encode)
  targets, target_lengths = targets_fn(tokens, lengths, noise_mask, rng, **encode)
  return dict(inputs=inputs, input_lengths=input_lengths, targets=targets,
              target_lengths=target_lengths)


def append_eos_after_trim(tokens: np.ndarray, lengths: np.ndarray, max_len: int,
                          eos_id: int) -> tuple[np.ndarray, np.ndarray]:
  """seqio `append_eos_after_trim`: keep the first max_len - 1 tokens, then append EOS.

  Args:
    tokens: [n, L] int ids, left-aligned.
    lengths: [n] int.
    max_len: the feature length (EOS included).
    eos_id: EOS.

  Returns:
    ([n, max_len] int32, 0-padded; [n] int32 lengths, each <= max_len).
  """
  n, width = tokens.shape
  kept = np.minimum(np.asarray(lengths), max_len - 1)
  out = np.zeros((n, max_len), np.int32)
  copy = min(width, max_len)
  out[:, :copy] = np.where(_valid(kept, copy), tokens[:, :copy], 0)
  out[np.arange(n), kept] = eos_id
  return out, (kept + 1).astype(np.int32)


# ---------------------------------------------------------------------------------------------
# BART (fairseq denoising_dataset.py): sentence permutation, then text infilling.
# ---------------------------------------------------------------------------------------------


def bart_permute_sentences(tokens: np.ndarray, lengths: np.ndarray, sentence_start: np.ndarray,
                           rng: np.random.Generator, *, ratio: float = 1.0) -> np.ndarray:
  """BART sentence permutation (DenoisingDataset.permute_sentences, spec objectives.md §8).

  A sentence runs from a `sentence_start` token to the next one (the last to the row's end), and
  the row's first token always begins one: a segment cut mid-sentence permutes its leading
  fragment as a sentence, as fairseq's first sentence runs from after `<s>` to the first full
  stop (fairseq finds sentences at full stops, closing the last one artificially, where packing
  gives them here; its `<s>` is not in our segments).
  ceil(#sentences · ratio) sentences chosen uniformly are permuted uniformly among their slots
  (`ordering[subs] = subs[randperm(k)]`); ratio 1.0 shuffles all. Draws 2 · n · S uniforms
  (S = most sentences in a row).

  Args:
    tokens: [n, L] int ids.
    lengths: [n] int.
    sentence_start: [n, L] bool, True at each sentence's first token.
    rng: the randomness.
    ratio: fraction of sentences permuted (`--permute-sentences`, 1.0 in BART).

  Returns:
    [n, L] int32: the permuted rows (lengths unchanged).
  """
  n, width = tokens.shape
  valid = _valid(lengths, width)
  starts = sentence_start & valid
  starts[:, 0] = valid[:, 0]
  num_sentences = np.count_nonzero(starts, axis=1)
  max_sentences = max(int(num_sentences.max(initial=0)), 1)
  sentence = np.cumsum(starts, axis=1) - 1                     # -1 before the first start
  in_sentence = valid & (sentence >= 0)
  rows, cols = np.nonzero(in_sentence)
  sizes = np.zeros((n, max_sentences), np.int64)
  np.add.at(sizes, (rows, sentence[rows, cols]), 1)
  num_to_permute = np.ceil(num_sentences * 2 * ratio / 2.0).astype(np.int64)
  slot = np.arange(max_sentences)[None, :]
  substitutions = _smallest_keys_first(
      np.where(slot < num_sentences[:, None], rng.random((n, max_sentences)), np.inf))
  shuffle = _smallest_keys_first(
      np.where(slot < num_to_permute[:, None], rng.random((n, max_sentences)), np.inf))
  ordering = np.broadcast_to(slot, (n, max_sentences)).copy()    # slot q shows sentence ordering[q]
  moved = slot < num_to_permute[:, None]
  moved_rows = np.nonzero(moved)[0]
  ordering[moved_rows, substitutions[moved]] = np.take_along_axis(substitutions, shuffle,
                                                                  axis=1)[moved]
  slot_of = np.empty_like(ordering)
  np.put_along_axis(slot_of, ordering, slot + np.zeros_like(ordering), axis=1)
  new_sizes = np.take_along_axis(sizes, ordering, axis=1)
  new_slot_start = np.cumsum(new_sizes, axis=1) - new_sizes
  old_start = np.cumsum(sizes, axis=1) - sizes
  first = np.argmax(starts, axis=1)                                # offset of sentence 0
  s = sentence[rows, cols]
  new_cols = first[rows] + new_slot_start[rows, slot_of[rows, s]] + (cols - first[rows] -
                                                                    old_start[rows, s])
  out = np.where(valid, tokens, 0).astype(np.int32)
  out[rows, new_cols] = tokens[rows, cols]
  return out


def poisson_span_distribution(poisson_lambda: float) -> np.ndarray:
  """fairseq's span-length distribution: Poisson(λ) pmf for k = 0, 1, ... up to and including
  the first k whose pmf drops below 1e-7 (λ = 3: 18 values), renormalised.

  Returns:
    [K] float64 probabilities of lengths 0..K-1.
  """
  probs, term = [], math.exp(-poisson_lambda)
  for k in range(POISSON_MAX_LENGTH):
    probs.append(term)
    term *= poisson_lambda / (k + 1)
    if probs[-1] < POISSON_PMF_CUTOFF:
      break
  probs = np.asarray(probs)
  return probs / probs.sum()


def _draw_span_lengths(budget: np.ndarray, probs: np.ndarray,
                       rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """fairseq's length draw: i.i.d. lengths until their sum reaches the budget, the last one
  trimmed to it. Rows draw blocks of max(budget) lengths until every row is covered.

  Returns:
    ([n, D] int lengths, 0 past the ones used; [n] int number used, 0 where the budget is 0).
  """
  n = budget.shape[0]
  block = max(int(budget.max(initial=0)), 1)
  cdf = np.cumsum(probs)
  draws = np.zeros((n, 0), np.int64)
  while (draws.sum(axis=1) < budget).any():
    new = np.searchsorted(cdf, rng.random((n, block)), side="right")
    draws = np.concatenate([draws, np.minimum(new, probs.size - 1)], axis=1)
  if draws.shape[1] == 0:
    return np.zeros((n, 1), np.int64), np.zeros(n, np.int64)
  total = np.cumsum(draws, axis=1)
  used = np.where(budget > 0, np.argmax(total >= budget[:, None], axis=1) + 1, 0)
  before_last = np.take_along_axis(total, np.maximum(used - 2, 0)[:, None], axis=1)[:, 0]
  before_last = np.where(used >= 2, before_last, 0)
  column = np.arange(draws.shape[1])[None, :]
  trimmed = np.where(column < (used - 1)[:, None], draws, 0)
  last = np.maximum(used - 1, 0)
  trimmed[np.arange(n), last] = np.where(used > 0, budget - before_last, 0)
  return trimmed, used


def bart_text_infilling(tokens: np.ndarray, lengths: np.ndarray, word_start: np.ndarray,
                        rng: np.random.Generator, *, mask_ratio: float, poisson_lambda: float,
                        mask_id: int, random_ratio: float,
                        vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
  """BART text infilling (DenoisingDataset.add_whole_word_mask with `--mask-length span-poisson
  --replace-length 1`, then add_insertion_noise for the zero-length spans; spec §8).

  fairseq frames each row `<s> text </s>` and never masks, deletes or inserts before `<s>` or
  after `</s>`; our segments are bare text, so each row is framed here with a placeholder on
  either side, noised, and unframed: the text's own first and last words can be masked, and an
  insertion can open or close it. Per framed row (its first and last token never word starts):
    1. budget = ceil(#word starts · mask_ratio), in float32 as fairseq's tensor product;
    2. span lengths (in words) ~ `poisson_span_distribution`, drawn until their sum reaches the
       budget, the last trimmed; zero-length spans become insertions;
    3. the positive spans start at distinct word starts chosen uniformly; each covers its start
       word and the following words up to its length, never the last token. Its first token
       becomes `mask_id` (with probability random_ratio a uniform id in [1, vocab_size)
       instead) and its other tokens are deleted; spans may overlap (a start inside another
       span is deleted);
    4. k insertions (k = #zero-length spans) go to ceil(T · (k / T)) distinct positions of the
       new row of length T + that, never first or last; ceil(· random_ratio) of them, chosen
       uniformly, are random tokens, the others `mask_id`.
  Draws: Poisson blocks, then n · L uniforms (starts), n · S (random coins), n · S integers,
  then n · L' uniforms (insert slots), n · L' integers (random inserts).

  Args:
    tokens: [n, L] int ids.
    lengths: [n] int.
    word_start: [n, L] bool, word-initial tokens (whole-word masking).
    rng: the randomness.
    mask_ratio: fraction of words masked (`--mask`, 0.3).
    poisson_lambda: mean span length in words (3 in the paper, 3.5 in the circulated command).
    mask_id: the mask token.
    random_ratio: probability a mask is a random token instead (`--mask-random`, 0.1).
    vocab_size: random tokens are uniform on [1, vocab_size).

  Returns:
    ([n, L'] int32 noised rows, 0-padded, L' >= L; [n] int32 lengths).
  """
  lengths = np.asarray(lengths, np.int64)
  framed = np.pad(np.where(_valid(lengths, tokens.shape[1]), tokens, 0), ((0, 0), (1, 1)))
  framed_starts = np.pad(word_start, ((0, 0), (1, 1)))    # the frame is never a word start
  out, out_lengths = _infill_framed(
      framed, np.where(lengths > 0, lengths + 2, 0), framed_starts, rng, mask_ratio=mask_ratio,
      poisson_lambda=poisson_lambda, mask_id=mask_id, random_ratio=random_ratio,
      vocab_size=vocab_size)
  out_lengths = np.maximum(out_lengths - 2, 0)
  out = out[:, 1:-1]
  return (np.where(_valid(out_lengths, out.shape[1]), out, 0).astype(np.int32),
          out_lengths.astype(np.int32))


def _infill_framed(tokens, lengths, word_start, rng, *, mask_ratio, poisson_lambda, mask_id,
                   random_ratio, vocab_size):
  """`bart_text_infilling` of rows framed as fairseq's (steps 1-4 of its docstring): the first
  and last token of each row are the frame."""
  n, width = tokens.shape
  rows = np.arange(n)
  valid = _valid(lengths, width)
  starts = word_start & valid
  starts[:, 0] = False
  starts[rows, np.maximum(lengths - 1, 0)] = False
  num_words = np.count_nonzero(starts, axis=1)
  budget = np.ceil(num_words.astype(np.float32) * np.float32(mask_ratio)).astype(np.int64)

  # 2. Span lengths; zero lengths are insertions.
  drawn, used = _draw_span_lengths(budget, poisson_span_distribution(poisson_lambda), rng)
  span_words, num_spans = _compact(drawn, drawn > 0)
  max_spans = max(int(num_spans.max(initial=0)), 1)   # <= max(budget) <= max(num_words) < L
  span_words = span_words[:, :max_spans].astype(np.int64)
  num_inserts = used - num_spans

  # 3. Span starts and ends; the first token is replaced, the rest deleted.
  order = _smallest_keys_first(np.where(starts, rng.random((n, width)), np.inf))
  start = order[:, :max_spans]
  is_span = np.arange(max_spans)[None, :] < num_spans[:, None]
  word_positions, _ = _compact(np.broadcast_to(np.arange(width), (n, width)), starts)
  word_positions = np.concatenate([word_positions, np.zeros((n, 1), np.int32)], axis=1)
  rank = np.cumsum(starts, axis=1) - 1
  end_rank = np.take_along_axis(rank, start, axis=1) + span_words
  end = np.where(end_rank < num_words[:, None],
                 np.take_along_axis(word_positions, np.minimum(end_rank, width), axis=1),
                 (lengths - 1)[:, None])
  use_random = rng.random((n, max_spans)) < random_ratio
  random_ids = rng.integers(1, vocab_size, size=(n, max_spans))
  span_rows = np.broadcast_to(rows[:, None], (n, max_spans))[is_span]
  noised = tokens.astype(np.int32).copy()
  noised[span_rows, start[is_span]] = np.where(use_random, random_ids, mask_id)[is_span]
  interior = np.zeros((n, width + 1), np.int64)
  np.add.at(interior, (span_rows, start[is_span] + 1), 1)
  np.add.at(interior, (span_rows, end[is_span]), -1)
  deleted = np.cumsum(interior, axis=1)[:, :width] > 0
  kept, kept_lengths = _compact(noised, valid & ~deleted)

  # 4. Insertions.
  with np.errstate(invalid="ignore", divide="ignore"):
    num_new = np.where(num_inserts > 0,
                       np.ceil(kept_lengths * (num_inserts / kept_lengths)), 0).astype(np.int64)
  out_lengths = kept_lengths + num_new
  out_width = max(width, int(out_lengths.max(initial=0)))
  position = np.arange(out_width)[None, :]
  candidate = (position >= 1) & (position <= (out_lengths - 2)[:, None])
  slot_order = _smallest_keys_first(np.where(candidate, rng.random((n, out_width)), np.inf))
  insert_rank = np.empty_like(slot_order)
  np.put_along_axis(insert_rank, slot_order, position + np.zeros_like(slot_order), axis=1)
  inserted = insert_rank < num_new[:, None]
  num_random = np.ceil(num_new * random_ratio).astype(np.int64)
  insert_ids = np.where(insert_rank < num_random[:, None],
                        rng.integers(1, vocab_size, size=(n, out_width)), mask_id)
  source = np.maximum(np.cumsum(~inserted, axis=1) - 1, 0)
  padded = np.zeros((n, out_width), np.int32)
  padded[:, :width] = kept
  out = np.where(inserted, insert_ids, np.take_along_axis(padded, np.minimum(source, out_width - 1),
                                                          axis=1))
  out = np.where(_valid(out_lengths, out_width), out, 0).astype(np.int32)
  return out, out_lengths.astype(np.int32)
