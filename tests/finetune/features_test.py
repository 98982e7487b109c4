"""Tests for bertfam_jax.finetune.features against BERT's run_classifier.py / run_squad.py."""

import numpy as np
import pytest

from bertfam_jax.data import tokenizers
from bertfam_jax.finetune import features

WORDS = ("the cat dog sat on a mat quickly ran over hill river bank money green old new tree "
         "house café naïve Zürich blue red small large apple banana stone water fire").split()


def _sentences(rng, count, low=3, high=14):
  return [" ".join(rng.choice(WORDS, rng.integers(low, high))) for _ in range(count)]


@pytest.fixture(scope="module")
def tokenizer():
  rng = np.random.default_rng(0)
  proto = tokenizers.train_sentencepiece(_sentences(rng, 2000), 130, "bpe")
  return tokenizers.Tokenizer(proto)


class _TwoSeparators:
  """RoBERTa's layout on our tokenizer: </s></s> between the segments."""

  def __init__(self, tokenizer):
    self._tokenizer = tokenizer
    self.pair_separator_ids = (tokenizer.sep_id, tokenizer.sep_id)

  def __getattr__(self, name):
    return getattr(self._tokenizer, name)


def test_truncated_pair_lengths_matches_bert_loop():
  def reference(a, b, max_tokens):   # run_classifier.py _truncate_seq_pair
    while a + b > max_tokens:
      if a > b:
        a -= 1
      else:
        b -= 1
    return a, b
  for a in range(12):
    for b in range(12):
      for max_tokens in range(1, 14):
        assert features.truncated_pair_lengths(a, b, max_tokens) == reference(a, b, max_tokens)


def test_encode_pairs_layout(tokenizer):
  a, b = tokenizer.encode(["the cat sat on the mat", "a dog ran"])
  out = features.encode_pairs(tokenizer, ["the cat sat on the mat"], 40, ["a dog ran"])
  cls, sep, pad = tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id
  expected = [cls, *a, sep, *b, sep]
  np.testing.assert_array_equal(out["input_ids"][0], expected + [pad] * (40 - len(expected)))
  padding = [0] * (40 - len(expected))
  np.testing.assert_array_equal(out["input_mask"][0], [1] * len(expected) + padding)
  np.testing.assert_array_equal(out["segment_ids"][0],
                                [0] * (len(a) + 2) + [1] * (len(b) + 1) + padding)
  single = features.encode_pairs(tokenizer, ["the cat sat on the mat"], 5)
  np.testing.assert_array_equal(single["input_ids"][0], [cls, *a[:3], sep])
  assert single["segment_ids"].sum() == 0


def test_xlnet_layout_puts_cls_last_and_pads_on_the_left(tokenizer):
  """xlnet classifier_utils.py convert_single_example: A <sep> B <sep> <cls>, segments 0 / 1 / 2
  (SEG_ID_CLS), left padding with segment 4 (SEG_ID_PAD) and input mask 0; pairs truncated to
  seq_len - 3 as BERT's, single texts to seq_len - 2."""
  a, b = tokenizer.encode(["the cat sat on the mat", "a dog ran"])
  cls, sep, pad = tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id
  out = features.encode_pairs(tokenizer, ["the cat sat on the mat"], 40, ["a dog ran"], "xlnet")
  real = [*a, sep, *b, sep, cls]
  padding = 40 - len(real)
  np.testing.assert_array_equal(out["input_ids"][0], [pad] * padding + real)
  np.testing.assert_array_equal(out["input_mask"][0], [0] * padding + [1] * len(real))
  np.testing.assert_array_equal(out["segment_ids"][0], [4] * padding + [0] * (len(a) + 1)
                                + [1] * (len(b) + 1) + [2])
  short = features.encode_pairs(tokenizer, ["the cat sat on the mat"], len(b) + 6, ["a dog ran"],
                                "xlnet")
  kept_a, kept_b = features.truncated_pair_lengths(len(a), len(b), len(b) + 3)
  np.testing.assert_array_equal(short["input_ids"][0],
                                [*a[:kept_a], sep, *b[:kept_b], sep, cls])
  single = features.encode_pairs(tokenizer, ["the cat sat on the mat"], 5, layout="xlnet")
  np.testing.assert_array_equal(single["input_ids"][0], [*a[:3], sep, cls])
  np.testing.assert_array_equal(single["segment_ids"][0], [0, 0, 0, 0, 2])
  choices = features.choice_features(
      tokenizer, [dict(question="the cat", choices=["sat", "ran"], label=1)], 16, "xlnet")
  assert (choices["input_ids"][0, :, -1] == cls).all() and (choices["input_mask"][0, :, 0] == 0).all()


def test_encode_pairs_roberta_separator_and_truncation(tokenizer):
  roberta = _TwoSeparators(tokenizer)
  a, b = tokenizer.encode(["the cat sat on the mat quickly", "a dog"])
  seq_len = len(b) + 8
  out = features.encode_pairs(roberta, ["the cat sat on the mat quickly"], seq_len, ["a dog"])
  kept_a, kept_b = features.truncated_pair_lengths(len(a), len(b), seq_len - 4)
  cls, sep = tokenizer.cls_id, tokenizer.sep_id
  expected = [cls, *a[:kept_a], sep, sep, *b[:kept_b], sep]
  assert len(expected) == seq_len
  np.testing.assert_array_equal(out["input_ids"][0], expected)
  np.testing.assert_array_equal(out["segment_ids"][0], [0] * (kept_a + 3) + [1] * (kept_b + 1))


def test_choice_features_shape(tokenizer):
  examples = [dict(question="the cat", choices=["sat", "ran", "dog"], label=2)] * 2
  out = features.choice_features(tokenizer, examples, 16)
  assert out["input_ids"].shape == (2, 3, 16) and out["label"].tolist() == [2, 2]
  flat = features.encode_pairs(tokenizer, ["the cat"] * 3, 16, ["sat", "ran", "dog"])
  np.testing.assert_array_equal(out["input_ids"][0], flat["input_ids"])


def test_tagging_features_label_first_sub_token(tokenizer):
  words = ["Zürich", "café", "bank", "naïve", "old"]
  out = features.tagging_features(tokenizer, [dict(words=words, labels=[1, 2, 3, 4, 5])], 32)
  ids, offsets = tokenizer.encode_with_offsets([" ".join(words)])
  positions = out["word_positions"][0]
  assert (positions > 0).all() and (np.diff(positions) > 0).all()
  text = " ".join(words)
  for word, position in zip(words, positions):
    start, end = offsets[0][position - 1]
    assert text[start:end] and word.startswith(text[start:end])   # the word's first sub-token
  np.testing.assert_array_equal(out["labels"][0, positions], [1, 2, 3, 4, 5])
  assert out["label_weights"][0].sum() == 5 and out["label_weights"][0, positions].all()
  # Truncation: words past the window lose their label and predict 0.
  short = features.tagging_features(tokenizer, [dict(words=words, labels=[1, 2, 3, 4, 5])],
                                    positions[2] + 1)
  assert (short["word_positions"][0, 2:] == -1).all()
  assert features.word_predictions(short["labels"], short["word_positions"], [5]) == [
      [1, 2, 0, 0, 0]]


def test_tagging_features_rows_of_different_lengths(tokenizer):
  """Each row's labels land on its own words' first sub-tokens when a batch mixes lengths."""
  examples = [dict(words=["old", "bank"], labels=[3, 4]),
              dict(words=["Zürich", "café", "bank", "naïve", "old"], labels=[1, 2, 3, 4, 5])]
  out = features.tagging_features(tokenizer, examples, 32)
  assert out["word_positions"].shape == (2, 5) and (out["word_positions"][0, 2:] == -1).all()
  for row, example in enumerate(examples):
    positions = out["word_positions"][row, :len(example["words"])]
    np.testing.assert_array_equal(out["labels"][row, positions], example["labels"])
    assert out["label_weights"][row].sum() == len(example["words"])
  assert features.word_predictions(out["labels"], out["word_positions"], [2, 5]) == [
      [3, 4], [1, 2, 3, 4, 5]]


def _qa_examples(seed, count, context_words=(20, 60)):
  """Contexts of random words; the answer is a run of whole words at a known character offset."""
  rng = np.random.default_rng(seed)
  examples = []
  for i in range(count):
    words = list(rng.choice(WORDS, rng.integers(*context_words)))
    first = int(rng.integers(0, len(words) - 3))
    last = first + int(rng.integers(0, 3))
    context = " ".join(words)
    start = len(" ".join(words[:first])) + (1 if first else 0)
    text = " ".join(words[first:last + 1])
    impossible = i % 5 == 0
    examples.append(dict(id=f"q{i}", question=" ".join(rng.choice(WORDS, 5)), context=context,
                         answers=[] if impossible else [dict(text=text, answer_start=start)],
                         is_impossible=impossible))
  return examples


def test_doc_windows_and_max_context():
  windows = features.doc_windows(10, 4, 3)
  assert windows == [(0, 4), (3, 4), (6, 4)]
  assert features.doc_windows(3, 4, 2) == [(0, 3)]
  # run_squad.py's docstring example: 'bought' has more context in the later window.
  assert features.max_context_window([(0, 5), (3, 5), (6, 5)], 7) == 2


def test_qa_windows_cover_every_token_once_at_max_context(tokenizer):
  examples = _qa_examples(1, 30)
  out = features.qa_features(tokenizer, examples, seq_len=32, doc_stride=7, max_query_len=6)
  contexts, _ = tokenizer.encode_with_offsets([e["context"] for e in examples])
  assert out["input_ids"].shape[0] > len(examples)   # long contexts were split
  for index, ids in enumerate(contexts):
    rows = np.flatnonzero(out["example_index"] == index)
    offsets = np.concatenate([out["token_offsets"][r][out["token_offsets"][r, :, 0] >= 0]
                              for r in rows])
    max_context = np.concatenate(
        [out["token_is_max_context"][r][out["token_offsets"][r, :, 0] >= 0] for r in rows])
    _, all_offsets = tokenizer.encode_with_offsets([examples[index]["context"]])
    covered = {tuple(o) for o in offsets}
    assert covered == {tuple(o) for o in all_offsets[0]}          # every token in some window
    assert max_context.sum() == len(ids)                          # max context exactly once
    assert {tuple(o) for o in offsets[max_context]} == covered
  for row in range(len(out["input_ids"])):
    ids = out["input_ids"][row][out["input_mask"][row] == 1]
    assert ids[0] == tokenizer.cls_id and ids[-1] == tokenizer.sep_id
    assert len(ids) <= 32


def test_qa_training_answers_decode_to_the_answer_text(tokenizer):
  examples = _qa_examples(2, 60)
  out = features.qa_features(tokenizer, examples, seq_len=40, doc_stride=10, max_query_len=8,
                             is_training=True)
  answerable_features = 0
  for row, index in enumerate(out["example_index"]):
    example, start, end = examples[index], out["start_position"][row], out["end_position"][row]
    # ELECTRA's answerable label is the example's, also in a window that misses the answer.
    assert out["is_impossible"][row] == example["is_impossible"]
    if example["is_impossible"]:
      assert start == end == 0
      continue
    if start == 0:   # the answer lies outside this window
      assert end == 0
      continue
    answerable_features += 1
    offsets = out["token_offsets"][row]
    assert 0 < start <= end and offsets[start, 0] >= 0 and offsets[end, 0] >= 0
    assert example["context"][offsets[start, 0]:offsets[end, 1]] == example["answers"][0]["text"]
  assert answerable_features >= 40
  # Each answerable example has its answer inside at least one window.
  assert {int(i) for i in out["example_index"][out["start_position"] > 0]} == {
      i for i, e in enumerate(examples) if not e["is_impossible"]}


def test_qa_training_drops_misaligned_answers(tokenizer):
  example = dict(id="x", question="cat", context="the cat sat", is_impossible=False,
                 answers=[dict(text="cat", answer_start=5)])
  training = features.qa_features(tokenizer, [example], 32, 8, 8, is_training=True)
  assert len(training["input_ids"]) == 0
  assert len(features.qa_features(tokenizer, [example], 32, 8, 8)["input_ids"]) == 1


def _reference_answer(out, example, prelim, is_null):
  """Both references' last step: "" without candidates or when `is_null(best score)`, else the
  context between the best (score, feature, start, end) candidate's tokens, the first on ties
  (Python's stable sort, as both scripts sort)."""
  prelim = sorted(prelim, key=lambda p: p[0], reverse=True)
  if not prelim or is_null(prelim[0][0]):
    return ""
  _, f, s, e = prelim[0]
  offsets = out["token_offsets"][f]
  return example["context"][offsets[s, 0]:offsets[e, 1]]


def _reference_predictions(start_logits, end_logits, out, examples, n_best, max_answer_len,
                           null_threshold, version_2):
  """run_squad.py write_predictions, transcribed loop by loop."""
  predictions = {}
  for index, example in enumerate(examples):
    prelim, score_null = [], 1e6
    for f in np.flatnonzero(out["example_index"] == index):
      starts = [i for i, _ in sorted(enumerate(start_logits[f]), key=lambda x: x[1],
                                     reverse=True)][:n_best]
      ends = [i for i, _ in sorted(enumerate(end_logits[f]), key=lambda x: x[1],
                                   reverse=True)][:n_best]
      score_null = min(score_null, start_logits[f][0] + end_logits[f][0])
      # Context tokens; run_squad.py's WordPiece has no empty ones, our bare '▁' pieces are.
      in_context = out["token_offsets"][f, :, 1] > out["token_offsets"][f, :, 0]
      for s in starts:
        for e in ends:
          if not (in_context[s] and in_context[e] and out["token_is_max_context"][f, s]):
            continue
          if e < s or e - s + 1 > max_answer_len:
            continue
          prelim.append((start_logits[f][s] + end_logits[f][e], f, s, e))
    predictions[example["id"]] = _reference_answer(
        out, example, prelim,
        lambda best, null=score_null: version_2 and null - best > null_threshold)
  return predictions


@pytest.mark.parametrize("version_2", [False, True])
def test_qa_predictions_match_run_squad(tokenizer, version_2):
  examples = _qa_examples(3, 25)
  out = features.qa_features(tokenizer, examples, seq_len=32, doc_stride=6, max_query_len=6)
  rng = np.random.default_rng(4)
  empty = 0
  for trial in range(5):
    start_logits = rng.normal(size=out["input_ids"].shape).round(1)   # ties happen
    end_logits = rng.normal(size=out["input_ids"].shape).round(1)
    # [CLS] raised so that the null score (the least over an example's windows) is near the best
    # span's, and the threshold decides: the null rule is exercised.
    start_logits[:, 0] += 2.5
    end_logits[:, 0] += 2.5
    args = dict(n_best=5, max_answer_len=4, null_threshold=0.5 * trial - 1.0, version_2=version_2)
    got = features.qa_predictions(start_logits, end_logits, out, examples, **args)
    assert got == _reference_predictions(start_logits, end_logits, out, examples, **args)
    assert all(text == text.strip() for text in got.values())
    empty += sum(text == "" for text in got.values())
  assert 0 < empty < 5 * len(examples) if version_2 else empty == 0


def _reference_joint_predictions(outputs, out, examples, max_answer_len, answerable_threshold,
                                 version_2):
  """electra qa_metrics.py write_predictions with joint_prediction and answerable_classifier,
  transcribed loop by loop (its token_to_orig_map: our context tokens of a character or more),
  but "" where no span is valid, not its placeholder text 'empty'."""
  predictions = {}
  for index, example in enumerate(examples):
    prelim, score_null = [], 1000000
    for f in np.flatnonzero(out["example_index"] == index):
      score_null = min(score_null, outputs["answerable_logit"][f])
      in_context = out["token_offsets"][f, :, 1] > out["token_offsets"][f, :, 0]
      for i, start_index in enumerate(outputs["start_top_index"][f]):
        for j, end_index in enumerate(outputs["end_top_index"][f][i]):
          if start_index == 0 or not in_context[start_index] or not in_context[end_index]:
            continue
          if not out["token_is_max_context"][f, start_index] or end_index < start_index:
            continue
          if end_index - start_index + 1 > max_answer_len:
            continue
          prelim.append((outputs["start_top_log_probs"][f][i] +
                         outputs["end_top_log_probs"][f][i, j], f, start_index, end_index))
    predictions[example["id"]] = _reference_answer(
        out, example, prelim,
        lambda _, null=score_null: version_2 and null > answerable_threshold)
  return predictions


@pytest.mark.parametrize("version_2", [False, True])
def test_joint_qa_predictions_match_electra(tokenizer, version_2):
  examples = _qa_examples(6, 25)
  out = features.qa_features(tokenizer, examples, seq_len=32, doc_stride=6, max_query_len=6)
  rng = np.random.default_rng(7)
  rows, beam = len(out["input_ids"]), 5
  empty = 0
  for trial in range(5):
    outputs = dict(start_top_log_probs=rng.normal(size=(rows, beam)).round(1),   # ties happen
                   start_top_index=rng.integers(0, 32, (rows, beam)),
                   end_top_log_probs=rng.normal(size=(rows, beam, beam)).round(1),
                   end_top_index=rng.integers(0, 32, (rows, beam, beam)),
                   answerable_logit=rng.normal(size=rows) - 2.5)
    # Thresholds among the examples' null scores (the least over their windows): the null rule
    # answers "" for some examples and not for others.
    nulls = [outputs["answerable_logit"][out["example_index"] == i].min()
             for i in range(len(examples))]
    args = dict(max_answer_len=4, answerable_threshold=np.quantile(nulls, 0.1 + 0.2 * trial),
                version_2=version_2)
    got = features.joint_qa_predictions(outputs, out, examples, **args)
    assert got == _reference_joint_predictions(outputs, out, examples, **args)
    empty += sum(text == "" for text in got.values())
  assert 0 < empty < 5 * len(examples) if version_2 else empty < len(examples)


def test_qa_predictions_hand_built(tokenizer):
  example = dict(id="a", question="what sat", context="the cat sat on the old mat",
                 answers=[dict(text="cat", answer_start=4)], is_impossible=False)
  out = features.qa_features(tokenizer, [example], seq_len=64, doc_stride=32, max_query_len=8)
  offsets = out["token_offsets"][0]
  starting = {int(o[0]): i for i, o in reversed(list(enumerate(offsets))) if o[1] > o[0]}
  ending = {int(o[1]): i for i, o in enumerate(offsets) if o[1] > o[0]}
  cat, sat_end, mat, mat_end, the_end = starting[4], ending[11], starting[23], ending[26], ending[3]
  start, end = np.full((1, 64), -100.0), np.full((1, 64), -100.0)
  start[0, 1] = end[0, 1] = 50.0                       # a question token: never an answer
  start[0, mat], end[0, the_end] = 20.0, 20.0          # end before start
  start[0, cat], end[0, sat_end] = 5.0, 5.0            # the best valid span
  short, long = sat_end - cat + 1, mat_end - cat + 1
  assert features.qa_predictions(start, end, out, [example], max_answer_len=short) == {
      "a": "cat sat"}
  # Only the n_best highest logits are candidates: with n_best=2 the ends are 'the' and the
  # question token, so no span is valid.
  assert features.qa_predictions(start, end, out, [example], n_best=2) == {"a": ""}
  # A better end after 'sat' counts only when the span fits in max_answer_len.
  start[0, mat], end[0, mat_end] = -100.0, 6.0
  assert features.qa_predictions(start, end, out, [example], max_answer_len=short) == {
      "a": "cat sat"}
  assert features.qa_predictions(start, end, out, [example], max_answer_len=long) == {
      "a": "cat sat on the old mat"}
  # SQuAD 2.0: a null score (start[0] + end[0]) above the best span's 10 wins by the margin.
  end[0, mat_end] = -100.0
  start[0, 0], end[0, 0] = 6.0, 5.0
  v2 = dict(max_answer_len=short, version_2=True)
  assert features.qa_predictions(start, end, out, [example], **v2) == {"a": ""}
  assert features.qa_predictions(start, end, out, [example], null_threshold=1.5, **v2) == {
      "a": "cat sat"}


def test_featurize_and_decode_each_kind(tokenizer):
  from types import SimpleNamespace   # pylint: disable=g-import-not-at-top
  from bertfam_jax.finetune import tasks   # pylint: disable=g-import-not-at-top
  ft = SimpleNamespace(max_seq_len=32, doc_stride=8, max_query_len=8, n_best=20,
                       max_answer_len=30, null_threshold=0.0, answerable_threshold=-2.75)
  stsb = tasks.get("glue/stsb")
  pairs = [dict(text="the cat", text_b="a dog", label=2.5)]
  data = features.featurize(stsb, tokenizer, pairs, ft, training=True)
  assert data["label"].dtype == np.float32 and data["segment_ids"].max() == 1
  assert features.decode_predictions(stsb, np.array([3.0]), data, pairs, tokenizer, ft) == [3.0]
  tagging = tasks.get("wordnet_tagging")
  sentences = [dict(words=["the", "dog", "sat"], labels=[0, 11, 0])]
  data = features.featurize(tagging, tokenizer, sentences, ft, training=False)
  one_hot = np.eye(tagging.num_labels)[data["labels"]]   # a perfect model
  assert features.decode_predictions(tagging, one_hot, data, sentences, tokenizer, ft) == [
      [0, 11, 0]]
  squad = tasks.get("squad/v2.0")
  examples = _qa_examples(5, 6)
  data = features.featurize(squad, tokenizer, examples, ft, training=False)
  outputs = np.full(data["input_ids"].shape + (2,), -10.0)
  rows = np.arange(len(outputs))
  outputs[rows, data["start_position"], 0] = outputs[rows, data["end_position"], 1] = 10.0
  predicted = features.decode_predictions(squad, outputs, data, examples, tokenizer, ft)
  assert predicted == [e["answers"][0]["text"] if e["answers"] else "" for e in examples]
  assert squad.score(examples, predicted)["f1"] == 100.0
  # The joint head's outputs (a dict): a perfect beam, 'no answer' logits of the labels.
  joint = dict(start_top_log_probs=np.array([[-0.1, -3.0]] * len(rows)),
               start_top_index=np.stack([data["start_position"], rows * 0 + 1], -1),
               end_top_log_probs=np.array([[[-0.1, -3.0]] * 2] * len(rows)),
               end_top_index=np.stack([data["end_position"]] * 2, -1)[:, None].repeat(2, 1),
               answerable_logit=np.where(data["start_position"] > 0, -10.0, 10.0))
  assert features.decode_predictions(squad, joint, data, examples, tokenizer, ft) == predicted


def test_gpt_input_transformations(tokenizer):
  """GPT §3.3: [start] A [delim] B [extract] (start, delim, extract = [CLS], [SEP], [MASK]),
  right padded, segment 0; single texts [start] A [extract]; with pair_orders=2 both orders."""
  a, b = tokenizer.encode(["the cat sat on the mat", "a dog ran"])
  start, delim, extract, pad = tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id, 0
  out = features.encode_pairs(tokenizer, ["the cat sat on the mat"], 40, ["a dog ran"], "gpt")
  real = [start, *a, delim, *b, extract]
  np.testing.assert_array_equal(out["input_ids"][0], real + [pad] * (40 - len(real)))
  np.testing.assert_array_equal(out["input_mask"][0], [1] * len(real) + [0] * (40 - len(real)))
  assert not out["segment_ids"].any()
  single = features.encode_pairs(tokenizer, ["the cat sat on the mat"], 5, layout="gpt")
  np.testing.assert_array_equal(single["input_ids"][0], [start, *a[:3], extract])

  class Task:
    name, kind = "pairs", "classification"

  class Ft:
    max_seq_len, pair_orders = 40, 2

  examples = [dict(text="the cat sat on the mat", text_b="a dog ran", label=1)]
  both = features.featurize(Task, tokenizer, examples, Ft(), True, "gpt")
  assert both["input_ids"].shape == (1, 2, 40) and both["label"].tolist() == [1]
  np.testing.assert_array_equal(both["input_ids"][0, 0], out["input_ids"][0])
  swapped = [start, *b, delim, *a, extract]
  np.testing.assert_array_equal(both["input_ids"][0, 1, :len(swapped)], swapped)
