"""threefry.unroll_on_cpu: JAX's random bits on the CPU from the unrolled hash, bit for bit those
of JAX's own rolled CPU lowering, without its `while` loop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertfam_jax.models import layers
from helpers.threefry_rules import ROLLED, UNROLLED, cpu_rule


def _compiled_under(rule, fn, *args):
  """`fn` compiled for the CPU with `rule` as threefry2x32's CPU lowering: (values, HLO text).
  A new function object each call, so JAX lowers it afresh under the rule."""
  with cpu_rule(rule):
    compiled = jax.jit(lambda *a: fn(*a)).lower(*args).compile()
    values = jax.device_get(compiled(*args))
  return values, compiled.as_text()


def _rolled_and_unrolled(fn, *args):
  return _compiled_under(ROLLED, fn, *args), _compiled_under(UNROLLED, fn, *args)


@pytest.mark.parametrize("shape", [(7,), (3, 5, 8), (2, 4, 33)])
def test_unrolled_bits_equal_the_rolled_lowering(shape):
  """The same uint32 words, uniforms and keep decisions for even and odd sizes, from a split
  and a folded key; the rolled program has the loop and the unrolled one none."""
  def draws(key):
    a, b = jax.random.split(jax.random.fold_in(key, 3))
    return (jax.random.bits(a, shape, jnp.uint32), jax.random.uniform(b, shape),
            jax.random.bernoulli(b, 0.9, shape))

  key = jax.random.key(11)
  (rolled, rolled_hlo), (unrolled, unrolled_hlo) = _rolled_and_unrolled(draws, key)
  for r, u in zip(rolled, unrolled):
    np.testing.assert_array_equal(r, u)
  assert " while(" in rolled_hlo and " while(" not in unrolled_hlo
  assert len(np.unique(rolled[0])) > 0.9 * np.prod(shape)   # bits, not a constant


@pytest.mark.parametrize("bits", [32, 16])
def test_dropout_masks_equal_under_both_lowerings(bits):
  """models.layers.Dropout (flax's draw and the 16-bit one) drops the same elements."""
  dropout = layers.Dropout(rate=0.1, bits=bits)
  x = jnp.ones((4, 16, 24), jnp.float32)

  def apply(key):
    return dropout.apply({}, x, deterministic=False, rngs={"dropout": key})

  (rolled, _), (unrolled, _) = _rolled_and_unrolled(apply, jax.random.key(5))
  np.testing.assert_array_equal(rolled, unrolled)
  assert 0.85 < np.mean(rolled != 0) < 0.95

