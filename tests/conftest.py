"""Test setup: 8 emulated CPU devices (set before jax initialises its backends), strict numerics,
and a private cache (corpus, tokenizers, compiled programs) shared by the session and the
subprocesses it starts, removed when the session ends."""

import atexit
import gc
import os
import shutil
import tempfile

# XLA:CPU aborts the process when one of the 8 devices' threads reaches a collective more than 40 s
# after the others ("Termination timeout ... exceeded"): on a 2-core machine under load (another
# xdist worker compiling, a background job) a starved thread did, twice, killing the worker
# mid-fixture with no message. 10 minutes is still a hang, not a slow step.
#
# XLA:CPU's newer fusion emitters compile a tiny BERT train step in ~2.6 s, the older loop emitters
# in ~1.7 s, with the same step time (measured on the 2-core CI machine's CPU): tests are
# dominated by compilation, so they use the older ones. Inherited by the CLI subprocesses.
# Appended once: xdist's workers inherit the controller's XLA_FLAGS and run this file again.
_XLA_FLAGS = ("--xla_force_host_platform_device_count=8",
              "--xla_cpu_collective_call_terminate_timeout_seconds=600",
              "--xla_cpu_use_fusion_emitters=false")
_flags = os.environ.get("XLA_FLAGS", "").split()
os.environ["XLA_FLAGS"] = " ".join(_flags + [f for f in _XLA_FLAGS if f not in _flags])
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Tests run tiny shapes for a few steps: XLA:CPU's optimisation passes cost more than they save
# (the suite took 7.5 instead of 10 minutes on the 2-core CI machine). Inherited by the CLI
# subprocesses of tests/integration.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
if "BERTFAM_CACHE" not in os.environ:  # pytest-xdist's workers inherit the controller's
  os.environ["BERTFAM_CACHE"] = tempfile.mkdtemp(prefix="bertfam_test_cache_")
  atexit.register(shutil.rmtree, os.environ["BERTFAM_CACHE"], ignore_errors=True)
# The CLI subprocesses of tests/integration compile the same tiny programs again and again.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(os.environ["BERTFAM_CACHE"], "jax_compilation_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

import jax  # noqa: E402  (must follow the XLA_FLAGS above)
import pytest  # noqa: E402

# With CI=true a skipped test fails (tests/helpers/ci_skips.py): the plugin's hooks, as this
# conftest's own.
from helpers.ci_skips import (  # noqa: E402,F401  pylint: disable=unused-import
    pytest_make_collect_report, pytest_runtest_makereport)
# The slowest files first, so that the workers finish together (tests/helpers/slow_first.py).
from helpers.slow_first import (  # noqa: E402,F401  pylint: disable=unused-import
    pytest_collection_modifyitems)

jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """After each test file, the programs it compiled are dropped (`jax.clear_caches`): a worker
  kept every one, and three workers had grown to 17 GB together by the end of the suite on a
  24 GB machine of CI's kind (8.4 GB with this; docs/tests.md). A later file that runs the same
  program again reads it from the persistent compilation cache above (those that took 0.2 s or
  more to compile)."""
  yield
  jax.clear_caches()
  gc.collect()
