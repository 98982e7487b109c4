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

import os

from absl import app, flags

from bertfam_jax import config_lib
from bertfam_jax.data import wordnet
from experiments import common

SPANBERT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "configs", "spanbert.py")
NO_PRETRAINING = common.NO_PRETRAINING
SCORES = common.SCORES

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

def define_flags() -> None:
  """The command line (defined only when run as a script, so that importing this module beside
  another experiment defines no flag twice)."""
  common.define_sweep_flags("masking_schemes", ROWS, SCALES)
  flags.DEFINE_integer("pretrain_steps", 0, "Override the scale's pre-training steps.")


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
  config_lib.apply_overrides(config, scale.get("config_overrides", ()))
  return config


def run_row(name: str, overrides: dict | None, seed: int, scale: dict, workdirs: str,
            task: wordnet.ClassificationTask) -> dict:
  """Pre-trains one row (unless it is the no-pre-training floor), fine-tunes, returns scores."""
  workdir = (None if overrides is None else
             os.path.join(workdirs, common.workdir_name(name, seed)))
  return common.pretrain_and_score(name, pretrain_config(scale, overrides or {}, seed), seed,
                                   scale, workdir, task)


def markdown_table(table: list[dict], scale_name: str) -> str:
  lines = [f"Masking schemes at scale `{scale_name}`: WordNet supersense (45-way) validation "
           "scores, fine-tuned and by a linear probe on frozen features, mean ± std over seeds "
           "(×100).", "",
           "| masking scheme | seeds | fine-tuned accuracy | fine-tuned macro-F1 | fine-tuned MCC "
           "| probe accuracy | probe macro-F1 | paper columns (SQuAD 2.0, NewsQA, TriviaQA, Coref, "
           "MNLI, QNLI, GLUE) |",
           "|---|---|---|---|---|---|---|---|"]
  for row in table:
    cells = [common.mean_std(row[k]) for k in SCORES]
    lines.append(f"| {row['row']} | {row['seeds']} | " + " | ".join(cells) +
                 " | not available offline |")
  return "\n".join(lines) + "\n"


def write_summary(results: list[dict], out: str, scale_name: str) -> str:
  """Writes OUT/table.md and OUT/plot.png from `results`; returns the markdown. Also what
  `python -m experiments.launch summary` calls on the merged rows."""
  table = common.summarise(results, [name for name, _ in ROWS])
  markdown = markdown_table(table, scale_name)
  with open(os.path.join(out, "table.md"), "w") as f:
    f.write(markdown)
  common.plot(table, os.path.join(out, "plot.png"),
              f"Masking schemes ({scale_name}), mean ± std over seeds")
  return markdown


def main(argv):
  del argv
  f = flags.FLAGS
  scale = dict(SCALES[f.scale], config_overrides=f.config_overrides)
  if f.pretrain_steps:
    scale = {**scale, "pretrain": {**scale["pretrain"], "total_steps": f.pretrain_steps},
             "warmup_steps": min(scale["warmup_steps"], f.pretrain_steps // 2)}
  common.check_rows(f.rows, ROWS, lambda spec: pretrain_config(scale, spec, 0))
  out, workdirs = common.sweep_dirs("masking_schemes")
  task = common.supersense_task(scale)
  results = common.run_sweep(
      ROWS, f.rows, list(map(int, f.seeds)), os.path.join(out, "results.jsonl"),
      lambda name, overrides, seed: run_row(name, overrides, seed, scale, workdirs, task))
  print(write_summary(results, out, f.scale))


if __name__ == "__main__":
  define_flags()
  app.run(main)
