"""A pre-trained backbone + a task head, for every fine-tuning task kind.

  model = FineTuneModel(config.model, kind="classification", num_outputs=3)
  logits = model.apply({"params": params}, input_ids, input_mask, segment_ids, deterministic=True)

Parameters: 'encoder' (the backbone, named as in pretraining.MaskedLM and electra.Electra, so a
pre-trained encoder drops in), 'scalar_mix' when `features='weighted_sum'`, and the head of the
kind: 'classification_head' ({'pooler', 'classifier'}: a pre-trained NSP/SOP pooler,
'sentence_head/pooler', can be copied in), 'token_head', 'span_head' or 'choice_head'.

GPT (a causal `Encoder`, backbone 'causal'; Radford et al. 2018 §3.3): rows are its input
transformations ([start] text [extract], [start] A [delim] B [extract], one row per choice), right
padded; a sequence-level head reads the extract token, each row's last real one, and has no
pooler. `orders=2` (GPT's similarity input) folds both orders of a pair, [batch, 2, length], and
sums their extract states before the head. `with_lm=True` also returns the LM logits of every
row [..., length, vocab] for GPT's auxiliary loss. GPT fine-tunes sequence-level tasks only.

Backbones: `BACKBONES[family](config_model, name="encoder")` builds a module whose
`__call__(input_ids, input_mask, segment_ids, *, deterministic, return_all_layers=False)` returns
hidden states [batch, length, hidden], or with `return_all_layers` the pair (those, [layers + 1,
batch, length, hidden]) as `Encoder` does. `backbone_for(config_model)` picks the entry:
'xlnet' for model.kind='xlnet' (the content stream, no permutation: every token sees every
token), else 'encoder'. A family with another network (T5's encoder) adds one entry.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertfam_jax import config_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.models import encoder, heads, pretraining, xlnet


class XLNetContent(xlnet.XLNet):
  """XLNet as a fine-tuning backbone: the content stream of the whole sequence, bidirectional
  (no perm_mask), no query stream and no memory, as the reference's classifiers use it."""

  def __call__(self, input_ids, input_mask, segment_ids, *, deterministic: bool,
               return_all_layers: bool = False):
    if return_all_layers:
      raise ConfigError("XLNet fine-tuning reads its last layer only; set "
                        "--config.finetune.features=last.")
    return super().__call__(input_ids, segment_ids=segment_ids, input_mask=input_mask,
                            deterministic=deterministic)["content"]


BACKBONES = {"encoder": encoder.Encoder, "xlnet": XLNetContent, "causal": encoder.Encoder}
# Where a backbone's rows keep the token a sequence summary reads: BERT's [CLS] first; XLNet's
# <cls> last, its rows padded on the left (xlnet classifier_utils.py, summary_type='last'); GPT's
# extract token last, rows padded on the right: gathered per row (`_extract_states`), then 0.
SUMMARY_POSITION = {"encoder": 0, "xlnet": -1, "causal": 0}
SEQUENCE_KINDS = ("classification", "regression", "multiple_choice")


def backbone_for(config_model) -> str:
  """The BACKBONES key of a pre-trained `model` section."""
  if config_model.get("kind") == "xlnet":
    return "xlnet"
  return "causal" if config_model.get("causal", False) else "encoder"


def _extract_states(x_BLD, input_mask_BL):
  """[rows, length, hidden] → [rows, 1, hidden]: each row's last real token (GPT's extract)."""
  last_B = jnp.sum(input_mask_BL, axis=-1) - 1
  return jnp.take_along_axis(x_BLD, last_B[:, None, None], axis=1)


# kind → (head module name, head(config_model, width, summary_position, name), output width
# fixed by the kind or None when `num_outputs` sets it). Every head maps [rows, length, hidden] →
# [rows, ...]; the sequence-level ones read the summary token at `summary_position`.
# Classification and regression pool as `model.classifier_pooler` says (ELECTRA: no pooler);
# multiple choice always pools (HF's ElectraForMultipleChoice: its summary projection).
# The sequence-level heads also take `settings`: their dropout and init (FineTuneModel's
# head_dropout and head_init).
KINDS = {
    "classification": ("classification_head", lambda c, width, at, name, **settings:
                       heads.ClassificationHead(c, width, summary_position=at,
                                                pooled=c.classifier_pooler, name=name,
                                                **settings), None),
    # One real value per example, in a head named as classification's so a pooler carries over.
    "regression": ("classification_head", lambda c, _, at, name, **settings:
                   heads.MultipleChoiceHead(c, summary_position=at, pooled=c.classifier_pooler,
                                            name=name, **settings), 1),
    "token_classification": ("token_head", lambda c, width, _, name: heads.TokenClassificationHead(
        c, width, name=name), None),
    "extractive_qa": ("span_head", lambda c, _, __, name: heads.SpanHead(c, name=name), 2),
    "multiple_choice": ("choice_head", lambda c, _, at, name, **settings:
                        heads.MultipleChoiceHead(c, summary_position=at, name=name, **settings),
                        1),
}


def output_width(kind: str, num_outputs: int) -> int:
  """The head's output width: `num_outputs` (classes or labels, >= 1) for classification and
  token_classification; fixed for the other kinds, where `num_outputs` must be 0 or that width."""
  if kind not in KINDS:
    raise ConfigError(f"Fine-tuning kind {kind!r}; choose one of {sorted(KINDS)}.")
  fixed = KINDS[kind][2]
  if fixed is None:
    if num_outputs < 1:
      raise ConfigError(f"A {kind} task needs num_outputs >= 1 (its number of classes or labels); "
                        f"got {num_outputs}.")
    return num_outputs
  if num_outputs not in (0, fixed):
    raise ConfigError(f"A {kind} task has {fixed} output(s) per example; got num_outputs="
                      f"{num_outputs} (pass 0 or {fixed}).")
  return fixed


class FineTuneModel(nn.Module):
  """Backbone → features (the last layer, or ELMo's scalar mix of the embedding output and every
  layer) → the kind's head. Outputs:
    classification        [batch, num_outputs] logits
    regression            [batch] predictions
    token_classification  [batch, length, num_outputs] logits
    extractive_qa         [batch, length, 2] start / end logits (run_squad.py's head); with
                          qa_head='joint', ELECTRA's `heads.JointSpanHead` dict
    multiple_choice       [batch, choices] scores (inputs [batch, choices, length])
  """
  config: Any  # the `config.model` section
  kind: str
  num_outputs: int = 0
  features: str = "last"  # last | weighted_sum
  backbone: str = "encoder"  # key of BACKBONES
  orders: int = 1  # 2: GPT's similarity input, both orders of a pair summed (module docstring)
  mix_layer_norm: bool = False  # weighted_sum: each layer normalised first (bilm-tf)
  qa_head: str = "independent"  # extractive_qa: independent (run_squad.py) | joint (ELECTRA's)
  qa_beam: int = 20  # the joint head's starts kept, and ends kept per start, when predicting
  head_dropout: float | None = None  # a sequence-level head's dropout; None = the model's
  head_init: str = "model"  # a sequence-level head's init: config_lib.FINETUNE_HEAD_INITS

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, *, deterministic: bool,
               with_lm: bool = False, with_layers: bool = False, start_positions=None):
    """input_ids / input_mask / segment_ids: [batch, length] int ([batch, choices, length] for
    multiple_choice, whose choices are folded into the batch; [batch, 2, length] with
    orders=2). `with_lm` (causal backbones): returns (the head's output, LM logits [..., length,
    vocab] of every input row). `with_layers`: returns (the head's output, the backbone's
    embedding output and every layer's, [layers + 1, rows, length, hidden], rows folded).
    `start_positions` [batch] int: the gold starts the joint QA head conditions its end logits
    on (training); None predicts with its beam."""
    width = output_width(self.kind, self.num_outputs)
    causal = self.backbone == "causal"
    if causal and self.kind not in SEQUENCE_KINDS:
      raise ConfigError(f"GPT fine-tunes sequence-level tasks ({', '.join(SEQUENCE_KINDS)}: "
                        f"the paper's input transformations), not {self.kind}.")
    if (self.orders != 1 or with_lm) and not causal:
      raise ConfigError("finetune.pair_orders=2 and finetune.lm_coef > 0 are GPT's; a "
                        f"{self.backbone} backbone takes pair_orders=1 and lm_coef=0.")
    if self.features not in config_lib.FINETUNE_FEATURES:
      raise ConfigError(f"features={self.features!r}; choose one of "
                        f"{config_lib.FINETUNE_FEATURES}.")
    if self.head_init not in config_lib.FINETUNE_HEAD_INITS:
      raise ConfigError(f"head_init={self.head_init!r}; choose one of "
                        f"{config_lib.FINETUNE_HEAD_INITS}.")
    if self.qa_head not in config_lib.FINETUNE_QA_HEADS:
      raise ConfigError(f"qa_head={self.qa_head!r}; choose one of {config_lib.FINETUNE_QA_HEADS}.")
    if self.backbone not in BACKBONES:
      raise ConfigError(f"backbone={self.backbone!r}; choose one of {sorted(BACKBONES)}.")
    batch_shape = input_ids.shape[:-1]
    fold = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
    backbone = BACKBONES[self.backbone](self.config, name="encoder")
    if with_lm and with_layers:
      raise ValueError("FineTuneModel returns the LM logits or the layers, not both.")
    if self.features == "weighted_sum" or with_layers:
      last_BLD, hidden_NBLD = backbone(fold(input_ids), fold(input_mask), fold(segment_ids),
                                       deterministic=deterministic, return_all_layers=True)
      x_BLD = (heads.ScalarMix(hidden_NBLD.shape[0], self.mix_layer_norm, name="scalar_mix")(
                   hidden_NBLD, fold(input_mask))
               if self.features == "weighted_sum" else last_BLD)
    else:
      last_BLD = x_BLD = backbone(fold(input_ids), fold(input_mask), fold(segment_ids),
                                  deterministic=deterministic)
    lm_logits = None
    if with_lm:
      # The LM reads the last layer, whatever the head, and (GPT) the step's dropped table.
      lm_logits = backbone.attend(last_BLD, deterministic)
      lm_logits = lm_logits.reshape(input_ids.shape + lm_logits.shape[-1:])
    if causal:
      x_BLD = _extract_states(x_BLD, fold(input_mask))
    if self.orders == 2:
      x_BLD = jnp.sum(x_BLD.reshape((-1, 2) + x_BLD.shape[1:]), axis=1)
      batch_shape = batch_shape[:-1]
    name, head, _ = KINDS[self.kind]
    settings = (dict(dropout=self.head_dropout, head_init=self.head_init)
                if self.kind in SEQUENCE_KINDS else {})
    # GPT's classifier dropout: one mask per example, shared by its choices (train.py).
    shared = dict(choices=batch_shape[-1]) if causal and self.kind == "multiple_choice" else {}
    if self.kind == "extractive_qa" and self.qa_head == "joint":
      head = lambda c, *_, name: heads.JointSpanHead(c, self.qa_beam, name=name)  # noqa: E731
      shared = dict(answer_mask_BL=heads.answer_mask(input_mask, segment_ids),
                    start_positions_B=start_positions)
    out = head(self.config, width, SUMMARY_POSITION[self.backbone], name=name, **settings)(
        x_BLD, deterministic=deterministic, **shared)
    # multiple choice: [batch, choices]
    out = jax.tree.map(lambda o: o.reshape(batch_shape + o.shape[1:]), out)
    if with_layers:
      return out, hidden_NBLD
    return (out, lm_logits) if with_lm else out


class TaskDistiller(nn.Module):
  """TinyBERT's task-specific distillation (finetune/distill.py): the student `FineTuneModel`,
  whose parameters are this module's own ('encoder', the head, ...: a distilled workdir predicts
  and exports as any fine-tuning), `fit_dense` (student → teacher width, whatever the widths) and
  the teacher `FineTuneModel` on the same task in the TEACHER collection, without dropout.

  `__call__` is the student's (prediction); `distill` returns both models' outputs and, with
  `layers`, every layer of both (apply with mutable=[layers.SCORES] for the attention
  scores)."""
  student: FineTuneModel
  teacher_config: Any          # the teacher's `config.model`
  teacher_features: str = "last"
  teacher_mix_layer_norm: bool = False   # the teacher's finetune.mix_layer_norm
  teacher_qa_head: str = "independent"   # the teacher's finetune.qa_head (its QA head's layers)

  def setup(self):
    nn.share_scope(self, self.student)
    # TinyBertForSequenceClassification(is_student=True) builds fit_dense whatever the widths.
    self.fit_dense = pretraining.fit_dense(self.student.config, self.teacher_config.hidden)
    self.teacher = pretraining.teacher_module(FineTuneModel, self.is_initializing())(
        self.teacher_config, self.student.kind, self.student.num_outputs,
        features=self.teacher_features, backbone=backbone_for(self.teacher_config),
        mix_layer_norm=self.teacher_mix_layer_norm, qa_head=self.teacher_qa_head)

  def __call__(self, input_ids, input_mask, segment_ids, *, deterministic: bool):
    if self.is_initializing():   # create every parameter, the teacher's and fit_dense too
      return self.distill(input_ids, input_mask, segment_ids, deterministic=deterministic,
                          layers=True)["student"]
    return self.student(input_ids, input_mask, segment_ids, deterministic=deterministic)

  def distill(self, input_ids, input_mask, segment_ids, *, deterministic: bool, layers: bool):
    """{'student', 'teacher': the head outputs} and, with `layers`, {'student_layers',
    'teacher_layers': [layers + 1, rows, length, teacher hidden]} (the student's projected)."""
    if not layers:
      return {"student": self.student(input_ids, input_mask, segment_ids,
                                      deterministic=deterministic),
              "teacher": self.teacher(input_ids, input_mask, segment_ids,
                                            deterministic=True)}
    student, student_NBLD = self.student(input_ids, input_mask, segment_ids,
                                         deterministic=deterministic, with_layers=True)
    teacher, teacher_NBLD = self.teacher(input_ids, input_mask, segment_ids,
                                               deterministic=True, with_layers=True)
    return {"student": student, "teacher": teacher, "student_layers": self.fit_dense(student_NBLD),
            "teacher_layers": teacher_NBLD}
