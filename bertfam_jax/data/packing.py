"""Packing tokenized documents into fixed-length examples: BERT sentence pairs, RoBERTa blocks.

Input everywhere: `docs`, a list of documents, each a list of sentences, each a [len] int array
of token ids (no special tokens). Output: a dict of numpy arrays following the batch-key
convention of `bertfam_jax.objectives` (`n` examples of length `L = seq_len`):
  input_ids [n, L] int32, segment_ids [n, L] int32, input_mask [n, L] int32
and, for sentence pairs, sentence_label [n] int32.
"""

from __future__ import annotations

import bisect
from typing import Callable

import numpy as np

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


def _nsp_pair(chunk: list[np.ndarray], a_end: int, docs: list[Document], doc_index: int,
              target_len: int, rng: np.random.Generator, random_next_prob: float):
  """BERT next-sentence prediction (create_pretraining_data.py, steps 5-6 of the spec).

  B is a random other document's text when the chunk has one sentence or with probability
  `random_next_prob` (label 1); the chunk's unused sentences are then handed back to be read
  again. Otherwise B is the rest of the chunk (label 0 = IsNext).
  """
  tokens_a = np.concatenate(chunk[:a_end])
  if len(chunk) == 1 or rng.random() < random_next_prob:
    tokens_b = _random_document_segment(docs, doc_index, target_len - len(tokens_a), rng)
    return tokens_a, tokens_b, 1, len(chunk) - a_end
  return tokens_a, np.concatenate(chunk[a_end:]), 0, 0


_PAIR_RULES: dict[str, PairRule] = {"nsp": _nsp_pair}


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
    pair_mode: 'nsp' (BERT). ALBERT's sentence-order prediction will add 'sop' as another
      `_PAIR_RULES` entry.

  Returns:
    input_ids [n, L] int32, segment_ids [n, L] int32 (0 for [CLS] A [SEP], 1 for B [SEP]),
    input_mask [n, L] int32, sentence_label [n] int32 (0 = IsNext, 1 = random next).
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


def full_sentences(docs: list[Document], seq_len: int, *, cls_id: int, sep_id: int,
                   pad_id: int) -> dict[str, np.ndarray]:
  """RoBERTa FULL-SENTENCES: `<s>` + complete sentences, across document boundaries.

  fairseq (masked_lm task, TokenBlockDataset with break_mode='complete', then a prepended BOS):
  every sentence is followed by `</s>` (our [SEP]); blocks greedily take whole sentences while
  they fit in L - 1 tokens, crossing document boundaries; then `<s>` (our [CLS]) is prepended.
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
  sentences = [s for doc in docs for s in doc if len(s)]
  if not sentences:
    empty = np.zeros((0, seq_len), np.int32)
    return dict(input_ids=empty, segment_ids=empty, input_mask=empty)
  lengths = np.fromiter((len(s) for s in sentences), np.int64, len(sentences))
  # Insert </s> after every sentence in one vectorised call.
  stream = np.insert(np.concatenate(sentences).astype(np.int32), np.cumsum(lengths), sep_id)
  breaks = _break_points(np.cumsum(lengths + 1), block_len).tolist()
  # Greedy packing: each block ends at the last break within block_len of its start. Every
  # unit between breaks is <= block_len, so each step advances; one bisect per block.
  block_ends, start = [], 0
  while start < len(stream):
    start = breaks[bisect.bisect_right(breaks, start + block_len) - 1]
    block_ends.append(start)
  ends = np.asarray(block_ends, np.int64)
  starts = np.concatenate([[0], ends[:-1]])
  block_lengths = ends - starts
  num_blocks = len(ends)
  input_ids = np.full((num_blocks, seq_len), pad_id, np.int32)
  input_ids[:, 0] = cls_id
  # Blocks tile the stream, so token t of the stream lands in row block(t), column 1 + offset.
  rows = np.repeat(np.arange(num_blocks), block_lengths)
  cols = 1 + np.arange(len(stream)) - np.repeat(starts, block_lengths)
  input_ids[rows, cols] = stream
  input_mask = (np.arange(seq_len)[None, :] < (block_lengths + 1)[:, None]).astype(np.int32)
  return dict(input_ids=input_ids, segment_ids=np.zeros_like(input_ids), input_mask=input_mask)
