"""ELMo pre-training: the bidirectional language model of Peters et al. (2018), "Deep
contextualized word representations", as allenai/bilm-tf trains it (spec §8 "ELMo biLM";
models/elmo.py, objectives/elmo.py).

The paper's recipe (bilm-tf's options for the released 2x4096_512_2048cnn_2xhighway model): a
character CNN (16-dim embeddings of ≤ 50 characters, filters of widths 1-7 with 32-1,024
channels, 2,048 in all, ReLU, 2 highway layers, projection to 512), 2 LSTM layers per direction of
4,096 cells projected to 512 with cell and projection clipping at 3 and a skip connection,
dropout 0.1; the softmax shared by both directions, trained as a sampled softmax with 8,192
candidates; Adagrad at 0.2 with accumulators from 1.0 and the gradients' global norm clipped at
10; 10 epochs of the 1B Word Benchmark (`lm1b` in TFDS) at 3 x 128 rows of 20 words.

Deviations (objectives/elmo.py and models/elmo.py say why): words are built from the run's
SentencePiece pieces, and the softmax is over the tokenizer's whole-word pieces (100,000 here),
not bilm-tf's 793,471-word vocabulary file; rows are 64 words of whole sentences, each direction
starting from zero states, instead of 20-word windows whose states carry over from batch to
batch; the sampled softmax draws its candidates with replacement.

  python -m bertfam_jax.main --config=configs/elmo.py --workdir=$WORKDIR \\
      --config.data.tfds_data_dir=$TFDS_DATA_DIR
  # Offline on a 2-core CPU (embedded Wikipedia sample, ~15 minutes): a small biLM, full softmax
  python -m bertfam_jax.main --config=configs/elmo.py:runlocal --workdir=runs/elmo-local
  # Its representations: python -m bertfam_jax.represent --workdir=runs/elmo-local ...
"""

import math

import ml_collections

from bertfam_jax import config_lib as cl


def get_config(arg=None):
  """`size=original|medium|small` (allennlp's released sizes), `runlocal`."""
  arg = cl.parse_arg(arg, size="original")
  config = cl.base_config()
  config.model = cl.elmo_model(arg.size, vocab_size=100_000)
  config.objective = ml_collections.ConfigDict(dict(name="elmo", sampled_negatives=8192))
  config.data.update(source="tfds", tfds_name="lm1b", train_split="train", eval_split="test",
                     seq_len=64, packing="full_sentences")
  config.optimizer = cl.elmo_adagrad()
  # 10 epochs of bilm-tf's n_train_tokens (768,648,884 words) at 384 x 64 word slots a step
  # (padding not deducted); bilm-tf's 1M steps are of 3 x 128 x 20 = 7,680 words.
  config.train.update(batch_size=384, total_steps=math.ceil(10 * 768_648_884 / (384 * 64)),
                      eval_every=10_000)
  if arg.runlocal:
    config.data.update(source="embedded_wiki", eval_fraction=0.1)
    config.model.update(vocab_size=8000, char_filters=((1, 32), (2, 32), (3, 64), (4, 128)),
                        highway_layers=1, projection_dim=128, lstm_cells=256)
    config.objective.sampled_negatives = 0   # the full softmax over 8,000 pieces
    config.train.update(batch_size=16, total_steps=2000, log_every=50, eval_every=500,
                        eval_batches=20, checkpoint_every=500)
    config.mesh.update(data=-1, fsdp=1, tensor=1)
  return config
