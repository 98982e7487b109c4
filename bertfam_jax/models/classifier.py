"""Encoder + heads assembled for fine-tuning (BERT's run_classifier.py `create_model`)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn

from bertfam_jax.models import encoder, heads


class SequenceClassifier(nn.Module):
  """The pre-training `Encoder` with a `SentenceHead` (tanh pooler on [CLS] + `num_classes`
  classifier) on top. Parameters are named as in `MaskedLM` ('encoder', 'sentence_head'), so a
  pre-trained encoder drops in unchanged.

  Deviation: BERT's run_classifier.py also applies dropout (0.1) to the pooled output before the
  classifier; `SentenceHead` has no dropout there.
  """
  config: Any  # the `config.model` section
  num_classes: int

  def setup(self):
    self.encoder = encoder.Encoder(self.config)
    self.sentence_head = heads.SentenceHead(self.config, self.num_classes)

  def __call__(self, input_ids, input_mask, segment_ids, *, deterministic: bool):
    """input_ids/input_mask/segment_ids: [batch, length] → logits [batch, num_classes]."""
    x_BLD = self.encoder(input_ids, input_mask, segment_ids, deterministic=deterministic)
    return self.sentence_head(x_BLD)
