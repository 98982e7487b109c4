"""XLNet (Yang et al., 2019, arXiv:1906.08237): Transformer-XL with two-stream attention.

Faithful to zihangdai/xlnet modeling.py `transformer_xl` with attn_type='bi' (HF
modeling_xlnet.py computes the same; tests/models/xlnet_model_test.py checks parity with it):
- Word embedding (tied to the output softmax) + dropout; no absolute positions, no embedding LN.
- Every layer: relative multi-head attention over keys/values from [memory ; content stream],
  score(i, j) = [(q_i + r_w)·k_j + (q_i + r_r)·W_r R(i + M − j) + (q_i + r_s)·s_ij] / sqrt(d_head)
  with R the sinusoidal embedding (sin and cos concatenated) of the relative distance, memory keys
  first, so distance = query position + M − key index (M = memory length); s_ij = seg_embed[1 if
  seg(i) ≠ seg(j) else 0], memory keys counting as segment 0; blocked entries −1e30. Then
  LN(h + Drop(o·attn)) and the FFN LN(x + Drop(W2 Drop(act(W1 x)))). q/k/v/o/r are [embed, heads,
  head_dim] without biases.
- Two streams with ALL weights shared: the content stream h (what fine-tuning uses) attends under
  the permutation mask with its diagonal cleared (every token sees itself); the query stream g
  starts from the learned `mask_emb` at each of the P target rows, attends from its target's
  position under the permutation mask as is (never to its own content) and gives the logits
  g·Eᵀ + b through the tied embedding table E.
- Segment recurrence: before each layer the layer's input h[:, :reuse_len] is appended to that
  layer's memory and the last `mem_len` states are kept (stop_gradient), the next window's
  memory. Memory keys are always visible.
- bi_data: a row with direction −1 (a reversed stream) uses negated relative distances, as the
  reference's `bwd_pos_seq` for the second half of its batch.

Conventions (shared with objectives/xlnet.py):
  perm_mask [batch, L, L] float or bool, 1 = query i may NOT attend to key j (reference).
  target_mapping [batch, P, L] float32 one-hot rows (distinct positions) or zero rows (padding).
  input_mask [batch, L] 1 = real token (the reference's input_mask is the opposite); padding keys
    are blocked in both streams (a padding query still sees itself in the content stream).
  segment_ids [batch, L] int32 (0, 1, 2 for <cls>), or None: no segment term (HF token_type_ids
    None).
  mems: tuple of per-layer [batch, M, hidden] (layer i's input states of earlier windows).
  direction [batch] float32 ±1, or None (all +1).

Compared with the reference computation, the query stream attends from its P target rows only
(the reference scatters the P queries onto all L positions, attends from every position and
gathers back; rows without a target there compute attention that is then discarded). The two give
the same numbers for one-hot rows (zero rows give a zero attention vector in both), at P/L of the
query stream's attention cost.

Dropout (modeling.py): `dropout` on the word embeddings, the mask_emb rows, the relative
positional encoding, each attention output, inside the FFN (after the activation and after
layer_2) and on the returned streams; `attention_dropout` (the reference's dropatt) on the
attention probabilities. Softmax and scores are float32 whatever `dtype`; `attention_impl` is not
used (the scores need the explicit relative terms). The memory is returned in float32.

Cost per layer and row (for FLOP counts): projections q over L (+ P for the query stream), k and
v over K = M + L, r over R = K + L relative positions (per row, since direction and dropout act
per row); scores (q + r_w)·k over L×K and (q + r_r)·r over L×R (likewise P×K and P×R for the
query stream); o and the FFN over L + P.

GELU: the reference's gelu() is the tanh approximation (`activation='gelu_tanh'`); HF's
XLNetConfig default 'gelu' is the exact erf form.

Initialisation (modeling.py with init='normal', init_std 0.02): every weight N(0, 0.02²) (not
truncated), biases 0, LayerNorm 1/0, except `mask_emb`, which the reference creates with
tf.get_variable and no initializer, i.e. TF's default Glorot-uniform (HF draws it N(0, 0.02²)).

Parameter tree (`layer_{i}` unrolled; one `layers` with a leading [layers] axis when scanned):
  word_embedding/embedding                       [vocab, hidden]
  mask_emb                                       [1, 1, hidden]
  r_w_bias, r_r_bias, r_s_bias                   [heads, head_dim]   only when untie_r=False
  layer_{i}/rel_attn/{q,k,v,o,r}                 [hidden, heads, head_dim]
  layer_{i}/rel_attn/{r_w_bias,r_r_bias,r_s_bias} [heads, head_dim]  only when untie_r=True
  layer_{i}/rel_attn/seg_embed                   [2, heads, head_dim]
  layer_{i}/rel_attn/layer_norm/norm/{scale,bias} [hidden]
  layer_{i}/ff/layer_1/{kernel [hidden, mlp], bias}; ff/layer_2/{kernel [mlp, hidden], bias};
  layer_{i}/ff/layer_norm/norm/{scale,bias}
  lm_loss/bias                                   [vocab]
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertfam_jax.config_lib import ConfigError
from bertfam_jax.models import layers
from bertfam_jax.models.encoder import REMAT_POLICIES

ACTIVATION_AXES = ("batch", "length", "act_embed")
HEAD_AXES = ("batch", "length", "act_heads", "act_kv")
# The reference subtracts 1e30 from blocked scores (rel_attn_core); a fully blocked row then gets
# a uniform distribution, as here.
BLOCKED_SCORE = -1e30


def validate(c) -> None:
  """Raises ConfigError for model fields this module cannot build."""
  if c.activation not in ("gelu", "gelu_tanh", "relu"):
    raise ConfigError(f"model.activation={c.activation!r}; choose gelu_tanh (the reference's tanh "
                      "GELU), gelu (HF's exact erf) or relu.")
  if c.remat_policy != "none" and c.remat_policy not in REMAT_POLICIES:
    raise ConfigError(f"model.remat_policy={c.remat_policy!r}; choose none or one of "
                      f"{sorted(REMAT_POLICIES)}.")
  if c.hidden % 2:
    raise ConfigError(f"model.hidden={c.hidden} must be even (sin and cos halves of the relative "
                      "positional encoding).")
  if c.mem_len < 0 or c.reuse_len < 0:
    raise ConfigError(f"model.mem_len={c.mem_len} and model.reuse_len={c.reuse_len} must be ≥ 0 "
                      "(0: no memory / cache every token).")


def normal_init(stddev: float, axes: tuple[str | None, ...]):
  """N(0, stddev²): the reference's init='normal' (tf.initializers.random_normal), not truncated."""
  return nn.with_logical_partitioning(nn.initializers.normal(stddev), axes)


class WordEmbedding(layers.Embedding):
  """The [vocab, hidden] table initialised N(0, 0.02²) (modeling.py embedding_lookup); lookup and
  the tied `attend` are layers.Embedding's."""

  def setup(self):
    self.embedding = self.param(
        "embedding", normal_init(self.initializer_range, (self.rows_axis, self.features_axis)),
        (self.num_embeddings, self.features), jnp.float32)


def relative_positional_encoding(qlen: int, klen: int, hidden: int, clamp_len: int, direction_B):
  """The sinusoidal embedding of the relative distances klen, klen−1, …, −qlen+1 (modeling.py
  relative_positional_encoding, attn_type='bi'), each row's distances times its direction:
  [batch] float32 → [batch, klen + qlen, hidden] float32, [sin | cos] with inv_freq
  1 / 10000^(2k / hidden)."""
  pos_seq_R = jnp.arange(klen, -qlen, -1, dtype=jnp.float32)
  if clamp_len > 0:
    pos_seq_R = jnp.clip(pos_seq_R, -clamp_len, clamp_len)
  inv_freq = 1.0 / (10000 ** (jnp.arange(0, hidden, 2, dtype=jnp.float32) / hidden))
  sinusoid_BRF = (direction_B[:, None] * pos_seq_R[None, :])[:, :, None] * inv_freq[None, None, :]
  return jnp.concatenate([jnp.sin(sinusoid_BRF), jnp.cos(sinusoid_BRF)], axis=-1)


def rel_shift(x_BNQR, klen: int):
  """[batch, heads, Q, klen + Q] scores against the distances klen … −Q+1 → [batch, heads, Q, klen]
  with out[i, j] = x[i, j + Q − i], the score at distance i + (klen − Q) − j (modeling.py rel_shift
  on the [b, n, i, j] layout, HF rel_shift_bnij)."""
  b, n, q, r = x_BNQR.shape
  x = x_BNQR.reshape(b, n, r, q)[:, :, 1:, :]
  return x.reshape(b, n, q, r - 1)[:, :, :, :klen]


def gather_shift(x_BNPR, positions_BP, qlen: int, klen: int):
  """rel_shift for queries at arbitrary positions: out[m, j] = x[m, j + qlen − positions[m]] (the
  query stream's target rows; qlen is the content length the distances were built for)."""
  index_BPK = (qlen - positions_BP)[:, :, None] + jnp.arange(klen, dtype=jnp.int32)[None, None, :]
  return jnp.take_along_axis(x_BNPR, index_BPK[:, None, :, :], axis=3)


class FeedForward(nn.Module):
  """modeling.py positionwise_ffn: LN(x + Drop(layer_2(Drop(act(layer_1(x))))))."""
  config: Any

  @nn.compact
  def __call__(self, x_BLD, *, deterministic: bool):
    c = self.config
    dtype = jnp.dtype(c.dtype)
    drop = functools.partial(layers.Dropout(c.dropout, c.dropout_bits),
                             deterministic=deterministic)
    dense = functools.partial(nn.Dense, dtype=dtype, param_dtype=jnp.float32)
    h_BLF = dense(c.mlp, kernel_init=normal_init(c.initializer_range, ("embed", "mlp")),
                  bias_init=layers.zeros_init(("mlp",)), name="layer_1")(x_BLD)
    h_BLF = nn.with_logical_constraint(layers.activation_fn(c.activation)(h_BLF),
                                       ("batch", "length", "act_mlp"))
    h_BLD = dense(x_BLD.shape[-1], kernel_init=normal_init(c.initializer_range, ("mlp", "embed")),
                  bias_init=layers.zeros_init(("embed",)), name="layer_2")(drop(h_BLF))
    out = layers.LayerNorm(c.layer_norm_eps, dtype, name="layer_norm")(x_BLD + drop(h_BLD))
    return nn.with_logical_constraint(out, ACTIVATION_AXES)


class RelativeAttention(nn.Module):
  """Two-stream relative attention of one layer (modeling.py two_stream_rel_attn /
  rel_multihead_attn): both streams use the same projections, biases, segment embedding, output
  projection and LayerNorm; keys and values come from [memory ; content stream]."""
  config: Any

  @nn.compact
  def __call__(self, h_BLD, g_BPD, mem_BMD, ctx, *, deterministic: bool):
    """h [batch, L, hidden], g [batch, P, hidden] or None, mem [batch, M, hidden] or None;
    `ctx` is XLNet._context's dict. → (h, g) after attention, residual and LayerNorm."""
    c = self.config
    dtype = jnp.dtype(c.dtype)
    hidden = h_BLD.shape[-1]
    proj_shape, proj_axes = (hidden, c.heads, c.head_dim), ("embed", "heads", "kv")
    kernel = lambda name: self.param(  # noqa: E731
        name, normal_init(c.initializer_range, proj_axes), proj_shape, jnp.float32).astype(dtype)
    w_q, w_k, w_v, w_o, w_r = (kernel(n) for n in ("q", "k", "v", "o", "r"))
    if c.untie_r:
      bias = lambda name: self.param(  # noqa: E731
          name, normal_init(c.initializer_range, ("heads", "kv")), (c.heads, c.head_dim),
          jnp.float32)
      biases = {n: bias(n) for n in ("r_w_bias", "r_r_bias", "r_s_bias")}
    else:
      biases = ctx["biases"]
    biases = {n: b.astype(dtype) for n, b in biases.items()}
    seg_embed = self.param("seg_embed", normal_init(c.initializer_range, (None, "heads", "kv")),
                           (2, c.heads, c.head_dim), jnp.float32).astype(dtype)

    h_BLD = h_BLD.astype(dtype)
    cat_BKD = h_BLD if mem_BMD is None else jnp.concatenate([mem_BMD.astype(dtype), h_BLD], 1)
    project = lambda x, w: nn.with_logical_constraint(  # noqa: E731
        jnp.einsum("bld,dnh->blnh", x, w), HEAD_AXES)
    k_BKNH, v_BKNH = project(cat_BKD, w_k), project(cat_BKD, w_v)
    kr_BRNH = project(ctx["pos_emb"].astype(dtype), w_r)
    attend = functools.partial(self._attend, k_BKNH=k_BKNH, v_BKNH=v_BKNH, kr_BRNH=kr_BRNH,
                               biases=biases, seg_embed=seg_embed, deterministic=deterministic)
    ln = layers.LayerNorm(c.layer_norm_eps, dtype, name="layer_norm")
    drop = functools.partial(layers.Dropout(c.dropout, c.dropout_bits),
                             deterministic=deterministic)

    def post_attention(x_BQD, attn_BQNH):
      out_BQD = jnp.einsum("bqnh,dnh->bqd", attn_BQNH, w_o)
      return nn.with_logical_constraint(ln(x_BQD + drop(out_BQD)), ACTIVATION_AXES)

    attn_h = attend(project(h_BLD, w_q), seg_BQK=ctx["seg_h"], blocked_BQK=ctx["blocked_h"],
                    positions_BQ=None)
    h_out = post_attention(h_BLD, attn_h)
    if g_BPD is None:
      return h_out, None
    g_BPD = g_BPD.astype(dtype)
    attn_g = attend(project(g_BPD, w_q), seg_BQK=ctx["seg_g"], blocked_BQK=ctx["blocked_g"],
                    positions_BQ=ctx["positions_g"])
    # A zero target_mapping row (padding) gets a zero attention vector, as in the reference's
    # scatter–gather.
    attn_g = attn_g * ctx["valid_g"].astype(dtype)[:, :, None, None]
    return h_out, post_attention(g_BPD, attn_g)

  def _attend(self, q_BQNH, *, k_BKNH, v_BKNH, kr_BRNH, biases, seg_embed, seg_BQK, blocked_BQK,
              positions_BQ, deterministic):
    """modeling.py rel_attn_core. Queries at content positions 0..L−1 (positions_BQ None) or at
    positions_BQ [batch, Q] int32; seg_BQK: True where query and key segments differ (or None);
    blocked_BQK: True where the query may not attend. → [batch, Q, heads, head_dim]."""
    c = self.config
    dtype = jnp.dtype(c.dtype)
    f32 = jnp.float32
    klen = k_BKNH.shape[1]
    qlen = kr_BRNH.shape[1] - klen  # the content length the distances were built for
    b_ = lambda name: biases[name][None, None, :, :]  # noqa: E731
    ac_BNQK = jnp.einsum("bqnh,bknh->bnqk", q_BQNH + b_("r_w_bias"), k_BKNH,
                         preferred_element_type=f32)
    bd_BNQR = jnp.einsum("bqnh,brnh->bnqr", q_BQNH + b_("r_r_bias"), kr_BRNH,
                         preferred_element_type=f32)
    if positions_BQ is None:
      bd_BNQK = rel_shift(bd_BNQR, klen)
    else:
      bd_BNQK = gather_shift(bd_BNQR, positions_BQ, qlen, klen)
    scores_BNQK = ac_BNQK + bd_BNQK
    if seg_BQK is not None:
      ef_BNQS = jnp.einsum("bqnh,snh->bnqs", q_BQNH + b_("r_s_bias"), seg_embed,
                           preferred_element_type=f32)
      scores_BNQK = scores_BNQK + jnp.where(seg_BQK[:, None, :, :], ef_BNQS[..., 1:],
                                            ef_BNQS[..., :1])
    scores_BNQK = scores_BNQK * (1.0 / c.head_dim ** 0.5)
    scores_BNQK = jnp.where(blocked_BQK[:, None, :, :], BLOCKED_SCORE, scores_BNQK)
    probs_BNQK = jax.nn.softmax(scores_BNQK, axis=-1).astype(dtype)
    probs_BNQK = layers.Dropout(c.attention_dropout, c.dropout_bits)(
        probs_BNQK, deterministic=deterministic)
    out_BQNH = jnp.einsum("bnqk,bknh->bqnh", probs_BNQK, v_BKNH)
    return nn.with_logical_constraint(out_BQNH, HEAD_AXES)


class XLNetLayer(nn.Module):
  """One layer: caches its input into the new memory, two-stream attention, the shared FFN on
  both streams. Signature (carry, x) → (carry, y) for nn.scan: carry = (h, g or None), x = this
  layer's memory (or None), y = its new memory (or None when mem_len is 0)."""
  config: Any

  @nn.compact
  def __call__(self, carry, mem_BMD, ctx, deterministic: bool):
    c = self.config
    h_BLD, g_BPD = carry
    new_mem = None
    if c.mem_len > 0:
      # modeling.py _cache_mem: the layer input of the first reuse_len tokens after the previous
      # memory, the last mem_len kept, no gradient. Stored in float32 (a fixed carry dtype).
      current = h_BLD[:, :c.reuse_len] if c.reuse_len > 0 else h_BLD
      if mem_BMD is not None:
        current = jnp.concatenate([mem_BMD.astype(current.dtype), current], axis=1)
      new_mem = jax.lax.stop_gradient(current[:, -c.mem_len:].astype(jnp.float32))
      new_mem = nn.with_logical_constraint(new_mem, ACTIVATION_AXES)
    h_BLD, g_BPD = RelativeAttention(c, name="rel_attn")(h_BLD, g_BPD, mem_BMD, ctx,
                                                         deterministic=deterministic)
    ff = FeedForward(c, name="ff")
    if g_BPD is not None:
      g_BPD = ff(g_BPD, deterministic=deterministic)
    h_BLD = ff(h_BLD, deterministic=deterministic)
    return (h_BLD, g_BPD), new_mem


class LMBias(nn.Module):
  """The output softmax bias [vocab] (modeling.py lm_loss/bias, zeros)."""
  vocab_size: int

  @nn.compact
  def __call__(self, logits_BPV):
    bias = self.param("bias", layers.zeros_init(("vocab",)), (self.vocab_size,), jnp.float32)
    return logits_BPV + bias.astype(logits_BPV.dtype)[None, None, :]


class XLNet(nn.Module):
  """XLNet's Transformer-XL with two-stream attention and the tied LM output; `config` is the
  model section (see the module docstring)."""
  config: Any

  def setup(self):
    c = self.config
    validate(c)
    self.word_embedding = WordEmbedding(c.vocab_size, c.hidden, c.initializer_range,
                                        jnp.dtype(c.dtype))
    # The reference's tf.get_variable without an initializer: TF's Glorot-uniform default.
    self.mask_emb = self.param(
        "mask_emb", nn.with_logical_partitioning(nn.initializers.glorot_uniform(),
                                                 (None, None, "embed")),
        (1, 1, c.hidden), jnp.float32)
    if not c.untie_r:
      bias = lambda name: self.param(  # noqa: E731
          name, normal_init(c.initializer_range, ("heads", "kv")), (c.heads, c.head_dim),
          jnp.float32)
      self.shared_biases = {n: bias(n) for n in ("r_w_bias", "r_r_bias", "r_s_bias")}
    self.layers = self._make_layers()
    self.dropout = layers.Dropout(c.dropout, c.dropout_bits)
    self.lm_loss = LMBias(c.vocab_size)

  def _make_layers(self):
    c = self.config
    layer_cls = XLNetLayer
    if c.remat_policy != "none":
      # self 0, carry 1, mem 2, ctx 3, deterministic 4.
      layer_cls = nn.remat(layer_cls, policy=REMAT_POLICIES[c.remat_policy], static_argnums=(4,))
    if not c.scan_layers:
      return [layer_cls(c, name=f"layer_{i}") for i in range(c.layers)]
    return [nn.scan(layer_cls, variable_axes={"params": 0},
                    split_rngs={"params": True, "dropout": True},
                    in_axes=(0, nn.broadcast, nn.broadcast), length=c.layers,
                    metadata_params={nn.PARTITION_NAME: "layers"})(c, name="layers")]

  def __call__(self, input_ids, segment_ids=None, input_mask=None, perm_mask=None,
               target_mapping=None, mems=None, direction=None, *, deterministic: bool):
    """input_ids, segment_ids, input_mask [batch, L]; perm_mask [batch, L, L] (None: every token
    sees every other, the fine-tuning case); target_mapping [batch, P, L] (None: no query stream);
    mems: tuple of `layers` [batch, M, hidden] (None: no memory); direction [batch] ±1 (None: +1).

    Returns dict(
      content=[batch, L, hidden]  the last layer's content stream (after the output dropout),
      query=[batch, P, hidden]    the last layer's query stream after the output dropout, or None,
      logits=[batch, P, vocab]    query · Eᵀ + b in the compute dtype, or None,
      new_mems=tuple of `layers` [batch, min(M + reuse, mem_len), hidden] float32 (stop_gradient),
               or None when mem_len is 0),
    where reuse = reuse_len or L.
    """
    c = self.config
    dtype = jnp.dtype(c.dtype)
    if mems is not None and len(mems) != c.layers:
      raise ValueError(f"mems has {len(mems)} entries; XLNet needs one per layer ({c.layers}).")
    ctx = self._context(input_ids, segment_ids, input_mask, perm_mask, target_mapping, mems,
                        direction, deterministic=deterministic)
    h_BLD = self.dropout(self.word_embedding(input_ids).astype(dtype), deterministic=deterministic)
    h_BLD = nn.with_logical_constraint(h_BLD, ACTIVATION_AXES)
    g_BPD = None
    if target_mapping is not None:
      shape = (input_ids.shape[0], target_mapping.shape[1], c.hidden)
      g_BPD = self.dropout(jnp.broadcast_to(self.mask_emb.astype(dtype), shape),
                           deterministic=deterministic)
    carry = (h_BLD, g_BPD)
    if c.scan_layers:
      stacked = None if mems is None else jnp.stack([m.astype(jnp.float32) for m in mems])
      carry, new_stacked = self.layers[0](carry, stacked, ctx, deterministic)
      new_mems = None if new_stacked is None else tuple(new_stacked[i] for i in range(c.layers))
    else:
      new_mems = []
      for i, layer in enumerate(self.layers):
        carry, new_mem = layer(carry, None if mems is None else mems[i], ctx, deterministic)
        new_mems.append(new_mem)
      new_mems = tuple(new_mems) if c.mem_len > 0 else None
    h_BLD, g_BPD = carry
    out = dict(content=self.dropout(h_BLD, deterministic=deterministic), query=None, logits=None,
               new_mems=new_mems)
    if g_BPD is not None:
      out["query"] = self.dropout(g_BPD, deterministic=deterministic)
      out["logits"] = self.lm_loss(self.word_embedding.attend(out["query"]))
    return out

  def _context(self, input_ids, segment_ids, input_mask, perm_mask, target_mapping, mems,
               direction, *, deterministic: bool):
    """What every layer shares: the relative positional encoding (after dropout), the masks and
    segment differences of both streams, the query rows' positions; untied biases when shared."""
    c = self.config
    batch, qlen = input_ids.shape
    mlen = 0 if mems is None else mems[0].shape[1]
    if direction is None:
      direction = jnp.ones((batch,), jnp.float32)
    pos_emb = relative_positional_encoding(qlen, mlen + qlen, c.hidden, c.clamp_len,
                                           direction.astype(jnp.float32))
    ctx = dict(pos_emb=self.dropout(pos_emb, deterministic=deterministic))
    # Blocked [batch, L, L]: the permutation mask, plus padding keys for every query.
    blocked_BLL = jnp.zeros((batch, qlen, qlen), jnp.bool_)
    if perm_mask is not None:
      blocked_BLL = perm_mask > 0
    if input_mask is not None:
      blocked_BLL = blocked_BLL | (input_mask == 0)[:, None, :]
    # Memory columns are always visible.
    blocked_BLK = jnp.concatenate([jnp.zeros((batch, qlen, mlen), jnp.bool_), blocked_BLL], 2)
    own_BLK = (jnp.arange(qlen)[:, None] + mlen == jnp.arange(mlen + qlen)[None, :])[None]
    ctx["blocked_h"] = blocked_BLK & ~own_BLK  # the content stream sees itself
    if segment_ids is not None:
      key_segments_BK = jnp.concatenate(
          [jnp.zeros((batch, mlen), segment_ids.dtype), segment_ids], axis=1)
      seg_BLK = segment_ids[:, :, None] != key_segments_BK[:, None, :]
    else:
      seg_BLK = None
    ctx["seg_h"] = seg_BLK
    if target_mapping is not None:
      # Each query row's position (one-hot rows; a zero row reads position 0 and is zeroed by
      # valid_g), and the mask and segment rows of those positions.
      positions_BP = jnp.argmax(target_mapping, axis=-1).astype(jnp.int32)
      rows = lambda x_BLK: jnp.take_along_axis(x_BLK, positions_BP[:, :, None], axis=1)  # noqa
      ctx.update(positions_g=positions_BP,
                 valid_g=jnp.sum(target_mapping.astype(jnp.float32), axis=-1),
                 blocked_g=rows(blocked_BLK), seg_g=None if seg_BLK is None else rows(seg_BLK))
    if not c.untie_r:
      ctx["biases"] = self.shared_biases
    return ctx

  def attend(self, h):
    """[..., hidden] → [..., vocab] through the tied word-embedding table, without the bias."""
    return self.word_embedding.attend(h)
