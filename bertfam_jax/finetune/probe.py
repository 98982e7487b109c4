"""Linear probe: a softmax regression on frozen, mean-pooled encoder features.

Small-scale comparisons of pre-training objectives (a few hundred steps of a 2-layer model) give
fine-tuning scores whose seed-to-seed spread can hide the differences; a probe on frozen features
measures the representation alone, with no dropout, no fresh pooler and a convex objective, so it
is nearly deterministic. It complements, never replaces, fine-tuning (`run.fine_tune`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertfam_jax.finetune import metrics
from bertfam_jax.models import encoder as encoder_lib


def mean_pooled_features(config_model, encoder_params, data: dict[str, np.ndarray],
                         batch_size: int = 256) -> np.ndarray:
  """Last-layer hidden states averaged over the real tokens ([CLS] and [SEP] included).

  Args:
    config_model: the `config.model` section the encoder was built with.
    encoder_params: the 'encoder' parameter subtree.
    data: input_ids / input_mask / segment_ids [examples, length].
    batch_size: examples per forward pass.

  Returns:
    [examples, hidden] float32.
  """
  model = encoder_lib.Encoder(config_model)

  @jax.jit
  def pooled(ids, mask, segments):
    x_BLD = model.apply({"params": encoder_params}, ids, mask, segments, deterministic=True)
    weights_BL = mask.astype(jnp.float32)
    return (jnp.einsum("bld,bl->bd", x_BLD.astype(jnp.float32), weights_BL) /
            jnp.maximum(weights_BL.sum(axis=1, keepdims=True), 1.0))

  num = len(data["input_ids"])
  return np.concatenate([
      np.asarray(pooled(*(data[k][start:start + batch_size]
                          for k in ("input_ids", "input_mask", "segment_ids"))))
      for start in range(0, num, batch_size)]) if num else np.zeros((0, config_model.hidden))


def linear_probe(config_model, encoder_params, train_data: dict[str, np.ndarray],
                 eval_data: dict[str, np.ndarray], *, num_classes: int, steps: int = 500,
                 learning_rate: float = 0.05, l2: float = 1e-4) -> dict[str, Any]:
  """Trains a softmax regression on standardised frozen features; scores it on eval_data.

  Full-batch Adam on the mean cross-entropy + `l2`·‖W‖² for a fixed number of steps from zero
  weights: deterministic given the features.

  Args:
    config_model, encoder_params: the frozen encoder.
    train_data, eval_data: input_ids / input_mask / segment_ids [n, L] and label [n].
    num_classes: number of labels.
    steps, learning_rate, l2: the regression's optimisation.

  Returns:
    accuracy, macro_f1, mcc on eval_data, predictions [eval examples] int32 and gold_nll [eval
    examples] float64: the gold label's negative log-probability (nats).
  """
  return softmax_regression(mean_pooled_features(config_model, encoder_params, train_data),
                            train_data["label"],
                            mean_pooled_features(config_model, encoder_params, eval_data),
                            eval_data["label"], num_classes=num_classes, steps=steps,
                            learning_rate=learning_rate, l2=l2)


def softmax_regression(train_x: np.ndarray, train_labels: np.ndarray, eval_x: np.ndarray,
                       eval_labels: np.ndarray, *, num_classes: int, steps: int = 500,
                       learning_rate: float = 0.05, l2: float = 1e-4) -> dict[str, Any]:
  """`linear_probe`'s regression on given features: train_x [n, d], eval_x [m, d] (standardised
  here by the training features' statistics), labels [n] / [m] int. Returns what
  `linear_probe` returns."""
  mean, std = train_x.mean(0), train_x.std(0) + 1e-6
  train_x, eval_x = (train_x - mean) / std, (eval_x - mean) / std
  labels = jnp.asarray(train_labels)
  params = dict(w=jnp.zeros((train_x.shape[1], num_classes)), b=jnp.zeros((num_classes,)))
  tx = optax.adam(learning_rate)

  def loss_fn(p):
    logits = jnp.asarray(train_x) @ p["w"] + p["b"][None, :]
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return ce + l2 * jnp.sum(p["w"] ** 2)

  @jax.jit
  def fit(p):
    def step(carry, _):
      p, opt_state = carry
      grads = jax.grad(loss_fn)(p)
      updates, opt_state = tx.update(grads, opt_state)
      return (optax.apply_updates(p, updates), opt_state), None
    (p, _), _ = jax.lax.scan(step, (p, tx.init(p)), None, length=steps)
    return p

  params = fit(params)
  logits = np.asarray(jnp.asarray(eval_x) @ params["w"] + params["b"][None, :])
  predictions = logits.argmax(-1).astype(np.int32)
  return dict(predictions=predictions, gold_nll=metrics.gold_nll(logits, eval_labels),
              **metrics.classification_metrics(eval_labels, predictions, num_classes))
