"""The package's XLA flags: added on import, never over a flag the environment names."""

import os

import bertfam_jax


def test_flags_are_added_and_the_environment_wins():
  environ = {}
  bertfam_jax._add_xla_flags(environ)  # pylint: disable=protected-access
  assert environ["XLA_FLAGS"] == " ".join(bertfam_jax.XLA_FLAGS)
  environ = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8 "
                          "--xla_cpu_enable_concurrency_optimized_scheduler=true"}
  bertfam_jax._add_xla_flags(environ)  # pylint: disable=protected-access
  assert environ["XLA_FLAGS"] == ("--xla_force_host_platform_device_count=8 "
                                  "--xla_cpu_enable_concurrency_optimized_scheduler=true")
  environ = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
  bertfam_jax._add_xla_flags(environ)  # pylint: disable=protected-access
  assert environ["XLA_FLAGS"].split() == ["--xla_force_host_platform_device_count=8",
                                          *bertfam_jax.XLA_FLAGS]


def test_this_process_runs_with_them():
  assert all(flag in os.environ["XLA_FLAGS"].split() for flag in bertfam_jax.XLA_FLAGS)
