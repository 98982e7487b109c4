"""The TPU launcher's generated gcloud commands (--dry-run: nothing is contacted)."""

import os
import shlex
import subprocess

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "tpu", "run_all_workers.sh")


def dry_run(*args):
  result = subprocess.run(["bash", SCRIPT, "--dry-run", *args], capture_output=True, text=True,
                          check=False)
  return result.returncode, [shlex.split(line) for line in result.stdout.splitlines()], result.stderr


def test_copies_installs_and_runs_on_every_worker():
  rc, commands, _ = dry_run("pod", "us-central2-b", "--", "python", "-m", "bertfam_jax.main",
                            "--config=configs/roberta.py", "--workdir=/mnt/shared/run one")
  assert rc == 0
  assert [c[:5] for c in commands] == [["gcloud", "compute", "tpus", "tpu-vm", verb]
                                       for verb in ("ssh", "scp", "ssh", "ssh")]
  for command in commands:
    assert "--worker=all" in command and "--zone=us-central2-b" in command
  assert "pip install" in commands[2][-1]
  # The user's command reaches the workers intact, quoting included.
  remote = commands[3][-1].split("--command=", 1)[-1]
  assert shlex.split(remote.split("&&", 1)[1]) == [
      "python", "-m", "bertfam_jax.main", "--config=configs/roberta.py",
      "--workdir=/mnt/shared/run one"]


def test_usage_error_without_separator():
  rc, _, stderr = dry_run("pod", "zone", "python")
  assert rc == 2 and "usage:" in stderr
