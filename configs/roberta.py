"""RoBERTa pre-training: dynamic masking, FULL-SENTENCES packing, no NSP (Liu et al., 2019,
arXiv:1907.11692).

Constants from fairseq (examples/roberta/config/pretraining/base.yaml, tasks/masked_lm.py,
data/mask_tokens_dataset.py, optim/adam.py): blocks of <= 512 tokens of whole sentences crossing
document boundaries; 15% dynamic masking with probabilistic rounding over all tokens, 80/10/10,
random tokens never special; 2048 sequences x 512 tokens, lr 5e-4, 10k warmup, linear decay over
125k updates, Adam (0.9, 0.98), eps 1e-6, decoupled weight decay 0.01 on every parameter, no
clipping; exact GELU, LayerNorm eps 1e-5, one token type. Our tokenizer is a SentencePiece BPE of
the same size trained on the corpus (fairseq uses GPT-2's byte-level BPE, which needs a download).

  # The paper's recipe (C4 from a prepared TFDS data_dir; see README "Data"):
  python -m bertfam_jax.main --config=configs/roberta.py --workdir=$WORKDIR \
      --config.data.tfds_data_dir=$TFDS_DATA_DIR
  # Offline on a 2-core CPU (embedded Wikipedia sample, ~10 minutes):
  python -m bertfam_jax.main --config=configs/roberta.py:runlocal --workdir=runs/roberta-local
  # RoBERTa-large: --config=configs/roberta.py:size=large (lr 4e-4, batch 8k, 30k warmup in the
  # released model; override --config.optimizer.peak_lr etc.)
"""

from bertfam_jax import config_lib as cl


def get_config(arg=None):
  arg = cl.parse_arg(arg, size="base")
  config = cl.base_config()
  # fairseq's init_bert_params: every weight N(0, 0.02), uncut.
  config.model = cl.encoder(arg.size, vocab_size=50265, activation="gelu", layer_norm_eps=1e-5,
                            type_vocab_size=1, weight_init="normal")
  # fairseq's probabilistic rounding asks for at most int(0.15 * 512 + 1) = 77 predictions.
  config.objective = cl.mlm_objective(mask_style="fairseq", masking="dynamic", sentence_task="",
                                      max_predictions=80)
  config.data.update(source="tfds", tfds_name="c4/en:3.1.0", train_split="train",
                     eval_split="validation", seq_len=512, packing="full_sentences",
                     document_separator=True)
  config.tokenizer.model_type = "bpe"
  config.optimizer = cl.fairseq_adam(peak_lr=5e-4, b2=0.98, warmup_steps=10_000)
  config.train.update(batch_size=2048, total_steps=125_000)
  if arg.runlocal:
    cl.shrink_for_local(config)
  return config
