"""Encoder + heads assembled for pre-training; objectives pick the assembly in `build_model`."""

from __future__ import annotations

from typing import Any

import flax.linen as nn

from bertfam_jax.models import encoder, heads


class MaskedLM(nn.Module):
  """Encoder with the tied MLM head and, when `sentence_classes > 0`, the NSP/SOP head (BERT)."""
  config: Any  # the `config.model` section
  sentence_classes: int = 0

  def setup(self):
    self.encoder = encoder.Encoder(self.config)
    self.mlm_head = heads.MLMHead(self.config)
    if self.sentence_classes:
      self.sentence_head = heads.SentenceHead(self.config, self.sentence_classes)

  def __call__(self, input_ids, input_mask, segment_ids, mlm_positions, *, deterministic: bool):
    """input_ids/input_mask/segment_ids: [batch, length]; mlm_positions: [batch, predictions].

    Returns {'mlm_logits': [batch, predictions, vocab]} plus 'sentence_logits' [batch, classes].
    """
    x_BLD = self.encoder(input_ids, input_mask, segment_ids, deterministic=deterministic)
    outputs = {"mlm_logits": self.mlm_head(x_BLD, mlm_positions, self.encoder.attend)}
    if self.sentence_classes:
      outputs["sentence_logits"] = self.sentence_head(x_BLD)
    return outputs
