"""The report of a pre-train → fine-tune comparison (EXPERIMENTS.md §1, 3 and 6), from its
results.jsonl records.

A record is one (row, seed): `row`, `seed`, `metrics` {task/metric: value} and `examples`
{task: {metric: [examples] scores in [0, 1], target_nll: [examples] nats per token}} on the
same evaluation examples for every row, optionally the tokens it saw (`input_tokens`,
`target_tokens`, `targets_cut_share`, `targets_length`), `pretrain` {eval_accuracy, curve} and
timings. A `Comparison` says which rows, columns and paper numbers the report lays out:

  summarise(results, comparison)     per row and column: mean ± 95% t-interval over seeds
  resample(results, comparison)      hierarchical paired bootstrap means (`stats.bootstrap_means`)
  markdown(...)                      table.md: the floor check, the paper's layout with its
                                     numbers beside ours, differences against the baseline,
                                     ranks, Kendall τ / Spearman ρ per block, whether the
                                     primary metric tracks each seed's pre-training, what each
                                     row saw
  plot(...), curves(...)             plot.png, and curves.png where pre-training curves exist
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Mapping, NamedTuple, Sequence

import numpy as np

from experiments import stats


@dataclasses.dataclass(frozen=True)
class Column:
  """One of our measured columns, higher is better: `metric` of `task` (×100), or with
  metric 'target_nll' the gold targets' teacher-forced log-likelihood (−loss, nats per token)."""
  label: str
  task: str
  metric: str
  paper: str | None = None       # the paper column it stands in for

  @property
  def loglik(self) -> bool:
    return self.metric == "target_nll"

  @property
  def digits(self) -> int:
    """Decimals shown: 1 for scores ×100, 3 for log-likelihoods in nats."""
    return 3 if self.loglik else 1

  @property
  def key(self) -> str:
    """The record's metrics key (log-likelihood: the token-weighted {task}/target_loss, which
    the report replaces by the example-averaged loss: `seed_value`)."""
    return f"{self.task}/target_loss" if self.loglik else f"{self.task}/{self.metric}"

  def shown(self, value):
    """A value as the tables show it: scores ×100, losses negated into log-likelihoods."""
    return -value if self.loglik else 100 * value


@dataclasses.dataclass(frozen=True)
class Comparison:
  """What the report lays out; every column is higher-is-better, `primary` (a column key) is
  the one the floor check and the ranks use."""
  title: str
  rows: Sequence[str]
  baseline: str
  floor: str
  groups: Sequence[tuple[str, Sequence[str]]]     # the paper's blocks: (title, row names)
  columns: Sequence[Column]
  primary_key: str
  paper: Mapping[str, Mapping[str, float]]         # row -> paper column -> value
  paper_columns: Sequence[str]
  paper_source: str
  row_label: str = "Objective"                     # what a row is, the tables' first header
  # The rows the scale's validity asks to be above the floor (None: every row but the floor).
  # A compression comparison asks it of its teacher alone: a compressed row at the floor is a
  # result about that method, not a scale too small to measure anything.
  floor_rows: Sequence[str] | None = None

  @property
  def primary(self) -> Column:
    return next(c for c in self.columns if c.key == self.primary_key)


# ------------------------------------------------------------------------------------- numbers


def runs(results: Sequence[dict], row: str) -> list[dict]:
  return sorted((r for r in results if r["row"] == row), key=lambda r: r["seed"])


def rows_run(results: Sequence[dict], comparison: Comparison) -> list[str]:
  have = {r["row"] for r in results}
  return [name for name in comparison.rows if name in have]


def summarise(results: Sequence[dict], comparison: Comparison) -> dict[str, dict]:
  """{row: {column key: (mean, 95% t-interval half-width over seeds) as shown, seeds: n}}."""
  table = {}
  for name in rows_run(results, comparison):
    records = runs(results, name)
    table[name] = dict(seeds=len(records))
    for column in comparison.columns:
      table[name][column.key] = stats.t_interval([column.shown(seed_value(r, column))
                                                  for r in records])
  return table


def pretrain_accuracy(record: dict) -> float | None:
  """The run's held-out accuracy on its own pre-training targets; None for the floor or a
  record without one."""
  return (record.get("pretrain") or {}).get("eval_accuracy")


def seed_value(record: dict, column: Column) -> float:
  """One seed's value of a column: its metric, or for a log-likelihood the mean over examples
  of each example's per-token loss (what the bootstrap resamples; the record's token-weighted
  {task}/target_loss weights long targets more)."""
  if column.loglik:
    return float(np.mean(record["examples"][column.task][column.metric]))
  return record["metrics"][column.key]


def per_example(results: Sequence[dict], column: Column,
                rows: Sequence[str]) -> dict[str, np.ndarray]:
  """{row: [seeds, examples]} of the column's per-example values (for log-likelihoods each
  example's mean per token, negated by `Column.shown` later)."""
  return {name: np.array([r["examples"][column.task][column.metric]
                          for r in runs(results, name)]) for name in rows}


def resample(results: Sequence[dict], comparison: Comparison,
             resamples: int = stats.RESAMPLES) -> dict[str, dict[str, np.ndarray]]:
  """{column key: {row: [resamples] means as shown}}: `stats.bootstrap_means` per column, the
  same example draws for every row of a column (seeded per column, deterministic)."""
  rows = rows_run(results, comparison)
  out = {}
  for i, column in enumerate(comparison.columns):
    means = stats.bootstrap_means(per_example(results, column, rows), resamples, seed=i)
    out[column.key] = {row: column.shown(m) for row, m in means.items()}
  return out


def constant_output(scores: Mapping[str, float], column: Column) -> float | None:
  """The constant-output score of the column as shown: `scores[task]` for a score,
  `scores['task/target_nll']` (a constant distribution's loss) for a log-likelihood; None where
  `scores` has none."""
  value = scores.get(f"{column.task}/target_nll" if column.loglik else column.task)
  return None if value is None else column.shown(value)


def not_separated(table: Mapping[str, dict], comparison: Comparison, column: Column,
                  names: Sequence[str]) -> list[str]:
  """Those of `names` whose mean on `column` is not above the floor's by more than both
  intervals' half-widths (a missing interval counts as infinite)."""
  floor_mean, floor_half = table[comparison.floor][column.key]
  out = []
  for name in names:
    mean, half = table[name][column.key]
    if not mean - floor_mean > (np.nan_to_num(half, nan=np.inf)
                                + np.nan_to_num(floor_half, nan=np.inf)):
      out.append(name)
  return out


class FloorCheck(NamedTuple):
  valid: bool          # every checked row's primary interval entirely above the floor's, and the
                       # floor's above the primary column's constant output where one is given
  lines: list[str]     # one per column: the rows whose intervals overlap the floor's
  failing: list[str]   # the checked rows that are not (all of them when the floor did not run)
  checked: list[str]   # the rows that must clear the floor: `comparison.floor_rows` that ran
  floor_above_constant: bool | None = None   # on the primary column; None: no constant given


def floor_check(table: Mapping[str, dict], comparison: Comparison,
                constants: Mapping[str, float] | None = None) -> FloorCheck:
  """The floor against the pre-trained rows: the rows checked are `comparison.floor_rows` (every
  pre-trained row when None); a line per column says which rows' intervals overlap the floor's
  and where the floor stands against the constant output, when `constants` has the column's."""
  pretrained = [r for r in table if r != comparison.floor]
  checked = (pretrained if comparison.floor_rows is None else
             [r for r in comparison.floor_rows if r in pretrained])
  if comparison.floor not in table:
    return FloorCheck(False, ["The floor was not run: no row can be ranked (EXPERIMENTS.md §1)."],
                      checked, checked)
  lines, failing, above_constant = [], [], None
  for column in comparison.columns:
    floor_mean, floor_half = table[comparison.floor][column.key]
    overlapping = not_separated(table, comparison, column, pretrained)
    verdict = ("every pre-trained row better, intervals apart" if not overlapping else
               f"not separated from the floor: {', '.join(overlapping)}")
    constant = constant_output(constants or {}, column)
    above = None
    if constant is not None:   # the floor's whole interval (none: not above) over the constant
      above = bool(floor_mean - np.nan_to_num(floor_half, nan=np.inf) > constant)
      verdict += (f"; the floor is {'above' if above else 'not above'} the constant output "
                  f"({constant:.{column.digits}f})")
    if column.key == comparison.primary_key:
      failing, above_constant = [r for r in checked if r in overlapping], above
    lines.append(f"- {column.label}: floor {_interval(column, table[comparison.floor])}; "
                 f"{verdict}.")
  return FloorCheck(bool(checked) and not failing and above_constant is not False, lines,
                    failing, checked, above_constant)


def _interval(column: Column, row: Mapping) -> str:
  mean, half = row[column.key]
  digits = column.digits
  return f"{mean:.{digits}f}" if math.isnan(half) else f"{mean:.{digits}f} ± {half:.{digits}f}"


def _bootstrap_interval(samples: np.ndarray, digits: int) -> str:
  low, high = stats.percentile_interval(samples)
  return f"[{low:.{digits}f}, {high:.{digits}f}]"


# ------------------------------------------------------------------------------------ markdown


def markdown(results: Sequence[dict], comparison: Comparison, *, setup: str,
             constants: Mapping[str, float], degenerate: Mapping[str, Sequence[str]],
             resamples: int = stats.RESAMPLES) -> str:
  """table.md: setup, the floor check, the results in the paper's layout, paired differences
  against the baseline, ranks and rank agreement, and what each row saw.

  Args:
    results: the records.
    comparison: the layout.
    setup: a paragraph on the scale (model, data, budgets, evaluation sizes).
    constants: {task: the best constant output's score in [0, 1]} (majority class, most common
      answer, most common target) and, optionally, {task/target_nll: a constant distribution's
      mean loss} (the training labels' frequencies).
    degenerate: {row: tasks where some seed's model was degenerate}; those cells are marked †.
    resamples: bootstrap draws.
  """
  table = summarise(results, comparison)
  boot = resample(results, comparison, resamples)
  rows = list(table)
  seeds = sorted({r["seed"] for r in results})
  valid, floor_lines, failing, checked, above_constant = floor_check(table, comparison,
                                                                     constants)
  if comparison.floor_rows is None:
    subject = ("every pre-trained row is", "some pre-trained row is")
  else:
    must = "the rows the scale must separate from the floor; the others may fall to it"
    subject = (f"{', '.join(checked)} ({must}) {'is' if len(checked) == 1 else 'are'}",
               f"{', '.join(failing) or 'none ran'} (of {', '.join(comparison.floor_rows)}: "
               f"{must}) {'is' if len(failing) == 1 else 'are'}")
  lines = [f"# {comparison.title}", "", setup, "",
           f"Rows × seeds: {len(results)} runs, seeds {seeds}. Cells: mean ± 95% t-interval "
           "over seeds, conditional on the evaluation examples (scores ×100; log-lik: the gold "
           "targets' log-likelihood under teacher forcing, nats per target token averaged over "
           "examples, i.e. −loss; a class label is one token); every column higher-is-better; "
           f"bootstrap intervals: {resamples:,} paired resamples of the evaluation examples, "
           "each row with its own seed error added, drawn independently (`experiments/stats.py`:"
           " wider than the t-intervals, which hold the examples fixed; a difference's interval "
           "is conservative, covering about 98-99.5% at 5 to 2 seeds by simulation).", "",
           "## The floor", "",
           _verdict(valid, subject, comparison.primary.label, failing, checked, above_constant),
           "",
           *floor_lines,
           "- Constant output (the most common training target, on the same examples; for a "
           "log-likelihood, the training targets' frequencies where given): " +
           "; ".join(f"{c.label} {constant_output(constants, c):.{c.digits}f}"
                     for c in comparison.columns if constant_output(constants, c) is not None)
           + ".", ""]
  lines += _results_table(results, table, comparison, degenerate)
  lines += _differences_table(boot, table, comparison, rows)
  lines += _ranks_table(boot, table, comparison, rows)
  lines += _agreement_lines(boot, table, comparison, rows)
  lines += _tracking_lines(results, comparison, rows)
  lines += _seen_table(results, comparison, rows)
  return "\n".join(lines) + "\n"


def _verdict(valid: bool, subject: tuple[str, str], primary: str, failing: list[str],
             checked: list[str], above_constant: bool | None) -> str:
  """The floor check's sentence (`floor_check`); `subject`: the rows that must clear the floor,
  as the valid and the failing sentence name them."""
  if valid:
    constant = ("above the constant output." if above_constant else
                "against the constant output: not checked (no constant for this column).")
    return (f"**Valid:** {subject[0]} above the floor on the primary metric ({primary}) with "
            f"non-overlapping 95% intervals, and the floor {constant}")
  if checked and not failing and above_constant is False:
    return (f"**Not valid at this scale:** the floor's interval is not above the constant output "
            f"on the primary metric ({primary}): the scale does not learn the task.")
  return (f"**Not valid at this scale:** {subject[1]} not above the floor on the primary metric "
          f"({primary}) with non-overlapping 95% intervals; the rankings below rank noise where "
          "they rank those rows.")


def _results_table(results, table, comparison: Comparison, degenerate) -> list[str]:
  header = ([comparison.row_label] + [c.label for c in comparison.columns] + ["pre-train acc"]
            + [f"paper {c}" for c in comparison.paper_columns])
  lines = ["## Results", "", f"Paper: {comparison.paper_source}.", "",
           "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for title, group in comparison.groups:
    names = [n for n in group if n in table]
    if not names:
      continue
    lines.append(f"| **{title}** |" + " |" * (len(header) - 1))
    for name in names:
      cells = [_interval(c, table[name]) + (
          "†" if c.task in degenerate.get(name, ()) and not c.loglik else "")
               for c in comparison.columns]
      accuracy = [a for a in map(pretrain_accuracy, runs(results, name)) if a is not None]
      cells.append(f"{100 * np.mean(accuracy):.1f}" if accuracy else "—")
      paper = comparison.paper.get(name, {})
      cells += [f"{paper[c]:.2f}" if c in paper else "—" for c in comparison.paper_columns]
      marks = "".join(mark for flag, mark in (("collapse", "‡"), ("nonfinite", "§"))
                      if flag in degenerate.get(name, ()))
      lines.append(f"| {name}{marks} | " + " | ".join(cells) + " |")
  lines += ["", "† degenerate: in some seed the fine-tuned model emitted at most a few distinct "
                "predictions on the evaluation examples (a constant output), not a result. "
                "‡ collapsed: in some seed the pre-trained encoder's token vectors have a mean "
                "cosine near 1. § a non-finite pre-training loss in some seed.",
            "pre-train acc: the held-out accuracy on the row's own pre-training targets (rows "
            "differ in what they predict: comparable within a row's curve, not across rows).",
            ""]
  return lines


def _differences_table(boot, table, comparison: Comparison, rows) -> list[str]:
  """Each row's mean minus the baseline's (the rows' own means: the mean of the resamples is not
  an estimate, since with 2 seeds their Student-t draws have no mean), with the paired
  bootstrap interval of the difference."""
  base = comparison.baseline
  if base not in rows:
    return []
  header = [comparison.row_label] + [f"Δ {c.label}" for c in comparison.columns]
  lines = [f"## Differences against {base}", "",
           f"Row − {base}: the mean difference [95% bootstrap interval, the evaluation examples "
           "paired, each row's seed error independent: conservative].",
           "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for name in rows:
    if name == base:
      continue
    cells = []
    for c in comparison.columns:
      difference = boot[c.key][name] - boot[c.key][base]
      point = table[name][c.key][0] - table[base][c.key][0]
      cells.append(f"{point:+.{c.digits}f} {_bootstrap_interval(difference, c.digits)}")
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  return lines + [""]


def _ranks_table(boot, table, comparison: Comparison, rows) -> list[str]:
  primary = comparison.primary
  paper_column = primary.paper
  quoted = [n for n in rows if paper_column in comparison.paper.get(n, {})]
  if len(quoted) < 2:
    return []
  samples = np.stack([boot[primary.key][name] for name in quoted], axis=1)    # [R, rows]
  sampled_ranks = np.stack([stats.ranks(s) for s in samples])
  ours = stats.ranks([table[name][primary.key][0] for name in quoted])
  theirs = stats.ranks([comparison.paper[n][paper_column] for n in quoted])
  lines = [f"## Ranks on {primary.label} (1 = best, among the rows run that the paper has)",
           "", f"| {comparison.row_label} | ours | our rank [95% bootstrap] | paper {paper_column} | "
           "paper rank |", "|---|---|---|---|---|"]
  for i, name in enumerate(quoted):
    low, high = stats.percentile_interval(sampled_ranks[:, i], method="nearest")
    lines.append(f"| {name} | {_interval(primary, table[name])} | {ours[i]:g} [{low:g}, "
                 f"{high:g}] | {comparison.paper[name][paper_column]:.2f} | {theirs[i]:g} |")
  return lines + [""]


def _agreement_lines(boot, table, comparison: Comparison, rows) -> list[str]:
  """Kendall τ and Spearman ρ of our means against the paper's matched column, per block of
  ≥ 3 rows run and over all pre-trained rows run (the floor, last by far in the paper, would
  inflate them), with bootstrap intervals."""
  if not any(c.paper for c in comparison.columns):
    return []   # no paper column to agree with
  blocks = [(title, [n for n in group if n in rows]) for title, group in comparison.groups]
  blocks = [(t, g) for t, g in blocks if len(g) >= 3] + [
      ("All pre-trained rows run", [n for n in rows if n != comparison.floor])]
  lines = ["## Rank agreement with the paper", "",
           "Kendall τ-b and Spearman ρ between our means and the paper's matched column "
           "[95% bootstrap interval; NaN where a resample ties every row].", ""]
  for title, names in blocks:
    parts = []
    for c in comparison.columns:
      if c.paper is None:
        continue
      quoted = [n for n in names if c.paper in comparison.paper.get(n, {})]
      if len(quoted) < 3:
        continue
      paper = [comparison.paper[n][c.paper] for n in quoted]
      samples = np.stack([boot[c.key][n] for n in quoted], axis=1)
      ours = [table[n][c.key][0] for n in quoted]
      tau, rho = stats.kendall_tau(ours, paper), stats.spearman_rho(ours, paper)
      parts.append(f"{c.label} vs {c.paper} ({len(quoted)} rows): τ = {tau:+.2f} "
                   f"{_bootstrap_interval(stats.kendall_tau_rows(samples, paper), 2)}, "
                   f"ρ = {rho:+.2f} "
                   f"{_bootstrap_interval(stats.spearman_rho_rows(samples, paper), 2)}")
    if parts:
      lines.append(f"- {title}: " + "; ".join(parts))
  return lines + [""]


def _tracking_lines(results, comparison: Comparison, rows) -> list[str]:
  """Within each pre-trained row, Spearman ρ over seeds between the primary metric and the
  held-out accuracy on the row's own pre-training targets (comparable within a row only), the
  mean over rows and its within-row permutation p-value (`stats.within_group_spearman`)."""
  primary = comparison.primary
  groups = {}
  for name in rows:
    pairs = [(accuracy, primary.shown(seed_value(r, primary))) for r in runs(results, name)
             if (accuracy := pretrain_accuracy(r)) is not None]
    if name != comparison.floor and len(pairs) >= 3:
      groups[name] = tuple(zip(*pairs))
  rho, p_value, per_row = stats.within_group_spearman(groups)
  if not per_row:
    return []
  return [f"## Does {primary.label} track pre-training?", "",
          f"Within each pre-trained row, Spearman ρ over its seeds between {primary.label} and "
          "the held-out accuracy on the row's own pre-training targets; the mean over "
          f"{len(per_row)} rows is ρ = {rho:+.2f}, one-sided permutation p = {p_value:.3f} "
          f"(seeds shuffled within rows, {stats.RESAMPLES:,} draws). Per row: " +
          ", ".join(f"{name} {value:+.2f}" for name, value in per_row.items()) + ". Near 0 or "
          "below, either the spread between a row's seeds does not come from how far each seed's "
          "pre-training got, or the held-out accuracy does not measure that (a detector near "
          "its base rate, for one).", ""]


_SEEN = (("pretrain_steps", "pre-train steps", "{:,.0f}"),
         ("input_tokens", "input tokens", "{:,.0f}"), ("target_tokens", "target tokens",
                                                      "{:,.0f}"),
         ("train_flops", "train FLOPs", "{:.3g}"),
         ("targets_length", "targets length", "{:.0f}"),
         ("targets_cut_share", "targets cut", "{:.2%}"),
         ("pretrain_seconds", "pre-train s", "{:.0f}"), ("total_seconds", "total s", "{:.0f}"))


def _seen_table(results, comparison: Comparison, rows) -> list[str]:
  """Per row, the mean over seeds of what it saw and took (fair rows: EXPERIMENTS.md §4); the
  quantities that no record has are left out."""
  shown = [item for item in _SEEN if any(r.get(item[0]) is not None for r in results)]
  header = [comparison.row_label] + [label for _, label, _ in shown]
  lines = ["## What each row saw (mean over seeds)", "",
           "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for name in rows:
    cells = []
    for key, _, form in shown:
      values = [r[key] for r in runs(results, name) if r.get(key) is not None]
      cells.append(form.format(np.mean(values)) if values else "—")
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  return lines + [""]


# ------------------------------------------------------------------------------------- files


def write(results: Sequence[dict], comparison: Comparison, out: str, *, setup: str,
          constants: Mapping[str, float], scale: Mapping, **meta) -> str:
  """OUT/table.md (`markdown`, with each row's degenerate flags gathered from its records),
  OUT/meta.json (the primary metric, the evaluation examples per column's task, the constant
  outputs, seeds, commits, `scale` and any further `meta`), OUT/plot.png and, where the records
  carry pre-training curves, OUT/curves.png; returns the markdown."""
  degenerate = {}
  for r in results:
    degenerate.setdefault(r["row"], set()).update(r.get("degenerate", ()))
  markdown_text = markdown(results, comparison, setup=setup, constants=constants,
                           degenerate=degenerate)
  with open(os.path.join(out, "table.md"), "w") as fh:
    fh.write(markdown_text)
  primary = comparison.primary
  record = dict(primary_metric=f"{'−' if primary.loglik else ''}{primary.key} ({primary.label})",
                higher_is_better=True, paper_column=primary.paper,
                evaluation_examples={c.task: len(results[0]["examples"][c.task][c.metric])
                                     for c in comparison.columns},
                constant_output=dict(constants), seeds=sorted({r["seed"] for r in results}),
                commits=sorted({r.get("commit", "?") for r in results}), scale=dict(scale),
                **meta)
  with open(os.path.join(out, "meta.json"), "w") as fh:
    json.dump(record, fh, indent=1, ensure_ascii=False)
  plot(results, comparison, constants, os.path.join(out, "plot.png"))
  if any(pretraining_curve(r) for r in results):
    curves(results, comparison, os.path.join(out, "curves.png"))
  return markdown_text


# --------------------------------------------------------------------------------------- plots


def plot(results: Sequence[dict], comparison: Comparison, constants: Mapping[str, float],
         path: str) -> None:
  """plot.png: per column, our mean and 95% interval per row on an axis that reaches the
  column's zero (0 for scores, the perfect 0 nats for log-likelihoods), with the floor's mean
  and the constant output as vertical lines; below, the paper's columns that ours stand in
  for, each on its own axis from 0 (no second row when there are none). No twin or truncated
  axes."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  table = summarise(results, comparison)
  names = list(table)
  columns = list(comparison.columns)
  with_paper = bool(comparison.paper) and any(c.paper is not None and not c.loglik
                                              for c in columns)
  fig, axes = plt.subplots(1 + with_paper, len(columns),
                           figsize=(4.2 * len(columns), (2 + 0.8 * len(names)) / (2 - with_paper)),
                           squeeze=False)
  y = np.arange(len(names))
  for ax, paper_ax, c in zip(axes[0], axes[-1] if with_paper else [None] * len(columns),
                             columns):
    means = np.array([table[n][c.key][0] for n in names])
    halves = np.array([np.nan_to_num(table[n][c.key][1]) for n in names])
    ax.errorbar(means, y, xerr=halves, fmt="o", capsize=3, color="tab:blue")
    if comparison.floor in table:
      ax.axvline(table[comparison.floor][c.key][0], color="tab:red", lw=1, label="floor")
    constant = constant_output(constants, c)
    if constant is not None:
      ax.axvline(constant, color="black", lw=1, ls="--", label="constant output")
    if c.loglik:
      ax.set_xlim(min(np.nanmin(means - halves), constant or 0) * 1.1, 0)
      ax.set_xlabel(f"ours: {c.label} (nats/token)")
    else:
      ax.set_xlim(0, max(np.nanmax(means + halves), constant or 0) * 1.15 or 1)
      ax.set_xlabel(f"ours: {c.label} (×100)")
    ax.set_yticks(y, names if c is columns[0] else [""] * len(names))
    ax.invert_yaxis()
    if ax.get_legend_handles_labels()[0]:
      ax.legend(loc="best", fontsize=7)
    if paper_ax is None:
      continue
    if c.paper is None or c.loglik:
      paper_ax.set_axis_off()
      continue
    paper = [comparison.paper.get(n, {}).get(c.paper, np.nan) for n in names]
    paper_ax.barh(y, np.nan_to_num(paper), color="tab:gray")
    paper_ax.set_xlim(0, 100)
    paper_ax.set_xlabel(f"paper: {c.paper}")
    paper_ax.set_yticks(y, names if c is columns[0] else [""] * len(names))
    paper_ax.invert_yaxis()
  fig.suptitle(f"{comparison.title}: ours (mean ± 95% interval over seeds)"
               + (" and the paper's" if with_paper else ""))
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)


def pretraining_curve(record: dict) -> dict | None:
  """The record's pre-training curve {steps, loss, eval_steps, eval_accuracy}, or None (none
  recorded, or no step in it)."""
  curve = (record.get("pretrain") or {}).get("curve")
  return curve if curve and curve["steps"] else None


def curves(results: Sequence[dict], comparison: Comparison, path: str) -> None:
  """curves.png: pre-training loss and held-out accuracy (on the row's own targets) against
  input tokens seen, one colour per row, one line per seed."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, (loss_ax, accuracy_ax) = plt.subplots(1, 2, figsize=(13, 5))
  colours = plt.get_cmap("tab20")
  for i, name in enumerate(rows_run(results, comparison)):
    for j, record in enumerate(runs(results, name)):
      curve = pretraining_curve(record)
      if curve is None:
        continue
      per_step = record["input_tokens"] / max(curve["steps"][-1], 1)
      label = name if j == 0 else None
      loss_ax.plot(np.array(curve["steps"]) * per_step, curve["loss"], color=colours(i),
                   lw=1, label=label)
      accuracy_ax.plot(np.array(curve["eval_steps"]) * per_step, curve["eval_accuracy"],
                       color=colours(i), lw=1, marker="o", ms=3, label=label)
  loss_ax.set(xlabel="input tokens seen", ylabel="training loss", ylim=(0, None))
  accuracy_ax.set(xlabel="input tokens seen", ylabel="held-out accuracy (own targets)",
                  ylim=(0, 1))
  if accuracy_ax.get_legend_handles_labels()[0]:
    accuracy_ax.legend(fontsize=7)
  fig.suptitle(f"{comparison.title}: pre-training")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
