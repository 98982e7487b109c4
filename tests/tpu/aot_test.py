"""tpu/aot.py: a config's real train step compiled ahead of time for a TPU slice this machine
does not have (libtpu's topology description, the [tpu-aot] extra), its memory and cost per
device reported, and a step that does not fit refused in one line."""

import os
import subprocess
import sys

import pytest

from bertfam_jax import config_lib
from bertfam_jax.config_lib import ConfigError
from helpers import tiny

pytest.importorskip("libtpu", reason="the [tpu-aot] extra (libtpu) is not installed")

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

from tpu import aot  # noqa: E402


def tiny_config(**mesh):
  c = config_lib.base_config()
  c.data.seq_len = 32
  c.model = tiny.encoder()
  c.objective.max_predictions = 5
  c.train.batch_size = 16
  c.mesh.update(mesh)
  return c


@pytest.fixture(scope="module")
def report():
  return aot.compile_step(tiny_config(data=2, fsdp=2), "v5e:2x2", "tiny")


def test_a_step_compiles_for_a_slice_with_its_memory_and_cost(report):
  assert (report.devices, report.chips, report.device_kind) == (4, 4, "TPU v5 lite")
  assert report.mesh == dict(data=2, fsdp=2, tensor=1)
  assert report.hbm_bytes == 16 * aot.GIB and report.fits
  # The state is sharded over fsdp=2: each device holds at least half the parameters and their
  # two Adam moments (float32); TPU layouts pad a 32-wide dimension to 128.
  params = 512 * 32 + 32 * 32 + 2 * (4 * 32 * 32 + 2 * 32 * 64)
  assert 3 * 4 * params / 2 < report.argument_bytes < 3 * 4 * params * 4
  # A forward and backward pass: ~6 FLOPs per parameter and token, the device's 8 rows of 32.
  matmul_params = 2 * (4 * 32 * 32 + 2 * 32 * 64) + 512 * 32
  assert report.flops > 2 * matmul_params * 8 * 32
  assert 0 < report.step_seconds < 1
  assert "memory per device" in "\n".join(report.lines())


def test_a_step_that_does_not_fit_names_the_fix(report):
  small = aot.Report(**{**report.__dict__, "hbm_bytes": report.used_bytes / 2})
  assert not small.fits
  message = str(aot.not_fitting(small, tiny_config(data=2, fsdp=2)))
  assert "--config.mesh.fsdp, now 2" in message and "remat_policy=full" in message
  assert "--config.train.batch_size (now 16)" in message


def test_bad_slices_are_one_line():
  with pytest.raises(ConfigError, match="--topology=v9:2x2 is not a TPU slice"):
    aot.topology_devices("v9:2x2")
  with pytest.raises(ConfigError, match="train.batch_size=6 does not split over the 4"):
    config = tiny_config()
    config.train.batch_size = 6
    aot.compile_step(config, "v5e:2x2")


def test_the_command_line(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "tpu.aot", "--config=configs/bert.py:runlocal", "--topology=v5e:2x2",
       "--config.model.layers=1", "--config.train.batch_size=8"],
      cwd=_ROOT, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "configs/bert.py:runlocal on v5e:2x2: 4 devices (TPU v5 lite, 4 chips)" in result.stdout
  bad = subprocess.run([sys.executable, "-m", "tpu.aot", "--config=configs/bert.py:runlocal",
                        "--topology=v5e:3x3x3x3"], cwd=_ROOT, capture_output=True, text=True,
                       timeout=600)
  assert bad.returncode == 2
  assert [line for line in bad.stderr.splitlines() if line.startswith("error: ")] == [
      next(line for line in bad.stderr.splitlines() if line.startswith("error: "))]
