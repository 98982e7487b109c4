"""Magnitude pruning: the global ranking, the exact sparsity, and the optimizer keeping the pruned
entries at 0."""

import jax
import jax.numpy as jnp
import numpy as np
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
