"""SpanBERT's comparison of masking schemes (Joshi et al., 2020, §5.1, "Comparing span masking
schemes"), pre-trained and fine-tuned offline.

Every row pre-trains the same model on the same data with the same SpanBERT-style recipe (single
document blocks, no NSP, no SBO, 15% budget `ceil(0.15·#block)`, random tokens by corpus
frequency), changing only which units are masked, as the paper's table does:

  Subword Tokens    BERT's random pieces, 80/10/10 per token
  Whole Words       whole words (BERT's WWM), 80/10/10 per merged span
  Named Entities    50% named entities, 50% random whole words (SpanBERT NERSpanMaskingScheme);
                    entities from a WordNet gazetteer + capitalisation (data/spans.py)
  Noun Phrases      50% noun phrases, 50% random whole words; a WordNet-lexicon chunker
  Geometric Spans   SpanBERT's spans, lengths ~ Geo(0.2) clipped at 10 words
  No pre-training   the fine-tuning task from a random initialisation (a floor, not in the paper)

Downstream: the offline task of ../shared/DATA.md, WordNet gloss → supersense (45 classes;
`data/wordnet.py`), fine-tuned with BERT's classifier recipe; accuracy and macro-F1 on the
validation split, mean and spread over seeds. The paper's columns (SQuAD 2.0, NewsQA, TriviaQA,
coreference, MNLI, QNLI, GLUE) need data this project cannot download; the table says so.

  # About 40 minutes on a 2-core CPU (6 rows x 2 seeds), results committed under
  # experiments/results/masking_schemes/runlocal/:
  python -m experiments.masking_schemes --scale=runlocal
  # One GPU, about an hour per seed sweep:
  python -m experiments.masking_schemes --scale=gpu --seeds=0,1,2
  # A subset, e.g. as separate jobs on TPUs (rows are independent; finished rows are skipped):
  python -m experiments.masking_schemes --scale=gpu --rows="Geometric Spans" --seeds=3
"""

from __future__ import annotations

import json
import os
import time

from absl import app, flags
import jax
import numpy as np

from bertfam_jax import config_lib
from bertfam_jax.data import sources, tokenizers, wordnet
from bertfam_jax.finetune import classify, probe
from bertfam_jax.train import train

SPANBERT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "configs", "spanbert.py")
NO_PRETRAINING = "No pre-training"
# Reported scores: fine-tuned, and a linear probe on frozen mean-pooled features.
SCORES = ("accuracy", "macro_f1", "mcc", "probe_accuracy", "probe_macro_f1")

# The sweep: (row name as in the paper, objective overrides). A plain list, so a launcher can
# run rows locally one after another or as separate jobs.
ROWS = [
    ("Subword Tokens", dict(mask_scheme="token", replace_per="token")),
    ("Whole Words", dict(mask_scheme="whole_word", replace_per="span")),
    ("Named Entities", dict(mask_scheme="units", span_source="entities", replace_per="span")),
    ("Noun Phrases", dict(mask_scheme="units", span_source="noun_phrases", replace_per="span")),
    ("Geometric Spans", dict(mask_scheme="span", replace_per="span")),
    (NO_PRETRAINING, None),
]

# Pre-training size and fine-tuning budget per scale.
SCALES = {
    # 2-core CPU: the mini model (H128 L2), 400 steps of 32 x 128; 4,000 training glosses.
    "runlocal": dict(config_arg="runlocal", pretrain=dict(total_steps=400, batch_size=32),
                     peak_lr=2e-3, warmup_steps=40, finetune_train=4000, finetune_eval=2000,
                     finetune_seq_len=32, finetune_epochs=3, finetune_lr=5e-4),
    # One GPU: BERT-small (H256 L4), 20k steps of 128 x 128; the whole supersense task.
    "gpu": dict(config_arg="runlocal", size="small",
                pretrain=dict(total_steps=20_000, batch_size=128),
                peak_lr=1e-3, warmup_steps=1000, finetune_train=None, finetune_eval=None,
                finetune_seq_len=48, finetune_epochs=3, finetune_lr=1e-4),
}

_SCALE = flags.DEFINE_enum("scale", "runlocal", sorted(SCALES), "Sweep size.")
_ROWS = flags.DEFINE_list("rows", [name for name, _ in ROWS], "Rows to run (paper names).")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1"], "Seeds: pre-training and fine-tuning.")
_OUT = flags.DEFINE_string("out", "", "Results directory (default experiments/results/"
                           "masking_schemes/<scale>).")
_STEPS = flags.DEFINE_integer("pretrain_steps", 0, "Override the scale's pre-training steps.")
_WORKDIRS = flags.DEFINE_string("workdirs", "", "Pre-training workdirs (default <out>/runs; "
                                "not committed).")


def pretrain_config(scale: dict, overrides: dict, seed: int):
  """configs/spanbert.py at the scale's size, SBO off, the row's masking scheme."""
  config = config_lib.load_config(SPANBERT_CONFIG, scale["config_arg"])
  if "size" in scale:
    config.model.update(config_lib.ENCODER_SIZES[scale["size"]])
  config.seed = seed
  config.objective.update(sbo=False, **overrides)
  config.train.update(scale["pretrain"], eval_every=scale["pretrain"]["total_steps"],
                      checkpoint_every=scale["pretrain"]["total_steps"],
                      log_every=max(1, scale["pretrain"]["total_steps"] // 10))
  config.optimizer.update(peak_lr=scale["peak_lr"], warmup_steps=scale["warmup_steps"])
  return config


def run_row(name: str, overrides: dict | None, seed: int, scale: dict, workdirs: str,
            task: wordnet.ClassificationTask) -> dict:
  """Pre-trains one row (unless it is the no-pre-training floor), fine-tunes, returns scores."""
  start = time.time()
  reference = pretrain_config(scale, overrides or {}, seed)
  encoder_params, tokenizer, model_config = None, None, reference.model
  if overrides is not None:
    workdir = os.path.join(workdirs, f"{name.lower().replace(' ', '_')}-seed{seed}")
    train.run(reference, workdir)
    run_config, tokenizer, encoder_params = classify.load_pretrained_encoder(workdir)
    model_config = run_config.model
  pretrain_seconds = time.time() - start
  if tokenizer is None:  # The floor uses the same tokenizer as the pre-trained rows.
    tokenizer = tokenizers.load_or_train(reference, sources.get_documents(reference.data, "train"))
  encode = lambda examples: {**classify.encode_texts(tokenizer, examples.texts,
                                                     scale["finetune_seq_len"]),
                             "label": examples.labels}
  train_data, eval_data = encode(task.train), encode(task.validation)
  num_classes = len(task.label_names)
  result = classify.fine_tune(model_config, encoder_params, train_data, eval_data,
                              num_classes=num_classes, epochs=scale["finetune_epochs"],
                              peak_lr=scale["finetune_lr"], seed=seed)
  if encoder_params is None:  # the probe of the floor reads a randomly initialised encoder
    encoder_params = classify.init_params(
        classify.build_model(model_config, num_classes), scale["finetune_seq_len"],
        jax.random.key(seed))["params"]["encoder"]
  probed = probe.linear_probe(model_config, encoder_params, train_data, eval_data,
                              num_classes=num_classes)
  return dict(row=name, seed=seed, accuracy=result["accuracy"], macro_f1=result["macro_f1"],
              mcc=result["mcc"], probe_accuracy=probed["accuracy"],
              probe_macro_f1=probed["macro_f1"], finetune_steps=result["steps"],
              pretrain_seconds=round(pretrain_seconds, 1),
              total_seconds=round(time.time() - start, 1))


def summarise(results: list[dict]) -> list[dict]:
  """Per row in ROWS order: mean and sample standard deviation of each score over seeds."""
  table = []
  for name, _ in ROWS:
    runs = [r for r in results if r["row"] == name]
    if not runs:
      continue
    row = dict(row=name, seeds=len(runs))
    for key in SCORES:
      values = np.array([r[key] for r in runs]) * 100
      row[key] = (values.mean(), values.std(ddof=1) if len(values) > 1 else float("nan"))
    table.append(row)
  return table


def markdown_table(table: list[dict], scale_name: str) -> str:
  lines = [f"Masking schemes at scale `{scale_name}`: WordNet supersense (45-way) validation "
           "scores, fine-tuned and by a linear probe on frozen features, mean ± std over seeds "
           "(×100).", "",
           "| masking scheme | seeds | fine-tuned accuracy | fine-tuned macro-F1 | fine-tuned MCC "
           "| probe accuracy | probe macro-F1 | paper columns (SQuAD 2.0, NewsQA, TriviaQA, Coref, "
           "MNLI, QNLI, GLUE) |",
           "|---|---|---|---|---|---|---|---|"]
  for row in table:
    cells = [f"{row[k][0]:.1f} ± {row[k][1]:.1f}" for k in SCORES]
    lines.append(f"| {row['row']} | {row['seeds']} | " + " | ".join(cells) +
                 " | not available offline |")
  return "\n".join(lines) + "\n"


def plot(table: list[dict], path: str, scale_name: str) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  names = [row["row"] for row in table]
  fig, ax = plt.subplots(figsize=(8, 4))
  x = np.arange(len(names))
  for offset, key in ((-0.2, "accuracy"), (0.2, "probe_accuracy")):
    ax.bar(x + offset, [row[key][0] for row in table], 0.4,
           yerr=[np.nan_to_num(row[key][1]) for row in table], capsize=3,
           label=key.replace("_", " ").replace("accuracy", "accuracy (fine-tuned)"
                                               if key == "accuracy" else "accuracy"))
  ax.set_xticks(x, names, rotation=20, ha="right")
  ax.set_ylabel("supersense validation (×100)")
  ax.set_title(f"Masking schemes ({scale_name}), mean ± std over seeds")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main(argv):
  del argv
  scale = SCALES[_SCALE.value]
  if _STEPS.value:
    scale = {**scale, "pretrain": {**scale["pretrain"], "total_steps": _STEPS.value},
             "warmup_steps": min(scale["warmup_steps"], _STEPS.value // 2)}
  out = _OUT.value or os.path.join("experiments", "results", "masking_schemes", _SCALE.value)
  workdirs = _WORKDIRS.value or os.path.join(out, "runs")
  os.makedirs(out, exist_ok=True)
  unknown = set(_ROWS.value) - {name for name, _ in ROWS}
  if unknown:
    raise app.UsageError(f"Unknown rows {sorted(unknown)}; choose from {[n for n, _ in ROWS]}.")
  results_path = os.path.join(out, "results.jsonl")
  results = []
  if os.path.exists(results_path):
    with open(results_path) as f:
      results = [json.loads(line) for line in f]
  done = {(r["row"], r["seed"]) for r in results}
  task = wordnet.supersense_task(max_examples=None)
  task = task._replace(
      train=_head(task.train, scale["finetune_train"]),
      validation=_head(task.validation, scale["finetune_eval"]))
  # Seeds outermost: an interrupted sweep still has every row for the seeds it finished.
  for seed in map(int, _SEEDS.value):
    for name, overrides in ROWS:
      if name not in _ROWS.value or (name, seed) in done:
        continue
      result = run_row(name, overrides, seed, scale, workdirs, task)
      print(json.dumps(result), flush=True)
      results.append(result)
      with open(results_path, "a") as f:
        f.write(json.dumps(result) + "\n")
  table = summarise(results)
  with open(os.path.join(out, "table.md"), "w") as f:
    f.write(markdown_table(table, _SCALE.value))
  plot(table, os.path.join(out, "plot.png"), _SCALE.value)
  print(markdown_table(table, _SCALE.value))


def _head(examples: wordnet.Examples, limit: int | None) -> wordnet.Examples:
  """The first `limit` examples (the split is already in a fixed hash order)."""
  if limit is None:
    return examples
  return wordnet.Examples(examples.texts[:limit], examples.labels[:limit])


if __name__ == "__main__":
  app.run(main)
