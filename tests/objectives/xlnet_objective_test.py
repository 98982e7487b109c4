"""XLNet's objective (spec objectives.md §6): the worked example §6.3, the reference's loops
(_split_a_and_b, _sample_mask, _local_perm) transcribed and compared, target statistics, the
masks' factorisation-order semantics, the window layout and step-major order, the loss."""

import functools
import re
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from bertfam_jax import config_lib as cl
from bertfam_jax.data import packing
from bertfam_jax.objectives import xlnet
from helpers import tiny

# The project tokenizer layout: <pad> 0, <unk> 1, [CLS] 2, [SEP] 3, [MASK] 4.
VOCAB, CLS, SEP = 61, 2, 3
SEQ, REUSE, PREDICT = 32, 16, 8


def tokenizer(seed=0):
  word_start = np.random.default_rng(seed).random(VOCAB) < 0.7
  word_start[:5] = True
  return types.SimpleNamespace(pad_id=0, unk_id=1, cls_id=CLS, sep_id=SEP, mask_id=4,
                               vocab_size=VOCAB, word_start=word_start,
                               word_start_for=lambda rule: word_start)


def tiny_config(perm_size=REUSE, bi_data=True, **model):
  c = cl.base_config()
  c.model = tiny.xlnet(**{**dict(vocab_size=VOCAB, heads=2, head_dim=16, activation="gelu",
                                 mem_len=REUSE, reuse_len=REUSE), **model})
  c.objective = ml_collections.ConfigDict(dict(
      name="xlnet", num_predict=PREDICT, mask_alpha=6.0, mask_beta=1.0, max_ngram=5,
      perm_size=perm_size, bi_data=bi_data, use_eod=True))
  c.data.update(seq_len=SEQ, packing="xlnet_streams")
  return c


def synthetic_docs(num_docs, rng):
  """Documents of 2..6 sentences of 3..12 ordinary tokens (ids 5..VOCAB-1)."""
  docs = []
  for _ in range(num_docs):
    lengths = rng.integers(3, 13, rng.integers(2, 7))
    docs.append(np.split(rng.integers(5, VOCAB, lengths.sum()).astype(np.int32),
                         np.cumsum(lengths)[:-1]))
  return docs


def chunk_features(config, rows=4, num_docs=40, seed=0):
  tok = tokenizer()
  docs = synthetic_docs(num_docs, np.random.default_rng(seed))
  streams = packing.xlnet_streams(docs, rows, bi_data=config.objective.bi_data,
                              eod_id=packing.eod_id(tok), use_eod=True)
  features = xlnet.make_features(config, tok)(streams, np.random.default_rng(seed + 1))
  return streams, features


# -------------------------------------------------------------------------------------------------
# The reference's loops, transcribed from zihangdai/xlnet data_utils.py (Python `random` and
# np.random replaced by draws from a Generator in the same order as the port draws them).
# -------------------------------------------------------------------------------------------------


class _Random:
  def __init__(self, rng):
    self.rng = rng

  def random(self):
    return self.rng.random()

  def choice(self, seq):
    return seq[self.rng.integers(len(seq))]

  def randint(self, a, b):
    return int(self.rng.integers(a, b + 1))


def reference_split_a_and_b(data, sent_ids, begin_idx, tot_len, random):
  data_len = data.shape[0]
  if begin_idx + tot_len >= data_len:
    return None
  end_idx = begin_idx + 1
  cut_points = []
  while end_idx < data_len:
    if sent_ids[end_idx] != sent_ids[end_idx - 1]:
      if end_idx - begin_idx >= tot_len:
        break
      cut_points.append(end_idx)
    end_idx += 1
  a_begin = begin_idx
  if len(cut_points) == 0 or random.random() < 0.5:
    label = 0
    if len(cut_points) == 0:
      a_end = end_idx
    else:
      a_end = random.choice(cut_points)
    b_len = max(1, tot_len - (a_end - a_begin))
    b_begin = random.randint(0, data_len - 1 - b_len)
    b_end = b_begin + b_len
    while b_begin > 0 and sent_ids[b_begin - 1] == sent_ids[b_begin]:
      b_begin -= 1
    while b_end < data_len - 1 and sent_ids[b_end - 1] == sent_ids[b_end]:
      b_end += 1
  else:
    label = 1
    a_end = random.choice(cut_points)
    b_begin = a_end
    b_end = end_idx
  while a_end - a_begin + b_end - b_begin > tot_len:
    if a_end - a_begin > b_end - b_begin:
      a_end -= 1
    else:
      b_end -= 1
  if a_end >= data_len or b_end >= data_len:
    return None
  a_target = data[a_begin + 1: a_end + 1]
  b_target = data[b_begin: b_end + 1]
  return data[a_begin: a_end], data[b_begin: b_end], label, (a_begin, a_end, b_begin, b_end), \
      a_target, b_target


def reference_span_loop(seg, is_start_piece, goal, ngram_draws, ctx_draws, alpha, beta, reverse):
  """_sample_mask's loop before the top-up, `np.random.choice(ngrams, p)` -> ngram_draws[k],
  `np.random.choice(ctx_size)` -> ⌊ctx_draws[k]·ctx_size⌋; returns the mask in the row's order."""
  seg_len = len(seg)
  mask = np.array([False] * seg_len, dtype=bool)
  num_predict = 0
  if reverse:
    seg = np.flip(seg, 0)
  cur_len, k = 0, 0
  while cur_len < seg_len:
    if goal is not None and num_predict >= goal:
      break
    n = ngram_draws[k]
    if goal is not None:
      n = min(n, goal - num_predict)
    ctx_size = (n * alpha) // beta
    l_ctx = int(ctx_draws[k] * ctx_size)
    k += 1
    r_ctx = ctx_size - l_ctx
    beg = cur_len + l_ctx
    while beg < seg_len and not is_start_piece(seg[beg]):
      beg += 1
    if beg >= seg_len:
      break
    end = beg + 1
    cnt_ngram = 1
    while end < seg_len:
      if is_start_piece(seg[beg]):   # sic: the reference tests seg[beg], not seg[end]
        cnt_ngram += 1
        if cnt_ngram > n:
          break
      end += 1
    if end >= seg_len:
      break
    mask[beg:end] = True
    num_predict += end - beg
    cur_len = end + r_ctx
  if reverse:
    mask = np.flip(mask, 0)
  return mask, num_predict


# -------------------------------------------------------------------------------------------------
# §6.3 and the masks.
# -------------------------------------------------------------------------------------------------


def test_worked_example_6_3_exactly():
  the, new, york, is_, big = 10, 11, 12, 13, 14
  ids = np.array([the, new, york, is_, big, SEP])
  is_masked = np.isin(np.arange(6), [1, 2, 4])
  ranks = np.array([3, 0, 4, 1, 5, 2])
  out = xlnet.local_perm(ids, is_masked, ranks, sep_id=SEP, cls_id=CLS)
  np.testing.assert_array_equal(out["rev"], [-1, 0, 4, -1, 5, 2])
  query = np.array([[0, 1, 1, 0, 1, 1],
                    [0, 1, 1, 0, 1, 1],
                    [0, 0, 1, 0, 1, 0],
                    [0, 1, 1, 0, 1, 1],
                    [0, 0, 0, 0, 1, 0],
                    [0, 0, 1, 0, 1, 0]], np.float32)
  np.testing.assert_array_equal(out["perm_mask"], query)
  content = query.copy()
  content[[1, 2, 4], [1, 2, 4]] = 0   # only the targets' own entries change
  np.testing.assert_array_equal(out["perm_mask"] * (1 - np.eye(6)), content)
  np.testing.assert_array_equal(out["target_mask"], [0, 1, 1, 0, 1, 0])
  positions, targets, weights = xlnet.target_slots(out["target_mask"], ids, num_predict=4)
  np.testing.assert_array_equal(targets, [new, york, big, 0])
  np.testing.assert_array_equal(weights, [1, 1, 1, 0])
  mapping = np.zeros((4, 6), np.float32)
  mapping[[0, 1, 2], [1, 2, 4]] = 1
  # The device path from the compact keys (one half: reuse_len = L) gives the same two arrays.
  perm_mask, target_mapping = xlnet.device_masks(
      dict(perm_rank=out["rev"][None], target_positions=positions[None],
           target_weights=weights[None]), reuse_len=6)
  np.testing.assert_array_equal(np.asarray(perm_mask)[0], query)
  np.testing.assert_array_equal(np.asarray(target_mapping)[0], mapping)


def test_ranks_permute_inside_every_block_alike():
  ranks = xlnet.sample_ranks(12, 4, np.random.default_rng(0))
  blocks = ranks.reshape(3, 4) - 4 * np.arange(3)[:, None]
  assert sorted(blocks[0]) == [0, 1, 2, 3]
  np.testing.assert_array_equal(blocks, np.broadcast_to(blocks[0], (3, 4)))
  # perm_size = length: one full permutation, every order equally likely (first rank ~ uniform).
  firsts = [xlnet.sample_ranks(4, 4, np.random.default_rng(s))[0] for s in range(2000)]
  counts = np.bincount(firsts, minlength=4)
  assert np.all(np.abs(counts / 2000 - 0.25) < 5 * np.sqrt(0.25 * 0.75 / 2000))


def random_window(rng, seq_len=SEQ, reuse_len=REUSE):
  """Random ids with <sep>/<cls> in the second half, random is_masked, ranks per half."""
  ids = rng.integers(5, VOCAB, seq_len)
  ids[rng.choice(np.arange(reuse_len, seq_len), 3, replace=False)] = (SEP, SEP, CLS)
  ids[rng.integers(reuse_len)] = SEP   # a functional token in the first half too
  is_masked = rng.random(seq_len) < 0.3
  perm = rng.choice([4, 8, 16])
  ranks = (xlnet.sample_ranks(reuse_len, perm, rng),
           xlnet.sample_ranks(seq_len - reuse_len, perm, rng))
  return ids, is_masked, ranks


def order_oracle(ids, is_masked, ranks, reuse_len):
  """Spec §6.2 in words: the factorisation order is half 1 then half 2; inside a half the
  non-targets come first, together, then targets and <sep>/<cls> by rank. A query sees what is
  strictly earlier, plus what is simultaneous (other non-targets, itself) unless it is a target.
  The content stream adds every position itself."""
  seq_len = len(ids)
  functional = np.isin(ids, [SEP, CLS])
  target = is_masked & ~functional
  half = np.arange(seq_len) >= reuse_len
  rank = np.where(~target & ~functional, -1, np.concatenate(ranks))
  order = half * 10 * seq_len + rank
  earlier = order[None, :] < order[:, None]
  same = (order[None, :] == order[:, None]) & ~target[:, None]
  query_sees = earlier | same
  return query_sees, query_sees | np.eye(seq_len, dtype=bool), target


def test_masks_follow_the_factorisation_order():
  rng = np.random.default_rng(1)
  for _ in range(50):
    ids, is_masked, ranks = random_window(rng)
    full = xlnet.two_stream_features(ids, is_masked, ranks, reuse_len=REUSE,
                                     num_predict=PREDICT + 20, sep_id=SEP, cls_id=CLS)
    query_sees, content_sees, target = order_oracle(ids, is_masked, ranks, REUSE)
    np.testing.assert_array_equal(full["perm_mask"] == 0, query_sees)
    np.testing.assert_array_equal((full["perm_mask"] * (1 - np.eye(SEQ))) == 0, content_sees)
    # Non-targets see no target of their half (their states carry nothing about what is
    # predicted there); the second half comes after the whole first half, targets included.
    context = ~target & ~np.isin(ids, [SEP, CLS])
    same_half = (np.arange(SEQ) < REUSE)[:, None] == (np.arange(SEQ) < REUSE)[None, :]
    assert not np.any((content_sees & same_half)[np.ix_(context, target)])
    assert np.all(content_sees[REUSE:, :REUSE])
    # No position sees a later half; targets never see themselves in the query stream.
    assert not np.any(query_sees[:REUSE, REUSE:]) and not np.any(np.diag(query_sees)[target])
    positions = np.flatnonzero(target)
    np.testing.assert_array_equal(full["target_positions"][:len(positions)], positions)
    np.testing.assert_array_equal(full["target_ids"][:len(positions)], ids[positions])
    np.testing.assert_array_equal(full["target_mapping"].sum(0), target)
    # The compact keys rebuild both arrays exactly on the device.
    compact = {k: full[k][None] for k in ("perm_rank", "target_positions", "target_weights")}
    perm_mask, mapping = xlnet.device_masks(compact, REUSE)
    np.testing.assert_array_equal(np.asarray(perm_mask)[0], full["perm_mask"])
    np.testing.assert_array_equal(np.asarray(mapping)[0], full["target_mapping"])


# -------------------------------------------------------------------------------------------------
# _split_a_and_b and _sample_mask against their transcriptions; target statistics.
# -------------------------------------------------------------------------------------------------


def test_split_a_and_b_matches_the_reference():
  rng = np.random.default_rng(2)
  labels = []
  for trial in range(300):
    data_len = int(rng.integers(40, 120))
    sent_ids = (np.cumsum(rng.random(data_len) < rng.choice([0.02, 0.1, 0.3])) % 2)
    data = rng.integers(5, VOCAB, data_len)
    begin, tot_len = int(rng.integers(0, data_len - 10)), int(rng.integers(5, 40))
    ours = xlnet.split_a_and_b(sent_ids, begin, tot_len, np.random.default_rng(trial))
    ref = reference_split_a_and_b(data, sent_ids, begin, tot_len,
                                  _Random(np.random.default_rng(trial)))
    if ref is None:
      assert ours is None
      continue
    a, b, label, bounds, a_target, b_target = ref
    assert ours == bounds + (label,)
    assert len(a) + len(b) == tot_len   # the window is always exactly full
    labels.append(label)
    # Spec §6.2: the stored next-token target, shifted back per half, is the token itself at
    # every non-functional position (here the second part: A <sep> B <sep> <cls>).
    inputs = np.concatenate([a, [SEP], b, [SEP], [CLS]])
    tgt = np.concatenate([a_target, b_target, [CLS, CLS]])
    shifted = np.concatenate([inputs[:1], tgt[:-1]])
    keep = ~np.isin(inputs, [SEP, CLS])
    np.testing.assert_array_equal(shifted[keep], inputs[keep])
  assert 0.35 < np.mean(labels) < 0.5   # label 1 only when a cut exists, then with p = 1/2


def test_span_loop_matches_the_reference():
  rng = np.random.default_rng(3)
  table = tokenizer().word_start
  for _ in range(200):
    seg_len = int(rng.choice([16, 50, 256]))
    seg = rng.integers(0, VOCAB, seg_len)
    goal = int(rng.integers(1, seg_len // 4 + 2))
    draws = seg_len // 2 + 1
    ngram_draws = rng.choice(np.arange(1, 6), size=draws, p=xlnet.ngram_probs(5))
    ctx_draws = rng.random(draws)
    reverse = bool(rng.integers(2))
    ref_mask, ref_num = reference_span_loop(seg, lambda i: table[i], goal, ngram_draws, ctx_draws,
                                            6, 1, reverse)
    is_start = table[seg][::-1] if reverse else table[seg]
    mask, num = xlnet.span_mask(is_start, goal, ngram_draws, ctx_draws, mask_alpha=6.0,
                                mask_beta=1.0)
    np.testing.assert_array_equal(mask[::-1] if reverse else mask, ref_mask)
    assert num == ref_num == ref_mask.sum()


def test_sample_targets_exact_count_and_reversal():
  table = tokenizer().word_start
  rng = np.random.default_rng(4)
  for goal, seg_len in [(43, 256), (42, 256), (PREDICT - PREDICT // 2, REUSE), (1, 3)]:
    for _ in range(20):
      is_start = table[rng.integers(0, VOCAB, seg_len)]
      assert xlnet.sample_targets(is_start, goal, rng).sum() == goal
  is_start = table[rng.integers(0, VOCAB, 256)]
  reversed_row = xlnet.sample_targets(is_start, 43, np.random.default_rng(9), reverse=True)
  forward = xlnet.sample_targets(is_start[::-1], 43, np.random.default_rng(9))
  np.testing.assert_array_equal(reversed_row, forward[::-1])


# data_utils.py _sample_mask: p(n) ∝ 1/n for n = 1..5, i.e. 60/137, 30/137, 20/137, 15/137,
# 12/137 (1 + 1/2 + 1/3 + 1/4 + 1/5 = 137/60), written out so that the test checks the law.
NGRAM_LAW = np.array([60, 30, 20, 15, 12]) / 137


def test_sampled_span_lengths_follow_the_one_over_n_law():
  """sample_targets' own draws on a long all-word-start row: span lengths 1..5 at 1/n."""
  np.testing.assert_allclose(xlnet.ngram_probs(5), NGRAM_LAW, rtol=1e-12)
  seg_len = 120_000
  mask = xlnet.sample_targets(np.ones(seg_len, bool), seg_len // 7 - 40,
                              np.random.default_rng(11))
  edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
  lengths = np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)
  freq = np.bincount(lengths, minlength=6)[1:6] / len(lengths)
  sigma = np.sqrt(NGRAM_LAW * (1 - NGRAM_LAW) / len(lengths))
  assert np.all(np.abs(freq - NGRAM_LAW) < 5 * sigma), (freq, NGRAM_LAW)


def test_span_statistics():
  """Without a goal cap (a long all-word-start row): span lengths n ∝ 1/n, 1..5; every cycle
  covers exactly n + ⌊6n⌋ = 7n positions, so the density is 1/7 up to the last cycle (≤ 35)."""
  seg_len = 120_000
  rng = np.random.default_rng(5)
  draws = seg_len // 2 + 1
  mask, num = xlnet.span_mask(
      np.ones(seg_len, bool), seg_len, rng.choice(np.arange(1, 6), size=draws,
                                                  p=xlnet.ngram_probs(5)),
      rng.random(draws), mask_alpha=6.0, mask_beta=1.0)
  assert abs(num / seg_len - 1 / 7) <= 35 / seg_len
  edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
  lengths = np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)   # spans never touch
  freq = np.bincount(lengths, minlength=6)[1:] / len(lengths)
  p = NGRAM_LAW
  assert np.all(np.abs(freq - p) < 5 * np.sqrt(p * (1 - p) / len(lengths))), (freq, p)
  # With word starts, a span begins only at a word start.
  table = tokenizer().word_start
  seg = rng.integers(0, VOCAB, 4000)
  mask, _ = xlnet.span_mask(table[seg], 4000, rng.choice(np.arange(1, 6), size=2001,
                                                         p=xlnet.ngram_probs(5)),
                            rng.random(2001), mask_alpha=6.0, mask_beta=1.0)
  starts = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8)])) == 1)
  assert len(starts) > 100 and table[seg[starts]].all()


# -------------------------------------------------------------------------------------------------
# Streams, windows, step-major order.
# -------------------------------------------------------------------------------------------------


def test_stream_rows_layout():
  docs = [[np.array([10, 11]), np.array([12, 13, 14])], [np.array([20]), np.array([], np.int32)],
          [], [np.array([30, 31, 32])]]
  eod = 7
  one = packing.xlnet_streams(docs, 1, bi_data=False, eod_id=eod)
  np.testing.assert_array_equal(one["input_ids"][0], [10, 11, 12, 13, 14, 7, 20, 7, 30, 31, 32, 7])
  # Sentence ids alternate per sentence; <eod> shares its document's last sentence's id.
  np.testing.assert_array_equal(one["sent_ids"][0], [1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0])
  two = packing.xlnet_streams(docs, 4, bi_data=True, eod_id=eod)
  np.testing.assert_array_equal(two["input_ids"][:2], one["input_ids"].reshape(2, 6))
  np.testing.assert_array_equal(two["input_ids"][2:], two["input_ids"][:2, ::-1])
  np.testing.assert_array_equal(two["sent_ids"][2:], two["sent_ids"][:2, ::-1])
  np.testing.assert_array_equal(two["reverse"], [False, False, True, True])
  no_eod = packing.xlnet_streams(docs, 5, bi_data=False, eod_id=eod, use_eod=False)
  np.testing.assert_array_equal(no_eod["input_ids"].reshape(-1), [10, 11, 12, 13, 14])
  with pytest.raises(cl.ConfigError, match="even"):
    packing.xlnet_streams(docs, 3, bi_data=True, eod_id=eod)


def test_windows_layout_and_step_major_order():
  config = tiny_config(perm_size=8)
  rows = 4
  streams, f = chunk_features(config, rows=rows)
  data_len = streams["input_ids"].shape[1]
  windows = (data_len - SEQ) // REUSE + 1   # A|B never runs out before R does
  assert windows >= 3 and len(f["input_ids"]) == windows * rows
  for key, shape in [("input_ids", (SEQ,)), ("segment_ids", (SEQ,)), ("input_mask", (SEQ,)),
                     ("perm_rank", (SEQ,)), ("target_positions", (PREDICT,)),
                     ("target_ids", (PREDICT,)), ("target_weights", (PREDICT,)), ("direction", ())]:
    assert f[key].shape == (windows * rows,) + shape, key
  for k in range(windows * rows):
    w, r = divmod(k, rows)   # step-major: window w of row r
    ids, seg = f["input_ids"][k], f["segment_ids"][k]
    row = streams["input_ids"][r]
    np.testing.assert_array_equal(ids[:REUSE], row[w * REUSE:(w + 1) * REUSE])
    len_a = int(np.sum(seg == 0)) - REUSE - 1
    assert len_a >= 1
    np.testing.assert_array_equal(ids[REUSE:REUSE + len_a], row[(w + 1) * REUSE:][:len_a])
    expected_seg = [0] * (REUSE + len_a + 1) + [1] * (SEQ - REUSE - len_a - 2) + [2]
    np.testing.assert_array_equal(seg, expected_seg)
    assert ids[REUSE + len_a] == SEP and ids[-2] == SEP and ids[-1] == CLS
    assert f["direction"][k] == (-1.0 if streams["reverse"][r] else 1.0)
    # Targets: ascending, the tokens themselves, 5 or 4 per half minus functional tokens.
    weights = f["target_weights"][k]
    positions = f["target_positions"][k][weights > 0]
    assert np.all(np.diff(positions) > 0)
    np.testing.assert_array_equal(f["target_ids"][k][weights > 0], ids[positions])
    # (the fake tokenizer has no <eod>: documents end with [SEP], functional, also in R).
    functional = np.isin(ids, [SEP, CLS])
    for half, goal in [(slice(0, REUSE), PREDICT - PREDICT // 2),
                       (slice(REUSE, SEQ), PREDICT // 2)]:
      in_half = np.sum((positions >= half.start) & (positions < half.stop))
      assert goal - functional[half].sum() <= in_half <= goal
    # Ranks: −1 exactly on non-targets (not functional); distinct per half.
    rank = f["perm_rank"][k]
    context = np.ones(SEQ, bool)
    context[positions] = False
    np.testing.assert_array_equal(rank == -1, context & ~functional)
    for half in (slice(0, REUSE), slice(REUSE, SEQ)):
      ranked = rank[half][rank[half] >= 0]
      assert len(set(ranked)) == len(ranked) and ranked.max() < REUSE
  # The device masks of the emitted batch follow the factorisation order (spec §6.2).
  perm_mask, mapping = xlnet.device_masks(f, REUSE)
  perm_mask, mapping = np.asarray(perm_mask), np.asarray(mapping)
  for k in range(0, windows * rows, 3):
    ids, rank = f["input_ids"][k], f["perm_rank"][k]
    is_masked = np.zeros(SEQ, bool)
    is_masked[f["target_positions"][k][f["target_weights"][k] > 0]] = True
    query_sees, _, _ = order_oracle(ids, is_masked, (rank[:REUSE], rank[REUSE:]), REUSE)
    np.testing.assert_array_equal(perm_mask[k] == 0, query_sees)
    np.testing.assert_array_equal(mapping[k].sum(0), is_masked)


def test_unidirectional_chunk_and_too_small_chunk():
  config = tiny_config(bi_data=False)
  streams, f = chunk_features(config, rows=3)
  assert not streams["reverse"].any() and np.all(f["direction"] == 1.0)
  assert len(f["input_ids"]) % 3 == 0 and len(f["input_ids"]) > 0
  _, empty = chunk_features(config, rows=3, num_docs=1)
  assert empty["input_ids"].shape == (0, SEQ) and empty["target_weights"].shape == (0, PREDICT)


def test_the_reused_half_gets_the_larger_target_goal(monkeypatch):
  """data_utils.py create_tfrecords: `num_predict_0 = num_predict // 2; num_predict_1 =
  num_predict - num_predict_0`, the first (the reused half, sampled first) the larger: 43 and 42
  of the paper's 85; at 9, 5 and 4."""
  goals = []
  real = xlnet.sample_targets
  monkeypatch.setattr(xlnet, "sample_targets",
                      lambda starts, goal, **kw: goals.append(goal) or real(starts, goal, **kw))
  config = tiny_config()
  config.objective.num_predict = 9
  streams = packing.xlnet_streams(synthetic_docs(40, np.random.default_rng(0)), 2, bi_data=False,
                                  eod_id=7)
  xlnet.make_features(config, tokenizer())(streams, np.random.default_rng(1))
  assert goals and goals[:2] == [5, 4] and set(goals[0::2]) == {5} and set(goals[1::2]) == {4}


def test_a_full_chunk_too_small_for_its_rows_is_refused():
  """A chunk of data.docs_per_chunk documents cut into R rows shorter than one window yields no
  example in any chunk: refused at the first chunk, naming docs_per_chunk and a size that fills
  four windows; a short last chunk (fewer documents) is not."""
  docs = synthetic_docs(40, np.random.default_rng(0))
  streams = packing.xlnet_streams(docs, 128, bi_data=True, eod_id=7)
  row = streams["input_ids"].shape[1]
  assert row < SEQ
  with pytest.raises(cl.ConfigError, match=r"data.docs_per_chunk=40 .* 128 parallel rows.*hold "
                     rf"{row} tokens.*about \d+ gives rows of four windows"):
    packing.check_xlnet_rows(row, 128, 40, 40, SEQ)
  packing.check_xlnet_rows(row, 128, 39, 40, SEQ)    # the epoch's last, partial chunk
  packing.check_xlnet_rows(SEQ, 128, 40, 40, SEQ)


def test_config_errors():
  tok = tokenizer()
  for fix, kwargs in [("perm_size", dict(perm_size=5)), ("num_predict", dict(num_predict=40)),
                      ("mask_alpha", dict(mask_alpha=0.5))]:
    config = tiny_config()
    config.objective.update(kwargs)
    with pytest.raises(cl.ConfigError, match=fix):
      xlnet.make_features(config, tok)
  config = tiny_config()
  config.model.reuse_len = SEQ - 3
  with pytest.raises(cl.ConfigError, match="reuse_len"):
    xlnet.make_features(config, tok)


# -------------------------------------------------------------------------------------------------
# Model-dependent: FLOPs, loss, memory.
# -------------------------------------------------------------------------------------------------


def test_flops_formula_is_the_forward_matmuls_times_3():
  """flops_per_token·L / 3 = the FLOPs of every dot_general in the lowered forward (loss inputs
  and the next memory), counted from their shapes: the formula documents what the model runs."""
  config = tiny_config(hidden=64, heads=2, head_dim=32, mlp=256, layers=3)
  model = xlnet.build_model(config)
  inputs = xlnet.init_inputs(config)
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), **inputs, deterministic=True))

  def forward(p, i):
    out = model.apply(p, **i, deterministic=True)
    return out["logits"], out["new_mems"]

  dots = 0
  for line in jax.jit(forward).lower(params, inputs).as_text().splitlines():
    if "stablehlo.dot_general" not in line:
      continue
    contracting = re.search(r"contracting_dims = \[([\d, ]+)\] x", line).group(1)
    shapes = [[int(v) for v in s.split("x")] for s in re.findall(r"tensor<([\dx]+)xf32>", line)]
    lhs, out = shapes[0], shapes[-1]
    dots += 2 * np.prod(out) * np.prod([lhs[int(i)] for i in contracting.split(",")])
  assert dots > 0
  assert xlnet.flops_per_token(config) * SEQ / 3 == pytest.approx(dots, rel=1e-9)


def test_loss_fits_one_batch_and_threads_memory():
  config = tiny_config()
  _, f = chunk_features(config, rows=4)
  batch = {k: jnp.asarray(v[:4]) for k, v in f.items()}   # window 0 of the 4 rows
  model = xlnet.build_model(config)
  params = nn.meta.unbox(jax.jit(lambda: model.init(
      jax.random.key(0), **xlnet.init_inputs(config), deterministic=True))())
  carry = xlnet.init_carry(config, 4)
  assert len(carry) == 2 and carry[0].shape == (4, REUSE, 32)
  tx = optax.adam(1e-2)

  @jax.jit
  def step(params, opt_state, carry):
    def loss(p):
      value, metrics, new_carry = xlnet.loss_fn(model, p, batch, jax.random.key(1), config,
                                                carry=carry)
      return value, (metrics, new_carry)
    (value, (metrics, new_carry)), grads = jax.value_and_grad(loss, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value, metrics, new_carry

  opt_state = tx.init(params)
  history = []
  for _ in range(40):
    params, opt_state, value, metrics, new_carry = step(params, opt_state, carry)
    history.append(float(value))
  total, count = metrics["plm_loss"]
  assert float(count) == float(batch["target_weights"].sum())
  np.testing.assert_allclose(float(total) / float(count), history[-1], rtol=1e-5)
  assert history[-1] < 0.25 * history[0], history   # 4.1 -> ~0.5 when it fits
  assert jax.tree.map(lambda x: (x.shape, x.dtype), new_carry) == \
      jax.tree.map(lambda x: (x.shape, x.dtype), carry)
  assert float(jnp.abs(new_carry[0]).sum()) > 0
  # Without a carry (eval): (loss, metrics) only; with one the memory changes the loss.
  evaluate = jax.jit(functools.partial(xlnet.loss_fn, model, config=config, deterministic=True))
  no_mem = evaluate(params, batch, jax.random.key(1))
  with_mem = evaluate(params, batch, jax.random.key(1), carry=new_carry)
  assert len(no_mem) == 2 and len(with_mem) == 3
  assert float(no_mem[0]) != float(with_mem[0])
