"""GPT (models/pretraining.CausalLM over the causal `Encoder`) and its generation
(bertfam_jax.generate): no position sees a later token, in every layer layout; the KV cache
gives the recomputing path's logits and tokens; top-k / top-p keep the tokens they name."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import linen as nn

from bertfam_jax import generate
from bertfam_jax.models import encoder as encoder_lib
from bertfam_jax.models import finetune as finetune_models
from bertfam_jax.models import layers, pretraining

from helpers import tiny

BATCH = 3


def model_and_params(config, seed=0):
  model = pretraining.CausalLM(ml_collections.FrozenConfigDict(config))
  ids = jnp.zeros((1, tiny.LENGTH), jnp.int32)
  params = nn.meta.unbox(model.init(jax.random.key(seed), ids, jnp.ones_like(ids),
                                    deterministic=True))["params"]
  return model, params


def random_ids(seed=0, length=tiny.LENGTH):
  return jnp.asarray(np.random.default_rng(seed).integers(4, tiny.VOCAB, (BATCH, length)),
                     jnp.int32)


LAYOUTS = {
    "gpt1": dict(),
    "gpt2": dict(version=2),
    "gpt2_scanned_remat": dict(version=2, scan_layers=True, remat_policy="dots"),
    "gpt1_dropout": dict(dropout=0.1, attention_dropout=0.1),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_no_position_sees_a_later_token(layout):
  """Changing the token at t + 1 leaves every logit at positions <= t unchanged (and changes
  those after), for each t; with dropout the masks are the same draw in both passes."""
  model, params = model_and_params(tiny.gpt(**LAYOUTS[layout]))
  ids = random_ids()
  dropout = "dropout" in layout
  apply = jax.jit(lambda ids: model.apply({"params": params}, ids, jnp.ones_like(ids),
                                          deterministic=not dropout,
                                          rngs={"dropout": jax.random.key(1)}))
  reference = np.asarray(apply(ids))
  for t in range(0, tiny.LENGTH - 1, 5):
    changed = np.asarray(apply(ids.at[:, t + 1].set((ids[:, t + 1] + 1) % tiny.VOCAB)))
    np.testing.assert_array_equal(changed[:, :t + 1], reference[:, :t + 1])
    assert not np.allclose(changed[:, t + 1:], reference[:, t + 1:])


def test_gpt_drops_its_tables_and_its_logits_read_the_dropped_table():
  """finetune-transformer-lm train.py model(): `we = dropout(we, embd_pdrop)` on the table of
  tokens and positions, then the lookups and the tied logits both read that `we`. In one step:
  the logits' table is the table with ~10% of its entries zeroed and the rest / 0.9; a token's
  embedding is one row of it wherever the token stands (one mask per table, not per place);
  another step draws another mask; deterministic reads the table as it is. GPT-2 drops the sum."""
  config = tiny.gpt(dropout=0.1)
  assert config.embedding_dropout == "table" and tiny.gpt(version=2).embedding_dropout == "output"
  model, params = model_and_params(config)
  table = np.asarray(params["encoder"]["word_embeddings"]["embedding"])
  eye = jnp.eye(table.shape[1])

  def step(module, ids, deterministic=False):
    return (module.encoder.embed(ids, deterministic=deterministic),
            module.encoder.attend(eye, deterministic).T)   # [vocab, width]: the table read

  ids = jnp.asarray([[5, 7, 5, 9], [5, 5, 8, 8]])
  apply = lambda seed, **kw: [np.asarray(a) for a in model.apply(  # noqa: E731
      {"params": params}, ids, rngs={"dropout": jax.random.key(seed)}, method=step, **kw)]
  embedded, dropped = apply(1)
  zero = dropped == 0
  assert abs(zero.mean() - 0.1) < 0.015
  np.testing.assert_allclose(dropped[~zero], table[~zero] / 0.9, rtol=1e-6)
  np.testing.assert_array_equal(embedded[0, 0], embedded[1, 0])   # token 5 at place 0, twice
  np.testing.assert_allclose(embedded[0, 1] - embedded[1, 1], dropped[7] - dropped[5],
                             rtol=1e-5, atol=1e-6)                 # one table for both reads
  assert not np.array_equal(apply(2)[1], dropped)
  np.testing.assert_array_equal(apply(1, deterministic=True)[1], table)

  # The model's own step: its logits are the last layer times that dropped table, and its
  # embedding output is the lookups with no second dropout on their sum.
  def forward(module, ids):
    logits = module(ids, jnp.ones_like(ids), deterministic=False)
    _, layers_ = module.encoder(ids, jnp.ones_like(ids), deterministic=False,
                                return_all_layers=True)
    return (logits, module.encoder.attend(eye, False).T, layers_[0],
            module.encoder.embed(ids, deterministic=False))

  (logits, dropped, embedding_output, looked_up), state = model.apply(
      {"params": params}, ids, rngs={"dropout": jax.random.key(1)}, method=forward,
      capture_intermediates=lambda m, name: isinstance(m, encoder_lib.Encoder) and
      name == "__call__", mutable=["intermediates"])
  last = np.asarray(state["intermediates"]["encoder"]["__call__"][0])
  np.testing.assert_allclose(logits, last @ np.asarray(dropped).T, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(embedding_output, looked_up)


def test_gpt_fine_tunings_auxiliary_lm_reads_the_dropped_table():
  """finetune-transformer-lm train.py: the fine-tuning LM's logits multiply by the dropped `we`:
  at the ids a row holds, the training logits are its last layer times those dropped rows (the
  rows its own lookups read), not the table's."""
  config = ml_collections.FrozenConfigDict(tiny.gpt(dropout=0.1))
  model = finetune_models.FineTuneModel(config, "classification", 2, backbone="causal")
  ids = jnp.asarray([[5, 7, 9, 11, 13, 15]])
  mask = jnp.ones_like(ids)
  params = nn.meta.unbox(model.init(jax.random.key(0), ids, mask, 0 * ids,
                                    deterministic=True))["params"]
  (_, lm), state = model.apply(
      {"params": params}, ids, mask, 0 * ids, deterministic=False, with_lm=True,
      rngs={"dropout": jax.random.key(1)}, mutable=["intermediates"],
      capture_intermediates=lambda m, name: isinstance(m, (encoder_lib.Encoder, layers.Embedding))
      and name == "__call__")
  captured = state["intermediates"]["encoder"]
  last = np.asarray(captured["__call__"][0])[0]                     # [length, hidden]
  rows = np.asarray(captured["word_embeddings"]["__call__"][0])[0]  # the dropped rows of ids
  np.testing.assert_allclose(np.asarray(lm)[0][:, np.asarray(ids[0])], last @ rows.T,
                             rtol=1e-5, atol=1e-5)
  table = np.asarray(params["encoder"]["word_embeddings"]["embedding"])[np.asarray(ids[0])]
  assert not np.allclose(rows, table)


def test_gpt2_initialises_positions_and_residual_projections_smaller():
  """GPT-2: wpe ~ N(0, 0.01) (model.py) and the attention and FFN output projections at
  0.02/√(2·layers) (§2.3, HF's c_proj); GPT-1 draws every one at 0.02. Measured as the ratio
  of standard deviations to the word table's / the query kernel's, over the draws."""
  for version, positions, residual in ((1, 1.0, 1.0), (2, 0.5, 1 / np.sqrt(2 * 2))):
    config = tiny.gpt(version=version, max_positions=512, mlp=256)
    assert config.layers == 2
    _, params = model_and_params(config)
    encoder = params["encoder"]
    std = lambda x: float(np.std(np.asarray(x)))  # noqa: E731
    assert std(encoder["position_embeddings"]["embedding"]) / std(
        encoder["word_embeddings"]["embedding"]) == pytest.approx(positions, rel=0.05)
    layer = encoder["layer_0"]
    query = std(layer["attention"]["query"]["kernel"])
    for kernel in (layer["attention"]["output"]["kernel"], layer["mlp"]["output"]["kernel"],
                   encoder["layer_1"]["mlp"]["output"]["kernel"]):
      assert std(kernel) / query == pytest.approx(residual, rel=0.1), version
    assert std(layer["mlp"]["intermediate"]["kernel"]) / query == pytest.approx(1.0, rel=0.1)


def test_pre_ln_has_a_final_norm_and_post_ln_none():
  _, gpt1 = model_and_params(tiny.gpt())
  _, gpt2 = model_and_params(tiny.gpt(version=2))
  assert "final_ln" not in gpt1["encoder"] and "final_ln" in gpt2["encoder"]
  assert "embeddings_ln" not in gpt1["encoder"] and "type_embeddings" not in gpt1["encoder"]
  assert set(gpt1["encoder"]["layer_0"]) == set(gpt2["encoder"]["layer_0"])


@pytest.mark.parametrize("layout", ["gpt1", "gpt2_scanned_remat"])
def test_the_cache_gives_the_full_forward_logits(layout):
  """Feeding a sequence through the KV cache in chunks of 5, 1, 1, ... gives the logits of one
  full forward pass at every position."""
  model, params = model_and_params(tiny.gpt(**LAYOUTS[layout]))
  ids = random_ids()
  full = model.apply({"params": params}, ids, jnp.ones_like(ids), deterministic=True)
  _, variables = model.apply({"params": params}, jnp.zeros_like(ids), jnp.ones_like(ids),
                             deterministic=True, decode=True, mutable=["cache"])
  cache, pieces = variables["cache"], []
  for start, stop in [(0, 5)] + [(t, t + 1) for t in range(5, tiny.LENGTH)]:
    chunk = ids[:, start:stop]
    logits, variables = model.apply({"params": params, "cache": cache}, chunk,
                                    jnp.ones_like(chunk), deterministic=True, decode=True,
                                    mutable=["cache"])
    cache = variables["cache"]
    pieces.append(logits)
  np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=0.9, top_k=5),
                                      dict(temperature=1.2, top_p=0.8)])
def test_cached_generation_equals_recomputation(sampling):
  """Prompts of 3, 7 and 1 tokens: the rows keep their prompts, the cached and the recomputing
  decodes produce the same tokens, and greedy decoding is each step's argmax of the full pass."""
  model, params = model_and_params(tiny.gpt(version=2))
  prompts, lengths = random_ids(2, 7), np.array([3, 7, 1])
  run = lambda use_cache: generate.generate(  # noqa: E731
      model, params, prompts, lengths, max_length=20, rng=jax.random.key(4),
      use_cache=use_cache, **sampling)
  cached, recomputed = run(True), run(False)
  np.testing.assert_array_equal(cached, recomputed)
  for row, length in enumerate(lengths):
    np.testing.assert_array_equal(cached[row, :length], prompts[row, :length])
  if sampling["temperature"] == 0.0:
    logits = model.apply({"params": params}, jnp.asarray(cached), jnp.ones_like(cached),
                         deterministic=True)
    for row, length in enumerate(lengths):
      np.testing.assert_array_equal(cached[row, length:],
                                    np.argmax(logits[row, length - 1:-1], axis=-1))


def test_generation_stops_rows_at_the_end_token():
  """With eos_id the greedy continuation of each row after its first eos is 0s."""
  model, params = model_and_params(tiny.gpt())
  prompts, lengths = random_ids(3, 4), np.array([4, 4, 4])
  free = generate.generate(model, params, prompts, lengths, max_length=24,
                           rng=jax.random.key(0), temperature=0.0)
  eos = int(free[0, 6])   # row 0's third generated token, taken as the end token
  stopped = generate.generate(model, params, prompts, lengths, max_length=24,
                              rng=jax.random.key(0), temperature=0.0, eos_id=eos)
  for row in range(BATCH):
    hits = np.flatnonzero(free[row, 4:] == eos)
    end = 4 + (hits[0] + 1 if len(hits) else 20)
    np.testing.assert_array_equal(stopped[row, :end], free[row, :end])
    assert not stopped[row, end:].any()


def test_top_k_and_top_p_keep_the_tokens_they_name():
  logits = jnp.log(jnp.array([[0.5, 0.2, 0.15, 0.1, 0.05]]))
  kept = lambda **kw: np.asarray(generate.filter_logits(logits, **kw) > -1e8)[0]  # noqa: E731
  np.testing.assert_array_equal(kept(top_k=2), [1, 1, 0, 0, 0])
  np.testing.assert_array_equal(kept(top_p=0.5), [1, 0, 0, 0, 0])     # 0.5 reaches 0.5
  np.testing.assert_array_equal(kept(top_p=0.6), [1, 1, 0, 0, 0])
  np.testing.assert_array_equal(kept(top_p=0.86), [1, 1, 1, 1, 0])
  np.testing.assert_array_equal(kept(top_k=3, top_p=0.99), [1, 1, 1, 0, 0])
  draws = generate.next_tokens(jnp.tile(logits, (4000, 1)), jax.random.key(0), temperature=1.0,
                               top_k=0, top_p=0.6)
  share = np.bincount(np.asarray(draws), minlength=5) / 4000
  np.testing.assert_allclose(share, [5 / 7, 2 / 7, 0, 0, 0], atol=0.03)
