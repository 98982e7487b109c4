"""Shared configuration pieces: every `configs/<paper>.py` composes these and states only its deltas.

A config is an `ml_collections.ConfigDict` with the sections
  seed, objective, data, tokenizer, model, optimizer, train, mesh
and `validate(config)` checks the invariants that would otherwise fail deep inside a run.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import types

import ml_collections
from ml_collections import config_dict

from bertfam_jax.errors import ConfigError  # noqa: F401  (config_lib.ConfigError, the public name)


# Transformer encoder sizes. BERT: Devlin et al. 2019, Table/§3.1 (base L12 H768 A12, large L24 H1024
# A16); FFN = 4H. `mini` is the CPU-sized model used by `:runlocal` and by tests.
ENCODER_SIZES = {
    "mini": dict(hidden=128, layers=2, heads=2, mlp=512),
    "small": dict(hidden=256, layers=4, heads=4, mlp=1024),
    "base": dict(hidden=768, layers=12, heads=12, mlp=3072),
    "large": dict(hidden=1024, layers=24, heads=16, mlp=4096),
}

# ALBERT sizes: Lan et al. 2020 (arXiv:1909.11942) Table 1 (H, L; E=128 for all, `albert_encoder`);
# heads and FFN from the released configs (HF albert-*-v2 config.json: xlarge 16 heads, FFN 4H;
# xxlarge 64 heads, FFN 16384).
ALBERT_SIZES = {
    "base": dict(hidden=768, layers=12, heads=12, mlp=3072),
    "large": dict(hidden=1024, layers=24, heads=16, mlp=4096),
    "xlarge": dict(hidden=2048, layers=24, heads=16, mlp=8192),
    "xxlarge": dict(hidden=4096, layers=12, heads=64, mlp=16384),
}


# ELECTRA discriminators (google-research/electra configure_pretraining.py and its "Table 6"
# comment): heads = H / 64, FFN = 4H; small has a 128-wide factorised embedding.
ELECTRA_SIZES = {
    "small": dict(hidden=256, layers=12, heads=4, mlp=1024, embedding_size=128),
    "base": dict(hidden=768, layers=12, heads=12, mlp=3072, embedding_size=0),
    "large": dict(hidden=1024, layers=24, heads=16, mlp=4096, embedding_size=0),
}


def parse_arg(arg: str | None, **fields) -> types.SimpleNamespace:
  """Parses the `key=value,flag` pairs of `--config=file.py:ARG` (e.g. `size=large,runlocal`).

  `fields` are the keys the config file takes, with their defaults, whose types the values are
  cast to (`size="base"`, `version="1.0"`, `task=""`, ...); `runlocal` (default False) is always
  taken. A bare `runlocal` means runlocal=True; any other bare word is the size, for files that
  take one. An unknown key is a ConfigError naming the known ones; sizes are checked by the
  model constructors.
  """
  values = dict(runlocal=False, **fields)
  for item in filter(None, (arg or "").split(",")):
    key, sep, value = item.partition("=")
    if not sep and (key == "runlocal" or "size" in values):
      key, value = ("runlocal", "true") if key == "runlocal" else ("size", key)
    if key not in values:
      raise ConfigError(f"Unknown config argument {key!r} in {arg!r}; known: {sorted(values)}.")
    field_type = type(values[key])
    values[key] = value.lower() in ("1", "true", "yes") if field_type is bool else field_type(value)
  return types.SimpleNamespace(**values)


def apply_overrides(config: ml_collections.ConfigDict, items) -> None:
  """Sets `section.key=value` items on `config`, each value cast to the type of the field it
  replaces (the experiments' --config_overrides, benchmarks/table.py's rows); ConfigError for
  an item that is not `section.key=value` of an existing field, or a value of the wrong type."""
  for item in items:
    key, equals, value = item.partition("=")
    *sections, field = key.split(".")
    target = config
    try:
      for section in sections:
        target = target[section]
      kind = type(target[field])
    except (KeyError, AttributeError, TypeError):
      raise ConfigError(f"override {item!r}: the config has no field {key!r}; overrides are "
                        "section.key=value with the config file's names (e.g. "
                        "model.dtype=bfloat16).") from None
    if not equals:
      raise ConfigError(f"override {item!r} has no value: write {key}=VALUE.")
    try:
      target[field] = value.lower() in ("1", "true", "yes") if kind is bool else kind(value)
    except (TypeError, ValueError):
      raise ConfigError(f"override {item!r}: {key} is a {kind.__name__}, and {value!r} is not "
                        "one.") from None


def load_config(path: str, arg: str | None = None) -> ml_collections.ConfigDict:
  """`get_config(arg)` of a config file, loaded from its path as `--config=path:arg` does."""
  spec = importlib.util.spec_from_file_location(
      "bertfam_config_" + os.path.splitext(os.path.basename(path))[0], path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def default_cache_dir() -> str:
  return os.environ.get("BERTFAM_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "bertfam_jax"))


# Where a run's records go besides WORKDIR/metrics.jsonl (train/metrics.py), and a profiler trace
# inside a real run (train/loop.py Profiler): the train section of pre-training and fine-tuning.
RUN_TRACKING = dict(
    metric_writers="tensorboard",   # comma-separated: tensorboard, wandb ([wandb] extra); '' none
    wandb_project="bertfam_jax",
    wandb_mode="offline",           # offline: files in WORKDIR/wandb (`wandb sync` them) | online
    profile_steps="",               # 'a:b': a jax.profiler trace of steps a+1..b in WORKDIR/profile
)


METRIC_WRITERS = ("tensorboard", "wandb")


def parse_metric_writers(value: str) -> tuple[str, ...]:
  """`train.metric_writers` ('tensorboard,wandb'; '' for metrics.jsonl alone) as a tuple;
  ConfigError naming the field for an unknown writer, or for wandb when it is not installed."""
  names = tuple(n.strip() for n in value.split(",") if n.strip())
  unknown = [n for n in names if n not in METRIC_WRITERS]
  if unknown:
    raise ConfigError(f"train.metric_writers={value!r}: unknown {unknown}; choose from "
                      f"{list(METRIC_WRITERS)} (comma-separated; metrics.jsonl is always "
                      f"written).")
  if "wandb" in names and importlib.util.find_spec("wandb") is None:
    raise ConfigError("train.metric_writers names wandb, which is not installed: pip install "
                      "'bertfam_jax[wandb]', or drop wandb from --config.train.metric_writers.")
  return names


def parse_profile_steps(value: str) -> tuple[int, int] | None:
  """`train.profile_steps` 'a:b' as (a, b) with 0 <= a < b: trace the steps after the a-th up to
  the b-th; '' (no trace) as None."""
  if not value:
    return None
  first, sep, last = value.partition(":")
  try:
    bounds = (int(first), int(last)) if sep else None
  except ValueError:
    bounds = None
  if bounds is None or not 0 <= bounds[0] < bounds[1]:
    raise ConfigError(f"train.profile_steps={value!r}: write 'a:b' with 0 <= a < b (the trace "
                      f"covers steps a+1..b), e.g. --config.train.profile_steps=10:15.")
  return bounds


def validate_tracking(t: ml_collections.ConfigDict) -> None:
  """The train section's RUN_TRACKING fields (pre-training and fine-tuning)."""
  parse_metric_writers(t.get("metric_writers", ""))
  parse_profile_steps(t.get("profile_steps", ""))


def base_config() -> ml_collections.ConfigDict:
  """Fields shared by every paper; each paper file overrides what differs."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.objective = mlm_objective()
  c.data = ml_collections.ConfigDict(dict(
      # 'embedded_wiki': Wikipedia articles shipped inside the gensim wheel (offline).
      # 'tfds': any TFDS text dataset (`tfds_name`, `tfds_data_dir`); 'text': local files.
      source="embedded_wiki",
      tfds_name="c4/en:3.1.0",
      tfds_data_dir="",
      tfds_text_key="text",
      train_split="train",
      eval_split="validation",
      text_files="",          # glob(s), comma separated: .txt (blank-line separated docs) or .jsonl
      text_format="auto",     # auto | blank_lines | lines | jsonl
      eval_fraction=0.05,     # documents held out by hash when the source has no eval split
      # Add the glosses of WordNet's training-split synsets (wordnet.training_gloss_documents,
      # ~1.4 M words, none of any task's validation or test synsets) to an embedded or text source.
      wordnet_glosses=False,
      seq_len=128,
      packing="sentence_pairs",   # sentence_pairs (BERT) | full_sentences (RoBERTa) |
                                  # document_blocks (SpanBERT) | electra_segments (ELECTRA)
                                  # | t5_segments (T5) | xlnet_streams (XLNet)
                                  # | lm_stream (GPT)
      # full_sentences: a lone [SEP] after each document, RoBERTa's "extra separator token
      # between documents" (ELMo's sentences have none).
      document_separator=False,
      short_seq_prob=0.1,
      docs_per_chunk=2000,
      # Independent data streams (data/pipeline.py); 0 = one per process. Fixed, the batches do
      # not depend on the process count: a run resumes on any number of processes dividing it.
      num_shards=0,
      # Batches a thread of the training process computes ahead when workers=0.
      prefetch=2,
      # Worker processes that pack and noise the next chunks (data/pipeline.py), 2 x workers
      # chunks ahead, instead of that thread; 0 = in the training process. The batches are the
      # same for any number.
      workers=0,
      cache_dir="",           # '' = $BERTFAM_CACHE or ~/.cache/bertfam_jax
      # Resume a workdir although its documents or tokenizer changed (logged); refused otherwise.
      allow_change=False,
  ))
  c.tokenizer = ml_collections.ConfigDict(dict(
      kind="sentencepiece",
      model_path="",          # '' = train one from the training corpus and cache it
      model_type="unigram",   # sentencepiece model type when training: unigram | bpe
      train_max_sentences=2_000_000,
      vocab_size=0,           # SentencePiece pieces; 0 = model.vocab_size - extra_ids
      extra_ids=0,            # T5 sentinels appended after the pieces (100 in T5)
      user_symbols="",        # more user-defined pieces after [MASK], comma-separated (XLNet: <eod>)
      normalize="",           # text before SentencePiece: '' as is | albert (lower-cased, NFKD,
                              # accents stripped, whitespace runs joined: ALBERT's preprocess_text)
  ))
  c.model = encoder("base")
  c.optimizer = bert_adamw(peak_lr=1e-4, warmup_steps=10_000)
  c.train = ml_collections.ConfigDict(dict(
      batch_size=256,
      total_steps=1_000_000,
      grad_accum_steps=1,
      log_every=100,
      eval_every=10_000,
      eval_batches=20,
      checkpoint_every=10_000,
      keep_checkpoints=3,
      init_from="",           # a checkpoint directory to start from when the workdir has none
      # What init_from gives: params (a new run from trained parameters) | all (its step and
      # optimizer state too: a later phase of one run, as BERT's 512-token phase, continuing
      # its learning-rate schedule).
      init_state="params",
      stop_step=0,            # stop here (0: total_steps); the schedule still spans total_steps
      rng_impl="threefry",    # the step's random bits (dropout, sampling): threefry | rbg |
                              # unsafe_rbg (RNG_IMPLS; train/step.py SeededStep)
      # XLA:CPU only: the op kinds of the train and eval steps XLA hands to YNNPACK fusions,
      # comma-separated from dot, eltwise, reduce, or none ("": XLA's default choice;
      # train/step.py compiler_options). Measured per family: docs/results.md.
      cpu_ynn_fusion="",
      **RUN_TRACKING,
  ))
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
  return c


def encoder(size: str, *, sizes=ENCODER_SIZES, **overrides) -> ml_collections.ConfigDict:
  """BERT-style post-LN encoder of the given size (defaults from BERT's modeling.py BertConfig);
  `sizes` is the table `size` is read from (ALBERT_SIZES for `albert_encoder`)."""
  if size not in sizes:
    raise ConfigError(f"Unknown model size {size!r}; choose one of {sorted(sizes)}.")
  m = ml_collections.ConfigDict(dict(
      vocab_size=30522,
      vocab_multiple=1,        # the word table padded to a multiple of this many rows (128:
                               # an aligned output matmul; layers.Embedding), 1: unpadded
      max_positions=512,
      type_vocab_size=2,
      dropout=0.1,
      attention_dropout=0.1,   # > 0 uses the explicit softmax path; 0 allows fused/flash kernels
      dropout_bits=32,         # random bits per dropout decision: 32 (flax's draw) | 16 (half)
      fused_qkv=False,         # Q, K and V as one matmul (same values; layers.project_together)
      fp8_matmuls=False,       # the layers' dense matmuls in FP8, current scaling (models/fp8.py;
                               # bf16 compute only; a deviation, opt-in)
      layer_norm_eps=1e-12,
      activation="gelu_tanh",  # TF BERT uses the tanh approximation; fairseq/HF use exact 'gelu'
      initializer_range=0.02,
      weight_init="truncated_normal",  # how σ-initializer_range weights are drawn
                               # (layers.normal_weights): truncated_normal (TF BERT, cut at 2σ)
                               # | normal (uncut: fairseq, PyTorch BERT, OpenAI GPT)
      # Dense layers the reference builds without an initializer (models/layers.py
      # bare_dense_init): truncated_normal (the model's weight_init: BERT gives every layer one)
      # | glorot_uniform (TF's default: ELECTRA's embeddings_project, detector output and task
      # classifiers).
      bare_dense_init="truncated_normal",
      classifier_pooler=True,  # classification / regression read tanh(dense(first token)) (BERT);
                               # False: the first token's state itself (ELECTRA)
      dtype="float32",         # compute dtype; parameters stay float32
      attention_impl="",       # '' = let JAX choose; 'xla' | 'cudnn' (GPU flash attention)
      remat_policy="none",     # none | full | dots | dots_no_batch
      scan_layers=False,
      embedding_size=0,        # ALBERT's factorised embedding width E (0: tables are `hidden` wide)
      share_layers="none",     # cross-layer sharing: none (BERT) | all (ALBERT) | attention | ffn
      hidden_groups=1,         # ALBERT num_hidden_groups: layer i uses shared group i·G // L
      adapter_size=0,          # Houlsby adapters' bottleneck width in every layer (0: none)
  ))
  m.update(sizes[size])
  m.update(overrides)
  return m


def albert_encoder(size: str, **overrides) -> ml_collections.ConfigDict:
  """ALBERT's encoder (albert modeling.py AlbertConfig, README): E=128 factorised embedding, every
  layer sharing one parameter set, no dropout (v2 models), tanh GELU (HF 'gelu_new'), LN ε 1e-12,
  30,000-piece SentencePiece vocabulary."""
  albert = dict(vocab_size=30000, embedding_size=128, dropout=0.0, attention_dropout=0.0,
                activation="gelu_tanh", layer_norm_eps=1e-12, share_layers="all", hidden_groups=1)
  return encoder(size, sizes=ALBERT_SIZES, **{**albert, **overrides})


def mlm_objective(**overrides) -> ml_collections.ConfigDict:
  """BERT's masked LM + NSP (create_pretraining_data.py defaults at 128 tokens)."""
  o = ml_collections.ConfigDict(dict(
      name="mlm",
      mask_rate=0.15,
      max_predictions=20,     # max_predictions_per_seq: 20 at 128, ~80 at 512 (BERT README)
      # Budget and candidates. bert: never [CLS]/[SEP], round(rate * len) incl. specials, capped;
      # fairseq: all tokens, probabilistic rounding; spanbert: ceil(rate * #non-special tokens).
      mask_style="bert",
      # Which units are chosen (objectives/noise.py SELECTORS): token | token_with_replacement
      # (ELECTRA: uniform draws with replacement, duplicates merged) | whole_word (BERT WWM) |
      # ngram (ALBERT, up to max_ngram words, p(n) ~ 1/n) | span (SpanBERT geometric spans of
      # words) | units (ERNIE / SpanBERT phrase or entity masking from `span_source`).
      mask_scheme="token",
      max_ngram=3,
      ngram_distribution="albert",  # ngram's p(n): albert (∝ 1/n) | unilm (0.8 one word, 0.2 more)
      # Which pieces begin a word (data/tokenizers.py WORD_START_RULES): bert (a piece after
      # whitespace, punctuation, specials) | albert (also any piece with a digit or a non-ASCII
      # character; several punctuation characters continue a word) | xlnet.
      word_start_rule="bert",
      span_p=0.2,             # SpanBERT README command (the argparse default is 0.3)
      span_max_words=10,
      span_source="",         # units: entities | noun_phrases (data/spans.py)
      unit_prob=0.5,          # units: share drawn from the units, the rest random whole words
      # Each segment of a sentence pair budgeted and masked on its own (SpanBERT's pairs: no
      # span across the middle [SEP]); one budget over the whole row otherwise (BERT).
      mask_per_segment=False,
      replace_per="token",    # 80/10/10 drawn per token (BERT) or once per merged span (SpanBERT)
      mask_token_prob=0.8,    # of the predicted tokens: [MASK] (BERT 0.8, ELECTRA 0.85) ...
      random_token_prob=0.1,  # ... random token (BERT 0.1, ELECTRA 0); the rest stay unchanged
      random_tokens="uniform",  # uniform | unigram (by corpus frequency, SpanBERT)
      masking="static",       # static: dupe_factor fixed masks per instance; dynamic: new every epoch
      dupe_factor=10,
      sentence_task="nsp",    # nsp (BERT) | sop (ALBERT) | structbert (3-way) | '' (none)
      sbo=False,              # SpanBERT span boundary objective
      sbo_max_targets=15,     # --max-pair-targets
      sbo_position_size=200,  # --pair-positional-embedding-size
      word_shuffle_rate=0.0,  # StructBERT word objective: fraction of tokens in shuffled trigrams
  ))
  o.update(overrides)
  return o


def electra_encoder(size: str, **overrides) -> ml_collections.ConfigDict:
  """ELECTRA's discriminator (electra configure_pretraining.py / model/modeling.py BertConfig):
  exact-erf GELU, dropout 0.1, LN ε 1e-12, BERT's uncased vocabulary size; Glorot-uniform
  where its code passes no initializer (embeddings_project, the detector's output unit, the task
  classifiers), and fine-tuning heads on the first token's state without a pooler
  (`get_pooled_output` is `sequence_output[:, 0]`)."""
  electra = dict(vocab_size=30522, activation="gelu", dropout=0.1, attention_dropout=0.1,
                 layer_norm_eps=1e-12, bare_dense_init="glorot_uniform", classifier_pooler=False)
  return encoder(size, sizes=ELECTRA_SIZES, **{**electra, **overrides})


def electra_objective(**overrides) -> ml_collections.ConfigDict:
  """ELECTRA's replaced-token detection (electra run_pretraining.py, pretrain_helpers.py): the
  masked-LM host noising with ELECTRA's masking (uniform positions drawn with replacement, never
  [CLS]/[SEP], `max_predictions` = int((mask_rate + 0.005) · L), 85% [MASK] / 15% unchanged,
  new masks every step) plus the generator and loss fields. `variant` picks the paper's
  efficiency-analysis row: electra | electra_15 (discriminator loss on the masked tokens only) |
  replace_mlm (MLM on generator-replaced inputs) | all_tokens_mlm (predict every token, with a
  copy gate)."""
  o = mlm_objective(
      name="electra", mask_style="bert", mask_scheme="token_with_replacement",
      mask_token_prob=0.85, random_token_prob=0.0, masking="dynamic", sentence_task="",
      max_predictions=19,
      variant="electra",
      generator_hidden_fraction=0.25,  # generator hidden = round(H · fraction); heads = max(1, h/64)
      generator_layers_fraction=1.0,   # generator layers = round(L · fraction)
      generator_weight=1.0,            # gen_weight
      discriminator_weight=50.0,       # disc_weight (λ)
      temperature=1.0,                 # Gumbel-max sampling temperature of the generator
      disallow_correct=False,          # subtract 1000 from the true token's logit when sampling
  )
  o.update(overrides)
  return o


def electra_max_predictions(seq_len: int, mask_rate: float) -> int:
  """ELECTRA's prediction slots N = int((mask_prob + 0.005) · max_seq_length) (19 at 128/15%,
  79 at 512/15%, 130 at 512/25%)."""
  return int((mask_rate + 0.005) * seq_len)


def electra_generator(discriminator: ml_collections.ConfigDict, hidden_fraction: float,
                      layers_fraction: float) -> ml_collections.ConfigDict:
  """The generator's `model` section (electra run_pretraining.py get_generator_config): hidden
  round(H · fraction), heads max(1, hidden // 64), FFN 4 · hidden, layers round(L · fraction),
  reading the discriminator's embedding tables (so its `embedding_size` is their width)."""
  g = ml_collections.ConfigDict(discriminator.to_dict())
  g.hidden = int(round(discriminator.hidden * hidden_fraction))
  g.heads = max(1, g.hidden // 64)
  g.mlp = 4 * g.hidden
  g.layers = int(round(discriminator.layers * layers_fraction))
  g.embedding_size = discriminator.embedding_size or discriminator.hidden
  return g


# T5 sizes (hidden = d_model, layers per stack, heads, head_dim = d_kv, mlp = d_ff). v1.0: Raffel et al.
# 2020 Table 14 and the released configs (HF t5-small/base/large: 6/12/24 layers per stack); v1.1:
# the released t5_1_1 gin files / HF google/t5-v1_1-* configs (gated GELU, narrower FFN, small
# with 8 layers and 6 heads). `mini` is the CPU-sized model of `:runlocal` and of the tests.
T5_SIZES = {
    "1.0": {
        "mini": dict(hidden=128, layers=2, decoder_layers=2, heads=2, head_dim=64, mlp=512),
        "small": dict(hidden=512, layers=6, decoder_layers=6, heads=8, head_dim=64, mlp=2048),
        "base": dict(hidden=768, layers=12, decoder_layers=12, heads=12, head_dim=64, mlp=3072),
        "large": dict(hidden=1024, layers=24, decoder_layers=24, heads=16, head_dim=64,
                      mlp=4096),
    },
    "1.1": {
        "mini": dict(hidden=128, layers=2, decoder_layers=2, heads=2, head_dim=64, mlp=384),
        "small": dict(hidden=512, layers=8, decoder_layers=8, heads=6, head_dim=64, mlp=1024),
        "base": dict(hidden=768, layers=12, decoder_layers=12, heads=12, head_dim=64, mlp=2048),
        "large": dict(hidden=1024, layers=24, decoder_layers=24, heads=16, head_dim=64,
                      mlp=2816),
    },
}
T5_ARCHITECTURES = ("encoder_decoder", "decoder_only", "prefix_lm")


def t5_model(size: str, version: str = "1.0", **overrides) -> ml_collections.ConfigDict:
  """T5's Transformer (models/t5.py): pre-norm RMSNorm (ε 1e-6), no biases, relative position
  buckets (32, max distance 128) shared across the layers of a stack, no absolute positions.
  v1.0: ReLU, dropout 0.1, input embedding tied to the softmax; v1.1: gated GELU (tanh), dropout 0
  in pre-training, untied. Vocabulary 32,128 rows = 32,000 pieces + 100 sentinels + padding (HF).
  `architecture` encoder_decoder (T5) | decoder_only (a language model over inputs + targets) |
  prefix_lm (the same, attending bidirectionally over the inputs), Raffel et al. §3.2."""
  if version not in T5_SIZES:
    raise ConfigError(f"T5 version {version!r}; choose one of {sorted(T5_SIZES)}.")
  if size not in T5_SIZES[version]:
    raise ConfigError(f"Unknown T5 size {size!r}; choose one of {sorted(T5_SIZES[version])}.")
  v11 = version == "1.1"
  m = ml_collections.ConfigDict(dict(
      kind="t5",
      version=version,
      vocab_size=32128,
      activation="gelu_tanh" if v11 else "relu",
      gated_mlp=v11,
      dropout=0.0 if v11 else 0.1,
      dropout_bits=32,
      fused_qkv=False,  # self-attention's Q, K and V as one matmul (layers.project_together)
      fp8_matmuls=False,  # the layers' dense matmuls in FP8 (models/fp8.py; bf16 compute only)
      layer_norm_eps=1e-6,
      relative_buckets=32,
      relative_max_distance=128,
      # The bucket tables' init: mesh-tf's default Glorot-uniform (t5x: variance_scaling(1,
      # fan_avg, uniform)), or "normal": HF's N(0, hidden^-1).
      relpos_bias_init="glorot_uniform",
      # A prefix LM's buckets: "bidirectional" as mesh-tf with input_full_attention (the paper's
      # lm_v1_ifa.gin), or "causal" as t5x's decoder-only network.
      prefix_lm_buckets="bidirectional",
      tie_embeddings=not v11,
      architecture="encoder_decoder",
      share_encoder_decoder=False,  # Table 2's "Enc-dec, shared": one layer stack for both
      dtype="float32",
      attention_impl="",
      remat_policy="none",
      scan_layers=False,
  ))
  m.update(T5_SIZES[version][size])
  m.update(overrides)
  return m


XLNET_SIZES = {
    "mini": dict(hidden=128, layers=2, heads=2, head_dim=64, mlp=512),
    "base": dict(hidden=768, layers=12, heads=12, head_dim=64, mlp=3072),
    "large": dict(hidden=1024, layers=24, heads=16, head_dim=64, mlp=4096),
}


# GPT sizes: GPT-1 (Radford et al. 2018: 12 layers, 768, 12 heads, FFN 3072) and GPT-2's four
# (HF gpt2, gpt2-medium, gpt2-large, gpt2-xl config.json: n_embd, n_layer, n_head; FFN 4·n_embd).
GPT_SIZES = {
    "mini": dict(hidden=128, layers=2, heads=2, mlp=512),
    "base": dict(hidden=768, layers=12, heads=12, mlp=3072),
    "medium": dict(hidden=1024, layers=24, heads=16, mlp=4096),
    "large": dict(hidden=1280, layers=36, heads=20, mlp=5120),
    "xl": dict(hidden=1600, layers=48, heads=25, mlp=6400),
}


def gpt_model(size: str, version: int = 1, **overrides) -> ml_collections.ConfigDict:
  """GPT's decoder (spec §8; openai/finetune-transformer-lm train.py model()): our BERT-style
  `Encoder` with causal self-attention, learned positions, no token types and no embedding
  LayerNorm, LayerNorm ε 1e-5, the tanh GELU, dropout 0.1 on embeddings, attention and residuals,
  output tied to the token embedding. version 1: post-LN, 512 positions, 40,478 tokens
  (40,000 BPE merges), the embedding dropout on the tables themselves, the tied logits reading
  the dropped table (train.py's `we = dropout(we, embd_pdrop)`, `embedding_dropout='table'`);
  version 2 (GPT-2, Radford et al. 2019): `pre_layer_norm` with a final LayerNorm, 1,024
  positions, 50,257 tokens, dropout on the summed embeddings (HF GPT2Model's placement; GPT-2's
  released code is inference only), positions initialised at σ 0.01 (model.py's `wpe`) and the
  residual projections at 0.02/√(2 · layers) (§2.3, as HF's GPT2 `c_proj`; model.py keeps
  0.02). Both draw every weight from an uncut normal (`random_normal_initializer`)."""
  if version not in (1, 2):
    raise ConfigError(f"GPT version {version!r}; choose 1 or 2.")
  m = encoder(size, sizes=GPT_SIZES, vocab_size=40478 if version == 1 else 50257,
              max_positions=512 if version == 1 else 1024, type_vocab_size=0,
              layer_norm_eps=1e-5, activation="gelu_tanh", weight_init="normal")
  m.update(causal=True, pre_layer_norm=version == 2, embedding_layer_norm=False,
           embedding_dropout="table" if version == 1 else "output")
  if version == 2:   # GPT-2's initialisation: model.py's wpe N(0, 0.01); §2.3's 1/√N residuals
    m.update(position_initializer_range=0.01, scale_residual_init=True)
  m.update(overrides)
  return m


def unilm_objective(**overrides) -> ml_collections.ConfigDict:
  """UniLM's cloze (objectives/unilm.py; Dong et al. 2019 §2.3, §3.1): BERT's 15% and 80/10/10,
  80% of the units one word and 20% a bigram or trigram, new masks every epoch, no sentence
  task, B A's continuation (but in one-sentence chunks); LM types per row 1/3 bidirectional, 1/6 left-to-right, 1/6
  right-to-left, 1/3 seq2seq."""
  o = mlm_objective(name="unilm", mask_scheme="ngram", max_ngram=3, ngram_distribution="unilm",
                    masking="dynamic", sentence_task="", random_next_prob=0.0,
                    bidirectional_prob=1 / 3, left_to_right_prob=1 / 6, right_to_left_prob=1 / 6,
                    seq2seq_prob=1 / 3)
  o.update(overrides)
  return o


def gpt_adam(**overrides) -> ml_collections.ConfigDict:
  """GPT's Adam (finetune-transformer-lm opt.py `adam`): bias-corrected, ε 1e-8, decoupled L2
  0.01 on every weight matrix (not biases or gains) inside the bias-corrected step
  (`decay_bias_corrected`), gradient clipping at 1; the paper's pre-training rate 2.5e-4, 2,000
  warmup steps, cosine to 0 (`warmup_cosine`)."""
  o = ml_collections.ConfigDict(dict(
      name="adamw", peak_lr=2.5e-4, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01,
      bias_correction=True, decay_bias_corrected=True, decay_norm_and_bias=False, clip_norm=1.0,
      schedule="warmup_cosine", warmup_steps=2000, end_lr=0.0))
  o.update(overrides)
  return o


# ELMo's biLMs as allennlp released them (the options files' names: LSTM layers x cells,
# projection, CNN filters, highway layers); 'original' is the paper's.
ELMO_FILTERS = ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024))  # 2,048
ELMO_SIZES = {
    "original": dict(lstm_cells=4096, projection_dim=512, highway_layers=2),  # 2x4096_512_..2x
    "medium": dict(lstm_cells=2048, projection_dim=256, highway_layers=1),    # 2x2048_256_..1x
    "small": dict(lstm_cells=1024, projection_dim=128, highway_layers=1),     # 2x1024_128_..1x
}


def elmo_model(size: str, **overrides) -> ml_collections.ConfigDict:
  """ELMo's biLM (models/elmo.py; bilm-tf's options for the released models, spec §8): character
  CNN over 16-dim embeddings of ≤ 50 characters (261 ids), filters ELMO_FILTERS with ReLU,
  highway layers, projection; 2 LSTM layers per direction with projection, cell and projection
  clipped at 3, skip connections; dropout 0.1; the softmax over the 1B Word Benchmark's 793,471
  words."""
  if size not in ELMO_SIZES:
    raise ConfigError(f"Unknown ELMo size {size!r}; choose one of {sorted(ELMO_SIZES)}.")
  m = ml_collections.ConfigDict(dict(
      kind="elmo",
      vocab_size=793471,
      max_characters=50,
      char_embedding_dim=16,
      char_activation="relu",
      char_filters=ELMO_FILTERS,
      lstm_layers=2,
      cell_clip=3.0,
      proj_clip=3.0,
      skip_connections=True,
      dropout=0.1,
      dropout_bits=32,
      dtype="float32",
  ))
  m.update(ELMO_SIZES[size])
  m.update(overrides)
  return m


def xlnet_model(size: str, **overrides) -> ml_collections.ConfigDict:
  """XLNet's Transformer-XL (models/xlnet.py; zihangdai/xlnet modeling.py, spec §6.4): relative
  positions (sinusoidal, r_w / r_r biases), relative segments (r_s, seg_embed), untied per-layer
  biases, post-LN ε 1e-12, no absolute positions, GELU (the reference's tanh form; HF's
  XLNetConfig defaults to the exact one), dropout 0.1 (also on attention), init N(0, 0.02); memory of `mem_len` states of the previous window's first `reuse_len` tokens
  (README large: 384 and 256 of 512). Vocabulary 32,000 (SentencePiece, cased)."""
  if size not in XLNET_SIZES:
    raise ConfigError(f"Unknown XLNet size {size!r}; choose one of {sorted(XLNET_SIZES)}.")
  m = ml_collections.ConfigDict(dict(
      kind="xlnet",
      vocab_size=32000,
      activation="gelu_tanh",
      dropout=0.1,
      attention_dropout=0.1,
      dropout_bits=32,
      layer_norm_eps=1e-12,
      initializer_range=0.02,
      weight_init="normal",  # its task heads; modeling.py's _get_initializer: random_normal
      bare_dense_init="truncated_normal",  # the task classifier (heads._classifier)
      classifier_pooler=True,  # summarize_sequence's use_proj: a tanh dense on <cls>
      untie_r=True,
      mem_len=384,
      reuse_len=256,
      clamp_len=-1,
      dtype="float32",
      attention_impl="",
      remat_policy="none",
      scan_layers=False,
  ))
  m.update(XLNET_SIZES[size])
  m.update(overrides)
  return m


def xlnet_objective(**overrides) -> ml_collections.ConfigDict:
  """Permutation LM (objectives/xlnet.py; data_utils.py flags): 85 targets per 512-token window
  chosen by n-gram spans (n ≤ 5, p ∝ 1/n, context n·alpha/beta), permutations within blocks of
  perm_size, half the rows reversed (bi_data), an <eod> after each document."""
  o = ml_collections.ConfigDict(dict(
      name="xlnet", num_predict=85, mask_alpha=6.0, mask_beta=1.0, max_ngram=5, perm_size=256,
      bi_data=True, use_eod=True))
  o.update(overrides)
  return o


def t5_objective(**overrides) -> ml_collections.ConfigDict:
  """T5's denoising objective as (noise mask) × (inputs encoding) × (targets encoding), the
  reference's `denoise` (t5/data/preprocessors.py); defaults = the final T5 objective,
  `span_corruption`: random spans, 15% noise, mean span 3, unique sentinels on both sides, 568
  raw tokens → 512 inputs / 114 targets. Rows of the objective comparison are settings of these
  fields (experiments/t5_objectives.py)."""
  o = ml_collections.ConfigDict(dict(
      name="t5",
      noise_mask="random_spans",      # random_spans | iid | random_prefix | mass_fragment |
                                      # bart_infilling
      noise_density=0.15,
      mean_noise_span_length=3.0,     # random_spans only
      inputs_encoding="noise_span_to_unique_sentinel",
      targets_encoding="nonnoise_span_to_unique_sentinel",
      random_prob=0.1,                # noise_token_to_random_token_or_sentinel (BERT-style row)
      keep_prob=0.1,                  # noise_token_to_sentinel_keep_or_random (MASS's 80/10/10)
      concat_documents=True,          # reduce_concat_tokens (off for prefix LM and deshuffling)
      targets_length=114,             # decoder length; random spans need at least the helper's
      permute_sentences=0.0,          # BART sentence permutation: fraction of sentences shuffled
      poisson_lambda=3.0,             # BART text infilling span lengths
      mask_random=0.0,                # BART: a span's <mask> is a random token instead
      z_loss=1e-4,                    # t5x's auxiliary z-loss (0 = off)
      loss_on_targets_only=True,      # decoder-only / prefix LM: loss on the targets (seqio)
      decoder_sees_masked=True,       # False: cross-attention skips masked inputs (MASS)
      masking="dynamic",              # new noise every epoch (the pipeline's epoch mode)
  ))
  o.update(overrides)
  return o


def t5_adafactor(**overrides) -> ml_collections.ConfigDict:
  """T5's optimizer (Raffel et al. §3.1.2; t5x pretrain.gin): Adafactor, decay rate 0.8, update
  clipping 1.0, parameter-scaled updates, no weight decay; learning rate 1/sqrt(max(step, 10^4))
  (0.01 for the first 10^4 steps); fine-tuning uses a constant 0.001."""
  o = ml_collections.ConfigDict(dict(
      name="adafactor", peak_lr=0.01, schedule="rsqrt", warmup_steps=10_000, end_lr=0.0,
      decay_rate=0.8, clipping_threshold=1.0, multiply_by_parameter_scale=True,
      weight_decay=0.0, clip_norm=0.0))
  o.update(overrides)
  return o


def bert_adamw(**overrides) -> ml_collections.ConfigDict:
  """BERT's AdamWeightDecayOptimizer (bert/optimization.py): no bias correction, decay excludes
  LayerNorm and bias, clip 1.0, warmup then `lr * (1 - step / total)`."""
  o = ml_collections.ConfigDict(dict(
      name="adamw", peak_lr=1e-4, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01,
      bias_correction=False, decay_norm_and_bias=False, clip_norm=1.0,
      schedule="linear_from_zero", warmup_steps=10_000, end_lr=0.0))
  o.update(overrides)
  return o


def albert_lamb(**overrides) -> ml_collections.ConfigDict:
  """ALBERT's LAMB (albert/lamb_optimizer.py, created by optimization.py create_optimizer):
  BERT's Adam without bias correction, `u = m / (sqrt(v) + eps) + wd·θ`, then u scaled by the
  trust ratio ‖θ‖/‖u‖; decay and trust ratio both skip LayerNorm and biases; clip 1.0; warmup,
  then polynomial decay with power 1 from step 0 (= linear_from_zero). lr 0.00176 and 3,125
  warmup steps are the README's recipe (batch 4096, 125k steps)."""
  o = bert_adamw(name="lamb", peak_lr=0.00176, warmup_steps=3125)
  o.update(overrides)
  return o


def elmo_adagrad(**overrides) -> ml_collections.ConfigDict:
  """bilm-tf's optimizer (training.py `train`): the gradients of the mean loss × unroll_steps
  (20: `opt.compute_gradients(loss * options['unroll_steps'])`, a sum over the 20 words of its
  rows), their global norm clipped at 10 (`all_clip_norm_val`), then TF's Adagrad at a constant
  0.2 with every accumulator starting at 1.0; no weight decay."""
  o = ml_collections.ConfigDict(dict(
      name="adagrad", peak_lr=0.2, initial_accumulator=1.0, gradient_scale=20.0, clip_norm=10.0,
      weight_decay=0.0, schedule="constant", warmup_steps=0, end_lr=0.0))
  o.update(overrides)
  return o


def fairseq_adam(**overrides) -> ml_collections.ConfigDict:
  """fairseq's Adam (fairseq/optim/adam.py) with polynomial_decay: bias-corrected, decoupled decay
  on every parameter, warmup then linear to `end_lr` over the remaining steps."""
  o = ml_collections.ConfigDict(dict(
      name="adamw", peak_lr=5e-4, b1=0.9, b2=0.98, eps=1e-6, weight_decay=0.01,
      bias_correction=True, decay_norm_and_bias=True, clip_norm=0.0,
      schedule="linear_after_warmup", warmup_steps=10_000, end_lr=0.0))
  o.update(overrides)
  return o


def shrink_for_local(c: ml_collections.ConfigDict) -> None:
  """`:runlocal`: the embedded corpus and a model that trains on a 2-core CPU in ~10 minutes."""
  c.data.source = "embedded_wiki"
  c.data.seq_len = 128
  c.data.eval_fraction = 0.1  # ~10 of the 96 articles, so eval batches rarely repeat
  c.model.update(ENCODER_SIZES["mini"])
  c.model.vocab_size = 8000
  c.model.max_positions = 128
  if "max_predictions" in c.objective:
    c.objective.max_predictions = 20
  # A 2-layer model on 2k steps: above the papers' rates, but not 2e-3, where BERT's stayed at
  # the unigram (4.2% held-out MLM accuracy at step 650) while 1e-3 reached 10% by step 450.
  c.optimizer.peak_lr = 1e-3
  c.optimizer.warmup_steps = 200
  c.train.batch_size = 32
  c.train.total_steps = 2000
  c.train.log_every = 50
  c.train.eval_every = 500
  c.train.eval_batches = 10
  c.train.checkpoint_every = 500
  c.mesh.update(data=-1, fsdp=1, tensor=1)


def mask_budget(seq_len: int, mask_rate: float) -> int:
  """The number of predictions 15% masking asks for in a full sequence of `seq_len` tokens."""
  return max(1, round(seq_len * mask_rate))


# Model kinds other than the BERT-family encoder, each trained by the objective of its name.
OWN_MODELS = ("t5", "xlnet", "elmo")


def validate(c: ml_collections.ConfigDict) -> None:
  """Raises ConfigError naming the fix for configurations that cannot run: the sections every
  run has (data, model, optimizer, train, mesh). The objective's own fields are its module's
  `validate` (`objectives.validate` runs both)."""
  d, m, t = c.data, c.model, c.train
  check_fields(c, FIELD_RULES)
  validate_tracking(t)
  if m.get("kind") in OWN_MODELS and c.objective.get("name") != m.kind:
    raise ConfigError(f"model.kind={m.kind!r} trains with objective.name={m.kind!r}, not "
                      f"{c.objective.get('name')!r}.")
  if m.get("causal", False) != (c.objective.get("name") == "causal_lm"):
    raise ConfigError(f"model.causal={m.get('causal', False)} with objective.name="
                      f"{c.objective.get('name')!r}: causal attention is the causal_lm objective's "
                      "(configs/gpt.py) and only its.")
  if m.get("kind") not in OWN_MODELS and d.seq_len > m.max_positions:
    raise ConfigError(f"data.seq_len={d.seq_len} exceeds model.max_positions={m.max_positions}; "
                      f"lower --config.data.seq_len or raise --config.model.max_positions.")
  if m.get("kind") not in OWN_MODELS:
    if m.hidden % m.heads:
      raise ConfigError(f"model.hidden={m.hidden} is not divisible by model.heads={m.heads}.")
    _validate_model(m)
  if m.get("kind") != "elmo":   # no attention
    _validate_attention(m)
  # A distillation teacher (loaded from its workdir, overridable) computes with its own fields.
  for name, section in (("model", m), ("objective.teacher_model",
                                       c.get("objective", {}).get("teacher_model"))):
    if section and section.get("fp8_matmuls", False) and section.get("dtype") != "bfloat16":
      raise ConfigError(f"{name}.fp8_matmuls rounds bf16 matmuls to FP8; it needs "
                        f"--config.{name}.dtype=bfloat16 (it is {section.get('dtype')!r}).")
  if d.source == "text" and not d.text_files:
    raise ConfigError("data.source='text' needs --config.data.text_files=PATH[,PATH...] (globs allowed).")
  if d.source == "tfds" and d.get("wordnet_glosses", False):
    raise ConfigError("data.wordnet_glosses adds to an embedded or text corpus, not to TFDS; set "
                      "--config.data.wordnet_glosses=False or another data.source.")
  if d.get("document_separator", False) and d.packing != "full_sentences":
    raise ConfigError(f"data.document_separator adds RoBERTa's separator between the documents "
                      f"of data.packing='full_sentences', not {d.packing!r}; set it False.")
  if d.num_shards and t.batch_size % d.num_shards:
    raise ConfigError(f"data.num_shards={d.num_shards} must be 0 (one per process) or divide "
                      f"train.batch_size={t.batch_size}.")
  if t.batch_size % t.grad_accum_steps:
    raise ConfigError(f"train.batch_size={t.batch_size} is not divisible by "
                      f"train.grad_accum_steps={t.grad_accum_steps}.")
  if t.get("stop_step", 0) > t.total_steps:
    raise ConfigError(f"train.stop_step={t.stop_step} is past train.total_steps={t.total_steps}, "
                      "where the schedule ends; lower it, or 0 to stop at total_steps.")
  if t.get("init_state", "params") == "all" and not t.init_from:
    raise ConfigError("train.init_state='all' continues another run: set --config.train.init_from="
                      "<its workdir>/checkpoints (BERT's phase 2: the phase-1 run's).")
  if c.optimizer.warmup_steps >= t.total_steps and c.optimizer.schedule in (
      "linear_after_warmup", "warmup_cosine"):
    raise ConfigError(f"optimizer.warmup_steps={c.optimizer.warmup_steps} must be below "
                      f"train.total_steps={t.total_steps}.")
  sizes = [c.mesh.data, c.mesh.fsdp, c.mesh.tensor]
  if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise ConfigError(f"mesh {dict(c.mesh)}: sizes must be positive with at most one -1.")
  pieces = c.tokenizer.get("vocab_size", 0) + c.tokenizer.get("extra_ids", 0)
  if c.tokenizer.kind == "sentencepiece" and pieces > m.vocab_size:
    raise ConfigError(f"tokenizer.vocab_size={c.tokenizer.vocab_size} + extra_ids="
                      f"{c.tokenizer.extra_ids} ids do not fit model.vocab_size={m.vocab_size} "
                      f"rows; raise --config.model.vocab_size or lower the tokenizer's.")


DTYPES = ("float32", "bfloat16", "float16")
ATTENTION_IMPLS = ("", "xla", "cudnn")
DROPOUT_BITS = (32, 16)
OPTIMIZERS = ("adamw", "lamb", "adafactor", "adagrad")
SHARE_LAYERS = ("none", "all", "attention", "ffn")
# `tokenizer.normalize` (data/tokenizers.normalize_text): '' as is, ALBERT's preprocess_text.
NORMALIZERS = ("", "albert")
PACKINGS = ("sentence_pairs", "full_sentences", "document_blocks", "electra_segments",
            "t5_segments", "xlnet_streams", "lm_stream")


@dataclasses.dataclass(frozen=True)
class Range:
  """A finite number in [low, high] (`open` ends excluded): what a size, a period, a rate or a
  probability may be. NaN and ±inf never hold."""
  low: float = -math.inf
  high: float = math.inf
  low_open: bool = False
  high_open: bool = False

  def holds(self, value) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
      return False
    above = value > self.low if self.low_open else value >= self.low
    below = value < self.high if self.high_open else value <= self.high
    return above and below

  def describe(self) -> str:
    if self.high == math.inf:
      return f"{'>' if self.low_open else '>='} {_number(self.low)}"
    if self.low == -math.inf:
      return f"{'<' if self.high_open else '<='} {_number(self.high)}"
    return (f"in {'(' if self.low_open else '['}{_number(self.low)}, {_number(self.high)}"
            f"{')' if self.high_open else ']'}")


def _number(x: float) -> str:
  return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(x)


AT_LEAST_1 = Range(1)
AT_LEAST_0 = Range(0)
POSITIVE = Range(0, low_open=True)
PROBABILITY = Range(0, 1)
# The train step's random-bit generators (train/step.py SeededStep).
RNG_IMPLS = ("threefry", "rbg", "unsafe_rbg")
# train.cpu_ynn_fusion: a subset of the first three, or "none" alone.
YNN_FUSION_TYPES = frozenset({"dot", "eltwise", "reduce", "none"})
RATE = Range(0, 1, high_open=True)      # a dropout rate, a held-out fraction, Adam's betas

ACTIVATIONS = ("gelu", "gelu_tanh", "relu")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
SCHEDULES = ("constant", "linear_after_warmup", "linear_from_zero", "rsqrt",
             "warmup_times_linear", "warmup_cosine")
SOURCES = ("embedded_wiki", "tfds", "text")
TEXT_FORMATS = ("auto", "blank_lines", "lines", "jsonl")
TOKENIZER_KINDS = ("sentencepiece", "hf")
SENTENCEPIECE_TYPES = ("unigram", "bpe")

# Every number and choice of the sections all runs share, and what it may be: one table, checked
# before anything is read or written (`check_fields`: a batch of 0 would "train" on nothing, a
# period of 0 divide by zero, a dropout of 3 train without complaint). An objective's own fields are in its
# module's FIELD_RULES (`objectives.field_rules`). Free-form strings (paths, dataset and split
# names) are checked where they are used, with the file or dataset named.
FIELD_RULES = {
    "seed": Range(0, 2**31 - 1),
    "data.source": SOURCES,
    "data.text_format": TEXT_FORMATS,
    "data.eval_fraction": RATE,
    "data.seq_len": Range(8),
    "data.packing": PACKINGS,
    "data.document_separator": (False, True),
    "data.short_seq_prob": PROBABILITY,
    "data.docs_per_chunk": AT_LEAST_1,
    "data.num_shards": AT_LEAST_0,
    "data.prefetch": Range(0, 1024),
    "data.workers": Range(0, 256),
    "tokenizer.kind": TOKENIZER_KINDS,
    "tokenizer.model_type": SENTENCEPIECE_TYPES,
    "tokenizer.train_max_sentences": AT_LEAST_1,
    "tokenizer.vocab_size": AT_LEAST_0,
    "tokenizer.extra_ids": AT_LEAST_0,
    "tokenizer.normalize": NORMALIZERS,
    "model.vocab_size": AT_LEAST_1,
    "model.hidden": AT_LEAST_1,
    "model.layers": AT_LEAST_1,
    "model.decoder_layers": AT_LEAST_1,
    "model.heads": AT_LEAST_1,
    "model.head_dim": AT_LEAST_1,
    "model.mlp": AT_LEAST_1,
    "model.max_positions": AT_LEAST_1,
    "model.type_vocab_size": AT_LEAST_0,
    "model.causal": (False, True),
    "model.pre_layer_norm": (False, True),
    "model.embedding_layer_norm": (False, True),
    "model.embedding_dropout": ("output", "table"),
    "model.position_initializer_range": AT_LEAST_0,
    "model.scale_residual_init": (False, True),
    "model.weight_init": ("truncated_normal", "normal"),
    "model.bare_dense_init": ("truncated_normal", "glorot_uniform"),
    "model.classifier_pooler": (False, True),
    "model.share_encoder_decoder": (False, True),
    "model.relpos_bias_init": ("glorot_uniform", "normal"),
    "model.prefix_lm_buckets": ("bidirectional", "causal"),
    "model.embedding_size": AT_LEAST_0,
    "model.hidden_groups": AT_LEAST_1,
    "model.adapter_size": AT_LEAST_0,
    "model.vocab_multiple": AT_LEAST_1,
    "model.relative_buckets": AT_LEAST_1,
    "model.relative_max_distance": AT_LEAST_1,
    "model.mem_len": AT_LEAST_0,
    "model.reuse_len": AT_LEAST_1,
    "model.clamp_len": Range(-1),
    "model.dropout": RATE,
    "model.attention_dropout": RATE,
    "model.layer_norm_eps": Range(0, 1, low_open=True),
    "model.initializer_range": POSITIVE,
    "model.dtype": DTYPES,
    "model.activation": ACTIVATIONS,
    "model.remat_policy": REMAT_POLICIES,
    "model.attention_impl": ATTENTION_IMPLS,
    "model.dropout_bits": DROPOUT_BITS,
    "model.share_layers": SHARE_LAYERS,
    "model.architecture": T5_ARCHITECTURES,
    "model.kind": ("t5", "xlnet", "elmo"),
    "model.version": ("1.0", "1.1"),
    "objective.masking": ("static", "dynamic"),
    "optimizer.name": OPTIMIZERS,
    "optimizer.schedule": SCHEDULES,
    "optimizer.peak_lr": AT_LEAST_0,
    "optimizer.end_lr": AT_LEAST_0,
    "optimizer.min_lr_ratio": PROBABILITY,
    "optimizer.warmup_steps": AT_LEAST_0,
    "optimizer.b1": RATE,
    "optimizer.b2": RATE,
    "optimizer.eps": AT_LEAST_0,
    "optimizer.weight_decay": AT_LEAST_0,
    "optimizer.clip_norm": AT_LEAST_0,
    "optimizer.initial_accumulator": AT_LEAST_0,
    "optimizer.gradient_scale": POSITIVE,
    "optimizer.decay_rate": Range(0, 1, low_open=True),
    "optimizer.clipping_threshold": AT_LEAST_0,
    "train.batch_size": AT_LEAST_1,
    "train.total_steps": AT_LEAST_1,
    "train.stop_step": AT_LEAST_0,
    "train.rng_impl": RNG_IMPLS,
    "train.cpu_ynn_fusion": YNN_FUSION_TYPES,
    "train.wandb_mode": ("offline", "online"),
    "train.init_state": ("params", "all"),
    "train.grad_accum_steps": AT_LEAST_1,
    "train.log_every": AT_LEAST_1,
    "train.eval_every": AT_LEAST_1,
    "train.eval_batches": AT_LEAST_0,
    "train.checkpoint_every": AT_LEAST_1,
    "train.keep_checkpoints": AT_LEAST_1,
    "mesh.data": Range(-1),
    "mesh.fsdp": Range(-1),
    "mesh.tensor": Range(-1),
}


def check_vocabulary(c: ml_collections.ConfigDict, tokenizer,
                     fix: str = "raise --config.model.vocab_size.") -> None:
  """ConfigError unless the tokenizer's ids fit model.vocab_size; `fix`: the message's remedy."""
  vocab = getattr(tokenizer, "vocab_size", None)
  if vocab is not None and vocab > c.model.vocab_size:
    raise ConfigError(f"The tokenizer has {vocab} ids but model.vocab_size={c.model.vocab_size}; "
                      f"{fix}")


def check_fields(c: ml_collections.ConfigDict, rules: dict) -> None:
  """Raises ConfigError for the first field of `c` outside its rule: a `Range`, a tuple of
  choices, or a frozenset whose subsets are written comma-separated ("none", when it is one of
  the set's, only alone). Fields `c` does not have are skipped (a section of another family)."""
  for path, rule in rules.items():
    section, _, key = path.rpartition(".")
    holder = c[section] if section else c
    if key not in holder:
      continue
    value = holder[key]
    if isinstance(rule, Range) and not rule.holds(value):
      raise ConfigError(f"{path}={value} must be {rule.describe()}; set --config.{path} to a "
                        f"value {rule.describe()}.")
    if isinstance(rule, tuple) and value not in rule:
      raise ConfigError(f"{path}={value!r}; choose one of {rule}.")
    kinds = set(value.split(",")) if isinstance(rule, frozenset) and value else set()
    if isinstance(rule, frozenset) and (not kinds <= rule or ("none" in kinds and len(kinds) > 1)):
      alone = ", 'none' alone" if "none" in rule else ""
      raise ConfigError(f"{path}={value!r}; give a comma-separated subset of "
                        f"{sorted(rule - {'none'})} (no spaces){alone}, or '' for the default.")


def memory_floor_bytes(c: ml_collections.ConfigDict) -> int:
  """A lower bound on the memory one training step needs, from the config alone: 4-byte
  parameters and their gradients for the embedding tables and the feed-forward matrices (every
  family has both; attention and the rest come on top), and one hidden state per token of a
  micro-batch per layer, in the compute dtype, kept for the backward pass; a distillation
  teacher's (`objective.teacher_model`) tables and feed-forward matrices once more, at 4 bytes.
  Python integers, so that absurd sizes do not overflow.
  `train.run` refuses a config whose floor exceeds the devices' memory (a hidden size of 10^9
  would otherwise fail deep inside XLA)."""
  m = c.model
  inputs, targets = c.data.seq_len, c.objective.get("targets_length", 0)
  micro_batch = c.train.batch_size // c.train.grad_accum_steps
  activation_bytes = 4 if m.get("dtype", "float32") == "float32" else 2
  if m.get("kind") == "elmo":   # the softmax and each LSTM's gates; each step's cell state
    weights = m.vocab_size * m.projection_dim + 2 * m.lstm_layers * (
        8 * m.projection_dim * m.lstm_cells)
    return 8 * weights + 4 * 2 * m.lstm_layers * inputs * micro_batch * m.lstm_cells
  # (layers, tokens per row each of them sees) of every stack the model has.
  if m.get("kind") != "t5":
    stacks = [(m.layers, inputs)]
  elif m.architecture == "encoder_decoder":
    stacks = [(m.layers, inputs), (m.decoder_layers, targets)]
  else:   # one decoder stack over the inputs and targets concatenated (objectives/t5.py)
    stacks = [(m.decoder_layers, inputs + targets)]
  activations = sum(layers * length for layers, length in stacks) * micro_batch * m.hidden
  floor = 8 * _floor_params(m, sum(layers for layers, _ in stacks)) + (
      activation_bytes * activations)
  teacher = c.get("objective", {}).get("teacher_model")
  if teacher is not None:   # a distillation teacher: 4-byte parameters, no gradient, forward only
    floor += 4 * _floor_params(teacher, teacher.layers)
  return floor


def _floor_params(m: ml_collections.ConfigDict, layers: int) -> int:
  """The embedding tables and feed-forward matrices of the model section `m` with `layers`
  layers (ALBERT: tables embedding_size wide, one feed-forward block per group of shared
  layers)."""
  tables = (m.vocab_size + m.get("max_positions", 0)) * (m.get("embedding_size", 0) or m.hidden)
  own_ffns = (m.hidden_groups if m.get("share_layers", "none") in ("all", "ffn") else layers)
  return tables + own_ffns * 2 * m.hidden * m.mlp


def _validate_attention(m: ml_collections.ConfigDict) -> None:
  """cuDNN flash attention runs in bf16 / fp16 only, and `jax.nn.dot_product_attention` has no
  dropout: 'cudnn' with attention dropout would silently train on the explicit path."""
  if m.attention_impl not in ATTENTION_IMPLS:
    raise ConfigError(f"model.attention_impl={m.attention_impl!r}; choose one of "
                      f"{ATTENTION_IMPLS} ('' lets JAX choose).")
  if m.attention_impl != "cudnn":
    return
  if m.dtype not in ("bfloat16", "float16"):
    raise ConfigError(f"model.attention_impl='cudnn' needs --config.model.dtype=bfloat16 (or "
                      f"float16); it is {m.dtype!r}.")
  dropout_field = "dropout" if m.get("kind") == "t5" else "attention_dropout"
  if m[dropout_field] > 0:
    raise ConfigError(f"model.attention_impl='cudnn' has no attention dropout; set "
                      f"--config.model.{dropout_field}=0 (a deviation from the paper's "
                      f"{m[dropout_field]}) or --config.model.attention_impl=''.")


def _validate_model(m: ml_collections.ConfigDict) -> None:
  """ALBERT's fields (factorised embedding width, sharing mode, groups, what scan supports) and the
  adapter width."""
  if m.embedding_size < 0:
    raise ConfigError(f"model.embedding_size={m.embedding_size} must be >= 0 (0: as wide as "
                      "hidden).")
  if m.share_layers not in SHARE_LAYERS:
    raise ConfigError(f"model.share_layers={m.share_layers!r}; choose one of {SHARE_LAYERS}.")
  if not 1 <= m.hidden_groups <= m.layers:
    raise ConfigError(f"model.hidden_groups={m.hidden_groups} must be in [1, model.layers="
                      f"{m.layers}].")
  if m.share_layers == "none" and m.hidden_groups != 1:
    raise ConfigError(f"model.hidden_groups={m.hidden_groups} groups shared layers only; set "
                      "--config.model.share_layers=all (ALBERT) or --config.model.hidden_groups=1.")
  if m.adapter_size < 0:
    raise ConfigError(f"model.adapter_size={m.adapter_size} must be >= 0 (0: no adapters).")
  if m.scan_layers and m.share_layers in ("attention", "ffn"):
    raise ConfigError(f"model.scan_layers=True cannot scan share_layers={m.share_layers!r} (one "
                      "sublayer shared, the other per layer); set "
                      "--config.model.scan_layers=False.")
  if m.get("embedding_dropout", "output") == "table" and (
      not m.get("causal", False) or m.embedding_size or m.type_vocab_size):
    raise ConfigError("model.embedding_dropout='table' is GPT's (a causal model with one "
                      "hidden-wide table of tokens and positions, no token types); set "
                      "--config.model.embedding_dropout=output.")


def effective_mask_rate(c: ml_collections.ConfigDict) -> float:
  """The fraction of a full-length sequence that is predicted given max_predictions (ALBERT's
  shipped 512/20 setting predicts ~3.9%, which is legal and logged, not refused)."""
  budget = mask_budget(c.data.seq_len, c.objective.mask_rate)
  return min(budget, c.objective.max_predictions) / c.data.seq_len


# ---------------------------------------------------------------------------------------------
# Fine-tuning (configs/finetune.py; bertfam_jax/finetune/run.py). The encoder's `model` and
# `tokenizer` sections come from `finetune.init` at run time.
# ---------------------------------------------------------------------------------------------

FINETUNE_METHODS = ("full", "adapters")
FINETUNE_FEATURES = ("last", "weighted_sum")
FINETUNE_QA_HEADS = ("independent", "joint")
LAYER_DECAY_STYLES = ("electra", "ulmfit")
FINETUNE_OPTIMIZERS = ("adamw", "adafactor")

_DEFAULT = config_dict.placeholder  # a typed field left None: resolved when the run starts


def finetune_config() -> ml_collections.ConfigDict:
  """The sections of a fine-tuning run: seed, finetune, optimizer, train, mesh.

  The model, tokenizer and objective come from `finetune.init` when the run starts, and so does
  whether it trains an encoder's task head or a T5 text-to-text: the fields left None here take
  that recipe's defaults then (`resolve_finetune`, the tables `FINETUNE_DEFAULTS` and
  `FINETUNE_RUNLOCAL`), and any field given a value keeps it. Building the config reads nothing.
  """
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.finetune = ml_collections.ConfigDict(dict(
      task="wordnet_supersense",
      init="",                 # a workdir of ours (pre-trained or imported) or a transformers dir
      runlocal=False,          # CPU-sized defaults (FINETUNE_RUNLOCAL) for the :runlocal models
      from_scratch=False,      # keep init's shape and tokenizer, re-initialise every weight
      data_dir="",             # TFDS data_dir for glue/*, super_glue/*, squad/*
      train_split="",          # '' = the task's own (train)
      eval_split="",           # '' = the task's own (validation; mnli: validation_matched)
      max_train_examples=_DEFAULT(int),   # 0 = all
      max_eval_examples=_DEFAULT(int),    # 0 = all
      max_seq_len=_DEFAULT(int),          # tokens per row (a T5's inputs)
      epochs=_DEFAULT(float),             # sets the steps when train.total_steps is 0
      doc_stride=_DEFAULT(int),           # extractive QA windows (run_squad.py)
      max_query_len=_DEFAULT(int),
      dropout=_DEFAULT(float),            # model.dropout while fine-tuning: the recipe's (T5
                                          # text-to-text 0.1, t5x finetune.gin's DROPOUT_RATE),
                                          # else the pre-trained model's own
      head_dropout=_DEFAULT(float),  # the dropout before a sequence-level head's classifier:
                                     # the recipe's (RoBERTa: 0, fairseq's pooler_dropout),
                                     # else finetune.dropout
      head_init=_DEFAULT(str),  # a sequence-level head's weights: 'model' (the encoder's law) |
                                # 'torch_default' (nn.Linear's U(±1/√fan_in), fairseq RoBERTa's)
      max_answer_len=30,
      n_best=20,               # start and end candidates (the joint head: its beam, ELECTRA's
                               # beam_size)
      null_threshold=0.0,      # SQuAD 2.0: predict no answer when null − best > threshold
      qa_head=_DEFAULT(str),   # extractive QA: independent (run_squad.py: start and end apart)
                               # | joint (ELECTRA's: the end given the start, a beam, and an
                               # answerable classifier); the recipe's (ELECTRA: joint)
      answerable_threshold=-2.75,  # joint, SQuAD 2.0: no answer when the example's least
                                   # 'no answer' logit exceeds it (ELECTRA's qa_na_threshold)
      method="full",           # full | adapters (Houlsby: only adapters, LayerNorms, head)
      adapter_size=64,
      features="last",         # last | weighted_sum (ELMo's scalar mix of every layer)
      mix_layer_norm=False,    # weighted_sum: normalise each layer first (bilm-tf do_layer_norm)
      mix_l2=0.0,              # weighted_sum: λ·Σ w² on the mix's weights (bilm-tf l2_coef)
      layer_decay=_DEFAULT(float),  # layer-wise lr decay (ELECTRA: 0.8, large 0.9; ULMFiT's
                                    # discriminative rates 1/2.6); 1 = off
      layer_decay_style="electra",  # electra (the head d^2 above the top layer) | ulmfit (d)
      freeze_layers=0,         # embeddings + the lowest N layers get no update
      prune_sparsity=0.0,      # global magnitude pruning of the encoder layers' weight matrices
                               # before fine-tuning, held at 0 (finetune/prune.py); 0 = off
      prune_heads=0.0,         # share of attention heads removed before fine-tuning by Michel et
                               # al.'s gradient importance, 10% per round (finetune/prune.py)
      unfreeze_every=0,        # ULMFiT's gradual unfreezing: the head first, then one more layer
                               # from the top every this many steps (ULMFiT: an epoch); 0 = off
      reuse_pooler=True,       # start the head's pooler from the pre-trained NSP pooler if any
      # TinyBERT's task-specific distillation (finetune/distill.py): a fine-tuning workdir on this
      # task as the teacher ('' = off), the stage, the soft labels' temperature, and the teacher
      # layer each student layer learns ('' = uniform).
      teacher="",
      distill="intermediate",  # intermediate (attention + hidden states) | prediction (logits)
      distill_temperature=1.0,
      teacher_layers="",
      # Q8BERT's 8-bit quantization (finetune/quantize.py): 'qat' quantization-aware fine-tuning,
      # 'ptq' a float fine-tuning evaluated quantized with dynamic ranges; '' = off.
      quantize="",
      quantize_ema_decay=0.9999,
      # GPT (a causal_lm init): the auxiliary LM loss's weight λ (the paper's 0.5; 0 = off), and
      # similarity's input transformation: 2 = both orders of a pair, their extract states summed.
      lm_coef=_DEFAULT(float),
      pair_orders=1,
      # UniLM's seq2seq fine-tuning on a text task (finetune/unilm_seq2seq.py): each row masks
      # max(1, round(mask_prob · its target tokens)) (the paper's 0.7), and the label smoothing
      # of their loss.
      mask_prob=0.7,
      label_smoothing=0.1,
      # Text-to-text fine-tuning of a T5 init (finetune/seq2seq.py):
      targets_length=0,        # decoder length; 0 = the task's max_target_tokens
      beam_size=1,             # 1 = greedy decoding (the paper); > 1 beam search
      alpha=0.6,               # beam search length penalty
  ))
  c.optimizer = ml_collections.ConfigDict(dict(
      name=_DEFAULT(str),              # adamw (BERT's AdamWeightDecay) | adafactor (T5's)
      peak_lr=_DEFAULT(float),
      warmup_fraction=_DEFAULT(float),  # warmup over this fraction of the steps, then linear decay
      weight_decay=_DEFAULT(float),
      clip_norm=_DEFAULT(float),
      adam=_DEFAULT(str),     # adamw's kind: bert (AdamWeightDecay) | gpt (finetune-transformer-
                              # lm opt.py: bias-corrected, ε 1e-8, L2 inside the step, warmup_linear)
                              # | fairseq (optim/adam.py: bias-corrected, β₂ 0.98, ε 1e-6,
                              # decoupled decay on every parameter; polynomial_decay)
      schedule="linear",      # linear (BERT's warmup + decay) | slanted_triangular (ULMFiT)
      cut_frac=0.1,           # slanted_triangular: the share of steps rising (ULMFiT)
      ratio=32.0,             # slanted_triangular: how much smaller the lowest rate is (ULMFiT)
  ))
  c.train = ml_collections.ConfigDict(dict(
      batch_size=_DEFAULT(int),   # the recipe's: 32 (RoBERTa: 16 for its small GLUE tasks)
      eval_batch_size=64,
      total_steps=_DEFAULT(int),  # 0 = finetune.epochs passes over the training rows
      grad_accum_steps=1,
      log_every=50,
      keep_checkpoints=1,
      cpu_ynn_fusion=_DEFAULT(str),  # as pre-training's train.cpu_ynn_fusion (T5: all three)
      **RUN_TRACKING,
  ))
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
  return c


# The recipes' defaults. Encoders: run_classifier.py (128 tokens, lr 5e-5, 3 epochs, 10% warmup,
# AdamW with weight decay 0.01, clip 1.0), run_squad.py (384 tokens, doc_stride 128, queries of
# <= 64 tokens, lr 3e-5, 2 epochs), BERT's NER setting for token classification. T5 (Raffel et
# al. §3.1.4; t5x finetune.gin): Adafactor at a constant 0.001, 512 input tokens.
# ELECTRA (configure_finetuning.py; the paper's Table 7): layer-wise decay 0.8 (large 0.9), lr by
# size (small 3e-4 as Table 7, where configure_finetuning.py's default is 1e-4; base 1e-4, large
# 5e-5), 3 epochs at 128 tokens, 10 for RTE and STS-B, SQuAD 2 epochs at 512 with its joint QA
# head (qa_tasks.py).
# GPT (Radford et al. 2018 §4.1; finetune-transformer-lm train.py): lr 6.25e-5, batch 32, 3
# epochs, warmup over 0.2% of the steps then linear decay, weight decay 0.01, clip 1, the
# auxiliary LM loss at λ = 0.5.
_ENCODER = dict(optimizer=dict(name="adamw", peak_lr=5e-5),
                finetune=dict(max_seq_len=128, epochs=3.0, doc_stride=128, max_query_len=64,
                              max_train_examples=0, max_eval_examples=0, layer_decay=1.0,
                              lm_coef=0.0, qa_head="independent", head_init="model"),
                train=dict(total_steps=0, cpu_ynn_fusion="", batch_size=32))
_ELECTRA = dict(_ENCODER, optimizer=dict(name="adamw", peak_lr=1e-4),
                finetune=dict(_ENCODER["finetune"], layer_decay=0.8))
FINETUNE_DEFAULTS = {
    "encoder": _ENCODER,
    "extractive_qa": dict(_ENCODER, optimizer=dict(name="adamw", peak_lr=3e-5),
                          finetune=dict(_ENCODER["finetune"], max_seq_len=384, epochs=2.0)),
    "electra": _ELECTRA,
    # fairseq's GLUE fine-tuning of RoBERTa (examples/roberta/config/finetuning/*.yaml):
    # Adam (0.9, 0.98), ε 1e-6, weight decay 0.1, no clipping, 6% warmup then linear decay, 10
    # epochs, batch 32, lr 1e-5 (ROBERTA_FINETUNE_BY_TASK: RTE and STS-B 2e-5, the small tasks
    # batch 16, QQP 25% warmup), up to 512 tokens; its RobertaClassificationHead without dropout
    # (pooler_dropout 0) and with torch's default init (registered after init_bert_params).
    "roberta": dict(_ENCODER,
                    optimizer=dict(name="adamw", peak_lr=1e-5, adam="fairseq", weight_decay=0.1,
                                   clip_norm=0.0, warmup_fraction=0.06),
                    finetune=dict(_ENCODER["finetune"], max_seq_len=512, epochs=10.0,
                                  head_dropout=0.0, head_init="torch_default")),
    "electra_qa": dict(_ELECTRA, finetune=dict(_ELECTRA["finetune"], max_seq_len=512,
                                               epochs=2.0, qa_head="joint")),
    "text_to_text": dict(_ENCODER, optimizer=dict(name="adafactor", peak_lr=1e-3),
                         # Dropout 0.1 whatever pre-training used (v1.1: 0), as t5x's
                         # finetune.gin (DROPOUT_RATE = 0.1; released_checkpoints.md: "dropout
                         # should be re-enabled during fine-tuning").
                         finetune=dict(_ENCODER["finetune"], max_seq_len=512, epochs=3.0,
                                       dropout=0.1),
                         # A T5's step on a CPU: as configs/t5.py's (docs/results.md).
                         train=dict(_ENCODER["train"], cpu_ynn_fusion="dot,eltwise,reduce")),
    # finetune-transformer-lm train.py: opt.py's Adam (`adam='gpt'`) at 6.25e-5, warmup_linear
    # over 0.2% of the steps, λ = 0.5.
    "gpt": dict(_ENCODER, optimizer=dict(name="adamw", peak_lr=6.25e-5, warmup_fraction=0.002,
                                         adam="gpt"),
                finetune=dict(_ENCODER["finetune"], lm_coef=0.5)),
    # UniLM on a text task (unilm-v1 run_seq2seq.py's AdamW at 3e-5 with 10% warmup): sources of
    # 128 tokens, the task's target length.
    "unilm_seq2seq": dict(_ENCODER, optimizer=dict(name="adamw", peak_lr=3e-5)),
}
ROBERTA_FINETUNE_BY_TASK = {
    "glue/rte": dict(optimizer=dict(peak_lr=2e-5), train=dict(batch_size=16)),
    "glue/stsb": dict(optimizer=dict(peak_lr=2e-5), train=dict(batch_size=16)),
    "glue/mrpc": dict(train=dict(batch_size=16)),
    "glue/cola": dict(train=dict(batch_size=16)),
    "glue/qqp": dict(optimizer=dict(warmup_fraction=0.25)),   # 28,318 of 113,272 updates
}
# ELECTRA's sizes (by the discriminator's width) where they change the recipe; other widths
# (the :runlocal models) take base's.
ELECTRA_FINETUNE_BY_WIDTH = {256: dict(optimizer=dict(peak_lr=3e-4)),
                             1024: dict(optimizer=dict(peak_lr=5e-5),
                                        finetune=dict(layer_decay=0.9))}
# configure_finetuning.py: "rte" and "sts" train 10 epochs (the small datasets), every other
# GLUE task 3 (Table 7 alike).
ELECTRA_FINETUNE_BY_TASK = {task: dict(finetune=dict(epochs=10.0))
                            for task in ("glue/rte", "glue/stsb")}
# Houlsby adapters (google-research/adapter-bert README's run_classifier.py command for
# BERT-base): lr 3e-4, 5 epochs, whatever the recipe (a field given keeps its value).
FINETUNE_METHOD_DEFAULTS = {"adapters": dict(optimizer=dict(peak_lr=3e-4),
                                             finetune=dict(epochs=5.0))}
# The rest of the optimizer by its name, whichever recipe: BERT's AdamWeightDecay (10% warmup,
# decay 0.01, clip 1.0) and T5's Adafactor (constant rate, no decay, update clipping only).
FINETUNE_SCHEDULES = ("linear", "slanted_triangular")
FINETUNE_OPTIMIZERS_DEFAULTS = {
    "adamw": dict(warmup_fraction=0.1, weight_decay=0.01, clip_norm=1.0, adam="bert"),
    "adafactor": dict(warmup_fraction=0.0, weight_decay=0.0, clip_norm=0.0, adam="bert"),
}
FINETUNE_ADAMS = ("bert", "gpt", "fairseq")
FINETUNE_HEAD_INITS = ("model", "torch_default")
# `runlocal`: a CPU-sized slice for the `:runlocal` pre-trained models (128 positions, 2 layers,
# 128 wide). lr 5e-4: such an encoder needs more than the papers' base-size rates; the T5s at
# T5's 0.001 still emit one label after 150 steps of supersense (0% accuracy), at 0.01 they
# reach 20% (measured on a runlocal T5).
FINETUNE_RUNLOCAL = {
    "encoder": dict(optimizer=dict(peak_lr=5e-4),
                    finetune=dict(max_train_examples=4000, max_eval_examples=1000,
                                  max_seq_len=128)),
    "extractive_qa": dict(optimizer=dict(peak_lr=5e-4),
                          finetune=dict(max_train_examples=4000, max_eval_examples=1000,
                                        max_seq_len=128, doc_stride=64, max_query_len=32)),
    "text_to_text": dict(optimizer=dict(peak_lr=1e-2),
                         finetune=dict(max_train_examples=4000, max_eval_examples=500,
                                       max_seq_len=128),
                         train=dict(total_steps=1000)),
}


# ELECTRA's runlocal slices are the encoder's and the QA's; GPT's the encoder's; UniLM's
# sources of 64 tokens, so that the WordNet definitions (64 target tokens) fit 128 positions.
# RoBERTa's runlocal slice trains the encoder slice's 3 epochs, not its recipe's 10.
FINETUNE_RUNLOCAL.update(electra=FINETUNE_RUNLOCAL["encoder"],
                         roberta=dict(FINETUNE_RUNLOCAL["encoder"], finetune=dict(
                             FINETUNE_RUNLOCAL["encoder"]["finetune"], epochs=3.0)),
                         electra_qa=FINETUNE_RUNLOCAL["extractive_qa"],
                         gpt=FINETUNE_RUNLOCAL["encoder"],
                         unilm_seq2seq=dict(optimizer=dict(peak_lr=5e-4),
                                            finetune=dict(max_train_examples=4000,
                                                          max_eval_examples=500,
                                                          max_seq_len=64)))


def finetune_recipe(text_to_text: bool, task_kind: str, objective: str = "",
                    mask_style: str = "") -> str:
  """The key of FINETUNE_DEFAULTS for a T5 (text-to-text) or an encoder's task of `task_kind`,
  ELECTRA's own where the pre-trained run's `objective` is ELECTRA, GPT's for a causal LM,
  UniLM's seq2seq for a UniLM on a text task (`text_to_text`), RoBERTa's for classification and
  regression (fairseq's GLUE `sentence_prediction`) of a masked LM with its `mask_style`
  'fairseq' (configs/roberta.py, an imported RoBERTa)."""
  if text_to_text:
    return "unilm_seq2seq" if objective == "unilm" else "text_to_text"
  if objective == "causal_lm":
    return "gpt"
  qa = task_kind == "extractive_qa"
  if objective == "electra":
    return "electra_qa" if qa else "electra"
  if objective == "mlm" and mask_style == "fairseq" and task_kind in ("classification",
                                                                      "regression"):
    return "roberta"
  return "extractive_qa" if qa else "encoder"


def resolve_finetune(config: ml_collections.ConfigDict, recipe: str, hidden: int = 0,
                     dropout: float | None = None) -> ml_collections.ConfigDict:
  """A copy of the fine-tuning `config` with every field left None set from the `recipe`'s
  defaults (`finetune_recipe`; FINETUNE_RUNLOCAL's first with finetune.runlocal; an ELECTRA
  recipe's by the encoder's width `hidden`, ELECTRA_FINETUNE_BY_WIDTH, and by the task,
  ELECTRA_FINETUNE_BY_TASK; the method's, FINETUNE_METHOD_DEFAULTS), the optimizer's other
  fields from its name's (FINETUNE_OPTIMIZERS_DEFAULTS: an AdamW asked of a T5 gets AdamW's),
  then validated. A field given a value keeps it. `dropout`, the pre-trained model's
  `model.dropout`, is finetune.dropout's where the recipe sets none."""
  resolved = ml_collections.ConfigDict(config.to_dict())
  layers = [FINETUNE_RUNLOCAL[recipe]] if config.finetune.runlocal else []
  if recipe.startswith("electra"):
    layers.append(ELECTRA_FINETUNE_BY_WIDTH.get(hidden, {}))
    layers.append(ELECTRA_FINETUNE_BY_TASK.get(config.finetune.task, {}))
  if recipe == "roberta":
    layers.append(ROBERTA_FINETUNE_BY_TASK.get(config.finetune.task, {}))
  layers.append(FINETUNE_METHOD_DEFAULTS.get(config.finetune.method, {}))
  layers.append(FINETUNE_DEFAULTS[recipe])
  if dropout is not None:
    layers.append(dict(finetune=dict(dropout=dropout)))
  for layer in layers:
    for section, values in layer.items():
      for key, value in values.items():
        if resolved[section][key] is None:
          resolved[section][key] = value
  if resolved.finetune.head_dropout is None:
    resolved.finetune.head_dropout = resolved.finetune.dropout
  if resolved.optimizer.name not in FINETUNE_OPTIMIZERS:
    raise ConfigError(f"optimizer.name={resolved.optimizer.name!r}; choose one of "
                      f"{FINETUNE_OPTIMIZERS}.")
  for key, value in FINETUNE_OPTIMIZERS_DEFAULTS[resolved.optimizer.name].items():
    if resolved.optimizer[key] is None:
      resolved.optimizer[key] = value
  validate_finetune(resolved)
  return resolved


def validate_finetune(c: ml_collections.ConfigDict) -> None:
  """Raises ConfigError naming the fix for a fine-tuning config that cannot run (after
  `resolve_finetune`: no field is None)."""
  f, t, o = c.finetune, c.train, c.optimizer
  validate_tracking(t)
  check_fields(c, {key: FIELD_RULES[key] for key in ("train.wandb_mode", "train.cpu_ynn_fusion")})
  if f.dropout is not None and not 0 <= f.dropout < 1:
    raise ConfigError(f"finetune.dropout={f.dropout} must be in [0, 1); 0.1 is BERT's and T5's.")
  if f.method not in FINETUNE_METHODS:
    raise ConfigError(f"finetune.method={f.method!r}; choose one of {FINETUNE_METHODS}.")
  if f.features not in FINETUNE_FEATURES:
    raise ConfigError(f"finetune.features={f.features!r}; choose one of {FINETUNE_FEATURES}.")
  if f.head_init not in FINETUNE_HEAD_INITS or not 0 <= (f.head_dropout or 0.0) < 1:
    raise ConfigError(f"finetune.head_init={f.head_init!r} must be one of {FINETUNE_HEAD_INITS} "
                      f"and head_dropout={f.head_dropout} in [0, 1).")
  if f.qa_head not in FINETUNE_QA_HEADS:
    raise ConfigError(f"finetune.qa_head={f.qa_head!r}; choose one of {FINETUNE_QA_HEADS}.")
  if f.n_best < 1 or f.max_answer_len < 1:
    raise ConfigError(f"finetune.n_best={f.n_best} and max_answer_len={f.max_answer_len} must be "
                      f">= 1 (run_squad.py: 20 and 30).")
  mix_l2, mix_layer_norm = f.get("mix_l2", 0.0), f.get("mix_layer_norm", False)
  if mix_l2 < 0 or mix_layer_norm not in (True, False):
    raise ConfigError(f"finetune.mix_l2={mix_l2} must be >= 0 and mix_layer_norm="
                      f"{mix_layer_norm!r} True or False.")
  if (mix_l2 or mix_layer_norm) and f.features != "weighted_sum":
    raise ConfigError(f"finetune.mix_l2={mix_l2} and mix_layer_norm={mix_layer_norm} shape the "
                      f"scalar mix: set --config.finetune.features=weighted_sum, or leave them "
                      f"at 0.0 and False.")
  if o.name not in FINETUNE_OPTIMIZERS:
    raise ConfigError(f"optimizer.name={o.name!r}; choose one of {FINETUNE_OPTIMIZERS}.")
  if not 0 < f.layer_decay <= 1:
    raise ConfigError(f"finetune.layer_decay={f.layer_decay} must be in (0, 1] (1 = off).")
  if f.freeze_layers < 0 or f.epochs <= 0 or f.max_seq_len < 8 or f.adapter_size < 1:
    raise ConfigError("finetune.freeze_layers must be >= 0, epochs > 0, max_seq_len >= 8 and "
                      "adapter_size >= 1.")
  if not 0 <= f.get("prune_heads", 0.0) < 1:
    raise ConfigError(f"finetune.prune_heads={f.prune_heads} must be in [0, 1): the share of "
                      f"attention heads removed before fine-tuning (0 = off).")
  if not 0 <= f.get("prune_sparsity", 0.0) < 1:
    raise ConfigError(f"finetune.prune_sparsity={f.prune_sparsity} must be in [0, 1): the share "
                      f"of the encoder layers' weights set to 0 before fine-tuning (0 = off).")
  if f.lm_coef < 0 or f.get("pair_orders", 1) not in (1, 2):
    raise ConfigError(f"finetune.lm_coef={f.lm_coef} must be >= 0 and finetune.pair_orders="
                      f"{f.get('pair_orders')} 1 or 2 (GPT's similarity: both orders).")
  if f.doc_stride < 1 or f.max_query_len < 1:
    raise ConfigError(f"finetune.doc_stride={f.doc_stride} and max_query_len={f.max_query_len} "
                      f"must be >= 1.")
  if f.max_train_examples < 0 or f.max_eval_examples < 0 or t.total_steps < 0:
    raise ConfigError("finetune.max_train_examples, max_eval_examples and train.total_steps must "
                      "be >= 0 (0: all examples; steps from finetune.epochs).")
  if o.peak_lr < 0 or o.weight_decay < 0 or o.clip_norm < 0 or not 0 <= o.warmup_fraction < 1:
    raise ConfigError("optimizer.peak_lr, weight_decay and clip_norm must be >= 0 and "
                      "warmup_fraction in [0, 1).")
  if o.get("schedule", "linear") not in FINETUNE_SCHEDULES:
    raise ConfigError(f"optimizer.schedule={o.schedule!r}; choose one of {FINETUNE_SCHEDULES}.")
  if o.get("adam", "bert") not in FINETUNE_ADAMS or (o.get("adam") != "bert" and (
      o.name != "adamw" or o.get("schedule", "linear") != "linear")):
    raise ConfigError(f"optimizer.adam={o.get('adam')!r}: choose one of {FINETUNE_ADAMS}; 'gpt' "
                      f"(opt.py's Adam with its warmup_linear) and 'fairseq' (polynomial_decay) "
                      f"need optimizer.name='adamw' and schedule='linear' (got {o.name!r} and "
                      f"{o.get('schedule')!r}): set --config.optimizer.adam=bert for another "
                      f"optimizer or schedule.")
  if o.get("schedule") == "slanted_triangular" and (
      not 0 < o.cut_frac < 1 or o.ratio < 1 or o.name != "adamw"):
    raise ConfigError(f"optimizer.schedule='slanted_triangular' needs optimizer.name='adamw', "
                      f"cut_frac in (0, 1) and ratio >= 1 (ULMFiT: 0.1 and 32); got "
                      f"{o.name!r}, {o.cut_frac} and {o.ratio}.")
  if f.get("unfreeze_every", 0) < 0:
    raise ConfigError(f"finetune.unfreeze_every={f.unfreeze_every} must be >= 0 (0 = off; "
                      f"ULMFiT: one epoch's steps).")
  if f.get("unfreeze_every", 0) and (o.name != "adamw" or o.get("adam", "bert") != "bert"):
    raise ConfigError(f"finetune.unfreeze_every={f.unfreeze_every} needs an optimizer without "
                      f"bias correction (a layer unfrozen late would take the global step's "
                      f"correction over its fresh moments): set --config.optimizer.name=adamw "
                      f"and --config.optimizer.adam=bert (got {o.name!r}, {o.get('adam')!r}).")
  if o.name == "adafactor" and o.warmup_fraction:
    raise ConfigError(f"optimizer.warmup_fraction={o.warmup_fraction}: Adafactor fine-tunes at a "
                      f"constant rate (T5); set --config.optimizer.warmup_fraction=0.")
  if t.log_every < 1 or t.keep_checkpoints < 1 or t.grad_accum_steps < 1:
    raise ConfigError(f"train.log_every={t.log_every}, keep_checkpoints={t.keep_checkpoints} and "
                      f"grad_accum_steps={t.grad_accum_steps} must be >= 1.")
  if t.batch_size < 1 or t.eval_batch_size < 1 or t.batch_size % t.grad_accum_steps:
    raise ConfigError(f"train.batch_size={t.batch_size} must be >= 1 and divisible by "
                      f"train.grad_accum_steps={t.grad_accum_steps}.")
