"""Loss primitives shared by every objective; each returns sums so callers can aggregate exactly."""

from __future__ import annotations

import jax.numpy as jnp
import optax


def weighted_cross_entropy(*, logits, targets, weights):
  """Softmax cross-entropy summed over weighted positions, in float32.

  logits: [..., classes]; targets: [...] int; weights: [...] float (0 drops a position).
  Returns (loss_sum, correct_sum, weight_sum), each a scalar float32.
  """
  logits = logits.astype(jnp.float32)
  weights = weights.astype(jnp.float32)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  return jnp.sum(losses * weights), jnp.sum(correct * weights), jnp.sum(weights)


def mean_cross_entropy(logits, targets, weights, metrics, name, denominator_offset=0.0):
  """Adds `{name}_loss` / `{name}_accuracy` as (sum, count) to `metrics`; returns the loss to
  optimise, Σ w·CE / (Σ w + denominator_offset) (the references' guards against empty batches)."""
  total, correct, count = weighted_cross_entropy(logits=logits, targets=targets, weights=weights)
  metrics[f"{name}_loss"] = (total, count)
  metrics[f"{name}_accuracy"] = (correct, count)
  return total / (count + denominator_offset)
