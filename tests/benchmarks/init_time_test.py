"""benchmarks/init_time.py: every phase to a row's first step is measured, in order."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import init_time  # noqa: E402  pylint: disable=wrong-import-position
import table  # noqa: E402  pylint: disable=wrong-import-position


def test_phases_of_a_cpu_row():
  config = table.row_config(table.ROWS_BY_NAME["bert-mini-128"], fast_path=False,
                            extra=("train.batch_size=8",))
  for on_host in (True, False):
    seconds = init_time.phases(config, on_host)
    assert list(seconds) == ["backend", "abstract", "init", "batch", "step lower",
                             "step compile", "first step"]
    assert all(s >= 0 for s in seconds.values())
    assert seconds["init"] > 0 and seconds["step compile"] > 0
