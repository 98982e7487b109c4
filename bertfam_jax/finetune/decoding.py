"""Greedy and beam search for T5 (bertfam_jax.models.t5) in each architecture, jit-able.

Encoder–decoder: `T5.encode` runs once; the decoder then produces one token per step, either
from its KV cache (`use_cache=True`: one-token `decode=True` calls, see models/t5.py) or by
recomputing the whole decoder over the tokens so far (`use_cache=False`, the reference the cache
is tested against). The first decoder input is BOS = 0 (T5's pad id, seqio
`make_autoregressive_inputs`).

Decoder-only LM and prefix LM (`prefix_tokens` given): each row holds the inputs with their EOS
(its first prefix_tokens tokens), laid out as in training (`seq2seq.featurize_decoder_only`,
seqio's PrefixLMFeatureConverter: BOS, the inputs, then the targets; the prefix LM's inputs and
one position more attending both ways). The reference recomputes that row at every step. The
cache is prefilled by one call over the rows left-padded so that every row's prefix ends at the
same position, then one-token steps follow (models/t5.py: the relative position bias sees only
distances, and the padding is never attended to), so a step costs one position instead of the
whole row.

Outputs are [batch, max_length] int32: the generated tokens, EOS included when one was produced,
0 after it. Wrap a call in `jax.jit(functools.partial(greedy_decode, model, max_length=...,
eos_id=...))` to compile it; every loop is a `lax.while_loop`, so the whole search is one program.

Beam search follows t5x `decoding.beam_search`: 2·beam candidates per step, the best `beam_size`
that do not end in EOS stay alive, those that end in EOS within the top `beam_size` (fairseq's and
HF's rule; t5x accepts any of the 2·beam) compete for the `beam_size` finished slots with score
log p / brevity_penalty; it stops when no alive beam can still beat the worst finished one.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from bertfam_jax.models import t5

NEG_INF = -1.0e7  # t5x: finite, so NEG_INF − NEG_INF never makes a NaN

# step_fn(sequences [N, max_length] int32 (positions ≥ step still 0), step, state)
#   → (logits [N, vocab] for position `step`, new state)
StepFn = Callable[[jax.Array, jax.Array, Any], tuple[jax.Array, Any]]


def brevity_penalty(alpha: float, length):
  """GNMT / t5x length normalisation ((5 + length) / 6)^alpha; alpha = 0 ranks by log p alone."""
  return ((5.0 + length) / 6.0) ** alpha


# ------------------------------------------------------------------------- model step functions


def _decoder_inputs_at(sequences, step):
  """[N, L] tokens → [N, 1]: the decoder input at position `step` (BOS 0, then the previous
  token)."""
  previous = jax.lax.dynamic_slice_in_dim(sequences, jnp.maximum(step - 1, 0), 1, axis=1)
  return jnp.where(step == 0, 0, previous)


_KV = ("cached_key", "cached_value")


def _name(path) -> str | None:
  return getattr(path[-1], "key", None)


def _reorder_rows(model, cache, parents):
  """A decoding cache (models/t5.py) with its rows taken from `parents` [N]."""
  batch_axis = 1 if model.config.scan_layers else 0  # scanned caches lead with [layers]

  def gather(path, leaf):
    if _name(path) in _KV:
      return jnp.take(leaf, parents, axis=batch_axis)
    if _name(path) == "first_key":
      return jnp.take(leaf, parents, axis=0)
    return leaf   # cache_index, key_positions: the same for every row
  return jax.tree_util.tree_map_with_path(gather, cache)


def _model_step_fn(model, params, input_ids, *, repeat: int, max_length: int, use_cache: bool):
  """(step_fn, initial state, reorder(state, flat parent indices [N])) for the model, with the
  encoder run once on input_ids [batch, Li] and its outputs repeated `repeat` times per row."""
  input_segment_ids = (input_ids != 0).astype(jnp.int32)
  encoded = model.apply({"params": params}, input_ids, input_segment_ids, deterministic=True,
                        method=t5.T5.encode)
  encoded = jnp.repeat(encoded, repeat, axis=0)
  input_segment_ids = jnp.repeat(input_segment_ids, repeat, axis=0)
  decode = lambda variables, ids, **kw: model.apply(  # noqa: E731
      variables, encoded, input_segment_ids, ids, deterministic=True, method=t5.T5.decode, **kw)

  if not use_cache:
    def recompute_step(sequences, step, state):
      bos = jnp.zeros((sequences.shape[0], 1), sequences.dtype)
      logits = decode({"params": params}, jnp.concatenate([bos, sequences[:, :-1]], axis=1))
      return jax.lax.dynamic_index_in_dim(logits, step, axis=1, keepdims=False), state
    return recompute_step, (), lambda state, parents: state

  # The first decode=True call at full length creates the cache (index 0: nothing cached). Its
  # keys/values are replaced by zeros, which the steps overwrite anyway, so that the call's
  # decoder pass is dead code under jit.
  _, variables = decode({"params": params},
                        jnp.zeros((encoded.shape[0], max_length), jnp.int32),
                        decode=True, mutable=["cache"])
  cache = jax.tree_util.tree_map_with_path(
      lambda path, leaf: jnp.zeros_like(leaf) if _name(path) in _KV else leaf,
      variables["cache"])

  def cached_step(sequences, step, cache):
    logits, variables = decode({"params": params, "cache": cache},
                               _decoder_inputs_at(sequences, step), decode=True,
                               mutable=["cache"])
    return logits[:, 0], variables["cache"]

  return cached_step, cache, functools.partial(_reorder_rows, model)


def _decoder_only_step_fn(model, params, rows, prefix_tokens, *, repeat: int, max_length: int,
                          use_cache: bool):
  """(step_fn, initial state, reorder) for a decoder-only / prefix-LM T5 whose rows [batch, W]
  begin with their inputs and EOS (prefix_tokens [batch] of them, 1 ≤ prefix ≤ W; the rest is
  ignored), each repeated `repeat` times. Generated token t sits at position prefix + t of the
  row."""
  batch, width = rows.shape
  total = width + max_length
  columns_L = jnp.arange(total)
  prefix_B = prefix_tokens.astype(jnp.int32)
  apply = lambda variables, ids, segments, columns_both_ways=None, **kw: model.apply(  # noqa: E731
      variables, None, None, ids, segments, deterministic=True, method=t5.T5.decode,
      **t5.prefix_lm_keyword(model.config, columns_both_ways), **kw)

  if not use_cache:   # the row as in training: prefix, then the tokens so far; BOS shifted in
    rows = jnp.repeat(rows, repeat, axis=0)
    prefix_N = jnp.repeat(prefix_B, repeat, axis=0)
    n = batch * repeat
    inputs_NL = jnp.where(columns_L[None] < prefix_N[:, None],
                          jnp.pad(rows, ((0, 0), (0, max_length))), 0)
    both_ways_NL = (columns_L[None] <= prefix_N[:, None]).astype(jnp.int32)
    ones_NL = jnp.ones((n, total), jnp.int32)
    rows_N = jnp.arange(n)

    def recompute_step(sequences, step, state):
      generated_at = columns_L[None] - prefix_N[:, None]
      generated_NL = jnp.take_along_axis(sequences, jnp.clip(generated_at, 0, max_length - 1), 1)
      targets_NL = jnp.where(generated_at >= 0, generated_NL, inputs_NL)
      logits = apply({"params": params}, jnp.pad(targets_NL[:, :-1], ((0, 0), (1, 0))), ones_NL,
                     both_ways_NL)
      return logits[rows_N, prefix_N + step], state
    return recompute_step, (), lambda state, parents: state

  # Prefill, once per example: the shifted prefix (BOS, inputs, EOS) right-aligned to end at
  # column `width`, where the first target is predicted; the steps then fill columns width + 1,
  # width + 2, ... Then the first logits and the cache are repeated for the beams.
  first_B = width - prefix_B                       # the BOS column
  source_BL = columns_L[None] - first_B[:, None] - 1
  prompt_BL = (columns_L[None] >= first_B[:, None]) & (columns_L[None] <= width)
  ids_BL = jnp.where(prompt_BL & (source_BL >= 0),
                     jnp.take_along_axis(rows, jnp.clip(source_BL, 0, width - 1), 1), 0)
  logits, variables = apply({"params": params}, ids_BL, prompt_BL.astype(jnp.int32),
                            jnp.broadcast_to(columns_L <= width, (batch, total)).astype(jnp.int32),
                            decode=True, cache_start=width + 1, mutable=["cache"])
  copies = jnp.repeat(jnp.arange(batch), repeat)
  first_logits = logits[copies, width]
  cache = _reorder_rows(model, variables["cache"], copies)
  ones_N1 = jnp.ones((batch * repeat, 1), jnp.int32)

  def cached_step(sequences, step, state):
    first_logits, cache = state

    def one_token():
      logits, variables = apply({"params": params, "cache": cache},
                                _decoder_inputs_at(sequences, step), ones_N1, decode=True,
                                mutable=["cache"])
      return logits[:, 0], variables["cache"]
    logits, cache = jax.lax.cond(step == 0, lambda: (first_logits, cache), one_token)
    return logits, (first_logits, cache)

  # The first logits are read at step 0 only, and are the same for an example's beams.
  return (cached_step, (first_logits, cache),
          lambda state, parents: (state[0], _reorder_rows(model, state[1], parents)))


def _step_fn(model, params, input_ids, prefix_tokens, **kw):
  if model.config.architecture == "encoder_decoder":
    if prefix_tokens is not None:
      raise ValueError("prefix_tokens are for a decoder-only / prefix-LM T5; an encoder-decoder "
                       "takes the inputs alone.")
    return _model_step_fn(model, params, input_ids, **kw)
  if prefix_tokens is None:
    raise ValueError(f"A {model.config.architecture!r} T5 decodes rows that begin with their "
                     f"inputs: pass prefix_tokens.")
  return _decoder_only_step_fn(model, params, input_ids, prefix_tokens, **kw)


# --------------------------------------------------------------------------------- the searches


def greedy_search(step_fn: StepFn, state, *, batch_size: int, max_length: int,
                  eos_id: int) -> jax.Array:
  """Argmax at every step until each row has produced EOS → [batch_size, max_length] int32."""

  def body(carry):
    step, sequences, finished, state = carry
    logits, state = step_fn(sequences, step, state)
    tokens = jnp.where(finished, 0, jnp.argmax(logits, axis=-1).astype(jnp.int32))
    sequences = sequences.at[:, step].set(tokens)
    return step + 1, sequences, finished | (tokens == eos_id), state

  def cond(carry):
    step, _, finished, _ = carry
    return (step < max_length) & ~jnp.all(finished)

  init = (jnp.array(0), jnp.zeros((batch_size, max_length), jnp.int32),
          jnp.zeros((batch_size,), jnp.bool_), state)
  return jax.lax.while_loop(cond, body, init)[1]


def _gather_beams(x, indices):
  """x [batch, beams, ...], indices [batch, k] → [batch, k, ...]."""
  return jax.vmap(lambda row, idx: row[idx])(x, indices)


def search_beams(step_fn: StepFn, state, reorder, *, batch_size: int, beam_size: int,
                 max_length: int, eos_id: int, alpha: float) -> jax.Array:
  """Beam search over `step_fn` (rows of its batch: batch-major, beam_size per example) →
  the best finished sequence per example [batch_size, max_length] (the best alive one where
  none finished). `reorder(state, parents [batch_size·beam_size])` reorders the state's rows."""
  b, k, length = batch_size, beam_size, max_length

  def body(carry):
    step, alive, alive_logp, finished, finished_score, finished_flag, state = carry
    logits, state = step_fn(alive.reshape(b * k, length), step, state)
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    vocab = log_probs.shape[-1]
    candidates = (alive_logp[:, :, None] + log_probs.reshape(b, k, vocab)).reshape(b, k * vocab)
    top_logp, top_index = jax.lax.top_k(candidates, 2 * k)
    parents, tokens = top_index // vocab, (top_index % vocab).astype(jnp.int32)
    sequences = _gather_beams(alive, parents).at[:, :, step].set(tokens)
    ends = tokens == eos_id
    # Alive: the best k candidates that do not end here.
    alive_logp, keep = jax.lax.top_k(jnp.where(ends, NEG_INF, top_logp), k)
    # Finishing needs an EOS candidate ranked within the top k (fairseq / HF beam search; t5x
    # takes any of the 2k): then beam_size 1 with alpha 0 is exactly greedy search.
    ends = ends & (jnp.arange(2 * k) < k)[None, :]
    alive = _gather_beams(sequences, keep)
    kept_parents = _gather_beams(parents, keep)
    state = reorder(state, (jnp.arange(b)[:, None] * k + kept_parents).reshape(-1))
    # Finished: the best k among the old finished and the candidates ending in EOS now.
    new_score = jnp.where(ends, top_logp / brevity_penalty(alpha, step + 1), NEG_INF)
    finished_score, best = jax.lax.top_k(
        jnp.concatenate([finished_score, new_score], axis=1), k)
    finished = _gather_beams(jnp.concatenate([finished, sequences], axis=1), best)
    finished_flag = _gather_beams(jnp.concatenate([finished_flag, ends], axis=1), best)
    return step + 1, alive, alive_logp, finished, finished_score, finished_flag, state

  def cond(carry):
    step, _, alive_logp, _, finished_score, finished_flag, _ = carry
    # Log probabilities only fall and the penalty is largest at max_length, so this bounds the
    # score any alive beam can still reach (t5x beam_search_loop_cond_fn).
    best_alive = alive_logp[:, :1] / brevity_penalty(alpha, length)
    worst_finished = jnp.where(finished_flag, finished_score.min(axis=1, keepdims=True),
                               NEG_INF)
    return (step < length) & ~jnp.all(worst_finished > best_alive)

  sequences = jnp.zeros((b, k, length), jnp.int32)
  # Only beam 0 is live at the start, so the first step does not pick k copies of one token.
  alive_logp = jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1)), (b, 1))
  init = (jnp.array(0), sequences, alive_logp, sequences, jnp.full((b, k), NEG_INF),
          jnp.zeros((b, k), jnp.bool_), state)
  _, alive, _, finished, _, finished_flag, _ = jax.lax.while_loop(cond, body, init)
  return jnp.where(finished_flag[:, :1], finished[:, 0], alive[:, 0])


# ---------------------------------------------------------------------------------- public API


def greedy_decode(model, params, input_ids, *, max_length: int, eos_id: int,
                  use_cache: bool = True, prefix_tokens=None) -> jax.Array:
  """input_ids [batch, Li] (0 = pad) → greedy output ids [batch, max_length] (0 after EOS).
  A decoder-only / prefix-LM T5: input_ids are rows that begin with the inputs and their EOS,
  prefix_tokens [batch] of them (the module docstring)."""
  step_fn, state, _ = _step_fn(model, params, input_ids, prefix_tokens, repeat=1,
                               max_length=max_length, use_cache=use_cache)
  return greedy_search(step_fn, state, batch_size=input_ids.shape[0], max_length=max_length,
                       eos_id=eos_id)


def beam_search(model, params, input_ids, *, max_length: int, eos_id: int, beam_size: int,
                alpha: float, use_cache: bool = True, prefix_tokens=None) -> jax.Array:
  """input_ids [batch, Li] → the best beam [batch, max_length] (0 after EOS); `alpha` is the
  brevity penalty exponent (t5x `alpha`, T5's decoding used 0.6); prefix_tokens as in
  `greedy_decode`."""
  step_fn, state, reorder = _step_fn(model, params, input_ids, prefix_tokens, repeat=beam_size,
                                     max_length=max_length, use_cache=use_cache)
  return search_beams(step_fn, state, reorder, batch_size=input_ids.shape[0],
                      beam_size=beam_size, max_length=max_length, eos_id=eos_id, alpha=alpha)
