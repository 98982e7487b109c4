"""Tests for bertfam_jax.data.packing against the reference rules (spec objectives.md §1.1, §2).

The synthetic documents give every token a unique id, so each packed token can be traced back
to its document, sentence and position.
"""

import numpy as np
import pytest

from bertfam_jax.data import packing

PAD, CLS, SEP = 0, 2, 3
FIRST_ID = 10


def traceable_docs(num_docs, sentences_range, length_range, seed, long_every=0, long_len=0):
  """Documents of unique-id tokens and a table id -> (doc, sentence, position in doc).

  Returns:
    docs: list of lists of [len] int32 arrays.
    where: [num_tokens + FIRST_ID, 3] int64 (doc, sentence, position); rows < FIRST_ID unused.
  """
  rng = np.random.default_rng(seed)
  docs, where, next_id = [], [np.full((FIRST_ID, 3), -1)], FIRST_ID
  for d in range(num_docs):
    doc, position = [], 0
    for s in range(int(rng.integers(*sentences_range))):
      length = long_len if long_every and s % long_every == long_every - 1 else int(
          rng.integers(*length_range))
      doc.append(np.arange(next_id, next_id + length, dtype=np.int32))
      where.append(np.stack([np.full(length, d), np.full(length, s),
                             position + np.arange(length)], axis=1))
      next_id += length
      position += length
    docs.append(doc)
  return docs, np.concatenate(where)


def split_pair(row, mask):
  tokens = row[mask.astype(bool)]
  seps = np.flatnonzero(tokens == SEP)
  return tokens, tokens[1:seps[0]], tokens[seps[0] + 1:seps[1]]


@pytest.fixture(scope="module")
def pairs_setup():
  docs, where = traceable_docs(400, (4, 30), (3, 13), seed=0)
  seq_len = 64
  out = packing.sentence_pairs(docs, seq_len, np.random.default_rng(1), short_seq_prob=0.1,
                               cls_id=CLS, sep_id=SEP, pad_id=PAD)
  return docs, where, seq_len, out


def test_sentence_pairs_structure(pairs_setup):
  _, _, seq_len, out = pairs_setup
  n = len(out["sentence_label"])
  assert n > 1000
  for key in ("input_ids", "segment_ids", "input_mask"):
    assert out[key].shape == (n, seq_len) and out[key].dtype == np.int32
  assert out["sentence_label"].dtype == np.int32
  for row, segments, mask in zip(out["input_ids"], out["segment_ids"], out["input_mask"]):
    length = int(mask.sum())
    assert 5 <= length <= seq_len
    np.testing.assert_array_equal(mask, np.arange(seq_len) < length)
    assert (row[length:] == PAD).all()
    tokens, a, b = split_pair(row, mask)
    assert tokens[0] == CLS and tokens[-1] == SEP
    assert (tokens == SEP).sum() == 2 and (tokens == CLS).sum() == 1
    assert len(a) >= 1 and len(b) >= 1
    expected_segments = np.r_[np.zeros(len(a) + 2), np.ones(len(b) + 1), np.zeros(seq_len - length)]
    np.testing.assert_array_equal(segments, expected_segments)


def test_sentence_pairs_trace_to_the_source(pairs_setup):
  docs, where, _, out = pairs_setup
  max_sentence = 12
  gaps = []
  for row, mask, label in zip(out["input_ids"], out["input_mask"], out["sentence_label"]):
    _, a, b = split_pair(row, mask)
    doc_a, doc_b = where[a, 0], where[b, 0]
    # Each segment is one contiguous run of one document (truncation only trims its ends).
    for doc, segment in ((doc_a, a), (doc_b, b)):
      assert (doc == doc[0]).all()
      np.testing.assert_array_equal(np.diff(where[segment, 2]), 1)
    if label == 0:   # IsNext: B continues A in the same document, after a sentence boundary.
      assert doc_a[0] == doc_b[0]
      assert where[b[0], 1] > where[a[-1], 1]
      gap = where[b[0], 2] - where[a[-1], 2] - 1
      assert 0 <= gap < max_sentence   # only truncation (< one sentence of excess) opens a gap
      gaps.append(gap)
    else:            # random next: B comes from another document of the chunk
      assert doc_a[0] != doc_b[0]
  assert np.mean(np.array(gaps) == 0) > 0.5


def test_random_next_avoids_the_current_document():
  # With 3 documents a single draw hits the current one a third of the time; BERT's 10 retries
  # leave (1/3)^10 per pair.
  docs, where = traceable_docs(3, (200, 300), (3, 13), seed=4)
  out = packing.sentence_pairs(docs, 64, np.random.default_rng(5), short_seq_prob=0.1,
                               cls_id=CLS, sep_id=SEP, pad_id=PAD)
  random_pairs = [split_pair(r, m) for r, m, label in
                  zip(out["input_ids"], out["input_mask"], out["sentence_label"]) if label == 1]
  assert len(random_pairs) > 50
  assert all(where[a[0], 0] != where[b[0], 0] for _, a, b in random_pairs)


def test_sentence_pairs_read_every_sentence(pairs_setup):
  # Unused sentences of a chunk whose B was random are pushed back and read again, so every
  # sentence lands in some segment of its own document (truncation rarely eats a whole one).
  docs, where, _, out = pairs_setup
  seen = set()
  for row, mask in zip(out["input_ids"], out["input_mask"]):
    _, a, b = split_pair(row, mask)
    seen.update(map(tuple, where[a, :2]))
    if where[b[0], 0] == where[a[0], 0]:
      seen.update(map(tuple, where[b, :2]))
  num_sentences = sum(len(d) for d in docs)
  assert len(seen) > 0.99 * num_sentences


def test_sentence_pairs_label_balance(pairs_setup):
  docs, where, _, out = pairs_setup
  # A chunk of a single sentence always takes a random B (BERT), which is why slightly more than
  # half of the pairs are random. With sentences shorter than any target length that happens only
  # for a document's last sentence read alone: identify those instances and test the rest.
  last_sentence = np.array([len(d) - 1 for d in docs])
  single = np.array([
      (where[a, 1] == last_sentence[where[a, 0]]).all()
      for a in (split_pair(r, m)[1] for r, m in zip(out["input_ids"], out["input_mask"]))])
  labels = out["sentence_label"]
  assert (labels[single] == 1).all()
  rest = labels[~single]
  sigma = np.sqrt(0.25 / len(rest))
  assert abs(rest.mean() - 0.5) < 4 * sigma
  assert labels.mean() > rest.mean()   # the excess of random pairs the spec describes


def test_short_seq_prob_and_determinism():
  docs, _ = traceable_docs(40, (10, 30), (3, 13), seed=2)
  kwargs = dict(cls_id=CLS, sep_id=SEP, pad_id=PAD)
  full = packing.sentence_pairs(docs, 128, np.random.default_rng(0), short_seq_prob=0.0, **kwargs)
  short = packing.sentence_pairs(docs, 128, np.random.default_rng(0), short_seq_prob=1.0, **kwargs)
  again = packing.sentence_pairs(docs, 128, np.random.default_rng(0), short_seq_prob=0.0, **kwargs)
  for key in full:
    np.testing.assert_array_equal(full[key], again[key])
  assert short["input_mask"].sum(1).mean() < 0.75 * full["input_mask"].sum(1).mean()
  with pytest.raises(ValueError, match="pair_mode"):
    packing.sentence_pairs(docs, 128, np.random.default_rng(0), short_seq_prob=0.0,
                           pair_mode="cbow", **kwargs)


def naive_truncate(a, b, max_num_tokens, rng):
  """BERT's truncate_seq_pair, token by token."""
  a, b = list(a), list(b)
  while len(a) + len(b) > max_num_tokens:
    longer = a if len(a) > len(b) else b
    if rng.random() < 0.5:
      del longer[0]
    else:
      longer.pop()
  return a, b


@pytest.mark.parametrize("len_a,len_b,max_num_tokens", [
    (50, 10, 40), (10, 50, 40), (30, 30, 41), (5, 5, 20), (100, 99, 3), (1, 80, 61)])
def test_truncate_pair_matches_the_token_by_token_rule(len_a, len_b, max_num_tokens):
  a, b = np.arange(len_a), 1000 + np.arange(len_b)
  for seed in range(20):
    got_a, got_b = packing.truncate_pair(a, b, max_num_tokens, np.random.default_rng(seed))
    want_a, want_b = naive_truncate(a, b, max_num_tokens, np.random.default_rng(seed))
    assert got_a.tolist() == want_a and got_b.tolist() == want_b


@pytest.fixture(scope="module")
def blocks_setup():
  # Every 7th sentence is longer than a block, to exercise the split into pieces.
  docs, where = traceable_docs(60, (3, 25), (3, 20), seed=3, long_every=7, long_len=75)
  seq_len = 32
  out = packing.full_sentences(docs, seq_len, cls_id=CLS, sep_id=SEP, pad_id=PAD)
  return docs, where, seq_len, out


def test_full_sentences_keeps_every_token_once_in_order(blocks_setup):
  docs, _, seq_len, out = blocks_setup
  ids, mask = out["input_ids"], out["input_mask"]
  assert ids.dtype == np.int32 and ids.shape[1] == seq_len
  assert (ids[:, 0] == CLS).all()
  assert (out["segment_ids"] == 0).all()
  assert (ids[mask == 0] == PAD).all()
  lengths = mask.sum(1)
  np.testing.assert_array_equal(mask, np.arange(seq_len)[None] < lengths[:, None])
  stream = np.concatenate([np.r_[s, SEP] for doc in docs for s in doc])
  packed = np.concatenate([row[1:n] for row, n in zip(ids, lengths)])
  np.testing.assert_array_equal(packed, stream)


def test_full_sentences_blocks_are_whole_sentences_and_greedy(blocks_setup):
  docs, where, seq_len, out = blocks_setup
  block_len = seq_len - 1
  sentences = [s for doc in docs for s in doc]
  units = [len(s) + 1 for s in sentences]
  crossings = 0
  for row, n in zip(out["input_ids"], out["input_mask"].sum(1)):
    content = row[1:n]
    tokens = content[content != SEP]
    if len(content) < block_len or content[-1] == SEP:
      # A block of whole sentences: it starts at a sentence start and ends with </s>.
      assert content[-1] == SEP
      first = tokens[0]
      assert where[first, 2] == 0 or where[first - 1, 1] != where[first, 1] or (
          units[_sentence_index(docs, first)] > block_len)
    else:
      # Only a sentence longer than a block may be cut, into full-length pieces.
      assert units[_sentence_index(docs, tokens[-1])] > block_len
    crossings += len(np.unique(where[tokens, 0])) > 1
  assert crossings > 10   # blocks cross document boundaries (FULL-SENTENCES, not DOC-SENTENCES)
  # Greedy: no block could have taken the next whole sentence.
  ends = np.cumsum(out["input_mask"].sum(1) - 1)
  unit_ends = np.cumsum(units)
  for end, length in zip(ends[:-1], out["input_mask"].sum(1)[:-1] - 1):
    k = np.searchsorted(unit_ends, end)
    if unit_ends[k] == end and k + 1 < len(units) and units[k + 1] <= block_len:
      assert length + units[k + 1] > block_len


def _sentence_index(docs, token):
  starts = np.cumsum([0] + [len(s) for doc in docs for s in doc])
  return int(np.searchsorted(starts, token - FIRST_ID, side="right") - 1)


def test_full_sentences_empty_and_exact_fit():
  out = packing.full_sentences([], 16, cls_id=CLS, sep_id=SEP, pad_id=PAD)
  assert out["input_ids"].shape == (0, 16)
  # Sentences of 14 + </s> fill a 16-token row exactly; a 15-token sentence is cut into 15 + 1.
  docs = [[np.full(14, 7, np.int32), np.full(15, 8, np.int32)]]
  out = packing.full_sentences(docs, 16, cls_id=CLS, sep_id=SEP, pad_id=PAD)
  assert out["input_mask"].sum(1).tolist() == [16, 16, 2]
  assert out["input_ids"][2, :2].tolist() == [CLS, SEP]


@pytest.mark.parametrize("pair_mode", ["sop", "structbert"])
def test_order_pairs_are_really_in_order_or_swapped(pair_mode):
  """SOP (ALBERT) and StructBERT's 3-way task: label 0 = B continues A; label 1 = the same two
  texts swapped (B precedes A in the document); StructBERT label 2 / SOP single-sentence chunks =
  another document. Classes are balanced as the reference draws them."""
  docs, where = traceable_docs(400, (4, 30), (3, 13), seed=6)
  out = packing.sentence_pairs(docs, 64, np.random.default_rng(7), short_seq_prob=0.1,
                               cls_id=CLS, sep_id=SEP, pad_id=PAD, pair_mode=pair_mode)
  labels = out["sentence_label"]
  kinds = []
  for row, mask, label in zip(out["input_ids"], out["input_mask"], labels):
    _, a, b = split_pair(row, mask)
    same_doc = where[a[0], 0] == where[b[0], 0]
    if label == 0:
      assert same_doc and where[b[0], 2] > where[a[-1], 2]
    elif label == 1 and same_doc:
      assert where[a[0], 2] > where[b[-1], 2]      # really swapped: A comes after B
      kinds.append("swapped")
    else:
      assert not same_doc
      assert label == (1 if pair_mode == "sop" else 2)
      if pair_mode == "sop":   # only a one-sentence chunk takes another document's text
        assert len(np.unique(where[a, 1])) == 1
      kinds.append("random")
  assert set(np.unique(labels)) == set(range(packing.PAIR_CLASSES[pair_mode]))
  n = len(labels)
  if pair_mode == "sop":
    swapped = kinds.count("swapped") / (n - kinds.count("random"))
    assert abs(swapped - 0.5) < 4 * np.sqrt(0.25 / n)
  else:
    counts = np.bincount(labels, minlength=3) / n
    # 1/3 each, plus the forced random B of one-sentence chunks.
    assert abs(counts[0] - counts[1]) < 4 * np.sqrt(2 / 9 / n)
    assert counts[2] > 1 / 3 - 4 * np.sqrt(2 / 9 / n) and counts[0] > 0.25


def test_document_blocks_are_whole_sentences_of_one_document():
  docs, where = traceable_docs(60, (3, 25), (3, 20), seed=3, long_every=7, long_len=75)
  seq_len = 32
  out = packing.document_blocks(docs, seq_len, cls_id=CLS, sep_id=SEP, pad_id=PAD)
  ids, mask = out["input_ids"], out["input_mask"]
  lengths = mask.sum(1)
  assert (ids[:, 0] == CLS).all() and (ids[np.arange(len(ids)), lengths - 1] == SEP).all()
  assert (out["segment_ids"] == 0).all() and (ids[mask == 0] == PAD).all()
  contents = [row[1:n - 1] for row, n in zip(ids, lengths)]
  # Every token once, in order; no separators inside a block.
  np.testing.assert_array_equal(np.concatenate(contents),
                                np.concatenate([s for doc in docs for s in doc]))
  block_len = seq_len - 2
  for k, tokens in enumerate(contents):
    assert len(np.unique(where[tokens, 0])) == 1          # never crosses a document end
    first, last = tokens[0], tokens[-1]
    sentence_len = len(docs[where[first, 0]][where[first, 1]])
    starts_sentence = where[first, 2] == 0 or where[first - 1, 1] != where[first, 1]
    assert starts_sentence or sentence_len > block_len    # only over-long sentences are cut
    # Greedy: the next sentence of the same document would not have fit.
    if k + 1 < len(contents) and where[contents[k + 1][0], 0] == where[last, 0]:
      nxt = contents[k + 1][0]
      next_len = len(docs[where[nxt, 0]][where[nxt, 1]])
      assert len(tokens) + min(next_len, block_len) > block_len or (
          where[nxt, 1] == where[last, 1])
