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


def log_uniform_probabilities(ids, range_max: int):
  """P(id) of TF's log-uniform (Zipfian) candidate sampler over [0, range_max): log((id + 2) /
  (id + 1)) / log(range_max + 1), which assumes ids sorted by falling frequency."""
  ids = ids.astype(jnp.float32)
  return jnp.log1p(1.0 / (ids + 1.0)) / jnp.log(range_max + 1.0)


def log_uniform_candidates(rng, num_sampled: int, range_max: int):
  """[num_sampled] int32 ids drawn with replacement from `log_uniform_probabilities` (TF's
  LogUniformSampler: floor(exp(u · log(range_max + 1))) − 1, u ~ U[0, 1))."""
  u = jax.random.uniform(rng, (num_sampled,))
  ids = jnp.floor(jnp.exp(u * jnp.log(range_max + 1.0))).astype(jnp.int32) - 1
  return jnp.clip(ids, 0, range_max - 1)


def sampled_softmax_cross_entropy(h_NP, targets_N, kernel_VP, bias_V, sampled_S):
  """TF's `sampled_softmax_loss` (num_true 1, remove_accidental_hits, subtract_log_q) over the
  candidates `sampled_S` drawn with replacement by `log_uniform_candidates`, so that a candidate's
  expected count is S · P(id) exactly (TF's default sampler draws them unique, whose expected
  counts follow the number of draws it took): per position, the cross-entropy of the true class
  against the S candidates, each logit h·w + b − log(S · P(id)), a candidate equal to the target
  masked out. h [N, P], targets [N] int, kernel [vocab, P], bias [vocab] → [N] float32."""
  num_sampled, vocab = sampled_S.shape[0], kernel_VP.shape[0]
  h_NP = h_NP.astype(jnp.float32)
  log_q = lambda ids: jnp.log(num_sampled * log_uniform_probabilities(ids, vocab))  # noqa: E731
  true_N = (jnp.sum(h_NP * kernel_VP[targets_N], axis=-1) + bias_V[targets_N]
            - log_q(targets_N))
  sampled_NS = h_NP @ kernel_VP[sampled_S].T + (bias_V[sampled_S] - log_q(sampled_S))[None]
  sampled_NS = jnp.where(sampled_S[None, :] == targets_N[:, None], jnp.finfo(jnp.float32).min,
                         sampled_NS)
  logits_N1S = jnp.concatenate([true_N[:, None], sampled_NS], axis=-1)
  return jax.nn.logsumexp(logits_N1S, axis=-1) - true_N
