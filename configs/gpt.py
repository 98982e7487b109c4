"""GPT pre-training: a causal language model over a stream of documents (Radford et al., 2018,
"Improving Language Understanding by Generative Pre-Training"), and GPT-2's pre-LN model
(Radford et al., 2019) as `version=2`.

Constants from the paper §4.1 and openai/finetune-transformer-lm (train.py model(), opt.py;
spec §8): 12 layers, 768 wide, 12 heads, FFN 3072, learned positions over 512 tokens, post-LN
with ε 1e-5, the tanh GELU, dropout 0.1 on embeddings (on the tables themselves, which the tied
logits read too: docs/gpt.md), attention and residuals, the output tied to the token embedding;
Adam (0.9, 0.999, ε 1e-8) with decoupled L2 0.01 on weight matrices, clipping at 1, lr 2.5e-4
warmed up over 2,000 updates then cosine-annealed to 0; 64 rows of 512 contiguous tokens, 100
epochs of BooksCorpus. The tokenizer is a SentencePiece BPE of the
paper's 40,000 merges' size trained on the corpus (GPT's ftfy + spaCy BPE needs a download),
with an `<eod>` piece closing each document. Weights are drawn from an uncut N(0, 0.02), as the
reference's `random_normal_initializer` (`model.weight_init`); GPT-2's positions at σ 0.01 and its
residual projections at 0.02/√(2·layers) (docs/gpt.md).

  # The paper's model and optimizer on C4 (a prepared TFDS data_dir; see README "Data"), for
  # 100k steps (3.3 B tokens, the cosine over those): a deviation in length, since the paper's
  # 100 epochs of BooksCorpus (~1 B tokens by our estimate: 985 M words) would be ~3 M steps of
  # 64 x 512; set --config.train.total_steps for another length.
  python -m bertfam_jax.main --config=configs/gpt.py --workdir=$WORKDIR \
      --config.data.tfds_data_dir=$TFDS_DATA_DIR
  # Offline on a 2-core CPU (embedded Wikipedia sample, ~10 minutes):
  python -m bertfam_jax.main --config=configs/gpt.py:runlocal --workdir=runs/gpt-local
  # GPT-2 (pre-LN, final LayerNorm, 1,024 positions): configs/gpt.py:version=2,size=medium
  # Generate from a run: python -m bertfam_jax.generate --workdir=runs/gpt-local --prompt="The"
"""

import ml_collections

from bertfam_jax import config_lib as cl


def get_config(arg=None):
  """`size=medium,version=2,runlocal` (a bare size or `runlocal` alone also work)."""
  arg = cl.parse_arg(arg, size="base", version=1)
  config = cl.base_config()
  version = arg.version
  config.model = cl.gpt_model(arg.size, version)
  config.objective = ml_collections.ConfigDict(dict(name="causal_lm"))
  config.data.update(source="tfds", tfds_name="c4/en:3.1.0", train_split="train",
                     eval_split="validation", seq_len=config.model.max_positions,
                     packing="lm_stream")
  config.tokenizer.update(model_type="bpe", user_symbols="<eod>",
                          vocab_size=40000 if version == 1 else 50000)
  config.optimizer = cl.gpt_adam()
  config.train.update(batch_size=64 if version == 1 else 512, total_steps=100_000)
  if arg.runlocal:
    cl.shrink_for_local(config)
    config.tokenizer.vocab_size = 0   # model.vocab_size less the specials
  return config
