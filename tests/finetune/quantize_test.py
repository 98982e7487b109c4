"""Q8BERT's quantization (finetune/quantize.py): the 8-bit grid and the straight-through gradient
of the reference, the EMA ranges, the integer path against the fake-quantized model, and the
wrapper leaving a float model unchanged."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bertfam_jax.finetune import quantize, run
from bertfam_jax.models import finetune as finetune_models
from helpers import tiny


def test_fake_quantization_is_the_references_grid_with_a_straight_through_gradient():
  x = jnp.asarray(np.random.default_rng(0).normal(size=(5, 7)), jnp.float32)
  scale = quantize.dynamic_scale(x)
  np.testing.assert_allclose(scale, 127 / np.max(np.abs(x)), rtol=1e-6)
  reference = np.clip(np.round(np.asarray(x) * scale), -127, 127) / scale   # quantization.py
  np.testing.assert_allclose(quantize.fake_quantize(x, scale), reference, rtol=1e-6)
  assert np.unique(np.round(np.asarray(quantize.fake_quantize(x, scale)) * scale)).size <= 255
  grad = jax.grad(lambda x: jnp.sum(quantize.fake_quantize(x, scale) * jnp.arange(7.0)[None]))(x)
  np.testing.assert_array_equal(grad, np.broadcast_to(np.arange(7.0), (5, 7)))
  np.testing.assert_array_equal(quantize.quantize(jnp.full(3, 1e9), scale), [127, 127, 127])


class _Dense(nn.Module):
  """A Dense that takes `deterministic`, to wrap alone."""

  @nn.compact
  def __call__(self, x, *, deterministic):
    del deterministic
    return nn.Dense(3)(x)


def test_ranges_start_at_the_first_batch_then_move_as_an_ema():
  model = quantize.Quantized(_Dense(), ema_decay=0.9)
  x1, x2 = jnp.full((2, 4), 2.0), jnp.full((2, 4), -7.0)
  v = model.init(jax.random.key(0), x1, deterministic=True)
  assert float(v[quantize.RANGES]["Dense_0"]["input_max"]) == 0.0
  _, new = model.apply(v, x1, deterministic=False, quant="fake", mutable=[quantize.RANGES])
  assert float(new[quantize.RANGES]["Dense_0"]["input_max"]) == 2.0
  _, new = model.apply({**v, **new}, x2, deterministic=False, quant="fake",
                       mutable=[quantize.RANGES])
  np.testing.assert_allclose(new[quantize.RANGES]["Dense_0"]["input_max"], 2.0 - 0.1 * (2 - 7))
  # Evaluation reads the range without moving it.
  _, same = model.apply({**v, **new}, x1, deterministic=True, quant="fake",
                        mutable=[quantize.RANGES])
  np.testing.assert_allclose(same[quantize.RANGES]["Dense_0"]["input_max"], 2.5)


@pytest.fixture(scope="module")
def classifier():
  c = tiny.encoder(dropout=0.0, attention_dropout=0.0)
  inner = finetune_models.FineTuneModel(ml_collections.FrozenConfigDict(c), "classification", 3)
  ids = (np.arange(4 * 32).reshape(4, 32) * 7 % tiny.VOCAB).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, 20:] = 0
  inputs = (ids, mask, 0 * ids)
  model = quantize.Quantized(inner)
  variables = nn.meta.unbox(model.init(jax.random.key(0), *inputs, deterministic=True))
  _, ranges = model.apply(variables, *inputs, deterministic=False, quant="fake",
                          mutable=[quantize.RANGES], rngs={"dropout": jax.random.key(1)})
  return inner, model, {**variables, **ranges}, inputs


def test_the_wrapper_keeps_names_and_float_outputs(classifier):
  inner, model, variables, inputs = classifier
  plain = inner.init(jax.random.key(0), *inputs, deterministic=True)
  assert jax.tree.structure(nn.meta.unbox(plain)["params"]) == jax.tree.structure(
      variables["params"])
  np.testing.assert_array_equal(
      model.apply(variables, *inputs, deterministic=True),
      inner.apply({"params": variables["params"]}, *inputs, deterministic=True))
  # Every dense layer has a range: Q, K, V, output and the FFN's two per layer, pooler, classifier.
  assert len(jax.tree.leaves(variables[quantize.RANGES])) == 2 * 6 + 2
  assert all(float(r) > 0 for r in jax.tree.leaves(variables[quantize.RANGES]))


def test_the_integer_path_equals_the_fake_quantized_model(classifier):
  """int8 × int8 → int32 products and int32 biases give the fake-quantized logits to 1e-5 of
  their scale, and the same predictions; the quantization moves the logits measurably."""
  inner, model, variables, inputs = classifier
  fake = np.asarray(model.apply(variables, *inputs, deterministic=True, quant="fake"))
  int8 = np.asarray(model.apply(variables, *inputs, deterministic=True, quant="int8"))
  plain = np.asarray(inner.apply({"params": variables["params"]}, *inputs, deterministic=True))
  scale = np.max(np.abs(fake))
  np.testing.assert_allclose(int8, fake, atol=1e-5 * scale)
  np.testing.assert_array_equal(int8.argmax(-1), fake.argmax(-1))
  assert np.max(np.abs(fake - plain)) > 1e-4 * scale
  jaxpr = jax.make_jaxpr(lambda v: model.apply(v, *inputs, deterministic=True, quant="int8"))(
      variables)
  dots = [e for e in jaxpr.eqns if e.primitive.name == "dot_general"]
  integer = [e for e in dots if e.invars[0].aval.dtype == jnp.int8
             and e.outvars[0].aval.dtype == jnp.int32]
  assert len(integer) == 2 * 6 + 2   # every dense layer; attention's two products stay float
  assert len(dots) - len(integer) == 2 * 2


def test_qat_loss_returns_the_updated_ranges(classifier):
  _, model, variables, inputs = classifier
  batch = dict(zip(quantize.INPUT_KEYS, inputs), label=np.array([0, 1, 2, 0], np.int32))
  loss_fn = quantize.qat_loss_fn("classification")
  loss, metrics, updates = loss_fn(model, variables, batch, jax.random.key(0), None)
  assert np.isfinite(float(loss)) and "accuracy" in metrics and set(updates) == {
      quantize.RANGES}
  assert len(loss_fn(model, variables, batch, jax.random.key(0), None, deterministic=True)) == 2


@pytest.mark.parametrize("quantize", [True, False])
def test_quantizing_drops_fused_qkv_and_fp8_which_bypass_the_interceptor(quantize):
  """Q8BERT's fake quantization intercepts each projection and dense layer: fine-tuning with it
  projects Q, K and V one by one and leaves FP8 off; without it both stay as pre-trained."""
  ft = ml_collections.ConfigDict(dict(method="full", quantize=quantize, dropout=None))
  m = run.model_config(tiny.encoder(fused_qkv=True, fp8_matmuls=True, dtype="bfloat16"), ft)
  assert (m.fused_qkv, m.fp8_matmuls) == (not quantize, not quantize)
