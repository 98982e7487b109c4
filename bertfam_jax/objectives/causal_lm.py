"""GPT's causal language model (Radford et al., 2018; openai/finetune-transformer-lm, spec §8).

Rows are consecutive pieces of one token stream of documents each closed by the end-of-document
id (`data.packing='lm_stream'`, `packing.lm_stream`); every position predicts the next token of
the stream, and the loss is the mean cross-entropy over the real targets. Nothing is noised on
the host: the packed rows are the batch.

Batch keys: input_ids, input_mask, target_ids [n, L] int32; loss_weights [n, L] float32.
"""

from __future__ import annotations

import jax.numpy as jnp

from bertfam_jax import config_lib, flops
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.models import pretraining
from bertfam_jax.objectives import losses


def build_model(config):
  return pretraining.CausalLM(config.model)


def validate(config) -> None:
  """The causal LM reads `lm_stream` rows, with a stack whose layers are its own (a shared
  layer module would hold one KV cache for several layers)."""
  if config.model.share_layers != "none":
    raise ConfigError(f"model.share_layers={config.model.share_layers!r}: a causal LM keeps one KV "
                      "cache per layer module; set --config.model.share_layers=none.")
  if config.data.packing != "lm_stream":
    raise ConfigError(f"objective.name='causal_lm' reads language-model rows; set "
                      f"--config.data.packing=lm_stream (it is {config.data.packing!r}).")


def init_inputs(config) -> dict[str, jnp.ndarray]:
  """One row (input_ids, input_mask [1, L]) to trace `CausalLM.init`."""
  length = config.data.seq_len
  return dict(input_ids=jnp.zeros((1, length), jnp.int32),
              input_mask=jnp.ones((1, length), jnp.int32))


def make_features(config, tokenizer):
  """The packed rows are the batch: `fn(rows, rng) -> rows`, after checking the vocabulary."""
  config_lib.check_vocabulary(config, tokenizer)
  return lm_features


def lm_features(rows, rng):
  """`packing.lm_stream`'s rows as they are (no host-side noise; `rng` unused)."""
  del rng
  return rows


def loss_fn(model, params, batch, rng, config, *, deterministic=False):
  """Returns (mean next-token cross-entropy over the real targets, {lm_loss, lm_accuracy})."""
  del config
  logits_BLV = model.apply(params, batch["input_ids"], batch["input_mask"],
                           deterministic=deterministic, rngs={"dropout": rng})
  total, _, correct, count = losses.token_cross_entropy(logits_BLV, batch["target_ids"],
                                                        batch["loss_weights"])
  metrics = {"lm_loss": (total, count), "lm_accuracy": (correct, count)}
  return total / jnp.maximum(count, 1.0), metrics


def flops_per_token(config) -> float:
  """The decoder as an encoder (causal attention counted in full, flops.py's convention) with the
  tied output at every position."""
  return flops.encoder_train_flops_per_token(config.model, config.data.seq_len,
                                             config.data.seq_len, sentence_head=False)


def describe(config) -> str:
  m = config.model
  return (f"Causal LM on {config.data.seq_len}-token rows of one document stream "
          f"({'pre' if m.pre_layer_norm else 'post'}-LN GPT, {m.layers} x {m.hidden})")
