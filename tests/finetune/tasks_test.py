"""Tests for bertfam_jax.finetune.tasks: registry, TFDS records, WordNet tasks, scoring."""

import numpy as np
import pytest

from bertfam_jax import config_lib
from bertfam_jax.data import wordnet
from bertfam_jax.finetune import tasks

try:
  wordnet.find_wordnet_dir()
  HAVE_WORDNET = True
except config_lib.ConfigError:
  HAVE_WORDNET = False
needs_wordnet = pytest.mark.skipif(not HAVE_WORDNET, reason="WordNet 3.0 is not installed")


def test_registry():
  assert tasks.get("glue/mnli").eval_split == "validation_matched"
  assert tasks.get("glue/cola").main_metric == "mcc"
  assert tasks.get("glue/stsb").kind == "regression" and tasks.get("glue/stsb").num_labels == 1
  assert tasks.get("glue/mrpc").main_metric == "f1"
  assert tasks.get("squad/v2.0").version_2 and not tasks.get("squad/v1.1").version_2
  assert tasks.get("wordnet_tagging").num_labels == 91
  assert tasks.get("squad/v1.1").num_outputs == 2 and tasks.get("glue/mnli").num_outputs == 3
  assert tasks.get("wordnet_choice").num_outputs == 1 and tasks.get("glue/stsb").num_outputs == 1
  for task in tasks.TASKS.values():
    assert task.kind in tasks.KINDS and task.main_metric in task.metrics
    assert task.eval_split in task.splits
  with pytest.raises(config_lib.ConfigError, match="Unknown task 'glue/foo'"):
    tasks.get("glue/foo")


# Records as tfds.data_source / tfds.as_numpy give them: Text features are bytes, ClassLabel an
# int, STS-B's label a float32, SQuAD's answers a dict of arrays.
def test_glue_records():
  record = dict(sentence1=b"The cat sat.", sentence2=b"A cat was sitting.", label=np.int64(1),
                idx=np.int32(7))
  assert tasks.pair_example(record, "sentence1", "sentence2") == dict(
      text="The cat sat.", text_b="A cat was sitting.", label=1)
  assert tasks.pair_example(dict(sentence=b"caf\xc3\xa9 ok", label=-1), "sentence") == dict(
      text="café ok", text_b=None, label=-1)
  stsb = tasks.pair_example(dict(sentence1=b"a", sentence2=b"b", label=np.float32(3.8)),
                            "sentence1", "sentence2", regression=True)
  assert stsb["label"] == pytest.approx(3.8)


def test_super_glue_records():
  copa = dict(premise=b"The man broke his toe.", choice1=b"He dropped a hammer on his foot.",
              choice2=b"He got a hole in his sock.", question=b"cause", label=0, idx=0)
  assert tasks.copa_example(copa) == dict(
      question="The man broke his toe. What was the cause?",
      choices=["He dropped a hammer on his foot.", "He got a hole in his sock."], label=0)
  wic = dict(word=b"bank", sentence1=b"the river bank", sentence2=b"the bank lent money",
             start1=4, end1=8, start2=4, end2=8, label=0, idx=1)
  assert tasks.wic_example(wic) == dict(text="bank: the river bank", text_b="the bank lent money",
                                        label=0)


def test_squad_records():
  v2 = dict(id=b"56ddde6b9a695914005b9628", title=b"Normans",
            context=b"The Normans were in Normandy.", question=b"Where were the Normans?",
            answers=dict(text=np.array([b"Normandy", b"in Normandy"], object),
                         answer_start=np.array([20, 17], np.int32)),
            plausible_answers=dict(text=np.array([], object), answer_start=np.array([], np.int32)),
            is_impossible=np.bool_(False))
  example = tasks.squad_example(v2)
  assert example == dict(id="56ddde6b9a695914005b9628", question="Where were the Normans?",
                         context="The Normans were in Normandy.",
                         answers=[dict(text="Normandy", answer_start=20),
                                  dict(text="in Normandy", answer_start=17)],
                         is_impossible=False)
  v1 = {k: v for k, v in v2.items() if k not in ("plausible_answers", "is_impossible")}
  assert tasks.squad_example(v1) == example
  impossible = dict(v2, answers=dict(text=np.array([], object),
                                     answer_start=np.array([], np.int32)),
                    is_impossible=np.bool_(True))
  assert tasks.squad_example(impossible)["is_impossible"]


@pytest.mark.parametrize("name", ["glue/cola", "squad/v1.1", "super_glue/boolq"])
def test_missing_tfds_dataset_names_the_build_command(name, tmp_path):
  with pytest.raises(config_lib.ConfigError, match=f"tfds build {name} --data_dir=DIR"):
    tasks.get(name).load("train", str(tmp_path))


def test_evaluate_each_kind():
  mrpc = tasks.get("glue/mrpc")
  examples = [dict(text="a", text_b="b", label=y) for y in (1, 1, 0, 0)]
  assert mrpc.score(examples, np.array([1, 0, 0, 0])) == pytest.approx(
      dict(f1=2 / 3, accuracy=0.75))
  stsb = tasks.get("glue/stsb")
  scores = stsb.score([dict(label=x) for x in (1.0, 2.0, 3.0)], np.array([1.0, 2.5, 2.9]))
  assert set(scores) == {"pearson", "spearman"} and scores["spearman"] == pytest.approx(1.0)
  squad = tasks.get("squad/v2.0")
  qa = [dict(id="1", answers=[dict(text="Normandy", answer_start=0)]), dict(id="2", answers=[])]
  assert squad.gold(qa) == [["Normandy"], []]
  assert squad.score(qa, ["normandy", ""])["f1"] == 100.0
  assert "HasAns_f1" not in squad.score(qa[:1], ["x"])   # no unanswerable question
  tagging = tasks.get("wordnet_tagging")
  names = tagging.label_names
  gold = [dict(words=["the", "dog"], labels=[0, names.index("B-noun.animal")])]
  assert tagging.score(gold, [[0, names.index("B-noun.animal")]])["span_f1"] == 1.0
  assert tagging.score(gold, [[0, names.index("B-noun.person")]])["span_f1"] == 0.0
  copa = tasks.get("super_glue/copa")
  assert copa.score([dict(label=0), dict(label=1)], np.array([0, 0])) == dict(accuracy=0.5)


@needs_wordnet
@pytest.mark.parametrize("name", ["wordnet_supersense", "wordnet_qa", "wordnet_tagging",
                                  "wordnet_choice"])
def test_wordnet_tasks_load_and_score_gold_perfectly(name):
  task = tasks.get(name)
  examples = task.load(task.eval_split, max_examples=200)
  assert len(examples) == 200
  assert task.load("test", max_examples=5) != examples[:5]
  gold = task.gold(examples)
  if task.kind == "extractive_qa":
    gold = [answers[0] if answers else "" for answers in gold]
  scores = task.score(examples, gold)
  assert scores[task.main_metric] == pytest.approx(100.0 if task.kind == "extractive_qa" else 1.0)
  with pytest.raises(config_lib.ConfigError, match="splits"):
    task.load("dev")
