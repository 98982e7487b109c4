r"""Pod-scale configs checked without a pod: the real train step of a config compiled ahead of
time for a named TPU slice, on this machine. Run it in its own process: libtpu, once loaded,
shares the process with jaxlib's own XLA, and later CPU computations there may abort.

`libtpu` (the `[tpu-aot]` extra) describes any TPU topology without the hardware
(`jax.experimental.topologies`); the step is built exactly as `train.run` builds it (the
config's model, optimizer, mesh over the slice's devices, parameter and batch shardings, the
objective's loss) and lowered with a batch of the objective's shapes (benchmarks/
train_throughput.py `abstract_batch`), then compiled for the slice. It reports, per device, the
memory XLA allocates (arguments, outputs, temporaries) against the chip's HBM, the FLOPs and HBM
bytes of one step, and a roofline estimate of the step time (the larger of FLOPs / peak and
bytes / bandwidth: a bound, not a measurement).

  python -m tpu.aot --config=configs/bert.py:large --topology=v4:4x4x2
  python -m tpu.aot --config=configs/t5.py --topology=v5e:16x16 --config.mesh.fsdp=16

A step that does not fit is refused in one line naming what to change (exit 2). Topology names
are libtpu's: v2:2x2, v3:4x4, v4:4x4x4, v5e:16x16, v5p:4x4x4, v6e:8x8, ... (chips per
dimension).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys

# The slice is compiled for whatever this machine's own backend is; never let an installed
# libtpu try to open TPUs here (and print its failure) as the default backend.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")   # no metadata server to ask off Cloud TPU
# libtpu takes /tmp/libtpu_lockfile for the TPUs of the host; describing a topology uses none,
# so several compilations may run at once.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

from absl import app, flags
from ml_collections import config_flags

from bertfam_jax import objectives
from bertfam_jax.config_lib import ConfigError

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  """A TPU chip generation: HBM, bf16 peak and HBM bandwidth per chip (Cloud TPU's published
  figures); `jax.Device.device_kind` names it."""
  name: str
  hbm_bytes: float
  peak_flops: float
  hbm_bytes_per_s: float


CHIPS = {
    "TPU v2": Chip("v2", 16 * GIB, 45e12, 700e9),
    "TPU v3": Chip("v3", 32 * GIB, 123e12, 900e9),
    "TPU v4": Chip("v4", 32 * GIB, 275e12, 1228e9),
    "TPU v5 lite": Chip("v5e", 16 * GIB, 197e12, 819e9),
    "TPU v5": Chip("v5p", 95 * GIB, 459e12, 2765e9),
    "TPU v6 lite": Chip("v6e", 32 * GIB, 918e12, 1640e9),
}


@dataclasses.dataclass
class Report:
  """One compiled step on one slice; memory, FLOPs and bytes are per device."""
  config: str
  topology: str
  device_kind: str
  devices: int
  chips: int
  mesh: dict
  batch_size: int
  argument_bytes: float
  output_bytes: float
  alias_bytes: float
  temp_bytes: float
  hbm_bytes: float          # of one device (its share of the chip's HBM)
  flops: float
  bytes_accessed: float
  peak_flops: float         # of one device
  hbm_bytes_per_s: float    # of one device

  @property
  def used_bytes(self) -> float:
    """What the step holds at its peak: arguments and outputs (donated state counted once) and
    XLA's temporaries."""
    return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

  @property
  def fits(self) -> bool:
    return self.used_bytes <= self.hbm_bytes

  @property
  def step_seconds(self) -> float:
    """The roofline bound of one step: compute or HBM traffic, whichever takes longer."""
    return max(self.flops / self.peak_flops, self.bytes_accessed / self.hbm_bytes_per_s)

  def lines(self) -> list[str]:
    return [
        f"{self.config} on {self.topology}: {self.devices} devices ({self.device_kind}, "
        f"{self.chips} chips), mesh {self.mesh}, global batch {self.batch_size}.",
        f"memory per device: {self.used_bytes / GIB:.2f} GiB of {self.hbm_bytes / GIB:.1f} GiB "
        f"(arguments {self.argument_bytes / GIB:.2f}, outputs {self.output_bytes / GIB:.2f}, "
        f"donated {self.alias_bytes / GIB:.2f}, temporaries {self.temp_bytes / GIB:.2f})"
        f"{'' if self.fits else ': DOES NOT FIT'}.",
        f"per device and step: {self.flops / 1e9:,.1f} GFLOP, {self.bytes_accessed / GIB:.2f} "
        f"GiB of HBM traffic; roofline {1e3 * self.step_seconds:.1f} ms per step "
        f"({self.devices * self.flops / self.step_seconds / 1e15:.2f} PFLOP/s for the slice "
        f"at that bound).",
    ]


def topology_devices(name: str):
  """The devices of the named TPU slice (libtpu's topology description; no hardware needed)."""
  try:
    from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  except ImportError as e:   # pragma: no cover (part of jax)
    raise ConfigError(f"jax.experimental.topologies is missing ({e}).") from None
  try:
    return topologies.get_topology_desc(platform="tpu", topology_name=name).devices
  except Exception as e:  # pylint: disable=broad-except  (libtpu's errors are plain RuntimeErrors)
    message = " ".join(str(e).split())
    if "libtpu" in message.lower() or "platform" in message.lower() and "tpu" in message.lower():
      raise ConfigError(f"--topology={name}: TPU topologies need libtpu: pip install "
                        f"'bertfam_jax[tpu-aot]' ({message[:160]}).") from None
    raise ConfigError(f"--topology={name} is not a TPU slice libtpu knows ({message[:200]}); "
                      f"write e.g. v4:4x4x4, v5e:16x16, v5p:4x4x4.") from None


def compile_step(config, topology: str, config_name: str = "") -> Report:
  """Builds `config`'s train step as `train.run` does, over `topology`'s devices, and compiles it
  ahead of time; returns the compiled program's memory and cost per device."""
  import jax  # pylint: disable=g-import-not-at-top
  from benchmarks import train_throughput  # pylint: disable=g-import-not-at-top
  from bertfam_jax.train import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  from bertfam_jax.train import step as step_lib  # pylint: disable=g-import-not-at-top

  objectives.validate(config)
  devices = topology_devices(topology)
  kind = devices[0].device_kind
  if kind not in CHIPS:
    raise ConfigError(f"--topology={topology}: no figures for {kind!r} chips; known: "
                      f"{sorted(CHIPS)}.")
  chip = CHIPS[kind]
  chips = math.prod(int(d) for d in topology.partition(":")[2].split("x"))
  per_chip = max(1, len(devices) // chips)   # v2 / v3 (and v4 without megacore): 2 per chip
  mesh = sharding_lib.make_mesh(config.mesh, devices)
  if config.train.batch_size % sharding_lib.data_parallel_size(mesh):
    raise ConfigError(f"train.batch_size={config.train.batch_size} does not split over the "
                      f"{sharding_lib.data_parallel_size(mesh)} data-parallel devices of "
                      f"{topology}; use a multiple of it.")
  objective = objectives.get(config.objective.name)
  p = step_lib.train_parts(config, mesh, objective)
  train_step = step_lib.make_train_step(p.model, p.tx, p.schedule, objective.loss_fn, config,
                                        p.shardings, mesh)
  batch = train_throughput.abstract_batch(config, config.train.batch_size, mesh)
  key = jax.ShapeDtypeStruct(train_step.key.shape, train_step.key.dtype,
                             sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
  compiled = train_step.jitted.lower(p.abstract, batch, key).compile()
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return Report(
      config=config_name, topology=topology, device_kind=kind, devices=len(devices), chips=chips,
      mesh=dict(mesh.shape), batch_size=config.train.batch_size,
      argument_bytes=memory.argument_size_in_bytes, output_bytes=memory.output_size_in_bytes,
      alias_bytes=memory.alias_size_in_bytes, temp_bytes=memory.temp_size_in_bytes,
      hbm_bytes=chip.hbm_bytes / per_chip, flops=float(cost.get("flops", 0.0)),
      bytes_accessed=float(cost.get("bytes accessed", 0.0)),
      peak_flops=chip.peak_flops / per_chip, hbm_bytes_per_s=chip.hbm_bytes_per_s / per_chip)


def not_fitting(report: Report, config) -> ConfigError:
  """The one line for a step that does not fit, naming what to change."""
  m = config.mesh
  return ConfigError(
      f"{report.config} needs {report.used_bytes / GIB:.1f} GiB per device on {report.topology}, "
      f"more than the {report.hbm_bytes / GIB:.1f} GiB of HBM it has: shard the state over more "
      f"devices (--config.mesh.fsdp, now {m.fsdp}; mesh {report.mesh}), recompute activations "
      f"(--config.model.remat_policy=full, now {config.model.get('remat_policy', 'none')}), or "
      f"lower --config.train.batch_size (now {config.train.batch_size}).")


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", None, "A config file, e.g. configs/bert.py.",
                                            lock_config=False)
  _TOPOLOGY = flags.DEFINE_string("topology", None, "A TPU slice, e.g. v4:4x4x4 or v5e:16x16.")
  _JSON = flags.DEFINE_bool("json", False, "Also print the report as one JSON line (its fields "
                            "and used_bytes, fits, step_seconds), e.g. for a table of slices.")
  flags.mark_flags_as_required(["config", "topology"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config_name = config_flags.get_config_filename(flags.FLAGS["config"])
  try:
    config = _CONFIG.value
    report = compile_step(config, _TOPOLOGY.value, config_name)
    print("\n".join(report.lines()), flush=True)
    if _JSON.value:
      print(json.dumps(dict(dataclasses.asdict(report), used_bytes=report.used_bytes,
                            fits=report.fits, step_seconds=report.step_seconds)), flush=True)
    if not report.fits:
      raise not_fitting(report, config)
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr, flush=True)
    sys.exit(2)


if __name__ == "__main__":
  app.run(main)
