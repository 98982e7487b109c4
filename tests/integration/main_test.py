"""The real CLI as a subprocess: SIGKILL/SIGTERM then resume reproduce an uninterrupted run, and
refusals exit non-zero with one line naming the fix, leaving the workdir as it was.

Subprocesses inherit conftest's 8 CPU devices and private BERTFAM_CACHE.
"""

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from helpers.run_records import damage_array_files, metric_records

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A model that compiles in seconds on real text: 512-piece tokenizer, 32-token rows, batch 8.
_TINY = ("--config.model.hidden=32", "--config.model.layers=2", "--config.model.heads=2",
         "--config.model.mlp=64", "--config.model.vocab_size=512",
         "--config.model.max_positions=32", "--config.data.seq_len=32",
         "--config.objective.max_predictions=5", "--config.train.batch_size=8",
         "--config.optimizer.warmup_steps=5")
_STEPS = 60
_CHECKPOINT_EVERY = 10
_LONG_RUN = (f"--config.train.total_steps={_STEPS}", "--config.train.log_every=1",
             f"--config.train.checkpoint_every={_CHECKPOINT_EVERY}")
_RUN_TIMEOUT_S = 400      # generous: other test processes share the 2 cores
_STOP_TIMEOUT_S = 120     # from SIGTERM to exit: one step, a checkpoint and shutdown


def _command(workdir, *overrides, config="configs/roberta.py:runlocal"):
  return [sys.executable, "-m", "bertfam_jax.main", f"--config={config}", f"--workdir={workdir}",
          *_TINY, *overrides]


def _env():
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [_REPO, env.get("PYTHONPATH")]))
  return env


def _run(command, timeout=_RUN_TIMEOUT_S):
  return subprocess.run(command, cwd=_REPO, env=_env(), capture_output=True, text=True,
                        timeout=timeout, check=False)


def _start(command, log_dir):
  """Starts `command` in the background with stdout/stderr in `log_dir` (never a full pipe)."""
  with open(os.path.join(log_dir, "stdout"), "w") as out, \
       open(os.path.join(log_dir, "stderr"), "w") as err:
    return subprocess.Popen(command, cwd=_REPO, env=_env(), stdout=out, stderr=err)


def _tail(text, lines=20):
  return "\n".join(text.strip().splitlines()[-lines:])


def _log_tail(log_dir):
  with open(os.path.join(log_dir, "stderr")) as f:
    return _tail(f.read())


def _assert_ok(result):
  assert result.returncode == 0, f"exit {result.returncode}:\n{_tail(result.stderr)}"


def _train_records(workdir, complete_only=False):
  """(step, loss) of every train record in metrics.jsonl, in file order (eval records have no
  'loss'). `complete_only` skips a last line that is still being written."""
  return [(r["step"], r["loss"]) for r in metric_records(workdir, complete_only) if "loss" in r]


def _wait_for_step(process, workdir, min_step, log_dir):
  """Polls metrics.jsonl until a step >= `min_step` is logged; returns that step."""
  deadline = time.monotonic() + _RUN_TIMEOUT_S
  while time.monotonic() < deadline:
    records = _train_records(workdir, complete_only=True)
    if records and records[-1][0] >= min_step:
      return records[-1][0]
    if process.poll() is not None:
      pytest.fail(f"exited {process.returncode} before logging step {min_step}:\n"
                  f"{_log_tail(log_dir)}")
    time.sleep(0.05)
  process.kill()
  process.wait()
  pytest.fail(f"step {min_step} not logged within {_RUN_TIMEOUT_S} s")


def _assert_reproduces(workdir, reference):
  """Every step 1..N logged exactly once, with the reference run's loss bit for bit."""
  records = _train_records(workdir)
  assert [s for s, _ in records] == list(range(1, _STEPS + 1))
  assert dict(records) == dict(_train_records(reference))


def _digest(root):
  """{relative path: sha256} of every file under `root`."""
  out = {}
  for dirpath, _, filenames in os.walk(root):
    for name in filenames:
      path = os.path.join(dirpath, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
  return out


def _assert_config_error(result, *fragments):
  """Exit 2 with `error: ...` naming the fix as the last line of stderr, and no traceback."""
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert result.returncode == 2, f"exit {result.returncode}:\n{_tail(result.stderr)}"
  assert "Traceback" not in result.stderr, result.stderr
  assert lines and lines[-1].startswith("error: "), result.stderr
  for fragment in fragments:
    assert fragment in lines[-1], (fragment, lines[-1])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("uninterrupted"))
  _assert_ok(_run(_command(workdir, *_LONG_RUN)))
  return workdir


@pytest.fixture(scope="module")
def bert_workdir(tmp_path_factory):
  """A finished 4-step BERT run with checkpoints at steps 2 and 4."""
  workdir = str(tmp_path_factory.mktemp("bert"))
  _assert_ok(_run(_command(workdir, "--config.train.total_steps=4", "--config.train.log_every=1",
                           "--config.train.checkpoint_every=2", config="configs/bert.py:runlocal")))
  return workdir


def test_the_run_learns(uninterrupted):
  losses = [loss for _, loss in _train_records(uninterrupted)]
  assert len(losses) == _STEPS
  assert sum(losses[-20:]) / 20 < sum(losses[:20]) / 20


def test_sigkill_then_resume_equals_uninterrupted(uninterrupted, tmp_path):
  workdir, logs = str(tmp_path / "workdir"), str(tmp_path)
  command = _command(workdir, *_LONG_RUN)
  process = _start(command, logs)
  _wait_for_step(process, workdir, _CHECKPOINT_EVERY + 1, logs)
  process.kill()
  assert process.wait(timeout=_STOP_TIMEOUT_S) == -signal.SIGKILL
  last_before_kill = _train_records(workdir, complete_only=True)[-1][0]
  assert _CHECKPOINT_EVERY < last_before_kill < _STEPS

  _assert_ok(_run(command))
  _assert_reproduces(workdir, uninterrupted)


def test_sigterm_saves_stops_and_resumes(uninterrupted, tmp_path):
  workdir, logs = str(tmp_path / "workdir"), str(tmp_path)
  command = _command(workdir, *_LONG_RUN)
  process = _start(command, logs)
  _wait_for_step(process, workdir, 1, logs)  # the loop, and with it the SIGTERM handler, runs
  process.send_signal(signal.SIGTERM)
  try:
    returncode = process.wait(timeout=_STOP_TIMEOUT_S)
  except subprocess.TimeoutExpired:
    process.kill()
    process.wait()
    pytest.fail(f"still running {_STOP_TIMEOUT_S} s after SIGTERM:\n{_log_tail(logs)}")
  assert returncode == 0, _log_tail(logs)
  stopped_at = _train_records(workdir)[-1][0]
  assert stopped_at < _STEPS
  # Orbax renames a checkpoint to its bare step number only once it is complete.
  assert str(stopped_at) in os.listdir(os.path.join(workdir, "checkpoints"))

  _assert_ok(_run(command))
  _assert_reproduces(workdir, uninterrupted)


def test_unknown_config_key(tmp_path):
  workdir = str(tmp_path / "workdir")
  result = _run(_command(workdir, "--config.train.not_a_key=1"))
  assert result.returncode != 0
  assert "Traceback" not in result.stderr, _tail(result.stderr)
  assert "not_a_key" in result.stderr, result.stderr
  assert not os.path.exists(workdir)


def test_paper_recipe_without_data(tmp_path):
  data_dir, workdir = tmp_path / "tfds", str(tmp_path / "workdir")
  data_dir.mkdir()
  result = _run([sys.executable, "-m", "bertfam_jax.main", "--config=configs/roberta.py",
                 f"--workdir={workdir}", f"--config.data.tfds_data_dir={data_dir}"], timeout=60)
  _assert_config_error(result, "tfds build", "data_dir", ":runlocal")
  assert not os.path.exists(workdir) or not os.listdir(workdir)


def test_other_model_on_an_existing_workdir(bert_workdir, tmp_path):
  workdir = str(tmp_path / "workdir")
  shutil.copytree(bert_workdir, workdir)
  before = _digest(workdir)
  assert any(path.startswith("checkpoints") for path in before)
  assert "config.json" in before and "metrics.jsonl" in before
  result = _run(_command(workdir, "--config.train.total_steps=4", "--config.model.hidden=64",
                         config="configs/bert.py:runlocal"))
  _assert_config_error(result, "model.hidden", "--workdir")
  assert _digest(workdir) == before


def test_corrupt_checkpoint(bert_workdir, tmp_path):
  workdir = str(tmp_path / "workdir")
  shutil.copytree(bert_workdir, workdir)
  checkpoint = os.path.join(workdir, "checkpoints", "4")
  assert damage_array_files(checkpoint)
  before = _digest(workdir)
  result = _run(_command(workdir, "--config.train.total_steps=8",
                         config="configs/bert.py:runlocal"))
  _assert_config_error(result, checkpoint, "--workdir")
  assert _digest(workdir) == before


def test_batch_not_divisible_by_the_devices(tmp_path):
  workdir = str(tmp_path / "workdir")
  result = _run(_command(workdir, "--config.train.batch_size=6", config="configs/bert.py:runlocal"))
  _assert_config_error(result, "train.batch_size=6", "multiple of 8")
  assert not os.path.exists(workdir) or not os.listdir(workdir)


@pytest.mark.parametrize("args, fragments", [
    (("--config.train.batch_size=0",), ("train.batch_size=0 must be >= 1",)),
    (("--config.train.log_every=0",), ("train.log_every=0 must be >= 1",)),
    (("--config.train.checkpoint_every=0",), ("train.checkpoint_every=0",)),
    (("--config.model.dtype=float17",), ("model.dtype='float17'", "bfloat16")),
    (("--config.train.total_steps=abc",), ("--config.train.total_steps=abc",)),
    (("--config=configs/no_such_paper.py",), ("no such file", "configs/roberta.py:runlocal")),
    (("--config=configs/bert.py:badarg",), ("Unknown model size 'badarg'",)),
    (("--config=configs/finetune.py:task=a,epochs=3",), ("Unknown config argument 'epochs'",)),
    (("--workdir=",), ("--workdir",)),
])
def test_bad_command_lines_are_one_line_and_touch_nothing(tmp_path, args, fragments):
  """A wrong value, type, config file, config argument or a missing --workdir: exit 2, one
  line naming the field and the fix, no traceback, and the workdir never created."""
  workdir = tmp_path / "never"
  command = [sys.executable, "-m", "bertfam_jax.main", "--config=configs/roberta.py:runlocal",
             f"--workdir={workdir}", *args]
  if args == ("--workdir=",):
    command = [a for a in command if not a.startswith("--workdir")]
  result = _run(command, timeout=120)
  _assert_config_error(result, *fragments)
  assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1, result.stderr
  assert not workdir.exists()


def test_a_full_disk_is_one_line_and_the_run_resumes(tmp_path):
  """A write that finds no room while a checkpoint is written (a file-size limit, `ulimit -f`,
  which writes meet as EFBIG where a full disk gives ENOSPC): exit 2 and one line naming the
  checkpoint and its size, the checkpoint before it intact, and the re-run without the limit
  resumes from that one."""
  workdir = str(tmp_path / "workdir")
  wide = ("--config.model.hidden=256", "--config.model.heads=4", "--config.train.log_every=1",
          "--config.optimizer.warmup_steps=1",
          "--config.train.checkpoint_every=2")
  _assert_ok(_run(_command(workdir, *wide, "--config.train.total_steps=2")))
  limit = 1 << 20   # above metrics, events and the tokenizer; below a 256-wide model's arrays
  command = _command(workdir, *wide, "--config.train.total_steps=4")
  # The limit is set in the child before it becomes the CLI (no preexec_fn: a fork of this
  # multithreaded JAX process).
  limited = [sys.executable, "-c",
             f"import os, resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, "
             f"{limit})); os.execv(sys.executable, [sys.executable] + sys.argv[1:])",
             *command[1:]]
  result = _run(limited)
  _assert_config_error(result, "No room to write checkpoint 4 (", "MiB) in ", "File too large")
  assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1, result.stderr
  assert sorted(n for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit()) == ["2"]
  _assert_ok(_run(_command(workdir, *wide, "--config.train.total_steps=4")))
  assert [step for step, _ in _train_records(workdir)] == [1, 2, 3, 4]
