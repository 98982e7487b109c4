r"""Per-device parameter and optimizer-state memory under each sharding strategy, from shapes and
shardings alone: the train state is `jax.eval_shape`d (`step.abstract_state`, nothing allocated)
with the shardings a run uses on a mesh of --num_devices emulated CPU devices, and a device's
bytes are, over the leaves, prod(sharding.shard_shape(shape)) x itemsize. Activations, gradients
and XLA's temporaries are not counted. Strategies are `sharding.STRATEGIES` (config.mesh
settings); "vs replicated" is the total over that of a whole copy of the state on every device
(what data parallelism holds).

  python benchmarks/sharding_memory.py --config=configs/bert.py:size=large --num_devices=8
  python benchmarks/sharding_memory.py --config=configs/t5.py:size=large --num_devices=64 \
      --output=t5_large_memory.json
"""

from __future__ import annotations

import dataclasses
import json
import math

import jax
from absl import app, flags
from ml_collections import config_flags

from bertfam_jax import objectives
from bertfam_jax.train import sharding as sharding_lib
from bertfam_jax.train import step as step_lib

if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file(
      "config", None, "Config file, e.g. configs/bert.py:size=large; override fields with "
      "--config.<section>.<key>=value.", lock_config=True)
  _NUM_DEVICES = flags.DEFINE_integer("num_devices", 8, "Devices of the mesh (emulated on CPU).")
  _STRATEGIES = flags.DEFINE_list("strategies", list(sharding_lib.STRATEGIES),
                                  "Names in sharding.STRATEGIES.")
  _OUTPUT = flags.DEFINE_string("output", None, "Optional JSON file for the rows.")
  flags.mark_flag_as_required("config")

GIB = 2**30


@dataclasses.dataclass
class Row:
  """One strategy: bytes of the train state one device holds."""
  strategy: str
  mesh: dict[str, int]
  param_bytes: int
  optimizer_bytes: int
  replicated_bytes: int   # parameters + optimizer state, unsharded

  @property
  def total_bytes(self) -> int:
    return self.param_bytes + self.optimizer_bytes


def per_device_bytes(tree) -> int:
  """Bytes one device holds of a tree of sharded ShapeDtypeStructs (every device holds one
  shard of each leaf; `sharding.logical_to_shardings` keeps shards even)."""
  return sum(math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
             for leaf in jax.tree.leaves(tree))


def total_bytes(tree) -> int:
  """Bytes of a tree of ShapeDtypeStructs, unsharded."""
  return sum(math.prod(leaf.shape) * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree))


def strategy_row(config, strategy: str, devices) -> Row:
  """The per-device state memory of `config` under `sharding.STRATEGIES[strategy]`."""
  config = config.copy_and_resolve_references()
  config.mesh.update(sharding_lib.STRATEGIES[strategy])
  mesh = sharding_lib.make_mesh(config.mesh, devices)
  objective = objectives.get(config.objective.name)
  model = objective.build_model(config)
  inputs = objectives.init_inputs(objective, config)
  tx, _ = step_lib.make_optimizer(config, model, inputs)
  state, _ = step_lib.with_mesh_context(step_lib.abstract_state, mesh)(model, tx, mesh, inputs)
  return Row(strategy, dict(mesh.shape), per_device_bytes(state.params),
             per_device_bytes(state.opt_state), total_bytes((state.params, state.opt_state)))


def markdown_table(rows: list[Row]) -> str:
  """Rows as a markdown table in GiB per device."""
  lines = ["| strategy | mesh (data×fsdp×tensor) | params GiB/device | optimizer GiB/device | "
           "total GiB/device | vs replicated |", "|---|---|---:|---:|---:|---:|"]
  for r in rows:
    mesh = "×".join(str(r.mesh[a]) for a in sharding_lib.MESH_AXES)
    lines.append(f"| {r.strategy} | {mesh} | {r.param_bytes / GIB:.3f} | "
                 f"{r.optimizer_bytes / GIB:.3f} | {r.total_bytes / GIB:.3f} | "
                 f"{r.total_bytes / r.replicated_bytes:.3f} |")
  return "\n".join(lines)


def main(argv):
  del argv
  # Shardings depend only on the mesh shape, so emulated CPU devices stand in for accelerators.
  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_num_cpu_devices", _NUM_DEVICES.value)
  config, devices = _CONFIG.value, jax.devices()
  rows = [strategy_row(config, name, devices) for name in _STRATEGIES.value]
  m = config.model
  print(f"hidden {m.hidden}, {m.layers} layers, {m.heads} heads, mlp {m.mlp}, vocab "
        f"{m.vocab_size}, optimizer {config.optimizer.name}; {len(devices)} devices:\n")
  print(markdown_table(rows))
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      json.dump([dict(dataclasses.asdict(r), total_bytes=r.total_bytes) for r in rows], f,
                indent=2)


if __name__ == "__main__":
  app.run(main)
