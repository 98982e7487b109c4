"""UniLM pre-training: one Transformer with four self-attention masks (bidirectional,
left-to-right, right-to-left, sequence-to-sequence) under one cloze objective (Dong et al., 2019,
"Unified Language Model Pre-training for Natural Language Understanding and Generation",
arXiv:1905.03197; objectives/unilm.py).

The pre-training code was not released; constants from the paper (§2.3, §3) and, for the token
types, microsoft/unilm's unilm-v1 seq2seq_loader.py: BERT-large's shape (24 layers, 1024 wide, 16
heads; the paper initialises from BERT-large, here `train.init_from` takes a run of the same
shape with six token types), 512 tokens, batch 330, 770k steps, Adam lr 3e-5 with 40k linear
warmup steps and linear decay, weight decay 0.01, dropout 0.1; 15% masking with 80/10/10, 80%
of the units one word and 20% a bigram or trigram; per row 1/3 bidirectional, 1/6 left-to-right,
1/6 right-to-left, 1/3 seq2seq. Deviation: no next-sentence prediction on the bidirectional rows.

  # The paper's recipe (Wikipedia from a prepared TFDS data_dir; see README "Data"):
  python -m bertfam_jax.main --config=configs/unilm.py --workdir=$WORKDIR \
      --config.data.tfds_data_dir=$TFDS_DATA_DIR
  # Offline on a 2-core CPU (embedded Wikipedia sample, ~10 minutes):
  python -m bertfam_jax.main --config=configs/unilm.py:runlocal --workdir=runs/unilm-local
"""

from bertfam_jax import config_lib as cl
from bertfam_jax.objectives import unilm


def get_config(arg=None):
  arg = cl.parse_arg(arg, size="large")
  config = cl.base_config()
  # Its PyTorch BERT's init_bert_weights draws every weight N(0, 0.02), uncut (the paper starts
  # from BERT-large; a run from scratch draws as its code would).
  config.model = cl.encoder(arg.size, vocab_size=28996, activation="gelu_tanh",
                            type_vocab_size=unilm.NUM_TOKEN_TYPES, weight_init="normal")
  config.objective = cl.unilm_objective(max_predictions=80)
  config.data.update(source="tfds", tfds_name="wikipedia/20230601.en", train_split="train[:99%]",
                     eval_split="train[99%:]", seq_len=512, packing="sentence_pairs",
                     short_seq_prob=0.1)
  config.optimizer = cl.bert_adamw(peak_lr=3e-5, warmup_steps=40_000)
  config.train.update(batch_size=330, total_steps=770_000)
  if arg.runlocal:
    cl.shrink_for_local(config)
  return config
