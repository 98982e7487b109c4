"""Pre-training heads, separate from the encoder and chosen by the objective."""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax.numpy as jnp

from bertfam_jax.models import encoder, layers


def gather_positions(x_BLD, positions_BP):
  """[batch, length, hidden] at [batch, predictions] positions → [batch, predictions, hidden]."""
  return jnp.take_along_axis(x_BLD, positions_BP[..., None], axis=1)


class MLMHead(nn.Module):
  """BERT's cls/predictions (run_pretraining.py get_masked_lm_output): gather the masked positions,
  dense H→H + activation + LayerNorm, then logits = h·Eᵀ + b with E the tied input embedding and
  b a separate zero-initialised output bias. Only the gathered positions are projected.
  With ALBERT's factorised embedding the transform is H→embedding_size and the LayerNorm acts in
  that width, so h meets the narrow table (albert run_pretraining.py get_masked_lm_output)."""
  config: Any  # the `config.model` section

  @nn.compact
  def __call__(self, x_BLD, positions_BP, attend: Callable):
    """x: [batch, length, hidden]; positions: [batch, predictions]; attend: [..., E] → [..., vocab].

    Returns logits [batch, predictions, vocab] in the compute dtype."""
    c = self.config
    dtype = jnp.dtype(c.dtype)
    width, axis = encoder.tied_head_features(c)
    h_BPD = gather_positions(x_BLD, positions_BP)
    h_BPE = nn.Dense(width, dtype=dtype, param_dtype=jnp.float32,
                     kernel_init=layers.param_init(c.initializer_range, ("embed", axis)),
                     bias_init=layers.zeros_init((axis,)), name="transform")(h_BPD)
    h_BPE = layers.activation_fn(c.activation)(h_BPE)
    h_BPE = layers.LayerNorm(c.layer_norm_eps, dtype, axis_name=axis, name="transform_ln")(h_BPE)
    bias = self.param("output_bias", layers.zeros_init(("vocab",)), (c.vocab_size,), jnp.float32)
    return attend(h_BPE) + bias.astype(dtype)[None, None, :]


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


class SpanBoundaryHead(nn.Module):
  """SpanBERT's span boundary objective head (models/pair_bert.py BertPairTargetPredictionHead).

  y = LN(GELU(W₂ · LN(GELU(W₁ [x_{s-1}; x_{e+1}; p_i])))) with p_i a learned `position_size`
  embedding of the target's offset in its span (`max_targets` rows), W₁: 2H + position_size → H,
  W₂: H → H (→ E with ALBERT's factorised embedding, to meet the tied table); logits = y·Eᵀ + b
  with E the tied word embeddings and b a separate zero-initialised bias.
  """
  config: Any  # the `config.model` section
  max_targets: int = 15
  position_size: int = 200

  @nn.compact
  def __call__(self, x_BLD, boundaries_BP2, offsets_BP, attend: Callable):
    """x: [batch, length, hidden]; boundaries: [batch, predictions, 2] (s - 1, e + 1);
    offsets: [batch, predictions]. Returns logits [batch, predictions, vocab]."""
    c = self.config
    dtype = jnp.dtype(c.dtype)
    batch, predictions, _ = boundaries_BP2.shape
    ends_BPD = gather_positions(x_BLD, boundaries_BP2.reshape(batch, 2 * predictions))
    ends_BPD = ends_BPD.reshape(batch, predictions, 2 * c.hidden)
    offsets_BPO = layers.Embedding(self.max_targets, self.position_size, c.initializer_range,
                                   dtype, rows_axis="positions", features_axis=None,
                                   name="offset_embeddings")(offsets_BP)
    h = jnp.concatenate([ends_BPD, offsets_BPO.astype(ends_BPD.dtype)], axis=-1)
    width, axis = encoder.tied_head_features(c)
    for name, features, out_axis in (("transform_1", c.hidden, "embed_out"),
                                     ("transform_2", width, axis)):
      h = nn.Dense(features, dtype=dtype, param_dtype=jnp.float32,
                   kernel_init=layers.param_init(c.initializer_range, (None, out_axis)),
                   bias_init=layers.zeros_init((out_axis,)), name=name)(h)
      h = layers.activation_fn(c.activation)(h)
      h = layers.LayerNorm(c.layer_norm_eps, dtype, axis_name=out_axis, name=f"{name}_ln")(h)
    bias = self.param("output_bias", layers.zeros_init(("vocab",)), (c.vocab_size,), jnp.float32)
    return attend(h) + bias.astype(dtype)[None, None, :]


class ReplacedTokenHead(nn.Module):
  """ELECTRA's discriminator head (electra run_pretraining.py _get_discriminator_output; HF
  `discriminator_predictions`): dense H→H + activation, dense H→1, at every position.
  Returns logits [batch, length] that a token was replaced."""
  config: Any  # the `config.model` section

  @nn.compact
  def __call__(self, x_BLD):
    c = self.config
    dtype = jnp.dtype(c.dtype)
    h_BLD = nn.Dense(c.hidden, dtype=dtype, param_dtype=jnp.float32,
                     kernel_init=layers.param_init(c.initializer_range, ("embed", "embed_out")),
                     bias_init=layers.zeros_init(("embed_out",)), name="transform")(x_BLD)
    h_BLD = layers.activation_fn(c.activation)(h_BLD)
    return nn.Dense(1, dtype=dtype, param_dtype=jnp.float32,
                    kernel_init=layers.param_init(c.initializer_range, ("embed_out", None)),
                    bias_init=layers.zeros_init((None,)), name="prediction")(h_BLD)[..., 0]
