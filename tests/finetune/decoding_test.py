"""bertfam_jax.finetune.decoding: greedy output is the argmax of the teacher-forced logits fed its
own output; the KV cache gives exactly the uncached (full recompute) greedy and beam outputs, also
with scanned layers, and for a decoder-only LM and a prefix LM (their cache prefilled over
left-padded inputs); beam_size 1 = greedy; on a hand-made chain of probabilities beam search finds
the better sequence greedy misses, and the brevity penalty changes the choice as t5x's does."""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertfam_jax.finetune import decoding
from bertfam_jax.finetune import seq2seq
from bertfam_jax.models import t5
from bertfam_jax.train import sharding
from helpers import tiny

VOCAB, EOS, BATCH, INPUTS, MAX_LENGTH = 13, 3, 3, 7, 6


def tiny_config(**overrides):
  return tiny.t5(**{**dict(vocab_size=VOCAB, layers=1, mlp=48, tie_embeddings=False),
                    **overrides})


MODELS = {"unrolled": t5.T5(tiny_config()), "scanned": t5.T5(tiny_config(scan_layers=True))}


@pytest.fixture(scope="module")
def setup():
  """(params, input_ids [BATCH, INPUTS] with padding) of an untied model whose pad logit column
  is negated: random weights otherwise mostly predict 0, a trained model never does. With these
  seeds one greedy output ends in EOS at position 2, the others run to MAX_LENGTH."""
  rng = np.random.default_rng(0)
  input_ids = rng.integers(4, VOCAB, (BATCH, INPUTS)).astype(np.int32)
  input_ids[1, 4:] = 0
  params = nn.unbox(jax.jit(lambda: MODELS["unrolled"].init(
      jax.random.key(1), input_ids, input_ids[:, :MAX_LENGTH], deterministic=True))())["params"]
  kernel = params["decoder"]["logits_dense"]["kernel"]
  params["decoder"]["logits_dense"]["kernel"] = kernel.at[:, 0].multiply(-1.0)
  return params, input_ids


@functools.lru_cache(maxsize=None)
def decode_fn(search: str, layers: str = "unrolled", **kwargs):
  """The jitted decoding.<search> of MODELS[layers], compiled once per argument set."""
  return jax.jit(functools.partial(getattr(decoding, search), MODELS[layers],
                                   max_length=MAX_LENGTH, eos_id=EOS, **kwargs))


def test_greedy_is_argmax_of_teacher_forced_logits_and_cache_matches_recompute(setup):
  params, input_ids = setup
  cached = np.asarray(decode_fn("greedy_decode")(params, input_ids))
  np.testing.assert_array_equal(
      decode_fn("greedy_decode", use_cache=False)(params, input_ids), cached)
  ends = [list(row).index(EOS) + 1 if EOS in row else MAX_LENGTH for row in cached]
  assert min(ends) < MAX_LENGTH  # some row stopped early: the 0-after-EOS path is exercised
  decoder_inputs = np.pad(cached, ((0, 0), (1, 0)))[:, :-1]
  logits = MODELS["unrolled"].apply({"params": params}, input_ids, decoder_inputs,
                                    deterministic=True)
  argmax = np.asarray(jnp.argmax(logits, axis=-1))
  for row, end in enumerate(ends):
    np.testing.assert_array_equal(cached[row, :end], argmax[row, :end])
    np.testing.assert_array_equal(cached[row, end:], 0)


def test_beam_search_cache_matches_recompute_and_beam_one_is_greedy(setup):
  params, input_ids = setup
  cached = decode_fn("beam_search", beam_size=3, alpha=0.6)(params, input_ids)
  uncached = decode_fn("beam_search", beam_size=3, alpha=0.6, use_cache=False)(params, input_ids)
  np.testing.assert_array_equal(cached, uncached)
  np.testing.assert_array_equal(decode_fn("beam_search", beam_size=1, alpha=0.0)(params,
                                                                                 input_ids),
                                decode_fn("greedy_decode")(params, input_ids))


def test_scanned_decoder_cache_matches_unrolled(setup):
  """With scan_layers the cache leads with a [layers] axis; beam reordering must gather the
  batch axis behind it."""
  params, input_ids = setup
  stack = lambda tree, n: {"layers": jax.tree.map(  # noqa: E731
      lambda *xs: jnp.stack(xs), *[tree[f"layer_{i}"] for i in range(n)]),
      **{k: v for k, v in tree.items() if not k.startswith("layer_")}}
  scanned_params = dict(params, encoder=stack(params["encoder"], 1),
                        decoder=stack(params["decoder"], 2))
  np.testing.assert_array_equal(
      decode_fn("beam_search", "scanned", beam_size=3, alpha=0.6)(scanned_params, input_ids),
      decode_fn("beam_search", beam_size=3, alpha=0.6)(params, input_ids))


DECODER_ONLY = {architecture: t5.T5(tiny_config(architecture=architecture))
                for architecture in ("decoder_only", "prefix_lm")}
ROW_WIDTH = 9


@pytest.fixture(scope="module")
def decoder_only_setup():
  """(params, rows [BATCH, ROW_WIDTH], prefix_tokens [BATCH]): rows begin with inputs of 3, 8
  and 5 tokens ending in EOS, then random tokens decoding must ignore; the pad logit negated as
  in `setup` (the two architectures have the same parameters)."""
  rng = np.random.default_rng(2)
  rows = rng.integers(4, VOCAB, (BATCH, ROW_WIDTH)).astype(np.int32)
  prefix_tokens = np.array([3, 8, 5], np.int32)
  rows[np.arange(BATCH), prefix_tokens - 1] = EOS
  params = nn.unbox(jax.jit(lambda: DECODER_ONLY["decoder_only"].init(
      jax.random.key(4), None, rows, deterministic=True))())["params"]
  kernel = params["decoder"]["logits_dense"]["kernel"]
  params["decoder"]["logits_dense"]["kernel"] = kernel.at[:, 0].multiply(-1.0)
  return params, rows, prefix_tokens


@functools.lru_cache(maxsize=None)
def decoder_only_fn(search: str, architecture: str, **kwargs):
  return jax.jit(functools.partial(getattr(decoding, search), DECODER_ONLY[architecture],
                                   max_length=MAX_LENGTH, eos_id=EOS, **kwargs))


@pytest.mark.parametrize("architecture", ["decoder_only", "prefix_lm"])
def test_decoder_only_prefilled_cache_matches_recompute(decoder_only_setup, architecture):
  """The cached search (inputs left-padded to end together, prefilled in one call, one-token
  steps) gives exactly the outputs of recomputing the training-layout row at every step
  (tests/finetune/seq2seq_test.py checks that against a hand-built loop), greedy and beam."""
  params, rows, prefix_tokens = decoder_only_setup
  run = lambda search, **kw: np.asarray(decoder_only_fn(search, architecture, **kw)(  # noqa: E731
      params, rows, prefix_tokens=prefix_tokens))
  greedy = run("greedy_decode")
  assert len({tuple(row) for row in greedy}) == BATCH   # each row decodes from its own inputs
  np.testing.assert_array_equal(run("greedy_decode", use_cache=False), greedy)
  beams = run("beam_search", beam_size=3, alpha=0.6)
  np.testing.assert_array_equal(run("beam_search", beam_size=3, alpha=0.6, use_cache=False),
                                beams)
  np.testing.assert_array_equal(run("beam_search", beam_size=1, alpha=0.0), greedy)


def test_scanned_prefix_lm_cache_matches_unrolled(decoder_only_setup):
  """A scanned decoder-only stack's cache, repeated for the beams and reordered by them along
  the batch axis behind [layers]."""
  params, rows, prefix_tokens = decoder_only_setup
  layers = [params["decoder"][f"layer_{i}"] for i in range(2)]
  decoder = {k: v for k, v in params["decoder"].items() if not k.startswith("layer_")}
  scanned_params = dict(params, decoder=dict(decoder, layers=jax.tree.map(
      lambda *xs: jnp.stack(xs), *layers)))
  scanned = t5.T5(tiny_config(architecture="prefix_lm", scan_layers=True))
  search = functools.partial(decoding.beam_search, max_length=MAX_LENGTH, eos_id=EOS,
                             beam_size=3, alpha=0.6, prefix_tokens=prefix_tokens)
  np.testing.assert_array_equal(
      jax.jit(functools.partial(search, scanned))(scanned_params, rows),
      decoder_only_fn("beam_search", "prefix_lm", beam_size=3, alpha=0.6)(
          params, rows, prefix_tokens=prefix_tokens))


def test_prefix_lm_search_on_a_2x2x2_mesh_equals_one_device(decoder_only_setup):
  """seq2seq.make_search (what fine-tuning evaluates with): parameters sharded by their logical
  axes, the batch over data × fsdp, the prefilled cache and its steps under one jit."""
  params, rows, prefix_tokens = decoder_only_setup
  model = DECODER_ONLY["prefix_lm"]
  batch = dict(decoder_target_ids=np.pad(rows[[0, 1, 2, 0]], ((0, 0), (0, MAX_LENGTH))),
               prefix_tokens=prefix_tokens[[0, 1, 2, 0]])
  boxed = jax.eval_shape(lambda: model.init(jax.random.key(4), None, rows, deterministic=True,
                                            decoder_causal_attention=np.ones_like(rows)))
  outputs = []
  for mesh in (sharding.make_mesh(dict(data=2, fsdp=2, tensor=2)),
               sharding.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])):
    search = seq2seq.make_search(model, sharding.logical_to_shardings(boxed, mesh), mesh,
                                 max_length=MAX_LENGTH, eos_id=EOS, beam_size=2, alpha=0.6)
    outputs.append(np.asarray(search({"params": params}, batch)))
  np.testing.assert_array_equal(outputs[0], outputs[1])
  np.testing.assert_array_equal(outputs[0][:3], decoder_only_fn(
      "beam_search", "prefix_lm", beam_size=2, alpha=0.6)(params, rows,
                                                           prefix_tokens=prefix_tokens))


def test_prefix_tokens_are_for_decoder_only_models(setup, decoder_only_setup):
  params, input_ids = setup
  with pytest.raises(ValueError, match="prefix_tokens are for a decoder-only"):
    decoding.greedy_decode(MODELS["unrolled"], params, input_ids, max_length=2, eos_id=EOS,
                           prefix_tokens=np.ones(BATCH, np.int32))
  params, rows, _ = decoder_only_setup
  with pytest.raises(ValueError, match="pass prefix_tokens"):
    decoding.greedy_decode(DECODER_ONLY["prefix_lm"], params, rows, max_length=2, eos_id=EOS)


def chain_step_fn(next_token_probs):
  """A hand-made model: p(next | previous token) from a table {previous: {token: p}}; the
  first step's previous token is BOS 0."""
  table = np.full((VOCAB, VOCAB), 1e-9)
  for previous, probs in next_token_probs.items():
    for token, p in probs.items():
      table[previous, token] = p
  log_table = jnp.asarray(np.log(table / table.sum(-1, keepdims=True)), jnp.float32)

  def step_fn(sequences, step, state):
    return log_table[decoding._decoder_inputs_at(sequences, step)[:, 0]], state
  return step_fn


# BOS → 4 (0.6) or 5 (0.4); after 4 nothing is likely (EOS 0.3, 6 0.36, 7 0.34) and 6, 7 end
# surely; after 5, EOS at 0.9. Greedy: 4 6 EOS, p = 0.6·0.36 = 0.216; best: 5 EOS, p = 0.36.
CHAIN = {0: {4: 0.6, 5: 0.4}, 4: {EOS: 0.3, 6: 0.36, 7: 0.34}, 5: {EOS: 0.9, 8: 0.1},
         6: {EOS: 1.0}, 7: {EOS: 1.0}}


def test_beam_search_finds_the_sequence_greedy_misses():
  step_fn = chain_step_fn(CHAIN)
  greedy = decoding.greedy_search(step_fn, (), batch_size=1, max_length=5, eos_id=EOS)
  np.testing.assert_array_equal(greedy, [[4, 6, EOS, 0, 0]])
  best = decoding.search_beams(step_fn, (), lambda state, parents: state, batch_size=1,
                               beam_size=2, max_length=5, eos_id=EOS, alpha=0.0)
  np.testing.assert_array_equal(best, [[5, EOS, 0, 0, 0]])


def test_brevity_penalty_can_prefer_the_longer_sequence():
  """Scores log p / ((5 + len) / 6)^alpha (t5x): 5 EOS (len 2, p 0.36) against 4 6 EOS (len 3,
  p 0.216). The longer one wins once alpha exceeds the crossover computed here."""
  crossover = math.log(math.log(0.216) / math.log(0.36)) / math.log(8 / 7)
  step_fn = chain_step_fn(CHAIN)
  search = functools.partial(decoding.search_beams, step_fn, (), lambda state, parents: state,
                             batch_size=1, beam_size=2, max_length=5, eos_id=EOS)
  np.testing.assert_array_equal(search(alpha=crossover - 0.1), [[5, EOS, 0, 0, 0]])
  np.testing.assert_array_equal(search(alpha=crossover + 0.1), [[4, 6, EOS, 0, 0]])
