"""SpanBERT's comparison of masking schemes (Joshi et al., 2020, §6.1 "Masking Schemes", Table 6
of arXiv 1907.10529v3), pre-trained and fine-tuned offline.

Every row pre-trains the same model on the same data with the paper's ablation setup, BERT's
bi-sequence training with next-sentence prediction (the table's caption: "All the models are
based on bi-sequence training with NSP"), no span-boundary objective, 15% of the tokens masked,
changing only which units are masked:

  Subword Tokens    BERT's random pieces, 80/10/10 per token
  Whole Words       whole words (BERT's WWM), 80/10/10 per merged span
  Named Entities    50% named entities, 50% random whole words (SpanBERT NERSpanMaskingScheme);
                    entities from a WordNet gazetteer + capitalisation (data/spans.py)
  Noun Phrases      50% noun phrases, 50% random whole words; a WordNet-lexicon chunker
  Geometric Spans   SpanBERT's spans, lengths ~ Geo(0.2) clipped at 10 words
  No pre-training   the fine-tuning task from a random initialisation (the floor, not in the paper)

Downstream (../shared/DATA.md's offline task): WordNet gloss → supersense (45 classes;
`data/wordnet.py`), fine-tuned with BERT's classifier recipe, and a linear probe on the frozen
encoder's mean-pooled features; each scored by accuracy and by the gold label's log-likelihood
(what moves first at small scale, EXPERIMENTS.md §2) on the same validation examples; the
primary metric is the probe's accuracy (`common.PRIMARY`: the budgeting study behind it). All
four columns stand in for the paper's GLUE average; its QA and coreference columns need data
this project cannot download and are printed beside ours.

  # The cpu scale as committed under experiments/results/masking_schemes/cpu: 5 rows and the
  # floor × 5 seeds (about 2 hours on a 2-core CPU; 25 minutes a seed):
  python -m experiments.masking_schemes --scale=cpu --seeds=0,1,2,3,4
  # The budget check first: the baseline row and the floor (EXPERIMENTS.md §1):
  python -m experiments.masking_schemes --scale=cpu --rows="Subword Tokens,No pre-training"
  # The gpu scale, one command per seed (each ≤ 10 minutes on one H100; resumable; on a bare
  # GPU machine given .carry from experiments/gpu/prepare.sh):
  bash experiments/gpu/sweep.sh masking_schemes 0
"""

from __future__ import annotations

import os

from absl import app, flags

from bertfam_jax import config_lib, objectives
from experiments import common, report

SPANBERT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "configs", "spanbert.py")
NO_PRETRAINING = common.NO_PRETRAINING
BASELINE = "Subword Tokens"

# The sweep: (row name as in the paper, objective overrides). A plain list, so a launcher can
# run rows locally one after another or as separate jobs.
ROWS = [
    (BASELINE, dict(mask_scheme="token", replace_per="token")),
    ("Whole Words", dict(mask_scheme="whole_word", replace_per="span")),
    ("Named Entities", dict(mask_scheme="units", span_source="entities", replace_per="span")),
    ("Noun Phrases", dict(mask_scheme="units", span_source="noun_phrases", replace_per="span")),
    ("Geometric Spans", dict(mask_scheme="span", replace_per="span")),
    (NO_PRETRAINING, None),
]
_NAMES = [name for name, _ in ROWS]

# Joshi et al. 2020, Table 6 of arXiv 1907.10529v3 (development sets; F1 for the QA tasks,
# accuracy for MNLI and QNLI, the GLUE average), checked against two full-text copies of the
# paper (the ar5iv rendering and a markdown transcription); the issue calls it Table 5.
PAPER_COLUMNS = ("SQuAD 2.0", "NewsQA", "TriviaQA", "Coreference", "MNLI", "QNLI", "GLUE")
PAPER = {
    "Subword Tokens": (83.8, 72.0, 76.3, 77.7, 86.7, 92.5, 83.2),
    "Whole Words": (84.3, 72.8, 77.1, 76.6, 86.3, 92.8, 82.9),
    "Named Entities": (84.8, 72.7, 78.7, 75.6, 86.0, 93.1, 83.2),
    "Noun Phrases": (85.0, 73.0, 77.7, 76.7, 86.5, 93.2, 83.5),
    "Geometric Spans": (85.4, 73.0, 78.8, 76.4, 87.0, 93.3, 83.4),
}

# Pre-training size and fine-tuning budget per scale.
SCALES = {
    # The 2-core CPU: configs/spanbert.py:runlocal's model (H128 L2, 8k pieces) on the embedded
    # Wikipedia sample and the glosses of WordNet's training synsets, 1,000 steps of 32 × 128;
    # 4,000 training glosses, 2,000 validation ones.
    "cpu": dict(config_arg="runlocal", pretrain=dict(total_steps=1000, batch_size=32),
                peak_lr=1e-3, warmup_steps=100, data=dict(wordnet_glosses=True),
                finetune_train=4000, finetune_eval=2000, finetune_seq_len=32,
                finetune_epochs=3, finetune_lr=5e-4),
    # One H100 (not run yet: no GPU was lent to the session that built it): BERT-small (H256
    # L4) in bfloat16, 3,000 steps of 128 × 128 (49 M positions, ~10 passes over the corpus),
    # 20,000 training glosses; one command per seed.
    "gpu": dict(config_arg="runlocal",
                model=dict(config_lib.ENCODER_SIZES["small"], dtype="bfloat16"),
                pretrain=dict(total_steps=3000, batch_size=128), peak_lr=1e-3,
                warmup_steps=300, data=dict(wordnet_glosses=True),
                finetune_train=20_000, finetune_eval=2000, finetune_seq_len=48,
                finetune_epochs=3, finetune_lr=1e-4),
}


def define_flags() -> None:
  """The command line (defined only when run as a script, so that importing this module beside
  another experiment defines no flag twice)."""
  common.define_sweep_flags("masking_schemes", ROWS, SCALES)
  flags.DEFINE_integer("pretrain_steps", 0, "Override the scale's pre-training steps.")


def pretrain_config(scale: dict, overrides: dict, seed: int):
  """configs/spanbert.py at the scale's size with the paper's ablation setup (sentence pairs,
  NSP, no SBO) and the row's masking scheme."""
  config = config_lib.load_config(SPANBERT_CONFIG, scale["config_arg"])
  config.model.update(scale.get("model", {}))
  config.data.update(scale.get("data", {}), packing="sentence_pairs")
  config.seed = seed
  config.objective.update(sbo=False, sentence_task="nsp", **overrides)
  steps = scale["pretrain"]["total_steps"]
  config.train.update(scale["pretrain"], eval_every=max(1, steps // 4), checkpoint_every=steps,
                      log_every=max(1, steps // 20))
  config.optimizer.update(peak_lr=scale["peak_lr"], warmup_steps=scale["warmup_steps"])
  common.apply_pinned(config, scale)
  config_lib.apply_overrides(config, scale.get("config_overrides", ()))
  objectives.validate(config)
  return config


def run_row(name: str, overrides: dict | None, seed: int, scale: dict, workdirs: str,
            task) -> dict:
  """Pre-trains one row (the floor: nothing, the baseline row's model and tokenizer), then
  fine-tunes and probes it: the results.jsonl record."""
  if overrides is None:
    return common.pretrain_and_score(name, pretrain_config(scale, dict(ROWS)[BASELINE], seed),
                                     seed, scale, None, task, ())
  workdir = os.path.join(workdirs, common.workdir_name(name, seed))
  return common.pretrain_and_score(name, pretrain_config(scale, overrides, seed), seed, scale,
                                   workdir, task, ("mlm_accuracy",))


COMPARISON = report.Comparison(
    title="SpanBERT masking schemes",
    rows=_NAMES, baseline=BASELINE, floor=NO_PRETRAINING,
    groups=(("Table 6: masking schemes (bi-sequence training with NSP, no SBO)", _NAMES[:5]),
            ("Floor", _NAMES[5:])),
    columns=common.columns("GLUE"), primary_key=common.PRIMARY,
    paper={name: dict(zip(PAPER_COLUMNS, values)) for name, values in PAPER.items()},
    paper_columns=PAPER_COLUMNS,
    paper_source="Joshi et al. 2020, Table 6 of arXiv 1907.10529v3 (development sets: F1 for "
                 "SQuAD 2.0, NewsQA, TriviaQA, coreference; accuracy for MNLI, QNLI; the GLUE "
                 "average), numbers checked against two full-text copies. Ours stand in: "
                 "Supersense, fine-tuned and probed, for GLUE; nothing here stands in for the "
                 "QA and coreference columns",
    row_label="Masking scheme")


def setup_text(scale_name: str, scale: dict) -> str:
  """The scale as a paragraph of table.md."""
  pretrain = scale["pretrain"]
  seq_len = pretrain_config(scale, dict(ROWS)[BASELINE], 0).data.seq_len
  model = ", ".join(f"{k} {v}" for k, v in scale.get("model", {}).items())
  return (f"Scale `{scale_name}`: configs/spanbert.py:{scale['config_arg']}"
          f"{' (' + model + ')' if model else ''}, sentence pairs with NSP, no "
          f"SBO, 15% masked; every row pre-trains {pretrain['total_steps']:,} steps × "
          f"{pretrain['batch_size']} sequences × {seq_len} tokens (peak rate {scale['peak_lr']}, "
          f"{scale['warmup_steps']} warm-up steps; data: the embedded Wikipedia sample and the "
          f"glosses of WordNet's training synsets), then fine-tunes {scale['finetune_epochs']} "
          f"epochs on {scale['finetune_train'] or 'all'} training glosses (rate "
          f"{scale['finetune_lr']}, {scale['finetune_seq_len']} tokens) and is scored on "
          f"{scale['finetune_eval'] or 'all'} validation glosses; the probe is a softmax "
          "regression on the frozen encoder's mean-pooled features of the same examples."
          + common.pinned_text(scale, "configs/spanbert.py"))


def write_summary(results: list[dict], out: str, scale_name: str) -> str:
  """Writes OUT/table.md, meta.json, plot.png and curves.png from `results`; returns the
  markdown. Also what `python -m experiments.launch summary` calls on the merged rows."""
  scale = SCALES[scale_name]
  return common.write_report(results, out, COMPARISON, setup_text(scale_name, scale),
                             common.supersense_task(scale), scale)


def main(argv):
  del argv
  f = flags.FLAGS
  scale = dict(SCALES[f.scale], name=f.scale, config_overrides=f.config_overrides)
  if f.pretrain_steps:
    scale = {**scale, "pretrain": {**scale["pretrain"], "total_steps": f.pretrain_steps},
             "warmup_steps": min(scale["warmup_steps"], f.pretrain_steps // 2)}
  common.check_rows(f.rows, ROWS, lambda spec: pretrain_config(scale, spec, 0))
  out, workdirs = common.sweep_dirs("masking_schemes")
  task = common.supersense_task(scale)
  results = common.run_sweep(
      ROWS, f.rows, list(map(int, f.seeds)), os.path.join(out, "results.jsonl"),
      lambda name, overrides, seed: run_row(name, overrides, seed, scale, workdirs, task))
  print(common.write_report(results, out, COMPARISON, setup_text(f.scale, scale), task, scale))


if __name__ == "__main__":
  define_flags()
  app.run(main)
