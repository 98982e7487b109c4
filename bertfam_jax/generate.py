r"""Text from a GPT run (a causal_lm workdir): greedy decoding, or sampling with a temperature,
top-k and nucleus (top-p) filtering, with a KV cache. A function and a CLI:

  python -m bertfam_jax.generate --workdir=runs/gpt-local --prompt="The history of" \
      [--prompts=prompts.txt] [--max_new_tokens=50] [--temperature=0.8] [--top_k=40] \
      [--top_p=0.9] [--greedy] [--seed=0]

  tokens = generate.generate(model, params, prompt_ids, prompt_lengths, max_length=64,
                             rng=jax.random.key(0), temperature=0.8, top_k=40)

How a batch of prompts of different lengths is decoded: the rows advance together one position
per step from their shortest prompt on (the positions every row shares are run through the model
in one call first); a row still inside its prompt takes its prompt's next token instead of the
sampled one, so every row sees exactly its own prompt at positions 0.. and no padding. A row
stops after the end-of-document token (`<eod>` of configs/gpt.py's tokenizer) and is padded
with 0 after it. Step t's draw uses `fold_in(rng, t)`, so the cached and the recomputing paths
(`use_cache=False`, the whole prefix through the model at every step) draw the same tokens.
"""

from __future__ import annotations

import functools
import sys
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from bertfam_jax import fileio, objectives
from bertfam_jax import workdir as workdir_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.data import packing

NEG_INF = -1.0e9


def filter_logits(logits_BV, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0):
  """[batch, vocab] logits → logits / temperature with every token outside the top k (k > 0)
  and outside the nucleus (the fewest most-probable tokens whose probability reaches top_p < 1;
  Holtzman et al. 2020, as transformers' TopPLogitsWarper: the most probable always stays) set
  to NEG_INF. Float32."""
  logits_BV = logits_BV.astype(jnp.float32) / temperature
  if 0 < top_k < logits_BV.shape[-1]:
    kth_B1 = jax.lax.top_k(logits_BV, top_k)[0][:, -1:]
    logits_BV = jnp.where(logits_BV < kth_B1, NEG_INF, logits_BV)
  if top_p < 1.0:
    sorted_BV = jnp.sort(logits_BV, axis=-1)[:, ::-1]
    probs_BV = jax.nn.softmax(sorted_BV, axis=-1)
    before_BV = jnp.cumsum(probs_BV, axis=-1) - probs_BV   # the mass of the more probable ones
    kept_BV = before_BV < top_p
    cutoff_B1 = jnp.min(jnp.where(kept_BV, sorted_BV, jnp.inf), axis=-1, keepdims=True)
    logits_BV = jnp.where(logits_BV < cutoff_B1, NEG_INF, logits_BV)
  return logits_BV


def next_tokens(logits_BV, rng, *, temperature: float, top_k: int, top_p: float):
  """[batch, vocab] → [batch] int32: the argmax when temperature == 0 (greedy), else a draw
  from the filtered distribution (`filter_logits`)."""
  if temperature == 0.0:
    return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
  filtered_BV = filter_logits(logits_BV, temperature=temperature, top_k=top_k, top_p=top_p)
  return jax.random.categorical(rng, filtered_BV, axis=-1).astype(jnp.int32)


def generate(model, params, prompt_ids, prompt_lengths, *, max_length: int, rng,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             eos_id: int | None = None, use_cache: bool = True) -> np.ndarray:
  """Continues each prompt up to `max_length` tokens.

  Args:
    model: a causal model (`models.pretraining.CausalLM`); params: its parameter tree.
    prompt_ids: [batch, ≤ max_length] int, each row's prompt from position 0, then anything.
    prompt_lengths: [batch] int ≥ 1.
    max_length: the tokens of each output row (≤ model.max_positions).
    rng: a jax key; temperature 0 is greedy; top_k 0 and top_p 1 filter nothing.
    eos_id: a row ends after generating it (then 0s); None: every row runs to max_length.
    use_cache: the KV cache (False: recompute the prefix at every step; the same tokens).

  Returns:
    [batch, max_length] int32: the prompts and their continuations.
  """
  prompt_lengths = np.asarray(prompt_lengths, np.int32)
  if prompt_lengths.min() < 1 or prompt_lengths.max() > max_length:
    raise ConfigError(f"Prompt lengths {prompt_lengths.min()}..{prompt_lengths.max()} must be in "
                      f"[1, max_length={max_length}].")
  if max_length > model.config.max_positions:
    raise ConfigError(f"max_length={max_length} exceeds the model's {model.config.max_positions} "
                      "positions; generate fewer tokens or shorten the prompts.")
  tokens = np.zeros((len(prompt_lengths), max_length), np.int32)
  width = min(np.shape(prompt_ids)[1], max_length)
  tokens[:, :width] = np.asarray(prompt_ids)[:, :width]
  tokens *= np.arange(max_length)[None] < prompt_lengths[:, None]
  run = _jitted(model, max_length, int(prompt_lengths.min()), float(temperature), int(top_k),
                float(top_p), -1 if eos_id is None else int(eos_id), use_cache)
  return np.asarray(run(params, jnp.asarray(tokens), jnp.asarray(prompt_lengths), rng))


def _jitted(model, max_length, shared, temperature, top_k, top_p, eos_id, use_cache):
  """The whole decode as one jitted function of (params, tokens, prompt_lengths, rng)."""
  choose = functools.partial(next_tokens, temperature=temperature, top_k=top_k, top_p=top_p)

  def run(params, tokens_BL, lengths_B, rng):
    batch = tokens_BL.shape[0]
    ones_BL = jnp.ones_like(tokens_BL)
    if use_cache:
      _, variables = model.apply({"params": params}, jnp.zeros_like(tokens_BL), ones_BL,
                                 deterministic=True, decode=True, mutable=["cache"])
      cache = variables["cache"]
      if shared > 1:   # the positions every prompt has, in one call
        _, variables = model.apply({"params": params, "cache": cache}, tokens_BL[:, :shared - 1],
                                   ones_BL[:, :shared - 1], deterministic=True, decode=True,
                                   mutable=["cache"])
        cache = variables["cache"]
    else:
      cache = ()

    def logits_after(t, tokens_BL, cache):
      """The logits for position t + 1 [batch, vocab], from the token at t."""
      if not use_cache:
        logits_BLV = model.apply({"params": params}, tokens_BL, ones_BL, deterministic=True)
        return jax.lax.dynamic_index_in_dim(logits_BLV, t, axis=1, keepdims=False), cache
      token_B1 = jax.lax.dynamic_slice_in_dim(tokens_BL, t, 1, axis=1)
      logits_B1V, variables = model.apply({"params": params, "cache": cache}, token_B1,
                                          jnp.ones_like(token_B1), deterministic=True,
                                          decode=True, mutable=["cache"])
      return logits_B1V[:, 0], variables["cache"]

    def body(carry):
      t, tokens_BL, finished_B, cache = carry
      logits_BV, cache = logits_after(t, tokens_BL, cache)
      drawn_B = choose(logits_BV, jax.random.fold_in(rng, t))
      in_prompt_B = t + 1 < lengths_B
      given_B = jax.lax.dynamic_index_in_dim(tokens_BL, t + 1, axis=1, keepdims=False)
      token_B = jnp.where(in_prompt_B, given_B, jnp.where(finished_B, 0, drawn_B))
      tokens_BL = jax.lax.dynamic_update_slice_in_dim(tokens_BL, token_B[:, None], t + 1, axis=1)
      finished_B = finished_B | (~in_prompt_B & (token_B == eos_id))
      return t + 1, tokens_BL, finished_B, cache

    def cond(carry):
      t, _, finished_B, _ = carry
      return (t + 1 < max_length) & ~jnp.all(finished_B)

    init = (jnp.array(shared - 1), tokens_BL, jnp.zeros((batch,), jnp.bool_), cache)
    return jax.lax.while_loop(cond, body, init)[1]

  return jax.jit(run)


def load(path: str):
  """(model, params, tokenizer, config) of a causal_lm workdir."""
  config, tokenizer, params = workdir_lib.load(path)
  if config.objective.name != "causal_lm":
    raise ConfigError(f"{path} is a {config.objective.name!r} run; generation needs a causal "
                      "language model (configs/gpt.py).")
  return objectives.get("causal_lm").build_model(config), params, tokenizer, config


def generate_texts(path: str, prompts: Sequence[str], *, max_new_tokens: int = 50, seed: int = 0,
                   **sampling) -> list[str]:
  """Each prompt continued by the run at `path` (`generate`'s `sampling` options), decoded."""
  model, params, tokenizer, _ = load(path)
  encoded = tokenizer.encode(list(prompts))
  lengths = np.array([len(ids) for ids in encoded], np.int32)
  if (lengths == 0).any():
    raise ConfigError("A prompt encodes to no tokens; give every prompt some text.")
  ids = np.zeros((len(encoded), lengths.max()), np.int32)
  for row, piece in enumerate(encoded):
    ids[row, :len(piece)] = piece
  out = generate(model, params, ids, lengths, max_length=int(lengths.max()) + max_new_tokens,
                 rng=jax.random.key(seed), eos_id=packing.eod_id(tokenizer), **sampling)
  texts = []
  eod = packing.eod_id(tokenizer)
  for row, length in zip(out, lengths):
    continuation = row[length:length + max_new_tokens]
    ends = np.flatnonzero(continuation == eod)
    continuation = continuation[:ends[0]] if len(ends) else continuation   # and the 0s after it
    texts.append(tokenizer.decode(row[:length].tolist() + continuation.tolist()))
  return texts


def define_flags() -> None:
  """The CLI's flags (defined when run as a program: other CLIs' modules name theirs alike)."""
  flags.DEFINE_string("workdir", None, "a causal_lm (GPT) workdir")
  flags.DEFINE_multi_string("prompt", [], "a prompt (repeatable)")
  flags.DEFINE_string("prompts", "", "a UTF-8 file of prompts, one per line")
  flags.DEFINE_integer("max_new_tokens", 50, "tokens generated after each prompt")
  flags.DEFINE_float("temperature", 1.0, "softmax temperature (> 0); see --greedy")
  flags.DEFINE_integer("top_k", 0, "keep the k most probable tokens (0: all)")
  flags.DEFINE_float("top_p", 1.0, "keep the nucleus of this probability mass (1: all)")
  flags.DEFINE_bool("greedy", False, "the most probable token at every step")
  flags.DEFINE_integer("seed", 0, "the sampling seed")


def main(argv: Sequence[str]) -> int:
  del argv
  f = flags.FLAGS
  try:
    if not f.workdir:
      raise ConfigError("--workdir is required.")
    prompts = list(f.prompt)
    if f.prompts:
      if not fileio.isfile(f.prompts):
        raise ConfigError(f"--prompts={f.prompts} is not a file; pass a UTF-8 text file, one "
                          "prompt per line.")
      prompts += [line for line in fileio.read_text(f.prompts).splitlines() if line.strip()]
    if not prompts:
      raise ConfigError("Give a --prompt or a --prompts file.")
    if f.max_new_tokens < 1 or f.top_k < 0 or not 0.0 < f.top_p <= 1.0 or f.temperature <= 0:
      raise ConfigError(f"--max_new_tokens={f.max_new_tokens} must be >= 1, --top_k={f.top_k} "
                        f">= 0, --top_p={f.top_p} in (0, 1] and --temperature={f.temperature} "
                        "> 0 (--greedy for the argmax).")
    texts = generate_texts(f.workdir, prompts, max_new_tokens=f.max_new_tokens, seed=f.seed,
                           temperature=0.0 if f.greedy else f.temperature, top_k=f.top_k,
                           top_p=f.top_p)
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  for text in texts:
    print(text)
  return 0


if __name__ == "__main__":
  define_flags()
  app.run(main)
