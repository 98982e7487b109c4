"""ELECTRA (spec §5): the exact parameter counts of the released discriminators and generators
against HF's, the generator shapes of configs/electra.py, and the sharing of the embedding
tables between the generator and the discriminator (which tables, read by what, trained by what).
Numerical parity with HF's ElectraForPreTraining / ElectraForMaskedLM is in hf_parity_test.py.
"""

import math
import pathlib
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoder_test import LENGTH, VOCAB, make_inputs, random_tree

from bertfam_jax import config_lib as cl
from bertfam_jax.models import electra
from helpers import tiny as tiny_models

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
SHARED = ("word_embeddings", "position_embeddings", "type_embeddings", "embeddings_ln")


def count_params(tree):
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


def abstract_params(model):
  """Parameter shapes of `model` (an Electra): nothing is allocated."""
  ids = jnp.zeros((1, 8), jnp.int32)
  return jax.eval_shape(lambda: nn.meta.unbox(model.init(
      jax.random.key(0), ids, ids, ids, ids[:, :1], deterministic=True))["params"])


def released(size, **overrides):
  """(discriminator, generator) `model` sections of configs/electra.py at `size`."""
  config = cl.load_config(str(CONFIGS / "electra.py"), f"size={size}")
  config.model.update(overrides)
  o = config.objective
  return config.model, cl.electra_generator(config.model, o.generator_hidden_fraction,
                                            o.generator_layers_fraction)


# ------------------------------------------------------------------------------------------------
# Parameter counts. The spec's §11 discriminator numbers (13.48M / 108.89M / 334.09M) are HF's
# ElectraModel, i.e. embeddings (+ embeddings_project) + layers, without the detection head.
# Computed once with transformers 5.23.0 / torch 2.13.0 on the meta device:
#   sum(p.numel() for p in Cls(ElectraConfig(vocab_size=30522, embedding_size=E, hidden_size=H,
#       num_hidden_layers=L, num_attention_heads=A, intermediate_size=F)).parameters())
# with (H, L, A, F, E) = (256, 12, 4, 1024, 128) / (768, 12, 12, 3072, 768) /
# (1024, 24, 16, 4096, 1024), 512 positions, 2 token types:
#   ElectraModel           → our `encoder`;
#   ElectraForPreTraining  → our `encoder` + `rtd_head` (discriminator_predictions);
#   ElectraForMaskedLM with the generator's config (hidden h = 64 / 256 / 256, heads max(1, h/64),
#     FFN 4h, same L and E) → HF_GENERATOR; HF_GENERATOR_EMBEDDINGS is the part of it named
#     `electra.embeddings.*` (tables + LayerNorm, E wide: the same shapes as the discriminator's).
#     Ours shares those with the discriminator, so our `generator` + `generator_head` hold exactly
#     HF_GENERATOR - HF_GENERATOR_EMBEDDINGS (embeddings_project, layers, generator_predictions,
#     generator_lm_head.bias; the tied decoder weight is the word table and counted once by HF).
HF_ELECTRA_MODEL = {"small": 13_483_008, "base": 108_891_648, "large": 334_092_288}
HF_ELECTRA_FOR_PRETRAINING = {"small": 13_549_057, "base": 109_483_009, "large": 335_142_913}
HF_GENERATOR = {"small": 4_620_026, "base": 33_740_602, "large": 51_295_290}
HF_GENERATOR_EMBEDDINGS = {"small": 3_972_864, "base": 23_837_184, "large": 31_782_912}
# Spec §5: generator hidden round(H·frac) with frac 1/4, 1/3, 1/4; heads max(1, hidden/64).
GENERATOR_SHAPES = {"small": (64, 1, 12, 128), "base": (256, 4, 12, 768),
                    "large": (256, 4, 24, 1024)}  # hidden, heads, layers, embedding width


@pytest.mark.parametrize("size", ["small", "base", "large"])
def test_generator_shapes_follow_spec(size):
  discriminator, generator = released(size)
  hidden, heads, layers, embedding = GENERATOR_SHAPES[size]
  assert (generator.hidden, generator.heads, generator.mlp, generator.layers) == (
      hidden, heads, 4 * hidden, layers)
  assert generator.layers == discriminator.layers
  assert generator.embedding_size == embedding == (discriminator.embedding_size or
                                                    discriminator.hidden)
  for key in ("vocab_size", "max_positions", "type_vocab_size", "activation", "layer_norm_eps"):
    assert generator[key] == discriminator[key], key
  assert discriminator.activation == "gelu" and discriminator.layer_norm_eps == 1e-12


@pytest.mark.parametrize("size", ["small", "base", "large"])
def test_parameter_counts_equal_hf(size):
  # scan_layers=True holds the same parameters (stacked) and traces one layer instead of L.
  params = abstract_params(electra.Electra(*released(size, scan_layers=True)))
  assert params.keys() == {"encoder", "generator", "generator_head", "rtd_head"}
  assert count_params(params["encoder"]) == HF_ELECTRA_MODEL[size]
  assert (count_params(params["encoder"]) + count_params(params["rtd_head"])
          == HF_ELECTRA_FOR_PRETRAINING[size])
  assert count_params({k: params["encoder"][k] for k in SHARED}) == HF_GENERATOR_EMBEDDINGS[size]
  assert (count_params(params["generator"]) + count_params(params["generator_head"])
          == HF_GENERATOR[size] - HF_GENERATOR_EMBEDDINGS[size])
  # Both networks together: each HF checkpoint with the one set of shared tables counted once.
  assert count_params(params) == (HF_ELECTRA_FOR_PRETRAINING[size] + HF_GENERATOR[size]
                                  - HF_GENERATOR_EMBEDDINGS[size])


@pytest.mark.parametrize("bare", ["glorot_uniform", "truncated_normal"])
def test_bare_dense_layers_start_as_tf_layers_dense_draws_them(bare):
  """ELECTRA's code builds embeddings_project (both networks) and the detector's output unit with
  `tf.layers.dense` and no initializer, i.e. Glorot-uniform, U(±√(6 / (fan_in + fan_out))); every
  other dense layer gets BERT's truncated normal (σ 0.02, cut at 2σ)."""
  discriminator, generator = released("small", layers=1, bare_dense_init=bare)
  generator = cl.electra_generator(discriminator, 0.25, 1.0)
  ids = jnp.zeros((1, 8), jnp.int32)
  params = nn.meta.unbox(electra.Electra(discriminator, generator).init(
      jax.random.key(0), ids, ids, ids, ids[:, :1], deterministic=True))["params"]
  bare_kernels = [params["encoder"]["embeddings_projection"]["kernel"],   # [128, 256]
                  params["generator"]["embeddings_projection"]["kernel"],  # [128, 64]
                  params["rtd_head"]["prediction"]["kernel"]]              # [256, 1]
  assert [k.shape for k in bare_kernels] == [(128, 256), (128, 64), (256, 1)]
  for kernel in bare_kernels:
    kernel = np.asarray(kernel)
    if bare == "glorot_uniform":
      bound = math.sqrt(6 / sum(kernel.shape))
      assert np.abs(kernel).max() <= bound and np.abs(kernel).max() > 0.95 * bound
      assert kernel.std() == pytest.approx(bound / math.sqrt(3), rel=0.12)
    else:
      assert np.abs(kernel).max() <= 0.04
  assert np.abs(np.asarray(params["rtd_head"]["transform"]["kernel"])).max() <= 0.04
  assert (released("small")[0].bare_dense_init, released("small")[0].classifier_pooler) == (
      "glorot_uniform", False)


# ------------------------------------------------------------------------------------------------
# Sharing, on a tiny pair: discriminator H32 E16 (factorised, as small), generator h24 (its own
# E16 → 24 projection).


class Tiny(NamedTuple):
  params: Any
  inputs: dict
  generate: Callable     # params → generator logits [batch, predictions, vocab]
  discriminate: Callable  # params → detection logits [batch, length]


@pytest.fixture(scope="module")
def tiny():
  """Random parameters (scale 0.2, tables 0.01; encoder_test.random_tree), none at its
  initialiser's value, so a table read from the wrong place shows; jitted forward passes."""
  discriminator = tiny_models.electra(vocab_size=VOCAB, max_positions=LENGTH)
  generator = cl.electra_generator(discriminator, hidden_fraction=0.75, layers_fraction=1.0)
  assert (generator.hidden, generator.embedding_size) == (24, 16)
  model = electra.Electra(discriminator, generator)
  params = random_tree(abstract_params(model), 0.2, seed=0, embedding_scale=0.01)
  inputs = make_inputs()
  apply = lambda p, method: model.apply({"params": p}, **inputs, deterministic=True,  # noqa: E731
                                        method=method)
  return Tiny(params, inputs, jax.jit(lambda p: apply(p, "generate")),
              jax.jit(lambda p: apply(p, "discriminate")["rtd_logits"]))


def test_generator_owns_no_embedding_tables(tiny):
  params = tiny.params
  assert sorted(params["generator"]) == ["embeddings_projection", "layer_0", "layer_1"]
  assert params["generator"]["embeddings_projection"]["kernel"].shape == (16, 24)
  assert set(SHARED) <= set(params["encoder"])
  # The generator head meets the E-wide shared table: transform h → E, LayerNorm in E.
  assert params["generator_head"]["transform"]["kernel"].shape == (24, 16)
  assert params["generator_head"]["transform_ln"]["norm"]["scale"].shape == (16,)


def perturbed(params, path, update):
  """A copy of `params` with the leaf at `path` (a tuple of keys) replaced by update(leaf)."""
  def visit(tree, keys):
    if not keys:
      return update(tree)
    return {**tree, keys[0]: visit(tree[keys[0]], keys[1:])}
  return visit(params, path)


def test_generator_reads_the_discriminators_tables(tiny):
  params, inputs, generate = tiny.params, tiny.inputs, tiny.generate
  logits = np.asarray(generate(params))
  # attend: a word-table row of a token absent from the input changes that token's generator
  # logit and nothing else, so the logits are h · (encoder/word_embeddings)ᵀ.
  absent = next(v for v in range(VOCAB) if v not in inputs["input_ids"])
  changed = np.asarray(generate(perturbed(
      params, ("encoder", "word_embeddings", "embedding"), lambda t: t.at[absent].add(1.0))))
  others = np.arange(VOCAB) != absent
  np.testing.assert_array_equal(changed[..., others], logits[..., others])
  assert np.all(changed[..., absent] != logits[..., absent])
  # The input side reads the shared tables and LayerNorm too (random changes: the LayerNorm
  # would undo a constant shift) ...
  rng = np.random.default_rng(1)
  noise = lambda t: t + 0.05 * rng.normal(size=t.shape).astype(np.float32)  # noqa: E731
  for path in (("encoder", "word_embeddings", "embedding"),
               ("encoder", "position_embeddings", "embedding"),
               ("encoder", "type_embeddings", "embedding"),
               ("encoder", "embeddings_ln", "norm", "bias")):
    changed = generate(perturbed(params, path, noise))
    assert np.all(np.asarray(changed) != logits), path
  # ... and nothing of the discriminator past them.
  for path in (("encoder", "embeddings_projection", "kernel"),
               ("encoder", "layer_0", "mlp", "intermediate", "kernel"),
               ("rtd_head", "prediction", "bias")):
    changed = generate(perturbed(params, path, noise))
    np.testing.assert_array_equal(changed, logits)


def nonzero(tree):
  return {jax.tree_util.keystr(path): bool(np.any(np.asarray(leaf) != 0))
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def test_gradients_reach_the_shared_tables_from_both_losses(tiny):
  params, inputs = tiny.params, tiny.inputs
  rng = np.random.default_rng(1)
  # Random linear functionals of the outputs: no gradient vanishes by symmetry.
  gen_weights = jnp.asarray(rng.normal(size=(*inputs["mlm_positions"].shape, VOCAB)), jnp.float32)
  rtd_weights = jnp.asarray(rng.normal(size=inputs["input_ids"].shape), jnp.float32)
  generator_grads = jax.grad(lambda p: jnp.sum(tiny.generate(p) * gen_weights))(params)
  discriminator_grads = jax.grad(lambda p: jnp.sum(tiny.discriminate(p) * rtd_weights))(params)

  for grads in (generator_grads, discriminator_grads):
    assert all(nonzero({k: grads["encoder"][k] for k in SHARED}).values())
  # Generator-only parameters: no gradient at all from the discriminator's loss (and they do get
  # one from the generator's).
  for name in ("generator", "generator_head"):
    assert not any(nonzero(discriminator_grads[name]).values()), name
    assert all(nonzero(generator_grads[name]).values()), name
  # Discriminator-only parameters, the other way round.
  own = {k: v for k, v in generator_grads["encoder"].items() if k not in SHARED}
  assert "embeddings_projection" in own and "layer_1" in own
  assert not any(nonzero({"encoder": own, "rtd_head": generator_grads["rtd_head"]}).values())
  assert all(nonzero({k: v for k, v in discriminator_grads["encoder"].items()
                      if k not in SHARED}).values())
