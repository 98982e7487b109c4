"""experiments/stats.py: intervals that cover at their nominal rate, a paired bootstrap that
gains from pairing, rank correlations equal to scipy's."""

import os
import sys

import numpy as np
import pytest
from scipy import stats as scipy_stats

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

from experiments import stats  # noqa: E402


def test_t_interval_covers_the_mean_at_its_nominal_rate():
  rng = np.random.default_rng(0)
  covered = 0
  for _ in range(2000):
    mean, half = stats.t_interval(rng.normal(5.0, 2.0, size=3))
    covered += abs(mean - 5.0) <= half
  assert 0.935 < covered / 2000 < 0.965
  assert stats.t_interval([1.0, 2.0, 3.0]) == pytest.approx((2.0, 4.302653 / np.sqrt(3)))
  assert np.isnan(stats.t_interval([4.0])[1])


def test_paired_bootstrap_resolves_what_unpaired_intervals_cannot():
  """Two rows whose models (3 seeds each) answer the same examples, of shared difficulty, the
  second 5 points more often: the examples' spread cancels in the paired difference, whose
  interval excludes 0 and is narrower than the rows' own intervals together."""
  rng = np.random.default_rng(1)
  difficulty = rng.uniform(0, 1, size=2000)
  answer = lambda p: (rng.uniform(size=(3, 2000)) < np.clip(p, 0, 1)).astype(float)  # noqa: E731
  base, better = answer(difficulty), answer(difficulty + 0.05)
  means = stats.bootstrap_means({"base": base, "better": better}, resamples=2000)
  difference = means["better"] - means["base"]
  low, high = stats.percentile_interval(difference)
  observed = better.mean() - base.mean()
  assert low < observed < high and low > 0
  own = [np.ptp(stats.percentile_interval(means[row])) for row in ("base", "better")]
  assert high - low < 0.8 * sum(own)
  # Deterministic given the seed; one draw of examples shared by both rows.
  again = stats.bootstrap_means({"base": base, "better": better}, resamples=2000)
  np.testing.assert_array_equal(again["better"], means["better"])
  same = stats.bootstrap_means({"a": base[:1], "b": base[:1].copy()}, resamples=500)
  np.testing.assert_array_equal(same["a"], same["b"])    # one seed: only the examples vary
  with pytest.raises(ValueError, match="different numbers of examples"):
    stats.bootstrap_means({"a": base, "b": base[:, :10]})


def test_bootstrap_intervals_cover_at_their_nominal_rate_with_three_seeds():
  """Two rows with no true difference whose seeds disagree far more than examples do (a run's
  luck dominates): the paired difference's 95% interval covers 0 in at least 95% of
  experiments (99% here: the per-example model noise counts in both levels, a conservative
  interval); resampling the 3 seeds with replacement covered 77%."""
  rng = np.random.default_rng(4)
  covered, experiments = 0, 300
  for _ in range(experiments):
    rows = {row: rng.normal(0, 0.3, size=(3, 1)) + rng.normal(0, 0.1, size=(3, 200))
            for row in ("a", "b")}
    means = stats.bootstrap_means(rows, resamples=400, seed=int(rng.integers(1 << 30)))
    low, high = stats.percentile_interval(means["a"] - means["b"])
    covered += low <= 0 <= high
  assert covered / experiments >= 0.94


def test_seed_spread_widens_the_interval():
  """A row whose seeds disagree gets a wider interval than one whose seeds agree."""
  rng = np.random.default_rng(2)
  steady = (rng.uniform(size=(3, 1000)) < 0.5).astype(float)
  shaky = np.stack([(rng.uniform(size=1000) < p).astype(float) for p in (0.3, 0.5, 0.7)])
  means = stats.bootstrap_means({"steady": steady, "shaky": shaky}, resamples=2000)
  assert np.ptp(stats.percentile_interval(means["shaky"])) > 3 * np.ptp(
      stats.percentile_interval(means["steady"]))


def test_rank_correlations_equal_scipys():
  rng = np.random.default_rng(3)
  for _ in range(100):
    a, b = rng.integers(0, 4, 6).astype(float), rng.integers(0, 4, 6).astype(float)
    for ours, theirs in ((stats.kendall_tau(a, b), scipy_stats.kendalltau(a, b).statistic),
                         (stats.spearman_rho(a, b), scipy_stats.spearmanr(a, b).statistic)):
      assert (np.isnan(ours) and np.isnan(theirs)) or ours == pytest.approx(theirs)
  samples = rng.normal(size=(50, 7))
  reference = rng.normal(size=7)
  np.testing.assert_allclose(stats.kendall_tau_rows(samples, reference),
                             [scipy_stats.kendalltau(s, reference).statistic for s in samples])
  np.testing.assert_allclose(stats.spearman_rho_rows(samples, reference),
                             [scipy_stats.spearmanr(s, reference).statistic for s in samples])
  np.testing.assert_array_equal(stats.ranks([85.0, 84.3, 82.4, 82.4, 82.2]), [1, 2, 3.5, 3.5, 5])
  assert np.isnan(stats.spearman_rho([1, 1, 1], [1, 2, 3]))
  assert np.isnan(stats.kendall_tau([1, 2], [3, 3]))


def test_within_group_spearman_finds_tracking_and_holds_its_size_without_it():
  """y rising with x inside every group, at different levels per group, is found (ρ = 1, the
  smallest p the draws allow); independent x and y are rejected at p < 0.05 about 5% of the
  time; too-small and constant groups are left out."""
  rng = np.random.default_rng(4)
  groups = {f"row{g}": (rng.normal(size=5) + 10 * g, None) for g in range(4)}
  groups = {k: (x, 3 * x - 40 * i) for i, (k, (x, _)) in enumerate(groups.items())}
  rho, p_value, per_row = stats.within_group_spearman(groups, permutations=2000)
  assert rho == pytest.approx(1.0) and p_value == pytest.approx(1 / 2001)
  assert per_row == pytest.approx({name: 1.0 for name in groups})
  # Pooling across groups would see the groups' levels (ρ < 0 here); within groups it does not.
  pooled_x = np.concatenate([x for x, _ in groups.values()])
  pooled_y = np.concatenate([y for _, y in groups.values()])
  assert stats.spearman_rho(pooled_x, pooled_y) < 0
  rejected = sum(stats.within_group_spearman(
      {g: (rng.normal(size=5), rng.normal(size=5)) for g in "abcde"}, permutations=500,
      seed=trial)[1] < 0.05 for trial in range(300))
  assert 0.02 < rejected / 300 < 0.09
  _, _, used = stats.within_group_spearman(
      {"two seeds": ([1, 2], [1, 2]), "constant": ([1, 2, 3], [4, 4, 4]), "ok": ([1, 2, 3],
                                                                                  [3, 1, 2])})
  assert list(used) == ["ok"]
  assert np.isnan(stats.within_group_spearman({"two seeds": ([1, 2], [1, 2])})[0])
