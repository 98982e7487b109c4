"""MASS: masked sequence-to-sequence pre-training (Song et al. 2019, arXiv:1905.02450), on the T5
encoder-decoder of models/t5.py.

The objective (MASS-unsupNMT src/trainer.py `restricted_mask_sent`, its README's command): one
contiguous fragment of half of each segment (`word_mass` 0.5; the fragment starts at the
segment's start with probability 0.2, ends at its end with 0.2, else starts uniformly) is masked
in the encoder, its tokens 80% [MASK] / 10% kept / 10% random (`word_mask_keep_rand`), and the
decoder predicts the fragment alone (cross-entropy on the fragment's tokens and EOS), its
cross-attention blind to the inputs holding [MASK] (`mass_step`'s `enc_mask`; the kept and
random ones stay visible). The network is the README's size: 6 + 6 layers, d_model 1024, 8
heads, FFN 4096, GELU, dropout 0.1; Adam β (0.9, 0.98) at 1e-4 with 4,000 warmup steps and
inverse-square-root decay, gradients clipped at norm 5 (train.py's `clip_grad_norm` default,
there per module, the encoder's and the decoder's; here over both together).

Deviations, from carrying MASS on T5's network (documented in docs/t5.md): relative position
buckets instead of MASS's absolute positions (so "positions are preserved" holds only as
relative distances, which cross-attention does not see), the decoder's first input is BOS 0
rather than the token before the fragment, the rate is constant for the 4,000 steps instead of
a linear ramp (t5x's rsqrt schedule), and segments are our packing's token segments of one
document (`concat_documents=False`), not MASS's single sentences.

  python -m bertfam_jax.main --config=configs/mass.py --workdir=$WORKDIR \
      --config.data.tfds_data_dir=$TFDS_DATA_DIR
  python -m bertfam_jax.main --config=configs/mass.py:runlocal --workdir=runs/mass-local
"""

import os

from bertfam_jax import config_lib as cl

T5_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "t5.py")


def get_config(arg=None):
  """`runlocal`: configs/t5.py:runlocal's network, data and optimizer with MASS's objective."""
  arg = cl.parse_arg(arg)
  config = cl.load_config(T5_CONFIG, "runlocal" if arg.runlocal else None)
  if not arg.runlocal:
    config.model = cl.t5_model("base", "1.0", hidden=1024, layers=6, decoder_layers=6, heads=8,
                               head_dim=128, mlp=4096, activation="gelu", dropout=0.1)
    config.data.seq_len = 256
    config.optimizer = cl.bert_adamw(peak_lr=1e-4, b1=0.9, b2=0.98, eps=1e-8, weight_decay=0.0,
                                     bias_correction=True, clip_norm=5.0, schedule="rsqrt",
                                     warmup_steps=4000)
  config.objective.update(noise_mask="mass_fragment", noise_density=0.5,
                          inputs_encoding="noise_token_to_sentinel_keep_or_random",
                          targets_encoding="drop_nonnoise_tokens", random_prob=0.1,
                          keep_prob=0.1, decoder_sees_masked=False, concat_documents=False,
                          targets_length=config.data.seq_len // 2 + 2)
  return config
