"""tests/helpers/ci_skips.py: with CI=true a skipped test or module fails, but for the skips CI
is known to need; without CI, skips stay skips."""

import os
import subprocess
import sys

import pytest

_TESTS = os.path.dirname(os.path.abspath(__file__))
SKIPPING = '''
import pytest
missing = pytest.importorskip("{module}")

def test_runs():
  pass

@pytest.mark.skipif(True, reason="{reason}")
def test_skipped():
  pass
'''


def run_pytest(tmp_path, ci: bool, module="os", reason="WordNet 3.0 is not installed"):
  (tmp_path / "skipping_test.py").write_text(SKIPPING.format(module=module, reason=reason))
  env = {k: v for k, v in os.environ.items() if k != "CI"}
  env.update(PYTHONPATH=_TESTS, **({"CI": "true"} if ci else {}))
  return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "helpers.ci_skips", "-p",
                         "no:cacheprovider", "-rs", str(tmp_path / "skipping_test.py")],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("module", ["os", "no_such_module_here"])
def test_a_skip_fails_in_ci_only(tmp_path, module):
  outside, inside = run_pytest(tmp_path, ci=False, module=module), run_pytest(tmp_path, ci=True,
                                                                               module=module)
  assert outside.returncode == (0 if module == "os" else 5), outside.stdout  # 5: nothing ran
  # 1: a test failed; 2: a module skipped at collection, which interrupts the run.
  assert inside.returncode in (1, 2) and "skipped in CI (CI=true)" in inside.stdout, inside.stdout
  expected = "no_such_module_here" if module != "os" else "WordNet 3.0 is not installed"
  assert expected in inside.stdout


def test_a_gpu_skip_is_expected_in_ci(tmp_path):
  result = run_pytest(tmp_path, ci=True, reason="cuDNN attention needs a GPU")
  assert result.returncode == 0 and "1 passed, 1 skipped" in result.stdout, result.stdout
