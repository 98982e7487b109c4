"""Pre-training heads, separate from the encoder and chosen by the objective."""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax.numpy as jnp

from bertfam_jax.models import layers


def gather_positions(x_BLD, positions_BP):
  """[batch, length, hidden] at [batch, predictions] positions → [batch, predictions, hidden]."""
  return jnp.take_along_axis(x_BLD, positions_BP[..., None], axis=1)


class MLMHead(nn.Module):
  """BERT's cls/predictions (run_pretraining.py get_masked_lm_output): gather the masked positions,
  dense H→H + activation + LayerNorm, then logits = h·Eᵀ + b with E the tied input embedding and
  b a separate zero-initialised output bias. Only the gathered positions are projected."""
  config: Any  # the `config.model` section

  @nn.compact
  def __call__(self, x_BLD, positions_BP, attend: Callable):
    """Returns logits [batch, predictions, vocab] in the compute dtype."""
    c = self.config
    dtype = jnp.dtype(c.dtype)
    h_BPD = gather_positions(x_BLD, positions_BP)
    h_BPD = nn.Dense(c.hidden, dtype=dtype, param_dtype=jnp.float32,
                     kernel_init=layers.param_init(c.initializer_range, ("embed", "embed_out")),
                     bias_init=layers.zeros_init(("embed_out",)), name="transform")(h_BPD)
    h_BPD = layers.activation_fn(c.activation)(h_BPD)
    h_BPD = layers.LayerNorm(c.layer_norm_eps, dtype, axis_name="embed_out", name="transform_ln")(
        h_BPD)
    bias = self.param("output_bias", layers.zeros_init(("vocab",)), (c.vocab_size,), jnp.float32)
    return attend(h_BPD) + bias.astype(dtype)[None, None, :]


class SentenceHead(nn.Module):
  """Pooler (tanh dense on the first token, BERT's `pooler`) + a `num_classes` classifier (NSP, SOP).
  Returns logits [batch, num_classes]."""
  config: Any  # the `config.model` section
  num_classes: int = 2

  @nn.compact
  def __call__(self, x_BLD):
    c = self.config
    dtype = jnp.dtype(c.dtype)
    pooled_BD = nn.tanh(nn.Dense(
        c.hidden, dtype=dtype, param_dtype=jnp.float32,
        kernel_init=layers.param_init(c.initializer_range, ("embed", "embed_out")),
        bias_init=layers.zeros_init(("embed_out",)), name="pooler")(x_BLD[:, 0]))
    return nn.Dense(self.num_classes, dtype=dtype, param_dtype=jnp.float32,
                    kernel_init=layers.param_init(c.initializer_range, ("embed_out", None)),
                    bias_init=layers.zeros_init((None,)), name="classifier")(pooled_BD)
