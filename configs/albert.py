"""ALBERT pre-training: factorised embedding, cross-layer sharing, SOP, n-gram masking, LAMB
(Lan et al., 2020, arXiv:1909.11942).

Constants from google-research/albert (modeling.py, create_pretraining_data.py, run_pretraining.py,
lamb_optimizer.py, README): E = 128, all layers share one parameter set, no dropout (v2), tanh
GELU; sentence-order prediction (the true continuation, swapped with probability 1/2); whole-word
n-gram masking up to 3 words with p(n) ∝ 1/n; 15% masking capped at max_predictions_per_seq 20
(at 512 tokens that predicts only ~3.9% of the tokens, as the shipped flags do: raise
`objective.max_predictions` to 77 for a true 15%); dupe_factor 40, short_seq_prob 0.1;
30,000-piece SentencePiece unigram vocabulary; batch 4096 × 512, LAMB lr 0.00176, 3,125 warmup
steps, 125k steps.

  # The paper's recipe (Wikipedia from a prepared TFDS data_dir):
  python -m bertfam_jax.main --config=configs/albert.py --workdir=$WORKDIR \
      --config.data.tfds_data_dir=$TFDS_DATA_DIR
  # Sizes: --config=configs/albert.py:size=large | xlarge | xxlarge
  # Sharing ablations (paper Table 4): --config.model.share_layers=none|attention|ffn
  # Offline on a 2-core CPU (embedded Wikipedia sample, minutes):
  python -m bertfam_jax.main --config=configs/albert.py:runlocal --workdir=runs/albert-local
"""

from bertfam_jax import config_lib as cl


def get_config(arg=None):
  arg = cl.parse_arg(arg, size="base")
  config = cl.base_config()
  config.model = cl.albert_encoder(arg.size)
  config.objective = cl.mlm_objective(mask_style="bert", mask_scheme="ngram", max_ngram=3,
                                      word_start_rule="albert", masking="static", dupe_factor=40, sentence_task="sop",
                                      max_predictions=20)
  config.data.update(source="tfds", tfds_name="wikipedia/20230601.en", train_split="train[:99%]",
                     eval_split="train[99%:]", seq_len=512, packing="sentence_pairs",
                     short_seq_prob=0.1)
  # ALBERT's text and vocabulary (README's spm_train; tokenization.py preprocess_text and
  # encode_pieces): lower-cased, accents stripped, `( ) " - . – £ €` always pieces of their own.
  config.tokenizer.update(model_type="unigram", normalize="albert",
                          user_symbols='(,),",-,.,–,£,€')
  config.optimizer = cl.albert_lamb()
  config.train.update(batch_size=4096, total_steps=125_000)
  if arg.runlocal:
    cl.shrink_for_local(config)
    # Keep ALBERT's shape at CPU size: a factorised table narrower than the layers, and more
    # layers than the BERT mini model since they share one parameter set.
    config.model.update(embedding_size=64, layers=4)
    config.optimizer.peak_lr = 5e-3
  return config
