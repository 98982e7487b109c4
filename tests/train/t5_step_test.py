"""T5's train step on a mesh: sharded (data / fsdp / tensor) equals one device, on packed rows."""

import os

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from bertfam_jax import config_lib as cl
from bertfam_jax.data import packing
from bertfam_jax.objectives import t5 as t5_objective
from bertfam_jax.train import sharding, step as step_lib
from helpers import tiny

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOCAB, INPUTS, TARGETS, BATCH = 96, 24, 12, 8


def tiny_config(**mesh):
  c = cl.load_config(os.path.join(_ROOT, "configs", "t5.py"), "runlocal")
  c.model = tiny.t5(vocab_size=VOCAB)
  c.data.seq_len = INPUTS
  c.objective.targets_length = TARGETS
  c.optimizer.update(peak_lr=1e-2, warmup_steps=2)
  c.train.update(batch_size=BATCH, total_steps=100)
  c.mesh.update({**dict(data=-1, fsdp=1, tensor=1), **mesh})
  return c


def packed_batch(seed):
  """Rows of 1-3 random (inputs, targets) examples, packed as the pipeline packs them."""
  rng = np.random.default_rng(seed)
  n = 3 * BATCH
  input_lengths, target_lengths = rng.integers(4, 12, n), rng.integers(2, 6, n)
  inputs = rng.integers(5, VOCAB, (n, 12)).astype(np.int32)
  targets = rng.integers(5, VOCAB, (n, 6)).astype(np.int32)
  rows = packing.pack_seq2seq(inputs, input_lengths, targets, target_lengths,
                              inputs_length=INPUTS, targets_length=TARGETS)
  assert len(rows["input_ids"]) >= BATCH and rows["input_segment_ids"].max() >= 2
  return {k: v[:BATCH] for k, v in rows.items()}


def run_steps(config, batches, devices=None):
  mesh = sharding.make_mesh(config.mesh, devices)
  state, train_step = step_lib.fresh_train_step(config, mesh, t5_objective)
  losses = []
  for batch in batches:
    batch = {k: jax.device_put(v, sharding.batch_sharding(mesh)) for k, v in batch.items()}
    state, metrics = train_step(state, batch)
    losses.append(step_lib.finalize_metrics(jax.device_get(metrics))["loss"])
  return losses, jax.device_get(state.params), state


@pytest.fixture(scope="module")
def single_device_run():
  batches = [packed_batch(i) for i in range(3)]
  return batches, run_steps(tiny_config(), batches, jax.devices()[:1])


@pytest.mark.parametrize("mesh", [dict(data=2, fsdp=2, tensor=2), dict(data=1, fsdp=8)])
def test_sharded_t5_step_equals_single_device(single_device_run, mesh):
  batches, (ref_losses, ref_params, _) = single_device_run
  losses, params, state = run_steps(tiny_config(**mesh), batches)
  np.testing.assert_allclose(losses, ref_losses, rtol=2e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6), params,
               ref_params)
  if mesh.get("tensor"):   # heads and MLP columns over `tensor`, the width over `fsdp`
    layer = state.params["params"]["encoder"]["layer_0"]
    assert layer["attention"]["query"].sharding.spec == P("fsdp", "tensor", None)
    assert layer["mlp"]["wi"]["kernel"].sharding.spec == P("fsdp", "tensor")
