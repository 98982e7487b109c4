r"""Our train step against HuggingFace transformers' PyTorch model of the same config, side by side.

In one process, on the same device and the same shapes (--batch_size x config.data.seq_len):
  ours  the real model, optimizer and jitted train step of --config, timed by
        `train_throughput.measure` (synthetic on-device batch, first compiling step and --warmup
        steps excluded, mean of --steps steps);
  HF    `BertForPreTraining` (config.objective.sentence_task set, e.g. BERT's NSP),
        `AlbertForPreTraining` (share_layers='all') or `RobertaForMaskedLM` (none) built from
        the same config.model (benchmarks/table.py adds `T5ForConditionalGeneration`): sizes, vocab, max positions,
        token types, LayerNorm eps, activation (gelu_tanh -> 'gelu_new', gelu -> 'gelu'), dropout
        probabilities; trained in train mode with torch.optim.AdamW (betas, eps, weight decay of
        config.optimizer, LayerNorm/bias excluded from decay as ours unless decay_norm_and_bias,
        our learning-rate schedule precomputed per step; torch's Adam always bias-corrects) and
        `clip_grad_norm_` when optimizer.clip_norm > 0; attention
        `attn_implementation='sdpa'` (falls back to 'eager' where unavailable; the header says
        which); bf16 autocast only when config.model.dtype is bfloat16; the model wrapped in
        `torch.compile` with --torch_compile (its compilation is in the first step, not timed).
HF gets the same input ids, token types, all-ones attention mask and NSP labels as our batch, and
masked-LM labels -100 except at max_predictions distinct positions per row (our count).

Both rows use the same FLOP count, ours (`flops.encoder_train_flops_per_token`, ../shared/PERF.md
§3): the MLM head counted at the max_predictions positions per row. HF's MLM head is dense (the
transform and the d x V decoder run on every position, and its loss ignores the -100 ones), so
its extra head work is not credited, and that work is part of the ratio. The header prints the
dense-head count for reference.

Threads: torch.set_num_threads(os.cpu_count()); JAX/XLA sizes its own CPU thread pool from the
visible cores; both are reported. The implementations run one after the other, ours first, with a
pause between, so neither's pool competes with the other's timed steps.

  PYTHONPATH=. python benchmarks/hf_compare.py --config=configs/bert.py:runlocal \
      --batch_size=32 --steps=20
  PYTHONPATH=. python benchmarks/hf_compare.py --config=configs/bert.py:runlocal \
      --batch_size=32 --steps=20 --torch_compile
  PYTHONPATH=. python benchmarks/hf_compare.py --config=configs/roberta.py:runlocal \
      --batch_size=32 --steps=20 --output=hf_compare.jsonl
Needs torch and transformers besides the project (e.g. `pip install torch==2.13.0 transformers`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time

import jax
import numpy as np
from absl import app, flags
from ml_collections import config_flags

import train_throughput as tt  # benchmarks/ is sys.path[0] when this runs as a script
from bertfam_jax import config_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.train import flops as flops_lib
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
  _TORCH_COMPILE = flags.DEFINE_bool("torch_compile", False, "Wrap the HF model in torch.compile.")
  _OUTPUT = flags.DEFINE_string("output", None, "Optional JSONL file; one object per run is "
                                "appended.")
  flags.mark_flag_as_required("config")

HF_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
ROBERTA_PAD_ID = 1  # fairseq's <pad>; HF's RoBERTa positions of real tokens start at pad + 1
TORCH_DEVICES = {"cpu": "cpu", "gpu": "cuda"}
PAUSE_S = 1.0  # between the implementations, for the other's idle threads to stop spinning
COLUMNS = ("implementation", "first step s", "step ms", "tokens/s", "model TFLOP/s", "ours/HF")


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


def hf_model(config, transformers, attn_implementation: str):
  """The HF PyTorch model of `config.model` (see the module docstring), randomly initialised:
  T5ForConditionalGeneration for T5, AlbertForPreTraining for ALBERT (factorised embedding, one
  shared layer group), BertForPreTraining with a sentence task, else RobertaForMaskedLM."""
  m = config.model
  if m.activation not in HF_ACTIVATIONS:
    raise ConfigError(f"model.activation={m.activation!r} has no HF counterpart here; "
                      f"known: {sorted(HF_ACTIVATIONS)}.")
  if m.get("kind") == "t5":
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
  common = dict(
      vocab_size=m.vocab_size, hidden_size=m.hidden, num_hidden_layers=m.layers,
      num_attention_heads=m.heads, intermediate_size=m.mlp,
      type_vocab_size=max(1, m.type_vocab_size), layer_norm_eps=m.layer_norm_eps,
      hidden_act=HF_ACTIVATIONS[m.activation], hidden_dropout_prob=m.dropout,
      attention_probs_dropout_prob=m.attention_dropout, initializer_range=m.initializer_range,
      attn_implementation=attn_implementation)
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


def hf_model_with_attention(config, transformers):
  """(model, attention implementation): 'sdpa' where this transformers/torch offers it."""
  try:
    model = hf_model(config, transformers, "sdpa")
  except (ValueError, ImportError):
    model = hf_model(config, transformers, "eager")
  return model, model.config._attn_implementation


def hf_inputs(config, batch, torch, device):
  """Our synthetic `batch` as HF keyword arguments on `device`."""
  host = {k: np.asarray(v) for k, v in batch.items()}
  if config.model.get("kind") == "t5":
    inputs = dict(input_ids=host["input_ids"], attention_mask=host["input_mask"],
                  decoder_input_ids=host["decoder_input_ids"], labels=host["decoder_target_ids"])
    return {k: torch.as_tensor(np.asarray(v, np.int64), device=device) for k, v in inputs.items()}
  rows, length = host["input_ids"].shape
  preds = config.objective.max_predictions
  if preds >= length:
    raise ConfigError(f"objective.max_predictions={preds} must be below data.seq_len={length}.")
  # `preds` distinct positions per row (ours may repeat one; HF's count must be exactly ours),
  # never position 0, labelled with our targets.
  rng = np.random.default_rng(0)
  positions = np.sort(np.stack([rng.permutation(np.arange(1, length))[:preds]
                                for _ in range(rows)]), axis=1)
  labels = np.full((rows, length), -100, np.int64)
  np.put_along_axis(labels, positions, host["mlm_targets"].astype(np.int64), axis=1)
  inputs = dict(input_ids=host["input_ids"], attention_mask=host["input_mask"],
                token_type_ids=host["segment_ids"], labels=labels)
  sentence_task = config.objective.get("sentence_task")
  if sentence_task:
    key = "sentence_order_label" if config.model.share_layers == "all" else "next_sentence_label"
    inputs[key] = host["sentence_label"]
  return {k: torch.as_tensor(np.asarray(v, np.int64), device=device) for k, v in inputs.items()}


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
  """Times HF's train step on `batch` like `train_throughput.measure` times ours."""
  model.to(device).train()
  inputs = hf_inputs(config, batch, torch, device)
  optimizer = adamw(model, config, torch)
  step_model = torch.compile(model) if compile_model else model
  accum = config.train.grad_accum_steps
  micro = [{k: v[i::accum] for k, v in inputs.items()} for i in range(accum)]  # strided, as ours
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
    for mb in micro:
      with autocast:
        loss = step_model(**mb).loss
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


def run(config) -> int:
  """Prints the header and the two-row table (and --output line); returns the exit status."""
  torch, transformers = import_torch()
  config_lib.validate(config)
  if config.objective.name != "mlm":
    raise ConfigError(f"objective.name={config.objective.name!r}: only 'mlm' has an HF peer here.")
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
  batch_size, seq_len, preds = (config.train.batch_size, config.data.seq_len,
                                config.objective.max_predictions)
  sentence_task = bool(config.objective.get("sentence_task"))
  flops_per_token = flops_lib.encoder_train_flops_per_token(config.model, seq_len, preds,
                                                            sentence_task)
  dense_head = flops_lib.encoder_train_flops_per_token(config.model, seq_len, seq_len,
                                                       sentence_task)
  devices = jax.devices()
  device_name = f"{devices[0].device_kind} x{len(devices)}"
  arg = tt.config_arg()
  model, attention = hf_model_with_attention(config, transformers)
  hf_name = type(model).__name__
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
        f"{mode}, attn_implementation={attention!r}, torch.optim.AdamW{clip}, autocast {autocast}\n"
        f"model FLOPs (both rows): {flops_per_token / 1e6:.1f} MFLOP/token, MLM head at the "
        f"{preds} predicted positions per row. HF's MLM head is dense (all {seq_len} positions, "
        f"loss on the {preds} labelled): {dense_head / 1e6:.1f} MFLOP/token with that work, "
        f"not credited to HF here\n", flush=True)

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
                  dense_head_flops_per_token=dense_head, torch_compile=_TORCH_COMPILE.value,
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
