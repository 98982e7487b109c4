"""FP8 matmuls (models/fp8.py, `model.fp8_matmuls`): the rounding is the FP8 grid under each
tensor's own scale, all three matmuls of a dense layer (forward, input and weight gradients)
multiply rounded operands, every layer matmul of BERT and T5 is an FP8 matmul and nothing else
is, splitting heads over devices gathers nothing more, and a model trains. On a GPU each of them
is one FP8 GEMM."""

import os
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import ml_dtypes
import numpy as np
import optax
import pytest

from bertfam_jax import config_lib, objectives
from bertfam_jax.models import fp8, layers, pretraining, t5
from bertfam_jax.train import sharding
from bertfam_jax.train import step as step_lib
from helpers import tiny

ON_GPU = jax.devices()[0].platform == "gpu"
# FP8 tensor cores: compute capability 8.9 (Ada) and later, Hopper's 9.0 included.
FP8_GPU = ON_GPU and float(getattr(jax.devices()[0], "compute_capability", "0")) >= 8.9
# Half a unit in the last place, relative, for numbers in the normal range: 3 and 2 mantissa bits.
HALF_ULP = {fp8.FORWARD_DTYPE: 2.0 ** -4, fp8.BACKWARD_DTYPE: 2.0 ** -3}


def reference_round(x, fp8_dtype):
  """numpy's (ml_dtypes') rounding of x to fp8_dtype under the scale amax(|x|) / fp8_max."""
  x = np.asarray(x, np.float64)
  scale = np.abs(x).max() / float(ml_dtypes.finfo(fp8_dtype).max)
  return (x / scale).astype(fp8_dtype).astype(np.float64) * scale


@pytest.mark.parametrize("fp8_dtype", [fp8.FORWARD_DTYPE, fp8.BACKWARD_DTYPE],
                         ids=["e4m3", "e5m2"])
def test_rounding_is_the_fp8_grid_under_the_tensors_own_scale(fp8_dtype):
  rng = np.random.default_rng(0)
  x = (rng.standard_t(3, size=(64, 48)) * 7e-3).astype(np.float32)  # heavy tails, small values
  q, scale = jax.jit(fp8.quantize, static_argnums=1)(x, fp8_dtype)
  assert q.dtype == fp8_dtype
  rounded = np.asarray(q, np.float64) * float(scale)
  np.testing.assert_allclose(rounded, reference_round(x, fp8_dtype), rtol=1e-6)
  largest = np.abs(x).argmax()
  assert rounded.flat[largest] == pytest.approx(x.flat[largest], rel=1e-6)  # amax maps to max
  normal = np.abs(x) >= float(ml_dtypes.finfo(fp8_dtype).smallest_normal) * float(scale)
  assert normal.mean() > 0.9
  relative = np.abs(rounded - x)[normal] / np.abs(x)[normal]
  assert relative.max() <= HALF_ULP[fp8_dtype] * (1 + 1e-5)
  assert relative.max() > HALF_ULP[fp8_dtype] / 2  # really rounded to that grid, not finer
  zeros, zeros_scale = fp8.quantize(jnp.zeros((4, 4)), fp8_dtype)
  assert float(zeros_scale) == 1.0 and not np.asarray(zeros, np.float32).any()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
def test_forward_and_both_gradients_multiply_rounded_operands(dtype):
  """y = r4(x)·r4(w), dx = r5(dy)·r4(w)ᵀ, dw = r4(x)ᵀ·r5(dy), as numpy computes them (r4 / r5:
  `reference_round` to e4m3 / e5m2). In float32 to float32 rounding (on a GPU, the FP8 GEMMs'
  fp32 accumulation order differs from numpy's); in bf16 to the output's own two roundings (the
  product, then times the scales: 2^-8 each). An operand left unrounded moves outputs by ~2-6%."""
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.normal(size=(2, 16, 32)), dtype)
  w = jnp.asarray(rng.normal(size=(32, 4, 8)) * 0.1, dtype)
  dy = jnp.asarray(rng.normal(size=(2, 16, 4, 8)) * 1e-3, dtype)
  y, vjp = jax.vjp(lambda x, w: layers.einsum("bld,dnh->blnh", x, w, True), x, w)
  dx, dw = vjp(dy)
  assert y.dtype == dx.dtype == dw.dtype == dtype
  x4, w4, dy5 = (reference_round(np.asarray(x, np.float32), fp8.FORWARD_DTYPE),
                 reference_round(np.asarray(w, np.float32), fp8.FORWARD_DTYPE),
                 reference_round(np.asarray(dy, np.float32), fp8.BACKWARD_DTYPE))
  for ours, reference in ((y, np.einsum("bld,dnh->blnh", x4, w4)),
                          (dx, np.einsum("blnh,dnh->bld", dy5, w4)),
                          (dw, np.einsum("bld,blnh->dnh", x4, dy5))):
    ours, scale = np.asarray(ours, np.float64), np.abs(reference).max()
    if dtype == jnp.float32:  # float32 sums cancel: absolute, at the output's scale
      np.testing.assert_allclose(ours, reference, rtol=0, atol=(2e-3 if ON_GPU else 1e-5) * scale)
    else:
      np.testing.assert_allclose(ours, reference, rtol=2 ** -7, atol=1e-3 * scale)


_IDS = np.random.default_rng(2).integers(1, tiny.VOCAB, (2, 16)).astype(np.int32)
BERT_INPUTS = dict(input_ids=_IDS, input_mask=np.ones_like(_IDS), segment_ids=np.zeros_like(_IDS),
                   mlm_positions=np.array([[1, 4, 9], [0, 7, 15]], np.int32))


def bert_loss(config):
  """(loss of MaskedLM(config) over BERT_INPUTS as a function of params, abstract params)."""
  inputs = BERT_INPUTS
  targets = jnp.asarray(_IDS[np.arange(2)[:, None], inputs["mlm_positions"]])
  model = pretraining.MaskedLM(config, 2)

  def loss(params):
    logits = model.apply({"params": params}, **inputs, deterministic=True)["mlm_logits"]
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), targets).mean()

  shapes = jax.eval_shape(lambda: nn.meta.unbox(
      model.init(jax.random.key(0), **inputs, deterministic=True))["params"])
  return loss, shapes


def t5_loss(config):
  rng = np.random.default_rng(3)
  inputs, targets = (rng.integers(1, tiny.VOCAB, (2, n)).astype(np.int32) for n in (16, 8))
  model = t5.T5(config)

  def loss(params):
    logits = model.apply({"params": params}, inputs, targets, deterministic=True)
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), targets).mean()

  shapes = jax.eval_shape(lambda: nn.meta.unbox(
      model.init(jax.random.key(0), inputs, targets, deterministic=True))["params"])
  return loss, shapes


# Each family's layer matmuls: BERT's q, k, v, output and two MLP matmuls per layer (4 with Q, K
# and V fused); T5's encoder the same (v1.0: no gated MLP), its decoder's self- and
# cross-attention four each and two MLP.
FAMILIES = {"bert": (bert_loss, tiny.encoder, 2 * 6),
            "bert-fused-qkv": (bert_loss, lambda **kw: tiny.encoder(fused_qkv=True, **kw), 2 * 4),
            "t5": (t5_loss, tiny.t5, 2 * 6 + 2 * 10)}


def fp8_ops(program_text: str) -> dict:
  """How many converts to e4m3 and to e5m2, and matmuls of two FP8 operands, a lowered program
  holds."""
  f8 = r"tensor<[^>]*xf8E\w+>"
  counts = {dtype: len(re.findall(rf"stablehlo\.convert .*-> tensor<[^>]*x{dtype}>", program_text))
            for dtype in ("f8E4M3FN", "f8E5M2")}
  counts["fp8 matmuls"] = len(re.findall(rf"stablehlo\.dot_general .*: \({f8}, {f8}\)",
                                         program_text))
  return counts


@pytest.mark.parametrize("family", FAMILIES)
def test_every_layer_matmul_is_rounded_and_the_gradients_stay_close(family):
  """The gradient program rounds two operands of each layer matmul to e4m3 and its output
  gradient to e5m2, and multiplies FP8 tensors in its forward and both gradient matmuls, and
  nothing else (embeddings and heads stay bf16). Against float32, FP8's
  gradients are further than bf16's (coarser rounding) but close (measured on the CPU: BERT 2.3%
  against bf16's 0.56%, T5 15.0% against 2.9%, of the gradient's norm)."""
  make_loss, make_config, matmuls = FAMILIES[family]
  f32_loss, shapes = make_loss(make_config())
  bf16_loss, _ = make_loss(make_config(dtype="bfloat16"))
  fp8_loss, _ = make_loss(make_config(dtype="bfloat16", fp8_matmuls=True))
  rng = np.random.default_rng(4)
  params = jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape) * 0.2, s.dtype), shapes)
  assert fp8_ops(jax.jit(jax.grad(fp8_loss)).lower(params).as_text()) == {
      "f8E4M3FN": 2 * matmuls, "f8E5M2": matmuls, "fp8 matmuls": 3 * matmuls}
  assert fp8_ops(jax.jit(jax.grad(bf16_loss)).lower(params).as_text()) == {
      "f8E4M3FN": 0, "f8E5M2": 0, "fp8 matmuls": 0}
  gradient = lambda loss: np.concatenate([  # noqa: E731
      np.ravel(np.asarray(g, np.float32)) for g in jax.tree.leaves(jax.jit(jax.grad(loss))(params))])
  reference = gradient(f32_loss)
  bf16_error, fp8_error = (np.linalg.norm(gradient(loss) - reference) / np.linalg.norm(reference)
                           for loss in (bf16_loss, fp8_loss))
  assert bf16_error < fp8_error < 0.2, (bf16_error, fp8_error)


def test_a_bert_with_fp8_matmuls_learns_one_batch_as_bf16_does():
  """40 Adam steps on one batch: measured on the CPU, 6.23 → 1.14 with and without FP8."""
  def train(fp8_matmuls):
    loss, shapes = bert_loss(tiny.encoder(dtype="bfloat16", fp8_matmuls=fp8_matmuls))
    rng = np.random.default_rng(5)
    params = jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape) * 0.02, s.dtype), shapes)
    optimizer = optax.adam(1e-2)

    @jax.jit
    def step(params, opt_state):
      value, grads = jax.value_and_grad(loss)(params)
      updates, opt_state = optimizer.update(grads, opt_state)
      return optax.apply_updates(params, updates), opt_state, value

    opt_state, losses = optimizer.init(params), []
    for _ in range(40):
      params, opt_state, value = step(params, opt_state)
      losses.append(float(value))
    return losses

  fp8_losses, bf16_losses = train(True), train(False)
  assert np.isfinite(fp8_losses).all()
  assert fp8_losses[-1] < 0.3 * fp8_losses[0], fp8_losses
  assert fp8_losses[-1] < 1.1 * bf16_losses[-1], (fp8_losses, bf16_losses)


def test_split_heads_gather_nothing_more_in_fp8():
  """On a data × tensor mesh (heads and MLP columns split, as Megatron), the FP8 gradient
  program all-gathers no more than the bf16 one, fused QKV included: FP8 multiplies matrices,
  and the kernels' dimensions merge with the split one leading."""
  mesh = sharding.make_mesh(ml_collections.ConfigDict(dict(data=2, fsdp=1, tensor=2)),
                            jax.devices()[:4])

  def gathers(fp8_matmuls: bool) -> int:
    config = tiny.encoder(dtype="bfloat16", fused_qkv=True, fp8_matmuls=fp8_matmuls)
    loss, _ = bert_loss(config)
    boxed = jax.eval_shape(lambda: pretraining.MaskedLM(config, 2).init(
        jax.random.key(0), **BERT_INPUTS, deterministic=True))["params"]
    params = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          nn.meta.unbox(boxed), sharding.logical_to_shardings(boxed, mesh))
    program = step_lib.with_mesh_context(jax.jit(jax.grad(loss)), mesh).lower(params)
    return program.compile().as_text().count(" all-gather(")

  assert gathers(True) <= gathers(False)


def test_fp8_matmuls_need_bf16_compute():
  config = config_lib.base_config()
  config.model.fp8_matmuls = True
  with pytest.raises(config_lib.ConfigError, match="model.fp8_matmuls.*dtype=bfloat16"):
    objectives.validate(config)
  # A distillation teacher computes with its own fields: its FP8 needs its own bf16.
  config = config_lib.load_config(os.path.join(os.path.dirname(__file__), "..", "..", "configs",
                                               "distilbert.py"))
  config.objective.teacher_model.update(fp8_matmuls=True, dtype="float32")
  with pytest.raises(config_lib.ConfigError, match=r"objective\.teacher_model\.fp8_matmuls.*"
                                                   r"--config\.objective\.teacher_model\.dtype"):
    objectives.validate(config)
  config.objective.teacher_model.dtype = "bfloat16"
  with pytest.raises(config_lib.ConfigError, match="objective.teacher is empty"):   # the next check
    objectives.validate(config)


def gemm_operand_dtypes(hlo: str) -> list[tuple[str, str]]:
  """The dtypes of the two operands of every matmul in an optimised HLO module's text: each
  `dot` instruction (XLA's own and those inside Triton GEMM fusions) and each cuBLAS GEMM call."""
  dtype_of = dict(re.findall(r"%(\S+) = (\w+)\[", hlo))
  calls = re.findall(r"= \w+\[[^=]*? dot\(%(\S+), %(\S+?)\)", hlo)
  calls += re.findall(r"custom-call\(%(\S+), %(\S+?)[,)].*custom_call_target=\"__cublas", hlo)
  return [(dtype_of[a], dtype_of[b]) for a, b in calls]


@pytest.mark.skipif(not FP8_GPU, reason="the FP8 GEMM check needs a GPU (Hopper or later)")
def test_each_matmul_is_one_fp8_gemm_on_a_gpu():
  """A dense layer's forward, input-gradient and weight-gradient matmuls compile to three GEMMs
  of FP8 operands (Triton's or cuBLASLt's), for nn.Dense (the MLPs) and einsum (the projections).
  (A first version, on an H200 with jax 0.11.2, found Triton GEMM fusions where it looked for
  cuBLAS calls only; this one has not run on a GPU yet.)"""
  rng = np.random.default_rng(6)
  x = jnp.asarray(rng.normal(size=(8, 128, 256)), jnp.bfloat16)
  dense = nn.Dense(512, dtype=jnp.bfloat16, dot_general=fp8.fp8_dot_general)
  params = jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape) * 0.05, s.dtype),
                        jax.eval_shape(dense.init, jax.random.key(0), x))
  kernel = jnp.asarray(rng.normal(size=(256, 4, 64)) * 0.05, jnp.bfloat16)
  square = lambda y: jnp.sum(y.astype(jnp.float32) ** 2)  # noqa: E731  its gradient needs y
  programs = {
      "dense": jax.jit(jax.grad(lambda p, x: square(dense.apply(p, x)), argnums=(0, 1))).lower(
          params, x),
      "einsum": jax.jit(jax.grad(lambda k, x: square(layers.einsum("bld,dnh->blnh", x, k, True)),
                                 argnums=(0, 1))).lower(kernel, x),
  }
  for name, lowered in programs.items():
    gemms = gemm_operand_dtypes(lowered.compile().as_text())
    assert len(gemms) == 3 and all(a.startswith("f8") and b.startswith("f8") for a, b in gemms), (
        name, gemms)
