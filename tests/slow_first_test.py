"""tests/helpers/slow_first.py: the listed files exist, and the collection puts them first, slowest
first, each file's tests together and in their order."""

import os
import subprocess
import sys

from helpers import slow_first

_TESTS = os.path.dirname(os.path.abspath(__file__))


def test_every_listed_file_exists_once():
  """A renamed or deleted file would silently fall back to the collection order."""
  for name in slow_first.SLOWEST:
    assert os.path.isfile(os.path.join(_TESTS, name)), f"{name}: not a test file"
  assert len(set(slow_first.SLOWEST)) == len(slow_first.SLOWEST)


def test_the_collection_starts_with_the_slowest_files():
  """`pytest --collect-only` of the suite as setup.cfg runs it: the listed files first in their
  order, every file's tests contiguous, and within a file the order they are written in."""
  listed = subprocess.run(
      [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "tests/models",
       "tests/train", "tests/slow_first_test.py"],
      cwd=os.path.dirname(_TESTS), capture_output=True, text=True, timeout=300, check=True)
  nodeids = [line for line in listed.stdout.splitlines() if "::" in line]
  files = list(dict.fromkeys(nodeid.split("::")[0] for nodeid in nodeids))
  assert [f for f in files if f.startswith(("tests/models/", "tests/train/"))][:4] == [
      "tests/train/step_test.py", "tests/train/train_test.py", "tests/models/t5_model_test.py",
      "tests/models/fp8_test.py"]
  ranks = [slow_first.file_rank(f) for f in files]
  assert ranks == sorted(ranks)
  runs = [nodeid.split("::")[0] for nodeid in nodeids]
  assert len([f for i, f in enumerate(runs) if i == 0 or runs[i - 1] != f]) == len(files)
  own = [n.split("::")[1] for n in nodeids if n.startswith("tests/slow_first_test.py")]
  assert own == ["test_every_listed_file_exists_once",
                 "test_the_collection_starts_with_the_slowest_files"]
