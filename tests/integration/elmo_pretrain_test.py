"""ELMo pre-training through the one train loop: configs/elmo.py:runlocal shrunk, on the embedded
corpus: both directions' held-out losses fall below the uniform prior, a resumed run equals the
uninterrupted one, sharded steps equal one device, and the sampled softmax trains too."""

import math
import os

import jax
import numpy as np
import pytest

from bertfam_jax import config_lib as cl
from bertfam_jax.objectives import elmo
from bertfam_jax.train import train
from helpers.run_records import assert_resume_reproduces, metric_records, train_records
from helpers.sharded import assert_sharded_equals_single, host_batches

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BATCH, VOCAB = 8, 512


def tiny_config(**objective):
  """configs/elmo.py:runlocal at 24-word rows, a biLM of 16 cells projected to 8 over 512
  pieces."""
  c = cl.load_config(os.path.join(_ROOT, "configs", "elmo.py"), "runlocal")
  c.data.update(seq_len=24, docs_per_chunk=16)
  c.model.update(vocab_size=VOCAB, max_characters=12, char_embedding_dim=4,
                 char_filters=((1, 8), (2, 8), (3, 16)), projection_dim=8, lstm_cells=16)
  c.objective.update(objective)
  c.train.update(batch_size=BATCH, total_steps=30, log_every=5, eval_every=30, eval_batches=2,
                 checkpoint_every=15, keep_checkpoints=5)
  return c


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("elmo"))
  train.run(tiny_config(), workdir)
  return workdir


def test_both_directions_learn(uninterrupted):
  metrics = train_records(uninterrupted)
  assert sorted(metrics) == [5, 10, 15, 20, 25, 30]
  for direction in ("forward", "backward"):
    assert metrics[30][f"{direction}_loss"] < metrics[5][f"{direction}_loss"] - 0.5
  last = [r for r in metric_records(uninterrupted) if "eval_forward_loss" in r][-1]
  for direction in ("forward", "backward"):   # held out, well below log(512) = 6.24
    assert last[f"eval_{direction}_loss"] < math.log(VOCAB) - 1.0
  np.testing.assert_allclose(last["eval_loss"], 0.5 * (last["eval_forward_loss"]
                                                       + last["eval_backward_loss"]), rtol=0.05)


def test_resume_reproduces_the_run(uninterrupted, tmp_path):
  assert_resume_reproduces(tiny_config(), uninterrupted, str(tmp_path / "resumed"))


@pytest.fixture(scope="module")
def batches():
  return host_batches(tiny_config(), elmo, 2, BATCH)


def test_sharded_steps_equal_single_device(batches):
  """Two steps on a 2 x 2 x 2 mesh equal one device: losses and parameters."""
  assert_sharded_equals_single(tiny_config(), elmo, batches)


def test_the_sampled_softmax_trains(batches):
  """objective.sampled_negatives: training logs the sampled loss (its candidates' softmax), which
  falls, and evaluation still reports the full softmax's."""
  from bertfam_jax.train import sharding, step as step_lib  # pylint: disable=g-import-not-at-top
  config = tiny_config(sampled_negatives=64)
  config.optimizer.clip_norm = 10.0
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  state, train_step = step_lib.fresh_train_step(config, mesh, elmo)
  put = lambda b: {k: jax.device_put(v, sharding.batch_sharding(mesh))  # noqa: E731
                   for k, v in b.items()}
  sampled = []
  for _ in range(10):
    state, metrics = train_step(state, put(batches[0]))
    sampled.append(step_lib.finalize_metrics(jax.device_get(metrics))["forward_sampled_loss"])
  assert sampled[-1] < sampled[0] - 0.5
  eval_step = step_lib.make_eval_step(elmo.build_model(config), elmo.loss_fn, config,
                                      jax.tree.map(lambda x: x.sharding, state), mesh)
  scalars = step_lib.finalize_metrics(jax.device_get(eval_step(state.params, put(batches[1]))))
  assert {"forward_loss", "backward_loss"} <= set(scalars)
  assert "forward_sampled_loss" not in scalars


def test_fine_tuning_an_elmo_workdir_is_refused_in_one_line(uninterrupted, tmp_path):
  """A biLM takes no task head here: a ConfigError naming the init and the alternatives, before
  the fine-tuning workdir is written."""
  from bertfam_jax.finetune import run as finetune_run  # pylint: disable=import-outside-toplevel
  c = cl.load_config(os.path.join(_ROOT, "configs", "finetune.py"),
                     f"task=wordnet_supersense,init={uninterrupted}")
  with pytest.raises(cl.ConfigError, match="is an ELMo biLM.*bertfam_jax.represent"):
    finetune_run.run(c, str(tmp_path / "ft"))
  assert not (tmp_path / "ft").exists()
