"""Pruning before fine-tuning: global unstructured magnitude pruning (`finetune.prune_sparsity`)
and attention-head pruning by gradient importance (`finetune.prune_heads`, below).

The weight matrices of the encoder's layers (every Dense `kernel` under a layer module: the
attention projections and the FFN; not the embeddings, LayerNorms, biases or the task head) are
ranked together by |w|, and the smallest `prune_sparsity` share of them is set to 0 (Gordon et al.,
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


# ---------------------------------------------------------------------------------- attention heads
#
# Michel et al. (2019, pmichel31415/are-16-heads-really-better-than-1 heads_pruning.py): a head's
# importance is |∂L/∂ξ_h| summed over batches, ξ_h a gate on the head's output (1 when open),
# normalised by its layer's L2 norm; the least important heads are masked 10% of all heads at a
# time, the importance recomputed after each round. Here the gate is not a model input: the head's
# output enters the model only through its slice W_o[h] of the output projection, so scaling ξ_h is
# scaling W_o[h], and ∂L/∂ξ_h = Σ W_o[h] ⊙ ∂L/∂W_o[h] (tested against an explicit gate). A pruned
# head has its query, key, value and output kernel slices set to 0 (held there by `keep_zeros`),
# so its contribution is exactly 0.

MASK_SHARE_PER_ROUND = 0.1   # heads_pruning.py --masking_amount


def attention_modules(params) -> list[tuple]:
  """The key paths (tuples of names) of every attention module of the encoder: a dict with
  query / key / value / output kernels; a scanned stack's kernels carry a leading layer axis."""
  found = []

  def visit(node, path):
    if isinstance(node, dict):
      if {"query", "key", "value", "output"} <= set(node) and "encoder" in path:
        found.append(path)
        return
      for name, child in node.items():
        visit(child, path + (name,))
  visit(params, ())
  return found


def _get(tree, path):
  for name in path:
    tree = tree[name]
  return tree


def head_importance(params, grads, modules) -> list[np.ndarray]:
  """Per attention module, |Σ W_o[h] ⊙ ∂L/∂W_o[h]| per head: [heads], or [layers, heads] for a
  scanned stack (output kernel [(layers,) heads, head_dim, hidden])."""
  out = []
  for path in modules:
    w = np.asarray(_get(params, path)["output"]["kernel"], np.float64)
    g = np.asarray(_get(grads, path)["output"]["kernel"], np.float64)
    out.append(np.abs(np.sum(w * g, axis=(-2, -1))))
  return out


def zero_heads(params, path, heads):
  """`params` (host numpy, copied where changed) with heads `heads` ([(layer, head)] for a scanned
  stack, [head] otherwise) of the attention module at `path` removed: their query / key / value
  kernel and bias slices and output kernel slice set to 0."""
  module = {k: dict(v) for k, v in _get(params, path).items()}
  for name in ("query", "key", "value", "output"):
    for leaf in ("kernel", "bias"):
      if name == "output" and leaf == "bias":
        continue
      x = np.array(module[name][leaf])
      for head in heads:
        index = tuple(np.atleast_1d(head))
        stacked = len(index) == 2
        if name == "output":                        # [(L,) heads, head_dim, hidden]
          x[index] = 0
        elif leaf == "kernel":                      # [(L,) hidden, heads, head_dim]
          x[(index[0], slice(None), index[1]) if stacked else (slice(None), index[0])] = 0
        else:                                       # bias [(L,) heads, head_dim]
          x[index] = 0
      module[name][leaf] = x
  updated = dict(params)
  node = updated
  for name in path[:-1]:
    node[name] = dict(node[name])
    node = node[name]
  node[path[-1]] = module
  return updated


def prune_heads(params, share: float, gradients_of):
  """Michel et al.'s iterative pruning of `params` (host numpy, the fine-tuning model's tree)
  until floor(share · H) of the H heads are removed. `gradients_of(params)` yields the loss's
  gradient (host numpy, same tree) on each importance batch; a head's importance is the sum of
  its per-batch |∂L/∂ξ_h| (heads_pruning.py compute_heads_importance). Returns (pruned params,
  the removed heads as {module path: sorted heads})."""
  modules = attention_modules(params)
  if not modules:
    raise ConfigError("finetune.prune_heads: this model has no encoder attention heads to prune "
                      "(a T5 or XLNet init?); set --config.finetune.prune_heads=0.")
  shapes = [np.asarray(_get(params, p)["output"]["kernel"]).shape[:-2] for p in modules]
  total = sum(int(np.prod(s)) for s in shapes)
  target = int(np.floor(share * total))
  removed = [np.zeros(s, bool) for s in shapes]
  while sum(int(r.sum()) for r in removed) < target:
    per_batch = [head_importance(params, g, modules) for g in gradients_of(params)]
    scores = [np.sum(s, axis=0) for s in zip(*per_batch)]
    # heads_pruning.py normalize_scores_by_layer: each layer's scores over its L2 norm.
    scores = [s / (np.linalg.norm(s, axis=-1, keepdims=True) + 1e-20) for s in scores]
    flat = np.concatenate([np.where(r, np.inf, s).ravel() for s, r in zip(scores, removed)])
    done = sum(int(r.sum()) for r in removed)
    count = min(max(1, int(total * MASK_SHARE_PER_ROUND)), target - done)
    chosen = np.argsort(flat, kind="stable")[:count]
    offset = 0
    for i, (path, r) in enumerate(zip(modules, removed)):
      mine = [np.unravel_index(j - offset, r.shape) for j in chosen
              if offset <= j < offset + r.size]
      for index in mine:
        r[index] = True
      if mine:
        params = zero_heads(params, path, [tuple(int(k) for k in index) if len(index) > 1
                                           else int(index[0]) for index in mine])
      offset += r.size
  return params, {"/".join(p): [tuple(int(k) for k in h) if len(h) > 1 else int(h[0])
                                for h in zip(*np.nonzero(r))] for p, r in zip(modules, removed)}
