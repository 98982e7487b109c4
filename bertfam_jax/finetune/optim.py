"""The fine-tuning optimizer: BERT's AdamW with layer-wise learning-rate decay, frozen layers and
adapter-only training.

  tx, schedule = make_finetune_optimizer(config, params, total_steps)

`config` is a resolved fine-tuning config (`config_lib.resolve_finetune`): `config.optimizer`
(name, peak_lr, warmup_fraction, weight_decay, clip_norm), `config.finetune` (`ft` below:
layer_decay, freeze_layers, method) and the encoder's `config.model`.

- Update (bert run_classifier.py → optimization.py create_optimizer, via train/optimizer.py
  make_optimizer): clip the global gradient norm at `clip_norm`, Adam without bias correction,
  decay `weight_decay`·θ on all but LayerNorm and biases, linear warmup over
  int(total_steps · warmup_fraction) steps (run_classifier's num_warmup_steps) and linear decay to
  0 at `total_steps` counted from step 0.
- `layer_decay` d < 1 (ELECTRA model/optimization.py `_get_layer_lrs`): a parameter at depth k has
  learning rate lr · d^(L + 2 − k), L = model.layers; depth 0 for the embeddings (tables, their
  LayerNorm, ALBERT's projection: ELECTRA's "/embeddings/" and "/embeddings_project/"), i + 1 for
  layer i (its adapters and LayerNorms included), L + 2 for everything outside the encoder: the
  heads, their pooler and the scalar mix, which ELECTRA's fine-tuning creates under
  "task_specific/" (its pooler has no weights). A scanned stack ('layers', [L, ...]) gets one
  multiplier per slice. Layers that share parameters (ALBERT) have no single depth, so d < 1
  is refused for them, as ELECTRA raises for a variable no key matches.
- ULMFiT (Howard & Ruder 2018): discriminative rates are `layer_decay` 1/2.6 with
  `layer_decay_style='ulmfit'` (its η^(l−1) = η^l / 2.6 from the head down: fastai v0.7's
  train_clas.py `lrs = [lr/lrm**4, ..., lr/lrm, lr]`, the head at lr, the top layer at lr/2.6,
  the embeddings at lr·d^(L+1); ELECTRA's style leaves a factor d² between the head and the top
  layer); `optimizer.schedule='slanted_triangular'` its slanted triangular rates
  (`train.optimizer.learning_rate_schedule`); `unfreeze_every` S its gradual unfreezing: the
  head alone for S steps, then one more layer from the top every S steps, the embeddings last
  (`unfrozen_depth`; ULMFiT's S is an epoch). Frozen depths get neither gradients into the
  optimizer (no moments) nor updates (no weight decay).
- `freeze_layers` N: the embeddings and layers 0..N−1 get no update; frozen leaves go through
  optax.set_to_zero (no optimizer state) and are left out of the clipped norm. A scanned stack
  is one array: its frozen slices get zero gradients and updates, its optimizer state covers
  the whole stack.
- `prune_sparsity` s > 0 / `prune_heads` h > 0 (finetune/prune.py): the pre-trained weights
  are magnitude-pruned / the least important attention heads removed before fine-tuning, and a
  last transformation keeps the pruned entries at exactly 0.
- method 'adapters' (Houlsby et al., 2019; adapter-bert optimization.py trains the collections
  "adapters", "layer_norm", "head"): only adapters, every LayerNorm (embeddings' included), and
  everything outside the encoder are trained. Deviation: adapter-bert's head is the output layer
  alone, its pooler the frozen pre-trained one; here the whole head trains, pooler included, since
  runs without a sentence task (RoBERTa, ELECTRA) have no pre-trained pooler.
"""

from __future__ import annotations

import collections
import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bertfam_jax import config_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.finetune import prune
from bertfam_jax.models import encoder
from bertfam_jax.train import optimizer

ADAPTERS = prune.ADAPTERS

# Where a parameter sits: outside the encoder, in its embeddings, in a scanned [layers, ...] stack,
# or in a layer module applied at some layers (`Layers`).
TASK, EMBEDDINGS, STACK = "task", "embeddings", "stack"


@dataclasses.dataclass(frozen=True)
class Layers:
  """The layers (indices) that apply a layer module: one, or several when they share it."""
  indices: tuple[int, ...]


def _names(path) -> list[str]:
  return [getattr(k, "key", str(k)) for k in path]


def _positions(config_model, params):
  """A tree like `params` of TASK / EMBEDDINGS / STACK / Layers."""
  modules = collections.defaultdict(list)  # layer module name → the layers that apply it
  for i, layer in enumerate(encoder.layer_plan(config_model)):
    for name, _ in layer:
      modules[name].append(i)

  def position(path, _):
    names = _names(path)
    if "encoder" not in names:
      return TASK
    module = names[names.index("encoder") + 1]
    if module == "layers":
      return STACK
    if module == "final_ln":   # GPT-2's, after the last layer: that layer's depth
      return Layers((config_model.layers - 1,))
    return Layers(tuple(modules[module])) if module in modules else EMBEDDINGS

  return jax.tree_util.tree_map_with_path(position, params)


def _per_slice(values, leaf):
  """[layers] values → [layers, 1, ...] broadcasting against a stacked leaf."""
  return np.asarray(values).reshape((-1,) + (1,) * (len(leaf.shape) - 1))


def _check(ft, config_model) -> None:
  if ft.method not in config_lib.FINETUNE_METHODS:
    raise ConfigError(f"finetune.method={ft.method!r}; choose one of "
                      f"{config_lib.FINETUNE_METHODS}.")
  if not 0 < ft.layer_decay <= 1:
    raise ConfigError(f"finetune.layer_decay={ft.layer_decay} must be in (0, 1] (1 = off).")
  if ft.get("layer_decay_style", "electra") not in config_lib.LAYER_DECAY_STYLES:
    raise ConfigError(f"finetune.layer_decay_style={ft.layer_decay_style!r}; choose one of "
                      f"{config_lib.LAYER_DECAY_STYLES}.")
  if not 0 <= ft.freeze_layers <= config_model.layers:
    raise ConfigError(f"finetune.freeze_layers={ft.freeze_layers} must be in [0, model.layers="
                      f"{config_model.layers}].")


def layer_depths(ft, config_model, params, what: str = "finetune.layer_decay"):
  """Each parameter's depth: 0 the embeddings, i + 1 layer i, L + 2 outside the encoder (the
  head); a tree like `params` of float32 numpy arrays, 0-d or [layers, 1, ...] for a scanned
  stack. Layers that share parameters have no single depth: `what` (the field that needs one)
  is refused for them unless it is off."""
  _check(ft, config_model)
  n = config_model.layers
  off = ft.layer_decay == 1 and not ft.get("unfreeze_every", 0)

  def depth(position, leaf):
    if position == TASK:
      return np.float32(n + 2)
    if position == EMBEDDINGS:
      return np.float32(0)
    if position == STACK:
      return _per_slice(np.arange(1, n + 1, dtype=np.float32), leaf)
    if len(position.indices) > 1 and not off:
      raise ConfigError(f"{what}={ft.layer_decay if 'decay' in what else ft.unfreeze_every} "
                        f"needs one parameter set per layer, but model.share_layers="
                        f"{config_model.share_layers!r} applies one at layers "
                        f"{list(position.indices)}; turn it off for this model.")
    return np.float32(position.indices[0] + 1)

  return jax.tree.map(depth, _positions(config_model, params), params)


def layer_multipliers(ft, config_model, params):
  """The per-parameter learning-rate factor of `layer_depths`' depth k: ELECTRA's d^(L + 2 − k)
  (`layer_decay_style='electra'`), or ULMFiT's d^max(L + 1 − k, 0) ('ulmfit': the head at
  lr, layer L − 1 at lr·d)."""
  n, decay = config_model.layers, ft.layer_decay
  if decay == 1:
    _check(ft, config_model)
    return jax.tree.map(lambda _: np.float32(1), params)
  top = n + 1 if ft.get("layer_decay_style", "electra") == "ulmfit" else n + 2
  return jax.tree.map(lambda k: np.float32(decay) ** np.maximum(top - k, 0),
                      layer_depths(ft, config_model, params))


def unfrozen_depth(step, num_layers: int, every: int):
  """ULMFiT's gradual unfreezing: the lowest depth (`layer_depths`) trained at `step`: the head
  alone for the first `every` steps, then one more layer from the top every `every` steps, the
  embeddings last (at stage L + 1)."""
  stage = step // every
  return jnp.where(stage == 0, num_layers + 2, jnp.maximum(num_layers + 1 - stage, 0))


def _gradual_unfreezing(depths, num_layers: int, every: int) -> optax.GradientTransformation:
  """Zeroes the updates of the depths not yet unfrozen (`unfrozen_depth`), counting its own
  steps; placed before the optimizer (no moments build up while frozen) and after it (decoupled
  weight decay moves no frozen weight)."""

  def update_fn(updates, count, params=None):
    del params
    lowest = unfrozen_depth(count, num_layers, every)
    gated = jax.tree.map(lambda u, k: u * (k >= lowest).astype(u.dtype), updates, depths)
    return gated, count + 1

  return optax.GradientTransformation(lambda _: jnp.zeros([], jnp.int32), update_fn)


def trainable_mask(ft, config_model, params):
  """A tree like `params` of numpy bools: 0-d, or [layers, 1, ...] for a scanned stack."""
  _check(ft, config_model)
  frozen = ft.freeze_layers
  adapters_only = ft.method == "adapters"
  if adapters_only and not any(
      a in _names(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]
      for a in ADAPTERS):
    raise ConfigError("finetune.method='adapters' needs a model with adapters: set "
                      "model.adapter_size > 0 (finetune.adapter_size) or "
                      "--config.finetune.method=full.")

  def trainable(path, position, leaf):
    names = _names(path)
    if position == TASK:
      return np.bool_(True)
    if adapters_only and not any(a in names for a in ADAPTERS + ("norm",)):
      return np.bool_(False)
    if position == EMBEDDINGS:
      return np.bool_(frozen == 0)
    if position == STACK:
      return _per_slice(np.arange(config_model.layers) >= frozen, leaf)
    if len({i < frozen for i in position.indices}) > 1:
      raise ConfigError(f"finetune.freeze_layers={frozen} splits the layers "
                        f"{list(position.indices)} "
                        f"that share '{names[names.index('encoder') + 1]}' (model.share_layers="
                        f"{config_model.share_layers!r}); freeze all of them or none.")
    return np.bool_(position.indices[0] >= frozen)

  return jax.tree_util.tree_map_with_path(trainable, _positions(config_model, params), params)


def trainable_fraction(ft, config_model, params) -> float:
  """The fraction of parameter entries that `make_finetune_optimizer` updates (`params` may be
  abstract: jax.eval_shape's ShapeDtypeStructs); the entries that `prune_sparsity` holds at 0
  are not updated."""
  mask = trainable_mask(ft, config_model, params)
  kept = 1.0 - ft.get("prune_sparsity", 0.0)
  sizes = jax.tree.map(lambda leaf: np.prod(leaf.shape, dtype=np.float64), params)
  trained = jax.tree.map(lambda m, leaf, pruned: np.prod(leaf.shape) * np.mean(m) * (
      kept if pruned else 1.0), mask, params, prune.prunable(params))
  return float(sum(jax.tree.leaves(trained)) / sum(jax.tree.leaves(sizes)))


def _scale_by(factors) -> optax.GradientTransformation:
  """Multiplies each update leaf by its factor (a 0-d or broadcasting numpy array)."""

  def update_fn(updates, state, params=None):
    del params
    return jax.tree.map(lambda u, f: u * f, updates, factors), state

  return optax.GradientTransformation(lambda _: optax.EmptyState(), update_fn)


def base_optimizer(o, total_steps: int) -> ml_collections.ConfigDict:
  """The {optimizer, train} sections `train.optimizer.make_optimizer` reads for fine-tuning's
  `config.optimizer` `o` over `total_steps` updates: 'adamw', BERT's AdamWeightDecay
  (`config_lib.bert_adamw`) with warmup over int(total_steps · warmup_fraction) steps, then
  linear decay to 0, or with `adam='gpt'` GPT's (`config_lib.gpt_adam`: opt.py's bias-corrected
  Adam with the L2 inside the step) at opt.py's warmup_linear, min(1, step / W) · (1 − step / T)
  (`warmup_times_linear`: rate 0 at the first update, as opt.py's x = 0), or with
  `adam='fairseq'` fairseq's (`config_lib.fairseq_adam`: bias-corrected, β₂ 0.98, ε 1e-6,
  decoupled decay on every parameter) at its polynomial_decay (warmup, then linear to 0 over the
  remaining steps); 'adafactor', T5's (`config_lib.t5_adafactor`) at a constant rate."""
  if o.name == "adafactor":   # a constant rate (`config_lib.validate_finetune`: no warmup)
    section = config_lib.t5_adafactor(peak_lr=o.peak_lr, schedule="constant", warmup_steps=0,
                                      weight_decay=o.weight_decay, clip_norm=o.clip_norm)
  elif o.get("adam", "bert") == "gpt":   # finetune-transformer-lm: opt.py adam, warmup_linear
    section = config_lib.gpt_adam(peak_lr=o.peak_lr, weight_decay=o.weight_decay,
                                  clip_norm=o.clip_norm, schedule="warmup_times_linear",
                                  warmup_steps=int(total_steps * o.warmup_fraction))
  elif o.get("adam", "bert") == "fairseq":   # fairseq optim/adam.py with polynomial_decay
    section = config_lib.fairseq_adam(peak_lr=o.peak_lr, weight_decay=o.weight_decay,
                                      clip_norm=o.clip_norm,
                                      warmup_steps=int(total_steps * o.warmup_fraction))
  elif o.get("schedule", "linear") == "slanted_triangular":   # ULMFiT: no separate warmup
    section = config_lib.bert_adamw(peak_lr=o.peak_lr, weight_decay=o.weight_decay,
                                    clip_norm=o.clip_norm, schedule="slanted_triangular",
                                    warmup_steps=0, cut_frac=o.cut_frac, ratio=o.ratio)
  else:
    section = config_lib.bert_adamw(peak_lr=o.peak_lr, weight_decay=o.weight_decay,
                                    clip_norm=o.clip_norm,
                                    warmup_steps=int(total_steps * o.warmup_fraction))
  return ml_collections.ConfigDict(dict(optimizer=section, train=dict(total_steps=total_steps)))


def make_finetune_optimizer(config, params, total_steps: int
                            ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """(transformation, schedule) for fine-tuning `params` (concrete or abstract, with or without
  the outer {'params': ...}) of a models/finetune.py FineTuneModel over `total_steps` updates:
  `base_optimizer` on the trainable entries, layer-wise decay on top."""
  ft, config_model = config.finetune, config.model
  mask = trainable_mask(ft, config_model, params)
  adamw, schedule = optimizer.make_optimizer(base_optimizer(config.optimizer, total_steps))
  labels = jax.tree.map(lambda m: "trainable" if m.any() else "frozen", mask)
  as_float = lambda m: m.astype(np.float32)  # noqa: E731
  multipliers = jax.tree.map(lambda m, k: as_float(m) * k, mask,
                             layer_multipliers(ft, config_model, params))
  parts = [_scale_by(jax.tree.map(as_float, mask)),  # zero frozen stack slices' gradients
           optax.multi_transform({"trainable": adamw, "frozen": optax.set_to_zero()}, labels),
           _scale_by(multipliers)]
  if ft.get("unfreeze_every", 0):
    depths = layer_depths(ft, config_model, params, "finetune.unfreeze_every")
    gate = lambda: _gradual_unfreezing(depths, config_model.layers, ft.unfreeze_every)  # noqa: E731
    parts = [gate(), *parts, gate()]
  if ft.get("prune_sparsity", 0.0) or ft.get("prune_heads", 0.0):
    parts.append(prune.keep_zeros())   # last: the pruned entries' final updates are 0
  return optax.chain(*parts), schedule
