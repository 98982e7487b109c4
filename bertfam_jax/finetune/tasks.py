"""Fine-tuning tasks: what to load, how to score it. `get(name) -> Task`.

Raw example formats (what `Task.load` returns, what `finetune.features` turns into arrays):
  classification / regression  {text, text_b (or None), label (int / float)}
  token_classification         {words: [str], labels: [int per word]}
  extractive_qa                {id, question, context, answers: [{text, answer_start}],
                                is_impossible}
  multiple_choice              {question, choices: [str], label}

Offline (WordNet 3.0, `bertfam_jax.data.wordnet`; data_dir = its database directory or None):
  wordnet_supersense  definition -> one of 45 supersenses
  wordnet_qa          definition -> the lemma's span in example sentences (SQuAD 2.0-like)
  wordnet_tagging     BIO supersense tags of the lemma in its example sentences
  wordnet_choice      definition -> the right lemma among 4
TFDS (data_dir = a TFDS data dir holding the prepared dataset; nothing is downloaded):
  glue/{cola,sst2,mrpc,qqp,stsb,mnli,qnli,rte,wnli}, super_glue/{boolq,cb,copa,rte,wic},
  squad/v1.1, squad/v2.0.

Main metrics follow the BERT paper's GLUE table (MCC for CoLA, F1 for MRPC / QQP, Spearman for
STS-B, accuracy elsewhere), SuperGLUE's (macro F1 for CB) and SQuAD's (F1).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from bertfam_jax.config_lib import ConfigError
from bertfam_jax.data import sources
from bertfam_jax.data import wordnet
from bertfam_jax.finetune import metrics as metrics_lib

KINDS = ("classification", "regression", "token_classification", "extractive_qa",
         "multiple_choice")


@dataclasses.dataclass(frozen=True)
class Task:
  """A fine-tuning task.

  Attributes:
    name: the registry key ('glue/mrpc').
    kind: one of KINDS.
    loader: (split, data_dir) -> raw examples (the module docstring's formats).
    metrics: the names `score` returns.
    main_metric: the one that ranks models (one of metrics).
    label_names: class names (classification, token_classification), else ().
    eval_split: the split to evaluate on ('validation', MNLI 'validation_matched').
    train_split: the split to fine-tune on.
    splits: the splits `load` accepts.
    version_2: extractive QA with unanswerable questions (run_squad.py's
      version_2_with_negative).
  """
  name: str
  kind: str
  loader: Callable[[str, str | None], Sequence[dict]]
  metrics: tuple[str, ...]
  main_metric: str
  label_names: tuple[str, ...] = ()
  eval_split: str = "validation"
  train_split: str = "train"
  splits: tuple[str, ...] = ("train", "validation", "test")
  version_2: bool = False

  @property
  def num_labels(self) -> int:
    """Classes (classification, token_classification); 1 for regression; 0 otherwise."""
    return 1 if self.kind == "regression" else len(self.label_names)

  @property
  def num_outputs(self) -> int:
    """The head's outputs per row (`models.finetune.FineTuneModel`): classes, 1 for regression
    and multiple choice (one score per choice), 2 for extractive QA (start, end)."""
    return dict(extractive_qa=2, multiple_choice=1).get(self.kind, self.num_labels)

  def load(self, split: str, data_dir: str | None = None,
           max_examples: int | None = None) -> list[dict]:
    """The raw examples of `split`, the first `max_examples` of them when given."""
    if split not in self.splits:
      raise ConfigError(f"Task {self.name!r} has splits {list(self.splits)}, not {split!r}; set "
                        f"--config.finetune.eval_split.")
    examples = self.loader(split, data_dir)
    count = len(examples) if max_examples is None else min(max_examples, len(examples))
    return [examples[i] for i in range(count)]

  def gold(self, examples: Sequence[dict]) -> list:
    """One gold value per example, aligned with `features.decode_predictions`: the label, the
    per-word labels, or the answer texts ([] when unanswerable)."""
    if self.kind == "token_classification":
      return [list(e["labels"]) for e in examples]
    if self.kind == "extractive_qa":
      return [[a["text"] for a in e["answers"]] for e in examples]
    return [e["label"] for e in examples]

  def score(self, examples: Sequence[dict], predictions: Sequence) -> dict[str, float]:
    """`metrics` of one prediction per example (`features.decode_predictions`: class ids,
    floats, per-word label ids, answer texts) against the examples' gold labels."""
    if len(predictions) != len(examples):
      raise ValueError(f"{len(predictions)} predictions for {len(examples)} examples.")
    scores = _SCORERS[self.kind](self, examples, predictions)
    # SQuAD 2.0's HasAns_* / NoAns_* exist only when both kinds of question were evaluated.
    return {name: scores[name] for name in self.metrics if name in scores}


def _score_classification(task, examples, predictions):
  labels = np.asarray([e["label"] for e in examples])
  scores = metrics_lib.classification_metrics(labels, predictions, task.num_labels)
  return dict(scores, f1=metrics_lib.binary_f1(labels, predictions))


def _score_regression(task, examples, predictions):
  return metrics_lib.regression_metrics([e["label"] for e in examples], predictions)


def _score_tagging(task, examples, predictions):
  names = task.label_names
  return metrics_lib.tagging_metrics([[names[i] for i in e["labels"]] for e in examples],
                                     [[names[i] for i in p] for p in predictions])


def _score_qa(task, examples, predictions):
  return metrics_lib.squad_scores({e["id"]: p for e, p in zip(examples, predictions)},
                                  {e["id"]: gold for e, gold in zip(examples, task.gold(examples))})


def _score_choice(task, examples, predictions):
  return dict(accuracy=metrics_lib.accuracy([e["label"] for e in examples], predictions))


_SCORERS = dict(classification=_score_classification, regression=_score_regression,
                token_classification=_score_tagging, extractive_qa=_score_qa,
                multiple_choice=_score_choice)

# ------------------------------------------------------------------------------------- WordNet


def _wordnet_supersense(split: str, data_dir: str | None) -> list[dict]:
  examples = getattr(wordnet.supersense_task(data_dir), split)
  return [dict(text=text, text_b=None, label=int(label))
          for text, label in zip(examples.texts, examples.labels)]


def _wordnet_raw(builder) -> Callable[[str, str | None], Sequence[dict]]:
  return lambda split, data_dir: getattr(builder(data_dir), split)


# ----------------------------------------------------------------------------------------- TFDS


def as_text(value: Any) -> str:
  """A TFDS Text / string feature (bytes from array_record and as_numpy) as str."""
  if isinstance(value, np.ndarray):
    value = value.item()
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def pair_example(record: Mapping[str, Any], text_key: str, text_b_key: str | None = None, *,
                 regression: bool = False) -> dict:
  """A GLUE / SuperGLUE record -> {text, text_b, label}; test splits keep TFDS's label -1."""
  label = float(record["label"]) if regression else int(record["label"])
  return dict(text=as_text(record[text_key]),
              text_b=as_text(record[text_b_key]) if text_b_key else None, label=label)


def wic_example(record: Mapping[str, Any]) -> dict:
  """SuperGLUE WiC as a pair: '<word>: <sentence1>' and sentence2 (the target word's spans,
  start1/end1/start2/end2, are left out: a sequence classifier has no span input)."""
  return dict(text=f"{as_text(record['word'])}: {as_text(record['sentence1'])}",
              text_b=as_text(record["sentence2"]), label=int(record["label"]))


def copa_example(record: Mapping[str, Any]) -> dict:
  """SuperGLUE COPA -> {question: '<premise> What was the cause|effect?', choices, label}."""
  return dict(question=f"{as_text(record['premise'])} What was the {as_text(record['question'])}?",
              choices=[as_text(record["choice1"]), as_text(record["choice2"])],
              label=int(record["label"]))


def squad_example(record: Mapping[str, Any]) -> dict:
  """A squad/v1.1 or squad/v2.0 record -> the extractive_qa format (v1.1 has no is_impossible)."""
  answers = record["answers"]
  return dict(id=as_text(record["id"]), question=as_text(record["question"]),
              context=as_text(record["context"]),
              answers=[dict(text=as_text(t), answer_start=int(s))
                       for t, s in zip(answers["text"], answers["answer_start"])],
              is_impossible=bool(record.get("is_impossible", False)))


class _Converted(Sequence):
  """A lazy, random-access view of TFDS records through a converter."""

  def __init__(self, records: Sequence, convert: Callable[[Mapping], dict]):
    self._records, self._convert = records, convert

  def __len__(self) -> int:
    return len(self._records)

  def __getitem__(self, index):
    return self._convert(self._records[index])


def _missing_message(name: str, data_dir: str | None) -> str:
  return (f"TFDS dataset {name!r} is not prepared in {data_dir or 'the TFDS default data dir'}, "
          f"and bertfam_jax never downloads. Prepare it once where there is network access: "
          f"`tfds build {name} --data_dir=DIR --file_format=array_record`, then pass "
          f"--config.finetune.data_dir=DIR. Offline tasks: wordnet_supersense, wordnet_qa, "
          f"wordnet_tagging, wordnet_choice.")


def tfds_loader(name: str, convert: Callable[[Mapping], dict]):
  def load(split: str, data_dir: str | None) -> _Converted:
    records = sources.tfds_records(name, split, data_dir,
                                   not_prepared=_missing_message(name, data_dir),
                                   split_flags="--config.finetune.eval_split")
    return _Converted(records, convert)
  return load


# ------------------------------------------------------------------------------------- registry

_CLASSIFICATION = ("accuracy", "macro_f1", "mcc")
_SQUAD_V2 = ("exact", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1")
_ENTAILMENT = ("entailment", "not_entailment")


def _pair_task(name: str, keys: tuple[str, ...], label_names: tuple[str, ...],
               metrics: tuple[str, ...] = ("accuracy",), main: str = "accuracy", **kwargs) -> Task:
  convert = functools.partial(pair_example, text_key=keys[0],
                              text_b_key=keys[1] if len(keys) > 1 else None)
  return Task(name, "classification", tfds_loader(name, convert), metrics, main, label_names,
              **kwargs)


def _registry() -> dict[str, Task]:
  squad_splits = ("train", "validation")
  tasks = [
      Task("wordnet_supersense", "classification", _wordnet_supersense, _CLASSIFICATION,
           "accuracy", wordnet.LEXNAMES),
      Task("wordnet_qa", "extractive_qa", _wordnet_raw(wordnet.definition_qa_task), _SQUAD_V2,
           "f1", version_2=True),
      Task("wordnet_tagging", "token_classification", _wordnet_raw(wordnet.lemma_tagging_task),
           ("span_f1", "span_precision", "span_recall", "token_accuracy"), "span_f1",
           wordnet.bio_label_names()),
      Task("wordnet_choice", "multiple_choice", _wordnet_raw(wordnet.lemma_choice_task),
           ("accuracy",), "accuracy"),
      _pair_task("glue/cola", ("sentence",), ("unacceptable", "acceptable"),
                 ("mcc", "accuracy"), "mcc"),
      _pair_task("glue/sst2", ("sentence",), ("negative", "positive")),
      _pair_task("glue/mrpc", ("sentence1", "sentence2"), ("not_equivalent", "equivalent"),
                 ("f1", "accuracy"), "f1"),
      _pair_task("glue/qqp", ("question1", "question2"), ("not_duplicate", "duplicate"),
                 ("f1", "accuracy"), "f1"),
      Task("glue/stsb", "regression",
           tfds_loader("glue/stsb", functools.partial(pair_example, text_key="sentence1",
                                                       text_b_key="sentence2", regression=True)),
           ("pearson", "spearman"), "spearman"),
      _pair_task("glue/mnli", ("premise", "hypothesis"),
                 ("entailment", "neutral", "contradiction"), eval_split="validation_matched",
                 splits=("train", "validation_matched", "validation_mismatched", "test_matched",
                         "test_mismatched")),
      _pair_task("glue/qnli", ("question", "sentence"), _ENTAILMENT),
      _pair_task("glue/rte", ("sentence1", "sentence2"), _ENTAILMENT),
      _pair_task("glue/wnli", ("sentence1", "sentence2"), ("not_entailment", "entailment")),
      _pair_task("super_glue/boolq", ("question", "passage"), ("False", "True")),
      _pair_task("super_glue/cb", ("premise", "hypothesis"),
                 ("entailment", "contradiction", "neutral"), ("macro_f1", "accuracy"),
                 "macro_f1"),
      Task("super_glue/copa", "multiple_choice", tfds_loader("super_glue/copa", copa_example),
           ("accuracy",), "accuracy"),
      _pair_task("super_glue/rte", ("premise", "hypothesis"), _ENTAILMENT),
      Task("super_glue/wic", "classification", tfds_loader("super_glue/wic", wic_example),
           ("accuracy",), "accuracy", ("False", "True")),
      Task("squad/v1.1", "extractive_qa", tfds_loader("squad/v1.1", squad_example),
           ("exact", "f1"), "f1", splits=squad_splits),
      Task("squad/v2.0", "extractive_qa", tfds_loader("squad/v2.0", squad_example),
           _SQUAD_V2, "f1", splits=squad_splits, version_2=True),
  ]
  return {task.name: task for task in tasks}


TASKS: dict[str, Task] = _registry()


def get(name: str) -> Task:
  """The registered task called `name`."""
  if name not in TASKS:
    raise ConfigError(f"Unknown task {name!r}; choose one of {sorted(TASKS)}.")
  return TASKS[name]
