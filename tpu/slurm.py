"""SLURM GPU clusters: writes a batch script that starts one process per GPU with `srun` and
submits it with `sbatch`; --dry_run prints the script and the sbatch command instead.

  python -m tpu.slurm --name=roberta --nodes=2 --gpus_per_node=8 --time=24:00:00 \\
      --partition=gpu --log_dir=/shared/logs --setup="source /shared/venv/bin/activate" -- \\
      python -m bertfam_jax.main --config=configs/roberta.py --workdir=/shared/runs/roberta

Every task runs the same command; `bertfam_jax.main` sees SLURM_NTASKS and calls
`jax.distributed.initialize()`, which reads the rest from the step's environment (JAX's
SlurmCluster: coordinator = the first host of SLURM_STEP_NODELIST on a port derived from
SLURM_JOB_ID, SLURM_NTASKS processes, process id SLURM_PROCID, and local device SLURM_LOCALID of
the node's GPUs). Hence one task per GPU with every GPU of the node visible to every task
(--gpus-per-node, never --gpus-per-task, which would leave each task one GPU, numbered 0).

The workdir must be on storage every node sees. Preemption: the job is requeued (--requeue) and
its script starts again, so the command resumes from the workdir's last checkpoint; near the time
limit SLURM signals the script (--signal=B:USR1@...), which requeues the job itself, so a run
longer than the partition's limit continues in the next allocation. Logs append across restarts.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
from typing import Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class SlurmError(Exception):
  """Submitting failed; the message names the fix."""


@dataclasses.dataclass(frozen=True)
class SlurmJob:
  """One batch job: `command` on nodes x tasks_per_node processes."""
  name: str
  command: tuple[str, ...]
  log_dir: str
  nodes: int = 1
  gpus_per_node: int = 1
  tasks_per_node: int = 0  # 0: one per GPU (bertfam_jax.main); 1: one process for all the GPUs
  cpus_per_task: int = 0  # 0: the cluster's default
  time: str = "24:00:00"
  partition: str = ""
  account: str = ""
  requeue_before_s: int = 300  # the script requeues the job this long before its time limit
  setup: str = ""  # shell lines run before srun (modules, a virtualenv)
  chdir: str = REPO
  sbatch_args: tuple[str, ...] = ()  # more #SBATCH options, e.g. --qos=high

  @property
  def script_path(self) -> str:
    return os.path.join(self.log_dir, f"{self.name}.sbatch")


def sbatch_script(job: SlurmJob) -> str:
  """The batch script of `job`."""
  if job.nodes < 1 or job.gpus_per_node < 1:
    raise SlurmError("--nodes and --gpus_per_node must be at least 1.")
  tasks = job.tasks_per_node or job.gpus_per_node
  options = [f"--job-name={job.name}", f"--nodes={job.nodes}", f"--ntasks-per-node={tasks}",
             f"--gpus-per-node={job.gpus_per_node}", f"--time={job.time}",
             f"--output={os.path.join(job.log_dir, '%x-%j.out')}", "--open-mode=append",
             "--requeue", f"--signal=B:USR1@{job.requeue_before_s}"]
  options += [f"--cpus-per-task={job.cpus_per_task}"] if job.cpus_per_task else []
  options += [f"--partition={job.partition}"] if job.partition else []
  options += [f"--account={job.account}"] if job.account else []
  options += list(job.sbatch_args)
  lines = ["#!/bin/bash",
           f"# Written by `python -m tpu.slurm`: {tasks} task(s) per node, "
           f"{job.gpus_per_node} GPU(s) per node, requeued on preemption.",
           *(f"#SBATCH {shlex.quote(o)}" for o in options),
           "set -uo pipefail",
           f"cd {shlex.quote(job.chdir)}",
           *([job.setup] if job.setup else []),
           'echo "[$(date)] job $SLURM_JOB_ID, restart ${SLURM_RESTART_COUNT:-0}, on '
           '$SLURM_JOB_NODELIST"',
           "# Near the time limit: requeue; the next allocation resumes from the workdir.",
           "trap 'echo \"[$(date)] time limit near: requeueing\"; "
           "scontrol requeue \"$SLURM_JOB_ID\"' USR1",
           # srun in the background, so that the trap runs while it works.
           f"srun --kill-on-bad-exit=1 {shlex.join(job.command)} &",
           'wait "$!"',
           ""]
  return "\n".join(lines)


def sbatch_command(job: SlurmJob) -> list[str]:
  return ["sbatch", "--parsable", job.script_path]


def submit(job: SlurmJob) -> str:
  """Writes the script to job.script_path and submits it; returns the job id."""
  if shutil.which("sbatch") is None:
    raise SlurmError("sbatch not found on PATH: run this on the cluster's login node (or pass "
                     "--dry_run to print the script).")
  os.makedirs(job.log_dir, exist_ok=True)
  with open(job.script_path, "w") as f:
    f.write(sbatch_script(job))
  result = subprocess.run(sbatch_command(job), capture_output=True, text=True, check=False)
  if result.returncode != 0:
    raise SlurmError(f"sbatch failed: {result.stderr.strip()}")
  return result.stdout.strip().split(";")[0]


def dry_run_text(job: SlurmJob) -> str:
  """What --dry_run prints: the script, then the command that would submit it."""
  return (f"# ---- {job.script_path}\n{sbatch_script(job)}# ----\n"
          f"{shlex.join(sbatch_command(job))}\n")


def add_job_flags(parser: argparse.ArgumentParser) -> None:
  """The SlurmJob flags shared with experiments.launch (all but --nodes)."""
  parser.add_argument("--gpus_per_node", type=int, default=1)
  parser.add_argument("--cpus_per_task", type=int, default=0, help="0: the cluster's default")
  parser.add_argument("--time", default="24:00:00", help="per allocation; the job requeues "
                      "itself before it")
  parser.add_argument("--partition", default="")
  parser.add_argument("--account", default="")
  parser.add_argument("--setup", default="", help="shell run before srun, e.g. 'source "
                      "/shared/venv/bin/activate'")
  parser.add_argument("--sbatch_arg", action="append", default=[],
                      help="another #SBATCH option, e.g. --sbatch_arg=--qos=high (repeatable)")


def main(argv: Sequence[str]) -> int:
  argv = list(argv)
  command = argv[argv.index("--") + 1:] if "--" in argv else []
  own = argv[:argv.index("--")] if "--" in argv else argv
  parser = argparse.ArgumentParser(prog="python -m tpu.slurm",
                                   description=__doc__.split("\n\n", 1)[0])
  parser.add_argument("--name", required=True, help="job name (and script name)")
  parser.add_argument("--log_dir", required=True, help="on shared storage: the script and the "
                      "job's output (NAME-JOBID.out)")
  parser.add_argument("--nodes", type=int, default=1)
  add_job_flags(parser)
  parser.add_argument("--dry_run", action="store_true", help="print, do not submit")
  args = parser.parse_args(own)
  if not command:
    parser.error("give the command after --, e.g. -- python -m bertfam_jax.main "
                 "--config=configs/bert.py --workdir=/shared/runs/bert")
  job = SlurmJob(args.name, tuple(command), os.path.abspath(args.log_dir), nodes=args.nodes,
                 gpus_per_node=args.gpus_per_node, cpus_per_task=args.cpus_per_task,
                 time=args.time, partition=args.partition, account=args.account,
                 setup=args.setup, sbatch_args=tuple(args.sbatch_arg))
  try:
    if args.dry_run:
      print(dry_run_text(job), end="")
      return 0
    print(f"submitted job {submit(job)}: {job.script_path}, output "
          f"{os.path.join(job.log_dir, job.name)}-<jobid>.out")
  except SlurmError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
