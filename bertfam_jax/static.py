r"""Static word vectors, the baselines of the contextual models: word2vec (Mikolov et al. 2013,
skip-gram with negative sampling) and fastText (Bojanowski et al. 2017, skip-gram over character
n-grams), trained through gensim on the same corpus as our runs (`config.data`), and evaluated on
the word-similarity and analogy sets that gensim's wheel ships: WordSim-353 and SimLex-999
(Spearman ρ against human scores), and Mikolov et al.'s analogy questions (accuracy).

  python -m bertfam_jax.static --config=configs/static.py:method=fasttext --workdir=runs/fasttext

The workdir holds config.json, vectors.kv (gensim KeyedVectors; `load_vectors`), and
eval_results.json. Hyperparameters are the tools' defaults (configs/static.py). Training is
deterministic given `seed`: one worker thread and a fixed string hash for the initial vectors
(gensim's default hash is Python's, which is salted per process).

Words are gensim's `tokenize(lowercase=True)` tokens of each sentence (`sources.split_sentences`),
letters only, as the evaluation sets are; `word_vectors` looks words up the same way.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import zlib
from typing import Sequence

import ml_collections
import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

from bertfam_jax import config_lib, fileio
from bertfam_jax import workdir as workdir_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.data import sources

METHODS = ("word2vec", "fasttext")
VECTORS_FILE = "vectors.kv"
RESULTS_FILE = "eval_results.json"
# The evaluation files in gensim's wheel (gensim.test.utils.datapath): name → file.
SIMILARITY_SETS = {"wordsim353": "wordsim353.tsv", "simlex999": "simlex999.txt"}
ANALOGY_SET = "questions-words.txt"
FIELD_RULES = {
    "seed": config_lib.FIELD_RULES["seed"],
    "data.source": config_lib.SOURCES,
    "data.text_format": config_lib.TEXT_FORMATS,
    "data.eval_fraction": config_lib.RATE,
    "static.method": METHODS,
    "static.vector_size": config_lib.AT_LEAST_1,
    "static.window": config_lib.AT_LEAST_1,
    "static.negative": config_lib.AT_LEAST_1,
    "static.sample": config_lib.PROBABILITY,
    "static.min_count": config_lib.AT_LEAST_1,
    "static.alpha": config_lib.POSITIVE,
    "static.epochs": config_lib.AT_LEAST_1,
    "static.min_n": config_lib.AT_LEAST_1,
    "static.max_n": config_lib.AT_LEAST_1,
}


def _stable_hash(text: str) -> int:
  """A string hash that is the same in every process (gensim seeds each word's vector with it)."""
  return zlib.crc32(text.encode("utf-8"))


def words(text: str) -> list[str]:
  """The lowercase letter tokens of `text` (gensim's `tokenize`)."""
  from gensim.utils import tokenize  # pylint: disable=g-import-not-at-top
  return list(tokenize(text, lowercase=True))


def corpus_sentences(data_config: ml_collections.ConfigDict, split: str = "train"
                     ) -> list[list[str]]:
  """The corpus of `data_config` (as a run of ours reads it) as sentences of words."""
  return [sentence for document in sources.get_documents(data_config, split)
          for sentence in (words(s) for s in sources.split_sentences(document)) if sentence]


def train_vectors(sentences: Sequence[Sequence[str]], static: ml_collections.ConfigDict,
                  seed: int):
  """gensim KeyedVectors of `static.method` trained on `sentences` (one worker: deterministic)."""
  from gensim.models import FastText, Word2Vec  # pylint: disable=g-import-not-at-top
  common = dict(sg=1, vector_size=static.vector_size, window=static.window,
                negative=static.negative, sample=static.sample, min_count=static.min_count,
                alpha=static.alpha, epochs=static.epochs, workers=1, seed=seed,
                hashfxn=_stable_hash)
  if static.method == "fasttext":
    model = FastText(sentences, min_n=static.min_n, max_n=static.max_n, **common)
  else:
    model = Word2Vec(sentences, **common)
  return model.wv


def evaluate(vectors) -> dict[str, float]:
  """{set_spearman, set_pearson, set_oov (share of pairs skipped: a word not in the
  vocabulary), analogy_accuracy, analogy_oov}: gensim's evaluation on its shipped sets. Only
  in-vocabulary pairs and questions count, for fastText too (its n-grams could guess the rest)."""
  from gensim.test.utils import datapath  # pylint: disable=g-import-not-at-top
  out = {}
  for name, filename in SIMILARITY_SETS.items():
    pearson, spearman, oov = vectors.evaluate_word_pairs(datapath(filename))
    out.update({f"{name}_spearman": float(spearman.statistic),
                f"{name}_pearson": float(pearson.statistic), f"{name}_oov": float(oov) / 100})
  accuracy, sections = vectors.evaluate_word_analogies(datapath(ANALOGY_SET))
  answered = sum(len(s["correct"]) + len(s["incorrect"]) for s in sections
                 if s["section"] == "Total accuracy")
  total = sum(1 for line in open(datapath(ANALOGY_SET), encoding="utf-8")
              if not line.startswith(":"))
  out.update(analogy_accuracy=float(accuracy), analogy_oov=1 - answered / total)
  return out


def save_vectors(vectors, workdir: str) -> None:
  """WORKDIR/vectors.kv (and the array files gensim writes beside it), through `fileio`."""
  with tempfile.TemporaryDirectory() as local:
    vectors.save(os.path.join(local, VECTORS_FILE))
    for name in sorted(os.listdir(local)):
      with open(os.path.join(local, name), "rb") as f:
        fileio.write_atomically(os.path.join(workdir, name), f.read())


def load_vectors(workdir: str):
  """The KeyedVectors a `run` saved in `workdir`."""
  from gensim.models import KeyedVectors  # pylint: disable=g-import-not-at-top
  if not fileio.exists(os.path.join(workdir, VECTORS_FILE)):
    raise ConfigError(f"{workdir} holds no {VECTORS_FILE}; train it with `python -m "
                      f"bertfam_jax.static --config=configs/static.py --workdir={workdir}`.")
  with tempfile.TemporaryDirectory() as local:
    prefix = VECTORS_FILE
    for name in fileio.listdir(workdir):
      if name.startswith(prefix):
        with open(os.path.join(local, name), "wb") as f:
          f.write(fileio.read_bytes(os.path.join(workdir, name)))
    return KeyedVectors.load(os.path.join(local, VECTORS_FILE))


def word_vectors(vectors, texts: Sequence[str]) -> list[np.ndarray]:
  """[words, dim] float32 per text, its words as `words` finds them; NaN for a word outside the
  vocabulary of word2vec (fastText builds one from its character n-grams)."""
  from gensim.models.fasttext import FastTextKeyedVectors  # pylint: disable=g-import-not-at-top
  builds_any = isinstance(vectors, FastTextKeyedVectors)
  out = []
  for text in texts:
    rows = [vectors[w] if builds_any or w in vectors.key_to_index
            else np.full(vectors.vector_size, np.nan, np.float32) for w in words(text)]
    out.append(np.asarray(rows, np.float32).reshape(-1, vectors.vector_size))
  return out


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Trains `config.static.method` on `config.data`'s training documents, saves the vectors
  and evaluates them; returns the evaluation (also written to WORKDIR/eval_results.json)."""
  workdir_lib.check_writable(workdir)
  sentences = corpus_sentences(config.data)
  logging.info("%s on %d sentences, %d words.", config.static.method, len(sentences),
               sum(map(len, sentences)))
  vectors = train_vectors(sentences, config.static, config.seed)
  fileio.makedirs(workdir)
  workdir_lib.write_config(workdir, config)
  save_vectors(vectors, workdir)
  results = dict(method=config.static.method, vocabulary=len(vectors.key_to_index),
                 words=sum(map(len, sentences)), **evaluate(vectors))
  fileio.write_atomically(os.path.join(workdir, RESULTS_FILE),
                          (json.dumps(results, indent=2) + "\n").encode("utf-8"))
  return results


def define_flags() -> None:
  """The CLI's flags (defined when run as a program: other CLIs' modules name theirs alike)."""
  config_flags.DEFINE_config_file("config", None, "configs/static.py[:method=...]",
                                  lock_config=False)
  flags.DEFINE_string("workdir", None, "where the vectors and their evaluation go")


def main(argv: Sequence[str]) -> int:
  del argv
  try:
    if not flags.FLAGS.workdir:
      raise ConfigError("--workdir is required.")
    config_lib.check_fields(flags.FLAGS.config, FIELD_RULES)
    results = run(flags.FLAGS.config, flags.FLAGS.workdir)
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(" | ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                   for k, v in results.items()))
  return 0


if __name__ == "__main__":
  define_flags()
  app.run(main)
