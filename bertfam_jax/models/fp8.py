"""FP8 matmuls with per-tensor current scaling (`model.fp8_matmuls`, opt-in; off by default).

A matmul's two operands are rounded to float8_e4m3fn and the gradient arriving at its output to
float8_e5m2 (the "hybrid" format of Micikevicius et al. 2022, "FP8 Formats for Deep Learning"),
each under one scale per tensor taken from that tensor's own absolute maximum in the same step
(current scaling: Transformer Engine's `Float8CurrentScaling` recipe):

  scale = amax(|x|) / fp8_max,   x ≈ scale · fp8(x / scale)

The matmuls take the FP8 tensors themselves (`lax.dot_general` of float8 operands, output in
the compute dtype, then times the two scales), so XLA must run an FP8 GEMM on a GPU (Triton's or
cuBLASLt's, compute capability 8.9 and later); the CPU computes the same products exactly.
Rounding then dequantising around an ordinary bf16 matmul, the pattern XLA's GEMM rewriter was
meant to match, did not work: on an H200 with jax 0.11.2 the rounded tensors came back unrounded
(XLA drops a float32 → fp8 → float32 round trip as excess precision) and the step was 0.91× as
fast as without (docs/results.md). The rounding's derivative is taken as the identity (straight
through), so:

  forward      y  = s_x s_w · q(x) q(w)
  backward     dx = s_dy s_w · q(dy) q(w)ᵀ,   dw = s_x s_dy · q(x)ᵀ q(dy)

with every one of the three matmuls in FP8 (q: e4m3 for x and w, e5m2 for dy) and the FP8
operands, not the bf16 ones, kept for the backward. Biases are added after the matmul in the
compute dtype, so their gradients come from the unrounded dy. The scales are not parameters:
nothing joins the train state, checkpoints do not change, and a run can turn the switch on or
off when it resumes.

Two consequences of one scale per tensor: with `model.fused_qkv` the Q, K and V kernels are one
tensor and share one scale (so fused and unfused projections no longer give the same values, as
they do without FP8); and a row's outputs depend, through the activations' scales, on the other
rows of its batch, in evaluation too, so cached decoding (one token a step) does not reproduce the
full forward pass exactly.

Why current scaling and not the delayed scaling of `flax.linen.fp8_ops` (an amax history carried
between steps in the `_overwrite_with_gradient` collection): it needs no state in the loop, and
its scale is always that of the tensor it rounds, so no overflow from a stale scale. Its cost is
one reduction over each operand and output gradient, which must finish before that tensor can be
rounded. It is a documented deviation from the papers' bf16 / fp32 training, measured in
docs/results.md.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

FORWARD_DTYPE = jnp.float8_e4m3fn   # operands: 3 mantissa bits, max 448
BACKWARD_DTYPE = jnp.float8_e5m2    # output gradients: 2 mantissa bits, max 57344


def quantize(x, fp8_dtype):
  """x (any shape, a float dtype) → (fp8_dtype(x / scale) [x's shape], scale [] float32), with
  the per-tensor scale amax(|x|) / fp8_max, so x ≈ scale · q. Computed in float32; an all-zero
  tensor gets scale 1."""
  fp8_max = float(jnp.finfo(fp8_dtype).max)
  amax = jnp.max(jnp.abs(x)).astype(jnp.float32)
  scale = jnp.where(amax > 0, amax / fp8_max, 1.0)
  return jnp.clip(x.astype(jnp.float32) / scale, -fp8_max, fp8_max).astype(fp8_dtype), scale


def _scaled_product(a, b, contracting, scale, out_dtype):
  """scale · a·b for FP8 matrices a, b contracted over `contracting` ((a's dim,), (b's dim,)):
  the product in out_dtype (the GEMM's output, as measured), times the float32 scale, rounded to
  out_dtype again (two roundings of at most 2^-8 in bf16, against FP8's 2^-4)."""
  product = lax.dot_general(a, b, (contracting, ((), ())), preferred_element_type=out_dtype)
  return (product.astype(jnp.float32) * scale).astype(out_dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def fp8_matmul(x_MK, w_KN, dtype):
  """[M, K] · [K, N] → [M, N], both operands (in `dtype`) rounded to e4m3 under their own scales,
  the product in `dtype`; its gradients (below) round the output gradient to e5m2."""
  return _fp8_matmul_fwd(x_MK, w_KN, dtype)[0]


def _fp8_matmul_fwd(x_MK, w_KN, dtype):
  (xq, x_scale), (wq, w_scale) = quantize(x_MK, FORWARD_DTYPE), quantize(w_KN, FORWARD_DTYPE)
  return _scaled_product(xq, wq, ((1,), (0,)), x_scale * w_scale, dtype), (xq, x_scale, wq, w_scale)


def _fp8_matmul_bwd(dtype, residuals, dy_MN):
  xq, x_scale, wq, w_scale = residuals
  dyq, dy_scale = quantize(dy_MN, BACKWARD_DTYPE)
  dx_MK = _scaled_product(dyq, wq, ((1,), (1,)), dy_scale * w_scale, dtype)
  dw_KN = _scaled_product(xq, dyq, ((0,), (0,)), x_scale * dy_scale, dtype)
  return dx_MK, dw_KN


fp8_matmul.defvjp(_fp8_matmul_fwd, _fp8_matmul_bwd)


def fp8_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
                    **kwargs):
  """`lax.dot_general` as `fp8_matmul`: a drop-in for `nn.Dense(dot_general=...)` and
  `jnp.einsum(..., _dot_general=...)`. Contractions without batch dimensions of two operands of
  one dtype, the product in that dtype (every dense layer here); the operands are laid out as
  [free, contracted] · [contracted, free] (no transpose for the layouts used here) and reshaped
  to matrices, and the product reshaped back. `precision` and sharding arguments are not used:
  FP8 fixes the precision."""
  del precision, kwargs
  (lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch) = dimension_numbers
  # jnp.einsum lists contracted dimensions in name order ('blnh,nhd': (3, 2), (1, 0)); in the
  # lhs's order they need no transpose, and a tensor-split leading dimension stays leading.
  lhs_contracting, rhs_contracting = (
      tuple(dims) for dims in zip(*sorted(zip(lhs_contracting, rhs_contracting))))
  dtype = jnp.dtype(lhs.dtype)
  if lhs_batch or rhs_batch or rhs.dtype != dtype or jnp.dtype(
      preferred_element_type or dtype) != dtype:
    raise NotImplementedError(
        f"fp8_dot_general: {lhs.dtype} · {rhs.dtype} → {preferred_element_type} with dimensions "
        f"{dimension_numbers}; it takes no batch dimensions and one dtype.")
  lhs_free = [d for d in range(lhs.ndim) if d not in lhs_contracting]
  rhs_free = [d for d in range(rhs.ndim) if d not in rhs_contracting]
  x = jnp.transpose(lhs, lhs_free + list(lhs_contracting))
  w = jnp.transpose(rhs, list(rhs_contracting) + rhs_free)
  contracted = math.prod(lhs.shape[d] for d in lhs_contracting)
  y = fp8_matmul(x.reshape(-1, contracted), w.reshape(contracted, -1), dtype)
  return y.reshape([lhs.shape[d] for d in lhs_free] + [rhs.shape[d] for d in rhs_free])


def dot_general(fp8: bool):
  """The `dot_general` a model's dense matmuls use: FP8 (`fp8_dot_general`) or `lax.dot_general`."""
  return fp8_dot_general if fp8 else lax.dot_general
