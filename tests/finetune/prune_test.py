"""Magnitude pruning: the global ranking, the exact sparsity, and the optimizer keeping the pruned
entries at 0."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
import optax
import pytest

from bertfam_jax.finetune import prune


def params(seed=0):
  """A fine-tuning model's tree: two layers (the second's weights 10 times smaller), embeddings,
  LayerNorm and a head, which are never pruned."""
  rng = np.random.default_rng(seed)
  normal = lambda *shape: rng.normal(size=shape).astype(np.float32)  # noqa: E731
  return {"encoder": {
      "word_embeddings": {"embedding": normal(50, 8)},
      "layer_0": {"attention": {"query": {"kernel": normal(8, 8), "bias": normal(8)}},
                  "mlp": {"output": {"kernel": normal(16, 8)}},
                  "mlp_ln": {"norm": {"scale": normal(8)}}},
      "layer_1": {"attention": {"query": {"kernel": normal(8, 8) / 10}}}},
      "classification_head": {"classifier": {"kernel": normal(8, 3)}}}


def test_prunable_leaves_are_the_layers_weight_matrices():
  mask = prune.prunable({"params": params()})["params"]
  assert jax.tree.leaves(mask).count(True) == 3
  assert mask["encoder"]["layer_0"]["mlp"]["output"]["kernel"]
  assert not mask["encoder"]["word_embeddings"]["embedding"]
  assert not mask["classification_head"]["classifier"]["kernel"]
  assert not mask["encoder"]["layer_0"]["attention"]["query"]["bias"]


def test_adapters_are_kept_and_shared_albert_layers_are_pruned():
  """Adapters start near 0 (they would go first): never pruned. ALBERT's shared group_g and
  attention_group_g modules are layers like layer_i."""
  kernel = np.ones((4, 4), np.float32)
  tree = {"encoder": {"group_0": {"mlp": {"kernel": kernel}},
                      "attention_group_0": {"attention": {"kernel": kernel}},
                      "layer_0": {"ffn_adapter": {"down": {"kernel": kernel}}}}}
  mask = prune.prunable(tree)["encoder"]
  assert mask["group_0"]["mlp"]["kernel"] and mask["attention_group_0"]["attention"]["kernel"]
  assert not mask["layer_0"]["ffn_adapter"]["down"]["kernel"]


def test_a_model_without_prunable_weights_is_refused():
  from bertfam_jax.config_lib import ConfigError  # pylint: disable=g-import-not-at-top
  with pytest.raises(ConfigError, match="finetune.prune_sparsity"):
    prune.magnitude_prune({"decoder": {"layer_0": {"kernel": np.ones((2, 2))}}}, 0.5)


@pytest.mark.parametrize("sparsity", [0.0, 0.3, 0.5, 0.9])
def test_global_magnitude_pruning_hits_its_sparsity(sparsity):
  """floor(s · N) of the N = 256 prunable entries become 0, the smallest |w| over all layers
  together (the small second layer first), nothing else changes."""
  original = params()
  pruned = prune.magnitude_prune(original, sparsity)
  assert prune.sparsity(pruned) == int(np.floor(sparsity * 256)) / 256
  kept, removed = [], []
  for x, y, m in zip(jax.tree.leaves(original), jax.tree.leaves(pruned),
                     jax.tree.leaves(prune.prunable(original))):
    if not m:
      np.testing.assert_array_equal(x, y)
      continue
    kept += list(np.abs(x[y != 0]))
    removed += list(np.abs(x[y == 0]))
    np.testing.assert_array_equal(y[y != 0], x[y != 0])
  if removed:
    assert max(removed) <= min(kept)
  if sparsity:   # ranked globally: the small layer_1 loses a larger share than layer_0
    small = pruned["encoder"]["layer_1"]["attention"]["query"]["kernel"]
    large = pruned["encoder"]["layer_0"]["mlp"]["output"]["kernel"]
    assert np.mean(small == 0) > np.mean(large == 0)


def test_the_optimizer_keeps_pruned_entries_at_zero():
  """Adam with decoupled weight decay, then keep_zeros: after steps with dense gradients every
  pruned entry is still exactly 0 and every kept one has moved."""
  start = jax.tree.map(jnp.asarray, prune.magnitude_prune(params(), 0.5))
  tx = optax.chain(optax.adamw(1e-2, weight_decay=0.1), prune.keep_zeros())
  state, p = tx.init(start), start
  rng = np.random.default_rng(1)
  for _ in range(3):
    grads = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype), p)
    updates, state = tx.update(grads, state, p)
    p = optax.apply_updates(p, updates)
  for x, y, m in zip(jax.tree.leaves(start), jax.tree.leaves(p),
                     jax.tree.leaves(prune.prunable(start))):
    if m:
      np.testing.assert_array_equal(np.asarray(y)[np.asarray(x) == 0], 0)
      assert np.all(np.asarray(y)[np.asarray(x) != 0] != np.asarray(x)[np.asarray(x) != 0])
  assert prune.sparsity(jax.device_get(p)) == 0.5


def _encoder(scan=False):
  from bertfam_jax.models import encoder  # pylint: disable=g-import-not-at-top
  from helpers import tiny  # pylint: disable=g-import-not-at-top
  config = tiny.encoder(dropout=0.0, attention_dropout=0.0, scan_layers=scan)
  model = encoder.Encoder(config)
  ids = np.random.default_rng(0).integers(5, tiny.VOCAB, (2, 16)).astype(np.int32)
  variables = model.init(jax.random.key(0), ids, np.ones_like(ids), deterministic=True)
  variables = jax.tree.map(np.asarray, nn.meta.unbox(variables))
  r = np.random.default_rng(1).normal(size=(2, 16, 32))

  def loss(encoder_params):
    out = model.apply({"params": encoder_params}, ids, np.ones_like(ids), deterministic=True)
    return jnp.sum(out * r)
  return {"encoder": variables["params"]}, loss


@pytest.mark.parametrize("scan", [False, True])
def test_head_importance_is_the_gradient_of_a_gate_on_the_head(scan):
  """|∂L/∂ξ_h| for a gate ξ_h scaling head h's output (its slice of the output projection),
  computed by differentiating the gate itself, equals head_importance's Σ W_o[h] ⊙ ∂L/∂W_o[h]."""
  params, loss = _encoder(scan)
  modules = prune.attention_modules(params)
  grads = {"encoder": jax.grad(loss)(params["encoder"])}
  importance = prune.head_importance(params, grads, modules)
  path = modules[0]
  index = (1, 2) if scan else 2   # layer 1's head 2 (scanned) or head 2 of layer_0

  def gated(xi):
    p = jax.tree.map(lambda x: x, params)
    kernel = jnp.asarray(prune._get(p, path)["output"]["kernel"])
    prune._get(p, path)["output"]["kernel"] = kernel.at[index].multiply(xi)
    return loss(p["encoder"])
  np.testing.assert_allclose(importance[0][index], abs(float(jax.grad(gated)(1.0))), rtol=1e-4)


@pytest.mark.parametrize("scan", [False, True])
def test_a_removed_head_contributes_nothing(scan):
  """After zero_heads, the output does not depend on anything of the removed head: the gradient
  with respect to its query / key / value biases is exactly 0 (another head's is not)."""
  params, loss = _encoder(scan)
  path = prune.attention_modules(params)[0]
  head = (0, 1) if scan else 1
  pruned = prune.zero_heads(params, path, [head])
  grads = jax.grad(loss)(pruned["encoder"])
  module = prune._get({"encoder": grads}, path)
  other = (0, 2) if scan else 2
  for name in ("query", "key", "value"):
    assert not np.any(np.asarray(module[name]["bias"][head]))
    assert np.any(np.asarray(module["value"]["bias"][other]))
  assert not np.any(prune._get(pruned, path)["output"]["kernel"][head])


def test_iterative_pruning_removes_the_least_important_heads_once_each():
  """2 layers x 4 heads, importance |Σ W_o[h]| (a gradient of ones): 50% = 4 heads, one per
  round (10% of 8 rounds down to 1), each round over the heads left, by layer-normalised score;
  the removed heads are zeroed."""
  params, _ = _encoder()
  modules = prune.attention_modules(params)
  for m, scale in zip(modules, ([1.0, 0.01, 1.0, 0.02], [0.03, 1.0, 1.0, 0.5])):
    kernel = np.abs(prune._get(params, m)["output"]["kernel"])
    prune._get(params, m)["output"]["kernel"] = kernel * np.asarray(scale)[:, None, None]
  rounds = []

  def gradients_of(p):
    rounds.append(p)
    yield jax.tree.map(np.ones_like, p)
  pruned, removed = prune.prune_heads(params, 0.5, gradients_of)
  assert len(rounds) == 4
  names = ["/".join(m) for m in modules]
  assert removed == {names[0]: [1, 3], names[1]: [0, 3]}
  for m, heads in zip(modules, ([1, 3], [0, 3])):
    kernel = prune._get(pruned, m)["output"]["kernel"]
    assert [h for h in range(4) if not np.any(kernel[h])] == heads
