"""HuggingFace state_dict names ↔ our parameter trees: BERT-style encoders and their heads, T5
(T5ForConditionalGeneration), XLNet (XLNetLMHeadModel) and GPT (GPT2LMHeadModel,
OpenAIGPTLMHeadModel).

One table drives both directions: `encoder_entries` / `head_entries` / `t5_entries` /
`xlnet_entries` list every parameter as an `Entry` (our path, HF name, how the array is laid out
in each), `params_from_hf` fills our tree from an HF state_dict (numpy, HF names → arrays) and
`params_to_hf` writes it back.

Layouts: torch Linear weights are [out, in] (our Dense kernels [in, out]); HF splits attention
head-major ([heads·head_dim, hidden] ↔ our [hidden, heads, head_dim]); RoBERTa's position table
has `position_offset` = padding_idx + 1 rows before the first real position, which we drop on the
way in and write back as zeros (HF's padding row is zero-initialised and never trained).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable

import numpy as np

from bertfam_jax.models.layers import padded_rows
from bertfam_jax.models.encoder import factorized_embedding

# Our Transformer-layer parameters → HF's names inside one layer module.
BERT_LAYER = dict(query="attention.self.query", key="attention.self.key",
                  value="attention.self.value", output="attention.output.dense",
                  attention_ln="attention.output.LayerNorm", intermediate="intermediate.dense",
                  mlp_output="output.dense", output_ln="output.LayerNorm")
ALBERT_LAYER = dict(query="attention.query", key="attention.key", value="attention.value",
                    output="attention.dense", attention_ln="attention.LayerNorm",
                    intermediate="ffn", mlp_output="ffn_output",
                    output_ln="full_layer_layer_norm")

# ELECTRA's discriminator and generator are separate HF checkpoints; our one `Electra` holds both,
# its generator reading the discriminator's embedding tables and LayerNorm (SHARED_EMBEDDINGS).
SHARED_EMBEDDINGS = ("word_embeddings", "position_embeddings", "type_embeddings", "embeddings_ln")


@dataclasses.dataclass(frozen=True)
class Entry:
  """One parameter: `ours` its path in our tree, `theirs` its HF name, `to_ours` / `to_hf` the
  array conversions between the two layouts. A fused HF tensor (GPT's c_attn: query, key and
  value in one) maps to a subtree of ours: `to_ours` returns a nested dict, merged into the tree
  beside the other entries' leaves, and `to_hf` reads that subtree."""
  ours: tuple[str, ...]
  theirs: str
  to_ours: Callable[[np.ndarray], np.ndarray] = lambda x: x
  to_hf: Callable[[np.ndarray], np.ndarray] = lambda x: x


def _transpose(x):
  return np.ascontiguousarray(x.T)


def dense(ours, theirs) -> list[Entry]:
  """A torch Linear `theirs` ↔ our nn.Dense at `ours`."""
  return [Entry(ours + ("kernel",), f"{theirs}.weight", _transpose, _transpose),
          Entry(ours + ("bias",), f"{theirs}.bias")]


def layer_norm(ours, theirs) -> list[Entry]:
  return [Entry(ours + ("norm", "scale"), f"{theirs}.weight"),
          Entry(ours + ("norm", "bias"), f"{theirs}.bias")]


def heads_in(ours, theirs, hidden: int, heads: int) -> Entry:
  """A torch Linear weight [heads·head_dim, hidden] (query, key, value) ↔ our per-head kernel
  [hidden, heads, head_dim]."""
  return Entry(ours, theirs, lambda w: np.ascontiguousarray(w.T.reshape(hidden, heads, -1)),
               lambda k: _transpose(k.reshape(hidden, -1)))


def heads_out(ours, theirs, hidden: int, heads: int) -> Entry:
  """A torch Linear weight [hidden, heads·head_dim] (the output projection) ↔ our per-head
  kernel [heads, head_dim, hidden]."""
  return Entry(ours, theirs, lambda w: np.ascontiguousarray(w.T.reshape(heads, -1, hidden)),
               lambda k: _transpose(k.reshape(-1, hidden)))


def _attention(ours, name, config) -> list[Entry]:
  """BERT's attention: query/key/value and output kernels (heads_in / heads_out) with biases
  [heads·head_dim] ↔ [heads, head_dim]."""
  hidden, heads = config.hidden, config.heads
  entries = []
  for part in ("query", "key", "value"):
    entries += [heads_in(ours + (part, "kernel"), f"{name[part]}.weight", hidden, heads),
                Entry(ours + (part, "bias"), f"{name[part]}.bias",
                      lambda b: b.reshape(heads, -1), lambda b: b.reshape(-1))]
  return entries + [
      heads_out(ours + ("output", "kernel"), f"{name['output']}.weight", hidden, heads),
      Entry(ours + ("output", "bias"), f"{name['output']}.bias")]


def _vocabulary(config) -> tuple[Callable, Callable]:
  """(to_ours, to_hf) of the word table: ours has `vocab_multiple`'s padding rows (zeros on
  import), HF's the `vocab_size` real ones."""
  rows = config.vocab_size
  padded = padded_rows(rows, config.get("vocab_multiple", 1))

  def to_ours(table):
    return np.concatenate([table, np.zeros((padded - rows, table.shape[1]), table.dtype)])

  return to_ours, (lambda table: table[:rows])


def _positions(config, offset: int) -> tuple[Callable, Callable]:
  rows = config.max_positions

  def to_hf(table):
    return np.concatenate([np.zeros((offset, table.shape[1]), table.dtype), table])

  return (lambda table: table[offset:offset + rows]), to_hf


def encoder_entries(config, *, prefix: str, position_offset: int = 0,
                    layers: dict[str, str] | None = None, layer_names=BERT_LAYER,
                    projection: str | None = None) -> list[Entry]:
  """The entries of our `Encoder` (config: its `model` section) inside an HF BERT-style model.

  Args:
    prefix: the encoder's HF name, 'bert', 'roberta', 'albert' or 'electra'.
    position_offset: the first row of HF's position table that a real token uses (RoBERTa: its
      padding_idx + 1 = 2); our table is the `max_positions` rows from there.
    layers: {our layer module: HF layer module}; default BERT's `layer_{i}` ←
      `{prefix}.encoder.layer.{i}`.
    layer_names: the parameter names inside an HF layer module (BERT_LAYER or ALBERT_LAYER).
    projection: HF name of the embedding → hidden projection of a factorised embedding (ALBERT's
      `albert.encoder.embedding_hidden_mapping_in`, ELECTRA's `electra.embeddings_project`).
  """
  embeddings = f"{prefix}.embeddings"
  entries = [
      Entry(("word_embeddings", "embedding"), f"{embeddings}.word_embeddings.weight",
            *_vocabulary(config)),
      Entry(("position_embeddings", "embedding"), f"{embeddings}.position_embeddings.weight",
            *_positions(config, position_offset)),
      Entry(("type_embeddings", "embedding"), f"{embeddings}.token_type_embeddings.weight"),
      *layer_norm(("embeddings_ln",), f"{embeddings}.LayerNorm"),
  ]
  if projection:
    entries += dense(("embeddings_projection",), projection)
  if layers is None:
    layers = {f"layer_{i}": f"{prefix}.encoder.layer.{i}" for i in range(config.layers)}
  for ours, theirs in layers.items():
    name = {k: f"{theirs}.{v}" for k, v in layer_names.items()}
    entries += [*_attention((ours, "attention"), name, config),
                *layer_norm((ours, "attention_ln"), name["attention_ln"]),
                *dense((ours, "mlp", "intermediate"), name["intermediate"]),
                *dense((ours, "mlp", "output"), name["mlp_output"]),
                *layer_norm((ours, "output_ln"), name["output_ln"])]
  return entries


def head_entries(root: str, names: dict[str, str]) -> list[Entry]:
  """{our parameter: HF name} of a head at our top-level `root` → its entries: our '*_ln' are
  LayerNorms, 'output_bias' and 'bias' bare vectors, the rest Linear layers."""
  entries = []
  for ours, theirs in names.items():
    path = (root, ours)
    entries += ([Entry(path, theirs)] if ours in ("output_bias", "bias") else
                layer_norm(path, theirs) if ours.endswith("_ln") else dense(path, theirs))
  return entries


def mlm_head_names(transform, transform_ln, output_bias) -> dict[str, str]:
  return dict(transform=transform, transform_ln=transform_ln, output_bias=output_bias)


def sentence_head_names(pooler, classifier) -> dict[str, str]:
  return dict(pooler=pooler, classifier=classifier)


ELECTRA_HEADS = {
    "discriminator": {"rtd_head": dict(transform="discriminator_predictions.dense",
                                       prediction="discriminator_predictions.dense_prediction")},
    "generator": {"generator_head": mlm_head_names("generator_predictions.dense",
                                                   "generator_predictions.LayerNorm",
                                                   "generator_lm_head.bias")},
}


def electra_entries(config, network: str) -> list[Entry]:
  """The entries of an HF ElectraForPreTraining (network='discriminator') or ElectraForMaskedLM
  ('generator') inside our `Electra`:
    discriminator  {'encoder', 'rtd_head'}
    generator      {'encoder': the SHARED_EMBEDDINGS only, 'generator', 'generator_head'}
  `config` is that network's `model` section (the generator's from config_lib.electra_generator)."""
  root = "encoder" if network == "discriminator" else "generator"
  entries = [
      dataclasses.replace(e, ours=(("encoder" if e.ours[0] in SHARED_EMBEDDINGS else root),)
                          + e.ours)
      for e in encoder_entries(
          config, prefix="electra",
          projection="electra.embeddings_project" if factorized_embedding(config) else None)]
  for head, names in ELECTRA_HEADS[network].items():
    entries += head_entries(head, names)
  return entries


def params_from_hf(state_dict: dict[str, np.ndarray], entries: list[Entry]) -> dict[str, Any]:
  """Our nested parameter tree (numpy) of `entries` from an HF state_dict."""
  missing = [e.theirs for e in entries if e.theirs not in state_dict]
  if missing:
    raise KeyError(f"HF state_dict lacks {missing[:5]} ({len(missing)} missing).")
  tree = {}
  for e in entries:
    node = tree
    for key in e.ours[:-1]:
      node = node.setdefault(key, {})
    _merge(node, e.ours[-1], e.to_ours(state_dict[e.theirs]))
  return tree


def _merge(node: dict, key: str, value) -> None:
  """node[key] = value, a subtree (dict) merged into what node[key] holds."""
  if not isinstance(value, dict):
    node[key] = np.asarray(value)
    return
  inner = node.setdefault(key, {})
  for k, v in value.items():
    _merge(inner, k, v)


def params_to_hf(params: dict[str, Any], entries: list[Entry]) -> dict[str, np.ndarray]:
  """The HF state_dict (name → numpy) of `entries` read from our parameter tree."""
  state_dict = {}
  for e in entries:
    node = params
    for key in e.ours:
      node = node[key]
    state_dict[e.theirs] = np.ascontiguousarray(
        e.to_hf(node if isinstance(node, dict) else np.asarray(node)))
  return state_dict


# Our T5 (models/t5.py) sublayers → their module in HF's T5Block; the attention kernels → HF's
# T5Attention Linear layers; the relative position table, which HF keeps in each stack's first
# block only (has_relative_attention_bias) and our stack holds once.
T5_ENCODER_LAYER = dict(pre_attention_layer_norm="layer.0.layer_norm",
                        attention="layer.0.SelfAttention",
                        pre_mlp_layer_norm="layer.1.layer_norm", mlp="layer.1.DenseReluDense")
T5_DECODER_LAYER = dict(pre_self_attention_layer_norm="layer.0.layer_norm",
                        self_attention="layer.0.SelfAttention",
                        pre_cross_attention_layer_norm="layer.1.layer_norm",
                        encoder_decoder_attention="layer.1.EncDecAttention",
                        pre_mlp_layer_norm="layer.2.layer_norm", mlp="layer.2.DenseReluDense")
T5_ATTENTION = dict(query="q", key="k", value="v")
T5_RELATIVE_BIAS = "block.0.layer.0.SelfAttention.relative_attention_bias.weight"


def t5_entries(config) -> list[Entry]:
  """The entries of our encoder–decoder `T5` (config: its model section) inside an HF
  T5ForConditionalGeneration:
    token_embedder/embedding [vocab, hidden]        shared.weight
    {stack}/relpos_bias/rel_embedding [buckets, heads]  {stack}.T5_RELATIVE_BIAS
    {stack}/layer_{i}/<T5_*_LAYER key>              {stack}.block.{i}.<its value>: RMSNorm scales,
                                                    q/k/v/o (heads_in / heads_out, no biases),
                                                    wi | wi_0, wi_1 and wo (transposed)
    {stack}/{stack}_norm/scale                      {stack}.final_layer_norm.weight
    decoder/logits_dense/kernel [hidden, vocab]     lm_head.weight [vocab, hidden], untied only
  for stack in encoder, decoder."""
  hidden, heads = config.hidden, config.heads
  mlp = ("wi_0", "wi_1", "wo") if config.gated_mlp else ("wi", "wo")
  entries = [Entry(("token_embedder", "embedding"), "shared.weight")]
  for stack, depth, sublayers in (("encoder", config.layers, T5_ENCODER_LAYER),
                                  ("decoder", config.decoder_layers, T5_DECODER_LAYER)):
    entries += [Entry((stack, "relpos_bias", "rel_embedding"), f"{stack}.{T5_RELATIVE_BIAS}"),
                Entry((stack, f"{stack}_norm", "scale"), f"{stack}.final_layer_norm.weight")]
    for i, (ours, theirs) in itertools.product(range(depth), sublayers.items()):
      path, name = (stack, f"layer_{i}", ours), f"{stack}.block.{i}.{theirs}"
      if ours.endswith("layer_norm"):
        entries.append(Entry(path + ("scale",), f"{name}.weight"))
      elif ours == "mlp":
        entries += [Entry(path + (n, "kernel"), f"{name}.{n}.weight", _transpose, _transpose)
                    for n in mlp]
      else:
        entries += [heads_in(path + (part,), f"{name}.{linear}.weight", hidden, heads)
                    for part, linear in T5_ATTENTION.items()]
        entries.append(heads_out(path + ("out",), f"{name}.o.weight", hidden, heads))
  if not config.tie_embeddings:
    entries.append(Entry(("decoder", "logits_dense", "kernel"), "lm_head.weight", _transpose,
                         _transpose))
  return entries


# Our XLNet (models/xlnet.py) inside HF's XLNetLMHeadModel: the attention projections and segment
# embedding keep HF's [hidden, heads, head_dim] / [2, heads, head_dim] layouts; HF keeps the
# relative-attention biases in every layer whatever its untie_r says.
XLNET_ATTENTION = ("q", "k", "v", "o", "r", "seg_embed")
XLNET_BIASES = ("r_w_bias", "r_r_bias", "r_s_bias")


def xlnet_entries(config) -> list[Entry]:
  """The entries of our `XLNet` (config: its model section) inside an HF XLNetLMHeadModel,
  without the output bias (its head, lm_loss/bias ↔ lm_loss.bias; the output weight is the tied
  word embedding):
    word_embedding/embedding [vocab, hidden]     transformer.word_embedding.weight
    mask_emb [1, 1, hidden]                      transformer.mask_emb
    layer_{i}/rel_attn/XLNET_ATTENTION           transformer.layer.{i}.rel_attn.* (as stored)
    layer_{i}/rel_attn/XLNET_BIASES [heads, head_dim]   transformer.layer.{i}.rel_attn.*; with
      untie_r=False our one top-level copy ↔ every layer's (read from each, written to each)
    layer_{i}/rel_attn/layer_norm, ff/layer_1, ff/layer_2, ff/layer_norm   the same names."""
  entries = [Entry(("word_embedding", "embedding"), "transformer.word_embedding.weight"),
             Entry(("mask_emb",), "transformer.mask_emb")]
  for i in range(config.layers):
    ours, theirs = (f"layer_{i}",), f"transformer.layer.{i}"
    attention = f"{theirs}.rel_attn"
    entries += [Entry(ours + ("rel_attn", n), f"{attention}.{n}") for n in XLNET_ATTENTION]
    entries += [Entry((ours + ("rel_attn",) if config.untie_r else ()) + (n,), f"{attention}.{n}")
                for n in XLNET_BIASES]
    entries += [*layer_norm(ours + ("rel_attn", "layer_norm"), f"{attention}.layer_norm"),
                *dense(ours + ("ff", "layer_1"), f"{theirs}.ff.layer_1"),
                *dense(ours + ("ff", "layer_2"), f"{theirs}.ff.layer_2"),
                *layer_norm(ours + ("ff", "layer_norm"), f"{theirs}.ff.layer_norm")]
  return entries


# Our causal `Encoder` (GPT: model.causal) inside HF's GPT-2 and OpenAI GPT, whose Conv1D weights
# are [in, out] as our kernels; c_attn holds query, key and value side by side ([hidden,
# 3·hidden] and [3·hidden]). {ours: (GPT-2's name, OpenAI GPT's name)}.
GPT_NAMES = dict(word_embeddings=("wte", "tokens_embed"),
                 position_embeddings=("wpe", "positions_embed"))
GPT_QKV = ("query", "key", "value")


def _fused_qkv(part: str, heads: int):
  """(to_ours, to_hf) of c_attn's `part` ('kernel' [hidden, 3·hidden] or 'bias' [3·hidden]) ↔
  {query, key, value: {part: [hidden,] heads, head_dim}}."""

  def to_ours(w):
    return {name: {part: piece.reshape(piece.shape[:-1] + (heads, -1))}
            for name, piece in zip(GPT_QKV, np.split(w, 3, axis=-1))}

  def to_hf(subtree):
    pieces = [np.asarray(subtree[name][part]) for name in GPT_QKV]
    return np.concatenate([p.reshape(p.shape[:-2] + (-1,)) for p in pieces], axis=-1)

  return to_ours, to_hf


def gpt_entries(config, openai: bool) -> list[Entry]:
  """The entries of our causal `Encoder` (config: its model section) inside HF's
  GPT2LMHeadModel (`openai` False) or OpenAIGPTLMHeadModel (True), names with the `transformer.`
  prefix; the LM head is the tied token embedding:
    word_embeddings, position_embeddings/embedding   transformer.{wte, wpe | tokens_embed,
                                                      positions_embed}.weight
    layer_{i}/attention/{query,key,value}            transformer.h.{i}.attn.c_attn (fused)
    layer_{i}/attention/output                       transformer.h.{i}.attn.c_proj
    layer_{i}/mlp/{intermediate,output}              transformer.h.{i}.mlp.{c_fc,c_proj}
    layer_{i}/{attention_ln,output_ln}               transformer.h.{i}.{ln_1,ln_2}
    final_ln (pre-LN, GPT-2)                         transformer.ln_f"""
  heads = config.heads
  entries = [Entry((ours, "embedding"), f"transformer.{names[openai]}.weight",
                   *(_vocabulary(config) if ours == "word_embeddings" else ()))
             for ours, names in GPT_NAMES.items()]
  for i in range(config.layers):
    ours, theirs = (f"layer_{i}",), f"transformer.h.{i}"
    attention = ours + ("attention",)
    for part, suffix in (("kernel", "weight"), ("bias", "bias")):
      entries.append(Entry(attention, f"{theirs}.attn.c_attn.{suffix}",
                           *_fused_qkv(part, heads)))
    entries += [
        Entry(attention + ("output", "kernel"), f"{theirs}.attn.c_proj.weight",
              lambda w: w.reshape(heads, -1, w.shape[-1]),
              lambda k: k.reshape(-1, k.shape[-1])),
        Entry(attention + ("output", "bias"), f"{theirs}.attn.c_proj.bias"),
        Entry(ours + ("mlp", "intermediate", "kernel"), f"{theirs}.mlp.c_fc.weight"),
        Entry(ours + ("mlp", "intermediate", "bias"), f"{theirs}.mlp.c_fc.bias"),
        Entry(ours + ("mlp", "output", "kernel"), f"{theirs}.mlp.c_proj.weight"),
        Entry(ours + ("mlp", "output", "bias"), f"{theirs}.mlp.c_proj.bias"),
        *layer_norm(ours + ("attention_ln",), f"{theirs}.ln_1"),
        *layer_norm(ours + ("output_ln",), f"{theirs}.ln_2")]
  if config.pre_layer_norm:
    entries += layer_norm(("final_ln",), "transformer.ln_f")
  return entries
