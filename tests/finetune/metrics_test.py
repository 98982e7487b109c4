"""Classification metrics against values computed by hand."""

import sys

import numpy as np
import pytest

from bertfam_jax.finetune import features, metrics

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


def test_binary_f1():
  # TP 3, FP 1, FN 1 → 6 / 8.
  assert metrics.binary_f1(BINARY_LABELS, BINARY_PREDICTIONS) == 0.75
  assert metrics.binary_f1([0, 0], [0, 0]) == 0.0


def test_pearson_spearman_by_hand():
  # x = 1..4, y = (1, 3, 2, 4): Pearson = cov / (sd sd) = 4 / 5; ranks equal the values, so
  # Spearman is 0.8 too. A monotone, non-linear y keeps Spearman at 1.
  assert metrics.pearson([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
  assert metrics.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
  assert metrics.spearman([1, 2, 3, 4], [1, 10, 100, 1000]) == pytest.approx(1.0)
  assert metrics.pearson([1, 2, 3, 4], [1, 10, 100, 1000]) < 0.9
  # Ties take their average rank: ranks (1.5, 1.5, 3) vs (1, 2, 3) → Pearson of the ranks.
  assert metrics.spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(np.sqrt(3) / 2)
  assert metrics.regression_metrics([1, 2, 3], [5, 5, 5]) == dict(pearson=0.0, spearman=0.0)


def test_squad_normalisation_and_scores():
  assert metrics.normalize_answer("  The  Cat's, (a) hat!") == "cats hat"
  assert metrics.normalize_answer("Theatre an") == "theatre"
  # 'the cat sat' → {cat, sat}; 'cat sat on' → {cat, sat, on}: P 2/3, R 1, F1 0.8.
  assert metrics.f1("the cat sat", "cat sat on") == pytest.approx(0.8)
  assert metrics.exact_match("The Cat sat.", "cat  sat") == 1.0
  # Tokens count with multiplicity: {x, b, b} & {b, b, b} = {b, b}: P = R = 2/3.
  assert metrics.f1("x b b", "b b b") == pytest.approx(2 / 3)
  assert metrics.f1("a b b", "b b b") == pytest.approx(0.8)   # 'a' is an article: gold is 'b b'
  # evaluate-v2.0.py: an empty side scores 1 only if both are empty.
  assert metrics.f1("", "") == 1.0 and metrics.f1("the", "") == 1.0 and metrics.f1("", "x") == 0.0


def test_squad_scores_v1_and_v2():
  answers = {"q1": ["Denver Broncos", "the Broncos"], "q2": ["1966"], "q3": ["Santa Clara"]}
  predictions = {"q1": "Broncos", "q2": "1966", "q3": "Clara, California"}
  # q1: max(F1 vs 'denver broncos' = 2/3, vs 'broncos' = 1) = 1, EM 1 (the article is dropped);
  # q2 exact; q3 F1 2·(1/2)(1/2)/1 = 0.5.
  assert metrics.squad_scores(predictions, answers) == pytest.approx(
      dict(exact=200 / 3, f1=250 / 3, total=3))
  answers["q4"], answers["q5"] = [], ["the"]   # both unanswerable ('the' normalises to empty)
  predictions.update(q4="", q5="something")
  scores = metrics.squad_scores(predictions, answers)
  assert scores == pytest.approx(dict(
      exact=300 / 5, f1=350 / 5, total=5, HasAns_exact=200 / 3, HasAns_f1=250 / 3,
      HasAns_total=3, NoAns_exact=50, NoAns_f1=50, NoAns_total=2))
  del predictions["q2"]   # a missing prediction scores 0 (evaluate-v1.1.py)
  assert metrics.squad_scores(predictions, answers)["HasAns_exact"] == pytest.approx(100 / 3)


def test_bio_spans_follow_seqeval():
  tags = ["B-PER", "I-PER", "O", "I-LOC", "I-LOC", "B-LOC", "I-PER", "B-ORG", "B-ORG"]
  # I- after O starts a span; I- of another type starts a new span; B- after B- splits.
  assert metrics.bio_spans(tags) == [("PER", 0, 1), ("LOC", 3, 4), ("LOC", 5, 5), ("PER", 6, 6),
                                     ("ORG", 7, 7), ("ORG", 8, 8)]
  assert metrics.bio_spans(["B-noun.animal", "I-noun.animal"]) == [("noun.animal", 0, 1)]
  with pytest.raises(ValueError, match="not BIO"):
    metrics.bio_spans(["E-PER"])


def test_span_f1_and_token_accuracy_by_hand():
  true = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-ORG"]]
  predicted = [["B-PER", "I-PER", "O", "O"], ["B-ORG", "I-ORG"]]
  # True spans: PER(0-1), LOC(3), ORG(1). Predicted: PER(0-1), ORG(0-1). Correct 1 of 2
  # predicted and of 3 true: P 1/2, R 1/3, F1 0.4. Tokens right: 3 of 4 and 0 of 2.
  scores = metrics.tagging_metrics(true, predicted)
  assert scores == pytest.approx(dict(span_precision=0.5, span_recall=1 / 3, span_f1=0.4,
                                      token_accuracy=0.5))
  assert metrics.span_f1([["O"]], [["O"]])["span_f1"] == 0.0
  with pytest.raises(ValueError, match="same number"):
    metrics.token_accuracy([["O", "O"]], [["O"]])


# ------------------------------------------------------------------------------- ROUGE and BLEU


def test_rouge_by_hand():
  # "the cat sat on the mat" vs "the cat is on the mat": 5 of 6 unigrams shared (F 5/6), bigrams
  # {the cat, on the, the mat} 3 of 5 (F 3/5), LCS "the cat on the mat" 5 (F 5/6). The second
  # example has an exact reference among two: 100 on every type.
  scores = metrics.rouge(["the cat sat on the mat", "a dog ran"],
                         [["the cat is on the mat"], ["no match here", "a dog ran"]])
  assert scores["rouge1"] == pytest.approx((500 / 6 + 100) / 2)
  assert scores["rouge2"] == pytest.approx((60 + 100) / 2)
  assert scores["rougeL"] == pytest.approx((500 / 6 + 100) / 2)


def test_rouge_lsum_splits_sentences_at_t5s_periods():
  # Two sentences swapped: one LCS over the whole text keeps 2 of 4 words, the summary-level LCS
  # (one sentence per line after " . " -> " .\n") keeps all 4.
  scores = metrics.rouge(["red fox . blue owl"], [["blue owl . red fox"]])
  assert scores["rougeL"] == pytest.approx(50.0)
  assert scores["rougeLsum"] == pytest.approx(100.0)


def test_bleu_is_sacrebleu_with_t5s_settings():
  sacrebleu = pytest.importorskip("sacrebleu")
  predictions = ["The cat sits on the mat.", "Der Hund läuft schnell nach Hause.", "Hello"]
  references = [["The cat is on the mat.", "A cat sits on the mat."],
                ["Der Hund rennt schnell nach Hause."], ["Hello world"]]
  expected = sacrebleu.corpus_bleu(
      predictions, [[r[0] for r in references], [references[0][1], None, None]],
      smooth_method="exp", smooth_value=0.0, force=False, lowercase=False, tokenize="intl",
      use_effective_order=False).score
  assert metrics.bleu(predictions, references) == pytest.approx(expected)
  assert 0 < expected < 100
  assert metrics.bleu(["exactly the same words here"],
                      [["exactly the same words here"]]) == pytest.approx(100.0)


def test_generation_metrics_reject_bad_references():
  with pytest.raises(ValueError, match="one non-empty list"):
    metrics.bleu(["a"], ["a"])
  with pytest.raises(ValueError, match="predictions for"):
    metrics.rouge(["a", "b"], [["a"]])


def test_gold_nll_is_the_softmax_cross_entropy():
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import optax  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(50, 7)) * 30 + 500      # large logits: computed stably
  labels = rng.integers(0, 7, 50)
  expected = optax.softmax_cross_entropy_with_integer_labels(jnp.asarray(logits, jnp.float32) -
                                                             500, jnp.asarray(labels))
  np.testing.assert_allclose(metrics.gold_nll(logits, labels), expected, rtol=1e-4, atol=1e-4)
  task = type("Task", (), {"kind": "multiple_choice"})
  assert features.gold_nll(task, logits, {"label": labels}) == pytest.approx(
      list(metrics.gold_nll(logits, labels)))
  task.kind = "extractive_qa"
  assert features.gold_nll(task, logits, {"label": labels}) is None


@pytest.mark.parametrize("module, package", [("rouge_score", "rouge-score"),
                                             ("sacrebleu", "sacrebleu")])
def test_missing_generation_scores_name_the_extra(monkeypatch, module, package):
  """Without the [t5] extra, ROUGE / BLEU and a generation task's recipe stop with one line that
  names it, before any data is read or any step is trained."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  from bertfam_jax.config_lib import ConfigError  # pylint: disable=import-outside-toplevel
  from bertfam_jax.finetune import seq2seq  # pylint: disable=import-outside-toplevel
  monkeypatch.setitem(sys.modules, module, None)      # `import module` raises ImportError
  if module == "rouge_score":
    monkeypatch.delitem(sys.modules, "rouge_score.rouge_scorer", raising=False)
  message = rf"needs the {package} package: pip install 'bertfam_jax\[t5\]'"
  score = metrics.rouge if module == "rouge_score" else metrics.bleu
  with pytest.raises(ConfigError, match=message):
    score(["a cat"], [["a cat"]])
  config = ml_collections.ConfigDict(dict(finetune=dict(task="wordnet_define")))
  with pytest.raises(ConfigError, match=message):
    seq2seq.make_recipe(config, tokenizer=None, params=None, mesh=None)
