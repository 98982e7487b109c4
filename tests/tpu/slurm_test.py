"""tpu/slurm.py: the batch script (its options, and run by bash against a fake srun / scontrol:
the command reaches srun intact, USR1 requeues the job), the dry run, and the SLURM settings JAX
derives for one process per GPU."""

import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

from tpu import slurm  # noqa: E402

COMMAND = ("python", "-m", "bertfam_jax.main", "--config=configs/roberta.py",
           "--workdir=/shared/runs/rob erta", "--config.note=it's $HOME")


def sbatch_options(script):
  return [line.split(" ", 1)[1] for line in script.splitlines() if line.startswith("#SBATCH ")]


def test_one_task_per_gpu_requeue_and_appending_log(tmp_path):
  job = slurm.SlurmJob("roberta", COMMAND, str(tmp_path), nodes=2, gpus_per_node=8,
                       partition="gpu", account="lab", sbatch_args=("--qos=high",))
  script = slurm.sbatch_script(job)
  options = sbatch_options(script)
  assert options == ["--job-name=roberta", "--nodes=2", "--ntasks-per-node=8",
                     "--gpus-per-node=8", "--time=24:00:00", f"--output={tmp_path}/%x-%j.out",
                     "--open-mode=append", "--requeue", "--signal=B:USR1@300",
                     "--partition=gpu", "--account=lab", "--qos=high"]
  assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0
  # One process for all the GPUs of a node (the experiments' jobs):
  single = sbatch_options(slurm.sbatch_script(
      slurm.SlurmJob("row", COMMAND, str(tmp_path), gpus_per_node=4, tasks_per_node=1)))
  assert "--ntasks-per-node=1" in single and "--gpus-per-node=4" in single


@pytest.fixture
def fake_slurm(tmp_path):
  """`srun` and `scontrol` that record their arguments (one per line) and their pid; srun then
  exits with $SRUN_EXIT, or sleeps when it is 'sleep'."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  for tool, then in (("srun", '[ "$SRUN_EXIT" = sleep ] && exec sleep 30\nexit "$SRUN_EXIT"'),
                     ("scontrol", "exit 0")):
    (bin_dir / tool).write_text(
        f'#!/bin/bash\necho $$ > "{tmp_path}/{tool}.pid"\n'
        f'printf "%s\\n" "$@" > "{tmp_path}/{tool}.args"\n{then}\n')
    (bin_dir / tool).chmod(0o755)
  return tmp_path


def start_script(tmp_path, srun_exit):
  job = slurm.SlurmJob("roberta", COMMAND, str(tmp_path / "logs"), chdir=str(tmp_path))
  (tmp_path / "job.sbatch").write_text(slurm.sbatch_script(job))
  env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", SRUN_EXIT=srun_exit,
             SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="gpu[001-002]")
  return subprocess.Popen(["bash", str(tmp_path / "job.sbatch")], env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def wait_for(path, timeout=10.0):
  deadline = time.time() + timeout
  while not path.exists():
    assert time.time() < deadline, f"{path} never appeared"
    time.sleep(0.05)


def recorded(tmp_path, tool):
  return (tmp_path / f"{tool}.args").read_text().splitlines()


def test_script_runs_the_command_under_srun_and_returns_its_status(fake_slurm):
  script = start_script(fake_slurm, "7")
  output, _ = script.communicate(timeout=10)
  assert script.returncode == 7
  assert recorded(fake_slurm, "srun") == ["--kill-on-bad-exit=1", *COMMAND]
  assert "job 4242, restart 0, on gpu[001-002]" in output


def test_usr1_before_the_time_limit_requeues_the_job(fake_slurm):
  script = start_script(fake_slurm, "sleep")
  wait_for(fake_slurm / "srun.args")  # srun started: the trap is set
  script.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@300 does
  wait_for(fake_slurm / "scontrol.args")
  # SLURM would now end the job and queue it again; here our fake srun's sleep is ended.
  os.kill(int((fake_slurm / "srun.pid").read_text()), signal.SIGTERM)
  output, _ = script.communicate(timeout=10)
  assert recorded(fake_slurm, "scontrol") == ["requeue", "4242"]
  assert "time limit near: requeueing" in output


@pytest.mark.parametrize("command", [COMMAND, (*COMMAND[:4], "--workdir=gs://my-bucket/runs/bert")])
def test_cli_dry_run_prints_the_script_and_writes_nothing(tmp_path, capsys, command):
  rc = slurm.main(["--name=bert", f"--log_dir={tmp_path}/logs", "--nodes=2", "--gpus_per_node=4",
                   "--setup=source /shared/venv/bin/activate", "--dry_run", "--", *command])
  out = capsys.readouterr().out
  assert rc == 0 and not (tmp_path / "logs").exists()
  assert "#SBATCH --ntasks-per-node=4" in out and "\nsource /shared/venv/bin/activate\n" in out
  assert out.splitlines()[-1] == f"sbatch --parsable {tmp_path}/logs/bert.sbatch"
  srun = next(line for line in out.splitlines() if line.startswith("srun "))
  assert shlex.split(srun) == ["srun", "--kill-on-bad-exit=1", *command, "&"]


def test_missing_sbatch_names_the_fix(tmp_path, capsys, monkeypatch):
  monkeypatch.setenv("PATH", "")
  assert slurm.main(["--name=bert", f"--log_dir={tmp_path}", "--", *COMMAND]) == 1
  assert "sbatch not found" in capsys.readouterr().err


def test_jax_reads_one_process_per_gpu_from_the_srun_environment(monkeypatch):
  """What jax.distributed.initialize() (called by bertfam_jax.main) derives inside one srun task
  of a 2-node x 8-GPU job: the template relies on it (JAX's own SLURM detection)."""
  from jax._src import clusters  # pylint: disable=import-outside-toplevel
  for key, value in dict(SLURM_JOB_ID="4242", SLURM_STEP_NODELIST="gpu[003-004]",
                         SLURM_NTASKS="16", SLURM_PROCID="9", SLURM_LOCALID="1").items():
    monkeypatch.setenv(key, value)
  address, processes, process_id, devices = (
      clusters.ClusterEnv.auto_detect_unset_distributed_params(None, None, None, None, "slurm",
                                                               None))
  assert address.startswith("gpu003:") and (processes, process_id, devices) == (16, 9, [1])
