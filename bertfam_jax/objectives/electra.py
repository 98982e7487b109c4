"""ELECTRA: replaced-token detection with a jointly trained generator (Clark et al., 2020;
google-research/electra run_pretraining.py, pretrain/pretrain_helpers.py), and the variants of the
paper's efficiency analysis (§3.5) as configuration.

Host side (`make_features`): the masked-LM composition of objectives/mlm.py with ELECTRA's
masking (`config_lib.electra_objective`): positions drawn uniformly with replacement among the
non-special tokens, `max_predictions` = int((rate + 0.005)·L), 85% [MASK] / 15% unchanged.

Device side (`loss_fn`), one step:
  1. generator MLM logits at the masked positions of the masked input;
  2. x̂ ~ softmax(logits / temperature) by Gumbel-max, under stop_gradient: nothing from the
     discriminator's loss reaches the generator through the samples;
  3. the discriminator's input is the ORIGINAL sequence with x̂ written at every masked
     position (it never sees [MASK], the 15% kept positions included);
  4. replaced = (input ≠ original), so a sample equal to the original counts as original.

Loss = generator_weight · L_MLM + discriminator_weight · L_D, by `objective.variant`:
  electra          L_D = Σ sigmoid-CE over every non-padding token / (#tokens + 1e-6)
  electra_15       the same sum over the masked positions only
  replace_mlm      L_D = MLM cross-entropy of the discriminator at the masked positions, its
                   input replaced by generator samples instead of [MASK]
  all_tokens_mlm   L_D = cross-entropy at every token, p = D·[x = input] + (1 − D)·softmax with
                   D a sigmoid copy gate (the paper's "explicit copy mechanism")
L_MLM = Σ w·CE / (Σ w + 1e-6) (run_pretraining.py `_get_masked_lm_output`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from bertfam_jax import config_lib, flops
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.models import electra
from bertfam_jax.objectives import losses, mlm

# run_pretraining.py adds 1e-6 to both loss denominators.
DENOMINATOR_EPS = 1e-6
# pretrain_helpers / run_pretraining `disallow_correct`: the true token's logit is lowered by this.
DISALLOW_CORRECT_PENALTY = 1000.0

_HEADS = {"electra": "rtd", "electra_15": "rtd", "replace_mlm": "mlm",
          "all_tokens_mlm": "mlm_copy"}


def generator_config(config):
  """The generator's `model` section for `config` (config_lib.electra_generator)."""
  o = config.objective
  return config_lib.electra_generator(config.model, o.generator_hidden_fraction,
                                      o.generator_layers_fraction)


VARIANTS = tuple(_HEADS)


FIELD_RULES = {
    **mlm.FIELD_RULES,
    "objective.variant": VARIANTS,
    "objective.generator_hidden_fraction": config_lib.Range(0, 1, low_open=True),
    "objective.generator_layers_fraction": config_lib.Range(0, 1, low_open=True),
    "objective.generator_weight": config_lib.AT_LEAST_0,
    "objective.discriminator_weight": config_lib.AT_LEAST_0,
    "objective.temperature": config_lib.POSITIVE,
}


def validate(config) -> None:
  """The masked LM's checks (`mlm.validate`), ELECTRA's variant and a generator shape that can
  be built."""
  mlm.validate(config)
  o = config.objective
  if o.sentence_task:
    raise ConfigError("ELECTRA has no sentence-level task: set --config.objective.sentence_task=''.")
  generator = generator_config(config)
  if generator.hidden < 1 or generator.layers < 1 or generator.hidden % generator.heads:
    raise ConfigError(
        f"objective.generator_hidden_fraction={o.generator_hidden_fraction} / "
        f"generator_layers_fraction={o.generator_layers_fraction} give a generator of hidden "
        f"{generator.hidden}, {generator.layers} layers, {generator.heads} heads; choose fractions "
        "giving >= 1 layer and a hidden size divisible by max(1, hidden // 64).")


def build_model(config):
  variant = config.objective.variant
  if variant not in _HEADS:
    raise ConfigError(f"objective.variant={variant!r}; choose one of {VARIANTS}.")
  return electra.Electra(config.model, generator_config(config),
                         discriminator_head=_HEADS[variant])


# ELECTRA's discriminator and generator read the masked-LM rows, described as the masked LM's.
init_inputs = mlm.init_inputs
describe = mlm.describe


def make_features(config, tokenizer):
  """ELECTRA's host-side masking is the masked-LM composition (see config_lib.electra_objective)."""
  return mlm.make_features(config, tokenizer)


def flops_per_token(config) -> float:
  """Training FLOPs per token (bertfam_jax/flops.py) of BOTH networks: the generator with its MLM head
  at the P masked positions, the discriminator with its variant's head (detection: dense H→H and
  H→1 at every token; Replace MLM: the tied MLM head at P positions; All-tokens MLM: that head
  at every token plus the copy gate). Sampling is not counted (no matmul)."""
  o, d = config.objective, config.model
  length, predictions = config.data.seq_len, o.max_predictions
  generator = flops.encoder_train_flops_per_token(generator_config(config), length, predictions,
                                                  False)
  head = _HEADS[o.variant]
  discriminator_predictions = {"rtd": 0, "mlm": predictions, "mlm_copy": length}[head]
  discriminator = flops.encoder_train_flops_per_token(d, length, discriminator_predictions, False)
  if head == "rtd":
    discriminator += 6 * (d.hidden * d.hidden + d.hidden)
  elif head == "mlm_copy":
    discriminator += 6 * d.hidden
  return float(generator + discriminator)


def scatter_positions(ids_BL, positions_BP, values_BP, weights_BP):
  """`ids` [batch, length] with `values` [batch, predictions] written at `positions` where
  `weights` > 0; padding slots write nothing (their position 0 is a real token)."""
  ids_BL = jnp.asarray(ids_BL)
  length = ids_BL.shape[1]
  rows_B1 = jnp.arange(ids_BL.shape[0])[:, None]
  where_BP = jnp.where(weights_BP > 0, positions_BP, length)  # out of range → dropped
  return ids_BL.at[rows_B1, where_BP].set(jnp.asarray(values_BP, ids_BL.dtype), mode="drop")


def discriminator_inputs(masked_ids_BL, positions_BP, targets_BP, weights_BP, sampled_BP):
  """(originals, fake_ids), both [batch, length]: the un-noised sequence (the targets written
  back at the masked positions) and the discriminator's input, that sequence with the samples
  written at every masked position ([MASK] and kept alike: run_pretraining.py
  `_get_fake_data` scatters into the ORIGINAL ids)."""
  originals = scatter_positions(masked_ids_BL, positions_BP, targets_BP, weights_BP)
  return originals, scatter_positions(originals, positions_BP, sampled_BP, weights_BP)


def sample_replacements(logits_BPV, targets_BP, rng, *, temperature: float,
                        disallow_correct: bool):
  """x̂ ~ softmax(logits / T) at each slot by Gumbel-max (run_pretraining.py `sample_from_
  softmax`), in float32, without gradient; `disallow_correct` subtracts 1000 from the target's
  tempered logit, as run_pretraining.py does after dividing by T. Returns [batch, predictions]
  int32."""
  logits = jax.lax.stop_gradient(logits_BPV).astype(jnp.float32) / temperature
  if disallow_correct:
    logits -= DISALLOW_CORRECT_PENALTY * jax.nn.one_hot(targets_BP, logits.shape[-1])
  return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)


def _ratio(metrics, name, numerator, denominator):
  metrics[name] = (jnp.sum(numerator.astype(jnp.float32)), jnp.sum(denominator.astype(jnp.float32)))


def _detection_loss(logits_BL, replaced_BL, weights_BL, metrics):
  """Σ w·sigmoid-CE / (Σ w + 1e-6), with accuracy, precision and recall of 'replaced', and the
  replaced share of the detected positions (1 − it is the accuracy of a detector that always
  says 'original'; the sampler's `replaced_fraction` over the real tokens, the same number
  where every real token is detected, not for the masked-only variant)."""
  logits = logits_BL.astype(jnp.float32)
  labels = replaced_BL.astype(jnp.float32)
  weights = weights_BL.astype(jnp.float32)
  total = jnp.sum(optax.sigmoid_binary_cross_entropy(logits, labels) * weights)
  count = jnp.sum(weights)
  predicted = (logits > 0) & (weights > 0)
  actual = replaced_BL & (weights > 0)
  metrics["discriminator_loss"] = (total, count)
  _ratio(metrics, "discriminator_accuracy", (predicted == replaced_BL) * weights, weights)
  _ratio(metrics, "discriminator_precision", predicted & actual, predicted)
  _ratio(metrics, "discriminator_recall", predicted & actual, actual)
  _ratio(metrics, "replaced_share", actual, weights > 0)
  return total / (count + DENOMINATOR_EPS)


def _copy_mlm_loss(mlm_logits_BLV, copy_logits_BL, inputs_BL, originals_BL, weights_BL, metrics):
  """All-tokens MLM with a copy gate D = σ(copy_logit): p(x) = D·[x = input] + (1 − D)·softmax(x),
  cross-entropy of the original token at every weighted position."""
  log_softmax = jax.nn.log_softmax(mlm_logits_BLV.astype(jnp.float32), axis=-1)
  copy = copy_logits_BL.astype(jnp.float32)
  log_generate = jax.nn.log_sigmoid(-copy) + jnp.take_along_axis(
      log_softmax, originals_BL[..., None], axis=-1)[..., 0]
  copied = inputs_BL == originals_BL
  log_p = jnp.where(copied, jnp.logaddexp(jax.nn.log_sigmoid(copy), log_generate), log_generate)
  weights = weights_BL.astype(jnp.float32)
  total, count = -jnp.sum(log_p * weights), jnp.sum(weights)
  # The mixture's most probable token: the input token gains D, the rest scale by (1 − D).
  mixture = jnp.exp(log_softmax) * jax.nn.sigmoid(-copy)[..., None]
  mixture += jax.nn.one_hot(inputs_BL, mixture.shape[-1]) * jax.nn.sigmoid(copy)[..., None]
  correct = jnp.argmax(mixture, axis=-1) == originals_BL
  metrics["mlm_loss"] = (total, count)
  _ratio(metrics, "mlm_accuracy", correct * weights, weights)
  return total / (count + DENOMINATOR_EPS)


def loss_fn(model, params, batch, rng, config, *, deterministic=False):
  """Returns (generator_weight · L_MLM + discriminator_weight · L_D, metrics); see the module
  docstring. Metrics: generator_mlm_{loss,accuracy}, sampled_original (fraction of samples equal
  to the original token), replaced_fraction, and the variant's discriminator_{loss,accuracy,
  precision,recall} or mlm_{loss,accuracy}."""
  o = config.objective
  generator_rng, sample_rng, discriminator_rng = jax.random.split(rng, 3)
  masked_ids, input_mask = batch["input_ids"], batch["input_mask"]
  segment_ids = batch["segment_ids"]
  positions, targets, weights = batch["mlm_positions"], batch["mlm_targets"], batch["mlm_weights"]
  metrics = {}

  generator_logits = model.apply(params, masked_ids, input_mask, segment_ids, positions,
                                 deterministic=deterministic, rngs={"dropout": generator_rng},
                                 method="generate")
  loss = o.generator_weight * losses.mean_cross_entropy(
      generator_logits, targets, weights, metrics, "generator_mlm", DENOMINATOR_EPS)

  sampled = sample_replacements(generator_logits, targets, sample_rng,
                                temperature=o.temperature, disallow_correct=o.disallow_correct)
  originals, fake_ids = discriminator_inputs(masked_ids, positions, targets, weights, sampled)
  real = input_mask > 0
  replaced = (fake_ids != originals) & real
  _ratio(metrics, "sampled_original", (sampled == targets) * weights, weights)
  _ratio(metrics, "replaced_fraction", replaced, real)

  outputs = model.apply(params, fake_ids, input_mask, segment_ids, positions,
                        deterministic=deterministic, rngs={"dropout": discriminator_rng},
                        method="discriminate")
  if o.variant == "electra":
    discriminator_loss = _detection_loss(outputs["rtd_logits"], replaced, real, metrics)
  elif o.variant == "electra_15":
    masked = scatter_positions(jnp.zeros_like(masked_ids), positions, jnp.ones_like(positions),
                               weights) > 0
    discriminator_loss = _detection_loss(outputs["rtd_logits"], replaced, masked, metrics)
  elif o.variant == "replace_mlm":
    discriminator_loss = losses.mean_cross_entropy(outputs["mlm_logits"], targets, weights,
                                                   metrics, "mlm", DENOMINATOR_EPS)
  else:
    discriminator_loss = _copy_mlm_loss(outputs["mlm_logits"], outputs["copy_logits"], fake_ids,
                                        originals, real, metrics)
  return loss + o.discriminator_weight * discriminator_loss, metrics
