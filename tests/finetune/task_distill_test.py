"""TinyBERT's task-specific distillation losses (finetune/distill.py): the soft cross-entropy as
task_distill.py computes it, zero layer losses for a student equal to its teacher on every input
layout (multiple choice folds its choices), and the general stage's projection carried over."""

import jax
import ml_collections
import numpy as np
from flax import linen as nn
import pytest

from bertfam_jax.finetune import distill
from bertfam_jax.models import finetune as finetune_models
from helpers import tiny


def test_soft_cross_entropy_is_the_references_mean_over_batch_and_classes():
  rng = np.random.default_rng(0)
  s, t = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
  log_q = s / 2 - np.log(np.sum(np.exp(s / 2), -1, keepdims=True))
  p = np.exp(t / 2) / np.sum(np.exp(t / 2), -1, keepdims=True)
  np.testing.assert_allclose(float(distill.soft_cross_entropy(s, t, 2.0)),
                             np.mean(-p * log_q), rtol=1e-6)


def _teacher_config(kind_features="last", **finetune):
  return ml_collections.ConfigDict(dict(model=tiny.encoder(dropout=0.0, attention_dropout=0.0),
                                        finetune=dict(features=kind_features, **finetune)))


def test_a_teacher_with_a_normalised_mix_is_rebuilt_with_it():
  """A teacher fine-tuned with finetune.features=weighted_sum and mix_layer_norm=True predicts
  through the normalised mix it was trained with: a student equal to it matches its logits."""
  teacher = _teacher_config("weighted_sum", mix_layer_norm=True)
  student = finetune_models.FineTuneModel(ml_collections.FrozenConfigDict(teacher.model),
                                          "classification", 3, "weighted_sum",
                                          mix_layer_norm=True)
  model = distill.build_model(student, teacher)
  ids = (np.arange(32, dtype=np.int32).reshape(2, 16) * 7) % tiny.VOCAB
  mask = np.ones_like(ids)
  variables = nn.meta.unbox(jax.device_get(model.init(
      jax.random.key(0), ids, mask, 0 * ids, deterministic=True)))
  rng = np.random.default_rng(0)   # LayerNorm scales and biases away from 1 and 0: the layers'
  trained = jax.tree.map(           # batch statistics are then not already 0 and 1
      lambda x: (x + 0.3 * rng.normal(size=x.shape)).astype(np.float32),
      variables["teacher"]["teacher"])
  same = {"params": dict(trained, fit_dense=variables["params"]["fit_dense"]),
          **distill.teacher_variables(trained)}
  out = model.apply(same, ids, mask, 0 * ids, deterministic=True,
                    method=finetune_models.TaskDistiller.distill, layers=False)
  np.testing.assert_allclose(out["student"], out["teacher"], rtol=1e-6, atol=1e-6)


def test_a_teacher_with_electras_joint_qa_head_is_rebuilt_with_it():
  """A QA teacher fine-tuned with finetune.qa_head='joint' (an ELECTRA init's default) is built
  with that head, so its saved parameters fit; a run_squad.py student learns its layers."""
  teacher = _teacher_config(qa_head="joint")
  student = finetune_models.FineTuneModel(ml_collections.FrozenConfigDict(teacher.model),
                                          "extractive_qa")
  ids = (np.arange(32, dtype=np.int32).reshape(2, 16) * 7) % tiny.VOCAB
  variables = nn.meta.unbox(jax.device_get(distill.build_model(student, teacher).init(
      jax.random.key(0), ids, np.ones_like(ids), 0 * ids, deterministic=True)))
  assert set(variables["teacher"]["teacher"]["span_head"]) == {
      "start", "qa_hidden", "qa_logits", "answerable_hidden", "answerable"}
  assert set(variables["params"]["span_head"]) == {"classifier"}


@pytest.mark.parametrize("kind, shape, outputs", [
    ("classification", (2, 16), 3),
    ("regression", (2, 16), 0),
    ("multiple_choice", (2, 3, 16), 0),
    ("token_classification", (2, 16), 5),
])
def test_a_student_equal_to_its_teacher_has_zero_losses(kind, shape, outputs):
  teacher = _teacher_config()
  student = finetune_models.FineTuneModel(ml_collections.FrozenConfigDict(teacher.model), kind,
                                          outputs)
  model = distill.build_model(student, teacher)
  ids = (np.arange(np.prod(shape), dtype=np.int32).reshape(shape) * 7) % tiny.VOCAB
  mask = np.ones_like(ids)
  mask[..., 12:] = 0
  batch = dict(input_ids=ids, input_mask=mask, segment_ids=0 * ids,
               label=np.zeros(shape[0], np.float32 if kind == "regression" else np.int32),
               labels=0 * ids, label_weights=mask.astype(np.float32))
  variables = nn.meta.unbox(jax.device_get(model.init(
      jax.random.key(0), ids, mask, 0 * ids, deterministic=True)))
  hidden = teacher.model.hidden   # TinyBERT's student has fit_dense at equal widths too
  assert variables["params"]["fit_dense"]["kernel"].shape == (hidden, hidden)
  identity = {"kernel": np.eye(hidden, dtype=np.float32), "bias": np.zeros(hidden, np.float32)}
  same = {"params": dict(variables["teacher"]["teacher"], fit_dense=identity),
          **distill.teacher_variables(variables["teacher"]["teacher"])}
  loss_fn = distill.make_loss_fn(kind, "intermediate", 1.0, [0, 1], 2, 2)
  loss, metrics = loss_fn(model, same, batch, jax.random.key(1), None, deterministic=True)
  assert float(loss) < 1e-8 and "task_loss" in metrics
  loss, _ = loss_fn(model, variables, batch, jax.random.key(1), None, deterministic=True)
  assert float(loss) > 1e-3
  if kind == "regression":   # task_distill.py: the MSE against the gold scores, not the teacher
    predicted = np.asarray(model.apply(same, ids, mask, 0 * ids, deterministic=True))
    batch["label"] = np.array([0.5, -1.0], np.float32)
    loss, _ = distill.make_loss_fn(kind, "prediction", 1.0, [0, 1], 2, 2)(
        model, same, batch, jax.random.key(1), None, deterministic=True)
    np.testing.assert_allclose(float(loss), np.mean((predicted - batch["label"]) ** 2),
                               rtol=1e-5)


def test_the_general_stages_projection_carries_over_when_it_fits():
  fresh = {"encoder": {"w": np.zeros(2)}, "fit_dense": {"kernel": np.zeros((2, 4)),
                                                        "bias": np.zeros(4)}}
  general = {"encoder": {"w": np.ones(2)}, "fit_dense": {"kernel": np.ones((2, 4)),
                                                         "bias": np.ones(4)}}
  transfer = lambda params: dict(params, encoder=general["encoder"])  # noqa: E731
  carried = distill.with_fit_dense(transfer, general)(fresh)
  np.testing.assert_array_equal(carried["fit_dense"]["kernel"], np.ones((2, 4)))
  other = dict(general, fit_dense={"kernel": np.ones((2, 8)), "bias": np.ones(8)})
  kept = distill.with_fit_dense(transfer, other)(fresh)
  np.testing.assert_array_equal(kept["fit_dense"]["kernel"], np.zeros((2, 4)))
