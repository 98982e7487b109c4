r"""Where the time to a table row's first step goes: building its state and compiling its step.

Building the train state (`train/step.init_state`) took 36-63 s on an H200 for BERT-base / large,
longer than compiling the train step, when one jitted function drew every parameter on the
device (docs/results.md); on a GPU the parameters are now drawn on the host. This splits the time,
in one process, into:

  backend     the first device query (the platform's start-up)
  abstract    the model, optimizer and the state's shapes and shardings (`abstract_state`)
  init        building the state: `init_state` with --init_on (auto: the host on a GPU)
  batch       the synthetic batch on the device
  step lower / step compile / first step
              tracing, compiling and running the train step once

  python benchmarks/init_time.py --row=bert-base-512                  # GPU, the table's fast path
  python benchmarks/init_time.py --row=bert-mini-128 --fast_path=false   # CPU
  python benchmarks/init_time.py --row=bert-base-512 --init_on=device  # the jitted draw on the GPU

One JSON object is printed (and appended to --output).
"""

from __future__ import annotations

import json
import os
import sys
import time

from absl import app, flags

if __name__ == "__main__":
  sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import table  # noqa: E402  benchmarks/ is sys.path[0] when run as a script
import train_throughput as tt  # noqa: E402
from bertfam_jax import objectives  # noqa: E402
from bertfam_jax.train import sharding as sharding_lib  # noqa: E402
from bertfam_jax.train import step as step_lib  # noqa: E402

if __name__ == "__main__":
  _ROW = flags.DEFINE_enum("row", None, [r.name for r in table.ROWS], "The table row.")
  _FAST = flags.DEFINE_bool("fast_path", True, "Apply the table's FAST_PATH (bf16 + cuDNN).")
  _OVERRIDES = flags.DEFINE_list("overrides", [], "Extra section.key=value settings for the row.")
  _INIT_ON = flags.DEFINE_enum("init_on", "auto", ["auto", "host", "device"],
                               "Where init_state draws the parameters (auto: the host on a GPU).")
  _OUTPUT = flags.DEFINE_string("output", None, "Optional JSONL file the result is appended to.")
  flags.mark_flag_as_required("row")


def phases(config, on_host: bool | None = None) -> dict[str, float]:
  """{phase: seconds} of building `config`'s state (`on_host` as `step.init_state` takes it) and
  its first step (see the module docstring)."""
  seconds = {}
  clock = [time.perf_counter()]

  def lap(name):
    now = time.perf_counter()
    seconds[name] = round(now - clock[0], 3)
    clock[0] = now

  mesh = sharding_lib.make_mesh(config.mesh)
  jax.block_until_ready(jnp.zeros(()))
  lap("backend")
  objective = objectives.get(config.objective.name)
  p = step_lib.train_parts(config, mesh, objective)
  lap("abstract")

  state = jax.block_until_ready(step_lib.with_mesh_context(
      lambda: step_lib.init_state(p.model, p.tx, p.shardings, config.seed, p.inputs, p.carry,
                                  on_host=on_host), mesh)())
  lap("init")
  batch = jax.block_until_ready(tt.synthetic_batch(config, config.train.batch_size, mesh))
  lap("batch")
  train_step = step_lib.make_train_step(p.model, p.tx, p.schedule, objective.loss_fn, config,
                                        p.shardings, mesh)
  lowered = train_step.lower(state, batch)
  lap("step lower")
  executable = lowered.compile()
  lap("step compile")
  jax.block_until_ready(executable(state, batch, train_step.key))
  lap("first step")
  return seconds


def main(argv):
  del argv
  config = table.row_config(table.ROWS_BY_NAME[_ROW.value], fast_path=_FAST.value,
                            extra=tuple(_OVERRIDES.value))
  on_host = {"auto": None, "host": True, "device": False}[_INIT_ON.value]
  seconds = phases(config, on_host)   # first: its "backend" phase starts the platform
  result = dict(row=_ROW.value, overrides=_OVERRIDES.value, fast_path=_FAST.value,
                init_on=_INIT_ON.value, device=jax.devices()[0].device_kind,
                xla_flags=os.environ.get("XLA_FLAGS", ""), jax_version=jax.__version__,
                seconds=seconds)
  result["total_s"] = round(sum(result["seconds"].values()), 3)
  line = json.dumps(result)
  print(line)
  if _OUTPUT.value:
    with open(_OUTPUT.value, "a", encoding="utf-8") as f:
      f.write(line + "\n")


if __name__ == "__main__":
  app.run(main)
