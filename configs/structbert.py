"""StructBERT pre-training: MLM + word-structural (shuffled trigrams) + 3-way sentence-structural
objectives (Wang et al., 2020, arXiv:1908.04577). No pretraining code was released; the
constants are the paper's (spec objectives.md §8, unverified against code).

BERT's data and masking (15%, 80/10/10, static); among the unmasked tokens ~5% are reordered in
trigrams and their original tokens predicted with the tied MLM head; (S1, S2) pairs where S2 is
the next text, the previous text or another document's, 1/3 each. Optimiser and schedule as BERT.

  python -m bertfam_jax.main --config=configs/structbert.py --workdir=$WORKDIR \
      --config.data.tfds_data_dir=$TFDS_DATA_DIR
  python -m bertfam_jax.main --config=configs/structbert.py:runlocal --workdir=runs/structbert-local
"""

from bertfam_jax import config_lib as cl


def get_config(arg=None):
  arg = cl.parse_arg(arg, size="base")
  config = cl.base_config()
  config.model = cl.encoder(arg.size, vocab_size=30522, activation="gelu_tanh")
  config.objective = cl.mlm_objective(mask_style="bert", masking="static", dupe_factor=10,
                                      sentence_task="structbert", word_shuffle_rate=0.05,
                                      max_predictions=20)
  config.data.update(source="tfds", tfds_name="wikipedia/20230601.en", train_split="train[:99%]",
                     eval_split="train[99%:]", seq_len=128, packing="sentence_pairs",
                     short_seq_prob=0.1)
  config.optimizer = cl.bert_adamw(peak_lr=1e-4, warmup_steps=10_000)
  config.train.update(batch_size=256, total_steps=1_000_000)
  if arg.runlocal:
    cl.shrink_for_local(config)
  return config
