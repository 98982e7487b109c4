"""ELECTRA pre-training: a small MLM generator and a discriminator trained jointly by replaced-token
detection (Clark et al., 2020, arXiv:2003.10555).

Constants from google-research/electra (configure_pretraining.py, run_pretraining.py,
pretrain/pretrain_helpers.py, model/optimization.py, build_pretraining_dataset.py):
  discriminator  small H256 L12 A4 FFN1024 with a 128-wide embedding; base H768 L12; large
                 H1024 L24; exact GELU, dropout 0.1, vocabulary 30,522.
  generator      same depth, hidden = round(H × fraction) with fraction 1/4 (small, large) or
                 1/3 (base), heads max(1, h / 64), FFN 4h; it shares the discriminator's token,
                 position and type embeddings and embedding LayerNorm.
  masking        15% (25% for large), positions drawn with replacement, 85% [MASK] / 15%
                 unchanged, fresh every step; max_predictions int((rate + 0.005) · L).
  loss           1 × generator MLM + 50 × replaced-token detection over every token.
  data           ExampleBuilder segments (`data.packing='electra_segments'`), no NSP.
  optimizer      AdamW without bias correction, wd 0.01 (not on LayerNorm / bias), ε 1e-6,
                 clip 1.0, lr × (1 − step/T) × min(1, step/W).
  small          batch 128 × 128, lr 5e-4, 10k warmup, 1M steps (the paper trains it on BERT's
                 Wikipedia + BooksCorpus, §3.1; the README's ELECTRA-Small-OWT on OpenWebText:
                 --config.data.source=text --config.data.text_files=...).
  base / large   512 tokens, lr 2e-4; batch 256 / 2048, 766k / 400k steps (paper Table 6).

The paper's efficiency analysis (§3.5) is `--config.objective.variant=electra_15 | replace_mlm |
all_tokens_mlm` (experiments/electra_ablation.py runs them beside BERT). Fine-tuning reads the
discriminator: it is the checkpoint's `encoder`, as a BERT encoder's.

  # ELECTRA-Small (Wikipedia from a prepared TFDS data_dir):
  python -m bertfam_jax.main --config=configs/electra.py --workdir=$WORKDIR \\
      --config.data.tfds_data_dir=$TFDS_DATA_DIR
  # --config=configs/electra.py:size=base | size=large
  # Offline on a 2-core CPU (embedded Wikipedia sample, minutes):
  python -m bertfam_jax.main --config=configs/electra.py:runlocal --workdir=runs/electra-local
"""

from bertfam_jax import config_lib as cl

# size: (seq_len, mask_rate, generator fraction, batch, steps, peak lr)
RECIPES = {
    "small": (128, 0.15, 0.25, 128, 1_000_000, 5e-4),
    "base": (512, 0.15, 1.0 / 3.0, 256, 766_000, 2e-4),
    "large": (512, 0.25, 0.25, 2048, 400_000, 2e-4),
}


def get_config(arg=None):
  arg = cl.parse_arg(arg, size="small")
  if arg.size not in RECIPES:
    raise cl.ConfigError(f"configs/electra.py has sizes {sorted(RECIPES)}, not {arg.size!r}.")
  seq_len, mask_rate, fraction, batch, steps, lr = RECIPES[arg.size]
  config = cl.base_config()
  config.model = cl.electra_encoder(arg.size)
  config.objective = cl.electra_objective(
      mask_rate=mask_rate, max_predictions=cl.electra_max_predictions(seq_len, mask_rate),
      generator_hidden_fraction=fraction)
  config.data.update(source="tfds", tfds_name="wikipedia/20230601.en", train_split="train[:99%]",
                     eval_split="train[99%:]", seq_len=seq_len, packing="electra_segments")
  config.tokenizer.model_type = "unigram"
  config.optimizer = cl.bert_adamw(peak_lr=lr, warmup_steps=10_000,
                                   schedule="warmup_times_linear")
  config.train.update(batch_size=batch, total_steps=steps)
  if arg.runlocal:
    cl.shrink_for_local(config)
    config.model.embedding_size = 0  # the mini discriminator is only 128 wide
    config.objective.max_predictions = cl.electra_max_predictions(128, mask_rate)
    # A runlocal-only deviation: the generator samples at temperature 3, not 1. At 1 the 2-layer,
    # 128-wide discriminator stays at the base rate for all 2,000 steps (held-out accuracy
    # 0.8798 = 1 − replaced share 0.1202, recall 0); at 3 its replacements, less plausible, are
    # detected (held-out 0.8675 against a base rate of 0.8625 at step 1,000, recall 19%).
    # Temperatures between 1 and 3 were not tried.
    config.objective.temperature = 3.0
  return config
