"""Q8BERT's 8-bit quantization (Zafrir et al., 2019, arXiv:1910.06188; IntelLabs nlp-architect
nlp_architect/nn/torch/quantization.py and models/transformers/quantized_bert.py).

  finetune.quantize = 'qat'  quantization-aware fine-tuning (Q8BERT): every fully connected layer
                             (Q, K, V, attention output, both FFN layers, pooler, task head) sees
                             its weights and its input fake-quantized, with straight-through
                             gradients; input ranges are exponential moving averages (decay
                             `finetune.quantize_ema_decay`, 0.9999) of max |x|, set to the first
                             batch's; embedding tables are weight-quantized. Evaluation runs the
                             integer path with the learned ranges.
  finetune.quantize = 'ptq'  the baseline: a float fine-tuning, evaluated through the integer path
                             with each input's range measured on the fly (the reference's DYNAMIC
                             mode, the paper's "DQ" rows).

Quantization is symmetric and linear, per tensor: q = clip(round(x · s), −127, 127) with
s = 127 / threshold (threshold = max |W| for weights, the EMA or the input's own max |x| for
activations); fake quantization is q / s in the forward pass and the identity in the backward
pass (`FakeLinearQuantizationWithSTE`).

The integer path (`quant='int8'`): int8 inputs and weights, products accumulated in int32 by
`lax.dot_general` / einsum with `preferred_element_type=int32`, the bias quantized to int32 at
scale s_x · s_w and added before the one dequantization (QuantizedLinear's
`inference_quantized_forward`); embeddings are int8 tables dequantized after the lookup. Its
outputs equal the fake-quantized model's up to float rounding (tested).

`Quantized` wraps any fine-tuning model without changing it: an interceptor
(`nn.intercept_methods`) replaces the `__call__` of every `nn.Dense`, `layers.HeadProjection`
and `layers.Embedding` inside it. Parameters keep their names (`nn.share_scope`); the ranges are
a collection of their own, RANGES ('input_max' per layer), which the train step updates
(`train/step.make_train_step(mutable=...)`) and checkpoints. Attention's score and context
products, LayerNorm, softmax and GELU stay in floating point, as in the reference.

Deviations: the reference's per-layer configuration file (which layers requantize their
outputs, a delayed start for the head) is not available offline; outputs are not requantized
and every layer starts at step 0.
"""

from __future__ import annotations

import functools
import flax.linen as nn
import jax
import jax.numpy as jnp

from bertfam_jax.config_lib import ConfigError
from bertfam_jax.finetune import losses as finetune_losses
from bertfam_jax.models import layers

MODES = ("", "qat", "ptq")
INPUT_KEYS = ("input_ids", "input_mask", "segment_ids")
RANGES = "quant_ranges"
BITS = 8
QMAX = 2 ** (BITS - 1) - 1   # 127: symmetric, −128 unused (calc_max_quant_value)


def scale_of(threshold):
  """127 / threshold (get_scale); a zero threshold (an all-zero tensor) gets scale 1."""
  threshold = jnp.asarray(threshold, jnp.float32)
  return QMAX / jnp.where(threshold > 0, threshold, QMAX)


def quantize(x, scale):
  """round(x · scale) clipped to [−127, 127], float32 (integer-valued)."""
  return jnp.clip(jnp.round(x.astype(jnp.float32) * scale), -QMAX, QMAX)


def fake_quantize(x, scale):
  """quantize(x) / scale forward, identity backward (straight-through), in x's dtype."""
  q = (quantize(x, scale) / scale).astype(x.dtype)
  return x + jax.lax.stop_gradient(q - x)


def dynamic_scale(x):
  """The scale of x's own max |x| (get_dynamic_scale; no gradient)."""
  return scale_of(jnp.max(jnp.abs(jax.lax.stop_gradient(x).astype(jnp.float32))))


# ------------------------------------------------------------------------------ the interceptor


def _contraction(module):
  """`fn(x, kernel, **dot_kwargs)` of a dense layer: the last axis of x against the kernel's
  first (nn.Dense), or the projection's own einsum (HeadProjection)."""
  if isinstance(module, layers.HeadProjection):
    return lambda x, k, **kw: jnp.einsum(module.equation, x, k, **kw)
  return lambda x, k, **kw: jax.lax.dot_general(x, k, (((x.ndim - 1,), (0,)), ((), ())), **kw)


def _input_scale(module, x, *, training: bool, dynamic: bool, decay: float):
  """The input's scale: its own max (dynamic, or before any range is known), or the EMA range,
  updated first when training with RANGES mutable (`_update_ema`: the first batch sets it)."""
  ema = module.variable(RANGES, "input_max", lambda: jnp.zeros((), jnp.float32))
  if dynamic:
    return dynamic_scale(x)
  current = jnp.max(jnp.abs(jax.lax.stop_gradient(x).astype(jnp.float32)))
  if training and module.is_mutable_collection(RANGES):
    ema.value = jnp.where(ema.value > 0, ema.value - (1.0 - decay) * (ema.value - current),
                          current)
  return scale_of(jnp.where(ema.value > 0, ema.value, current))


def _dense(module, x, *, mode: str, training: bool, dynamic: bool, decay: float):
  """A quantized nn.Dense / HeadProjection call (module docstring)."""
  kernel = nn.meta.unbox(module.get_variable("params", "kernel"))
  bias = (nn.meta.unbox(module.get_variable("params", "bias"))
          if module.has_variable("params", "bias") else None)
  contract = _contraction(module)
  dtype = module.dtype or jnp.float32
  x_scale = _input_scale(module, x, training=training, dynamic=dynamic, decay=decay)
  w_scale = dynamic_scale(kernel)
  if mode == "fake":
    y = contract(fake_quantize(x, x_scale).astype(dtype),
                 fake_quantize(kernel, w_scale).astype(dtype))
    if bias is not None:
      y = y + bias.astype(dtype).reshape((1,) * (y.ndim - bias.ndim) + bias.shape)
    return y
  accumulated = contract(quantize(x, x_scale).astype(jnp.int8),
                         quantize(kernel, w_scale).astype(jnp.int8),
                         preferred_element_type=jnp.int32)
  bias_scale = x_scale * w_scale
  if bias is not None:   # int32 bias at scale s_x · s_w (accumulation_bits = 32)
    q_bias = jnp.round(bias.astype(jnp.float32) * bias_scale).astype(jnp.int32)
    accumulated = accumulated + q_bias.reshape((1,) * (accumulated.ndim - bias.ndim) + bias.shape)
  return (accumulated.astype(jnp.float32) / bias_scale).astype(dtype)


def _embedding(module, ids, *, mode: str):
  """A weight-quantized lookup (QuantizedEmbedding): int8 rows, dequantized."""
  table = module._table()  # pylint: disable=protected-access
  scale = dynamic_scale(table)
  if mode == "fake":
    return jnp.take(fake_quantize(table, scale), ids, axis=0)
  rows = jnp.take(quantize(table, scale).astype(jnp.int8), ids, axis=0)
  return rows.astype(jnp.float32) / scale


def interceptor(next_fun, args, kwargs, context, *, mode: str, training: bool, dynamic: bool,
                decay: float):
  """Replaces the `__call__` of the dense layers and embedding tables (module docstring); during
  `init` it only creates their ranges and calls through."""
  module = context.module
  dense = isinstance(module, (nn.Dense, layers.HeadProjection))
  if context.method_name != "__call__" or not (dense or isinstance(module, layers.Embedding)):
    return next_fun(*args, **kwargs)
  if module.is_initializing():
    if dense:
      module.variable(RANGES, "input_max", lambda: jnp.zeros((), jnp.float32))
    return next_fun(*args, **kwargs)
  if not dense:
    return _embedding(module, args[0], mode=mode)
  return _dense(module, args[0], mode=mode, training=training, dynamic=dynamic, decay=decay)


class Quantized(nn.Module):
  """`inner` (a fine-tuning model) run with its dense layers and embeddings quantized; its
  parameters keep their names. `__call__(..., quant=)`: 'none' (floating point), 'fake' (QAT's
  forward; with `deterministic=False` and RANGES mutable the EMA ranges update) or 'int8' (the
  integer path). `dynamic`: activation ranges from each input (PTQ) rather than the EMA."""
  inner: nn.Module
  dynamic: bool = False
  ema_decay: float = 0.9999

  def setup(self):
    nn.share_scope(self, self.inner)

  def __call__(self, *args, deterministic: bool, quant: str = "none", **kwargs):
    if self.is_initializing():
      quant = "fake"   # create every range
    if quant == "none":
      return self.inner(*args, deterministic=deterministic, **kwargs)
    if quant not in ("fake", "int8"):
      raise ValueError(f"quant={quant!r}; choose none, fake or int8.")
    intercept = functools.partial(interceptor, mode=quant, training=not deterministic,
                                  dynamic=self.dynamic, decay=self.ema_decay)
    with nn.intercept_methods(intercept):
      return self.inner(*args, deterministic=deterministic, **kwargs)


# --------------------------------------------------------------------------- the fine-tuning run


def check(config, backbone: str) -> None:
  """ConfigError for a `finetune.quantize` setting that cannot run (a resolved fine-tuning
  config)."""
  ft, m = config.finetune, config.model
  if ft.quantize not in MODES:
    raise ConfigError(f"finetune.quantize={ft.quantize!r}; choose one of {MODES} ('' = off).")
  if not 0 < ft.quantize_ema_decay < 1:
    raise ConfigError(f"finetune.quantize_ema_decay={ft.quantize_ema_decay} must be in (0, 1) "
                      f"(Q8BERT: 0.9999).")
  if ft.quantize and backbone != "encoder":
    raise ConfigError(f"finetune.quantize={ft.quantize!r} quantizes BERT-family encoders; this "
                      f"init is a {backbone} backbone.")
  if not ft.quantize:
    return
  if ft.get("teacher"):
    raise ConfigError("finetune.quantize and finetune.teacher (distillation) are not combined; "
                      "distil first, then quantize the distilled workdir.")
  if m.get("scan_layers") or m.get("share_layers", "none") != "none":
    raise ConfigError(f"finetune.quantize keeps one activation range per layer, so it needs "
                      f"layers of their own, unscanned; this init has scan_layers="
                      f"{m.get('scan_layers')} and share_layers={m.get('share_layers')!r}.")
  if ft.quantize == "qat" and config.train.grad_accum_steps != 1:
    raise ConfigError(f"finetune.quantize='qat' updates its ranges every step; set "
                      f"--config.train.grad_accum_steps=1 (got {config.train.grad_accum_steps}).")


def wrap(model, ft) -> Quantized:
  return Quantized(model, dynamic=ft.quantize == "ptq", ema_decay=ft.quantize_ema_decay)


def qat_loss_fn(kind: str):
  """The task's loss (finetune/losses.py) of the `Quantized` model's fake-quantized forward; when
  training, (loss, metrics, {RANGES: the updated ranges}) for make_train_step(mutable=(RANGES,))."""

  def loss_fn(model, params, batch, rng, config, *, deterministic=False):
    del config
    inputs = [batch[k] for k in INPUT_KEYS]
    if deterministic:
      outputs = model.apply(params, *inputs, deterministic=True, quant="fake")
      return finetune_losses.task_loss(kind, outputs, batch)
    outputs, updates = model.apply(params, *inputs, deterministic=False, quant="fake",
                                   rngs={"dropout": rng}, mutable=[RANGES])
    loss, metrics = finetune_losses.task_loss(kind, outputs, batch)
    return loss, metrics, updates

  return loss_fn
