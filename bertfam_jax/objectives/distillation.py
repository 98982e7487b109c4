"""DistilBERT's distillation of a masked LM (Sanh et al., 2019; spec §8; huggingface transformers
examples/research_projects/distillation: distiller.py, train.py, scripts/extract_distilbert.py).

The model (`models/pretraining.Distiller`) holds the student and the teacher. The teacher is any
masked-LM workdir of ours (`python -m bertfam_jax.hf import` makes one of a transformers BERT);
its weights are a collection that nothing trains, run in the same jitted step without dropout
and without gradients (train/step.py TRAINED). A fresh run starts the student from the teacher
(`initial_params`): the embeddings without token types, the MLM head, and teacher layers
`student_layer_map` (0, 2, 4, 7, 9, 11 of 12 for 6, as extract_distilbert.py).

Loss (distiller.py `step`), over the student's and teacher's logits at every real position:
  alpha_ce · T² · KL(softmax(t/T) ‖ softmax(s/T))   mean over real tokens ("batchmean")
+ alpha_mlm · cross-entropy at the masked positions  mean over them
+ alpha_cos · (1 − cos(h_s, h_t))                    mean over real tokens, last hidden layer
with the README's 5.0 / 2.0 / 1.0 and T = 2.

Masking (distiller.py `prepare_batch_mlm`, train.py's token_probs): ceil(mask_rate · real
tokens) positions drawn without replacement across the rows noised together, each with weight
max(count, 1)^−smoothing (0.7) of its token, special tokens never; 80% [MASK], 10% kept, 10% a
uniformly random id. Deviation: the reference counts tokens over its whole binarised corpus; the
host here sees a chunk of `data.docs_per_chunk` documents at a time and counts those.

Batch keys: input_ids (noised), input_mask, mlm_targets [n, L] int32 (the original ids);
mlm_weights [n, L] float32 1.0 at the masked positions.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bertfam_jax import config_lib, flops
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.models import pretraining
from bertfam_jax.objectives import losses, noise

FIELD_RULES = {
    "objective.mask_rate": config_lib.Range(0, 1, low_open=True, high_open=True),
    "objective.mask_token_prob": config_lib.PROBABILITY,
    "objective.random_token_prob": config_lib.PROBABILITY,
    "objective.smoothing": config_lib.Range(0),
    "objective.temperature": config_lib.POSITIVE,
    "objective.alpha_ce": config_lib.Range(0),
    "objective.alpha_mlm": config_lib.Range(0),
    "objective.alpha_cos": config_lib.Range(0),
    "objective.freeze_positions": (True, False),
}


def build_model(config):
  """The Distiller of `config.model`'s student, its position table frozen when
  `objective.freeze_positions` (the flag stays out of the saved model section, so fine-tuning
  the student or distilling from it trains its positions)."""
  student = ml_collections.ConfigDict(config.model.to_dict())
  student.freeze_positions = bool(config.objective.get("freeze_positions", False))
  return pretraining.Distiller(student, config.objective.teacher_model)


def student_layer_map(teacher_layers: int, student_layers: int) -> list[int]:
  """The teacher layer each student layer starts from: evenly spaced from the first to the last,
  rounded half up (12 → 6: 0, 2, 4, 7, 9, 11, extract_distilbert.py's choice); one student layer
  takes the first."""
  if student_layers == 1:
    return [0]
  step = (teacher_layers - 1) / (student_layers - 1)
  return [math.floor(i * step + 0.5) for i in range(student_layers)]


def layer_map(config) -> list[int]:
  """`objective.student_layers` ('2,5' etc.), or `student_layer_map`'s when it is empty."""
  given = config.objective.student_layers
  if given:
    return [int(i) for i in given.split(",")]
  return student_layer_map(config.objective.teacher_model.layers, config.model.layers)


# How a student may compute apart from its teacher (dropout, precision, memory, kernels).
STUDENT_COMPUTE = ("dropout", "attention_dropout", "dropout_bits", "dtype", "remat_policy",
                   "attention_impl", "scan_layers", "fused_qkv", "fp8_matmuls")
# What a DistilBERT student may set apart from its teacher: its depth and token types, and how it
# computes; every other model field is the teacher's.
_STUDENT_OWN = ("layers", "type_vocab_size") + STUDENT_COMPUTE


def check_student(student, teacher, *, own: tuple[str, ...], names: tuple[str, str],
                  fields_reason: str, layers_reason: str) -> None:
  """ConfigError unless the model section `student` can learn from `teacher`'s layers: every
  field but `own` the teacher's (`fields_reason`: why), both BERT-style encoders with layers of
  their own, unscanned (`layers_reason`: why), and the student no deeper. `names`: the two
  sections' config paths, as the messages name them."""
  for key in sorted(set(student) | set(teacher)):
    if key not in own and student.get(key) != teacher.get(key):
      raise ConfigError(f"{names[0]}.{key}={student.get(key)!r} differs from the teacher's "
                        f"{teacher.get(key)!r}; {fields_reason}, so set "
                        f"--config.{names[0]}.{key}={teacher.get(key)!r}.")
  for name, m in zip(names, (student, teacher)):
    if m.share_layers != "none" or m.scan_layers or m.get("kind", "encoder") != "encoder":
      raise ConfigError(f"{name}: {layers_reason}, so it needs a BERT-style encoder with layers "
                        f"of its own, unscanned (share_layers=none, scan_layers=False).")
  if student.layers > teacher.layers:
    raise ConfigError(f"{names[0]}.layers={student.layers} exceeds the teacher's "
                      f"{teacher.layers}; a student has at most its teacher's depth.")


def validate(config) -> None:
  """A student that can start from its teacher's layers: the same width, vocabulary and layer
  layout, at most the teacher's depth, and a layer map of one existing teacher layer each."""
  o, s = config.objective, config.model
  t = o.teacher_model
  check_student(s, t, own=_STUDENT_OWN, names=("model", "objective.teacher_model"),
                fields_reason="a DistilBERT student copies its teacher's layers",
                layers_reason="distillation copies layer by layer")
  if s.type_vocab_size:
    raise ConfigError(f"model.type_vocab_size={s.type_vocab_size}: DistilBERT's student has no "
                      f"token types; set --config.model.type_vocab_size=0.")
  try:
    mapped = layer_map(config)
  except ValueError:
    mapped = None
  if mapped is None or len(mapped) != s.layers or not all(0 <= i < t.layers for i in mapped):
    raise ConfigError(f"objective.student_layers={o.student_layers!r} must list model.layers="
                      f"{s.layers} teacher layers in [0, {t.layers}), comma-separated, or be '' "
                      f"for {student_layer_map(t.layers, s.layers)}.")
  if o.get("freeze_positions", False) and config.optimizer.weight_decay > 0:
    raise ConfigError(f"objective.freeze_positions keeps the student's position table at its "
                      f"teacher's, but optimizer.weight_decay={config.optimizer.weight_decay} "
                      f"would still shrink it; set --config.optimizer.weight_decay=0 (the "
                      f"recipe's) or --config.objective.freeze_positions=False.")
  if o.mask_token_prob + o.random_token_prob > 1.0:
    raise ConfigError(f"objective.mask_token_prob={o.mask_token_prob} and random_token_prob="
                      f"{o.random_token_prob} must sum to <= 1 (the rest stay unchanged).")
  if not o.teacher:
    raise ConfigError("objective.teacher is empty; pass the teacher's workdir in the config "
                      "argument: --config=configs/distilbert.py:teacher=DIR (it reads the "
                      "teacher's model and tokenizer from there).")


def init_inputs(config) -> dict[str, jnp.ndarray]:
  """One row (input_ids, input_mask [1, L]) to trace `Distiller.init`."""
  length = config.data.seq_len
  return dict(input_ids=jnp.zeros((1, length), jnp.int32),
              input_mask=jnp.ones((1, length), jnp.int32))


def initial_params(config, restore_params):
  """The student made from the teacher, and the teacher: {'params': student, TEACHER: {'teacher':
  teacher}} as host arrays. `restore_params(workdir)` reads a workdir's latest parameters (host
  numpy; train.py passes `workdir.restore_params`)."""
  saved = restore_params(config.objective.teacher)
  missing = [k for k in ("encoder", "mlm_head") if k not in saved]
  if missing:
    raise ConfigError(f"objective.teacher={config.objective.teacher} has no {missing} parameters "
                      f"(it has {sorted(saved)}); the teacher must be a masked-LM run (BERT, "
                      f"RoBERTa, ...) or an imported transformers BERT.")
  teacher = {"encoder": saved["encoder"], "mlm_head": saved["mlm_head"]}
  return {"params": {"encoder": student_encoder(teacher["encoder"], layer_map(config)),
                     "mlm_head": teacher["mlm_head"]},
          pretraining.TEACHER: {"teacher": teacher}}


def student_encoder(teacher_encoder: dict, layers: list[int]) -> dict:
  """The teacher's embeddings (without token types) and its `layers[i]` as layer_i."""
  student = {k: v for k, v in teacher_encoder.items()
             if not k.startswith("layer_") and k != "type_embeddings"}
  student.update({f"layer_{i}": teacher_encoder[f"layer_{j}"] for i, j in enumerate(layers)})
  return student


# ------------------------------------------------------------------------------- host-side masking


def make_features(config, tokenizer):
  """Returns the host-side masking `fn(rows, rng) -> batch` (module docstring)."""
  config_lib.check_fields(config, FIELD_RULES)
  config_lib.check_vocabulary(config, tokenizer, fix=(
      "the teacher's tokenizer and vocabulary go together (configs/distilbert.py reads both from the "
      "teacher's workdir)."))
  o = config.objective
  return functools.partial(
      distil_features,
      # train.py zeroes every special token's weight, [UNK] included (ours leave it out).
      special_ids=np.append(np.asarray(tokenizer.special_ids), tokenizer.unk_id),
      mask_id=tokenizer.mask_id, vocab_size=config.model.vocab_size, mask_rate=o.mask_rate,
      smoothing=o.smoothing,
      replace_probs=(o.mask_token_prob, max(0.0, 1.0 - o.mask_token_prob - o.random_token_prob),
                     o.random_token_prob))


def token_weights(input_ids, input_mask, special_ids, vocab_size: int, smoothing: float):
  """[V] float64: max(count, 1)^−smoothing of each id over the real tokens of `input_ids`, 0 for
  the special ids (train.py's token_probs)."""
  counts = noise.unigram_counts(input_ids, input_mask > 0, vocab_size)
  weights = np.maximum(counts, 1).astype(np.float64) ** -smoothing
  weights[special_ids] = 0.0
  return weights


def distil_features(rows, rng: np.random.Generator, *, special_ids, mask_id: int,
                    vocab_size: int, mask_rate: float, smoothing: float,
                    replace_probs: tuple[float, float, float]) -> dict:
  """DistilBERT's masking of packed rows (input_ids / input_mask [n, L]).

  Returns the rows with input_ids noised, mlm_targets [n, L] (the original ids) and mlm_weights
  [n, L] float32 (1.0 where a position is predicted)."""
  input_ids, input_mask = rows["input_ids"], rows["input_mask"]
  per_token = token_weights(input_ids, input_mask, special_ids, vocab_size, smoothing)
  position_weights = (per_token[input_ids] * (input_mask > 0)).ravel()
  candidates = int(np.count_nonzero(position_weights))
  count = min(math.ceil(mask_rate * int(np.sum(input_mask > 0))), candidates)
  chosen = np.zeros(input_ids.size, bool)
  if count:
    chosen[rng.choice(input_ids.size, size=count, replace=False,
                      p=position_weights / position_weights.sum())] = True
  chosen = chosen.reshape(input_ids.shape)
  # 0: [MASK], 1: kept, 2: a uniformly random id (distiller.py's pred_probs order).
  how = rng.choice(3, size=count, p=np.asarray(replace_probs) / np.sum(replace_probs))
  random_ids = rng.integers(0, vocab_size, size=count)
  original = input_ids[chosen]
  noised = input_ids.copy()
  noised[chosen] = np.where(how == 0, mask_id, np.where(how == 1, original, random_ids))
  return {**rows, "input_ids": noised.astype(np.int32),
          "mlm_targets": input_ids.astype(np.int32), "mlm_weights": chosen.astype(np.float32)}


# ------------------------------------------------------------------------------------- the loss


def soft_cross_entropy(student_logits, teacher_logits, weights, temperature: float):
  """T² · KL(softmax(t/T) ‖ softmax(s/T)) summed over the positions with `weights` (distiller.py's
  KLDivLoss, whose 'batchmean' divides by the selected positions: `sum / count` here).

  Args: logits [batch, length, vocab]; weights [batch, length] float.
  Returns (sum, count), float32 scalars."""
  log_s = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
  log_t = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / temperature, axis=-1)
  kl_BL = jnp.sum(jnp.exp(log_t) * (log_t - log_s), axis=-1)
  weights = weights.astype(jnp.float32)
  return temperature ** 2 * jnp.sum(kl_BL * weights), jnp.sum(weights)


def cosine_distance(student_hidden, teacher_hidden, weights):
  """1 − cos(h_s, h_t) summed over the positions with `weights` (distiller.py's
  CosineEmbeddingLoss with target 1; torch's eps 1e-8 on the norms' product).

  Args: hidden [batch, length, hidden]; weights [batch, length] float.
  Returns (sum, count), float32 scalars."""
  s = student_hidden.astype(jnp.float32)
  t = teacher_hidden.astype(jnp.float32)
  norms = jnp.sqrt(jnp.sum(s * s, -1) * jnp.sum(t * t, -1))
  cos_BL = jnp.sum(s * t, -1) / jnp.maximum(norms, 1e-8)
  weights = weights.astype(jnp.float32)
  return jnp.sum((1.0 - cos_BL) * weights), jnp.sum(weights)


def loss_fn(model, params, batch, rng, config, *, deterministic=False):
  """Returns (α_ce·L_ce + α_mlm·L_mlm + α_cos·L_cos, metrics): distill_ce, mlm_loss,
  mlm_accuracy, cosine_loss, and the teacher's teacher_mlm_accuracy on the same masks."""
  o = config.objective
  out = model.apply(params, batch["input_ids"], batch["input_mask"], deterministic=deterministic,
                    rngs={"dropout": rng})
  real_BL = batch["input_mask"].astype(jnp.float32)
  ce_sum, real = soft_cross_entropy(out["student_logits"], out["teacher_logits"], real_BL,
                                    o.temperature)
  mlm_sum, _, correct, masked = losses.token_cross_entropy(
      out["student_logits"], batch["mlm_targets"], batch["mlm_weights"])
  cos_sum, _ = cosine_distance(out["student_hidden"], out["teacher_hidden"], real_BL)
  _, _, teacher_correct, _ = losses.token_cross_entropy(
      out["teacher_logits"], batch["mlm_targets"], batch["mlm_weights"])
  mean = lambda total, count: total / jnp.maximum(count, 1.0)  # noqa: E731
  loss = (o.alpha_ce * mean(ce_sum, real) + o.alpha_mlm * mean(mlm_sum, masked)
          + o.alpha_cos * mean(cos_sum, real))
  metrics = {"distill_ce": (ce_sum, real), "mlm_loss": (mlm_sum, masked),
             "mlm_accuracy": (correct, masked), "cosine_loss": (cos_sum, real),
             "teacher_mlm_accuracy": (teacher_correct, masked)}
  return loss, metrics


def flops_per_token(config) -> float:
  """The student's training (its tied output at every position) plus the teacher's forward pass
  (a third of its training FLOPs, flops.py's 2 : 4 forward to backward)."""
  length = config.data.seq_len
  student = flops.encoder_train_flops_per_token(config.model, length, length, sentence_head=False)
  teacher = flops.encoder_train_flops_per_token(config.objective.teacher_model, length, length,
                                                sentence_head=False)
  return student + teacher / 3


def describe(config) -> str:
  o, t = config.objective, config.objective.teacher_model
  return (f"DistilBERT: a {config.model.layers}-layer student of the {t.layers}-layer teacher "
          f"{o.teacher} (its layers {layer_map(config)}), {config.data.seq_len}-token rows, "
          f"loss {o.alpha_ce}·CE(T={o.temperature}) + {o.alpha_mlm}·MLM + {o.alpha_cos}·cos")
