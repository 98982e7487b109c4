"""The jitted train step: sharded equals single-device, accumulation, and learning on a tiny model."""

import jax
import numpy as np
import pytest

from jax.sharding import PartitionSpec as P

from bertfam_jax import config_lib as cl
from bertfam_jax.objectives import mlm
from bertfam_jax.train import sharding, step as step_lib

VOCAB, LENGTH, PREDICTIONS, BATCH = 97, 16, 4, 8


def tiny_config(**mesh):
  c = cl.base_config()
  c.model.update(hidden=32, layers=2, heads=4, mlp=64, vocab_size=VOCAB, max_positions=LENGTH)
  c.data.seq_len = LENGTH
  c.objective.max_predictions = PREDICTIONS
  c.optimizer.update(peak_lr=1e-2, warmup_steps=2)
  c.train.update(batch_size=BATCH, total_steps=100)
  c.mesh.update({**dict(data=-1, fsdp=1, tensor=1), **mesh})
  return c


def random_batch(seed=0):
  rng = np.random.default_rng(seed)
  input_mask = np.ones((BATCH, LENGTH), np.int32)
  input_mask[:, LENGTH - 3:] = 0  # some padding, so masking of keys is exercised
  return dict(
      input_ids=(rng.integers(5, VOCAB, (BATCH, LENGTH)) * input_mask).astype(np.int32),
      input_mask=input_mask,
      segment_ids=(np.arange(LENGTH)[None] >= LENGTH // 2).repeat(BATCH, 0).astype(np.int32),
      mlm_positions=np.sort(rng.choice(LENGTH - 3, (BATCH, PREDICTIONS), replace=True), 1
                            ).astype(np.int32),
      mlm_targets=rng.integers(5, VOCAB, (BATCH, PREDICTIONS)).astype(np.int32),
      mlm_weights=np.ones((BATCH, PREDICTIONS), np.float32),
      sentence_label=rng.integers(0, 2, (BATCH,)).astype(np.int32))


def setup(config, devices=None):
  mesh = sharding.make_mesh(config.mesh, devices)
  return (mesh,) + step_lib.fresh_train_step(config, mesh, mlm)


def put(batch, mesh):
  return {k: jax.device_put(v, sharding.batch_sharding(mesh)) for k, v in batch.items()}


def run_steps(config, batches, devices=None):
  mesh, state, train_step = setup(config, devices)
  losses = []
  for batch in batches:
    state, metrics = train_step(state, put(batch, mesh))
    losses.append(step_lib.finalize_metrics(jax.device_get(metrics))["loss"])
  return losses, jax.device_get(state.params)


@pytest.fixture(scope="module")
def single_device_run():
  batches = [random_batch(i) for i in range(3)]
  return batches, run_steps(tiny_config(), batches, jax.devices()[:1])


@pytest.mark.parametrize("mesh", [dict(data=2, fsdp=2, tensor=2), dict(data=1, fsdp=8),
                                  dict(data=2, tensor=4)])
def test_sharded_step_equals_single_device(single_device_run, mesh):
  batches, (ref_losses, ref_params) = single_device_run
  losses, params = run_steps(tiny_config(**mesh), batches)
  np.testing.assert_allclose(losses, ref_losses, rtol=2e-5)
  # Parameters after 3 updates agree, so the gradients did at every step.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6), params,
               ref_params)


def test_parameters_are_sharded_by_logical_rules():
  config = tiny_config(data=2, fsdp=2, tensor=2)
  _, state, _ = setup(config)
  layer = state.params["params"]["encoder"]["layer_0"]
  assert layer["mlp"]["intermediate"]["kernel"].sharding.spec == P("fsdp", "tensor")
  assert layer["attention"]["query"]["kernel"].sharding.spec == P("fsdp", "tensor", None)
  # 97 is not divisible by tensor=2: the vocabulary dimension falls back to replication.
  embedding = state.params["params"]["encoder"]["word_embeddings"]["embedding"]
  assert embedding.sharding.spec == P(None, "fsdp")
  mu = state.opt_state[1].mu["params"]["encoder"]["layer_0"]["mlp"]["intermediate"]["kernel"]
  assert mu.sharding.spec == P("fsdp", "tensor")  # optimizer state sharded like its parameter


def test_gradient_accumulation_matches_mean_of_micro_batch_gradients():
  """k micro-batches of size B/k give the update of the mean micro-batch gradient; with identical
  micro-batches that equals the full-batch update. Micro-batches are strided (rows i, i+k, ...), so
  repeating every row twice makes the two micro-batches identical."""
  half = random_batch(7)
  half = {k: v[: BATCH // 2] for k, v in half.items()}
  doubled = {k: np.repeat(v, 2, axis=0) for k, v in half.items()}
  c1 = tiny_config()
  c1.model.update(dropout=0.0, attention_dropout=0.0)
  c2 = tiny_config()
  c2.model.update(dropout=0.0, attention_dropout=0.0)
  c2.train.grad_accum_steps = 2
  loss1, params1 = run_steps(c1, [doubled])
  loss2, params2 = run_steps(c2, [doubled])
  np.testing.assert_allclose(loss2[0], loss1[0], rtol=1e-5)  # logged loss: mean over micro-batches
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6), params1,
               params2)


def test_loss_decreases_when_fitting_one_batch():
  batch = random_batch(3)
  config = tiny_config()
  config.optimizer.peak_lr = 3e-3
  losses, _ = run_steps(config, [batch] * 30)
  assert losses[-1] < 0.5 * losses[0], losses
