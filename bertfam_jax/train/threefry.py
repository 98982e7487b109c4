"""JAX's threefry2x32 on the CPU, lowered as on GPUs and TPUs: its 20 rounds unrolled.

JAX lowers the threefry2x32 hash behind `jax.random` (dropout's keep decisions, ELECTRA's
sampling, every key split) to a 5-iteration `while` loop on the CPU and to straight-line code
everywhere else. The loop keeps XLA:CPU from fusing the rounds with each other and with what
consumes the bits, so every iteration writes and reads two uint32 arrays the size of the mask.
Unrolled, the hash, the uniform's conversion and the keep comparison can fuse: T5 :runlocal's
CPU step went from 312 to 258 ms, BERT's from 224 to 190 ms (docs/results.md "Threefry unrolled
on the CPU").

The bits are the same: the unrolled rule is JAX's own, the one its GPU and TPU lowerings use,
the same 32-bit integer operations in the same order (tests/train/threefry_test.py compares
both programs' bits and dropout masks). So no random stream, hence no run, changes; only the
CPU program's shape and speed.

The rule is installed for the whole process, for CPU programs lowered afterwards (programs JAX
has already compiled keep theirs), user code included. It reaches into JAX's private modules; a
JAX that moves them leaves the CPU lowering as it was, with a warning, and fails the tests.
JAX's main branch has made the same change itself (jax-ml/jax#37872, "threefry2x32: use unrolled
loops in CPU lowering": no CPU rule is registered there, so the generic unrolled one applies);
the jax 0.10.2 of constraints.txt still has the rolled one. Under a JAX without it this module
re-registers what is already in use, and can go.
"""

from __future__ import annotations

from absl import logging

_warned = False


def unroll_on_cpu() -> bool:
  """Registers JAX's unrolled threefry2x32 lowering for the CPU (idempotent). Returns whether it
  is installed: False, with a warning the first time, when this JAX lacks the private rule."""
  global _warned
  try:
    from jax._src.interpreters import mlir
    from jax._src.random import threefry2x32 as jax_threefry
    primitive = jax_threefry.threefry2x32_p
    unrolled = jax_threefry._threefry2x32_lowering_rule  # noqa: SLF001  JAX's GPU / TPU rule
  except (ImportError, AttributeError) as e:
    if not _warned:
      _warned = True
      logging.warning("threefry2x32 stays a rolled loop on the CPU (this JAX lacks %s): the "
                      "same bits, CPU steps with dropout ~1.2x slower.", e)
    return False
  # Out of line, as JAX emits it for GPUs (the generic rule's own setting).
  mlir.register_lowering(primitive, unrolled, platform="cpu", inline=False)
  return True
