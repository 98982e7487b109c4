"""ALBERT (spec §3) as fields of the one Encoder: the factorised embedding against a float64 numpy
reference, cross-layer sharing against the unshared model whose layers hold copies of the shared
parameters (same outputs; shared gradient = sum of the per-layer gradients), scan/remat variants,
the exact parameter counts of the released sizes, and one sharded LAMB train step.
"""

import math
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

# Float64 reference pieces of spec §0 and the tiny inputs, from the BERT tests beside this file.
from encoder_test import (BATCH, F32_TOL, LENGTH, MLM_POSITIONS, VOCAB, dropout_key, encode,
                          gelu, layer_norm, make_inputs, outputs_and_grads, random_params,
                          random_tree, reference_layer)

from bertfam_jax import config_lib as cl
from bertfam_jax import objectives
from bertfam_jax.models import encoder, pretraining
from bertfam_jax.objectives import mlm
from bertfam_jax.train import optimizer, sharding, step as step_lib
from helpers import tiny

EMBEDDING = 16  # E < hidden 32: the tables are narrower than the layers, as ALBERT's 128 < 768


def tiny_config(**overrides):
  """The suite's tiny ALBERT with 3 layers (with 2 groups the groups hold different numbers of
  layers)."""
  return tiny.albert(**{**dict(layers=3, embedding_size=EMBEDDING, vocab_size=VOCAB,
                               max_positions=LENGTH), **overrides})


def count_params(tree):
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


def abstract_params(config, sentence_classes=2):
  """Parameter shapes of the MaskedLM (+ NSP/SOP head): nothing is allocated."""
  model = pretraining.MaskedLM(config, sentence_classes)
  ids = jnp.zeros((1, 8), jnp.int32)
  return jax.eval_shape(lambda: nn.meta.unbox(model.init(
      jax.random.key(0), ids, ids, ids, ids[:, :1], deterministic=True))["params"])


# ------------------------------------------------------------------------------------------------
# Parameter counts (spec §3): encoder + pooler, i.e. HF AlbertModel / BertModel with their default
# add_pooling_layer=True; the MLM head and the NSP/SOP classifier are not counted. Computed once
# with transformers 5.23.0 (torch 2.13.0), vocab 30,000, 512 positions, 2 token types:
#   sum(p.numel() for p in AlbertModel(AlbertConfig(
#       vocab_size=30000, embedding_size=128, hidden_size=H, num_hidden_layers=L,
#       num_attention_heads=A, intermediate_size=F)).parameters())
# and BertModel(BertConfig(vocab_size=30000, ...)) for BERT.
HF_PARAM_COUNTS = {
    ("albert", "base"): 11_683_584,
    ("albert", "large"): 17_683_968,
    ("albert", "xlarge"): 58_724_864,
    ("albert", "xxlarge"): 222_595_584,
    ("bert", "base"): 109_081_344,
    ("bert", "large"): 334_607_360,
}
# The paper's Table 1 (Lan et al., 2020), rounded and a few percent off the exact counts (spec §9.4:
# xxlarge is 5.3% below 235M): for the README, never for an assert.
PAPER_PARAM_COUNTS = {
    ("albert", "base"): "12M",
    ("albert", "large"): "18M",
    ("albert", "xlarge"): "60M",
    ("albert", "xxlarge"): "235M",
    ("bert", "base"): "108M",
    ("bert", "large"): "334M",
}


@pytest.mark.parametrize("family, size", list(HF_PARAM_COUNTS))
def test_parameter_counts_equal_hf(family, size):
  # scan_layers=True holds the same parameters (BERT: stacked) and traces one layer instead of L.
  config = (cl.albert_encoder(size, scan_layers=True) if family == "albert"
            else cl.encoder(size, vocab_size=30000, scan_layers=True))
  params = abstract_params(config)
  count = count_params(params["encoder"]) + count_params(params["sentence_head"]["pooler"])
  assert count == HF_PARAM_COUNTS[family, size], (
      f"{count:,}; the paper's table rounds HF's {HF_PARAM_COUNTS[family, size]:,} to "
      f"{PAPER_PARAM_COUNTS[family, size]}")


# ------------------------------------------------------------------------------------------------
# Which parameters are shared.


def test_layer_groups_follow_albert_and_hf():
  """Layer i uses group i·G // L: albert modeling.py's `int(i / L * G)` and HF's
  `int(i / (L / G))` at the released depths. (Their float forms disagree with each other and
  with i·G // L for a few other (L, G): TF maps layer 15 of L = G = 22 to group 14.)"""
  for layers in (12, 24):
    for groups in range(1, layers + 1):
      plan = encoder.layer_plan(tiny_config(layers=layers, hidden_groups=groups))
      ours = [name for ((name, _),) in plan]
      assert ours == [f"group_{int(i / layers * groups)}" for i in range(layers)]
      assert ours == [f"group_{int(i / (layers / groups))}" for i in range(layers)]


def layer_tree(params):
  """{module name: sorted submodule names} for the encoder's Transformer-layer modules."""
  return {name: sorted(tree) for name, tree in params["encoder"].items()
          if name.startswith(("layer_", "group_", "attention_group_", "ffn_group_"))}


ATTENTION, FFN = ["attention", "attention_ln"], ["mlp", "output_ln"]


@pytest.mark.parametrize("share, groups, expected", [
    ("none", 1, {f"layer_{i}": ATTENTION + FFN for i in range(3)}),
    ("all", 1, {"group_0": ATTENTION + FFN}),
    ("all", 2, {"group_0": ATTENTION + FFN, "group_1": ATTENTION + FFN}),
    ("attention", 1, {"attention_group_0": ATTENTION, **{f"layer_{i}": FFN for i in range(3)}}),
    ("ffn", 2, {"ffn_group_0": FFN, "ffn_group_1": FFN,
                **{f"layer_{i}": ATTENTION for i in range(3)}}),
])
def test_shared_modules_hold_one_set_of_parameters(share, groups, expected):
  params = abstract_params(tiny_config(share_layers=share, hidden_groups=groups))
  assert layer_tree(params) == expected
  # Counts: each module holds one attention and/or one FFN block; nothing else depends on sharing.
  reference = abstract_params(tiny_config(share_layers="none"))
  layer = reference["encoder"]["layer_0"]
  attention, ffn = (count_params({k: layer[k] for k in keys}) for keys in (ATTENTION, FFN))
  outside = count_params(reference) - 3 * (attention + ffn)
  owned = sum(attention * ("attention" in keys) + ffn * ("mlp" in keys)
              for keys in expected.values())
  assert count_params(params) == outside + owned


def test_factorised_embedding_shapes_and_axes():
  """V×E, 512×E, 2×E tables, LayerNorm in E, E→H projection with bias, head H→E + LN(E); the E
  dimension is named 'embed_factor' (replicated: the projection kernel's H takes fsdp)."""
  config = tiny_config()
  model = pretraining.MaskedLM(config, 2)
  ids = jnp.zeros((1, 8), jnp.int32)
  boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), ids, ids, ids, ids[:, :1],
                                            deterministic=True))["params"]
  specs = nn.get_partition_spec(boxed)
  shapes = jax.tree.map(lambda x: x.shape, nn.meta.unbox(boxed))
  e, m = "encoder", "mlm_head"
  expected = {
      (e, "word_embeddings", "embedding"): ((VOCAB, EMBEDDING), ("vocab", "embed_factor")),
      (e, "position_embeddings", "embedding"): ((LENGTH, EMBEDDING),
                                                ("positions", "embed_factor")),
      (e, "type_embeddings", "embedding"): ((2, EMBEDDING), ("types", "embed_factor")),
      (e, "embeddings_ln", "norm", "scale"): ((EMBEDDING,), ("embed_factor",)),
      (e, "embeddings_projection", "kernel"): ((EMBEDDING, 32), ("embed_factor", "embed")),
      (e, "embeddings_projection", "bias"): ((32,), ("embed",)),
      (m, "transform", "kernel"): ((32, EMBEDDING), ("embed", "embed_factor")),
      (m, "transform_ln", "norm", "bias"): ((EMBEDDING,), ("embed_factor",)),
  }
  for path, (shape, axes) in expected.items():
    shape_node, spec_node = shapes, specs
    for key in path:
      shape_node, spec_node = shape_node[key], spec_node[key]
    assert (shape_node, tuple(spec_node)) == (shape, axes), path
  assert ("embed_factor", None) in sharding.LOGICAL_AXIS_RULES


# ------------------------------------------------------------------------------------------------
# Forward pass against float64 numpy (spec §3: ALBERT's deltas on spec §0's block).


def reference_forward(params, c, inputs):
  """Hidden states [B, L, H] and {'mlm_logits' [B, P, V], 'sentence_logits' [B, 2]} of ALBERT with
  share_layers='all': layer i applies group int(i / L * G) (albert modeling.py's own formula)."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  e, eps = p["encoder"], c.layer_norm_eps
  ids, mask = inputs["input_ids"], inputs["input_mask"].astype(np.float64)
  x = (e["word_embeddings"]["embedding"][ids] + e["position_embeddings"]["embedding"][None, :LENGTH]
       + e["type_embeddings"]["embedding"][inputs["segment_ids"]])  # [B, L, E]
  x = layer_norm(x, e["embeddings_ln"], eps)
  x = x @ e["embeddings_projection"]["kernel"] + e["embeddings_projection"]["bias"]  # [B, L, H]
  for i in range(c.layers):
    x = reference_layer(x, e[f"group_{int(i / c.layers * c.hidden_groups)}"], mask, c, eps)
  m, s = p["mlm_head"], p["sentence_head"]
  h = x[np.arange(BATCH)[:, None], inputs["mlm_positions"]]
  h = gelu(h @ m["transform"]["kernel"] + m["transform"]["bias"], c.activation)  # [B, P, E]
  h = layer_norm(h, m["transform_ln"], eps)
  pooled = np.tanh(x[:, 0] @ s["pooler"]["kernel"] + s["pooler"]["bias"])
  return x, {"mlm_logits": h @ e["word_embeddings"]["embedding"].T + m["output_bias"],
             "sentence_logits": pooled @ s["classifier"]["kernel"] + s["classifier"]["bias"]}


def test_forward_matches_float64_reference():
  config = tiny_config(hidden_groups=2)  # layers 0 and 1 apply group_0, layer 2 group_1
  model, params = random_params(config, 2)
  inputs = make_inputs()
  outputs = model.apply({"params": params}, **inputs, deterministic=True)
  hidden = encode(model, params, inputs, deterministic=True)
  ref_hidden, ref_outputs = reference_forward(params, config, inputs)
  real = inputs["input_mask"] > 0
  np.testing.assert_allclose(hidden[real], ref_hidden[real], **F32_TOL)
  for name, ref in ref_outputs.items():
    np.testing.assert_allclose(outputs[name], ref, **F32_TOL, err_msg=name)


# ------------------------------------------------------------------------------------------------
# Sharing = the unshared model with tied copies: same function, gradients summed.


def unshared_twin(params, config):
  """The share_layers='none' tree whose layer_{i} merges copies of the modules layer i applies."""
  encoder_params = {k: v for k, v in params["encoder"].items() if k not in layer_tree(params)}
  for i, layer in enumerate(encoder.layer_plan(config)):
    encoder_params[f"layer_{i}"] = {k: v for name, _ in layer
                                    for k, v in params["encoder"][name].items()}
  return {**params, "encoder": encoder_params}


def assert_trees_close(actual, expected, **tol):
  assert jax.tree.structure(actual) == jax.tree.structure(expected)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **tol), actual, expected)


@pytest.mark.parametrize("share, groups", [("all", 1), ("attention", 1), ("ffn", 2)])
def test_shared_gradient_is_sum_of_per_layer_gradients(share, groups):
  config = tiny_config(share_layers=share, hidden_groups=groups)
  model, params = random_params(config, 2)
  inputs = make_inputs()
  outputs, grads = outputs_and_grads(model, params, inputs, deterministic=True)
  twin_model = pretraining.MaskedLM(tiny_config(share_layers="none"), 2)
  twin_outputs, twin_grads = outputs_and_grads(twin_model, unshared_twin(params, config), inputs,
                                               deterministic=True)
  assert_trees_close(outputs, twin_outputs, rtol=1e-6, atol=1e-6)
  # Each shared module's gradient is the sum over the layers that apply it; the others are equal.
  expected = {k: v for k, v in twin_grads["encoder"].items() if not k.startswith("layer_")}
  for i, layer in enumerate(encoder.layer_plan(config)):
    for name, _ in layer:
      part = {k: twin_grads["encoder"][f"layer_{i}"][k] for k in grads["encoder"][name]}
      expected[name] = part if name not in expected else jax.tree.map(jnp.add, expected[name],
                                                                      part)
  assert_trees_close(grads, {**twin_grads, "encoder": expected}, rtol=1e-4, atol=1e-6)


def test_scanned_rematerialised_groups_match_unrolled():
  """One scan per group over its consecutive layers, the group's parameters broadcast to every
  step, with remat inside: the unrolled model's outputs and gradients on the same (unstacked)
  tree. (Remat of unrolled shared layers is the per-module wrapper encoder_test.py checks, and
  `test_shared_layer_draws_new_dropout_mask_at_each_layer` runs it with sharing.)"""
  model, params = random_params(tiny_config(hidden_groups=2), 2)
  inputs = make_inputs()
  ref_outputs, ref_grads = outputs_and_grads(model, params, inputs, deterministic=True)
  variant = tiny_config(hidden_groups=2, scan_layers=True, remat_policy="dots")
  assert jax.tree.structure(abstract_params(variant)) == jax.tree.structure(params)
  outputs, grads = outputs_and_grads(pretraining.MaskedLM(variant, 2), params, inputs,
                                     deterministic=True)
  assert_trees_close(outputs, ref_outputs, rtol=1e-5, atol=1e-6)
  # The scan sums the group's gradient over its steps in another order: ~1e-5 relative.
  assert_trees_close(grads, ref_grads, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("remat_policy", ["none", "dots"])
def test_shared_layer_draws_new_dropout_mask_at_each_layer(remat_policy):
  """One module applied at every layer must not reuse one dropout mask for all of them."""
  config = tiny_config(dropout=0.5, remat_policy=remat_policy)
  model, params = random_params(config, 2)
  x = jnp.asarray(np.random.default_rng(0).normal(size=(BATCH, LENGTH, 32)), jnp.float32)
  mask = jnp.ones((BATCH, 1, 1, LENGTH), jnp.bool_)

  def twice(m):
    layer = m.encoder.layers["group_0"]
    return layer(x, mask, False, False), layer(x, mask, False, False)  # not decoding

  first, second = model.apply({"params": params}, method=twice, rngs={"dropout": dropout_key(3)})
  assert not np.allclose(first, second, atol=1e-3)


# ------------------------------------------------------------------------------------------------
# Configuration checks.


@pytest.mark.parametrize("overrides, match", [
    (dict(share_layers="some"), "share_layers"),
    (dict(hidden_groups=0), "hidden_groups"),
    (dict(hidden_groups=4), "hidden_groups"),  # more groups than the 3 layers
    (dict(share_layers="none", hidden_groups=2), "share_layers=all"),
    (dict(share_layers="attention", scan_layers=True), "scan_layers=False"),
    (dict(embedding_size=-1), "embedding_size"),
])
def test_validate_rejects_impossible_model_fields(overrides, match):
  config = cl.base_config()
  config.model = tiny_config(**overrides)
  config.data.seq_len = LENGTH
  with pytest.raises(cl.ConfigError, match=match):
    objectives.validate(config)


# ------------------------------------------------------------------------------------------------
# LAMB train steps of the all-shared model on a (data 2, fsdp 2, tensor 2) mesh equal the same
# steps on one device (as tests/train/step_test.py does for BERT with AdamW).


TRAIN_BATCH = 4 * BATCH  # divisible by data × fsdp = 4


def random_batch(seed):
  """4 draws of `make_inputs` stacked, with MLM targets, weights and SOP labels."""
  rng = np.random.default_rng(seed)
  inputs = [make_inputs(4 * seed + i) for i in range(4)]
  predictions = MLM_POSITIONS.shape[1]
  return dict({k: np.concatenate([x[k] for x in inputs]) for k in inputs[0]},
              mlm_targets=rng.integers(1, VOCAB, (TRAIN_BATCH, predictions)).astype(np.int32),
              mlm_weights=np.ones((TRAIN_BATCH, predictions), np.float32),
              sentence_label=rng.integers(0, 2, (TRAIN_BATCH,)).astype(np.int32))


class Trainer(NamedTuple):
  config: Any
  mesh: Any
  tx: Any
  abstract_state: Any  # TrainState of ShapeDtypeStructs
  shardings: Any       # TrainState of NamedShardings
  step: Any


def make_trainer(mesh_sizes, devices=None) -> Trainer:
  """The tiny all-shared ALBERT (2 layers: the shared gradient still sums two applications; each
  layer adds compile time) with an SOP head and ALBERT's LAMB, jitted on the mesh `mesh_sizes`."""
  c = cl.base_config()
  c.model = tiny_config(layers=2, dropout=0.0, attention_dropout=0.0)
  c.data.seq_len = LENGTH
  c.objective.update(max_predictions=MLM_POSITIONS.shape[1], sentence_task="sop")
  c.optimizer = cl.albert_lamb(peak_lr=1e-2, warmup_steps=1)
  c.train.update(batch_size=TRAIN_BATCH, total_steps=10)
  c.mesh.update(mesh_sizes)
  mesh = sharding.make_mesh(c.mesh, devices)
  model = mlm.build_model(c)
  tx, schedule = optimizer.make_optimizer(c)
  abstract, shardings = step_lib.with_mesh_context(step_lib.abstract_state, mesh)(
      model, tx, mesh, mlm.init_inputs(c))
  train_step = step_lib.make_train_step(model, tx, schedule, mlm.loss_fn, c, shardings, mesh)
  return Trainer(c, mesh, tx, abstract, shardings, train_step)


def run_steps(trainer: Trainer, state, batches):
  """Losses and final parameters (host) of one step per batch."""
  losses = []
  for batch in batches:
    batch = {k: jax.device_put(v, sharding.batch_sharding(trainer.mesh)) for k, v in batch.items()}
    state, metrics = trainer.step(state, batch)
    losses.append(step_lib.finalize_metrics(jax.device_get(metrics))["loss"])
  return losses, jax.device_get(state.params)


def test_sharded_lamb_step_equals_single_device():
  batches = [random_batch(i) for i in range(2)]
  sharded = make_trainer(dict(data=2, fsdp=2, tensor=2))
  single = make_trainer(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])
  # Both start from the same random parameters (built in numpy: `init_state` is step_test.py's and
  # would cost one more compilation) and fresh LAMB moments.
  params = random_tree(single.abstract_state.params, 0.2, seed=0, embedding_scale=0.01)
  state = jax.device_get(step_lib.TrainState(  # on the host: each run gets its own copy to donate
      step=jnp.zeros([], jnp.int32), params=params, opt_state=single.tx.init(params)))
  sharded_state = jax.device_put(state, sharded.shardings)
  encoder_params = sharded_state.params["params"]["encoder"]
  assert encoder_params["embeddings_projection"]["kernel"].sharding.spec == P(None, "fsdp")
  assert encoder_params["group_0"]["mlp"]["intermediate"]["kernel"].sharding.spec == P("fsdp",
                                                                                       "tensor")
  ref_losses, ref_params = run_steps(single, jax.device_put(state, single.shardings), batches)
  losses, params = run_steps(sharded, sharded_state, batches)
  np.testing.assert_allclose(losses, ref_losses, rtol=2e-5)
  # The second loss follows the first update; the parameters after both agree.
  assert_trees_close(params, ref_params, rtol=1e-4, atol=2e-6)
