"""SpanBERT pre-training: geometric span masking + span boundary objective, single segments, no NSP
(Joshi et al., 2020, arXiv:1907.10529).

The official command (facebookresearch/SpanBERT pretraining/README.md): `--schemes ["pair_span"]
--span-lower 1 --span-upper 10 --geometric-p 0.2 --replacement-method span --endpoints external
--no-nsp --pair-loss-weight 1.0 --max-pair-targets 15 --pair-positional-embedding-size 200
--short-seq-prob 0.0 --tokens-per-sample 512`, lr 1e-4, 10k warmup, polynomial decay over 2.4M
updates, Adam (0.9, 0.999) eps 1e-8, wd 0.01, clip 1.0, 256 × 512 per step (eps and the clip
act on gradients divided by the masked tokens per GPU: below, their values for the mean loss).
Spans of whole words with lengths from a geometric distribution clipped at 10 (mean 3.8 words),
budget ceil(15%) of the block, one 80/10/10 draw per span, random tokens by corpus frequency;
blocks of whole sentences of one document, `[CLS] block [SEP]`; with sentence pairs (the
paper's NSP ablation) each segment masked on its own. Loss = MLM + SBO. Not reproduced:
`--clamp-attention` (raw scores clamped to ±10000, an fp16 safeguard).

  # The paper's recipe (Wikipedia from a prepared TFDS data_dir; the paper adds BooksCorpus):
  python -m bertfam_jax.main --config=configs/spanbert.py:size=large --workdir=$WORKDIR \
      --config.data.tfds_data_dir=$TFDS_DATA_DIR
  # Offline on a 2-core CPU (embedded Wikipedia sample, minutes):
  python -m bertfam_jax.main --config=configs/spanbert.py:runlocal --workdir=runs/spanbert-local
"""

from bertfam_jax import config_lib as cl


def get_config(arg=None):
  arg = cl.parse_arg(arg, size="base")
  config = cl.base_config()
  # BERT's architecture with fairseq's exact GELU; the released models use the cased WordPiece
  # vocabulary of 28,996 (we train a SentencePiece model of that size). pair_bert.py's
  # init_bert_weights draws every weight N(0, 0.02), uncut.
  config.model = cl.encoder(arg.size, vocab_size=28996, activation="gelu", weight_init="normal")
  config.objective = cl.mlm_objective(
      mask_style="spanbert", mask_scheme="span", span_p=0.2, span_max_words=10,
      replace_per="span", random_tokens="unigram", masking="dynamic", sentence_task="",
      sbo=True, sbo_max_targets=15, sbo_position_size=200, mask_per_segment=True,
      max_predictions=80)  # ceil(0.15 * 510) = 77
  config.data.update(source="tfds", tfds_name="wikipedia/20230601.en", train_split="train[:99%]",
                     eval_split="train[99%:]", seq_len=512, packing="document_blocks")
  # The command's Adam eps 1e-8 and --clip-norm 1.0 act on gradients that trainer.py has divided
  # by the masked tokens per GPU (~614 at 4,096 tokens; `span_bert_loss` already returns a
  # mean): in the mean loss's units eps is ~6e-6 and the clip never fires. Its polynomial_decay
  # counts the decay from step 0: lr·(1 − n/T) after warmup.
  config.optimizer = cl.fairseq_adam(peak_lr=1e-4, b2=0.999, eps=6e-6, weight_decay=0.01,
                                     clip_norm=0.0, warmup_steps=10_000,
                                     schedule="linear_from_zero")
  config.train.update(batch_size=256, total_steps=2_400_000)
  if arg.runlocal:
    cl.shrink_for_local(config)
  return config
