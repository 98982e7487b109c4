"""UniLM pre-training through the one train loop: configs/unilm.py shrunk, on the embedded corpus:
the held-out cloze loss falls, every LM type's loss is logged, and sharded steps equal one device."""

import os

import jax
import numpy as np
import pytest

from bertfam_jax import config_lib as cl
from bertfam_jax.objectives import unilm
from bertfam_jax.train import train
from helpers.sharded import assert_sharded_equals_single, host_batches
from helpers.run_records import metric_records, train_records

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BATCH, VOCAB = 8, 512


def tiny_config():
  """configs/unilm.py:runlocal at 32-token pairs, a 2-layer 32-wide encoder over 512 pieces."""
  c = cl.load_config(os.path.join(_ROOT, "configs", "unilm.py"), "runlocal")
  c.data.update(seq_len=32, docs_per_chunk=16)
  c.model.update(hidden=32, heads=4, mlp=64, layers=2, vocab_size=VOCAB, max_positions=32)
  c.objective.max_predictions = 5
  c.optimizer.update(peak_lr=3e-3, warmup_steps=5)
  c.train.update(batch_size=BATCH, total_steps=40, log_every=10, eval_every=40, eval_batches=4,
                 checkpoint_every=40)
  return c


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("unilm"))
  train.run(tiny_config(), workdir)
  return workdir


def test_loss_falls_with_every_lm_type_logged(uninterrupted):
  metrics = train_records(uninterrupted)
  assert sorted(metrics) == [10, 20, 30, 40]
  assert metrics[40]["mlm_loss"] < metrics[10]["mlm_loss"] - 0.3
  assert all(f"mlm_loss_{name}" in metrics[40] for name in unilm.LM_TYPES)
  evals = [r for r in metric_records(uninterrupted) if "eval_mlm_loss" in r]
  assert evals[-1]["eval_mlm_loss"] < np.log(VOCAB) - 0.3


@pytest.fixture(scope="module")
def batches():
  return host_batches(tiny_config(), unilm, 2, BATCH)


def test_rows_hold_their_types_and_b_follows_a(batches):
  batch = batches[0]
  types = set(batch["lm_type"].tolist())
  assert types <= {0, 1, 2, 3} and len(types) >= 2
  for row, t in enumerate(batch["lm_type"]):
    real = batch["input_mask"][row] > 0
    assert set(batch["segment_ids"][row][real].tolist()) <= set(unilm.LM_TYPE_IDS[int(t)])


def test_sharded_steps_equal_single_device(batches):
  assert_sharded_equals_single(tiny_config(), unilm, batches)


def test_seq2seq_fine_tuning_on_a_text_task(uninterrupted, tmp_path):
  """configs/finetune.py with a UniLM init and a text task takes UniLM's seq2seq recipe: the
  pre-trained encoder and MLM head carried over, masked-target training, greedy decoding scored
  by the task."""
  pytest.importorskip("wn")  # the WordNet tasks
  from bertfam_jax import workdir as workdir_lib  # pylint: disable=import-outside-toplevel
  from bertfam_jax.finetune import run as finetune_run  # pylint: disable=import-outside-toplevel
  c = cl.load_config(os.path.join(_ROOT, "configs", "finetune.py"),
                     f"task=wordnet_supersense_t2t,init={uninterrupted}")
  c.finetune.update(max_train_examples=64, max_eval_examples=16, epochs=1.0, max_seq_len=24,
                    targets_length=8)
  c.train.update(batch_size=16, eval_batch_size=16, log_every=2)
  workdir = str(tmp_path / "ft")
  results = finetune_run.run(c, workdir)
  assert 0 <= results["scores"]["accuracy"] <= 1 and results["distinct_predictions"] >= 1
  config, _, tuned = workdir_lib.load(workdir)
  assert (config.optimizer.peak_lr, config.finetune.mask_prob) == (3e-5, 0.7)
  _, _, pretrained = workdir_lib.load(uninterrupted)
  assert jax.tree.structure(tuned) == jax.tree.structure(pretrained)
  assert all("accuracy" in r for r in train_records(workdir).values())
