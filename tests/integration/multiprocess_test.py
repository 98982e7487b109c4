"""Two processes x 4 CPU devices (jax.distributed with a coordinator on 127.0.0.1) against one
process x 8 devices, both reading data.num_shards=2 shards: every process reads its own
documents, the global batch is assembled from both, checkpoints are written by both, and the job
resumes from them, on two processes and on one."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from bertfam_jax import config_lib
from bertfam_jax.data import pipeline
from bertfam_jax.finetune import run as finetune_run
from bertfam_jax.train import train
from helpers.run_records import metric_records, train_records

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_TINY = {"model.hidden": 32, "model.layers": 2, "model.heads": 2, "model.mlp": 64,
         "model.vocab_size": 512, "model.max_positions": 32, "data.seq_len": 32,
         "objective.max_predictions": 5, "train.batch_size": 16,
         # A learning rate independent of train.total_steps, so that 3 steps resumed to 6 are
         # the uninterrupted run of 6.
         "optimizer.schedule": "constant",
         "train.log_every": 1, "train.checkpoint_every": 3, "train.eval_every": 3,
         "train.eval_batches": 1, "mesh.data": 4, "mesh.fsdp": 2, "data.num_shards": 2}
# "Data shard 1 of 2 (process 1) reads documents [3, 41, ...] of 85." (pipeline.chunk_examples)
_READS = re.compile(r"Data shard (\d+) of 2 \(process (\d+)\) reads documents \[([\d, ]*)\] of "
                    r"(\d+)\.")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _pretraining(total_steps, *flags):
  """The CLI arguments of the tiny BERT pre-training run."""
  return ["--config=configs/bert.py:runlocal", *(f"--config.{k}={v}" for k, v in _TINY.items()),
          f"--config.train.total_steps={total_steps}", *flags]


def _start_two_processes(workdir, args):
  """Starts `python -m bertfam_jax.main ARGS --workdir=WORKDIR` as processes 0 and 1 of a job
  (4 CPU devices each); returns them and each one's (stdout file, stderr file)."""
  port = _free_port()
  # conftest's XLA flags, with 4 devices instead of 8.
  env = dict(os.environ, PYTHONPATH=_REPO, XLA_FLAGS=os.environ["XLA_FLAGS"].replace(
      "--xla_force_host_platform_device_count=8", "--xla_force_host_platform_device_count=4"))
  # Files, not pipes: a process blocked on a full pipe would stall the other in a collective.
  files = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in range(2)]
  procs = [subprocess.Popen(
      [sys.executable, "-m", "bertfam_jax.main", *args, f"--workdir={workdir}",
       f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}"],
      cwd=_REPO, env=env, stdout=out, stderr=err) for i, (out, err) in enumerate(files)]
  return procs, files


def _wait(procs, files):
  """Waits for both processes; returns each one's (stdout, stderr) once both exited 0."""
  try:
    for p in procs:
      p.wait(timeout=400)
  finally:  # a hung pair (one waiting for the other) must not outlive the test
    for p in procs:
      if p.poll() is None:
        p.kill()
  outputs = [tuple(_read(f) for f in pair) for pair in files]
  for p, (_, err) in zip(procs, outputs):
    assert p.returncode == 0, err[-3000:]
  return outputs


def _run_two_processes(workdir, total_steps, *flags):
  """The tiny pre-training on two processes; returns each process's (stdout, stderr)."""
  return _wait(*_start_two_processes(workdir, _pretraining(total_steps, *flags)))


def _read(file) -> str:
  file.seek(0)
  with file:
    return file.read()


def _run_one_process(workdir, total_steps, **overrides):
  """The same run in this process, on its 8 devices."""
  config = config_lib.load_config(os.path.join(_REPO, "configs", "bert.py"), "runlocal")
  for key, value in {**_TINY, "train.total_steps": total_steps, **overrides}.items():
    section, field = key.split(".")
    config[section][field] = value
  train.run(config, workdir)


def _losses(workdir):
  return {step: r["loss"] for step, r in train_records(workdir).items()}


def _data_positions(workdir, step):
  """Every data shard's position in a checkpoint, whatever number of processes wrote it."""
  with open(os.path.join(workdir, "checkpoints", str(step), "data", "metadata")) as f:
    data = json.load(f)
  return pipeline.shard_positions([dict(zip(data["keys"], row)) for row in data["processes"]])


def _documents_read(stderr):
  """{(shard, process, number of documents in the split): [document ids]} from the debug log."""
  reads = {}
  for shard, process, ids, num_docs in _READS.findall(stderr):
    reads.setdefault((int(shard), int(process), int(num_docs)), []).extend(
        int(i) for i in ids.split(", ") if i)
  return reads


def test_two_processes_equal_one_read_disjoint_data_and_resume_on_either(tmp_path):
  two, one, reference = (str(tmp_path / name) for name in ("two", "one", "reference"))
  outputs = _run_two_processes(two, 3, "--verbosity=1")
  # Process 0 prints the progress; both ran the same global steps on an 8-device mesh.
  assert "mesh {'data': 4, 'fsdp': 2, 'tensor': 1}" in outputs[0][0]
  assert "step 3/3" in outputs[0][0] and "step 3/3" not in outputs[1][0]
  assert os.listdir(os.path.join(two, "checkpoints")) == ["3"]
  # The documents each process really read (logged where a chunk is read): process p read data
  # shard p only; the processes' documents are disjoint and together every document of a split.
  num_train, num_eval = map(int, re.search(r"(\d+) train / (\d+) eval documents",
                                           outputs[0][0]).groups())
  for num_docs in (num_train, num_eval):
    read = []
    for process, (_, stderr) in enumerate(outputs):
      reads = _documents_read(stderr)
      assert {(s, p) for s, p, _ in reads} == {(process, process)}, reads.keys()
      read.append(set(reads[process, process, num_docs]))
    assert read[0].isdisjoint(read[1]) and read[0] | read[1] == set(range(num_docs))
  shutil.copytree(two, one)
  _run_two_processes(two, 6)   # resumes from step 3
  losses = _losses(two)
  assert sorted(losses) == [1, 2, 3, 4, 5, 6]
  assert all(0 < loss < 20 for loss in losses.values())

  # One process x 8 devices reads the same two shards: the same batches, so the same losses (to
  # the rounding of the cross-process reductions), and the same data positions.
  _run_one_process(reference, 6, **{"train.checkpoint_every": 6})
  reference_losses = _losses(reference)
  np.testing.assert_allclose([reference_losses[s] for s in range(1, 7)],
                             [losses[s] for s in range(1, 7)], rtol=1e-5)
  assert len(_data_positions(two, 6)) == 2
  assert _data_positions(reference, 6) == _data_positions(two, 6)

  # The checkpoint written by the two processes resumes in one: the state and both shards'
  # positions are restored, and steps 4-6 continue the two-process run.
  _run_one_process(one, 6)
  resumed = _losses(one)
  np.testing.assert_allclose([resumed[s] for s in (4, 5, 6)], [losses[s] for s in (4, 5, 6)],
                             rtol=1e-5)
  assert _data_positions(one, 6) == _data_positions(two, 6)


def test_a_preemption_notice_to_one_process_stops_both_at_one_checkpointed_step(tmp_path):
  """SIGTERM reaches one host only (or each at a different step): JAX's preemption sync agrees on
  one step, both processes save it together and exit 0. With a flag per process, the one that
  stops to save would wait for the other, itself waiting in the next step's collectives."""
  workdir = str(tmp_path / "run")
  procs, files = _start_two_processes(
      workdir, _pretraining(100_000, "--config.train.checkpoint_every=100000"))
  deadline = time.monotonic() + 300
  while not any(r["step"] >= 2 for r in metric_records(workdir, complete_only=True)):
    assert time.monotonic() < deadline and procs[0].poll() is None, "no step 2 logged"
    time.sleep(0.1)
  procs[1].send_signal(signal.SIGTERM)
  _, (_, stderr_1) = _wait(procs, files)
  stopped_at = max(train_records(workdir))
  assert 2 <= stopped_at < 1000
  assert os.listdir(os.path.join(workdir, "checkpoints")) == [str(stopped_at)]
  assert f"saved step {stopped_at} and stopped" in stderr_1
  assert len(_data_positions(workdir, stopped_at)) == 2



def test_fine_tuning_on_two_processes_equals_one(tmp_path):
  """Each process reads the pre-trained encoder onto a device of its own, trains on its half of
  every batch and takes part in the evaluation: the losses, scores and predictions are those of
  one process with 8 devices."""
  pytest.importorskip("wn")  # the WordNet task
  pretrained = str(tmp_path / "pretrained")
  _run_one_process(pretrained, 3)
  task = f"task=wordnet_supersense,init={pretrained}"
  overrides = {"finetune.max_train_examples": 64, "finetune.max_eval_examples": 24,
               "finetune.max_seq_len": 32, "finetune.epochs": 2.0, "train.batch_size": 16,
               "train.eval_batch_size": 8, "train.log_every": 1}
  two, one = str(tmp_path / "two"), str(tmp_path / "one")
  _wait(*_start_two_processes(two, [f"--config=configs/finetune.py:{task}",
                                    *(f"--config.{k}={v}" for k, v in overrides.items())]))
  config = config_lib.load_config(os.path.join(_REPO, "configs", "finetune.py"), task)
  for key, value in overrides.items():
    section, field = key.split(".")
    config[section][field] = value
  finetune_run.run(config, one)
  np.testing.assert_allclose([loss for _, loss in sorted(_losses(two).items())],
                             [loss for _, loss in sorted(_losses(one).items())], rtol=1e-5)
  assert sorted(_losses(two)) == list(range(1, 9))

  def read(run, name):
    with open(os.path.join(run, name)) as f:
      return f.read()
  assert read(two, "eval_results.json") == read(one, "eval_results.json")
  # The predictions exactly; their gold-label losses to float tolerance, as the losses above
  # (logits summed in another order over two processes).
  split, whole = ([json.loads(line) for line in read(run, "predictions.jsonl").splitlines()]
                  for run in (two, one))
  assert [{k: v for k, v in p.items() if k != "gold_nll"} for p in split] == [
      {k: v for k, v in p.items() if k != "gold_nll"} for p in whole]
  np.testing.assert_allclose([p["gold_nll"] for p in split], [p["gold_nll"] for p in whole],
                             rtol=1e-5)
