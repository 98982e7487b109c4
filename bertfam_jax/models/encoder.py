"""The Transformer encoder of the BERT family (post-LN, as google-research/bert modeling.py).

One module serves BERT, RoBERTa and, through config fields, the later members (ALBERT's factorised
embedding and sharing, ELECTRA's sizes, SpanBERT): composition, not subclasses.

ALBERT (Lan et al., 2020; google-research/albert modeling.py):
  `embedding_size` E > 0 (and ≠ hidden): word/position/type tables are E wide, LayerNorm and dropout
    act in E, then one dense E→H with bias (`embedding_hidden_mapping_in`) feeds layer 0.
  `share_layers`: 'all' applies one parameter set at every layer ('attention' / 'ffn' share only
    that sublayer, the paper's Table 4 ablations); `hidden_groups` G splits the layers into G
    consecutive groups, each with its own parameters (`layer_plan`).

Houlsby adapters (Houlsby et al., 2019; google-research/adapter-bert modeling.py): `adapter_size`
A > 0 inserts a bottleneck adapter (`layers.Adapter`) after each sublayer's output projection and
dropout, before the residual + LayerNorm ('attention_adapter', 'ffn_adapter' in each layer module,
so shared layers share their adapters too). 0 adds no parameters and changes nothing.
"""

from __future__ import annotations

import collections
import math
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertfam_jax.models import layers

REMAT_POLICIES = {
    "full": None,  # save nothing: recompute the whole layer in the backward pass
    "dots": jax.checkpoint_policies.dots_saveable,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def drops_tables(config) -> bool:
  """Whether dropout acts on the embedding tables (GPT's `embedding_dropout='table'`, `Encoder`)
  rather than on the summed embeddings."""
  return config.get("embedding_dropout", "output") == "table"


def residual_initializer_range(config) -> float:
  """The init std of the projections that write into the residual stream (attention output, FFN
  output): `initializer_range`, over √(2 · layers) with `model.scale_residual_init` (GPT-2,
  Radford et al. 2019 §2.3; HF GPT2's `c_proj` init; the released model.py leaves them at
  0.02)."""
  scale = math.sqrt(2 * config.layers) if config.get("scale_residual_init", False) else 1.0
  return config.initializer_range / scale


def factorized_embedding(c) -> bool:
  """Whether the embedding tables are narrower than the layers (ALBERT): albert modeling.py adds
  `embedding_hidden_mapping_in` only when the embedding width differs from the hidden size."""
  return bool(c.embedding_size) and c.embedding_size != c.hidden


def tied_head_features(c) -> tuple[int, str]:
  """(width, logical axis) of a head's last transform before the tied embedding table: E on
  'embed_factor' when factorised (albert run_pretraining.py projects H→E), else hidden on
  'embed_out' (BERT's H→H)."""
  return (c.embedding_size, "embed_factor") if factorized_embedding(c) else (c.hidden, "embed_out")


def layer_plan(c) -> list[tuple[tuple[str, str], ...]]:
  """For each of the `layers` layers, the (module name, sublayers) applied to it, in order.

  A name that recurs at several layers is one module: those layers share its parameters and their
  gradients add up in them. Layer i of a shared stack uses group g = i·G // L with G =
  `hidden_groups` (albert modeling.py `int(i / L * G)`, here in exact integer arithmetic):
    none       layer_{i} (both sublayers)                                   BERT
    all        group_{g} (both)                                             ALBERT
    attention  attention_group_{g} (attention), then layer_{i} (ffn)
    ffn        layer_{i} (attention), then ffn_group_{g} (ffn)
  """
  plans = {
      "none": lambda i, g: ((f"layer_{i}", "both"),),
      "all": lambda i, g: ((f"group_{g}", "both"),),
      "attention": lambda i, g: ((f"attention_group_{g}", "attention"), (f"layer_{i}", "ffn")),
      "ffn": lambda i, g: ((f"layer_{i}", "attention"), (f"ffn_group_{g}", "ffn")),
  }
  share, groups = c.get("share_layers", "none"), c.get("hidden_groups", 1)  # none for XLNet
  if share not in plans:
    raise ValueError(f"model.share_layers={share!r}; choose one of {sorted(plans)}.")
  return [plans[share](i, i * groups // c.layers) for i in range(c.layers)]


def _residual(c, x_BLD, norm_name: str, adapter_name: str, sublayer, deterministic: bool):
  """One residual block around `sublayer` ([batch, length, hidden] → same), post- or pre-LN
  (`TransformerLayer`). A function, not a method: called inside the layer's compact `__call__`,
  its modules are the layer's own, and traces name them as before (`layer_0/mlp/...`)."""
  dtype = jnp.dtype(c.dtype)
  norm = layers.LayerNorm(c.layer_norm_eps, dtype, name=norm_name)
  pre = c.get("pre_layer_norm", False)
  h_BLD = layers.Dropout(c.dropout, c.dropout_bits)(sublayer(norm(x_BLD) if pre else x_BLD),
                                                     deterministic=deterministic)
  if c.adapter_size:
    h_BLD = layers.Adapter(c.adapter_size, dtype=dtype, name=adapter_name)(h_BLD)
  x_BLD = x_BLD + h_BLD if pre else norm(x_BLD + h_BLD)
  return nn.with_logical_constraint(x_BLD, ("batch", "length", "act_embed"))


class TransformerLayer(nn.Module):
  """x = LN(x + Drop(Attn(x))); x = LN(x + Drop(MLP(x)))  (post-LN, BERT and GPT); with adapters
  x = LN(x + Adapter(Drop(Attn(x)))) and likewise for the MLP (adapter-bert transformer_model).
  `model.pre_layer_norm` (GPT-2): x = x + Drop(Attn(LN(x))); x = x + Drop(MLP(LN(x))), the same
  two LayerNorms ('attention_ln', 'output_ln') now before their sublayer.

  `sublayers='attention'` or `'ffn'` holds and applies only that residual block, for sharing one
  of the two across layers while the other stays per layer (`layer_plan`).
  """
  config: Any  # the `config.model` section
  sublayers: str = "both"  # both | attention | ffn

  @nn.compact
  def __call__(self, x_BLD, mask_B11L, deterministic: bool, decode: bool = False):
    """x: [batch, length, hidden]; mask: [batch, 1, 1, length] bool → [batch, length, hidden].
    `decode`: the attention's KV cache (layers.SelfAttention; causal models only)."""
    c = self.config
    dtype = jnp.dtype(c.dtype)
    if self.sublayers != "ffn":
      x_BLD = _residual(c, x_BLD, "attention_ln", "attention_adapter", lambda h: (
          layers.SelfAttention(
              heads=c.heads, head_dim=c.hidden // c.heads, attention_dropout=c.attention_dropout,
              initializer_range=c.initializer_range, attention_impl=c.attention_impl,
              dtype=dtype, dropout_bits=c.dropout_bits, causal=c.get("causal", False),
              fused_qkv=c.get("fused_qkv", False), fp8_matmuls=c.get("fp8_matmuls", False),
              output_initializer_range=residual_initializer_range(c),
              weight_init=c.weight_init, name="attention")(
                  h, mask_B11L, deterministic=deterministic, decode=decode)),
          deterministic)
    if self.sublayers != "attention":
      x_BLD = _residual(c, x_BLD, "output_ln", "ffn_adapter", layers.MLP(
          c.mlp, c.activation, c.initializer_range, dtype, c.get("fp8_matmuls", False),
          output_initializer_range=residual_initializer_range(c), weight_init=c.weight_init,
          name="mlp"), deterministic)
    return x_BLD



class ScannedLayer(TransformerLayer):
  """TransformerLayer with the (carry, x) → (carry, y) signature `nn.scan` needs; y is the layer's
  output when `collect` (stacked by the scan into [layers, batch, length, hidden]), else None."""

  def __call__(self, x_BLD, mask_B11L, deterministic: bool, collect: bool,
               decode: bool = False):
    x_BLD = super().__call__(x_BLD, mask_B11L, deterministic, decode)
    return x_BLD, (x_BLD if collect else None)


class DecodePosition(nn.Module):
  """While decoding with a KV cache: the position of a call's first token, from the "cache"
  collection's `position_index`, advanced by the call's `length`; 0 at the first call, which
  creates the caches and advances nothing."""

  @nn.compact
  def __call__(self, length: int):
    if not self.has_variable("cache", "position_index"):
      self.variable("cache", "position_index", lambda: jnp.array(0, jnp.int32))
      return 0
    index = self.variable("cache", "position_index")
    first = index.value
    index.value = first + length
    return first


class Encoder(nn.Module):
  """Embeddings + `layers` Transformer layers.

  `__call__(input_ids [batch, length], input_mask [batch, length], segment_ids [batch, length])`
  returns hidden states [batch, length, hidden]; with `return_all_layers=True` the pair (those,
  [layers + 1, batch, length, hidden]: the embedding output (after dropout and the factorised
  projection) then every layer's output, bert modeling.py's all_encoder_layers with the input).
  `attend(h [..., E])` projects onto the word-embedding table ([..., vocab]) for heads tied to the
  input embedding (E = embedding_size when factorised, else hidden).

  `model.embedding_dropout`: 'output' (BERT, HF's GPT) drops the summed embeddings; 'table'
  (GPT, finetune-transformer-lm train.py model(): `we = dropout(we, embd_pdrop)` on the one
  table of tokens and positions) drops the word and position tables themselves, one mask per
  table and step, and `attend(h, deterministic=False)` reads the same dropped word table, as the
  reference's tied LM logits do. Its key is drawn once per `apply` (in `setup`), so the lookups
  and `attend` of one step share it.

  `embeddings_from`: another Encoder whose embedding tables and embedding LayerNorm this one
  uses (and owns no copy of), ELECTRA's generator reading the discriminator's; `config.
  embedding_size` must then equal that encoder's embedding width (a projection to this encoder's
  `hidden` follows when they differ). Dropout and the projection stay this encoder's own.
  """
  config: Any  # the `config.model` section
  embeddings_from: Optional["Encoder"] = None

  def setup(self):
    c = self.config
    dtype = jnp.dtype(c.dtype)
    if self.embeddings_from is None:
      width, axis = ((c.embedding_size, "embed_factor") if factorized_embedding(c)
                     else (c.hidden, "embed"))
      self.word_embeddings = layers.Embedding(c.vocab_size, width, c.initializer_range, dtype,
                                              features_axis=axis,
                                              rows_multiple=c.get("vocab_multiple", 1),
                                              weight_init=c.weight_init)
      self.position_embeddings = layers.Embedding(c.max_positions, width,
                                                  c.get("position_initializer_range", 0.0)
                                                  or c.initializer_range,
                                                  rows_axis="positions", features_axis=axis,
                                                  weight_init=c.weight_init)
      if c.type_vocab_size:
        self.type_embeddings = layers.Embedding(c.type_vocab_size, width, c.initializer_range,
                                                rows_axis="types", features_axis=axis,
                                                weight_init=c.weight_init)
      if c.get("embedding_layer_norm", True):
        self.embeddings_ln = layers.LayerNorm(c.layer_norm_eps, dtype, axis_name=axis)
    self.embeddings_dropout = layers.Dropout(c.dropout, c.dropout_bits)
    # GPT's dropout on the tables: one key per apply, shared by embed and attend.
    self.table_dropout_rng = (self.make_rng("dropout") if drops_tables(c) and
                              self.has_rng("dropout") else None)
    if factorized_embedding(c):
      self.embeddings_projection = nn.Dense(
          c.hidden, dtype=dtype, param_dtype=jnp.float32,
          kernel_init=layers.bare_dense_init(c, ("embed_factor", "embed")),
          bias_init=layers.zeros_init(("embed",)))
    self.layers = self._make_layers()
    if c.get("pre_layer_norm", False):
      self.final_ln = layers.LayerNorm(c.layer_norm_eps, dtype)
    if c.get("causal", False):
      self.decode_position = DecodePosition()

  def _make_layers(self):
    """Unrolled: {name: module} for the names of `layer_plan`. Scanned: the scans in layer order,
    one over all layers with stacked parameters (share_layers='none'), or one per shared group
    over its consecutive layers with the group's parameters broadcast to every step ('all')."""
    c = self.config
    layer_cls = ScannedLayer if c.scan_layers else TransformerLayer
    if c.remat_policy != "none":
      if c.remat_policy not in REMAT_POLICIES:
        raise ValueError(f"model.remat_policy={c.remat_policy!r}; choose none or one of "
                         f"{sorted(REMAT_POLICIES)}.")
      # deterministic, (collect,) decode; self is 0
      static = (3, 4, 5) if c.scan_layers else (3, 4)
      layer_cls = nn.remat(layer_cls, policy=REMAT_POLICIES[c.remat_policy], static_argnums=static)
    plan = layer_plan(c)
    if not c.scan_layers:
      modules = dict(step for layer in plan for step in layer)  # name → sublayers, deduplicated
      return {name: layer_cls(c, sublayers, name=name) for name, sublayers in modules.items()}
    if c.share_layers == "none":
      scanned = nn.scan(layer_cls, variable_axes={"params": 0, "cache": 0},
                        split_rngs={"params": True, "dropout": True},
                        in_axes=(nn.broadcast,) * 4, length=c.layers,
                        metadata_params={nn.PARTITION_NAME: "layers"})
      return [scanned(c, name="layers")]
    if c.share_layers == "all":
      runs = collections.Counter(name for ((name, _),) in plan)  # groups are consecutive
      return [nn.scan(layer_cls, variable_broadcast="params", variable_axes={"cache": 0},
                      split_rngs={"params": False, "dropout": True},
                      in_axes=(nn.broadcast,) * 4, length=run)(c, name=name)
              for name, run in runs.items()]
    raise ValueError(f"model.scan_layers cannot scan share_layers={c.share_layers!r}; set "
                     "--config.model.scan_layers=False.")

  def embed(self, input_ids, segment_ids=None, first_position=0, deterministic=True):
    """Word + position (+ type) embeddings after the embedding LayerNorm (none when
    `model.embedding_layer_norm` is False: GPT), before the output's dropout: [batch, length] →
    [batch, length, E] (E = embedding_size when factorised, else hidden), from the dropped
    tables with `embedding_dropout='table'` unless `deterministic`; positions count from
    `first_position` (a traced scalar while decoding). `freeze_positions` in the config (set by
    objectives/distillation.build_model, never saved): the position table gets no gradient."""
    c = self.config
    positions_L = first_position + jnp.arange(input_ids.shape[1])
    positions_LE = self.position_embeddings(positions_L, self._table_dropout(deterministic, 1))
    if c.get("freeze_positions", False):   # DistilBERT's student: its teacher's table, fixed
      positions_LE = jax.lax.stop_gradient(positions_LE)
    x_BLE = (self.word_embeddings(input_ids, self._table_dropout(deterministic, 0))
             + positions_LE[None])
    if c.type_vocab_size:
      ids = jnp.zeros_like(input_ids) if segment_ids is None else segment_ids
      x_BLE = x_BLE + self.type_embeddings(ids)
    return self.embeddings_ln(x_BLE) if c.get("embedding_layer_norm", True) else x_BLE

  def __call__(self, input_ids, input_mask, segment_ids=None, *, deterministic: bool,
               return_all_layers: bool = False, decode: bool = False, attention_mask=None):
    """`decode` (causal models): generate with the KV cache. The first call, with the full
    length [batch, max_length], creates the caches; each later call appends its tokens
    [batch, length] at the next positions (generate.py). `attention_mask` [batch, 1, length,
    length] bool (UniLM's per-row masks, objectives/unilm.py): which keys each query attends to,
    instead of every real token; it must itself exclude padding (`input_mask` is then unused)."""
    c = self.config
    dtype = jnp.dtype(c.dtype)
    owner = self if self.embeddings_from is None else self.embeddings_from
    if decode and not c.get("causal", False):
      raise ValueError("decode=True (a KV cache) needs a causal model (model.causal=True).")
    first = self.decode_position(input_ids.shape[1]) if decode else 0
    x_BLE = owner.embed(input_ids, segment_ids, first, deterministic)
    if not drops_tables(c):
      x_BLE = self.embeddings_dropout(x_BLE, deterministic=deterministic)
    x_BLD = self.embeddings_projection(x_BLE) if factorized_embedding(c) else x_BLE
    x_BLD = nn.with_logical_constraint(x_BLD.astype(dtype), ("batch", "length", "act_embed"))
    mask_B11L = (layers.attention_mask_from_input_mask(input_mask) if attention_mask is None
                 else attention_mask)
    hidden = [x_BLD[None]]  # [1 or run, batch, length, hidden] pieces, in layer order
    if c.scan_layers:
      for scanned in self.layers:
        x_BLD, outputs = scanned(x_BLD, mask_B11L, deterministic, return_all_layers, decode)
        hidden.append(outputs)
    else:
      for layer in layer_plan(c):
        for name, _ in layer:
          x_BLD = self.layers[name](x_BLD, mask_B11L, deterministic, decode)
        hidden.append(x_BLD[None])
    if c.get("pre_layer_norm", False):   # GPT-2's ln_f; the last layer's output is after it (HF)
      x_BLD = self.final_ln(x_BLD)
    if not return_all_layers:
      return x_BLD
    all_LBLD = jnp.concatenate(hidden, axis=0)
    return x_BLD, all_LBLD.at[-1].set(x_BLD) if c.get("pre_layer_norm", False) else all_LBLD

  def attend(self, h, deterministic=True):
    """[..., E] → logits over the vocabulary [..., vocab] with the tied embedding table, in the
    compute dtype (the loss upcasts to float32); the step's dropped table with
    `embedding_dropout='table'` unless `deterministic`."""
    if self.embeddings_from is not None:
      return self.embeddings_from.attend(h)
    return self.word_embeddings.attend(h, self._table_dropout(deterministic, 0))

  def _table_dropout(self, deterministic: bool, table: int):
    """`layers.Embedding`'s dropout argument for table 0 (words) or 1 (positions): None unless
    the tables are dropped in this training step."""
    if deterministic or self.table_dropout_rng is None or not self.config.dropout:
      return None
    return (jax.random.fold_in(self.table_dropout_rng, table), self.config.dropout,
            self.config.dropout_bits)
