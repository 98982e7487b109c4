"""The Transformer encoder of the BERT family (post-LN, as google-research/bert modeling.py).

One module serves BERT, RoBERTa and, through config fields, the later members (ALBERT's factorised
embedding and sharing, ELECTRA's sizes, SpanBERT): composition, not subclasses.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertfam_jax.models import layers

REMAT_POLICIES = {
    "full": None,  # save nothing: recompute the whole layer in the backward pass
    "dots": jax.checkpoint_policies.dots_saveable,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


class TransformerLayer(nn.Module):
  """x = LN(x + Drop(Attn(x))); x = LN(x + Drop(MLP(x)))  (post-LN, BERT)."""
  config: Any  # the `config.model` section

  @nn.compact
  def __call__(self, x_BLD, mask_B11L, deterministic: bool):
    c = self.config
    dtype = jnp.dtype(c.dtype)
    attn = layers.SelfAttention(
        heads=c.heads, head_dim=c.hidden // c.heads, attention_dropout=c.attention_dropout,
        initializer_range=c.initializer_range, attention_impl=c.attention_impl, dtype=dtype,
        name="attention")(x_BLD, mask_B11L, deterministic=deterministic)
    attn = nn.Dropout(c.dropout)(attn, deterministic=deterministic)
    x_BLD = layers.LayerNorm(c.layer_norm_eps, dtype, name="attention_ln")(x_BLD + attn)
    x_BLD = nn.with_logical_constraint(x_BLD, ("batch", "length", "act_embed"))
    mlp = layers.MLP(c.mlp, c.activation, c.initializer_range, dtype, name="mlp")(x_BLD)
    mlp = nn.Dropout(c.dropout)(mlp, deterministic=deterministic)
    x_BLD = layers.LayerNorm(c.layer_norm_eps, dtype, name="output_ln")(x_BLD + mlp)
    return nn.with_logical_constraint(x_BLD, ("batch", "length", "act_embed"))


class ScannedLayer(TransformerLayer):
  """TransformerLayer with the (carry, x) → (carry, y) signature `nn.scan` needs."""

  def __call__(self, x_BLD, mask_B11L, deterministic: bool):
    return super().__call__(x_BLD, mask_B11L, deterministic), None


class Encoder(nn.Module):
  """Embeddings + `layers` Transformer layers.

  `__call__(input_ids [batch, length], input_mask [batch, length], segment_ids [batch, length])`
  returns hidden states [batch, length, hidden]. `attend(h [..., hidden])` projects onto the
  word-embedding table ([..., vocab]) for heads tied to the input embedding.
  """
  config: Any  # the `config.model` section

  def setup(self):
    c = self.config
    self.word_embeddings = layers.Embedding(c.vocab_size, c.hidden, c.initializer_range,
                                            jnp.dtype(c.dtype))
    self.position_embeddings = layers.Embedding(c.max_positions, c.hidden, c.initializer_range,
                                                rows_axis="positions")
    if c.type_vocab_size:
      self.type_embeddings = layers.Embedding(c.type_vocab_size, c.hidden, c.initializer_range,
                                              rows_axis="types")
    self.embeddings_ln = layers.LayerNorm(c.layer_norm_eps, jnp.dtype(c.dtype))
    self.embeddings_dropout = nn.Dropout(c.dropout)
    self.layers = self._make_layers()

  def _make_layers(self):
    c = self.config
    layer_cls = TransformerLayer
    if c.remat_policy != "none":
      if c.remat_policy not in REMAT_POLICIES:
        raise ValueError(f"model.remat_policy={c.remat_policy!r}; choose none or one of "
                         f"{sorted(REMAT_POLICIES)}.")
      layer_cls = nn.remat(ScannedLayer if c.scan_layers else TransformerLayer,
                           policy=REMAT_POLICIES[c.remat_policy], static_argnums=(3,))
    elif c.scan_layers:
      layer_cls = ScannedLayer
    if c.scan_layers:
      scanned = nn.scan(layer_cls, variable_axes={"params": 0}, split_rngs={"params": True,
                                                                           "dropout": True},
                        in_axes=(nn.broadcast, nn.broadcast), length=c.layers,
                        metadata_params={nn.PARTITION_NAME: "layers"})
      return scanned(c, name="layers")
    return [layer_cls(c, name=f"layer_{i}") for i in range(c.layers)]

  def __call__(self, input_ids, input_mask, segment_ids=None, *, deterministic: bool):
    c = self.config
    dtype = jnp.dtype(c.dtype)
    length = input_ids.shape[1]
    x_BLD = self.word_embeddings(input_ids) + self.position_embeddings(jnp.arange(length))[None]
    if c.type_vocab_size:
      ids = jnp.zeros_like(input_ids) if segment_ids is None else segment_ids
      x_BLD = x_BLD + self.type_embeddings(ids)
    x_BLD = self.embeddings_dropout(self.embeddings_ln(x_BLD), deterministic=deterministic)
    x_BLD = nn.with_logical_constraint(x_BLD.astype(dtype), ("batch", "length", "act_embed"))
    mask_B11L = layers.attention_mask_from_input_mask(input_mask)
    if c.scan_layers:
      x_BLD, _ = self.layers(x_BLD, mask_B11L, deterministic)
    else:
      for layer in self.layers:
        x_BLD = layer(x_BLD, mask_B11L, deterministic)
    return x_BLD

  def attend(self, h):
    """[..., hidden] → logits over the vocabulary [..., vocab] with the tied embedding table, in the
    compute dtype (the loss upcasts to float32)."""
    return self.word_embeddings.attend(h)
