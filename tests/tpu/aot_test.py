"""tpu/aot.py: a config's real train step compiled ahead of time for a TPU slice this machine
does not have (libtpu's topology description, the [tpu-aot] extra), its memory and cost per
device reported, and a step that does not fit refused in one line. Every compilation runs in its
own process, as the tool does: libtpu loaded beside jaxlib's XLA can abort later computations of
the process (seen in a test worker)."""

import json
import os
import subprocess
import sys

import pytest

from bertfam_jax import config_lib
from helpers import tiny

pytest.importorskip("libtpu", reason="the [tpu-aot] extra (libtpu) is not installed")

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

from tpu import aot  # noqa: E402  (no libtpu loaded by the import)

# configs/bert.py:runlocal shrunk to the suite's tiny encoder, over data=2 x fsdp=2.
TINY = [f"--config.model.{k}={v}" for k, v in tiny.SIZE.items()] + [
    f"--config.model.vocab_size={tiny.VOCAB}", f"--config.model.max_positions={tiny.LENGTH}",
    f"--config.data.seq_len={tiny.LENGTH}", "--config.objective.max_predictions=5",
    "--config.train.batch_size=16", "--config.mesh.data=2", "--config.mesh.fsdp=2"]


def run(*args):
  # libtpu reads XLA_FLAGS too, and aborts on the XLA:CPU flag of tests/conftest.py it does not
  # know ("Unknown flags in XLA_FLAGS: --xla_cpu_use_fusion_emitters=false").
  env = dict(os.environ, XLA_FLAGS=os.environ["XLA_FLAGS"].replace(
      "--xla_cpu_use_fusion_emitters=false", ""))
  return subprocess.run([sys.executable, "-m", "tpu.aot", "--config=configs/bert.py:runlocal",
                         *args], cwd=_ROOT, env=env, capture_output=True, text=True, timeout=600)


def errors(result):
  return [line for line in result.stderr.splitlines() if line.startswith("error: ")]


@pytest.fixture(scope="module")
def report():
  result = run("--topology=v5e:2x2", "--json", *TINY)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "configs/bert.py:runlocal on v5e:2x2: 4 devices (TPU v5 lite, 4 chips)" in result.stdout
  return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_step_compiles_for_a_slice_with_its_memory_and_cost(report):
  assert (report["devices"], report["chips"], report["device_kind"]) == (4, 4, "TPU v5 lite")
  assert report["mesh"] == dict(data=2, fsdp=2, tensor=1)
  assert report["hbm_bytes"] == 16 * aot.GIB and report["fits"]
  # The state is sharded over fsdp=2: each device holds at least half the parameters and their
  # two Adam moments (float32); TPU layouts pad a 32-wide dimension to 128.
  params = 512 * 32 + 32 * 32 + 2 * (4 * 32 * 32 + 2 * 32 * 64)
  assert 3 * 4 * params / 2 < report["argument_bytes"] < 3 * 4 * params * 4
  # A forward and backward pass: ~6 FLOPs per matmul parameter and token, 8 rows of 32 a device.
  matmul_params = 2 * (4 * 32 * 32 + 2 * 32 * 64) + 512 * 32
  assert report["flops"] > 2 * matmul_params * 8 * 32
  assert 0 < report["step_seconds"] < 1


def test_a_step_that_does_not_fit_names_the_fix(report):
  fields = {k: v for k, v in report.items() if k not in ("used_bytes", "fits", "step_seconds")}
  small = aot.Report(**{**fields, "hbm_bytes": report["used_bytes"] / 2})
  assert not small.fits
  config = config_lib.base_config()
  config.mesh.update(data=2, fsdp=2)
  config.train.batch_size = 16
  message = str(aot.not_fitting(small, config))
  assert "--config.mesh.fsdp, now 2" in message and "remat_policy=full" in message
  assert "--config.train.batch_size (now 16)" in message


def test_bad_slices_and_batches_are_one_line():
  unknown = run("--topology=v9:2x2", *TINY)
  assert unknown.returncode == 2 and len(errors(unknown)) == 1
  assert "--topology=v9:2x2 is not a TPU slice" in errors(unknown)[0]
  odd = run("--topology=v5e:2x2", *TINY, "--config.train.batch_size=6")
  assert odd.returncode == 2
  assert errors(odd) == ["error: train.batch_size=6 does not split over the 4 data-parallel "
                         "devices of v5e:2x2; use a multiple of it."]
