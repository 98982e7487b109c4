"""The unigram baseline of a pre-training config: what a model that ignores the context scores.

It counts the target tokens (masked tokens; T5's decoder targets; XLNet's permutation targets;
GPT's next tokens; ELMo's next and previous words)
of `--train_batches` training batches, then predicts the most frequent one (accuracy) and the
unigram distribution (cross-entropy) at the predicted positions of the same held-out batches the
train loop evaluates on. A pre-trained model must beat both.

  python experiments/unigram_baseline.py --config=configs/roberta.py:runlocal
"""

from absl import app, flags
from ml_collections import config_flags
import numpy as np

from bertfam_jax import objectives
from bertfam_jax.data import pipeline, sources, tokenizers
from bertfam_jax.objectives import elmo

if __name__ == "__main__":  # flags of the script only, so that others can import the function
  _CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
  _TRAIN_BATCHES = flags.DEFINE_integer("train_batches", 200, "Training batches to count.")


# Each objective's prediction targets and their weights in a batch (the masked-LM families and
# ELECTRA's generator: mlm_targets / mlm_weights; ELMo: `prediction_targets`).
TARGET_KEYS = {"t5": ("decoder_target_ids", "decoder_loss_weights"),
               "xlnet": ("target_ids", "target_weights"),
               "causal_lm": ("target_ids", "loss_weights")}
MLM_TARGET_KEYS = ("mlm_targets", "mlm_weights")


def prediction_targets(objective_name: str, batch: dict) -> np.ndarray:
  """[predictions] the batch's weighted targets; ELMo's: both directions' together, as its loss
  weighs them (`elmo.shifted_targets`: the next / previous word within the row, none read from
  a sentence's closing boundary)."""
  if objective_name == "elmo":
    found = []
    for _, shift in elmo.DIRECTIONS:
      targets, weights = elmo.shifted_targets(batch["word_ids"], batch["input_mask"], shift,
                                              batch["char_ids"][..., 1])
      found.append(np.asarray(targets)[np.asarray(weights) > 0])
    return np.concatenate(found)
  targets_key, weights_key = TARGET_KEYS.get(objective_name, MLM_TARGET_KEYS)
  return batch[targets_key][batch[weights_key] > 0]


def unigram_baseline(config, train_batches: int) -> dict[str, float]:
  """Returns eval accuracy and cross-entropy (nats) of the unigram predictor at the objective's
  predicted positions (masked tokens; T5's decoder targets, sentinels and EOS included; XLNet's
  permutation targets)."""
  train_docs = sources.get_documents(config.data, "train")
  tokenizer = tokenizers.load_or_train(config, train_docs)
  objective = objectives.get(config.objective.name)
  features_fn = objective.make_features(config, tokenizer)
  # The objective's own pipeline options, as the train loop builds it (XLNet's ordered streams).
  args = dict(process_index=0, process_count=1, local_batch_size=config.train.batch_size,
              **objectives.pipeline_options(objective, config))
  counts = np.zeros(config.model.vocab_size, np.float64)
  train_pipe = pipeline.Pipeline(config, tokenizer, train_docs, features_fn, **args)
  for _ in range(train_batches):
    np.add.at(counts, prediction_targets(config.objective.name, next(train_pipe)), 1)
  train_pipe.close()
  # Add-one smoothing so tokens unseen in training have a finite cross-entropy.
  log_probs = np.log((counts + 1) / (counts + 1).sum())
  eval_pipe = pipeline.Pipeline(config, tokenizer, sources.get_documents(config.data, "eval"),
                                features_fn, **args)
  targets = np.concatenate([prediction_targets(config.objective.name, b)
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
