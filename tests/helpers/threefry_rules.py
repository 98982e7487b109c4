"""threefry2x32's two CPU lowerings, for the tests of `bertfam_jax.train.threefry`: JAX's rolled
one (its CPU rule in jax 0.10.2; JAX's main branch has since dropped it, jax-ml/jax#37872), built
from the same function as the unrolled one so that the tests outlive that rule's name, and a
context that installs a rule for the CPU and puts `threefry.unroll_on_cpu` back afterwards."""

import contextlib
import functools

from jax._src.interpreters import mlir
from jax._src.random import threefry2x32 as jax_threefry

from bertfam_jax.train import threefry

ROLLED = mlir.lower_fun(functools.partial(jax_threefry._threefry2x32_lowering,
                                          use_rolled_loops=True), multiple_results=True)
UNROLLED = jax_threefry._threefry2x32_lowering_rule


@contextlib.contextmanager
def cpu_rule(rule):
  """Programs lowered inside the block lower threefry2x32 with `rule` on the CPU; after it, with
  the rule `threefry.unroll_on_cpu` installs (asserted installed: this JAX has the private rule)."""
  mlir.register_lowering(jax_threefry.threefry2x32_p, rule, platform="cpu")
  try:
    yield
  finally:
    installed = threefry.unroll_on_cpu()
  assert installed
