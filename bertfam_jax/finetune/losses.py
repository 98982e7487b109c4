"""Fine-tuning losses, one per task kind of models/finetune.py, in the objectives' convention:
`task_loss(kind, outputs, batch) -> (loss to differentiate, {metric: (sum, count)})`, so metrics
aggregate exactly over batches (train/metrics.py). Every loss is in float32.

Batch keys (numpy or jax arrays):
  classification, multiple_choice  label [batch] int
  regression                       label [batch] float
  token_classification             labels [batch, length] int, label_weights [batch, length] float
                                   (1 on the first sub-token of each word, 0 elsewhere)
  extractive_qa                    start_position, end_position [batch] int (0 = no answer);
                                   the joint head also is_impossible [batch] int
"""

from __future__ import annotations

import jax.numpy as jnp
import optax

from bertfam_jax.config_lib import ConfigError
from bertfam_jax.objectives import losses


def _cross_entropy(logits, targets, weights):
  """Σ w·CE / Σ w (0 when Σ w = 0) with 'loss' and 'accuracy' as (weighted sum, Σ w)."""
  total, correct, count = losses.weighted_cross_entropy(logits=logits, targets=targets,
                                                        weights=weights)
  return total / jnp.maximum(count, 1.0), {"loss": (total, count), "accuracy": (correct, count)}


def classification_loss(outputs, batch):
  """Mean softmax cross-entropy of logits [batch, classes] (or choice scores [batch, choices]) on
  `label` (run_classifier.py create_model)."""
  return _cross_entropy(outputs, batch["label"], jnp.ones(batch["label"].shape, jnp.float32))


def regression_loss(outputs, batch):
  """Mean squared error of predictions [batch] against float `label` (HF's num_labels=1 MSELoss;
  the STS-B recipe)."""
  errors = jnp.square(outputs.astype(jnp.float32) - batch["label"].astype(jnp.float32))
  count = jnp.asarray(errors.size, jnp.float32)
  return jnp.mean(errors), {"loss": (jnp.sum(errors), count)}


def token_classification_loss(outputs, batch):
  """Cross-entropy of logits [batch, length, labels] on `labels`, averaged over the positions with
  `label_weights` 1 (the first sub-token of each word); 0 when a batch has none."""
  return _cross_entropy(outputs, batch["labels"], batch["label_weights"])


# ELECTRA's joint QA head: the weight of the answerable classifier's loss
# (configure_finetuning.py answerable_weight).
ANSWERABLE_WEIGHT = 0.5


def extractive_qa_loss(outputs, batch):
  """bert run_squad.py create_model's loss: (CE(start logits, start_position) + CE(end logits,
  end_position)) / 2, each the batch mean of a softmax over every position; outputs [batch,
  length, 2] hold the start logits in [..., 0] and the end logits in [..., 1].

  The joint head's outputs (a dict, `heads.JointSpanHead` given the gold starts): ELECTRA
  qa_tasks.py's loss, the same mean plus ANSWERABLE_WEIGHT × the sigmoid cross-entropy of
  answerable_logit on is_impossible (logged as answerable_loss)."""
  joint = isinstance(outputs, dict)
  boundaries = ((outputs["start_logits"], outputs["end_logits"]) if joint
                else (outputs[..., 0], outputs[..., 1]))
  start_logits, end_logits = (x.astype(jnp.float32) for x in boundaries)
  start = optax.softmax_cross_entropy_with_integer_labels(start_logits, batch["start_position"])
  end = optax.softmax_cross_entropy_with_integer_labels(end_logits, batch["end_position"])
  count = jnp.asarray(start.size, jnp.float32)
  hit = lambda logits, key: jnp.sum(jnp.argmax(logits, -1) == batch[key]).astype(  # noqa: E731
      jnp.float32)
  per_example = (start + end) / 2
  metrics = {"start_accuracy": (hit(start_logits, "start_position"), count),
             "end_accuracy": (hit(end_logits, "end_position"), count)}
  if joint:
    answerable = optax.sigmoid_binary_cross_entropy(
        outputs["answerable_logit"].astype(jnp.float32),
        batch["is_impossible"].astype(jnp.float32))
    metrics["answerable_loss"] = (jnp.sum(answerable), count)
    per_example = per_example + ANSWERABLE_WEIGHT * answerable
  metrics["loss"] = (jnp.sum(per_example), count)
  return jnp.mean(per_example), metrics


TASK_LOSSES = {
    "classification": classification_loss,
    "regression": regression_loss,
    "token_classification": token_classification_loss,
    "extractive_qa": extractive_qa_loss,
    "multiple_choice": classification_loss,
}


def task_loss(kind: str, outputs, batch):
  """(scalar loss, {metric: (sum, count)}) for the outputs of `FineTuneModel(kind=kind)`. Every
  kind reports 'loss'; classification, multiple_choice and token_classification 'accuracy';
  extractive_qa 'start_accuracy' and 'end_accuracy'."""
  if kind not in TASK_LOSSES:
    raise ConfigError(f"Fine-tuning kind {kind!r}; choose one of {sorted(TASK_LOSSES)}.")
  return TASK_LOSSES[kind](outputs, batch)
