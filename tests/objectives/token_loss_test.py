"""objectives/losses.token_cross_entropy: t5x's cross-entropy + z-loss, float32 from any dtype."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertfam_jax.objectives import losses


def _reference(logits, targets, weights, z_loss):
  """Per-position log-softmax with float64 numpy, summed over weighted positions."""
  logits = np.asarray(logits, np.float64)
  log_z = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
  target_logit = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
  z_term = z_loss * log_z**2
  return (np.sum((log_z - target_logit + z_term) * weights), np.sum(z_term * weights),
          np.sum((logits.argmax(-1) == targets) * weights), np.sum(weights))


@pytest.mark.parametrize("z_loss", [0.0, 1e-4, 0.1])
def test_matches_float64_reference(z_loss):
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 5, 11)) * 4
  targets = rng.integers(0, 11, size=(3, 5))
  weights = (rng.random((3, 5)) > 0.3).astype(np.float32)
  ours = losses.token_cross_entropy(jnp.asarray(logits, jnp.float32), jnp.asarray(targets),
                                    jnp.asarray(weights), z_loss)
  np.testing.assert_allclose(np.asarray(ours), _reference(logits, targets, weights, z_loss),
                             rtol=1e-5)
  if z_loss == 0:
    assert float(ours[1]) == 0.0


def test_padding_positions_change_nothing_and_bf16_is_computed_in_float32():
  rng = np.random.default_rng(1)
  logits = jnp.asarray(rng.normal(size=(2, 4, 32000)) * 3, jnp.bfloat16)
  targets = jnp.asarray(rng.integers(0, 32000, size=(2, 4)))
  weights = jnp.asarray([[1, 1, 0, 0], [1, 0, 0, 0]], jnp.float32)
  full = losses.token_cross_entropy(logits, targets, weights, 1e-4)
  assert all(x.dtype == jnp.float32 for x in full)
  garbage = logits.at[:, 2:].set(1e4)   # huge values only where the weight is 0
  np.testing.assert_array_equal(np.asarray(full),
                                np.asarray(losses.token_cross_entropy(garbage, targets, weights,
                                                                      1e-4)))
  expected = _reference(np.asarray(logits.astype(jnp.float32)), np.asarray(targets),
                        np.asarray(weights), 1e-4)
  np.testing.assert_allclose(np.asarray(full), expected, rtol=1e-5)


def test_gradient_is_softmax_minus_one_hot():
  rng = np.random.default_rng(2)
  logits = jnp.asarray(rng.normal(size=(1, 3, 7)), jnp.float32)
  targets = jnp.asarray([[1, 4, 6]])
  weights = jnp.ones((1, 3), jnp.float32)
  grad = jax.grad(lambda x: losses.token_cross_entropy(x, targets, weights, 0.0)[0])(logits)
  expected = jax.nn.softmax(logits) - jax.nn.one_hot(targets, 7)
  np.testing.assert_allclose(np.asarray(grad), np.asarray(expected), atol=1e-6)


def test_target_is_top_is_argmax_without_ties_and_counts_ties_as_correct():
  logits = np.random.default_rng(0).normal(size=(6, 5, 11)).astype(np.float32)
  targets = np.random.default_rng(1).integers(0, 11, (6, 5))
  targets[0, 0] = logits[0, 0].argmax()   # some positions correct
  target_logit = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
  np.testing.assert_array_equal(losses.target_is_top(jnp.asarray(logits), target_logit),
                                logits.argmax(-1) == targets)
  tied = np.array([[1.0, 3.0, 3.0]], np.float32)
  assert losses.target_is_top(tied, tied[:, 2]).tolist() == [1.0]   # argmax would say 1
  assert losses.target_is_top(tied, tied[:, 0]).tolist() == [0.0]
