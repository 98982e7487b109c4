"""T5 pre-training through the one train loop: configs/t5.py shrunk, on the embedded corpus."""

import os

import numpy as np
import pytest

from bertfam_jax import config_lib as cl
from bertfam_jax import objectives
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.data import sources, tokenizers
from bertfam_jax.objectives import t5 as t5_objective
from bertfam_jax.train import train
from helpers.run_records import assert_resume_reproduces, metric_records, train_records
from helpers.sharded import host_batches

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny_config(**objective):
  """configs/t5.py:runlocal at 64 inputs, a 2-layer d_model-32 T5, 512 pieces + 20 sentinels."""
  c = cl.load_config(os.path.join(_ROOT, "configs", "t5.py"), "runlocal")
  c.data.update(seq_len=64, docs_per_chunk=16)
  c.model.update(hidden=32, heads=2, head_dim=16, mlp=64, layers=2, decoder_layers=2,
                 vocab_size=536)
  c.tokenizer.update(vocab_size=512, extra_ids=20)
  c.objective.update({"targets_length": 16, **objective})
  c.optimizer.update(peak_lr=0.02, warmup_steps=5)
  c.train.update(batch_size=8, total_steps=30, log_every=5, eval_every=30, eval_batches=2,
                 checkpoint_every=15, keep_checkpoints=5)
  return c


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("t5"))
  train.run(tiny_config(), workdir)
  return workdir


def test_loss_falls_and_the_run_writes_its_outputs(uninterrupted):
  metrics = train_records(uninterrupted)
  assert sorted(metrics) == [5, 10, 15, 20, 25, 30]
  assert metrics[30]["t5_loss"] < 0.85 * metrics[5]["t5_loss"]
  assert 0 < metrics[30]["z_loss"] < 0.1 * metrics[30]["t5_loss"]
  for key in ("t5_accuracy", "learning_rate", "tokens_per_sec", "eval_t5_loss"):
    assert key in metrics[30] or key in metric_records(uninterrupted)[-1], key
  # What the run saw: span corruption with the helper's exact targets length cuts nothing.
  for record in metrics.values():
    assert record["targets_cut"] == 0.0 and 0.5 < record["input_fill"] <= 1.0
    assert 0.3 < record["target_fill"] <= 1.0
  assert sorted(os.listdir(os.path.join(uninterrupted, "checkpoints"))) == ["15", "30"]


def test_a_short_targets_length_logs_the_share_it_cuts(tmp_path):
  """i.i.d. 50% noise with full-text-sized sentinel targets of 16 tokens: most examples' targets
  are cut, and the logged share says so (the unit is the example, whatever the packing)."""
  config = tiny_config(noise_mask="iid", noise_density=0.5, targets_length=16)
  config.train.update(total_steps=2, log_every=1, eval_batches=0, checkpoint_every=2)
  workdir = str(tmp_path / "cut")
  train.run(config, workdir)
  shares = [r["targets_cut"] for r in train_records(workdir).values()]
  assert all(0.5 < share <= 1.0 for share in shares), shares


def test_resume_reproduces_the_run(uninterrupted, tmp_path):
  """Steps 16..30 after restoring step 15 equal the uninterrupted run's, bit for bit: the data
  position (T5 rows are regrouped by packing) and the noise are resumed exactly."""
  assert_resume_reproduces(tiny_config(), uninterrupted, str(tmp_path / "resumed"))


def _first_batch(config):
  tokenizer = tokenizers.load_or_train(config, sources.get_documents(config.data, "train"))
  return host_batches(config, t5_objective, 1, 8, tokenizer)[0], tokenizer


@pytest.mark.parametrize("objective", [
    dict(),   # span corruption: inputs fill the row, sentinels from the top of the vocabulary
    dict(noise_mask="iid", noise_density=0.6, inputs_encoding="drop_noise_tokens",
         targets_encoding="drop_nonnoise_tokens", targets_length=96)])  # ~26-token inputs
def test_pipeline_batches_are_packed_t5_rows(objective):
  config = tiny_config(**objective)
  batch, tokenizer = _first_batch(config)
  targets_length = config.objective.targets_length
  assert batch["input_ids"].shape == (8, 64)
  assert batch["decoder_target_ids"].shape == (8, targets_length)
  eos = tokenizer.eos_id
  examples = 0
  for row in range(8):   # every packed example ends in its one EOS, on both sides
    for side, ids_key in (("input", "input_ids"), ("decoder", "decoder_target_ids")):
      segments = batch[f"{side}_segment_ids"][row]
      for s in range(1, segments.max() + 1):
        ids = batch[ids_key][row][segments == s]
        assert ids[-1] == eos and eos not in ids[:-1]
    examples += batch["input_segment_ids"][row].max()
  sentinels = batch["input_ids"][batch["input_ids"] >= tokenizer.num_pieces]
  if objective:
    assert examples >= 12 and not sentinels.size   # several examples per row, no sentinels
  else:
    assert examples == 8 and sentinels.max() == tokenizer.sentinel_start
  np.testing.assert_array_equal(batch["decoder_loss_weights"] > 0, batch["decoder_target_ids"] > 0)


def test_refusals():
  short = tiny_config(noise_mask="random_spans")
  short.objective.targets_length = 8
  with pytest.raises(ConfigError, match="targets_length=14"):
    t5_objective.segment_length(short)
  bad = tiny_config(inputs_encoding="noise_span_to_unique_sentinels")
  with pytest.raises(ConfigError, match="inputs_encoding"):
    objectives.validate(bad)
  packing = tiny_config()
  packing.data.packing = "full_sentences"
  with pytest.raises(ConfigError, match="t5_segments"):
    objectives.validate(packing)


def test_rows_hold_one_example_on_cudnn():
  """cuDNN attention takes padding as lengths, which cannot separate packed examples
  (models/t5.py): with it the pipeline puts one example in each row, and the config is accepted."""
  config = tiny_config(noise_mask="iid", noise_density=0.6, inputs_encoding="drop_noise_tokens",
                       targets_encoding="drop_nonnoise_tokens", targets_length=96)
  config.model.update(attention_impl="cudnn", dtype="bfloat16", dropout=0.0)
  objectives.validate(config)
  batch, _ = _first_batch(config)
  assert batch["input_segment_ids"].max() == 1 and batch["decoder_segment_ids"].max() == 1
  assert (batch["input_segment_ids"][:, 0] == 1).all()
