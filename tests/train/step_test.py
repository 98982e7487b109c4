"""The jitted train step: every sharding strategy equals one device; accumulation; learning on a
tiny model."""

import re
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax.sharding import PartitionSpec as P

from bertfam_jax import config_lib as cl
from bertfam_jax.objectives import mlm
from bertfam_jax.models import layers
from bertfam_jax.train import optimizer, sharding, step as step_lib
from helpers import tiny
from helpers.threefry_rules import ROLLED, cpu_rule

# Heads, MLP width and vocabulary divisible by 8: tensor parallelism up to 8 shards them all.
VOCAB, HEADS, LENGTH, PREDICTIONS, BATCH = 96, 8, 16, 4, 8


def tiny_config(vocab_size=VOCAB, **mesh):
  c = cl.base_config()
  c.model = tiny.encoder(heads=HEADS, vocab_size=vocab_size, max_positions=LENGTH)
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


class Run(NamedTuple):
  losses: list[float]
  grad_norms: list[float]
  first_moment: Any   # Adam's mu after the first step: (1 - b1) · the clipped gradient tree
  params: Any         # after the last step


def run_steps(config, batches, devices=None) -> Run:
  mesh, state, train_step = setup(config, devices)
  losses, grad_norms, first_moment = [], [], None
  for batch in batches:
    state, metrics = train_step(state, put(batch, mesh))
    scalars = step_lib.finalize_metrics(jax.device_get(metrics))
    losses.append(scalars["loss"])
    grad_norms.append(scalars["grad_norm"])
    if first_moment is None:   # opt_state: (clip, adam, decay, lr) states
      first_moment = jax.device_get(state.opt_state[1].mu)
  return Run(losses, grad_norms, first_moment, jax.device_get(state.params))


@pytest.fixture(scope="module")
def single_device_run():
  batches = [random_batch(i) for i in range(3)]
  return batches, run_steps(tiny_config(), batches, jax.devices()[:1])


@pytest.mark.parametrize("mesh", sharding.STRATEGIES.values(), ids=sharding.STRATEGIES.keys())
def test_sharded_step_equals_single_device(single_device_run, mesh):
  """Each strategy (data=8, fsdp=8, tensor=8 and their combinations) on 8 devices."""
  batches, reference = single_device_run
  run = run_steps(tiny_config(**mesh), batches)
  np.testing.assert_allclose(run.losses, reference.losses, rtol=2e-5)
  np.testing.assert_allclose(run.grad_norms, reference.grad_norms, rtol=1e-4)
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6)  # noqa: E731
  jax.tree.map(close, run.first_moment, reference.first_moment)   # the first gradients
  jax.tree.map(close, run.params, reference.params)   # so the gradients of every step


def abstract_state(config):
  """The train state's shapes and shardings on config.mesh (8 devices), without allocating."""
  mesh = sharding.make_mesh(config.mesh)
  model, (tx, _) = mlm.build_model(config), optimizer.make_optimizer(config)
  return step_lib.with_mesh_context(step_lib.abstract_state, mesh)(
      model, tx, mesh, mlm.init_inputs(config))[0]


def test_parameters_are_sharded_by_logical_rules():
  state = abstract_state(tiny_config(data=2, fsdp=2, tensor=2))
  encoder = state.params["params"]["encoder"]
  layer = encoder["layer_0"]
  assert layer["mlp"]["intermediate"]["kernel"].sharding.spec == P("fsdp", "tensor")
  assert layer["attention"]["query"]["kernel"].sharding.spec == P("fsdp", "tensor", None)
  assert encoder["word_embeddings"]["embedding"].sharding.spec == P("tensor", "fsdp")
  mu = state.opt_state[1].mu["params"]["encoder"]["layer_0"]["mlp"]["intermediate"]["kernel"]
  assert mu.sharding.spec == P("fsdp", "tensor")  # optimizer state sharded like its parameter
  # 97 is not divisible by tensor=2: the vocabulary dimension falls back to replication.
  state = abstract_state(tiny_config(vocab_size=97, data=2, fsdp=2, tensor=2))
  assert state.params["params"]["encoder"]["word_embeddings"]["embedding"].sharding.spec == P(
      None, "fsdp")


def test_tensor_parallelism_shards_heads_mlp_and_vocabulary():
  """tensor=8: every device holds 1/8 of each head-, MLP- and vocabulary-sized dimension and a
  whole copy of what has none (LayerNorm)."""
  encoder = abstract_state(tiny_config(data=1, tensor=8)).params["params"]["encoder"]
  layer = encoder["layer_0"]
  shard = lambda x: x.sharding.shard_shape(x.shape)  # noqa: E731
  assert shard(layer["attention"]["query"]["kernel"]) == (32, HEADS // 8, 32 // HEADS)
  assert shard(layer["attention"]["output"]["kernel"]) == (HEADS // 8, 32 // HEADS, 32)
  assert shard(layer["mlp"]["intermediate"]["kernel"]) == (32, 64 // 8)
  assert shard(layer["mlp"]["output"]["kernel"]) == (64 // 8, 32)
  assert shard(encoder["word_embeddings"]["embedding"]) == (VOCAB // 8, 32)
  assert shard(layer["attention_ln"]["norm"]["scale"]) == (32,)


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
  run1, run2 = run_steps(c1, [doubled]), run_steps(c2, [doubled])
  # logged loss: mean over micro-batches
  np.testing.assert_allclose(run2.losses[0], run1.losses[0], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6), run1.params,
               run2.params)


def test_loss_decreases_when_fitting_one_batch():
  batch = random_batch(3)
  config = tiny_config()
  config.optimizer.peak_lr = 3e-3
  losses = run_steps(config, [batch] * 30).losses
  assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize("impl, bits", [("threefry", 32), ("rbg", 32), ("unsafe_rbg", 32),
                                         ("threefry", 16), ("rbg", 16)])
def test_dropout_masks_keep_their_statistics_with_every_generator(impl, bits):
  """train.rng_impl and model.dropout_bits change the bits, not the distribution: the keep rate
  of the models' Dropout (p = 0.1) within 5σ of 0.9 over 2^20 draws per step; masks of
  consecutive steps (the step's fold_in), of neighbouring positions (with 16 bits, the two
  halves of one random word) and of two layers' dropouts uncorrelated (|r| < 5σ); no two steps'
  masks equal."""
  seeded = step_lib.SeededStep(lambda *args: None, seed=3, impl=impl)
  shape, p = (1024, 1024), 0.1
  n = shape[0] * shape[1]

  def masks(step):
    rng = jax.random.fold_in(seeded.key, step)
    layer = lambda name: layers.Dropout(p, bits).apply(  # noqa: E731
        {}, jnp.ones(shape), deterministic=False, rngs={"dropout": jax.random.fold_in(rng, name)})
    return np.asarray(layer(0) != 0), np.asarray(layer(1) != 0)

  (first, other_layer), (second, _) = masks(0), masks(1)
  bound = 5 * np.sqrt(p * (1 - p) / n)
  for mask in (first, other_layer, second):
    assert abs(mask.mean() - (1 - p)) < bound
  r = lambda a, b: np.corrcoef(a.ravel(), b.ravel())[0, 1]  # noqa: E731
  sigma = 1 / np.sqrt(n)
  assert abs(r(first, second)) < 5 * sigma
  assert abs(r(first, other_layer)) < 5 * sigma
  assert abs(r(first[:, :-1], first[:, 1:])) < 5 * sigma
  assert abs(r(first[:, 0::2], first[:, 1::2])) < 5 * np.sqrt(2) * sigma   # one word's halves
  assert (first != second).any()
  assert str(seeded.key.dtype) == {"threefry": "key<fry>", "rbg": "key<rbg>",
                                   "unsafe_rbg": "key<urbg>"}[impl]


def test_dropout_of_32_bits_is_flaxs():
  """model.dropout_bits=32 (the default) draws flax's nn.Dropout masks exactly, module names and
  so random streams included (the runs before dropout_bits existed reproduce); 16 draws others."""
  class Two(nn.Module):
    dropout: Any

    @nn.compact
    def __call__(self, x):
      return self.dropout()(self.dropout()(x, deterministic=False), deterministic=False)

  x, rngs = jnp.ones((64, 96)), {"dropout": jax.random.key(7)}
  flax_out = Two(lambda: nn.Dropout(0.1)).apply({}, x, rngs=rngs)
  ours = Two(lambda: layers.Dropout(0.1)).apply({}, x, rngs=rngs)
  np.testing.assert_array_equal(ours, flax_out)
  assert (Two(lambda: layers.Dropout(0.1, 16)).apply({}, x, rngs=rngs) != flax_out).any()


@pytest.mark.parametrize("bits", [32, 16])
def test_broadcast_dropout_shares_one_decision_along_its_axes(bits):
  """broadcast_dims=(-2,) (T5's): every index along axis -2 keeps the same features; 32 bits
  draw flax's nn.Dropout(broadcast_dims=(-2,)) exactly; the keep rate holds (5σ over the 2^16
  decisions); the last axis cannot be broadcast."""
  x, rngs = jnp.ones((64, 48, 1024)), {"dropout": jax.random.key(11)}
  ours = np.asarray(layers.Dropout(0.1, bits, broadcast_dims=(-2,)).apply(
      {}, x, deterministic=False, rngs=rngs))
  np.testing.assert_array_equal(ours, np.broadcast_to(ours[:, :1], ours.shape))
  assert abs((ours[:, 0] != 0).mean() - 0.9) < 5 * np.sqrt(0.09 / (64 * 1024))
  if bits == 32:
    flax_out = nn.Dropout(0.1, broadcast_dims=(-2,)).apply({}, x, deterministic=False, rngs=rngs)
    np.testing.assert_array_equal(ours, flax_out)
  with pytest.raises(ValueError, match="last axis"):
    layers.Dropout(0.1, bits, broadcast_dims=(1, 2)).apply({}, x, deterministic=False, rngs=rngs)


def test_the_configured_generator_draws_the_steps_dropout():
  """train.rng_impl reaches the step: another generator, another (valid) dropout stream, the
  same step otherwise; a run is a pure function of its seed either way."""
  losses = {}
  for impl in ("threefry", "rbg", "rbg"):
    config = tiny_config(data=1)
    config.train.rng_impl = impl
    mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
    state, train_step = step_lib.fresh_train_step(config, mesh, mlm)
    assert train_step.impl == impl and train_step.with_seed(5).impl == impl
    _, metrics = train_step(state, random_batch())
    losses.setdefault(impl, []).append(float(metrics["loss"][0]))
  assert losses["rbg"][0] == losses["rbg"][1] != losses["threefry"][0]


@pytest.mark.parametrize("mesh_shape", [dict(data=1, fsdp=4, tensor=2), dict(data=-1)])
def test_state_drawn_on_the_host_equals_the_device_draw(mesh_shape):
  """init_state(on_host=True), the default on a GPU, places the same parameters with the same
  shardings as the jitted draw into the shardings, and the same optimizer state and step."""
  config = tiny_config(**mesh_shape)
  mesh = sharding.make_mesh(config.mesh)
  model = mlm.build_model(config)
  inputs = mlm.init_inputs(config)
  tx, _ = step_lib.make_optimizer(config, model, inputs)
  _, shardings = step_lib.with_mesh_context(step_lib.abstract_state, mesh)(model, tx, mesh,
                                                                           inputs)
  init = lambda on_host: step_lib.with_mesh_context(  # noqa: E731
      lambda: step_lib.init_state(model, tx, shardings, 3, inputs, on_host=on_host), mesh)()
  host, device = init(True), init(False)
  assert jax.tree.structure(host) == jax.tree.structure(device)
  for a, b, sh in zip(jax.tree.leaves(host), jax.tree.leaves(device), jax.tree.leaves(shardings)):
    assert a.sharding == b.sharding == sh
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert any(np.asarray(leaf).std() > 0 for leaf in jax.tree.leaves(host.params))


def test_step_compiled_ahead_is_not_compiled_again():
  """step.compile_ahead compiles the train step while the state is built; the first call with
  the real state and a batch made as the loop makes it (pipeline.make_global_batch) runs that
  executable: no XLA compilation happens in it, on a sharded mesh too."""
  from bertfam_jax.data import pipeline  # pylint: disable=g-import-not-at-top
  compiles = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda name, *_, **__: compiles.append(name) if "backend_compile" in name else None)
  config = tiny_config(data=2, fsdp=2)
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:4])
  host_batch = random_batch()
  shapes = step_lib.abstract_batch(host_batch, mesh)
  state, train_step = step_lib.fresh_train_step(config, mesh, mlm, shapes)
  batch = pipeline.make_global_batch(host_batch, mesh, sharding.BATCH_SPEC)
  assert {k: (v.shape, v.dtype, v.sharding) for k, v in batch.items()} == {
      k: (s.shape, s.dtype, s.sharding) for k, s in shapes.items()}
  before = len(compiles)
  state, metrics = jax.block_until_ready(train_step(state, batch))
  assert compiles[before:] == []
  # Without it the first call compiles (the listener sees compilations at all).
  _, fresh_step = step_lib.fresh_train_step(config, mesh, mlm)
  before = len(compiles)
  jax.block_until_ready(fresh_step.with_seed(1)(state, batch))
  assert compiles[before:]


def test_train_step_draws_its_dropout_bits_without_threefry_loops():
  """make_train_step installs threefry.unroll_on_cpu (this JAX still has the private rule it
  reaches for): with JAX's rolled CPU rule in place before it, a draw compiled before has
  threefry's loop and the train step compiled after it has none, for its dropout masks, its key
  folds and splits alike."""
  def threefry_loops(hlo):
    # The rolled hash's loop state: (i, x0, x1, ks0, ks1, ks2, rotations, rotations).
    return [line for line in hlo.splitlines()
            if re.search(r"u32\[\], u32\[4\]\{0\}, u32\[4\]\{0\}\) while\(", line)]

  with cpu_rule(ROLLED):
    before = jax.jit(lambda k: jax.random.bernoulli(k, 0.9, (64,))).lower(
        jax.random.key(0)).compile().as_text()
    mesh, state, train_step = setup(tiny_config(data=1), jax.devices()[:1])
    after = train_step.lower(state, put(random_batch(), mesh)).compile().as_text()
  assert threefry_loops(before) and not threefry_loops(after)
  assert "_bernoulli" in after   # the step does draw dropout masks


def test_cpu_ynn_fusion_reaches_the_compiled_steps_and_keeps_their_values():
  """train.cpu_ynn_fusion sets which ops of the train and eval steps XLA:CPU hands to YNNPACK:
  none at all, or more than XLA's default ("" leaves its choice), and the step's loss, gradient
  norm and updated parameters equal XLA's default program's to float32 rounding; a kind outside
  dot / eltwise / reduce / none is refused by name."""
  runs, fusions = {}, {}
  for fusion in ("", "none", "dot", "dot,eltwise,reduce"):
    config = tiny_config(data=1)
    config.train.cpu_ynn_fusion = fusion
    mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
    state, train_step = step_lib.fresh_train_step(config, mesh, mlm)
    parts = step_lib.train_parts(config, mesh, mlm)
    eval_step = step_lib.make_eval_step(parts.model, mlm.loss_fn, config, parts.shardings, mesh)
    batch = put(random_batch(), mesh)
    fusions[fusion] = [text.count("__ynn_fusion") for text in (
        train_step.lower(state, batch).compile().as_text(),
        eval_step.lower(state.params, batch).compile().as_text())]
    state, metrics = train_step(state, batch)
    scalars = step_lib.finalize_metrics(jax.device_get(metrics))
    runs[fusion] = (scalars["loss"], scalars["grad_norm"], jax.device_get(state.params))
  assert fusions["none"] == [0, 0]
  # XLA's default hands YNNPACK some ops already (jaxlib 0.10.2, constraints.txt, on this CPU).
  assert all(0 < d < a for d, a in zip(fusions[""], fusions["dot,eltwise,reduce"])), fusions
  assert fusions["dot"] != fusions[""], fusions
  reference = runs.pop("")
  for loss, grad_norm, params in runs.values():
    np.testing.assert_allclose([loss, grad_norm], reference[:2], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                 params, reference[2])
  config = tiny_config()
  for bad in ("dot,gelu", "dot,none"):
    config.train.cpu_ynn_fusion = bad
    with pytest.raises(cl.ConfigError, match=rf"train.cpu_ynn_fusion='{bad}'.*subset"):
      cl.validate(config)
