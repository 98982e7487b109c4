"""Tests of the T5 additions to bertfam_jax.data.packing: `token_segments` (reduce_concat_tokens +
split_tokens, spec t5_objectives.md §3.0) and `pack_seq2seq` (seqio trim_and_pack +
EncDecFeatureConverter). Every token id is unique, so each packed token traces back to its
example."""

import numpy as np

from bertfam_jax.data import packing

PAD = 0


def docs_of(sentence_lengths_per_doc, first_id=10):
  """Documents of consecutive unique ids; returns (docs, the stream per document)."""
  docs, next_id = [], first_id
  for lengths in sentence_lengths_per_doc:
    doc = []
    for length in lengths:
      doc.append(np.arange(next_id, next_id + length, dtype=np.int32))
      next_id += length
    docs.append(doc)
  return docs


def rows_of(out):
  return [out["tokens"][i, :out["lengths"][i]].tolist() for i in range(len(out["lengths"]))]


def test_token_segments_concatenated_stream():
  docs = docs_of([[3, 4], [], [0, 5], [2, 2, 2]])
  out = packing.token_segments(docs, 4, concat_documents=True, pad_id=PAD)
  stream = np.concatenate([s for doc in docs for s in doc]).tolist()
  # Cut every 4 tokens across documents; only the last segment is shorter, and it is kept.
  assert rows_of(out) == [stream[i:i + 4] for i in range(0, len(stream), 4)]
  assert (out["tokens"][-1, out["lengths"][-1]:] == PAD).all()
  firsts = {int(s[0]) for doc in docs for s in doc if len(s)}
  np.testing.assert_array_equal(out["sentence_start"], np.isin(out["tokens"], list(firsts)))
  assert out["tokens"].dtype == np.int32 and out["lengths"].dtype == np.int32


def test_token_segments_per_document():
  docs = docs_of([[3, 4], [5], [2, 2, 2, 3]])
  out = packing.token_segments(docs, 4, concat_documents=False, pad_id=PAD)
  expected = []
  for doc in docs:
    tokens = np.concatenate(doc).tolist()
    expected += [tokens[i:i + 4] for i in range(0, len(tokens), 4)]
  assert rows_of(out) == expected       # no segment mixes two documents
  empty = packing.token_segments([[], [np.zeros(0, np.int32)]], 4, concat_documents=False,
                                 pad_id=PAD)
  assert empty["tokens"].shape == (0, 4)


def reference_greedy_rows(input_lengths, target_lengths, inputs_length, targets_length):
  """seqio trim_and_pack (tf-ops greedy): a new row when the next example does not fit."""
  rows, current = [], None
  for e, (a, b) in enumerate(zip(input_lengths, target_lengths)):
    a, b = min(a, inputs_length), min(b, targets_length)
    if current is None or current[1] + a > inputs_length or current[2] + b > targets_length:
      current = [[], 0, 0]
      rows.append(current)
    current[0].append(e)
    current[1] += a
    current[2] += b
  return [examples for examples, _, _ in rows]


def test_pack_seq2seq_layout():
  rng = np.random.default_rng(0)
  n, inputs_length, targets_length = 60, 16, 8
  input_lengths = rng.integers(1, 19, n)            # some longer than a side: trimmed
  target_lengths = rng.integers(1, 10, n)
  inputs = np.arange(n)[:, None] * 1000 + 1 + np.arange(20)[None, :]       # example e: e*1000+..
  targets = np.arange(n)[:, None] * 1000 + 501 + np.arange(20)[None, :]
  out = packing.pack_seq2seq(inputs, input_lengths, targets, target_lengths,
                             inputs_length=inputs_length, targets_length=targets_length)
  expected_rows = reference_greedy_rows(input_lengths, target_lengths, inputs_length,
                                        targets_length)
  assert out["input_ids"].shape == (len(expected_rows), inputs_length)
  assert out["decoder_target_ids"].shape == (len(expected_rows), targets_length)
  for key, value in out.items():
    assert value.dtype == (np.float32 if key == "decoder_loss_weights" else np.int32), key
  for r, examples in enumerate(expected_rows):
    for prefix, ids_key, width, lengths, source in (
        ("input", "input_ids", inputs_length, input_lengths, inputs),
        ("decoder", "decoder_target_ids", targets_length, target_lengths, targets)):
      ids, segments = out[ids_key][r], out[f"{prefix}_segment_ids"][r]
      positions = out[f"{prefix}_positions"][r]
      column = 0
      for k, e in enumerate(examples):
        length = min(lengths[e], width)
        span = slice(column, column + length)
        # Segment k + 1 holds exactly example e's (trimmed) tokens, positions from 0; the same
        # segment id on both sides is the same example.
        np.testing.assert_array_equal(ids[span], source[e, :length])
        assert (segments[span] == k + 1).all()
        np.testing.assert_array_equal(positions[span], np.arange(length))
        column += length
      assert (ids[column:] == PAD).all() and (segments[column:] == 0).all()
      assert (positions[column:] == 0).all()
    np.testing.assert_array_equal(out["input_mask"][r], out["input_segment_ids"][r] > 0)
    np.testing.assert_array_equal(out["decoder_loss_weights"][r],
                                  (out["decoder_segment_ids"][r] > 0).astype(np.float32))
  # With the examples' cut flags, each row counts its own cut examples.
  cut = target_lengths > targets_length
  counted = packing.pack_seq2seq(inputs, input_lengths, targets, target_lengths,
                                 inputs_length=inputs_length, targets_length=targets_length,
                                 cut=cut)["targets_cut"]
  assert counted.tolist() == [int(cut[examples].sum()) for examples in expected_rows]
  assert "targets_cut" not in out
  # Decoder inputs: targets shifted right within each segment, 0 (BOS) at every segment start.
  targets_out, segments = out["decoder_target_ids"], out["decoder_segment_ids"]
  decoder_inputs = out["decoder_input_ids"]
  for r in range(len(expected_rows)):
    for t in range(targets_length):
      same = t > 0 and segments[r, t] > 0 and segments[r, t - 1] == segments[r, t]
      assert decoder_inputs[r, t] == (targets_out[r, t - 1] if same else 0)


def test_pack_seq2seq_exact_fit_and_empty():
  inputs = np.array([[1, 2, 0], [3, 4, 5], [6, 0, 0]])
  targets = np.array([[7, 0], [8, 9], [10, 0]])
  out = packing.pack_seq2seq(inputs, [2, 3, 1], targets, [1, 2, 1], inputs_length=5,
                             targets_length=3)
  # Examples 0 and 1 fill the inputs exactly (2 + 3) and targets (1 + 2); example 2 starts a row.
  np.testing.assert_array_equal(out["input_ids"], [[1, 2, 3, 4, 5], [6, 0, 0, 0, 0]])
  np.testing.assert_array_equal(out["decoder_target_ids"], [[7, 8, 9], [10, 0, 0]])
  np.testing.assert_array_equal(out["decoder_input_ids"], [[0, 0, 8], [0, 0, 0]])
  np.testing.assert_array_equal(out["decoder_segment_ids"], [[1, 2, 2], [1, 0, 0]])
  empty = packing.pack_seq2seq(np.zeros((0, 3), int), [], np.zeros((0, 2), int), [],
                               inputs_length=5, targets_length=3)
  assert empty["input_ids"].shape == (0, 5) and empty["decoder_input_ids"].shape == (0, 3)


def test_pack_seq2seq_examples_per_row():
  """examples_per_row=1 (what cuDNN attention needs) gives each example its own row; 2 caps rows
  that would hold three."""
  inputs = np.array([[1, 0], [2, 0], [3, 0]])
  targets = np.array([[4, 0], [5, 0], [6, 0]])
  args = (inputs, [1, 1, 1], targets, [1, 1, 1])
  packed = packing.pack_seq2seq(*args, inputs_length=6, targets_length=6)
  assert packed["input_segment_ids"].tolist() == [[1, 2, 3, 0, 0, 0]]
  one = packing.pack_seq2seq(*args, inputs_length=6, targets_length=6, examples_per_row=1)
  np.testing.assert_array_equal(one["input_ids"][:, 0], [1, 2, 3])
  assert one["input_segment_ids"].max() == 1 and one["decoder_segment_ids"].max() == 1
  two = packing.pack_seq2seq(*args, inputs_length=6, targets_length=6, examples_per_row=2)
  assert two["input_segment_ids"].tolist() == [[1, 2, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]]


def test_pack_decoder_only_is_seqio_prefix_lm_feature_converter():
  """seqio's PrefixLMFeatureConverter docstring example, array for array (its loss weights are
  those of loss_on_targets_only=False); with the default, the loss is on the targets only."""
  inputs = np.array([[7, 8, 5, 1, 0], [8, 4, 9, 3, 1]])
  targets = np.array([[3, 9, 1], [4, 1, 0]])
  kwargs = dict(inputs_length=7, targets_length=8)
  out = packing.pack_decoder_only(inputs, [4, 5], targets, [3, 2], loss_on_targets_only=False,
                                  **kwargs)
  expected = dict(
      decoder_target_ids=[7, 8, 5, 1, 3, 9, 1, 8, 4, 9, 3, 1, 4, 1, 0],
      decoder_input_ids=[0, 7, 8, 5, 1, 3, 9, 0, 8, 4, 9, 3, 1, 4, 0],
      decoder_loss_weights=[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0],
      decoder_positions=[0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 0],
      decoder_segment_ids=[1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 0],
      decoder_causal_attention=[1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0])
  assert {k: v.tolist() for k, v in out.items()} == {k: [v] for k, v in expected.items()}
  out = packing.pack_decoder_only(inputs, [4, 5], targets, [3, 2], **kwargs)
  assert out["decoder_loss_weights"].tolist() == [[0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 0]]


def test_pack_decoder_only_rows_hold_each_example_concatenated():
  """Random examples of unique ids: each segment is its example's inputs then targets, rows are
  filled in order while the concatenation fits, the prefix is the inputs plus one position."""
  rng = np.random.default_rng(1)
  n, inputs_length, targets_length = 40, 12, 6
  input_lengths, target_lengths = rng.integers(0, 13, n), rng.integers(1, 7, n)
  ids = np.arange(10, 10 + n * 18).reshape(n, 18)
  inputs, targets = ids[:, :12], ids[:, 12:]
  out = packing.pack_decoder_only(inputs, input_lengths, targets, target_lengths,
                                  inputs_length=inputs_length, targets_length=targets_length,
                                  cut=target_lengths == 6)
  length = inputs_length + targets_length
  expected_rows = reference_greedy_rows(input_lengths + target_lengths, [0] * n, length, 1)
  assert len(out["decoder_target_ids"]) == len(expected_rows)
  for row, examples in enumerate(expected_rows):
    segments = out["decoder_segment_ids"][row]
    for s, e in enumerate(examples, 1):
      a = input_lengths[e]
      sequence = out["decoder_target_ids"][row][segments == s]
      assert sequence.tolist() == inputs[e, :a].tolist() + targets[e, :target_lengths[e]].tolist()
      prefix = out["decoder_causal_attention"][row][segments == s]
      assert prefix.tolist() == [1] * (a + 1) + [0] * (len(sequence) - a - 1)
      loss = out["decoder_loss_weights"][row][segments == s]
      assert loss.tolist() == [0] * a + [1] * target_lengths[e]
      shifted = out["decoder_input_ids"][row][segments == s]
      assert shifted.tolist() == [0] + sequence[:-1].tolist()
    assert out["targets_cut"][row] == sum(target_lengths[e] == 6 for e in examples)
  assert (out["decoder_causal_attention"][out["decoder_segment_ids"] == 0] == 0).all()
