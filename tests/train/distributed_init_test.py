"""bertfam_jax.train.distributed.init_kwargs: when and how jax.distributed is initialised, from the
flags and the environment (SLURM, Cloud TPU, explicit coordinator)."""

import pytest
from jax._src import clusters  # private: checks that JAX reads the SLURM job as we expect

from bertfam_jax.config_lib import ConfigError
from bertfam_jax.train import distributed

# srun --nodes=1 --ntasks=4 (one task per GPU): what srun exports to task 2.
SRUN_PER_GPU = dict(SLURM_JOB_ID="4242", SLURM_STEP_NODELIST="gpu[001-002]", SLURM_NTASKS="4",
                    SLURM_PROCID="2", SLURM_LOCALID="2", SLURM_STEP_NUM_NODES="1",
                    SLURM_GPUS_ON_NODE="4")
# srun --nodes=2 --ntasks-per-node=1 with 8 GPUs per node: one process drives its node's GPUs.
SRUN_PER_NODE = dict(SRUN_PER_GPU, SLURM_NTASKS="2", SLURM_PROCID="1", SLURM_LOCALID="0",
                     SLURM_STEP_NUM_NODES="2", SLURM_GPUS_ON_NODE="8")


def kwargs(env=None, mode="auto", coordinator=None, num_processes=None, process_id=None):
  return distributed.init_kwargs(mode, coordinator, num_processes, process_id, env or {})


def test_a_single_process_does_not_initialise():
  assert kwargs() is None
  assert kwargs(dict(SRUN_PER_GPU, SLURM_NTASKS="1")) is None   # a single-task job
  # An sbatch script running python itself (no srun step): one process, whatever --ntasks says.
  batch_script = {k: v for k, v in SRUN_PER_GPU.items() if k != "SLURM_STEP_NODELIST"}
  assert kwargs(batch_script) is None
  assert kwargs(dict(TPU_WORKER_HOSTNAMES="localhost")) is None   # a single-host TPU VM


def test_explicit_flags():
  assert kwargs(coordinator="10.0.0.1:1234", num_processes=2, process_id=1) == dict(
      coordinator_address="10.0.0.1:1234", num_processes=2, process_id=1)
  assert kwargs(mode="off", coordinator="10.0.0.1:1234", num_processes=2, process_id=1) is None
  with pytest.raises(ConfigError, match=r"--num_processes, --process_id missing"):
    kwargs(coordinator="10.0.0.1:1234")
  # Under srun JAX reads what the flags leave unset.
  assert kwargs(SRUN_PER_GPU, coordinator="gpu001:5555") == dict(coordinator_address="gpu001:5555")


def test_multi_process_environments_leave_the_settings_to_jax():
  assert kwargs(SRUN_PER_GPU) == {}
  assert kwargs(dict(TPU_WORKER_HOSTNAMES="t1k-w-0,t1k-w-1,t1k-w-2,t1k-w-3")) == {}
  assert kwargs(dict(MEGASCALE_COORDINATOR_ADDRESS="10.0.0.1")) == {}
  assert kwargs(mode="on") == {}   # e.g. Cloud TPU metadata, which JAX queries itself


def test_one_task_per_node_selects_every_gpu_of_the_node():
  assert kwargs(SRUN_PER_NODE) == dict(local_device_ids=list(range(8)))
  assert kwargs(dict(SRUN_PER_NODE, JAX_LOCAL_DEVICE_IDS="0,1")) == {}   # JAX reads it itself


@pytest.mark.parametrize("env, local_device_ids", [(SRUN_PER_GPU, [2]),
                                                    (SRUN_PER_NODE, list(range(8)))])
def test_jax_reads_the_srun_environment(monkeypatch, env, local_device_ids):
  """JAX's SLURM detection sees the same job: process count and id from SLURM, the coordinator on
  the first node, and one GPU per task unless we select the node's GPUs."""
  for key, value in env.items():
    monkeypatch.setenv(key, value)
  given = kwargs(env)
  detected = clusters.ClusterEnv.auto_detect_unset_distributed_params(
      None, None, None, given.get("local_device_ids"), None, 300)
  assert detected == ("gpu001:" + str(4242 % 2**12 + 65535 - 2**12 + 1), int(env["SLURM_NTASKS"]),
                      int(env["SLURM_PROCID"]), local_device_ids)
