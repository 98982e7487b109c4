"""experiments/launch.py: local jobs N at a time (a fake sweep with the experiments' command line
that trains nothing), resume and summary; the SLURM and TPU jobs (--dry_run); the real sweeps'
interface."""

import inspect
import json
import os
import re
import shlex
import sys
import textwrap

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

from experiments import launch  # noqa: E402

# The experiments' interface (ROWS, SCALES, write_summary, absl list flags) without training:
# each job records its row, seed, extra flag, start and end times and memory fraction.
FAKE_SWEEP = textwrap.dedent('''
    import json, os, sys, time
    from absl import app, flags

    ROWS = [("A", dict(x=1)), ("B, with comma", dict(x=2)), ("★ C", None)]
    SCALES = {"tiny": {}}

    def write_summary(results, out, scale_name):
      text = scale_name + ": " + ", ".join(f"{r['row']}/{r['seed']}" for r in results)
      with open(os.path.join(out, "table.md"), "w") as f:
        f.write(text)
      return text

    def main(argv):
      f = flags.FLAGS
      os.makedirs(f.out, exist_ok=True)
      start = time.time()
      time.sleep(0.4)
      for row in f.rows:
        if row == os.environ.get("FAKE_FAIL"):
          sys.exit(3)
        for seed in f.seeds:
          with open(os.path.join(f.out, "results.jsonl"), "a") as fh:
            fh.write(json.dumps(dict(row=row, seed=int(seed), scale=f.scale, extra=f.extra,
                                     workdirs=f.workdirs, start=start, end=time.time(),
                                     memory=os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")))
                     + "\\n")

    if __name__ == "__main__":
      flags.DEFINE_string("scale", "tiny", "")
      flags.DEFINE_list("rows", [n for n, _ in ROWS], "")
      flags.DEFINE_list("seeds", ["0"], "")
      flags.DEFINE_string("out", "", "")
      flags.DEFINE_string("workdirs", "", "")
      flags.DEFINE_integer("extra", 0, "")
      app.run(main)
''')
ROW_NAMES = ["A", "B, with comma", "★ C"]


@pytest.fixture
def fake_sweep(tmp_path, monkeypatch):
  """The fake sweep importable here and in the jobs (PYTHONPATH); returns an output dir."""
  (tmp_path / "fake_experiments").mkdir()
  (tmp_path / "fake_experiments" / "__init__.py").write_text("")
  (tmp_path / "fake_experiments" / "fake_sweep.py").write_text(FAKE_SWEEP)
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setenv("PYTHONPATH", str(tmp_path))
  monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
  return tmp_path / "out"


def run(*args):
  return launch.main(["--sweep=fake_experiments.fake_sweep", "--scale=tiny", *args])


def test_local_jobs_two_at_a_time_resume_and_summary(fake_sweep, capsys, monkeypatch):
  monkeypatch.setenv("FAKE_FAIL", "★ C")
  assert run(f"--out={fake_sweep}", "--seeds=0", "--parallel=2", "--", "--extra=7") == 1
  assert "1 job(s) failed: c-seed0" in capsys.readouterr().err
  jobs = sorted(j for j in os.listdir(fake_sweep / "rows")
                if (fake_sweep / "rows" / j / "results.jsonl").exists())
  assert jobs == ["a-seed0", "b_with_comma-seed0"]
  records = [json.loads((fake_sweep / "rows" / j / "results.jsonl").read_text()) for j in jobs]
  # Each job ran its own row (the comma survives absl's list flag), the extra flag, the shared
  # workdirs, and the two overlapped, splitting the memory of a shared GPU.
  assert [r["row"] for r in records] == ["A", "B, with comma"]
  assert all(r["extra"] == 7 and r["workdirs"] == str(fake_sweep / "runs") for r in records)
  assert records[0]["start"] < records[1]["end"] and records[1]["start"] < records[0]["end"]
  assert [r["memory"] for r in records] == ["0.45", "0.45"]
  assert "'--rows=★ C' --seeds=0" in (fake_sweep / "logs" / "c-seed0.log").read_text()
  # The rerun launches only the failed job.
  monkeypatch.delenv("FAKE_FAIL")
  assert run(f"--out={fake_sweep}", "--seeds=0", "--parallel=2") == 0
  out = capsys.readouterr().out
  assert "2 of 3 jobs finished" in out and out.count("started ") == 1 and "c-seed0" in out
  # Summary: every job's results merged into OUT/results.jsonl, then the sweep's own table.
  assert run("summary", f"--out={fake_sweep}") == 0
  merged = [json.loads(line) for line in (fake_sweep / "results.jsonl").read_text().splitlines()]
  assert [r["row"] for r in merged] == ROW_NAMES
  assert (fake_sweep / "table.md").read_text() == "tiny: A/0, B, with comma/0, ★ C/0"
  assert run(f"--out={fake_sweep}", "--seeds=0") == 0  # nothing left to do
  assert "3 of 3 jobs finished" in capsys.readouterr().out


def test_local_dry_run_and_gpus(fake_sweep, capsys):
  assert run(f"--out={fake_sweep}", "--seeds=0,1", '--rows="B, with comma"', "--dry_run") == 0
  commands = [shlex.split(line) for line in capsys.readouterr().out.splitlines()
              if not line.startswith("#")]
  assert [c[2:] for c in commands] == [
      ["fake_experiments.fake_sweep", "--scale=tiny", '--rows="B, with comma"', f"--seeds={seed}",
       f"--out={fake_sweep}/rows/b_with_comma-seed{seed}", f"--workdirs={fake_sweep}/runs"]
      for seed in (0, 1)]
  assert not fake_sweep.exists()
  env = [launch.job_env(slot, 4, ["0", "1"], {"PYTHONPATH": "/x"}) for slot in range(4)]
  assert [e["CUDA_VISIBLE_DEVICES"] for e in env] == ["0", "1", "0", "1"]
  assert env[0]["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.45"
  assert env[0]["PYTHONPATH"] == f"{launch.REPO}{os.pathsep}/x"
  assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in launch.job_env(0, 2, ["0", "1"], {})


def test_slurm_one_job_per_row_and_seed_skipping_finished(fake_sweep, capsys):
  done = fake_sweep / "rows" / "a-seed0"
  done.mkdir(parents=True)
  (done / "results.jsonl").write_text(json.dumps(dict(row="A", seed=0)) + "\n")
  assert run(f"--out={fake_sweep}", "--seeds=0,1", "--backend=slurm", "--gpus_per_node=2",
             "--partition=gpu", "--time=2:00:00", "--dry_run") == 0
  out = capsys.readouterr().out
  names = re.findall(r"#SBATCH --job-name=(\S+)", out)
  assert names == ["fake_sweep-b_with_comma-seed0", "fake_sweep-c-seed0", "fake_sweep-a-seed1",
                   "fake_sweep-b_with_comma-seed1", "fake_sweep-c-seed1"]
  assert out.count("#SBATCH --ntasks-per-node=1\n") == 5
  assert out.count("#SBATCH --gpus-per-node=2\n") == 5 and "#SBATCH --requeue" in out
  srun = [shlex.split(line) for line in out.splitlines() if line.startswith("srun ")]
  assert srun[0][2:] == [sys.executable, "-m", "fake_experiments.fake_sweep", "--scale=tiny",
                         '--rows="B, with comma"', "--seeds=0",
                         f"--out={fake_sweep}/rows/b_with_comma-seed0",
                         f"--workdirs={fake_sweep}/runs", "&"]
  assert f"sbatch --parsable {fake_sweep}/logs/fake_sweep-c-seed1.sbatch" in out


def test_tpu_one_tpu_per_row_with_its_seeds(capsys, fake_sweep):
  tpu = ["--backend=tpu", "--zone=us-central2-b", "--accelerator_type=v4-8",
         "--version=tpu-ubuntu2204-base", "--spot", "--queued", "--dry_run", "--seeds=0,1",
         "--worker_setup=sudo mount /mnt/shared"]
  assert run("--out=/mnt/shared/sweep", *tpu, "--", "--extra=7") == 0
  lines = [shlex.split(line) for line in capsys.readouterr().out.splitlines()
           if not line.startswith("#")]
  assert len(lines) == 3  # one TPU per row
  for command, row in zip(lines, ROW_NAMES):
    assert command[1:4] == ["-m", "tpu.launch", "run"] and "--spot" in command
    assert "--worker_setup=sudo mount /mnt/shared" in command
    name = command[4].removeprefix("--name=")
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and name.startswith("fake-sweep-")
    assert command[command.index("--") + 1:command.index("--") + 3] == ["bash", "-c"]
    seeds = [shlex.split(c) for c in command[-1].split(" && ")]
    assert [s[:3] for s in seeds] == [["python", "-m", "fake_experiments.fake_sweep"]] * 2
    assert [s[5] for s in seeds] == ["--seeds=0", "--seeds=1"]
    assert all(s[4] == f"--rows={launch.list_item(row)}" and s[-1] == "--extra=7" and
               s[7] == "--workdirs=/mnt/shared/sweep/runs" for s in seeds)
  assert run("--out=relative/dir", *tpu) == 1
  assert "absolute path" in capsys.readouterr().err


def test_errors_name_the_fix(fake_sweep, capsys):
  assert launch.main(["--sweep=no_such_sweep", "--dry_run"]) == 1
  assert "unknown sweep 'no_such_sweep'" in capsys.readouterr().err
  assert run("--rows=D", "--dry_run") == 1
  assert "unknown rows ['D']" in capsys.readouterr().err
  assert run("--scale=huge", "--dry_run") == 1
  assert "unknown scale 'huge'" in capsys.readouterr().err
  assert run("summary", f"--out={fake_sweep}") == 1
  assert "no results under" in capsys.readouterr().err


def _encoder_record(row, seed, accuracy, **extra):
  """A results.jsonl record of an encoder experiment (`experiments/common.py`), 10 examples."""
  correct = [1] * round(10 * accuracy) + [0] * (10 - round(10 * accuracy))
  examples = {task: {"accuracy": correct, "target_nll": [1.5] * 10}
              for task in ("wordnet_supersense", "probe")}
  metrics = {f"{task}/{key}": value for task in examples
             for key, value in (("accuracy", accuracy), ("target_loss", 1.5))}
  return json.dumps(dict(row=row, seed=seed, metrics=metrics, examples=examples, degenerate=[],
                         total_seconds=10.0, **extra)) + "\n"


def test_the_experiments_are_sweeps(tmp_path, capsys):
  """Importing all three together defines no flag twice; each has distinct row directories and
  writes its own table from merged results."""
  modules = {name: launch.load_sweep(name) for name in launch.SWEEPS}
  for module in modules.values():
    launch.select_jobs(module.ROWS, [n for n, _ in module.ROWS], [0])
  # `summary` calls write_summary(results, out, scale) of any experiment (representations' once
  # needed a fourth argument, a TypeError).
  for name in (*launch.SWEEPS, "t5_architectures", "compression", "representations"):
    inspect.signature(launch.load_sweep(name).write_summary).bind([], str(tmp_path), "cpu")
  out = tmp_path / "masking"
  for seed in (0, 1):
    job = out / "rows" / f"whole_words-seed{seed}"
    job.mkdir(parents=True)
    (job / "results.jsonl").write_text(_encoder_record("Whole Words", seed, 0.5 + 0.1 * seed))
  assert launch.main(["summary", "--sweep=masking_schemes", "--scale=gpu", f"--out={out}"]) == 0
  assert "| Whole Words | 55.0 ± 63.5 |" in (out / "table.md").read_text()
  assert (out / "plot.png").stat().st_size > 0
  assert "rows without any: ['Subword Tokens'" in capsys.readouterr().out
  # A job of the floor alone: its table (no floor check possible without pre-trained rows).
  floor = tmp_path / "electra" / "rows" / "no_pre_training-seed0"
  floor.mkdir(parents=True)
  (floor / "results.jsonl").write_text(_encoder_record("No pre-training", 0, 0.2,
                                                       pretrain_steps=0, train_flops=0.0))
  modules["electra_ablation"].write_summary(launch.merged_results(str(floor.parent.parent)),
                                            str(floor), "cpu")
  assert (floor / "plot.png").stat().st_size > 0
  assert "| No pre-training | 20.0 |" in (floor / "table.md").read_text()
  # Records of an older format (no per-example scores): one line naming the fix.
  stale = tmp_path / "stale"
  stale.mkdir()
  (stale / "results.jsonl").write_text(json.dumps(dict(row="BERT", seed=0, accuracy=0.2)) + "\n")
  assert launch.main(["summary", "--sweep=electra_ablation", "--scale=cpu", f"--out={stale}"]) == 1
  assert "hold no per-example scores" in capsys.readouterr().err
  assert launch.main(["summary", "--sweep=electra_ablation", "--scale=runlocal",
                      f"--out={stale}"]) == 1
  assert "unknown scale 'runlocal'" in capsys.readouterr().err
