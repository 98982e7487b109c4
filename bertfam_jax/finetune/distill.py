"""TinyBERT's task-specific distillation (Jiao et al., 2020 §3.2-3.3; huawei-noah TinyBERT
task_distill.py): fine-tuning a student with a teacher fine-tuned on the same task.

  finetune.teacher      a fine-tuning workdir of ours on `finetune.task` (its model, head and
                        latest weights); '' = an ordinary fine-tuning
  finetune.distill      'intermediate': att_loss + rep_loss, every student layer against its
                          teacher layer (objectives/tinybert.py's losses and layer map), the
                          task head untrained (task_distill.py without --pred_distill);
                        'prediction': the soft cross-entropy of the student's logits against the
                          teacher's at `finetune.distill_temperature` (1, task_distill.py's
                          default), no hard labels; for regression task_distill.py's MSE against
                          the gold scores (the teacher's predictions are not read)
  finetune.teacher_layers  one teacher layer per student layer; '' = uniform

The reference's recipe is the two stages in turn: intermediate from the general TinyBERT
(`finetune.init`, e.g. configs/tinybert.py's workdir; its `fit_dense` carries over when the
widths match), then prediction from the intermediate stage's workdir (its encoder). The student
keeps the init's model; the teacher's must match it in heads, vocabulary, positions and token
types (`tinybert.check_student`). The task's scores are the student's.

task_distill.py's `soft_cross_entropy` is (−softmax(t/T) · log_softmax(s/T)).mean() over the
batch and the classes, so the cross-entropy divided by the number of classes; kept as it is.
Prediction distillation covers the sequence-level kinds (classification, regression, multiple
choice: the choices' scores are its classes); intermediate distillation every encoder kind.
"""

from __future__ import annotations

import ml_collections
import jax
import jax.numpy as jnp
import numpy as np

from bertfam_jax import workdir as workdir_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.finetune import losses as finetune_losses
from bertfam_jax.models import finetune as finetune_models
from bertfam_jax.models import pretraining
from bertfam_jax.models.layers import SCORES
from bertfam_jax.objectives import tinybert

STAGES = ("intermediate", "prediction")
PREDICTION_KINDS = ("classification", "regression", "multiple_choice")
INPUT_KEYS = ("input_ids", "input_mask", "segment_ids")


def load_teacher(config, kind: str) -> tuple[ml_collections.ConfigDict, dict]:
  """(the teacher's config, its parameters as host numpy) after checking that it can teach the
  student of `config` (resolved) on a task of `kind`."""
  ft = config.finetune
  if ft.distill not in STAGES:
    raise ConfigError(f"finetune.distill={ft.distill!r}; choose one of {STAGES}.")
  if ft.distill == "prediction" and kind not in PREDICTION_KINDS:
    raise ConfigError(f"finetune.distill='prediction' distils the logits of "
                      f"{', '.join(PREDICTION_KINDS)} tasks; {ft.task} is {kind}: use "
                      f"--config.finetune.distill=intermediate.")
  if not ft.distill_temperature > 0:
    raise ConfigError(f"finetune.distill_temperature={ft.distill_temperature} must be > 0.")
  saved = workdir_lib.read_config(ft.teacher)
  task = saved.get("finetune", {}).get("task")
  if task != ft.task:
    held = f"a fine-tuning on {task!r}" if task else "a pre-training run"
    raise ConfigError(f"finetune.teacher={ft.teacher} holds {held}; the teacher must be "
                      f"fine-tuned on {ft.task!r} (python -m bertfam_jax.main "
                      f"--config=configs/finetune.py:task={ft.task},init=... --workdir=DIR).")
  tinybert.check_student(config.model, saved.model, "model", "finetune.teacher's model")
  layer_map(config, saved)
  return saved, workdir_lib.restore_params(ft.teacher)


def layer_map(config, teacher_config) -> list[int]:
  return tinybert.teacher_layer_map(config.finetune.teacher_layers, teacher_config.model.layers,
                                    config.model.layers, "finetune.teacher_layers")


def build_model(student: finetune_models.FineTuneModel, teacher_config
                ) -> finetune_models.TaskDistiller:
  return finetune_models.TaskDistiller(
      student, ml_collections.FrozenConfigDict(teacher_config.model),
      teacher_features=teacher_config.finetune.get("features", "last"),
      teacher_mix_layer_norm=teacher_config.finetune.get("mix_layer_norm", False),
      teacher_qa_head=teacher_config.finetune.get("qa_head") or "independent")


def teacher_variables(teacher_params) -> dict:
  """The TEACHER collection of `TaskDistiller` from the teacher workdir's parameters."""
  return {pretraining.TEACHER: {"teacher": teacher_params}}


def with_fit_dense(transfer, pretrained):
  """`transfer` (the encoder's, finetune/run.py), then the general stage's `fit_dense` when the
  init has one of the fresh one's shape (task_distill.py loads the whole TinyBERT student)."""
  def apply(fresh):
    params = transfer(fresh)
    given = pretrained.get("fit_dense")
    if "fit_dense" in fresh and given is not None and jax.tree.map(
        np.shape, given) == jax.tree.map(np.shape, fresh["fit_dense"]):
      params = dict(params, fit_dense=jax.tree.map(jnp.asarray, given))
    return params
  return apply


def soft_cross_entropy(student_logits, teacher_logits, temperature: float):
  """task_distill.py's soft_cross_entropy of logits / T: mean over every element of
  −softmax(t/T) · log_softmax(s/T). Args: [batch, classes]. Returns a float32 scalar."""
  log_s = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
  p_t = jax.nn.softmax(teacher_logits.astype(jnp.float32) / temperature, axis=-1)
  return jnp.mean(-p_t * log_s)


def make_loss_fn(kind: str, stage: str, temperature: float, mapped: list[int],
                 student_layers: int, teacher_layers: int):
  """`loss_fn(model, params, batch, rng, config, *, deterministic)` of the stage (module
  docstring) for the `TaskDistiller`; metrics: att_loss and rep_loss, or pred_loss, and the
  student's task loss and accuracy on the batch's labels (logged, not trained)."""

  def loss_fn(model, params, batch, rng, config, *, deterministic=False):
    del config
    inputs = [batch[k] for k in INPUT_KEYS]
    layers = stage == "intermediate"
    out, state = model.apply(params, *inputs, deterministic=deterministic,
                             rngs={"dropout": rng}, mutable=[SCORES] if layers else [],
                             method=finetune_models.TaskDistiller.distill, layers=layers)
    _, metrics = finetune_losses.task_loss(kind, out["student"], batch)
    metrics = {f"task_{k}": v for k, v in metrics.items()}
    one = jnp.ones([], jnp.float32)
    if layers:
      mask = batch["input_mask"]
      att, rep = tinybert.layer_losses(
          tinybert.attention_scores(state[SCORES], "encoder", student_layers),
          tinybert.attention_scores(state[SCORES], "teacher/encoder", teacher_layers),
          out["student_layers"], out["teacher_layers"], mask.reshape(-1, mask.shape[-1]),
          mapped)
      return att + rep, {**metrics, "att_loss": (att, one), "rep_loss": (rep, one)}
    if kind == "regression":   # task_distill.py: the MSE against the gold scores
      pred = jnp.mean(jnp.square(out["student"].astype(jnp.float32)
                                 - batch["label"].astype(jnp.float32)))
    else:
      pred = soft_cross_entropy(out["student"], out["teacher"], temperature)
    return pred, {**metrics, "pred_loss": (pred, one)}

  return loss_fn
