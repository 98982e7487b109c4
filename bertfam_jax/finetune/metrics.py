"""Fine-tuning metrics in numpy: the ones GLUE, SuperGLUE, SQuAD and tagging tasks report.

Classification functions take `labels` and `predictions`, [examples] integer class ids, and return
a float; conventions follow scikit-learn's defaults so numbers compare with published GLUE scripts.
Regression: Pearson / Spearman (STS-B). SQuAD: the official evaluate-v1.1 / v2.0 scripts' answer
normalisation, exact match and token F1. Tagging: seqeval's exact BIO spans and token accuracy.
"""

from __future__ import annotations

import collections
import importlib
import re
import string
from typing import Mapping, Sequence

import numpy as np

from bertfam_jax.config_lib import ConfigError

# The packages of the generation scores, in the [t5] extra: (module, pip name, what needs it).
GENERATION_PACKAGES = (("rouge_score", "rouge-score", "ROUGE"), ("sacrebleu", "sacrebleu", "BLEU"))


def require(module: str):
  """Imports one of GENERATION_PACKAGES' modules; raises ConfigError naming the [t5] extra (one
  line, before any training when called from a recipe) when it is not installed."""
  _, package, what = next(p for p in GENERATION_PACKAGES if p[0] == module)
  try:
    return importlib.import_module(module)
  except ModuleNotFoundError as e:
    if e.name != module:   # the package is there and broke: its own error says why
      raise
    raise ConfigError(f"{what} needs the {package} package: pip install 'bertfam_jax[t5]' (or "
                      f"pip install {package}).") from None


def require_generation_scores() -> None:
  """Raises ConfigError (`require`) unless ROUGE's and BLEU's packages import."""
  for module, _, _ in GENERATION_PACKAGES:
    require(module)


def confusion_matrix(labels, predictions, num_classes: int) -> np.ndarray:
  """[num_classes, num_classes] int64 counts; rows are true classes, columns predicted ones."""
  labels, predictions = np.asarray(labels), np.asarray(predictions)
  if labels.shape != predictions.shape or labels.ndim != 1:
    raise ValueError(f"labels {labels.shape} and predictions {predictions.shape} must both be "
                     f"[examples].")
  for name, ids in (("labels", labels), ("predictions", predictions)):
    if ids.size and (ids.min() < 0 or ids.max() >= num_classes):
      raise ValueError(f"{name} hold ids outside [0, {num_classes}).")
  counts = np.zeros((num_classes, num_classes), np.int64)
  np.add.at(counts, (labels, predictions), 1)
  return counts


def accuracy(labels, predictions) -> float:
  return float(np.mean(np.asarray(labels) == np.asarray(predictions)))


def macro_f1(labels, predictions, num_classes: int) -> float:
  """The unweighted mean of per-class F1 = 2·TP / (2·TP + FP + FN), over the classes that occur in
  `labels` or `predictions` (scikit-learn's `f1_score(average='macro')`)."""
  counts = confusion_matrix(labels, predictions, num_classes)
  true_positives = np.diag(counts)
  true, predicted = counts.sum(axis=1), counts.sum(axis=0)
  present = (true + predicted) > 0
  if not present.any():
    return 0.0
  f1 = 2 * true_positives[present] / (true[present] + predicted[present])
  return float(np.mean(f1))


def matthews_corrcoef(labels, predictions, num_classes: int) -> float:
  """Matthews correlation, multi-class form (Gorodkin 2004, as scikit-learn):
  (c·s − Σ_k p_k·t_k) / sqrt((s² − Σ_k p_k²)(s² − Σ_k t_k²)) with c correct, s examples, t_k / p_k
  the true / predicted counts of class k; 0 when a factor of the denominator is 0 (one class only).
  For two classes it is (TP·TN − FP·FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)), CoLA's metric."""
  counts = confusion_matrix(labels, predictions, num_classes).astype(np.float64)
  true, predicted = counts.sum(axis=1), counts.sum(axis=0)
  correct, total = np.trace(counts), counts.sum()
  denominator = (total**2 - predicted @ predicted) * (total**2 - true @ true)
  if denominator == 0:
    return 0.0
  return float((correct * total - predicted @ true) / np.sqrt(denominator))


def gold_nll(logits, labels) -> np.ndarray:
  """The gold label's negative log-probability under a softmax: logits [n, classes], labels [n]
  int -> [n] float64 nats."""
  logits = np.asarray(logits, np.float64)
  shifted = logits - logits.max(-1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  return -np.take_along_axis(log_probs, np.asarray(labels)[:, None], -1)[:, 0]


def classification_metrics(labels, predictions, num_classes: int) -> dict[str, float]:
  """{'accuracy', 'macro_f1', 'mcc'}."""
  return dict(accuracy=accuracy(labels, predictions),
              macro_f1=macro_f1(labels, predictions, num_classes),
              mcc=matthews_corrcoef(labels, predictions, num_classes))


def binary_f1(labels, predictions) -> float:
  """F1 of the positive class 1, 2·TP / (2·TP + FP + FN) (scikit-learn's `f1_score` default, the
  GLUE F1 of MRPC and QQP); 0 when there is no positive label or prediction."""
  labels, predictions = np.asarray(labels), np.asarray(predictions)
  true_positives = np.sum((labels == 1) & (predictions == 1))
  denominator = np.sum(labels == 1) + np.sum(predictions == 1)
  return float(2 * true_positives / denominator) if denominator else 0.0


# ------------------------------------------------------------------------------------ regression


def pearson(labels, predictions) -> float:
  """Pearson correlation of [examples] floats (STS-B); 0 when either side is constant."""
  labels, predictions = np.asarray(labels, np.float64), np.asarray(predictions, np.float64)
  if np.ptp(labels) == 0 or np.ptp(predictions) == 0:
    return 0.0
  from scipy import stats  # pylint: disable=g-import-not-at-top  (~1 s to import: when needed)
  return float(stats.pearsonr(labels, predictions)[0])


def spearman(labels, predictions) -> float:
  """Spearman rank correlation (ties get their average rank); 0 when either side is constant."""
  labels, predictions = np.asarray(labels, np.float64), np.asarray(predictions, np.float64)
  if np.ptp(labels) == 0 or np.ptp(predictions) == 0:
    return 0.0
  from scipy import stats  # pylint: disable=g-import-not-at-top
  return float(stats.spearmanr(labels, predictions)[0])


def regression_metrics(labels, predictions) -> dict[str, float]:
  """{'pearson', 'spearman'}: STS-B's two numbers."""
  return dict(pearson=pearson(labels, predictions), spearman=spearman(labels, predictions))


# ------------------------------------------------------------------------- SQuAD (official scripts)

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
  """SQuAD's evaluate-v1.1/v2.0 normalisation: lower case, drop ASCII punctuation, drop the
  articles a/an/the, collapse whitespace."""
  text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
  return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(gold: str, prediction: str) -> float:
  return float(normalize_answer(gold) == normalize_answer(prediction))


def f1(gold: str, prediction: str) -> float:
  """Bag-of-tokens F1 of the normalised answers (evaluate-v2.0.py `compute_f1`): when either side
  is empty (no answer) it is 1 if both are, else 0."""
  gold_tokens = normalize_answer(gold).split()
  predicted_tokens = normalize_answer(prediction).split()
  if not gold_tokens or not predicted_tokens:
    return float(gold_tokens == predicted_tokens)
  same = sum((collections.Counter(gold_tokens) & collections.Counter(predicted_tokens)).values())
  if same == 0:
    return 0.0
  precision, recall = same / len(predicted_tokens), same / len(gold_tokens)
  return 2 * precision * recall / (precision + recall)


def squad_question_scores(predictions: Mapping[str, str], answers: Mapping[str, Sequence[str]]
                          ) -> tuple[dict[str, float], dict[str, float], dict[str, bool]]:
  """Per question id: exact match and F1 in [0, 1] (each the maximum over the question's gold
  answers, as `squad_scores` describes; 0 for a question without a prediction), and whether it
  has an answer; what `squad_scores` averages."""
  if not answers:
    raise ValueError("squad_scores needs at least one question.")
  exact_scores, f1_scores, has_answer = {}, {}, {}
  for qid, texts in answers.items():
    golds = [t for t in texts if normalize_answer(t)] or [""]
    has_answer[qid] = golds != [""]
    if qid not in predictions:
      exact_scores[qid] = f1_scores[qid] = 0.0
      continue
    exact_scores[qid] = max(exact_match(g, predictions[qid]) for g in golds)
    f1_scores[qid] = max(f1(g, predictions[qid]) for g in golds)
  return exact_scores, f1_scores, has_answer


def squad_scores(predictions: Mapping[str, str],
                 answers: Mapping[str, Sequence[str]]) -> dict[str, float]:
  """The official SQuAD evaluation (evaluate-v2.0.py, which equals v1.1 on answerable questions).

  Each question scores the maximum over its gold answers that do not normalise to empty; a
  question with none of those (SQuAD 2.0's unanswerable) has the one gold answer "", so only an
  empty prediction scores. A question missing from `predictions` scores 0 (evaluate-v1.1.py).

  Args:
    predictions: question id -> predicted answer text ("" = no answer).
    answers: question id -> its gold answer texts ([] when unanswerable).

  Returns:
    exact, f1: percentages (0-100, as the official scripts print them) over all questions, and
    total; when some question is unanswerable also HasAns_exact, HasAns_f1, HasAns_total,
    NoAns_exact, NoAns_f1, NoAns_total.
  """
  exact_scores, f1_scores, has_answer = squad_question_scores(predictions, answers)

  def summary(qids, prefix=""):
    return {f"{prefix}exact": 100.0 * sum(exact_scores[q] for q in qids) / len(qids),
            f"{prefix}f1": 100.0 * sum(f1_scores[q] for q in qids) / len(qids),
            f"{prefix}total": float(len(qids))}

  scores = summary(list(answers))
  if not all(has_answer.values()):
    for prefix, wanted in (("HasAns_", True), ("NoAns_", False)):
      qids = [q for q, has in has_answer.items() if has == wanted]
      if qids:
        scores.update(summary(qids, prefix))
  return scores


# ------------------------------------------------------------------ token classification (BIO)


def bio_spans(tags: Sequence[str]) -> list[tuple[str, int, int]]:
  """The entity spans (type, first, last) of one BIO-tagged sentence, as seqeval's default
  (lenient) `get_entities`: a span starts at B-X, or at I-X after O or after a tag of another
  type, and runs over the following I-X."""
  spans = []
  kind, begin = None, 0
  for i, tag in enumerate(list(tags) + ["O"]):
    prefix, _, tag_kind = tag.partition("-")
    if prefix not in ("B", "I", "O"):
      raise ValueError(f"Tag {tag!r} is not BIO (O, B-TYPE, I-TYPE).")
    continues = prefix == "I" and tag_kind == kind
    if kind is not None and not continues:
      spans.append((kind, begin, i - 1))
      kind = None
    if prefix in ("B", "I") and not continues:
      kind, begin = tag_kind, i
  return spans


def span_f1(true_tags: Sequence[Sequence[str]],
            predicted_tags: Sequence[Sequence[str]]) -> dict[str, float]:
  """Micro-averaged exact-span precision, recall and F1 over sentences of BIO tags (seqeval's
  default mode, `classification_report`'s micro avg); each is 0 when its denominator is."""
  _check_tag_lengths(true_tags, predicted_tags)
  true_spans = {(s, *span) for s, tags in enumerate(true_tags) for span in bio_spans(tags)}
  predicted = {(s, *span) for s, tags in enumerate(predicted_tags) for span in bio_spans(tags)}
  correct = len(true_spans & predicted)
  precision = correct / len(predicted) if predicted else 0.0
  recall = correct / len(true_spans) if true_spans else 0.0
  f1_score = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
  return dict(span_precision=precision, span_recall=recall, span_f1=f1_score)


def token_accuracy(true_tags: Sequence[Sequence], predicted_tags: Sequence[Sequence]) -> float:
  """The fraction of words whose tag is right, over all sentences (seqeval `accuracy_score`)."""
  _check_tag_lengths(true_tags, predicted_tags)
  pairs = [(t, p) for ts, ps in zip(true_tags, predicted_tags) for t, p in zip(ts, ps)]
  return sum(t == p for t, p in pairs) / len(pairs) if pairs else 0.0


def tagging_metrics(true_tags: Sequence[Sequence[str]],
                    predicted_tags: Sequence[Sequence[str]]) -> dict[str, float]:
  """{'span_precision', 'span_recall', 'span_f1', 'token_accuracy'}."""
  return dict(span_f1(true_tags, predicted_tags),
              token_accuracy=token_accuracy(true_tags, predicted_tags))


def _check_tag_lengths(true_tags, predicted_tags) -> None:
  lengths = [len(t) for t in true_tags], [len(p) for p in predicted_tags]
  if lengths[0] != lengths[1]:
    raise ValueError("true_tags and predicted_tags must hold the same number of sentences with "
                     "the same number of tags each.")


# ------------------------------------------------------------- text generation (ROUGE, BLEU)

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")


def _summary_sentences(text: str) -> str:
  """T5's `_prepare_summary_rouge`: one sentence per line (" . " -> " .\\n"), which rougeLsum
  splits on."""
  return text.replace(" . ", " .\n")


def rouge(predictions: Sequence[str], references: Sequence[Sequence[str]],
          rouge_types: Sequence[str] = ROUGE_TYPES) -> dict[str, float]:
  """ROUGE F-measures in percent, averaged over examples (t5.evaluation.metrics.rouge with
  `rouge_score`: no stemming, its default tokenizer (lower case, [a-z0-9] words)).

  Each example scores against its best reference per ROUGE type (`rouge_per_example`). T5
  reports the BootstrapAggregator's "mid", the median of 1000 resampled means; the plain mean
  here equals it up to the bootstrap's noise and is deterministic.

  Args:
    predictions: [examples] generated texts.
    references: [examples] lists of acceptable texts (at least one each).
    rouge_types: any of `ROUGE_TYPES`.

  Returns:
    {rouge_type: mean F-measure x 100}.
  """
  per_example = rouge_per_example(predictions, references, rouge_types)
  return {name: 100.0 * float(np.mean(values)) for name, values in per_example.items()}


def rouge_per_example(predictions: Sequence[str], references: Sequence[Sequence[str]],
                      rouge_types: Sequence[str] = ROUGE_TYPES) -> dict[str, np.ndarray]:
  """{rouge_type: [examples] F-measure in [0, 1]}, each example against its best reference
  (`rouge_scorer.score_multi`); what `rouge` averages, and what a paired bootstrap resamples."""
  require("rouge_score")
  from rouge_score import rouge_scorer  # pylint: disable=g-import-not-at-top
  _check_references(predictions, references)
  scorer = rouge_scorer.RougeScorer(list(rouge_types), use_stemmer=False)
  scores = [scorer.score_multi([_summary_sentences(g) for g in golds],
                               _summary_sentences(prediction))
            for prediction, golds in zip(predictions, references)]
  return {name: np.array([s[name].fmeasure for s in scores]) for name in rouge_types}


def bleu(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
  """Corpus BLEU (0-100) with T5's SacreBLEU settings (t5.evaluation.metrics.bleu): 'exp'
  smoothing, 'intl' tokenization, case-sensitive, no effective order.

  Args:
    predictions: [examples] generated texts.
    references: [examples] lists of reference translations; examples may have different numbers
      of references (the missing ones are passed to sacrebleu as None).
  """
  sacrebleu = require("sacrebleu")
  _check_references(predictions, references)
  streams = max(len(golds) for golds in references)
  reference_streams = [[golds[k] if k < len(golds) else None for golds in references]
                       for k in range(streams)]
  return float(sacrebleu.corpus_bleu(list(predictions), reference_streams, smooth_method="exp",
                                     smooth_value=0.0, force=False, lowercase=False,
                                     tokenize="intl", use_effective_order=False).score)


def _check_references(predictions, references) -> None:
  if not predictions or len(predictions) != len(references):
    raise ValueError(f"{len(predictions)} predictions for {len(references)} reference lists; "
                     f"need one non-empty list per prediction, at least one.")
  if any(isinstance(golds, str) or not golds for golds in references):
    raise ValueError("references must hold one non-empty list of texts per example.")
