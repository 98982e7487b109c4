"""Test setup: 8 emulated CPU devices (set before jax initialises its backends) and strict numerics."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402  (must follow the XLA_FLAGS above)

jax.config.update("jax_numpy_rank_promotion", "raise")
