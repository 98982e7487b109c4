"""Text-to-text tasks: T5's formatting of GLUE / SuperGLUE / SQuAD / CNN-DM / WMT records
(transcribed from t5/data/preprocessors.py), the WordNet tasks, and scoring."""

import numpy as np
import pytest

from bertfam_jax import config_lib
from bertfam_jax.data import wordnet
from bertfam_jax.finetune import text_tasks

try:
  wordnet.find_wordnet_dir()
  HAVE_WORDNET = True
except config_lib.ConfigError:
  HAVE_WORDNET = False
needs_wordnet = pytest.mark.skipif(not HAVE_WORDNET, reason="WordNet 3.0 is not installed")


def test_registry():
  for task in text_tasks.TASKS.values():
    assert task.kind in text_tasks.KINDS and task.main_metric in task.metrics
    assert task.eval_split in task.splits and task.max_target_tokens > 0
    assert (task.kind == "classification") == bool(task.label_names)
  assert text_tasks.get("glue/cola").main_metric == "mcc"
  assert text_tasks.get("squad/v1.1").main_metric == "exact"        # the paper's SQuAD column
  assert text_tasks.get("cnn_dailymail").main_metric == "rouge2"    # the paper's CNNDM column
  assert text_tasks.get("glue/mnli").eval_split == "validation_matched"
  with pytest.raises(config_lib.ConfigError, match="Unknown text-to-text task 'glue/foo'"):
    text_tasks.get("glue/foo")


# Records as tfds.data_source gives them: Text features as bytes, ClassLabel as int.
def test_glue_formatting_sorts_features_and_names_labels():
  mnli = dict(premise=b"A man eats.", hypothesis=b"Someone eats.", label=0, idx=7)
  assert text_tasks.glue_example(mnli, "mnli", ("entailment", "neutral", "contradiction")) == dict(
      inputs="mnli hypothesis: Someone eats. premise: A man eats.", targets="entailment", id="7",
      references=["entailment"])
  cola = dict(sentence=b"caf\xc3\xa9 is good", label=-1, idx=3)   # a hidden test label
  assert text_tasks.glue_example(cola, "cola", ("unacceptable", "acceptable"))["targets"] == "<unk>"
  copa = dict(premise=b"It rained.", choice1=b"I got wet.", choice2=b"I got dry.",
              question=b"effect", label=0, idx=0)
  assert text_tasks.glue_example(copa, "copa", ("choice1", "choice2"))["inputs"] == (
      "copa choice1: I got wet. choice2: I got dry. premise: It rained. question: effect")


def test_wic_keeps_glue_utils_feature_order():
  # glue_utils passes ("sentence1", "sentence2", "word"): the word last, the span indices out.
  wic = dict(word=b"bank", sentence1=b"the river bank", sentence2=b"the bank lent money",
             start1=10, end1=14, start2=4, end2=8, label=1, idx=2)
  assert text_tasks.glue_example(wic, "wic", ("False", "True"),
                                 ("sentence1", "sentence2", "word"))["inputs"] == (
      "wic sentence1: the river bank sentence2: the bank lent money word: bank")


def test_stsb_rounds_to_a_fifth_half_to_even():
  record = dict(sentence1=b"A cat.", sentence2=b"A dog.", idx=1)
  # label·5 rounded half to even (tf.round), / 5, one decimal: 2.5 -> 12.5 -> 12 -> 2.4.
  for label, target in ((3.8, "3.8"), (4.75, "4.8"), (2.5, "2.4"), (0.6, "0.6"), (5.0, "5.0")):
    formatted = text_tasks.stsb_example(dict(record, label=np.float32(label)))
    assert formatted["targets"] == target, label
  assert formatted["inputs"] == "stsb sentence1: A cat. sentence2: A dog."


def test_pad_punctuation_as_t5():
  # Every ASCII punctuation character gets spaces on both sides, whitespace runs collapse to one
  # space and nothing is stripped; non-ASCII text is untouched.
  assert text_tasks.pad_punctuation("Hello,  world! (Zürich's)") == (
      "Hello , world ! ( Zürich ' s ) ")
  squad = text_tasks.squad_example("Where is it?", "It is in France.", ["France", "in France."],
                                   "q1")
  assert squad == dict(inputs="question: Where is it ? context: It is in France . ",
                       targets="France", id="q1", references=["France", "in France . "])


def test_summarize_and_translate_formatting():
  article = dict(article=b"The storm\n\nhit.", highlights=b"A storm.\nIt hit.", id=b"abc")
  assert text_tasks.summarize_example(article) == dict(
      inputs="summarize: The storm hit.", targets="A storm.\nIt hit.", id="abc",
      references=["A storm.\nIt hit."])
  pair = dict(en=b"Thank you.", de=b"Danke.")
  assert text_tasks.translate_example(pair, "en", "de")["inputs"] == (
      "translate English to German: Thank you.")
  assert text_tasks.translate_example(pair, "en", "de")["targets"] == "Danke."


def _examples(targets, references=None):
  return [text_tasks.example(f"in {i}", t, f"q{i}", references[i] if references else None)
          for i, t in enumerate(targets)]


def test_classification_scores_unknown_predictions_as_wrong():
  task = text_tasks.get("glue/mrpc")   # ("not_equivalent", "equivalent"), positive = equivalent
  examples = _examples(["equivalent", "equivalent", "not_equivalent", "not_equivalent"])
  scores = task.score(examples, ["equivalent", "banana", "not_equivalent", "equivalent"])
  # TP 1, FN 1 (the unknown), FP 1: F1 = 2/(2+1+1); 2 of 4 right.
  assert scores == dict(f1=pytest.approx(0.5), accuracy=0.5)
  cola = text_tasks.get("glue/cola")
  perfect = cola.score(_examples(["acceptable", "unacceptable"]), ["acceptable", "unacceptable"])
  assert perfect["mcc"] == 1.0
  np.testing.assert_array_equal(text_tasks.class_ids(["b", "x", "a"], ("a", "b")), [1, 2, 0])


def test_regression_qa_and_generation_scores():
  stsb = text_tasks.get("glue/stsb")
  scores = stsb.score(_examples(["1.0", "2.0", "3.0"]), ["1.2", "2.2", "oops"])
  # "oops" -> -1 (string_to_float's default): ranks 2, 3, 1 against 1, 2, 3.
  assert scores["spearman"] == pytest.approx(-0.5)
  squad = text_tasks.get("squad/v1.1")
  qa = squad.score(_examples(["France", "Paris"], [["France", "in France"], ["Paris"]]),
                   ["in France", "the city of Paris"])
  # Exact on the first (an alternative answer), F1 2·(1/3·1)/(1/3+1) = 0.5 on the second.
  assert qa == dict(exact=pytest.approx(50.0), f1=pytest.approx(75.0))
  define = text_tasks.get("wordnet_define")
  generated = define.score(_examples(["a domestic animal kept as a pet"]),
                           ["a domestic animal kept as a pet"])
  assert generated == pytest.approx(dict(rouge1=100.0, rouge2=100.0, rougeL=100.0,
                                         rougeLsum=100.0, bleu=100.0))
  with pytest.raises(ValueError, match="predictions for"):
    define.score(_examples(["x"]), [])


def test_tfds_records_through_the_finetune_reader(tmp_path_factory):
  """The prepared array_record datasets of tasks_tfds_test, read by the shared TFDS reader."""
  pytest.importorskip("tensorflow_datasets")
  import tasks_tfds_test  # pylint: disable=g-import-not-at-top
  data_dir = str(tasks_tfds_test.data_dir.__wrapped__(tmp_path_factory))
  mrpc = text_tasks.get("glue/mrpc").load("validation", data_dir)
  expected = {f"mrpc sentence1: {r['sentence1']} sentence2: {r['sentence2']}":
              ("not_equivalent", "equivalent")[r["label"]]
              for r in tasks_tfds_test._MRPC["validation"]}
  assert {e["inputs"]: e["targets"] for e in mrpc} == expected
  assert text_tasks.get("glue/mrpc").load("test", data_dir)[0]["targets"] == "<unk>"
  copa = text_tasks.get("super_glue/copa").load("validation", data_dir, max_examples=2)
  assert len(copa) == 2 and all(e["inputs"].startswith("copa choice1: ") for e in copa)
  assert {e["targets"] for e in copa} <= {"choice1", "choice2"}


@needs_wordnet
def test_wordnet_tasks():
  supersense = text_tasks.get("wordnet_supersense_t2t").load("validation", max_examples=50)
  raw = wordnet.supersense_task().validation
  assert [e["inputs"] for e in supersense] == [f"supersense: {t}" for t in raw.texts[:50]]
  assert [e["targets"] for e in supersense] == [wordnet.LEXNAMES[i] for i in raw.labels[:50]]

  qa = text_tasks.get("wordnet_qa_t2t").load("validation", max_examples=50)
  for e in qa:   # the answer is a span of the (padded) context, never of the question
    assert e["inputs"].startswith("question: ") and e["targets"] in e["references"]
    assert f" {e['targets']} " in " " + e["inputs"].split(" context: ", 1)[1] + " "

  define = text_tasks.get("wordnet_define")
  examples = define.load("validation", max_examples=200)
  assert {e["targets"] for e in examples} <= set(raw.texts)   # the same split of definitions
  assert all(e["inputs"].split(": ", 1)[0] in ("define noun", "define verb", "define adj",
                                                "define adv") for e in examples)
  assert all(e["references"][0] == e["targets"] for e in examples)
  polysemous = [e for e in examples if len(e["references"]) > 1]
  assert polysemous, "some lemmas have several senses"
  train_definitions = {e["targets"] for e in define.load("train")}
  assert train_definitions.isdisjoint(e["targets"] for e in examples)


@needs_wordnet
def test_example_scores_average_to_the_task_scores():
  """What the experiments' paired bootstrap resamples: per-example scores whose mean is the
  task's score, on predictions that are partly right, partly near misses."""
  cases = (("wordnet_supersense_t2t", ("accuracy",)), ("wordnet_qa_t2t", ("exact", "f1")),
           ("wordnet_define", ("rouge1", "rouge2", "rougeL", "rougeLsum")))
  for name, decomposable in cases:
    task = text_tasks.get(name)
    examples = task.load("validation", max_examples=40)
    words = [e["targets"].split() for e in examples]
    predictions = [e["targets"] if i % 3 == 0 else " ".join(w[: len(w) // 2] + ["the"])
                   for i, (e, w) in enumerate(zip(examples, words))]
    per_example = text_tasks.example_scores(task, examples, predictions)
    assert set(per_example) == set(decomposable), name
    scores = task.score(examples, predictions)
    scale = 1 if task.kind == "classification" else 100
    for metric, values in per_example.items():
      assert values.shape == (40,) and 0 <= values.min() and values.max() <= 1
      assert 0 < values.mean() < 1, (name, metric)
      assert scale * values.mean() == pytest.approx(scores[metric]), (name, metric)


@needs_wordnet
def test_pretraining_glosses_hold_no_evaluation_synset():
  documents = wordnet.training_gloss_documents()
  lines = {line for document in documents for line in document.split("\n")}
  assert len(documents) > 2000 and len(lines) > 80_000
  definitions = {line.split(": ", 1)[1].split(". \"")[0].rstrip(".") for line in lines}
  for split in ("validation", "test"):
    held_out = text_tasks.get("wordnet_define").load(split)
    assert definitions.isdisjoint(e["targets"] for e in held_out), split
  train = text_tasks.get("wordnet_define").load("train", max_examples=2000)
  assert len(definitions & {e["targets"] for e in train}) > 1900
