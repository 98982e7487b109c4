"""Machinery shared by the pre-train → fine-tune experiments (masking_schemes, electra_ablation).

An experiment is a list of rows (name, spec), a dict of scales and a `run_row(name, spec, seed)`
that returns one result dict; this module provides the rest:

  supersense_task(scale)            the offline downstream task at the scale's size
  pretrain_and_score(...)           pre-train a config in a workdir (or not: the floor), then
                                    fine-tune and probe its encoder on the task
  run_sweep(...)                    seeds × rows, appending to results.jsonl, skipping finished rows
  define_sweep_flags / sweep_dirs   the flags every experiment takes and the directories they name
  summarise / mean_std / plot       mean ± sample std over seeds, table cells and the bar chart

A scale is a dict with at least finetune_train / finetune_eval (examples kept per split, None for
all), finetune_seq_len, finetune_epochs and finetune_lr.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Callable, Sequence

from absl import app, flags
import flax.linen as nn
import jax
import numpy as np

from bertfam_jax import config_lib
from bertfam_jax import workdir as workdir_lib
from bertfam_jax.data import sources, tokenizers, wordnet
from bertfam_jax.finetune import features, probe
from bertfam_jax.finetune import run as finetune_run
from bertfam_jax.models import encoder as encoder_lib
from bertfam_jax.train import train

NO_PRETRAINING = "No pre-training"
# Reported scores: fine-tuned, and a linear probe on frozen mean-pooled features.
SCORES = ("accuracy", "macro_f1", "mcc", "probe_accuracy", "probe_macro_f1")


# ------------------------------------------------------------------------------- downstream task


def head(examples: wordnet.Examples, limit: int | None) -> wordnet.Examples:
  """The first `limit` examples (the split is already in a fixed hash order)."""
  if limit is None:
    return examples
  return wordnet.Examples(examples.texts[:limit], examples.labels[:limit])


def supersense_task(scale: dict) -> wordnet.ClassificationTask:
  """WordNet gloss → supersense (45 classes), train / validation cut to the scale's size."""
  task = wordnet.supersense_task(max_examples=None)
  return task._replace(train=head(task.train, scale["finetune_train"]),
                       validation=head(task.validation, scale["finetune_eval"]))


def workdir_name(name: str, seed: int) -> str:
  """A row's pre-training workdir name: 'Whole Words', 1 → 'whole_words-seed1'."""
  return f"{name.lower().replace(' ', '_').replace('%', 'pct')}-seed{seed}"


def finetune_config(scale: dict, seed: int):
  """BERT's classifier recipe (run_classifier.py: batch 32, 10% warmup, AdamW with weight decay
  0.01) on the supersense task at the scale's size, length, epochs and rate."""
  config = config_lib.finetune_config()
  config.seed = seed
  config.finetune.update(
      task=SUPERSENSE, max_train_examples=scale["finetune_train"] or 0,
      max_eval_examples=scale["finetune_eval"] or 0, max_seq_len=scale["finetune_seq_len"],
      epochs=float(scale["finetune_epochs"]))
  config.optimizer.peak_lr = scale["finetune_lr"]
  config.train.update(log_every=10_000)
  return config


SUPERSENSE = "wordnet_supersense"


def random_encoder(model_config, seq_len: int, seed: int):
  """The 'encoder' parameters of a fresh initialisation from `seed`: what the floor fine-tunes
  and probes."""
  ids = np.zeros((1, seq_len), np.int32)
  return jax.jit(lambda: nn.meta.unbox(encoder_lib.Encoder(model_config).init(
      jax.random.key(seed), ids, np.ones_like(ids), ids, deterministic=True)))()["params"]


def downstream_scores(init_config, params, tokenizer, task: wordnet.ClassificationTask,
                      scale: dict, seed: int) -> dict:
  """Fine-tunes (`finetune.run.fine_tune`: the one train loop, BERT's classifier recipe) and
  linearly probes an encoder on `task`.

  Args:
    init_config: the pre-trained run's config (its model, tokenizer and objective sections).
    params: its parameters ({'encoder', heads...}), or None for a random initialisation (the
      floor).
    tokenizer: the tokenizer it was pre-trained with.
    task: the classification task (texts and labels [examples] per split), cut to the scale's
      size as `finetune_config` cuts the fine-tuning task.
    scale: the experiment's scale (fine-tuning length, rate, sequence length).
    seed: fine-tuning initialisation, dropout and data order; the floor's probed encoder.

  Returns:
    SCORES (fractions in [0, 1], validation split) and finetune_steps.
  """
  config = finetune_run.resolved_config(finetune_config(scale, seed), init_config)
  config.finetune.from_scratch = params is None
  result = finetune_run.fine_tune(config, tokenizer, params)
  encode = lambda examples: {**features.encode_pairs(tokenizer, examples.texts,  # noqa: E731
                                                     scale["finetune_seq_len"]),
                             "label": examples.labels}
  encoder_params = (random_encoder(init_config.model, scale["finetune_seq_len"], seed)
                    if params is None else params["encoder"])
  probed = probe.linear_probe(init_config.model, encoder_params, encode(task.train),
                              encode(task.validation), num_classes=len(task.label_names))
  scores = result["scores"]
  return dict(accuracy=scores["accuracy"], macro_f1=scores["macro_f1"], mcc=scores["mcc"],
              probe_accuracy=probed["accuracy"], probe_macro_f1=probed["macro_f1"],
              finetune_steps=result["step"])


def pretrain_and_score(name: str, config, seed: int, scale: dict, workdir: str | None,
                       task: wordnet.ClassificationTask) -> dict:
  """Pre-trains `config` in `workdir` (resuming a checkpoint there), then fine-tunes and probes
  the checkpoint's encoder on `task`. With `workdir` None nothing is pre-trained: the encoder of
  `config.model` starts from a random initialisation, with the tokenizer `config` would train.

  Returns:
    row, seed, SCORES, finetune_steps, pretrain_seconds (setup, compile and training),
    total_seconds.
  """
  start = time.time()
  if workdir is not None:
    train.run(config, workdir)
    config, tokenizer, params = workdir_lib.load(workdir)
  else:  # the floor uses the same tokenizer as the pre-trained rows
    params = None
    tokenizer = tokenizers.load_or_train(config, sources.get_documents(config.data, "train"))
  pretrain_seconds = time.time() - start
  scores = downstream_scores(config, params, tokenizer, task, scale, seed)
  return dict(row=name, seed=seed, **scores, pretrain_seconds=round(pretrain_seconds, 1),
              total_seconds=round(time.time() - start, 1))


# ------------------------------------------------------------------------------ command line


def define_sweep_flags(experiment: str, rows: Sequence[tuple], scales: dict) -> None:
  """The flags every experiment takes (an experiment defines them only when run as a script, so
  that importing it beside another experiment defines no flag twice): --scale (default: the
  first of `scales`), --rows, --seeds, --out, --workdirs, --config_overrides and
  --compilation_cache."""
  flags.DEFINE_enum("scale", next(iter(scales)), list(scales), "Sweep size.")
  flags.DEFINE_list("rows", [name for name, _ in rows], "Rows to run (paper names).")
  flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds: pre-training and fine-tuning (at least 3 "
                    "for the intervals of EXPERIMENTS.md).")
  flags.DEFINE_string("out", "", f"Results directory (default experiments/results/{experiment}/"
                      "<scale>).")
  flags.DEFINE_string("workdirs", "", "Pre-training workdirs (default <out>/runs; not committed).")
  flags.DEFINE_list("config_overrides", [], "Extra config settings for every row, key=value with "
                    "dotted keys (e.g. data.tfds_data_dir=/data).")
  flags.DEFINE_string("compilation_cache", "", "JAX's persistent compilation cache (default "
                      "<workdirs>/jax_cache): rows of one shape compile once.")


def sweep_dirs(experiment: str) -> tuple[str, str]:
  """(results directory, workdirs directory) from the parsed sweep flags; creates the first and
  points JAX's persistent compilation cache at --compilation_cache (default <workdirs>/jax_cache)."""
  f = flags.FLAGS
  out = f.out or os.path.join("experiments", "results", experiment, f.scale)
  workdirs = f.workdirs or os.path.join(out, "runs")
  os.makedirs(out, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir",
                    f.compilation_cache or os.path.join(workdirs, "jax_cache"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
  return out, workdirs


# -------------------------------------------------------------------------------- results, sweep


def check_rows(selected: Sequence[str], rows: Sequence[tuple],
               make_config: Callable[[object], object]) -> None:
  """Raises app.UsageError for a --rows name that is not a row, or a selected row whose
  `make_config(spec)` raises ConfigError (a bad --config_overrides), before hours of other rows
  run. Specs that are None (the no-pre-training floor) build no config."""
  unknown = set(selected) - {name for name, _ in rows}
  if unknown:
    raise app.UsageError(f"Unknown rows {sorted(unknown)}; choose from {[n for n, _ in rows]}.")
  for name, spec in rows:
    if name in selected and spec is not None:
      try:
        make_config(spec)
      except config_lib.ConfigError as e:
        raise app.UsageError(f"row {name!r}: {e}") from None


def read_results(path: str) -> list[dict]:
  """The results.jsonl records at `path` ([] when there is no file)."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f]


def run_sweep(rows: Sequence[tuple], selected: Sequence[str], seeds: Sequence[int],
              results_path: str, run_row: Callable[[str, object, int], dict]) -> list[dict]:
  """Runs `run_row(name, spec, seed)` for the selected rows and seeds not yet in results_path,
  appending each result there as it finishes; returns every result (old and new).

  Seeds are outermost: an interrupted sweep still has every row for the seeds it finished.
  """
  results = read_results(results_path)
  done = {(r["row"], r["seed"]) for r in results}
  for seed in seeds:
    for name, spec in rows:
      if name not in selected or (name, seed) in done:
        continue
      result = run_row(name, spec, seed)
      print(json.dumps({k: v for k, v in result.items() if k != "examples"}), flush=True)
      results.append(result)
      with open(results_path, "a") as f:
        f.write(json.dumps(result) + "\n")
  return results


def commit() -> str:
  """The checkout's commit ('<sha>-dirty' with uncommitted changes to tracked files; 'unknown'
  outside git): what a results record says it was measured at."""
  def git(*args):
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True,
                          timeout=30).stdout.strip()
  try:
    sha = git("rev-parse", "HEAD")
    return sha + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
  except (OSError, subprocess.SubprocessError):
    return "unknown"


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------------ pre-training logs


def final_eval_metrics(workdir: str) -> dict[str, float]:
  """The last held-out evaluation in WORKDIR/metrics.jsonl, without the 'eval_' prefix."""
  last = {}
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      record = json.loads(line)
      if any(k.startswith("eval_") for k in record):
        last = {k[len("eval_"):]: v for k, v in record.items() if k.startswith("eval_")}
  return last


def median_throughput(workdir: str) -> float | None:
  """The median of the training tokens/s logged in WORKDIR/metrics.jsonl (compile excluded)."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    values = [r["tokens_per_sec"] for r in map(json.loads, f) if r.get("tokens_per_sec")]
  return float(np.median(values)) if values else None


# ------------------------------------------------------------------------------ summary and plot


def summarise(results: list[dict], row_names: Sequence[str],
              scores: Sequence[str] = SCORES) -> list[dict]:
  """Per row in `row_names` order (rows without results left out): row, seeds, and for each
  score (mean, sample standard deviation) over seeds, ×100; the deviation is NaN for one seed."""
  table = []
  for name in row_names:
    runs = [r for r in results if r["row"] == name]
    if not runs:
      continue
    row = dict(row=name, seeds=len(runs))
    for key in scores:
      values = np.array([r[key] for r in runs]) * 100
      row[key] = (values.mean(), values.std(ddof=1) if len(values) > 1 else float("nan"))
    table.append(row)
  return table


def mean_std(value: tuple[float, float]) -> str:
  """A table cell: '20.1 ± 3.6'."""
  return f"{value[0]:.1f} ± {value[1]:.1f}"


def plot(table: list[dict], path: str, title: str,
         paper: tuple[str, dict[str, float]] | None = None) -> None:
  """Bars of fine-tuned and probe accuracy per row (mean, error bars one std over seeds). With
  `paper` = (label, {row: score}), a side panel shows those scores for the rows that have one
  (none when no row has one, e.g. a one-row job of the floor)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  names = [row["row"] for row in table]
  quoted = [name for name in names if paper is not None and name in paper[1]]
  if not quoted:
    fig, ax = plt.subplots(figsize=(8, 4))
  else:
    fig, (ax, side) = plt.subplots(1, 2, figsize=(12, 4.5), width_ratios=(3, 2))
  x = np.arange(len(names))
  for offset, key in ((-0.2, "accuracy"), (0.2, "probe_accuracy")):
    ax.bar(x + offset, [row[key][0] for row in table], 0.4,
           yerr=[np.nan_to_num(row[key][1]) for row in table], capsize=3,
           label=key.replace("_", " ").replace("accuracy", "accuracy (fine-tuned)"
                                               if key == "accuracy" else "accuracy"))
  ax.set_xticks(x, names, rotation=20, ha="right")
  ax.set_ylabel("supersense validation (×100)")
  ax.set_title(title)
  ax.legend()
  if quoted:
    label, scores = paper
    values = [scores[name] for name in quoted]
    side.bar(np.arange(len(quoted)), values, 0.6, color="tab:gray")
    for i, value in enumerate(values):
      side.annotate(f"{value:.1f}", (i, value), ha="center", va="bottom", fontsize=8)
    side.set_xticks(np.arange(len(quoted)), quoted, rotation=20, ha="right")
    side.set_ylim(min(values) - 2, max(values) + 1)
    side.set_ylabel(label)
    side.set_title("paper")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
