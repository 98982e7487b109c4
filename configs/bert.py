"""BERT pre-training: MLM + NSP with static masking (Devlin et al., 2019, arXiv:1810.04805).

Constants from google-research/bert (create_pretraining_data.py, run_pretraining.py,
optimization.py, README): 15% masking 80/10/10 never on [CLS]/[SEP], max_predictions_per_seq 20 at
128 tokens, dupe_factor 10, short_seq_prob 0.1; batch 256, lr 1e-4, 10k warmup, linear decay to 0
over 1M steps, AdamWeightDecay (no bias correction, no decay on LayerNorm/bias), clip 1.0.
The paper trains 90% of the steps at 128 tokens and the rest at 512, under one schedule:
`phase=1` (the default) stops at 90% of `train.total_steps`; `phase=2` continues that run's
checkpoint (step, parameters and Adam moments: `train.init_state='all'`) at 512 tokens with
`max_predictions_per_seq` 80 (the README asks for about max_seq_length · masked_lm_prob, 76.8;
the cap never binds, a row asking at most 77) until `total_steps`, the learning rate
going on down the same linear decay. Phase 2 reads new data from the start (another length).
`:runlocal` trains one phase over all its steps unless a phase is named.

  # The paper's recipe (Wikipedia from a prepared TFDS data_dir):
  python -m bertfam_jax.main --config=configs/bert.py --workdir=$WORKDIR \
      --config.data.tfds_data_dir=$TFDS_DATA_DIR
  # ... then its last 10% at 512 tokens:
  python -m bertfam_jax.main --config=configs/bert.py:phase=2 --workdir=$WORKDIR-512 \
      --config.train.init_from=$WORKDIR/checkpoints --config.data.tfds_data_dir=$TFDS_DATA_DIR
  # Offline on a laptop CPU (embedded Wikipedia sample, ~10 minutes):
  python -m bertfam_jax.main --config=configs/bert.py:runlocal --workdir=runs/bert-local
  # BERT-large: --config=configs/bert.py:size=large
"""

from bertfam_jax import config_lib as cl


def get_config(arg=None):
  arg = cl.parse_arg(arg, size="base", phase=0)
  config = cl.base_config()
  config.model = cl.encoder(arg.size, vocab_size=30522, activation="gelu_tanh")
  config.objective = cl.mlm_objective(mask_style="bert", masking="static", dupe_factor=10,
                                      sentence_task="nsp", max_predictions=20)
  config.data.update(source="tfds", tfds_name="wikipedia/20230601.en", train_split="train[:99%]",
                     eval_split="train[99%:]", seq_len=128, packing="sentence_pairs",
                     short_seq_prob=0.1)
  config.optimizer = cl.bert_adamw(peak_lr=1e-4, warmup_steps=10_000)
  config.train.update(batch_size=256, total_steps=1_000_000)
  if arg.runlocal:
    cl.shrink_for_local(config)
  phase = arg.phase or (0 if arg.runlocal else 1)  # runlocal: one phase, unless one is named
  if phase not in (0, 1, 2):
    raise cl.ConfigError(f"configs/bert.py:phase={arg.phase}; choose 1 (128 tokens) or 2 (512).")
  if phase == 1:
    config.train.stop_step = config.train.total_steps * 9 // 10
  elif phase == 2:
    config.data.seq_len = min(512, config.model.max_positions)
    config.objective.max_predictions = round(80 * config.data.seq_len / 512)
    config.train.init_state = "all"
  return config
