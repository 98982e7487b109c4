"""A pytest plugin: with CI=true a skipped test fails. CI installs every extra the suite uses,
so a skip there means a broken install (the [parity] extra) or a regression in what a test
checks for (e.g. `wordnet.find_wordnet_dir()`), and must not leave CI green. The skips CI needs
are listed in EXPECTED_IN_CI. tests/conftest.py loads it; a skip's reason is printed (`-rs` in
setup.cfg) everywhere else."""

import os

import pytest

EXPECTED_IN_CI = ("needs a GPU",)   # CI's machines have none


def _unexpected_skip(report) -> str | None:
  """The reason of a skip that CI must not have, else None."""
  if os.environ.get("CI") != "true" or not report.skipped:
    return None
  reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
  return None if any(expected in reason for expected in EXPECTED_IN_CI) else reason


def _fail(report) -> None:
  reason = _unexpected_skip(report)
  if reason is not None:
    report.outcome = "failed"
    report.longrepr = (f"skipped in CI (CI=true), where every extra the suite uses is installed: "
                       f"{reason}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # pylint: disable=unused-argument
  outcome = yield
  _fail(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):  # pylint: disable=unused-argument
  outcome = yield
  _fail(outcome.get_result())
