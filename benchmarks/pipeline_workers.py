r"""The real host pipeline's throughput with 0, 1, 2, ... worker processes (`data.workers`).

For each family, `configs/<family>.py:runlocal`'s pipeline (its tokenizer, packing and the
objective's noising, on the embedded corpus) hands out --batches batches after a warm-up of
--warmup batches (which also starts the workers); tokens/s counts the positions of those batches
(batch × seq_len, padding included) over their wall time. `data.docs_per_chunk` is lowered to
--docs_per_chunk so that an epoch has chunks enough to spread over the workers (the default
2,000 gives the 2,754-document sample one chunk and a half). The batches are the same for every
worker count (tests/data/pipeline_workers_test.py); only their speed differs. The last column is
`consumer_ceiling`: what the training process can take from any number of workers.

  python benchmarks/pipeline_workers.py --families=bert,electra --workers=0,1,2
"""

import argparse
import itertools
import pathlib
import pickle
import time

from bertfam_jax import config_lib, objectives
from bertfam_jax.data import pipeline, sources, tokenizers

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"


def throughput(family: str, workers: int, *, batches: int, warmup: int, batch_size: int,
               docs_per_chunk: int) -> float:
  """Tokens/s of `family`'s runlocal pipeline with `workers` worker processes."""
  config = config_lib.load_config(str(CONFIGS / f"{family}.py"), "runlocal")
  config.data.update(workers=workers, docs_per_chunk=docs_per_chunk)
  config.train.batch_size = batch_size
  documents = sources.get_documents(config.data, "train")
  tokenizer = tokenizers.load_or_train(config, documents)
  objective = objectives.get(config.objective.name)
  pipe = pipeline.Pipeline(config, tokenizer, documents, objective.make_features(config, tokenizer),
                           0, 1, batch_size, **objectives.pipeline_options(objective, config))
  try:
    for _ in itertools.islice(pipe, warmup):
      pass
    start = time.perf_counter()
    for _ in itertools.islice(pipe, batches):
      pass
    seconds = time.perf_counter() - start
  finally:
    pipe.close()
  return batches * batch_size * config.data.seq_len / seconds


def consumer_ceiling(family: str, *, batch_size: int, docs_per_chunk: int,
                     chunks: int = 40) -> float:
  """Tokens/s the training process itself can take from workers at best: for `chunks` chunks
  made beforehand, what it does per chunk (unpickle what a worker sent, slice it into batches
  and copy each out: `Pipeline._concat`), timed alone. Workers cannot deliver faster than this
  on any number of cores."""
  config = config_lib.load_config(str(CONFIGS / f"{family}.py"), "runlocal")
  config.data.update(workers=0, docs_per_chunk=docs_per_chunk)
  documents = sources.get_documents(config.data, "train")
  tokenizer = tokenizers.load_or_train(config, documents)
  objective = objectives.get(config.objective.name)
  pipe = pipeline.Pipeline(config, tokenizer, documents, objective.make_features(config, tokenizer),
                           0, 1, batch_size, **objectives.pipeline_options(objective, config))
  sent = [pickle.dumps(pipe.chunk_examples(0, c % pipe._num_chunks(0), 0))  # pylint: disable=protected-access
          for c in range(chunks)]
  pipe.close()
  rows = 0
  start = time.perf_counter()
  for payload in sent:
    examples = pickle.loads(payload)
    n = len(next(iter(examples.values())))
    for offset in range(0, n, batch_size):
      pipeline.Pipeline._concat([{k: v[offset:offset + batch_size]  # pylint: disable=protected-access
                                  for k, v in examples.items()}])
    rows += n
  return rows * config.data.seq_len / (time.perf_counter() - start)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--families", default="bert,roberta,spanbert,electra,t5")
  parser.add_argument("--workers", default="0,1,2")
  parser.add_argument("--batches", type=int, default=400)
  parser.add_argument("--warmup", type=int, default=20)
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--docs_per_chunk", type=int, default=4)
  args = parser.parse_args()
  counts = [int(w) for w in args.workers.split(",")]
  print("| family | " + " | ".join(f"{w} workers (tokens/s)" for w in counts) +
        " | speed-up, most workers | consumer ceiling (tokens/s) |")
  print("|---|" + "---|" * (len(counts) + 2))
  for family in args.families.split(","):
    rates = [throughput(family, w, batches=args.batches, warmup=args.warmup,
                        batch_size=args.batch_size, docs_per_chunk=args.docs_per_chunk)
             for w in counts]
    ceiling = consumer_ceiling(family, batch_size=args.batch_size,
                               docs_per_chunk=args.docs_per_chunk)
    print(f"| {family} | " + " | ".join(f"{r:,.0f}" for r in rates) +
          f" | {rates[-1] / rates[0]:.2f}× | {ceiling:,.0f} |", flush=True)


if __name__ == "__main__":
  main()
