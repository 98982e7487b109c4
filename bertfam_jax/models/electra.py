"""ELECTRA: a small masked-LM generator and a discriminator sharing one embedding (Clark et al.,
2020, arXiv:2003.10555; google-research/electra run_pretraining.py).

The discriminator is the module named `encoder`, so fine-tuning code that reads a pre-training
checkpoint's `params['encoder']` gets the discriminator with its embeddings, exactly a BERT
encoder's layout; the generator (`generator`, `generator_head`) is dropped there. The generator
owns no embedding tables: it reads the discriminator's word / position / type tables and
embedding LayerNorm (electra's shared `electra/embeddings` scope), projects them to its own width
(`embeddings_projection`) and ties its MLM head to the same word table.

`discriminator_head` picks the efficiency-analysis variant's head (paper §3.5):
  rtd       replaced-token detection, one logit per token (ELECTRA, ELECTRA 15%)
  mlm       the tied MLM head at the masked positions (Replace MLM)
  mlm_copy  the tied MLM head at every position plus a sigmoid copy gate (All-tokens MLM)
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from bertfam_jax.models import encoder, heads, layers

DISCRIMINATOR_HEADS = ("rtd", "mlm", "mlm_copy")


class Electra(nn.Module):
  config: Any            # the discriminator's `config.model` section
  generator_config: Any  # config_lib.electra_generator(config.model, ...)
  discriminator_head: str = "rtd"

  def setup(self):
    if self.discriminator_head not in DISCRIMINATOR_HEADS:
      raise ValueError(f"discriminator_head={self.discriminator_head!r}; choose one of "
                       f"{DISCRIMINATOR_HEADS}.")
    self.encoder = encoder.Encoder(self.config)
    self.generator = encoder.Encoder(self.generator_config, embeddings_from=self.encoder)
    self.generator_head = heads.MLMHead(self.generator_config)
    if self.discriminator_head == "rtd":
      self.rtd_head = heads.ReplacedTokenHead(self.config)
    else:
      self.mlm_head = heads.MLMHead(self.config)
    if self.discriminator_head == "mlm_copy":
      c = self.config
      self.copy_gate = nn.Dense(
          1, dtype=jnp.dtype(c.dtype), param_dtype=jnp.float32,
          kernel_init=layers.weight_init(c, ("embed", None)),
          bias_init=layers.zeros_init((None,)))

  def generate(self, input_ids, input_mask, segment_ids, mlm_positions, *, deterministic: bool):
    """The generator's MLM logits [batch, predictions, vocab] at `mlm_positions` [batch,
    predictions] of the masked input [batch, length]."""
    x_BLG = self.generator(input_ids, input_mask, segment_ids, deterministic=deterministic)
    return self.generator_head(x_BLG, mlm_positions, self.generator.attend)

  def discriminate(self, input_ids, input_mask, segment_ids, mlm_positions, *,
                   deterministic: bool):
    """The discriminator on the generator-filled input [batch, length]. Returns, by head:
    rtd {'rtd_logits': [batch, length]}; mlm {'mlm_logits': [batch, predictions, vocab]} at
    `mlm_positions`; mlm_copy {'mlm_logits': [batch, length, vocab], 'copy_logits': [batch,
    length]} at every position."""
    x_BLD = self.encoder(input_ids, input_mask, segment_ids, deterministic=deterministic)
    if self.discriminator_head == "rtd":
      return {"rtd_logits": self.rtd_head(x_BLD)}
    if self.discriminator_head == "mlm":
      return {"mlm_logits": self.mlm_head(x_BLD, mlm_positions, self.encoder.attend)}
    every_BL = jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
    return {"mlm_logits": self.mlm_head(x_BLD, every_BL, self.encoder.attend),
            "copy_logits": self.copy_gate(x_BLD)[..., 0]}

  def __call__(self, input_ids, input_mask, segment_ids, mlm_positions, *, deterministic: bool):
    """Both networks on the same input (used to initialise every parameter); the objective
    calls `generate`, samples, then `discriminate` (objectives/electra.py)."""
    outputs = self.discriminate(input_ids, input_mask, segment_ids, mlm_positions,
                                deterministic=deterministic)
    outputs["generator_logits"] = self.generate(input_ids, input_mask, segment_ids,
                                                mlm_positions, deterministic=deterministic)
    return outputs
