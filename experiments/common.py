"""Machinery shared by the encoder pre-train → fine-tune experiments (masking_schemes,
electra_ablation), in the protocol of EXPERIMENTS.md and the report of `experiments/report.py`.

An experiment is a list of rows (name, spec), a dict of scales and a `run_row(name, spec, seed)`
that returns one results.jsonl record; this module provides the rest:

  supersense_task(scale)            the offline downstream task at the scale's size
  pretrain_and_score(...)           pre-train a config in a workdir (or not: the floor), then
                                    fine-tune and probe its encoder on the task: scores and
                                    per-example correctness and gold-label loss, token cosine,
                                    degenerate flags, the pre-training curve
  run_sweep(...)                    seeds × rows, appending to results.jsonl, skipping finished rows
  define_sweep_flags / sweep_dirs   the flags every experiment takes and the directories they name
  columns / write_report            the report's columns and its files (table.md, meta.json,
                                    plot.png, curves.png)

A scale is a dict with at least finetune_train / finetune_eval (examples kept per split, None for
all), finetune_seq_len, finetune_epochs and finetune_lr.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import platform
import subprocess
import time
from typing import Callable, Sequence

from absl import app, flags
import flax.linen as nn
import jax
import jaxlib.version as jaxlib_version
import numpy as np

from bertfam_jax import config_lib
from bertfam_jax import workdir as workdir_lib
from bertfam_jax.data import sources, tokenizers, wordnet
from bertfam_jax.finetune import features, probe
from bertfam_jax.finetune import run as finetune_run
from bertfam_jax.models import encoder as encoder_lib
from bertfam_jax.train import metrics as metrics_lib
from bertfam_jax.train import train
from experiments import report

NO_PRETRAINING = "No pre-training"


# ------------------------------------------------------------------------------- downstream task


SUPERSENSE = "wordnet_supersense"
PROBE = "probe"       # the linear probe on frozen features, scored on the supersense examples
# A model with at most this many distinct predictions on the evaluation examples emits a
# constant, not an answer; an encoder whose token vectors have at least this mean cosine has
# collapsed (EXPERIMENTS.md §2).
DEGENERATE = 3
COLLAPSED_COSINE = 0.95


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
  0.01, no layer-wise decay) on the supersense task at the scale's size, length, epochs and rate,
  for every row: an ELECTRA checkpoint's own recipe (layer-wise decay 0.8) is not applied, so
  that rows differ in their encoder only."""
  config = config_lib.finetune_config()
  config.seed = seed
  config.finetune.update(
      task=SUPERSENSE, max_train_examples=scale["finetune_train"] or 0,
      max_eval_examples=scale["finetune_eval"] or 0, max_seq_len=scale["finetune_seq_len"],
      epochs=float(scale["finetune_epochs"]), layer_decay=1.0)
  config.optimizer.peak_lr = scale["finetune_lr"]
  config.train.update(log_every=10_000)
  return config


def apply_pinned(config, scale: dict) -> None:
  """Sets the scale's `pinned` fields ({'section.field': value}): what a scale's committed
  records ran with, where the paper config has since taken the reference's value."""
  for key, value in scale.get("pinned", {}).items():
    section, field = key.split(".")
    config[section][field] = value


def pinned_text(scale: dict, config_file: str) -> str:
  """The setup line's sentence naming the scale's pinned fields ('' when none)."""
  pinned = scale.get("pinned", {})
  if not pinned:
    return ""
  return (f" Pinned to what the records ran with ({config_file} now sets the reference's): "
          + ", ".join(f"{key}={value}" for key, value in pinned.items()) + ".")


def random_encoder(model_config, seq_len: int, seed: int):
  """The 'encoder' parameters of a fresh initialisation from `seed`: what the floor fine-tunes
  and probes."""
  ids = np.zeros((1, seq_len), np.int32)
  return jax.jit(lambda: nn.meta.unbox(encoder_lib.Encoder(model_config).init(
      jax.random.key(seed), ids, np.ones_like(ids), ids, deterministic=True)))()["params"]


def token_cosine(model_config, encoder_params, tokenizer, texts: Sequence[str], seq_len: int, *,
                 examples: int = 256, pairs: int = 2000) -> float:
  """Mean cosine similarity between the encoder's last-layer vectors of random pairs of distinct
  real tokens of the first `examples` texts: ≈ 0.35-0.4 at random initialisation on glosses of
  32 tokens, 1.0 when every token maps to one vector (a collapsed encoder: nothing left to
  fine-tune from)."""
  data = features.encode_pairs(tokenizer, list(texts[:examples]), seq_len)
  x_NLD = jax.jit(lambda ids, mask, segments: encoder_lib.Encoder(model_config).apply(
      {"params": encoder_params}, ids, mask, segments, deterministic=True))(
          data["input_ids"], data["input_mask"], data["segment_ids"])
  x_TD = np.asarray(x_NLD, np.float64)[data["input_mask"] > 0]
  rng = np.random.default_rng(0)
  first = rng.integers(0, len(x_TD), pairs)
  second = (first + rng.integers(1, len(x_TD), pairs)) % len(x_TD)  # never the same token
  a_PD, b_PD = x_TD[first], x_TD[second]
  return float(np.mean(np.sum(a_PD * b_PD, 1) /
                       (np.linalg.norm(a_PD, axis=1) * np.linalg.norm(b_PD, axis=1) + 1e-12)))


def downstream_scores(init_config, params, tokenizer, task: wordnet.ClassificationTask,
                      scale: dict, seed: int) -> tuple[dict, dict]:
  """Fine-tunes (`finetune.run.fine_tune`: the one train loop, BERT's classifier recipe) and
  linearly probes an encoder on `task`, and measures its token cosine.

  Args:
    init_config: the pre-trained run's config (its model, tokenizer and objective sections).
    params: its parameters ({'encoder', heads...}), or None for a random initialisation (the
      floor).
    tokenizer: the tokenizer it was pre-trained with.
    task: the classification task (texts and labels [examples] per split), cut to the scale's
      size as `finetune_config` cuts the fine-tuning task.
    scale: the experiment's scale (fine-tuning length, rate, sequence length).
    seed: fine-tuning initialisation, dropout and data order; the floor's encoder.

  Returns:
    metrics: {SUPERSENSE/ and PROBE/ + accuracy, macro_f1, target_loss (the gold label's mean
      negative log-probability, nats), distinct (distinct predictions); finetune_steps;
      token_cosine};
    examples: {SUPERSENSE, PROBE: {accuracy: [examples] 0/1, target_nll: [examples] nats}} on
      the validation examples, the same for every row: what the paired bootstrap resamples.
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
  tuned = result["predictions"]
  labels = np.asarray(task.validation.labels)
  if [p["label"] for p in tuned] != labels.tolist():
    raise ValueError("The fine-tuning run scored other validation examples than the probe's "
                     f"{len(labels)}: check finetune.max_eval_examples and the task's split.")
  per_task = {
      SUPERSENSE: (np.array([p["prediction"] for p in tuned]),
                   np.array([p["gold_nll"] for p in tuned]), result["scores"]["macro_f1"]),
      PROBE: (probed["predictions"], probed["gold_nll"], probed["macro_f1"])}
  metrics, examples = {}, {}
  for name, (predictions, nll, macro_f1) in per_task.items():
    correct = (predictions == labels).astype(float)
    metrics.update({f"{name}/accuracy": float(correct.mean()), f"{name}/macro_f1": macro_f1,
                    f"{name}/target_loss": float(nll.mean()),
                    f"{name}/distinct": len(set(predictions.tolist()))})
    examples[name] = {"accuracy": correct.astype(int).tolist(),
                      "target_nll": [round(float(x), 4) for x in nll]}
  metrics["finetune_steps"] = result["step"]
  metrics["token_cosine"] = token_cosine(init_config.model, encoder_params, tokenizer,
                                         task.validation.texts, scale["finetune_seq_len"])
  return metrics, examples


def degenerate_flags(metrics: dict, pretrain_loss: float | None) -> list[str]:
  """What makes a run not a result (EXPERIMENTS.md §2): a task whose predictions take at most
  DEGENERATE values, 'collapse' (mean token cosine ≥ COLLAPSED_COSINE), 'nonfinite' (a
  non-finite pre-training loss)."""
  flags_ = [task for task in (SUPERSENSE, PROBE) if metrics[f"{task}/distinct"] <= DEGENERATE]
  if metrics["token_cosine"] >= COLLAPSED_COSINE:
    flags_.append("collapse")
  if pretrain_loss is not None and not np.isfinite(pretrain_loss):
    flags_.append("nonfinite")
  return flags_


def pretrain_and_score(name: str, config, seed: int, scale: dict, workdir: str | None,
                       task: wordnet.ClassificationTask, eval_keys: Sequence[str]) -> dict:
  """Pre-trains `config` in `workdir` (resuming a checkpoint there), then fine-tunes and probes
  the checkpoint's encoder on `task`. With `workdir` None nothing is pre-trained: the encoder of
  `config.model` starts from a random initialisation, with the tokenizer `config` would train.

  Args:
    eval_keys: the held-out pre-training metrics that are the row's own-target accuracy, in
      order of preference (the first one the run logs; e.g. 'mlm_accuracy').

  Returns:
    The results.jsonl record (`experiments/report.py`): row, seed, scale, commit, metrics,
    examples, degenerate, input_tokens (pre-training positions seen), pretrain {eval (the last
    held-out metrics), eval_accuracy, tokens_per_sec, curve}, pretrain_seconds (setup, compile
    and training) and total_seconds.
  """
  start = time.time()
  if workdir is not None:
    train.run(config, workdir)
    config, tokenizer, params = workdir_lib.load(workdir)
    pretrain = pretrain_record(workdir, eval_keys)
    input_tokens = config.train.total_steps * config.train.batch_size * config.data.seq_len
  else:  # the floor uses the same tokenizer as the pre-trained rows
    params, pretrain, input_tokens = None, {}, 0
    tokenizer = tokenizers.load_or_train(config, sources.get_documents(config.data, "train"))
  pretrain_seconds = time.time() - start
  metrics, examples = downstream_scores(config, params, tokenizer, task, scale, seed)
  last_loss = (pretrain.get("curve") or {}).get("loss", [None])[-1:] or [None]
  return dict(row=name, seed=seed, scale=scale.get("name"), commit=commit(),
              config_overrides=list(scale.get("config_overrides", ())), metrics=metrics,
              degenerate=degenerate_flags(metrics, last_loss[0]), input_tokens=input_tokens,
              pretrain=pretrain, pretrain_seconds=round(pretrain_seconds, 1),
              total_seconds=round(time.time() - start, 1), examples=examples)


def pretrain_record(workdir: str, eval_keys: Sequence[str]) -> dict:
  """A pre-training workdir's summary from its metrics.jsonl: the last held-out metrics, the
  own-target accuracy (the first of `eval_keys` logged), the median throughput and the curve
  (training loss at each logged step, the accuracy at each evaluation)."""
  records = metrics_lib.read_records(workdir)
  last = final_eval_metrics(workdir)
  key = next((k for k in eval_keys if k in last), None)
  evals = [r for r in records if key is not None and f"eval_{key}" in r]
  train_records = [r for r in records if "loss" in r]
  return dict(eval=last, eval_accuracy=last.get(key), tokens_per_sec=median_throughput(workdir),
              curve=dict(steps=[r["step"] for r in train_records],
                         loss=[round(r["loss"], 4) for r in train_records],
                         eval_steps=[r["step"] for r in evals],
                         eval_accuracy=[round(r[f"eval_{key}"], 4) for r in evals]))


def unigram_nll(train: Sequence[Sequence[int]], evaluation: Sequence[Sequence[int]],
                vocab_size: int) -> float:
  """The log-likelihood of a constant output: the mean over `evaluation`'s examples of their
  tokens' mean negative log-probability (nats) under one distribution, the add-one smoothed
  frequencies of every token in `train` over `vocab_size` ids (a class label is one token).
  Each example weighs the same, as a row's per-example `target_nll`."""
  counts = np.bincount(np.concatenate([np.asarray(t, np.int64) for t in train]),
                       minlength=vocab_size)
  log_prior = np.log((counts + 1) / (counts.sum() + vocab_size))
  return float(np.mean([-log_prior[np.asarray(t, np.int64)].mean() for t in evaluation]))


def constant_scores(task: wordnet.ClassificationTask) -> dict[str, float]:
  """The best constant outputs on the validation examples: {SUPERSENSE, PROBE: the majority
  training class's accuracy; SUPERSENSE/target_nll, PROBE/target_nll: the gold label's loss
  under the training classes' add-one smoothed frequencies (`unigram_nll`)}."""
  majority = collections.Counter(task.train.labels).most_common(1)[0][0]
  validation = np.asarray(task.validation.labels)
  accuracy = float(np.mean(validation == majority))
  nll = unigram_nll([[label] for label in task.train.labels],
                    [[label] for label in validation.tolist()], len(task.label_names))
  return {SUPERSENSE: accuracy, PROBE: accuracy, f"{SUPERSENSE}/target_nll": nll,
          f"{PROBE}/target_nll": nll}


# Our columns, every one higher-is-better; `paper` names the paper column each stands in for.
def columns(paper_column: str | None) -> tuple:
  """Fine-tuned and probed supersense accuracy and gold-label log-likelihood, each standing in
  for `paper_column` (the paper's fine-tuned score; the probe reads the same representation
  without fine-tuning's seed noise)."""
  return (report.Column("Supersense acc", SUPERSENSE, "accuracy", paper_column),
          report.Column("Probe acc", PROBE, "accuracy", paper_column),
          report.Column("Supersense log-lik", SUPERSENSE, "target_nll", paper_column),
          report.Column("Probe log-lik", PROBE, "target_nll", paper_column))


# The primary metric: the probe's accuracy. The budgeting study of the masking sweep's cpu scale
# (the baseline row and the floor × 3 seeds, docs/results.md) separated the floor from the
# baseline row on both probe columns (accuracy 34.9 ± 0.9 against 30.8 ± 1.2, 95% t-intervals;
# log-lik −2.833 ± 0.177 against −3.202 ± 0.101) and on neither fine-tuned one, whose
# seed-to-seed spread (375 fine-tuning steps of a 2-layer encoder) exceeds pre-training's effect
# (log-lik −2.557 ± 0.200 against −2.717 ± 0.254). Of the probe's two, only its accuracy has the
# floor measurably above the constant output (11.3); its log-likelihood on a random encoder's
# features, overfit, is no better than the training labels' frequencies (−3.202 against −3.232).
PRIMARY = f"{PROBE}/accuracy"


def write_report(results: list[dict], out: str, comparison: report.Comparison, setup: str,
                 task: wordnet.ClassificationTask, scale: dict) -> str:
  """OUT/table.md, meta.json, plot.png and curves.png of an encoder comparison
  (`experiments/report.py`); returns the markdown. `setup` describes `scale`, the scale the
  records were run at; settings overridden on the command line are listed from the records."""
  if not results:
    raise ValueError(f"No results to report in {out}.")
  old = sorted({r["row"] for r in results if "examples" not in r})
  if old:
    raise ValueError(f"the records of rows {old} hold no per-example scores (an older version's "
                     "format); rerun those rows into a fresh --out.")
  overrides = sorted({o for r in results for o in r.get("config_overrides", ())})
  if overrides:
    setup += f" Overrides for every row: {', '.join(overrides)}."
  return report.write(results, comparison, out, setup=setup, constants=constant_scores(task),
                      scale=scale, config_overrides=overrides)


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
      result = dict(run_row(name, spec, seed), host=host())
      print(json.dumps({k: v for k, v in result.items() if k != "examples"}), flush=True)
      results.append(result)
      with open(results_path, "a") as f:
        f.write(json.dumps(result) + "\n")
  return results


def host() -> dict[str, str]:
  """What a record says about the machine that made it: the CPU's model name and a digest of its
  feature flags (XLA:CPU compiles for the host's features, so the same code and seed can round
  differently on another CPU: records of 2026-11-26 reproduced exactly that day did not on
  2026-11-27 with the same commit and seed, a host change the likely cause, unconfirmed), the
  first device's kind, and the jax / jaxlib versions."""
  model, cpu_flags = "unknown", ""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == "unknown":
          model = value.strip()
        elif key.strip() == "flags" and not cpu_flags:
          cpu_flags = " ".join(sorted(value.split()))
  except OSError:
    model = platform.processor() or "unknown"
  return dict(cpu=model, cpu_flags=hashlib.sha1(cpu_flags.encode()).hexdigest()[:12],
              device=jax.devices()[0].device_kind, jax=jax.__version__,
              jaxlib=jaxlib_version.__version__)


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
  for record in metrics_lib.read_records(workdir):
    if any(k.startswith("eval_") for k in record):
      last = {k[len("eval_"):]: v for k, v in record.items() if k.startswith("eval_")}
  return last


def median_throughput(workdir: str) -> float | None:
  """The median of the training tokens/s logged in WORKDIR/metrics.jsonl (compile excluded)."""
  values = [r["tokens_per_sec"] for r in metrics_lib.read_records(workdir)
            if r.get("tokens_per_sec")]
  return float(np.median(values)) if values else None
