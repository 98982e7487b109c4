"""Cloud TPU VMs and pod slices: create, install, launch on every worker, stream logs, resume
after preemption, tear down. Every step is a gcloud command built by a small function here;
--dry_run prints them instead of running them.

  # Everything in one go: create (or reuse) the TPU, install this checkout on every worker, start
  # the command on all workers at once, stream worker 0's log; when the TPU is preempted, recreate
  # it and start the same command again (bertfam_jax.main resumes from its workdir); delete the
  # TPU when the command ends.
  python -m tpu.launch run --name=pod --zone=us-central2-b --accelerator_type=v4-32 \\
      --version=tpu-ubuntu2204-base --queued --spot -- \\
      python -m bertfam_jax.main --config=configs/roberta.py --distributed=on \\
      --workdir=gs://my-bucket/roberta --config.data.tfds_data_dir=gs://my-bucket/tensorflow_datasets

  # Or step by step (the same flags): create, install, launch, logs, status, stop, delete.
  python -m tpu.launch logs --name=pod --zone=us-central2-b

The workdir must be storage every worker sees, and a recreated TPU finds again: a Cloud Storage
path (--workdir=gs://bucket/run; the workers install the [gcs] extra and use the TPU VM's service
account) or a filesystem (a Filestore / NFS mount, e.g. mounted by --worker_setup, which runs
again on a recreated TPU). Every process writes its shards of each checkpoint there.

On a worker: the checkout is in ~/bertfam_jax, installed (with `uv`, which brings its own
Python: TPU runtimes ship Python 3.10, the project needs 3.11+) into the virtualenv
~/bertfam_venv; the command runs detached (nohup) from ~/bertfam_jax with that virtualenv
active, its output in ~/bertfam_logs/run.log, so a dropped ssh connection does not stop it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Callable, Protocol, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What a worker needs of the checkout (setup.cfg reads README.md); results and runs stay here.
SHIPPED = ("setup.cfg", "pyproject.toml", "README.md", "bertfam_jax", "configs", "experiments",
           "tpu")
EXCLUDED = ("__pycache__", "*.egg-info", "runs", "experiments/results")

# Paths on a worker, for its login shell.
CODE = "$HOME/bertfam_jax"
VENV = "$HOME/bertfam_venv"
LOGS = "$HOME/bertfam_logs"
LOG, PID, EXIT = f"{LOGS}/run.log", f"{LOGS}/run.pid", f"{LOGS}/run.exit"
ARCHIVE = "bertfam_jax.tar.gz"  # in the worker's home directory

# TPU VM (`state`) and queued resource (`state.state`) states; any other state (CREATING,
# WAITING_FOR_RESOURCES, PROVISIONING, REPAIRING, DELETING, ...) is waited out.
HEALTHY = frozenset({"READY", "ACTIVE"})
LOST = frozenset({"", "PREEMPTED", "TERMINATED", "STOPPED", "SUSPENDING", "SUSPENDED", "FAILED"})
NOT_FOUND = ""
UNKNOWN = "UNKNOWN"  # gcloud could not tell (network, auth): polled again


class TpuError(Exception):
  """A step failed in a way that retrying will not fix; the message names the fix."""


@dataclasses.dataclass(frozen=True)
class Tpu:
  """A TPU VM or pod slice, created directly or (queued=True) through a queued resource of the
  same name whose one node also has that name."""
  name: str
  zone: str
  accelerator_type: str = ""
  version: str = ""
  project: str = ""
  spot: bool = False
  queued: bool = False


@dataclasses.dataclass(frozen=True)
class Setup:
  """How a worker is prepared: `prepare` runs first on every worker, at every install (so again
  on a recreated TPU), e.g. mounting the shared filesystem; then the checkout is installed."""
  extras: str = "tfds,experiments,gcs"
  packages: tuple[str, ...] = ("jax[tpu]",)
  python: str = "3.12"
  prepare: str = ""


# ----------------------------------------------------------------------------- gcloud commands


def _gcloud(tpu: Tpu, group: str, verb: str, *args: str) -> list[str]:
  location = [f"--zone={tpu.zone}"] + ([f"--project={tpu.project}"] if tpu.project else [])
  return ["gcloud", "compute", "tpus", group, verb, *args, *location]


def create_command(tpu: Tpu) -> list[str]:
  """Creates the TPU VM, or requests the queued resource (which then waits for capacity)."""
  if not (tpu.accelerator_type and tpu.version):
    raise TpuError("creating a TPU needs --accelerator_type (e.g. v4-32) and --version (the "
                   "runtime, e.g. tpu-ubuntu2204-base).")
  spot = ["--spot"] if tpu.spot else []
  if tpu.queued:
    return _gcloud(tpu, "queued-resources", "create", tpu.name, f"--node-id={tpu.name}",
                   f"--accelerator-type={tpu.accelerator_type}",
                   f"--runtime-version={tpu.version}", *spot)
  return _gcloud(tpu, "tpu-vm", "create", tpu.name, f"--accelerator-type={tpu.accelerator_type}",
                 f"--version={tpu.version}", *spot)


def state_command(tpu: Tpu) -> list[str]:
  """Prints the state: READY / PREEMPTED / ... (TPU VM), ACTIVE / SUSPENDED / ... (queued)."""
  if tpu.queued:
    return _gcloud(tpu, "queued-resources", "describe", tpu.name, "--format=value(state.state)")
  return _gcloud(tpu, "tpu-vm", "describe", tpu.name, "--format=value(state)")


def delete_command(tpu: Tpu) -> list[str]:
  """Deletes the TPU (a queued resource with its node), without a confirmation prompt."""
  if tpu.queued:
    return _gcloud(tpu, "queued-resources", "delete", tpu.name, "--force", "--quiet")
  return _gcloud(tpu, "tpu-vm", "delete", tpu.name, "--quiet")


def ssh_command(tpu: Tpu, script: str, worker: str = "all") -> list[str]:
  """Runs `script` in the login shell of `worker` ('all': every worker at once)."""
  return _gcloud(tpu, "tpu-vm", "ssh", tpu.name, f"--worker={worker}", f"--command={script}")


def archive_path(tpu: Tpu) -> str:
  """The local archive of the checkout shipped to `tpu`'s workers."""
  return os.path.join(tempfile.gettempdir(), f"bertfam_jax-{tpu.name}.tar.gz")


def pack_command(archive: str, repo: str = REPO) -> list[str]:
  """Packs the parts of the checkout a worker needs (uncommitted edits included)."""
  return ["tar", "czf", archive, *(f"--exclude={p}" for p in EXCLUDED), "-C", repo, *SHIPPED]


def scp_command(tpu: Tpu, archive: str) -> list[str]:
  """Copies the archive to the home directory of every worker."""
  return _gcloud(tpu, "tpu-vm", "scp", archive, f"{tpu.name}:{ARCHIVE}", "--worker=all")


# ------------------------------------------------------------------------- scripts on a worker


def install_script(setup: Setup) -> str:
  """Runs `setup.prepare`, unpacks the checkout into ~/bertfam_jax and installs it, with
  `setup.packages`, into ~/bertfam_venv (created once, with uv's own Python `setup.python`)."""
  packages = " ".join(shlex.quote(p) for p in (f".[{setup.extras}]", *setup.packages))
  return " && ".join([
      *([f"({setup.prepare})"] if setup.prepare else []),
      f'rm -rf "{CODE}"', f'mkdir -p "{CODE}"', f'tar xzf "$HOME/{ARCHIVE}" -C "{CODE}"',
      "(command -v uv >/dev/null || curl -LsSf https://astral.sh/uv/install.sh | sh)",
      'export PATH="$HOME/.local/bin:$PATH"',
      f'([ -x "{VENV}/bin/python" ] || uv venv --python {shlex.quote(setup.python)} "{VENV}")',
      f'cd "{CODE}"', f'uv pip install --python "{VENV}/bin/python" -e {packages}'])


def launch_script(command: Sequence[str]) -> str:
  """Starts `command` detached (it outlives the ssh connection) in ~/bertfam_jax with the
  virtualenv active, appending its output to ~/bertfam_logs/run.log; its process group id goes
  to run.pid (before this returns) and, when it ends, its exit status to run.exit. Refuses
  while a run is going on."""
  run = (f'echo $$ > "{PID}"; cd "{CODE}" && source "{VENV}/bin/activate" && '
         f'{shlex.join(command)}; echo $? > "{EXIT}"')
  refuse = (f'if [ ! -f "{EXIT}" ] && [ -f "{PID}" ] && kill -0 "$(cat "{PID}")" 2>/dev/null; '
            f'then echo "a run is still going on this TPU: tpu.launch logs follows it, '
            f'tpu.launch stop ends it" >&2; exit 1; fi')
  # Return once run.pid is written, so that `logs` and `status` find the run.
  started = (f'for _ in $(seq 100); do [ -s "{PID}" ] && exit 0; sleep 0.1; done; '
             'echo "the run did not start" >&2; exit 1')
  return (f'mkdir -p "{LOGS}"; {refuse}; rm -f "{EXIT}" "{PID}"; '
          f'nohup setsid bash -c {shlex.quote(run)} >> "{LOG}" 2>&1 < /dev/null & {started}')


def logs_script() -> str:
  """Prints the run's log from the start and follows it until the run ends."""
  return (f'if [ -f "{PID}" ]; then tail -n +1 --pid="$(cat "{PID}")" -F "{LOG}"; '
          f'else echo "no run was launched on this worker" >&2; exit 1; fi')


def status_script() -> str:
  """Prints the run's exit status once it ended, 'running' while it runs, 'stopped' when it
  ended without one (tpu.launch stop, or killed), 'none' when nothing was launched."""
  return (f'if [ -f "{EXIT}" ]; then cat "{EXIT}"; '
          f'elif [ ! -f "{PID}" ]; then echo none; '
          f'elif kill -0 "$(cat "{PID}")" 2>/dev/null; then echo running; else echo stopped; fi')


def stop_script() -> str:
  """Ends the run's whole process group (SIGTERM)."""
  return f'[ -f "{PID}" ] && kill -- -"$(cat "{PID}")"'


# --------------------------------------------------------------------------- running commands


class Shell(Protocol):
  """Runs commands: `run` streams their output, `output` captures it."""

  def run(self, argv: Sequence[str]) -> int:
    ...

  def output(self, argv: Sequence[str]) -> tuple[int, str, str]:
    ...


class LocalShell:
  """Runs commands here, echoing each one first ('+ gcloud ...')."""

  def run(self, argv: Sequence[str]) -> int:
    print("+", shlex.join(argv), flush=True)
    return subprocess.call(list(argv))

  def output(self, argv: Sequence[str]) -> tuple[int, str, str]:
    print("+", shlex.join(argv), flush=True)
    result = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    return result.returncode, result.stdout.strip(), result.stderr.strip()


def require_gcloud() -> None:
  """Raises TpuError when the gcloud CLI is not on PATH."""
  if shutil.which("gcloud") is None:
    raise TpuError("gcloud not found on PATH: install the Google Cloud CLI "
                   "(https://cloud.google.com/sdk/docs/install) and run `gcloud auth login`, or "
                   "pass --dry_run to print the commands.")


def current_state(tpu: Tpu, shell: Shell) -> str:
  """The TPU's state; NOT_FOUND ('') when it does not exist, UNKNOWN when gcloud failed."""
  rc, out, err = shell.output(state_command(tpu))
  if rc == 0:
    return out
  return NOT_FOUND if "NOT_FOUND" in err or "not found" in err.lower() else UNKNOWN


def check(rc: int, what: str) -> None:
  if rc != 0:
    raise _StepFailed(f"{what} failed (exit status {rc}).")


class _StepFailed(Exception):
  """A step failed: fatal unless the TPU turns out to be lost (preempted) meanwhile."""


def run_status(tpu: Tpu, shell: Shell) -> str:
  """status_script's answer on worker 0; '' when it could not be asked (ssh failed)."""
  rc, out, _ = shell.output(ssh_command(tpu, status_script(), worker="0"))
  return out if rc == 0 else ""


def install(tpu: Tpu, shell: Shell, setup: Setup, repo: str = REPO) -> None:
  """Packs the checkout, copies it to every worker, installs it there."""
  archive = archive_path(tpu)
  check(shell.run(pack_command(archive, repo)), "packing the checkout")
  check(shell.run(scp_command(tpu, archive)), "copying the checkout to the workers")
  check(shell.run(ssh_command(tpu, install_script(setup))), "installing on the workers")


def launch(tpu: Tpu, shell: Shell, command: Sequence[str]) -> None:
  check(shell.run(ssh_command(tpu, launch_script(command))), "launching on the workers")


def supervise(tpu: Tpu, command: Sequence[str], shell: Shell, *, setup: Setup = Setup(),
              repo: str = REPO, poll_s: float = 60.0, max_restarts: int = 20,
              keep: bool = False, sleep: Callable[[float], None] = time.sleep) -> int:
  """Runs `command` on every worker of `tpu` to its end and returns its exit status (worker 0's).

  Creates the TPU unless it is up, installs the checkout, launches (or, when a run is going on
  there already, follows that one), streams worker 0's log. When
  the TPU is lost (preempted, suspended, deleted), deletes what is left of it, creates it again,
  reinstalls and launches the same command; when the run vanished without an exit status (the
  VM restarted), reinstalls and launches it again: a command with a workdir resumes from its
  last checkpoint. At most `max_restarts` times. Deletes the TPU at the end unless `keep`, also
  when giving up (TpuError), but not on Ctrl-C: the run goes on, and `logs` / `delete` find it.
  """
  try:
    status = _run_to_end(tpu, command, shell, setup=setup, repo=repo, poll_s=poll_s,
                         max_restarts=max_restarts, sleep=sleep)
  except TpuError:
    if not keep:
      shell.run(delete_command(tpu))
    raise
  if not keep:
    shell.run(delete_command(tpu))
  return status


def _run_to_end(tpu: Tpu, command: Sequence[str], shell: Shell, *, setup: Setup, repo: str,
                poll_s: float, max_restarts: int, sleep: Callable[[float], None]) -> int:
  """supervise() without the teardown."""
  restarts, launched = 0, False

  def relaunching(why: str) -> None:
    nonlocal restarts
    restarts += 1
    if restarts > max_restarts:
      raise TpuError(f"{why}: that makes {restarts} restarts; giving up (--max_restarts).")
    print(f"{why}: launching the same command again (restart {restarts}).", flush=True)

  while True:
    state = current_state(tpu, shell)
    if state in LOST:
      if launched:
        relaunching(f"{tpu.name} is {state or 'gone'}; recreating it")
      try:
        if state != NOT_FOUND:
          check(shell.run(delete_command(tpu)), f"deleting the {state} TPU")
        check(shell.run(create_command(tpu)), "creating the TPU (--queued waits for capacity "
              "instead of failing)")
      except _StepFailed as e:
        raise TpuError(str(e)) from e
      launched = False
      continue
    if state not in HEALTHY:  # coming up, repairing, or gcloud could not tell
      sleep(poll_s)
      continue
    try:
      if not launched and run_status(tpu, shell) == "running":
        print(f"a run is going on {tpu.name} already: following it.", flush=True)
        launched = True
      if not launched:
        install(tpu, shell, setup, repo)
        launch(tpu, shell, command)
        launched = True
      shell.run(ssh_command(tpu, logs_script(), worker="0"))
      status = run_status(tpu, shell)
    except _StepFailed as e:
      if current_state(tpu, shell) in LOST:
        continue
      raise TpuError(str(e)) from e
    if status.lstrip("-").isdigit():
      print(f"the run on {tpu.name} ended with exit status {status}.", flush=True)
      return int(status)
    if status in ("stopped", "none"):  # the VM restarted (maintenance), or a kill
      relaunching(f"the run on {tpu.name} ended without an exit status ({status})")
      launched = False
      continue
    sleep(poll_s)  # still running (the ssh connection dropped), or the TPU is going away


def run_plan(tpu: Tpu, command: Sequence[str], setup: Setup = Setup(),
             repo: str = REPO) -> list[tuple[str, list[str]]]:
  """The commands of `supervise` when nothing goes wrong, each with what it is for (--dry_run)."""
  archive = archive_path(tpu)
  return [
      ("state: create unless READY/ACTIVE, delete first when PREEMPTED/SUSPENDED/FAILED",
       state_command(tpu)),
      ("create", create_command(tpu)),
      ("poll the state until READY/ACTIVE", state_command(tpu)),
      ("a run going on already (an existing TPU)? then follow it instead of launching",
       ssh_command(tpu, status_script(), worker="0")),
      ("pack the checkout", pack_command(archive, repo)),
      ("copy it to every worker", scp_command(tpu, archive)),
      ("install on every worker", ssh_command(tpu, install_script(setup))),
      ("launch on every worker", ssh_command(tpu, launch_script(command))),
      ("stream worker 0's log until the run ends", ssh_command(tpu, logs_script(), worker="0")),
      ("state: when lost (preempted), delete, create, install and launch the same command "
       "again: it resumes from its workdir", state_command(tpu)),
      ("exit status of the run (worker 0)", ssh_command(tpu, status_script(), worker="0")),
      ("teardown (unless --keep)", delete_command(tpu)),
  ]


# ------------------------------------------------------------------------------------------ CLI

VERBS = ("run", "create", "install", "launch", "logs", "status", "stop", "delete")


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
  """Splits `VERB --flags -- COMMAND...` into the parsed flags and the command."""
  argv = list(argv)
  command = argv[argv.index("--") + 1:] if "--" in argv else []
  own = argv[:argv.index("--")] if "--" in argv else argv
  parser = argparse.ArgumentParser(
      prog="python -m tpu.launch", description=__doc__.split("\n\n", 1)[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("verb", choices=VERBS, help="run = create + install + launch + logs, "
                      "recreating and relaunching after preemption, then delete.")
  parser.add_argument("--name", required=True, help="TPU (and queued resource) name.")
  parser.add_argument("--zone", required=True, help="e.g. us-central2-b")
  parser.add_argument("--project", default="", help="default: gcloud's core/project")
  parser.add_argument("--accelerator_type", default="", help="e.g. v4-8, v4-32, v5litepod-16 "
                      "(create, run)")
  parser.add_argument("--version", default="", help="TPU runtime, e.g. tpu-ubuntu2204-base, "
                      "v2-alpha-tpuv5-lite, v2-alpha-tpuv6e (create, run)")
  parser.add_argument("--spot", action="store_true", help="spot capacity: cheaper, preemptible")
  parser.add_argument("--queued", action="store_true", help="create through a queued resource "
                      "(waits for capacity); give it to every verb of that TPU")
  parser.add_argument("--extras", default=Setup.extras, help="the project's pip extras")
  parser.add_argument("--packages", default=",".join(Setup.packages),
                      help="more pip requirements, comma-separated")
  parser.add_argument("--python", default=Setup.python, help="the workers' Python (uv)")
  parser.add_argument("--worker_setup", default="", help="shell run on every worker before "
                      "installing, also on a recreated TPU: mount the shared filesystem here, "
                      "e.g. 'sudo mkdir -p /mnt/shared && sudo mount -t nfs 10.1.2.3:/vol "
                      "/mnt/shared'")
  parser.add_argument("--worker", default="0", help="logs: the worker whose log to follow")
  parser.add_argument("--poll_s", type=float, default=60.0, help="run: seconds between polls")
  parser.add_argument("--max_restarts", type=int, default=20,
                      help="run: recreations after preemption before giving up")
  parser.add_argument("--keep", action="store_true", help="run: keep the TPU at the end")
  parser.add_argument("--dry_run", action="store_true",
                      help="print every command instead of running it")
  args = parser.parse_args(own)
  if args.verb in ("run", "launch") and not command:
    parser.error(f"{args.verb} needs the command after --, e.g. -- python -m bertfam_jax.main "
                 "--config=configs/bert.py --workdir=/mnt/shared/bert")
  if args.verb not in ("run", "launch") and command:
    parser.error(f"{args.verb} takes no command (only run and launch do).")
  return args, command


def verb_commands(args: argparse.Namespace, tpu: Tpu, setup: Setup,
                  command: Sequence[str]) -> list[list[str]]:
  """The commands of a single-step verb (all but run), in order."""
  archive = archive_path(tpu)
  return {
      "create": lambda: [create_command(tpu)],
      "install": lambda: [pack_command(archive), scp_command(tpu, archive),
                          ssh_command(tpu, install_script(setup))],
      "launch": lambda: [ssh_command(tpu, launch_script(command))],
      "logs": lambda: [ssh_command(tpu, logs_script(), worker=args.worker)],
      "status": lambda: [state_command(tpu), ssh_command(tpu, status_script(), worker="0")],
      "stop": lambda: [ssh_command(tpu, stop_script())],
      "delete": lambda: [delete_command(tpu)],
  }[args.verb]()


def main(argv: Sequence[str]) -> int:
  args, command = parse_args(argv)
  tpu = Tpu(args.name, args.zone, args.accelerator_type, args.version, args.project, args.spot,
            args.queued)
  setup = Setup(args.extras, tuple(p for p in args.packages.split(",") if p), args.python,
                args.worker_setup)
  try:
    if args.dry_run:
      steps = (run_plan(tpu, command, setup) if args.verb == "run" else
               [("", c) for c in verb_commands(args, tpu, setup, command)])
      for why, argv_ in steps:
        if why:
          print(f"# {why}")
        print(shlex.join(argv_))
      return 0
    require_gcloud()
    shell = LocalShell()
    if args.verb == "run":
      return supervise(tpu, command, shell, setup=setup, poll_s=args.poll_s,
                       max_restarts=args.max_restarts, keep=args.keep)
    for argv_ in verb_commands(args, tpu, setup, command):
      rc = shell.run(argv_)
      if rc != 0:
        return rc
    return 0
  except TpuError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  except KeyboardInterrupt:
    print(f"\ninterrupted: {tpu.name} and its run are left as they are; `python -m tpu.launch "
          f"logs` follows the run, `python -m tpu.launch delete` tears the TPU down "
          f"(same --name/--zone{'/--queued' if tpu.queued else ''}).", file=sys.stderr)
    return 130


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
