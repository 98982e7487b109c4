"""Encoder + heads assembled for pre-training; objectives pick the assembly in `build_model`."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from bertfam_jax.models import encoder, heads, layers


class MaskedLM(nn.Module):
  """Encoder with the tied MLM head; when `sentence_classes > 0` the NSP / SOP / StructBERT head;
  when `sbo_max_targets > 0` SpanBERT's span boundary head."""
  config: Any  # the `config.model` section
  sentence_classes: int = 0
  sbo_max_targets: int = 0
  sbo_position_size: int = 200

  def setup(self):
    self.encoder = encoder.Encoder(self.config)
    self.mlm_head = heads.MLMHead(self.config)
    if self.sentence_classes:
      self.sentence_head = heads.SentenceHead(self.config, self.sentence_classes)
    if self.sbo_max_targets:
      self.sbo_head = heads.SpanBoundaryHead(self.config, self.sbo_max_targets,
                                             self.sbo_position_size)

  def __call__(self, input_ids, input_mask, segment_ids, mlm_positions, *, sbo_boundaries=None,
               sbo_offsets=None, deterministic: bool, attention_mask=None,
               return_hidden: bool = False):
    """input_ids/input_mask/segment_ids: [batch, length]; mlm_positions: [batch, predictions];
    sbo_boundaries: [batch, predictions, 2] and sbo_offsets: [batch, predictions] (SBO only).

    Returns {'mlm_logits': [batch, predictions, vocab]} plus 'sentence_logits' [batch, classes]
    and 'sbo_logits' [batch, predictions, vocab] when those heads exist, and with
    `return_hidden` the last layer 'hidden' [batch, length, hidden]. `attention_mask`
    [batch, 1, length, length] bool: UniLM's per-row masks (encoder.Encoder).
    """
    x_BLD = self.encoder(input_ids, input_mask, segment_ids, deterministic=deterministic,
                         attention_mask=attention_mask)
    outputs = {"mlm_logits": self.mlm_head(x_BLD, mlm_positions, self.encoder.attend)}
    if return_hidden:
      outputs["hidden"] = x_BLD
    if self.sentence_classes:
      outputs["sentence_logits"] = self.sentence_head(x_BLD)
    if self.sbo_max_targets:
      if sbo_boundaries is None and self.is_initializing():
        # The train loop initialises every model from the MLM inputs alone (train/step.py).
        sbo_boundaries = jnp.zeros(mlm_positions.shape + (2,), jnp.int32)
        sbo_offsets = jnp.zeros_like(mlm_positions)
      outputs["sbo_logits"] = self.sbo_head(x_BLD, sbo_boundaries, sbo_offsets,
                                            self.encoder.attend)
    return outputs


# A teacher's weights (DistilBERT, TinyBERT): a variable collection of their own, which nothing
# trains (train/step.py TRAINED), kept in checkpoints beside the student's 'params'.
TEACHER = "teacher"


def _as_teacher(variables):
  """The wrapped teacher's 'params' stored as the TEACHER collection (its init, `Distiller`)."""
  return {TEACHER: variables.get("params", {}), "params": {}}


def _from_teacher(variables):
  """The TEACHER collection seen by the wrapped teacher as its 'params'."""
  return {"params": variables.get(TEACHER, {})}


def teacher_module(module_cls, initializing: bool):
  """`module_cls` with its 'params' read from (and, when `initializing`, initialised into) the
  TEACHER collection: a teacher inside a student's model (Distiller, LayerDistiller,
  models/finetune.TaskDistiller)."""
  return nn.map_variables(module_cls, ("params", TEACHER), trans_in_fn=_from_teacher,
                          trans_out_fn=_as_teacher, init=initializing, mutable=initializing)


class Distiller(nn.Module):
  """DistilBERT (Sanh et al., 2019): a student encoder with the tied MLM head, its parameters
  named as `MaskedLM`'s (so a distilled workdir fine-tunes as any MLM run), and a
  teacher `MaskedLM` whose weights are the TEACHER collection. The teacher runs without dropout
  (distiller.py puts it in eval mode) and without its sentence or span heads."""
  config: Any          # the student's `config.model`
  teacher_config: Any  # the teacher's

  def setup(self):
    self.encoder = encoder.Encoder(self.config)
    self.mlm_head = heads.MLMHead(self.config)
    self.teacher = teacher_module(MaskedLM, self.is_initializing())(self.teacher_config)

  def __call__(self, input_ids, input_mask, *, deterministic: bool):
    """input_ids / input_mask: [batch, length]. Returns the logits at every position and the last
    layer of both: {'student_logits', 'teacher_logits': [batch, length, vocab];
    'student_hidden', 'teacher_hidden': [batch, length, hidden]} (no token types: segment 0)."""
    positions_BL = jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
    x_BLD = self.encoder(input_ids, input_mask, deterministic=deterministic)
    taught = self.teacher(input_ids, input_mask, jnp.zeros_like(input_ids), positions_BL,
                          deterministic=True, return_hidden=True)
    return {"student_logits": self.mlm_head(x_BLD, positions_BL, self.encoder.attend),
            "student_hidden": x_BLD,
            "teacher_logits": taught["mlm_logits"], "teacher_hidden": taught["hidden"]}


def fit_dense(student_config, teacher_hidden: int) -> nn.Dense:
  """TinyBERT's `fit_dense`: a learned student-hidden → `teacher_hidden` projection with bias,
  [..., hidden] → [..., teacher hidden] (TinyBertForPreTraining builds it whatever the widths)."""
  return nn.Dense(teacher_hidden, dtype=jnp.dtype(student_config.dtype), param_dtype=jnp.float32,
                  kernel_init=layers.weight_init(student_config, ("embed", "embed_out")),
                  bias_init=layers.zeros_init(("embed_out",)))


class LayerDistiller(nn.Module):
  """TinyBERT's general distillation (Jiao et al., 2020; huawei-noah TinyBERT general_distill.py):
  a student encoder and a teacher encoder (the TEACHER collection, no dropout) over the same
  tokens, each returning every layer. The student's layers pass through `fit_dense`, a learned
  hidden → teacher-hidden projection (with bias; TinyBertForPreTraining builds and applies its
  fit_dense whatever the widths, so a student as wide as its teacher has one too). Attention
  scores reach the loss as sown values (layers.SelfAttention), so apply with
  mutable=[layers.SCORES]."""
  config: Any          # the student's `config.model`
  teacher_config: Any  # the teacher's

  def setup(self):
    self.encoder = encoder.Encoder(self.config)
    self.fit_dense = fit_dense(self.config, self.teacher_config.hidden)
    self.teacher = teacher_module(encoder.Encoder, self.is_initializing())(
        self.teacher_config)

  def __call__(self, input_ids, input_mask, segment_ids, *, deterministic: bool):
    """input_ids / input_mask / segment_ids: [batch, length]. Returns {'student_layers',
    'teacher_layers': [layers + 1, batch, length, teacher hidden]}: the embedding output then
    every layer's output, the student's projected to the teacher's width."""
    _, student_NBLD = self.encoder(input_ids, input_mask, segment_ids,
                                   deterministic=deterministic, return_all_layers=True)
    _, teacher_NBLD = self.teacher(input_ids, input_mask, segment_ids, deterministic=True,
                                   return_all_layers=True)
    return {"student_layers": self.fit_dense(student_NBLD), "teacher_layers": teacher_NBLD}


class CausalLM(nn.Module):
  """GPT (Radford et al., 2018): the Transformer stack with causal self-attention
  (`model.causal`; module name `encoder`, as every BERT-style stack here) and the output tied to
  the token embedding, with no output bias (finetune-transformer-lm, HF GPT2LMHeadModel)."""
  config: Any  # the `config.model` section

  def setup(self):
    self.encoder = encoder.Encoder(self.config)

  def __call__(self, input_ids, input_mask, *, deterministic: bool, decode: bool = False):
    """input_ids, input_mask: [batch, length] → next-token logits [batch, length, vocab] in the
    compute dtype; `decode`: the KV cache (encoder.Encoder)."""
    x_BLD = self.encoder(input_ids, input_mask, deterministic=deterministic, decode=decode)
    return self.encoder.attend(x_BLD, deterministic)   # GPT's logits read the dropped table
