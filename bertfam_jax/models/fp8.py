"""FP8 matmuls with per-tensor current scaling (`model.fp8_matmuls`, opt-in; off by default).

A matmul's two operands are rounded to float8_e4m3fn and the gradient arriving at its output to
float8_e5m2 (the "hybrid" format of Micikevicius et al. 2022, "FP8 Formats for Deep Learning"),
each under one scale per tensor taken from that tensor's own absolute maximum in the same step
(current scaling: Transformer Engine's `Float8CurrentScaling` recipe):

  scale = amax(|x|) / fp8_max,   x ≈ scale · fp8(x / scale)

The rounding is written as quantize-then-dequantize around an ordinary `dot_general` in the
compute dtype, the pattern XLA's GPU GEMM rewriter turns into one cuBLASLt FP8 matmul with the
two scales as arguments (on Hopper and later; elsewhere, the CPU included, the converts run as
written, so a CPU run has FP8's numerics without its speed). The rounding's derivative is taken
as the identity (straight through), and the output's rounding only acts on the way back, so:

  forward      y  = fp8(x) · fp8(w)
  backward     dx = fp8(dy) · fp8(w)ᵀ,   dw = fp8(x)ᵀ · fp8(dy)

with every one of the three matmuls in FP8. Biases are added after the matmul in the compute
dtype, so their gradients come from the unrounded dy. The scales are not parameters: nothing
joins the train state, checkpoints do not change, and a run can turn the switch on or off when
it resumes.

Why current scaling and not the delayed scaling of `flax.linen.fp8_ops` (an amax history carried
between steps in the `_overwrite_with_gradient` collection): it needs no state in the loop, and
its scale is always that of the tensor it rounds, so no overflow from a stale scale. Its cost is
one reduction over each operand and output gradient before the rounding that needs it, which
XLA cannot fuse into the tensor's producer. It is a documented deviation from the papers' bf16 /
fp32 training, measured in docs/results.md.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

FORWARD_DTYPE = jnp.float8_e4m3fn   # operands: 3 mantissa bits, max 448
BACKWARD_DTYPE = jnp.float8_e5m2    # output gradients: 2 mantissa bits, max 57344


def quantize_dequantize(x, fp8_dtype):
  """x (any shape, a float dtype) → x on fp8_dtype's grid under the per-tensor scale
  amax(|x|) / fp8_max, back in x's dtype: convert(fp8(x / scale)) · scale, the dequantisation
  XLA's GEMM rewriter matches. An all-zero tensor stays zero (its scale is 1)."""
  fp8_max = jnp.finfo(fp8_dtype).max.astype(jnp.float32)
  amax = jnp.max(jnp.abs(x)).astype(jnp.float32)
  scale = lax.stop_gradient(jnp.where(amax > 0, amax / fp8_max, 1.0)).astype(x.dtype)
  scaled = jnp.clip(x / scale, -fp8_max.astype(x.dtype), fp8_max.astype(x.dtype))
  return scaled.astype(fp8_dtype).astype(x.dtype) * scale


@jax.custom_vjp
def fp8_operand(x):
  """Forward: x rounded to e4m3 (`quantize_dequantize`); backward: the gradient as it comes."""
  return quantize_dequantize(x, FORWARD_DTYPE)


def _operand_fwd(x):
  return fp8_operand(x), None


def _operand_bwd(_, g):
  return (g,)


fp8_operand.defvjp(_operand_fwd, _operand_bwd)


@jax.custom_vjp
def fp8_output_gradient(y):
  """Forward: y as it is; backward: the gradient rounded to e5m2 (`quantize_dequantize`)."""
  return y


def _output_fwd(y):
  return y, None


def _output_bwd(_, g):
  return (quantize_dequantize(g, BACKWARD_DTYPE),)


fp8_output_gradient.defvjp(_output_fwd, _output_bwd)


def fp8_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
                    **kwargs):
  """`lax.dot_general` with both operands in e4m3 and its output gradient in e5m2: a drop-in for
  `nn.Dense(dot_general=...)` and `jnp.einsum(..., _dot_general=...)`."""
  out = lax.dot_general(fp8_operand(lhs), fp8_operand(rhs), dimension_numbers, precision,
                        preferred_element_type=preferred_element_type, **kwargs)
  return fp8_output_gradient(out)


def dot_general(fp8: bool):
  """The `dot_general` a model's dense matmuls use: FP8 (`fp8_dot_general`) or `lax.dot_general`."""
  return fp8_dot_general if fp8 else lax.dot_general
