"""When and how `jax.distributed` is initialised (bertfam_jax/main.py): from the flags
--distributed, --coordinator_address, --num_processes, --process_id and the environment (SLURM,
Cloud TPU, multislice). A module of its own, without flags, so that tests import it."""

from __future__ import annotations

from typing import Mapping

from bertfam_jax.config_lib import ConfigError

# What jax's SlurmCluster reads (jax/_src/clusters/slurm_cluster.py); srun sets them all.
_SLURM_VARS = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
               "SLURM_LOCALID")


def init_kwargs(mode: str, coordinator_address: str | None, num_processes: int | None,
                process_id: int | None, env: Mapping[str, str]) -> dict | None:
  """The keyword arguments of `jax.distributed.initialize`, or None to run as one process.

  Explicit flags win; what they leave unset JAX reads from the environment. 'auto' initialises
  only for a multi-process job: srun with SLURM_NTASKS > 1 (an sbatch script running python
  itself has no SLURM_STEP_NODELIST and stays one process, as does a single task), more than one
  host in TPU_PROCESS_ADDRESSES / TPU_WORKER_HOSTNAMES (a single-host TPU VM lists one), or
  MEGASCALE_COORDINATOR_ADDRESS (multislice). Under SLURM JAX gives each process the one GPU of
  its SLURM_LOCALID (one task per GPU); with one task per node every GPU of the node
  (SLURM_GPUS_ON_NODE) is selected instead, unless JAX_LOCAL_DEVICE_IDS says otherwise.
  """
  explicit = {k: v for k, v in dict(coordinator_address=coordinator_address,
                                    num_processes=num_processes, process_id=process_id).items()
              if v is not None}
  slurm = all(k in env for k in _SLURM_VARS) and int(env["SLURM_NTASKS"]) > 1
  tpu_hosts = (env.get("TPU_PROCESS_ADDRESSES") or env.get("TPU_WORKER_HOSTNAMES") or "")
  tpu = len(tpu_hosts.split(",")) > 1 or "MEGASCALE_COORDINATOR_ADDRESS" in env
  if mode == "off" or (mode == "auto" and not (explicit or slurm or tpu)):
    return None
  if explicit and len(explicit) < 3 and not (slurm or tpu):
    missing = sorted({"coordinator_address", "num_processes", "process_id"} - set(explicit))
    raise ConfigError(f"--{', --'.join(missing)} missing: outside SLURM and Cloud TPU pass all "
                      f"of --coordinator_address, --num_processes and --process_id.")
  kwargs = dict(explicit)
  nodes = env.get("SLURM_STEP_NUM_NODES", env.get("SLURM_NNODES"))
  one_task_per_node = slurm and nodes and int(nodes) == int(env["SLURM_NTASKS"])
  if one_task_per_node and env.get("SLURM_GPUS_ON_NODE") and "JAX_LOCAL_DEVICE_IDS" not in env:
    kwargs["local_device_ids"] = list(range(int(env["SLURM_GPUS_ON_NODE"])))
  return kwargs
