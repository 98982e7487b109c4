"""bertfam_jax.models.t5 without torch: the relative bucket function against a transcription of HF's
`_relative_position_bucket`, packing isolation (a packed row = its examples run alone), masks of the
three architectures, scan/remat = unrolled, init scales, and the T5-base parameter counts."""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertfam_jax import config_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.models import t5
from helpers import tiny

TOL = dict(rtol=1e-5, atol=1e-5)
BATCH, INPUTS, TARGETS = 3, 14, 10  # one set of shapes, so eager ops compile once per file


def tiny_config(**overrides):
  return tiny.t5(**{**dict(vocab_size=50, mlp=48, tie_embeddings=True), **overrides})


def init_params(model, *args, **kwargs):
  return nn.unbox(model.init(jax.random.key(0), *args, deterministic=True, **kwargs))


@pytest.fixture(scope="module")
def tiny_params():
  """Parameters of T5(tiny_config()) (they do not depend on batch or length)."""
  return init_params(t5.T5(tiny_config()), np.ones((BATCH, INPUTS), np.int32),
                     np.ones((BATCH, TARGETS), np.int32))


def hf_relative_position_bucket(relative_position, bidirectional, num_buckets, max_distance):
  """HF modeling_t5 `_relative_position_bucket`, line by line in numpy (float32 log as torch)."""
  relative_buckets = np.zeros_like(relative_position)
  if bidirectional:
    num_buckets //= 2
    relative_buckets += (relative_position > 0).astype(np.int64) * num_buckets
    relative_position = np.abs(relative_position)
  else:
    relative_position = -np.minimum(relative_position, np.zeros_like(relative_position))
  max_exact = num_buckets // 2
  is_small = relative_position < max_exact
  with np.errstate(divide="ignore"):
    scaled = np.log(relative_position.astype(np.float32) / np.float32(max_exact))
  large = max_exact + (scaled / np.float32(math.log(max_distance / max_exact))
                       * np.float32(num_buckets - max_exact))
  large = np.where(is_small, 0, large).astype(np.int64)  # torch casts -inf to a garbage int too
  large = np.minimum(large, num_buckets - 1)
  return relative_buckets + np.where(is_small, relative_position, large)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 12)])
def test_relative_position_bucket_matches_hf_transcription(bidirectional, num_buckets,
                                                           max_distance):
  relative = np.arange(-400, 401)
  expected = hf_relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
  ours = np.asarray(t5.relative_position_bucket(
      relative, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance))
  np.testing.assert_array_equal(ours, expected)
  # The spec's landmarks (objectives.md §7) for 32 buckets / 128: exact below 8 (encoder) or 16
  # (decoder), every distance ≥ 128 in the last bucket of its side.
  if (num_buckets, max_distance) == (32, 128):
    exact = 8 if bidirectional else 16
    np.testing.assert_array_equal(ours[400 - exact + 1:401], np.arange(exact)[::-1])
    assert set(ours[:400 - 128 + 1]) == {15 if bidirectional else 31}


def pack(examples, length):
  """[ids, ...] → (ids, segment_ids) [length]: the examples in order in one zero-padded row."""
  ids = np.concatenate(examples)
  segments = np.concatenate([np.full(len(e), i + 1) for i, e in enumerate(examples)])
  pad = length - len(ids)
  return np.pad(ids, (0, pad)).astype(np.int32), np.pad(segments, (0, pad)).astype(np.int32)


def one_per_row(examples, length):
  """[ids, ...] → (ids, segment_ids) [len(examples), length]: each example alone in its row."""
  rows = [pack([e], length) for e in examples]
  return np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])


def packed_in_first_row(examples, length, batch):
  """(ids, segment_ids) [batch, length]: the examples packed into row 0, the other rows empty."""
  ids, segments = (np.zeros((batch, length), np.int32) for _ in range(2))
  ids[0], segments[0] = pack(examples, length)
  return ids, segments


def test_packed_row_equals_examples_alone(tiny_params):
  """Encoder–decoder: each example's encoder outputs and logits inside a packed row equal those
  of the example alone, so no attention (self or cross) crosses a segment boundary."""
  model = t5.T5(tiny_config())
  rng = np.random.default_rng(0)
  inputs = [rng.integers(2, 50, n) for n in (5, 3, 4)]
  targets = [np.concatenate([[0], rng.integers(2, 50, n - 1)]) for n in (4, 2, 3)]
  outputs = {}
  for layout, arrange in (("packed", functools.partial(packed_in_first_row, batch=BATCH)),
                          ("alone", one_per_row)):
    input_ids, input_segments = arrange(inputs, INPUTS)
    decoder_ids, decoder_segments = arrange(targets, TARGETS)
    outputs[layout] = (
        model.apply(tiny_params, input_ids, input_segments, deterministic=True,
                    method=t5.T5.encode),
        model.apply(tiny_params, input_ids, decoder_ids, input_segments, decoder_segments,
                    deterministic=True))
  (packed_encoded, packed_logits), (alone_encoded, alone_logits) = (
      outputs["packed"], outputs["alone"])
  in_start = tgt_start = 0
  for row, (inp, tgt) in enumerate(zip(inputs, targets)):
    np.testing.assert_allclose(packed_encoded[0, in_start:in_start + len(inp)],
                               alone_encoded[row, :len(inp)], **TOL)
    np.testing.assert_allclose(packed_logits[0, tgt_start:tgt_start + len(tgt)],
                               alone_logits[row, :len(tgt)], **TOL)
    in_start, tgt_start = in_start + len(inp), tgt_start + len(tgt)


def test_cross_segment_ids_hide_encoder_positions_from_the_decoder(tiny_params):
  """MASS's `enc_mask`: with cross_segment_ids 0 at some encoder positions, the decoder's logits
  do not depend on those positions' encoder outputs (and do on the others), while the encoder
  itself still reads every input."""
  model = t5.T5(tiny_config())
  rng = np.random.default_rng(3)
  input_ids, segments = one_per_row([rng.integers(2, 50, n) for n in (9, 12, 7)], INPUTS)
  decoder_ids, decoder_segments = one_per_row(
      [np.concatenate([[0], rng.integers(2, 50, n - 1)]) for n in (5, 6, 4)], TARGETS)
  hidden = np.zeros_like(segments, bool)
  hidden[:, 2:5] = True
  cross = np.where(hidden, 0, segments)
  encoded = model.apply(tiny_params, input_ids, segments, deterministic=True,
                        method=t5.T5.encode)
  decode = functools.partial(model.apply, tiny_params, decoder_input_ids=decoder_ids,
                             decoder_segment_ids=decoder_segments, deterministic=True,
                             method=t5.T5.decode)
  real = decoder_segments > 0   # a padding query sees no key at all (a uniform average)
  noise = 5.0 * rng.standard_normal(encoded.shape).astype(np.float32)
  logits = decode(encoded, cross)[real]
  np.testing.assert_allclose(decode(encoded + noise * hidden[..., None], cross)[real], logits,
                             **TOL)
  assert not np.allclose(decode(encoded + noise * ~hidden[..., None], cross)[real], logits, **TOL)
  assert not np.allclose(decode(encoded, segments)[real], logits, **TOL)
  np.testing.assert_allclose(
      model.apply(tiny_params, input_ids, decoder_ids, segments, decoder_segments,
                  deterministic=True, cross_segment_ids=cross)[real], logits, **TOL)


def test_packed_prefix_lm_row_equals_examples_alone():
  model = t5.T5(tiny_config(architecture="prefix_lm"))
  rng = np.random.default_rng(1)
  lengths, prefixes = (6, 5), (3, 2)
  examples = [rng.integers(2, 50, n) for n in lengths]
  ids, segments = packed_in_first_row(examples, 12, batch=2)
  packed_prefix = np.zeros_like(ids)
  packed_prefix[0, :11] = np.concatenate([np.arange(n) < p for n, p in zip(lengths, prefixes)])
  params = init_params(model, None, ids, None, segments, decoder_causal_attention=packed_prefix)
  packed = model.apply(params, None, ids, None, segments, deterministic=True,
                       decoder_causal_attention=packed_prefix)
  alone_ids, alone_segments = one_per_row(examples, 12)
  alone_prefix = (np.arange(12)[None] < np.array(prefixes)[:, None]).astype(np.int32)
  alone = model.apply(params, None, alone_ids, None, alone_segments, deterministic=True,
                      decoder_causal_attention=alone_prefix)
  np.testing.assert_allclose(packed[0, :6], alone[0, :6], **TOL)
  np.testing.assert_allclose(packed[0, 6:11], alone[1, :5], **TOL)


@pytest.mark.parametrize("architecture", ["decoder_only", "prefix_lm"])
def test_prefilled_cache_steps_equal_the_full_rows_logits(architecture):
  """Rows with prompts of 5 and 3 tokens, left-padded to end at one column and prefilled in one
  decode=True call (cache_start after the prompt), then 3 one-token steps: every logit equals
  the full right-aligned row's at the same position (the relative bias sees distances only, and
  first_key keeps the padding out)."""
  model = t5.T5(tiny_config(architecture=architecture))
  rng = np.random.default_rng(5)
  prompts, steps, width = (5, 3), 3, 9
  full = np.zeros((2, 8), np.int32)            # right-aligned rows: prompt, then the steps' inputs
  for row, n in enumerate(prompts):
    full[row, :n + steps] = rng.integers(2, 50, n + steps)
  prefix_kw = lambda columns: (  # noqa: E731
      {"decoder_causal_attention": columns.astype(np.int32)} if architecture == "prefix_lm"
      else {})
  params = init_params(model, None, full, **prefix_kw(np.ones_like(full)))
  full_logits = model.apply(params, None, full, deterministic=True,
                            **prefix_kw(np.arange(8)[None] < np.array(prompts)[:, None]))
  end = 5                                      # every prompt's last column
  padded = np.zeros((2, width), np.int32)
  for row, n in enumerate(prompts):
    padded[row, end - n + 1:end + 1] = full[row, :n]
  segments = (padded != 0).astype(np.int32)
  logits, variables = model.apply(
      params, None, None, padded, segments, deterministic=True, decode=True, cache_start=end + 1,
      mutable=["cache"], method=t5.T5.decode, **prefix_kw(np.arange(width)[None] <= end))
  for row, n in enumerate(prompts):
    np.testing.assert_allclose(logits[row, end - n + 1:end + 1], full_logits[row, :n], **TOL)
  cache = variables["cache"]
  for step in range(steps):
    token = np.array([[full[row, n + step]] for row, n in enumerate(prompts)], np.int32)
    logits, variables = model.apply({**params, "cache": cache}, None, None, token,
                                    np.ones_like(token), deterministic=True, decode=True,
                                    mutable=["cache"], method=t5.T5.decode)
    cache = variables["cache"]
    for row, n in enumerate(prompts):
      np.testing.assert_allclose(logits[row, 0], full_logits[row, n + step], **TOL)


@pytest.mark.parametrize("architecture", ["encoder_decoder", "decoder_only", "prefix_lm"])
def test_decoder_attention_is_causal_outside_the_prefix(architecture, tiny_params):
  """A decoder token changes the logits at its own and later positions only, except inside a
  prefix LM's prefix (positions 0..3 here), where attention is bidirectional."""
  ids = np.random.default_rng(2).integers(2, 40, (1, TARGETS))
  rows = np.concatenate([ids, ids, ids]).astype(np.int32)  # original, changed at 6, changed at 2
  rows[1, 6] += 1
  rows[2, 2] += 1
  call = dict(input_ids=None, decoder_input_ids=rows)
  if architecture == "encoder_decoder":
    model, params = t5.T5(tiny_config()), tiny_params
    call["input_ids"] = np.tile(ids[:, :INPUTS - 4], (BATCH, 1)).astype(np.int32)
  else:
    model = t5.T5(tiny_config(architecture=architecture, decoder_layers=1))
    if architecture == "prefix_lm":
      call["decoder_causal_attention"] = np.tile(np.arange(TARGETS) < 4, (3, 1)).astype(np.int32)
    params = init_params(model, **call)
  logits = np.asarray(model.apply(params, deterministic=True, **call))
  changed = lambda row: np.flatnonzero(np.abs(logits[row] - logits[0]).max(-1) > 1e-6)  # noqa
  np.testing.assert_array_equal(changed(1), range(6, TARGETS))
  expected = range(TARGETS) if architecture == "prefix_lm" else range(2, TARGETS)
  np.testing.assert_array_equal(changed(2), expected)


def test_scanned_rematerialised_stack_equals_unrolled(tiny_params):
  """The same weights stacked on a [layers] axis under nn.scan + remat give the same logits as
  the unrolled layers."""
  rng = np.random.default_rng(3)
  input_ids = rng.integers(0, 50, (BATCH, INPUTS)).astype(np.int32)
  decoder_ids = rng.integers(0, 50, (BATCH, TARGETS)).astype(np.int32)
  scanned = t5.T5(tiny_config(scan_layers=True, remat_policy="dots"))

  def stack(tree):
    layers = sorted(k for k in tree if k.startswith("layer_"))
    stacked = {k: v for k, v in tree.items() if k not in layers}
    stacked["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *[tree[k] for k in layers])
    return stacked

  params = tiny_params["params"]
  stacked = dict(params, encoder=stack(params["encoder"]), decoder=stack(params["decoder"]))
  shapes = nn.unbox(jax.eval_shape(lambda: scanned.init(jax.random.key(0), input_ids, decoder_ids,
                                                        deterministic=True)))["params"]
  assert jax.tree.map(jnp.shape, stacked) == jax.tree.map(jnp.shape, shapes)
  np.testing.assert_allclose(
      scanned.apply({"params": stacked}, input_ids, decoder_ids, deterministic=True),
      t5.T5(tiny_config()).apply(tiny_params, input_ids, decoder_ids, deterministic=True), **TOL)


def test_fused_qkv_gives_the_same_logits_and_gradients(tiny_params):
  """model.fused_qkv: self-attention's Q, K and V as one matmul over the same parameters (the
  encoder-decoder attention keeps its own projections); logits and every gradient unchanged."""
  rng = np.random.default_rng(6)
  input_ids = rng.integers(0, 50, (BATCH, INPUTS)).astype(np.int32)
  decoder_ids = rng.integers(0, 50, (BATCH, TARGETS)).astype(np.int32)
  cotangent = rng.normal(size=(BATCH, TARGETS, 50))

  def logits_and_grads(config):
    def objective(params):
      logits = t5.T5(config).apply({"params": params}, input_ids, decoder_ids, deterministic=True)
      return jnp.sum(logits * cotangent), logits
    return jax.value_and_grad(objective, has_aux=True)(tiny_params["params"])[::-1]

  grads, (_, logits) = logits_and_grads(tiny_config())
  fused_grads, (_, fused_logits) = logits_and_grads(tiny_config(fused_qkv=True))
  np.testing.assert_allclose(fused_logits, logits, **TOL)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), fused_grads,
               grads)


@pytest.mark.parametrize("relpos_bias_init", ["glorot_uniform", "normal"])
def test_init_scales_follow_mesh_tf(relpos_bias_init):
  """N(0, σ²) with σ from HF `_init_weights` / t5x: embedding 1, query (hidden·kv)^-½,
  key/value/wi hidden^-½, out (heads·kv)^-½, wo mlp^-½, untied logits hidden^-½ (t5x);
  norms start at 1. The bucket tables [32, 4]: mesh-tf's default Glorot-uniform, U(±√(6/36)),
  σ = √(2/36) (t5x: variance_scaling(1, fan_avg, uniform)), or HF's N(0, hidden^-1).
  Tolerance: 5 standard errors of the sample std."""
  config = tiny_config(hidden=64, heads=4, head_dim=16, mlp=128, vocab_size=256,
                       tie_embeddings=False, layers=1, decoder_layers=1, relative_buckets=32,
                       relpos_bias_init=relpos_bias_init)
  ids = jnp.zeros((1, 4), jnp.int32)
  params = init_params(t5.T5(config), ids, ids)["params"]
  layer = params["encoder"]["layer_0"]
  glorot = relpos_bias_init == "glorot_uniform"
  for stack in ("encoder", "decoder"):
    table = np.asarray(params[stack]["relpos_bias"]["rel_embedding"])
    assert np.abs(table).max() <= math.sqrt(6 / 36) or not glorot, stack
  expected = {
      "embedding": (params["token_embedder"]["embedding"], 1.0),
      "query": (layer["attention"]["query"], (64 * 16) ** -0.5),
      "key": (layer["attention"]["key"], 64 ** -0.5),
      "value": (layer["attention"]["value"], 64 ** -0.5),
      "out": (layer["attention"]["out"], (4 * 16) ** -0.5),
      "wi": (layer["mlp"]["wi"]["kernel"], 64 ** -0.5),
      "wo": (layer["mlp"]["wo"]["kernel"], 128 ** -0.5),
      "logits": (params["decoder"]["logits_dense"]["kernel"], 64 ** -0.5),
      "relpos": (params["decoder"]["relpos_bias"]["rel_embedding"],
                 math.sqrt(2 / 36) if glorot else 64 ** -0.5),
  }
  for name, (value, stddev) in expected.items():
    value = np.asarray(value)
    assert abs(value.std() / stddev - 1) < 5 / math.sqrt(2 * value.size), name
    assert abs(value.mean()) < 5 * stddev / math.sqrt(value.size), name
  np.testing.assert_array_equal(layer["pre_mlp_layer_norm"]["scale"], np.ones(64))


@pytest.mark.parametrize("version,expected", [
    ("1.0", 222_903_552),  # HF t5-base
    ("1.1", 247_577_856),  # HF google/t5-v1_1-base (untied: + 32,128 × 768)
])
def test_t5_base_parameter_count(version, expected):
  ids = jnp.zeros((1, 8), jnp.int32)
  model = t5.T5(config_lib.t5_model("base", version))
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), ids, ids, deterministic=True))
  assert sum(x.size for x in jax.tree.leaves(nn.unbox(shapes))) == expected


def test_bfloat16_compute_tracks_float32(tiny_params):
  ids = np.random.default_rng(4).integers(2, 50, (BATCH, TARGETS)).astype(np.int32)
  params = tiny_params
  full = t5.T5(tiny_config()).apply(params, ids, ids, deterministic=True)
  half = t5.T5(tiny_config(dtype="bfloat16")).apply(params, ids, ids, deterministic=True)
  assert half.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(half, np.float32), full, atol=0.05 * float(
      jnp.abs(full).max()))


def test_dropout_is_active_only_when_not_deterministic(tiny_params):
  ids = np.random.default_rng(5).integers(2, 50, (BATCH, TARGETS)).astype(np.int32)
  model = t5.T5(tiny_config(dropout=0.1))
  params = tiny_params
  apply = lambda seed, deterministic: model.apply(  # noqa: E731
      params, ids, ids, deterministic=deterministic, rngs={"dropout": jax.random.key(seed)})
  np.testing.assert_array_equal(apply(0, True), apply(1, True))
  assert not np.allclose(apply(0, False), apply(1, False))
  np.testing.assert_array_equal(apply(0, False), apply(0, False))


def test_dropout_masks_are_shared_along_the_sequence(tiny_params):
  """Every dropout in training mode drops the same features at every position of an example
  ([batch, length, features]) and the same keys for every query ([batch, heads, queries, keys]),
  as mesh-tf and t5x: no dropout both drops and keeps one feature (key) along axis -2."""
  ids = np.random.default_rng(6).integers(2, 50, (BATCH, TARGETS)).astype(np.int32)
  seen = []

  def record(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if isinstance(context.module, t5.layers.Dropout) and context.method_name == "__call__":
      seen.append((np.asarray(out == 0), np.asarray(args[0] != 0)))
    return out

  with nn.intercept_methods(record):
    t5.T5(tiny_config(dropout=0.3)).apply(tiny_params, ids, ids, deterministic=False,
                                          rngs={"dropout": jax.random.key(3)})
  layers_count = tiny_config().layers
  # Embeddings and final outputs (2 per stack); per encoder layer attention probabilities, FFN
  # hidden and 2 residuals; per decoder layer 2 attentions' probabilities, FFN hidden, 3 residuals.
  assert len(seen) == 4 + 4 * layers_count + 6 * layers_count
  for zero, nonzero in seen:   # (a masked key's probability is 0 whatever the decision)
    dropped, kept = (zero & nonzero).any(-2), (~zero & nonzero).any(-2)
    assert dropped.any() and kept.any()
    assert not (dropped & kept).any()


@pytest.mark.parametrize("buckets", ["bidirectional", "causal"])
def test_prefix_lm_buckets_tell_keys_to_the_right_apart(buckets):
  """In a 1-layer prefix LM, position 0 attends the whole prefix. With mesh-tf's bidirectional
  buckets (`lm_v1_ifa.gin`) it tells the keys to its right apart, so reordering them changes its
  output; with t5x's causal buckets they share bucket 0 and its output is order-blind."""
  model = t5.T5(tiny_config(architecture="prefix_lm", decoder_layers=1,
                            prefix_lm_buckets=buckets))
  ids = np.random.default_rng(7).integers(2, 40, (1, TARGETS))
  rows = np.concatenate([ids, ids]).astype(np.int32)
  rows[1, 1:4] = ids[0, [3, 1, 2]]       # the prefix's keys right of position 0, reordered
  call = dict(input_ids=None, decoder_input_ids=rows,
              decoder_causal_attention=np.tile(np.arange(TARGETS) < 5, (2, 1)).astype(np.int32))
  params = init_params(model, **call)
  logits = np.asarray(model.apply(params, deterministic=True, **call))
  assert np.allclose(logits[0, 0], logits[1, 0], atol=1e-6) == (buckets == "causal")


def test_architecture_misuse_is_a_config_error():
  ids = jnp.ones((1, 4), jnp.int32)
  with pytest.raises(ConfigError, match="has no encoder"):
    t5.T5(tiny_config(architecture="decoder_only")).init(jax.random.key(0), ids, ids,
                                                         deterministic=True)
  with pytest.raises(ConfigError, match="prefix_lm"):
    t5.T5(tiny_config(architecture="prefix_lm")).init(jax.random.key(0), None, ids,
                                                       deterministic=True)
  with pytest.raises(ConfigError, match="model.architecture='seq2seq'"):
    t5.T5(tiny_config(architecture="seq2seq")).init(jax.random.key(0), ids, ids,
                                                    deterministic=True)


def attention_gradients(implementation: str, packed: bool, dtype: str = "bfloat16"):
  """(loss, gradients) of a T5 in `dtype` (heads of 16, so cuDNN runs it) whose attention is
  `implementation`, on rows with padding or, when `packed`, two examples each: the loss is the
  targets' cross-entropy, so every parameter (the relative-position tables too) gets a gradient.
  float32 runs at the highest matmul precision: the reference the bf16 runs are measured from."""
  rng = np.random.default_rng(6)
  batch, inputs_length, targets_length = 4, 64, 32
  def rows(length):
    sizes = [rng.integers(length // 4, length // 2, 2) if packed
             else [rng.integers(length // 2, length)] for _ in range(batch)]
    return [[rng.integers(2, 50, n) for n in row] for row in sizes]
  arrange = lambda examples, length: map(np.stack, zip(*(  # noqa: E731
      pack(row, length) for row in examples)))
  input_ids, input_segments = arrange(rows(inputs_length), inputs_length)
  decoder_ids, decoder_segments = arrange(rows(targets_length), targets_length)
  labels = np.roll(decoder_ids, -1, axis=1)
  model = t5.T5(tiny_config(dtype=dtype, head_dim=16, attention_impl=implementation))
  params = init_params(t5.T5(tiny_config(head_dim=16)), input_ids[:1], decoder_ids[:1])

  def loss_fn(p):
    logits = model.apply(p, input_ids, decoder_ids, input_segments, decoder_segments,
                         deterministic=True).astype(jnp.float32)
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], -1)[..., 0]
    weights = decoder_segments > 0
    return jnp.sum(nll * weights) / jnp.sum(weights)

  with jax.default_matmul_precision("highest" if dtype == "float32" else "default"):
    return jax.jit(jax.value_and_grad(loss_fn))(params)


def assert_gradients_close(result, reference, baseline):
  """Asserts that (loss, gradients) `result` (bf16) is as close to `reference` (float32) as
  `baseline` (bf16 on XLA's masked attention) is: the loss within 2%, and every gradient within
  3% of its norm (floored at 1% of the largest) or 1.5 times the baseline's own distance, the
  relative-position tables named. bf16 alone moves some leaves by 3-4% (an H100, 2026-11-26), so
  a fixed tolerance would fail XLA against itself; NaN always fails."""
  norms = lambda tree: {jax.tree_util.keystr(p): np.linalg.norm(np.asarray(g, np.float32))  # noqa: E731
                        for p, g in jax.tree_util.tree_flatten_with_path(tree)[0]}
  distance = lambda a, b: norms(jax.tree.map(  # noqa: E731
      lambda x, y: np.asarray(x, np.float32) - np.asarray(y, np.float32), a, b))
  (loss, grads), (ref_loss, ref_grads), (_, base_grads) = result, reference, baseline
  np.testing.assert_allclose(loss, ref_loss, rtol=2e-2)
  ref_norms = norms(ref_grads)
  tables = [k for k in ref_norms if "relpos_bias" in k]
  assert len(tables) == 2 and all(ref_norms[k] > 0 for k in tables)
  floor = 1e-2 * max(ref_norms.values())
  errors, base_errors = distance(grads, ref_grads), distance(base_grads, ref_grads)
  off = {k: round(float(errors[k] / max(n, floor)), 4) for k, n in ref_norms.items()
         if not errors[k] <= max(3e-2 * max(n, floor), 1.5 * base_errors[k])}  # NaN is off
  assert not off, f"gradients off by more than 3% of their norm and 1.5x bf16 XLA's, or NaN: {off}"


@pytest.fixture(scope="module")
def references():
  """{packed: (float32 reference, bf16 XLA baseline)}."""
  return {packed: (attention_gradients("xla", packed, "float32"), attention_gradients("xla", packed))
          for packed in (False, True)}


def test_attention_gradient_comparison_can_fail(references):
  """The GPU check below can fail: XLA's attention against itself passes, and gradients whose
  relative-position tables are zero (what a cuDNN path dropping the bias gradient gives) or NaN
  (what jax 0.11.2's cuDNN path gave T5 on an H200 with the mask added to the bias) fail."""
  reference, baseline = references[True]
  assert_gradients_close(attention_gradients("", packed=True), reference, baseline)
  loss, grads = baseline
  for broken in (0.0, np.nan):
    bad = jax.tree_util.tree_map_with_path(
        lambda path, g: g * broken if "relpos_bias" in jax.tree_util.keystr(path) else g, grads)
    with pytest.raises(AssertionError, match="relpos_bias"):
      assert_gradients_close((loss, bad), reference, baseline)


def test_cudnn_path_equals_masked_attention(monkeypatch, references):
  """The cuDNN path's arguments (padding as lengths, causality as a flag, the bias alone) mean
  what the masks mean: run through XLA's implementation of the same call, a T5 on padded rows of
  one example each has the masked path's loss and gradients (float32: equal to 1e-5; bf16: as
  close to float32 as the masked path), position tables included; on packed
  rows the lengths cannot say where an example ends, and the comparison fails (which is why the
  objective packs one example per row on cuDNN)."""
  monkeypatch.setattr(t5, "LENGTHS_IMPLEMENTATION", "xla")
  (loss, grads), (ref_loss, ref_grads) = (attention_gradients("cudnn", False, "float32"),
                                          references[False][0])
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
  assert_gradients_close(attention_gradients("cudnn", packed=False), *references[False])
  with pytest.raises(AssertionError, match="gradients off"):
    assert_gradients_close(attention_gradients("cudnn", packed=True), *references[True])


@pytest.mark.skipif(jax.devices()[0].platform != "gpu", reason="cuDNN attention needs a GPU")
def test_cudnn_attention_gradients_equal_xla(references):
  """T5 on cuDNN flash attention trains as on XLA's: the loss and every gradient, the
  relative-position bias tables' included, on padded rows of one example each."""
  assert_gradients_close(attention_gradients("cudnn", packed=False), *references[False])


def test_prefix_lm_on_cudnn_is_refused():
  with pytest.raises(ConfigError, match="attention_impl=xla"):
    t5.validate(tiny_config(architecture="prefix_lm", dtype="bfloat16", attention_impl="cudnn"))


# Our encoder layer's parameters ← the decoder layer's that a shared encoder runs.
SHARED_SUBLAYERS = dict(pre_attention_layer_norm="pre_self_attention_layer_norm",
                        attention="self_attention", pre_mlp_layer_norm="pre_mlp_layer_norm",
                        mlp="mlp")


@pytest.mark.parametrize("scan", [False, True])
def test_shared_encoder_decoder_is_the_decoder_layers_run_twice(scan):
  """Table 2's "Enc-dec, shared" as mesh-tf's bi_v1_shared.gin: the encoder holds no parameter;
  the model equals an unshared T5 whose encoder layers are copies of the decoder layers'
  self-attention, MLP and norms, and whose encoder bucket table and final norm are copies of the
  decoder's, and each shared parameter's gradient is the sum of the two copies' gradients."""
  rng = np.random.default_rng(5)
  input_ids = jnp.asarray(rng.integers(1, 50, (BATCH, INPUTS)), jnp.int32)
  decoder_ids = jnp.asarray(rng.integers(1, 50, (BATCH, TARGETS)), jnp.int32)
  shared_model = t5.T5(tiny_config(share_encoder_decoder=True, scan_layers=scan))
  shared = init_params(shared_model, input_ids, decoder_ids)["params"]
  assert "encoder" not in shared
  layer_names = ["layers"] if scan else [f"layer_{i}" for i in range(2)]
  unshared = dict(shared, encoder=dict(
      relpos_bias=shared["decoder"]["relpos_bias"], encoder_norm=shared["decoder"]["decoder_norm"],
      **{name: {ours: shared["decoder"][name][theirs] for ours, theirs in SHARED_SUBLAYERS.items()}
         for name in layer_names}))
  unshared_model = t5.T5(tiny_config(scan_layers=scan))

  def loss(model, params):
    logits = model.apply({"params": params}, input_ids, decoder_ids, deterministic=True)
    return jnp.mean(jax.nn.log_softmax(logits.astype(jnp.float32))[..., 3])

  value, grads = jax.value_and_grad(functools.partial(loss, shared_model))(shared)
  ref_value, ref_grads = jax.value_and_grad(functools.partial(loss, unshared_model))(unshared)
  np.testing.assert_allclose(value, ref_value, rtol=1e-6)
  pairs = [((name, theirs), (name, ours)) for name in layer_names
           for ours, theirs in SHARED_SUBLAYERS.items()]
  pairs += [(("relpos_bias",), ("relpos_bias",)), (("decoder_norm",), ("encoder_norm",))]
  for theirs, ours in pairs:
    summed = jax.tree.map(jnp.add, functools.reduce(dict.get, theirs, ref_grads["decoder"]),
                          functools.reduce(dict.get, ours, ref_grads["encoder"]))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7),
                 functools.reduce(dict.get, theirs, grads["decoder"]), summed)


def test_sharing_needs_an_encoder_decoder_of_equal_depths():
  for overrides in (dict(architecture="decoder_only"), dict(decoder_layers=1)):
    with pytest.raises(ConfigError, match="share_encoder_decoder"):
      init_params(t5.T5(tiny_config(share_encoder_decoder=True, **overrides)),
                  np.ones((1, 4), np.int32), np.ones((1, 4), np.int32))
