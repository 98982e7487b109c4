"""Static versus contextual word representations (issue 21 §4; Potts, "Contextual word
representations"): frozen features of a word in its sentence, each read by a linear probe, in
the protocol of EXPERIMENTS.md.

Rows, each a featuriser of the target word of an example sentence:
  word2vec, fastText   static vectors trained on the same corpus (`bertfam_jax.static`, configs/
                       static.py): the word's vector whatever its sentence (zeros for a word
                       outside word2vec's vocabulary; fastText builds one from its n-grams)
  ELMo                 the biLM's three layers with equal weights (ELMo's fixed mix)
  BERT, RoBERTa, ALBERT, ELECTRA (its discriminator), XLNet (the content stream), T5 (its
                       encoder): the last layer
  No pre-training      BERT's network at a random initialisation of the row's seed (the floor)
Every contextual row is its family's `configs/<family>.py:runlocal`, pre-trained once on the
embedded corpus (`--workdirs`; a finished workdir is read, as `experiments.runlocal_check` reads
it). A word's vector is the mean of its pieces' (`represent`, unit=word, pooling=mean).

Tasks (WordNet 3.0, offline; splits by the synset's definition hash, or the lemma's for wic):
  supersense  the lemma in one of its synset's example sentences → the synset's supersense (45
              classes): the same word in different senses, from `wordnet.lemma_tagging_task`
  wic         two example sentences sharing a lemma → the same synset or not (balanced), the
              word-in-context task: probe input the cosine similarity of the lemma's two vectors
              (the threshold baseline of Pilehvar & Camacho-Collados 2019, WiC, for ELMo and
              BERT). The first run's input, [u; v; u·v; |u − v|] (4 × the feature size, e.g.
              1,024 for ELMo), overfit: ELMo's wic log-likelihood fell below the constant
              output's at 61% accuracy, ±5.7 points over seeds
              (experiments/results/representations/cpu/first_design.md)
A static row gives the same vector to a word in every sentence: on wic it has nothing but the
word's inflection to go on.

The probe: softmax regression on standardised features (`finetune.probe.softmax_regression`,
500 full-batch Adam steps); the seed draws which training words it fits (the scale's
`train_fraction` of them, with all their examples; its L2 weight is chosen on the others',
L2_GRID) and the floor's initialisation. Scores on the same test examples for
every row: accuracy and the gold label's log-likelihood, per example, for the paired bootstrap
(`experiments/report.py`). Per-layer curves (seed 0, table.md and layers.png): the supersense
probe on each layer of the rows that have several (which layer holds what).

  python -m experiments.representations --scale=cpu --workdirs=/tmp/representations
"""

from __future__ import annotations

import collections
import json
import os
import time

from absl import app, flags
import numpy as np

from bertfam_jax import config_lib
from bertfam_jax import represent
from bertfam_jax import static
from bertfam_jax.data import wordnet
from bertfam_jax.finetune import probe
from bertfam_jax.train import train
from experiments import common, report

NO_PRETRAINING = common.NO_PRETRAINING
SUPERSENSE, WIC = "supersense", "wic"
STATIC_ROWS = ("word2vec", "fastText")
# (row, how its features are made): static vectors, a pre-trained family's run, or the floor.
ROWS = [
    ("word2vec", dict(kind="static", method="word2vec")),
    ("fastText", dict(kind="static", method="fasttext")),
    ("ELMo", dict(kind="run", family="elmo", mix="mean")),
    ("BERT", dict(kind="run", family="bert")),
    ("RoBERTa", dict(kind="run", family="roberta")),
    ("ALBERT", dict(kind="run", family="albert")),
    ("ELECTRA", dict(kind="run", family="electra")),
    ("XLNet", dict(kind="run", family="xlnet")),
    ("T5 encoder", dict(kind="run", family="t5")),
    (NO_PRETRAINING, dict(kind="random", family="bert")),
]
_NAMES = [name for name, _ in ROWS]
CONTEXTUAL = _NAMES[2:-1]

SCALES = {
    # Probes on 4,000 training examples of each task (a seed draws 80% of them) and 2,000 test
    # examples; the pre-trained runs are each family's :runlocal (2,000 steps).
    "cpu": dict(train_examples=4000, test_examples=2000, train_fraction=0.8, max_tokens=128),
}

COLUMNS = (report.Column("Supersense acc", SUPERSENSE, "accuracy"),
           report.Column("Supersense log-lik", SUPERSENSE, "target_nll"),
           report.Column("WiC acc", WIC, "accuracy"),
           report.Column("WiC log-lik", WIC, "target_nll"))

COMPARISON = report.Comparison(
    title="Static versus contextual word representations",
    rows=_NAMES, baseline="word2vec", floor=NO_PRETRAINING,
    groups=(("Static", _NAMES[:2]), ("Contextual", CONTEXTUAL), ("Floor", _NAMES[-1:])),
    columns=COLUMNS, primary_key=f"{SUPERSENSE}/accuracy", paper={}, paper_columns=(),
    paper_source="no paper measures these rows on these tasks; Peters et al. (2018) compare ELMo "
                 "with GloVe on their own tasks (docs/elmo.md)",
    row_label="Representation", floor_rows=tuple(CONTEXTUAL))


# ----------------------------------------------------------------------------------- tasks


def supersense_items(split: str, limit: int) -> list[dict]:
  """{text, word (the lemma's first word's index in text.split()), label (supersense id)} of the
  split's lemma-tagging examples (`wordnet.lemma_tagging_task`), the first `limit`."""
  task = wordnet.lemma_tagging_task()
  items = []
  for example in getattr(task, split)[:limit]:
    first = next(i for i, label in enumerate(example["labels"]) if label % 2 == 1)
    items.append(dict(text=" ".join(example["words"]), word=first,
                      label=(example["labels"][first] - 1) // 2))
  return items


PAIRS_PER_LEMMA = 5


def wic_items(split: str, limit: int) -> list[dict]:
  """Balanced pairs {texts: (a, b), words: (i, j), label: 1 same synset / 0 not} of example
  sentences where the same word occurs as (the first word of) a lemma of their synsets
  (`wordnet.lemma_finder`, lowercased),
  split by the lemma's hash (a test lemma is never a training one; 'test' is WordNet's validation
  and test fractions together, 20%), the first `limit` in a fixed order: per lemma up to
  PAIRS_PER_LEMMA same-synset pairs and as many different-synset ones, so that the most
  polysemous lemmas do not make up the task."""
  occurrences = collections.defaultdict(list)   # lemma → (synset id, text, word index)
  seen = set()
  for synset in wordnet.load_synsets():
    find = wordnet.lemma_finder(synset)
    for sentence in synset.examples:
      if sentence in seen:
        continue
      seen.add(sentence)
      words = wordnet.split_words(sentence)
      found = find(words)
      if found:   # the occurrence's first word is the target (the key: 'add' of 'add up' too)
        lemma = words[found[0][0]][0].lower()
        occurrences[lemma].append((wordnet.synset_id(synset),
                                   " ".join(w for w, _, _ in words), found[0][0]))
  bounds = {"train": (0.0, 0.8), "test": (0.8, 1.0)}[split]
  items = []
  for lemma in sorted(occurrences, key=lambda k: (wordnet.unit_hash(k), k)):
    if not bounds[0] <= wordnet.unit_hash(lemma) < bounds[1]:
      continue
    found = occurrences[lemma]
    same = [(a, b) for i, a in enumerate(found) for b in found[i + 1:] if a[0] == b[0]]
    other = [(a, b) for i, a in enumerate(found) for b in found[i + 1:] if a[0] != b[0]]
    for (a, b), label in [pair for k in range(min(len(same), len(other), PAIRS_PER_LEMMA))
                          for pair in ((same[k], 1), (other[k], 0))]:
      items.append(dict(texts=(a[1], b[1]), words=(a[2], b[2]), label=label))
  return items[:limit]


def task_items(scale: dict) -> dict[str, dict[str, list[dict]]]:
  return {SUPERSENSE: dict(train=supersense_items("train", scale["train_examples"]),
                           test=supersense_items("test", scale["test_examples"])),
          WIC: dict(train=wic_items("train", scale["train_examples"]),
                    test=wic_items("test", scale["test_examples"]))}


def targets(items: dict[str, dict[str, list[dict]]]) -> list[tuple[str, int]]:
  """Every (sentence, word index) a row must featurise, each once, in a fixed order."""
  out = set()
  for split_items in items[SUPERSENSE].values():
    out.update((i["text"], i["word"]) for i in split_items)
  for split_items in items[WIC].values():
    for i in split_items:
      out.update(zip(i["texts"], i["words"]))
  return sorted(out)


# -------------------------------------------------------------------------------- features


def family_config(family: str):
  return config_lib.load_config(os.path.join(common.REPO, "configs", f"{family}.py"), "runlocal")


def pretrained(spec: dict, workdirs: str) -> str:
  """The row's run (trained here unless finished): its workdir."""
  workdir = os.path.join(workdirs, spec["family"])
  train.run(family_config(spec["family"]), workdir)
  return workdir


def static_vectors(spec: dict, workdirs: str):
  workdir = os.path.join(workdirs, spec["method"])
  if not os.path.exists(os.path.join(workdir, static.VECTORS_FILE)):
    static.run(config_lib.load_config(os.path.join(common.REPO, "configs", "static.py"),
                                      f"method={spec['method']}"), workdir)
  return static.load_vectors(workdir)


def representer(spec: dict, seed: int, workdirs: str) -> represent.Representer:
  """The row's network: its pre-trained run, or (the floor) BERT's run's config and tokenizer
  with a random initialisation from `seed`."""
  workdir = pretrained(spec, workdirs)
  loaded = represent.load(workdir)
  if spec["kind"] == "run":
    return loaded
  params = {"encoder": common.random_encoder(loaded.config.model, 128, seed)}
  return represent.Representer(loaded.config, loaded.tokenizer, params, workdir)


def contextual_features(r: represent.Representer, sentences: list[tuple[str, int]],
                        max_tokens: int) -> dict[tuple[str, int], np.ndarray]:
  """{(text, word): [layers, hidden]} of each target word: every hidden state the network
  gives (one for XLNet's content stream and T5's encoder, whose [words, hidden] output gains
  the layer axis here)."""
  texts = sorted({text for text, _ in sentences})
  vectors = represent.represent(r, texts, unit="word", pooling="mean", layers="all",
                                mix="none", max_tokens=max_tokens)
  by_text = {text: v[:, None] if v.ndim == 2 else v for text, v in zip(texts, vectors)}
  return {(text, word): np.nan_to_num(by_text[text][word]) for text, word in sentences}


def static_features(vectors, sentences: list[tuple[str, int]]) -> dict[tuple[str, int], np.ndarray]:
  """{(text, word): the word's static vector} (lowercased; zeros outside the vocabulary)."""
  out = {}
  for text, word in sentences:
    try:
      out[(text, word)] = np.asarray(vectors[text.split()[word].lower()], np.float32)
    except KeyError:   # word2vec, a word outside its vocabulary
      out[(text, word)] = np.zeros(vectors.vector_size, np.float32)
  return out


def design(items: list[dict], features: dict, task: str) -> np.ndarray:
  """The probe's input per example, [examples, features]: the word's vector (supersense), or the
  cosine similarity of the pair's two vectors (wic). A zero vector is word2vec's word outside
  its vocabulary (or a word past max_tokens): both zero, the same form twice, 1; one zero, two
  forms of which one is known, 0."""
  if task == SUPERSENSE:
    return np.stack([features[(i["text"], i["word"])] for i in items])
  u = np.stack([features[(i["texts"][0], i["words"][0])] for i in items])
  v = np.stack([features[(i["texts"][1], i["words"][1])] for i in items])
  norms = np.linalg.norm(u, axis=1) * np.linalg.norm(v, axis=1)
  both_zero = ~u.any(axis=1) & ~v.any(axis=1)
  cosine = np.where(norms > 0, (u * v).sum(1) / np.where(norms > 0, norms, 1.0),
                    both_zero.astype(np.float64))
  return cosine[:, None].astype(np.float32)


# The probe's L2 weights, one chosen per (row, task, seed) by the gold label's log-likelihood on
# the training examples the seed left out (a fixed weight let the first design's wide wic inputs
# overfit below the constant output's log-likelihood). The seed leaves out whole words (every
# training example of a word it draws), as wic's test split holds words the probe never saw.
L2_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)


def target_word(item: dict) -> str:
  """The example's target word, lowercased (a wic pair's, the same in both sentences)."""
  text, word = (item["text"], item["word"]) if "text" in item else (item["texts"][0],
                                                                    item["words"][0])
  return text.split()[word].lower()
def probe_task(items: dict[str, list[dict]], features: dict, task: str, seed: int,
               fraction: float, num_classes: int) -> tuple[dict, dict]:
  """(metrics {task/accuracy, task/target_loss, task/macro_f1, task/distinct, task/l2},
  per-example {accuracy, target_nll}) of the probe trained on the training items of the seed's
  `fraction` of their words, its L2 weight chosen on the rest (L2_GRID)."""
  held = [wordnet.unit_hash(f"{seed}:{target_word(i)}") >= fraction for i in items["train"]]
  fit_items = [i for i, h in zip(items["train"], held) if not h]
  held_items = [i for i, h in zip(items["train"], held) if h]
  if not fit_items or not held_items:
    raise ValueError(f"{task}: the {len(items['train'])} training examples share too few words "
                     f"to hold {1 - fraction:.0%} of them out.")
  fit_x, held_x, test_x = (design(part, features, task)
                           for part in (fit_items, held_items, items["test"]))
  fit_labels, held_labels, test_labels = (np.array([i["label"] for i in part])
                                          for part in (fit_items, held_items, items["test"]))
  held_nll = [np.mean(probe.softmax_regression(fit_x, fit_labels, held_x, held_labels,
                                               num_classes=num_classes, l2=l2)["gold_nll"])
              for l2 in L2_GRID]
  l2 = L2_GRID[int(np.argmin(held_nll))]
  result = probe.softmax_regression(fit_x, fit_labels, test_x, test_labels,
                                    num_classes=num_classes, l2=l2)
  correct = (result["predictions"] == test_labels).astype(int)
  metrics = {f"{task}/accuracy": float(correct.mean()), f"{task}/macro_f1": result["macro_f1"],
             f"{task}/target_loss": float(np.mean(result["gold_nll"])),
             f"{task}/distinct": len(set(result["predictions"].tolist())), f"{task}/l2": l2}
  return metrics, {"accuracy": correct.tolist(),
                   "target_nll": [round(float(x), 4) for x in result["gold_nll"]]}


NUM_CLASSES = {SUPERSENSE: 45, WIC: 2}


def layer_curve(layered: dict, items: dict, scale: dict) -> list[float]:
  """The supersense probe's test accuracy on each layer alone (seed 0); `layered`: {(text,
  word): [layers, hidden]}."""
  curve = []
  for layer in range(next(iter(layered.values())).shape[0]):
    one = {k: v[layer] for k, v in layered.items()}
    metrics, _ = probe_task(items[SUPERSENSE], one, SUPERSENSE, 0, scale["train_fraction"],
                            NUM_CLASSES[SUPERSENSE])
    curve.append(round(metrics[f"{SUPERSENSE}/accuracy"], 4))
  return curve


def layered_features(spec: dict, seed: int, scale: dict, items: dict, workdirs: str) -> dict:
  """{(text, word): [layers, hidden]} of every target word: a static row's one vector, a
  network's every hidden state."""
  sentences = targets(items)
  if spec["kind"] == "static":
    return {k: v[None] for k, v in
            static_features(static_vectors(spec, workdirs), sentences).items()}
  return contextual_features(representer(spec, seed, workdirs), sentences, scale["max_tokens"])


def run_row(name: str, spec: dict, seed: int, scale: dict, items: dict, workdirs: str,
            cache: dict) -> dict:
  """One (row, seed): its features (a row's own for every seed but the floor's, whose network
  the seed draws: `cache` keeps them), a probe per task, and (seed 0) its layer curve."""
  start = time.time()
  if spec["kind"] == "random" or name not in cache:
    cache[name] = layered_features(spec, seed, scale, items, workdirs)
  layered = cache[name]
  # ELMo's fixed mix is the mean of its layers; every other network's vector its last layer.
  features = {k: (v.mean(0) if spec.get("mix") == "mean" else v[-1]) for k, v in layered.items()}
  curve = (layer_curve(layered, items, scale) if seed == 0 and len(next(iter(
      layered.values()))) > 1 else None)
  metrics, examples = {}, {}
  for task in (SUPERSENSE, WIC):
    task_metrics, examples[task] = probe_task(items[task], features, task, seed,
                                              scale["train_fraction"], NUM_CLASSES[task])
    metrics.update(task_metrics)
  degenerate = [t for t in (SUPERSENSE, WIC) if metrics[f"{t}/distinct"] < 2]
  return dict(row=name, seed=seed, scale=scale.get("name"), commit=common.commit(),
              metrics=metrics, examples=examples, degenerate=degenerate, layer_curve=curve,
              feature_size=int(next(iter(features.values())).size),
              total_seconds=round(time.time() - start, 1))


# --------------------------------------------------------------------------------- report


def constant_scores(items: dict) -> dict[str, float]:
  """Each task's best constant output on its test examples: the majority training label's
  accuracy, and the training labels' frequencies' log-loss (add-one smoothed)."""
  out = {}
  for task in (SUPERSENSE, WIC):
    counts = collections.Counter(i["label"] for i in items[task]["train"])
    test = [i["label"] for i in items[task]["test"]]
    out[task] = float(np.mean([label == counts.most_common(1)[0][0] for label in test]))
    total = sum(counts.values()) + NUM_CLASSES[task]
    out[f"{task}/target_nll"] = float(np.mean([-np.log((counts[label] + 1) / total)
                                               for label in test]))
  return out


def curves_table(results: list[dict]) -> list[str]:
  lines = ["| representation | supersense probe accuracy, layer 0 (embeddings / tokens) → last |",
           "|---|---|"]
  for r in results:
    if r.get("layer_curve"):
      lines.append(f"| {r['row']} | {' → '.join(f'{100 * a:.1f}' for a in r['layer_curve'])} |")
  return lines


def layers_plot(results: list[dict], constant: float, path: str) -> None:
  """layers.png: the supersense probe's accuracy on each layer alone (seed 0), one line per row
  that has several layers, with the constant output."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  import matplotlib.ticker  # pylint: disable=import-outside-toplevel
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for r in results:
    if r.get("layer_curve"):
      ax.plot(range(len(r["layer_curve"])), 100 * np.array(r["layer_curve"]), marker="o",
              label=r["row"])
  ax.axhline(100 * constant, color="black", ls="--", lw=1, label="constant output")
  ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
  ax.set(xlabel="layer (0: embeddings / ELMo's token layer)", ylabel="supersense accuracy (×100)",
         ylim=(0, None), title="Which layer holds supersenses (seed 0)")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def write_summary(results: list[dict], out: str, scale_name: str,
                  items: dict | None = None) -> str:
  """Writes OUT/table.md, meta.json, plot.png, curves.png and layers.png from `results`; returns
  the markdown. `items`: the scale's probe examples (`task_items`; built when not given, as
  `python -m experiments.launch summary` calls it)."""
  if items is None:
    items = task_items(dict(SCALES[scale_name], name=scale_name))
  setup = (f"Scale `{scale_name}`: {SCALES[scale_name]}; probes trained on "
           f"{len(items[SUPERSENSE]['train'])} supersense and {len(items[WIC]['train'])} wic "
           f"training examples (a seed's {SCALES[scale_name]['train_fraction']:.0%} of them), "
           f"scored on {len(items[SUPERSENSE]['test'])} and {len(items[WIC]['test'])} test "
           "examples.")
  constants = constant_scores(items)
  text = report.write(results, COMPARISON, out, setup=setup, constants=constants,
                      scale=SCALES[scale_name])
  layers_plot(results, constants[SUPERSENSE], os.path.join(out, "layers.png"))
  text += "\n## Which layer holds supersenses (seed 0)\n\n" + "\n".join(curves_table(results))
  with open(os.path.join(out, "table.md"), "w") as f:
    f.write(text + "\n")
  return text


def main(argv):
  del argv
  f = flags.FLAGS
  scale = dict(SCALES[f.scale], name=f.scale)
  common.check_rows(f.rows, ROWS, lambda spec: None)
  out, workdirs = common.sweep_dirs("representations")
  items = task_items(scale)
  cache = {}
  results = common.run_sweep(ROWS, f.rows, list(map(int, f.seeds)),
                             os.path.join(out, "results.jsonl"),
                             lambda name, spec, seed: run_row(name, spec, seed, scale, items,
                                                              workdirs, cache))
  print(write_summary(results, out, f.scale, items))
  with open(os.path.join(out, "items.json"), "w") as fh:
    json.dump({task: {split: len(v) for split, v in splits.items()}
               for task, splits in items.items()}, fh)


if __name__ == "__main__":
  common.define_sweep_flags("representations", ROWS, SCALES)
  app.run(main)
