r"""Where a train step's time goes: a device profile of one row of the benchmark table, by category.

For a row of `benchmarks/table.py` (same config, fast path and batch), this builds the real state
and jitted step on a synthetic batch (`train_throughput.synthetic_batch`), compiles it ahead of
time, times --steps untraced steps (mean step time, tokens/s, MFU as in the table), then records
--trace_steps more under `jax.profiler.trace` and attributes the device time of every executed
HLO op to:

  category  what the op computes, read from the optimised HLO of that same executable:
            matmul (dot / convolution / a GEMM custom call, or a fusion around one), attention
            kernel (cuDNN fused attention), dropout RNG (random bits and Bernoulli masks: ops
            traced from `jax.random`), reduction fusion (LayerNorm statistics, softmax, loss,
            global norms), elementwise fusion, data movement (copy, transpose, gather, scatter,
            slices), collective (all-reduce, all-gather, ...), control (while / conditional
            bookkeeping) and other;
  phase     forward (ops traced under `jvp`), backward (under `transpose`) or update (outside
            `value_and_grad`: the optimizer, gradient clipping, the logged norms);
  part      the model module that traced the op (`encoder/layer_*/attention`, `mlm_head`, ...).

Times are self times: an op's duration minus the ops nested in it (a `while` over scanned layers
contains its body's ops). On a GPU the profile's "XLA Ops" line is used (one event per executed
HLO op on the compute stream); on a CPU the XLA worker threads', where ops run concurrently on
several threads, so there the per-step busy time can exceed the step time. "busy" is the sum of
the ops' self times per step; on a GPU, step time minus busy is the time the device waits
(launch gaps, host synchronisation).

--variant OVERRIDES (repeatable; comma-separated section.key=value) also times the same row with
those overrides, one line each, against the profiled baseline: the ablations that say what a
suspected cost is worth (e.g. --variant=model.dropout=0 for the hidden-dropout masks).

  python benchmarks/profile_step.py --row=bert-base-512
  python benchmarks/profile_step.py --row=bert-large-512 --variant=model.dropout=0 \
      --variant=model.remat_policy=dots --output=profile.json
  python benchmarks/profile_step.py --row=bert-mini-128 --fast_path=false --steps=3   # CPU

The trace (open in Perfetto or TensorBoard's profile plugin) and the optimised HLO are kept in
--trace_dir.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

from absl import app, flags

if __name__ == "__main__":
  sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import jax  # noqa: E402

import table  # noqa: E402  benchmarks/ is sys.path[0] when run as a script
import train_throughput as tt  # noqa: E402
from bertfam_jax import objectives  # noqa: E402
from bertfam_jax.config_lib import ConfigError  # noqa: E402
from bertfam_jax import flops as flops_lib  # noqa: E402
from bertfam_jax.train import sharding as sharding_lib  # noqa: E402
from bertfam_jax.train import step as step_lib  # noqa: E402

if __name__ == "__main__":
  _ROW = flags.DEFINE_enum("row", None, [r.name for r in table.ROWS], "The table row to profile.")
  _FAST = flags.DEFINE_bool("fast_path", True, "Apply the table's FAST_PATH (bf16 + cuDNN).")
  _OVERRIDES = flags.DEFINE_list("overrides", [], "Extra section.key=value settings for the row.")
  _VARIANTS = flags.DEFINE_multi_string("variant", [], "Comma-separated overrides to time "
                                        "against the baseline (repeatable).")
  _STEPS = flags.DEFINE_integer("steps", 20, "Timed untraced steps.")
  _WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed steps after the first (compiling) one.")
  _TRACE_STEPS = flags.DEFINE_integer("trace_steps", 5, "Steps recorded by the profiler.")
  _TOP = flags.DEFINE_integer("top", 25, "Ops listed by self time.")
  _TRACE_DIR = flags.DEFINE_string("trace_dir", None, "Where the trace and HLO go (default: a "
                                   "new temporary directory).")
  _OUTPUT = flags.DEFINE_string("output", None, "Optional JSON file for every figure printed.")
  flags.mark_flag_as_required("row")

CATEGORIES = ("matmul", "attention kernel", "dropout RNG", "reduction fusion", "elementwise fusion",
              "data movement", "collective", "control", "other")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all",
               "collective-broadcast")
DATA_MOVEMENT = ("copy", "transpose", "gather", "scatter", "dynamic-slice",
                 "dynamic-update-slice", "slice", "concatenate", "pad", "broadcast", "reverse",
                 "sort", "select-and-scatter", "iota")
CONTROL = ("while", "conditional", "call", "tuple", "get-tuple-element", "parameter", "constant",
           "bitcast", "after-all", "partition-id", "replica-id", "async-start", "async-done")
RNG_OPS = ("rng", "rng-bit-generator", "rng-get-and-update-state")
RNG_NAMES = re.compile(r"_bernoulli|_uniform|random_bits|threefry|_gamma|_normal|random_wrap")
GEMM_TARGETS = re.compile(r"gemm|matmul|cublas|triton", re.I)
ATTENTION_TARGETS = re.compile(r"cudnn.*(fmha|fMHA|flash|attention)|fmha|flash_attention", re.I)


# ----------------------------------------------------------------------------- the optimised HLO


@dataclasses.dataclass
class HloOp:
  """One instruction of an optimised HLO module."""
  name: str
  opcode: str
  op_name: str = ""            # metadata op_name: the JAX trace path
  custom_call_target: str = ""
  calls: tuple[str, ...] = ()  # computations it calls (a fusion's body, a while's body / cond)
  kernel: str = ""             # the name its kernel runs under: XLA gives identical fusions
                               # (one per layer) one `deduplicated_name`; else its own name


_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_CALLED = re.compile(r"\b(?:calls|to_apply|body|condition|branch_computations)="
                     r"(\{[^}]*\}|%?[\w.\-]+)")


def _opcode(rest: str) -> str:
  """The opcode of an instruction's right-hand side `shape opcode(operands), attributes`."""
  depth, i = 0, 0
  if rest.startswith("("):  # a tuple shape: skip to its closing parenthesis
    for i, ch in enumerate(rest):
      depth += (ch == "(") - (ch == ")")
      if depth == 0:
        break
    rest = rest[i + 1:]
  else:
    rest = rest.split(" ", 1)[1] if " " in rest else rest
  match = re.match(r"\s*([\w\-]+)\(", rest)
  return match.group(1) if match else ""


def parse_hlo(text: str) -> tuple[dict[str, HloOp], dict[str, list[str]]]:
  """Optimised HLO text (`compiled.as_text()`) -> ({instruction name: HloOp},
  {computation name: names of its instructions})."""
  ops, computations, current = {}, {}, None
  for line in text.splitlines():
    stripped = line.strip()
    if not stripped or stripped.startswith(("HloModule", "//")):
      continue
    if stripped == "}":
      current = None
      continue
    instruction = _INSTRUCTION.match(line) if current is not None else None
    if instruction is None:
      computation = _COMPUTATION.match(stripped)
      if computation:
        current = computation.group(1)
        computations[current] = []
      continue
    name, rest = instruction.groups()
    op_name = re.search(r'op_name="([^"]*)"', rest)
    target = re.search(r'custom_call_target="([^"]*)"', rest)
    calls = tuple(c.strip(" {}%") for group in _CALLED.findall(rest)
                  for c in group.split(",") if c.strip(" {}%"))
    deduplicated = re.search(r'deduplicated_name="([^"]*)"', rest)
    ops[name] = HloOp(name=name, opcode=_opcode(rest), op_name=op_name.group(1) if op_name else "",
                      custom_call_target=target.group(1) if target else "", calls=calls,
                      kernel=deduplicated.group(1) if deduplicated else name)
    computations[current].append(name)
  return ops, computations


def _called_opcodes(op: HloOp, ops, computations, _seen=None) -> set[str]:
  """Opcodes of every instruction in the computations `op` calls, transitively, and "random
  bits" where one of them was traced from `jax.random` (RNG_NAMES)."""
  seen = set() if _seen is None else _seen
  found = set()
  for computation in op.calls:
    if computation in seen:
      continue
    seen.add(computation)
    for name in computations.get(computation, ()):
      inner = ops[name]
      found.add(inner.opcode)
      if inner.custom_call_target:
        found.add("custom-call:" + inner.custom_call_target)
      if RNG_NAMES.search(inner.op_name):
        found.add("random bits")
      if inner.opcode == "fusion":
        found |= _called_opcodes(inner, ops, computations, seen)
  return found


def categorise(op: HloOp, ops, computations) -> str:
  """The CATEGORIES entry of one executed op (see the module docstring)."""
  opcode = op.opcode.removesuffix("-start").removesuffix("-done")
  if opcode in COLLECTIVES:
    return "collective"
  if op.opcode == "custom-call":
    if ATTENTION_TARGETS.search(op.custom_call_target):
      return "attention kernel"
    if GEMM_TARGETS.search(op.custom_call_target):
      return "matmul"
  if op.opcode in ("dot", "convolution"):
    return "matmul"
  inner = _called_opcodes(op, ops, computations) if op.opcode == "fusion" else set()
  if inner & {"dot", "convolution"} or any(GEMM_TARGETS.search(t) for t in inner
                                           if t.startswith("custom-call:")):
    return "matmul"
  if (op.opcode in RNG_OPS or inner & {*RNG_OPS, "random bits"}
      or RNG_NAMES.search(op.op_name)):
    return "dropout RNG"
  if op.opcode == "fusion":
    return "reduction fusion" if "reduce" in inner else "elementwise fusion"
  if op.opcode in ("reduce", "reduce-window"):
    return "reduction fusion"
  if op.opcode in DATA_MOVEMENT:
    return "data movement"
  if op.opcode in CONTROL:
    return "control"
  return "other"


def kernel_category(kernel: str) -> str:
  """The CATEGORIES entry of a kernel that no op could be found for, from its name."""
  if COPY_KERNELS.search(kernel.removeprefix(UNATTRIBUTED)):
    return "data movement"
  if GEMM_KERNELS.search(kernel):
    return "matmul"
  return "attention kernel" if ATTENTION_KERNELS.search(kernel) else "other"


def phase(op_name: str) -> str:
  """forward / backward / update, from the JAX trace path in an op's metadata."""
  if "transpose(" in op_name:
    return "backward"
  if "jvp(" in op_name:
    return "forward"
  return "update"


def part(op_name: str, depth: int = 3) -> str:
  """The model module an op belongs to: its trace path without the transformation wrappers
  (`jit(step)`, `jvp(Model)`, `transpose(...)`), layer numbers folded, `depth` components."""
  components = []
  for component in op_name.split("/"):
    if re.match(r"^(jit|jvp|transpose|vmap|remat|checkpoint|pjit|closed_call|while|body|cond|"
                r"rematted_computation)(\(|$)", component):
      continue
    components.append(re.sub(r"_\d+$", "_*", component))
  # The last component is the primitive (dot_general, add, ...): not a module.
  modules = components[:-1]
  if modules:
    return "/".join(modules[:depth])
  return "(optimizer, norms)" if phase(op_name) == "update" else "(loss, outside modules)"


# ----------------------------------------------------------------------------- the trace


def trace_file(trace_dir: str) -> str:
  """The newest perfetto trace `jax.profiler.trace(..., create_perfetto_trace=True)` wrote."""
  paths = sorted(glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"),
                           recursive=True), key=os.path.getmtime)
  if not paths:
    raise RuntimeError(f"the profiler wrote no perfetto_trace.json.gz under {trace_dir}")
  return paths[-1]


def op_events(trace: dict, ops, computations=None) -> list[dict]:
  """The complete events of executed HLO ops of `ops` (names, or {name: HloOp}), each {name, ts,
  dur, thread} with times in microseconds. Where the trace has a device (GPU / TPU): its "XLA
  Ops" line (one event per op), else its kernel events (`kernel_ops` names them; several kernels
  of one op add up); on a CPU: the host's XLA worker threads ("tf_XLA..."). Raises with the
  trace's process and thread names when none is found."""
  processes, threads = {}, {}
  for event in trace["traceEvents"]:
    if event.get("ph") == "M" and event.get("name") == "process_name":
      processes[event["pid"]] = event["args"]["name"]
    elif event.get("ph") == "M" and event.get("name") == "thread_name":
      threads[(event["pid"], event["tid"])] = event["args"]["name"]
  devices = {pid for pid, name in processes.items() if name.startswith("/device:")}
  xla_ops = {key for key, name in threads.items() if key[0] in devices and name == "XLA Ops"}
  if xla_ops:
    wanted = lambda key: key in xla_ops  # noqa: E731
  elif devices:
    wanted = lambda key: key[0] in devices  # noqa: E731
  else:
    wanted = lambda key: threads.get(key, "").startswith("tf_XLA")  # noqa: E731
  selected = sorted((e for e in trace["traceEvents"]
                     if e.get("ph") == "X" and wanted((e["pid"], e["tid"]))),
                    key=lambda e: float(e["ts"]))
  kernels = bool(devices) and not xla_ops  # a device's kernels, not its "XLA Ops" line
  if kernels:
    names = kernel_ops(selected, ops, computations)
  else:
    lookup = _op_lookup(ops)
    names = [lookup.get(_event_op(e)) for e in selected]
  # Kernels never nest (those of a CUDA graph may overlap their neighbours by a few ns, which
  # must not count as nesting): each is a thread of its own for self_times.
  events = [dict(name=name, ts=float(e["ts"]), dur=float(e.get("dur", 0.0)),
                 thread=(e["pid"], e["tid"], i) if kernels else (e["pid"], e["tid"]))
            for i, (e, name) in enumerate(zip(selected, names)) if name]
  if not events:
    lines = sorted(f"{processes.get(pid, pid)} / {name}" for (pid, _), name in threads.items())
    raise RuntimeError("no event of the step's HLO ops in the trace; its threads: "
                       + "; ".join(lines))
  return events


def _op_lookup(ops) -> dict[str, str]:
  """{how a trace event may name an op: the op's name}. An event names its op as `fusion.3`,
  `%fusion.3 = bf16[..] fusion(...), ...` (the whole instruction, TPU) or, as a kernel,
  `fusion_3`."""
  return {n: n for n in ops} | {re.sub(r"[.\-]", "_", n): n for n in ops}


def _event_op(event: dict) -> str:
  """The op name an event gives: its `hlo_op` argument, else its own name's first word."""
  raw = str(event.get("args", {}).get("hlo_op") or event["name"])
  return raw.lstrip("%").split(" ", 1)[0]


# Kernels that XLA launches for a custom call, named by the library rather than by the op (inside
# a CUDA graph their `hlo_op` is the command buffer's): the families `kernel_ops` aligns.
GEMM_KERNELS = re.compile(r"nvjet|gemm|xmma|cutlass|cublas", re.I)
GEMM_CONTINUATIONS = re.compile(r"splitKreduce", re.I)
ATTENTION_KERNELS = re.compile(r"cudnn|sdpa|fmha|flash", re.I)
COPY_KERNELS = re.compile(r"^(Memset|Memcpy|memcpy)", re.I)
UNATTRIBUTED = "kernel "  # prefix of the name of a kernel no op could be found for


def _schedule(ops, computations) -> list[str]:
  """The entry computation's instructions in their (scheduled) order, the bodies of while / call
  / conditional instructions inlined where they run."""
  called = {c for op in ops.values() for c in op.calls}
  entry = max((c for c in computations if c not in called), key=lambda c: len(computations[c]))
  order = []

  def visit(computation, seen):
    for name in computations.get(computation, ()):
      order.append(name)
      if ops[name].opcode in ("while", "call", "conditional"):
        for inner in ops[name].calls:
          if inner not in seen:
            visit(inner, seen | {inner})

  visit(entry, {entry})
  return order


def kernel_ops(kernels: list[dict], ops, computations=None) -> list[str]:
  """The op of each kernel event of one device (in time order), aligned with the schedule:
  - a kernel whose `hlo_op` or own name names an op: the first op after the last one seen of
    that op's group (XLA compiles identical fusions, one per layer, once, under one
    `deduplicated_name`; their kernel runs under one of their names wherever it runs);
  - a GEMM or attention library kernel: the next custom call of that library in the schedule
    after the last op seen (a split-K reduction stays with its GEMM, consecutive attention
    kernels with one attention call: cuDNN's backward is three);
  - else `UNATTRIBUTED` + the kernel's name.
  Aligning needs `ops` as {name: HloOp} and `computations`; with names alone every kernel that
  does not name its op stays unattributed."""
  aligned = isinstance(ops, dict) and computations is not None
  order = _schedule(ops, computations) if aligned else sorted(ops)
  # Identical fusions (one per layer) share one `deduplicated_name` and one compiled kernel,
  # which runs under the name of any of them: a kernel name stands for the whole group.
  group = {name: ops[name].kernel if aligned else name for name in order}
  positions_of = collections.defaultdict(list)
  for i, name in enumerate(order):
    positions_of[group[name]].append(i)
  # {an op's name as a trace may give it: the positions of its group}
  runs_as = {alias: positions_of[group[name]] for alias, name in _op_lookup(order).items()}
  cursor, run = -1, None  # schedule position of the last op seen; library of the current run

  def first_after(positions):
    return next((i for i in positions if i > cursor), positions[0])

  def next_call(pattern):
    return next((i for i in range(cursor + 1, len(order))
                 if pattern.search(ops[order[i]].custom_call_target)), None)

  names = []
  for kernel in kernels:
    positions = runs_as.get(_event_op(kernel)) or runs_as.get(kernel["name"])
    library = (None if positions or COPY_KERNELS.search(kernel["name"]) else
               "gemm" if GEMM_KERNELS.search(kernel["name"]) else
               "attention" if ATTENTION_KERNELS.search(kernel["name"]) else None)
    if positions:
      cursor, run = first_after(positions), None
    elif library is not None and run == library and (
        library == "attention" or GEMM_CONTINUATIONS.search(kernel["name"])):
      pass  # the same call's next kernel
    elif library is not None and aligned and (found := next_call(
        GEMM_TARGETS if library == "gemm" else ATTENTION_TARGETS)) is not None:
      cursor, run = found, library
    else:
      names.append(UNATTRIBUTED + kernel["name"][:80])
      continue
    names.append(order[cursor])
  return names


def self_times(events: list[dict]) -> dict[str, float]:
  """{op name: Σ self time (µs)}: each event's duration minus that of the events nested in it
  on the same thread."""
  totals = collections.defaultdict(float)
  by_thread = collections.defaultdict(list)
  for event in events:
    by_thread[event["thread"]].append(event)
  for thread_events in by_thread.values():
    thread_events.sort(key=lambda e: (e["ts"], -e["dur"]))
    stack = []  # [end time, name] of the open events
    for event in thread_events:
      while stack and stack[-1][0] <= event["ts"]:
        stack.pop()
      if stack:  # nested: its time is not its parent's own
        totals[stack[-1][1]] -= event["dur"]
      totals[event["name"]] += event["dur"]
      stack.append((event["ts"] + event["dur"], event["name"]))
  return dict(totals)


@dataclasses.dataclass
class Breakdown:
  """Per-step milliseconds by category, phase and part, and the top ops."""
  steps: int
  busy_ms: float
  by_category: dict[str, float]
  by_phase: dict[str, float]
  by_part: dict[str, float]
  top_ops: list[dict]


def breakdown(times_us: dict[str, float], ops, computations, steps: int, top: int) -> Breakdown:
  """Groups the ops' self times (µs over `steps` steps) into per-step milliseconds. The top ops
  are the same op of every layer together (trace paths with layer numbers folded), `ops` the
  number of HLO ops in each."""
  per_step = {name: us / 1e3 / steps for name, us in times_us.items() if us > 0}
  groups = {key: collections.defaultdict(float) for key in ("category", "phase", "part")}
  rows = {}
  for name, ms in per_step.items():
    if name.startswith(UNATTRIBUTED):
      op = HloOp(name=name, opcode="kernel")
      labels = dict(category=kernel_category(name), phase="(unattributed kernels)",
                    part="(unattributed kernels)")
    else:
      op = ops[name]
      labels = dict(category=categorise(op, ops, computations), phase=phase(op.op_name),
                    part=part(op.op_name))
    for key, label in labels.items():
      groups[key][label] += ms
    folded = re.sub(r"layer_\d+", "layer_*", op.op_name) or name
    row = rows.setdefault((folded, *labels.values()), dict(
        name=name, ms=0.0, ops=0, opcode=op.opcode, op_name=folded, **labels))
    row["ms"] += ms
    row["ops"] += 1
  rows = sorted(rows.values(), key=lambda r: -r["ms"])
  ordered = lambda d: dict(sorted(d.items(), key=lambda kv: -kv[1]))  # noqa: E731
  return Breakdown(steps=steps, busy_ms=sum(per_step.values()),
                   by_category=ordered(groups["category"]), by_phase=ordered(groups["phase"]),
                   by_part=ordered(groups["part"]), top_ops=rows[:top])


# ----------------------------------------------------------------------------- measuring


def time_steps(step_fn, state, batch, steps: int):
  """(state, mean seconds per step) over `steps` back-to-back steps."""
  start = time.perf_counter()
  for _ in range(steps):
    state, metrics = step_fn(state, batch)
  jax.block_until_ready((state, metrics))
  return state, (time.perf_counter() - start) / steps


def compiled_step(config, mesh):
  """(state, batch, compiled step, optimised HLO text, seconds) of `config` on `mesh`; seconds
  is {init_s: building the state, compile_s: lowering and compiling the step}. ConfigError when
  the mesh cannot split the batch."""
  config = tt.with_batch_size(config, config.train.batch_size, mesh)
  start = time.perf_counter()
  state, train_step = step_lib.fresh_train_step(config, mesh,
                                                objectives.get(config.objective.name))
  jax.block_until_ready(state)
  init_s = time.perf_counter() - start
  batch = tt.synthetic_batch(config, config.train.batch_size, mesh)
  start = time.perf_counter()
  executable = train_step.lower(state, batch).compile()
  seconds = dict(init_s=init_s, compile_s=time.perf_counter() - start)
  compiled = lambda state, batch: executable(state, batch, train_step.key)  # noqa: E731
  return state, batch, compiled, executable.as_text(), seconds


def throughput(config, step_s: float) -> dict:
  """tokens/s, model TFLOP/s and MFU (None without a known peak) of one step time."""
  tokens_per_s = config.train.batch_size * config.data.seq_len / step_s
  flops_per_s = objectives.get(config.objective.name).flops_per_token(config) * tokens_per_s
  peak = flops_lib.peak_flops_per_device()
  return dict(step_ms=1e3 * step_s, tokens_per_s=tokens_per_s,
              model_tflops_per_s=flops_per_s / 1e12,
              mfu=flops_per_s / (peak * jax.device_count()) if peak else None)


def record(config, mesh, *, steps: int, warmup: int, trace_steps: int, trace_dir: str):
  """Times `config`'s step on `mesh`, then traces `trace_steps` more into `trace_dir` (with the
  optimised HLO beside it); returns the throughput dict with the init and compile seconds."""
  state, batch, compiled, hlo, seconds = compiled_step(config, mesh)
  with open(os.path.join(trace_dir, "step_after_optimizations.txt"), "w") as f:
    f.write(hlo)
  state, _ = time_steps(compiled, state, batch, 1 + warmup)
  state, step_s = time_steps(compiled, state, batch, steps)
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    state, _ = time_steps(compiled, state, batch, trace_steps)
  return throughput(config, step_s) | seconds


def attribute(trace_dir: str, trace_steps: int, top: int) -> Breakdown:
  """The Breakdown of the trace and HLO that `record` left in `trace_dir`."""
  with open(os.path.join(trace_dir, "step_after_optimizations.txt")) as f:
    ops, computations = parse_hlo(f.read())
  with gzip.open(trace_file(trace_dir), "rt") as f:
    events = op_events(json.load(f), ops, computations)
  return breakdown(self_times(events), ops, computations, trace_steps, top)


def time_variant(config, mesh, *, steps: int, warmup: int) -> dict:
  """The throughput dict of `config`'s step on `mesh` (no trace), with init and compile
  seconds."""
  state, batch, compiled, _, seconds = compiled_step(config, mesh)
  state, _ = time_steps(compiled, state, batch, 1 + warmup)
  return throughput(config, time_steps(compiled, state, batch, steps)[1]) | seconds


def summary(name: str, t: dict) -> str:
  """One progress line of a timed configuration."""
  mfu = "–" if t["mfu"] is None else f"{100 * t['mfu']:.1f}%"
  return (f"{name}: {t['step_ms']:.2f} ms / step, {t['tokens_per_s']:,.0f} tokens/s, MFU {mfu}; "
          f"state built in {t['init_s']:.1f} s, step compiled in {t['compile_s']:.1f} s")


# ----------------------------------------------------------------------------- report


def share_table(title: str, ms_by_label: dict[str, float], step_ms: float) -> str:
  lines = [tt.markdown_header((title, "ms / step", "% of step"))]
  lines += [tt.markdown_line((label, f"{ms:.2f}", f"{100 * ms / step_ms:.1f}%"))
            for label, ms in ms_by_label.items()]
  return "\n".join(lines)


def report(row: str, base: dict, result: Breakdown, variants: list[tuple[str, dict]]) -> str:
  mfu = lambda t: "–" if t["mfu"] is None else f"{100 * t['mfu']:.1f}%"  # noqa: E731
  step_ms = base["step_ms"]
  kernels_ms = sum(result.by_category.get(c, 0.0) for c in ("matmul", "attention kernel"))
  kernels_tflops = base["model_tflops_per_s"] * step_ms / kernels_ms if kernels_ms else 0.0
  lines = [f"{row}: {step_ms:.2f} ms / step, {base['tokens_per_s']:,.0f} tokens/s, "
           f"{base['model_tflops_per_s']:.3g} model TFLOP/s, MFU {mfu(base)}; ops busy "
           f"{result.busy_ms:.2f} ms / step over {result.steps} traced steps; matmul and "
           f"attention kernels {kernels_ms:.2f} ms / step, {kernels_tflops:.3g} TFLOP/s of model "
           "FLOPs in them (what the step would reach if nothing else took time)", "",
           share_table("category", result.by_category, step_ms), "",
           share_table("phase", result.by_phase, step_ms), "",
           share_table("part", dict(list(result.by_part.items())[:15]), step_ms), "",
           tt.markdown_header(("op (one of)", "ops", "category", "phase", "ms / step",
                               "traced from"))]
  lines += [tt.markdown_line((r["name"], r["ops"], r["category"], r["phase"], f"{r['ms']:.3f}",
                              f"`{r['op_name'][-90:]}`")) for r in result.top_ops]
  if variants:
    lines += ["", tt.markdown_header(("variant", "step ms", "tokens/s", "MFU", "vs baseline"))]
    lines.append(tt.markdown_line(("baseline", f"{step_ms:.2f}", f"{base['tokens_per_s']:,.0f}",
                                   mfu(base), "1.00x")))
    lines += [tt.markdown_line((name, f"{t['step_ms']:.2f}", f"{t['tokens_per_s']:,.0f}", mfu(t),
                                f"{step_ms / t['step_ms']:.2f}x")) for name, t in variants]
  return "\n".join(lines)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  row = table.ROWS_BY_NAME[_ROW.value]
  trace_dir = _TRACE_DIR.value or tempfile.mkdtemp(prefix="profile_step_")
  os.makedirs(trace_dir, exist_ok=True)
  try:
    config = table.row_config(row, fast_path=_FAST.value, extra=tuple(_OVERRIDES.value))
    variant_configs = [(v, table.row_config(row, fast_path=_FAST.value,
                                            extra=tuple(_OVERRIDES.value) + tuple(v.split(","))))
                       for v in _VARIANTS.value]  # every override checked before anything runs
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  devices = jax.devices()
  print(f"jax {jax.__version__}; {devices[0].device_kind} x{len(devices)}; row {row.name} "
        f"({row.config}, {row.seq_len} x {config.train.batch_size}, {config.model.dtype}); "
        f"trace and HLO in {trace_dir}", flush=True)
  mesh = sharding_lib.make_mesh(config.mesh)
  base = record(config, mesh, steps=_STEPS.value, warmup=_WARMUP.value,
                trace_steps=_TRACE_STEPS.value, trace_dir=trace_dir)
  print(summary("baseline", base), flush=True)
  variants = []  # timed before the trace is read, so a long attribution delays no figure
  for name, c in variant_configs:
    variants.append((name, time_variant(c, sharding_lib.make_mesh(c.mesh), steps=_STEPS.value,
                                        warmup=_WARMUP.value)))
    print(summary(name, variants[-1][1]), flush=True)
  result = attribute(trace_dir, _TRACE_STEPS.value, _TOP.value)
  print(report(row.name, base, result, variants), flush=True)
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      json.dump(dict(row=row.name, device=devices[0].device_kind, jax_version=jax.__version__,
                     trace_dir=trace_dir, baseline=base, breakdown=dataclasses.asdict(result),
                     variants=dict(variants)), f, indent=1)


if __name__ == "__main__":
  app.run(main)
