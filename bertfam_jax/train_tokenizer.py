"""Trains (or finds in the cache) the SentencePiece model of a config and prints its path.

  python -m bertfam_jax.train_tokenizer --config=configs/roberta.py:runlocal
  python -m bertfam_jax.train_tokenizer --config=configs/roberta.py \
      --config.data.tfds_data_dir=$TFDS_DATA_DIR --output=gs-or-local/path/roberta.model

The train loop calls the same `tokenizers.load_or_train`, so running this first only moves the
cost out of the first training step; `--output` also copies the model to a path of your choice
(then pass it as --config.tokenizer.model_path).
"""

import sys

from absl import app, flags
from ml_collections import config_flags

from bertfam_jax import fileio
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.data import sources, tokenizers

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
_OUTPUT = flags.DEFINE_string("output", None, "Optional path to copy the model to.")
flags.mark_flags_as_required(["config"])


def main(argv):
  del argv
  config = _CONFIG.value
  try:
    tokenizer = tokenizers.load_or_train(config, sources.get_documents(config.data, "train"))
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr, flush=True)
    sys.exit(2)
  path = config.tokenizer.model_path or tokenizers.cache_path(config)
  if _OUTPUT.value:
    fileio.write_atomically(_OUTPUT.value, fileio.read_bytes(path))
    path = _OUTPUT.value
  print(f"{tokenizer.vocab_size}-piece SentencePiece model: {path}")


if __name__ == "__main__":
  app.run(main)
