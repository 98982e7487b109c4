"""XLNet's permutation language modelling (Yang et al. 2019, arXiv:1906.08237); spec objectives §6.

Host side, numpy, a port of zihangdai/xlnet data_utils.py (the reference; every function names the
one it ports). Deterministic given the `np.random.Generator`; the reference's Python `random` and
`np.random` draws become draws from that one generator, in the same order within each function.

  streams    `packing.xlnet_streams` (_create_data + batchify + create_tfrecords' bi_data): a chunk's
             documents become one token stream (sentence ids alternating 0/1 per sentence, an
             <eod> after each document sharing its last sentence's id) cut into R parallel rows;
             with bi_data the first R/2 rows are the forward stream and rows R/2.. the same rows
             reversed (row R/2 + r = row r reversed; the reference interleaves the halves per TPU
             core, which only matters there: here every row carries its own `direction`).
  windows    `xlnet_features` (create_tfrecords' loop): window t of a row starts at t·reuse_len,
             `[R: reuse_len tokens] A <sep> B <sep> <cls>` with seg ids 0 / 0 0 / 1 1 / 2;
             A|B = `split_a_and_b` (_split_a_and_b: natural continuation or a random B of the row,
             label unused). A chunk whose rows run out stops every row at the same window, so a
             chunk gives W·R examples in STEP-MAJOR order (window 0 of rows 0..R−1, window 1, ...):
             consecutive batches of R rows continue every row, which is what the memory needs.
  targets    `sample_targets` (_sample_mask): per half (the first reuse_len tokens: goal
             num_predict − num_predict // 2 = 43; the rest: 42), n-gram spans n ∈ 1..max_ngram with
             p ∝ 1/n, each in a context of n·alpha/beta pieces, topped up with random single
             positions to exactly the goal; reversed rows are sampled right to left.
  order      `sample_ranks` + `perm_ranks` / `local_perm` (_local_perm): a permutation per half;
             non-targets first (rank −1), targets and <sep>/<cls> by their sampled rank.
  masks      `two_stream_features` (the parser): perm_mask [L, L] (1 = query i may NOT see key j),
             first-half rows blocked from every second-half column, target_mapping [P, L] one-hot
             rows of the targets in increasing position order, zero rows as padding.

Batch keys (an example = one window; a [L, L] mask per example would be 1 MB of host memory and
transfer, so the masks travel as ranks and are built on the device by `device_masks`):
  input_ids        [n, L] int32   the window; never noised (the query stream hides the targets).
  segment_ids      [n, L] int32   0 for R, A and the first <sep>; 1 for B and the second; 2 <cls>.
  input_mask       [n, L] int32   1 (windows are always full).
  perm_rank        [n, L] int32   the reference's `rev_index` per half: −1 for non-targets, else
                                  the position's rank in its half's factorisation order.
  target_positions [n, P] int32   positions of the targets, ascending, 0-padded.
  target_ids       [n, P] int32   their tokens (the reference's shifted-back `target`), 0-padded.
  target_weights   [n, P] float32 1.0 real, 0.0 padding (the reference's `target_mask`).
  direction        [n]    float32 +1 forward rows, −1 reversed rows (bi_data).

Pipeline contract (data/pipeline.py): a chunk's documents are packed by
`packing.xlnet_streams(docs, R, bi_data=objective.bi_data, eod_id=packing.eod_id(tokenizer),
use_eod=objective.use_eod)` with R = the rows of one batch of the data shard; `features_fn`
(make_features) turns that dict into the chunk's W·R examples, which REPLACE the packed rows
(`replace_examples`) and must be batched in the order given (`ordered`: no example shuffle), R
per batch, so that a chunk's batches are its windows 0, 1, ..., W − 1. The memory of row r then
always holds the previous window of the same stream, except at a chunk's first batch, where it
holds the end of another chunk's row (as the reference's memory runs on across its files).

Loss (function_builder.py two_stream_loss): Σ CE(query-stream logits, target)·w / Σ w. The memory
(Transformer-XL recurrence) is the train state's carry: `init_carry` zeros, `loss_fn(...,
carry=mems)` returns the next memory.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from bertfam_jax import config_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.models import xlnet as xlnet_model
from bertfam_jax.objectives import losses

# Every window ends with <sep> and <sep> <cls> around B: A|B get seq_len − reuse_len − 3 tokens.
_FUNCTIONAL_TOKENS = 3


# -------------------------------------------------------------------------------------------------
# Streams: _create_data + batchify + create_tfrecords' bi_data layout.
# -------------------------------------------------------------------------------------------------


def split_a_and_b(sent_ids: np.ndarray, begin_idx: int, tot_len: int,
                  rng: np.random.Generator) -> tuple[int, int, int, int, int] | None:
  """_split_a_and_b(extend_target=True) on one row: where A and B lie.

  A starts at begin_idx. With probability 1/2, or when no sentence boundary lies within tot_len
  tokens, A ends at a random boundary (or runs on) and B is a random span of the row of the
  remaining length, widened to sentence boundaries (label 0); else A ends at a random boundary and
  B continues to the first boundary at or beyond tot_len (label 1). The longer side is trimmed
  from its right until len(A) + len(B) = tot_len. The draws: one uniform (only when a boundary
  exists), one boundary index, B's start (label 0), in the reference's order.

  Returns:
    (a_begin, a_end, b_begin, b_end, label) or None where the reference returns None (the row is
    too short: the caller stops every row there).
  """
  data_len = len(sent_ids)
  if begin_idx + tot_len >= data_len:
    return None
  # The reference's scan from begin_idx + 1: boundaries closer than tot_len are cut points, the
  # first one at tot_len or beyond ends it (end_idx), else it runs to data_len.
  changes = begin_idx + 1 + np.flatnonzero(sent_ids[begin_idx + 1:] != sent_ids[begin_idx:-1])
  far = changes - begin_idx >= tot_len
  cut_points = changes[~far]   # changes ascend, so the near ones come first
  end_idx = int(changes[far][0]) if far.any() else data_len

  a_begin = begin_idx
  if len(cut_points) == 0 or rng.random() < 0.5:
    label = 0
    a_end = end_idx if len(cut_points) == 0 else int(cut_points[rng.integers(len(cut_points))])
    b_len = max(1, tot_len - (a_end - a_begin))
    b_begin = int(rng.integers(0, data_len - 1 - b_len + 1))   # random.randint is inclusive
    b_end = b_begin + b_len
    while b_begin > 0 and sent_ids[b_begin - 1] == sent_ids[b_begin]:
      b_begin -= 1
    while b_end < data_len - 1 and sent_ids[b_end - 1] == sent_ids[b_end]:
      b_end += 1
  else:
    label = 1
    a_end = int(cut_points[rng.integers(len(cut_points))])
    b_begin, b_end = a_end, end_idx

  while a_end - a_begin + b_end - b_begin > tot_len:
    if a_end - a_begin > b_end - b_begin:
      a_end -= 1
    else:
      b_end -= 1
  if a_end >= data_len or b_end >= data_len:   # extend_target needs one token after each
    return None
  return a_begin, a_end, b_begin, b_end, label


# -------------------------------------------------------------------------------------------------
# Targets: _sample_mask.
# -------------------------------------------------------------------------------------------------


def ngram_probs(max_ngram: int) -> np.ndarray:
  """[max_ngram] p(n) ∝ 1/n, n = 1..max_ngram."""
  p = 1.0 / np.arange(1, max_ngram + 1)
  return p / p.sum()


def span_mask(is_start: np.ndarray, goal: int, ngram_draws: np.ndarray, ctx_draws: np.ndarray,
              *, mask_alpha: float, mask_beta: float) -> tuple[np.ndarray, int]:
  """The span loop of _sample_mask, given its draws (left to right; the caller flips).

  Each iteration: n = ngram_draws[k] capped by the remaining goal, ctx = ⌊n·alpha / beta⌋,
  l_ctx = ⌊ctx_draws[k]·ctx⌋ (uniform in [0, ctx)); the span starts at the first word start at or
  after cur + l_ctx and covers n pieces; cur = end + ctx − l_ctx. It stops at the goal, or when
  a span would reach the last position (the reference's `end >= seg_len` break: the last position
  is never in a span). The reference's end loop tests `seg[beg]` (always a start piece) instead
  of `seg[end]`, so n counts pieces, not words; ported as is (spec §6.1 step 4).

  Args:
    is_start: [S] bool, word-initial pieces.
    goal: targets wanted.
    ngram_draws: [>= S // 2 + 1] int n-gram lengths; ctx_draws: as many uniforms in [0, 1).

  Returns:
    (mask [S] bool, number of masked positions).
  """
  seg_len = len(is_start)
  # next_start[k]: the first word start at or after k (seg_len if none).
  starts = np.flatnonzero(is_start)
  next_start = np.append(starts, seg_len)[np.searchsorted(starts, np.arange(seg_len + 1))]
  mask = np.zeros(seg_len, bool)
  num_predict, cur_len, k = 0, 0, 0
  while cur_len < seg_len:
    if num_predict >= goal:
      break
    n = min(int(ngram_draws[k]), goal - num_predict)
    ctx_size = int((n * mask_alpha) // mask_beta)
    l_ctx = int(ctx_draws[k] * ctx_size)
    k += 1
    beg = int(next_start[min(cur_len + l_ctx, seg_len)])
    if beg >= seg_len:
      break
    end = beg + n
    if end >= seg_len:
      break
    mask[beg:end] = True
    num_predict += n
    cur_len = end + ctx_size - l_ctx
  return mask, num_predict


def sample_targets(is_start: np.ndarray, goal: int, rng: np.random.Generator, *,
                   max_ngram: int = 5, mask_alpha: float = 6, mask_beta: float = 1,
                   reverse: bool = False) -> np.ndarray:
  """_sample_mask: exactly `goal` of the [S] positions, as n-gram spans then random singles.

  Args:
    is_start: [S] bool, True where a piece starts a word (the tokenizer's `word_start` of the
      ids; the reference's `_is_start_piece`: '▁', special and punctuation pieces), in the
      row's stored order.
    goal: positions to select (<= S).
    rng: the only randomness: S // 2 + 1 n-gram lengths and uniforms (enough for any run of the
      loop, which advances at least 2 positions an iteration), then the top-up.
    reverse: a reversed row: sampled on the flipped row (so spans start at word starts of the
      original text) and flipped back.

  Returns:
    [S] bool, `goal` positions True.
  """
  seg_len = len(is_start)
  if goal > seg_len:
    raise ValueError(f"Cannot select {goal} targets among {seg_len} positions.")
  if reverse:
    is_start = is_start[::-1]
  draws = seg_len // 2 + 1
  ngram_draws = rng.choice(np.arange(1, max_ngram + 1), size=draws, p=ngram_probs(max_ngram))
  ctx_draws = rng.random(draws)
  mask, num_predict = span_mask(is_start, goal, ngram_draws, ctx_draws, mask_alpha=mask_alpha,
                                mask_beta=mask_beta)
  if num_predict < goal:
    # The reference draws random positions until `goal` distinct unmasked ones are hit: a
    # uniformly random subset of the unmasked positions.
    mask[rng.choice(np.flatnonzero(~mask), goal - num_predict, replace=False)] = True
  return mask[::-1].copy() if reverse else mask


# -------------------------------------------------------------------------------------------------
# Factorisation order and masks: _local_perm and the parser.
# -------------------------------------------------------------------------------------------------


def sample_ranks(length: int, perm_size: int, rng: np.random.Generator) -> np.ndarray:
  """_local_perm's `index`: [length] ranks, one permutation π of perm_size applied inside every
  block of perm_size positions: rank(b·P + k) = b·P + π(k)."""
  index = np.arange(length).reshape(-1, perm_size).T   # [perm_size, blocks]
  index = index[rng.permutation(perm_size)]            # tf.random_shuffle: along the first axis
  return np.ascontiguousarray(index.T).reshape(-1)


def perm_ranks(ids: np.ndarray, is_masked: np.ndarray, ranks: np.ndarray, *, sep_id: int,
               cls_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """_local_perm's ranks of one half.

  Returns:
    rev [S] int32 (−1 for non-targets: neither masked nor <sep>/<cls>; else the rank),
    self_rev [S] int32 (rev for targets, rev + 1 otherwise: all but targets see themselves),
    target [S] bool (masked and not functional).
  """
  non_func = ~((ids == sep_id) | (ids == cls_id))
  non_mask = ~is_masked & non_func
  rev = np.where(non_mask, -1, ranks).astype(np.int32)
  target = ~non_mask & non_func
  self_rev = np.where(target, rev, rev + 1).astype(np.int32)
  return rev, self_rev, target


def local_perm(ids: np.ndarray, is_masked: np.ndarray, ranks: np.ndarray, *, sep_id: int,
               cls_id: int) -> dict[str, np.ndarray]:
  """_local_perm of one half, given its ranks (`sample_ranks`).

  Returns:
    perm_mask [S, S] float32: 1 where query i may NOT attend to key j, i.e. self_rev(i) <= rev(j)
      and j is a target or functional token (spec §6.2); the content stream clears the diagonal.
    target [S] int32: the token itself (the reference's shifted-back next-token target).
    target_mask [S] float32: 1 on targets. input_q [S] float32: = target_mask.
    rev [S] int32: the ranks (`perm_ranks`).
  """
  rev, self_rev, target = perm_ranks(ids, is_masked, ranks, sep_id=sep_id, cls_id=cls_id)
  masked_or_func = rev >= 0
  perm_mask = (self_rev[:, None] <= rev[None, :]) & masked_or_func[None, :]
  target_mask = target.astype(np.float32)
  return dict(perm_mask=perm_mask.astype(np.float32), target=np.asarray(ids, np.int32),
              target_mask=target_mask, input_q=target_mask, rev=rev)


def target_slots(target_mask: np.ndarray, ids: np.ndarray, num_predict: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The parser's num_predict slots: positions of the targets in increasing position order.

  Returns:
    positions [P] int32 (0-padded), target ids [P] int32 (0-padded), weights [P] float32.
  """
  indices = np.flatnonzero(target_mask)
  if len(indices) > num_predict:
    raise ValueError(f"{len(indices)} targets exceed num_predict={num_predict}.")
  positions = np.zeros(num_predict, np.int32)
  targets = np.zeros(num_predict, np.int32)
  weights = np.zeros(num_predict, np.float32)
  positions[:len(indices)] = indices
  targets[:len(indices)] = ids[indices]
  weights[:len(indices)] = 1.0
  return positions, targets, weights


def two_stream_features(ids: np.ndarray, is_masked: np.ndarray, ranks: tuple[np.ndarray, ...],
                        *, reuse_len: int, num_predict: int, sep_id: int, cls_id: int
                        ) -> dict[str, np.ndarray]:
  """The parser of one window, in full: both halves' _local_perm joined (first-half rows blocked
  from every second-half column, second-half rows see the first half) and the target slots.

  Args:
    ids: [L] the window; is_masked: [L] bool (`sample_targets` of each half).
    ranks: (ranks of positions < reuse_len, ranks of the rest), each from `sample_ranks`.

  Returns:
    perm_mask [L, L] float32, target_mapping [P, L] float32, target_positions / target_ids [P]
    int32, target_weights [P] float32, perm_rank [L] int32 (what `xlnet_features` emits).
  """
  seq_len = len(ids)
  halves = [local_perm(ids[s], is_masked[s], r, sep_id=sep_id, cls_id=cls_id)
            for s, r in zip((slice(0, reuse_len), slice(reuse_len, seq_len)), ranks)]
  non_reuse = seq_len - reuse_len
  perm_mask = np.block([
      [halves[0]["perm_mask"], np.ones((reuse_len, non_reuse), np.float32)],
      [np.zeros((non_reuse, reuse_len), np.float32), halves[1]["perm_mask"]]])
  target_mask = np.concatenate([h["target_mask"] for h in halves])
  positions, targets, weights = target_slots(target_mask, ids, num_predict)
  target_mapping = np.zeros((num_predict, seq_len), np.float32)
  target_mapping[np.arange(num_predict), positions] = weights
  return dict(perm_mask=perm_mask, target_mapping=target_mapping, target_positions=positions,
              target_ids=targets, target_weights=weights,
              perm_rank=np.concatenate([h["rev"] for h in halves]))


def device_masks(batch: dict, reuse_len: int) -> tuple[jax.Array, jax.Array]:
  """The model's perm_mask and target_mapping from the compact batch keys, on the device.

  Equals `two_stream_features` row by row: within a half perm_mask[i, j] = self_rank(i) <=
  perm_rank(j) with self_rank = perm_rank + 1 off the targets (non-targets have rank −1, so
  self_rank 0 <= rank(j) already implies that j is a target or functional token); first-half rows
  are blocked from every second-half column; second-half rows see every first-half column.

  Args:
    batch: perm_rank [B, L], target_positions [B, P], target_weights [B, P].
    reuse_len: the first half's length.

  Returns:
    perm_mask [B, L, L] float32 (1 = query i may not attend to key j), target_mapping [B, P, L]
    float32 (one-hot rows, zero rows for padding slots).
  """
  rank = batch["perm_rank"]
  seq_len = rank.shape[1]
  weights = batch["target_weights"].astype(jnp.float32)
  target_mapping = jax.nn.one_hot(batch["target_positions"], seq_len) * weights[:, :, None]
  is_target = jnp.sum(target_mapping, axis=1) > 0
  self_rank = rank + jnp.where(is_target, 0, 1)
  within = self_rank[:, :, None] <= rank[:, None, :]
  first = jnp.arange(seq_len) < reuse_len
  same_half = first[:, None] == first[None, :]
  across = first[:, None] & ~first[None, :]
  perm_mask = jnp.where(same_half[None], within, across[None])
  return perm_mask.astype(jnp.float32), target_mapping


# -------------------------------------------------------------------------------------------------
# The features function: create_tfrecords' window loop + the parser.
# -------------------------------------------------------------------------------------------------


def window_example(row: np.ndarray, sent_ids: np.ndarray, start: int, rng: np.random.Generator,
                   *, seq_len: int, reuse_len: int, num_predict: int, perm_size: int,
                   max_ngram: int, mask_alpha: float, mask_beta: float, sep_id: int, cls_id: int,
                   word_start: np.ndarray, reverse: bool) -> dict | None:
  """One window of one row (create_tfrecords' inner loop body, then the parser), or None when
  `split_a_and_b` finds the row too short.

  Returns:
    input_ids / segment_ids / perm_rank [L] int32, target_positions / target_ids [P] int32,
    target_weights [P] float32, label (the unused A|B label).
  """
  split = split_a_and_b(sent_ids, start + reuse_len, seq_len - reuse_len - _FUNCTIONAL_TOKENS,
                        rng)
  if split is None:
    return None
  a_begin, a_end, b_begin, b_end, label = split
  a, b = row[a_begin:a_end], row[b_begin:b_end]
  tail = np.concatenate([a, [sep_id], b, [sep_id], [cls_id]]).astype(np.int32)
  ids = np.concatenate([row[start:start + reuse_len], tail]).astype(np.int32)
  segment_ids = np.concatenate([np.zeros(reuse_len + len(a) + 1, np.int32),
                                np.ones(len(b) + 1, np.int32), [2]]).astype(np.int32)
  goal_1 = num_predict // 2
  sample = functools.partial(sample_targets, rng=rng, max_ngram=max_ngram, mask_alpha=mask_alpha,
                             mask_beta=mask_beta, reverse=reverse)
  is_masked = np.concatenate([sample(word_start[ids[:reuse_len]], num_predict - goal_1),
                              sample(word_start[tail], goal_1)])
  halves = (slice(0, reuse_len), slice(reuse_len, seq_len))
  ranks = [sample_ranks(h.stop - h.start, perm_size, rng) for h in halves]
  rank = np.concatenate([perm_ranks(ids[h], is_masked[h], r, sep_id=sep_id, cls_id=cls_id)[0]
                         for h, r in zip(halves, ranks)])
  functional = (ids == sep_id) | (ids == cls_id)
  positions, targets, weights = target_slots(is_masked & ~functional, ids, num_predict)
  return dict(input_ids=ids, segment_ids=segment_ids, perm_rank=rank, target_positions=positions,
              target_ids=targets, target_weights=weights, label=label)


_EXAMPLE_KEYS = ("input_ids", "segment_ids", "perm_rank", "target_positions", "target_ids",
                 "target_weights")


def xlnet_features(streams: dict, rng: np.random.Generator, *, seq_len: int, reuse_len: int,
                   num_predict: int, perm_size: int, max_ngram: int, mask_alpha: float,
                   mask_beta: float, sep_id: int, cls_id: int, word_start: np.ndarray) -> dict:
  """All windows of a chunk's rows, step-major (see the module docstring).

  Args:
    streams: `packing.xlnet_streams` output: input_ids [R, T] int32, sent_ids [R, T] (0/1 alternating per
      sentence), reverse [R] bool (optional: all False).
    rng: the only randomness; per window and row in order: A|B split, the two halves' targets,
      the two halves' orders.
    word_start: [vocab] bool, the tokenizer's word-initial pieces.

  Returns:
    The batch keys of the module docstring, [W·R, ...]: example k is window k // R of row k % R.
  """
  data, sent_ids = streams["input_ids"], streams["sent_ids"]
  num_rows, data_len = data.shape
  reverse = streams.get("reverse")
  reverse = np.zeros(num_rows, bool) if reverse is None else np.asarray(reverse, bool)
  params = dict(seq_len=seq_len, reuse_len=reuse_len, num_predict=num_predict,
                perm_size=perm_size, max_ngram=max_ngram, mask_alpha=mask_alpha,
                mask_beta=mask_beta, sep_id=sep_id, cls_id=cls_id, word_start=word_start)
  windows, start = [], 0
  while start + seq_len <= data_len:
    step = [window_example(data[r], sent_ids[r], start, rng, reverse=bool(reverse[r]), **params)
            for r in range(num_rows)]
    if any(example is None for example in step):   # the reference drops the whole step
      break
    windows.extend(step)
    start += reuse_len
  out = {key: np.stack([w[key] for w in windows]) if windows else
         np.zeros((0, num_predict if key.startswith("target") else seq_len),
                  np.float32 if key == "target_weights" else np.int32)
         for key in _EXAMPLE_KEYS}
  out["input_mask"] = np.ones_like(out["input_ids"])
  direction = np.where(reverse, -1.0, 1.0).astype(np.float32)
  out["direction"] = np.tile(direction, len(windows) // num_rows if num_rows else 0)
  return out


FIELD_RULES = {
    "objective.perm_size": config_lib.AT_LEAST_1,
    "objective.num_predict": config_lib.AT_LEAST_1,
    "objective.max_ngram": config_lib.AT_LEAST_1,
    "objective.mask_alpha": config_lib.POSITIVE,
    "objective.mask_beta": config_lib.POSITIVE,
}


def validate(config) -> None:
  """Raises ConfigError for XLNet's windows (R = reuse_len, then A <sep> B <sep> <cls>), its
  memory, and the constants the reference asserts (or loops forever on)."""
  o, m, seq_len = config.objective, config.model, config.data.seq_len
  reuse_len = m.reuse_len
  if config.data.packing != "xlnet_streams":
    raise ConfigError("XLNet reads parallel token streams: set --config.data.packing=xlnet_streams.")
  if m.mem_len < 0:
    raise ConfigError(f"model.mem_len={m.mem_len} must be >= 0 (0: no memory).")
  if m.mem_len and config.train.grad_accum_steps != 1:
    raise ConfigError("XLNet's memory carries each row from one batch to the next: set "
                      "--config.train.grad_accum_steps=1 (or --config.model.mem_len=0).")
  non_reuse = seq_len - reuse_len
  if not 0 < reuse_len < seq_len - _FUNCTIONAL_TOKENS:
    raise ConfigError(f"model.reuse_len={reuse_len} must lie in (0, data.seq_len − 3) = (0, "
                      f"{seq_len - _FUNCTIONAL_TOKENS}) (the window's <sep> <sep> <cls>); the "
                      f"reference uses seq_len / 2, e.g. --config.model.reuse_len={seq_len // 2}.")
  if o.perm_size < 1 or reuse_len % o.perm_size or non_reuse % o.perm_size:
    raise ConfigError(f"objective.perm_size={o.perm_size} must divide both model.reuse_len="
                      f"{reuse_len} and data.seq_len − reuse_len={non_reuse} (the reference "
                      f"reshapes each half into blocks of perm_size); e.g. "
                      f"--config.objective.perm_size={np.gcd(reuse_len, non_reuse)}.")
  goals = (o.num_predict - o.num_predict // 2, o.num_predict // 2)
  if o.num_predict < 1 or goals[0] > reuse_len or goals[1] > non_reuse:
    raise ConfigError(f"objective.num_predict={o.num_predict} splits into {goals} targets for "
                      f"halves of {reuse_len} and {non_reuse} tokens; lower "
                      f"--config.objective.num_predict (the reference: 85 of 512).")
  if o.max_ngram < 1 or o.mask_beta <= 0 or o.mask_alpha < o.mask_beta:
    raise ConfigError(f"objective.mask_alpha={o.mask_alpha}, mask_beta={o.mask_beta}, max_ngram="
                      f"{o.max_ngram}: a 1-gram's context ⌊alpha / beta⌋ must be >= 1 and "
                      f"max_ngram >= 1 (the reference: 6, 1, 5).")


def make_features(config, tokenizer):
  """Returns the host-side `fn(streams, rng) -> batch` (`xlnet_features`; streams from
  `packing.xlnet_streams` with R = the per-shard batch size)."""
  validate(config)
  config_lib.check_vocabulary(config, tokenizer)
  o = config.objective
  return functools.partial(
      xlnet_features, seq_len=config.data.seq_len, reuse_len=config.model.reuse_len,
      num_predict=o.num_predict, perm_size=o.perm_size, max_ngram=o.max_ngram,
      mask_alpha=o.mask_alpha, mask_beta=o.mask_beta, sep_id=tokenizer.sep_id,
      cls_id=tokenizer.cls_id, word_start=tokenizer.word_start_for("xlnet"))


def pipeline_options(config) -> dict:
  """Pipeline keywords: the features replace the packed streams (`replace_examples`), and their
  step-major order must survive (`ordered`: no example shuffle), so that batch k + 1's row r
  continues batch k's row r (the memory)."""
  del config
  return dict(replace_examples=True, ordered=True)


def describe(config) -> str:
  o, m = config.objective, config.model
  return (f"XLNet permutation LM: {o.num_predict} targets per {config.data.seq_len}-token window "
          f"({o.num_predict - o.num_predict // 2} in the {m.reuse_len} reused tokens, "
          f"{o.num_predict // 2} after), n-grams <= {o.max_ngram} in contexts of "
          f"{o.mask_alpha / o.mask_beta:g}·n, perm_size {o.perm_size}, memory {m.mem_len}, "
          f"{'forward + reversed' if o.bi_data else 'forward'} streams")


# -------------------------------------------------------------------------------------------------
# Model, memory, loss, FLOPs.
# -------------------------------------------------------------------------------------------------


def build_model(config):
  return xlnet_model.XLNet(config.model)


def init_carry(config, batch_size: int) -> tuple:
  """The memory at the start of a run: per layer [batch, mem_len, hidden] float32 zeros (the
  reference's initial mems); () without memory."""
  m = config.model
  if not m.mem_len:
    return ()
  return tuple(jnp.zeros((batch_size, m.mem_len, m.hidden), jnp.float32)
               for _ in range(m.layers))


def init_inputs(config) -> dict:
  """One row of every model input (memory included), to trace `XLNet.init`."""
  seq_len, num_predict = config.data.seq_len, config.objective.num_predict
  mems = init_carry(config, 1) or None
  return dict(input_ids=jnp.zeros((1, seq_len), jnp.int32),
              segment_ids=jnp.zeros((1, seq_len), jnp.int32),
              input_mask=jnp.ones((1, seq_len), jnp.int32),
              perm_mask=jnp.zeros((1, seq_len, seq_len), jnp.float32),
              target_mapping=jnp.zeros((1, num_predict, seq_len), jnp.float32),
              mems=mems, direction=jnp.ones((1,), jnp.float32))


def loss_fn(model, params, batch, rng, config, *, deterministic=False, carry=None):
  """Returns (Σ CE·w / Σ w over the query-stream targets, {plm_loss, plm_accuracy: (sum, count)}),
  and the next memory when `carry` (this step's memory) is given."""
  perm_mask, target_mapping = device_masks(batch, config.model.reuse_len)
  outputs = model.apply(
      params, batch["input_ids"], segment_ids=batch["segment_ids"],
      input_mask=batch["input_mask"], perm_mask=perm_mask, target_mapping=target_mapping,
      mems=carry or None, direction=batch["direction"], deterministic=deterministic,
      rngs={"dropout": rng})
  metrics = {}
  # function_builder.py two_stream_loss divides by Σ target_mask with no guard: every window has
  # targets (num_predict of them are sampled, at most 3 fall on <sep>/<cls>).
  loss = losses.mean_cross_entropy(outputs["logits"], batch["target_ids"],
                                   batch["target_weights"], metrics, "plm")
  if carry is None:
    return loss, metrics
  new_carry = tuple(jax.lax.stop_gradient(new).astype(old.dtype)
                    for new, old in zip(outputs["new_mems"], carry))
  return loss, metrics, new_carry


def train_flops_per_token(model, seq_len: int, num_predict: int) -> float:
  """Training FLOPs per window token of XLNet's two streams: 3 × the forward's matmul FLOPs
  (PERF.md §3), with L = seq_len, M = mem_len, K = L + M keys, R = M + 2L relative distances
  (klen + qlen: the position scores are computed over R columns, then shifted to K), P =
  num_predict query rows, A = heads·head_dim, N = layers:

    every layer:            2·K·d·A·2 + 2·R·d·A                  k, v of [memory ; window], r
    content stream, N − 1:  2·L·d·A·2 + 2·L·(2K + R)·A            q, o; content and position
                            + 2·L·2·A + 4·L·d·f                   scores, values; segments; FFN
    query stream, N:        2·P·d·A·2 + 2·P·(2K + R)·A + 2·P·2·A + 4·P·d·f
    head:                   2·P·d·V                               tied output embedding

  FLOPs/token = 3 · (sum) / L. The last layer's content stream is not counted: no loss and no
  memory depends on it (the memory is built from layer inputs), so jit drops it (with
  scan_layers the scanned body computes it anyway). The query stream attends from its P rows as
  models/xlnet.py does (the reference scatters them to L rows). Memory keys and the positional
  embedding get no input gradient, so the × 3 slightly overcounts them, as the convention does.
  tests/objectives/xlnet_objective_test.py checks the sum against the compiled forward's dots.
  """
  d, f, layers, vocab = model.hidden, model.mlp, model.layers, model.vocab_size
  a = model.heads * model.head_dim
  length, preds = seq_len, num_predict
  keys = length + model.mem_len
  distances = keys + length
  projections = 2 * keys * d * a * 2 + 2 * distances * d * a

  def stream(rows):
    return (2 * rows * d * a * 2 + 2 * rows * (2 * keys + distances) * a + 2 * rows * 2 * a
            + 4 * rows * d * f)

  forward = (layers * projections + (layers - 1) * stream(length) + layers * stream(preds)
             + 2 * preds * d * vocab)
  return float(3 * forward / length)


def flops_per_token(config) -> float:
  return train_flops_per_token(config.model, config.data.seq_len, config.objective.num_predict)
