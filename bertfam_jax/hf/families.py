"""The HF model families we read and write: config translation and which heads each HF class holds.

`FAMILIES[model_type]` is a `Family`: bert, roberta, albert, electra (our BERT-style `Encoder`
plus heads, Network ENCODER), t5 (T5ForConditionalGeneration ↔ models/t5.py, Network T5),
xlnet (XLNetLMHeadModel ↔ models/xlnet.py, Network XLNET), gpt2 and openai-gpt
(GPT2LMHeadModel / OpenAIGPTLMHeadModel ↔ models/pretraining.CausalLM, Network GPT). The `Network` holds what differs
between those kinds of model: the HF config keys and their translation, the name table
(mapping.py), the pre-training recipe of an imported checkpoint and the token ids of an export.
A family lists its `Architecture`s (HF classes) most heads first; `detect` picks the first whose
head parameters the checkpoint holds, so e.g. bert-base-uncased (config says BertForMaskedLM,
weights hold NSP too) imports with both heads, and a bare BertModel / XLNetModel with fresh
ones.

Fine-tuned checkpoints are a family's task classes (`Family.tasks`: *ForSequenceClassification,
*ForTokenClassification, *ForQuestionAnswering, *ForMultipleChoice), whose heads are our
`models.finetune.FineTuneModel` heads; config.json's `architectures` names them (their weights
alone cannot tell sequence classification from multiple choice). Where HF's head computes
something else than ours, the class names the config under which it equals ours
(`Architecture.hf_fields`: ELECTRA's multiple-choice summary with tanh) or why it never does
(`Architecture.mismatch`: ELECTRA's GELU classification head), and such checkpoints and runs are
refused.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import ml_collections
import numpy as np

from bertfam_jax import config_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.data import packing
from bertfam_jax.hf import mapping
from bertfam_jax.models import finetune as finetune_models
from bertfam_jax.models.encoder import factorized_embedding

# HF hidden_act → our model.activation: HF 'gelu' is exact erf; 'gelu_new' and
# 'gelu_pytorch_tanh' are the tanh approximation of TF BERT / ALBERT.
ACTIVATIONS_FROM_HF = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                       "relu": "relu"}
ACTIVATIONS_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}

REQUIRED_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "intermediate_size", "max_position_embeddings")
# HF's config defaults (BertConfig) for the keys an older config.json may omit.
COMMON_DEFAULTS = dict(hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                       type_vocab_size=2, initializer_range=0.02, layer_norm_eps=1e-12,
                       pad_token_id=0)


@dataclasses.dataclass(frozen=True)
class Architecture:
  """An HF class of a family and the part of our model its checkpoint holds.

  name: the HF class (config.json `architectures`); objective: our objective ('mlm' or
  'electra'; '' for a task class); sentence_task: 'nsp' / 'sop' / ''; heads: {our head module:
  {our parameter: HF name}}; gelu_head: HF hard-wires exact GELU in this class's MLM head
  (RoBERTa, ELECTRA's generator) where ours uses model.activation, so the model must use 'gelu'.
  Task classes: kind, the FineTuneModel kind of the head ('classification' also stands for
  regression, HF's num_labels=1 / problem_type='regression'); hf_fields, HF config values under
  which HF's head computes ours (written on export, required on import); mismatch, why HF's head
  differs from ours when no config makes it equal."""
  name: str
  objective: str
  sentence_task: str
  heads: dict[str, dict[str, str]]
  gelu_head: bool = False
  kind: str = ""
  hf_fields: dict = dataclasses.field(default_factory=dict)
  mismatch: str = ""


@dataclasses.dataclass(frozen=True)
class Network:
  """The kind of model a family's checkpoints hold (ENCODER: our BERT-style `Encoder` plus
  heads; T5; XLNET) and how it translates. required: the HF config keys a config.json must have;
  defaults: the HF class's defaults of the other keys we read or write; model_from_hf(family,
  hf): our `model` section of a full HF config; model_to_hf(family, model, hf): the HF config
  fields of our model section (`hf`: the other fields, e.g. the token ids); entries(family,
  model, hf): the mapping entries of every parameter but those of Architecture.heads; recipe(family,
  arch, config): sets the objective, data and optimizer of a checkpoint's pre-training;
  token_ids(tokenizer): the HF config's token id fields for our tokenizer; names(family, hf,
  state_dict): the checkpoint's state_dict under the names `entries` use (a bare model's prefix
  added, HF's implicit weights made explicit)."""
  required: tuple[str, ...]
  defaults: dict
  model_from_hf: Callable
  model_to_hf: Callable
  entries: Callable
  recipe: Callable
  token_ids: Callable
  names: Callable


@dataclasses.dataclass(frozen=True)
class Family:
  """model_type: HF's; network: the kind of model (Network); architectures: the pre-training
  classes, most heads first; base: the one whose objective describes a task class's encoder (it
  receives that encoder when the task head is left out); tasks: the task classes; defaults: HF
  config defaults beyond the network's. Read by the ENCODER network only: model_from_hf(hf) /
  model_to_hf(model), the family's own config fields; encoder(model, hf), the encoder's mapping
  entries; objective, our objective fields for a checkpoint of this family (the paper's recipe);
  packing, data.packing without a sentence task, and document_separator its
  data.document_separator; position_offset(hf), the first position row a
  real token uses (RoBERTa)."""
  model_type: str
  network: Network
  architectures: tuple[Architecture, ...] = ()
  base: str = ""
  tasks: tuple[Architecture, ...] = ()
  defaults: dict = dataclasses.field(default_factory=dict)
  model_from_hf: Callable[[dict], dict] = lambda hf: {}
  model_to_hf: Callable[[ml_collections.ConfigDict], dict] = lambda model: {}
  encoder: Callable = None
  objective: dict = dataclasses.field(default_factory=dict)
  packing: str = "full_sentences"
  document_separator: bool = False   # data.document_separator (RoBERTa's)
  position_offset: Callable[[dict], int] = lambda hf: 0

  def architecture(self, name: str) -> Architecture:
    for arch in self.architectures + self.tasks:
      if arch.name == name:
        return arch
    raise ConfigError(f"{name} is not a {self.model_type} class we map; choose one of "
                      f"{[a.name for a in self.architectures + self.tasks]}.")

  def task(self, name: str) -> Architecture | None:
    """The task class called `name`, or None."""
    return next((arch for arch in self.tasks if arch.name == name), None)

  def task_architecture(self, kind: str) -> Architecture:
    """The task class of a FineTuneModel `kind` (regression: *ForSequenceClassification)."""
    head_kind = "classification" if kind == "regression" else kind
    return next(arch for arch in self.tasks if arch.kind == head_kind)

  def detect(self, state_dict) -> tuple[Architecture, tuple[str, ...]]:
    """(the first architecture whose head parameters are all in `state_dict`, or the last one,
    the heads `state_dict` lacks, which are then freshly initialised)."""
    for arch in self.architectures:
      if all(e.theirs in state_dict for e in head_entries(arch)):
        return arch, ()
    arch = self.architectures[-1]
    return arch, tuple(arch.heads)


def head_entries(arch: Architecture) -> list[mapping.Entry]:
  return [e for root, names in arch.heads.items() for e in mapping.head_entries(root, names)]


def entries(family: Family, arch: Architecture, model, hf: dict,
            heads: bool = True) -> list[mapping.Entry]:
  """Every parameter of `arch` for our `model` (a BERT-style encoder under 'encoder'), without
  the heads when `heads` is False; `hf` is the full HF config (full_hf_config)."""
  return family.network.entries(family, model, hf) + (head_entries(arch) if heads else [])


# --------------------------------------------------------------------------------------- networks


def with_prefix(state_dict: dict, prefix: str, probe: str) -> dict:
  """The state_dict of a bare model class (BertModel, XLNetModel), whose names lack the `prefix`
  that its head classes give them, under the head classes' names; unchanged when it holds
  `probe` (a name of a head class)."""
  if probe in state_dict:
    return state_dict
  return {f"{prefix}.{k}": v for k, v in state_dict.items()}


def _encoder_model_from_hf(family: Family, hf: dict) -> ml_collections.ConfigDict:
  if hf["hidden_act"] not in ACTIVATIONS_FROM_HF:
    raise ConfigError(f"HF hidden_act={hf['hidden_act']!r} has no counterpart here; supported: "
                      f"{sorted(ACTIVATIONS_FROM_HF)}.")
  return config_lib.encoder(
      "base", vocab_size=hf["vocab_size"], hidden=hf["hidden_size"],
      layers=hf["num_hidden_layers"], heads=hf["num_attention_heads"],
      mlp=hf["intermediate_size"],
      max_positions=hf["max_position_embeddings"] - family.position_offset(hf),
      type_vocab_size=hf["type_vocab_size"], dropout=hf["hidden_dropout_prob"],
      attention_dropout=hf["attention_probs_dropout_prob"], layer_norm_eps=hf["layer_norm_eps"],
      activation=ACTIVATIONS_FROM_HF[hf["hidden_act"]], initializer_range=hf["initializer_range"],
      **family.model_from_hf(hf))


def _encoder_model_to_hf(family: Family, model, hf: dict) -> dict:
  if model.activation not in ACTIVATIONS_TO_HF:
    raise ConfigError(f"model.activation={model.activation!r} has no HF hidden_act.")
  if not model.type_vocab_size:
    raise ConfigError("HF encoders always have token types; export needs model.type_vocab_size "
                      ">= 1.")
  fields = dict(
      vocab_size=model.vocab_size, hidden_size=model.hidden, num_hidden_layers=model.layers,
      num_attention_heads=model.heads, intermediate_size=model.mlp,
      hidden_act=ACTIVATIONS_TO_HF[model.activation], hidden_dropout_prob=model.dropout,
      attention_probs_dropout_prob=model.attention_dropout,
      type_vocab_size=model.type_vocab_size, initializer_range=model.initializer_range,
      layer_norm_eps=model.layer_norm_eps, tie_word_embeddings=True, **family.model_to_hf(model))
  fields["max_position_embeddings"] = model.max_positions + family.position_offset(
      {**hf, **fields})
  return fields


def _encoder_entries(family: Family, model, hf: dict) -> list[mapping.Entry]:
  return [dataclasses.replace(e, ours=("encoder",) + e.ours) for e in family.encoder(model, hf)]


def _encoder_recipe(family: Family, arch: Architecture, config) -> None:
  """The masked LM (+ NSP / SOP) or ELECTRA objective of `arch` with the family's recipe, a
  sequence length within the model's positions."""
  config.data.seq_len = min(config.data.seq_len, config.model.max_positions)
  if arch.objective == "electra":
    config.objective = config_lib.electra_objective(
        max_predictions=config_lib.electra_max_predictions(config.data.seq_len, 0.15))
  else:
    config.objective = config_lib.mlm_objective(sentence_task=arch.sentence_task,
                                                **family.objective)
    # A model of fewer positions than BERT's 20 predictions (tests' tiny imports) predicts at
    # most every token.
    config.objective.max_predictions = min(config.objective.max_predictions, config.data.seq_len)
  if not arch.sentence_task:
    config.data.update(packing=family.packing, document_separator=family.document_separator)


def _encoder_names(family: Family, hf: dict, state_dict: dict) -> dict:
  del hf
  return with_prefix(state_dict, family.model_type,
                     f"{family.model_type}.embeddings.word_embeddings.weight")


def _pad_id(tokenizer) -> dict:
  return dict(pad_token_id=tokenizer.pad_id)


ENCODER = Network(
    required=REQUIRED_KEYS, defaults=COMMON_DEFAULTS, model_from_hf=_encoder_model_from_hf,
    model_to_hf=_encoder_model_to_hf, entries=_encoder_entries, recipe=_encoder_recipe,
    token_ids=_pad_id, names=_encoder_names)


# T5 (T5ForConditionalGeneration ↔ models/t5.py): T5Config's keys and defaults.
T5_REQUIRED = ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads")
T5_DEFAULTS = dict(num_decoder_layers=None, relative_attention_num_buckets=32,
                   relative_attention_max_distance=128, dropout_rate=0.1,
                   layer_norm_epsilon=1e-6, feed_forward_proj="relu", tie_word_embeddings=True,
                   is_encoder_decoder=True, pad_token_id=0, eos_token_id=1,
                   decoder_start_token_id=0)


def t5_activation(feed_forward_proj: str) -> tuple[str, bool]:
  """(model.activation, model.gated_mlp) of T5Config.feed_forward_proj '[gated-]ACT', read as
  transformers does: 'gated-gelu' is the tanh GELU (T5 v1.1; dense_act_fn 'gelu_new')."""
  gated = feed_forward_proj.startswith("gated-")
  act = "gelu_new" if feed_forward_proj == "gated-gelu" else feed_forward_proj[6 * gated:]
  if act not in ACTIVATIONS_FROM_HF:
    raise ConfigError(f"T5 feed_forward_proj={feed_forward_proj!r} has no counterpart in our T5; "
                      f"supported: [gated-]ACT with ACT one of {sorted(ACTIVATIONS_FROM_HF)} "
                      "('relu': T5 v1.0, 'gated-gelu': v1.1).")
  return ACTIVATIONS_FROM_HF[act], gated


def _t5_feed_forward_proj(model) -> str:
  """T5Config.feed_forward_proj of our model section: 'gated-gelu' for v1.1's gated tanh GELU,
  else [gated-] + HF's name of model.activation."""
  for proj in ("gated-gelu", "gated-" * model.gated_mlp + ACTIVATIONS_TO_HF[model.activation]):
    if t5_activation(proj) == (model.activation, model.gated_mlp):
      return proj
  raise ConfigError(f"model.activation={model.activation!r} with gated_mlp=True has no HF "
                    "feed_forward_proj (transformers reads 'gated-gelu' as the tanh GELU); use "
                    "activation='gelu_tanh' (T5 v1.1) to export.")


def t5_tied(hf: dict) -> bool:
  """Whether the decoder output is scaled by d_model^-0.5 and read out through the shared table
  (T5 v1.0; else v1.1's lm_head): transformers 5 writes this as `scale_decoder_outputs` (and
  tie_word_embeddings always true), transformers 4 as `tie_word_embeddings`."""
  return bool(hf.get("scale_decoder_outputs", hf["tie_word_embeddings"]))


def _t5_model_from_hf(family: Family, hf: dict) -> ml_collections.ConfigDict:
  del family
  if (hf["pad_token_id"], hf["decoder_start_token_id"] or 0) != (0, 0):
    raise ConfigError(f"T5 checkpoint with pad_token_id={hf['pad_token_id']} and "
                      f"decoder_start_token_id={hf['decoder_start_token_id']}: our T5 objective "
                      "and text-to-text fine-tuning pad with id 0 and start the decoder with it "
                      "(seqio's layout, every released T5); only such checkpoints import.")
  activation, gated = t5_activation(hf["feed_forward_proj"])
  return config_lib.t5_model(
      "base", "1.1" if gated else "1.0", vocab_size=hf["vocab_size"], hidden=hf["d_model"],
      layers=hf["num_layers"], decoder_layers=hf["num_decoder_layers"] or hf["num_layers"],
      heads=hf["num_heads"], head_dim=hf["d_kv"], mlp=hf["d_ff"], activation=activation,
      gated_mlp=gated, dropout=hf["dropout_rate"], layer_norm_eps=hf["layer_norm_epsilon"],
      relative_buckets=hf["relative_attention_num_buckets"],
      relative_max_distance=hf["relative_attention_max_distance"], tie_embeddings=t5_tied(hf))


def _t5_model_to_hf(family: Family, model, hf: dict) -> dict:
  del family, hf
  if model.architecture != "encoder_decoder":
    raise ConfigError(f"model.architecture={model.architecture!r}: HF's "
                      "T5ForConditionalGeneration is an encoder–decoder, and decoder-only / "
                      "prefix-LM T5 runs have no HF class; export an encoder_decoder run.")
  if model.share_encoder_decoder:
    raise ConfigError("model.share_encoder_decoder: HF's T5 has separate encoder and decoder "
                      "layers, so a T5 sharing them has no HF class.")
  return dict(
      vocab_size=model.vocab_size, d_model=model.hidden, d_kv=model.head_dim, d_ff=model.mlp,
      num_layers=model.layers, num_decoder_layers=model.decoder_layers, num_heads=model.heads,
      relative_attention_num_buckets=model.relative_buckets,
      relative_attention_max_distance=model.relative_max_distance, dropout_rate=model.dropout,
      layer_norm_epsilon=model.layer_norm_eps, feed_forward_proj=_t5_feed_forward_proj(model),
      tie_word_embeddings=model.tie_embeddings, scale_decoder_outputs=model.tie_embeddings,
      is_encoder_decoder=True)


def _t5_recipe(family: Family, arch: Architecture, config) -> None:
  """T5's span corruption (configs/t5.py): 512 inputs, packed segments, Adafactor."""
  del family, arch
  config.objective = config_lib.t5_objective()
  config.optimizer = config_lib.t5_adafactor()
  config.data.update(packing="t5_segments", seq_len=512)


def _t5_names(family: Family, hf: dict, state_dict: dict) -> dict:
  """T5's lm_head as transformers reads it: an untied (v1.1) checkpoint without lm_head.weight
  (transformers 5 saves a v1.1 model it tied that way) reads out through shared.weight; a tied
  one whose lm_head.weight differs from shared.weight is refused (transformers 5 would use that
  head with v1.0's output scaling, which our T5 does not have)."""
  del family
  head = state_dict.get("lm_head.weight")
  if not t5_tied(hf):
    return state_dict if head is not None else {**state_dict,
                                                "lm_head.weight": state_dict["shared.weight"]}
  if head is not None and not np.array_equal(head, state_dict["shared.weight"]):
    raise ConfigError("The T5 config ties lm_head to the shared embedding (tie_word_embeddings / "
                      "scale_decoder_outputs true) but lm_head.weight differs from shared.weight; "
                      "set tie_word_embeddings=false in config.json if the head is its own (v1.1).")
  return state_dict


T5 = Network(
    required=T5_REQUIRED, defaults=T5_DEFAULTS, model_from_hf=_t5_model_from_hf,
    model_to_hf=_t5_model_to_hf,
    entries=lambda family, model, hf: mapping.t5_entries(model), recipe=_t5_recipe,
    token_ids=lambda tokenizer: dict(pad_token_id=tokenizer.pad_id, eos_token_id=tokenizer.eos_id,
                                     decoder_start_token_id=tokenizer.pad_id),
    names=_t5_names)


# XLNet (XLNetLMHeadModel ↔ models/xlnet.py): XLNetConfig's keys and defaults.
XLNET_REQUIRED = ("vocab_size", "d_model", "n_layer", "n_head", "d_inner")
XLNET_DEFAULTS = dict(ff_activation="gelu", attn_type="bi", initializer_range=0.02,
                      layer_norm_eps=1e-12, dropout=0.1, mem_len=512, reuse_len=None,
                      bi_data=False, clamp_len=-1, same_length=False, pad_token_id=5,
                      bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
# The forward options of XLNetConfig that our XLNet computes only at these values.
XLNET_FORWARD = dict(attn_type="bi", same_length=False, bi_data=False)


def _xlnet_model_from_hf(family: Family, hf: dict) -> ml_collections.ConfigDict:
  """Our XLNet of an XLNetConfig. HF keeps the relative-attention biases in every layer
  (untie_r=True); mem_len / reuse_len, which only shape pre-training, keep our paper defaults
  (384 / 256) where HF has none."""
  del family
  differ = {k: hf[k] for k, v in XLNET_FORWARD.items() if hf[k] != v}
  if differ:
    raise ConfigError(f"XLNet with {differ}: our XLNet computes HF's forward only with "
                      f"{XLNET_FORWARD} (bi_data only lays out a pre-training batch; the weights "
                      "do not depend on it); set those in config.json to import.")
  if hf["ff_activation"] not in ACTIVATIONS_FROM_HF:
    raise ConfigError(f"XLNet ff_activation={hf['ff_activation']!r} has no counterpart here; "
                      f"supported: {sorted(ACTIVATIONS_FROM_HF)}.")
  memory = {k: hf[k] for k in ("mem_len", "reuse_len") if hf[k] is not None}
  return config_lib.xlnet_model(
      "base", vocab_size=hf["vocab_size"], hidden=hf["d_model"], layers=hf["n_layer"],
      heads=hf["n_head"], head_dim=hf["d_model"] // hf["n_head"], mlp=hf["d_inner"],
      activation=ACTIVATIONS_FROM_HF[hf["ff_activation"]], dropout=hf["dropout"],
      attention_dropout=hf["dropout"], layer_norm_eps=hf["layer_norm_eps"],
      initializer_range=hf["initializer_range"], untie_r=True, clamp_len=hf["clamp_len"],
      **memory)


def _xlnet_model_to_hf(family: Family, model, hf: dict) -> dict:
  """XLNetConfig fields of our XLNet; HF's dropout also drops attention probabilities (ours:
  attention_dropout), and untie_r=False writes the shared biases into every layer."""
  del family, hf
  if model.heads * model.head_dim != model.hidden:
    raise ConfigError(f"model.heads={model.heads} × head_dim={model.head_dim} != hidden="
                      f"{model.hidden}: HF's XLNet derives d_head = d_model / n_head; export a "
                      "model with heads · head_dim = hidden.")
  return dict(vocab_size=model.vocab_size, d_model=model.hidden, n_layer=model.layers,
              n_head=model.heads, d_head=model.head_dim, d_inner=model.mlp,
              ff_activation=ACTIVATIONS_TO_HF[model.activation], dropout=model.dropout,
              layer_norm_eps=model.layer_norm_eps, initializer_range=model.initializer_range,
              mem_len=model.mem_len, reuse_len=model.reuse_len, clamp_len=model.clamp_len,
              tie_word_embeddings=True, **XLNET_FORWARD)


def _xlnet_recipe(family: Family, arch: Architecture, config) -> None:
  """XLNet's permutation LM as configs/xlnet.py (AdamW 4e-4, ε 1e-6, linear decay after 40k
  warmup steps), on windows of 2 · reuse_len tokens (the paper's 512 = 2 · 256) permuted in
  blocks of reuse_len, 85 of every 512 tokens predicted."""
  del family, arch
  reuse = config.model.reuse_len
  config.objective = config_lib.xlnet_objective(perm_size=reuse,
                                                num_predict=max(1, round(reuse * 85 / 256)))
  config.optimizer = config_lib.bert_adamw(peak_lr=4e-4, eps=1e-6, warmup_steps=40_000,
                                           schedule="linear_after_warmup")
  config.data.update(packing="xlnet_streams", seq_len=2 * reuse)


def _xlnet_names(family: Family, hf: dict, state_dict: dict) -> dict:
  del family, hf
  return with_prefix(state_dict, "transformer", "transformer.word_embedding.weight")


XLNET = Network(
    required=XLNET_REQUIRED, defaults=XLNET_DEFAULTS, model_from_hf=_xlnet_model_from_hf,
    model_to_hf=_xlnet_model_to_hf,
    entries=lambda family, model, hf: mapping.xlnet_entries(model), recipe=_xlnet_recipe,
    token_ids=_pad_id, names=_xlnet_names)


# GPT (GPT2LMHeadModel, OpenAIGPTLMHeadModel ↔ our causal Encoder in models/pretraining.CausalLM):
# the keys both configs share, and each one's own defaults (Family.defaults).
GPT_REQUIRED = ("n_embd", "n_layer", "n_head")
GPT_DEFAULTS = dict(n_inner=None, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
                    layer_norm_epsilon=1e-5, initializer_range=0.02, tie_word_embeddings=True)
GPT2_DEFAULTS = dict(vocab_size=50257, n_positions=1024, activation_function="gelu_new",
                     scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False,
                     add_cross_attention=False)
OPENAI_GPT_DEFAULTS = dict(vocab_size=40478, n_positions=512, afn="gelu")
# GPT-2's forward options that our GPT computes only at these values.
GPT2_FORWARD = dict(scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False,
                    add_cross_attention=False)
# OpenAI GPT's `afn` (modeling_openai.py ACT_FNS: its 'gelu' is the tanh approximation).
OPENAI_ACTIVATIONS_FROM_HF = {"gelu": "gelu_tanh", "relu": "relu"}
OPENAI_ACTIVATIONS_TO_HF = {v: k for k, v in OPENAI_ACTIVATIONS_FROM_HF.items()}


def _is_openai(family: Family) -> bool:
  return family.model_type == "openai-gpt"


def _gpt_activation(family: Family, hf: dict) -> str:
  key, table = (("afn", OPENAI_ACTIVATIONS_FROM_HF) if _is_openai(family)
                else ("activation_function", ACTIVATIONS_FROM_HF))
  if hf[key] not in table:
    raise ConfigError(f"{family.model_type} {key}={hf[key]!r} has no counterpart here; "
                      f"supported: {sorted(table)}.")
  return table[hf[key]]


def _gpt_model_from_hf(family: Family, hf: dict) -> ml_collections.ConfigDict:
  """Our GPT of a GPT2Config (pre-LN) or OpenAIGPTConfig (post-LN); resid_pdrop is our dropout
  (embeddings and residuals; HF's embd_pdrop is read as equal to it)."""
  if not _is_openai(family):
    differ = {k: hf[k] for k, v in GPT2_FORWARD.items() if hf[k] != v}
    if differ:
      raise ConfigError(f"GPT-2 with {differ}: our GPT computes HF's forward only with "
                        f"{GPT2_FORWARD}; set those in config.json to import.")
  return config_lib.gpt_model(
      "base", 1 if _is_openai(family) else 2, vocab_size=hf["vocab_size"], hidden=hf["n_embd"],
      layers=hf["n_layer"], heads=hf["n_head"], mlp=hf["n_inner"] or 4 * hf["n_embd"],
      max_positions=hf["n_positions"], activation=_gpt_activation(family, hf),
      dropout=hf["resid_pdrop"], attention_dropout=hf["attn_pdrop"],
      layer_norm_eps=hf["layer_norm_epsilon"], initializer_range=hf["initializer_range"])


def _gpt_model_to_hf(family: Family, model, hf: dict) -> dict:
  """The GPT2Config / OpenAIGPTConfig fields of our GPT; its layout (pre- or post-LN) must be
  the family's."""
  del hf
  extra = {k: model[k] for k, off in (("share_layers", "none"), ("embedding_size", 0),
                                      ("type_vocab_size", 0)) if model.get(k, off) != off}
  if extra:
    raise ConfigError(f"{family.model_type} has no shared layers, factorised embedding or token "
                      f"types; this GPT has {extra}, so it cannot be exported.")
  if model.pre_layer_norm == _is_openai(family) or model.get("embedding_layer_norm", True):
    raise ConfigError(f"model.pre_layer_norm={model.pre_layer_norm}: {family.model_type} is "
                      f"{'post' if _is_openai(family) else 'pre'}-LN without an embedding "
                      "LayerNorm; export a GPT of configs/gpt.py's version "
                      f"{1 if _is_openai(family) else 2} as {family.model_type}.")
  if _is_openai(family):
    if model.activation not in OPENAI_ACTIVATIONS_TO_HF:
      raise ConfigError(f"model.activation={model.activation!r}: OpenAI GPT's afn has "
                        f"{sorted(OPENAI_ACTIVATIONS_TO_HF)} only.")
    activation = dict(afn=OPENAI_ACTIVATIONS_TO_HF[model.activation])
  else:
    activation = dict(activation_function=ACTIVATIONS_TO_HF[model.activation], **GPT2_FORWARD,
                      n_inner=model.mlp)
  if _is_openai(family) and model.mlp != 4 * model.hidden:
    raise ConfigError(f"model.mlp={model.mlp}: OpenAI GPT's MLP is 4 × n_embd = "
                      f"{4 * model.hidden} wide.")
  return dict(vocab_size=model.vocab_size, n_embd=model.hidden, n_layer=model.layers,
              n_head=model.heads, n_positions=model.max_positions, resid_pdrop=model.dropout,
              embd_pdrop=model.dropout, attn_pdrop=model.attention_dropout,
              layer_norm_epsilon=model.layer_norm_eps, initializer_range=model.initializer_range,
              tie_word_embeddings=True, **activation)


def _gpt_entries(family: Family, model, hf: dict) -> list[mapping.Entry]:
  del hf
  return [dataclasses.replace(e, ours=("encoder",) + e.ours)
          for e in mapping.gpt_entries(model, openai=_is_openai(family))]


def _gpt_recipe(family: Family, arch: Architecture, config) -> None:
  """GPT's causal LM (configs/gpt.py) on rows of the model's positions (at most 1,024)."""
  del family, arch
  config.objective = ml_collections.ConfigDict(dict(name="causal_lm"))
  config.optimizer = config_lib.gpt_adam()
  config.data.update(packing="lm_stream", seq_len=min(config.model.max_positions, 1024))


def _gpt_token_ids(tokenizer) -> dict:
  """GPT-2's bos / eos are its <|endoftext|>, our end of document."""
  eod = packing.eod_id(tokenizer)
  return dict(bos_token_id=eod, eos_token_id=eod)


# The token embedding's name in each GPT family: it tells a head class's names from a bare model's.
GPT_WORD_EMBEDDING = {"gpt2": "wte", "openai-gpt": "tokens_embed"}


def _gpt_names(family: Family, hf: dict, state_dict: dict) -> dict:
  del hf
  return with_prefix(state_dict, "transformer",
                     f"transformer.{GPT_WORD_EMBEDDING[family.model_type]}.weight")

GPT = Network(
    required=GPT_REQUIRED, defaults=GPT_DEFAULTS, model_from_hf=_gpt_model_from_hf,
    model_to_hf=_gpt_model_to_hf, entries=_gpt_entries, recipe=_gpt_recipe,
    token_ids=_gpt_token_ids, names=_gpt_names)


# --------------------------------------------------------------------------------------- families


def _albert_from_hf(hf: dict) -> dict:
  if hf["inner_group_num"] != 1:
    raise ConfigError(f"ALBERT inner_group_num={hf['inner_group_num']}: our encoder has one layer "
                      "per group (every released ALBERT); only inner_group_num=1 can be imported.")
  if hf["embedding_size"] == hf["hidden_size"]:
    raise ConfigError("ALBERT with embedding_size == hidden_size keeps a square "
                      "embedding_hidden_mapping_in that our encoder omits; only factorised "
                      "ALBERT checkpoints (embedding_size < hidden_size) can be imported.")
  return dict(embedding_size=hf["embedding_size"], share_layers="all",
              hidden_groups=hf["num_hidden_groups"])


def _albert_to_hf(model) -> dict:
  if model.share_layers != "all" or not factorized_embedding(model):
    raise ConfigError("An ALBERT export needs model.share_layers='all' and a factorised "
                      "embedding (model.embedding_size < hidden).")
  return dict(embedding_size=model.embedding_size, num_hidden_groups=model.hidden_groups,
              inner_group_num=1)


def _albert_encoder(model, hf):
  return mapping.encoder_entries(
      model, prefix="albert", layer_names=mapping.ALBERT_LAYER,
      projection="albert.encoder.embedding_hidden_mapping_in",
      layers={f"group_{g}": f"albert.encoder.albert_layer_groups.{g}.albert_layers.0"
              for g in range(model.hidden_groups)})


def _electra_from_hf(hf: dict) -> dict:
  """An imported ELECTRA fine-tunes as ELECTRA's code does (config_lib.electra_encoder): no
  pooler on classification and regression, Glorot-uniform task classifiers."""
  width = hf["embedding_size"] or hf["hidden_size"]
  return dict(embedding_size=0 if width == hf["hidden_size"] else width,
              bare_dense_init="glorot_uniform", classifier_pooler=False)


def _electra_to_hf(model) -> dict:
  return dict(embedding_size=model.embedding_size or model.hidden)


def _electra_encoder(model, hf):
  return mapping.encoder_entries(
      model, prefix="electra",
      projection="electra.embeddings_project" if factorized_embedding(model) else None)


def _bert_encoder(prefix):
  def encoder(model, hf):
    return mapping.encoder_entries(model, prefix=prefix,
                                   position_offset=FAMILIES[prefix].position_offset(hf))
  return encoder


def _roberta_offset(hf: dict) -> int:
  """RoBERTa's positions start at padding_idx + 1 (fairseq's make_positions)."""
  return hf["pad_token_id"] + 1


BERT_MLM = mapping.mlm_head_names("cls.predictions.transform.dense",
                                  "cls.predictions.transform.LayerNorm", "cls.predictions.bias")
ALBERT_MLM = mapping.mlm_head_names("predictions.dense", "predictions.LayerNorm",
                                    "predictions.bias")
# The pooler (tanh dense on the first token) and classifier of BERT's / ALBERT's sequence
# classification and multiple-choice heads.
BERT_POOLED = mapping.sentence_head_names("bert.pooler.dense", "classifier")
ALBERT_POOLED = mapping.sentence_head_names("albert.pooler", "classifier")



def _task_classes(prefix: str, sequence: dict[str, str], choice: dict[str, str],
                  sequence_mismatch: str = "", choice_fields: dict | None = None
                  ) -> tuple[Architecture, ...]:
  """HF's {prefix}For{SequenceClassification, TokenClassification, QuestionAnswering,
  MultipleChoice}: `sequence` / `choice` name the pooler (tanh dense on the first token) and
  classifier of the sentence-level heads; the token and span heads are HF's `classifier` and
  `qa_outputs` in every family. Our heads are named as FineTuneModel names them."""
  def task(suffix, kind, names, **fields):
    return Architecture(f"{prefix}For{suffix}", "", "", {finetune_models.KINDS[kind][0]: names},
                        kind=kind, **fields)
  return (task("SequenceClassification", "classification", sequence, mismatch=sequence_mismatch),
          task("TokenClassification", "token_classification", dict(classifier="classifier")),
          task("QuestionAnswering", "extractive_qa", dict(classifier="qa_outputs")),
          task("MultipleChoice", "multiple_choice", choice, hf_fields=choice_fields or {}))


FAMILIES = {
    "bert": Family(
        "bert", ENCODER,
        architectures=(
            Architecture("BertForPreTraining", "mlm", "nsp", {
                "mlm_head": BERT_MLM,
                "sentence_head": mapping.sentence_head_names("bert.pooler.dense",
                                                             "cls.seq_relationship")}),
            Architecture("BertForMaskedLM", "mlm", "", {"mlm_head": BERT_MLM})),
        base="BertForMaskedLM",
        tasks=_task_classes("Bert", BERT_POOLED, BERT_POOLED),
        encoder=_bert_encoder("bert")),
    "roberta": Family(
        "roberta", ENCODER,
        architectures=(Architecture("RobertaForMaskedLM", "mlm", "", {
            "mlm_head": mapping.mlm_head_names("lm_head.dense", "lm_head.layer_norm",
                                               "lm_head.bias")}, gelu_head=True),),
        base="RobertaForMaskedLM",
        # RobertaClassificationHead: dense + tanh + out_proj on <s>, our pooler + classifier.
        tasks=_task_classes(
            "Roberta", mapping.sentence_head_names("classifier.dense", "classifier.out_proj"),
            mapping.sentence_head_names("roberta.pooler.dense", "classifier")),
        defaults=dict(pad_token_id=1, bos_token_id=0, eos_token_id=2),
        # Its fresh task heads drawn as HF's RobertaPreTrainedModel._init_weights draws them,
        # and fairseq's init_bert_params the network (its register_classification_head leaves
        # torch's default Linear init: docs/faithfulness.md).
        model_from_hf=lambda hf: dict(weight_init="normal"),
        encoder=_bert_encoder("roberta"),
        objective=dict(mask_style="fairseq", masking="dynamic"),
        document_separator=True,
        position_offset=_roberta_offset),
    "albert": Family(
        "albert", ENCODER,
        architectures=(
            Architecture("AlbertForPreTraining", "mlm", "sop", {
                "mlm_head": ALBERT_MLM,
                "sentence_head": mapping.sentence_head_names("albert.pooler",
                                                             "sop_classifier.classifier")}),
            Architecture("AlbertForMaskedLM", "mlm", "", {"mlm_head": ALBERT_MLM})),
        base="AlbertForMaskedLM",
        tasks=_task_classes("Albert", ALBERT_POOLED, ALBERT_POOLED),
        defaults=dict(hidden_act="gelu_new", hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, embedding_size=128, num_hidden_groups=1,
                      inner_group_num=1, bos_token_id=2, eos_token_id=3),
        model_from_hf=_albert_from_hf, model_to_hf=_albert_to_hf, encoder=_albert_encoder,
        objective=dict(mask_scheme="ngram")),
    "electra": Family(
        "electra", ENCODER,
        architectures=(
            Architecture("ElectraForPreTraining", "electra", "",
                         mapping.ELECTRA_HEADS["discriminator"]),
            # A generator checkpoint alone is a masked LM of its own width.
            Architecture("ElectraForMaskedLM", "mlm", "",
                         {"mlm_head": mapping.ELECTRA_HEADS["generator"]["generator_head"]},
                         gelu_head=True)),
        base="ElectraForPreTraining",
        tasks=_task_classes(
            "Electra", mapping.sentence_head_names("classifier.dense", "classifier.out_proj"),
            mapping.sentence_head_names("sequence_summary.summary", "classifier"),
            sequence_mismatch="HF's ElectraClassificationHead is dense + GELU + out_proj "
            "(hard-wired, no config field changes it) where our classification and regression "
            "heads are, as ELECTRA's own code, one dense on the first token (with "
            "model.classifier_pooler, BERT's tanh pooler), so their logits differ",
            # ElectraSequenceSummary is our pooler when told to take the first token and tanh.
            choice_fields=dict(summary_type="first", summary_use_proj=True,
                               summary_activation="tanh")),
        # ElectraConfig's own defaults of the fields its task heads read.
        defaults=dict(embedding_size=128, summary_type="first", summary_use_proj=True,
                      summary_activation="gelu"),
        model_from_hf=_electra_from_hf, model_to_hf=_electra_to_hf, encoder=_electra_encoder,
        packing="electra_segments"),
    # The encoder–decoder and its LM head are one network (T5 v1.1's untied lm_head included).
    "t5": Family(
        "t5", T5,
        architectures=(Architecture("T5ForConditionalGeneration", "t5", "", {}),),
        base="T5ForConditionalGeneration"),
    # The output weight is the tied word embedding; a bare XLNetModel gets a fresh output bias.
    "xlnet": Family(
        "xlnet", XLNET,
        architectures=(Architecture("XLNetLMHeadModel", "xlnet", "",
                                    {"lm_loss": {"bias": "lm_loss.bias"}}),),
        base="XLNetLMHeadModel"),
    # GPT-2 (pre-LN) and GPT-1 (post-LN): the LM head is the tied token embedding.
    "gpt2": Family(
        "gpt2", GPT,
        architectures=(Architecture("GPT2LMHeadModel", "causal_lm", "", {}),),
        base="GPT2LMHeadModel", defaults=GPT2_DEFAULTS),
    "openai-gpt": Family(
        "openai-gpt", GPT,
        architectures=(Architecture("OpenAIGPTLMHeadModel", "causal_lm", "", {}),),
        base="OpenAIGPTLMHeadModel", defaults=OPENAI_GPT_DEFAULTS),
}


def get(model_type: str) -> Family:
  if model_type not in FAMILIES:
    raise ConfigError(f"HF model_type {model_type!r} is not supported; choose one of "
                      f"{sorted(FAMILIES)}.")
  return FAMILIES[model_type]


# ------------------------------------------------------------------------------ config translation


def full_hf_config(family: Family, hf_config: dict) -> dict:
  """`hf_config` with HF's defaults filled in; ConfigError when a size is missing."""
  missing = [k for k in family.network.required if k not in hf_config]
  if missing:
    raise ConfigError(f"The HF config.json lacks {missing}; it is not a {family.model_type} "
                      "config.")
  return {**family.network.defaults, **family.defaults, **hf_config}


def model_from_hf(family: Family, hf_config: dict) -> ml_collections.ConfigDict:
  """Our `config.model` section for an HF config.json of `family`."""
  return family.network.model_from_hf(family, full_hf_config(family, hf_config))


def model_to_hf(family: Family, arch: Architecture, model, base: dict) -> dict:
  """The HF config.json of our `model` as `arch`; `base` holds the other HF fields (token ids,
  those of an imported config, a task class's labels) and is updated."""
  check_exportable(arch, model)
  hf = {**family.network.defaults, **family.defaults, **base}
  hf.update(model_type=family.model_type, architectures=[arch.name])
  hf.update(family.network.model_to_hf(family, model, hf))
  hf.update(arch.hf_fields)
  return hf


def check_exportable(arch: Architecture, model) -> None:
  """ConfigError when our `model` (its `model` section) with `arch`'s head has no HF
  counterpart: adapters, or a task class whose HF head differs from ours."""
  if model.get("adapter_size", 0):
    raise ConfigError(f"model.adapter_size={model.adapter_size}: HF's {arch.name} has no "
                      "adapter layers, so a model with adapters (finetune.method='adapters') "
                      "cannot be exported; fine-tune with method='full' to export.")
  if arch.mismatch:
    raise ConfigError(f"Cannot export as {arch.name}: {arch.mismatch}.")


def check_task_class(arch: Architecture, hf: dict) -> None:
  """ConfigError when the checkpoint of task class `arch` with full HF config `hf` has a head
  that ours does not compute."""
  differ = {k: hf.get(k) for k, v in arch.hf_fields.items() if hf.get(k) != v}
  if arch.mismatch or differ:
    why = arch.mismatch or (f"its config has {differ}, and HF's head equals ours only with "
                            f"{arch.hf_fields}")
    raise ConfigError(f"The {arch.name} head cannot be imported: {why}. Pass task_head=False "
                      "to import its encoder alone (`python -m bertfam_jax.hf import` does).")


def task_head(arch: Architecture, hf: dict) -> tuple[str, int]:
  """(FineTuneModel kind, num_outputs) of a checkpoint of task class `arch` with HF config `hf`:
  num_outputs is the number of labels (classification, token classification), 1 for regression
  (HF: problem_type 'regression', or num_labels=1 without a problem_type) and multiple choice,
  2 for extractive QA (HF's qa_outputs: start, end)."""
  labels = len(hf["id2label"]) if hf.get("id2label") else hf.get("num_labels", 2)
  kind = arch.kind
  if kind == "classification" and (hf.get("problem_type") == "regression" or
                                   (not hf.get("problem_type") and labels == 1)):
    kind = "regression"
  if kind == "extractive_qa" and labels != 2:
    raise ConfigError(f"{arch.name} with num_labels={labels}: its span logits are start and end, "
                      "num_labels=2.")
  fixed = finetune_models.KINDS[kind][2]
  return kind, labels if fixed is None else fixed


def task_config(kind: str, num_outputs: int, label_names=()) -> dict:
  """The HF config fields of a FineTuneModel head of `kind` with `num_outputs` (task_head's
  inverse): num_labels, id2label / label2id (`label_names`, else HF's LABEL_i) and problem_type
  (single-label classification, regression, else None)."""
  names = list(label_names) or [f"LABEL_{i}" for i in range(num_outputs)]
  problem = dict(classification="single_label_classification", regression="regression")
  return dict(num_labels=len(names), id2label={str(i): n for i, n in enumerate(names)},
              label2id={n: i for i, n in enumerate(names)}, problem_type=problem.get(kind))


def check_head_activation(arch: Architecture, model) -> None:
  if arch.gelu_head and model.activation != "gelu":
    raise ConfigError(f"HF's {arch.name} applies exact GELU in its MLM head whatever hidden_act "
                      f"says, and ours applies model.activation={model.activation!r}; only "
                      "hidden_act='gelu' checkpoints of this class map exactly.")


def run_config(family: Family, arch: Architecture, model,
               tokenizer_path: str) -> ml_collections.ConfigDict:
  """A full bertfam config (config_lib.base_config) for a checkpoint: `model`, the objective of
  its heads with the family's recipe (Network.recipe), tokenizer kind 'hf' at `tokenizer_path`
  ('' when the checkpoint has none)."""
  config = config_lib.base_config()
  config.model = model
  family.network.recipe(family, arch, config)
  config.tokenizer.update(kind="hf", model_path=tokenizer_path)
  return config
