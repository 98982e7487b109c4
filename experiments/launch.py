"""Launches an experiment's sweep (its ROWS: one Python list of (row name, overrides)) as one job
per row and seed, each `python -m experiments.<sweep> --rows=<row> --seeds=<seed>
--out=<out>/rows/<row>-seed<seed>`: here N at a time, on SLURM (one sbatch job each) or on Cloud
TPU (one TPU per row, its seeds one after another). `summary` merges the finished jobs into the
sweep's results.jsonl, table.md and plot.png with the experiment's own table code.

  # Here, two jobs at a time (on one GPU they share its memory; --gpus=0,1 gives each its own):
  python -m experiments.launch --sweep=t5_objectives --scale=gpu --parallel=2
  # SLURM: one single-process job per row and seed, requeued on preemption (--dry_run prints):
  python -m experiments.launch --sweep=t5_objectives --scale=gpu --backend=slurm \\
      --out=/shared/t5_gpu --partition=gpu --gpus_per_node=1 --time=4:00:00
  # Cloud TPU: one single-host TPU per row, 16 at a time, recreated after preemption:
  python -m experiments.launch --sweep=t5_objectives --scale=gpu --backend=tpu \\
      --out=/mnt/shared/t5_gpu --zone=us-central2-b --accelerator_type=v4-8 \\
      --version=tpu-ubuntu2204-base --queued --spot --parallel=16
  # The table of whatever has finished (rerun it as more rows finish):
  python -m experiments.launch summary --sweep=t5_objectives --scale=gpu --out=/shared/t5_gpu

Flags after `--` go to every job, e.g. `-- --config_overrides=model.dtype=bfloat16`.

Resuming: a rerun launches only the (row, seed) jobs not yet in any results.jsonl under --out
(SLURM: nor queued or running under the same job name); an interrupted job resumes its
pre-training from its workdir (<out>/runs, shared by the jobs). --out must be on storage that
every job sees; for TPU, a path on the workers' shared filesystem (where the launcher cannot see
it, every selected row is launched, and each job skips what its results.jsonl already holds).
"""

from __future__ import annotations

import argparse
import collections
import csv
import dataclasses
import getpass
import glob
import importlib
import io
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from typing import Callable, Sequence

from tpu import slurm

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SWEEPS = ("t5_objectives", "electra_ablation", "masking_schemes")
BACKENDS = ("local", "slurm", "tpu")


class LaunchError(Exception):
  """A launch cannot go ahead; the message names the fix."""


@dataclasses.dataclass(frozen=True)
class Job:
  """One row and seed of a sweep."""
  row: str
  seed: int

  @property
  def name(self) -> str:
    return f"{slug(self.row)}-seed{self.seed}"


# ------------------------------------------------------------------------------------- sweeps


def load_sweep(name: str):
  """The experiment module: a name of SWEEPS, or a dotted module path with the same interface
  (ROWS, SCALES, write_summary(results, out, scale_name), the experiments' flags)."""
  module_name = name if "." in name else f"experiments.{name}"
  try:
    module = importlib.import_module(module_name)
  except ModuleNotFoundError as e:
    if e.name != module_name:
      raise
    raise LaunchError(f"unknown sweep {name!r}: choose from {', '.join(SWEEPS)} (or give a "
                      "module path).") from e
  missing = [a for a in ("ROWS", "SCALES", "write_summary") if not hasattr(module, a)]
  if missing:
    raise LaunchError(f"{module_name} is not a sweep: it lacks {', '.join(missing)}.")
  return module


def short_name(sweep: str) -> str:
  """'t5_objectives' or 'my.pkg.t5_objectives' → 't5_objectives'."""
  return sweep.rsplit(".", 1)[-1]


def slug(name: str) -> str:
  """A row name as a file name: '★ Replace corrupted spans' → 'replace_corrupted_spans'."""
  return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def parse_list(value: str) -> list[str]:
  """A comma-separated flag value, with double quotes around items that hold commas (absl's
  list flags parse it the same way): 'a,"b, c"' → ['a', 'b, c']."""
  return [item.strip() for item in next(csv.reader([value]))] if value.strip() else []


def list_item(value: str) -> str:
  """The inverse of parse_list for one item: quoted when it holds a comma or a quote."""
  buffer = io.StringIO()
  csv.writer(buffer, lineterminator="").writerow([value])
  return buffer.getvalue()


def select_jobs(rows: Sequence[tuple], selected: Sequence[str], seeds: Sequence[int]) -> list[Job]:
  """The (row, seed) jobs, seeds outermost (as run_sweep: every row of a seed before the next
  seed), rows in ROWS order. Raises LaunchError for an unknown row or clashing file names."""
  names = [name for name, _ in rows]
  unknown = [s for s in selected if s not in names]
  if unknown:
    raise LaunchError(f"unknown rows {unknown}; choose from {names}.")
  slugs = collections.Counter(slug(n) for n in names)
  clashing = [n for n in names if slugs[slug(n)] > 1]
  if clashing:
    raise LaunchError(f"rows {clashing} share the directory name {slug(clashing[0])!r}: rename "
                      "one in ROWS.")
  return [Job(name, seed) for seed in seeds for name in names if name in selected]


def read_jsonl(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def merged_results(out: str) -> list[dict]:
  """Every result under OUT: OUT/results.jsonl (a sweep run in one process, or an earlier
  summary) and each job's OUT/rows/*/results.jsonl; the first record of a (row, seed) wins."""
  results, seen = [], set()
  paths = [os.path.join(out, "results.jsonl"),
           *sorted(glob.glob(os.path.join(out, "rows", "*", "results.jsonl")))]
  for path in paths:
    for record in read_jsonl(path):
      key = (record["row"], record["seed"])
      if key not in seen:
        seen.add(key)
        results.append(record)
  return results


def row_command(python: str, module: str, job: Job, scale: str, out: str, workdirs: str,
                extra: Sequence[str]) -> list[str]:
  """The command of one job: the experiment on one row and seed, in its own output directory."""
  return [python, "-m", module, f"--scale={scale}", f"--rows={list_item(job.row)}",
          f"--seeds={job.seed}", f"--out={os.path.join(out, 'rows', job.name)}",
          f"--workdirs={workdirs}", *extra]


# --------------------------------------------------------------------------------------- local


def job_env(slot: int, parallel: int, gpus: Sequence[str], base: dict[str, str]) -> dict[str, str]:
  """The environment of the job in `slot` (0 .. parallel-1): the checkout on PYTHONPATH; with
  `gpus`, its own GPU (round-robin); jobs sharing a GPU split its memory (JAX would otherwise
  preallocate 75% of it in each), unless XLA_PYTHON_CLIENT_MEM_FRACTION is set already."""
  env = dict(base, PYTHONPATH=os.pathsep.join(p for p in (REPO, base.get("PYTHONPATH")) if p))
  if gpus:
    env["CUDA_VISIBLE_DEVICES"] = gpus[slot % len(gpus)]
  sharing = math.ceil(parallel / len(gpus)) if gpus else parallel
  if sharing > 1 and "XLA_PYTHON_CLIENT_MEM_FRACTION" not in base:
    env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{0.9 / sharing:.2f}"
  return env


def run_local(commands: Sequence[tuple[str, list[str]]], parallel: int, log_dir: str,
              env: Callable[[int], dict[str, str]], poll_s: float = 0.5) -> list[str]:
  """Runs (name, command) pairs `parallel` at a time from the checkout, each one's output in
  LOG_DIR/<name>.log; returns the names of those that failed. Ctrl-C ends the running ones
  (their workdirs resume on the next launch)."""
  os.makedirs(log_dir, exist_ok=True)
  pending, running, failed = collections.deque(commands), {}, []
  total, done = len(commands), 0
  try:
    while pending or running:
      for slot in range(parallel):
        if slot not in running and pending:
          name, command = pending.popleft()
          log_path = os.path.join(log_dir, f"{name}.log")
          log = open(log_path, "a")  # pylint: disable=consider-using-with
          log.write(f"$ {shlex.join(command)}\n")
          log.flush()
          process = subprocess.Popen(command, cwd=REPO, env=env(slot), stdout=log,
                                     stderr=subprocess.STDOUT)
          running[slot] = (name, process, log, time.time())
          print(f"started  {name} (log {log_path})", flush=True)
      time.sleep(poll_s)
      for slot, (name, process, log, start) in list(running.items()):
        if process.poll() is None:
          continue
        log.close()
        del running[slot]
        done += 1
        minutes = (time.time() - start) / 60
        if process.returncode == 0:
          print(f"finished {name} [{done}/{total}] in {minutes:.1f} min", flush=True)
        else:
          failed.append(name)
          print(f"FAILED   {name} [{done}/{total}] (exit status {process.returncode}) after "
                f"{minutes:.1f} min: see {os.path.join(log_dir, name + '.log')}", flush=True)
  except KeyboardInterrupt:
    for name, process, log, _ in running.values():
      process.terminate()
      process.wait()
      log.close()
    raise
  return failed


# --------------------------------------------------------------------------------- SLURM, TPU


def slurm_job(job_name: str, command: Sequence[str], log_dir: str,
              args: argparse.Namespace) -> slurm.SlurmJob:
  """One job of the sweep on SLURM: one process on one node with --gpus_per_node GPUs (the
  experiments run single-process)."""
  return slurm.SlurmJob(job_name, tuple(command), log_dir, nodes=1,
                        gpus_per_node=args.gpus_per_node, tasks_per_node=1,
                        cpus_per_task=args.cpus_per_task, time=args.time,
                        partition=args.partition, account=args.account, setup=args.setup,
                        sbatch_args=tuple(args.sbatch_arg))


def active_slurm_jobs() -> set[str]:
  """Names of this user's queued or running SLURM jobs."""
  result = subprocess.run(["squeue", "--noheader", "--format=%j", f"--user={getpass.getuser()}"],
                          capture_output=True, text=True, check=False)
  if result.returncode != 0:
    raise LaunchError(f"squeue failed ({result.stderr.strip()}): run this on the cluster's login "
                      "node, or pass --dry_run.")
  return set(result.stdout.split())


def tpu_name(prefix: str, row: str) -> str:
  """A TPU name for a row: lowercase letters, digits and hyphens, at most 63 characters."""
  return f"{prefix}-{slug(row)}".replace("_", "-")[:63].rstrip("-")


def tpu_command(python: str, name: str, commands: Sequence[Sequence[str]],
                args: argparse.Namespace) -> list[str]:
  """`python -m tpu.launch run` for one row: its seeds' commands one after another on one TPU."""
  flags = [f"--name={name}", f"--zone={args.zone}", f"--accelerator_type={args.accelerator_type}",
           f"--version={args.version}"]
  flags += [f"--project={args.project}"] if args.project else []
  flags += ["--spot"] if args.spot else []
  flags += ["--queued"] if args.queued else []
  flags += [f"--worker_setup={args.worker_setup}"] if args.worker_setup else []
  return [python, "-m", "tpu.launch", "run", *flags, "--", "bash", "-c",
          " && ".join(shlex.join(c) for c in commands)]


# ------------------------------------------------------------------------------------ commands


def launch(args: argparse.Namespace, extra: Sequence[str]) -> int:
  """Launches the jobs not finished yet; returns the exit status."""
  module = load_sweep(args.sweep)
  if args.scale not in module.SCALES:
    raise LaunchError(f"unknown scale {args.scale!r}; {args.sweep} has {sorted(module.SCALES)}.")
  rows = [name for name, _ in module.ROWS]
  selected = parse_list(args.rows) if args.rows else rows
  jobs = select_jobs(module.ROWS, selected, [int(s) for s in parse_list(args.seeds)])
  out = output_dir(args)
  workdirs = args.workdirs or os.path.join(out, "runs")
  log_dir = args.log_dir or os.path.join(out, "logs")
  finished = {(r["row"], r["seed"]) for r in merged_results(out)}
  todo = [job for job in jobs if (job.row, job.seed) not in finished]
  print(f"# {args.sweep} at scale {args.scale}: {len(jobs) - len(todo)} of {len(jobs)} jobs "
        f"finished under {out}; launching {len(todo)} ({args.backend}).", flush=True)
  remote_python = "python" if args.backend == "tpu" else args.python
  command = {job: row_command(remote_python, module.__name__, job, args.scale, out, workdirs,
                              extra) for job in todo}
  if args.backend == "local":
    named = [(job.name, command[job]) for job in todo]
    if args.dry_run:
      for _, c in named:
        print(shlex.join(c))
      return 0
    gpus = parse_list(args.gpus)
    failed = run_local(named, args.parallel, log_dir,
                       lambda slot: job_env(slot, args.parallel, gpus, dict(os.environ)))
  elif args.backend == "slurm":
    return launch_slurm(args, todo, command, log_dir)
  else:
    failed = launch_tpu(args, todo, command, log_dir)
  if failed:
    print(f"{len(failed)} job(s) failed: {', '.join(failed)}. A rerun launches them again.",
          file=sys.stderr)
    return 1
  return 0


def launch_slurm(args: argparse.Namespace, todo: Sequence[Job], command: dict,
                 log_dir: str) -> int:
  """Submits one sbatch job per (row, seed), skipping those already queued or running."""
  jobs = [slurm_job(f"{short_name(args.sweep)}-{job.name}", command[job], log_dir, args)
          for job in todo]
  if args.dry_run:
    print("# (jobs already queued or running under their name are skipped: squeue)")
    for job in jobs:
      print(slurm.dry_run_text(job), end="")
    return 0
  active = active_slurm_jobs()
  for job in jobs:
    if job.name in active:
      print(f"queued or running already: {job.name}")
    else:
      print(f"submitted {job.name}: job {slurm.submit(job)}", flush=True)
  return 0


def launch_tpu(args: argparse.Namespace, todo: Sequence[Job], command: dict,
               log_dir: str) -> list[str]:
  """One `tpu.launch run` per row (its unfinished seeds in turn), --parallel at a time, each
  supervisor's output in LOG_DIR/<row>.log; returns the rows that failed."""
  if not (args.zone and args.accelerator_type and args.version):
    raise LaunchError("--backend=tpu needs --zone, --accelerator_type (a single-host slice such "
                      "as v4-8: the experiments run single-process) and --version.")
  if not os.path.isabs(args.out):
    raise LaunchError("--backend=tpu needs --out, an absolute path on the workers' shared "
                      "filesystem (a recreated TPU finds the rows' workdirs there).")
  prefix = args.tpu_prefix or short_name(args.sweep).replace("_", "-")
  by_row = collections.defaultdict(list)
  for job in todo:
    by_row[job.row].append(command[job])
  names = {row: tpu_name(prefix, row) for row in by_row}
  if len(set(names.values())) < len(names):
    raise LaunchError(f"rows get the same TPU name under prefix {prefix!r}: give a shorter "
                      "--tpu_prefix.")
  commands = [(slug(row), tpu_command(args.python, names[row], cmds, args))
              for row, cmds in by_row.items()]
  if args.dry_run:
    for _, c in commands:
      print(shlex.join(c))
    return []
  return run_local(commands, args.parallel, log_dir,
                   lambda slot: job_env(slot, 1, [], dict(os.environ)))


def summary(args: argparse.Namespace) -> int:
  """Merges the finished jobs into OUT/results.jsonl and writes the experiment's report there
  (table.md, meta.json, plot.png, curves.png); prints the table and the rows still missing."""
  module = load_sweep(args.sweep)
  if args.scale not in module.SCALES:
    raise LaunchError(f"unknown scale {args.scale!r}; {args.sweep} has {sorted(module.SCALES)}.")
  out = output_dir(args)
  results = merged_results(out)
  if not results:
    raise LaunchError(f"no results under {out} yet (OUT/results.jsonl, OUT/rows/*/"
                      "results.jsonl): check --out and --scale.")
  rows = [name for name, _ in module.ROWS]
  results.sort(key=lambda r: (r["seed"], rows.index(r["row"]) if r["row"] in rows else len(rows)))
  path = os.path.join(out, "results.jsonl")
  with open(path + ".tmp", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in results)
  os.replace(path + ".tmp", path)
  try:
    print(module.write_summary(results, out, args.scale))
  except ValueError as e:   # records the experiment cannot report, e.g. an older format's
    raise LaunchError(f"{out}: {e}") from None
  have = {r["row"] for r in results}
  print(f"{len(results)} results in {path}; rows without any: "
        f"{[r for r in rows if r not in have] or 'none'}.")
  return 0


def output_dir(args: argparse.Namespace) -> str:
  """--out, by default the experiment's own (experiments/results/<sweep>/<scale>); absolute
  for the local and SLURM jobs, as given for TPU workers."""
  out = args.out or os.path.join("experiments", "results", short_name(args.sweep), args.scale)
  return out if args.backend == "tpu" else os.path.abspath(out)


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
  """Splits `[run|summary] --flags -- SWEEP_FLAGS...` into the parsed flags and the extra
  flags for every job."""
  argv = list(argv)
  extra = argv[argv.index("--") + 1:] if "--" in argv else []
  own = argv[:argv.index("--")] if "--" in argv else argv
  parser = argparse.ArgumentParser(prog="python -m experiments.launch",
                                   description=__doc__.split("\n\n", 1)[0])
  parser.add_argument("action", nargs="?", default="run", choices=("run", "summary"))
  parser.add_argument("--sweep", required=True, help=f"one of {', '.join(SWEEPS)}")
  parser.add_argument("--scale", default="", help="one of the experiment's SCALES (default: "
                      "its first)")
  parser.add_argument("--rows", default="", help="rows to run (default all), comma-separated, "
                      "names holding commas in double quotes (as the experiments' --rows)")
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--out", default="", help="default experiments/results/<sweep>/<scale>")
  parser.add_argument("--workdirs", default="", help="pre-training workdirs (default <out>/runs)")
  parser.add_argument("--log_dir", default="", help="the jobs' logs (default <out>/logs)")
  parser.add_argument("--backend", default="local", choices=BACKENDS)
  parser.add_argument("--parallel", type=int, default=1, help="local / tpu: jobs at a time")
  parser.add_argument("--gpus", default="", help="local: GPU ids handed to the jobs in turn, "
                      "e.g. 0,1,2,3 (default: every job sees every GPU)")
  parser.add_argument("--python", default=sys.executable, help="the jobs' Python (local, "
                      "SLURM); also runs tpu.launch")
  parser.add_argument("--dry_run", action="store_true", help="print the jobs, launch nothing")
  slurm.add_job_flags(parser)
  for flag, help_ in (("zone", "e.g. us-central2-b"), ("accelerator_type", "e.g. v4-8"),
                      ("version", "TPU runtime, e.g. tpu-ubuntu2204-base"), ("project", ""),
                      ("tpu_prefix", "TPU names: <prefix>-<row> (default: the sweep's name)")):
    parser.add_argument(f"--{flag}", default="", help=f"tpu: {help_}")
  parser.add_argument("--worker_setup", default="", help="tpu: shell run on every worker "
                      "before installing (mount the shared filesystem); see tpu.launch")
  parser.add_argument("--spot", action="store_true", help="tpu: spot capacity")
  parser.add_argument("--queued", action="store_true", help="tpu: through queued resources")
  args = parser.parse_args(own)
  if args.parallel < 1:
    parser.error("--parallel must be at least 1.")
  return args, extra


def main(argv: Sequence[str]) -> int:
  args, extra = parse_args(argv)
  try:
    args.scale = args.scale or next(iter(load_sweep(args.sweep).SCALES))
    return summary(args) if args.action == "summary" else launch(args, extra)
  except (LaunchError, slurm.SlurmError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  except KeyboardInterrupt:
    print("\ninterrupted: the running jobs were ended (local: a rerun resumes them; TPU: the "
          "runs go on on their TPUs, and a rerun follows them again).", file=sys.stderr)
    return 130


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
