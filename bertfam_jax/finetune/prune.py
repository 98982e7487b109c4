"""Global unstructured magnitude pruning before fine-tuning (`finetune.prune_sparsity`).

The weight matrices of the encoder's layers (every Dense `kernel` under a layer module: the
attention projections and the FFN; not the embeddings, LayerNorms, biases or the task head) are
ranked together by |w|, and the smallest `sparsity` share of them is set to 0 (Gordon et al.,
2020, "Compressing BERT": global magnitude pruning of the pre-trained weights, then fine-tuning
with the pruned weights held at 0). The zeros are the mask: the parameters carry it, so
checkpoints, exports and any later run see the pruned model, and `keep_zeros` (the optimizer's
last transformation, its state the boolean mask of the kept entries) keeps every pruned entry
at exactly 0 while the rest fine-tune.

  params = prune.magnitude_prune(params, 0.5)   # host numpy {'encoder': ..., head: ...}
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertfam_jax.config_lib import ConfigError


# Adapters (finetune.method='adapters') start near 0 and would be the first weights pruned.
ADAPTERS = ("attention_adapter", "ffn_adapter")


def _is_layer(name: str) -> bool:
  """A layer module of the encoder: layer_i, a scanned `layers` stack, or ALBERT's shared
  group_g / attention_group_g / ffn_group_g (encoder.layer_plan)."""
  return name.startswith("layer_") or name == "layers" or name.startswith(
      ("group_", "attention_group_", "ffn_group_"))


def prunable(params):
  """A tree like `params` (the model's {'encoder': ..., ...}, or with an outer {'params': ...}),
  True at the weight matrices of the encoder's layers (adapters excluded)."""
  def is_prunable(path, _):
    names = [getattr(k, "key", str(k)) for k in path]
    inside = names[names.index("encoder") + 1:] if "encoder" in names else []
    return (names[-1] == "kernel" and any(_is_layer(n) for n in inside)
            and not any(n in ADAPTERS for n in inside))
  return jax.tree_util.tree_map_with_path(is_prunable, params)


def magnitude_prune(params, share: float):
  """`params` (host numpy) with the floor(share · N) smallest-magnitude entries of the N
  prunable ones (`prunable`) set to 0, ranked over all of them at once (ties at the threshold
  broken arbitrarily). The other leaves are returned as they are. ConfigError when `params` has
  no prunable leaf."""
  mask = prunable(params)
  leaves, treedef = jax.tree.flatten(params)
  chosen = [np.asarray(x) for x, m in zip(leaves, jax.tree.leaves(mask)) if m]
  if not chosen:
    raise ConfigError("finetune.prune_sparsity: this model has no encoder layer weights to prune "
                      "(a T5 or XLNet init?); set --config.finetune.prune_sparsity=0.")
  if share <= 0:
    return params
  magnitudes = np.concatenate([np.abs(x).ravel() for x in chosen])
  count = int(np.floor(share * magnitudes.size))
  keep = np.ones(magnitudes.size, bool)
  keep[np.argpartition(magnitudes, count - 1)[:count] if count else []] = False
  pruned, offset = [], 0
  for x, m in zip(leaves, jax.tree.leaves(mask)):
    if m:
      x = np.asarray(x)
      kept = keep[offset:offset + x.size].reshape(x.shape)
      offset += x.size
      x = np.where(kept, x, np.zeros((), x.dtype))
    pruned.append(x)
  return jax.tree.unflatten(treedef, pruned)


def sparsity(params) -> float:
  """The share of exact zeros among the prunable entries of `params`."""
  chosen = [np.asarray(x) for x, m in zip(jax.tree.leaves(params),
                                          jax.tree.leaves(prunable(params))) if m]
  total = sum(x.size for x in chosen)
  return sum(int(np.sum(x == 0)) for x in chosen) / max(total, 1)


def keep_zeros() -> optax.GradientTransformation:
  """Zeroes the updates of the prunable entries that are 0 when the optimizer is initialised
  (the pruned ones), so that they stay exactly 0. Its state is that mask: per prunable leaf the
  kept entries (True), per other leaf a scalar True."""
  def init_fn(params):
    return jax.tree.map(lambda p, m: (p != 0) if m else jnp.ones((), bool), params,
                        prunable(params))

  def update_fn(updates, kept, params=None):
    del params
    return jax.tree.map(lambda u, k: u * k.astype(u.dtype), updates, kept), kept

  return optax.GradientTransformation(init_fn, update_fn)
