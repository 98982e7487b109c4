"""benchmarks/sharding_memory.py: per-device state bytes under each strategy, from abstract shapes
(a 2-layer BERT-large on the 8 test devices; nothing is allocated)."""

import os
import sys

import jax
import pytest

from bertfam_jax import config_lib

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import sharding_memory  # noqa: E402  pylint: disable=g-import-not-at-top

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def bert_large(vocab_size=30522):
  config = config_lib.load_config(os.path.join(_REPO, "configs", "bert.py"), "size=large")
  config.model.update(layers=2, vocab_size=vocab_size)
  return config


@pytest.fixture(scope="module")
def rows():
  return {name: sharding_memory.strategy_row(bert_large(), name, jax.devices())
          for name in ("data", "fsdp", "tensor")}


def test_data_parallelism_holds_the_whole_state(rows):
  r = rows["data"]
  assert r.mesh == dict(data=8, fsdp=1, tensor=1)
  # Adam: two float32 moments per parameter, plus a step count.
  assert 2 * r.param_bytes <= r.optimizer_bytes <= 2 * r.param_bytes + 16
  assert r.total_bytes == r.replicated_bytes
  # 2 layers of BERT-large: embeddings 31.8 M, 2 x (4 d^2 + 2 d f) = 25.2 M weights, MLM head,
  # pooler and NSP 2.1 M.
  assert 59e6 < r.param_bytes / 4 < 60e6


def test_fsdp_divides_nearly_everything_by_the_device_count(rows):
  # What has no `embed` dimension (biases of heads and MLP columns) stays whole: < 1% here.
  assert 1 / 8 <= rows["fsdp"].total_bytes / rows["data"].total_bytes < 1 / 8 + 0.01


def test_tensor_parallelism_keeps_what_it_cannot_split(rows):
  """tensor=8 splits heads (16), MLP columns and the vocabulary; LayerNorms, positions and the
  embedding-wide vectors stay whole, and so does BERT's 30,522-entry vocabulary (not divisible by
  8) until it is padded to 30,528."""
  tensor = rows["tensor"]
  assert tensor.total_bytes / tensor.replicated_bytes > 0.3
  padded = sharding_memory.strategy_row(bert_large(30528), "tensor", jax.devices())
  embedding_bytes = 30528 * 1024 * 4
  saved = tensor.param_bytes - padded.param_bytes
  assert saved == pytest.approx(embedding_bytes * 7 / 8, rel=0.01)
  assert padded.total_bytes / padded.replicated_bytes < 1 / 8 + 0.05


def test_markdown_table(rows):
  table = sharding_memory.markdown_table(list(rows.values())).splitlines()
  assert table[0].startswith("| strategy | mesh (data×fsdp×tensor) | params GiB/device")
  assert table[2].startswith("| data | 8×1×1 | ") and table[2].endswith(" | 1.000 |")
  assert table[3].startswith("| fsdp | 1×8×1 | ")
