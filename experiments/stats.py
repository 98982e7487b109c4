"""The statistics of the experiments' protocol (EXPERIMENTS.md §3), on per-example scores.

A row's score on a task is held as an array [seeds, examples]: one fine-tuned model per seed,
scored on the same evaluation examples as every other row. From those:

  t_interval(values)              mean and the 95% t-interval half-width over seeds
  bootstrap_means(per_example)    the resampling every interval below comes from: evaluation
                                  examples drawn with replacement (one draw shared by every row:
                                  the rows stay paired), plus each row's seed error as a t draw
  percentile_interval(samples)    the 2.5th and 97.5th percentiles
  kendall_tau / spearman_rho      rank correlations (tie-corrected), NaN when undefined
  ranks(values)                   1 = best, ties sharing their mean rank
  within_group_spearman(groups)   the mean over groups (rows) of the Spearman ρ between two
                                  quantities over seeds, with a within-group permutation p-value
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
from scipy import stats as scipy_stats

RESAMPLES = 10_000


def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
  """(mean, half-width of the two-sided Student-t interval of the mean) over `values` (one per
  seed); the half-width is NaN for a single value."""
  values = np.asarray(values, np.float64)
  if len(values) < 2:
    return float(values.mean()), float("nan")
  quantile = scipy_stats.t.ppf(0.5 + confidence / 2, df=len(values) - 1)
  return float(values.mean()), float(quantile * values.std(ddof=1) / np.sqrt(len(values)))


def bootstrap_means(per_example: Mapping[str, np.ndarray], resamples: int = RESAMPLES,
                    seed: int = 0, chunk: int = 500) -> dict[str, np.ndarray]:
  """Resampled mean scores of every row, paired over examples, with the seed spread of each.

  A row's mean varies for two reasons: which evaluation examples were drawn, and which seeds
  (pre-training and fine-tuning runs) were. Each resample draws the examples with replacement
  once for all rows (rows stay paired: shared hard examples cancel in a difference) and scores
  each row's seed-averaged per-example values on that draw; to that it adds the row's seed
  error, the standard error of its per-seed means times a Student-t draw with seeds − 1
  degrees of freedom. Resampling 3 seeds with replacement instead would cover about 77% where
  it claims 95% (the bootstrap of a mean of 3 shrinks its variance by 2/3 and never leaves the
  seeds' range); the t draw gives the seed level the coverage of the t-interval.

  Args:
    per_example: {row: [seeds, examples] scores}; every row scored on the same examples (its own
      number of seeds; with one seed no seed error is added).
    resamples: bootstrap draws.
    seed: the draws' random seed (the result is deterministic).
    chunk: resamples drawn at once (memory: chunk × examples counts).

  Returns:
    {row: [resamples] means}.
  """
  lengths = {np.shape(scores)[1] for scores in per_example.values()}
  if len(lengths) != 1:
    raise ValueError(f"rows scored on different numbers of examples: {sorted(lengths)}")
  examples = lengths.pop()
  rng = np.random.default_rng(seed)
  means = {row: [] for row in per_example}
  for start in range(0, resamples, chunk):
    size = min(chunk, resamples - start)
    counts = rng.multinomial(examples, np.full(examples, 1.0 / examples), size=size)  # [size, n]
    for row, scores in per_example.items():
      scores = np.asarray(scores, np.float64)                                # [seeds, n]
      drawn = counts @ scores.mean(axis=0) / examples                        # [size]
      seeds = len(scores)
      if seeds > 1:
        error = scores.mean(axis=1).std(ddof=1) / np.sqrt(seeds)
        drawn = drawn + error * rng.standard_t(seeds - 1, size=size)
      means[row].append(drawn)
  return {row: np.concatenate(parts) for row, parts in means.items()}


def percentile_interval(samples: np.ndarray, confidence: float = 0.95,
                        method: str = "linear") -> tuple[float, float]:
  """The central `confidence` interval of `samples`, NaNs (undefined resamples) left out;
  `method` as numpy's percentile ('nearest' keeps ranks ranks)."""
  tail = 100 * (1 - confidence) / 2
  low, high = np.nanpercentile(np.asarray(samples, np.float64), [tail, 100 - tail],
                               method=method)
  return float(low), float(high)


def ranks(values: Sequence[float]) -> np.ndarray:
  """1 = highest; ties share their mean rank ([85.0, 82.4, 82.4] → [1, 2.5, 2.5])."""
  return scipy_stats.rankdata(-np.asarray(values, np.float64))


def spearman_rho(a: Sequence[float], b: Sequence[float]) -> float:
  """Spearman's ρ: the Pearson correlation of the tie-averaged ranks; NaN when either side is
  constant or there are fewer than 2 values."""
  return float(spearman_rho_rows(np.asarray(a, np.float64)[None], b)[0])


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
  """Kendall's τ-b (ties on either side corrected for); NaN when either side is constant or
  there are fewer than 2 values."""
  return float(kendall_tau_rows(np.asarray(a, np.float64)[None], b)[0])


def spearman_rho_rows(samples: np.ndarray, reference: Sequence[float]) -> np.ndarray:
  """[rows] Spearman's ρ of each row of samples [rows, n] with reference [n]."""
  samples = np.asarray(samples, np.float64)
  if samples.shape[1] < 2:
    return np.full(len(samples), np.nan)
  ra = scipy_stats.rankdata(samples, axis=1)
  rb = scipy_stats.rankdata(np.asarray(reference, np.float64))
  ra, rb = ra - ra.mean(axis=1, keepdims=True), rb - rb.mean()
  denominator = np.sqrt((ra**2).sum(axis=1) * (rb**2).sum())
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(denominator > 0, (ra * rb).sum(axis=1) / denominator, np.nan)


def kendall_tau_rows(samples: np.ndarray, reference: Sequence[float]) -> np.ndarray:
  """[rows] Kendall's τ-b of each row of samples [rows, n] with reference [n]."""
  samples, reference = np.asarray(samples, np.float64), np.asarray(reference, np.float64)
  upper = np.triu_indices(samples.shape[1], k=1)
  da = np.sign(samples[:, :, None] - samples[:, None, :])[:, upper[0], upper[1]]   # [rows, pairs]
  db = np.sign(reference[:, None] - reference[None, :])[upper]                    # [pairs]
  denominator = np.sqrt((da != 0).sum(axis=1) * (db != 0).sum())
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(denominator > 0, (da * db).sum(axis=1) / denominator, np.nan)


def within_group_spearman(groups: Mapping[str, tuple[Sequence[float], Sequence[float]]],
                          permutations: int = RESAMPLES, seed: int = 0
                          ) -> tuple[float, float, dict[str, float]]:
  """Whether y tracks x between seeds, each group (row) compared only with itself.

  Args:
    groups: {group: (x [seeds], y [seeds])}; groups with fewer than 3 seeds, or with either side
      constant, are left out.
    permutations: draws of the null (y shuffled among the seeds of each group, independently).
    seed: the permutations' generator seed (deterministic).

  Returns:
    (mean ρ over the groups used, one-sided permutation p-value of a mean ρ at least as large,
    with the observed arrangement counted among the draws, {group: ρ}); (NaN, NaN, {}) when no
    group is usable.
  """
  rng = np.random.default_rng(seed)
  per_group, null = {}, []
  for name, (x, y) in groups.items():
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
      continue
    per_group[name] = spearman_rho(y, x)
    shuffled = rng.permuted(np.broadcast_to(y, (permutations, len(y))), axis=1)   # [P, seeds]
    null.append(spearman_rho_rows(shuffled, x))
  if not per_group:
    return float("nan"), float("nan"), {}
  observed = float(np.mean(list(per_group.values())))
  null_means = np.mean(null, axis=0)                                                # [P]
  p_value = (1 + np.sum(null_means >= observed - 1e-12)) / (permutations + 1)
  return observed, float(p_value), per_group
