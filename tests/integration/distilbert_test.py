"""DistilBERT through the one train loop: configs/distilbert.py:runlocal (shrunk) distils a
student from a BERT runlocal teacher's workdir. The teacher stays frozen, the loss falls, a
resumed run equals the uninterrupted one, sharded steps equal one device, and the student is a
masked-LM workdir like any other."""

import os

import jax
import numpy as np
import pytest

from bertfam_jax import workdir as workdir_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.models import pretraining
from bertfam_jax.objectives import distillation
from bertfam_jax.train import checkpoint, train
from helpers import teachers
from helpers.run_records import assert_resume_reproduces, metric_records, train_records
from helpers.sharded import assert_sharded_equals_single, host_batches, run_steps

BATCH = 8
# 200 steps: one 5-step log of this student's loss moves by ±0.3 from the next, so a fall shows
# only over many steps (at 30 steps seed 1 rose by 0.02; at 200 the last two logs' mean is
# 0.36 / 0.57 / 0.38 below the first two's for seeds 0 / 1 / 2, at 56b4376 on this CPU).
STEPS = 200
_load = teachers.load_config


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
  return teachers.train_bert_teacher(str(tmp_path_factory.mktemp("teacher")), BATCH)


def student_config(teacher_dir):
  c = _load("distilbert.py", f"runlocal,teacher={teacher_dir}")
  c.data.update(seq_len=32, docs_per_chunk=16)
  c.optimizer.update(peak_lr=5e-3, warmup_steps=2)
  c.train.update(batch_size=BATCH, total_steps=STEPS, log_every=5, eval_every=STEPS,
                 eval_batches=2, checkpoint_every=STEPS // 2, keep_checkpoints=5)
  return c


@pytest.fixture(scope="module")
def student(teacher, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("student"))
  train.run(student_config(teacher), workdir)
  return workdir


def test_the_config_reads_its_teacher(teacher):
  """Half the teacher's depth, its width, vocabulary and tokenizer; no token types."""
  c, saved = student_config(teacher), workdir_lib.read_config(teacher)
  assert (c.model.layers, c.model.hidden, c.model.vocab_size, c.model.type_vocab_size) == (
      1, 32, 512, 0)
  assert c.objective.teacher_model.to_dict() == saved.model.to_dict()
  assert c.tokenizer.model_path == os.path.join(teacher, "tokenizer.model")
  with pytest.raises(ConfigError, match="has no config.json"):
    _load("distilbert.py", f"runlocal,teacher={teacher}/missing")


def test_distillation_trains_the_student_and_leaves_the_teacher(teacher, student):
  metrics = train_records(student)
  assert sorted(metrics) == list(range(5, STEPS + 5, 5))
  # The student starts from its teacher's layers (KL near 0); at this size the MLM term, 2 × ~6.3
  # nats, is most of the loss and falls.
  first, last = (np.mean([metrics[s]["loss"] for s in steps])
                 for steps in ((5, 10), (STEPS - 5, STEPS)))
  assert last < first - 0.2, (first, last)
  assert metrics[5]["distill_ce"] < 0.1
  assert any("eval_distill_ce" in r for r in metric_records(student))
  directory = os.path.join(student, "checkpoints")
  state = checkpoint.read_params(directory, STEPS)   # the 'params' collection: the student
  teacher_params = workdir_lib.restore_params(teacher)
  start = distillation.initial_params(student_config(teacher), workdir_lib.restore_params)
  assert set(state) == {"encoder", "mlm_head"} and "type_embeddings" not in state["encoder"]
  # Every leaf trained but the position table, which stays the teacher's (the reference's
  # sinusoidal_pos_embds table: requires_grad=False, then loaded from the teacher).
  positions = state["encoder"].pop("position_embeddings")
  start_positions = start["params"]["encoder"].pop("position_embeddings")
  jax.tree.map(np.testing.assert_array_equal, positions, start_positions)
  jax.tree.map(np.testing.assert_array_equal, positions,
               teacher_params["encoder"]["position_embeddings"])
  changed = jax.tree.map(lambda a, b: not np.array_equal(a, b), state, start["params"])
  assert all(jax.tree.leaves(changed))
  # The checkpoint's teacher collection is the teacher's parameters, bit for bit.
  frozen = checkpoint.read_params(directory, STEPS, pretraining.TEACHER)["teacher"]
  assert set(frozen) == {"encoder", "mlm_head"}
  for key in frozen:
    jax.tree.map(np.testing.assert_array_equal, frozen[key], teacher_params[key])


def test_resume_reproduces_the_run(teacher, student, tmp_path):
  assert_resume_reproduces(student_config(teacher), student, str(tmp_path / "resumed"),
                           at=STEPS // 2, steps=(STEPS - 10, STEPS - 5, STEPS))


def test_the_student_loads_as_an_encoder(student):
  """... with trainable positions: the frozen table is distillation's (objective), not the
  saved model's, so fine-tuning the student or distilling from it trains it."""
  config, _, encoder_params = workdir_lib.load_encoder(student)
  assert config.model.layers == 1 and "layer_1" not in encoder_params
  assert "freeze_positions" not in config.model and config.objective.freeze_positions


def test_sharded_steps_equal_single_device(teacher):
  """Two distillation steps on a 2 x 2 x 2 mesh equal one device: losses and parameters, the
  teacher collection unchanged on both."""
  config = student_config(teacher)
  tokenizer = workdir_lib.load_tokenizer(workdir_lib.read_config(teacher), teacher)
  batches = host_batches(config, distillation, 2, BATCH, tokenizer)
  state = assert_sharded_equals_single(config, distillation, batches)
  config.mesh.update(data=2, fsdp=2, tensor=2)
  _, fresh = run_steps(config, distillation, [], jax.devices())
  jax.tree.map(np.testing.assert_array_equal, state.params[pretraining.TEACHER],
               fresh.params[pretraining.TEACHER])
  # Micro-batches (the gradient of the trained collection only, accumulated): the teacher
  # stays, the student moves, the loss is finite.
  config.train.grad_accum_steps = 2
  accum_losses, accum_state = run_steps(config, distillation, batches[:1], jax.devices())
  assert np.isfinite(accum_losses).all()
  jax.tree.map(np.testing.assert_array_equal, accum_state.params[pretraining.TEACHER],
               fresh.params[pretraining.TEACHER])
  assert not np.array_equal(accum_state.params["params"]["encoder"]["layer_0"]["mlp"]["output"][
      "kernel"], fresh.params["params"]["encoder"]["layer_0"]["mlp"]["output"]["kernel"])
