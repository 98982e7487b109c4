"""The papers' optimizers and learning-rate schedules, built from optax pieces.

BERT (bert/optimization.py AdamWeightDecayOptimizer): clip global norm 1.0 → Adam moments *without*
bias correction → `u += wd·θ` for every parameter except LayerNorm and biases → `θ -= lr·u`.
fairseq (fairseq/optim/adam.py, RoBERTa): bias-corrected Adam, decoupled decay `θ -= lr·wd·θ` on
*every* parameter, no clipping in the RoBERTa recipe.
ALBERT's LAMB (albert/lamb_optimizer.py LAMBOptimizer, built by albert/optimization.py
create_optimizer): BERT's update `u = m / (sqrt(v) + eps) + wd·θ` (no bias correction), then
`θ -= lr·r·u` with the trust ratio r = ‖θ‖/‖u‖ (1 where either norm is 0); LayerNorm and biases
get neither decay nor trust ratio (exclude_from_layer_adaptation defaults to the decay exclusions).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from bertfam_jax.config_lib import OPTIMIZERS, ConfigError


class ScaleByAdamState(NamedTuple):
  count: jax.Array
  mu: optax.Updates
  nu: optax.Updates


def scale_by_adam(b1: float, b2: float, eps: float, bias_correction: bool,
                  weight_decay: float = 0.0, decay_mask=None) -> optax.GradientTransformation:
  """Adam's m / (sqrt(v) + eps), with fairseq's bias correction optional (BERT/ELECTRA have none).

  weight_decay > 0: GPT's decay inside the step, scale · (m / (sqrt(v) + eps) + wd · θ) on the
  leaves where `decay_mask(params)` is True (None: every leaf), so that the decay takes the bias
  correction too (finetune-transformer-lm opt.py `adam`: p − lrt · (m / (√v + e) + l2 · p), lrt
  holding √(1 − β2^t) / (1 − β1^t)); otherwise decay is `optax.add_decayed_weights` after it."""

  def init_fn(params):
    zeros = lambda p: jnp.zeros_like(p, dtype=jnp.float32)  # noqa: E731
    return ScaleByAdamState(jnp.zeros([], jnp.int32), jax.tree.map(zeros, params),
                            jax.tree.map(zeros, params))

  def update_fn(updates, state, params=None):
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g), state.nu, updates)
    count = state.count + 1
    if bias_correction:
      # fairseq/optim/adam.py: step_size = lr·sqrt(1 − β2^t)/(1 − β1^t) and denom = sqrt(v) + eps on
      # the uncorrected v (eps is not rescaled as in optax/PyTorch's m̂ / (sqrt(v̂) + eps)).
      t = count.astype(jnp.float32)
      scale = jnp.sqrt(1 - b2**t) / (1 - b1**t)
    else:
      scale = 1.0
    if weight_decay <= 0:   # scale · m / (...) in this order: the float32 bits of the runs before
      new_updates = jax.tree.map(lambda m, v: scale * m / (jnp.sqrt(v) + eps), mu, nu)
      return new_updates, ScaleByAdamState(count, mu, nu)
    decays = (jax.tree.map(lambda _: True, params) if decay_mask is None
              else decay_mask(params))
    new_updates = jax.tree.map(
        lambda m, v, p, d: scale * (m / (jnp.sqrt(v) + eps) + (weight_decay * p if d else 0.0)),
        mu, nu, params, decays)
    return new_updates, ScaleByAdamState(count, mu, nu)

  return optax.GradientTransformation(init_fn, update_fn)


def clip_each_by_norm(max_norm: float) -> optax.GradientTransformation:
  """Each gradient leaf scaled to Euclidean norm at most `max_norm` on its own (pytorch-
  pretrained-bert's BertAdam, TinyBERT's: `clip_grad_norm_(p, max_grad_norm)` per parameter
  inside the update loop), g · max_norm / max(‖g‖, max_norm): torch's max_norm / (‖g‖ + 1e-6)
  but for that ε."""

  def update_fn(updates, state, params=None):
    del params
    clip = lambda g: g * (max_norm / jnp.maximum(jnp.linalg.norm(g), max_norm))  # noqa: E731
    return jax.tree.map(clip, updates), state

  return optax.GradientTransformation(lambda _: optax.EmptyState(), update_fn)


def learning_rate_schedule(o, total_steps: int) -> optax.Schedule:
  """`o` is `config.optimizer`; the step is the 0-based index of the update being computed.

  linear_from_zero (BERT/ALBERT): step < W: lr·step/W; else lr·(1 − step/T) (the decay counts
    from step 0, so the rate drops slightly at W, as polynomial_decay + warmup in optimization.py).
  linear_after_warmup (fairseq polynomial_decay; XLNet model_utils.py with decay_method=poly):
    lr·max(step, 1)/W during warmup (fairseq starts at lr/W, XLNet at 0: the two differ in the
    first update only), then linear from lr at W to end_lr at T.
  end_lr is `optimizer.end_lr`, or, where `optimizer.min_lr_ratio` is set (XLNet's 0.001), that
  fraction of lr, so that it follows an overridden peak.
  warmup_times_linear (ELECTRA model/optimization.py): lr·(1 − step/T) × min(1, step/W), the
    warmup factor multiplying the decay (so the peak, just below lr, is reached at W).
  rsqrt (T5: t5x `constant * rsqrt_decay`, the paper's 1/sqrt(max(n, k))): lr·sqrt(W / max(step,
    W)), constant lr for the first W steps (no ramp), then inverse square root; T5's 0.01 at
    W = 10^4 is 1/sqrt(10^4).
  constant: lr (T5 fine-tuning, 0.001).
  warmup_cosine (GPT: finetune-transformer-lm opt.py `warmup_cosine`, the paper's "increased
    linearly from zero over the first 2000 updates and annealed to 0 using a cosine schedule"):
    lr·step/W for step <= W (lr itself at W, as `x <= warmup` there), then lr·½(1 + cos(π·step/T)),
    the cosine over the whole run as in that code (so it resumes just below lr after W), to 0
    whatever end_lr says.
  slanted_triangular (ULMFiT, Howard & Ruder 2018 eq. 3; fastai v0.7 `CircularLR`): cut =
    ⌊T·cut_frac⌋; p = step/cut before it, else 1 − (step − cut)/(T − cut);
    lr·(1 + p·(ratio − 1))/ratio, from lr/ratio up to lr at cut and back down to lr/ratio at T
    (`optimizer.cut_frac` 0.1, `optimizer.ratio` 32, the paper's). Eq. 3 divides by
    cut·(1/cut_frac − 1), which is T − cut when T·cut_frac is whole and otherwise would reach
    lr/ratio before T; fastai's T − cut never does.
  """
  lr, warmup = o.peak_lr, o.warmup_steps
  end_lr = o.min_lr_ratio * lr if o.get("min_lr_ratio") else o.end_lr
  total = float(total_steps)

  def linear_from_zero(step):
    step = jnp.asarray(step, jnp.float32)
    decayed = (lr - end_lr) * (1.0 - jnp.minimum(step, total) / total) + end_lr
    warm = lr * step / max(warmup, 1)
    return jnp.where(step < warmup, warm, decayed)

  def linear_after_warmup(step):
    step = jnp.asarray(step, jnp.float32)
    warm = lr * jnp.maximum(step, 1.0) / max(warmup, 1)
    remaining = 1.0 - (jnp.minimum(step, total) - warmup) / max(total - warmup, 1.0)
    return jnp.where(step < warmup, warm, (lr - end_lr) * remaining + end_lr)

  def warmup_times_linear(step):
    step = jnp.asarray(step, jnp.float32)
    decayed = (lr - end_lr) * (1.0 - jnp.minimum(step, total) / total) + end_lr
    return decayed * jnp.minimum(1.0, step / max(warmup, 1))

  def rsqrt(step):
    step = jnp.asarray(step, jnp.float32)
    return lr * jnp.sqrt(max(warmup, 1) / jnp.maximum(step, max(warmup, 1)))

  def constant(step):
    return jnp.full(jnp.shape(step), lr, jnp.float32)

  def warmup_cosine(step):
    step = jnp.asarray(step, jnp.float32)
    cosine = 0.5 * lr * (1.0 + jnp.cos(jnp.pi * jnp.minimum(step, total) / total))
    if not warmup:
      return cosine
    return jnp.where(step <= warmup, lr * step / warmup, cosine)   # opt.py's x <= warmup

  def slanted_triangular(step):
    step = jnp.minimum(jnp.asarray(step, jnp.float32), total)
    cut_frac, ratio = o.cut_frac, o.ratio
    cut = max(int(total * cut_frac), 1)
    p = jnp.where(step < cut, step / cut, 1.0 - (step - cut) / max(total - cut, 1.0))
    return lr * (1.0 + p * (ratio - 1.0)) / ratio

  schedules = {"linear_from_zero": linear_from_zero, "linear_after_warmup": linear_after_warmup,
               "warmup_times_linear": warmup_times_linear, "rsqrt": rsqrt, "constant": constant,
               "slanted_triangular": slanted_triangular, "warmup_cosine": warmup_cosine}
  if o.schedule not in schedules:
    raise ConfigError(f"optimizer.schedule={o.schedule!r}; choose one of {sorted(schedules)}.")
  return schedules[o.schedule]


# XLNet's AdamWeightDecayOptimizer (xlnet/model_utils.py) decays these despite their name:
# `include_in_weight_decay` is checked before `exclude_from_weight_decay`.
DECAYED_BIASES = ("r_w_bias", "r_r_bias", "r_s_bias")


def decay_mask(params):
  """True where weight decay applies: everything except biases and LayerNorm parameters (BERT's
  exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"]), XLNet's relative-attention
  biases (DECAYED_BIASES) included."""

  def decays(path, _):
    names = [getattr(k, "key", str(k)) for k in path]
    return names[-1] in DECAYED_BIASES or not ("bias" in names[-1] or "norm" in names)

  return jax.tree_util.tree_map_with_path(decays, params)


def stacked_mask(params):
  """True for the parameters of a scanned layer stack (the encoder's `layers` module with
  scan_layers=True), whose leading axis indexes the layer."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: "layers" in [getattr(k, "key", str(k)) for k in path], params)


def scale_by_trust_ratio(adapt_mask) -> optax.GradientTransformation:
  """LAMB's layer adaptation (albert/lamb_optimizer.py): u ← u·‖θ‖/‖u‖ with Euclidean norms over
  the whole parameter (over each layer's slice of a scanned stack, so that scanning does not change
  the update), and ratio 1 where either norm is 0. Leaves where `adapt_mask(params)` is False pass
  unchanged; `adapt_mask=None` adapts every leaf."""

  def update_fn(updates, state, params):
    adapt = adapt_mask(params) if adapt_mask else jax.tree.map(lambda _: True, params)

    def scale(u, p, adapted, stacked):
      if not adapted:
        return u
      axes = tuple(range(1 if stacked else 0, u.ndim))
      norm = lambda x: jnp.sqrt(jnp.sum(jnp.square(x), axis=axes, keepdims=True))  # noqa: E731
      w_norm, u_norm = norm(p), norm(u)
      return u * jnp.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, 1.0).astype(u.dtype)

    return jax.tree.map(scale, updates, params, adapt, stacked_mask(params)), state

  return optax.GradientTransformation(lambda _: optax.EmptyState(), update_fn)


# t5x's standard_logical_factor_rules (t5x/adafactor.py): how each logical axis of a parameter
# takes part in Adafactor's factored second moment. ROW and COLUMN axes are averaged into the two
# factors; a BATCH axis (the layers of a scanned stack) is neither averaged nor factored, so that
# each layer gets its own moments, update clipping and parameter scale, as unrolled layers do.
ROW, COLUMN, BATCH = "row", "column", "batch"
FACTOR_RULES = {
    "vocab": COLUMN, "embed": ROW, "mlp": COLUMN, "heads": COLUMN, "kv": COLUMN,
    "joined_kv": COLUMN, "relpos_buckets": None, "layers": BATCH, "stack": BATCH,
    "layer_norm_scale": None, "mlp_activations": COLUMN,
}


class AdafactorState(NamedTuple):
  """t5x's per-parameter state (no momentum): the factored row and column moments where a
  parameter is factored, else its full second moment; [1]-shaped placeholders for the others."""
  count: jax.Array
  v_row: optax.Updates
  v_col: optax.Updates
  v: optax.Updates


def _factoring(shape, names, min_dim_size_to_factor: int):
  """(averaging axes, (row axes, column axes) or None) of one parameter, as t5x's `_parse_rule`
  with the standard rules does for the parameter as t5x stores it. t5x keeps attention kernels
  2-D ([embed, heads·kv], DenseGeneral's flattened kernel), and factors a parameter of rank <= 2
  without a layer axis by its heuristic: its two largest axes, when the smaller is >=
  min_dim_size_to_factor. Ours are [embed, heads, kv]: the same heuristic on the [embed,
  heads·kv] view (row axes against column axes). A scanned stack's layer axis is a batch axis,
  and t5x then factors by the names alone, whatever the sizes; averaging (update clipping,
  parameter scale) is over every axis but the layers."""
  ndim = len(shape)
  if names is None:
    if ndim > 2:
      raise ValueError(f"A parameter of shape {shape} needs its logical axis names to be factored "
                       f"as t5x does (make_optimizer(config, param_axes)).")
    names = (None,) * ndim
  rule = [FACTOR_RULES.get(name) for name in names]
  batch = tuple(i for i, r in enumerate(rule) if r == BATCH)
  averaging = tuple(i for i in range(ndim) if i not in batch)
  if ndim <= 2 and not batch:    # t5x's fallback to its heuristic
    if ndim < 2:
      return averaging, None
    by_size = sorted(range(ndim), key=lambda i: (shape[i], i))   # np.argsort's stable order
    if shape[by_size[-2]] < min_dim_size_to_factor:
      return averaging, None
    return averaging, ((by_size[-2],), (by_size[-1],))
  rows = tuple(i for i, r in enumerate(rule) if r == ROW)
  columns = tuple(i for i, r in enumerate(rule) if r == COLUMN)
  if not batch:   # a 3-D attention kernel: t5x's heuristic on its 2-D view
    view = [math.prod(shape[i] for i in axes) for axes in (rows, columns)]
    if not rows or not columns or min(view) < min_dim_size_to_factor:
      return averaging, None
  return averaging, (None if (rows, columns) == ((), ()) else (rows, columns))


def scale_by_t5x_adafactor(learning_rate: optax.ScalarOrSchedule, param_axes=None, *,
                           decay_rate: float = 0.8, clipping_threshold: float | None = 1.0,
                           multiply_by_parameter_scale: bool = True,
                           weight_decay_rate: float | None = None,
                           min_dim_size_to_factor: int = 128, epsilon1: float = 1e-30,
                           epsilon2: float = 1e-3) -> optax.GradientTransformation:
  """t5x's Adafactor (t5x/adafactor.py `apply_param_gradient`, beta1=None, the defaults of
  T5's gin files) as an optax transformation whose updates are `new_param − param`.

  `param_axes`: the parameters' logical axis names (`step.param_axes`), a tree of tuples (None
  where a parameter has none), from which each parameter's factoring follows (`_factoring`).
  Per parameter, with t = step + 1 and β = 1 − t^−decay_rate:
    V ← β·V + (1 − β)·(g² + ε1), factored as row and column means where the rules say so;
    y = g / sqrt(V̂), V̂ = V_row·V_col / mean(V_row) when factored;
    y ← y / max(1, rms(y) / clipping_threshold), rms over the averaging axes (not the layers);
    update = −lr·max(rms(θ), ε2)·y (the parameter scale per layer too), − wd·θ when set.
  """
  lr_schedule = learning_rate if callable(learning_rate) else (lambda _: learning_rate)

  def factorings(params) -> list:
    """Each parameter's `_factoring`, in the order of the tree's leaves."""
    treedef = jax.tree.structure(params)
    axes = ([None] * treedef.num_leaves if param_axes is None
            else treedef.flatten_up_to(param_axes))   # a tuple of names, or None, per leaf
    return [_factoring(p.shape, names, min_dim_size_to_factor)
            for p, names in zip(treedef.flatten_up_to(params), axes)]

  def init_fn(params):
    placeholder = jnp.zeros((1,), jnp.float32)

    def moments(p, rule):
      _, factored = rule
      if factored is None:
        return placeholder, placeholder, jnp.zeros(p.shape, jnp.float32)
      rows, columns = factored
      row_shape = [d for i, d in enumerate(p.shape) if i not in columns]
      column_shape = [d for i, d in enumerate(p.shape) if i not in rows]
      return jnp.zeros(row_shape, jnp.float32), jnp.zeros(column_shape, jnp.float32), placeholder

    treedef = jax.tree.structure(params)
    out = [moments(p, rule) for p, rule in zip(treedef.flatten_up_to(params), factorings(params))]
    return AdafactorState(jnp.zeros([], jnp.int32),
                          *(treedef.unflatten(list(x)) for x in zip(*out)))

  def update_fn(grads, state, params):
    count = state.count
    t = count.astype(jnp.float32) + 1.0
    decay = 1.0 - t ** (-decay_rate)
    lr = lr_schedule(count)
    treedef = jax.tree.structure(params)
    rules = factorings(params)
    leaves = [treedef.flatten_up_to(tree) for tree in (grads, params, state.v_row, state.v_col,
                                                       state.v)]
    out = [_adafactor_leaf(g, p, v_row, v_col, v, rule, decay, lr, clipping_threshold,
                           multiply_by_parameter_scale, weight_decay_rate, epsilon1, epsilon2)
           for (g, p, v_row, v_col, v), rule in zip(zip(*leaves), rules)]
    updates, v_rows, v_cols, vs = (treedef.unflatten(list(x)) for x in zip(*out))
    return updates, AdafactorState(count + 1, v_rows, v_cols, vs)

  return optax.GradientTransformation(init_fn, update_fn)


def _adafactor_leaf(grad, param, v_row, v_col, v, rule, decay, lr, clipping_threshold,
                    multiply_by_parameter_scale, weight_decay_rate, epsilon1, epsilon2):
  """One parameter's update and moments (`scale_by_t5x_adafactor`)."""
  averaging, factored = rule
  grad = grad.astype(jnp.float32)
  grad_sqr = grad * grad + epsilon1
  if factored is not None:
    rows, columns = factored
    v_row = decay * v_row + (1.0 - decay) * jnp.mean(grad_sqr, axis=columns)
    v_col = decay * v_col + (1.0 - decay) * jnp.mean(grad_sqr, axis=rows)
    reduced_rows = tuple(d - sum(c < d for c in columns) for d in rows)
    row_factor = (v_row / jnp.mean(v_row, axis=reduced_rows, keepdims=True)) ** -0.5
    y = grad * jnp.expand_dims(row_factor, columns) * jnp.expand_dims(v_col ** -0.5, rows)
  else:
    v = decay * v + (1.0 - decay) * grad_sqr
    y = grad * v ** -0.5
  if clipping_threshold is not None:
    rms = jnp.sqrt(jnp.mean(y * y, axis=averaging, keepdims=True))
    y = y / jnp.maximum(1.0, rms / clipping_threshold)
  scale = lr
  if multiply_by_parameter_scale:
    scale = scale * jnp.maximum(
        jnp.sqrt(jnp.mean(param * param, axis=averaging, keepdims=True)), epsilon2)
  update = -scale * y
  if weight_decay_rate:
    update = update - weight_decay_rate * param
  return update.astype(param.dtype), v_row, v_col, v


def adafactor_transform(o, schedule, param_axes=None) -> optax.GradientTransformation:
  """T5's Adafactor (`scale_by_t5x_adafactor`: t5x's, factored by the parameters' logical axes;
  decay rate 0.8, update clipping at RMS `clipping_threshold` (1.0), no momentum, updates scaled
  by the parameter's RMS (floored at 1e-3) when `multiply_by_parameter_scale`); optional
  global-norm clipping first. `o.weight_decay`, as t5x's weight_decay_rate, is not scaled by the
  learning rate."""
  parts = [optax.clip_by_global_norm(o.clip_norm)] if o.clip_norm > 0 else []
  parts.append(scale_by_t5x_adafactor(
      schedule, param_axes, decay_rate=o.decay_rate, clipping_threshold=o.clipping_threshold,
      multiply_by_parameter_scale=o.multiply_by_parameter_scale,
      weight_decay_rate=o.weight_decay or None))
  return optax.chain(*parts)


def make_optimizer(config, param_axes=None) -> tuple[optax.GradientTransformation,
                                                      optax.Schedule]:
  """Returns (transformation, schedule) for `config.optimizer` over `config.train.total_steps`.
  `param_axes`: the parameters' logical axis names (`step.param_axes`), which Adafactor factors
  by (t5x's rules); the other optimizers ignore them.

  name 'adamw': BERT's or fairseq's Adam (bias_correction / decay_norm_and_bias select which);
  'lamb': the same moments and decay followed by LAMB's trust ratio, which skips the same
  parameters as the decay; 'adafactor': T5's Adafactor (`adafactor_transform`); 'adagrad': TF's
  Adagrad (ELMo's bilm-tf): the gradient times `gradient_scale`, clipped, then a ← a + g²,
  θ ← θ − lr·g/√a, every a starting at `initial_accumulator` (TF's 0.1 unless set), no ε
  (optax's scale_by_rss with eps 0), no weight decay.
  """
  o = config.optimizer
  if o.name not in OPTIMIZERS:
    raise ConfigError(f"optimizer.name={o.name!r} is not available; use 'adamw' (with "
                      "bias_correction / decay_norm_and_bias selecting BERT's or fairseq's "
                      "variant), 'lamb' (ALBERT), 'adafactor' (T5) or 'adagrad' (ELMo).")
  schedule = learning_rate_schedule(o, config.train.total_steps)
  if o.name == "adafactor":
    return adafactor_transform(o, schedule, param_axes), schedule
  if o.name == "adagrad":
    if o.get("weight_decay", 0.0) > 0:
      raise ConfigError(f"optimizer.name='adagrad' has no weight decay (TF's Adagrad, bilm-tf's); "
                        f"set --config.optimizer.weight_decay=0 (it is {o.weight_decay}).")
    parts = [optax.scale(o.get("gradient_scale", 1.0))]
    if o.clip_norm > 0:
      parts.append(optax.clip_by_global_norm(o.clip_norm))
    parts += [optax.scale_by_rss(o.get("initial_accumulator", 0.1), eps=0.0),
              optax.scale_by_learning_rate(schedule)]
    return optax.chain(*parts), schedule
  decays = None if o.decay_norm_and_bias else decay_mask  # leaves with decay (and trust ratio)
  parts = []
  if o.clip_norm > 0:
    parts.append(clip_each_by_norm(o.clip_norm) if o.get("clip_per_tensor", False)
                 else optax.clip_by_global_norm(o.clip_norm))
  if o.get("decay_bias_corrected", False):   # GPT's opt.py: the decay inside the step
    parts.append(scale_by_adam(o.b1, o.b2, o.eps, o.bias_correction, o.weight_decay, decays))
    if o.weight_decay > 0:   # the decay's slot kept at 0, so the state's layout is the same
      parts.append(optax.add_decayed_weights(0.0, mask=decays))
  else:
    parts.append(scale_by_adam(o.b1, o.b2, o.eps, o.bias_correction))
    if o.weight_decay > 0:
      parts.append(optax.add_decayed_weights(o.weight_decay, mask=decays))
  if o.name == "lamb":
    parts.append(scale_by_trust_ratio(decays))
  parts.append(optax.scale_by_learning_rate(schedule))
  return optax.chain(*parts), schedule
