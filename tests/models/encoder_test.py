"""The encoder and the MLM/NSP heads against an independent float64 numpy reference of spec §0
(BERT) and §2 (RoBERTa deltas), plus what the execution variants promise: scanned and
rematerialised layers equal the unrolled model, the explicit-softmax attention path equals the fused
one, padding never leaks into real positions, bfloat16 compute stays close to float32, and the
parameter counts equal HF's (spec §11).
"""

import importlib.util
import math
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertfam_jax import config_lib, objectives
from bertfam_jax.models import layers, pretraining
from bertfam_jax.objectives import mlm
from helpers import tiny

BATCH, LENGTH, VOCAB = 2, 16, 101
REAL_TOKENS = (LENGTH, 11)  # the second row ends in 5 padding positions
# Masked positions [batch, predictions], all at real tokens ([CLS] included).
MLM_POSITIONS = np.array([[0, 5, 15], [3, 7, 10]], np.int32)
ROBERTA = dict(type_vocab_size=1, activation="gelu", layer_norm_eps=1e-5)  # spec §2
# Float32 against float64 through two layers and a head: observed errors are ≲1.5e-6 on values
# of order 1.
F32_TOL = dict(rtol=1e-5, atol=1e-5)


def tiny_config(**overrides):
  """The suite's tiny encoder (tests/helpers/tiny.py) at this file's vocabulary and length."""
  return tiny.encoder(vocab_size=VOCAB, max_positions=LENGTH, **overrides)


def make_inputs(seed=0, *, type_vocab_size=2):
  """[CLS]-first rows with right padding; segment B starts at position 6 when there are 2 types."""
  rng = np.random.default_rng(seed)
  input_mask = (np.arange(LENGTH)[None] < np.array(REAL_TOKENS)[:, None]).astype(np.int32)
  input_ids = np.where(input_mask > 0, rng.integers(1, VOCAB, (BATCH, LENGTH)), 0)
  segment_ids = input_mask * (np.arange(LENGTH)[None] >= 6) * (type_vocab_size > 1)
  return dict(input_ids=input_ids.astype(np.int32), input_mask=input_mask,
              segment_ids=segment_ids.astype(np.int32), mlm_positions=MLM_POSITIONS)


def random_tree(shapes, scale, seed, *, embedding_scale=None):
  """`shapes` (a tree of ShapeDtypeStructs) filled with N(0, scale²), embedding tables with
  N(0, embedding_scale²) when given, LayerNorm γ with 1 + N(0, scale²)."""
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    name = path[-1].key
    std = embedding_scale if name == "embedding" and embedding_scale else scale
    return jnp.asarray(std * rng.normal(size=leaf.shape) + (name == "scale"), leaf.dtype)

  return jax.tree_util.tree_map_with_path(draw, shapes)


def random_params(config, sentence_classes, seed=0):
  """Returns (model, params): the MaskedLM and its parameter tree (names and shapes from an abstract
  `init`) filled by `random_tree`: scale 0.2, embedding tables 0.01.

  Not BERT's init values: those leave biases and LayerNorm β at 0 and γ at 1, under which a bias or
  LayerNorm applied to the wrong tensor would go unnoticed, and their σ=0.02 makes attention nearly
  uniform, under which masking mistakes are small. (A concrete `init` would also cost seconds of
  compilation on a 2-core CPU.) The small tables make the embedding LayerNorm's input variance
  (~3e-4) comparable to RoBERTa's ε=1e-5, so a wrong ε changes the outputs by ~1%.
  """
  model = pretraining.MaskedLM(config, sentence_classes)
  shapes = jax.eval_shape(lambda: nn.meta.unbox(
      model.init(jax.random.key(0), **make_inputs(), deterministic=True))["params"])
  return model, random_tree(shapes, 0.2, seed, embedding_scale=0.01)


def encode(model, params, inputs, **kwargs):
  """The encoder's hidden states [batch, length, hidden] inside `model` (a MaskedLM)."""
  encoder_inputs = {k: v for k, v in inputs.items() if k != "mlm_positions"}
  return model.apply({"params": params}, **encoder_inputs, **kwargs,
                     method=lambda m, *args, **kw: m.encoder(*args, **kw))


# ------------------------------------------------------------------------------------------------
# The float64 reference, written from spec §0 in BERT's own layout: Q/K/V/O are [H, H] matrices
# whose columns are split into heads head-major (modeling.py transpose_for_scores), so our
# [embed, heads, head_dim] kernels are read through a reshape to [H, H].


def gelu(x, activation):
  if activation == "gelu":  # exact: x·Φ(x)
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
  assert activation == "gelu_tanh"  # BERT modeling.py gelu
  return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def layer_norm(x, p, eps):
  mean = x.mean(-1, keepdims=True)
  var = np.square(x - mean).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * p["norm"]["scale"] + p["norm"]["bias"]


def softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def reference_attention(x, p, input_mask, heads):
  """x [B, L, H], input_mask [B, L] → [B, L, H]; padding keys get BERT's additive −10000."""
  b, l, h = x.shape

  def split_heads(name):  # [B, L, H] → [B, heads, L, head_dim]
    y = x @ p[name]["kernel"].reshape(h, h) + p[name]["bias"].reshape(h)
    return y.reshape(b, l, heads, h // heads).transpose(0, 2, 1, 3)

  q, k, v = split_heads("query"), split_heads("key"), split_heads("value")
  scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(h // heads)  # [B, heads, Lq, Lk]
  scores = scores - 10000.0 * (1.0 - input_mask[:, None, None, :])
  context = (softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(b, l, h)
  return context @ p["output"]["kernel"].reshape(h, h) + p["output"]["bias"]



def reference_layer(x, lp, mask, c, eps):
  """One post-LN BERT layer in numpy from its parameter dict `lp`."""
  x = layer_norm(x + reference_attention(x, lp["attention"], mask, c.heads), lp["attention_ln"],
                 eps)
  ffn = gelu(x @ lp["mlp"]["intermediate"]["kernel"] + lp["mlp"]["intermediate"]["bias"],
             c.activation)
  return layer_norm(x + ffn @ lp["mlp"]["output"]["kernel"] + lp["mlp"]["output"]["bias"],
                    lp["output_ln"], eps)


def reference_forward(params, c, inputs):
  """Returns hidden states [B, L, H] and {'mlm_logits' [B, P, V], 'sentence_logits' [B, 2]}."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  e, eps = p["encoder"], c.layer_norm_eps
  ids, mask = inputs["input_ids"], inputs["input_mask"].astype(np.float64)
  x = (e["word_embeddings"]["embedding"][ids]
       + e["position_embeddings"]["embedding"][None, :ids.shape[1]])
  if c.type_vocab_size:
    x = x + e["type_embeddings"]["embedding"][inputs["segment_ids"]]
  x = layer_norm(x, e["embeddings_ln"], eps)
  for i in range(c.layers):
    x = reference_layer(x, e[f"layer_{i}"], mask, c, eps)
  m = p["mlm_head"]
  h = x[np.arange(ids.shape[0])[:, None], inputs["mlm_positions"]]
  h = gelu(h @ m["transform"]["kernel"] + m["transform"]["bias"], c.activation)
  h = layer_norm(h, m["transform_ln"], eps)
  outputs = {"mlm_logits": h @ e["word_embeddings"]["embedding"].T + m["output_bias"]}
  if "sentence_head" in p:
    s = p["sentence_head"]
    pooled = np.tanh(x[:, 0] @ s["pooler"]["kernel"] + s["pooler"]["bias"])
    outputs["sentence_logits"] = pooled @ s["classifier"]["kernel"] + s["classifier"]["bias"]
  return x, outputs


def test_activations_match_their_formulas():
  # Through LayerNorms the two GELUs move the model's outputs by only ~1e-5, so each is pinned here,
  # where they differ by up to ~5e-4.
  x = np.linspace(-6.0, 6.0, 1201)
  for name in ("gelu", "gelu_tanh"):
    np.testing.assert_allclose(layers.activation_fn(name)(jnp.asarray(x, jnp.float32)),
                               gelu(x, name), rtol=1e-6, atol=1e-6, err_msg=name)
  assert np.abs(gelu(x, "gelu") - gelu(x, "gelu_tanh")).max() > 1e-4


@pytest.mark.parametrize("overrides, sentence_classes", [
    (dict(), 2),                        # BERT: tanh GELU, ε 1e-12, two segments, NSP head
    (dict(activation="gelu"), 2),       # BERT with HF's exact GELU
    (ROBERTA, 0),                       # RoBERTa: one token type, exact GELU, ε 1e-5, no NSP
])
def test_forward_matches_float64_reference(overrides, sentence_classes):
  config = tiny_config(**overrides)
  model, params = random_params(config, sentence_classes)
  inputs = make_inputs(type_vocab_size=config.type_vocab_size)
  outputs = model.apply({"params": params}, **inputs, deterministic=True)
  hidden = encode(model, params, inputs, deterministic=True)
  ref_hidden, ref_outputs = reference_forward(params, config, inputs)
  assert outputs.keys() == ref_outputs.keys()
  real = inputs["input_mask"] > 0  # padded rows of the hidden states are never read
  np.testing.assert_allclose(hidden[real], ref_hidden[real], **F32_TOL)
  for name, ref in ref_outputs.items():
    assert outputs[name].dtype == jnp.float32
    np.testing.assert_allclose(outputs[name], ref, **F32_TOL, err_msg=name)


# ------------------------------------------------------------------------------------------------
# Scanned / rematerialised layers.


def stack_layers(params, num_layers):
  """The unrolled tree with its `layer_{i}` subtrees stacked along a new axis 0 under `layers`: the
  tree that `scan_layers=True` initialises."""
  encoder_params = dict(params["encoder"])
  per_layer = [encoder_params.pop(f"layer_{i}") for i in range(num_layers)]
  encoder_params["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *per_layer)
  return {**params, "encoder": encoder_params}


def unstack_layers(params, num_layers):
  encoder_params = dict(params["encoder"])
  stacked = encoder_params.pop("layers")
  for i in range(num_layers):
    encoder_params[f"layer_{i}"] = jax.tree.map(lambda x, i=i: x[i], stacked)
  return {**params, "encoder": encoder_params}


def dropout_key(seed):
  """An 'rbg' key: XLA's RngBitGenerator compiles in a fraction of the time threefry takes."""
  return jax.random.key(seed, impl="rbg")


def outputs_and_grads(model, params, inputs, *, deterministic):
  """Model outputs and the gradient of Σ outputs·r (r fixed random) with respect to the params.

  Run eagerly, not jitted: eager ops are compiled once per shape and reused by every variant and
  test, which on a 2-core CPU is several times cheaper than compiling each variant's whole graph.
  """
  rng = np.random.default_rng(1)
  cotangents = {"mlm_logits": rng.normal(size=(BATCH, MLM_POSITIONS.shape[1], VOCAB)),
                "sentence_logits": rng.normal(size=(BATCH, 2))}

  def objective(p):
    out = model.apply({"params": p}, **inputs, deterministic=deterministic,
                      rngs={"dropout": dropout_key(7)})
    return sum(jnp.sum(out[k] * cotangents[k]) for k in out), out

  (_, outputs), grads = jax.value_and_grad(objective, has_aux=True)(params)
  return outputs, grads


@pytest.fixture(scope="module")
def unrolled():
  """The unrolled, non-rematerialised BERT: (params, outputs, grads) with dropout off."""
  model, params = random_params(tiny_config(), 2)
  return (params,) + outputs_and_grads(model, params, make_inputs(), deterministic=True)


def test_stacked_tree_is_the_scanned_models_tree(unrolled):
  params = unrolled[0]
  model = pretraining.MaskedLM(tiny_config(scan_layers=True), 2)
  scanned = jax.eval_shape(lambda: nn.meta.unbox(
      model.init(jax.random.key(0), **make_inputs(), deterministic=True))["params"])
  stacked = stack_layers(params, 2)
  assert jax.tree.structure(stacked) == jax.tree.structure(scanned)
  assert jax.tree.map(jnp.shape, stacked) == jax.tree.map(lambda s: s.shape, scanned)


# Every remat policy on the unrolled layers, the scanned layers, and remat inside the scan (the
# policy reaches both layer classes the same way, so one policy covers that branch).
# Q, K and V as one matmul (model.fused_qkv) reads the same parameters and gives the same values.
VARIANTS = [dict(remat_policy="full"), dict(remat_policy="dots"),
            dict(remat_policy="dots_no_batch"), dict(scan_layers=True),
            dict(scan_layers=True, remat_policy="dots"), dict(fused_qkv=True),
            dict(scan_layers=True, fused_qkv=True)]


@pytest.mark.parametrize("variant", VARIANTS,
                         ids=lambda v: "-".join(f"{k}={x}" for k, x in v.items()))
def test_scan_and_remat_match_unrolled(unrolled, variant):
  params, ref_outputs, ref_grads = unrolled
  model = pretraining.MaskedLM(tiny_config(**variant), 2)
  scan_layers = variant.get("scan_layers", False)
  if scan_layers:
    params = stack_layers(params, 2)
  outputs, grads = outputs_and_grads(model, params, make_inputs(), deterministic=True)
  if scan_layers:
    grads = unstack_layers(grads, 2)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), outputs,
               ref_outputs)
  assert jax.tree.structure(grads) == jax.tree.structure(ref_grads)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), grads,
               ref_grads)


def test_remat_keeps_dropout_masks(unrolled):
  """With dropout on, rematerialisation must redraw the same masks in the backward pass and take
  the same random streams as the plain model (same rng → same outputs and gradients)."""
  params, deterministic_outputs, _ = unrolled
  inputs = make_inputs()
  model = pretraining.MaskedLM(tiny_config(), 2)
  ref_outputs, ref_grads = outputs_and_grads(model, params, inputs, deterministic=False)
  # Dropout is really on, or the comparison below would prove nothing.
  assert not np.allclose(ref_outputs["mlm_logits"], deterministic_outputs["mlm_logits"], atol=1e-2)
  remat = pretraining.MaskedLM(tiny_config(remat_policy="dots"), 2)
  outputs, grads = outputs_and_grads(remat, params, inputs, deterministic=False)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), outputs,
               ref_outputs)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), grads,
               ref_grads)


# ------------------------------------------------------------------------------------------------
# Attention paths and padding.


def test_explicit_softmax_path_equals_fused_attention():
  # The explicit-softmax path runs only when attention dropout is on and not deterministic; a rate
  # of 1e-9 takes it while dropping nothing (the keep probability rounds to 1 in float32).
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(BATCH, LENGTH, 32)), jnp.float32)
  mask = layers.attention_mask_from_input_mask(make_inputs()["input_mask"])
  attention = lambda rate: layers.SelfAttention(  # noqa: E731
      heads=4, head_dim=8, attention_dropout=rate, initializer_range=0.02)
  shapes = jax.eval_shape(lambda: nn.meta.unbox(
      attention(0.0).init(jax.random.key(0), x, mask, deterministic=True)))
  variables = random_tree(shapes, 0.3, seed=1)  # scores of a few units: peaked attention
  fused = attention(0.0).apply(variables, x, mask, deterministic=True)
  explicit = attention(1e-9).apply(variables, x, mask, deterministic=False,
                                   rngs={"dropout": dropout_key(1)})
  np.testing.assert_allclose(explicit, fused, rtol=1e-5, atol=1e-5)
  dropped = attention(0.5).apply(variables, x, mask, deterministic=False,
                                 rngs={"dropout": dropout_key(1)})
  assert not np.allclose(dropped, fused, atol=1e-2)  # the explicit path does drop probabilities


def test_padded_vocabulary_changes_nothing_but_the_table(unrolled):
  """model.vocab_multiple=64 pads the 101-row table to 128 rows: with the same real rows the
  outputs are the unpadded model's (101 logits), and the padding rows get no gradient."""
  params, ref_outputs, ref_grads = unrolled
  model = pretraining.MaskedLM(tiny_config(vocab_multiple=64), 2)
  table = params["encoder"]["word_embeddings"]["embedding"]
  padding = jnp.asarray(np.random.default_rng(2).normal(size=(128 - VOCAB, table.shape[1])),
                        table.dtype)
  padded = jax.tree.map(lambda x: x, params)
  padded["encoder"]["word_embeddings"]["embedding"] = jnp.concatenate([table, padding])
  outputs, grads = outputs_and_grads(model, padded, make_inputs(), deterministic=True)
  assert outputs["mlm_logits"].shape[-1] == VOCAB
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), outputs,
               ref_outputs)
  table_grad = grads["encoder"]["word_embeddings"]["embedding"]
  np.testing.assert_array_equal(table_grad[VOCAB:], 0.0)
  np.testing.assert_allclose(table_grad[:VOCAB],
                             ref_grads["encoder"]["word_embeddings"]["embedding"],
                             rtol=1e-4, atol=1e-5)


def test_fused_qkv_is_one_matmul_forward_and_backward():
  """model.fused_qkv leaves two of the three projection matmuls out of the forward and two of the
  weight-gradient and two of the input-gradient matmuls out of the backward (6 - 2 = 4 fewer in
  the gradient's program)."""
  x = jnp.ones((BATCH, LENGTH, 32), jnp.float32)
  mask = layers.attention_mask_from_input_mask(make_inputs()["input_mask"])

  def matmuls(fused: bool, backward: bool) -> int:
    attention = layers.SelfAttention(heads=4, head_dim=8, attention_dropout=0.0,
                                     initializer_range=0.02, fused_qkv=fused)
    variables = nn.meta.unbox(attention.init(jax.random.key(0), x, mask, deterministic=True))
    forward = lambda v, x: jnp.sum(  # noqa: E731
        attention.apply(v, x, mask, deterministic=True))
    program = jax.grad(forward, argnums=(0, 1)) if backward else forward
    return str(jax.make_jaxpr(program)(variables, x)).count("dot_general")

  assert matmuls(False, False) - matmuls(True, False) == 2
  assert matmuls(False, True) - matmuls(True, True) == 2 + 4


# The fused path, and the explicit one with nothing dropped (see above).
FUSED = dict(config=dict(), deterministic=True)
EXPLICIT = dict(config=dict(dropout=0.0, attention_dropout=1e-9), deterministic=False)


@pytest.mark.parametrize("path", [FUSED, EXPLICIT], ids=["fused", "explicit"])
def test_padding_does_not_reach_real_positions(path):
  model, params = random_params(tiny_config(**path["config"]), 2)
  inputs = make_inputs()
  padded = inputs["input_mask"] == 0
  assert padded.any()
  rng = np.random.default_rng(5)
  changed = dict(inputs,
                 input_ids=np.where(padded, rng.integers(1, VOCAB, padded.shape),
                                    inputs["input_ids"]).astype(np.int32),
                 segment_ids=np.where(padded, 1 - inputs["segment_ids"], inputs["segment_ids"]))
  kwargs = dict(deterministic=path["deterministic"], rngs={"dropout": dropout_key(2)})
  real = ~padded
  hidden, changed_hidden = (encode(model, params, x, **kwargs) for x in (inputs, changed))
  np.testing.assert_allclose(changed_hidden[real], hidden[real], rtol=1e-6, atol=1e-6)
  outputs, changed_outputs = (model.apply({"params": params}, **x, **kwargs)
                              for x in (inputs, changed))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6),
               changed_outputs, outputs)


# ------------------------------------------------------------------------------------------------
# bfloat16 compute.


def test_bfloat16_compute_is_close_to_float32_with_float32_params():
  config = tiny_config(dtype="bfloat16")
  model = pretraining.MaskedLM(config, 2)
  inputs = make_inputs()
  bf16_init = jax.eval_shape(lambda: nn.meta.unbox(
      model.init(jax.random.key(0), **inputs, deterministic=True))["params"])
  assert {x.dtype for x in jax.tree.leaves(bf16_init)} == {jnp.dtype(jnp.float32)}
  _, params = random_params(tiny_config(), 2)  # the same values under both compute dtypes
  f32_model = pretraining.MaskedLM(tiny_config(), 2)
  reference = f32_model.apply({"params": params}, **inputs, deterministic=True)
  # Jitted: one compilation of the bfloat16 graph is cheaper than compiling its ops one by one.
  outputs = jax.jit(lambda p: model.apply({"params": p}, **inputs, deterministic=True))(params)
  for name, ref in reference.items():
    out = np.asarray(outputs[name].astype(jnp.float32))
    assert outputs[name].dtype == jnp.bfloat16, name  # the heads return the compute dtype
    assert np.isfinite(out).all(), name
    # bfloat16 keeps 8 significant bits (relative rounding 2^-9); through two layers and a head
    # the relative error norm is 4e-3 (MLM) and 1.3e-2 (NSP).
    relative_error = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert relative_error < 3e-2, (name, relative_error)


# ------------------------------------------------------------------------------------------------
# cuDNN flash attention (the GPU fast path): refused where it would deviate silently; on a GPU,
# the same function and gradient as the masked XLA path, padding included.


@pytest.mark.parametrize("overrides, message", [
    (dict(attention_impl="cudnn", attention_dropout=0.0), "dtype=bfloat16"),
    (dict(attention_impl="cudnn", dtype="bfloat16"), "attention_dropout=0"),
    (dict(attention_impl="flash"), "choose one of"),
])
def test_cudnn_attention_is_refused_where_it_would_deviate(overrides, message):
  config = config_lib.base_config()
  config.model.update(overrides)
  with pytest.raises(config_lib.ConfigError, match=message):
    objectives.validate(config)


@pytest.mark.skipif(jax.devices()[0].platform != "gpu", reason="cuDNN attention needs a GPU")
def test_cudnn_attention_equals_masked_xla_attention_with_padding():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(BATCH, LENGTH, 64)), jnp.bfloat16)
  mask = layers.attention_mask_from_input_mask(make_inputs()["input_mask"])
  assert not mask.all()
  attention = lambda impl: layers.SelfAttention(  # noqa: E731
      heads=4, head_dim=16, attention_dropout=0.0, initializer_range=0.02, attention_impl=impl,
      dtype=jnp.bfloat16)
  variables = random_tree(jax.eval_shape(lambda: nn.meta.unbox(
      attention("xla").init(jax.random.key(0), x, mask, deterministic=True))), 0.3, seed=1)

  def loss_and_grad(impl):
    loss = lambda v: jnp.sum(attention(impl).apply(  # noqa: E731
        v, x, mask, deterministic=True).astype(jnp.float32) ** 2)
    return jax.jit(jax.value_and_grad(loss))(variables)

  (ref_loss, ref_grads), (loss, grads) = loss_and_grad("xla"), loss_and_grad("cudnn")
  np.testing.assert_allclose(loss, ref_loss, rtol=2e-2)
  # The key bias's gradient is zero in exact arithmetic (it adds q·b to every score of a query,
  # which softmax ignores): on both paths it is bf16 rounding noise, small against the others
  # (measured on an H100: the two differ by 1e-3 of the largest gradient's norm).
  norms = lambda tree: {jax.tree_util.keystr(p): np.linalg.norm(np.asarray(g, np.float32))  # noqa: E731
                        for p, g in jax.tree_util.tree_flatten_with_path(tree)[0]}
  scale = max(norms(ref_grads).values())
  key_bias = "['params']['key']['bias']"
  assert norms(ref_grads)[key_bias] < 2e-2 * scale and norms(grads)[key_bias] < 2e-2 * scale
  errors = norms(jax.tree.map(lambda a, b: np.asarray(a, np.float32) - np.asarray(b, np.float32),
                              grads, ref_grads))
  relative = {k: errors[k] / n for k, n in norms(ref_grads).items() if k != key_bias}
  assert max(relative.values()) <= 3e-2, relative


# ------------------------------------------------------------------------------------------------
# Parameter counts (spec §11), from abstract shapes: nothing is allocated.


def load_config(name, arg=None):
  """`configs/<name>.py:<arg>`, loaded from its file as config_flags does."""
  path = pathlib.Path(__file__).resolve().parents[2] / "configs" / f"{name}.py"
  spec = importlib.util.spec_from_file_location(f"configs_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def count_params(tree):
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


def abstract_params(config):
  """The parameter shapes of the model `config`'s objective builds (MLM head; NSP when asked)."""
  model = mlm.build_model(config)
  ids = jnp.zeros((1, 8), jnp.int32)
  return jax.eval_shape(lambda: nn.meta.unbox(model.init(
      jax.random.key(0), ids, ids, ids, ids[:, :1], deterministic=True))["params"])


def test_bert_base_parameter_counts_equal_hf():
  params = abstract_params(load_config("bert"))
  # HF BertModel(BertConfig()) = embeddings + 12 layers + pooler: 109,482,240 (V 30,522, 512
  # positions, 2 token types).
  assert count_params(params["encoder"]) + count_params(
      params["sentence_head"]["pooler"]) == 109_482_240
  # HF BertForPreTraining adds the MLM transform (dense + LayerNorm), the output bias and the NSP
  # classifier; its decoder is tied: 110,106,428 (transformers 5.23.0; hf_parity_test.py checks it).
  assert count_params(params) == 110_106_428


def test_roberta_base_parameter_counts_equal_hf():
  config = load_config("roberta")
  params = abstract_params(config)
  assert "sentence_head" not in params
  hidden = config.model.hidden
  # HF's position table has 514 rows for our max_positions=512: its positions start at
  # padding_idx + 1 = 2, and rows 0 and 1 are never used by a real token.
  hf_offset_rows = 2 * hidden
  # HF RobertaModel (V 50,265, 1 token type, add_pooling_layer=True by default) = embeddings +
  # 12 layers + pooler: 124,645,632. RoBERTa pre-trains without a pooler, so ours has none; HF's
  # dense H→H + bias is added to our count.
  hf_pooler = hidden * hidden + hidden
  assert count_params(params["encoder"]) + hf_offset_rows + hf_pooler == 124_645_632
  # HF RobertaForMaskedLM (no pooler; LM head dense + LayerNorm + bias, tied decoder):
  # 124,697,433 (transformers 5.23.0; hf_parity_test.py checks it).
  assert count_params(params) + hf_offset_rows == 124_697_433
