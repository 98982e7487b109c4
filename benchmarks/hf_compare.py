r"""Our train step against the same model in HuggingFace transformers (PyTorch), side by side.

In one process, on the same device and the same shapes (--batch_size x config.data.seq_len):
  ours  the real model, optimizer and jitted train step of --config, timed by
        `train_throughput.measure` (synthetic on-device batch, first compiling step and --warmup
        steps excluded, mean of --steps steps);
  HF    the same model, parameter for parameter, built from the same config (`hf_model`), fed
        the same synthetic batch (`hf_inputs`) and trained on the family's loss (`hf_loss`):
    BERT, RoBERTa, ALBERT  `BertForPreTraining` (config.objective.sentence_task set, e.g. NSP),
          `AlbertForPreTraining` (share_layers='all') or `RobertaForMaskedLM` (none); HF's loss.
    SpanBERT  HF's `BertForMaskedLM` plus a span boundary head that is OUR torch code (HF has
          none), layer for layer models/heads.py SpanBoundaryHead: offset embeddings,
          dense 2H+s -> H, activation, LayerNorm, dense H -> H, activation, LayerNorm, decoder
          tied to the word embeddings with its own bias; loss = HF's MLM cross-entropy + ours
          Σ CE·w / (Σ w + 1) at the SBO slots (objectives/mlm.py).
    ELECTRA  HF's `ElectraForMaskedLM` (generator) and `ElectraForPreTraining` (discriminator);
          the generator reads the discriminator's word / position / type embeddings and
          embedding LayerNorm (google-research/electra's shared scope, models/electra.py) and
          its output layer is tied to that word table. The joint step is OUR torch code, as
          objectives/electra.py: generator_weight x generator CE at the masked positions; samples
          by Gumbel-max from the generator's logits / objective.temperature, without gradient;
          the discriminator reads the original ids with the samples written at the masked
          positions; discriminator_weight x its BCE over every real token (replaced = differs
          from the original). Variant 'electra' only.
    XLNet  `XLNetLMHeadModel` with perm_mask and target_mapping (`objectives.xlnet.device_masks`
          of the batch's ranks), token_type_ids, labels at the targets (HF's mean CE = ours
          Σ CE·w / Σ w) and the memory carried from step to step (zeros at the first, as ours;
          mem_len and reuse_len as ours). bi_data: HF runs the first half of the batch forward
          and the second half reversed, ours takes a direction per row, so HF gets the rows
          forward-first (equal halves needed); with objective.bi_data off HF runs every row
          forward while ours still follows the synthetic batch's directions (the same work).
          HF's XLNet uses `dropout` on the attention probabilities too: attention_dropout must
          equal dropout. grad_accum_steps 1 (the memory), as ours.
    T5  `T5ForConditionalGeneration` (encoder_decoder): HF's loss, which has no z-loss.
    GPT  `GPT2LMHeadModel` (pre-LN, configs/gpt.py version=2) or `OpenAIGPTLMHeadModel`
          (post-LN, version 1) with labels = the input ids at real tokens: HF's loss shifts
          them, L − 1 targets per row where ours has L (the stream's next token; the same
          logits are computed).
  Every peer: sizes, vocab, max positions, token types, LayerNorm eps, activation (gelu_tanh ->
  'gelu_new', gelu -> 'gelu'), dropout probabilities as config.model; trained in train mode with
  torch.optim.AdamW (betas, eps, weight decay of config.optimizer, LayerNorm/bias excluded from
  decay as ours unless decay_norm_and_bias, our learning-rate schedule precomputed per step;
  torch's Adam always bias-corrects) and `clip_grad_norm_` when optimizer.clip_norm > 0 (a
  config's LAMB or Adafactor becomes `config_lib.bert_adamw()` on both sides, as table.py does);
  attention `attn_implementation='sdpa'` (falls back to 'eager' where unavailable, e.g. XLNet;
  the header says which); bf16 autocast only when config.model.dtype is bfloat16; the loss
  (forward and loss) wrapped in `torch.compile` with --torch_compile (its compilation is in the
  first step, not timed).
Masked-LM peers get our batch's input ids, token types, all-ones attention mask and sentence
labels, and labels -100 except at max_predictions distinct positions per row (our count; SpanBERT's
SBO slots are those positions); ELECTRA gets our masked positions, targets and weights as they are.

Both rows use the same FLOP count, ours (the objective's `flops_per_token`, ../shared/PERF.md §3).
Work HF does beyond it is not credited and is part of the ratio; the header names it (with its
FLOPs for the dense heads): HF's MLM heads are dense (transform and d x V decoder at every
position, loss at the labelled ones; ELECTRA's generator head likewise), and XLNet's query stream
attends from every position (the reference's scatter; ours from the num_predict targets) and its
last layer's content stream runs.

Threads: torch.set_num_threads(os.cpu_count()); JAX/XLA sizes its own CPU thread pool from the
visible cores; both are reported. The implementations run one after the other, ours first, with a
pause between, so neither's pool competes with the other's timed steps.

  PYTHONPATH=. python benchmarks/hf_compare.py --config=configs/bert.py:runlocal \
      --batch_size=32 --steps=20
  PYTHONPATH=. python benchmarks/hf_compare.py --config=configs/bert.py:runlocal \
      --batch_size=32 --steps=20 --torch_compile
  PYTHONPATH=. python benchmarks/hf_compare.py --config=configs/electra.py:runlocal \
      --batch_size=32 --steps=20 --output=hf_compare.jsonl
  # also configs/roberta.py, albert.py, spanbert.py, xlnet.py, t5.py, gpt.py (:runlocal,version=2)
Needs torch and transformers besides the project (e.g. `pip install torch==2.13.0 transformers`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import sys
import time

import jax
import numpy as np
from absl import app, flags
from ml_collections import config_flags

import train_throughput as tt  # benchmarks/ is sys.path[0] when this runs as a script
from bertfam_jax import config_lib, objectives
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.objectives import electra as electra_objective
from bertfam_jax.objectives import mlm as mlm_objective
from bertfam_jax.objectives import xlnet as xlnet_objective
from bertfam_jax.train import optimizer as optimizer_lib
from bertfam_jax.train import sharding as sharding_lib

if __name__ == "__main__":
  # Flags only when run as a script: benchmarks/table.py imports the functions below.
  _CONFIG = config_flags.DEFINE_config_file(
      "config", None, "Config file, e.g. configs/bert.py:runlocal; override fields with "
      "--config.<section>.<key>=value.", lock_config=True)
  _BATCH_SIZE = flags.DEFINE_integer("batch_size", None, "Global batch size; default: the "
                                     "config's train.batch_size.")
  _STEPS = flags.DEFINE_integer("steps", 20, "Timed steps per implementation.")
  _WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed steps after the first (compiling) step.")
  _TORCH_COMPILE = flags.DEFINE_bool("torch_compile", False, "Wrap the HF loss in torch.compile.")
  _OUTPUT = flags.DEFINE_string("output", None, "Optional JSONL file; one object per run is "
                                "appended.")
  flags.mark_flag_as_required("config")

HF_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
ROBERTA_PAD_ID = 1  # fairseq's <pad>; HF's RoBERTa positions of real tokens start at pad + 1
TORCH_DEVICES = {"cpu": "cpu", "gpu": "cuda"}
PAUSE_S = 1.0  # between the implementations, for the other's idle threads to stop spinning
COLUMNS = ("implementation", "first step s", "step ms", "tokens/s", "model TFLOP/s", "ours/HF")
# Our objectives' loss constants, so the peers' losses cannot drift from them.
ELECTRA_EPS = electra_objective.DENOMINATOR_EPS
DISALLOW_CORRECT_PENALTY = electra_objective.DISALLOW_CORRECT_PENALTY
SBO_OFFSET = mlm_objective.SBO_DENOMINATOR_OFFSET


@dataclasses.dataclass
class Row:
  implementation: str
  first_step_s: float | None = None
  step_s: float | None = None
  tokens_per_s: float | None = None
  model_tflops_per_s: float | None = None
  final_loss: float | None = None
  error: str | None = None

  def markdown(self, ratio: str) -> str:
    fmt = tt.format_cell
    cells = (self.implementation, fmt(self.first_step_s, ".1f"), fmt(self.step_s, ".1f", 1e3),
             fmt(self.tokens_per_s, ",.0f"), fmt(self.model_tflops_per_s, ".4f"),
             ratio if not self.error else f"failed: {self.error}")
    return tt.markdown_line(cells)


def import_torch():
  try:
    import torch
    import transformers
  except ImportError as e:
    raise ConfigError(f"{e}; hf_compare.py needs torch and transformers "
                      "(e.g. pip install torch==2.13.0 transformers).") from e
  return torch, transformers


def peer_family(config) -> str:
  """The HF peer `config` gets (see the module docstring): 't5', 'xlnet', 'electra', 'spanbert'
  (masked LM with objective.sbo) or 'mlm' (BERT, RoBERTa, ALBERT); ConfigError for the rest."""
  o = config.objective
  if o.name in ("t5", "xlnet", "electra"):
    return o.name
  if o.name == "causal_lm":
    return "gpt"
  if o.name != "mlm" or o.get("word_shuffle_rate") or o.get("sentence_task") == "structbert":
    raise ConfigError(f"objective {o.name!r} (sentence_task={o.get('sentence_task')!r}, "
                      f"word_shuffle_rate={o.get('word_shuffle_rate')}) has no HF peer here "
                      "(StructBERT's word-order and 3-way sentence tasks have none); peers: BERT, "
                      "RoBERTa, ALBERT, SpanBERT, ELECTRA, XLNet, T5, GPT.")
  return "spanbert" if o.get("sbo") else "mlm"


# ----------------------------------------------------------------------------- models


def _encoder_kwargs(m, attn_implementation: str) -> dict:
  """BertConfig-style keyword arguments of the encoder section `m` (shared by BERT, RoBERTa,
  ALBERT and ELECTRA's configs)."""
  return dict(
      vocab_size=m.vocab_size, hidden_size=m.hidden, num_hidden_layers=m.layers,
      num_attention_heads=m.heads, intermediate_size=m.mlp,
      type_vocab_size=max(1, m.type_vocab_size), layer_norm_eps=m.layer_norm_eps,
      hidden_act=HF_ACTIVATIONS[m.activation], hidden_dropout_prob=m.dropout,
      attention_probs_dropout_prob=m.attention_dropout, initializer_range=m.initializer_range,
      attn_implementation=attn_implementation)


def _t5_model(config, transformers, attn_implementation: str):
  """T5ForConditionalGeneration of config.model (lm_head untied for v1.1)."""
  m = config.model
  if m.architecture != "encoder_decoder":
    raise ConfigError(f"model.architecture={m.architecture!r}: the HF peer is "
                      "T5ForConditionalGeneration; use "
                      "--config.model.architecture=encoder_decoder.")
  model = transformers.T5ForConditionalGeneration(transformers.T5Config(
      vocab_size=m.vocab_size, d_model=m.hidden, d_kv=m.head_dim, d_ff=m.mlp,
      num_layers=m.layers, num_decoder_layers=m.decoder_layers, num_heads=m.heads,
      relative_attention_num_buckets=m.relative_buckets,
      relative_attention_max_distance=m.relative_max_distance, dropout_rate=m.dropout,
      layer_norm_epsilon=m.layer_norm_eps,
      feed_forward_proj=("gated-gelu" if m.gated_mlp else "relu"),
      tie_word_embeddings=m.tie_embeddings, decoder_start_token_id=0,
      attn_implementation=attn_implementation))
  if not m.tie_embeddings:  # transformers 5 always ties lm_head to the shared table; v1.1 not
    import torch  # pylint: disable=g-import-not-at-top
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
  return model


def _mlm_model(config, transformers, attn_implementation: str):
  """AlbertForPreTraining (factorised embedding, shared layer groups), BertForPreTraining with a
  sentence task, else RobertaForMaskedLM."""
  m = config.model
  common = _encoder_kwargs(m, attn_implementation)
  if m.share_layers == "all":
    return transformers.AlbertForPreTraining(transformers.AlbertConfig(
        embedding_size=m.embedding_size or m.hidden, max_position_embeddings=m.max_positions,
        num_hidden_groups=m.hidden_groups, inner_group_num=1, classifier_dropout_prob=m.dropout,
        **common))
  if config.objective.get("sentence_task"):
    return transformers.BertForPreTraining(
        transformers.BertConfig(max_position_embeddings=m.max_positions, **common))
  return transformers.RobertaForMaskedLM(transformers.RobertaConfig(
      max_position_embeddings=m.max_positions + ROBERTA_PAD_ID + 1, pad_token_id=ROBERTA_PAD_ID,
      **common))


def _spanbert_model(config, transformers, attn_implementation: str):
  """ModuleDict(mlm=BertForMaskedLM, sbo=our SBO head): the head's offset_embeddings [max_targets,
  position_size], dense_1 (2H + position_size -> H), dense_2 (H -> H), each followed by the
  activation and LayerNorm_{1,2}, and decoder (H -> V) tied to BERT's word embeddings with its own
  bias; initialised as HF initialises BERT (N(0, initializer_range), zero biases)."""
  import torch  # pylint: disable=g-import-not-at-top
  m, o = config.model, config.objective
  if m.embedding_size not in (0, m.hidden) or m.share_layers != "none":
    raise ConfigError("SpanBERT's HF peer is BERT: it needs model.embedding_size=0 and "
                      "model.share_layers='none'.")
  mlm = transformers.BertForMaskedLM(transformers.BertConfig(
      max_position_embeddings=m.max_positions, **_encoder_kwargs(m, attn_implementation)))
  nn = torch.nn
  sbo = nn.ModuleDict(dict(
      offset_embeddings=nn.Embedding(o.sbo_max_targets, o.sbo_position_size),
      dense_1=nn.Linear(2 * m.hidden + o.sbo_position_size, m.hidden),
      LayerNorm_1=nn.LayerNorm(m.hidden, eps=m.layer_norm_eps),
      dense_2=nn.Linear(m.hidden, m.hidden),
      LayerNorm_2=nn.LayerNorm(m.hidden, eps=m.layer_norm_eps),
      activation=transformers.activations.get_activation(HF_ACTIVATIONS[m.activation]),
      decoder=nn.Linear(m.hidden, m.vocab_size)))
  sbo.apply(mlm._init_weights)  # pylint: disable=protected-access
  sbo.decoder.weight = mlm.bert.embeddings.word_embeddings.weight
  return nn.ModuleDict(dict(mlm=mlm, sbo=sbo))


def _electra_model(config, transformers, attn_implementation: str):
  """ModuleDict(generator=ElectraForMaskedLM, discriminator=ElectraForPreTraining), the generator
  (objectives.electra.generator_config) using the discriminator's embedding module (tables and
  LayerNorm) and its output layer tied to that word table, as models/electra.py."""
  import torch  # pylint: disable=g-import-not-at-top
  if config.objective.variant != "electra":
    raise ConfigError(f"objective.variant={config.objective.variant!r} has no HF peer here; use "
                      "--config.objective.variant=electra.")

  def electra_config(m):
    return transformers.ElectraConfig(embedding_size=m.embedding_size or m.hidden,
                                      max_position_embeddings=m.max_positions,
                                      **_encoder_kwargs(m, attn_implementation))

  generator_m = electra_objective.generator_config(config)
  generator = transformers.ElectraForMaskedLM(electra_config(generator_m))
  discriminator = transformers.ElectraForPreTraining(electra_config(config.model))
  embeddings = discriminator.electra.embeddings
  generator.electra.embeddings = embeddings
  generator.generator_lm_head.weight = embeddings.word_embeddings.weight
  # HF hard-codes exact GELU in the generator head; ours uses the model's activation.
  generator.generator_predictions.activation = transformers.activations.get_activation(
      HF_ACTIVATIONS[generator_m.activation])
  return torch.nn.ModuleDict(dict(generator=generator, discriminator=discriminator))


def _xlnet_model(config, transformers, attn_implementation: str):
  """XLNetLMHeadModel of config.model (the mapping of tests/models/xlnet_model_test.py), memory
  mem_len / reuse_len as ours, bi_data as objective.bi_data."""
  m = config.model
  if m.heads * m.head_dim != m.hidden:
    raise ConfigError(f"HF's XLNet has head_dim = hidden / heads; set --config.model.head_dim="
                      f"{m.hidden // m.heads} (now {m.head_dim}).")
  if m.attention_dropout != m.dropout:
    raise ConfigError(f"HF's XLNet drops attention probabilities with its one `dropout`; set "
                      f"--config.model.attention_dropout={m.dropout}.")
  return transformers.XLNetLMHeadModel(transformers.XLNetConfig(
      vocab_size=m.vocab_size, d_model=m.hidden, n_layer=m.layers, n_head=m.heads,
      d_inner=m.mlp, ff_activation=HF_ACTIVATIONS[m.activation], attn_type="bi",
      untie_r=m.untie_r, dropout=m.dropout, layer_norm_eps=m.layer_norm_eps,
      initializer_range=m.initializer_range, mem_len=m.mem_len, reuse_len=m.reuse_len,
      bi_data=config.objective.bi_data, clamp_len=m.clamp_len, same_length=False,
      use_mems_train=True, attn_implementation=attn_implementation))


def _gpt_model(config, transformers, attn_implementation: str):
  """GPT2LMHeadModel of a pre-LN GPT, OpenAIGPTLMHeadModel of a post-LN one (its 'gelu' is the
  tanh approximation)."""
  m = config.model
  common = dict(vocab_size=m.vocab_size, n_positions=m.max_positions, n_embd=m.hidden,
                n_layer=m.layers, n_head=m.heads, resid_pdrop=m.dropout, embd_pdrop=m.dropout,
                attn_pdrop=m.attention_dropout, layer_norm_epsilon=m.layer_norm_eps,
                initializer_range=m.initializer_range, attn_implementation=attn_implementation)
  if m.pre_layer_norm:
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_inner=m.mlp, activation_function=HF_ACTIVATIONS[m.activation], **common))
  if m.activation != "gelu_tanh" or m.mlp != 4 * m.hidden:
    raise ConfigError("OpenAIGPTLMHeadModel has the tanh GELU ('gelu') and a 4 × hidden MLP; "
                      "set --config.model.activation=gelu_tanh and model.mlp = 4 · hidden.")
  return transformers.OpenAIGPTLMHeadModel(transformers.OpenAIGPTConfig(afn="gelu", **common))


_MODELS = {"t5": _t5_model, "mlm": _mlm_model, "spanbert": _spanbert_model,
           "electra": _electra_model, "xlnet": _xlnet_model, "gpt": _gpt_model}


def hf_model(config, transformers, attn_implementation: str):
  """The HF PyTorch peer of `config` (see the module docstring), randomly initialised: one HF
  model, or a torch ModuleDict of the parts of a joint peer (ELECTRA, SpanBERT)."""
  if config.model.activation not in HF_ACTIVATIONS:
    raise ConfigError(f"model.activation={config.model.activation!r} has no HF counterpart here; "
                      f"known: {sorted(HF_ACTIVATIONS)}.")
  return _MODELS[peer_family(config)](config, transformers, attn_implementation)


def hf_model_with_attention(config, transformers):
  """(model, attention implementation): 'sdpa' where this transformers/torch offers it."""
  try:
    model = hf_model(config, transformers, "sdpa")
  except ConfigError:
    raise
  except (ValueError, ImportError):
    model = hf_model(config, transformers, "eager")
  parts = [model] if hasattr(model, "config") else model.values()
  return model, next(p.config._attn_implementation for p in parts if hasattr(p, "config"))


def peer_name(model) -> str:
  """The peer's class: 'BertForPreTraining'; a joint peer lists its parts, ours (no HF config)
  by key: 'ElectraForMaskedLM + ElectraForPreTraining', 'BertForMaskedLM + our sbo head'."""
  if hasattr(model, "config"):
    return type(model).__name__
  return " + ".join(type(part).__name__ if hasattr(part, "config") else f"our {key} head"
                    for key, part in model.items())


# ----------------------------------------------------------------------------- inputs


def _mlm_labels(config, host) -> tuple[np.ndarray, np.ndarray]:
  """(positions [B, P], labels [B, L]): P = max_predictions distinct positions per row (ours may
  repeat one; HF's count must be exactly ours), never position 0, labelled with our targets,
  -100 elsewhere."""
  rows, length = host["input_ids"].shape
  preds = config.objective.max_predictions
  if preds >= length:
    raise ConfigError(f"objective.max_predictions={preds} must be below data.seq_len={length}.")
  rng = np.random.default_rng(0)
  positions = np.sort(np.stack([rng.permutation(np.arange(1, length))[:preds]
                                for _ in range(rows)]), axis=1)
  labels = np.full((rows, length), -100, np.int64)
  np.put_along_axis(labels, positions, host["mlm_targets"], axis=1)
  return positions, labels


def _encoder_inputs(host) -> dict:
  return dict(input_ids=host["input_ids"], attention_mask=host["input_mask"],
              token_type_ids=host["segment_ids"])


def _mlm_inputs(config, host) -> dict:
  """BERT / RoBERTa / ALBERT: ids, mask, types [B, L], labels [B, L] and the sentence label [B]
  (NSP's next_sentence_label, ALBERT's sentence_order_label)."""
  inputs = dict(_encoder_inputs(host), labels=_mlm_labels(config, host)[1])
  if config.objective.get("sentence_task"):
    key = "sentence_order_label" if config.model.share_layers == "all" else "next_sentence_label"
    inputs[key] = host["sentence_label"]
  return inputs


def _spanbert_inputs(config, host) -> dict:
  """The MLM inputs plus an SBO target at every labelled position, as our synthetic batch:
  sbo_boundaries [B, P, 2] (p - 1, min(p + 1, L - 1)), sbo_offsets [B, P] 0, sbo_targets [B, P]
  (the MLM targets), sbo_weights [B, P] 1."""
  positions, labels = _mlm_labels(config, host)
  last = host["input_ids"].shape[1] - 1
  return dict(_encoder_inputs(host), labels=labels,
              sbo_boundaries=np.stack([positions - 1, np.minimum(positions + 1, last)], -1),
              sbo_offsets=np.zeros_like(positions), sbo_targets=host["mlm_targets"],
              sbo_weights=np.ones(positions.shape, np.float32))


def _electra_inputs(config, host) -> dict:
  """ids, mask, types [B, L] and our mlm_positions / mlm_targets / mlm_weights [B, P] as they
  are (the generator predicts, and the discriminator's input is rewritten, where ours are)."""
  del config
  return dict(_encoder_inputs(host), **{k: host[k] for k in ("mlm_positions", "mlm_targets",
                                                              "mlm_weights")})


def _bi_data_order(config, direction_B) -> np.ndarray:
  """Row order [B] for HF's bi_data (first half forward, second half reversed): the forward rows,
  then the reversed ones; the identity without bi_data."""
  if not config.objective.bi_data:
    return np.arange(len(direction_B))
  forward, reverse = np.flatnonzero(direction_B > 0), np.flatnonzero(direction_B < 0)
  if len(forward) != len(reverse):
    raise ConfigError(f"HF's XLNet with bi_data runs the first half of the batch forward and the "
                      f"second reversed; this batch has {len(forward)} forward and {len(reverse)} "
                      "reversed rows: use an even --batch_size (or "
                      "--config.objective.bi_data=false).")
  return np.concatenate([forward, reverse])


def _xlnet_inputs(config, host) -> dict:
  """ids, types, mask [B, L], perm_mask [B, L, L] and target_mapping [B, P, L] (ours,
  `device_masks`), labels [B, P] (targets, -100 at padding slots), rows in `_bi_data_order`."""
  if config.train.grad_accum_steps != 1:
    raise ConfigError("XLNet carries its memory from batch to batch: set "
                      "--config.train.grad_accum_steps=1.")
  order = _bi_data_order(config, host["direction"])
  perm_mask, target_mapping = xlnet_objective.device_masks(host, config.model.reuse_len)
  inputs = dict(_encoder_inputs(host), perm_mask=perm_mask, target_mapping=target_mapping,
                labels=np.where(host["target_weights"] > 0, host["target_ids"], -100))
  return {k: np.asarray(v)[order] for k, v in inputs.items()}


def _t5_inputs(config, host) -> dict:
  """Encoder ids and mask [B, Li], decoder inputs and labels [B, Lt]."""
  del config
  return dict(input_ids=host["input_ids"], attention_mask=host["input_mask"],
              decoder_input_ids=host["decoder_input_ids"], labels=host["decoder_target_ids"])


def _gpt_inputs(config, host) -> dict:
  """Ids and mask [B, L]; labels the ids at real tokens (HF shifts them)."""
  del config
  return dict(input_ids=host["input_ids"], attention_mask=host["input_mask"],
              labels=np.where(host["input_mask"] > 0, host["input_ids"], -100))


_INPUTS = {"t5": _t5_inputs, "mlm": _mlm_inputs, "spanbert": _spanbert_inputs,
           "electra": _electra_inputs, "xlnet": _xlnet_inputs, "gpt": _gpt_inputs}


def _writable(value) -> np.ndarray:
  """A copy for torch: float32 for floats, int64 otherwise (JAX's host arrays are read-only)."""
  value = np.asarray(value)
  return np.array(value, np.float32 if value.dtype.kind == "f" else np.int64)


def hf_inputs(config, batch, torch, device) -> dict:
  """Our synthetic `batch` as the peer's keyword arguments on `device` (integers int64, floats
  float32)."""
  host = {k: np.asarray(v) for k, v in batch.items()}
  inputs = _INPUTS[peer_family(config)](config, host)
  return {k: torch.as_tensor(_writable(v), device=device) for k, v in inputs.items()}


# ----------------------------------------------------------------------------- losses
# The losses, each `loss(model, inputs, carry) -> (scalar loss, next carry)` once `hf_loss` has
# bound the rest, and their helpers.


def _gather_positions(x_BLD, positions_BP):
  """[B, L, D] at [B, P] positions → [B, P, D] (ours: models/heads.py gather_positions)."""
  return x_BLD.gather(1, positions_BP[..., None].expand(-1, -1, x_BLD.shape[-1]))


def _weighted_mean(values, weights, offset: float):
  """Σ values·w / (Σ w + offset), float32 (our losses' form)."""
  weights = weights.float()
  return (values.float() * weights).sum() / (weights.sum() + offset)


def output_loss(model, inputs, carry):
  """An HF model's own loss, `model(**inputs).loss`; no carry."""
  return model(**inputs).loss, carry


def _sample(torch, logits_BPV, targets_BP, *, temperature: float, disallow_correct: bool):
  """x̂ ~ softmax(logits / T) by Gumbel-max in float32, without gradient (ours:
  objectives.electra.sample_replacements). Returns [B, P] int64."""
  with torch.no_grad():
    logits = logits_BPV.detach().float()
    if disallow_correct:
      logits = logits - DISALLOW_CORRECT_PENALTY * torch.nn.functional.one_hot(
          targets_BP, logits.shape[-1])
    gumbel = -torch.empty_like(logits).exponential_().log()
    return (logits / temperature + gumbel).argmax(-1)


def _scatter(ids_BL, positions_BP, values_BP, weights_BP):
  """`ids` with `values` written at `positions` where `weights` > 0 ([B, L])."""
  kept = ids_BL.gather(1, positions_BP)
  return ids_BL.scatter(1, positions_BP, values_BP.where(weights_BP > 0, kept))


def electra_loss(torch, model, inputs, carry, *, generator_weight: float,
                 discriminator_weight: float, temperature: float, disallow_correct: bool):
  """generator_weight·L_MLM + discriminator_weight·L_D, as objectives/electra.py ('electra'):
  L_MLM = Σ w·CE / (Σ w + 1e-6) of the generator's logits [B, P, V] at the masked positions (its
  HF head runs at every position); L_D = Σ BCE / (#real + 1e-6) over the real tokens of the
  discriminator's logits [B, L] on the original ids with samples at the masked positions."""
  functional = torch.nn.functional
  ids, mask, types = inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"]
  positions, targets, weights = (inputs[k] for k in ("mlm_positions", "mlm_targets",
                                                      "mlm_weights"))
  logits_BPV = _gather_positions(model["generator"](
      input_ids=ids, attention_mask=mask, token_type_ids=types).logits, positions)
  generator_ce = functional.cross_entropy(logits_BPV.float().transpose(1, 2), targets,
                                          reduction="none")
  sampled = _sample(torch, logits_BPV, targets, temperature=temperature,
                    disallow_correct=disallow_correct)
  originals = _scatter(ids, positions, targets, weights)
  fake = _scatter(originals, positions, sampled, weights)
  real = mask > 0
  replaced = (fake != originals) & real
  logits_BL = model["discriminator"](input_ids=fake, attention_mask=mask,
                                     token_type_ids=types).logits
  bce = functional.binary_cross_entropy_with_logits(logits_BL.float(), replaced.float(),
                                                    reduction="none")
  loss = (generator_weight * _weighted_mean(generator_ce, weights, ELECTRA_EPS)
          + discriminator_weight * _weighted_mean(bce, real, ELECTRA_EPS))
  return loss, carry


def _sbo_logits(torch, head, hidden_BLD, boundaries_BP2, offsets_BP):
  """Our SBO head (models/heads.py SpanBoundaryHead): [x_{s-1}; x_{e+1}; offset embedding]
  [B, P, 2H + s] through dense, activation, LayerNorm twice, then the tied decoder: logits
  [B, P, V]."""
  batch, preds, _ = boundaries_BP2.shape
  ends_BPD = _gather_positions(hidden_BLD, boundaries_BP2.reshape(batch, 2 * preds))
  ends_BPD = ends_BPD.reshape(batch, preds, -1)
  h = torch.cat([ends_BPD, head.offset_embeddings(offsets_BP)], dim=-1)
  for i in (1, 2):
    h = head[f"LayerNorm_{i}"](head.activation(head[f"dense_{i}"](h)))
  return head.decoder(h)


def spanbert_loss(torch, model, inputs, carry):
  """HF BertForMaskedLM's loss (BERT, then its dense MLM head, mean CE over the labelled
  positions; ours divides by Σ w + 1e-5) + Σ w·CE / (Σ w + 1) of our SBO head at the SBO slots
  (objectives/mlm.py)."""
  functional = torch.nn.functional
  mlm = model["mlm"]
  hidden_BLD = mlm.bert(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                        token_type_ids=inputs["token_type_ids"]).last_hidden_state
  logits_BLV = mlm.cls(hidden_BLD)
  mlm_loss = functional.cross_entropy(logits_BLV.flatten(0, 1), inputs["labels"].flatten())
  sbo_BPV = _sbo_logits(torch, model["sbo"], hidden_BLD, inputs["sbo_boundaries"],
                        inputs["sbo_offsets"])
  sbo_ce = functional.cross_entropy(sbo_BPV.float().transpose(1, 2), inputs["sbo_targets"],
                                    reduction="none")
  return mlm_loss + _weighted_mean(sbo_ce, inputs["sbo_weights"], SBO_OFFSET), carry


def xlnet_loss(model, inputs, mems):
  """XLNetLMHeadModel's loss (mean CE at the targets) with this step's memory (per layer
  [mem_len, B, D], or None without one); returns the next memory (detached by HF)."""
  outputs = model(**inputs, mems=mems, use_mems=mems is not None)
  return outputs.loss, outputs.mems


def hf_loss(config, torch):
  """The peer's `loss(model, inputs, carry) -> (scalar loss, next carry)`: ELECTRA's and
  SpanBERT's joint losses, XLNet's with its memory, else the HF model's own."""
  family = peer_family(config)
  if family == "electra":
    o = config.objective
    return functools.partial(electra_loss, torch, generator_weight=o.generator_weight,
                             discriminator_weight=o.discriminator_weight,
                             temperature=o.temperature, disallow_correct=o.disallow_correct)
  if family == "spanbert":
    return functools.partial(spanbert_loss, torch)
  return xlnet_loss if family == "xlnet" else output_loss


def hf_first_carry(config, inputs, torch):
  """The first step's carry for `inputs`: XLNet's memory, per layer [mem_len, B, hidden] float32
  zeros (ours: objectives.xlnet.init_carry; HF's memory is sequence-first); else None."""
  m = config.model
  if peer_family(config) != "xlnet" or not m.mem_len:
    return None
  ids = inputs["input_ids"]
  return [torch.zeros(m.mem_len, ids.shape[0], m.hidden, device=ids.device)
          for _ in range(m.layers)]


# ----------------------------------------------------------------------------- the step


def adamw(model, config, torch):
  """torch AdamW with our optimizer's betas, eps, weight decay and decay mask."""
  o = config.optimizer
  decay, no_decay = [], []
  for name, param in model.named_parameters():  # tied weights appear once
    excluded = "bias" in name or "LayerNorm" in name or "layer_norm" in name
    (no_decay if excluded and not o.decay_norm_and_bias else decay).append(param)
  groups = [dict(params=decay, weight_decay=o.weight_decay),
            dict(params=no_decay, weight_decay=0.0)]
  return torch.optim.AdamW(groups, lr=0.0, betas=(o.b1, o.b2), eps=o.eps)


def measure_hf(config, batch, row: Row, flops_per_token: float, torch, model, device, *,
               steps: int, warmup: int, compile_model: bool) -> None:
  """Times HF's train step on `batch` like `train_throughput.measure` times ours: per
  micro-batch `hf_loss` (compiled with `compile_model`) and backward, clip, AdamW."""
  model.to(device).train()
  inputs = hf_inputs(config, batch, torch, device)
  optimizer = adamw(model, config, torch)
  loss_fn = hf_loss(config, torch)
  step_loss = torch.compile(loss_fn) if compile_model else loss_fn
  accum = config.train.grad_accum_steps
  micro = [{k: v[i::accum] for k, v in inputs.items()} for i in range(accum)]  # strided, as ours
  carries = [hf_first_carry(config, mb, torch) for mb in micro]
  dtype = config.model.dtype
  autocast = (torch.autocast(device, dtype=getattr(torch, dtype)) if dtype != "float32"
              else contextlib.nullcontext())
  clip = config.optimizer.clip_norm
  schedule = optimizer_lib.learning_rate_schedule(config.optimizer, config.train.total_steps)
  learning_rates = [float(schedule(i)) for i in range(1 + warmup + steps)]
  steps_done = [0]
  sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

  def step():
    optimizer.zero_grad(set_to_none=True)
    for i, mb in enumerate(micro):
      with autocast:
        loss, carries[i] = step_loss(model, mb, carries[i])
      (loss / accum).backward()
    if clip > 0:
      torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    for group in optimizer.param_groups:
      group["lr"] = learning_rates[steps_done[0]]
    steps_done[0] += 1
    optimizer.step()
    return loss.detach()

  start = time.perf_counter()
  step()
  sync()
  row.first_step_s = time.perf_counter() - start
  for _ in range(warmup):
    step()
  sync()

  start = time.perf_counter()
  for _ in range(steps):
    loss = step()
  sync()
  row.step_s = (time.perf_counter() - start) / steps
  row.tokens_per_s = config.train.batch_size * config.data.seq_len / row.step_s
  row.model_tflops_per_s = flops_per_token * row.tokens_per_s / 1e12
  row.final_loss = float(loss.float().cpu())


def dense_head_flops_per_token(config) -> float | None:
  """FLOPs/token HF's dense MLM head adds to ours (bertfam_jax/flops.py's head term at the L - P
  positions ours skips): 6·(1 - P/L)·(d·E + E·V), d and E of the network the head belongs to
  (ELECTRA: the generator). None for XLNet and T5 (HF's heads run where ours do)."""
  family = peer_family(config)
  if family not in ("mlm", "spanbert", "electra"):
    return None
  m = electra_objective.generator_config(config) if family == "electra" else config.model
  e = m.get("embedding_size") or m.hidden
  length, preds = config.data.seq_len, config.objective.max_predictions
  return 6 * (1 - preds / length) * (m.hidden * e + e * m.vocab_size)


def hf_extra_work(config, flops_per_token: float) -> str:
  """The header's sentence on the work HF does beyond the credited FLOPs."""
  family = peer_family(config)
  dense = dense_head_flops_per_token(config)
  if dense is not None:
    head = "generator's MLM head" if family == "electra" else "MLM head"
    return (f"HF's {head} is dense (all {config.data.seq_len} positions, loss at "
            f"{config.objective.max_predictions}): {(flops_per_token + dense) / 1e6:.1f} "
            f"MFLOP/token with that work, not credited to HF")
  if family == "xlnet":
    return ("HF's query stream attends from every position (ours from the "
            f"{config.objective.num_predict} targets) and its last layer's content stream runs: "
            "not credited to HF")
  return "HF's heads run where ours do"


def run(config) -> int:
  """Prints the header and the two-row table (and --output line); returns the exit status."""
  torch, transformers = import_torch()
  objectives.validate(config)
  peer_family(config)  # ConfigError before any work
  platform = jax.devices()[0].platform
  if platform not in TORCH_DEVICES:
    raise ConfigError(f"JAX runs on {platform!r}; the HF peer runs on cpu or cuda only.")
  device = TORCH_DEVICES[platform]
  if device == "cuda" and not torch.cuda.is_available():
    raise ConfigError("JAX runs on a GPU but this torch has no CUDA; install a CUDA torch for a "
                      "same-device comparison.")
  torch.set_num_threads(os.cpu_count())
  mesh = sharding_lib.make_mesh(config.mesh)
  config = tt.with_batch_size(config, _BATCH_SIZE.value or config.train.batch_size, mesh)
  swapped = ""
  if config.optimizer.name != "adamw":  # torch has no LAMB / Adafactor (as benchmarks/table.py)
    swapped = f"; the config's {config.optimizer.name} is bert_adamw() on both sides"
    config.optimizer = config_lib.bert_adamw()
  batch_size, seq_len = config.train.batch_size, config.data.seq_len
  flops_per_token = objectives.get(config.objective.name).flops_per_token(config)
  dense_head = dense_head_flops_per_token(config)
  devices = jax.devices()
  device_name = f"{devices[0].device_kind} x{len(devices)}"
  arg = tt.config_arg()
  model, attention = hf_model_with_attention(config, transformers)
  hf_name = peer_name(model)
  mode = "torch.compile" if _TORCH_COMPILE.value else "eager"
  clip = (f" + clip_grad_norm_({config.optimizer.clip_norm})" if config.optimizer.clip_norm > 0
          else "")
  autocast = config.model.dtype if config.model.dtype != "float32" else "off"
  parallel = [line.strip() for line in torch.__config__.parallel_info().splitlines()
              if "parallel backend" in line]

  print(f"{arg} --batch_size={batch_size}{' --torch_compile' if _TORCH_COMPILE.value else ''}\n"
        f"{device_name} (torch device {device!r}); batch {batch_size} x seq {seq_len}, "
        f"{config.model.dtype}; {_STEPS.value} timed steps after 1 + {_WARMUP.value} warm-up, "
        f"ours first then HF\n"
        f"threads: torch {torch.get_num_threads()} intra-op / {torch.get_num_interop_threads()} "
        f"inter-op ({'; '.join(parallel) or 'backend unknown'}); JAX {jax.__version__}: XLA's own "
        f"pool from the visible cores (os.cpu_count()={os.cpu_count()}, affinity "
        f"{len(os.sched_getaffinity(0))}), XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, "
        f"mesh {dict(mesh.shape)}\n"
        f"HF: transformers {transformers.__version__} {hf_name}, torch {torch.__version__}, "
        f"{mode}, attn_implementation={attention!r}, torch.optim.AdamW{clip}, autocast {autocast}"
        f"{swapped}\n"
        f"model FLOPs (both rows, ours): {flops_per_token / 1e6:.1f} MFLOP/token. "
        f"{hf_extra_work(config, flops_per_token)}\n", flush=True)

  ours = tt.Result(device=device_name, config=arg, batch_size=batch_size, seq_len=seq_len,
                   dtype=config.model.dtype, flops_per_token=flops_per_token)
  metrics = tt.measure(config, mesh, ours, steps=_STEPS.value, warmup=_WARMUP.value)
  loss_sum, loss_count = metrics["loss"]
  ours_row = Row(implementation=f"bertfam_jax (jax {jax.__version__}, jit)",
                 first_step_s=ours.first_step_s, step_s=ours.step_s,
                 tokens_per_s=ours.tokens_per_s, model_tflops_per_s=ours.model_tflops_per_s,
                 final_loss=float(loss_sum / loss_count))

  time.sleep(PAUSE_S)
  hf_row = Row(implementation=f"HF {hf_name} (torch {torch.__version__}, {mode}, {attention})")
  batch = tt.synthetic_batch(config, batch_size, mesh)
  try:
    measure_hf(config, batch, hf_row, flops_per_token, torch, model, device, steps=_STEPS.value,
               warmup=_WARMUP.value, compile_model=_TORCH_COMPILE.value)
  except Exception as e:  # noqa: BLE001 -- torch.compile fails in many ways; report, don't crash
    if not _TORCH_COMPILE.value:
      raise
    hf_row.error = f"torch.compile: {type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"

  ratio = (ours_row.tokens_per_s / hf_row.tokens_per_s) if hf_row.tokens_per_s else None
  print(tt.markdown_header(COLUMNS))
  print(ours_row.markdown("–" if ratio is None else f"**{ratio:.2f}x**"))
  print(hf_row.markdown("1.00x"))
  print(f"\nlast-step loss (random init, same batch): ours {ours_row.final_loss:.3f}, HF "
        f"{'–' if hf_row.final_loss is None else format(hf_row.final_loss, '.3f')}", flush=True)
  if _OUTPUT.value and jax.process_index() == 0:
    record = dict(config=arg, device=device_name, torch_device=device, batch_size=batch_size,
                  seq_len=seq_len, dtype=config.model.dtype, steps=_STEPS.value,
                  warmup=_WARMUP.value, flops_per_token=flops_per_token,
                  dense_head_flops_per_token=(None if dense_head is None
                                              else flops_per_token + dense_head),
                  torch_compile=_TORCH_COMPILE.value,
                  attn_implementation=attention, hf_model=hf_name,
                  torch_version=torch.__version__, transformers_version=transformers.__version__,
                  jax_version=jax.__version__, torch_threads=torch.get_num_threads(),
                  torch_interop_threads=torch.get_num_interop_threads(),
                  cpu_count=os.cpu_count(), xla_flags=os.environ.get("XLA_FLAGS", ""),
                  ours=dataclasses.asdict(ours_row), hf=dataclasses.asdict(hf_row),
                  ratio_ours_over_hf=ratio, load_average=os.getloadavg())
    with open(_OUTPUT.value, "a") as f:
      f.write(json.dumps(record) + "\n")
  return 1 if hf_row.error else 0


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  try:
    status = run(_CONFIG.value)
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr, flush=True)
    sys.exit(2)
  sys.exit(status)


if __name__ == "__main__":
  app.run(main)
