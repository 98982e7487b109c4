"""Compression of the family (issue 22 §5): distillation (DistilBERT, TinyBERT), 8-bit
quantization (Q8BERT) and pruning (magnitude, attention heads), each applied to one pre-trained
teacher and measured as size, CPU latency and task scores, in the protocol of EXPERIMENTS.md.

The teacher is a BERT of ours, pre-trained once at the scale's size; the two students are
distilled from it once, on the same data and for the same steps. Every row then fine-tunes on
the offline WordNet tasks (`finetune/tasks.py`), seeds 0-2 (the seed draws the head, dropout,
the data order and the pruned heads' importance batches):

  BERT (teacher)           the teacher fine-tuned in float32: the reference row
  Q8BERT, post-training    the same float fine-tuning, evaluated through the int8 path with
                           ranges measured per input (finetune.quantize=ptq: the paper's baseline)
  Q8BERT, QAT              quantization-aware fine-tuning, evaluated through the int8 path
  Magnitude pruning 50%    half the encoder layers' weights (smallest |w|, ranked globally) set
                           to 0 before fine-tuning and held there (finetune.prune_sparsity)
  Head pruning 50%         half the attention heads removed by Michel et al.'s gradient
                           importance, 10% per round, before fine-tuning (finetune.prune_heads)
  DistilBERT               the student (half the layers, from the teacher's) fine-tuned
  TinyBERT, general        the general-distilled student (half depth and width) fine-tuned
  TinyBERT, general + task the same student distilled on the task from the teacher row's
                           fine-tuned model of the same seed: attention and hidden states, then
                           the predictions (finetune.teacher, distill=intermediate|prediction;
                           for tagging the second stage fits the labels: the reference distils
                           sentence-level logits only)
  No pre-training          the teacher's network fine-tuned from a random initialisation (floor)

Scores: supersense (definition → one of 45 classes; accuracy and the gold label's
log-likelihood) and lemma tagging (the supersense tags of the lemma in WordNet's example
sentences; per example, the share of its tagged words tagged right). Size: parameters of the
deployed model (a distillation's projections excluded), those not zero, and bytes as deployed
(4 per float32 parameter, 1 per int8 matrix or table entry of the Q8BERT rows; a 50%-sparse
matrix stored dense, since a sparse format with 4-byte indices saves nothing at that sparsity).
Latency: the jitted prediction's median wall time at batch 1 and 32 on this process's CPU.

WordNet QA is not a column at the cpu scale: with 1,000 training examples it did not separate
the teacher from the floor (span F1 10.0 against 9.4 after 10 epochs, one seed each; EM 4.4
and 4.3), a null metric by EXPERIMENTS.md §1; lemma tagging did (span F1 17.7 against 0.0).

  # The cpu scale (results committed under experiments/results/compression/cpu):
  python -m experiments.compression --scale=cpu
"""

from __future__ import annotations

import json
import os
import time

from absl import app, flags
import flax.linen as nn
import jax
import numpy as np

from bertfam_jax import config_lib
from bertfam_jax import workdir as workdir_lib
from bertfam_jax.finetune import distill, quantize, tasks
from bertfam_jax.finetune import run as finetune_run
from bertfam_jax.train import train
from experiments import common, report

REPO = common.REPO
NO_PRETRAINING = common.NO_PRETRAINING
BASELINE = "BERT (teacher)"
TEACHER, DISTILBERT, TINYBERT = "teacher", "distilbert", "tinybert"
SUPERSENSE, TAGGING = "wordnet_supersense", "wordnet_tagging"

# (row, how it is made): `init` names the pre-trained model, the other keys are finetune fields;
# `task_distill` adds TinyBERT's two task-specific stages.
ROWS = [
    (BASELINE, dict(init=TEACHER)),
    ("Q8BERT, post-training", dict(init=TEACHER, quantize="ptq")),
    ("Q8BERT, QAT", dict(init=TEACHER, quantize="qat")),
    ("Magnitude pruning 50%", dict(init=TEACHER, prune_sparsity=0.5)),
    ("Head pruning 50%", dict(init=TEACHER, prune_heads=0.5)),
    ("DistilBERT", dict(init=DISTILBERT)),
    ("TinyBERT, general", dict(init=TINYBERT)),
    ("TinyBERT, general + task", dict(init=TINYBERT, task_distill=True)),
    (NO_PRETRAINING, dict(init=TEACHER, from_scratch=True)),
]
_NAMES = [name for name, _ in ROWS]

SCALES = {
    # The 2-core CPU: configs/bert.py:runlocal (L2 H128, 8k pieces) pre-trained 2,000 steps of
    # 32 × 128 on the embedded Wikipedia sample and WordNet's training glosses; students
    # distilled 400 steps of 32 × 128 on the same data; fine-tuning on 1,000 training examples
    # for 10 epochs (the few-example regime, where the budgeting runs separated the teacher from
    # the floor: supersense 29.0 against 23.6), scored on 2,000 (supersense) and 1,000 (tagging).
    "cpu": dict(teacher_steps=2000, student_steps=400,
                tasks={SUPERSENSE: dict(seq_len=32, eval=2000),
                       TAGGING: dict(seq_len=48, eval=1000)},
                finetune_train=1000, finetune_epochs=10, finetune_lr=5e-4,
                latency_batches=(1, 32), latency_reps=30,
                # The committed records' TinyBERT student ran before configs/tinybert.py took
                # its code's uncut weight init (the teacher and DistilBERT draw as BERT anyway).
                pinned={"model.weight_init": "truncated_normal"}),
}


# ------------------------------------------------------------------------------- the pre-training


def teacher_config(scale: dict):
  """configs/bert.py:runlocal with WordNet's training glosses added to its data."""
  config = config_lib.load_config(os.path.join(REPO, "configs", "bert.py"), "runlocal")
  return _on_glosses(config, scale["teacher_steps"], 4, scale)


def student_config(kind: str, teacher_dir: str, scale: dict):
  """configs/{distilbert,tinybert}.py:runlocal from the teacher, on the teacher's data, for the
  scale's steps (warm-up a tenth of them)."""
  config = config_lib.load_config(os.path.join(REPO, "configs", f"{kind}.py"),
                                  f"runlocal,teacher={teacher_dir}")
  config.optimizer.warmup_steps = scale["student_steps"] // 10
  return _on_glosses(config, scale["student_steps"], 2, scale)


def _on_glosses(config, steps: int, evaluations: int, scale: dict):
  """`config` on the embedded sample and WordNet's training glosses for `steps` steps,
  evaluated `evaluations` times, checkpointed at the end, with the scale's overrides last."""
  config.data.wordnet_glosses = True
  config.train.update(total_steps=steps, checkpoint_every=steps,
                      eval_every=steps // evaluations)
  common.apply_pinned(config, scale)
  config_lib.apply_overrides(config, scale.get("config_overrides", ()))
  return config


def pretrain(scale: dict, workdirs: str) -> dict[str, str]:
  """Pre-trains the teacher and distils both students (each resumed or skipped when its
  workdir is complete); returns {TEACHER, DISTILBERT, TINYBERT: workdir}."""
  dirs = {name: os.path.join(workdirs, name) for name in (TEACHER, DISTILBERT, TINYBERT)}
  train.run(teacher_config(scale), dirs[TEACHER])
  for kind in (DISTILBERT, TINYBERT):
    train.run(student_config(kind, dirs[TEACHER], scale), dirs[kind])
  return dirs


# -------------------------------------------------------------------------------- fine-tuning


def finetune_config(task: str, init: str, seed: int, scale: dict, **fields):
  """BERT's classifier recipe (`common.finetune_config`) on `task` at the scale's size, from
  the workdir `init`, with `fields` (finetune.*) set."""
  size = scale["tasks"][task]
  base = dict(scale, finetune_eval=size["eval"], finetune_seq_len=size["seq_len"])
  config = common.finetune_config(base, seed)
  config.finetune.update(task=task, init=init, **fields)
  return config


def finetune(task: str, spec: dict, seed: int, scale: dict, dirs: dict, workdir: str) -> str:
  """Runs the row's fine-tuning on `task` in `workdir` (resumed or skipped when complete; for
  TinyBERT's task distillation, the teacher row's fine-tuning of this seed first, then the two
  stages); returns the workdir whose predictions score the row."""
  fields = {k: v for k, v in spec.items() if k not in ("init", "task_distill")}
  init = dirs[spec["init"]]
  if not spec.get("task_distill"):
    _run(finetune_config(task, init, seed, scale, **fields), workdir)
    return workdir
  teacher = finetune_dir(dirs, BASELINE, task, seed)
  finetune(task, dict(ROWS)[BASELINE], seed, scale, dirs, teacher)
  stage1, stage2 = workdir + "-intermediate", workdir
  _run(finetune_config(task, init, seed, scale, teacher=teacher, distill="intermediate"), stage1)
  # The prediction stage distils sentence-level logits (task_distill.py's GLUE heads); a tagging
  # task's second stage is a fine-tuning on its labels.
  prediction = (dict(teacher=teacher, distill="prediction")
                if tasks.get(task).kind in distill.PREDICTION_KINDS else {})
  _run(finetune_config(task, stage1, seed, scale, **prediction), stage2)
  return stage2


def _run(config, workdir: str) -> None:
  if not os.path.exists(os.path.join(workdir, "eval_results.json")):
    finetune_run.run(config, workdir)


def finetune_dir(dirs: dict, row: str, task: str, seed: int) -> str:
  return os.path.join(os.path.dirname(dirs[TEACHER]), "finetune",
                      f"{common.workdir_name(row, seed)}-{task}")


def read_predictions(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "predictions.jsonl")) as f:
    return [json.loads(line) for line in f]


def task_scores(task: str, predictions: list[dict]) -> tuple[dict, dict]:
  """(metrics, per-example scores) of a task's predictions.jsonl.

  supersense: accuracy and the gold label's negative log-probability per example;
  tagging: per example with a tagged word, the share of its tagged words (gold tag not O)
  whose predicted tag is the gold one (the same examples for every row: the gold tags decide).
  `distinct`: the labels the model emitted; a tagger's over all its words, since tag sequences
  of different lengths differ even when every tag is O (the constant output).
  """
  if task == SUPERSENSE:
    correct = [float(p["prediction"] == p["label"]) for p in predictions]
    nll = [round(float(p["gold_nll"]), 4) for p in predictions]
    metrics = {f"{task}/accuracy": float(np.mean(correct)),
               f"{task}/target_loss": float(np.mean(nll)),
               f"{task}/distinct": len({p["prediction"] for p in predictions})}
    return metrics, {"accuracy": correct, "target_nll": nll}
  shares = []
  for p in predictions:
    tagged = [i for i, tag in enumerate(p["label"]) if tag != 0]
    if tagged:
      shares.append(float(np.mean([p["prediction"][i] == p["label"][i] for i in tagged])))
  distinct = len({tag for p in predictions for tag in p["prediction"]})
  return ({f"{task}/accuracy": float(np.mean(shares)), f"{task}/distinct": distinct},
          {"accuracy": shares})


# ---------------------------------------------------------------------------- size and latency


def footprint(workdir: str) -> dict:
  """Parameters of the fine-tuned model in `workdir` (a distillation's `fit_dense` projections
  left out: they serve training only), those not exactly 0, and bytes as deployed: 1 per entry
  of a quantized row's matrices and embedding tables (Q8BERT: every kernel and table), 4 for
  everything else."""
  config = workdir_lib.read_config(workdir)
  params = workdir_lib.restore_params(workdir)
  quantized = bool(config.finetune.get("quantize"))
  total = nonzero = size_bytes = 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    names = [str(getattr(k, "key", k)) for k in path]
    if any("fit_dense" in n for n in names):
      continue
    leaf = np.asarray(leaf)
    total += leaf.size
    nonzero += int(np.count_nonzero(leaf))
    size_bytes += leaf.size * (1 if quantized and names[-1] in ("kernel", "embedding") else 4)
  return dict(params=total, nonzero_params=nonzero, bytes=size_bytes)


def latency_ms(workdir: str, batch: int, seq_len: int, reps: int) -> float:
  """Median wall milliseconds of the fine-tuned model's jitted prediction (the int8 path for
  a quantized row) on a [batch, seq_len] input, after two untimed calls. Parameter values do not
  change the time of dense work, so the model's own initialisation serves."""
  config = workdir_lib.read_config(workdir)
  model, _ = finetune_run.build_model(config)
  quant = {}
  if config.finetune.get("quantize"):
    model, quant = quantize.wrap(model, config.finetune), {"quant": "int8"}
  ids = np.full((batch, seq_len), 5, np.int32)
  mask, segments = np.ones_like(ids), np.zeros_like(ids)
  variables = nn.meta.unbox(jax.jit(lambda: model.init(
      jax.random.key(0), ids, mask, segments, deterministic=True))())
  predict = jax.jit(lambda v, *inputs: model.apply(v, *inputs, deterministic=True, **quant))
  times = []
  for i in range(reps + 2):
    start = time.perf_counter()
    jax.block_until_ready(predict(variables, ids, mask, segments))
    if i >= 2:
      times.append(time.perf_counter() - start)
  return 1000 * float(np.median(times))


# ------------------------------------------------------------------------------------ the rows


def run_row(name: str, spec: dict, seed: int, scale: dict, dirs: dict) -> dict:
  """One (row, seed): its fine-tunings on every task, their scores, and the supersense model's
  size and latency; the results.jsonl record."""
  start = time.time()
  metrics, examples, scored = {}, {}, {}
  for task in scale["tasks"]:
    workdir = finetune(task, spec, seed, scale, dirs, finetune_dir(dirs, name, task, seed))
    task_metrics, examples[task] = task_scores(task, read_predictions(workdir))
    metrics.update(task_metrics)
    scored[task] = workdir
  model = scored[SUPERSENSE]
  seq_len = scale["tasks"][SUPERSENSE]["seq_len"]
  size = footprint(model)
  latency = {f"latency_ms_batch{b}": round(latency_ms(model, b, seq_len, scale["latency_reps"]), 3)
             for b in scale["latency_batches"]}
  degenerate = [task for task in scale["tasks"] if metrics[f"{task}/distinct"] <= common.DEGENERATE]
  return dict(row=name, seed=seed, scale=scale.get("name"), commit=common.commit(),
              config_overrides=list(scale.get("config_overrides", ())), metrics=metrics,
              examples=examples, degenerate=degenerate, size=size, latency=latency,
              pretrained=spec["init"] if not spec.get("from_scratch") else None,
              total_seconds=round(time.time() - start, 1))


COLUMNS = (report.Column("Supersense acc", SUPERSENSE, "accuracy"),
           report.Column("Supersense log-lik", SUPERSENSE, "target_nll"),
           report.Column("Tagging acc", TAGGING, "accuracy"))

COMPARISON = report.Comparison(
    title="Compression of a BERT teacher",
    rows=_NAMES, baseline=BASELINE, floor=NO_PRETRAINING,
    groups=(("Teacher", _NAMES[:1]), ("Quantization (Q8BERT)", _NAMES[1:3]),
            ("Pruning", _NAMES[3:5]), ("Distillation", _NAMES[5:8]), ("Floor", _NAMES[8:])),
    columns=COLUMNS, primary_key=f"{SUPERSENSE}/accuracy", paper={}, paper_columns=(),
    paper_source="no paper measures these methods side by side on one teacher; each paper's "
                 "own claim is in docs/compression.md",
    row_label="Method", floor_rows=(BASELINE,))


def constant_scores(scale: dict) -> dict[str, float]:
  """The majority supersense's accuracy and the label frequencies' log-loss on the scored
  examples (`common.constant_scores`); tagging's constant output (every word O) scores 0."""
  task = common.supersense_task(dict(finetune_train=scale["finetune_train"],
                                     finetune_eval=scale["tasks"][SUPERSENSE]["eval"]))
  constants = common.constant_scores(task)
  return {SUPERSENSE: constants[common.SUPERSENSE],
          f"{SUPERSENSE}/target_nll": constants[f"{common.SUPERSENSE}/target_nll"], TAGGING: 0.0}


def size_table(results: list[dict]) -> list[str]:
  """Size and latency per row (the same for every seed but the nonzero count of head pruning,
  whose heads depend on the seed: means over seeds), with each against the teacher's."""
  rows = report.rows_run(results, COMPARISON)
  mean = lambda name, part, key: float(np.mean(  # noqa: E731
      [r[part][key] for r in report.runs(results, name)]))
  base = {key: mean(BASELINE, part, key) for part, key in
          (("size", "bytes"), ("latency", "latency_ms_batch1"), ("latency", "latency_ms_batch32"))}
  lines = ["## Size and CPU latency", "",
           "Parameters of the deployed model, those not zero, bytes as deployed (int8: 1 byte "
           "per quantized entry), and the jitted prediction's median latency on the 2-core CPU "
           "(ms; × = the teacher's time over the row's).", "",
           "| Method | params | nonzero | MB | × smaller | ms, batch 1 | × faster | ms, batch 32 "
           "| × faster |", "|---|---|---|---|---|---|---|---|---|"]
  for name in rows:
    size_bytes = mean(name, "size", "bytes")
    b1, b32 = mean(name, "latency", "latency_ms_batch1"), mean(name, "latency", "latency_ms_batch32")
    lines.append(f"| {name} | {mean(name, 'size', 'params'):,.0f} | "
                 f"{mean(name, 'size', 'nonzero_params'):,.0f} | {size_bytes / 1e6:.2f} | "
                 f"{base['bytes'] / size_bytes:.2f} | {b1:.2f} | "
                 f"{base['latency_ms_batch1'] / b1:.2f} | {b32:.2f} | "
                 f"{base['latency_ms_batch32'] / b32:.2f} |")
  return lines + [""]


def pareto_plot(results: list[dict], path: str) -> None:
  """plot.png: the primary score (mean ± 95% interval over seeds) against bytes as deployed and
  against batch-32 latency, one point per row, the floor's score as a line."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  table = report.summarise(results, COMPARISON)
  key = COMPARISON.primary_key
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
  for ax, (part, field, label) in zip(axes, (("size", "bytes", "MB as deployed"),
                                             ("latency", "latency_ms_batch32",
                                              "CPU latency at batch 32 (ms)"))):
    for name, cells in table.items():
      x = np.mean([r[part][field] for r in report.runs(results, name)])
      x = x / 1e6 if part == "size" else x
      mean, half = cells[key]
      ax.errorbar(x, mean, yerr=np.nan_to_num(half), fmt="o", capsize=3)
      ax.annotate(name, (x, mean), fontsize=7, xytext=(4, 4), textcoords="offset points")
    if NO_PRETRAINING in table:
      ax.axhline(table[NO_PRETRAINING][key][0], color="tab:red", lw=1, ls="--",
                 label="no pre-training")
      ax.legend(loc="lower right", fontsize=7)
    ax.set_xlabel(label)
    ax.set_ylabel(f"{COMPARISON.primary.label} (×100)")
    ax.set_xlim(left=0)
  fig.suptitle("Compression: accuracy against size and latency (mean ± 95% interval over seeds)")
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)


def setup_text(scale_name: str, scale: dict, dirs: dict | None = None) -> str:
  tasks = "; ".join(f"{t}: {s['seq_len']} tokens, scored on {s['eval']:,} validation examples"
                    for t, s in scale["tasks"].items())
  return (f"Scale `{scale_name}`: the teacher is configs/bert.py:runlocal (L2 H128, 2 heads, "
          f"8k pieces) pre-trained {scale['teacher_steps']:,} steps × 32 × 128 on the embedded "
          f"Wikipedia sample and WordNet's training glosses, once; DistilBERT (1 layer, from the "
          f"teacher's) and TinyBERT (1 layer, H64) are distilled from it {scale['student_steps']:,} "
          f"steps × 32 × 128 on the same data, once. Every row fine-tunes "
          f"{scale['finetune_epochs']} epochs on {scale['finetune_train']:,} training examples "
          f"(rate {scale['finetune_lr']}, BERT's classifier recipe) per task ({tasks}); "
          "TinyBERT's task stages each run the same epochs. Latency on the 2-core CPU, "
          f"{scale['latency_reps']} timed calls after 2."
          + common.pinned_text(scale, "configs/tinybert.py"))


def write_summary(results: list[dict], out: str, scale_name: str) -> str:
  """OUT/table.md (the scores in the report's layout, then size and latency), meta.json,
  scores.png (every score per row) and plot.png (the Pareto view); returns the markdown."""
  scale = SCALES[scale_name]
  constants = constant_scores(scale)
  degenerate = {}
  for r in results:
    degenerate.setdefault(r["row"], set()).update(r.get("degenerate", ()))
  text = report.markdown(results, COMPARISON, setup=setup_text(scale_name, scale),
                         constants=constants, degenerate=degenerate)
  text += "\n" + "\n".join(size_table(results))
  with open(os.path.join(out, "table.md"), "w") as f:
    f.write(text)
  with open(os.path.join(out, "meta.json"), "w") as f:
    json.dump(dict(primary_metric=f"{COMPARISON.primary_key} ({COMPARISON.primary.label})",
                   higher_is_better=True, constant_output=constants,
                   evaluation_examples={t: len(results[0]["examples"][t]["accuracy"])
                                        for t in scale["tasks"]},
                   seeds=sorted({r["seed"] for r in results}),
                   commits=sorted({r.get("commit", "?") for r in results}),
                   scale={k: v for k, v in scale.items()}), f, indent=1, default=str)
  report.plot(results, COMPARISON, constants, os.path.join(out, "scores.png"))
  pareto_plot(results, os.path.join(out, "plot.png"))
  return text


def main(argv):
  del argv
  f = flags.FLAGS
  scale = dict(SCALES[f.scale], name=f.scale, config_overrides=f.config_overrides)
  common.check_rows(f.rows, ROWS, lambda spec: None)
  out, workdirs = common.sweep_dirs("compression")
  dirs = pretrain(scale, workdirs)
  results = common.run_sweep(ROWS, f.rows, list(map(int, f.seeds)),
                             os.path.join(out, "results.jsonl"),
                             lambda name, spec, seed: run_row(name, spec, seed, scale, dirs))
  print(write_summary(results, out, f.scale))


if __name__ == "__main__":
  common.define_sweep_flags("compression", ROWS, SCALES)
  app.run(main)
