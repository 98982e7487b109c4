"""T5 (Raffel et al., 2020, arXiv:1910.10683): encoder–decoder, decoder-only and prefix LM.

Faithful to t5 / mesh-tensorflow as HF modeling_t5 and t5x `examples/t5/network.py` implement it:
pre-norm RMSNorm (scale only, statistics in float32, ε 1e-6), no biases anywhere, attention scores
NOT divided by sqrt(d_kv) (absorbed in the query init), one relative position bias table
[relpos_buckets, heads] per stack shared by all its layers (bidirectional buckets in the encoder,
causal ones in decoder self-attention, none in cross-attention; Glorot-uniform init as mesh-tf and
t5x, `model.relpos_bias_init`), dropout where HF T5 applies it (after the embedding, on attention
probabilities, in the FFN after the activation, on each sublayer output before the residual add,
after the final norm) with one mask shared along the sequence, as mesh-tf and t5x draw it (HF
draws per element; `shared_mask_dropout`). Version differences are config fields:
  v1.0: activation='relu', gated_mlp=False, tie_embeddings=True (decoder output × hidden^-0.5
        before the tied embedding table, HF `scale_decoder_outputs`);
  v1.1: activation='gelu_tanh', gated_mlp=True (wi_0 activated × wi_1 linear), untied
        `decoder/logits_dense`, no output scaling.

Architectures (`config.architecture`), one class `T5`:
  encoder_decoder  `encoder` stack + `decoder` stack with cross-attention.
  decoder_only     one `decoder` stack without cross-attention, causal (t5x DecoderOnly).
  prefix_lm        the same stack; `decoder_causal_attention` [batch, length] = 1 marks the prefix
                   (inputs) region, whose tokens attend to each other bidirectionally (t5x
                   `make_decoder_mask`: causal OR (both in the prefix)). Its relative buckets
                   are bidirectional, as mesh-tf's with input_full_attention (the paper's
                   lm_v1_ifa.gin); `model.prefix_lm_buckets='causal'` keeps t5x's causal ones,
                   where keys to the right inside the prefix share bucket 0.

`share_encoder_decoder` (Raffel et al. §3.2.2, Table 2's "Enc-dec, shared"; mesh-tf's
bi_v1_shared.gin, `encoder_name = "decoder"`, which shares every variable of the same name): the
encoder runs the decoder's layers (their self-attention, MLP and norms; not the cross-attention),
its bucket table (with bidirectional buckets) and its final norm, under its own bidirectional
mask, so the encoder holds no parameter and each shared one gets the gradients of both uses.
Encoder-decoder only, with as many encoder as decoder layers.

Packing: segment ids (1..k per packed example, 0 = pad) restrict every attention to one example;
relative positions are `arange` over the row, which inside one contiguous segment equals the
distance within the example.

cuDNN flash attention (`attention_impl='cudnn'`) returns the relative-position bias's gradient only
for the bias alone, in its [1, heads, Lq, Lk] shape: a segment mask added to it makes a
[batch, heads, Lq, Lk] tensor whose gradient came back NaN (jax 0.11.2, H200). So on cuDNN the
bias goes in as [1, heads, Lq, Lk] in the compute dtype, padding as query / key lengths, the
decoder's causality as `is_causal`, and no mask: each row must hold one example, right-padded
(the T5 objective packs one example per row when cuDNN is on; fine-tuning never packs). A prefix
LM's mask has no such form and is refused; a decoding run (KV cache) takes XLA's attention.

Parameter tree (t5x names; `layer_{i}` unrolled, one `layers` with a leading [layers] axis when
`scan_layers`):
  token_embedder/embedding                      [vocab, embed]     shared by both stacks
  encoder/...                                   none with share_encoder_decoder (the decoder's)
  encoder/relpos_bias/rel_embedding             [relpos_buckets, heads]
  encoder/layer_{i}/pre_attention_layer_norm/scale                    [embed]
  encoder/layer_{i}/attention/{query,key,value}                       [embed, heads, kv]
  encoder/layer_{i}/attention/out                                     [heads, kv, embed]
  encoder/layer_{i}/pre_mlp_layer_norm/scale                          [embed]
  encoder/layer_{i}/mlp/{wi | wi_0, wi_1}/kernel [embed, mlp]; mlp/wo/kernel [mlp, embed]
  encoder/encoder_norm/scale
  decoder/relpos_bias/rel_embedding
  decoder/layer_{i}/{pre_self_attention_layer_norm, self_attention,
                     pre_cross_attention_layer_norm, encoder_decoder_attention,
                     pre_mlp_layer_norm, mlp}     (no cross-attention outside encoder_decoder)
  decoder/decoder_norm/scale
  decoder/logits_dense/kernel                   [embed, vocab]     only when not tie_embeddings

KV cache (`decode=True`, flax "cache" collection): a first call with the full-length decoder input
[batch, max_length] creates the caches (`decoder/cache_position/{cache_index, key_positions,
first_key}`, per layer `self_attention/cached_key`, `cached_value` [batch, max_length, heads, kv],
stacked on a leading [layers] axis when scanned), holding that call's keys and values; each later
call feeds one token [batch, 1] at position `cache_index`, which starts at the first call's
`cache_start` (0: nothing cached yet), and attends to the cached keys from the row's `first_key`
(its first position of a nonzero segment id in the first call) to `cache_index`. A prompt is
prefilled that way (`finetune.decoding`: a decoder-only T5's inputs, left-padded so that every
row's prompt ends at one position: the relative position bias sees distances only, and the
padding is outside [first_key, cache_index]); the first call's positions from `cache_start` on are
overwritten by the steps before anything attends to them. Cross-attention keys/values are
recomputed from `encoded` each step (as t5x).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from bertfam_jax.config_lib import ConfigError
from bertfam_jax.models import fp8, layers
from bertfam_jax.models.encoder import REMAT_POLICIES

ARCHITECTURES = ("encoder_decoder", "decoder_only", "prefix_lm")
ACTIVATION_AXES = ("batch", "length", "act_embed")


def normal_init(stddev: float, axes: tuple[str | None, ...]):
  """N(0, stddev²) (HF `_init_weights`; t5x uses the same scales for the dense kernels) with
  logical axis names."""
  return nn.with_logical_partitioning(nn.initializers.normal(stddev), axes)


def shared_mask_dropout(c) -> layers.Dropout:
  """`model.dropout` with one decision shared along the sequence axis (-2): every position of an
  example drops the same features of [batch, length, features], and every query the same keys of
  the probabilities [batch, heads, queries, keys] (mesh-tf's noise_shape without the length
  dimension, t5x's broadcast_dims=(-2,) and broadcast_dropout)."""
  return layers.Dropout(c.dropout, c.dropout_bits, broadcast_dims=(-2,))


def relative_position_bucket(relative_position, *, bidirectional: bool, num_buckets: int,
                             max_distance: int):
  """Bucket of `key_position - query_position` (int array, any shape → same shape, int32).

  mesh-tf `_relative_position_bucket` as HF writes it: bidirectional gives half the buckets to each
  sign; causal maps every future position to bucket 0. Distances below half the (per-sign) buckets
  get a bucket each, larger ones log-spaced up to `max_distance`, beyond it the last bucket.
  """
  relative_position = jnp.asarray(relative_position, jnp.int32)
  buckets = jnp.zeros_like(relative_position)
  if bidirectional:
    num_buckets //= 2
    buckets = buckets + (relative_position > 0).astype(jnp.int32) * num_buckets
    distance = jnp.abs(relative_position)
  else:
    distance = -jnp.minimum(relative_position, 0)
  max_exact = num_buckets // 2
  # max() keeps log away from 0; those distances take the exact branch anyway.
  scaled = jnp.log(jnp.maximum(distance, max_exact).astype(jnp.float32) / max_exact)
  large = max_exact + (scaled / math.log(max_distance / max_exact)
                       * (num_buckets - max_exact)).astype(jnp.int32)
  large = jnp.minimum(large, num_buckets - 1)
  return buckets + jnp.where(distance < max_exact, distance, large)


def segment_mask(query_segment_ids, key_segment_ids):
  """[batch, Lq], [batch, Lk] int → [batch, 1, Lq, Lk] bool: same nonzero segment."""
  same = query_segment_ids[:, None, :, None] == key_segment_ids[:, None, None, :]
  return same & (key_segment_ids != 0)[:, None, None, :]


def causal_mask(length: int):
  """[1, 1, length, length] bool: query i may attend to keys j ≤ i."""
  positions = jnp.arange(length)
  return (positions[:, None] >= positions[None, :])[None, None]


def prefix_lm_keyword(model_config, decoder_causal_attention) -> dict:
  """{'decoder_causal_attention': it} for a prefix LM, {} for the other architectures."""
  if model_config.architecture != "prefix_lm":
    return {}
  return {"decoder_causal_attention": decoder_causal_attention}


def prefix_lm_mask(decoder_causal_attention):
  """[batch, L] 0/1 → [batch, 1, L, L] bool: causal, or both query and key in the prefix (t5x)."""
  prefix = decoder_causal_attention.astype(jnp.bool_)
  both_in_prefix = prefix[:, None, :, None] & prefix[:, None, None, :]
  return causal_mask(prefix.shape[1]) | both_in_prefix


@flax.struct.dataclass
class Masking:
  """Which keys each query may attend to, in the two forms the attention paths take.

  mask: [batch or 1, 1, Lq, Lk] bool, for XLA's attention and the explicit softmax.
  query_lengths, key_lengths: [batch] int32 real tokens per row, for cuDNN (rows of one example,
    right-padded); None in a decoding run (KV cache), which takes XLA's attention.
  causal: query i sees keys j <= i (decoder self-attention), for cuDNN's `is_causal`.
  """
  mask: jax.Array
  query_lengths: jax.Array | None = None
  key_lengths: jax.Array | None = None
  causal: bool = flax.struct.field(pytree_node=False, default=False)


def row_lengths(segment_ids):
  """[batch, L] segment ids → [batch] int32 non-pad tokens per row, at least 1 (an empty row,
  e.g. an eval batch's filler, then attends to its first position: finite, and weighted 0)."""
  return jnp.maximum(jnp.sum(segment_ids != 0, axis=-1, dtype=jnp.int32), 1)


# The implementation `attention_by_lengths` runs for attention_impl='cudnn' (tests on a CPU set it
# to 'xla', which takes the same lengths and causal flag).
LENGTHS_IMPLEMENTATION = "cudnn"


def attention_by_lengths(q_BQNH, k_BKNH, v_BKNH, bias_1NQK, masking: Masking, implementation):
  """Unscaled attention with padding as lengths, causality as a flag and the bias (None, or
  [1, heads, Lq, Lk] in the queries' dtype) alone → [batch, Lq, heads, kv]."""
  return jax.nn.dot_product_attention(
      q_BQNH, k_BKNH, v_BKNH, bias=bias_1NQK, scale=1.0, is_causal=masking.causal,
      query_seq_lengths=masking.query_lengths, key_value_seq_lengths=masking.key_lengths,
      implementation=implementation)


def validate(c) -> None:
  """Raises ConfigError for model fields this module cannot build."""
  if c.architecture not in ARCHITECTURES:
    raise ConfigError(f"model.architecture={c.architecture!r}; choose one of {ARCHITECTURES}.")
  if c.architecture == "prefix_lm" and c.attention_impl == "cudnn":
    raise ConfigError("model.architecture='prefix_lm' needs a mask cuDNN attention cannot take "
                      "with a trainable position bias; set --config.model.attention_impl=xla.")
  if c.activation not in ("relu", "gelu_tanh", "gelu"):
    raise ConfigError(f"model.activation={c.activation!r}; choose relu, gelu_tanh or gelu.")
  if c.share_encoder_decoder and (
      c.architecture != "encoder_decoder" or c.layers != c.decoder_layers):
    raise ConfigError(f"model.share_encoder_decoder runs the decoder's layers as the encoder: it "
                      f"needs architecture='encoder_decoder' (it is {c.architecture!r}) and "
                      f"layers = decoder_layers ({c.layers} vs {c.decoder_layers}).")
  if c.remat_policy != "none" and c.remat_policy not in REMAT_POLICIES:
    raise ConfigError(f"model.remat_policy={c.remat_policy!r}; choose none or one of "
                      f"{sorted(REMAT_POLICIES)}.")


class RMSNorm(nn.Module):
  """T5 LayerNorm: x / sqrt(mean(x²) + ε) · scale; no mean subtraction, no bias; fp32 stats."""
  epsilon: float
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x_BLD):
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones_init(),
                                                             ("embed",)),
                       (x_BLD.shape[-1],), jnp.float32)
    x32 = x_BLD.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.epsilon)
    return (normed * scale[None, None, :]).astype(self.dtype)


class TokenEmbedding(layers.Embedding):
  """The shared [vocab, embed] table, initialised N(0, 1) as mesh-tf / t5x / HF (not BERT's
  truncated normal); lookup and `attend` are layers.Embedding's."""

  def setup(self):
    self.embedding = self.param(
        "embedding", normal_init(self.initializer_range, (self.rows_axis, self.features_axis)),
        (self.num_embeddings, self.features), jnp.float32)


def relpos_init(c):
  """The bucket table's init (`model.relpos_bias_init`): 'glorot_uniform', U(±√(6 / (buckets +
  heads))), mesh-tf's default for a variable created without an initializer and t5x's
  variance_scaling(1, 'fan_avg', 'uniform'); or 'normal', HF's N(0, hidden^-1) (what a run saved
  before the field existed drew: `workdir.read_config` gives it that value)."""
  if c.relpos_bias_init == "normal":
    init = nn.initializers.normal(c.hidden ** -0.5)
  else:
    init = nn.initializers.variance_scaling(1.0, "fan_avg", "uniform")
  return nn.with_logical_partitioning(init, ("relpos_buckets", "heads"))


class RelativePositionBias(nn.Module):
  """The per-stack table [relpos_buckets, heads] → an additive score bias per head."""
  config: Any
  bidirectional: bool

  @nn.compact
  def __call__(self, query_positions, key_positions, bidirectional: bool | None = None):
    """[Lq], [Lk] int → [1, heads, Lq, Lk] in the compute dtype (t5x adds the bias in it; cuDNN
    needs the queries' dtype). `bidirectional`: the stack's own unless given (a shared encoder
    reading its decoder's table)."""
    c = self.config
    table = self.param("rel_embedding", relpos_init(c), (c.relative_buckets, c.heads),
                       jnp.float32)
    bidirectional = self.bidirectional if bidirectional is None else bidirectional
    buckets_QK = relative_position_bucket(
        key_positions[None, :] - query_positions[:, None], bidirectional=bidirectional,
        num_buckets=c.relative_buckets, max_distance=c.relative_max_distance)
    bias_QKN = jnp.take(table, buckets_QK, axis=0).astype(jnp.dtype(c.dtype))
    return jnp.transpose(bias_QKN, (2, 0, 1))[None]


class Attention(nn.Module):
  """T5 multi-head attention: no biases, no 1/sqrt(d_kv), an additive position bias.

  Inits (HF `_init_weights`, t5x): query N(0, (hidden·kv)^-1), key/value N(0, hidden^-1), out
  N(0, (heads·kv)^-1). Dropout on the probabilities needs the explicit softmax; without it
  (`dropout == 0` or deterministic) `jax.nn.dot_product_attention(implementation=attention_impl)`
  runs, where 'cudnn' is cuDNN flash attention with the masking as lengths (module docstring).
  """
  config: Any

  @nn.compact
  def __call__(self, x_BQD, kv_BKD, bias_1NQK, masking: Masking, *, deterministic: bool,
               decode: bool = False, cache_index=None):
    """x [batch, Lq, embed] attends kv [batch, Lk, embed] → [batch, Lq, embed].

    bias: [1, heads, Lq, Lk] in the compute dtype, or None; masking: which keys each query sees.
    With `decode` the keys/values are (created in, or when `cache_index` is given written at that
    position of) the cache, and the query attends over the whole cache [max_length].
    """
    c = self.config
    dtype = jnp.dtype(c.dtype)
    hidden = x_BQD.shape[-1]
    qkv_axes = ("embed", "heads", "kv")
    kernels_DNH = [self.param(name, normal_init(std, qkv_axes), (hidden, c.heads, c.head_dim),
                              jnp.float32)
                   for name, std in (("query", (hidden * c.head_dim) ** -0.5),
                                     ("key", hidden ** -0.5), ("value", hidden ** -0.5))]
    fp8_matmuls = c.fp8_matmuls
    if c.fused_qkv and kv_BKD is x_BQD:  # self-attention: one matmul
      q_BQNH, k_BKNH, v_BKNH = layers.project_together(x_BQD, kernels_DNH, dtype=dtype,
                                                       fp8_matmuls=fp8_matmuls)
    else:
      q_BQNH, k_BKNH, v_BKNH = (
          layers.einsum("bld,dnh->blnh", x.astype(dtype), kernel_DNH.astype(dtype), fp8_matmuls)
          for x, kernel_DNH in zip((x_BQD, kv_BKD, kv_BKD), kernels_DNH))
    act_axes = ("batch", "length", "act_heads", "act_kv")
    q_BQNH, k_BKNH, v_BKNH = (nn.with_logical_constraint(t, act_axes)
                              for t in (q_BQNH, k_BKNH, v_BKNH))
    if decode:
      k_BKNH, v_BKNH = self._update_cache(k_BKNH, v_BKNH, cache_index)
    if c.dropout > 0 and not deterministic:
      scores_BNQK = jnp.einsum("bqnh,bknh->bnqk", q_BQNH, k_BKNH,
                               preferred_element_type=jnp.float32)
      if bias_1NQK is not None:
        scores_BNQK = scores_BNQK + bias_1NQK
      scores_BNQK = jnp.where(masking.mask, scores_BNQK, jnp.finfo(jnp.float32).min)
      probs_BNQK = shared_mask_dropout(c)(
          jax.nn.softmax(scores_BNQK, axis=-1).astype(dtype), deterministic=False)
      out_BQNH = jnp.einsum("bnqk,bknh->bqnh", probs_BNQK, v_BKNH)
    elif c.attention_impl == "cudnn" and masking.query_lengths is not None:
      out_BQNH = attention_by_lengths(q_BQNH, k_BKNH, v_BKNH, bias_1NQK, masking,
                                      LENGTHS_IMPLEMENTATION)
    else:
      out_BQNH = jax.nn.dot_product_attention(
          q_BQNH, k_BKNH, v_BKNH, bias=bias_1NQK, mask=masking.mask, scale=1.0,
          implementation=None if decode else (c.attention_impl or None))
    out_BQNH = nn.with_logical_constraint(out_BQNH, act_axes)
    out_kernel = self.param("out", normal_init((c.heads * c.head_dim) ** -0.5,
                                               ("heads", "kv", "embed")),
                            (c.heads, c.head_dim, hidden), jnp.float32)
    return layers.einsum("bqnh,nhd->bqd", out_BQNH, out_kernel.astype(dtype), fp8_matmuls)

  def _update_cache(self, k_BKNH, v_BKNH, cache_index):
    """Creates the cache at the first (full-length) call, holding its keys/values; with
    `cache_index` writes the one new key/value there and returns the whole cache
    [batch, max_length, heads, kv]."""
    cached_key = self.variable("cache", "cached_key", lambda: k_BKNH)
    cached_value = self.variable("cache", "cached_value", lambda: v_BKNH)
    if cache_index is None:
      return k_BKNH, v_BKNH
    start = (0, cache_index, 0, 0)
    cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, k_BKNH, start)
    cached_value.value = jax.lax.dynamic_update_slice(cached_value.value, v_BKNH, start)
    return cached_key.value, cached_value.value


class MLP(nn.Module):
  """wo(drop(act(wi x))), or v1.1's gated wo(drop(act(wi_0 x) · wi_1 x)); no biases.
  Inits N(0, hidden^-1) for wi*, N(0, mlp^-1) for wo (HF, t5x)."""
  config: Any

  @nn.compact
  def __call__(self, x_BLD, *, deterministic: bool):
    """[batch, length, embed] → [batch, length, embed]."""
    c = self.config
    dense = functools.partial(nn.Dense, use_bias=False, dtype=jnp.dtype(c.dtype),
                              param_dtype=jnp.float32,
                              dot_general=fp8.dot_general(c.fp8_matmuls))
    wi = lambda name: dense(  # noqa: E731
        c.mlp, kernel_init=normal_init(c.hidden ** -0.5, ("embed", "mlp")), name=name)(x_BLD)
    act = layers.activation_fn(c.activation)
    h_BLF = act(wi("wi_0")) * wi("wi_1") if c.gated_mlp else act(wi("wi"))
    h_BLF = nn.with_logical_constraint(h_BLF, ("batch", "length", "act_mlp"))
    h_BLF = shared_mask_dropout(c)(h_BLF, deterministic=deterministic)
    return dense(c.hidden, kernel_init=normal_init(c.mlp ** -0.5, ("mlp", "embed")),
                 name="wo")(h_BLF)


class EncoderLayer(nn.Module):
  """x += drop(Attn(norm(x))); x += drop(MLP(norm(x))). Returns (x, None): the (carry, output)
  signature `nn.scan` needs, used unrolled too."""
  config: Any

  @nn.compact
  def __call__(self, x_BLD, bias_1NLL, masking: Masking, deterministic: bool):
    """x: [batch, length, hidden]; bias: [1, heads, L, L]; masking: mask [batch, 1, L, L]."""
    c = self.config
    dtype = jnp.dtype(c.dtype)
    drop = functools.partial(shared_mask_dropout(c),
                             deterministic=deterministic)
    h = RMSNorm(c.layer_norm_eps, dtype, name="pre_attention_layer_norm")(x_BLD)
    h = Attention(c, name="attention")(h, h, bias_1NLL, masking, deterministic=deterministic)
    x_BLD = nn.with_logical_constraint(x_BLD + drop(h), ACTIVATION_AXES)
    h = RMSNorm(c.layer_norm_eps, dtype, name="pre_mlp_layer_norm")(x_BLD)
    h = MLP(c, name="mlp")(h, deterministic=deterministic)
    return nn.with_logical_constraint(x_BLD + drop(h), ACTIVATION_AXES), None


class DecoderLayer(nn.Module):
  """Self-attention (causal / prefix), cross-attention to `encoded` when `cross_attention`, MLP;
  each pre-normed with a dropped-out residual. Returns (x, None) like EncoderLayer."""
  config: Any
  cross_attention: bool

  @nn.compact
  def __call__(self, x_BLD, encoded_BSD, bias_1NLL, masking: Masking, cross_masking: Masking,
               deterministic: bool, decode: bool, cache_index):
    """x: [batch, L, hidden]; encoded: [batch, S, hidden] or None; bias: [1, heads, L, L or
    max_length]; maskings of self-attention (mask [batch or 1, 1, L, L or max_length]) and of
    cross-attention (mask [batch, 1, L, S]; None without cross-attention). `encoded` None in a
    layer with cross-attention: a shared encoder's call, which skips it."""
    c = self.config
    dtype = jnp.dtype(c.dtype)
    drop = functools.partial(shared_mask_dropout(c),
                             deterministic=deterministic)
    h = RMSNorm(c.layer_norm_eps, dtype, name="pre_self_attention_layer_norm")(x_BLD)
    h = Attention(c, name="self_attention")(h, h, bias_1NLL, masking,
                                            deterministic=deterministic, decode=decode,
                                            cache_index=cache_index)
    x_BLD = nn.with_logical_constraint(x_BLD + drop(h), ACTIVATION_AXES)
    if self.cross_attention and encoded_BSD is not None:
      h = RMSNorm(c.layer_norm_eps, dtype, name="pre_cross_attention_layer_norm")(x_BLD)
      h = Attention(c, name="encoder_decoder_attention")(h, encoded_BSD, None, cross_masking,
                                                         deterministic=deterministic)
      x_BLD = nn.with_logical_constraint(x_BLD + drop(h), ACTIVATION_AXES)
    h = RMSNorm(c.layer_norm_eps, dtype, name="pre_mlp_layer_norm")(x_BLD)
    h = MLP(c, name="mlp")(h, deterministic=deterministic)
    return nn.with_logical_constraint(x_BLD + drop(h), ACTIVATION_AXES), None


def layer_stack(config, layer_cls, num_layers: int, *, num_args: int,
                static_argnums: tuple[int, ...], **kwargs):
  """`num_layers` layer modules to apply in order: unrolled `layer_{i}`, or one `layers` scan with
  parameters (and caches) stacked on a leading [layers] axis; rematerialised per
  `config.remat_policy`. `num_args`: the layer's call arguments (the first is the scan carry);
  `static_argnums` count `self` as 0."""
  if config.remat_policy != "none":
    layer_cls = nn.remat(layer_cls, policy=REMAT_POLICIES[config.remat_policy],
                         static_argnums=static_argnums)
  if not config.scan_layers:
    return [layer_cls(config, name=f"layer_{i}", **kwargs) for i in range(num_layers)]
  scanned = nn.scan(layer_cls, variable_axes={"params": 0, "cache": 0},
                    split_rngs={"params": True, "dropout": True},
                    in_axes=(nn.broadcast,) * (num_args - 1), length=num_layers,
                    metadata_params={nn.PARTITION_NAME: "layers"})
  return [scanned(config, name="layers", **kwargs)]


class Encoder(nn.Module):
  """Embedding + `layers` EncoderLayers + final norm; bidirectional relative buckets. With
  `layers_from` (share_encoder_decoder) the layers, the bucket table and the final norm are that
  Decoder's (mesh-tf's `encoder_name = "decoder"` shares every same-named variable), the layers
  called without cross-attention and the buckets bidirectional: the encoder holds no parameter."""
  config: Any
  embedder: nn.Module  # the parent's shared TokenEmbedding
  layers_from: Any = None  # the Decoder whose layers this encoder runs

  def setup(self):
    c = self.config
    # EncoderLayer args: self 0, x 1, bias 2, masking 3, deterministic 4.
    if self.layers_from is None:
      self.relpos_bias = RelativePositionBias(c, bidirectional=True)
      self.layers = layer_stack(c, EncoderLayer, c.layers, num_args=4, static_argnums=(4,))
      self.encoder_norm = RMSNorm(c.layer_norm_eps, jnp.dtype(c.dtype))
    self.dropout = shared_mask_dropout(c)

  def __call__(self, input_ids, input_segment_ids, *, deterministic: bool):
    """[batch, L] ids and segment ids → [batch, L, hidden] in the compute dtype."""
    length = input_ids.shape[1]
    x_BLD = self.dropout(self.embedder(input_ids).astype(jnp.dtype(self.config.dtype)),
                         deterministic=deterministic)
    x_BLD = nn.with_logical_constraint(x_BLD, ACTIVATION_AXES)
    shared = self.layers_from is not None
    relpos_bias = self.layers_from.relpos_bias if shared else self.relpos_bias
    bias_1NLL = relpos_bias(jnp.arange(length), jnp.arange(length), bidirectional=True)
    lengths_B = row_lengths(input_segment_ids)
    masking = Masking(segment_mask(input_segment_ids, input_segment_ids), lengths_B, lengths_B)
    if not shared:
      for layer in self.layers:
        x_BLD, _ = layer(x_BLD, bias_1NLL, masking, deterministic)
    else:   # the decoder's layers: no encoder output (no cross-attention), no cache
      for layer in self.layers_from.layers:
        x_BLD, _ = layer(x_BLD, None, bias_1NLL, masking, None, deterministic, False, None)
    norm = self.layers_from.decoder_norm if shared else self.encoder_norm
    return self.dropout(norm(x_BLD), deterministic=deterministic)


def prefix_lm_bidirectional(c) -> bool:
  """Whether a decoder stack's buckets are bidirectional: a prefix LM's with
  `model.prefix_lm_buckets='bidirectional'` (mesh-tf, where input_full_attention makes the whole
  stack bidirectional, for the targets' causal attention too; a run saved before the field
  existed had 'causal', which `workdir.read_config` gives it); every other decoder's are causal."""
  return (c.architecture == "prefix_lm"
          and c.prefix_lm_buckets == "bidirectional")


class Decoder(nn.Module):
  """Embedding + `decoder_layers` DecoderLayers + final norm + logits; causal relative buckets.

  Self-attention mask: same nonzero segment AND (causal, or for a prefix LM both in the prefix);
  in a cached step: keys at positions from the row's first_key to cache_index.
  """
  config: Any
  embedder: nn.Module
  cross_attention: bool

  def setup(self):
    c = self.config
    self.relpos_bias = RelativePositionBias(c, bidirectional=prefix_lm_bidirectional(c))
    # DecoderLayer args: self 0, x 1, encoded 2, bias 3, masking 4, cross masking 5,
    # deterministic 6, decode 7, cache_index 8.
    self.layers = layer_stack(c, DecoderLayer, c.decoder_layers, num_args=8,
                              static_argnums=(6, 7), cross_attention=self.cross_attention)
    self.decoder_norm = RMSNorm(c.layer_norm_eps, jnp.dtype(c.dtype))
    self.dropout = shared_mask_dropout(c)
    self.cache_position = CachePosition()
    if not c.tie_embeddings:
      self.logits_dense = nn.Dense(
          c.vocab_size, use_bias=False, dtype=jnp.dtype(c.dtype), param_dtype=jnp.float32,
          kernel_init=normal_init(c.hidden ** -0.5, ("embed", "vocab")))

  def __call__(self, decoder_input_ids, decoder_segment_ids, encoded_BSD, input_segment_ids,
               decoder_causal_attention=None, *, deterministic: bool, decode: bool = False,
               cache_start=0):
    """[batch, L] ids (+ encoder output [batch, S, hidden] and its segment ids, or None) →
    logits [batch, L, vocab] in the compute dtype. `cache_start`: see the module docstring."""
    c = self.config
    length = decoder_input_ids.shape[1]
    x_BLD = self.dropout(self.embedder(decoder_input_ids).astype(jnp.dtype(c.dtype)),
                         deterministic=deterministic)
    x_BLD = nn.with_logical_constraint(x_BLD, ACTIVATION_AXES)
    cache_index, bias_1NLK, masking = self._self_attention_bias_and_masking(
        length, decoder_segment_ids, decoder_causal_attention, decode, cache_start)
    cross_masking = None
    if self.cross_attention:   # a decoding run's steps take XLA's attention: no lengths
      cross_mask = segment_mask(decoder_segment_ids, input_segment_ids)
      cross_masking = Masking(cross_mask) if decode else Masking(
          cross_mask, row_lengths(decoder_segment_ids), row_lengths(input_segment_ids))
    for layer in self.layers:
      x_BLD, _ = layer(x_BLD, encoded_BSD, bias_1NLK, masking, cross_masking, deterministic,
                       decode, cache_index)
    x_BLD = self.dropout(self.decoder_norm(x_BLD), deterministic=deterministic)
    if c.tie_embeddings:
      return self.embedder.attend(x_BLD * c.hidden ** -0.5)
    return self.logits_dense(x_BLD)

  def _self_attention_bias_and_masking(self, length, decoder_segment_ids,
                                       decoder_causal_attention, decode, cache_start):
    """(cache_index or None, bias [1, heads, L, K], Masking with mask [batch or 1, 1, L, K]);
    K = L, or max_length in a cached step (whose one query sits at position cache_index)."""
    cache_index = None
    if decode:
      cache_index, key_positions, first_key_B = self.cache_position(length, decoder_segment_ids,
                                                                    cache_start)
    if cache_index is not None:
      bias = self.relpos_bias(cache_index[None], key_positions)
      visible_BK = ((key_positions[None, :] <= cache_index)
                    & (key_positions[None, :] >= first_key_B[:, None]))
      return cache_index, bias, Masking(visible_BK[:, None, None, :])
    positions = jnp.arange(length)
    if (decoder_causal_attention is None) != (self.config.architecture != "prefix_lm"):
      raise ConfigError("decoder_causal_attention is required by model.architecture='prefix_lm' "
                        "(outside a one-token cached step) and only accepted by it; set "
                        "model.architecture accordingly.")
    if decoder_causal_attention is None:
      mask = causal_mask(length)
    else:
      mask = prefix_lm_mask(decoder_causal_attention)
    mask = mask & segment_mask(decoder_segment_ids, decoder_segment_ids)
    lengths_B = None if decode else row_lengths(decoder_segment_ids)
    masking = Masking(mask, lengths_B, lengths_B, causal=decoder_causal_attention is None)
    return None, self.relpos_bias(positions, positions), masking


class CachePosition(nn.Module):
  """The decoder's place in its KV cache: `cache_index` (the position the next one-token call
  fills), `key_positions` [max_length] (0..max_length-1, the positions of the cached keys) and
  `first_key` [batch] (each row's first position to attend to)."""

  @nn.compact
  def __call__(self, length: int, segment_ids, cache_start):
    """→ (cache_index before this call, key_positions, first_key) in a cached step; (None,
    key_positions, first_key) at the first, cache-creating call of `length` = max_length, whose
    segment_ids [batch, max_length] set first_key (the first nonzero one; 0 in a row of none) and
    which sets cache_index to `cache_start`."""
    step = self.has_variable("cache", "cache_index")
    index = self.variable("cache", "cache_index", lambda: jnp.asarray(cache_start, jnp.int32))
    key_positions = self.variable("cache", "key_positions", jnp.arange, length, dtype=jnp.int32)
    first_key = self.variable("cache", "first_key",
                              lambda: jnp.argmax(segment_ids != 0, axis=1).astype(jnp.int32))
    if not step:
      return None, key_positions.value, first_key.value
    cache_index = index.value
    index.value = cache_index + 1
    return cache_index, key_positions.value, first_key.value


class T5(nn.Module):
  """T5 in any of `ARCHITECTURES` (see the module docstring); `config` is the model section."""
  config: Any

  def setup(self):
    c = self.config
    validate(c)
    self.token_embedder = TokenEmbedding(c.vocab_size, c.hidden, 1.0, jnp.dtype(c.dtype))
    encoder_decoder = c.architecture == "encoder_decoder"
    self.decoder = Decoder(c, self.token_embedder, cross_attention=encoder_decoder)
    if encoder_decoder:
      shared = c.share_encoder_decoder
      self.encoder = Encoder(c, self.token_embedder, self.decoder if shared else None)

  def __call__(self, input_ids, decoder_input_ids, input_segment_ids=None,
               decoder_segment_ids=None, *, deterministic: bool, decoder_causal_attention=None,
               cross_segment_ids=None):
    """Teacher-forced logits [batch, Lt, vocab] in the compute dtype (callers cast to float32).

    Encoder–decoder: input_ids [batch, Li] and decoder_input_ids [batch, Lt]. Decoder-only /
    prefix LM: input_ids must be None and decoder_input_ids is the one sequence [batch, L];
    prefix LM also takes decoder_causal_attention [batch, L] (1 on the bidirectional prefix).
    Segment ids None: encoder (input_ids != 0), decoder all ones (the causal mask only).
    cross_segment_ids [batch, Li]: the encoder positions' segment ids as the decoder's
    cross-attention sees them, 0 where it may not look (MASS's [MASK]ed inputs); None: the
    input_segment_ids. XLA attention only: lengths cannot express a hole (objectives/t5.py
    refuses the combination with cuDNN).
    """
    c = self.config
    if c.architecture == "encoder_decoder":
      if input_ids is None or decoder_causal_attention is not None:
        raise ConfigError("model.architecture='encoder_decoder' takes input_ids and no "
                          "decoder_causal_attention; set model.architecture='prefix_lm' for a "
                          "prefix LM.")
      if input_segment_ids is None:
        input_segment_ids = (input_ids != 0).astype(jnp.int32)
      encoded = self.encode(input_ids, input_segment_ids, deterministic=deterministic)
      return self.decode(encoded,
                         input_segment_ids if cross_segment_ids is None else cross_segment_ids,
                         decoder_input_ids, decoder_segment_ids, deterministic=deterministic)
    if input_ids is not None:
      raise ConfigError(f"model.architecture={c.architecture!r} has no encoder: pass the whole "
                        "sequence as decoder_input_ids, or set "
                        "model.architecture='encoder_decoder'.")
    return self.decoder(decoder_input_ids, self._decoder_segments(decoder_input_ids,
                                                                  decoder_segment_ids),
                        None, None, decoder_causal_attention, deterministic=deterministic)

  def encode(self, input_ids, input_segment_ids=None, *, deterministic: bool):
    """[batch, Li] → encoder output [batch, Li, hidden] (compute dtype)."""
    if input_segment_ids is None:
      input_segment_ids = (input_ids != 0).astype(jnp.int32)
    return self.encoder(input_ids, input_segment_ids, deterministic=deterministic)

  def decode(self, encoded, input_segment_ids, decoder_input_ids, decoder_segment_ids=None, *,
             deterministic: bool, decode: bool = False, decoder_causal_attention=None,
             cache_start=0):
    """encoded [batch, Li, hidden] with its segment ids [batch, Li] (None: every position is a
    real token of segment 1), decoder_input_ids [batch, Lt] → logits [batch, Lt, vocab]. A
    decoder-only / prefix-LM T5 takes encoded None (and the prefix LM its
    decoder_causal_attention [batch, Lt] in a call that is not a one-token step).
    `decode=True`: the KV-cache path, `cache_start` (see the module docstring)."""
    if (encoded is None) != (self.config.architecture != "encoder_decoder"):
      raise ConfigError(f"T5.decode takes an encoder output exactly when model.architecture is "
                        f"'encoder_decoder' (it is {self.config.architecture!r}).")
    if encoded is not None and input_segment_ids is None:
      input_segment_ids = jnp.ones(encoded.shape[:2], jnp.int32)
    return self.decoder(decoder_input_ids,
                        self._decoder_segments(decoder_input_ids, decoder_segment_ids),
                        encoded, input_segment_ids, decoder_causal_attention,
                        deterministic=deterministic, decode=decode, cache_start=cache_start)

  @staticmethod
  def _decoder_segments(decoder_input_ids, decoder_segment_ids):
    if decoder_segment_ids is None:
      return jnp.ones(decoder_input_ids.shape, jnp.int32)
    return decoder_segment_ids
