"""TinyBERT's general distillation: a narrower, shallower encoder taught layer by layer (Jiao et
al., 2020, arXiv:1909.10351 §3.1-3.2; huawei-noah/Pretrained-Language-Model TinyBERT:
general_distill.py, transformer/modeling.py TinyBertForPreTraining).

The model (`models/pretraining.LayerDistiller`) holds a student encoder, initialised at random as
general_distill.py's `from_scratch`, and a teacher encoder, the TEACHER collection, read from any
masked-LM workdir of ours (or an imported transformers BERT) and run without dropout and without
gradients. The student has the teacher's vocabulary, positions, token types and head count, and
may be narrower and shallower; its layers go through `fit_dense`, a learned projection to the
teacher's width, at any width (TinyBertForPreTraining has it even at 768 → 768).

Layer mapping (`teacher_layer_map`): student layer m (0-based) learns from teacher layer
g(m) = (m + 1)·k − 1 with k = teacher layers / student layers, general_distill.py's
`teacher_atts[i * layers_per_block + layers_per_block - 1]`; or `objective.teacher_layers`, one
teacher layer per student layer. The embedding output learns from the teacher's.

Loss (general_distill.py: `att_loss + rep_loss`; the paper's Eq. 7-10 without the prediction
layer, which only the task-specific stage adds, finetune/distill.py):
  att: Σ_m MSE(A_s^m, A_t^g(m))   attention scores (QKᵀ/√d, before softmax) [batch, heads, L, L],
                                  with the padded keys' scores set to 0 in both (the reference's
                                  `where(score <= -1e2, 0, score)` after its −10000 mask)
  rep: Σ_i MSE(H_s^i W_h, H_t^g'(i))  the embedding output (i = 0) and each layer's output, the
                                  student's through `fit_dense`; g'(0) = 0, g'(m + 1) = g(m) + 1
Each MSE is torch's MSELoss: a mean over every element, padded positions included.

Inputs: general_distill.py reads the instances of pregenerate_training_data.py, whose
`--masked_lm_prob` defaults to 0.0 ("no [mask] symbol in corpus"; the README's command keeps it),
and whose `create_masked_lm_predictions` still corrupts min(20, max(1, round(len · prob)))
tokens of each row: so one token a row, uniform over the row's non-special tokens, 80% [MASK] /
10% kept / 10% random (`masked_rows`: BERT's masking of objectives/mlm.py with
`objective.mask_rate` 0 and `max_predictions` 20). Batch keys: input_ids (noised), input_mask
[n, L]; segment_ids [n, L] when the pipeline gives them (else 0).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import traverse_util
import flax.linen as nn

from bertfam_jax import config_lib, flops
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.models import layers, pretraining
from bertfam_jax.objectives import distillation, mlm

FIELD_RULES = {
    "objective.mask_rate": config_lib.Range(0, 1, high_open=True),
    "objective.max_predictions": config_lib.AT_LEAST_1,
    "objective.mask_token_prob": config_lib.PROBABILITY,
    "objective.random_token_prob": config_lib.PROBABILITY,
}

# What a TinyBERT student may set apart from its teacher: its size (width, depth, feed-forward)
# and how it computes. Heads must match (the attention scores are compared head by head), and
# the vocabulary, positions and token types (both read the same rows).
_STUDENT_OWN = distillation.STUDENT_COMPUTE + ("layers", "hidden", "mlp", "initializer_range",
                                               "weight_init")


def build_model(config):
  return pretraining.LayerDistiller(config.model, config.objective.teacher_model)


def uniform_layer_map(teacher_layers: int, student_layers: int) -> list[int]:
  """The teacher layer each student layer learns from: the last of each block of k = teacher /
  student consecutive layers (0-based; 12 → 4: 2, 5, 8, 11)."""
  if teacher_layers % student_layers:
    raise ConfigError(f"A {student_layers}-layer student of a {teacher_layers}-layer teacher has "
                      f"no uniform layer map (TinyBERT needs the teacher's depth to be a multiple "
                      f"of the student's); list one teacher layer per student layer, e.g. "
                      f"teacher_layers='{','.join(str(i) for i in range(student_layers))}'.")
  block = teacher_layers // student_layers
  return [(m + 1) * block - 1 for m in range(student_layers)]


def teacher_layer_map(given: str, teacher_layers: int, student_layers: int, field: str
                      ) -> list[int]:
  """`given` ('2,5,8,11': one 0-based teacher layer per student layer), or the uniform map when
  it is ''. ConfigError naming `field` when it does not list `student_layers` teacher layers."""
  if not given:
    return uniform_layer_map(teacher_layers, student_layers)
  try:
    mapped = [int(i) for i in given.split(",")]
  except ValueError:
    mapped = []
  if len(mapped) != student_layers or not all(0 <= i < teacher_layers for i in mapped):
    raise ConfigError(f"{field}={given!r} must list {student_layers} teacher layers (one per "
                      f"student layer) in [0, {teacher_layers}), comma-separated, or be '' for "
                      f"the uniform map.")
  return mapped


def layer_map(config) -> list[int]:
  o = config.objective
  return teacher_layer_map(o.teacher_layers, o.teacher_model.layers, config.model.layers,
                           "objective.teacher_layers")


def check_student(student, teacher, student_name: str, teacher_name: str) -> None:
  """`distillation.check_student` with TinyBERT's own fields (_STUDENT_OWN): ConfigError unless
  `student` (a model section) can learn `teacher`'s layers."""
  distillation.check_student(
      student, teacher, own=_STUDENT_OWN, names=(student_name, teacher_name),
      fields_reason="a TinyBERT student reads the teacher's rows and matches its attention head "
                    "by head",
      layers_reason="layer distillation reads every layer's attention")


def validate(config) -> None:
  o = config.objective
  check_student(config.model, o.teacher_model, "model", "objective.teacher_model")
  layer_map(config)
  if o.mask_token_prob + o.random_token_prob > 1.0:
    raise ConfigError(f"objective.mask_token_prob={o.mask_token_prob} and random_token_prob="
                      f"{o.random_token_prob} must sum to <= 1 (the rest stay unchanged).")
  if not o.teacher:
    raise ConfigError("objective.teacher is empty; pass the teacher's workdir in the config "
                      "argument: --config=configs/tinybert.py:teacher=DIR.")


def init_inputs(config) -> dict[str, jnp.ndarray]:
  length = config.data.seq_len
  return dict(input_ids=jnp.zeros((1, length), jnp.int32),
              input_mask=jnp.ones((1, length), jnp.int32),
              segment_ids=jnp.zeros((1, length), jnp.int32))


def initial_params(config, restore_params):
  """The student drawn from `config.seed` as a random start would be, and the teacher's encoder
  read from `objective.teacher`: {'params': student, TEACHER: {'teacher': teacher encoder}}."""
  saved = restore_params(config.objective.teacher)
  if "encoder" not in saved:
    raise ConfigError(f"objective.teacher={config.objective.teacher} has no encoder parameters "
                      f"(it has {sorted(saved)}); the teacher must be a BERT-style pre-training "
                      f"run or an imported transformers BERT.")
  rng = jax.random.key(config.seed)
  fresh = jax.jit(lambda: nn.meta.unbox(build_model(config).init(
      {"params": rng, "dropout": rng}, **init_inputs(config), deterministic=True)["params"]))()
  return {"params": jax.device_get(fresh),
          pretraining.TEACHER: {"teacher": saved["encoder"]}}


def make_features(config, tokenizer):
  """BERT's masking of the rows both encoders read, `max(1, round(mask_rate · len))` tokens a row
  (module docstring): `fn(rows, rng) -> rows` with input_ids noised."""
  config_lib.check_fields(config, FIELD_RULES)
  config_lib.check_vocabulary(config, tokenizer, fix=(
      "the teacher's tokenizer and vocabulary go together (configs/tinybert.py reads both from the "
      "teacher's workdir)."))
  o = config.objective
  masking = ml_collections.ConfigDict(dict(
      mask_style="bert", mask_scheme="token", mask_rate=o.mask_rate,
      max_predictions=o.max_predictions, replace_per="token", random_tokens="uniform",
      mask_token_prob=o.mask_token_prob, random_token_prob=o.random_token_prob, sbo=False,
      word_shuffle_rate=0.0, mask_per_segment=False))
  return functools.partial(
      masked_rows, features=functools.partial(
          mlm.mlm_features, config=masking, vocab_size=config.model.vocab_size,
          special_ids=np.asarray(tokenizer.special_ids), mask_id=tokenizer.mask_id,
          word_start_table=tokenizer.word_start, scheme_params={}, unit_source=None,
          num_never_random=0))


def masked_rows(rows: dict, rng: np.random.Generator, *, features) -> dict:
  """`rows` (input_ids, input_mask [n, L], ...) with input_ids noised by `features` (the masked
  LM's), and none of its prediction keys: the distillation targets are the teacher's."""
  noised = features(rows, rng)
  return {key: noised[key] for key in rows}


# ------------------------------------------------------------------------------------- the loss


def attention_scores(sown, path: str, count: int) -> list:
  """The scores sown by layers `0 .. count − 1` of the encoder at `path` of the model ('encoder':
  the student's, 'teacher'): a list of [batch, heads, L, L] float32."""
  flat = traverse_util.flatten_dict(sown, sep="/")
  return [flat[f"{path}/layer_{i}/attention/scores"][0] for i in range(count)]


def layer_losses(student_scores, teacher_scores, student_layers_NBLD, teacher_layers_NBLD,
                 input_mask_BL, mapped: list[int]):
  """TinyBERT's (att_loss, rep_loss) (module docstring), float32 scalars.

  Args:
    student_scores, teacher_scores: every layer's attention scores, [batch, heads, L, L] each.
    student_layers_NBLD: [student layers + 1, batch, L, teacher hidden] (projected).
    teacher_layers_NBLD: [teacher layers + 1, batch, L, teacher hidden].
    input_mask_BL: [batch, L]; mapped: the teacher layer of each student layer.
  """
  keys_B11L = input_mask_BL[:, None, None, :] > 0
  masked = lambda s: jnp.where(keys_B11L, s.astype(jnp.float32), 0.0)  # noqa: E731
  mse = lambda a, b: jnp.mean(jnp.square(a.astype(jnp.float32) - b.astype(jnp.float32)))  # noqa
  att = sum(mse(masked(student_scores[m]), masked(teacher_scores[j]))
            for m, j in enumerate(mapped))
  reps = [0] + [j + 1 for j in mapped]
  rep = sum(mse(student_layers_NBLD[i], teacher_layers_NBLD[j]) for i, j in enumerate(reps))
  return att, rep


def loss_fn(model, params, batch, rng, config, *, deterministic=False):
  """Returns (att_loss + rep_loss, metrics): att_loss, rep_loss (each its batch's value)."""
  segment_ids = batch.get("segment_ids", jnp.zeros_like(batch["input_ids"]))
  out, state = model.apply(params, batch["input_ids"], batch["input_mask"], segment_ids,
                           deterministic=deterministic, rngs={"dropout": rng},
                           mutable=[layers.SCORES])
  o = config.objective
  att, rep = layer_losses(
      attention_scores(state[layers.SCORES], "encoder", config.model.layers),
      attention_scores(state[layers.SCORES], "teacher", o.teacher_model.layers),
      out["student_layers"], out["teacher_layers"], batch["input_mask"], layer_map(config))
  one = jnp.ones([], jnp.float32)
  return att + rep, {"att_loss": (att, one), "rep_loss": (rep, one)}


def flops_per_token(config) -> float:
  """The student's training, the projection of its layers, and the teacher's forward pass (a
  third of its training FLOPs, flops.py's 2 : 4 forward to backward); no output layer."""
  length = config.data.seq_len
  s, t = config.model, config.objective.teacher_model
  student = flops.encoder_train_flops_per_token(s, length, 0, sentence_head=False)
  teacher = flops.encoder_train_flops_per_token(t, length, 0, sentence_head=False)
  projection = 6 * (s.layers + 1) * s.hidden * t.hidden if s.hidden != t.hidden else 0.0
  return student + projection + teacher / 3


def describe(config) -> str:
  s, t = config.model, config.objective.teacher_model
  return (f"TinyBERT general distillation: a {s.layers}-layer {s.hidden}-wide student of the "
          f"{t.layers}-layer {t.hidden}-wide teacher {config.objective.teacher} (its layers "
          f"{layer_map(config)}), {config.data.seq_len}-token rows, loss att + rep")
