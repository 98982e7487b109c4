"""ELMo's bidirectional language model (Peters et al., 2018, "Deep contextualized word
representations"; allenai/bilm-tf bilm/training.py `LanguageModel`, spec §8 "ELMo biLM").

  characters [batch, words, max_characters] int32
    → CharCNN: 16-dim character embeddings, one convolution per (width, filters), each max-pooled
      over the word's characters then ReLU, concatenated (2,048), 2 highway layers, a projection
      to 512: the context-free token representation x_k
    → a forward and a backward stack of 2 LSTM layers with projection (4,096 cells → 512, cell and
      projection clipped at 3), the second layer's input added to its output (skip connection)
    → one softmax over the word vocabulary, shared by both directions.

What bilm-tf does and this follows, constant by constant:
  - character ids: UTF-8 bytes 0-255, then <S> 256, </S> 257, begin-of-word 258, end-of-word 259,
    padding 260 (`UnicodeCharsVocabulary`); a word is [258, its first 48 bytes, 259, 260...].
  - init: character table U(-1, 1); convolutions U(-0.05, 0.05) with ReLU (Kim et al.), zero bias;
    highway W ~ N(0, 1/2048), carry bias -2 (the gate starts mostly carrying), transform bias 0;
    projection N(0, 1/2048); LSTM kernels Glorot-uniform (TF's default, no initializer given),
    biases 0, forget bias +1 added in the cell (TF's LSTMCell); softmax N(0, 1/512), bias 0.
  - dropout (0.1) on each LSTM layer's input at every step (`DropoutWrapper(input_keep_prob)`,
    outside the skip connection, so the skip adds the dropped input) and on the top layer's
    output before the softmax.
  - the LSTM cell: [i, j, f, o] = [x, m_prev] W + b; c = σ(f + 1) c_prev + σ(i) tanh(j), clipped;
    m = (σ(o) tanh(c)) W_proj, clipped (TF's LSTMCell with num_proj, no peepholes).

Rows here are padded windows (`input_mask`), and each direction's LSTM starts from zeros at its
row's edge: the backward stack reads each row from its last real word (`nn.RNN(seq_lengths=)`).
bilm-tf instead carries both stacks' states from one batch to the next over an endless stream.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertfam_jax.models import layers

# bilm-tf's character ids (bilm/data.py UnicodeCharsVocabulary).
BOS_CHAR, EOS_CHAR, BOW_CHAR, EOW_CHAR, PAD_CHAR = 256, 257, 258, 259, 260
NUM_CHARACTERS = 261


def normal(stddev: float):
  return nn.initializers.normal(stddev)


class CharCNN(nn.Module):
  """characters [batch, words, max_characters] int32 → token representations [batch, words,
  projection_dim] (bilm-tf `_build_word_char_embeddings`)."""
  config: Any  # the `model` section

  @nn.compact
  def __call__(self, chars_BWC):
    c = self.config
    dtype = jnp.dtype(c.dtype)
    table = self.param("char_embedding", _uniform(1.0), (NUM_CHARACTERS, c.char_embedding_dim))
    x_BWCE = jnp.take(table, chars_BWC, axis=0).astype(dtype)
    activation = layers.activation_fn(c.char_activation)
    pooled = []
    for i, (width, filters) in enumerate(c.char_filters):
      kernel_KEF = self.param(f"conv_{i}", _uniform(0.05), (width, c.char_embedding_dim, filters))
      bias_F = self.param(f"conv_{i}_bias", nn.initializers.zeros_init(), (filters,))
      pooled.append(activation(jnp.max(valid_convolution(x_BWCE, kernel_KEF.astype(dtype)),
                                       axis=-2) + bias_F.astype(dtype)[None, None]))
    h_BWF = jnp.concatenate(pooled, axis=-1)
    width = h_BWF.shape[-1]
    for i in range(c.highway_layers):
      h_BWF = Highway(width, dtype, name=f"highway_{i}")(h_BWF)
    if width != c.projection_dim:
      h_BWF = nn.Dense(c.projection_dim, dtype=dtype, param_dtype=jnp.float32,
                       kernel_init=normal(width ** -0.5), name="projection")(h_BWF)
    return h_BWF


def _uniform(limit: float):
  """U(-limit, limit) (TF's random_uniform_initializer(-limit, limit))."""
  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -limit, limit)
  return init


def valid_convolution(x_BWCE, kernel_KEF):
  """A 'VALID' 1-D convolution along the characters: x [batch, words, chars, embed] with kernel
  [width, embed, filters] → [batch, words, chars − width + 1, filters]. (The bias is added after
  the max over positions: the same maximum, as the bias is constant along them.)"""
  batch, words, chars, embed = x_BWCE.shape
  y_NSF = jax.lax.conv_general_dilated(x_BWCE.reshape(batch * words, chars, embed), kernel_KEF,
                                       (1,), "VALID", dimension_numbers=("NWC", "WIO", "NWC"))
  return y_NSF.reshape(batch, words, *y_NSF.shape[1:])


class Highway(nn.Module):
  """bilm-tf's highway layer: g = σ(x W_g + b_g) (b_g = -2), h = relu(x W_h + b_h);
  out = g·h + (1 − g)·x."""
  width: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    dense = lambda name, bias: nn.Dense(  # noqa: E731
        self.width, dtype=self.dtype, param_dtype=jnp.float32,
        kernel_init=normal(self.width ** -0.5), bias_init=nn.initializers.constant(bias),
        name=name)(x)
    gate = jax.nn.sigmoid(dense("carry", -2.0))
    return gate * jax.nn.relu(dense("transform", 0.0)) + (1.0 - gate) * x


class ProjectedLSTMCell(nn.RNNCellBase):
  """TF's LSTMCell with `num_proj`, `cell_clip` and `proj_clip` (no peepholes, forget bias 1):
  carry (c [..., cells], m [..., projection]), input x [..., features] → output m."""
  cells: int
  projection: int
  cell_clip: float
  proj_clip: float
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, carry, x):
    c_prev, m_prev = carry
    gates = nn.Dense(4 * self.cells, dtype=self.dtype, param_dtype=jnp.float32,
                     kernel_init=nn.initializers.glorot_uniform(), name="gates")(
                         jnp.concatenate([x, m_prev.astype(x.dtype)], axis=-1))
    i, j, f, o = jnp.split(gates.astype(jnp.float32), 4, axis=-1)
    c = jax.nn.sigmoid(f + 1.0) * c_prev + jax.nn.sigmoid(i) * jnp.tanh(j)
    c = jnp.clip(c, -self.cell_clip, self.cell_clip)
    m = nn.Dense(self.projection, use_bias=False, dtype=self.dtype, param_dtype=jnp.float32,
                 kernel_init=nn.initializers.glorot_uniform(), name="projection")(
                     (jax.nn.sigmoid(o) * jnp.tanh(c)).astype(self.dtype))
    m = jnp.clip(m.astype(jnp.float32), -self.proj_clip, self.proj_clip)
    return (c, m), m

  def initialize_carry(self, rng, input_shape):
    del rng
    batch = input_shape[:-1]
    return jnp.zeros(batch + (self.cells,), jnp.float32), jnp.zeros(batch + (self.projection,),
                                                                     jnp.float32)

  @property
  def num_feature_axes(self) -> int:
    return 1


class LSTMStack(nn.Module):
  """One direction's LSTM layers: x [batch, words, projection], lengths [batch] → each layer's
  output [batch, words, projection] float32 (`reverse`: read from each row's last real word)."""
  config: Any
  reverse: bool = False

  @nn.compact
  def __call__(self, x_BWP, lengths_B, *, deterministic: bool) -> list[jax.Array]:
    c = self.config
    outputs, h_BWP = [], x_BWP
    for i in range(c.lstm_layers):
      inputs_BWP = layers.Dropout(c.dropout, c.get("dropout_bits", 32))(
          h_BWP, deterministic=deterministic)
      cell = ProjectedLSTMCell(c.lstm_cells, c.projection_dim, c.cell_clip, c.proj_clip,
                               jnp.dtype(c.dtype), name=f"layer_{i}")
      out_BWP = nn.RNN(cell, reverse=self.reverse, keep_order=True)(
          inputs_BWP, seq_lengths=lengths_B)
      if c.skip_connections and i > 0:
        out_BWP = out_BWP + inputs_BWP.astype(out_BWP.dtype)
      outputs.append(out_BWP)
      h_BWP = out_BWP
    return outputs


class BiLM(nn.Module):
  """characters [batch, words, max_characters], input_mask [batch, words] →
  {'token': [batch, words, P], 'forward' / 'backward': each layer's [batch, words, P]} (P =
  projection_dim; float32); `logits(h)` is the shared softmax's [..., vocab]."""
  config: Any

  def setup(self):
    c = self.config
    self.token_encoder = CharCNN(c)
    self.forward_lm = LSTMStack(c, reverse=False)
    self.backward_lm = LSTMStack(c, reverse=True)
    self.output_dropout = layers.Dropout(c.dropout, c.get("dropout_bits", 32))
    self.softmax_kernel = self.param("softmax_kernel", normal(c.projection_dim ** -0.5),
                                     (c.vocab_size, c.projection_dim))
    self.softmax_bias = self.param("softmax_bias", nn.initializers.zeros_init(), (c.vocab_size,))

  def __call__(self, chars_BWC, input_mask_BW, *, deterministic: bool = True):
    token_BWP = self.token_encoder(chars_BWC).astype(jnp.float32)
    lengths_B = jnp.sum(input_mask_BW, axis=-1, dtype=jnp.int32)
    return dict(token=token_BWP,
                forward=self.forward_lm(token_BWP, lengths_B, deterministic=deterministic),
                backward=self.backward_lm(token_BWP, lengths_B, deterministic=deterministic))

  def top(self, outputs, direction: str, *, deterministic: bool = True):
    """The top layer of `direction` ('forward' / 'backward') after the output dropout:
    [batch, words, P]."""
    return self.output_dropout(outputs[direction][-1], deterministic=deterministic)

  def logits(self, h_NP):
    """[..., P] → [..., vocab] float32 through the softmax both directions share."""
    logits = jnp.einsum("...p,vp->...v", h_NP.astype(jnp.float32), self.softmax_kernel)
    return logits + self.softmax_bias.reshape((1,) * (logits.ndim - 1) + (-1,))

  def softmax_weights(self):
    """(kernel [vocab, P], bias [vocab]): what a sampled softmax reads rows of."""
    return self.softmax_kernel, self.softmax_bias


def representation_layers(outputs) -> jax.Array:
  """ELMo's layers for a task [1 + layers, batch, words, 2P]: the token layer (repeated for both
  directions, as allennlp's `_ElmoBiLm` does) then each LSTM layer as [forward; backward]."""
  token = jnp.concatenate([outputs["token"]] * 2, axis=-1)
  lstm = [jnp.concatenate([f, b], axis=-1)
          for f, b in zip(outputs["forward"], outputs["backward"])]
  return jnp.stack([token, *lstm])
