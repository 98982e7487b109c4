"""XLNet pre-training: permutation language modelling with two-stream attention on a Transformer-XL
(Yang et al., 2019, arXiv:1906.08237).

Constants from zihangdai/xlnet (README pre-training command, data_utils.py, modeling.py,
model_utils.py, train.py) and the paper: windows of 512 tokens = 256 reused (their states are the
next window's memory) + A <sep> B <sep> <cls> (segments 0 / 1 / 2); memory 384; 85 targets per
window chosen as n-gram spans (n ≤ 5, p ∝ 1/n, alpha 6 / beta 1, i.e. ~1/6 of the tokens
predicted, K = 6), permutations within blocks of 256 (each half fully permuted), half the rows
the reversed stream (bi_data); an <eod> after each document. Large: L24 d1024 h16 FFN 4096;
batch 8,192 for 500k steps, Adam (BERT's, weight decay 0.01, ε 1e-6) at 4e-4 with 40,000 warmup
steps then linear decay, clip 1.0 (the paper; the README's command uses batch 2,048). Base: L12
d768 h12 with the same recipe.

  # The paper's recipe (Wikipedia from a prepared TFDS data_dir):
  python -m bertfam_jax.main --config=configs/xlnet.py --workdir=$WORKDIR \
      --config.data.tfds_data_dir=$TFDS_DATA_DIR
  # Large: --config=configs/xlnet.py:size=large
  # Offline on a 2-core CPU (embedded Wikipedia sample, minutes):
  python -m bertfam_jax.main --config=configs/xlnet.py:runlocal --workdir=runs/xlnet-local
"""

from bertfam_jax import config_lib as cl

SIZES = ("base", "large")


def get_config(arg=None):
  arg = cl.parse_arg(arg, size="base")
  if arg.size not in SIZES and not arg.runlocal:
    raise cl.ConfigError(f"configs/xlnet.py has sizes {SIZES}, not {arg.size!r}.")
  config = cl.base_config()
  config.model = cl.xlnet_model(arg.size if arg.size in SIZES else "base")
  config.objective = cl.xlnet_objective()
  config.data.update(source="tfds", tfds_name="wikipedia/20230601.en", train_split="train[:99%]",
                     eval_split="train[99%:]", seq_len=512, packing="xlnet_streams")
  config.tokenizer.update(model_type="unigram", user_symbols="<eod>")
  # model_utils.py: decay to min_lr_ratio 0.001 of the peak (train_gpu.py / train.py default).
  config.optimizer = cl.bert_adamw(peak_lr=4e-4, eps=1e-6, warmup_steps=40_000,
                                   schedule="linear_after_warmup", min_lr_ratio=0.001)
  config.train.update(batch_size=8192, total_steps=500_000)
  if arg.runlocal:
    cl.shrink_for_local(config)
    config.model = cl.xlnet_model("mini", vocab_size=8000, mem_len=96, reuse_len=64)
    # 128-token windows: 64 reused + 64 new; 85/512 of them predicted; one permutation block
    # per half as in the paper.
    config.objective.update(num_predict=21, perm_size=64)
    config.optimizer.update(peak_lr=1e-3, warmup_steps=200)
  return config
