"""Static word vectors (bertfam_jax/static.py): deterministic across processes, better than random
vectors on the shipped similarity set, saved and loaded intact, OOV words NaN for word2vec and
built from n-grams for fastText, and the CLI's refusals are one line."""

import os
import subprocess
import sys

import numpy as np
import pytest

from bertfam_jax import config_lib as cl
from bertfam_jax import static

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def static_config(method: str, **fields):
  c = cl.load_config(os.path.join(_ROOT, "configs", "static.py"), f"method={method}")
  c.static.update(fields)
  return c


@pytest.fixture(scope="module")
def word2vec(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("word2vec"))
  return workdir, static.run(static_config("word2vec"), workdir)


def test_word2vec_beats_random_vectors_on_wordsim353(word2vec):
  workdir, results = word2vec
  vectors = static.load_vectors(workdir)
  rng = np.random.default_rng(0)
  trained = vectors.vectors.copy()
  chance = []
  for _ in range(5):   # ~220 in-vocabulary pairs: one random draw's ρ has a spread of ±0.07
    vectors.vectors = rng.standard_normal(trained.shape).astype(np.float32)
    chance.append(static.evaluate(vectors)["wordsim353_spearman"])
  assert results["vocabulary"] == len(trained) > 5000
  assert results["wordsim353_spearman"] > np.mean(chance) + 0.1
  assert results["wordsim353_spearman"] > 0.15
  assert 0 < results["wordsim353_oov"] < 0.6 and 0 < results["analogy_oov"] < 1


_TRAIN_IN_A_PROCESS = """
import sys
from bertfam_jax import config_lib as cl, static
c = cl.load_config(sys.argv[1], "method=word2vec")
c.static.update(epochs=1, min_count=2)
sentences = static.corpus_sentences(c.data)[:3000]
sys.stdout.buffer.write(static.train_vectors(sentences, c.static, 0).vectors.tobytes())
"""


def test_training_is_the_same_in_processes_with_different_string_hashes():
  """gensim seeds each word's vector with a string hash; Python's is salted per process."""
  outputs = []
  for hash_seed in ("1", "2"):
    done = subprocess.run([sys.executable, "-c", _TRAIN_IN_A_PROCESS,
                           os.path.join(_ROOT, "configs", "static.py")], capture_output=True,
                          check=True, env=dict(os.environ, PYTHONHASHSEED=hash_seed), cwd=_ROOT)
    outputs.append(done.stdout)
  assert len(outputs[0]) > 10_000 and outputs[0] == outputs[1]


def test_saved_vectors_load_intact_and_oov_words(word2vec, tmp_path):
  workdir, _ = word2vec
  vectors = static.load_vectors(workdir)
  known, = static.word_vectors(vectors, ["The history of Anarchism"])
  assert known.shape == (4, 100) and np.isfinite(known).all()
  np.testing.assert_array_equal(known[1], vectors["history"])
  unknown, = static.word_vectors(vectors, ["zzxqj history"])
  assert np.isnan(unknown[0]).all() and np.isfinite(unknown[1]).all()
  sentences = static.corpus_sentences(static_config("fasttext").data)[:2000]
  fasttext = static.train_vectors(sentences, static_config("fasttext", epochs=1).static, 0)
  built, = static.word_vectors(fasttext, ["zzxqj histories"])
  assert np.isfinite(built).all() and "zzxqj" not in fasttext.key_to_index


def test_cli_refuses_a_bad_value_in_one_line(tmp_path):
  done = subprocess.run([sys.executable, "-m", "bertfam_jax.static",
                         "--config=configs/static.py:method=glove",
                         f"--workdir={tmp_path / 'w'}"], capture_output=True, text=True,
                        cwd=_ROOT, check=False)
  assert done.returncode == 2, done.stderr
  assert done.stderr.strip().splitlines()[-1].startswith("error: static.method='glove'")
  assert not (tmp_path / "w").exists()
