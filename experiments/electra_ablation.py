"""ELECTRA's efficiency analysis (Clark et al., 2020, §3.5 / Table 5): where does ELECTRA's gain
over BERT come from? Pre-trained at equal compute and fine-tuned offline.

Every row pre-trains the same discriminator-sized encoder on the same data (`configs/electra.py`:
ExampleBuilder segments, no NSP) with the same optimizer, changing only `config.objective`:

  ELECTRA          replaced-token detection over every token (λ = 50)
  All-Tokens MLM   the discriminator predicts the original of EVERY token of the generator-filled
                   input, through a copy gate (variant all_tokens_mlm)
  Replace MLM      MLM on the masked positions of the generator-filled input instead of [MASK]
                   (variant replace_mlm)
  ELECTRA 15%      detection loss on the masked (15%) positions only (λ = 50)
  BERT             masked LM, BERT's 80/10/10 per token, dynamic masks, 20 predictions at 128
                   tokens, no NSP, no generator (objectives/mlm.py)
  No pre-training  the fine-tuning task from a random initialisation (a floor, not in the paper)

λ (`objective.discriminator_weight`) is 50 for the two detection rows, as in the paper; the two
MLM variants use 1.0, since their discriminator-side loss is an MLM cross-entropy on BERT's scale
(λ = 50 balances a binary loss of ~0.1-0.4 nats against the generator's ~7; on an MLM loss it
would let the discriminator's gradient swamp the generator's in the embeddings they share).

Equal compute: the budget is the ELECTRA row's training FLOPs (`objectives.get(...).flops_per_
token`, both networks) × batch × seq_len × the scale's steps; every row gets round(budget /
(its FLOPs per token × batch × seq_len)) steps, its warmup scaled in proportion. BERT, with no
generator, gets more steps; All-Tokens MLM, with a full-vocabulary head at every token, fewer.

Downstream (../shared/DATA.md's offline task): WordNet gloss → supersense (45 classes;
`data/wordnet.py`), fine-tuned with BERT's classifier recipe on the checkpoint's `encoder` (the
discriminator for the ELECTRA rows), and a linear probe on its frozen mean-pooled features; each
scored by accuracy and by the gold label's log-likelihood on the same validation examples, in
the protocol of EXPERIMENTS.md (`experiments/common.py`, `experiments/report.py`). The paper's
column is its GLUE dev score (Table 5), which all four columns stand in for; the primary metric
is the probe's accuracy (`common.PRIMARY`).

  # The cpu scale, 5 rows and the floor × 3 seeds on a 2-core CPU (results under
  # experiments/results/electra_ablation/cpu):
  python -m experiments.electra_ablation --scale=cpu
  # The budget check first: the ELECTRA row and the floor (EXPERIMENTS.md §1):
  python -m experiments.electra_ablation --scale=cpu --rows="ELECTRA,No pre-training"
  # One H100, one command per seed (about 7 minutes each; resumable; on a bare GPU machine
  # given .carry from experiments/gpu/prepare.sh):
  bash experiments/gpu/sweep.sh electra_ablation 0
  # A smoke run into a scratch directory:
  python -m experiments.electra_ablation --rows=ELECTRA --seeds=0 --pretrain_steps=20 \\
      --out=/tmp/electra_smoke
  # ELECTRA-Base at the released recipe (512 tokens, batch 256, 766k steps; TPU pods, not run):
  python -m experiments.electra_ablation --scale=paper --rows=ELECTRA --seeds=0 \\
      --config_overrides=data.tfds_data_dir=$TFDS_DATA_DIR
"""

from __future__ import annotations

import os

from absl import app, flags

from bertfam_jax import config_lib, objectives
from experiments import common, report

ELECTRA_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "configs", "electra.py")
NO_PRETRAINING = common.NO_PRETRAINING
REFERENCE_ROW = "ELECTRA"

# The sweep: (row name as in the paper, objective overrides). Overrides update configs/electra.py's
# objective; an entry with name='mlm' replaces it by config_lib.mlm_objective(**overrides). A plain
# list, so a launcher can run rows locally one after another or as separate jobs.
ROWS = [
    ("ELECTRA", dict(variant="electra")),
    ("All-Tokens MLM", dict(variant="all_tokens_mlm", discriminator_weight=1.0)),
    ("Replace MLM", dict(variant="replace_mlm", discriminator_weight=1.0)),
    ("ELECTRA 15%", dict(variant="electra_15")),
    ("BERT", dict(name="mlm", mask_style="bert", mask_scheme="token", masking="dynamic",
                  sentence_task="", max_predictions=20)),
    (NO_PRETRAINING, None),
]

# Clark et al. 2020, Table 5 ("Compute-efficiency experiments"), GLUE dev score; checked against
# a full-text copy of the paper and its §3.5 text ("Replace MLM slightly outperforms BERT").
PAPER_GLUE = {"ELECTRA": 85.0, "All-Tokens MLM": 84.3, "Replace MLM": 82.4, "ELECTRA 15%": 82.4,
              "BERT": 82.2}

# Pre-training size and fine-tuning budget per scale; `electra_steps` are the ELECTRA row's steps
# (the compute budget), `warmup_steps` its warmup.
SCALES = {
    # 2-core CPU: configs/electra.py:runlocal (discriminator H128 L2, generator H32, sampling
    # temperature 3: the runlocal-only deviation, docs/results.md) on the embedded Wikipedia
    # sample and the glosses of WordNet's training synsets, batch 32 × 128, 600 ELECTRA steps
    # (the other rows at equal FLOPs); 4,000 training glosses, 2,000 validation ones. Sized on
    # the idle CPU (2026-11-26, 54d415b): the ELECTRA row pre-trained in 210 s and fine-tuned and
    # probed in 29 s, so the 15 pre-trained runs take ~60 minutes (1,000 steps: ~95, over
    # EXPERIMENTS.md's 90); its probe 37.2% against the floor's 31.2% (seed 0). Peak rate 5e-4,
    # ELECTRA-Small's (configs/electra.py): the first sweep's 1e-3 (records of 6c00397) left seed
    # 1's discriminator at the base rate; rerun 2026-11-28 at ec2847f, seed 1 at 1e-3 ended with
    # held-out recall 0.2% and probe 25.5%, at 5e-4 recall 7.7% and probe 35.4% (the floor's
    # seeds 30.2-31.2%).
    "cpu": dict(config_arg="runlocal", batch_size=32, electra_steps=600, peak_lr=5e-4,
                warmup_steps=100, data=dict(wordnet_glosses=True), finetune_train=4000,
                finetune_eval=2000, finetune_seq_len=32, finetune_epochs=3, finetune_lr=5e-4),
    # One H100: an ELECTRA-Small-like discriminator 4 layers deep (H256 A4 FFN1024, 128-wide
    # embedding; generator H64, 4 layers), batch 128 x 128 on the embedded corpus (8k-piece
    # vocabulary), float32 (TF32 matmuls); 20,000 training glosses. Measured on one H100 (jax
    # 0.11.2): ELECTRA ran at 1.1-1.6M tokens/s in the loop (~80 steps/s), BERT at ~1.8M; a
    # 600-step sweep took 52-99 s per row with compile, fine-tuning and probe. That sweep used 60
    # warmup steps and every row collapsed to the prior (BERT at the unigram plateau even after
    # 5,450 steps); the same post-LN model learns with 300 warmup steps (BERT MLM 14.0% held out
    # after 2,000 steps, same GPU). Hence 10% warmup and 2,000 ELECTRA steps, estimated from
    # those rates at about 7 minutes per seed (not yet measured at this size), with the glosses.
    "gpu": dict(config_arg="runlocal", batch_size=128, electra_steps=2000, peak_lr=1e-3,
                warmup_steps=200, data=dict(wordnet_glosses=True),
                model=dict(hidden=256, layers=4, heads=4, mlp=1024, embedding_size=128),
                finetune_train=20_000, finetune_eval=4000, finetune_seq_len=48,
                finetune_epochs=3, finetune_lr=1e-4),
    # ELECTRA-Base at configs/electra.py:base (512 tokens, batch 256, 766k steps, lr 2e-4, 10k
    # warmup; Wikipedia from TFDS); BERT's 80 predictions at 512 tokens; the whole task. Documents
    # the configuration: TPU-pod scale, not run here.
    "paper": dict(config_arg="base", batch_size=256, electra_steps=766_000, peak_lr=2e-4,
                  warmup_steps=10_000, checkpoint_every=10_000, eval_every=10_000,
                  bert_max_predictions=80, finetune_train=None, finetune_eval=None,
                  finetune_seq_len=64, finetune_epochs=3, finetune_lr=1e-4),
}

def define_flags() -> None:
  """The command line (defined only when run as a script, so that importing this module beside
  another experiment defines no flag twice)."""
  common.define_sweep_flags("electra_ablation", ROWS, SCALES)
  flags.DEFINE_integer("pretrain_steps", 0, "Override the scale's ELECTRA steps (the budget; "
                       "the other rows follow at equal FLOPs).")


# ------------------------------------------------------------------------------------- configs


def base_config(scale: dict, seed: int):
  """configs/electra.py at the scale's size, batch and optimizer; the objective still ELECTRA's."""
  config = config_lib.load_config(ELECTRA_CONFIG, scale["config_arg"])
  config.model.update(scale.get("model", {}))
  config.data.update(scale.get("data", {}))
  config.seed = seed
  config.train.batch_size = scale["batch_size"]
  config.optimizer.peak_lr = scale["peak_lr"]
  common.apply_pinned(config, scale)
  config_lib.apply_overrides(config, scale.get("config_overrides", ()))
  return config


def set_objective(config, overrides: dict, scale: dict) -> None:
  """Replaces (name='mlm') or updates (an ELECTRA variant) `config.objective` in place."""
  if overrides.get("name", "electra") == "electra":
    config.objective.update(overrides)
  else:
    config.objective = config_lib.mlm_objective(**overrides)
    if "bert_max_predictions" in scale:
      config.objective.max_predictions = scale["bert_max_predictions"]


def flops_per_token(config) -> float:
  """Training FLOPs per token of `config`'s objective (both networks for ELECTRA)."""
  return objectives.get(config.objective.name).flops_per_token(config)


def equal_compute_steps(config, scale: dict) -> int:
  """Steps of `config` (same batch and length) that spend the ELECTRA row's training FLOPs."""
  reference = base_config(scale, config.seed)
  set_objective(reference, dict(ROWS)[REFERENCE_ROW], scale)
  return max(1, round(scale["electra_steps"] * flops_per_token(reference) /
                      flops_per_token(config)))


def pretrain_config(scale: dict, overrides: dict, seed: int):
  """The row's full pre-training config: its objective, its equal-compute steps and warmup."""
  config = base_config(scale, seed)
  set_objective(config, overrides, scale)
  steps = equal_compute_steps(config, scale)
  warmup = round(scale["warmup_steps"] * steps / scale["electra_steps"])
  config.optimizer.warmup_steps = min(warmup, steps - 1)
  config.train.update(total_steps=steps, log_every=max(1, min(steps // 10, 1000)),
                      eval_every=min(steps, scale.get("eval_every", max(1, steps // 4))),
                      checkpoint_every=min(steps, scale.get("checkpoint_every", steps)))
  objectives.validate(config)
  return config


# ---------------------------------------------------------------------------------------- rows


def run_row(name: str, overrides: dict | None, seed: int, scale: dict, workdirs: str,
            task) -> dict:
  """Pre-trains one row (the floor: nothing, the ELECTRA row's discriminator and tokenizer),
  fine-tunes and probes it: the results.jsonl record, with the row's pre-training steps, FLOPs
  per token and total training FLOPs."""
  if overrides is None:
    record = common.pretrain_and_score(name, base_config(scale, seed), seed, scale, None, task,
                                       ())
    return dict(record, pretrain_steps=0, flops_per_token=0.0, train_flops=0.0)
  config = pretrain_config(scale, overrides, seed)
  workdir = os.path.join(workdirs, common.workdir_name(name, seed))
  record = common.pretrain_and_score(name, config, seed, scale, workdir, task, EVAL_KEYS)
  per_token = flops_per_token(config)
  return dict(record, pretrain_steps=config.train.total_steps, flops_per_token=per_token,
              train_flops=per_token * record["input_tokens"])


# A row's own-target held-out accuracy: the detector's for ELECTRA and ELECTRA 15%, the token
# predictions' for the MLM rows.
EVAL_KEYS = ("discriminator_accuracy", "mlm_accuracy")

COMPARISON = report.Comparison(
    title="ELECTRA efficiency analysis (equal pre-training FLOPs)",
    rows=[name for name, _ in ROWS], baseline="BERT", floor=NO_PRETRAINING,
    groups=(("Table 5: compute-efficiency experiments", [name for name, _ in ROWS[:5]]),
            ("Floor", [NO_PRETRAINING])),
    columns=common.columns("GLUE"), primary_key=common.PRIMARY,
    paper={name: {"GLUE": value} for name, value in PAPER_GLUE.items()},
    paper_columns=("GLUE",),
    paper_source="Clark et al. 2020, Table 5 (GLUE dev score), checked against a full-text "
                 "copy. Ours stand in: Supersense, fine-tuned and probed, for GLUE",
    row_label="Model")


def setup_text(scale_name: str, scale: dict) -> str:
  """The scale as a paragraph of table.md."""
  model = ", ".join(f"{k} {v}" for k, v in scale.get("model", {}).items())
  return (f"Scale `{scale_name}`: configs/electra.py:{scale['config_arg']}"
          f"{' (' + model + ')' if model else ''}, batch {scale['batch_size']}; the ELECTRA row "
          f"pre-trains {scale['electra_steps']:,} steps (peak rate {scale['peak_lr']}, "
          f"{scale['warmup_steps']} warm-up steps) and every other row spends the same training "
          "FLOPs (objectives' `flops_per_token`, generator included), its warm-up in proportion; "
          "λ = 50 for the detection rows, 1.0 for All-Tokens MLM and Replace MLM (an MLM loss on "
          "BERT's scale). Then each fine-tunes "
          f"{scale['finetune_epochs']} epochs on {scale['finetune_train'] or 'all'} training "
          f"glosses (rate {scale['finetune_lr']}, {scale['finetune_seq_len']} tokens) and is "
          f"scored on {scale['finetune_eval'] or 'all'} validation glosses; the probe is a "
          "softmax regression on the frozen encoder's mean-pooled features of the same examples."
          + common.pinned_text(scale, "configs/electra.py"))


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
    scale.update(electra_steps=f.pretrain_steps,
                 warmup_steps=min(scale["warmup_steps"], f.pretrain_steps // 2))
  common.check_rows(f.rows, ROWS, lambda spec: pretrain_config(scale, spec, 0))
  out, workdirs = common.sweep_dirs("electra_ablation")
  task = common.supersense_task(scale)
  results = common.run_sweep(
      ROWS, f.rows, list(map(int, f.seeds)), os.path.join(out, "results.jsonl"),
      lambda name, overrides, seed: run_row(name, overrides, seed, scale, workdirs, task))
  print(common.write_report(results, out, COMPARISON, setup_text(f.scale, scale), task, scale))


if __name__ == "__main__":
  define_flags()
  app.run(main)
