"""Text-to-text tasks (Raffel et al. 2020, §2.4): every task is text in, text out.
`get(name) -> TextTask`; `finetune.seq2seq` fine-tunes and scores a T5 on one.

Examples (what `TextTask.load` returns): {inputs: str, targets: str, references: [str] (every
acceptable output; the metrics take the best), id: str}.

Offline (WordNet 3.0, `bertfam_jax.data.wordnet`; splits by the definition's hash as there):
  wordnet_supersense_t2t  "supersense: <definition>" -> "noun.artifact"        (classification)
  wordnet_qa_t2t          "question: <definition> context: <example sentences>" -> the lemma as
                          written there                                         (QA, SQuAD-like)
  wordnet_define          "define noun: ice cream" -> the definition             (generation)
TFDS (data_dir = a TFDS data dir holding the prepared dataset; nothing is downloaded), formatted
as t5/data/preprocessors.py does:
  glue/*, super_glue/{boolq,cb,copa,rte,wic}  `glue`: "<benchmark> <feature>: <text> ..." ->
                          the label's name ("<unk>" for unlabelled test rows); glue/stsb
                          `stsb`: the score rounded to 0.2 as text ("3.8")
  squad/v1.1              `squad`: "question: <q> context: <c>" -> the first answer, with
                          punctuation padded by spaces (`pad_punctuation`)
  cnn_dailymail           `summarize`: "summarize: <article>" -> the highlights
  wmt_t2t_translate/de-en, wmt14_translate/fr-en, wmt16_translate/ro-en
                          `translate`: "translate English to German: <en>" -> <de>

Metrics are T5's (t5/evaluation/metrics.py): accuracy / F1 / MCC on label names (a prediction
that is no label name is wrong), Pearson / Spearman for STS-B (of the rounded targets, as T5
post-processes both sides), SQuAD exact match and F1, ROUGE (`metrics.rouge`) and SacreBLEU
(`metrics.bleu`). Main metrics: as `finetune.tasks` for GLUE / SuperGLUE (MCC for CoLA, F1 for
MRPC / QQP, Spearman for STS-B, macro F1 for CB, else accuracy) and the columns of the paper's
tables elsewhere: SQuAD exact match, CNN/DM ROUGE-2, WMT BLEU.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from bertfam_jax.config_lib import ConfigError
from bertfam_jax.data import wordnet
from bertfam_jax.finetune import metrics as metrics_lib
from bertfam_jax.finetune import tasks as tasks_lib

KINDS = ("classification", "regression", "qa", "generation")
CLASSIFICATION_METRICS = ("accuracy", "f1", "macro_f1", "mcc")
REGRESSION_METRICS = ("pearson", "spearman")
QA_METRICS = ("exact", "f1")
GENERATION_METRICS = (*metrics_lib.ROUGE_TYPES, "bleu")

@dataclasses.dataclass(frozen=True)
class TextTask:
  """A text-to-text task.

  Attributes:
    name: the registry key ('glue/mrpc').
    kind: one of KINDS; says how predictions are scored.
    loader: (split, data_dir) -> examples (the module docstring's format).
    metrics: the names `score` returns.
    main_metric: the one that ranks models (one of metrics).
    max_target_tokens: a hint for the decoder length (SentencePiece pieces + EOS) that fits
      nearly every target with T5's 32k vocabulary.
    label_names: the class names (classification), else ().
    eval_split, train_split, splits: as `finetune.tasks.Task`.
  """
  name: str
  kind: str
  loader: Callable[[str, str | None], Sequence[dict]]
  metrics: tuple[str, ...]
  main_metric: str
  max_target_tokens: int
  label_names: tuple[str, ...] = ()
  eval_split: str = "validation"
  train_split: str = "train"
  splits: tuple[str, ...] = ("train", "validation", "test")

  def load(self, split: str, data_dir: str | None = None,
           max_examples: int | None = None) -> list[dict]:
    """The examples of `split`, the first `max_examples` of them when given."""
    if split not in self.splits:
      raise ConfigError(f"Task {self.name!r} has splits {list(self.splits)}, not {split!r}; set "
                        f"--config.finetune.eval_split.")
    examples = self.loader(split, data_dir)
    count = len(examples) if max_examples is None else min(max_examples, len(examples))
    return [examples[i] for i in range(count)]

  def score(self, examples: Sequence[dict], predictions: Sequence[str]) -> dict[str, float]:
    """`metrics` of one predicted text per example against the examples' references."""
    if len(predictions) != len(examples) or not examples:
      raise ValueError(f"{len(predictions)} predictions for {len(examples)} examples; need one "
                       f"per example, at least one.")
    scores = _SCORERS[self.kind](self, examples, list(predictions))
    return {name: scores[name] for name in self.metrics}


def class_ids(texts: Sequence[str], label_names: Sequence[str]) -> np.ndarray:
  """[texts] int: each text's index in label_names, len(label_names) for any other text (T5's
  `string_label_to_class_id` maps those to -1, which scikit-learn scores as one more class)."""
  index = {name: i for i, name in enumerate(label_names)}
  return np.asarray([index.get(t, len(label_names)) for t in texts], np.int64)


def _score_classification(task, examples, predictions):
  labels = class_ids([e["targets"] for e in examples], task.label_names)
  predicted = class_ids(predictions, task.label_names)
  scores = metrics_lib.classification_metrics(labels, predicted, len(task.label_names) + 1)
  return dict(scores, f1=metrics_lib.binary_f1(labels, predicted))


def to_float(text: str, default: float = -1.0) -> float:
  """T5's `string_to_float`: the number a prediction spells, `default` when it spells none."""
  try:
    return float(text)
  except ValueError:
    return default


def _score_regression(task, examples, predictions):
  return metrics_lib.regression_metrics([to_float(e["targets"]) for e in examples],
                                        [to_float(p) for p in predictions])


def _score_qa(task, examples, predictions):
  return metrics_lib.squad_scores({e["id"]: p for e, p in zip(examples, predictions)},
                                  {e["id"]: e["references"] for e in examples})


def _score_generation(task, examples, predictions):
  references = [e["references"] for e in examples]
  return dict(metrics_lib.rouge(predictions, references),
              bleu=metrics_lib.bleu(predictions, references))


def example_scores(task: TextTask, examples: Sequence[dict],
                   predictions: Sequence[str]) -> dict[str, np.ndarray]:
  """{metric: [examples] float in [0, 1]} for those of `task.metrics` that are means over
  examples (classification accuracy, QA exact and f1, generation ROUGE): each example's share,
  so that their mean is `task.score`'s value (as a fraction) and a paired bootstrap can
  resample them. Other metrics (F1, MCC, correlations, BLEU) are corpus-level and left out."""
  if len(predictions) != len(examples) or not examples:
    raise ValueError(f"{len(predictions)} predictions for {len(examples)} examples; need one "
                     f"per example, at least one.")
  if task.kind == "classification":
    correct = (class_ids([e["targets"] for e in examples], task.label_names)
               == class_ids(predictions, task.label_names))
    scores = dict(accuracy=correct.astype(np.float64))
  elif task.kind == "qa":
    keys = [str(i) for i in range(len(examples))]
    exact, f1, _ = metrics_lib.squad_question_scores(
        dict(zip(keys, predictions)), {k: e["references"] for k, e in zip(keys, examples)})
    scores = dict(exact=np.array([exact[k] for k in keys]), f1=np.array([f1[k] for k in keys]))
  elif task.kind == "generation":
    scores = metrics_lib.rouge_per_example(predictions, [e["references"] for e in examples])
  else:
    scores = {}
  return {name: values for name, values in scores.items() if name in task.metrics}


_SCORERS = dict(classification=_score_classification, regression=_score_regression,
                qa=_score_qa, generation=_score_generation)


def example(inputs: str, targets: str, id_: str, references: Sequence[str] | None = None) -> dict:
  """One text-to-text example; `references` default to [targets]."""
  return dict(inputs=inputs, targets=targets, id=id_,
              references=list(references) if references else [targets])


# ------------------------------------------------------------------------ T5's text formatting


def pad_punctuation(text: str) -> str:
  """t5 preprocessors `_pad_punctuation`: a space on both sides of every ASCII punctuation
  character (RE2's [[:punct:]]), then every whitespace run collapsed to one space."""
  text = re.sub(r"([!-/:-@\[-`{-~])", r" \1 ", text)
  return re.sub(r"\s+", " ", text)


def string_join(parts: Sequence[str]) -> str:
  """t5 preprocessors `_string_join`: the parts joined by a space, every whitespace run then
  collapsed to one space."""
  return re.sub(r"\s+", " ", " ".join(parts))


def glue_example(record: Mapping[str, Any], benchmark: str, label_names: Sequence[str],
                 feature_names: Sequence[str] | None = None) -> dict:
  """t5 preprocessors `glue`: inputs "<benchmark> <key>: <text> <key>: <text> ..." over
  `feature_names`, by default every feature but label and idx in sorted order; targets the
  label's name, "<unk>" for label -1 (unlabelled test rows)."""
  keys = feature_names or sorted(set(record) - {"label", "idx"})
  inputs = " ".join([benchmark, *(f"{key}: {tasks_lib.as_text(record[key])}" for key in keys)])
  label = int(record["label"])
  return example(inputs, "<unk>" if label == -1 else label_names[label], str(record.get("idx", "")))


def stsb_example(record: Mapping[str, Any]) -> dict:
  """t5 preprocessors `stsb`: "stsb sentence1: <a> sentence2: <b>" -> the similarity rounded to
  the nearest 0.2 (half to even, as tf.round) with one decimal: 3.8 -> "3.8", 2.5 -> "2.4"."""
  rounded = np.round(np.float32(record["label"]) * np.float32(5)) / np.float32(5)
  text = tasks_lib.as_text
  return example(f"stsb sentence1: {text(record['sentence1'])} sentence2: "
                 f"{text(record['sentence2'])}", f"{rounded:.1f}", str(record.get("idx", "")))


def squad_example(question: str, context: str, answers: Sequence[str], id_: str) -> dict:
  """t5 preprocessors `squad`: "question: <q> context: <c>" -> the first answer, every text
  through `pad_punctuation`; all answers are references."""
  padded = [pad_punctuation(a) for a in answers]
  return example(string_join(["question:", pad_punctuation(question), "context:",
                              pad_punctuation(context)]), padded[0], id_, padded)


def _squad_record(record: Mapping[str, Any]) -> dict:
  raw = tasks_lib.squad_example(record)
  return squad_example(raw["question"], raw["context"], [a["text"] for a in raw["answers"]],
                       raw["id"])


def summarize_example(record: Mapping[str, Any]) -> dict:
  """t5 preprocessors `summarize` on cnn_dailymail: "summarize: <article>" (`string_join`) ->
  highlights; id '' where the dataset version has none."""
  text = tasks_lib.as_text
  return example(string_join(["summarize:", text(record["article"])]), text(record["highlights"]),
                 text(record.get("id", "")))


LANGUAGE_NAMES = dict(en="English", de="German", fr="French", ro="Romanian")


def translate_example(record: Mapping[str, Any], source: str, target: str) -> dict:
  """t5 preprocessors `translate`: "translate <Source> to <Target>: <source text>" -> the target
  text (language names as babel's English names of the ISO 639-1 codes); WMT records have no id."""
  return example(f"translate {LANGUAGE_NAMES[source]} to {LANGUAGE_NAMES[target]}: "
                 f"{tasks_lib.as_text(record[source])}", tasks_lib.as_text(record[target]), "")


# ------------------------------------------------------------------------------------- WordNet


def _wordnet_supersense(split: str, data_dir: str | None) -> list[dict]:
  task = wordnet.supersense_task(data_dir)
  examples = getattr(task, split)
  return [example(f"supersense: {text}", task.label_names[label], f"{split}-{i}")
          for i, (text, label) in enumerate(zip(examples.texts, examples.labels))]


def _wordnet_qa(split: str, data_dir: str | None) -> list[dict]:
  """`wordnet.definition_qa_task`'s answerable questions (SQuAD v1.1-like: T5 trained on v1.1),
  formatted as SQuAD; references are the distinct answer texts."""
  return [squad_example(e["question"], e["context"],
                        list(dict.fromkeys(a["text"] for a in e["answers"])), e["id"])
          for e in getattr(wordnet.definition_qa_task(data_dir), split) if e["answers"]]


_POS_OF_SS_TYPE = dict(n="noun", v="verb", a="adj", s="adj", r="adv")


def _wordnet_define(split: str, data_dir: str | None) -> list[dict]:
  return _definitions(wordnet.find_wordnet_dir(data_dir))[wordnet.SPLITS.index(split)]


@functools.lru_cache(maxsize=2)
def _definitions(wordnet_dir: str) -> tuple[list[dict], ...]:
  """Per split, one example per synset: "define <pos>: <first lemma>" -> its definition, in the
  split and order of `wordnet.supersense_task` (by the definition's hash). A lemma has one
  definition per sense, so every definition of that lemma and part of speech is a reference."""
  synsets = wordnet.load_synsets(wordnet_dir)
  by_definition, senses = {}, {}
  for synset in synsets:
    prompt = f"define {_POS_OF_SS_TYPE[synset.ss_type]}: {synset.words[0].replace('_', ' ')}"
    by_definition.setdefault(synset.definition, []).append((prompt, synset))
    senses.setdefault(prompt, []).append(synset.definition)
  task = wordnet.supersense_task(wordnet_dir)
  splits = []
  for split in wordnet.SPLITS:
    splits.append([example(prompt, text, wordnet.synset_id(synset),
                           [text, *(d for d in dict.fromkeys(senses[prompt]) if d != text)])
                   for text in dict.fromkeys(getattr(task, split).texts)
                   for prompt, synset in by_definition[text]])
  return tuple(splits)


# ------------------------------------------------------------------------------------- registry

_ENTAILMENT = ("entailment", "not_entailment")


def _glue_task(name: str, label_names: tuple[str, ...], metrics: tuple[str, ...] = ("accuracy",),
               main: str = "accuracy", *, benchmark: str | None = None,
               feature_names: tuple[str, ...] | None = None, **kwargs) -> TextTask:
  """A GLUE / SuperGLUE classification task; the benchmark name is the TFDS config's ('cola';
  MNLI's splits and SuperGLUE's RTE share 'mnli' / 'rte' as in t5/data/glue_utils.py)."""
  convert = functools.partial(glue_example, benchmark=benchmark or name.split("/")[1],
                              label_names=label_names, feature_names=feature_names)
  return TextTask(name, "classification", tasks_lib.tfds_loader(name, convert),
                  metrics, main, max_target_tokens=8, label_names=label_names, **kwargs)


def _translation_task(name: str, source: str, target: str) -> TextTask:
  convert = functools.partial(translate_example, source=source, target=target)
  return TextTask(name, "generation", tasks_lib.tfds_loader(name, convert), ("bleu",), "bleu",
                  max_target_tokens=256)


def _registry() -> dict[str, TextTask]:
  task_list = [
      TextTask("wordnet_supersense_t2t", "classification", _wordnet_supersense,
               ("accuracy", "macro_f1"), "accuracy", max_target_tokens=8,
               label_names=wordnet.LEXNAMES),
      TextTask("wordnet_qa_t2t", "qa", _wordnet_qa, QA_METRICS, "exact", max_target_tokens=16),
      TextTask("wordnet_define", "generation", _wordnet_define, GENERATION_METRICS, "rouge2",
               max_target_tokens=64),
      _glue_task("glue/cola", ("unacceptable", "acceptable"), ("mcc", "accuracy"), "mcc"),
      _glue_task("glue/sst2", ("negative", "positive")),
      _glue_task("glue/mrpc", ("not_equivalent", "equivalent"), ("f1", "accuracy"), "f1"),
      _glue_task("glue/qqp", ("not_duplicate", "duplicate"), ("f1", "accuracy"), "f1"),
      TextTask("glue/stsb", "regression", tasks_lib.tfds_loader("glue/stsb", stsb_example),
               REGRESSION_METRICS, "spearman", max_target_tokens=4),
      _glue_task("glue/mnli", ("entailment", "neutral", "contradiction"),
                 eval_split="validation_matched",
                 splits=("train", "validation_matched", "validation_mismatched", "test_matched",
                         "test_mismatched")),
      _glue_task("glue/qnli", _ENTAILMENT),
      _glue_task("glue/rte", _ENTAILMENT),
      _glue_task("glue/wnli", ("not_entailment", "entailment")),
      _glue_task("super_glue/boolq", ("False", "True")),
      _glue_task("super_glue/cb", ("entailment", "contradiction", "neutral"),
                 ("macro_f1", "accuracy"), "macro_f1"),
      _glue_task("super_glue/copa", ("choice1", "choice2")),
      _glue_task("super_glue/rte", _ENTAILMENT),
      # glue_utils: WiC's word goes last; its span indices are left out.
      _glue_task("super_glue/wic", ("False", "True"),
                 feature_names=("sentence1", "sentence2", "word")),
      TextTask("squad/v1.1", "qa", tasks_lib.tfds_loader("squad/v1.1", _squad_record),
               QA_METRICS, "exact", max_target_tokens=32, splits=("train", "validation")),
      TextTask("cnn_dailymail", "generation",
               tasks_lib.tfds_loader("cnn_dailymail", summarize_example), GENERATION_METRICS,
               "rouge2", max_target_tokens=128),
      _translation_task("wmt_t2t_translate/de-en", "en", "de"),
      _translation_task("wmt14_translate/fr-en", "en", "fr"),
      _translation_task("wmt16_translate/ro-en", "en", "ro"),
  ]
  return {task.name: task for task in task_list}


TASKS: dict[str, TextTask] = _registry()


def get(name: str) -> TextTask:
  """The registered text-to-text task called `name`."""
  if name not in TASKS:
    raise ConfigError(f"Unknown text-to-text task {name!r}; choose one of {sorted(TASKS)}.")
  return TASKS[name]
