"""T5 pre-training: span corruption on C4 with the paper's baseline recipe (Raffel et al. 2020,
arXiv:1910.10683, §3.1 and the final objective of §3.3).

Constants from the paper (§3.1) and google-research/text-to-text-transfer-transformer
(t5/data/preprocessors.py span_corruption, t5/models/gin/objectives/span.gin, models/bi_v1.gin,
learning_rate_schedules/rsqrt_no_ramp_down.gin): T5 v1.0 base (12 + 12 layers, d_model 768, d_ff
3072, ReLU, relative position buckets, tied embeddings, dropout 0.1); random spans, 15% noise,
mean span 3, 568 raw tokens -> 512 inputs / 114 targets, several examples packed per row;
128 rows, 2^19 steps (2^35 tokens); Adafactor, 1/sqrt(max(step, 10^4)); SentencePiece 32,000
pieces + 100 sentinels in 32,128 rows. Our tokenizer is trained on the corpus (T5's cc_all.32000
model needs a download).

  # The paper's recipe (C4 from a prepared TFDS data_dir; see README "Data"):
  python -m bertfam_jax.main --config=configs/t5.py --workdir=$WORKDIR \
      --config.data.tfds_data_dir=$TFDS_DATA_DIR
  # Offline on a 2-core CPU (embedded Wikipedia sample, a few minutes):
  python -m bertfam_jax.main --config=configs/t5.py:runlocal --workdir=runs/t5-local
  # Other sizes and v1.1 (gated GELU, untied, dropout 0): configs/t5.py:size=large,version=1.1
  # Other objectives: --config.objective.* (rows of experiments/t5_objectives.py), e.g.
  #   --config.objective.noise_mask=iid --config.objective.targets_length=192
"""

from bertfam_jax import config_lib as cl


def get_config(arg=None):
  """`size=large,version=1.1,runlocal` (a bare size or `runlocal` alone also work)."""
  arg = cl.parse_arg(arg, size="base", version="1.0")
  config = cl.base_config()
  config.model = cl.t5_model(arg.size, arg.version)
  config.objective = cl.t5_objective()
  config.data.update(source="tfds", tfds_name="c4/en:3.1.0", train_split="train",
                     eval_split="validation", seq_len=512, packing="t5_segments")
  config.tokenizer.update(vocab_size=32000, extra_ids=100)
  config.optimizer = cl.t5_adafactor()
  config.train.update(batch_size=128, total_steps=2**19, eval_every=5000, checkpoint_every=5000,
                      # On a CPU only: the step's matmuls, elementwise ops and reductions in
                      # YNNPACK, faster than XLA's default for T5 v1.0 :runlocal
                      # (docs/results.md; v1.1 and configs/mass.py inherit it, unmeasured).
                      cpu_ynn_fusion="dot,eltwise,reduce")
  if arg.runlocal:
    shrink_for_local(config, arg.version)
  return config


def shrink_for_local(config, version: str = "1.0") -> None:
  """`:runlocal`: the embedded corpus and the `mini` T5 (2 + 2 layers, d_model 128), 128 inputs /
  32 targets (random_spans_helper gives 141 raw tokens -> 128 / 29), batch 32, 2,000 steps."""
  cl.shrink_for_local(config)
  config.model = cl.t5_model("mini", version, vocab_size=8192)
  config.tokenizer.update(vocab_size=8000, extra_ids=100)
  config.objective.targets_length = 32
  config.optimizer = cl.t5_adafactor(peak_lr=0.01, warmup_steps=200)
