"""The unigram baseline of a masked-LM config: what a model that ignores the context scores.

It counts the masked target tokens of `--train_batches` training batches, then predicts the most
frequent one (accuracy) and the unigram distribution (cross-entropy) at the masked positions of
the same held-out batches the train loop evaluates on. A pre-trained model must beat both.

  python experiments/unigram_baseline.py --config=configs/roberta.py:runlocal
"""

from absl import app, flags
from ml_collections import config_flags
import numpy as np

from bertfam_jax import objectives
from bertfam_jax.data import pipeline, sources, tokenizers

if __name__ == "__main__":  # flags of the script only, so that others can import the function
  _CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
  _TRAIN_BATCHES = flags.DEFINE_integer("train_batches", 200, "Training batches to count.")


def unigram_baseline(config, train_batches: int) -> dict[str, float]:
  """Returns eval accuracy and cross-entropy (nats) of the unigram predictor at masked positions."""
  train_docs = sources.get_documents(config.data, "train")
  tokenizer = tokenizers.load_or_train(config, train_docs)
  features_fn = objectives.get(config.objective.name).make_features(config, tokenizer)
  args = dict(process_index=0, process_count=1, local_batch_size=config.train.batch_size)
  counts = np.zeros(config.model.vocab_size, np.float64)
  train_pipe = pipeline.Pipeline(config, tokenizer, train_docs, features_fn, **args)
  for _ in range(train_batches):
    batch = next(train_pipe)
    np.add.at(counts, batch["mlm_targets"][batch["mlm_weights"] > 0], 1)
  train_pipe.close()
  # Add-one smoothing so tokens unseen in training have a finite cross-entropy.
  log_probs = np.log((counts + 1) / (counts + 1).sum())
  eval_pipe = pipeline.Pipeline(config, tokenizer, sources.get_documents(config.data, "eval"),
                                features_fn, **args)
  targets = np.concatenate([b["mlm_targets"][b["mlm_weights"] > 0]
                            for b in eval_pipe.eval_batches(config.train.eval_batches)])
  eval_pipe.close()
  return {"unigram_accuracy": float(np.mean(targets == np.argmax(counts))),
          "unigram_cross_entropy": float(-np.mean(log_probs[targets])),
          "eval_predictions": int(targets.size)}


def main(argv):
  del argv
  for key, value in unigram_baseline(_CONFIG.value, _TRAIN_BATCHES.value).items():
    print(f"{key}: {value:.4f}" if isinstance(value, float) else f"{key}: {value}")


if __name__ == "__main__":
  app.run(main)
