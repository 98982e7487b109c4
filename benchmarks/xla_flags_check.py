r"""Do XLA flag sets leave a row's loss and gradients as they are? (issue 23 item 4)

A flag that speeds a step up is worth nothing if it changes what the step computes: cuBLASLt's
bias epilogues have been miscompiled silently in recent XLA (openxla/xla#46110, #46897). For one
row of `benchmarks/table.py` this computes the loss and the gradient of every trained parameter
on one synthetic batch (the table's fast path, dropout drawn from one fixed key), in separate
processes:

  reference   the row in float32 with XLA's attention, the environment's XLA_FLAGS
  default     the row as the table runs it, the environment's XLA_FLAGS
  <name>      the row as the table runs it, the environment's XLA_FLAGS plus the named set

and compares each flag set with the reference as `tests/models/t5_model_test.py` compares cuDNN
with XLA: the loss and every gradient leaf may be as far from the float32 reference as the
default's own distance times 1.5, or --tolerance (relative L2, default 3%), whichever is larger.
A NaN anywhere fails. A flag unknown to this XLA fails its set (XLA stops at start-up).

  python benchmarks/xla_flags_check.py --row=bert-base-512 \
      --flag_sets='cublaslt=--xla_gpu_enable_cublaslt=true;no-triton-gemm=--xla_gpu_enable_triton_gemm=false'
  python benchmarks/xla_flags_check.py --row=bert-mini-128 --fast_path=false \
      --flag_sets='no-concurrency=--xla_cpu_enable_concurrency_optimized_scheduler=false'  # CPU

Prints one markdown line per flag set (and appends one JSON object per set to --output). Run the
speed A/B of the sets that pass with `benchmarks/table.py --xla_flags=...`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from absl import app, flags
import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(_HERE)
if __name__ == "__main__":
  sys.path[:0] = [_REPO, _HERE]

import table  # noqa: E402  benchmarks/ is on sys.path when run as a script

REFERENCE = ("model.dtype=float32", "model.attention_impl=")
GPU_FLAG_SETS = ("cublaslt=--xla_gpu_enable_cublaslt=true;"
                 "cudnn-layernorm=--xla_gpu_enable_cudnn_layer_norm=true;"
                 "no-triton-gemm=--xla_gpu_enable_triton_gemm=false")

if __name__ == "__main__":
  _ROW = flags.DEFINE_string("row", "bert-base-512", "A row of benchmarks/table.py.")
  _FLAG_SETS = flags.DEFINE_string("flag_sets", GPU_FLAG_SETS, "name=XLA flags;name=flags;...")
  _FAST = flags.DEFINE_bool("fast_path", True, "The table's fast path (bf16 + cuDNN attention).")
  _BATCH = flags.DEFINE_integer("batch", 0, "Rows in the batch (0: the row's).")
  _OVERRIDES = flags.DEFINE_list("overrides", [], "Extra section.key=value settings.")
  _TOLERANCE = flags.DEFINE_float("tolerance", 0.03, "The smallest allowance, relative L2.")
  _OUTPUT = flags.DEFINE_string("output", "", "JSONL file; one object per flag set is appended.")
  _CELL = flags.DEFINE_string("cell", None, "(internal) JSON of one computation.")
  _NPZ = flags.DEFINE_string("npz", None, "(internal) where the cell writes its arrays.")


def parse_flag_sets(text: str) -> dict[str, str]:
  """'a=--x=1 --y=2;b=--z=0' → {'a': '--x=1 --y=2', 'b': '--z=0'}; ValueError on a set without
  a name or without flags."""
  sets = {}
  for part in filter(None, (p.strip() for p in text.split(";"))):
    name, _, value = part.partition("=")
    if not name or not value.strip().startswith("--"):
      raise ValueError(f"--flag_sets entry {part!r}: write name=--flag=value [--flag=value ...].")
    sets[name.strip()] = value.strip()
  return sets


# -------------------------------------------------------------------------------- one computation


def loss_and_grads(row_name: str, fast_path: bool, extra: tuple[str, ...]
                   ) -> tuple[float, dict[str, np.ndarray]]:
  """The row's loss on one synthetic batch and the gradient of every trained parameter, as host
  float32 arrays keyed by their path ('encoder/layer_0/mlp/wi/kernel')."""
  import jax  # pylint: disable=g-import-not-at-top
  from bertfam_jax import objectives  # pylint: disable=g-import-not-at-top
  from bertfam_jax.train import sharding, step as step_lib  # pylint: disable=g-import-not-at-top
  import train_throughput as tt  # pylint: disable=g-import-not-at-top

  config = table.row_config(table.ROWS_BY_NAME[row_name], fast_path=fast_path, extra=extra)
  mesh = sharding.make_mesh(config.mesh)
  objective = objectives.get(config.objective.name)
  parts = step_lib.train_parts(config, mesh, objective)
  state = step_lib.with_mesh_context(step_lib.init_state, mesh)(
      parts.model, parts.tx, parts.shardings, config.seed, parts.inputs, parts.carry)
  batch = tt.synthetic_batch(config, config.train.batch_size, mesh)

  def loss_of(trained_params, params, batch, carry):
    kwargs = {} if carry is None else {"carry": carry}
    out = objective.loss_fn(parts.model, {**params, **trained_params}, batch,
                            jax.random.key(1), config, **kwargs)
    return out[0]

  loss, grads = step_lib.with_mesh_context(jax.jit(jax.value_and_grad(loss_of)), mesh)(
      step_lib.trained(state.params), state.params, batch, state.carry)
  flat = {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(g, np.float32)
          for path, g in jax.tree_util.tree_leaves_with_path(jax.device_get(grads))}
  return float(loss), flat


def run_cell(cell: dict, npz: str) -> None:
  loss, grads = loss_and_grads(cell["row"], cell["fast_path"], tuple(cell["extra"]))
  np.savez(npz, __loss__=np.float64(loss), **grads)


def spawn(cell: dict, xla_flags: str) -> dict:
  """`run_cell` in a child process with XLA_FLAGS set: {'loss', 'grads'} or {'error'}."""
  env = table.child_env("ours", xla_flags)
  with tempfile.TemporaryDirectory() as tmp:
    npz = os.path.join(tmp, "out.npz")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), f"--cell={json.dumps(cell)}",
                           f"--npz={npz}"], env=env, capture_output=True, text=True, check=False)
    if proc.returncode or not os.path.exists(npz):
      tail = (proc.stderr or proc.stdout).strip().splitlines()
      return {"error": tail[-1][:300] if tail else f"exit {proc.returncode}"}
    with np.load(npz) as data:
      return {"loss": float(data["__loss__"]),
              "grads": {k: data[k] for k in data.files if k != "__loss__"}}


# ---------------------------------------------------------------------------------- the verdict


def distance(a, b) -> float:
  """‖a − b‖ / ‖b‖ (relative L2; NaN when either holds a NaN, 0 for two zero arrays)."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
    return float("nan")
  norm = np.linalg.norm(b)
  diff = np.linalg.norm(a - b)
  return float(diff / norm) if norm > 0 else (0.0 if diff == 0 else float("inf"))


def compare(reference: dict, default: dict, flagged: dict, tolerance: float) -> dict:
  """Whether `flagged` ({'loss', 'grads'}) is as close to `reference` as `default` is: each of
  the loss and the gradient leaves within max(1.5 × default's distance, tolerance). Returns
  {ok, loss_distance, loss_allowance, worst_leaf, worst_distance, worst_allowance, failures:
  [(name, distance, allowance)]}."""
  items = [("loss", flagged["loss"], default["loss"], reference["loss"])]
  missing = sorted(set(reference["grads"]) ^ set(flagged["grads"]))
  items += [(name, flagged["grads"][name], default["grads"][name], g)
            for name, g in sorted(reference["grads"].items()) if name not in missing]
  checked = [(name, distance(ours, ref), max(1.5 * distance(theirs, ref), tolerance))
             for name, ours, theirs, ref in items]
  failures = [(name, d, allowance) for name, d, allowance in checked if not d <= allowance]
  failures += [(name, float("nan"), 0.0) for name in missing]   # NaN fails, as above
  worst = max(checked[1:], default=("", 0.0, 0.0),   # a NaN leaf is the worst
              key=lambda c: float("inf") if np.isnan(c[1]) else c[1])
  _, loss_distance, loss_allowance = checked[0]
  return dict(ok=not failures, loss_distance=loss_distance, loss_allowance=loss_allowance,
              worst_leaf=worst[0], worst_distance=worst[1], worst_allowance=worst[2],
              failures=failures)


def verdict_line(name: str, flags_text: str, result: dict) -> str:
  if "error" in result:
    return f"| {name} | `{flags_text}` | error: {result['error']} | – | – |"
  state = "equal" if result["ok"] else f"DIFFERENT ({len(result['failures'])} of the loss and leaves)"
  return (f"| {name} | `{flags_text}` | {state} | {result['loss_distance']:.2e} "
          f"(≤ {result['loss_allowance']:.2e}) | {result['worst_leaf']} {result['worst_distance']:.2e} "
          f"(≤ {result['worst_allowance']:.2e}) |")


def main(argv):
  del argv
  if _CELL.value:
    run_cell(json.loads(_CELL.value), _NPZ.value)
    return
  if _ROW.value not in table.ROWS_BY_NAME:
    raise app.UsageError(f"--row={_ROW.value}: choose one of {sorted(table.ROWS_BY_NAME)}.")
  try:
    sets = parse_flag_sets(_FLAG_SETS.value)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  base_flags = os.environ.get("XLA_FLAGS", "")
  extra = list(_OVERRIDES.value) + ([f"train.batch_size={_BATCH.value}"] if _BATCH.value else [])
  cell = dict(row=_ROW.value, fast_path=_FAST.value, extra=extra)
  reference = spawn(dict(cell, extra=extra + list(REFERENCE)), base_flags)
  default = spawn(cell, base_flags)
  for name, got in (("reference", reference), ("default", default)):
    if "error" in got:
      raise SystemExit(f"error: the {name} computation failed: {got['error']}")
  print(f"row {_ROW.value}; fast path {_FAST.value}; base XLA_FLAGS {base_flags!r}; default "
        f"against the float32 reference: loss {distance(default['loss'], reference['loss']):.2e}",
        flush=True)
  print("| flag set | flags | loss and gradients | loss distance | worst leaf |\n|---|---|---|---|---|")
  for name, flags_text in sets.items():
    flagged = spawn(cell, f"{base_flags} {flags_text}".strip())
    result = flagged if "error" in flagged else compare(reference, default, flagged,
                                                        _TOLERANCE.value)
    print(verdict_line(name, flags_text, result), flush=True)
    if _OUTPUT.value:
      with open(_OUTPUT.value, "a") as f:
        f.write(json.dumps(dict(row=_ROW.value, flag_set=name, xla_flags=flags_text,
                                base_xla_flags=base_flags, fast_path=_FAST.value,
                                **{k: v for k, v in result.items()})) + "\n")


if __name__ == "__main__":
  app.run(main)
