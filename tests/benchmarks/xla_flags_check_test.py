"""benchmarks/xla_flags_check.py: flag sets parsed, the verdict (within 1.5 × the default's
distance from the float32 reference or the tolerance; NaN and missing leaves fail), and one CPU
run end to end, a harmless flag equal and an unknown one an error."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import xla_flags_check as check  # noqa: E402  pylint: disable=wrong-import-position


def test_flag_sets_are_parsed():
  assert check.parse_flag_sets("a=--x=1 --y=2; b=--z=0;") == {"a": "--x=1 --y=2", "b": "--z=0"}
  assert set(check.parse_flag_sets(check.GPU_FLAG_SETS)) == {"cublaslt", "cudnn-layernorm",
                                                             "no-triton-gemm"}
  for bad in ("--x=1", "a=x=1", "=--x=1"):
    with pytest.raises(ValueError, match="name=--flag"):
      check.parse_flag_sets(bad)


def _computation(loss, **grads):
  return {"loss": loss, "grads": {k: np.asarray(v, np.float32) for k, v in grads.items()}}


def test_verdict():
  rng = np.random.default_rng(0)
  w, b = rng.normal(size=(8, 4)), rng.normal(size=4)
  reference = _computation(2.0, w=w, b=b)
  # The default (bf16, say) 5% off the reference in w: the allowance for w is 7.5%.
  default = _computation(2.01, w=w * 1.05, b=b)
  assert check.compare(reference, default, _computation(2.0, w=w, b=b), 0.03)["ok"]
  within = check.compare(reference, default, _computation(2.02, w=w * 1.07, b=b), 0.03)
  assert within["ok"] and within["worst_leaf"] == "w"
  assert within["worst_distance"] == pytest.approx(0.07, rel=1e-5)
  # b: the default is exact, so its allowance is the 3% tolerance; 10% off fails, named.
  wrong = check.compare(reference, default, _computation(2.0, w=w, b=b * 1.1), 0.03)
  assert not wrong["ok"] and [f[0] for f in wrong["failures"]] == ["b"]
  assert not check.compare(reference, default, _computation(2.0, w=w * 1.08, b=b), 0.03)["ok"]
  loss_off = check.compare(reference, default, _computation(2.2, w=w, b=b), 0.03)
  assert [f[0] for f in loss_off["failures"]] == ["loss"]
  nan = check.compare(reference, default, _computation(2.0, w=w, b=np.full(4, np.nan)), 0.03)
  assert not nan["ok"] and nan["worst_leaf"] == "b"
  missing = check.compare(reference, default, _computation(2.0, w=w), 0.03)
  assert not missing["ok"]


def test_a_cpu_run_end_to_end(tmp_path):
  """Float32 on the CPU: the reference and default are the same computation; a scheduler flag
  leaves them equal, a flag this XLA does not know is its set's error, not the run's."""
  out = tmp_path / "flags.jsonl"
  proc = subprocess.run(
      [sys.executable, os.path.join(REPO, "benchmarks", "xla_flags_check.py"),
       "--row=bert-mini-128", "--fast_path=false", "--batch=2",
       "--flag_sets=scheduler=--xla_cpu_enable_concurrency_optimized_scheduler=false;"
       "unknown=--xla_no_such_flag_here=true", f"--output={out}"],
      capture_output=True, text=True, check=False, timeout=600,
      env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=""))
  assert proc.returncode == 0, proc.stderr[-2000:]
  lines = [l for l in proc.stdout.splitlines() if l.startswith("| scheduler") or
           l.startswith("| unknown")]
  assert "| equal |" in lines[0] and "error" in lines[1], proc.stdout
  records = [json.loads(l) for l in out.read_text().splitlines()]
  assert records[0]["ok"] and records[0]["worst_distance"] == 0.0 and "error" in records[1]
