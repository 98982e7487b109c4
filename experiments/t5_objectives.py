"""The T5 paper's comparison of unsupervised objectives (Raffel et al. 2020 §3.3, Tables 4-7),
plus BART's two noising functions on the same encoder-decoder.

Every row pre-trains configs/t5.py with one objective (the same model, batch, steps and optimizer:
the paper compares objectives at equal steps), then fine-tunes it text-to-text on three offline
tasks and scores its greedy outputs on their validation splits:

  Supersense   wordnet_supersense_t2t  gloss -> one of 45 WordNet supersenses      accuracy
  Definition QA wordnet_qa_t2t         gloss + example sentences -> the word        exact match
  Define       wordnet_define          "define noun: dog" -> the gloss              ROUGE-2 F

standing in for the paper's GLUE, SQuAD and CNNDM columns (classification, question answering,
summarisation scored with ROUGE-2); the paper's numbers are printed beside ours. ROWS is a plain
list of (paper row name, objective overrides): the same rows run here one after another, or as
one job per row and seed, here N at a time, on SLURM or on TPUs (python -m experiments.launch).

  # The whole sweep on a 2-core CPU (committed under experiments/results/t5_objectives/runlocal):
  python -m experiments.t5_objectives --scale=runlocal
  # One row, e.g. on its own machine:
  python -m experiments.t5_objectives --scale=gpu --rows="Span length 3" --seeds=0
"""

from __future__ import annotations

import json
import math
import os
import time

from absl import app, flags
import numpy as np

from bertfam_jax import config_lib, objectives
from bertfam_jax import workdir as workdir_lib
from bertfam_jax.data import sources, tokenizers
from bertfam_jax.finetune import run as finetune_run
from bertfam_jax.finetune import text_tasks
from bertfam_jax.objectives import t5 as t5_objective
from bertfam_jax.train import train
from experiments import common

T5_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "configs", "t5.py")
NO_PRETRAINING = common.NO_PRETRAINING
BASELINE = "★ Replace corrupted spans"

# Targets length of a row: 'full' = the inputs length (full-text and prefix-LM targets, never
# cut), 'helper' = random_spans_helper's exact length (never cut), 'measured' = the 99.9th
# percentile of the row's own target lengths on the training documents (`targets_length`). The
# gin files fix the i.i.d. rows' lengths for 512 inputs (iid_15_u_u 192/512, called the "99.9th
# percentile" of its targets; iid_15_d_d 104; iid_10/25/50_u_u 103 / 256 / 512); scaled to
# shorter inputs, those fractions cut a row-dependent share of the examples (measured at 64
# inputs: ★ 13.7%, 10% rate 24.6%, 25% rate 27.0%, drop-tokens 2.1%), which is not a fair row.
_IID = dict(noise_mask="iid", noise_density=0.15, concat_documents=True)
_SENTINELS = dict(inputs_encoding="noise_span_to_unique_sentinel",
                  targets_encoding="nonnoise_span_to_unique_sentinel")
_FULL_TEXT = dict(targets_encoding="original", targets="full")

# (row name as in the paper, objective overrides + 'targets'), grouped by the paper's tables.
ROWS = [
    # Table 4: disparate high-level approaches.
    ("Prefix language modeling", dict(noise_mask="random_prefix", noise_density=0.5,
                                      inputs_encoding="drop_nonnoise_tokens",
                                      targets_encoding="drop_noise_tokens",
                                      concat_documents=False, targets="full")),
    ("BERT-style (Devlin et al., 2018)", dict(
        _IID, inputs_encoding="noise_token_to_random_token_or_sentinel", random_prob=0.1,
        **_FULL_TEXT)),
    ("Deshuffling", dict(noise_mask="iid", noise_density=1.0, concat_documents=False,
                         inputs_encoding="permute_noise_tokens", **_FULL_TEXT)),
    # Table 5: simplifying the BERT objective.
    ("MASS-style (Song et al., 2019)", dict(_IID, inputs_encoding="noise_token_to_sentinel",
                                            **_FULL_TEXT)),
    (BASELINE, dict(_IID, **_SENTINELS, targets="measured")),
    ("Drop corrupted tokens", dict(_IID, inputs_encoding="drop_noise_tokens",
                                   targets_encoding="drop_nonnoise_tokens", targets="measured")),
    # Table 6: corruption rate (i.i.d., replace spans; 15% is the baseline row).
    ("Corruption rate 10%", dict(_IID, **_SENTINELS, noise_density=0.10, targets="measured")),
    ("Corruption rate 25%", dict(_IID, **_SENTINELS, noise_density=0.25, targets="measured")),
    ("Corruption rate 50%", dict(_IID, **_SENTINELS, noise_density=0.50, targets="measured")),
    # Table 7: corrupted span length (random spans, 15%).
    *[(f"Span length {n}", dict(noise_mask="random_spans", noise_density=0.15,
                                mean_noise_span_length=float(n), **_SENTINELS, targets="helper"))
      for n in (2, 3, 5, 10)],
    # BART (Lewis et al., 2020) noising on the same encoder-decoder: Poisson(3) span infilling
    # of 30% of the tokens, one <mask> per span; with every sentence permuted first.
    ("BART text infilling", dict(noise_mask="bart_infilling", noise_density=0.3,
                                 poisson_lambda=3.0, **_FULL_TEXT)),
    ("BART infilling + sentence permutation", dict(
        noise_mask="bart_infilling", noise_density=0.3, poisson_lambda=3.0, permute_sentences=1.0,
        **_FULL_TEXT)),
    (NO_PRETRAINING, None),
]
_NAMES = [name for name, _ in ROWS]
# Blocks of the table (the paper's tables; the ★ row is the 15% and i.i.d. baseline of Tables 6
# and 7 too, shown there again from the same runs).
TABLE_GROUPS = (
    ("Table 4: disparate high-level approaches", _NAMES[0:3]),
    ("Table 5: simplifying the BERT objective", _NAMES[3:6]),
    ("Table 6: corruption rate (i.i.d., replace spans)",
     [_NAMES[6], BASELINE, _NAMES[7], _NAMES[8]]),
    ("Table 7: corrupted span length (15%)", [BASELINE] + _NAMES[9:13]),
    ("BART noising (not in the paper's tables)", _NAMES[13:15]),
    ("Floor", _NAMES[15:16]),
)

# The paper's validation scores (spec t5_objectives.md §1, Tables 1 and 4-7); "Corruption rate
# 15%" and "Baseline (i.i.d.)" are the ★ row.
PAPER_COLUMNS = ("GLUE", "CNNDM", "SQuAD", "SGLUE", "EnDe", "EnFr", "EnRo")
PAPER = {
    "Prefix language modeling": (80.69, 18.94, 77.99, 65.27, 26.86, 39.73, 27.49),
    "BERT-style (Devlin et al., 2018)": (82.96, 19.17, 80.65, 69.85, 26.78, 40.03, 27.41),
    "Deshuffling": (73.17, 18.59, 67.61, 58.47, 26.11, 39.30, 25.62),
    "MASS-style (Song et al., 2019)": (82.32, 19.16, 80.10, 69.28, 26.79, 39.89, 27.55),
    BASELINE: (83.28, 19.24, 80.88, 71.36, 26.98, 39.82, 27.65),
    "Drop corrupted tokens": (84.44, 19.31, 80.52, 68.67, 27.07, 39.76, 27.82),
    "Corruption rate 10%": (82.82, 19.00, 80.38, 69.55, 26.87, 39.28, 27.44),
    "Corruption rate 25%": (83.00, 19.54, 80.96, 70.48, 27.04, 39.83, 27.47),
    "Corruption rate 50%": (81.27, 19.32, 79.80, 70.33, 27.01, 39.90, 27.49),
    "Span length 2": (83.54, 19.39, 82.09, 72.20, 26.76, 39.99, 27.63),
    "Span length 3": (83.49, 19.62, 81.84, 72.53, 26.86, 39.65, 27.62),
    "Span length 5": (83.40, 19.24, 82.05, 72.23, 26.88, 39.40, 27.53),
    "Span length 10": (82.85, 19.33, 81.84, 70.44, 26.79, 39.49, 27.69),
    NO_PRETRAINING: (66.22, 17.60, 50.31, 53.04, 25.86, 39.77, 24.04),
}

# Our downstream columns: (column label, text task, metric, the paper column it stands in for).
TASKS = (
    ("Supersense", "wordnet_supersense_t2t", "accuracy", "GLUE"),
    ("Definition QA", "wordnet_qa_t2t", "exact", "SQuAD"),
    ("Define", "wordnet_define", "rouge2", "CNNDM"),
)
SCORES = tuple(f"{task}/{metric}" for _, task, metric, _ in TASKS)

SCALES = {
    # 2-core CPU: configs/t5.py:runlocal (T5 v1.0 mini: 2 + 2 layers, d_model 128), 128 inputs,
    # batch 32, on the embedded Wikipedia sample; every fine-tuning run on 4,000 training and
    # 500 validation examples of its task.
    # 2-core CPU, under 45 minutes for 16 rows x 2 seeds: configs/t5.py:runlocal's T5 v1.0 mini
    # (2 + 2 layers, d_model 128) with 4,000 SentencePiece pieces + 100 sentinels, 64 inputs,
    # batch 32, 100 steps on the embedded Wikipedia sample; each task fine-tuned for 60 steps of
    # 16 examples at 0.01 (a tiny model on a short budget; 0.001 left every model at the floor)
    # and scored on 150 validation examples.
    "runlocal": dict(config_arg="runlocal", batch_size=32, seq_len=64, pretrain_steps=100,
                     warmup_steps=20, peak_lr=0.02,
                     model=dict(vocab_size=4224), tokenizer=dict(vocab_size=4000),
                     finetune_steps=60, finetune_batch=16, finetune_lr=1e-2,
                     finetune_inputs=64, finetune_targets=32, finetune_train=4000,
                     finetune_eval=150),
    # The `cpu` scale of issue 19's protocol (replacing runlocal once it has run): the same T5
    # mini, dropout 0, 400 steps of 32 × 64; each task fine-tuned 400 steps × 32 on 4,000
    # training examples and scored on 2,000 validation ones (a standard error of about a point),
    # with the gold targets' loss. Its wall time is to be measured (one row: docs/results.md).
    "cpu": dict(config_arg="runlocal", batch_size=32, seq_len=64, pretrain_steps=400,
                warmup_steps=40, peak_lr=0.02,
                model=dict(vocab_size=4224, dropout=0.0), tokenizer=dict(vocab_size=4000),
                finetune_steps=400, finetune_batch=32, finetune_lr=1e-2,
                finetune_inputs=64, finetune_targets=32, finetune_train=4000,
                finetune_eval=2000),
    # One GPU, about an hour for the sweep: T5 small-like (4 + 4 layers, d_model 256), 256 inputs,
    # batch 128, 5,000 steps each. Not measured here (no GPU lent to this task).
    "gpu": dict(config_arg="runlocal", batch_size=128, pretrain_steps=5000, warmup_steps=500,
                peak_lr=0.01, seq_len=256,
                model=dict(hidden=256, layers=4, decoder_layers=4, heads=4, head_dim=64,
                           mlp=1024),
                finetune_steps=2000, finetune_batch=64, finetune_lr=1e-3, finetune_inputs=128,
                finetune_targets=64, finetune_train=None, finetune_eval=2000),
    # The paper: T5 base v1.0, 512 inputs, 128 x 2^19 steps on C4 (2^35 tokens); fine-tuning
    # 2^18 steps at a constant 0.001 in the paper, shortened here to the offline tasks' size.
    # Documents the configuration: TPU-pod scale, not run here.
    "paper": dict(config_arg="base", batch_size=128, pretrain_steps=2**19, warmup_steps=10_000,
                  peak_lr=0.01, seq_len=512, checkpoint_every=5000, eval_every=5000,
                  finetune_steps=20_000, finetune_batch=128, finetune_lr=1e-3,
                  finetune_inputs=256, finetune_targets=128, finetune_train=None,
                  finetune_eval=None),
}



def define_flags() -> None:
  """The command line (defined only when run as a script, so that importing this module beside
  another experiment defines no flag twice)."""
  common.define_sweep_flags("t5_objectives", ROWS, SCALES)


# ------------------------------------------------------------------------------------- configs


# 'measured' rows cut at most this share of their examples' targets.
MAX_CUT_SHARE = 0.001


def targets_length(rule: str, config) -> int:
  """The row's decoder length (see `_IID` above): 'full' the inputs length, 'helper' the exact
  random-spans length, 'measured' the (1 − MAX_CUT_SHARE) quantile of the row's own target
  lengths (`row_targets`) rounded up to a multiple of 8."""
  inputs_length, o = config.data.seq_len, config.objective
  if rule == "full":
    return inputs_length
  if rule == "helper":
    _, needed = t5_objective.t5_noise.random_spans_helper(
        inputs_length, o.noise_density, o.mean_noise_span_length)
    return needed
  quantile = np.quantile(row_targets(config), 1.0 - MAX_CUT_SHARE, method="higher")
  return int(8 * math.ceil(quantile / 8))


def pretrain_config(scale: dict, spec: dict, seed: int):
  """configs/t5.py at the scale's size, batch, steps and optimizer, with the row's objective and
  its targets length (`targets_length`, sized on the row's own targets: `row_targets`)."""
  config = config_lib.load_config(T5_CONFIG, scale["config_arg"])
  config.model.update(scale.get("model", {}))
  config.tokenizer.update(scale.get("tokenizer", {}))
  config.seed = seed
  if "seq_len" in scale:
    config.data.seq_len = scale["seq_len"]
  steps = scale["pretrain_steps"]
  config.train.update(batch_size=scale["batch_size"], total_steps=steps,
                      log_every=max(1, min(steps // 10, 1000)),
                      eval_every=min(steps, scale.get("eval_every", steps)),
                      checkpoint_every=min(steps, scale.get("checkpoint_every", steps)))
  config.optimizer.update(peak_lr=scale["peak_lr"], warmup_steps=scale["warmup_steps"])
  overrides = {k: v for k, v in spec.items() if k != "targets"}
  config.objective = config_lib.t5_objective(**overrides)
  config.objective.targets_length = config.data.seq_len   # provisional, for BART's segments
  config_lib.apply_overrides(config, scale.get("config_overrides", ()))
  config.objective.targets_length = targets_length(spec["targets"], config)
  objectives.validate(config)
  t5_objective.segment_length(config)  # the objective's own length check
  return config


def row_targets(config) -> np.ndarray:
  """The row's target lengths (EOS included) on the first documents of its training corpus,
  with its tokenizer (trained once and cached): what 'measured' rows are sized from."""
  documents = sources.get_documents(config.data, "train")
  tokenizer = tokenizers.load_or_train(config, documents)
  return t5_objective.target_lengths(config, tokenizer, documents)


# ---------------------------------------------------------------------------------------- rows


def finetune_config(init_config, task: text_tasks.TextTask, scale: dict, seed: int):
  """The resolved text-to-text fine-tuning config of `task` at the scale's size: T5's recipe
  (Adafactor at a constant rate, greedy decoding) for `finetune_steps` updates."""
  config = config_lib.finetune_config()
  config.seed = seed
  config.optimizer.peak_lr = scale["finetune_lr"]
  config.finetune.update(
      task=task.name, max_seq_len=scale["finetune_inputs"],
      targets_length=min(task.max_target_tokens, scale["finetune_targets"]),
      max_train_examples=scale["finetune_train"] or 0,
      max_eval_examples=scale["finetune_eval"] or 0)
  config.train.update(batch_size=scale["finetune_batch"], eval_batch_size=scale["finetune_batch"],
                      total_steps=scale["finetune_steps"], log_every=10_000)
  return finetune_run.resolved_config(config, init_config)


def downstream_scores(init_config, params, tokenizer, scale: dict, seed: int) -> dict:
  """Fine-tunes a copy of `params` (None: a fresh initialisation) on every task
  (`finetune.run.fine_tune`: the one train loop); returns {task/metric: score in [0, 1]}, each
  task's teacher-forced loss on its gold targets ({task}/target_loss, nats per token), its
  number of distinct predictions ({task}/distinct: a degenerate run emits 1-3), and the
  fine-tuning steps."""
  scores = {}
  for _, task_name, metric, _ in TASKS:
    task = text_tasks.get(task_name)
    config = finetune_config(init_config, task, scale, seed)
    config.finetune.from_scratch = params is None
    result = finetune_run.fine_tune(config, tokenizer, params)
    scores[f"{task_name}/{metric}"] = result["scores"][metric] / 100 if metric in (
        "exact", "rouge2") else result["scores"][metric]
    scores[f"{task_name}/target_loss"] = result["scores"]["target_loss"]
    scores[f"{task_name}/distinct"] = result["distinct_predictions"]
  return dict(scores, finetune_steps=scale["finetune_steps"])


def run_row(name: str, spec: dict | None, seed: int, scale: dict, workdirs: str) -> dict:
  """Pre-trains one row (unless it is the floor), fine-tunes it on every task, returns scores
  and the pre-training's held-out target-token accuracy and throughput."""
  start = time.time()
  if spec is None:  # the floor: the baseline row's model and tokenizer, nothing pre-trained
    config = pretrain_config(scale, dict(ROWS)[BASELINE], seed)
    tokenizer = tokenizers.load_or_train(config, sources.get_documents(config.data, "train"))
    params, pretrain = None, {}
  else:
    config = pretrain_config(scale, spec, seed)
    workdir = os.path.join(workdirs, common.workdir_name(name.lstrip("★ "), seed))
    train.run(config, workdir)
    config, tokenizer, params = workdir_lib.load(workdir)
    pretrain = dict(common_eval(workdir), **seen(workdir, config),
                    targets_length=config.objective.targets_length)
  pretrain_seconds = time.time() - start
  scores = downstream_scores(config, params, tokenizer, scale, seed)
  return dict(row=name, seed=seed, **scores, pretrain=pretrain,
              pretrain_seconds=round(pretrain_seconds, 1),
              total_seconds=round(time.time() - start, 1))


def seen(workdir: str, config) -> dict:
  """What the row's pre-training saw, from its logged steps: input and target tokens (the
  batches' filled positions × steps) and the share of its examples whose targets were cut."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [r for r in map(json.loads, f) if "input_fill" in r]
  mean = lambda key: float(np.mean([r[key] for r in records if r.get(key) is not None]))  # noqa: E731
  rows = config.train.batch_size * config.train.total_steps
  return dict(input_tokens=round(mean("input_fill") * config.data.seq_len * rows),
              target_tokens=round(mean("target_fill") * config.objective.targets_length * rows),
              targets_cut_share=mean("targets_cut"))


def common_eval(workdir: str) -> dict:
  """The last held-out pre-training accuracy and the median training throughput of a workdir."""
  last = common.final_eval_metrics(workdir)
  return dict(eval_accuracy=last.get("t5_accuracy"), eval_loss=last.get("t5_loss"),
              tokens_per_sec=common.median_throughput(workdir))


# --------------------------------------------------------------------------------------- table


def _cell(value: tuple[float, float] | None) -> str:
  if value is None:
    return "—"
  mean, std = value
  return f"{mean:.1f}" if math.isnan(std) else f"{mean:.1f} ± {std:.1f}"


def markdown_table(table: list[dict], results: list[dict], scale_name: str, seeds: int) -> str:
  """The paper's layout: one block per paper table, rows = objectives, our columns (mean ± std
  over seeds, ×100) then the paper's; best of each of our columns within a block in bold, by the
  paper's rule (within two standard deviations of the best); a cell of a degenerate run (some
  seed's fine-tuned model emitted at most DEGENERATE distinct texts) marked †."""
  by_row = {row["row"]: row for row in table}
  ours = [label for label, *_ in TASKS]
  header = (["Objective"] + [f"{label} ({metric})" for label, _, metric, _ in TASKS]
            + ["pre-train acc"] + [f"paper {c}" for c in PAPER_COLUMNS])
  lines = [f"T5 objective comparison, scale `{scale_name}`, {seeds} seed(s): mean ± sample std "
           f"×100 on validation splits. Ours: {', '.join(ours)} (greedy decoding); paper: "
           "Raffel et al. 2020 Tables 1, 4-7.", ""]
  lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for title, group in TABLE_GROUPS:
    rows = [by_row[name] for name in group if name in by_row]
    if not rows:
      continue
    lines.append(f"| **{title}** |" + " |" * (len(header) - 1))
    best = {key: max(r[key][0] for r in rows) for key in SCORES}
    for r in rows:
      cells = []
      for key in SCORES:
        text = _cell(r[key])
        std = r[key][1]
        if len(rows) > 1 and not math.isnan(std) and r[key][0] >= best[key] - 2 * std:
          text = f"**{text}**"
        cells.append(text + ("†" if degenerate(results, r["row"], key) else ""))
      accuracy = [x["pretrain"].get("eval_accuracy") for x in results
                  if x["row"] == r["row"] and x.get("pretrain")]
      accuracy = [a for a in accuracy if a is not None]
      cells.append(f"{100 * np.mean(accuracy):.1f}" if accuracy else "—")
      paper = PAPER.get(r["row"])
      cells += [f"{v:.2f}" for v in paper] if paper else ["—"] * len(PAPER_COLUMNS)
      lines.append(f"| {r['row']} | " + " | ".join(cells) + " |")
  lines += ["", f"† degenerate: in some seed the fine-tuned model emitted at most {DEGENERATE} "
                f"distinct texts on the validation split (a constant output), not a result."]
  return "\n".join(lines) + "\n"


# A fine-tuned model with at most this many distinct predictions emits a constant, not an answer.
DEGENERATE = 3


def degenerate(results: list[dict], row: str, score_key: str) -> bool:
  """Whether some seed of `row` predicted at most DEGENERATE distinct texts on the task of
  `score_key` ({task}/{metric}); results without the count (older runs) are not flagged."""
  task = score_key.split("/")[0]
  counts = [r.get(f"{task}/distinct") for r in results if r["row"] == row]
  return any(c is not None and c <= DEGENERATE for c in counts)


def rank_agreement(table: list[dict]) -> list[str]:
  """Per paper table block and matched column pair, Spearman's ρ between our means and the
  paper's over the block's rows (NaN with fewer than 3 rows or constant columns)."""
  by_row = {row["row"]: row for row in table}
  lines = []
  for title, group in TABLE_GROUPS:
    names = [n for n in group if n in by_row and n in PAPER]
    if len(names) < 3:
      continue
    parts = []
    for label, task, metric, paper_column in TASKS:
      ours = [by_row[n][f"{task}/{metric}"][0] for n in names]
      theirs = [PAPER[n][PAPER_COLUMNS.index(paper_column)] for n in names]
      parts.append(f"{label} vs {paper_column} ρ = {common.spearman(ours, theirs):+.2f}")
    lines.append(f"- {title}: " + "; ".join(parts))
  return lines


def plot(table: list[dict], path: str, title: str) -> None:
  """One panel per downstream task: our mean ± std per row; the paper's matched column beside
  it on a second axis."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  names = [row["row"] for row in table]
  fig, axes = plt.subplots(1, len(TASKS), figsize=(6 * len(TASKS), 5.5), sharey=False)
  y = np.arange(len(names))
  for ax, (label, task, metric, paper_column) in zip(axes, TASKS):
    key = f"{task}/{metric}"
    ax.barh(y - 0.2, [row[key][0] for row in table], 0.4,
            xerr=[np.nan_to_num(row[key][1]) for row in table], capsize=2, label="ours")
    ax.set_xlabel(f"{label} {metric} (×100)")
    twin = ax.twiny()
    paper = [PAPER.get(n, (np.nan,) * len(PAPER_COLUMNS))[PAPER_COLUMNS.index(paper_column)]
             for n in names]
    twin.barh(y + 0.2, paper, 0.4, color="tab:gray", label=f"paper {paper_column}")
    finite = [p for p in paper if not np.isnan(p)]
    if finite:
      twin.set_xlim(min(finite) - 2, max(finite) + 1)
    twin.set_xlabel(f"paper {paper_column}", color="tab:gray")
    ax.set_yticks(y, names if ax is axes[0] else [""] * len(names))
    ax.invert_yaxis()
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv):
  del argv
  f = flags.FLAGS
  scale = dict(SCALES[f.scale], config_overrides=f.config_overrides)
  common.check_rows(f.rows, ROWS, lambda spec: pretrain_config(scale, spec, 0))
  out, workdirs = common.sweep_dirs("t5_objectives")
  seeds = list(map(int, f.seeds))
  results = common.run_sweep(
      ROWS, f.rows, seeds, os.path.join(out, "results.jsonl"),
      lambda name, spec, seed: run_row(name, spec, seed, scale, workdirs))
  print(write_summary(results, out, f.scale))


def write_summary(results: list[dict], out: str, scale_name: str) -> str:
  """Writes OUT/table.md (with the rank agreement) and OUT/plot.png from `results`; returns the
  markdown. Also what `python -m experiments.launch summary` calls on the merged rows."""
  table = common.summarise(results, [name for name, _ in ROWS], scores=SCORES)
  markdown = markdown_table(table, results, scale_name, len({r["seed"] for r in results}))
  markdown += "\nRank agreement with the paper within each block:\n" + "\n".join(
      rank_agreement(table)) + "\n"
  with open(os.path.join(out, "table.md"), "w") as fh:
    fh.write(markdown)
  plot(table, os.path.join(out, "plot.png"),
       f"T5 objective comparison ({scale_name}), mean ± std over seeds; paper in gray")
  return markdown


if __name__ == "__main__":
  define_flags()
  app.run(main)
