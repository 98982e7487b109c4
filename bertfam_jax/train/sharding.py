"""Device mesh, logical-axis rules and the shardings of state and batches.

Models name logical axes only; these rules map them onto the mesh axes `data`, `fsdp`, `tensor`:
  batch      → (data, fsdp)   examples are split over every data-parallel device
  embed      → fsdp           FSDP shards parameters (and the optimizer state) along the model width
  mlp, heads, vocab → tensor  Megatron-style tensor parallelism over MLP columns, heads, vocabulary
  act_mlp, act_heads → tensor activations follow their weights
  everything else (length, kv, positions, types, embed_out, act_embed, act_kv, layers, T5's
  relpos_buckets) replicated,
  and embed_factor (ALBERT's 128-wide embedding tables): its E→H projection kernel is
  [embed_factor, embed], and two dimensions of one kernel cannot both take `fsdp`.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import linen as nn
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from bertfam_jax.config_lib import ConfigError

MESH_AXES = ("data", "fsdp", "tensor")

LOGICAL_AXIS_RULES = (
    ("batch", ("data", "fsdp")),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("vocab", "tensor"),
    ("act_mlp", "tensor"),
    ("act_heads", "tensor"),
    ("length", None),
    ("kv", None),
    ("act_embed", None),
    ("act_kv", None),
    ("embed_out", None),
    ("embed_factor", None),
    ("positions", None),
    ("types", None),
    ("layers", None),
    ("relpos_buckets", None),
)

BATCH_SPEC = P(("data", "fsdp"))

# The sharding strategies as `config.mesh` settings (-1: the remaining devices), e.g. FSDP is
# --config.mesh.data=1 --config.mesh.fsdp=-1. tests/train/step_test.py checks that each trains as
# one device does; benchmarks/sharding_memory.py reports their per-device state memory.
STRATEGIES = {
    "data": dict(data=-1, fsdp=1, tensor=1),        # state replicated, batch split
    "fsdp": dict(data=1, fsdp=-1, tensor=1),        # parameters + optimizer state split along embed
    "tensor": dict(data=1, fsdp=1, tensor=-1),      # Megatron: heads, MLP columns, vocabulary
    "data+fsdp": dict(data=2, fsdp=-1, tensor=1),
    "data+tensor": dict(data=2, fsdp=1, tensor=-1),
    "fsdp+tensor": dict(data=1, fsdp=-1, tensor=2),
    "data+fsdp+tensor": dict(data=2, fsdp=-1, tensor=2),
}


def mesh_shape(mesh_config, num_devices: int) -> tuple[int, int, int]:
  """Resolves the one `-1` in {data, fsdp, tensor} and checks the product against the devices."""
  sizes = [int(mesh_config[a]) for a in MESH_AXES]
  known = int(np.prod([s for s in sizes if s != -1]))
  if -1 in sizes:
    if num_devices % known:
      raise ConfigError(f"mesh {dict(zip(MESH_AXES, sizes))} cannot use {num_devices} devices: "
                        f"{num_devices} is not divisible by {known}; set --config.mesh.* so the "
                        f"product is {num_devices}.")
    sizes[sizes.index(-1)] = num_devices // known
  if int(np.prod(sizes)) != num_devices:
    raise ConfigError(f"mesh {dict(zip(MESH_AXES, sizes))} has {int(np.prod(sizes))} devices but "
                      f"{num_devices} are present; set --config.mesh.data=-1 or sizes whose product "
                      f"is {num_devices}.")
  return tuple(sizes)


def make_mesh(mesh_config, devices=None) -> Mesh:
  devices = jax.devices() if devices is None else devices
  shape = mesh_shape(mesh_config, len(devices))
  try:
    device_array = mesh_utils.create_device_mesh(shape, devices=devices)
  except (ValueError, NotImplementedError, AssertionError):
    device_array = np.asarray(devices).reshape(shape)
  return Mesh(device_array, MESH_AXES,
              axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES))


def data_parallel_size(mesh: Mesh) -> int:
  return mesh.shape["data"] * mesh.shape["fsdp"]


def logical_to_shardings(boxed_tree, mesh: Mesh, rules=LOGICAL_AXIS_RULES):
  """A tree of flax logical-partitioning metadata (over ShapeDtypeStructs) → NamedShardings.

  A dimension that its mesh axes do not divide (e.g. RoBERTa's 50,265-entry vocabulary over
  tensor=2) is replicated instead of failing; that costs memory, never correctness.
  """
  shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed_tree), mesh, rules)
  is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)  # noqa: E731
  shapes = jax.tree.map(lambda x: x.unbox(apply_constraint=False).shape if is_box(x) else x.shape,
                        boxed_tree, is_leaf=is_box)
  return jax.tree.map(lambda sh, shape: _divisible(sh, shape, mesh), shardings, shapes,
                      is_leaf=lambda x: isinstance(x, NamedSharding))


def _divisible(named: NamedSharding, shape, mesh: Mesh) -> NamedSharding:
  spec = []
  for dim, axes in zip(shape, tuple(named.spec) + (None,) * (len(shape) - len(named.spec))):
    names = (axes,) if isinstance(axes, str) else (axes or ())
    size = int(np.prod([mesh.shape[a] for a in names])) if names else 1
    spec.append(axes if dim % size == 0 else None)
  return NamedSharding(mesh, P(*spec))


def opt_state_shardings(abstract_opt_state, param_shardings, mesh: Mesh):
  """Shards every optimizer-state leaf like the parameter at the same path suffix (Adam moments
  mirror the parameter tree); anything else (step counts, Adafactor's factored row / column
  moments) is replicated."""
  by_path = {}
  for path, sharding in jax.tree_util.tree_flatten_with_path(param_shardings)[0]:
    by_path[tuple(str(k) for k in path)] = sharding
  replicated = NamedSharding(mesh, P())

  def lookup(path, leaf):
    keys = tuple(str(k) for k in path)
    for start in range(len(keys)):
      sharding = by_path.get(keys[start:])
      if sharding is not None and len(sharding.spec) <= len(leaf.shape):
        # Adafactor keeps [1]-shaped placeholders beside unfactored moments: what a dimension's
        # axes do not divide is replicated.
        return _divisible(sharding, leaf.shape, mesh)
    return replicated

  return jax.tree_util.tree_map_with_path(lookup, abstract_opt_state)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, BATCH_SPEC)
