"""ELMo's biLM (models/elmo.py) against float64 numpy transcriptions of bilm-tf's maths: the
character CNN with highway and projection, TF's LSTMCell with projection and clipping unrolled in
both directions over padded rows, the skip connection; which words each direction sees; the
sampled softmax (objectives/losses.py) against its formula and its sampler's distribution; TF's
Adagrad (train/optimizer.py); the initialisations."""

import jax
import jax.numpy as jnp
import flax.linen as nn
import numpy as np
import pytest

from bertfam_jax import config_lib
from bertfam_jax.models import elmo
from bertfam_jax.objectives import losses
from bertfam_jax.train import optimizer as optimizer_lib

BATCH, WORDS, CHARS, VOCAB = 2, 7, 9, 30
LENGTHS = (WORDS, 4)   # the second row ends in 3 padding words


def tiny_config(**overrides):
  """Clips of 0.5 / 0.3 so that clipping happens in the tests' unrolls."""
  return config_lib.elmo_model("small", **{**dict(
      vocab_size=VOCAB, max_characters=CHARS, char_embedding_dim=5,
      char_filters=((1, 4), (2, 4), (3, 6)), highway_layers=2, projection_dim=6,
      lstm_cells=10, cell_clip=0.5, proj_clip=0.3, dropout=0.0), **overrides})


def make_inputs(seed=0):
  rng = np.random.default_rng(seed)
  chars = rng.integers(0, elmo.NUM_CHARACTERS, (BATCH, WORDS, CHARS)).astype(np.int32)
  mask = (np.arange(WORDS)[None] < np.array(LENGTHS)[:, None]).astype(np.int32)
  return chars, mask


def random_params(config, seed=0, scale=0.5):
  """The BiLM's parameter tree filled with N(0, scale²) (the char table with N(0, 1)), so that
  gates saturate neither way and the clips engage."""
  model = elmo.BiLM(config)
  chars, mask = make_inputs()
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), chars, mask))["params"]
  rng = np.random.default_rng(seed)
  params = jax.tree_util.tree_map_with_path(
      lambda path, s: jnp.asarray(rng.normal(size=s.shape) * (
          1.0 if path[-1].key == "char_embedding" else scale), jnp.float32), shapes)
  return model, params


def sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def reference_token_encoder(p, chars, c):
  """bilm-tf `_build_word_char_embeddings` in numpy: [B, W, C] → [B, W, projection]."""
  x = np.asarray(p["char_embedding"], np.float64)[chars]            # [B, W, C, E]
  pooled = []
  for i, (width, filters) in enumerate(c.char_filters):
    kernel, bias = np.asarray(p[f"conv_{i}"], np.float64), np.asarray(p[f"conv_{i}_bias"])
    steps = chars.shape[-1] - width + 1
    conv = np.stack([sum(x[:, :, s + k] @ kernel[k] for k in range(width)) + bias
                     for s in range(steps)], axis=2)                 # [B, W, steps, F]
    pooled.append(np.maximum(conv.max(axis=2), 0.0))
  h = np.concatenate(pooled, axis=-1)
  for i in range(c.highway_layers):
    q = p[f"highway_{i}"]
    gate = sigmoid(h @ q["carry"]["kernel"] + q["carry"]["bias"])
    h = gate * np.maximum(h @ q["transform"]["kernel"] + q["transform"]["bias"], 0) + (1 - gate) * h
  return h @ p["projection"]["kernel"] + p["projection"]["bias"]


def reference_direction(p, x, length, c, reverse):
  """One row's LSTM stack (TF's LSTMCell with num_proj, clips, forget bias 1; the skip connection
  from the second layer on) over its first `length` words, read backwards when `reverse`:
  each layer's [length, projection]."""
  order = list(range(length))[::-1] if reverse else list(range(length))
  outputs, h = [], x[:length]
  for i in range(c.lstm_layers):
    q = p[f"layer_{i}"]
    cell, m = np.zeros(c.lstm_cells), np.zeros(c.projection_dim)
    out = np.zeros((length, c.projection_dim))
    for t in order:
      gates = np.concatenate([h[t], m]) @ q["gates"]["kernel"] + q["gates"]["bias"]
      gi, gj, gf, go = np.split(gates, 4)
      cell = np.clip(sigmoid(gf + 1.0) * cell + sigmoid(gi) * np.tanh(gj), -c.cell_clip,
                     c.cell_clip)
      m = np.clip((sigmoid(go) * np.tanh(cell)) @ q["projection"]["kernel"], -c.proj_clip,
                  c.proj_clip)
      out[t] = m
    if c.skip_connections and i > 0:
      out = out + h
    outputs.append(out)
    h = out
  return outputs


def as_float64(tree):
  return jax.tree.map(lambda x: np.asarray(x, np.float64), tree)


def test_forward_matches_the_bilm_tf_transcription():
  config = tiny_config()
  model, params = random_params(config)
  chars, mask = make_inputs()
  out = model.apply({"params": params}, chars, mask)
  p = as_float64(params)
  token = reference_token_encoder(p["token_encoder"], chars, config)
  np.testing.assert_allclose(out["token"], token, rtol=1e-5, atol=1e-5)
  clipped = 0
  for row, length in enumerate(LENGTHS):
    for direction, reverse in (("forward", False), ("backward", True)):
      expected = reference_direction(p[f"{direction}_lm"], token[row], length, config, reverse)
      for layer, want in enumerate(expected):
        np.testing.assert_allclose(out[direction][layer][row, :length], want, rtol=1e-5,
                                   atol=1e-5, err_msg=f"row {row} {direction} layer {layer}")
        clipped += np.sum(np.isclose(np.abs(want), config.proj_clip))
  assert clipped > 0   # the projection clip was exercised
  h = np.asarray(out["forward"][-1])
  np.testing.assert_allclose(model.apply({"params": params}, h, method=elmo.BiLM.logits),
                             h @ p["softmax_kernel"].T + p["softmax_bias"], rtol=1e-5, atol=1e-5)


def test_each_direction_sees_only_its_side():
  """A word changed at position 3: the forward LM's states before it and the backward LM's after
  it stay as they were; padding never reaches a real word's states."""
  model, params = random_params(tiny_config())
  chars, mask = make_inputs()
  changed = chars.copy()
  changed[:, 3] = (changed[:, 3] + 7) % elmo.NUM_CHARACTERS
  padded = chars.copy()
  padded[1, LENGTHS[1]:] = 0
  a, b, c = (model.apply({"params": params}, x, mask) for x in (chars, changed, padded))
  for layer in range(2):
    np.testing.assert_array_equal(a["forward"][layer][:, :3], b["forward"][layer][:, :3])
    np.testing.assert_array_equal(a["backward"][layer][0, 4:], b["backward"][layer][0, 4:])
    assert not np.allclose(a["forward"][layer][:, 3:], b["forward"][layer][:, 3:])
    assert not np.allclose(a["backward"][layer][:, :4], b["backward"][layer][:, :4])
    for direction in ("forward", "backward"):
      np.testing.assert_array_equal(a[direction][layer][1, :LENGTHS[1]],
                                    c[direction][layer][1, :LENGTHS[1]])


def test_dropout_is_on_the_inputs_and_the_top_only_when_training():
  config = tiny_config(dropout=0.5)
  model, params = random_params(config)
  chars, mask = make_inputs()
  apply = lambda deterministic, seed=0: model.apply(  # noqa: E731
      {"params": params}, chars, mask, deterministic=deterministic,
      rngs={"dropout": jax.random.key(seed)})
  np.testing.assert_array_equal(apply(True)["forward"][0], model.apply(
      {"params": params}, chars, mask)["forward"][0])
  assert not np.allclose(apply(False)["forward"][0], apply(True)["forward"][0])
  np.testing.assert_array_equal(apply(False)["token"], apply(True)["token"])   # none in the CNN
  top = lambda deterministic: model.apply(  # noqa: E731
      {"params": params}, apply(True), "forward", deterministic=deterministic,
      rngs={"dropout": jax.random.key(1)}, method=elmo.BiLM.top)
  dropped = np.asarray(top(False))
  assert np.mean(dropped == 0) > 0.3
  np.testing.assert_allclose(dropped[dropped != 0], 2 * np.asarray(top(True))[dropped != 0],
                             rtol=1e-6)


def test_representation_layers_are_the_token_layer_twice_then_each_lstm_layer():
  model, params = random_params(tiny_config())
  out = model.apply({"params": params}, *make_inputs())
  reps = elmo.representation_layers(out)
  assert reps.shape == (3, BATCH, WORDS, 12)
  np.testing.assert_array_equal(reps[0], np.concatenate([out["token"]] * 2, -1))
  np.testing.assert_array_equal(reps[2], np.concatenate([out["forward"][1], out["backward"][1]],
                                                        -1))


def test_initialisation_follows_bilm_tf():
  config = config_lib.elmo_model("small", vocab_size=500, max_characters=CHARS)
  model = elmo.BiLM(config)
  params = nn.unbox(model.init(jax.random.key(0), *make_inputs()))["params"]
  cnn = params["token_encoder"]
  assert np.abs(cnn["char_embedding"]).max() <= 1.0 and np.std(cnn["char_embedding"]) > 0.5
  assert np.abs(cnn["conv_6"]).max() <= 0.05 and np.std(cnn["conv_6"]) > 0.025
  np.testing.assert_array_equal(cnn["highway_0"]["carry"]["bias"], -2.0)
  np.testing.assert_allclose(np.std(cnn["highway_0"]["carry"]["kernel"]), 2048 ** -0.5, rtol=0.02)
  np.testing.assert_allclose(np.std(cnn["projection"]["kernel"]), 2048 ** -0.5, rtol=0.02)
  gates = params["forward_lm"]["layer_0"]["gates"]["kernel"]   # Glorot-uniform [128 + 128, 4096]
  np.testing.assert_allclose(np.abs(gates).max(), np.sqrt(6 / (256 + 4096)), rtol=0.01)
  np.testing.assert_allclose(np.std(params["softmax_kernel"]), 128 ** -0.5, rtol=0.05)


def test_sampled_softmax_is_tfs_formula_without_accidental_hits():
  rng = np.random.default_rng(0)
  h, kernel, bias = rng.normal(size=(5, 6)), rng.normal(size=(VOCAB, 6)), rng.normal(size=VOCAB)
  targets = np.array([0, 3, 7, 3, 29], np.int32)
  sampled = np.array([1, 3, 3, 0, 12, 2], np.int32)   # target 3 drawn twice: both masked
  got = losses.sampled_softmax_cross_entropy(jnp.asarray(h, jnp.float32), targets,
                                             jnp.asarray(kernel, jnp.float32),
                                             jnp.asarray(bias, jnp.float32), sampled)
  q = lambda ids: len(sampled) * np.log((ids + 2) / (ids + 1)) / np.log(VOCAB + 1)  # noqa: E731
  for n, target in enumerate(targets):
    true = h[n] @ kernel[target] + bias[target] - np.log(q(target))
    others = [h[n] @ kernel[s] + bias[s] - np.log(q(s)) for s in sampled if s != target]
    expected = np.log(np.exp(true) + np.sum(np.exp(others))) - true
    np.testing.assert_allclose(got[n], expected, rtol=1e-5, err_msg=str(n))


def test_candidates_follow_the_log_uniform_distribution():
  draws = np.asarray(losses.log_uniform_candidates(jax.random.key(0), 400_000, 1000))
  assert draws.min() >= 0 and draws.max() < 1000
  counts = np.bincount(draws, minlength=1000) / len(draws)
  expected = np.asarray(losses.log_uniform_probabilities(jnp.arange(1000), 1000))
  np.testing.assert_allclose(expected.sum(), 1.0, rtol=1e-5)
  np.testing.assert_allclose(counts[:10], expected[:10], rtol=0.03)   # ≥ 5,000 draws each
  np.testing.assert_allclose(counts[100:].sum(), expected[100:].sum(), rtol=0.01)


def test_adagrad_is_tfs_with_its_initial_accumulator():
  """bilm-tf's update: the gradient of 20 × the mean loss, then TF's Adagrad from 1.0."""
  config = config_lib.base_config()
  config.optimizer = config_lib.elmo_adagrad(clip_norm=0.0)
  tx, _ = optimizer_lib.make_optimizer(config)
  params = {"w": jnp.array([1.0, -2.0])}
  state = tx.init(params)
  accumulator = np.ones(2)
  theta = np.array([1.0, -2.0])
  for g in ([0.05, -0.1], [0.2, 0.025]):
    updates, state = tx.update({"w": jnp.asarray(g)}, state, params)
    params = jax.tree.map(lambda p, u: p + u, params, updates)
    scaled = 20 * np.asarray(g)
    accumulator += np.square(scaled)
    theta -= 0.2 * scaled / np.sqrt(accumulator)
    np.testing.assert_allclose(params["w"], theta, rtol=1e-6)
  config.optimizer.weight_decay = 0.01
  with pytest.raises(config_lib.ConfigError, match="no weight decay"):
    optimizer_lib.make_optimizer(config)


@pytest.mark.parametrize("size", ["original", "medium", "small"])
def test_released_sizes(size):
  c = config_lib.elmo_model(size)
  assert sum(n for _, n in c.char_filters) == 2048 and c.lstm_layers == 2
  assert (c.lstm_cells, c.projection_dim) == {"original": (4096, 512), "medium": (2048, 256),
                                              "small": (1024, 128)}[size]
