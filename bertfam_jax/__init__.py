"""bertfam_jax: the BERT family of language models in JAX / Flax.

Importing the package adds the XLA flags below to `XLA_FLAGS` (a flag the environment already
names is left as it is): measured choices that change speed, not results (a run's losses and
parameters are bit for bit the same with or without them). They take effect when JAX starts its
backend, i.e. when the package is imported before the first computation, as every entry point
here does.

  --xla_cpu_enable_concurrency_optimized_scheduler=false
      XLA:CPU's default scheduler orders the step for ops running concurrently. On the 2-core
      CPU, in six back-to-back pairs, T5 :runlocal's train step was 15-22% faster with this flag
      in four (e.g. 382 against 464 ms) and level in two, never slower; BERT :runlocal's was level
      (docs/results.md). No effect on GPU or TPU.
"""

import os

XLA_FLAGS = ("--xla_cpu_enable_concurrency_optimized_scheduler=false",)


def _add_xla_flags(environ=os.environ) -> None:
  """Appends each of XLA_FLAGS to environ['XLA_FLAGS'] unless that flag is already named there."""
  current = environ.get("XLA_FLAGS", "")
  named = {flag.split("=")[0].lstrip("-") for flag in current.split()}
  added = [flag for flag in XLA_FLAGS if flag.split("=")[0].lstrip("-") not in named]
  if added:
    environ["XLA_FLAGS"] = " ".join([current, *added]).strip()


_add_xla_flags()
