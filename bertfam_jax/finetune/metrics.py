"""Classification metrics in numpy (GLUE reports accuracy, F1 and Matthews correlation).

Every function takes `labels` and `predictions`, [examples] integer class ids, and returns a float.
Conventions follow scikit-learn's defaults so numbers compare with published GLUE scripts.
"""

from __future__ import annotations

import numpy as np


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


def classification_metrics(labels, predictions, num_classes: int) -> dict[str, float]:
  """{'accuracy', 'macro_f1', 'mcc'}."""
  return dict(accuracy=accuracy(labels, predictions),
              macro_f1=macro_f1(labels, predictions, num_classes),
              mcc=matthews_corrcoef(labels, predictions, num_classes))
