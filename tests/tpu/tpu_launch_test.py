"""tpu/launch.py: the gcloud commands it generates (--dry_run: nothing is contacted), the scripts it
runs on a worker (run here with bash, in a fake home directory), and its preemption loop against
a scripted gcloud."""

import os
import shlex
import subprocess
import sys
import time

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

from tpu import launch  # noqa: E402

USER_COMMAND = ["python", "-m", "bertfam_jax.main", "--config=configs/roberta.py",
                "--workdir=/mnt/shared/run one", "--config.note=it's \"quoted\" $HOME"]
POD = ["--name=pod", "--zone=us-central2-b", "--accelerator_type=v4-32",
       "--version=tpu-ubuntu2204-base"]


def dry_run(capsys, verb, *args):
  rc = launch.main([verb, "--dry_run", *args])
  lines = capsys.readouterr().out.splitlines()
  return rc, [shlex.split(line) for line in lines if not line.startswith("#")]


def flag(command, name):
  """The value of --name=value in an argv."""
  values = [a.split("=", 1)[1] for a in command if a.startswith(f"--{name}=")]
  assert len(values) == 1, (name, command)
  return values[0]


def test_run_dry_run_prints_every_step(capsys):
  rc, commands = dry_run(capsys, "run", *POD, "--queued", "--spot",
                         "--worker_setup=sudo mount -t nfs 10.1.2.3:/vol /mnt/shared", "--",
                         *USER_COMMAND)
  assert rc == 0
  verbs = [tuple(c[3:5]) if c[0] == "gcloud" else (c[0],) for c in commands]
  assert verbs == [("queued-resources", "describe"), ("queued-resources", "create"),
                   ("queued-resources", "describe"), ("tpu-vm", "ssh"), ("tar",), ("tpu-vm", "scp"),
                   ("tpu-vm", "ssh"), ("tpu-vm", "ssh"), ("tpu-vm", "ssh"),
                   ("queued-resources", "describe"), ("tpu-vm", "ssh"),
                   ("queued-resources", "delete")]
  for command in commands:
    if command[0] == "gcloud":
      assert flag(command, "zone") == "us-central2-b"
      assert command[5] == "pod" or command[4] == "scp"
  create = commands[1]
  assert flag(create, "node-id") == "pod" and flag(create, "accelerator-type") == "v4-32"
  assert flag(create, "runtime-version") == "tpu-ubuntu2204-base" and "--spot" in create
  assert flag(commands[0], "format") == "value(state.state)"
  assert "run.exit" in flag(commands[3], "command")
  tar, scp, install, start, logs = commands[4:9]
  assert scp[5] == tar[2] and scp[6] == "pod:bertfam_jax.tar.gz"
  assert all(p in tar for p in ("bertfam_jax", "configs", "experiments", "setup.cfg"))
  assert [flag(c, "worker") for c in (scp, install, start, logs)] == ["all", "all", "all", "0"]
  assert flag(install, "command").startswith("(sudo mount -t nfs 10.1.2.3:/vol /mnt/shared) && ")
  assert "uv pip install" in flag(install, "command") and "jax[tpu]" in flag(install, "command")
  assert "nohup" in flag(start, "command") and "tail" in flag(logs, "command")
  assert commands[-1][-3:] == ["--force", "--quiet", "--zone=us-central2-b"]


def test_a_pod_slice_writing_to_gs_gets_its_workdir_intact_and_the_gcs_extra(capsys):
  command = ["python", "-m", "bertfam_jax.main", "--config=configs/bert.py", "--distributed=on",
             "--workdir=gs://my-bucket/runs/bert", "--config.data.tfds_data_dir=gs://my-bucket/tfds"]
  rc, commands = dry_run(capsys, "run", *POD, "--", *command)
  assert rc == 0
  install, start = commands[6], commands[7]
  assert ".[tfds,experiments,gcs]" in flag(install, "command")
  assert "mount" not in flag(install, "command")
  script = flag(start, "command")
  assert all(a in script for a in command[3:]), script   # URLs passed through unchanged


def test_tpu_vm_commands_without_queued_resources(capsys):
  rc, [create] = dry_run(capsys, "create", *POD, "--spot", "--project=my-proj")
  assert rc == 0
  assert create[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "pod"]
  assert flag(create, "version") == "tpu-ubuntu2204-base" and "--spot" in create
  assert flag(create, "project") == "my-proj"
  _, [delete] = dry_run(capsys, "delete", "--name=pod", "--zone=z")
  assert delete == ["gcloud", "compute", "tpus", "tpu-vm", "delete", "pod", "--quiet", "--zone=z"]
  _, [state, status] = dry_run(capsys, "status", "--name=pod", "--zone=z")
  assert flag(state, "format") == "value(state)" and flag(status, "worker") == "0"
  _, [logs] = dry_run(capsys, "logs", "--name=pod", "--zone=z", "--worker=3")
  assert flag(logs, "worker") == "3"


def test_errors_name_the_fix(capsys, monkeypatch):
  assert launch.main(["create", "--name=pod", "--zone=z", "--dry_run"]) == 1
  assert "--accelerator_type" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    launch.main(["run", *POD, "--dry_run"])  # no command after --
  assert "needs the command after --" in capsys.readouterr().err
  monkeypatch.setenv("PATH", "")
  assert launch.main(["status", "--name=pod", "--zone=z"]) == 1
  assert "gcloud not found" in capsys.readouterr().err


# ------------------------------------------------------------------- the scripts on a worker


@pytest.fixture
def worker_home(tmp_path):
  """A worker's home: the unpacked checkout and a virtualenv whose activation sets a marker."""
  (tmp_path / "bertfam_jax").mkdir()
  (tmp_path / "bertfam_venv" / "bin").mkdir(parents=True)
  (tmp_path / "bertfam_venv" / "bin" / "activate").write_text("export VENV_ACTIVE=yes\n")
  return tmp_path


def on_worker(home, script, timeout=10):
  """Runs a remote script as `gcloud ... ssh --command=SCRIPT` does: in the login shell."""
  return subprocess.run(["bash", "-c", script], env=dict(os.environ, HOME=str(home)),
                        capture_output=True, text=True, timeout=timeout, check=False)


def wait_for_exit_status(home, timeout=10.0):
  deadline = time.time() + timeout
  while time.time() < deadline:
    status = on_worker(home, launch.status_script()).stdout.strip()
    if status not in ("running", ""):
      return status
    time.sleep(0.05)
  raise AssertionError("the run did not end")


def test_launched_command_gets_its_arguments_intact(worker_home):
  probe = [sys.executable, "-c", "import os, sys; print(repr(sys.argv[1:]), os.getcwd(), "
           "os.environ['VENV_ACTIVE'])", *USER_COMMAND[3:]]
  started = on_worker(worker_home, launch.launch_script(probe))
  assert started.returncode == 0, started.stderr
  assert wait_for_exit_status(worker_home) == "0"
  log = on_worker(worker_home, launch.logs_script())  # the run ended: prints all, returns
  assert log.returncode == 0
  assert log.stdout.strip() == (f"{USER_COMMAND[3:]!r} {worker_home / 'bertfam_jax'} yes")


def test_exit_status_refusal_while_running_and_stop(worker_home):
  on_worker(worker_home, launch.launch_script(["bash", "-c", "exit 3"]))
  assert wait_for_exit_status(worker_home) == "3"
  assert on_worker(worker_home, launch.launch_script(["sleep", "30"])).returncode == 0
  assert on_worker(worker_home, launch.status_script()).stdout.strip() == "running"
  again = on_worker(worker_home, launch.launch_script(["true"]))
  assert again.returncode == 1 and "still going" in again.stderr
  assert on_worker(worker_home, launch.stop_script()).returncode == 0
  assert wait_for_exit_status(worker_home) == "stopped"


# ---------------------------------------------------------------------------- preemption loop


class ScriptedGcloud:
  """Answers the state and exit-status queries from scripts; records every command."""

  def __init__(self, states, statuses, failing=()):
    self.states, self.statuses, self.failing = list(states), list(statuses), failing
    self.commands = []

  def run(self, argv):
    self.commands.append(list(argv))
    return 1 if any(f in " ".join(argv) for f in self.failing) else 0

  def output(self, argv):
    self.commands.append(list(argv))
    if "describe" in argv:
      state = self.states.pop(0)
      return (1, "", "ERROR: NOT_FOUND: Resource was not found") if state == "" else (0, state, "")
    return self.statuses.pop(0)

  def steps(self):
    """('describe' | 'create' | 'delete' | 'tar' | 'scp' | 'install' | 'launch' | 'logs' |
    'status') per command."""
    names = []
    for c in self.commands:
      if c[0] != "gcloud":
        names.append(c[0])
      elif c[4] != "ssh":
        names.append(c[4])
      else:
        script = flag(c, "command")
        names.append(next(k for k, s in (("install", "uv pip"), ("launch", "nohup"),
                                         ("logs", "tail"), ("status", "run.exit"))
                           if s in script))
    return names


TPU = launch.Tpu("pod", "us-central2-b", "v4-32", "tpu-ubuntu2204-base", spot=True, queued=True)
UP = ["status", "tar", "scp", "install", "launch", "logs"]  # nothing running: install, launch
FRESH = (0, "none", "")


def supervise(gcloud, **kwargs):
  return launch.supervise(TPU, USER_COMMAND, gcloud, sleep=lambda s: None, **kwargs)


def test_preempted_tpu_is_recreated_and_the_same_command_relaunched():
  gcloud = ScriptedGcloud(
      states=["", "WAITING_FOR_RESOURCES", "ACTIVE", "SUSPENDED", "PROVISIONING", "ACTIVE"],
      statuses=[FRESH, (255, "", "connection closed"), FRESH, (0, "0", "")])
  assert supervise(gcloud) == 0
  assert gcloud.steps() == [
      "describe", "create", "describe", "describe", *UP, "status",  # ssh fails: preempted
      "describe", "delete", "create", "describe", "describe", *UP, "status", "delete"]
  launches = [c for c, s in zip(gcloud.commands, gcloud.steps()) if s == "launch"]
  assert len(launches) == 2 and launches[0] == launches[1]  # same command, same workdir
  assert "--workdir=/mnt/shared/run one" in shlex.join(launches[0])


def test_exit_status_is_returned_and_keep_leaves_the_tpu():
  gcloud = ScriptedGcloud(states=["READY", "READY"],
                          statuses=[FRESH, (0, "running", ""), (0, "7", "")])
  assert supervise(gcloud, keep=True) == 7
  # An existing TPU is reused; the log stream is resumed while the run goes on.
  assert gcloud.steps() == ["describe", *UP, "status", "describe", "logs", "status"]


def test_a_run_going_on_already_is_followed_not_launched_again():
  gcloud = ScriptedGcloud(states=["READY"], statuses=[(0, "running", ""), (0, "0", "")])
  assert supervise(gcloud) == 0
  assert gcloud.steps() == ["describe", "status", "logs", "status", "delete"]


def test_a_vanished_run_is_relaunched_until_max_restarts_then_torn_down():
  # The VM restarted under the run (no exit status), then the TPU was preempted.
  gcloud = ScriptedGcloud(states=["READY", "READY", "PREEMPTED"],
                          statuses=[FRESH, (0, "stopped", ""), (0, "stopped", ""),
                                    (255, "", "")])
  with pytest.raises(launch.TpuError, match="that makes 2 restarts"):
    supervise(gcloud, max_restarts=1)
  assert gcloud.steps() == ["describe", *UP, "status", "describe", *UP, "status", "describe",
                            "delete"]


def test_a_failing_install_is_fatal_when_the_tpu_is_up():
  gcloud = ScriptedGcloud(states=["READY", "READY"], statuses=[FRESH], failing=("uv pip",))
  with pytest.raises(launch.TpuError, match="installing on the workers failed"):
    supervise(gcloud)
  assert gcloud.steps() == ["describe", "status", "tar", "scp", "install", "describe", "delete"]
