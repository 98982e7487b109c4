"""Pre-training heads, chosen by the objective, and fine-tuning heads, chosen by the task kind
(models/finetune.py); all separate from the encoder."""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertfam_jax.models import encoder, layers


def gather_positions(x_BLD, positions_BP):
  """[batch, length, hidden] at [batch, predictions] positions → [batch, predictions, hidden]."""
  return jnp.take_along_axis(x_BLD, positions_BP[..., None], axis=1)


def _pooler(c, dtype, init: str = "model"):
  """BERT's pooler dense H→H (modeling.py); callers apply it to the first token, then tanh.
  init 'torch_default': PyTorch's nn.Linear init (`layers.torch_linear_init`)."""
  if init == "torch_default":
    kernel_init, bias_init = layers.torch_linear_init(c.hidden, ("embed", "embed_out"),
                                                      ("embed_out",))
  else:
    kernel_init = layers.weight_init(c, ("embed", "embed_out"))
    bias_init = layers.zeros_init(("embed_out",))
  return nn.Dense(c.hidden, dtype=dtype, param_dtype=jnp.float32, kernel_init=kernel_init,
                  bias_init=bias_init, name="pooler")


def _classifier(c, dtype, features: int, in_axis: str | None, *, bare: bool = True,
                name: str = "classifier", init: str = "model"):
  """The task's output layer: dense → `features`, bias 0; its kernel `layers.bare_dense_init`
  (the model's `weight_init`, or ELECTRA's Glorot-uniform), or with `bare=False` the model's
  `weight_init` always (the NSP / SOP layer, which BERT and ALBERT initialise themselves).
  init 'torch_default': PyTorch's nn.Linear init, for a hidden-wide input (the pooled state)."""
  kernel_axes = (in_axis, None)
  if init == "torch_default":
    kernel_init, bias_init = layers.torch_linear_init(c.hidden, kernel_axes, (None,))
  else:
    kernel_init = (layers.bare_dense_init(c, kernel_axes) if bare else
                   layers.weight_init(c, kernel_axes))
    bias_init = layers.zeros_init((None,))
  return nn.Dense(features, dtype=dtype, param_dtype=jnp.float32, kernel_init=kernel_init,
                  bias_init=bias_init, name=name)


class MLMHead(nn.Module):
  """BERT's cls/predictions (run_pretraining.py get_masked_lm_output): gather the masked positions,
  dense H→H + activation + LayerNorm, then logits = h·Eᵀ + b with E the tied input embedding and
  b a separate zero-initialised output bias. Only the gathered positions are projected.
  With ALBERT's factorised embedding the transform is H→embedding_size and the LayerNorm acts in
  that width, so h meets the narrow table (albert run_pretraining.py get_masked_lm_output)."""
  config: Any  # the `config.model` section

  @nn.compact
  def __call__(self, x_BLD, positions_BP, attend: Callable):
    """x: [batch, length, hidden]; positions: [batch, predictions]; attend: [..., E] → [..., vocab].

    Returns logits [batch, predictions, vocab] in the compute dtype."""
    c = self.config
    dtype = jnp.dtype(c.dtype)
    width, axis = encoder.tied_head_features(c)
    h_BPD = gather_positions(x_BLD, positions_BP)
    h_BPE = nn.Dense(width, dtype=dtype, param_dtype=jnp.float32,
                     kernel_init=layers.weight_init(c, ("embed", axis)),
                     bias_init=layers.zeros_init((axis,)), name="transform")(h_BPD)
    h_BPE = layers.activation_fn(c.activation)(h_BPE)
    h_BPE = layers.LayerNorm(c.layer_norm_eps, dtype, axis_name=axis, name="transform_ln")(h_BPE)
    bias = self.param("output_bias", layers.zeros_init(("vocab",)), (c.vocab_size,), jnp.float32)
    return attend(h_BPE) + bias.astype(dtype)[None, None, :]


class SentenceHead(nn.Module):
  """Pooler (tanh dense on the first token, BERT's `pooler`) + a `num_classes` classifier (NSP, SOP).
  Returns logits [batch, num_classes]."""
  config: Any  # the `config.model` section
  num_classes: int = 2

  @nn.compact
  def __call__(self, x_BLD):
    c = self.config
    dtype = jnp.dtype(c.dtype)
    pooled_BD = nn.tanh(_pooler(c, dtype)(x_BLD[:, 0]))
    return _classifier(c, dtype, self.num_classes, "embed_out", bare=False)(pooled_BD)


class SpanBoundaryHead(nn.Module):
  """SpanBERT's span boundary objective head (models/pair_bert.py BertPairTargetPredictionHead).

  y = LN(GELU(W₂ · LN(GELU(W₁ [x_{s-1}; x_{e+1}; p_i])))) with p_i a learned `position_size`
  embedding of the target's offset in its span (`max_targets` rows), W₁: 2H + position_size → H,
  W₂: H → H (→ E with ALBERT's factorised embedding, to meet the tied table); logits = y·Eᵀ + b
  with E the tied word embeddings and b a separate zero-initialised bias.
  """
  config: Any  # the `config.model` section
  max_targets: int = 15
  position_size: int = 200

  @nn.compact
  def __call__(self, x_BLD, boundaries_BP2, offsets_BP, attend: Callable):
    """x: [batch, length, hidden]; boundaries: [batch, predictions, 2] (s - 1, e + 1);
    offsets: [batch, predictions]. Returns logits [batch, predictions, vocab]."""
    c = self.config
    dtype = jnp.dtype(c.dtype)
    batch, predictions, _ = boundaries_BP2.shape
    ends_BPD = gather_positions(x_BLD, boundaries_BP2.reshape(batch, 2 * predictions))
    ends_BPD = ends_BPD.reshape(batch, predictions, 2 * c.hidden)
    offsets_BPO = layers.Embedding(self.max_targets, self.position_size, c.initializer_range,
                                   dtype, rows_axis="positions", features_axis=None,
                                   weight_init=c.weight_init, name="offset_embeddings")(offsets_BP)
    h = jnp.concatenate([ends_BPD, offsets_BPO.astype(ends_BPD.dtype)], axis=-1)
    width, axis = encoder.tied_head_features(c)
    for name, features, out_axis in (("transform_1", c.hidden, "embed_out"),
                                     ("transform_2", width, axis)):
      h = nn.Dense(features, dtype=dtype, param_dtype=jnp.float32,
                   kernel_init=layers.weight_init(c, (None, out_axis)),
                   bias_init=layers.zeros_init((out_axis,)), name=name)(h)
      h = layers.activation_fn(c.activation)(h)
      h = layers.LayerNorm(c.layer_norm_eps, dtype, axis_name=out_axis, name=f"{name}_ln")(h)
    bias = self.param("output_bias", layers.zeros_init(("vocab",)), (c.vocab_size,), jnp.float32)
    return attend(h) + bias.astype(dtype)[None, None, :]


class ReplacedTokenHead(nn.Module):
  """ELECTRA's discriminator head (electra run_pretraining.py _get_discriminator_output; HF
  `discriminator_predictions`): dense H→H + activation, dense H→1, at every position.
  Returns logits [batch, length] that a token was replaced."""
  config: Any  # the `config.model` section

  @nn.compact
  def __call__(self, x_BLD):
    c = self.config
    dtype = jnp.dtype(c.dtype)
    h_BLD = nn.Dense(c.hidden, dtype=dtype, param_dtype=jnp.float32,
                     kernel_init=layers.weight_init(c, ("embed", "embed_out")),
                     bias_init=layers.zeros_init(("embed_out",)), name="transform")(x_BLD)
    h_BLD = layers.activation_fn(c.activation)(h_BLD)
    return nn.Dense(1, dtype=dtype, param_dtype=jnp.float32,
                    kernel_init=layers.bare_dense_init(c, ("embed_out", None)),
                    bias_init=layers.zeros_init((None,)), name="prediction")(h_BLD)[..., 0]


# ------------------------------------------------------------------------------- fine-tuning heads


class ClassificationHead(nn.Module):
  """BERT's run_classifier.py create_model on the pooled output: pooler (tanh dense on the token
  at `summary_position`: BERT's [CLS] at 0, XLNet's <cls> at -1, its summarize_sequence with
  summary_type 'last' and use_proj; named 'pooler' as in SentenceHead, so a pre-trained NSP
  pooler can be copied in), dropout (`config.dropout`, run_classifier's keep_prob 0.9), dense →
  `num_outputs` ('classifier'). Returns [batch, num_outputs].
  A causal model's (GPT: `model.causal`) has no pooler: dropout and the linear layer on the
  extract token's state (finetune-transformer-lm train.py `clf`); nor has one with `pooled`
  False (ELECTRA's classification and regression, `model.classifier_pooler`: its
  `get_pooled_output` is the first token's state). `choices` > 1: the rows are
  an example's choices, consecutive, and share one dropout mask (train.py drops `clf_h` of shape
  [batch, 2, n_embd] with noise_shape [batch, 1, n_embd]).
  `dropout` (None: the model's) and `head_init` (config_lib.FINETUNE_HEAD_INITS;
  'torch_default' for the pooler and the classifier: fairseq's RobertaClassificationHead,
  pooler_dropout 0, registered after init_bert_params)."""
  config: Any  # the `config.model` section
  num_outputs: int
  summary_position: int = 0
  pooled: bool = True
  dropout: float | None = None
  head_init: str = "model"   # (`init` would shadow Module.init)

  @nn.compact
  def __call__(self, x_BLD, *, deterministic: bool, choices: int = 1):
    c = self.config
    dtype = jnp.dtype(c.dtype)
    summary_BD = x_BLD[:, self.summary_position]
    pooled_BD = (nn.tanh(_pooler(c, dtype, self.head_init)(summary_BD))
                 if self.pooled and not c.get("causal", False) else summary_BD)
    dropout = layers.Dropout(c.dropout if self.dropout is None else self.dropout, c.dropout_bits)
    if choices > 1:
      rows, width = pooled_BD.shape
      keep_E1D = dropout(jnp.ones((rows // choices, 1, width), pooled_BD.dtype), deterministic)
      pooled_BD = (pooled_BD.reshape(-1, choices, width) * keep_E1D).reshape(rows, width)
    else:
      pooled_BD = dropout(pooled_BD, deterministic=deterministic)
    return _classifier(c, dtype, self.num_outputs, "embed_out", init=self.head_init)(pooled_BD)


class MultipleChoiceHead(ClassificationHead):
  """One score per row: a one-output ClassificationHead (pooler, dropout, dense → 1), squeezed to
  [rows]. Multiple choice (HF BertForMultipleChoice) scores every (context, choice) row with the
  choices folded into the batch, [batch · choices, length, hidden] → [batch · choices], unfolded to
  [batch, choices] by the caller; regression (HF's num_labels=1) reads [batch] values."""
  num_outputs: int = 1

  def __call__(self, x_BLD, *, deterministic: bool, choices: int = 1):
    return super().__call__(x_BLD, deterministic=deterministic, choices=choices)[:, 0]


class TokenClassificationHead(nn.Module):
  """Dropout then dense → `num_labels` at every position (HF BertForTokenClassification).
  Returns [batch, length, num_labels]."""
  config: Any  # the `config.model` section
  num_labels: int

  @nn.compact
  def __call__(self, x_BLD, *, deterministic: bool):
    c = self.config
    x_BLD = layers.Dropout(c.dropout, c.dropout_bits)(x_BLD, deterministic=deterministic)
    return _classifier(c, jnp.dtype(c.dtype), self.num_labels, "embed")(x_BLD)


class SpanHead(nn.Module):
  """Extractive QA (bert run_squad.py create_model): one dense H→2 at every position, no dropout.
  Returns [batch, length, 2]: start logits in [..., 0], end logits in [..., 1]."""
  config: Any  # the `config.model` section

  @nn.compact
  def __call__(self, x_BLD, *, deterministic: bool):
    del deterministic  # run_squad.py applies no dropout before the span logits
    c = self.config
    return _classifier(c, jnp.dtype(c.dtype), 2, "embed")(x_BLD)


# ELECTRA's joint QA head: the width of its hidden layers (qa_tasks.py's literal 512), and the
# penalty that keeps a start or end outside the answer mask out of its softmax (1000·(mask − 1)).
JOINT_QA_HIDDEN = 512
JOINT_QA_PENALTY = 1000.0


class _PairDense(nn.Module):
  """dense(concat([a, b], -1)), one [2·hidden, features] kernel as the reference's, computed as
  a·W_a + b·W_b + bias so that a broadcast against b ([..., 1, D] with [..., L, D]) never builds
  the [..., L, 2·D] concatenation."""
  config: Any
  features: int

  @nn.compact
  def __call__(self, a, b):
    c = self.config
    dtype = jnp.dtype(c.dtype)
    width = a.shape[-1]
    kernel = self.param("kernel", layers.bare_dense_init(c, (None, None)),
                        (2 * width, self.features), jnp.float32).astype(dtype)
    bias = self.param("bias", layers.zeros_init((None,)), (self.features,), jnp.float32)
    y = a.astype(dtype) @ kernel[:width] + b.astype(dtype) @ kernel[width:]
    return y + bias.astype(dtype).reshape((1,) * (y.ndim - 1) + (-1,))


class JointSpanHead(nn.Module):
  """ELECTRA's SQuAD head (electra finetune/qa/qa_tasks.py `get_prediction_module` with
  configure_finetuning.py's joint_prediction, answerable_classifier and
  answerable_uses_start_logits, all on by default): the end is predicted given the start.

    start logits  dense H → 1 at every position ('start')
    end logits    dense 2H → 512 + GELU ('qa_hidden') on [h_start; h_j], dense → 1 ('qa_logits')
    answerable    dense 2H → 512 + GELU ('answerable_hidden') on [h_0; Σ_j softmax(start)_j h_j],
                  dense → 1 ('answerable'): the logit that the window has *no* answer

  Starts and ends outside `answer_mask` (the context, its closing [SEP] and position 0) take
  −1000. Training (`start_positions` given) conditions the end on the gold start; prediction
  keeps the `beam_size` best starts (log-softmax) and, for each, the `beam_size` best ends.
  Dense layers are bare (`layers.bare_dense_init`: ELECTRA's Glorot-uniform); GELU is ELECTRA's
  `modeling.gelu`, the exact erf form; no dropout (qa_tasks.py applies none).

  Returns, with start_positions: start_logits, end_logits [batch, length] and answerable_logit
  [batch] (float32); without: start_top_log_probs, start_top_index [batch, K], end_top_log_probs,
  end_top_index [batch, K, K] and answerable_logit, K = min(beam_size, length)."""
  config: Any  # the `config.model` section
  beam_size: int = 20

  @nn.compact
  def __call__(self, x_BLD, *, deterministic: bool, answer_mask_BL, start_positions_B=None):
    del deterministic   # no dropout in the head
    c = self.config
    gelu = layers.activation_fn("gelu")
    dense = lambda features, name: _classifier(c, jnp.dtype(c.dtype), features, None,  # noqa: E731
                                               name=name)
    penalty_BL = JOINT_QA_PENALTY * (answer_mask_BL.astype(jnp.float32) - 1.0)
    start_BL = dense(1, "start")(x_BLD)[..., 0].astype(jnp.float32) + penalty_BL
    qa_hidden = _PairDense(c, JOINT_QA_HIDDEN, name="qa_hidden")
    qa_logits = dense(1, "qa_logits")
    start_p_BL = jax.nn.softmax(start_BL, axis=-1).astype(x_BLD.dtype)
    summary_BD = jnp.concatenate([x_BLD[:, 0], jnp.einsum("bl,bld->bd", start_p_BL, x_BLD)], -1)
    answerable_B = dense(1, "answerable")(
        gelu(dense(JOINT_QA_HIDDEN, "answerable_hidden")(summary_BD)))[:, 0]
    answerable_B = answerable_B.astype(jnp.float32)
    if start_positions_B is not None:
      start_B1D = gather_positions(x_BLD, start_positions_B[:, None])
      end_BL = qa_logits(gelu(qa_hidden(start_B1D, x_BLD)))[..., 0]
      return dict(start_logits=start_BL, end_logits=end_BL.astype(jnp.float32) + penalty_BL,
                  answerable_logit=answerable_B)
    k = min(self.beam_size, x_BLD.shape[1])
    start_top_BK, start_index_BK = jax.lax.top_k(jax.nn.log_softmax(start_BL, axis=-1), k)
    start_BK1D = gather_positions(x_BLD, start_index_BK)[:, :, None, :]
    end_BKL = qa_logits(gelu(qa_hidden(start_BK1D, x_BLD[:, None])))[..., 0]
    end_BKL = end_BKL.astype(jnp.float32) + penalty_BL[:, None, :]
    end_top_BKK, end_index_BKK = jax.lax.top_k(jax.nn.log_softmax(end_BKL, axis=-1), k)
    return dict(start_top_log_probs=start_top_BK, start_top_index=start_index_BK,
                end_top_log_probs=end_top_BKK, end_top_index=end_index_BKK,
                answerable_logit=answerable_B)


def answer_mask(input_mask_BL, segment_ids_BL):
  """ELECTRA's QA answer mask: the second segment's real tokens (the context and its closing
  [SEP]) and position 0 ([CLS], the no-answer position).
  [batch, length] → [batch, length] int32."""
  first_1L = (jnp.arange(input_mask_BL.shape[-1]) == 0)[None, :]
  return ((jnp.asarray(input_mask_BL) * segment_ids_BL != 0) | first_1L).astype(jnp.int32)


def normalize_layers(hidden_NBLD, mask_BL):
  """bilm-tf's `weight_layers(do_layer_norm=True)` `_do_ln` (allennlp ScalarMix alike): each
  layer less its mean, over its variance's root (ε 1e-12), both taken over every real token of
  the batch and every feature at once, no learned scale. [layers, batch, length, hidden], mask
  [batch, length] → [layers, batch, length, hidden] float32."""
  x = hidden_NBLD.astype(jnp.float32)
  mask = mask_BL.astype(jnp.float32)[None, :, :, None]
  count = jnp.maximum(jnp.sum(mask) * x.shape[-1], 1.0)
  mean = jnp.sum(x * mask, axis=(1, 2, 3), keepdims=True) / count
  variance = jnp.sum(((x - mean) * mask) ** 2, axis=(1, 2, 3), keepdims=True) / count
  return (x - mean) * jax.lax.rsqrt(variance + 1e-12)


class ScalarMix(nn.Module):
  """ELMo's scalar mix (Peters et al., 2018, eq. 1; bilm-tf `weight_layers`, allennlp
  ScalarMix): γ · Σ_j softmax(w)_j · h_j over the `num_layers` hidden states, w = 0 (an average)
  and γ = 1 at initialisation; with `layer_norm` each h_j first normalised over the batch's real
  tokens (`normalize_layers`, bilm-tf's do_layer_norm). bilm-tf's λ‖w‖² lives in the loss
  (`finetune.mix_l2`). [num_layers, batch, length, hidden] → [batch, length, hidden]."""
  num_layers: int
  layer_norm: bool = False

  @nn.compact
  def __call__(self, hidden_NBLD, mask_BL=None):
    if hidden_NBLD.shape[0] != self.num_layers:
      raise ValueError(f"ScalarMix of {self.num_layers} layers got {hidden_NBLD.shape[0]}.")
    weights = self.param("weights", layers.zeros_init((None,)), (self.num_layers,), jnp.float32)
    gamma = self.param("gamma", nn.with_logical_partitioning(nn.initializers.ones_init(), ()),
                       (), jnp.float32)
    mix_N = (gamma * jax.nn.softmax(weights)).astype(hidden_NBLD.dtype)
    if self.layer_norm:
      hidden_NBLD = normalize_layers(hidden_NBLD, mask_BL).astype(hidden_NBLD.dtype)
    return jnp.einsum("n,nbld->bld", mix_N, hidden_NBLD)
