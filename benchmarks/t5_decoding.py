r"""T5 greedy decoding speed, from the KV cache against recomputing the row at every step, for
each architecture (`finetune.decoding`).

The model is configs/t5.py:runlocal's mini T5 (with --overrides), with random weights; a batch
is --batch rows of --inputs input tokens (random lengths from half to all of them, EOS last) and
--max_length steps, all of them run (decoding stops at an id no model emits, not at EOS: a
random model may emit EOS first). Each cell times --batches
jitted calls after one that compiles; `same rows` is the share of rows whose cached output
equals the recomputed one token for token.

  python benchmarks/t5_decoding.py --architectures=encoder_decoder,decoder_only,prefix_lm
"""

import argparse
import functools
import pathlib
import time

import jax
import ml_collections
import numpy as np

from bertfam_jax import config_lib
from bertfam_jax.finetune import decoding
from bertfam_jax.models import t5

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
EOS = 3   # [SEP], the tokenizers' eos_id


def model_of(architecture: str, overrides: str) -> t5.T5:
  config = config_lib.load_config(str(CONFIGS / "t5.py"), "runlocal")
  config.model.architecture = architecture
  config_lib.apply_overrides(config, filter(None, overrides.split(",")))
  return t5.T5(ml_collections.FrozenConfigDict(config.model))


def batch_of(rng, *, batch: int, inputs: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
  """(ids [batch, inputs], lengths [batch]): random tokens, EOS last, 0 after."""
  lengths = rng.integers(inputs // 2, inputs + 1, batch).astype(np.int32)
  ids = rng.integers(5, vocab, (batch, inputs)).astype(np.int32)
  ids[np.arange(batch), lengths - 1] = EOS
  ids[np.arange(inputs)[None] >= lengths[:, None]] = 0
  return ids, lengths


def decode_fn(model, architecture: str, max_length: int, use_cache: bool):
  search = functools.partial(decoding.greedy_decode, model, max_length=max_length, eos_id=-1,
                             use_cache=use_cache)
  if architecture == "encoder_decoder":
    return jax.jit(lambda params, ids, lengths: search(params, ids))
  return jax.jit(lambda params, ids, lengths: search(params, ids, prefix_tokens=lengths))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--architectures", default="encoder_decoder,decoder_only,prefix_lm")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--inputs", type=int, default=64)
  parser.add_argument("--max_length", type=int, default=32)
  parser.add_argument("--batches", type=int, default=5)
  parser.add_argument("--overrides", default="model.vocab_size=4224,model.dropout=0.0",
                      help="section.key=value,... (default: the t5_* experiments' cpu scale)")
  args = parser.parse_args()
  print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}; batch {args.batch} × "
        f"{args.inputs} inputs, {args.max_length} steps")
  print("| architecture | recompute rows/s | cached rows/s | cached / recompute | same rows |")
  print("|---|---|---|---|---|")
  rng = np.random.default_rng(0)
  for architecture in args.architectures.split(","):
    model = model_of(architecture, args.overrides)
    vocab = model.config.vocab_size
    batches = [batch_of(rng, batch=args.batch, inputs=args.inputs, vocab=vocab)
               for _ in range(args.batches)]
    ids = batches[0][0]
    init_args = (ids, ids[:, :args.max_length]) if architecture == "encoder_decoder" else (
        None, ids)
    init_kw = ({"decoder_causal_attention": np.ones_like(ids)}
               if architecture == "prefix_lm" else {})
    params = jax.jit(lambda: model.init(jax.random.key(0), *init_args, deterministic=True,
                                        **init_kw))()["params"]
    rates, outputs = {}, {}
    for use_cache in (False, True):
      fn = decode_fn(model, architecture, args.max_length, use_cache)
      jax.block_until_ready(fn(params, *batches[0]))   # compiles
      start = time.perf_counter()
      outputs[use_cache] = [np.asarray(fn(params, *b)) for b in batches]
      rates[use_cache] = args.batch * args.batches / (time.perf_counter() - start)
    same = np.mean([np.all(a == b, axis=1).mean()
                    for a, b in zip(outputs[False], outputs[True])])
    print(f"| {architecture} | {rates[False]:.1f} | {rates[True]:.1f} | "
          f"{rates[True] / rates[False]:.1f}× | {same:.1%} |", flush=True)


if __name__ == "__main__":
  main()
