"""Static word vectors on our corpus: word2vec (skip-gram with negative sampling; Mikolov et al.
2013) or fastText (skip-gram over character n-grams; Bojanowski et al. 2017), the baselines of the
contextual representations (bertfam_jax/static.py).

  python -m bertfam_jax.static --config=configs/static.py:method=word2vec --workdir=runs/word2vec
  python -m bertfam_jax.static --config=configs/static.py:method=fasttext --workdir=runs/fasttext \
      --config.data.source=text --config.data.text_files='corpus/*.txt'

Hyperparameters are the tools' defaults: word2vec.c's for skip-gram (100 dimensions, window 5,
5 negatives, sub-sampling 1e-3, min count 5, learning rate 0.025, 5 epochs); fastText's n-grams
of 3-6 characters. The corpus is `data` as our runs read it (the embedded Wikipedia sample by
default: 395 k words after tokenisation, 7,800 words kept at min count 5).
"""

import ml_collections

from bertfam_jax import config_lib as cl


def get_config(arg=None):
  arg = cl.parse_arg(arg, method="word2vec")
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.data = ml_collections.ConfigDict({
      k: cl.base_config().data[k]
      for k in ("source", "tfds_name", "tfds_data_dir", "tfds_text_key", "train_split",
                "eval_split", "text_files", "text_format", "eval_fraction", "wordnet_glosses",
                "cache_dir")})
  config.static = ml_collections.ConfigDict(dict(
      method=arg.method, vector_size=100, window=5, negative=5, sample=1e-3, min_count=5,
      alpha=0.025, epochs=5, min_n=3, max_n=6))
  return config
