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

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from bertfam_jax.config_lib import OPTIMIZERS, ConfigError


class ScaleByAdamState(NamedTuple):
  count: jax.Array
  mu: optax.Updates
  nu: optax.Updates


def scale_by_adam(b1: float, b2: float, eps: float, bias_correction: bool
                  ) -> optax.GradientTransformation:
  """Adam's m / (sqrt(v) + eps), with fairseq's bias correction optional (BERT/ELECTRA have none)."""

  def init_fn(params):
    zeros = lambda p: jnp.zeros_like(p, dtype=jnp.float32)  # noqa: E731
    return ScaleByAdamState(jnp.zeros([], jnp.int32), jax.tree.map(zeros, params),
                            jax.tree.map(zeros, params))

  def update_fn(updates, state, params=None):
    del params
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
    new_updates = jax.tree.map(lambda m, v: scale * m / (jnp.sqrt(v) + eps), mu, nu)
    return new_updates, ScaleByAdamState(count, mu, nu)

  return optax.GradientTransformation(init_fn, update_fn)


def learning_rate_schedule(o, total_steps: int) -> optax.Schedule:
  """`o` is `config.optimizer`; the step is the 0-based index of the update being computed.

  linear_from_zero (BERT/ALBERT): step < W: lr·step/W; else lr·(1 − step/T) (the decay counts
    from step 0, so the rate drops slightly at W, as polynomial_decay + warmup in optimization.py).
  linear_after_warmup (fairseq polynomial_decay): lr·max(step, 1)/W during warmup (fairseq starts
    at lr/W), then linear from lr at W to end_lr at T.
  warmup_times_linear (ELECTRA model/optimization.py): lr·(1 − step/T) × min(1, step/W), the
    warmup factor multiplying the decay (so the peak, just below lr, is reached at W).
  rsqrt (T5: t5x `constant * rsqrt_decay`, the paper's 1/sqrt(max(n, k))): lr·sqrt(W / max(step,
    W)), constant lr for the first W steps (no ramp), then inverse square root; T5's 0.01 at
    W = 10^4 is 1/sqrt(10^4).
  constant: lr (T5 fine-tuning, 0.001).
  """
  lr, warmup, end_lr = o.peak_lr, o.warmup_steps, o.end_lr
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

  schedules = {"linear_from_zero": linear_from_zero, "linear_after_warmup": linear_after_warmup,
               "warmup_times_linear": warmup_times_linear, "rsqrt": rsqrt, "constant": constant}
  if o.schedule not in schedules:
    raise ConfigError(f"optimizer.schedule={o.schedule!r}; choose one of {sorted(schedules)}.")
  return schedules[o.schedule]


def decay_mask(params):
  """True where weight decay applies: everything except biases and LayerNorm parameters (BERT's
  exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"])."""

  def decays(path, _):
    names = [getattr(k, "key", str(k)) for k in path]
    return not ("bias" in names[-1] or "norm" in names)

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


def adafactor_transform(o, schedule) -> optax.GradientTransformation:
  """T5's Adafactor (t5x adafactor.py / mesh-tf defaults, Shazeer & Stern 2018): factored second
  moments for matrices with both dimensions >= 128, decay rate 0.8 (β2_t = 1 − t^−0.8), update
  clipping at RMS `clipping_threshold` (1.0), no momentum, updates scaled by the parameter's RMS
  (floored at 1e-3) when `multiply_by_parameter_scale`; optional global-norm clipping first."""
  parts = [optax.clip_by_global_norm(o.clip_norm)] if o.clip_norm > 0 else []
  parts.append(optax.adafactor(
      learning_rate=schedule, decay_rate=o.decay_rate, clipping_threshold=o.clipping_threshold,
      multiply_by_parameter_scale=o.multiply_by_parameter_scale, min_dim_size_to_factor=128,
      weight_decay_rate=o.weight_decay or None))
  return optax.chain(*parts)


def make_optimizer(config) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """Returns (transformation, schedule) for `config.optimizer` over `config.train.total_steps`.

  name 'adamw': BERT's or fairseq's Adam (bias_correction / decay_norm_and_bias select which);
  'lamb': the same moments and decay followed by LAMB's trust ratio, which skips the same
  parameters as the decay; 'adafactor': T5's Adafactor (`adafactor_transform`).
  """
  o = config.optimizer
  if o.name not in OPTIMIZERS:
    raise ConfigError(f"optimizer.name={o.name!r} is not available; use 'adamw' (with "
                      "bias_correction / decay_norm_and_bias selecting BERT's or fairseq's "
                      "variant), 'lamb' (ALBERT) or 'adafactor' (T5).")
  schedule = learning_rate_schedule(o, config.train.total_steps)
  if o.name == "adafactor":
    return adafactor_transform(o, schedule), schedule
  decays = None if o.decay_norm_and_bias else decay_mask  # leaves with decay (and trust ratio)
  parts = []
  if o.clip_norm > 0:
    parts.append(optax.clip_by_global_norm(o.clip_norm))
  parts.append(scale_by_adam(o.b1, o.b2, o.eps, o.bias_correction))
  if o.weight_decay > 0:
    parts.append(optax.add_decayed_weights(o.weight_decay, mask=decays))
  if o.name == "lamb":
    parts.append(scale_by_trust_ratio(decays))
  parts.append(optax.scale_by_learning_rate(schedule))
  return optax.chain(*parts), schedule
