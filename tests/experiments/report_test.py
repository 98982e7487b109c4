"""experiments/report.py's verdicts and signs, pinned: the floor rule is non-overlapping 95%
intervals on the primary column and the floor above the constant output (EXPERIMENTS.md §1);
the differences table is row − baseline, point and interval; the percentile interval is the
central 95%."""

import os
import sys

import numpy as np
import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, _ROOT)
from experiments import common, report, stats  # noqa: E402
from experiments import masking_schemes as ms  # noqa: E402

KEYS = [c.key for c in ms.COMPARISON.columns]


def _table(row, floor):
  return {"Subword Tokens": {k: row for k in KEYS},
          common.NO_PRETRAINING: {k: floor for k in KEYS}}


@pytest.mark.parametrize("row, floor, valid", [
    ((35.0, 1.0), (31.0, 1.0), True),             # 34 > 32: apart
    ((35.0, 4.0), (31.0, 0.5), False),            # the row's interval reaches the floor's
    ((35.0, 0.5), (31.0, 4.0), False),            # the floor's reaches the row's
    ((35.0, 2.0), (31.0, 2.0), False),            # touching: not apart
    ((35.0, float("nan")), (31.0, 0.1), False),   # one seed: no interval, never apart
    ((29.0, 0.1), (31.0, 0.1), False),            # below the floor
])
def test_the_floor_rule_is_non_overlapping_intervals(row, floor, valid):
  assert report.floor_check(_table(row, floor), ms.COMPARISON).valid is valid


@pytest.mark.parametrize("floor, constant, above", [
    ((12.0, 1.5), 0.11, False),    # the floor's lower end 10.5 is under the constant's 11.0
    ((12.0, 0.5), 0.11, True),     # 11.5 > 11.0
    ((12.0, 0.5), None, None),     # no constant given: not checked, the rows decide
])
def test_a_floor_at_the_constant_output_makes_the_scale_invalid(floor, constant, above):
  """§1: valid only if the floor is also above the constant output (a floor at the constant means
  the scale does not learn the task, whatever the rows do)."""
  primary = ms.COMPARISON.primary
  constants = {} if constant is None else {primary.task: constant}
  check = report.floor_check(_table((40.0, 1.0), floor), ms.COMPARISON, constants)
  assert check.floor_above_constant is above and check.valid is (above is not False)
  line = next(l for l in check.lines if l.startswith(f"- {primary.label}:"))
  if above is False:
    assert "the floor is not above the constant output (11.0)" in line


def test_the_percentile_interval_is_the_central_95():
  assert stats.percentile_interval(np.arange(1001.0)) == pytest.approx((25.0, 975.0))


def test_differences_are_row_minus_baseline_point_and_interval():
  rng = np.random.default_rng(0)
  results = []
  for name, shift in (("Subword Tokens", 0.0), ("Whole Words", 0.2),
                      (common.NO_PRETRAINING, -0.2)):
    for seed in range(3):
      examples = {t: {"accuracy": (rng.uniform(size=400) < 0.4 + shift).astype(float).tolist(),
                      "target_nll": (rng.uniform(1, 3, 400) - shift).tolist()}
                  for t in (common.SUPERSENSE, common.PROBE)}
      metrics = {f"{t}/accuracy": float(np.mean(examples[t]["accuracy"])) for t in examples}
      results.append(dict(row=name, seed=seed, metrics=metrics, examples=examples,
                          degenerate=[]))
  text = report.markdown(results, ms.COMPARISON, setup="", constants={}, degenerate={},
                         resamples=500)
  section = text.split("## Differences against Subword Tokens")[1].split("\n## ")[0]
  assert "Row − Subword Tokens" in section
  better = next(l for l in section.splitlines() if l.startswith("| Whole Words |"))
  worse = next(l for l in section.splitlines() if l.startswith(f"| {common.NO_PRETRAINING} |"))
  for line, sign in ((better, 1), (worse, -1)):
    for cell in line.strip("| ").split(" | ")[1:]:
      point = float(cell.split(" [")[0])
      low, high = (float(x) for x in cell.split(" [")[1].rstrip("]").split(", "))
      assert sign * point > 0 and low <= point <= high and sign * low > 0 and sign * high > 0, cell
