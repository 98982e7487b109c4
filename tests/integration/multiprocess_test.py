"""Two processes x 4 CPU devices (jax.distributed with a coordinator on 127.0.0.1): every process
reads its own documents, the global batch is assembled from both, checkpoints are written by both
and the job resumes from them."""

import json
import os
import socket
import subprocess
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_TINY = ("--config.model.hidden=32", "--config.model.layers=2", "--config.model.heads=2",
         "--config.model.mlp=64", "--config.model.vocab_size=512",
         "--config.model.max_positions=32", "--config.data.seq_len=32",
         "--config.objective.max_predictions=5", "--config.train.batch_size=16",
         "--config.optimizer.warmup_steps=2", "--config.train.log_every=1",
         "--config.train.checkpoint_every=3", "--config.train.eval_every=3",
         "--config.train.eval_batches=1", "--config.mesh.data=4", "--config.mesh.fsdp=2")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run_two_processes(workdir, total_steps):
  port = _free_port()
  env = dict(os.environ, PYTHONPATH=_REPO,
             XLA_FLAGS="--xla_force_host_platform_device_count=4")
  procs = [subprocess.Popen(
      [sys.executable, "-m", "bertfam_jax.main", "--config=configs/bert.py:runlocal",
       f"--workdir={workdir}", *_TINY, f"--config.train.total_steps={total_steps}",
       f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}"],
      cwd=_REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(2)]
  outputs = [p.communicate(timeout=400) for p in procs]
  for p, (_, err) in zip(procs, outputs):
    assert p.returncode == 0, err[-3000:]
  return outputs


def _losses(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}


def test_two_processes_train_checkpoint_and_resume(tmp_path):
  workdir = str(tmp_path / "two")
  outputs = _run_two_processes(workdir, total_steps=3)
  # Process 0 prints the progress; both ran the same global steps on an 8-device mesh.
  assert "mesh {'data': 4, 'fsdp': 2, 'tensor': 1}" in outputs[0][0]
  assert "step 3/3" in outputs[0][0] and "step 3/3" not in outputs[1][0]
  assert os.listdir(os.path.join(workdir, "checkpoints")) == ["3"]
  first = _losses(workdir)
  _run_two_processes(workdir, total_steps=6)  # resumes from step 3
  resumed = _losses(workdir)
  assert sorted(resumed) == [1, 2, 3, 4, 5, 6]
  assert all(resumed[s] == first[s] for s in (1, 2, 3))
  assert all(0 < loss < 20 for loss in resumed.values())
