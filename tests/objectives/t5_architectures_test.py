"""T5's objectives on the decoder-only and prefix-LM architectures (t5x's feature converters):
the decoder-only rows hold exactly the encoder-decoder examples concatenated, the prefix LM
attends bidirectionally over its inputs only, the step is the same sharded and on one device,
and pre-training through the one loop learns."""

import os

import jax
import numpy as np
import pytest

from bertfam_jax import config_lib as cl
from bertfam_jax import flops
from bertfam_jax.data import pipeline as pipeline_lib
from bertfam_jax.data import sources, tokenizers
from bertfam_jax.objectives import t5 as t5_objective
from bertfam_jax.train import sharding, step as step_lib
from bertfam_jax.train import train
from helpers.run_records import train_records

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny_config(architecture, **objective):
  """configs/t5.py:runlocal at 48 inputs / 16 targets, a 2-layer d_model-32 T5."""
  c = cl.load_config(os.path.join(_ROOT, "configs", "t5.py"), "runlocal")
  c.data.update(seq_len=48, docs_per_chunk=16)
  c.model.update(hidden=32, heads=2, head_dim=16, mlp=64, layers=2, decoder_layers=2,
                 vocab_size=536, architecture=architecture)
  c.tokenizer.update(vocab_size=512, extra_ids=20)
  c.objective.update({"targets_length": 16, **objective})
  c.optimizer.update(peak_lr=0.02, warmup_steps=5)
  c.train.update(batch_size=8, total_steps=30, log_every=5, eval_every=30, eval_batches=2,
                 checkpoint_every=30)
  return c


def first_chunk(config):
  docs = sources.get_documents(config.data, "train")
  tokenizer = tokenizers.load_or_train(config, docs)
  pipe = pipeline_lib.Pipeline(config, tokenizer, docs,
                               t5_objective.make_features(config, tokenizer), 0, 1, 8,
                               **t5_objective.pipeline_options(config))
  segments = pipe._pack(pipe._tokenize(np.arange(16)), np.random.default_rng(0))  # pylint: disable=protected-access
  pipe.close()
  return segments, tokenizer


@pytest.mark.parametrize("objective", [
    dict(),   # span corruption
    dict(noise_mask="random_prefix", noise_density=0.5, inputs_encoding="drop_nonnoise_tokens",
         targets_encoding="drop_noise_tokens", concat_documents=False, targets_length=48)])
def test_decoder_only_rows_are_the_encoder_decoder_examples_concatenated(objective):
  """The same segments noised with the same generator: every decoder-only segment is an
  encoder-decoder example's inputs (EOS included) followed by its targets."""
  config = tiny_config("prefix_lm", **objective)
  segments, tokenizer = first_chunk(config)
  features = t5_objective.make_features(config, tokenizer)
  seq2seq = t5_objective.make_features(tiny_config("encoder_decoder", **objective), tokenizer)
  rows = features(segments, np.random.default_rng(7))
  pairs = seq2seq(segments, np.random.default_rng(7))

  def examples(ids, segment_ids):
    return [ids[r][segment_ids[r] == s].tolist() for r in range(len(ids))
            for s in range(1, segment_ids[r].max() + 1)]
  inputs = examples(pairs["input_ids"], pairs["input_segment_ids"])
  targets = examples(pairs["decoder_target_ids"], pairs["decoder_segment_ids"])
  sequences = examples(rows["decoder_target_ids"], rows["decoder_segment_ids"])
  assert len(sequences) == len(inputs) >= 8
  assert sequences == [a + b for a, b in zip(inputs, targets)]
  assert all(a[-1] == tokenizer.eos_id for a in inputs)
  weights = examples(rows["decoder_loss_weights"], rows["decoder_segment_ids"])
  assert [sum(w) for w in weights] == [len(b) for b in targets]   # loss on the targets only
  assert rows["decoder_target_ids"].shape[1] == 48 + config.objective.targets_length


def test_prefix_lm_attends_over_its_inputs_both_ways_and_the_lm_does_not():
  """Changing the last input token of a row changes the logits at the first position in a prefix
  LM (bidirectional prefix), never in a decoder-only LM (causal), and no logit of another packed
  example in either."""
  for architecture, reaches_back in (("prefix_lm", True), ("decoder_only", False)):
    config = tiny_config(architecture)
    model = t5_objective.build_model(config)
    params = model.init(jax.random.key(0), **t5_objective.init_inputs(config), deterministic=True)
    ids = np.random.default_rng(0).integers(5, 500, (1, 64)).astype(np.int32)
    segment_ids = np.array([[1] * 30 + [2] * 34], np.int32)
    prefix = np.array([[1] * 11 + [0] * 19 + [1] * 11 + [0] * 23], np.int32)   # inputs: 10 each
    extra = {"decoder_causal_attention": prefix} if architecture == "prefix_lm" else {}

    def logits(ids):
      return np.asarray(model.apply(params, None, ids, None, segment_ids, deterministic=True,
                                    **extra))
    changed = ids.copy()
    changed[0, 9] += 1   # the first example's last input token
    moved = np.abs(logits(changed) - logits(ids)).max(axis=-1)[0]
    assert (moved[0] > 1e-6) == reaches_back, architecture
    assert (moved[:9] > 1e-6).any() == reaches_back
    assert (moved[9:30] > 1e-6).all() and (moved[30:] == 0).all()


def test_flops_match_the_encoder_decoder_at_equal_layers_and_length():
  """Raffel et al. §3.2.2: an L-layer decoder-only model over inputs + targets costs about what
  the L + L encoder-decoder does (both "M FLOPs"). They differ by the terms the paper's count
  leaves out: the encoder-decoder's cross-attention, against the decoder-only model's attention
  over the whole concatenation and its logits at the input positions (within 5% at base, 512 +
  512); at 512 + 114 (span corruption) the decoder-only model's logits at 512 more positions
  make it dearer."""
  base = cl.load_config(os.path.join(_ROOT, "configs", "t5.py"), "size=base")
  model, inputs, targets = base.model, 512, 512
  encoder_decoder = flops.t5_train_flops_per_input_token(model, inputs, targets)
  decoder = flops.decoder_only_train_flops_per_input_token(model, inputs, targets)
  assert 0.95 < decoder / encoder_decoder < 1.05
  short = (flops.decoder_only_train_flops_per_input_token(model, inputs, 114)
           / flops.t5_train_flops_per_input_token(model, inputs, 114))
  assert short > 1.05


@pytest.mark.parametrize("architecture", ["prefix_lm", "decoder_only"])
def test_sharded_step_equals_one_device_and_pretraining_learns(architecture, tmp_path):
  config = tiny_config(architecture)
  segments, tokenizer = first_chunk(config)
  rows = t5_objective.make_features(config, tokenizer)(segments, np.random.default_rng(3))
  batch = {k: v[:8] for k, v in rows.items()}
  results = []
  for mesh_config, devices in ((dict(data=-1, fsdp=1, tensor=1), jax.devices()[:1]),
                               (dict(data=2, fsdp=2, tensor=2), None)):
    config.mesh.update(mesh_config)
    mesh = sharding.make_mesh(config.mesh, devices)
    state, train_step = step_lib.fresh_train_step(config, mesh, t5_objective)
    placed = {k: jax.device_put(v, sharding.batch_sharding(mesh)) for k, v in batch.items()}
    losses = []
    for _ in range(2):
      state, metrics = train_step(state, placed)
      losses.append(step_lib.finalize_metrics(jax.device_get(metrics))["loss"])
    results.append(losses)
  np.testing.assert_allclose(results[1], results[0], rtol=2e-5)

  config.mesh.update(dict(data=-1, fsdp=1, tensor=1))
  train.run(config, str(tmp_path / architecture))
  records = train_records(str(tmp_path / architecture))
  assert records[30]["t5_loss"] < 0.8 * records[5]["t5_loss"]
  assert 0.5 < records[30]["input_fill"] <= 1.0 and 0.3 < records[30]["target_fill"] <= 1.0
