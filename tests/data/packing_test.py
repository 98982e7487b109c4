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
  another document. Classes are balanced as the reference draws them. Every fourth sentence is
  longer than a row, so that one-sentence chunks are common."""
  docs, where = traceable_docs(400, (4, 30), (3, 13), seed=6, long_every=4, long_len=70)
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
    # 1/3 each: a one-sentence chunk is cut in two rather than forced to another document.
    counts = np.bincount(labels, minlength=3) / n
    assert np.all(np.abs(counts - 1 / 3) < 4 * np.sqrt(2 / 9 / n)), counts


def test_document_blocks_are_whole_sentences_of_one_document():
  docs, where = traceable_docs(60, (3, 25), (3, 20), seed=3, long_every=7, long_len=75)
  seq_len = 32
  out = packing.document_blocks(docs, seq_len, cls_id=CLS, sep_id=SEP, pad_id=PAD)
  ids, mask = out["input_ids"], out["input_mask"]
  lengths = mask.sum(1)
  assert (ids[:, 0] == CLS).all() and (ids[np.arange(len(ids)), lengths - 1] == SEP).all()
  assert (out["segment_ids"] == 0).all() and (ids[mask == 0] == PAD).all()
  contents = [row[1:n - 1] for row, n in zip(ids, lengths)]
  block_len = seq_len - 2
  # Every token of every sentence that fits once, in order; the longer sentences (75 tokens)
  # dropped, as SpanBERT's BlockDataset drops them; no separators inside a block.
  np.testing.assert_array_equal(np.concatenate(contents), np.concatenate(
      [s for doc in docs for s in doc if len(s) <= block_len]))
  assert sum(len(s) > block_len for doc in docs for s in doc) > 10
  for k, tokens in enumerate(contents):
    assert len(np.unique(where[tokens, 0])) == 1          # never crosses a document end
    first, last = tokens[0], tokens[-1]
    sentence = lambda token: tuple(where[token, :2])  # noqa: E731  (doc, sentence)
    starts_sentence = sentence(first - 1) != sentence(first)
    ends_sentence = last + 1 == len(where) or sentence(last + 1) != sentence(last)
    assert starts_sentence and ends_sentence              # whole sentences only
    # Contiguous: no block spans a dropped sentence.
    assert np.all(np.diff(where[tokens, 2]) == 1)
    # Greedy: the next sentence of the same document would not have fit, or was dropped.
    if k + 1 < len(contents) and where[contents[k + 1][0], 0] == where[last, 0]:
      nxt = contents[k + 1][0]
      next_len = len(docs[where[nxt, 0]][where[nxt, 1]])
      follows = where[nxt, 2] == where[last, 2] + 1
      assert len(tokens) + next_len > block_len or not follows


# ---------------------------------------------------------------------------------------------
# ELECTRA (build_pretraining_dataset.py ExampleBuilder).
# ---------------------------------------------------------------------------------------------


class ReferenceExampleBuilder:
  """google-research/electra build_pretraining_dataset.py ExampleBuilder, line for line on lists of
  token ids, with `random.random()` -> `rng.random()` and `random.randint(a, b)` ->
  `rng.integers(a, b + 1)`. `add_line([])` is the blank line that ends a document."""

  def __init__(self, max_length, rng):
    self._rng = rng
    self._current_sentences = []
    self._current_length = 0
    self._max_length = max_length
    self._target_length = max_length

  def add_line(self, bert_tokids):
    if (not bert_tokids) and self._current_length != 0:  # empty lines separate docs
      return self._create_example()
    self._current_sentences.append(bert_tokids)
    self._current_length += len(bert_tokids)
    if self._current_length >= self._target_length:
      return self._create_example()
    return None

  def _create_example(self):
    if self._rng.random() < 0.1:
      first_segment_target_length = 100000
    else:
      first_segment_target_length = (self._target_length - 3) // 2
    first_segment = []
    second_segment = []
    for sentence in self._current_sentences:
      if (len(first_segment) == 0 or
          len(first_segment) + len(sentence) < first_segment_target_length or
          (len(second_segment) == 0 and
           len(first_segment) < first_segment_target_length and
           self._rng.random() < 0.5)):
        first_segment += sentence
      else:
        second_segment += sentence
    first_segment = first_segment[:self._max_length - 2]
    second_segment = second_segment[:max(0, self._max_length - len(first_segment) - 3)]
    self._current_sentences = []
    self._current_length = 0
    if self._rng.random() < 0.05:
      self._target_length = int(self._rng.integers(5, self._max_length + 1))
    else:
      self._target_length = self._max_length
    return self._make_example(first_segment, second_segment)

  def _make_example(self, first_segment, second_segment):
    input_ids = [CLS] + first_segment + [SEP]
    segment_ids = [0] * len(input_ids)
    if second_segment:
      input_ids += second_segment + [SEP]
      segment_ids += [1] * (len(second_segment) + 1)
    input_mask = [1] * len(input_ids)
    input_ids += [PAD] * (self._max_length - len(input_ids))
    input_mask += [0] * (self._max_length - len(input_mask))
    segment_ids += [0] * (self._max_length - len(segment_ids))
    return input_ids, segment_ids, input_mask


def reference_electra(docs, seq_len, rng):
  """Feeds the documents to the reference builder as its input file: one line per non-empty
  sentence, a blank line after each document (and the writer's final blank line)."""
  builder, examples = ReferenceExampleBuilder(seq_len, rng), []
  for doc in docs:
    for line in [s.tolist() for s in doc if len(s)] + [[]]:
      example = builder.add_line(line)
      if example:
        examples.append(example)
  ids, segments, mask = (np.array(column, np.int32).reshape(-1, seq_len)
                         for column in zip(*examples)) if examples else [np.zeros((0, seq_len))] * 3
  return dict(input_ids=ids, segment_ids=segments, input_mask=mask)


def electra(docs, seq_len, seed):
  return packing.electra_segments(docs, seq_len, np.random.default_rng(seed), cls_id=CLS,
                                  sep_id=SEP, pad_id=PAD)


def electra_segments_of(out):
  """(A, B) token arrays of every row, checking the `[CLS] A [SEP] (B [SEP])` layout."""
  seq_len = out["input_ids"].shape[1]
  rows = []
  for row, segments, mask in zip(out["input_ids"], out["segment_ids"], out["input_mask"]):
    length = int(mask.sum())
    np.testing.assert_array_equal(mask, np.arange(seq_len) < length)
    assert (row[length:] == PAD).all()
    tokens = row[:length]
    seps = np.flatnonzero(tokens == SEP)
    assert tokens[0] == CLS and (tokens == CLS).sum() == 1 and tokens[-1] == SEP
    assert len(seps) in (1, 2)
    a = tokens[1:seps[0]]
    b = tokens[seps[0] + 1:-1] if len(seps) == 2 else tokens[:0]
    assert len(a) >= 1 and (len(seps) == 1 or len(b) >= 1)
    expected = np.r_[np.zeros(len(a) + 2), np.ones(len(b) + 1 if len(b) else 0),
                     np.zeros(seq_len - length)]
    np.testing.assert_array_equal(segments, expected)
    rows.append((a, b))
  return rows


@pytest.fixture(scope="module")
def electra_setup():
  # Sentences up to 40 tokens at L = 48: the trims of A and B both happen often.
  docs, where = traceable_docs(300, (1, 30), (1, 41), seed=8)
  seq_len = 48
  return docs, where, seq_len, electra(docs, seq_len, seed=9)


def _global_sentence_index(docs):
  """{(doc, sentence in doc): index of the sentence in the whole input}."""
  index = {}
  for d, doc in enumerate(docs):
    for s in range(len(doc)):
      index[d, s] = len(index)
  return index


def test_electra_segments_are_in_order_sentences_of_one_document(electra_setup):
  docs, where, seq_len, out = electra_setup
  n = len(out["input_ids"])
  assert n > 1000
  for key in ("input_ids", "segment_ids", "input_mask"):
    assert out[key].shape == (n, seq_len) and out[key].dtype == np.int32
  assert set(out) == {"input_ids", "segment_ids", "input_mask"}
  one_segment = interleaved = 0
  for a, b in electra_segments_of(out):
    assert len(a) <= seq_len - 2 and len(a) + 2 + (len(b) + 1 if len(b) else 0) <= seq_len
    assert (where[a, 0] == where[a[0], 0]).all() and (where[b, 0] == where[a[0], 0]).all()
    for segment, capped in ((a, len(a) == seq_len - 2),
                            (b, len(a) + len(b) + 3 == seq_len)):
      if not len(segment):
        continue
      positions, sentence = where[segment, 2], where[segment, 1]
      assert (np.diff(positions) > 0).all()       # in document order
      # Runs of one sentence: contiguous, starting at the sentence start; all whole but the last,
      # which only a trim at the row's cap may cut.
      run_starts = np.flatnonzero(np.r_[True, np.diff(sentence) != 0])
      run_ends = np.r_[run_starts[1:], len(segment)]
      for k, (start, end) in enumerate(zip(run_starts, run_ends)):
        doc, s = where[segment[start], :2]
        assert where[segment[start], 2] == sum(len(x) for x in docs[doc][:s])
        np.testing.assert_array_equal(np.diff(positions[start:end]), 1)
        whole = end - start == len(docs[doc][s])
        assert whole or (k == len(run_starts) - 1 and capped)
    if len(b):
      assert where[b[0], 1] > where[a[0], 1]
      a_sentences = np.unique(where[a, 1])
      interleaved += len(a_sentences) != a_sentences[-1] - a_sentences[0] + 1
    else:
      one_segment += 1
  # The reference lets a short sentence join A after a longer one went to B (A, B interleave).
  assert interleaved > 0 and one_segment > 0.1 * n


def test_electra_examples_partition_the_sentences_and_trim_exactly(electra_setup):
  """Each example holds the sentences from its first one (A's first) to the next example's
  first; A and B only lose tokens to the trims A[:L - 2], B[:max(0, L - len(A) - 3)]."""
  docs, where, seq_len, out = electra_setup
  index = _global_sentence_index(docs)
  lengths = np.array([len(s) for doc in docs for s in doc])
  doc_of = np.array([d for d, doc in enumerate(docs) for _ in doc])
  rows = electra_segments_of(out)
  firsts = np.array([index[tuple(where[a[0], :2])] for a, _ in rows] + [len(lengths)])
  assert firsts[0] == 0 and (np.diff(firsts) > 0).all()
  trimmed_b = 0
  for (a, b), first, end in zip(rows, firsts[:-1], firsts[1:]):
    assert (doc_of[first:end] == doc_of[first]).all()       # one document per example
    total = lengths[first:end].sum()
    tokens = np.concatenate([docs[doc_of[first]][s - index[doc_of[first], 0]]
                             for s in range(first, end)])
    assert set(a.tolist()) | set(b.tolist()) <= set(tokens.tolist())
    assert len(a) <= seq_len - 2
    if len(b):   # A was not trimmed (else B's room is max(0, -1) = 0), so B had total - len(A)
      assert len(b) == min(total - len(a), max(0, seq_len - len(a) - 3))
      trimmed_b += len(b) < total - len(a)
    else:        # no B text at all (A = everything, trimmed) or B trimmed away entirely
      assert len(a) == min(total, seq_len - 2) or len(a) >= seq_len - 3
  assert trimmed_b > 50


def test_electra_rates_of_one_segment_targets_and_overflow():
  """One-token sentences make every draw visible: an example that starts >= L tokens before its
  document's end is ended by its target length t alone, so it holds exactly t tokens (t = L, or
  with probability 0.05 randint(5, L)); its A is everything (probability 0.1) or, with target
  ft = (t - 3) // 2 >= 2, ft - 1 tokens plus the crossing token with probability 0.5.

  Rows are selected by where they start, which the earlier draws decide, not by where they end
  (a short random target is less likely to meet a document's end: selecting rows not ended by a
  document's end would bias the rate up).
  """
  seq_len, doc_len = 16, 10_000
  docs = [[np.array([FIRST_ID + d * doc_len + i], np.int32) for i in range(doc_len)]
          for d in range(40)]
  out = electra(docs, seq_len, seed=11)
  rows = electra_segments_of(out)
  starts = np.array([a[0] - FIRST_ID for a, _ in rows])
  ends = np.r_[starts[1:], len(docs) * doc_len]
  sizes, len_a = ends - starts, np.array([len(a) for a, _ in rows])
  has_b = np.array([len(b) > 0 for _, b in rows])
  room = doc_len - starts % doc_len
  clear = room >= seq_len
  n = clear.sum()
  assert n > 20_000
  assert (sizes[clear] >= 5).all() and (sizes[clear] <= seq_len).all()

  def near(rate, p, count):
    return abs(rate - p) < 5 * np.sqrt(p * (1 - p) / count)   # 5 sigma of a binomial

  # Random target lengths: t < L reveals one (a random t equal to L does not: 1 in L - 4).
  assert near(np.mean(sizes[clear] < seq_len), 0.05 * (seq_len - 5) / (seq_len - 4), n)
  assert set(sizes[clear & (sizes < seq_len)]) == set(range(5, seq_len))
  # One segment: B empty (with two segments B always gets the rest here).
  assert near(np.mean(~has_b[clear]), 0.1, n)
  assert (len_a[clear & ~has_b] == np.minimum(sizes[clear & ~has_b], seq_len - 2)).all()
  # Two segments: A is ft - 1 or ft (the 0.5 coin) when ft >= 2, B is the rest.
  ft = (sizes - 3) // 2
  two = clear & has_b & (ft >= 2)
  assert set(ft[two] - len_a[two]) == {0, 1}
  assert near(np.mean(len_a[two] == ft[two]), 0.5, two.sum())


def test_electra_is_deterministic_given_the_generator():
  docs, _ = traceable_docs(60, (1, 30), (1, 41), seed=12)
  first, again, other = electra(docs, 64, seed=0), electra(docs, 64, seed=0), electra(docs, 64, 1)
  for key in first:
    np.testing.assert_array_equal(first[key], again[key])
  assert first["input_ids"].shape != other["input_ids"].shape or (
      first["input_ids"] != other["input_ids"]).any()


@pytest.mark.parametrize("seq_len", [5, 8, 16, 48, 128])
def test_electra_matches_the_reference_builder(seq_len):
  docs, _ = traceable_docs(80, (1, 40), (1, 45), seed=seq_len)
  # Empty sentences and documents, which both skip without a draw.
  docs[3].insert(1, np.zeros(0, np.int32))
  docs.insert(5, [])
  docs.insert(9, [np.zeros(0, np.int32)])
  for seed in range(3):
    got = electra(docs, seq_len, seed)
    want = reference_electra(docs, seq_len, np.random.default_rng(seed))
    assert len(want["input_ids"]) > 20
    for key in want:
      np.testing.assert_array_equal(got[key], want[key])


class ScriptedRng:
  """Answers `random()` / `integers(low, high)` from a script, checking the order of the calls."""

  def __init__(self, script):
    self._script = list(script)

  def random(self):
    kind, value = self._script.pop(0)
    assert kind == "random"
    return value

  def integers(self, low, high):
    kind, value = self._script.pop(0)
    assert kind == (low, high)
    return value

  def done(self):
    return not self._script


def test_electra_hand_worked_example():
  """L = 12. Doc 1 = sentences of 3, 4, 5 tokens (a, b, c); doc 2 = 2 tokens (d); doc 3 = 1, 6,
  1, 4 tokens (e, f, g, h).
    Doc 1: 3 + 4 + 5 = 12 >= 12 -> example. 0.5 >= 0.1: ft = (12 - 3) // 2 = 4. a: A empty -> A.
      b: 3 + 4 < 4 no; B empty, 3 < 4, coin 0.3 < 0.5 -> A (7). c: B empty but 7 >= 4 -> B, no
      coin. Trim: A 7 <= 10; B = c[:12 - 7 - 3] = c[:2]. Then 0.01 < 0.05: t = randint(5, 12) = 6.
    Doc 2: d = 2 < 6, document end -> example. 0.05 < 0.1: one segment, A = d. 0.9: t = 12.
    Doc 3: 1 + 6 + 1 + 4 = 12 -> example. 0.5: ft = 4. e -> A (1). f: 1 + 6 < 4 no, coin 0.7 ->
      B (6). g: 1 + 1 < 4 -> A (2), after f went to B. h: 2 + 4 < 4 no, B not empty -> B (10).
      Trim: B = (f + h)[:12 - 2 - 3 = 7]. 0.5: t = 12.
  """
  a, b, c = np.arange(10, 13), np.arange(20, 24), np.arange(30, 35)
  d = np.arange(40, 42)
  e, f, g, h = np.array([50]), np.arange(60, 66), np.array([70]), np.arange(80, 84)
  empty = np.zeros(0, np.int64)
  docs = [[a, b, empty, c], [], [d], [e, f, g, h]]
  script = [("random", 0.5), ("random", 0.3), ("random", 0.01), ((5, 13), 6),   # doc 1
            ("random", 0.05), ("random", 0.9),                                 # doc 2
            ("random", 0.5), ("random", 0.7), ("random", 0.5)]                 # doc 3
  rng = ScriptedRng(script)
  out = packing.electra_segments(docs, 12, rng, cls_id=CLS, sep_id=SEP, pad_id=PAD)
  assert rng.done()
  P = PAD
  np.testing.assert_array_equal(out["input_ids"], [
      [CLS, 10, 11, 12, 20, 21, 22, 23, SEP, 30, 31, SEP],
      [CLS, 40, 41, SEP, P, P, P, P, P, P, P, P],
      [CLS, 50, 70, SEP, 60, 61, 62, 63, 64, 65, 80, SEP]])
  np.testing.assert_array_equal(out["segment_ids"], [
      [0] * 9 + [1] * 3, [0] * 12, [0] * 4 + [1] * 8])
  np.testing.assert_array_equal(out["input_mask"], [[1] * 12, [1] * 4 + [0] * 8, [1] * 12])
  # The reference builder, fed the same script, agrees.
  want = reference_electra(docs, 12, ScriptedRng(script))
  for key in want:
    np.testing.assert_array_equal(out[key], want[key])


def test_electra_edge_cases():
  assert electra([], 16, 0)["input_ids"].shape == (0, 16)
  assert electra([[np.zeros(0, np.int32)]], 16, 0)["input_mask"].shape == (0, 16)
  with pytest.raises(ValueError, match="seq_len"):
    electra([[np.arange(10, 20)]], 4, 0)


def test_lm_stream_predicts_every_token_of_the_stream_once():
  """GPT's rows: documents closed by <eod> (9) in one stream; row r holds stream[rL : rL + L] and
  predicts stream[rL + 1 : rL + L + 1], so every token but the first is a target exactly once;
  only the last row is short, padded (0) with zero weights (its last real input, the stream's
  final <eod>, has no target); empty documents are skipped."""
  docs = [[np.array([1, 2, 3]), np.array([4])], [], [np.array([5, 6])], [np.array([], np.int32)],
          [np.array([7])]]
  stream = [1, 2, 3, 4, 9, 5, 6, 9, 7, 9]
  rows = packing.lm_stream(docs, 4, eod_id=9, pad_id=0)
  np.testing.assert_array_equal(rows["input_ids"], [[1, 2, 3, 4], [9, 5, 6, 9], [7, 9, 0, 0]])
  np.testing.assert_array_equal(rows["target_ids"], [[2, 3, 4, 9], [5, 6, 9, 7], [9, 0, 0, 0]])
  np.testing.assert_array_equal(rows["input_mask"], [[1] * 4, [1] * 4, [1, 1, 0, 0]])
  np.testing.assert_array_equal(rows["loss_weights"], [[1] * 4, [1] * 4, [1, 0, 0, 0]])
  targets = rows["target_ids"][rows["loss_weights"] > 0]
  assert targets.tolist() == stream[1:]
  assert packing.lm_stream([[]], 4, eod_id=9, pad_id=0)["input_ids"].shape == (0, 4)


def test_full_sentences_document_separator_is_a_lone_sep_after_each_document():
  """RoBERTa's extra separator (fairseq's blank line between documents, an `[eos]` item of its
  own): with document_separator every document's last `</s>` is followed by one more, packed as
  a 1-token sentence; without it (ELMo) none. Empty documents get none."""
  docs = [[np.full(3, 7, np.int32), np.full(2, 8, np.int32)], [], [np.full(4, 9, np.int32)]]
  rows = lambda separator: [  # noqa: E731
      row[:n].tolist() for row, n in zip(*(lambda o: (o["input_ids"], o["input_mask"].sum(1)))(
          packing.full_sentences(docs, 32, cls_id=CLS, sep_id=SEP, pad_id=PAD,
                                 document_separator=separator)))]
  assert rows(True) == [[CLS, 7, 7, 7, SEP, 8, 8, SEP, SEP, 9, 9, 9, 9, SEP, SEP]]
  assert rows(False) == [[CLS, 7, 7, 7, SEP, 8, 8, SEP, 9, 9, 9, 9, SEP]]
  # Blocks of 8: the lone </s> is a unit of its own, kept whole (greedy as any sentence).
  out = packing.full_sentences(docs, 9, cls_id=CLS, sep_id=SEP, pad_id=PAD,
                               document_separator=True)
  assert [row[1:n].tolist() for row, n in zip(out["input_ids"], out["input_mask"].sum(1))] == [
      [7, 7, 7, SEP, 8, 8, SEP, SEP], [9, 9, 9, 9, SEP, SEP]]
