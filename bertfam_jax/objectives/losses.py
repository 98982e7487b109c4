"""Loss primitives shared by every objective; each returns sums so callers can aggregate exactly."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def target_is_top(logits, target_logit):
  """[...] float32: 1 where the target's logit (`target_logit` [...], gathered from `logits`
  [..., classes]) is the largest. A tie with another class counts as correct (`argmax == target`
  would count it only at the lower index; in float32 logits ties are rare). One max per position
  instead of XLA's (value, index) argmax reduction, which took ~19 ms of T5 :runlocal's ~400 ms
  step on the 2-core CPU (max and compare: ~0.1 ms)."""
  return (target_logit >= jnp.max(logits, axis=-1)).astype(jnp.float32)


def weighted_cross_entropy(*, logits, targets, weights):
  """Softmax cross-entropy summed over weighted positions, in float32.

  logits: [..., classes]; targets: [...] int; weights: [...] float (0 drops a position).
  Returns (loss_sum, correct_sum, weight_sum), each a scalar float32.
  """
  logits = logits.astype(jnp.float32)
  weights = weights.astype(jnp.float32)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  target_logit = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
  correct = target_is_top(logits, target_logit)
  return jnp.sum(losses * weights), jnp.sum(correct * weights), jnp.sum(weights)


def mean_cross_entropy(logits, targets, weights, metrics, name, denominator_offset=0.0):
  """Adds `{name}_loss` / `{name}_accuracy` as (sum, count) to `metrics`; returns the loss to
  optimise, Σ w·CE / (Σ w + denominator_offset) (the references' guards against empty batches)."""
  total, correct, count = weighted_cross_entropy(logits=logits, targets=targets, weights=weights)
  metrics[f"{name}_loss"] = (total, count)
  metrics[f"{name}_accuracy"] = (correct, count)
  return total / (count + denominator_offset)


def token_cross_entropy(logits, targets, weights, z_loss: float = 0.0):
  """Sequence-to-sequence token loss as t5x's `cross_entropy_with_logits`, without a one-hot.

  Per position: CE = logsumexp(logits) − logits[target], plus t5x's auxiliary z-loss
  `z_loss · logsumexp(logits)²` (keeps the softmax normaliser near 1; 1e-4 in t5x). Statistics
  are float32 whatever the logits' dtype (bf16-safe); only one [..., vocab] float32 copy of the
  logits is made, and the target logit is gathered, not selected with a [.., vocab] one-hot.

  Args:
    logits: [batch, length, vocab] in any float dtype.
    targets: [batch, length] int target ids.
    weights: [batch, length] float, 0 on padding.
    z_loss: the z-loss coefficient (0 = off).

  Returns:
    (loss_sum, z_loss_sum, correct_sum, weight_sum), float32 scalars; `loss_sum` includes the
    z-loss term, `z_loss_sum` is that term alone (for logging).
  """
  logits = logits.astype(jnp.float32)
  weights = weights.astype(jnp.float32)
  log_z = jax.nn.logsumexp(logits, axis=-1)
  target_logit = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
  z_term = z_loss * jnp.square(log_z)
  losses = log_z - target_logit + z_term
  correct = target_is_top(logits, target_logit)
  return (jnp.sum(losses * weights), jnp.sum(z_term * weights), jnp.sum(correct * weights),
          jnp.sum(weights))
