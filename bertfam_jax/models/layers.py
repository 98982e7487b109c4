"""Transformer building blocks with logical axis names on every parameter and block activation.

Parameters use the logical names `vocab, embed, embed_factor, mlp, heads, kv, positions, types,
layers, adapter` (`embed_factor`: the width of ALBERT's factorised embedding tables when it differs
from the hidden size; `adapter`: the bottleneck of Houlsby adapters, unsharded);
activations use `batch, length, act_embed, act_mlp, act_heads, act_kv`. The mapping to mesh axes
lives in `bertfam_jax.train.sharding.LOGICAL_AXIS_RULES`; no module here names a mesh axis.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertfam_jax.models import fp8

Dtype = Any
# The collection SelfAttention sows its attention scores into when it is mutable.
SCORES = "attention_scores"


# `model.weight_init`: how every weight drawn at σ `initializer_range` is drawn.
WEIGHT_INITS = ("truncated_normal", "normal")


def normal_weights(stddev: float, distribution: str = "truncated_normal"):
  """Weights of σ `stddev` (`model.weight_init`):
  - 'truncated_normal': BERT's `create_initializer`, TF's truncated_normal, cut at 2σ (so its
    std is 0.88σ). Also ALBERT's and ELECTRA's (their BERT modeling code).
  - 'normal': N(0, σ²) uncut. fairseq's `init_bert_params` (RoBERTa), PyTorch BERT's
    `init_bert_weights` (SpanBERT's pair_bert.py, UniLM, TinyBERT), OpenAI GPT's
    `random_normal_initializer`."""
  if distribution not in WEIGHT_INITS:
    raise ValueError(f"model.weight_init={distribution!r}: one of {WEIGHT_INITS}")
  if distribution == "normal":
    return nn.initializers.normal(stddev)
  return nn.initializers.truncated_normal(stddev=stddev)


def param_init(stddev: float, axes: tuple[str | None, ...],
               distribution: str = "truncated_normal"):
  return nn.with_logical_partitioning(normal_weights(stddev, distribution), axes)


def weight_init(c, axes: tuple[str | None, ...]):
  """A weight of the `model` section `c` at σ `c.initializer_range`, drawn as `c.weight_init`
  says."""
  return param_init(c.initializer_range, axes, c.weight_init)


def bare_dense_init(c, axes: tuple[str | None, ...]):
  """The kernel init of a dense layer that the reference builds without an initializer
  (`model.bare_dense_init`): 'truncated_normal' (the init of every other weight: σ
  `initializer_range`, drawn as `model.weight_init` says; BERT passes `create_initializer` to
  every layer, fairseq and PyTorch BERT initialise every Linear alike) or 'glorot_uniform' (TF's
  default for `tf.layers.dense`: ELECTRA's embeddings_project, its detector's output unit and its
  task classifiers)."""
  if c.bare_dense_init == "glorot_uniform":
    return nn.with_logical_partitioning(nn.initializers.glorot_uniform(), axes)
  return weight_init(c, axes)


def torch_linear_init(fan_in: int, kernel_axes: tuple[str | None, ...],
                      bias_axes: tuple[str | None, ...]):
  """(kernel init, bias init) of PyTorch's default `nn.Linear` on `fan_in` inputs:
  kaiming_uniform_(a=√5), i.e. U(±1/√fan_in), and a bias U(±1/√fan_in) (fairseq RoBERTa's
  classification head)."""
  bound = fan_in ** -0.5

  def bias(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)

  return (nn.with_logical_partitioning(
              nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform"), kernel_axes),
          nn.with_logical_partitioning(bias, bias_axes))


def zeros_init(axes: tuple[str | None, ...]):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def activation_fn(name: str):
  """'gelu_tanh' = TF BERT/ALBERT/XLNet's tanh approximation; 'gelu' = exact erf (fairseq, HF)."""
  return {
      "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
      "gelu": functools.partial(jax.nn.gelu, approximate=False),
      "relu": jax.nn.relu,
  }[name]


class LayerNorm(nn.Module):
  """LayerNorm over the last axis, statistics in float32, scale/bias named on the `embed` axis."""
  epsilon: float
  dtype: Dtype = jnp.float32
  axis_name: str = "embed"

  @nn.compact
  def __call__(self, x):
    return nn.LayerNorm(
        epsilon=self.epsilon, dtype=self.dtype, param_dtype=jnp.float32,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), (self.axis_name,)),
        bias_init=zeros_init((self.axis_name,)), name="norm")(x)


class Embedding(nn.Module):
  """A [vocab, features] table: lookup of ids and, for tied output heads, `attend`.

  `rows_multiple` > 1 pads the table to a multiple of that many rows (`model.vocab_multiple`:
  128 gives the output matmul an aligned width). The padded rows are never looked up, and
  `attend` drops their logits, so losses, accuracies and samples see `num_embeddings` classes;
  they receive no gradient (weight decay alone moves them), and the HF export leaves them out.

  Before use the table is constrained to ('vocab', 'act_embed'): under FSDP that all-gathers the
  `embed`-sharded rows first (as FSDP does for every weight), so the gathered activations come
  out batch-sharded instead of forcing the partitioner into a full rematerialisation.
  """
  num_embeddings: int
  features: int
  initializer_range: float
  dtype: Dtype = jnp.float32
  rows_axis: str = "vocab"  # logical name of the rows: vocab, positions or types
  features_axis: str | None = "embed"  # 'embed_factor' for ALBERT's factorised tables
  rows_multiple: int = 1
  weight_init: str = "truncated_normal"  # `model.weight_init`

  def setup(self):
    self.embedding = self.param(
        "embedding", param_init(self.initializer_range, (self.rows_axis, self.features_axis),
                                self.weight_init),
        (padded_rows(self.num_embeddings, self.rows_multiple), self.features), jnp.float32)

  def _table(self, dropout=None):
    table = nn.with_logical_constraint(self.embedding, (self.rows_axis, "act_embed"))
    return table if dropout is None else drop(table, *dropout)

  def __call__(self, ids, dropout=None):
    """ids [...] int → [..., features] in float32. `dropout` (rng, rate, bits): the rows come
    from the table after dropout on the table itself (GPT's, `Encoder`)."""
    return jnp.take(self._table(dropout), ids, axis=0)

  def attend(self, h, dropout=None):
    """h [..., features] → [..., vocab] in the compute dtype (the padded rows' logits left out);
    `dropout` as in `__call__`: the same (rng, rate, bits) gives the same dropped table."""
    table = self._table(dropout).astype(self.dtype)
    logits = jnp.einsum("...d,vd->...v", h.astype(self.dtype), table)
    return logits[..., :self.num_embeddings]


def padded_rows(rows: int, multiple: int) -> int:
  """`rows` rounded up to a multiple of `multiple` (≥ 1)."""
  return -(-rows // multiple) * multiple


def attention_mask_from_input_mask(input_mask):
  """[batch, length] 0/1 → [batch, 1, 1, length] bool: every query may attend to real keys."""
  return input_mask[:, None, None, :].astype(jnp.bool_)


def causal_mask(length: int):
  """[1, 1, length, length] bool: query i may attend to key j when j <= i."""
  return jnp.tril(jnp.ones((length, length), jnp.bool_))[None, None]


class HeadProjection(nn.Module):
  """An einsum with a kernel and bias whose dimensions keep their own logical names (e.g. the
  Q/K/V kernels are [embed, heads, head_dim], so tensor parallelism can split heads)."""
  equation: str
  kernel_shape: tuple[int, ...]
  kernel_axes: tuple[str, ...]
  bias_shape: tuple[int, ...]
  bias_axes: tuple[str, ...]
  initializer_range: float
  dtype: Dtype = jnp.float32
  fp8_matmuls: bool = False  # the matmul in FP8 (models/fp8.py)
  weight_init: str = "truncated_normal"  # `model.weight_init`

  @nn.compact
  def __call__(self, x):
    kernel = self.param("kernel", param_init(self.initializer_range, self.kernel_axes,
                                             self.weight_init),
                        self.kernel_shape, jnp.float32)
    bias = self.param("bias", zeros_init(self.bias_axes), self.bias_shape, jnp.float32)
    y = einsum(self.equation, x.astype(self.dtype), kernel.astype(self.dtype), self.fp8_matmuls)
    return y + bias.astype(self.dtype).reshape((1,) * (y.ndim - bias.ndim) + bias.shape)


def einsum(equation: str, a, b, fp8_matmuls: bool = False):
  """`jnp.einsum` of two operands, its matmul in FP8 when `fp8_matmuls` (models/fp8.py)."""
  return jnp.einsum(equation, a, b, _dot_general=fp8.dot_general(fp8_matmuls))


def project_together(x_BLD, kernels_DNH, biases_NH=None, dtype: Dtype = jnp.float32,
                     fp8_matmuls: bool = False):
  """Several head projections of one input as one matmul (the fused QKV kernel): x [batch,
  length, embed] with kernels, each [embed, heads, kv] (and biases [heads, kv], or None) → one
  [batch, length, heads, kv] per kernel, the values of projecting by each alone. The kernels are
  stacked at use ([embed, 3, heads, kv]), so parameters, checkpoints and the HF mapping keep
  separate query / key / value tensors, and the backward's weight gradient is one matmul too.
  With FP8 the stack is [embed, heads, 3, kv]: FP8 multiplies matrices, and merging (heads, 3,
  kv) into one dimension keeps a tensor-split `heads` leading, where (3, heads, kv) would make
  XLA gather it."""
  axis = 2 if fp8_matmuls else 1  # of the stacked kernel
  kernel = jnp.stack([k.astype(dtype) for k in kernels_DNH], axis=axis)
  equation = "bld,dnch->blnch" if fp8_matmuls else "bld,dcnh->blcnh"
  y = einsum(equation, x_BLD.astype(dtype), kernel, fp8_matmuls)
  if biases_NH is not None:
    y = y + jnp.stack([b.astype(dtype) for b in biases_NH], axis=axis - 1)[None, None]
  return tuple(jax.lax.index_in_dim(y, i, axis + 1, keepdims=False)
               for i in range(len(kernels_DNH)))


class Dropout(nn.Module):
  """Dropout as flax's `nn.Dropout` (same name, so the same random stream per module), drawing
  its keep decisions from `bits` random bits each.

  bits=32: flax's draw exactly, `bernoulli(rng, 1 - rate)` from one 32-bit word per element.
  bits=16: one 32-bit word gives two neighbours along the last axis their 16-bit uniforms (low
    half, high half), so a batch- or sequence-sharded mask stays local; an element is kept when
    its uniform is below round((1 - rate) · 2^16), so the keep rate is exact to 2^-17 (0.9 →
    0.89999). Half the random words: T5 :runlocal's CPU step 356-360 against 415-427 ms in two
    interleaved pairs, within the noise of others (docs/results.md; measured with an earlier
    pairing of the halves, and before the CPU's threefry was unrolled, train/threefry.py, which
    made steps with dropout about 1.1-1.2× faster). Another random stream, so a deviation a run
    opts into.
  """
  rate: float
  bits: int = 32
  broadcast_dims: Sequence[int] = ()  # axes sharing one decision (T5's sequence axis), not last

  @nn.compact
  def __call__(self, x, deterministic: bool):
    """x: any shape → x with dropped elements zeroed and kept ones scaled by 1 / (1 - rate)."""
    if self.rate == 0.0 or deterministic:
      return x
    if self.rate == 1.0:
      return jnp.zeros_like(x)
    if self.bits not in (32, 16):
      raise ValueError(f"Dropout bits={self.bits}; model.dropout_bits takes 32 or 16.")
    return drop(x, self.make_rng("dropout"), self.rate, self.bits, self.broadcast_dims)


def drop(x, rng, rate: float, bits: int, broadcast_dims: Sequence[int] = ()):
  """x with each element zeroed at `rate` and the kept ones scaled by 1 / (1 - rate), the keep
  decisions drawn from `rng` with `bits` random bits each (`Dropout`); 0 < rate < 1. Along
  `broadcast_dims` (flax's `nn.Dropout` argument; never the last axis) one decision holds for
  every index."""
  keep = 1.0 - rate
  axes = {d % x.ndim for d in broadcast_dims}
  if x.ndim - 1 in axes:
    raise ValueError("Dropout broadcast_dims may not include the last axis.")
  shape = tuple(1 if i in axes else n for i, n in enumerate(x.shape))
  if bits == 32:
    mask = jax.random.bernoulli(rng, p=keep, shape=shape)
  else:
    width = shape[-1]
    words = jax.random.bits(rng, shape[:-1] + ((width + 1) // 2,), jnp.uint32)
    halves = jnp.stack([words & 0xFFFF, words >> 16], axis=-1)
    halves = halves.reshape(shape[:-1] + (2 * words.shape[-1],))[..., :width]
    mask = halves < jnp.uint32(round(keep * 2 ** 16))
  return jax.lax.select(jnp.broadcast_to(mask, x.shape), x / keep, jnp.zeros_like(x))


class SelfAttention(nn.Module):
  """Multi-head self-attention with biases on Q/K/V/O (BERT's modeling.py attention_layer).

  Attention dropout: the papers apply dropout 0.1 to the attention probabilities, which
  `jax.nn.dot_product_attention` cannot do (it has no dropout argument). So `attention_dropout > 0`
  (the faithful default) computes softmax explicitly; `attention_dropout == 0` routes through
  `jax.nn.dot_product_attention(implementation=attention_impl)`, which is where cuDNN flash
  attention is one switch (`attention_impl='cudnn'`, bf16; padding is passed as key lengths, so
  the mask must be right padding, as every pipeline here makes it). That is a documented
  deviation a GPU fast-path config opts into, never a silent one: config validation refuses
  'cudnn' with attention dropout or in float32.
  """
  heads: int
  head_dim: int
  attention_dropout: float
  initializer_range: float
  attention_impl: str = ""
  dtype: Dtype = jnp.float32
  dropout_bits: int = 32
  causal: bool = False  # query i attends keys j <= i only (GPT); cuDNN's `is_causal`
  fused_qkv: bool = False  # Q, K and V in one matmul (`project_together`): the same values
  fp8_matmuls: bool = False  # the four projections in FP8 (models/fp8.py)
  output_initializer_range: float = 0.0  # the output projection's (0: initializer_range; GPT-2)
  weight_init: str = "truncated_normal"  # `model.weight_init`

  @nn.compact
  def __call__(self, x_BLD, mask_B11L, *, deterministic: bool, decode: bool = False):
    """x: [batch, length, embed]; mask: [batch, 1, 1, length] bool (padding) → [batch, length,
    embed].

    `decode` (causal only): a KV cache in the flax "cache" collection. The first call (the full
    length to generate) creates zero caches [batch, max_length, heads, kv] and computes as
    without; each later call writes its `length` new keys and values at `cache_index`, advances
    it, and attends over the cache up to each query's own position (`mask_B11L` is not read:
    every cached position holds a real token)."""
    embed = x_BLD.shape[-1]
    qkv_shape, qkv_axes = (embed, self.heads, self.head_dim), ("embed", "heads", "kv")
    projections = [HeadProjection("bld,dnh->blnh", qkv_shape, qkv_axes,
                                  (self.heads, self.head_dim), ("heads", "kv"),
                                  self.initializer_range, self.dtype, self.fp8_matmuls,
                                  self.weight_init, name=name)
                   for name in ("query", "key", "value")]
    if self.fused_qkv and not self.is_initializing():  # `init` creates them by calling each
      weights = [nn.meta.unbox(p.variables["params"]) for p in projections]
      q_BLNH, k_BLNH, v_BLNH = project_together(
          x_BLD, [w["kernel"] for w in weights], [w["bias"] for w in weights], self.dtype,
          self.fp8_matmuls)
    else:
      q_BLNH, k_BLNH, v_BLNH = (p(x_BLD) for p in projections)
    axes = ("batch", "length", "act_heads", "act_kv")
    q_BLNH, k_BLNH, v_BLNH = (nn.with_logical_constraint(t, axes) for t in (q_BLNH, k_BLNH, v_BLNH))
    padding_B11L = mask_B11L
    if decode and self.has_variable("cache", "cached_key"):
      k_BLNH, v_BLNH, mask_B11L = self._cached(k_BLNH, v_BLNH)
    elif decode or self.causal:
      if decode:
        self._create_cache(k_BLNH, v_BLNH)
      mask_B11L = mask_B11L & causal_mask(x_BLD.shape[1])
    if (self.attention_dropout > 0 and not deterministic) or self._sowing_scores():
      out_BLNH = self._explicit_attention(q_BLNH, k_BLNH, v_BLNH, mask_B11L, deterministic)
    elif self.attention_impl == "cudnn" and not decode:
      # cuDNN flash attention takes padding as key lengths (its PADDING mask type) rather than a
      # materialised mask; every pipeline here pads on the right, so the mask is a prefix.
      lengths_B = jnp.sum(padding_B11L[:, 0, 0, :], axis=-1, dtype=jnp.int32)
      out_BLNH = jax.nn.dot_product_attention(q_BLNH, k_BLNH, v_BLNH,
                                              key_value_seq_lengths=lengths_B,
                                              is_causal=self.causal, implementation="cudnn")
    else:
      impl = None if decode else (self.attention_impl or None)
      out_BLNH = jax.nn.dot_product_attention(q_BLNH, k_BLNH, v_BLNH, mask=mask_B11L,
                                              implementation=impl)
    out_BLNH = nn.with_logical_constraint(out_BLNH, axes)
    return HeadProjection("blnh,nhd->bld", (self.heads, self.head_dim, embed),
                          ("heads", "kv", "embed"), (embed,), ("embed",),
                          self.output_initializer_range or self.initializer_range,
                          self.dtype, self.fp8_matmuls, self.weight_init,
                          name="output")(out_BLNH)

  def _create_cache(self, k_BLNH, v_BLNH):
    """The zero caches, as long as the first decode call: [batch, max_length, heads, kv]."""
    if not self.causal:
      raise ValueError("A KV cache (decode=True) needs causal attention (model.causal=True).")
    self.variable("cache", "cached_key", jnp.zeros, k_BLNH.shape, k_BLNH.dtype)
    self.variable("cache", "cached_value", jnp.zeros, v_BLNH.shape, v_BLNH.dtype)
    self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))

  def _cached(self, k_BLNH, v_BLNH):
    """Writes the new keys/values [batch, length, ...] at `cache_index` and advances it; returns
    the whole caches and the mask [1, 1, length, max_length] of the keys each new query sees."""
    cached_key = self.variable("cache", "cached_key")
    cached_value = self.variable("cache", "cached_value")
    index = self.variable("cache", "cache_index")
    start = index.value
    cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, k_BLNH, (0, start, 0, 0))
    cached_value.value = jax.lax.dynamic_update_slice(cached_value.value, v_BLNH,
                                                      (0, start, 0, 0))
    index.value = start + k_BLNH.shape[1]
    query_positions_Q = start + jnp.arange(k_BLNH.shape[1])
    key_positions_K = jnp.arange(cached_key.value.shape[1])
    mask_QK = key_positions_K[None, :] <= query_positions_Q[:, None]
    return cached_key.value, cached_value.value, mask_QK[None, None]

  def _sowing_scores(self) -> bool:
    """Whether this call records its attention scores: when applied with the SCORES collection
    mutable (TinyBERT's layer distillation, objectives/tinybert.py), never in `init`. A collection
    of its own, so that other readers of intermediates (hf/io.py) keep the fast path."""
    return self.is_mutable_collection(SCORES) and not self.is_initializing()

  def _explicit_attention(self, q_BLNH, k_BLNH, v_BLNH, mask_B11L, deterministic: bool):
    """softmax(QKᵀ/√d) V with dropout on the probabilities. When `_sowing_scores`, the scaled
    scores before masking, [batch, heads, query, key] float32, are sown as
    SCORES/.../attention/scores."""
    scores_BNLL = jnp.einsum("bqnh,bknh->bnqk", q_BLNH, k_BLNH) / jnp.sqrt(self.head_dim).astype(
        q_BLNH.dtype)
    if self._sowing_scores():
      self.sow(SCORES, "scores", scores_BNLL.astype(jnp.float32))
    # Softmax in float32; masked keys get the dtype's lowest value (BERT adds -10000, which is the
    # same after softmax for any realistic score range).
    scores_BNLL = jnp.where(mask_B11L, scores_BNLL.astype(jnp.float32), jnp.finfo(jnp.float32).min)
    probs_BNLL = jax.nn.softmax(scores_BNLL, axis=-1).astype(self.dtype)
    probs_BNLL = Dropout(self.attention_dropout, self.dropout_bits)(probs_BNLL,
                                                                  deterministic=deterministic)
    return jnp.einsum("bnqk,bknh->bqnh", probs_BNLL, v_BLNH)


class MLP(nn.Module):
  """Position-wise feed-forward: dense(embed→mlp) + activation + dense(mlp→embed)."""
  mlp_dim: int
  activation: str
  initializer_range: float
  dtype: Dtype = jnp.float32
  fp8_matmuls: bool = False  # both matmuls in FP8 (models/fp8.py)
  output_initializer_range: float = 0.0  # the output dense's (0: initializer_range; GPT-2)
  weight_init: str = "truncated_normal"  # `model.weight_init`

  @nn.compact
  def __call__(self, x_BLD):
    dense = functools.partial(nn.Dense, dtype=self.dtype, param_dtype=jnp.float32,
                              dot_general=fp8.dot_general(self.fp8_matmuls))
    h_BLF = dense(
        self.mlp_dim,
        kernel_init=param_init(self.initializer_range, ("embed", "mlp"), self.weight_init),
        bias_init=zeros_init(("mlp",)), name="intermediate")(x_BLD)
    h_BLF = nn.with_logical_constraint(activation_fn(self.activation)(h_BLF),
                                       ("batch", "length", "act_mlp"))
    return dense(
        x_BLD.shape[-1],
        kernel_init=param_init(self.output_initializer_range or self.initializer_range,
                               ("mlp", "embed"), self.weight_init),
        bias_init=zeros_init(("embed",)), name="output")(h_BLF)


class Adapter(nn.Module):
  """Houlsby et al. (2019) bottleneck adapter (google-research/adapter-bert modeling.py
  `feedforward_adapter`): x + W_up·gelu(W_down·x + b_down) + b_up, with the tanh GELU of that code.
  Weights ~ truncated normal(`init_scale`), biases 0, so it starts near the identity."""
  size: int  # bottleneck width (adapter-bert's hidden_size, 64 in its README)
  init_scale: float = 1e-3  # adapter-bert's adapter_init_scale
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x_BLD):
    """[batch, length, embed] → [batch, length, embed]."""
    h_BLA = nn.Dense(self.size, dtype=self.dtype, param_dtype=jnp.float32,
                     kernel_init=param_init(self.init_scale, ("embed", "adapter")),
                     bias_init=zeros_init(("adapter",)), name="down")(x_BLD)
    h_BLA = activation_fn("gelu_tanh")(h_BLA)
    return x_BLD + nn.Dense(x_BLD.shape[-1], dtype=self.dtype, param_dtype=jnp.float32,
                            kernel_init=param_init(self.init_scale, ("adapter", "embed")),
                            bias_init=zeros_init(("embed",)), name="up")(h_BLA)
