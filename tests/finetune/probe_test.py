"""Linear probe on frozen features: it reads what the features hold, deterministically."""

import flax.linen as nn
import jax
import numpy as np

from bertfam_jax.finetune import probe
from bertfam_jax.models import encoder as encoder_lib
from helpers import tiny


def tiny_encoder():
  model = tiny.encoder(layers=1, heads=2, vocab_size=50, max_positions=16)
  ids = np.zeros((1, 16), np.int32)
  params = nn.meta.unbox(encoder_lib.Encoder(model).init(jax.random.key(0), ids,
                                                         np.ones_like(ids), ids,
                                                         deterministic=True))
  return model, params["params"]


def data(num, seed, marker=7):
  """Random rows; label 1 where the marker token appears (twice, so the mean moves)."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(10, 50, (num, 16)).astype(np.int32)
  ids[:, 0], ids[:, -1] = 2, 3
  labels = rng.integers(0, 2, num).astype(np.int32)
  ids[labels == 1, 4] = marker
  ids[labels == 1, 9] = marker
  return dict(input_ids=ids, input_mask=np.ones_like(ids), segment_ids=np.zeros_like(ids),
              label=labels)


def test_mean_pooling_ignores_padding():
  model, params = tiny_encoder()
  batch = data(4, 0)
  padded = {k: v.copy() for k, v in batch.items()}
  padded["input_mask"][:, 12:] = 0
  padded["input_ids"][:, 12:] = 0
  features = probe.mean_pooled_features(model, params, padded)
  again = probe.mean_pooled_features(
      model, params, {**padded, "input_ids": np.where(padded["input_mask"] > 0,
                                                      padded["input_ids"], 17)})
  assert features.shape == (4, 32)
  np.testing.assert_allclose(features, again, atol=1e-5)   # padding content never matters


def test_probe_reads_a_linearly_present_signal_and_is_deterministic():
  model, params = tiny_encoder()
  train, evaluation = data(800, 1), data(400, 2)
  first = probe.linear_probe(model, params, train, evaluation, num_classes=2, steps=200)
  second = probe.linear_probe(model, params, train, evaluation, num_classes=2, steps=200)
  assert first["accuracy"] > 0.9
  np.testing.assert_array_equal(first["predictions"], second["predictions"])
  # With the marker never shown, the labels are noise to the features: chance.
  blind = probe.linear_probe(model, params, data(800, 1, marker=20), data(400, 2, marker=21),
                             num_classes=2, steps=200)
  assert blind["accuracy"] < 0.65
  # The gold label's loss per example: low where the probe reads the signal, no better than
  # the uniform prior's log 2 on noise (where the probe overfits), and above log 2 exactly where
  # the prediction is wrong (two classes).
  assert first["gold_nll"].shape == (400,)
  assert first["gold_nll"].mean() < 0.3
  assert blind["gold_nll"].mean() > np.log(2)
  wrong = first["predictions"] != evaluation["label"]
  np.testing.assert_array_equal(first["gold_nll"] > np.log(2), wrong)
