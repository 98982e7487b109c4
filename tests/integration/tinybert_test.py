"""TinyBERT's general distillation through the one train loop: configs/tinybert.py:runlocal
(shrunk) teaches a half-depth, half-width student from a BERT runlocal teacher's workdir. The
teacher stays frozen, both layer losses fall, a resumed run equals the uninterrupted one, sharded
steps equal one device, and the student is an encoder workdir that fine-tunes."""

import os

import jax
import numpy as np
import pytest

from bertfam_jax import workdir as workdir_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.finetune import distill
from bertfam_jax.finetune import run as finetune_run
from bertfam_jax.models import pretraining
from bertfam_jax.objectives import tinybert
from bertfam_jax.train import checkpoint, train
from helpers import teachers
from helpers.run_records import assert_resume_reproduces, metric_records, train_records
from helpers.sharded import assert_sharded_equals_single, host_batches

BATCH = 8


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
  return teachers.train_bert_teacher(str(tmp_path_factory.mktemp("teacher")), BATCH)


def student_config(teacher_dir):
  c = teachers.load_config("tinybert.py", f"runlocal,teacher={teacher_dir}")
  c.data.update(seq_len=32, docs_per_chunk=16)
  c.optimizer.update(peak_lr=5e-3, warmup_steps=2)
  c.train.update(batch_size=BATCH, total_steps=30, log_every=5, eval_every=30, eval_batches=2,
                 checkpoint_every=15, keep_checkpoints=5)
  return c


@pytest.fixture(scope="module")
def student(teacher, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("student"))
  train.run(student_config(teacher), workdir)
  return workdir


def test_the_config_reads_its_teacher(teacher):
  """Half the teacher's depth and width, its heads, vocabulary, token types and tokenizer."""
  c, saved = student_config(teacher), workdir_lib.read_config(teacher)
  assert (c.model.layers, c.model.hidden, c.model.heads, c.model.mlp) == (1, 16, 4, 64)
  assert (c.model.vocab_size, c.model.type_vocab_size) == (512, 2)
  assert c.objective.teacher_model.to_dict() == saved.model.to_dict()
  assert tinybert.layer_map(c) == [1]


def test_distillation_trains_the_student_and_leaves_the_teacher(teacher, student):
  metrics = train_records(student)
  assert sorted(metrics) == [5, 10, 15, 20, 25, 30]
  for name in ("att_loss", "rep_loss"):
    assert metrics[30][name] < 0.8 * metrics[5][name], name
  assert any("eval_att_loss" in r for r in metric_records(student))
  directory = os.path.join(student, "checkpoints")
  state = checkpoint.read_params(directory, 30)
  assert set(state) == {"encoder", "fit_dense"}
  assert state["fit_dense"]["kernel"].shape == (16, 32)
  frozen = checkpoint.read_params(directory, 30, pretraining.TEACHER)["teacher"]
  jax.tree.map(np.testing.assert_array_equal, frozen,
               workdir_lib.restore_params(teacher)["encoder"])


def test_resume_reproduces_the_run(teacher, student, tmp_path):
  assert_resume_reproduces(student_config(teacher), student, str(tmp_path / "resumed"))


def test_the_student_loads_as_an_encoder(student):
  config, _, encoder_params = workdir_lib.load_encoder(student)
  assert (config.model.layers, config.model.hidden) == (1, 16)
  assert encoder_params["layer_0"]["mlp"]["intermediate"]["kernel"].shape == (16, 64)


def test_sharded_steps_equal_single_device(teacher):
  """Two steps on a 2 x 2 x 2 mesh equal one device; the teacher collection stays."""
  config = student_config(teacher)
  tokenizer = workdir_lib.load_tokenizer(workdir_lib.read_config(teacher), teacher)
  assert_sharded_equals_single(config, tinybert, host_batches(config, tinybert, 2, BATCH,
                                                               tokenizer))


# ------------------------------------------------------------- the task-specific stage (finetune)


def finetune_config(init, **finetune):
  c = teachers.load_config("finetune.py", f"task=wordnet_supersense,init={init}")
  c.finetune.update(max_train_examples=96, max_eval_examples=32, epochs=2.0, max_seq_len=32)
  c.finetune.update(finetune)
  c.optimizer.peak_lr = 5e-3
  c.train.update(batch_size=BATCH, eval_batch_size=BATCH, log_every=4)
  return c


@pytest.fixture(scope="module")
def task_teacher(teacher, tmp_path_factory):
  """The BERT teacher fine-tuned on supersense classification."""
  workdir = str(tmp_path_factory.mktemp("task_teacher"))
  finetune_run.run(finetune_config(teacher), workdir)
  return workdir


def _losses(workdir, name):
  return [r[name] for r in metric_records(workdir) if name in r]


@pytest.fixture(scope="module")
def intermediate(student, task_teacher, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("intermediate"))
  finetune_run.run(finetune_config(student, teacher=task_teacher), workdir)
  return workdir


def test_intermediate_stage_learns_the_teachers_layers(student, task_teacher, intermediate):
  att, rep = _losses(intermediate, "att_loss"), _losses(intermediate, "rep_loss")
  assert len(att) >= 5 and att[-1] < 0.8 * att[0] and rep[-1] < 0.8 * rep[0]
  assert os.path.exists(os.path.join(intermediate, "eval_results.json"))
  step = workdir_lib.latest_step(intermediate)
  directory = os.path.join(intermediate, "checkpoints")
  jax.tree.map(np.testing.assert_array_equal,
               checkpoint.read_params(directory, step, pretraining.TEACHER)["teacher"],
               workdir_lib.restore_params(task_teacher))
  params = checkpoint.read_params(directory, step)
  assert set(params) == {"encoder", "classification_head", "fit_dense"}
  # The head is not trained in this stage (no loss reads it); the encoder is.
  general = workdir_lib.restore_params(student)
  assert not np.array_equal(params["encoder"]["layer_0"]["mlp"]["output"]["kernel"],
                            general["encoder"]["layer_0"]["mlp"]["output"]["kernel"])


def test_prediction_stage_learns_the_teachers_logits(intermediate, task_teacher, tmp_path):
  workdir = str(tmp_path / "prediction")
  results = finetune_run.run(finetune_config(intermediate, teacher=task_teacher,
                                             distill="prediction"), workdir)
  pred = _losses(workdir, "pred_loss")
  assert len(pred) >= 5 and pred[-1] < pred[0]
  assert "accuracy" in results["scores"] and "task_accuracy" in metric_records(workdir)[0]


def test_the_distilled_student_predicts_as_a_fine_tuning(intermediate, task_teacher):
  """Its predictions come from the student alone: the same scores as the fine-tuned model's
  predict applied to the student's parameters only."""
  config = workdir_lib.read_config(intermediate)
  model, _ = finetune_run.build_model(config)
  params = workdir_lib.restore_params(intermediate)
  student = {k: v for k, v in params.items() if k != "fit_dense"}
  ids = np.ones((2, 32), np.int32)
  plain = model.apply({"params": student}, ids, ids, 0 * ids, deterministic=True)
  teacher_config, teacher_params = distill.load_teacher(config, "classification")
  distiller = distill.build_model(model, teacher_config)
  both = {"params": params, **distill.teacher_variables(teacher_params)}
  np.testing.assert_allclose(distiller.apply(both, ids, ids, 0 * ids, deterministic=True), plain,
                             rtol=1e-6)


@pytest.mark.parametrize("change, message", [
    (dict(distill="soft"), "finetune.distill='soft'"),
    (dict(distill_temperature=0.0), "finetune.distill_temperature=0.0"),
    (dict(teacher_layers="5"), "finetune.teacher_layers='5'"),
])
def test_task_distillation_refusals(student, task_teacher, tmp_path, change, message):
  with pytest.raises(ConfigError, match=message):
    finetune_run.run(finetune_config(student, teacher=task_teacher, **change),
                     str(tmp_path / "w"))


def test_a_teacher_must_be_fine_tuned_on_the_task(student, teacher, task_teacher, tmp_path):
  with pytest.raises(ConfigError, match="holds a pre-training run"):
    finetune_run.run(finetune_config(student, teacher=teacher), str(tmp_path / "a"))
  c = finetune_config(student, teacher=task_teacher)
  c.finetune.task = "wordnet_tagging"
  with pytest.raises(ConfigError, match="holds a fine-tuning on 'wordnet_supersense'"):
    finetune_run.run(c, str(tmp_path / "b"))
  c.finetune.distill = "prediction"
  with pytest.raises(ConfigError, match="wordnet_tagging is token_classification"):
    finetune_run.run(c, str(tmp_path / "c"))
  assert not os.listdir(tmp_path)   # refused before any workdir was made
