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

  # Table 4, ★ and the floor × 3 seeds on a 2-core CPU (about 80 minutes; committed under
  # experiments/results/t5_objectives/cpu):
  python -m experiments.t5_objectives --scale=cpu --rows='Prefix language modeling,\
"BERT-style (Devlin et al., 2018)",Deshuffling,★ Replace corrupted spans,No pre-training'
  # One row, e.g. on its own machine:
  python -m experiments.t5_objectives --scale=gpu --rows="Span length 3" --seeds=0
"""

from __future__ import annotations

import collections
import math
import os
import time

from absl import app, flags
import numpy as np

from bertfam_jax import config_lib, objectives
from bertfam_jax import workdir as workdir_lib
from bertfam_jax.data import sources, tokenizers
from bertfam_jax.finetune import run as finetune_run
from bertfam_jax.finetune import seq2seq
from bertfam_jax.finetune import text_tasks
from bertfam_jax.objectives import t5 as t5_objective
from bertfam_jax.train import metrics as metrics_lib
from bertfam_jax.train import train
from experiments import common, report

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
    # MASS (Song et al., 2019) itself, not the paper's "MASS-style": one contiguous fragment of
    # half of each segment, masked 80/10/10 in the inputs, predicted alone by a decoder that does
    # not attend to the [MASK]ed inputs (configs/mass.py).
    ("MASS fragment (Song et al., 2019)", dict(
        noise_mask="mass_fragment", noise_density=0.5,
        inputs_encoding="noise_token_to_sentinel_keep_or_random", random_prob=0.1, keep_prob=0.1,
        decoder_sees_masked=False, targets_encoding="drop_nonnoise_tokens",
        concat_documents=False, targets="measured")),
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
    ("BART and MASS noising (not in the paper's tables)", _NAMES[13:16]),
    ("Floor", _NAMES[16:17]),
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

SCALES = {
    # The 2-core CPU, about 80 minutes for Table 4's three rows, ★ and the floor × 3 seeds
    # (measured: docs/results.md). T5 v1.0 mini (configs/t5.py:runlocal: 2 + 2 layers, d_model
    # 128) with 4,000 SentencePiece pieces + 100 sentinels and dropout 0, pre-trained 1,200 steps
    # of 32 × 64 inputs (2.5 M input tokens, about one pass) on the embedded Wikipedia sample
    # and the glosses of WordNet's training synsets; each task then fine-tuned 100 steps × 32 on
    # its first 4,000 training examples and scored on 2,000 validation ones, with the gold
    # targets' loss. The budgeting study behind these numbers: 400 pre-training steps on the
    # Wikipedia sample alone, or 400 fine-tuning steps, left the floor level with ★.
    "cpu": dict(config_arg="runlocal", batch_size=32, seq_len=64, pretrain_steps=1200,
                warmup_steps=100, peak_lr=0.02, eval_every=300,
                # The committed cpu records ran before the bucket tables took mesh-tf's init,
                # a prefix LM its bidirectional buckets and fine-tuning t5x's dropout 0.1: this
                # scale keeps HF's init, t5x's causal buckets and the pre-training's dropout 0
                # in fine-tuning (configs/t5.py's defaults are the paper code's).
                model=dict(vocab_size=4224, dropout=0.0, relpos_bias_init="normal",
                           prefix_lm_buckets="causal"), tokenizer=dict(vocab_size=4000),
                data=dict(wordnet_glosses=True), finetune_dropout=0.0,
                finetune_steps=100, finetune_batch=32, finetune_lr=1e-2,
                finetune_inputs=64, finetune_targets=32, finetune_train=4000,
                finetune_eval=2000),
    # One H100 (not measured: no GPU was lent to the sessions that built it; run with
    # `bash experiments/gpu/sweep.sh t5_objectives SEED`, one seed per command): a 4 + 4-layer,
    # d_model 256 T5 in bfloat16, 1,200 steps of 64 × 256 inputs (19.7 M input tokens: 8 passes over the 2.4 M
    # tokens of the Wikipedia sample and the training glosses), each task fine-tuned 500 steps
    # × 64 on all its training examples and scored on 2,000 validation ones.
    "gpu": dict(config_arg="runlocal", batch_size=64, seq_len=256, pretrain_steps=1200,
                warmup_steps=100, peak_lr=0.01, eval_every=300,
                model=dict(hidden=256, layers=4, decoder_layers=4, heads=4, head_dim=64, mlp=1024,
                           dtype="bfloat16"),
                data=dict(wordnet_glosses=True),
                finetune_steps=500, finetune_batch=64, finetune_lr=1e-3, finetune_inputs=128,
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
  config.data.update(scale.get("data", {}))
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
  (Adafactor at a constant rate, dropout 0.1 unless the scale pins `finetune_dropout`, greedy
  decoding) for `finetune_steps` updates."""
  config = config_lib.finetune_config()
  config.seed = seed
  config.optimizer.peak_lr = scale["finetune_lr"]
  config.finetune.update(
      task=task.name, max_seq_len=scale["finetune_inputs"], dropout=scale.get("finetune_dropout"),
      targets_length=min(task.max_target_tokens, scale["finetune_targets"]),
      max_train_examples=scale["finetune_train"] or 0,
      max_eval_examples=scale["finetune_eval"] or 0)
  config.train.update(batch_size=scale["finetune_batch"], eval_batch_size=scale["finetune_batch"],
                      total_steps=scale["finetune_steps"], log_every=10_000)
  return finetune_run.resolved_config(config, init_config)


def downstream_scores(init_config, params, tokenizer, scale: dict,
                      seed: int) -> tuple[dict, dict]:
  """Fine-tunes a copy of `params` (None: a fresh initialisation) on every task
  (`finetune.run.fine_tune`: the one train loop).

  Returns:
    metrics: {task/metric: score in [0, 1], task/target_loss: the gold targets' teacher-forced
      loss (nats per token), task/distinct: distinct predictions (a degenerate run emits 1-3)};
    examples: {task: {metric: [examples] scores, target_nll: [examples] nats per token}}, on
      the same evaluation examples for every row: what the paired bootstrap resamples.
  """
  metrics, examples = {}, {}
  for _, task_name, metric, _ in TASKS:
    task = text_tasks.get(task_name)
    config = finetune_config(init_config, task, scale, seed)
    config.finetune.from_scratch = params is None
    result = finetune_run.fine_tune(config, tokenizer, params)
    predictions = result["predictions"]
    metrics[f"{task_name}/{metric}"] = float(np.mean([p["scores"][metric] for p in predictions]))
    metrics[f"{task_name}/target_loss"] = result["scores"]["target_loss"]
    metrics[f"{task_name}/distinct"] = result["distinct_predictions"]
    examples[task_name] = {metric: [round(p["scores"][metric], 4) for p in predictions],
                           "target_nll": [round(p["target_nll"], 4) for p in predictions]}
  return metrics, examples


def run_row(name: str, spec: dict | None, seed: int, scale: dict, workdirs: str, *,
            make_config=None, floor_spec=None) -> dict:
  """Pre-trains one row (unless it is the floor) and fine-tunes it on every task.
  `make_config(scale, spec, seed)`: the row's pre-training config (default `pretrain_config`);
  `floor_spec`: the spec whose model and tokenizer the floor takes (default the ★ row's).

  Returns the results.jsonl record (`experiments/report.py`): row, seed, scale, commit,
  metrics, examples, degenerate (tasks with at most DEGENERATE distinct predictions), the
  tokens it saw (`seen`), targets_length, pretrain {eval_accuracy, eval_loss, tokens_per_sec,
  curve} and timings."""
  start = time.time()
  make_config = make_config or pretrain_config
  if spec is None:  # the floor: the baseline row's model and tokenizer, nothing pre-trained
    config = make_config(scale, floor_spec or dict(ROWS)[BASELINE], seed)
    tokenizer = tokenizers.load_or_train(config, sources.get_documents(config.data, "train"))
    params, pretrain, saw = None, {}, dict(input_tokens=0, target_tokens=0)
  else:
    config = make_config(scale, spec, seed)
    workdir = os.path.join(workdirs, common.workdir_name(name.lstrip("★ "), seed))
    train.run(config, workdir)
    config, tokenizer, params = workdir_lib.load(workdir)
    pretrain = dict(common_eval(workdir), curve=curve(workdir))
    saw = dict(seen(workdir, config), targets_length=config.objective.targets_length)
  pretrain_seconds = time.time() - start
  metrics, examples = downstream_scores(config, params, tokenizer, scale, seed)
  degenerate = [task for _, task, _, _ in TASKS if metrics[f"{task}/distinct"] <= DEGENERATE]
  return dict(row=name, seed=seed, scale=scale["name"], commit=common.commit(), **saw,
              metrics=metrics, degenerate=degenerate, pretrain=pretrain,
              pretrain_seconds=round(pretrain_seconds, 1),
              total_seconds=round(time.time() - start, 1), examples=examples)


# A fine-tuned model with at most this many distinct predictions emits a constant, not an answer.
DEGENERATE = 3


def seen(workdir: str, config) -> dict:
  """What the row's pre-training saw, from its logged steps: input and target tokens (the
  batches' filled positions × steps) and the share of its examples whose targets were cut."""
  records = [r for r in metrics_lib.read_records(workdir) if "input_fill" in r]
  mean = lambda key: float(np.mean([r[key] for r in records if r.get(key) is not None]))  # noqa: E731
  rows = config.train.batch_size * config.train.total_steps
  return dict(input_tokens=round(mean("input_fill") * config.data.seq_len * rows),
              target_tokens=round(mean("target_fill") * config.objective.targets_length * rows),
              targets_cut_share=mean("targets_cut"))


def curve(workdir: str) -> dict:
  """The pre-training curve of a workdir: training loss at each logged step and the held-out
  accuracy on the row's own targets at each evaluation."""
  records = metrics_lib.read_records(workdir)
  train_records = [r for r in records if "loss" in r]
  evals = [r for r in records if "eval_t5_accuracy" in r]
  return dict(steps=[r["step"] for r in train_records],
              loss=[round(r["loss"], 4) for r in train_records],
              eval_steps=[r["step"] for r in evals],
              eval_accuracy=[round(r["eval_t5_accuracy"], 4) for r in evals])


def common_eval(workdir: str) -> dict:
  """The last held-out pre-training accuracy and the median training throughput of a workdir."""
  last = common.final_eval_metrics(workdir)
  return dict(eval_accuracy=last.get("t5_accuracy"), eval_loss=last.get("t5_loss"),
              tokens_per_sec=common.median_throughput(workdir))


# -------------------------------------------------------------------------------------- report

_METRIC_LABELS = dict(accuracy="acc", exact="EM", rouge2="ROUGE-2")
# The primary metric: Define's gold log-likelihood (−loss), compared with the paper's CNNDM. At
# the cpu scale greedy scores cannot tell pre-training from none (supersense: 39.7% after 400
# pre-training steps, 42.1% with none; docs/results.md), while the gold targets' loss can.
PRIMARY = "wordnet_define/target_loss"
COMPARISON = report.Comparison(
    title="T5 objective comparison",
    rows=_NAMES, baseline=BASELINE, floor=NO_PRETRAINING, groups=TABLE_GROUPS,
    columns=(*(report.Column(f"{label} {_METRIC_LABELS[metric]}", task, metric, paper)
               for label, task, metric, paper in TASKS),
             *(report.Column(f"{label} log-lik", task, "target_nll", paper)
               for label, task, _, paper in TASKS)),
    primary_key=PRIMARY,
    paper={name: dict(zip(PAPER_COLUMNS, values)) for name, values in PAPER.items()},
    paper_columns=PAPER_COLUMNS,
    paper_source="Raffel et al. 2020, validation scores of Tables 4-7 (the ★ row and the floor "
                 "from Table 1; spec t5_objectives.md §1). Ours stand in: Supersense for GLUE, "
                 "Definition QA for SQuAD, Define for CNNDM")


def constant_scores(scale: dict, tokenizer=None) -> dict[str, float]:
  """The best-known constant outputs on the scale's evaluation examples: {task: score in [0, 1]
  of the most common target of its training examples (supersense: the majority class),
  task/target_nll: the gold targets' loss under one distribution, their training targets'
  token frequencies (`common.unigram_nll`; tokenized as fine-tuning does: cut at its targets
  length, EOS included)}. `tokenizer`: default the floor's (`floor_tokenizer`)."""
  tokenizer = tokenizer or floor_tokenizer(scale)
  scores = {}
  for _, task_name, metric, _ in TASKS:
    task = text_tasks.get(task_name)
    train_examples = task.load(task.train_split, max_examples=scale["finetune_train"])
    counts = collections.Counter(e["targets"] for e in train_examples)
    constant = max(counts.items(), key=lambda item: (item[1], item[0]))[0]
    evaluation = task.load(task.eval_split, max_examples=scale["finetune_eval"])
    scores[task_name] = float(np.mean(text_tasks.example_scores(
        task, evaluation, [constant] * len(evaluation))[metric]))
    length = min(task.max_target_tokens, scale["finetune_targets"])
    train_ids, eval_ids = (seq2seq.encode_texts(tokenizer, [e["targets"] for e in examples],
                                                length)
                           for examples in (train_examples, evaluation))
    scores[f"{task_name}/target_nll"] = common.unigram_nll(
        [row[row != 0] for row in train_ids], [row[row != 0] for row in eval_ids],
        tokenizer.vocab_size)
  return scores


def floor_tokenizer(scale: dict) -> tokenizers.Tokenizer:
  """The tokenizer of the scale's floor, the ★ row's (trained once and cached)."""
  config = pretrain_config(scale, dict(ROWS)[BASELINE], seed=0)
  return tokenizers.load_or_train(config, sources.get_documents(config.data, "train"))


def setup_text(scale_name: str, scale: dict) -> str:
  """The scale as a paragraph of table.md."""
  model = ", ".join(f"{k} {v}" for k, v in scale.get("model", {}).items())
  glosses = scale.get("data", {}).get("wordnet_glosses")
  return (f"Scale `{scale_name}`: configs/t5.py:{scale['config_arg']} ({model or 'as configured'}"
          f"); every row pre-trains {scale['pretrain_steps']} steps × {scale['batch_size']} "
          f"sequences × {scale.get('seq_len', 'configured')} inputs (peak rate "
          f"{scale['peak_lr']}, {scale['warmup_steps']} warm-up steps; data: the embedded "
          f"Wikipedia sample{' and the glosses of WordNet’s training synsets' if glosses else ''}"
          f"), then each task fine-tunes "
          f"{scale['finetune_steps']} steps × {scale['finetune_batch']} at "
          f"{scale['finetune_lr']} (dropout {scale.get('finetune_dropout', 0.1)}) on "
          f"{scale['finetune_train'] or 'all'} training examples and "
          f"is scored on {scale['finetune_eval'] or 'all'} validation examples (greedy decoding).")


def write_summary(results: list[dict], out: str, scale_name: str) -> str:
  """Writes OUT/table.md, OUT/meta.json, OUT/plot.png and OUT/curves.png from `results`
  (`experiments/report.py`); returns the markdown. Also what `python -m experiments.launch
  summary` calls on the merged rows."""
  scale = SCALES[scale_name]
  return report.write(results, COMPARISON, out, setup=setup_text(scale_name, scale),
                      constants=constant_scores(scale), scale=scale)


def main(argv):
  del argv
  f = flags.FLAGS
  scale = dict(SCALES[f.scale], name=f.scale, config_overrides=f.config_overrides)
  common.check_rows(f.rows, ROWS, lambda spec: pretrain_config(scale, spec, 0))
  out, workdirs = common.sweep_dirs("t5_objectives")
  seeds = list(map(int, f.seeds))
  results = common.run_sweep(
      ROWS, f.rows, seeds, os.path.join(out, "results.jsonl"),
      lambda name, spec, seed: run_row(name, spec, seed, scale, workdirs))
  print(write_summary(results, out, f.scale))


if __name__ == "__main__":
  define_flags()
  app.run(main)
