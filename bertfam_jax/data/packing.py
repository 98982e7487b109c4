"""Packing tokenized documents into fixed-length examples: BERT / ALBERT / StructBERT sentence
pairs, RoBERTa FULL-SENTENCES blocks, SpanBERT single-document blocks, ELECTRA one- or
two-segment examples; for T5, raw token segments (`token_segments`) and, after the objective's
noise, several (inputs, targets) examples packed per row (`pack_seq2seq`).

Input everywhere: `docs`, a list of documents, each a list of sentences, each a [len] int array
of token ids (no special tokens). Output: a dict of numpy arrays following the batch-key
convention of `bertfam_jax.objectives` (`n` examples of length `L = seq_len`):
  input_ids [n, L] int32, segment_ids [n, L] int32, input_mask [n, L] int32
and, for sentence pairs, sentence_label [n] int32.
"""

from __future__ import annotations

import bisect
import math
from typing import Callable, Sequence

import numpy as np

from bertfam_jax.config_lib import ConfigError

Document = list[np.ndarray]   # sentences, each [len] int token ids


def _pad_rows(rows: list[np.ndarray], seq_len: int, pad_id: int) -> np.ndarray:
  """Stacks variable-length rows (each <= seq_len) into [n, seq_len] int32, padded on the right."""
  lengths = np.fromiter((len(r) for r in rows), np.int64, len(rows))
  out = np.full((len(rows), seq_len), pad_id, np.int32)
  if rows:
    starts = np.cumsum(lengths) - lengths
    row_index = np.repeat(np.arange(len(rows)), lengths)
    col_index = np.arange(lengths.sum()) - np.repeat(starts, lengths)
    out[row_index, col_index] = np.concatenate(rows)
  return out


# ---------------------------------------------------------------------------------------------
# BERT: sentence pairs with next-sentence prediction.
# ---------------------------------------------------------------------------------------------


def truncate_pair(tokens_a: np.ndarray, tokens_b: np.ndarray, max_num_tokens: int,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """BERT's truncate_seq_pair: while too long, drop one token of the longer segment (B on a tie),
  from its front or its back with probability 1/2 each.

  Draws exactly one uniform per dropped token, in the same order as the per-token loop, but
  slices each segment once instead of deleting token by token.
  """
  excess = len(tokens_a) + len(tokens_b) - max_num_tokens
  if excess <= 0:
    return tokens_a, tokens_b
  from_front = rng.random(excess) < 0.5
  trim_a = np.zeros(excess, bool)   # which segment each dropped token comes from
  len_a, len_b = len(tokens_a), len(tokens_b)
  for k in range(excess):
    trim_a[k] = len_a > len_b
    len_a, len_b = (len_a - 1, len_b) if trim_a[k] else (len_a, len_b - 1)
  a_front, a_back = np.sum(trim_a & from_front), np.sum(trim_a & ~from_front)
  b_front, b_back = np.sum(~trim_a & from_front), np.sum(~trim_a & ~from_front)
  return (tokens_a[a_front:len(tokens_a) - a_back], tokens_b[b_front:len(tokens_b) - b_back])


# A pair rule picks segment B for a chunk split at `a_end`:
#   (chunk, a_end, docs, doc_index, target_len, rng, random_next_prob)
#     -> (tokens_a, tokens_b, label, num_unused_sentences)
PairRule = Callable[..., tuple[np.ndarray, np.ndarray, int, int]]


def _random_document_segment(docs: list[Document], doc_index: int, target_b_len: int,
                             rng: np.random.Generator) -> np.ndarray:
  """Sentences from a random start in another document until >= target_b_len tokens.

  As BERT: up to 10 draws to avoid the current document; after that the last draw is kept.
  """
  for _ in range(10):
    random_index = int(rng.integers(len(docs)))
    if random_index != doc_index:
      break
  random_doc = docs[random_index]
  start = int(rng.integers(len(random_doc)))
  segment, length = [], 0
  for sentence in random_doc[start:]:
    segment.append(sentence)
    length += len(sentence)
    if length >= target_b_len:
      break
  return np.concatenate(segment)


def _random_next(chunk: list[np.ndarray], a_end: int, docs: list[Document], doc_index: int,
                 target_len: int, rng: np.random.Generator, label: int):
  """A = the chunk's first `a_end` sentences, B = a random other document's text; the chunk's
  unused sentences are handed back to be read again (BERT steps 5-6)."""
  tokens_a = np.concatenate(chunk[:a_end])
  tokens_b = _random_document_segment(docs, doc_index, target_len - len(tokens_a), rng)
  return tokens_a, tokens_b, label, len(chunk) - a_end


def _nsp_pair(chunk: list[np.ndarray], a_end: int, docs: list[Document], doc_index: int,
              target_len: int, rng: np.random.Generator, random_next_prob: float):
  """BERT next-sentence prediction (create_pretraining_data.py, steps 5-6 of the spec).

  B is a random other document's text when the chunk has one sentence or with probability
  `random_next_prob` (label 1). Otherwise B is the rest of the chunk (label 0 = IsNext).
  """
  if len(chunk) == 1 or rng.random() < random_next_prob:
    return _random_next(chunk, a_end, docs, doc_index, target_len, rng, label=1)
  return np.concatenate(chunk[:a_end]), np.concatenate(chunk[a_end:]), 0, 0


def _sop_pair(chunk: list[np.ndarray], a_end: int, docs: list[Document], doc_index: int,
              target_len: int, rng: np.random.Generator, random_next_prob: float):
  """ALBERT sentence-order prediction (albert create_pretraining_data.py, random_next_sentence
  False; spec §3 "SOP data").

  A one-sentence chunk still gets a random other document's text as B (label 1: the BERT-style
  negative survives in the reference). Otherwise B is the chunk's continuation and, with
  probability 1/2, A and B are swapped (label 1 = swapped); else label 0 = in order.
  `random_next_prob` is unused: SOP's swap probability is the reference's fixed 1/2.
  """
  del random_next_prob
  if len(chunk) == 1:
    return _random_next(chunk, a_end, docs, doc_index, target_len, rng, label=1)
  tokens_a, tokens_b = np.concatenate(chunk[:a_end]), np.concatenate(chunk[a_end:])
  if rng.random() < 0.5:
    return tokens_b, tokens_a, 1, 0
  return tokens_a, tokens_b, 0, 0


def _structbert_pair(chunk: list[np.ndarray], a_end: int, docs: list[Document], doc_index: int,
                     target_len: int, rng: np.random.Generator, random_next_prob: float):
  """StructBERT's sentence-structural objective (Wang et al. 2020, §2.2; no code released): B is
  the next text (label 0), the previous text (label 1: A and B swapped) or another document's
  text (label 2), 1/3 each. A one-sentence chunk (a sentence as long as the target, or a
  document's last) is cut at a uniform token boundary into A and B, so that it too has a next
  and a previous text; only a one-token chunk must take label 2. (Forcing label 2 on every
  one-sentence chunk gave 29/27/44% at 512 tokens on the embedded corpus.)
  `random_next_prob` is unused: the three classes are equiprobable as in the paper.
  """
  del random_next_prob
  whole_sentence = len(chunk) == 1 and len(chunk[0]) >= 2
  if whole_sentence:
    cut = int(rng.integers(1, len(chunk[0])))
    chunk, a_end = [chunk[0][:cut], chunk[0][cut:]], 1
  draw = 0.0 if len(chunk) == 1 else rng.random()
  if draw < 1 / 3:
    tokens_a, tokens_b, label, unused = _random_next(chunk, a_end, docs, doc_index, target_len,
                                                     rng, label=2)
    # A cut sentence's second half is not handed back: the document moves on past it.
    return tokens_a, tokens_b, label, 0 if whole_sentence else unused
  tokens_a, tokens_b = np.concatenate(chunk[:a_end]), np.concatenate(chunk[a_end:])
  if draw < 2 / 3:
    return tokens_b, tokens_a, 1, 0
  return tokens_a, tokens_b, 0, 0


# Sentence-pair tasks and their number of classes.
_PAIR_RULES: dict[str, PairRule] = {"nsp": _nsp_pair, "sop": _sop_pair, "structbert": _structbert_pair}
PAIR_CLASSES = {"nsp": 2, "sop": 2, "structbert": 3}


def _document_pairs(docs: list[Document], doc_index: int, max_num_tokens: int,
                    short_seq_prob: float, random_next_prob: float, pair_rule: PairRule,
                    rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray, int]]:
  """BERT's create_instances_from_document (steps 3-7): (A, B, label) triples of one document."""
  document = docs[doc_index]
  # One target length per document; with short_seq_prob a shorter one, so the model also sees
  # short sequences (which fine-tuning has).
  target_len = max_num_tokens
  if rng.random() < short_seq_prob:
    target_len = int(rng.integers(2, max_num_tokens + 1))
  pairs = []
  chunk, chunk_len, i = [], 0, 0
  while i < len(document):
    chunk.append(document[i])
    chunk_len += len(document[i])
    if i == len(document) - 1 or chunk_len >= target_len:
      a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
      tokens_a, tokens_b, label, num_unused = pair_rule(
          chunk, a_end, docs, doc_index, target_len, rng, random_next_prob)
      i -= num_unused
      tokens_a, tokens_b = truncate_pair(tokens_a, tokens_b, max_num_tokens, rng)
      pairs.append((tokens_a, tokens_b, label))
      chunk, chunk_len = [], 0
    i += 1
  return pairs


def sentence_pairs(docs: list[Document], seq_len: int, rng: np.random.Generator, *,
                   short_seq_prob: float, random_next_prob: float = 0.5, cls_id: int,
                   sep_id: int, pad_id: int, pair_mode: str = "nsp") -> dict[str, np.ndarray]:
  """BERT pre-training instances `[CLS] A [SEP] B [SEP]` from the documents given.

  Follows google-research/bert create_pretraining_data.py (spec objectives.md §1.1 steps 3-8);
  the random-next document is drawn from `docs` (the pipeline passes one chunk of documents).
  Empty documents and empty sentences are skipped, as BERT drops empty documents.

  Args:
    docs: documents, each a list of [len] int token arrays (sentences).
    seq_len: L, the example length including [CLS] and two [SEP].
    rng: the only randomness (target lengths, split points, random next, truncation).
    short_seq_prob: probability of a document-wide target length uniform in [2, L - 3].
    random_next_prob: probability that B is a random document's text (NSP label 1).
    cls_id, sep_id, pad_id: special token ids.
    pair_mode: 'nsp' (BERT next sentence), 'sop' (ALBERT sentence order) or 'structbert'
      (next / previous / random, 3-way).

  Returns:
    input_ids [n, L] int32, segment_ids [n, L] int32 (0 for [CLS] A [SEP], 1 for B [SEP]),
    input_mask [n, L] int32, sentence_label [n] int32 (0 = IsNext / in order; 1 = random next
    (nsp), swapped (sop) or previous (structbert); 2 = random (structbert)).
  """
  if pair_mode not in _PAIR_RULES:
    raise ValueError(f"pair_mode={pair_mode!r}; available: {sorted(_PAIR_RULES)}.")
  docs = [[s for s in doc if len(s)] for doc in docs]
  docs = [doc for doc in docs if doc]
  max_num_tokens = seq_len - 3
  pairs = [pair for doc_index in range(len(docs))
           for pair in _document_pairs(docs, doc_index, max_num_tokens, short_seq_prob,
                                       random_next_prob, _PAIR_RULES[pair_mode], rng)]
  cls, sep = np.array([cls_id], np.int32), np.array([sep_id], np.int32)
  rows = [np.concatenate([cls, a, sep, b, sep]) for a, b, _ in pairs]
  len_a = np.array([len(a) for a, _, _ in pairs], np.int64).reshape(-1, 1)
  lengths = np.array([len(r) for r in rows], np.int64).reshape(-1, 1)
  positions = np.arange(seq_len).reshape(1, -1)
  input_mask = positions < lengths
  return dict(
      input_ids=_pad_rows(rows, seq_len, pad_id),
      segment_ids=((positions >= len_a + 2) & input_mask).astype(np.int32),
      input_mask=input_mask.astype(np.int32),
      sentence_label=np.array([label for _, _, label in pairs], np.int32),
  )


# ---------------------------------------------------------------------------------------------
# RoBERTa: FULL-SENTENCES blocks.
# ---------------------------------------------------------------------------------------------


def _break_points(unit_ends: np.ndarray, max_len: int) -> np.ndarray:
  """Allowed block ends: every sentence end, plus every `max_len` tokens inside a sentence
  longer than `max_len` (counted from the sentence start), so no unit exceeds `max_len`.

  Args:
    unit_ends: [num_sentences] int64 cumulative end offsets of the sentences in the stream.
    max_len: the longest block.

  Returns:
    [num_breaks] int64, ascending, ending with the stream length.
  """
  unit_starts = np.concatenate([[0], unit_ends[:-1]])
  pieces = (unit_ends - unit_starts - 1) // max_len       # extra breaks inside each sentence
  owner = np.repeat(np.arange(len(unit_ends)), pieces)
  rank = np.arange(pieces.sum()) - np.repeat(np.cumsum(pieces) - pieces, pieces) + 1
  inner = unit_starts[owner] + rank * max_len
  return np.sort(np.concatenate([unit_ends, inner]))


def _greedy_blocks(breaks: list[int], block_len: int, hard_ends: list[int]) -> np.ndarray:
  """Greedy packing: from each start, the block ends at the last allowed break within `block_len`
  tokens that does not cross the next hard end (a document end where blocks may not cross).

  Args:
    breaks: ascending allowed block ends (units between consecutive breaks are <= block_len).
    block_len: the longest block.
    hard_ends: ascending ends blocks may not cross, the last one the stream length; each is also
      a break.

  Returns:
    [num_blocks] int64 block end offsets; block k spans [ends[k-1], ends[k]).
  """
  ends, start = [], 0
  while start < hard_ends[-1]:
    limit = min(start + block_len, hard_ends[bisect.bisect_right(hard_ends, start)])
    start = breaks[bisect.bisect_right(breaks, limit) - 1]
    ends.append(start)
  return np.asarray(ends, np.int64)


def _place_blocks(stream: np.ndarray, ends: np.ndarray, seq_len: int, *, cls_id: int,
                  sep_id: int | None, pad_id: int) -> dict[str, np.ndarray]:
  """Rows `[CLS] stream[start:end] ([SEP])`, padded to seq_len, for consecutive blocks.

  Blocks tile the stream, so token t lands in row block(t), column 1 + offset (one vectorised
  scatter, no per-block Python copies).
  """
  starts = np.concatenate([[0], ends[:-1]])
  block_lengths = ends - starts
  num_blocks = len(ends)
  input_ids = np.full((num_blocks, seq_len), pad_id, np.int32)
  input_ids[:, 0] = cls_id
  rows = np.repeat(np.arange(num_blocks), block_lengths)
  cols = 1 + np.arange(len(stream)) - np.repeat(starts, block_lengths)
  input_ids[rows, cols] = stream
  row_lengths = block_lengths + 1
  if sep_id is not None:
    input_ids[np.arange(num_blocks), row_lengths] = sep_id
    row_lengths = row_lengths + 1
  input_mask = (np.arange(seq_len)[None, :] < row_lengths[:, None]).astype(np.int32)
  return dict(input_ids=input_ids, segment_ids=np.zeros_like(input_ids), input_mask=input_mask)


def _empty_blocks(seq_len: int) -> dict[str, np.ndarray]:
  empty = np.zeros((0, seq_len), np.int32)
  return dict(input_ids=empty, segment_ids=empty, input_mask=empty)


def full_sentences(docs: list[Document], seq_len: int, *, cls_id: int, sep_id: int,
                   pad_id: int, document_separator: bool = False) -> dict[str, np.ndarray]:
  """RoBERTa FULL-SENTENCES: `<s>` + complete sentences, across document boundaries.

  fairseq (masked_lm task, TokenBlockDataset with break_mode='complete', then a prepended BOS):
  every sentence is followed by `</s>` (our [SEP]), and with `document_separator` every document
  by one more, a lone `</s>` (the paper's "extra separator token between documents": the
  tutorial's blank line between documents, kept by `--keep-empty`, which `Dictionary.encode_line`
  makes `[eos]`; ELMo's sentence stream has none); blocks greedily
  take whole sentences (the lone `</s>` as one) while they fit in L - 1 tokens, crossing document
  boundaries; then `<s>` (our [CLS]) is prepended.
  A sentence (with its `</s>`) longer than L - 1 is cut into L - 1 pieces, which fairseq would
  have left over-long. Deterministic: no randomness is involved.

  Args:
    docs: documents, each a list of [len] int token arrays (sentences).
    seq_len: L, the example length including `<s>`.
    cls_id, sep_id, pad_id: ids used for `<s>`, `</s>` and padding.

  Returns:
    input_ids [n, L] int32, segment_ids [n, L] int32 (all 0), input_mask [n, L] int32.
  """
  block_len = seq_len - 1
  # Each document's sentences, then (document_separator) an empty one: its lone </s>.
  separator = [np.zeros(0, np.int32)] if document_separator else []
  sentences = []
  for doc in docs:
    nonempty = [sentence for sentence in doc if len(sentence)]
    sentences += nonempty + separator if nonempty else []
  if not sentences:
    return _empty_blocks(seq_len)
  lengths = np.fromiter((len(s) for s in sentences), np.int64, len(sentences))
  # Insert </s> after every sentence in one vectorised call (the empty one's lone </s> directly
  # after its document's last).
  stream = np.insert(np.concatenate(sentences).astype(np.int32), np.cumsum(lengths), sep_id)
  breaks = _break_points(np.cumsum(lengths + 1), block_len).tolist()
  ends = _greedy_blocks(breaks, block_len, [len(stream)])
  return _place_blocks(stream, ends, seq_len, cls_id=cls_id, sep_id=None, pad_id=pad_id)


def document_blocks(docs: list[Document], seq_len: int, *, cls_id: int, sep_id: int,
                    pad_id: int) -> dict[str, np.ndarray]:
  """SpanBERT's single-segment blocks: `[CLS] whole sentences of ONE document [SEP]`.

  SpanBERT (no_nsp_span_bert_dataset.py BlockDataset, break_mode 'doc', spec §4 "Data"):
  contiguous whole sentences of one document, greedily up to L - 2 tokens, never crossing a
  document end, no separator between sentences. A sentence longer than L - 2 is dropped, as
  BlockDataset skips it, and no block spans the gap it leaves (there the reference's
  offset-based length exceeds the limit and ends the block; where the dropped sentence is a
  document's last, the reference also loses the block before it, which is kept here). Segment
  0 everywhere, no sentence-level task. Deterministic.

  Args:
    docs: documents, each a list of [len] int token arrays (sentences).
    seq_len: L, the example length including [CLS] and [SEP].
    cls_id, sep_id, pad_id: special token ids.

  Returns:
    input_ids [n, L] int32, segment_ids [n, L] int32 (all 0), input_mask [n, L] int32.
  """
  block_len = seq_len - 2
  runs = []  # the runs of kept sentences: between documents' ends and dropped sentences
  for doc in docs:
    run = []
    for sentence in doc:
      if len(sentence) > block_len:
        runs.append(run)
        run = []
      elif len(sentence):
        run.append(sentence)
    runs.append(run)
  runs = [run for run in runs if run]
  if not runs:
    return _empty_blocks(seq_len)
  lengths = np.fromiter((len(s) for run in runs for s in run), np.int64)
  stream = np.concatenate([s for run in runs for s in run]).astype(np.int32)
  run_ends = np.cumsum([sum(len(s) for s in run) for run in runs]).tolist()
  ends = _greedy_blocks(np.cumsum(lengths).tolist(), block_len, run_ends)
  return _place_blocks(stream, ends, seq_len, cls_id=cls_id, sep_id=sep_id, pad_id=pad_id)


# ---------------------------------------------------------------------------------------------
# ELECTRA: one or two segments of one document, no sentence-level task.
# ---------------------------------------------------------------------------------------------

ELECTRA_ONE_SEGMENT_PROB = 0.1      # an example with a single segment, as classification inputs
ELECTRA_ONE_SEGMENT_TARGET = 100_000   # the first-segment target then: every sentence goes to A
ELECTRA_OVERFLOW_TO_A_PROB = 0.5    # a sentence crossing A's target still joins A (B empty)
ELECTRA_RANDOM_LENGTH_PROB = 0.05   # the next example's target is randint(5, L) instead of L
ELECTRA_MIN_RANDOM_LENGTH = 5


def electra_segments(docs: list[Document], seq_len: int, rng: np.random.Generator, *,
                     cls_id: int, sep_id: int, pad_id: int) -> dict[str, np.ndarray]:
  """ELECTRA's ExampleBuilder: `[CLS] A [SEP] (B [SEP])` of whole sentences of ONE document.

  google-research/electra build_pretraining_dataset.py, class ExampleBuilder (blank lines
  separating documents, its default). Sentences are appended to the current example until it
  holds >= target_length tokens (the crossing sentence included whole), or the document ends;
  then the example is built:
    * with probability 0.1 the first-segment target is 100000 (one segment only, as the inputs
      of classification tasks); else it is (target_length - 3) // 2;
    * each sentence, in order, goes to A if A is empty, or len(A) + len(sentence) < the first
      target, or (B is still empty and len(A) < the first target and, with probability 0.5, a
      coin says so); otherwise to B. Evaluated as the reference's short-circuit `or` / `and`, so
      the 0.5 draw is taken only when the first two tests fail, B is empty and len(A) < target.
      A later short sentence may still join A after one went to B, so A and B are each in-order
      sentences of the document but need not be contiguous text (the reference's behaviour);
    * A = A[:L - 2], B = B[:max(0, L - len(A) - 3)]; B and its [SEP] only if B is non-empty;
    * the next target length: with probability 0.05 randint(5, L) (both ends included), else L.
  The target length carries across documents, like the reference's builder over its input.
  Random draws follow the reference's order: per example the 0.1 draw, the per-sentence 0.5
  draws, the 0.05 draw, then the randint (`rng.integers(5, L + 1)`) if taken. Empty sentences
  are skipped (in the reference they never change the example or consume a draw). The
  per-sentence loop runs on Python ints; the rows are then placed with one vectorised scatter.

  Args:
    docs: documents, each a list of [len] int token arrays (sentences).
    seq_len: L, the example length including [CLS] and the [SEP]s (>= 5).
    rng: the only randomness (segment targets, overflow coins, target lengths).
    cls_id, sep_id, pad_id: special token ids.

  Returns:
    input_ids [n, L] int32, segment_ids [n, L] int32 (0 for [CLS] A [SEP], 1 for B [SEP]),
    input_mask [n, L] int32. No sentence-level label.
  """
  if seq_len < ELECTRA_MIN_RANDOM_LENGTH:
    raise ValueError(f"seq_len={seq_len}: ELECTRA packing needs seq_len >= "
                     f"{ELECTRA_MIN_RANDOM_LENGTH} (its random target lengths start there).")
  docs = [[s for s in doc if len(s)] for doc in docs]
  sentences = [s for doc in docs for s in doc]
  if not sentences:
    return _empty_blocks(seq_len)
  lengths = [len(s) for s in sentences]
  doc_end = [False] * len(sentences)
  for end in np.cumsum([len(doc) for doc in docs if doc]).tolist():
    doc_end[end - 1] = True

  # The sequential rule, on Python ints: per sentence its segment and its offset in the segment.
  segment = [0] * len(sentences)
  offset = [0] * len(sentences)
  counts, len_a_out, len_b_out = [], [], []   # per example: sentences, trimmed len(A), len(B)
  target_length, start, current_length = seq_len, 0, 0
  for i, length in enumerate(lengths):
    current_length += length
    if current_length < target_length and not doc_end[i]:
      continue
    if rng.random() < ELECTRA_ONE_SEGMENT_PROB:
      first_target = ELECTRA_ONE_SEGMENT_TARGET
    else:
      first_target = (target_length - 3) // 2
    len_a = len_b = 0
    for j in range(start, i + 1):
      n = lengths[j]
      if (len_a == 0 or len_a + n < first_target or
          (len_b == 0 and len_a < first_target and rng.random() < ELECTRA_OVERFLOW_TO_A_PROB)):
        offset[j], len_a = len_a, len_a + n
      else:
        segment[j], offset[j], len_b = 1, len_b, len_b + n
    len_a = min(len_a, seq_len - 2)
    len_b = min(len_b, max(0, seq_len - len_a - 3))
    counts.append(i + 1 - start)
    len_a_out.append(len_a)
    len_b_out.append(len_b)
    if rng.random() < ELECTRA_RANDOM_LENGTH_PROB:
      target_length = int(rng.integers(ELECTRA_MIN_RANDOM_LENGTH, seq_len + 1))
    else:
      target_length = seq_len
    start, current_length = i + 1, 0

  # Token t of sentence j lands in example(j) at column 1 + rank (A) or len(A) + 2 + rank (B),
  # rank = offset[j] + its position in the sentence, unless the trim cut it.
  len_a, len_b = np.array(len_a_out, np.int64), np.array(len_b_out, np.int64)
  sentence_lengths = np.array(lengths, np.int64)
  example = np.repeat(np.arange(len(counts)), counts)
  token_example = np.repeat(example, sentence_lengths)
  token_in_b = np.repeat(np.array(segment, bool), sentence_lengths)
  starts = np.cumsum(sentence_lengths) - sentence_lengths
  rank = (np.repeat(np.array(offset, np.int64) - starts, sentence_lengths)
          + np.arange(sentence_lengths.sum()))
  kept = rank < np.where(token_in_b, len_b[token_example], len_a[token_example])
  cols = np.where(token_in_b, len_a[token_example] + 2, 1) + rank
  stream = np.concatenate(sentences).astype(np.int32)
  num_examples = len(counts)
  rows = np.arange(num_examples)
  input_ids = np.full((num_examples, seq_len), pad_id, np.int32)
  input_ids[token_example[kept], cols[kept]] = stream[kept]
  input_ids[:, 0] = cls_id
  input_ids[rows, len_a + 1] = sep_id
  has_b = len_b > 0
  input_ids[rows[has_b], (len_a + len_b + 2)[has_b]] = sep_id
  row_lengths = len_a + 2 + np.where(has_b, len_b + 1, 0)
  positions = np.arange(seq_len)[None, :]
  input_mask = positions < row_lengths[:, None]
  return dict(
      input_ids=input_ids,
      segment_ids=((positions >= (len_a + 2)[:, None]) & input_mask).astype(np.int32),
      input_mask=input_mask.astype(np.int32),
  )


# ---------------------------------------------------------------------------------------------
# T5: raw token segments, and packing of (inputs, targets) pairs into encoder-decoder rows.
# ---------------------------------------------------------------------------------------------


def token_segments(docs: list[Document], segment_len: int, *, concat_documents: bool,
                   pad_id: int) -> dict[str, np.ndarray]:
  """T5's `reduce_concat_tokens` + `split_tokens`: raw segments of exactly segment_len tokens.

  t5/data/preprocessors.py (spec t5_objectives.md §3.0): with `concat_documents` the documents
  are concatenated in order with no separator and no EOS (span corruption, i.i.d. denoising);
  without it every document is split on its own (prefix LM, deshuffling: one document per
  example). Segments are cut every segment_len tokens; only the last segment of the stream (of
  each document without concatenation) may be shorter, and it is kept. The reference
  concatenates batches of 128 documents (and first takes a random 65,536-token chunk of longer
  documents); here the whole list given is one stream. Deterministic; empty sentences are
  skipped.

  Args:
    docs: documents, each a list of [len] int token arrays (sentences).
    segment_len: tokens per segment (e.g. `random_spans_helper(...)[0]`, or inputs_length - 1).
    concat_documents: concatenate documents (True) or keep each separate (False).
    pad_id: id filling the short last segments.

  Returns:
    tokens [n, segment_len] int32, lengths [n] int32, sentence_start [n, segment_len] bool
    (True at each sentence's first token; BART's sentence permutation).
  """
  sentences = [[s for s in doc if len(s)] for doc in docs]
  sentences = [doc for doc in sentences if doc]
  if not sentences:
    return dict(tokens=np.zeros((0, segment_len), np.int32), lengths=np.zeros(0, np.int32),
                sentence_start=np.zeros((0, segment_len), bool))
  flat = [s for doc in sentences for s in doc]
  stream = np.concatenate(flat).astype(np.int32)
  sentence_lengths = np.fromiter((len(s) for s in flat), np.int64, len(flat))
  is_first = np.zeros(len(stream), bool)
  is_first[np.cumsum(sentence_lengths) - sentence_lengths] = True
  doc_lengths = np.array([sum(len(s) for s in doc) for doc in sentences], np.int64)
  group_lengths = doc_lengths.sum(keepdims=True) if concat_documents else doc_lengths
  offset = np.arange(len(stream)) - np.repeat(np.cumsum(group_lengths) - group_lengths,
                                              group_lengths)
  segments_per_group = -(-group_lengths // segment_len)
  first_row = np.cumsum(segments_per_group) - segments_per_group
  rows = np.repeat(first_row, group_lengths) + offset // segment_len
  cols = offset % segment_len
  num_rows = int(segments_per_group.sum())
  tokens = np.full((num_rows, segment_len), pad_id, np.int32)
  tokens[rows, cols] = stream
  sentence_start = np.zeros((num_rows, segment_len), bool)
  sentence_start[rows, cols] = is_first
  return dict(tokens=tokens, lengths=np.bincount(rows, minlength=num_rows).astype(np.int32),
              sentence_start=sentence_start)


def lm_stream(docs: list[Document], seq_len: int, *, eod_id: int,
              pad_id: int) -> dict[str, np.ndarray]:
  """GPT's language-model rows: the documents as one token stream, each followed by `eod_id`
  (GPT-2's <|endoftext|>), cut into consecutive rows of `seq_len` tokens whose targets are the
  next token of the stream, so that every token but the stream's first is predicted exactly once
  (the last target of a row is the first input of the next). Attention crosses document
  boundaries, as in finetune-transformer-lm's contiguous 512-token BooksCorpus sequences and
  transformers' run_clm `group_texts`. Only the last row may be short; it is padded. Empty
  documents are skipped; deterministic.

  Args:
    docs: documents, each a list of [len] int token arrays (sentences).
    seq_len: L, the tokens of a row.
    eod_id: the end-of-document id; pad_id: the id filling the short last row.

  Returns:
    input_ids [n, L] int32, input_mask [n, L] int32 (1 on real inputs), target_ids [n, L] int32
    (the next token; pad_id beyond the stream), loss_weights [n, L] float32 (1.0 on real targets).
  """
  tokens = [np.concatenate(doc) for doc in docs if any(len(s) for s in doc)]
  if not tokens:
    empty = np.zeros((0, seq_len), np.int32)
    return dict(input_ids=empty, input_mask=empty, target_ids=empty,
                loss_weights=empty.astype(np.float32))
  lengths = np.fromiter((len(t) for t in tokens), np.int64, len(tokens))
  stream = np.insert(np.concatenate(tokens).astype(np.int32), np.cumsum(lengths), eod_id)
  num_rows = -(-(len(stream) - 1) // seq_len)
  index = np.arange(num_rows)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
  rows = np.append(stream, np.full(num_rows * seq_len + 1 - len(stream), pad_id, np.int32))[index]
  real = index < len(stream)
  return dict(input_ids=rows[:, :-1], input_mask=real[:, :-1].astype(np.int32),
              target_ids=rows[:, 1:], loss_weights=real[:, 1:].astype(np.float32))


def _place_packed(tokens: np.ndarray, lengths: np.ndarray, row: np.ndarray, offset: np.ndarray,
                  num_rows: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Writes example e's first lengths[e] tokens to row[e] from column offset[e].

  Returns:
    ids, segment_ids (1 + index of the example within its row; 0 = pad), positions
    (0..len-1 within each example; 0 on pad), each [num_rows, width] int32.
  """
  num_examples = len(lengths)
  example = np.repeat(np.arange(num_examples), lengths)
  rank = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
  segment = np.arange(num_examples) - np.searchsorted(row, row) + 1   # rows are ascending
  ids = np.zeros((num_rows, width), np.int32)
  segment_ids = np.zeros((num_rows, width), np.int32)
  positions = np.zeros((num_rows, width), np.int32)
  rows, cols = row[example], offset[example] + rank
  ids[rows, cols] = tokens[example, rank]
  segment_ids[rows, cols] = segment[example]
  positions[rows, cols] = rank
  return ids, segment_ids, positions


def _next_fit(lengths: Sequence[np.ndarray], capacities: Sequence[int],
              examples_per_row: int | None) -> tuple[np.ndarray, list[np.ndarray]]:
  """seqio's packing order: greedy in order, an example joins the current row while each of its
  sides fits that side's capacity (and the row holds fewer than `examples_per_row`, when given),
  else it starts a new row. Loops over examples on Python ints.

  Args:
    lengths: per side, [n] int lengths, each at most its capacity.
    capacities: per side, the row length.
    examples_per_row: at most this many examples in a row; None: as many as fit.

  Returns:
    row [n] (ascending from 0) and, per side, offset [n]: the column where the example starts.
  """
  num_examples = len(lengths[0])
  row = np.zeros(num_examples, np.int64)
  offsets = [np.zeros(num_examples, np.int64) for _ in lengths]
  current, used, in_row = -1, [0] * len(lengths), 0
  row_full = examples_per_row or num_examples
  for e, sizes in enumerate(zip(*(side.tolist() for side in lengths))):
    if (current < 0 or in_row == row_full
        or any(u + n > c for u, n, c in zip(used, sizes, capacities))):
      current, used, in_row = current + 1, [0] * len(lengths), 0
    row[e] = current
    for offset, u in zip(offsets, used):
      offset[e] = u
    used, in_row = [u + n for u, n in zip(used, sizes)], in_row + 1
  return row, offsets


def pack_seq2seq(inputs: np.ndarray, input_lengths: np.ndarray, targets: np.ndarray,
                 target_lengths: np.ndarray, *, inputs_length: int,
                 targets_length: int, cut: np.ndarray | None = None,
                 examples_per_row: int | None = None) -> dict[str, np.ndarray]:
  """seqio's `trim_and_pack` + `EncDecFeatureConverter`: (inputs, targets) pairs -> packed rows.

  Each example is first trimmed to inputs_length / targets_length (after
  `t5_noise.append_eos_after_trim` nothing is). Greedy in order: an example joins the current
  row while both its sides fit (and the row holds fewer than `examples_per_row`, when given),
  else it starts a new row. Within a row the k-th example has
  segment id k (1-based) on both sides and positions counting from 0. The decoder inputs are the
  targets shifted right within each segment, with 0 (BOS, `make_autoregressive_inputs(bos_id=0)`)
  at every segment start; every non-pad target, sentinels and EOS included, has loss weight 1.
  The greedy assignment loops over examples on Python ints; the placement is vectorised.

  Args:
    inputs: [n, Li'] int ids, left-aligned; input_lengths: [n] int.
    targets: [n, Lt'] int ids, left-aligned; target_lengths: [n] int.
    inputs_length, targets_length: Li, Lt, the packed row lengths.
    cut: [n] bool, the examples whose targets were cut short (optional).
    examples_per_row: at most this many examples in a row (1: unpacked rows, what cuDNN
      attention needs); None: as many as fit.

  Returns:
    input_ids, input_mask, input_segment_ids, input_positions [rows, Li] int32;
    decoder_target_ids, decoder_input_ids, decoder_segment_ids, decoder_positions [rows, Lt]
    int32; decoder_loss_weights [rows, Lt] float32; with `cut`, targets_cut [rows] int32: how
    many of the row's examples were cut.
  """
  input_lengths = np.minimum(np.asarray(input_lengths, np.int64), inputs_length)
  target_lengths = np.minimum(np.asarray(target_lengths, np.int64), targets_length)
  row, (input_offset, target_offset) = _next_fit((input_lengths, target_lengths),
                                                 (inputs_length, targets_length), examples_per_row)
  num_rows = int(row[-1]) + 1 if len(row) else 0
  input_ids, input_segment_ids, input_positions = _place_packed(
      inputs, input_lengths, row, input_offset, num_rows, inputs_length)
  target_ids, decoder_segment_ids, decoder_positions = _place_packed(
      targets, target_lengths, row, target_offset, num_rows, targets_length)
  shifted = np.zeros_like(target_ids)
  shifted[:, 1:] = target_ids[:, :-1]
  counted = {} if cut is None else dict(targets_cut=np.bincount(
      row, weights=np.asarray(cut, np.float64), minlength=num_rows).astype(np.int32))
  return dict(
      **counted,
      input_ids=input_ids,
      input_mask=(input_segment_ids > 0).astype(np.int32),
      input_segment_ids=input_segment_ids,
      input_positions=input_positions,
      decoder_target_ids=target_ids,
      decoder_input_ids=np.where(decoder_positions > 0, shifted, 0).astype(np.int32),
      decoder_segment_ids=decoder_segment_ids,
      decoder_positions=decoder_positions,
      decoder_loss_weights=(decoder_segment_ids > 0).astype(np.float32),
  )


def pack_decoder_only(inputs: np.ndarray, input_lengths: np.ndarray, targets: np.ndarray,
                      target_lengths: np.ndarray, *, inputs_length: int, targets_length: int,
                      loss_on_targets_only: bool = True, cut: np.ndarray | None = None,
                      examples_per_row: int | None = None) -> dict[str, np.ndarray]:
  """seqio's `PrefixLMFeatureConverter` (t5x's decoder-only and prefix-LM input): each example's
  inputs (≤ inputs_length) and targets (≤ targets_length) concatenated into one sequence, the
  sequences packed in order (`_next_fit`) into rows of inputs_length + targets_length.

  Within a row the k-th example has segment id k and positions from 0; the decoder inputs are the
  sequence shifted right within its segment (0 at each start). `decoder_causal_attention` is 1 on
  the example's inputs and one position more (where the last input is read and the first target
  predicted; mesh-tensorflow's rule): the bidirectional prefix of a prefix LM, ignored by a
  decoder-only LM. The loss weights are 1 on the targets (`loss_on_targets_only`, seqio's
  default), or on every token of the sequence.

  Args:
    inputs: [n, Li'] int ids, left-aligned; input_lengths: [n] int.
    targets: [n, Lt'] int ids, left-aligned; target_lengths: [n] int (each ≥ 1, an EOS at least).
    inputs_length, targets_length: Li, Lt; rows are Li + Lt long.
    cut: [n] bool, the examples whose targets were cut short (optional).
    examples_per_row: at most this many examples in a row (1 for cuDNN attention).

  Returns:
    decoder_target_ids, decoder_input_ids, decoder_segment_ids, decoder_positions,
    decoder_causal_attention [rows, Li + Lt] int32; decoder_loss_weights [rows, Li + Lt]
    float32; with `cut`, targets_cut [rows] int32.
  """
  input_lengths = np.minimum(np.asarray(input_lengths, np.int64), inputs_length)
  target_lengths = np.minimum(np.asarray(target_lengths, np.int64), targets_length)
  if np.any(target_lengths < 1):
    raise ValueError("pack_decoder_only: an example has empty targets (seqio refuses them too); "
                     "targets hold an EOS at least.")
  n, length = len(input_lengths), inputs_length + targets_length
  sequences = np.zeros((n, length), np.int32)
  columns = np.arange(length)[None, :]
  example, column = np.nonzero(columns < input_lengths[:, None])
  sequences[example, column] = np.asarray(inputs)[example, column]
  target_columns = columns - input_lengths[:, None]
  in_targets = (target_columns >= 0) & (target_columns < target_lengths[:, None])
  example, column = np.nonzero(in_targets)
  sequences[example, column] = np.asarray(targets)[example, target_columns[example, column]]
  lengths = input_lengths + target_lengths
  row, (offset,) = _next_fit((lengths,), (length,), examples_per_row)
  num_rows = int(row[-1]) + 1 if n else 0
  ids, segment_ids, positions = _place_packed(sequences, lengths, row, offset, num_rows, length)
  # Each position's inputs width, placed as the tokens are.
  widths, _, _ = _place_packed(np.repeat(input_lengths[:, None], length, 1).astype(np.int32),
                               lengths, row, offset, num_rows, length)
  shifted = np.zeros_like(ids)
  shifted[:, 1:] = ids[:, :-1]
  real = segment_ids > 0
  loss = real & (positions >= widths) if loss_on_targets_only else real
  counted = {} if cut is None else dict(targets_cut=np.bincount(
      row, weights=np.asarray(cut, np.float64), minlength=num_rows).astype(np.int32))
  return dict(
      **counted,
      decoder_target_ids=ids,
      decoder_input_ids=np.where(positions > 0, shifted, 0).astype(np.int32),
      decoder_segment_ids=segment_ids,
      decoder_positions=positions,
      decoder_causal_attention=(real & (positions < widths + 1)).astype(np.int32),
      decoder_loss_weights=loss.astype(np.float32),
  )


# ----------------------------------------------------------------------------- XLNet


def eod_id(tokenizer) -> int:
  """The end-of-document id: `tokenizer.eod_id` when the vocabulary has one (configs/xlnet.py's
  tokenizers have `<eod>` = 5, XLNet's released one 7; an ordinary token, predicted like any
  other as in the reference), else [SEP] (a functional token: it takes part in the order with
  its rank and is never predicted)."""
  eod = getattr(tokenizer, "eod_id", None)
  return tokenizer.sep_id if eod is None else eod


def check_xlnet_rows(row_length: int, num_rows: int, num_docs: int, docs_per_chunk: int,
                     seq_len: int) -> None:
  """Refuses a full chunk (`num_docs` >= docs_per_chunk documents) whose `num_rows` parallel
  rows (`xlnet_streams`) hold fewer than one `seq_len` window each: every chunk would then
  yield nothing, found only after an epoch of tokenizing. (The reference's rows are its whole
  corpus; ours are a chunk's, so the memory carries real context W − 1 steps in W.)"""
  if num_docs < docs_per_chunk or row_length >= seq_len:
    return
  needed = math.ceil(docs_per_chunk * 4 * seq_len / max(row_length, 1))
  raise ConfigError(
      f"XLNet cuts each chunk of data.docs_per_chunk={docs_per_chunk} documents into {num_rows} "
      f"parallel rows (the batch per data shard); a full chunk's rows hold {row_length} tokens, "
      f"fewer than one {seq_len}-token window, so no chunk yields an example. Raise "
      f"--config.data.docs_per_chunk (about {needed} gives rows of four windows) or lower the "
      f"batch per data shard.")


def xlnet_streams(docs: Sequence[Sequence[np.ndarray]], num_rows: int, *, bi_data: bool,
                eod_id: int, use_eod: bool = True) -> dict[str, np.ndarray]:
  """A chunk's documents as `num_rows` parallel token streams (the reference's data layout).

  _create_data: sentences are concatenated with a sentence id alternating per sentence; with
  `use_eod` an <eod> follows every document and shares its last sentence's id (so a cut point
  never falls before an <eod>). batchify: the stream is cut into rows of ⌊len / rows⌋ tokens,
  the tail dropped. bi_data: num_rows / 2 forward rows, then the same rows reversed.

  Args:
    docs: documents, each a list of [len] int token arrays (sentences, no special tokens).
    num_rows: R, the rows of a (per data shard) batch.
    bi_data: half the rows reversed.
    eod_id: the end-of-document token (`eod_id(tokenizer)`).
    use_eod: append it after every document.

  Returns:
    input_ids [R, T] int32, sent_ids [R, T] int32 (0/1), reverse [R] bool.
  """
  if num_rows < 1 or (bi_data and num_rows % 2):
    raise ConfigError(f"XLNet's bi_data needs an even number of rows per batch (per data shard), "
                      f"got {num_rows}; use an even --config.train.batch_size per shard or "
                      f"--config.objective.bi_data=False.")
  pieces, ids, sent_id = [], [], 1   # the reference starts with sent_id = True
  for doc in docs:
    sentences = [np.asarray(s, np.int32) for s in doc if len(s)]
    if not sentences:
      continue
    for sentence in sentences:
      pieces.append(sentence)
      ids.append(np.full(len(sentence), sent_id, np.int32))
      sent_id ^= 1
    if use_eod:
      pieces.append(np.array([eod_id], np.int32))
      ids.append(np.array([sent_id ^ 1], np.int32))
  data = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
  sent_ids = np.concatenate(ids) if ids else np.zeros(0, np.int32)
  forward = num_rows // 2 if bi_data else num_rows
  steps = len(data) // forward
  data = data[:forward * steps].reshape(forward, steps)
  sent_ids = sent_ids[:forward * steps].reshape(forward, steps)
  reverse = np.zeros(forward, bool)
  if bi_data:
    data = np.concatenate([data, data[:, ::-1]])
    sent_ids = np.concatenate([sent_ids, sent_ids[:, ::-1]])
    reverse = np.concatenate([reverse, ~reverse])
  return dict(input_ids=np.ascontiguousarray(data), sent_ids=np.ascontiguousarray(sent_ids),
              reverse=reverse)
