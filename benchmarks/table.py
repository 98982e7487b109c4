r"""The benchmark table: every model family x sequence length, ours against HuggingFace, one run.

Each row is a paper's config at a size, sequence length and global batch, on the GPU fast path
(FAST_PATH: bf16 compute with float32 parameters and optimizer state, cuDNN flash attention, so
attention-probability dropout 0 — the one deviation from the recipes, on both sides — hidden
dropout as the recipe has it; Q, K and V as one matmul, the same values, 1.019x on BERT-base on
an H100, docs/results.md). For each row, in separate processes one after another on the
same device (so neither allocator holds memory the other needs, and a crash or OOM stays a cell):

  ours            `train_throughput.measure`: the jitted train step of the real model, optimizer
                  and sharding on a synthetic on-device batch; the time to the first step (the
                  state built while the step compiles) and 3 warm-up steps excluded, mean of
                  --steps steps
  HF eager        the same model in transformers (PyTorch), parameter for parameter,
                  `attn_implementation='sdpa'` ('eager' for XLNet, which has no other), bf16
                  autocast, torch.optim.AdamW (`hf_compare.measure_hf`, same inputs, loss terms
                  and schedule)
  HF compiled     the same, its loss (forward + loss) wrapped in `torch.compile` (compilation
                  excluded)

The HF peers (hf_compare.py's docstring has the details): BertForPreTraining, RobertaForMaskedLM,
AlbertForPreTraining and T5ForConditionalGeneration with HF's own losses; SpanBERT is HF's
BertForMaskedLM plus our span boundary head written in torch (HF has none); ELECTRA is HF's
ElectraForMaskedLM generator and ElectraForPreTraining discriminator sharing the embeddings, joined
by our torch step (generator MLM, sampling without gradient, 50 x replaced-token detection); XLNet
is XLNetLMHeadModel with the permutation mask, target mapping and memory carried between steps.

tokens/s count every position of the batch (T5: the encoder inputs). Model FLOPs are ours for
both (the objective's `flops_per_token`, ../shared/PERF.md §3: matmul FLOPs of forward and
backward, attention counted in full, heads at the positions they compute; HF's dense MLM heads
and XLNet's query stream attending from every position do more work that is not credited). MFU
divides by the device's dense bf16 peak (H100 SXM: 989 TFLOP/s). Peak memory is the process's
peak (JAX `peak_bytes_in_use`, torch `max_memory_allocated`). The optimizer is AdamW on both
sides (ALBERT's LAMB and T5's Adafactor are swapped for it in those rows so the ratio compares
models, not optimizers).

--variants measures each row's step under named settings, for A/B ratios on one warm machine:
'name=a.b=c,d.e=f;name2=--xla_flag=v' runs one `ours` cell per variant (config overrides, or XLA
flags added to the environment's when the value starts with `--`), the row as is first and again
last (so the drift between them is seen), and prints each variant's tokens/s over the first run's.

--max_batch finds, for the named rows, the largest global batch that fits, with remat off and
with `remat_policy=full`: the peak memory measured at the row's batch gives the per-example
activation bytes above the state, the largest multiple of 8 predicted to fit under the device's
`bytes_limit` is run (2 steps), and stepped down by 1/16 until it fits.

  python benchmarks/table.py                                   # every row (a GPU: ~25 minutes)
  python benchmarks/table.py --rows=bert-base-128,bert-base-512 --hf=eager,compile
  python benchmarks/table.py --rows=bert-base-512 --max_batch=bert-base-512 --hf=
  python benchmarks/table.py --rows=bert-mini-128 --fast_path=false --steps=3   # CPU smoke run
  python benchmarks/table.py --rows=bert-base-512 --hf= --steps=50 \
      --variants='fused-qkv=model.fused_qkv=true;bits16=model.dropout_bits=16'
Needs torch and transformers for the HF cells (e.g. `pip install torch==2.13.0 transformers`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time

from absl import app, flags

_PROCESS_START = time.perf_counter()
_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(_HERE)
if __name__ == "__main__":
  sys.path[:0] = [_REPO]  # `python benchmarks/table.py` from anywhere

import train_throughput as tt  # noqa: E402  benchmarks/ is sys.path[0] when run as a script
from bertfam_jax import config_lib  # noqa: E402


@dataclasses.dataclass(frozen=True)
class BenchRow:
  """One line of the table: `config` (path:arg under configs/) at `seq_len` x `batch`."""
  name: str
  label: str
  config: str
  seq_len: int
  batch: int
  overrides: tuple[str, ...] = ()
  hf: bool = True  # False: no HF peer (its cells read "no HF peer": UniLM)


# BERT / RoBERTa / ALBERT predict ~15% of the positions (BERT's max_predictions_per_seq 20 @ 128,
# 80 @ 512; ALBERT's shipped 20 would be 3.9% at 512, the configs' docstring says so).
ROWS = (
    BenchRow("bert-base-128", "BERT-base", "bert.py:size=base", 128, 256,
             ("objective.max_predictions=20",)),
    BenchRow("bert-base-512", "BERT-base", "bert.py:size=base", 512, 64,
             ("objective.max_predictions=80",)),
    BenchRow("bert-large-128", "BERT-large", "bert.py:size=large", 128, 128,
             ("objective.max_predictions=20",)),
    BenchRow("bert-large-512", "BERT-large", "bert.py:size=large", 512, 32,
             ("objective.max_predictions=80",)),
    BenchRow("roberta-base-512", "RoBERTa-base", "roberta.py:size=base", 512, 64,
             ("objective.max_predictions=77",)),
    BenchRow("albert-base-512", "ALBERT-base", "albert.py:size=base", 512, 64,
             ("objective.max_predictions=77",)),
    BenchRow("spanbert-base-512", "SpanBERT-base (MLM + SBO)", "spanbert.py:size=base", 512, 64),
    BenchRow("electra-base-512", "ELECTRA-base (generator + discriminator)",
             "electra.py:size=base", 512, 64),
    # On cuDNN T5's position bias goes in alone and padding as lengths (models/t5.py), so each
    # row holds one example: at 512 -> 114 span corruption fills a row with one anyway.
    BenchRow("t5-base-512", "T5 v1.1 base (512 -> 114)", "t5.py:size=base,version=1.1", 512, 64,
             ("objective.targets_length=114",)),
    # XLNet's recipe window (256 reused + 256 new, memory 384, 85 targets): both streams.
    BenchRow("xlnet-base-512", "XLNet-base (two streams, memory 384)", "xlnet.py:size=base", 512,
             32),
    # GPT-1's recipe (512 tokens x 64 rows) and GPT-2 medium at its 1,024 positions.
    BenchRow("gpt-base-512", "GPT (post-LN, 12 x 768)", "gpt.py:size=base", 512, 64),
    BenchRow("gpt2-medium-1024", "GPT-2 medium (pre-LN, 24 x 1024)",
             "gpt.py:size=medium,version=2", 1024, 16),
    # UniLM's per-row masks take the XLA attention path (cuDNN's takes padding lengths only).
    BenchRow("unilm-large-512", "UniLM-large (four attention masks)", "unilm.py", 512, 16,
             ("objective.max_predictions=77", "model.attention_impl="), hf=False),
    # CPU-sized rows for smoke runs, tests and CPU profiles (T5's :runlocal at its hf_compare
    # shape, where ours trailed HF eager).
    BenchRow("bert-mini-128", "BERT-mini", "bert.py:size=mini", 128, 8,
             ("objective.max_predictions=20",)),
    BenchRow("t5-mini-128", "T5-mini :runlocal (128 -> 32)", "t5.py:runlocal", 128, 32),
)
ROWS_BY_NAME = {row.name: row for row in ROWS}
CPU_ROWS = ("bert-mini-128", "t5-mini-128")
GPU_ROWS = [row.name for row in ROWS if row.name not in CPU_ROWS]
FAST_PATH = ("model.dtype=bfloat16", "model.attention_impl=cudnn", "model.fused_qkv=true")
HF_MODES = ("eager", "compile")
COLUMNS = ("model", "seq", "batch", "ours tokens/s", "MFU", "peak GiB", "to first step s",
           "HF eager tokens/s", "ours / HF eager", "HF compiled tokens/s", "ours / HF compiled")

if __name__ == "__main__":
  _ROWS = flags.DEFINE_list("rows", GPU_ROWS, f"Rows to run, of {[r.name for r in ROWS]}.")
  _HF = flags.DEFINE_list("hf", list(HF_MODES), "HF peers to run: eager, compile (empty: none).")
  _STEPS = flags.DEFINE_integer("steps", 20, "Timed steps per cell.")
  _WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed steps after the first (compiling) one.")
  _FAST = flags.DEFINE_bool("fast_path", True, "Apply FAST_PATH (bf16 + cuDNN attention).")
  _MAX_BATCH = flags.DEFINE_list("max_batch", [], "Rows whose largest fitting batch to find, "
                                 "with remat none and full.")
  _OVERRIDES = flags.DEFINE_list("overrides", [], "Extra section.key=value settings for every "
                                 "row (e.g. model.scan_layers=true).")
  _OUTPUT = flags.DEFINE_string("output", "", "JSONL file; one object per cell is appended.")
  _VARIANTS = flags.DEFINE_string("variants", "", "name=overrides or name=--xla_flags;...: "
                                   "each row's A/B cells (module docstring); overrides are "
                                   "comma-separated, so no value may hold a comma.")
  _XLA_FLAGS = flags.DEFINE_string("xla_flags", None, "XLA_FLAGS for our cells (default: the "
                                   "environment's).")
  # Internal: one cell in a child process.
  _CELL = flags.DEFINE_string("cell", None, "(internal) JSON of the cell to run.")


# ----------------------------------------------------------------------------- configs and cells


def row_config(row: BenchRow, *, fast_path: bool, extra: tuple[str, ...] = ()):
  """The row's config: its file and argument, seq_len / batch, attention dropout 0 and FAST_PATH
  when `fast_path`, then the row's and `extra` overrides; AdamW where the recipe has another."""
  path, _, arg = row.config.partition(":")
  config = config_lib.load_config(os.path.join(_REPO, "configs", path), arg or None)
  config.data.seq_len = row.seq_len
  config.train.batch_size = row.batch
  if "max_positions" in config.model:
    config.model.max_positions = max(config.model.max_positions, row.seq_len)
  if config.optimizer.name != "adamw":
    config.optimizer = config_lib.bert_adamw()
  items = list(row.overrides) + list(extra)
  if fast_path and config.model.get("kind") == "xlnet":
    # XLNet's two-stream relative attention is its own (explicit softmax in float32): bf16 only.
    items = ["model.dtype=bfloat16", *items]
  elif fast_path:
    dropout = "model.dropout=0" if config.model.get("kind") == "t5" else "model.attention_dropout=0"
    items = [dropout, *FAST_PATH, *items]
  config_lib.apply_overrides(config, items)
  from bertfam_jax import objectives  # pylint: disable=g-import-not-at-top
  objectives.validate(config)
  return config


def run_cell(cell: dict) -> dict:
  """Runs one cell in this process: cell = {row, impl ('ours' | 'eager' | 'compile'), batch,
  steps, warmup, fast_path, extra}; returns its measurements."""
  row = ROWS_BY_NAME[cell["row"]]
  extra = tuple(cell["extra"]) + (f"train.batch_size={cell['batch']}",)
  config = row_config(row, fast_path=cell["fast_path"], extra=extra)
  record = (measure_ours if cell["impl"] == "ours" else measure_hf)(config, cell)
  record["process_s"] = time.perf_counter() - _PROCESS_START
  return record


def measure_ours(config, cell: dict) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  from bertfam_jax import objectives  # pylint: disable=g-import-not-at-top
  from bertfam_jax.train import sharding  # pylint: disable=g-import-not-at-top
  mesh = sharding.make_mesh(config.mesh)
  devices = jax.devices()
  result = tt.Result(device=f"{devices[0].device_kind} x{len(devices)}", config=cell["row"],
                     batch_size=config.train.batch_size, seq_len=config.data.seq_len,
                     dtype=config.model.dtype,
                     flops_per_token=objectives.get(config.objective.name).flops_per_token(config))
  tt.measure(config, mesh, result, steps=cell["steps"], warmup=cell["warmup"])
  record = dataclasses.asdict(result)
  start = time.perf_counter()
  record.update(jax_version=jax.__version__, state_bytes=state_bytes(config, mesh),
                bytes_limit=bytes_limit(), state_bytes_s=time.perf_counter() - start)
  return record


def measure_hf(config, cell: dict) -> dict:
  import hf_compare  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from bertfam_jax import objectives  # pylint: disable=g-import-not-at-top
  from bertfam_jax import flops as flops_lib  # pylint: disable=g-import-not-at-top
  from bertfam_jax.train import sharding  # pylint: disable=g-import-not-at-top
  torch, transformers = hf_compare.import_torch()
  device = "cuda" if torch.cuda.is_available() else "cpu"
  cpu_mesh = sharding.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])
  batch = tt.synthetic_batch(config, config.train.batch_size, cpu_mesh)
  model, attention = hf_compare.hf_model_with_attention(config, transformers)
  flops_per_token = objectives.get(config.objective.name).flops_per_token(config)
  name = hf_compare.peer_name(model)
  row = hf_compare.Row(implementation=f"HF {name}")
  hf_compare.measure_hf(config, batch, row, flops_per_token, torch, model, device,
                        steps=cell["steps"], warmup=cell["warmup"],
                        compile_model=cell["impl"] == "compile")
  record = dataclasses.asdict(row)
  record.update(
      tokens_per_s=row.tokens_per_s, flops_per_token=flops_per_token,
      device=torch.cuda.get_device_name() if device == "cuda" else "cpu",
      peak_memory_bytes=torch.cuda.max_memory_allocated() if device == "cuda" else None,
      attn_implementation=attention, hf_model=name,
      torch_version=torch.__version__, transformers_version=transformers.__version__)
  peak = next((p for k, p in flops_lib.PEAK_BF16_FLOPS.items() if k in record["device"]), None)
  record["mfu"] = flops_per_token * row.tokens_per_s / peak if peak else None
  return record


def state_bytes(config, mesh) -> int:
  """Bytes of the train state (parameters + optimizer state) on one device, from shapes alone."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from bertfam_jax import objectives  # pylint: disable=g-import-not-at-top
  from bertfam_jax.train import step as step_lib  # pylint: disable=g-import-not-at-top
  objective = objectives.get(config.objective.name)
  model, inputs = objective.build_model(config), objectives.init_inputs(objective, config)
  tx, _ = step_lib.make_optimizer(config, model, inputs)
  abstract, shardings = step_lib.with_mesh_context(step_lib.abstract_state, mesh)(
      model, tx, mesh, inputs)
  leaves = zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings))
  return int(sum(np.prod(s.shard_shape(a.shape)) * a.dtype.itemsize for a, s in leaves))


def bytes_limit() -> int | None:
  import jax  # pylint: disable=g-import-not-at-top
  stats = jax.local_devices()[0].memory_stats()
  return stats.get("bytes_limit") if stats else None


# ----------------------------------------------------------------------------- the parent


def spawn(cell: dict, env: dict) -> dict:
  """Runs `cell` in a child process; its record, or {'error': ...} (OOM, crash, compile failure)."""
  with tempfile.NamedTemporaryFile("r", suffix=".json") as out:
    cmd = [sys.executable, os.path.abspath(__file__), f"--cell={json.dumps(cell)}",
           f"--output={out.name}"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    text = out.read()
  if proc.returncode == 0 and text:
    record = json.loads(text)
  else:
    tail = (proc.stderr or proc.stdout).strip().splitlines()
    oom = any(s in proc.stderr for s in ("RESOURCE_EXHAUSTED", "OutOfMemoryError", "out of memory"))
    record = dict(error="out of memory" if oom else (tail[-1][:300] if tail else "failed"))
    if not oom:
      print(proc.stderr[-4000:], file=sys.stderr, flush=True)
  record.update(cell=cell, wall_s=time.perf_counter() - start)
  return record


def child_env(impl: str, xla_flags: str | None) -> dict:
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_REPO, _HERE,
                                                                  os.environ.get("PYTHONPATH")])))
  if impl != "ours":
    env["JAX_PLATFORMS"] = "cpu"  # JAX only makes the batch; the GPU is torch's alone
  elif xla_flags is not None:
    env["XLA_FLAGS"] = xla_flags
  return env


def parse_variants(text: str) -> dict[str, tuple[list[str], str]]:
  """'a=x.y=1,z.w=2;b=--xla_f=0' → {'a': (['x.y=1', 'z.w=2'], ''), 'b': ([], '--xla_f=0')}: each
  variant's config overrides and XLA flags. ValueError on an entry without a name or value."""
  variants = {}
  for part in filter(None, (p.strip() for p in text.split(";"))):
    name, _, value = part.partition("=")
    value = value.strip()
    if not name.strip() or not value:
      raise ValueError(f"--variants entry {part!r}: write name=a.b=c,d.e=f or name=--xla_flag=v.")
    flags_only = value.startswith("--")
    variants[name.strip()] = ([] if flags_only else value.split(","), value if flags_only else "")
  return variants


def variant_cells(base: dict, variants: dict[str, tuple[list[str], str]], xla_flags: str | None
                  ) -> list[tuple[str, dict, dict]]:
  """(name, cell, child environment) of each A/B cell: the row as is, each variant, the row as
  is again. A variant's XLA flags follow the run's own (`xla_flags`, else the environment's)."""
  own = xla_flags if xla_flags is not None else os.environ.get("XLA_FLAGS", "")
  cells = [("as is", base, child_env("ours", xla_flags))]
  for name, (overrides, variant_flags) in variants.items():
    cell = dict(base, extra=list(base["extra"]) + overrides)
    env_flags = " ".join(filter(None, [own, variant_flags])) if variant_flags else xla_flags
    cells.append((name, cell, child_env("ours", env_flags)))
  return cells + [("as is, again", base, child_env("ours", xla_flags))]


def variant_line(row: BenchRow, name: str, record: dict, first: dict) -> str:
  fmt = tt.format_cell
  mfu, tokens, step = (record.get(k) for k in ("mfu", "tokens_per_s", "step_s"))
  ratio = (f"{tokens / first['tokens_per_s']:.3f}x"
           if tokens and first.get("tokens_per_s") else "–")
  return tt.markdown_line([row.label, name, record.get("error") or fmt(tokens, ",.0f"),
                           "–" if mfu is None else f"{100 * mfu:.1f}%", fmt(step, ".2f", 1e3),
                           fmt(record.get("first_step_s"), ".0f"), ratio])


def run_variants(row: BenchRow, variants: dict[str, tuple[list[str], str]], write) -> list[str]:
  """The row's A/B cells (`variant_cells`) one after another; a markdown line per cell."""
  base = dict(row=row.name, impl="ours", batch=row.batch, steps=_STEPS.value,
              warmup=_WARMUP.value, fast_path=_FAST.value, extra=list(_OVERRIDES.value))
  lines, first = [], None
  for label, cell, env in variant_cells(base, variants, _XLA_FLAGS.value):
    record = dict(spawn(cell, env), variant=label)
    write(record)
    first = first or record
    lines.append(variant_line(row, label, record, first))
    print(lines[-1], flush=True)
  return lines


def cell_line(row: BenchRow, ours: dict, hf: dict[str, dict]) -> str:
  fmt = tt.format_cell

  def tokens(record):
    return record.get("error") or fmt(record.get("tokens_per_s"), ",.0f")

  def ratio(record):
    if not record or not ours.get("tokens_per_s") or not record.get("tokens_per_s"):
      return "–"
    return f"{ours['tokens_per_s'] / record['tokens_per_s']:.2f}x"

  mfu = ours.get("mfu")
  cells = [row.label, row.seq_len, ours["cell"]["batch"], tokens(ours),
           "–" if mfu is None else f"{100 * mfu:.1f}%",
           fmt(ours.get("peak_memory_bytes"), ".1f", 2.0**-30), fmt(ours.get("first_step_s"), ".0f")]
  for mode in HF_MODES:
    record = hf.get(mode)
    cells += [tokens(record) if record else ("no HF peer" if not row.hf else "–"), ratio(record)]
  return tt.markdown_line(cells)


def predicted_max_batch(record: dict, safety: float = 0.97) -> int | None:
  """The largest multiple of 8 whose predicted peak (state + batch x activations per example,
  from one measured peak) stays under `safety` x bytes_limit."""
  peak, state, limit = (record.get(k) for k in ("peak_memory_bytes", "state_bytes", "bytes_limit"))
  batch = record["cell"]["batch"]
  if not (peak and state and limit) or peak <= state:
    return None
  per_example = (peak - state) / batch
  return max(8, int((safety * limit - state) / per_example) // 8 * 8)


def find_max_batch(row: BenchRow, base: dict, write) -> list[str]:
  """Largest fitting batch for remat none and full; markdown lines."""
  lines = []
  for remat in ("none", "full"):
    extra = tuple(base["extra"]) + (f"model.remat_policy={remat}",)
    probe = spawn(dict(base, extra=list(extra), steps=2, warmup=0), child_env("ours", None))
    write(probe)
    batch = predicted_max_batch(probe)
    tried = []
    while batch:
      record = spawn(dict(base, extra=list(extra), batch=batch, steps=2, warmup=0),
                     child_env("ours", None))
      write(record)
      tried.append(batch)
      if not record.get("error"):
        lines.append(tt.markdown_line([row.label, row.seq_len, remat, batch,
                                       tt.format_cell(record["peak_memory_bytes"], ".1f", 2.0**-30),
                                       tt.format_cell(record["tokens_per_s"], ",.0f"),
                                       ", ".join(map(str, tried))]))
        break
      if record["error"] != "out of memory" or len(tried) == 4:
        lines.append(tt.markdown_line([row.label, row.seq_len, remat, "–", "–", "–",
                                       f"{tried}: {record['error']}"]))
        break
      batch = max(8, (batch - max(8, batch // 16)) // 8 * 8)
  return lines


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _CELL.value:  # child
    record = run_cell(json.loads(_CELL.value))
    with open(_OUTPUT.value, "w") as f:
      json.dump(record, f)
    return
  unknown = (set(_ROWS.value) | set(_MAX_BATCH.value)) - ROWS_BY_NAME.keys()
  if unknown or set(_HF.value) - set(HF_MODES):
    raise app.UsageError(f"Unknown rows {sorted(unknown)} or HF modes {_HF.value}; rows: "
                         f"{[r.name for r in ROWS]}, modes: {HF_MODES}.")

  def write(record):
    if _OUTPUT.value:
      with open(_OUTPUT.value, "a") as f:
        f.write(json.dumps(record) + "\n")

  lines = []
  print(f"rows {_ROWS.value}; HF {_HF.value}; {_STEPS.value} timed steps after 1 + "
        f"{_WARMUP.value}; fast path {_FAST.value}; XLA_FLAGS "
        f"{_XLA_FLAGS.value if _XLA_FLAGS.value is not None else os.environ.get('XLA_FLAGS', '')!r}",
        flush=True)
  try:
    variants = parse_variants(_VARIANTS.value)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  for name in [] if variants else _ROWS.value:  # the A/B cells below replace the table's
    row = ROWS_BY_NAME[name]
    base = dict(row=name, batch=row.batch, steps=_STEPS.value, warmup=_WARMUP.value,
                fast_path=_FAST.value, extra=list(_OVERRIDES.value))
    ours = spawn(dict(base, impl="ours"), child_env("ours", _XLA_FLAGS.value))
    write(ours)
    hf = {}
    for mode in (_HF.value if row.hf else []):
      hf[mode] = spawn(dict(base, impl=mode), child_env(mode, None))
      write(hf[mode])
    lines.append(cell_line(row, ours, hf))
    print(lines[-1], flush=True)
  if lines:
    print("\n" + tt.markdown_header(COLUMNS))
    print("\n".join(lines), flush=True)

  variant_lines = [line for name in (_ROWS.value if variants else [])
                   for line in run_variants(ROWS_BY_NAME[name], variants, write)]
  if variant_lines:
    print("\n" + tt.markdown_header(("model", "variant", "tokens/s", "MFU", "step ms",
                                     "to first step s", "/ as is")))
    print("\n".join(variant_lines), flush=True)

  max_lines = []
  for name in _MAX_BATCH.value:
    base = dict(row=name, impl="ours", batch=ROWS_BY_NAME[name].batch, fast_path=_FAST.value,
                extra=list(_OVERRIDES.value))
    max_lines += find_max_batch(ROWS_BY_NAME[name], base, write)
  if max_lines:
    print("\n" + tt.markdown_header(("model", "seq", "remat", "largest batch", "peak GiB",
                                     "tokens/s", "batches tried")))
    print("\n".join(max_lines), flush=True)


if __name__ == "__main__":
  app.run(main)
