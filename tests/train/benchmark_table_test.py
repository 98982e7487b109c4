"""benchmarks/table.py: its rows are the recipes on the fast path, its HF peers are the same models
(parameter for parameter), and its memory arithmetic is right."""

import os
import sys

import jax
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import table  # noqa: E402  pylint: disable=wrong-import-position

from bertfam_jax import objectives  # noqa: E402
from bertfam_jax.train import optimizer as optimizer_lib, sharding, step as step_lib  # noqa: E402


def our_parameter_count(config) -> int:
  objective = objectives.get(config.objective.name)
  tx, _ = optimizer_lib.make_optimizer(config)
  mesh = sharding.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])
  abstract, _ = step_lib.with_mesh_context(step_lib.abstract_state, mesh)(
      objective.build_model(config), tx, config, mesh,
      step_lib.objective_init_inputs(objective, config))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract.params))


@pytest.mark.parametrize("row, extra", [("bert-base-128", 0), ("albert-base-512", 0),
                                        ("t5-base-512", 0),
                                        # HF's RoBERTa positions start after fairseq's pad id:
                                        # 2 more rows of its position table.
                                        ("roberta-base-512", 2 * 768)])
def test_hf_peer_is_the_same_model(row, extra):
  hf_compare = pytest.importorskip("hf_compare")
  pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  # Without the fast path: cuDNN attention cannot even be traced on a CPU; parameters are the same.
  config = table.row_config(table.ROWS_BY_NAME[row], fast_path=False)
  model, _ = hf_compare.hf_model_with_attention(config, transformers)
  assert sum(p.numel() for p in model.parameters()) == our_parameter_count(config) + extra


def test_rows_are_the_recipes_on_the_fast_path():
  bert = table.row_config(table.ROWS_BY_NAME["bert-base-512"], fast_path=True)
  assert (bert.model.dtype, bert.model.attention_impl) == ("bfloat16", "cudnn")
  assert (bert.model.attention_dropout, bert.model.dropout) == (0.0, 0.1)  # only attention's off
  assert (bert.data.seq_len, bert.train.batch_size, bert.objective.max_predictions) == (512, 64, 80)
  albert = table.row_config(table.ROWS_BY_NAME["albert-base-512"], fast_path=True)
  assert albert.optimizer.name == "adamw" and albert.objective.sentence_task == "sop"
  t5 = table.row_config(table.ROWS_BY_NAME["t5-base-512"], fast_path=True)
  assert (t5.model.dropout, t5.objective.targets_length, t5.optimizer.name) == (0.0, 114, "adamw")
  faithful = table.row_config(table.ROWS_BY_NAME["bert-base-512"], fast_path=False)
  assert (faithful.model.dtype, faithful.model.attention_dropout) == ("float32", 0.1)


def test_state_bytes_are_the_allocated_state():
  config = table.row_config(table.ROWS_BY_NAME["bert-mini-128"], fast_path=False)
  mesh = sharding.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])
  state, _ = step_lib.fresh_train_step(config, mesh, objectives.get(config.objective.name))
  assert table.state_bytes(config, mesh) == sum(x.nbytes for x in jax.tree.leaves(state))


def test_predicted_max_batch():
  gib = 2**30
  # 10 GiB of state, 2 GiB per example at batch 8, 80 GiB limit: (0.97·80 - 10) / 2 = 33.8 → 32.
  record = dict(peak_memory_bytes=26 * gib, state_bytes=10 * gib, bytes_limit=80 * gib,
                cell=dict(batch=8))
  assert table.predicted_max_batch(record) == 32
  assert table.predicted_max_batch(dict(record, peak_memory_bytes=None)) is None
