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
