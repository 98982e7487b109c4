"""Classification metrics against values computed by hand."""

import numpy as np
import pytest

from bertfam_jax.finetune import metrics

# Two classes: TP 3, FN 1, FP 1, TN 3.
BINARY_LABELS = [1, 1, 1, 0, 0, 0, 0, 1]
BINARY_PREDICTIONS = [1, 0, 1, 0, 0, 1, 0, 1]
# Three classes; confusion (rows true, columns predicted) [[2, 1, 0], [0, 1, 1], [0, 0, 1]].
THREE_LABELS = [0, 0, 0, 1, 1, 2]
THREE_PREDICTIONS = [0, 0, 1, 1, 2, 2]


def test_confusion_matrix():
  np.testing.assert_array_equal(metrics.confusion_matrix(THREE_LABELS, THREE_PREDICTIONS, 3),
                                [[2, 1, 0], [0, 1, 1], [0, 0, 1]])


def test_binary_by_hand():
  # F1 of either class is 2·3 / (2·3 + 1 + 1) = 0.75; MCC = (3·3 − 1·1) / sqrt(4·4·4·4) = 0.5.
  assert metrics.classification_metrics(BINARY_LABELS, BINARY_PREDICTIONS, 2) == dict(
      accuracy=0.75, macro_f1=0.75, mcc=0.5)


def test_three_classes_by_hand():
  # Per-class F1 2TP/(2TP+FP+FN): 4/5, 2/4, 2/3. MCC: c=4, s=6, t=(3,2,1), p=(2,2,2):
  # (4·6 − 12) / sqrt((36 − 12)(36 − 14)) = 12 / sqrt(528).
  result = metrics.classification_metrics(THREE_LABELS, THREE_PREDICTIONS, 3)
  assert result["accuracy"] == pytest.approx(4 / 6)
  assert result["macro_f1"] == pytest.approx((4 / 5 + 1 / 2 + 2 / 3) / 3)
  assert result["mcc"] == pytest.approx(12 / np.sqrt(528))


def test_binary_mcc_equals_the_two_by_two_formula():
  rng = np.random.default_rng(0)
  labels, predictions = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
  tp = np.sum((labels == 1) & (predictions == 1))
  tn = np.sum((labels == 0) & (predictions == 0))
  fp = np.sum((labels == 0) & (predictions == 1))
  fn = np.sum((labels == 1) & (predictions == 0))
  expected = (tp * tn - fp * fn) / np.sqrt(float((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)))
  assert metrics.matthews_corrcoef(labels, predictions, 2) == pytest.approx(expected)


def test_degenerate_cases():
  # One predicted class: MCC's denominator is 0 → 0 (scikit-learn's convention).
  assert metrics.matthews_corrcoef([0, 1, 1], [1, 1, 1], 2) == 0.0
  # Perfect and inverted binary predictions.
  assert metrics.matthews_corrcoef([0, 1, 0, 1], [0, 1, 0, 1], 2) == 1.0
  assert metrics.matthews_corrcoef([0, 1, 0, 1], [1, 0, 1, 0], 2) == -1.0
  # Class 2 occurs in neither labels nor predictions: averaged over classes 0 and 1 only.
  assert metrics.macro_f1([0, 1], [0, 1], 3) == 1.0
  # A class only predicted counts with F1 0: classes 0 (F1 2/3) and 1 (F1 0).
  assert metrics.macro_f1([0, 0], [0, 1], 2) == pytest.approx(1 / 3)


def test_rejects_bad_inputs():
  with pytest.raises(ValueError, match="outside"):
    metrics.confusion_matrix([0, 2], [0, 1], 2)
  with pytest.raises(ValueError, match="must both be"):
    metrics.confusion_matrix([0, 1], [0], 2)
