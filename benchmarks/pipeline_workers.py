r"""The real host pipeline's throughput with 0, 1, 2, ... worker processes (`data.workers`).

For each family, `configs/<family>.py:runlocal`'s pipeline (its tokenizer, packing and the
objective's noising, on the embedded corpus) hands out --batches batches after --warmup_epochs
epochs (which start the workers and fill their tokenization memo, as the in-process pipeline's is
after its first epoch: the steady state of a run); tokens/s counts the positions of those batches
(batch × seq_len, padding included) over their wall time. Chunks are the config's
(`data.docs_per_chunk`, 2,000 documents: the 2,754-document sample is a chunk of 2,000 and one of
754, and the workers run epochs ahead); --docs_per_chunk=4 makes a chunk a fraction of a batch,
the stress case of the per-chunk costs (a request, its answer, a segment to read and hand back).
The batches are the same for every worker count (tests/data/pipeline_workers_test.py); only
their speed differs.

Columns besides the worker counts:
  0 workers, thread: data.prefetch=2 (the default), whose thread hands batches over; with
    workers the pipeline uses no thread. The other 0-worker column has none either.
  independent processes: the machine's own ceiling, --processes processes each computing
    chunks alone (no pipeline, nothing sent), their summed rate over one process's.
  consumer ceiling: what the training process itself can take from any number of workers.

  python benchmarks/pipeline_workers.py --families=bert,electra --workers=2
"""

import argparse
import concurrent.futures
import itertools
import multiprocessing
import pathlib
import time

from bertfam_jax import config_lib, objectives
from bertfam_jax.data import pipeline, sources, tokenizers

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"


def runlocal_pipeline(family: str, *, workers: int, prefetch: int, batch_size: int,
                      docs_per_chunk: int | None) -> tuple[pipeline.Pipeline, int]:
  """`family`'s runlocal pipeline (its own `data.docs_per_chunk` where None) and its seq_len."""
  config = config_lib.load_config(str(CONFIGS / f"{family}.py"), "runlocal")
  config.data.update(workers=workers, prefetch=prefetch)
  if docs_per_chunk is not None:
    config.data.docs_per_chunk = docs_per_chunk
  config.train.batch_size = batch_size
  documents = sources.get_documents(config.data, "train")
  tokenizer = tokenizers.load_or_train(config, documents)
  objective = objectives.get(config.objective.name)
  pipe = pipeline.Pipeline(config, tokenizer, documents, objective.make_features(config, tokenizer),
                           0, 1, batch_size, **objectives.pipeline_options(objective, config))
  return pipe, config.data.seq_len


def throughput(family: str, workers: int, *, prefetch: int = 0, batches: int,
               warmup_epochs: int, batch_size: int, docs_per_chunk: int | None) -> float:
  """Tokens/s of `family`'s runlocal pipeline with `workers` worker processes."""
  pipe, seq_len = runlocal_pipeline(family, workers=workers, prefetch=prefetch,
                                    batch_size=batch_size, docs_per_chunk=docs_per_chunk)
  try:
    while pipe.state()["epoch"] < warmup_epochs:
      next(pipe)
    start = time.perf_counter()
    for _ in itertools.islice(pipe, batches):
      pass
    seconds = time.perf_counter() - start
  finally:
    pipe.close()
  return batches * batch_size * seq_len / seconds


_BARRIER = None


def _set_barrier(barrier) -> None:
  global _BARRIER
  _BARRIER = barrier


def _alone(family: str, docs_per_chunk: int | None, epochs: int) -> float:
  """Tokens/s of one process computing `epochs` epochs of chunks (after one that tokenizes),
  started with the others at the barrier."""
  pipe, seq_len = runlocal_pipeline(family, workers=0, prefetch=0, batch_size=32,
                                    docs_per_chunk=docs_per_chunk)
  chunks = pipe._num_chunks(pipe.shards[0])  # pylint: disable=protected-access
  for chunk in range(chunks):
    pipe.chunk_examples(0, chunk)
  _BARRIER.wait()
  start, rows = time.perf_counter(), 0
  for epoch, chunk in itertools.product(range(1, epochs + 1), range(chunks)):
    rows += len(pipe.chunk_examples(epoch, chunk)["input_ids"])
  return rows * seq_len / (time.perf_counter() - start)


def independent_processes(family: str, processes: int, *, docs_per_chunk: int | None,
                          epochs: int = 30) -> float:
  """The summed tokens/s of `processes` processes computing chunks side by side, none sent
  anywhere: what the machine's cores give this work at best."""
  context = multiprocessing.get_context("spawn")
  barrier = context.Barrier(processes)
  with concurrent.futures.ProcessPoolExecutor(processes, mp_context=context,
                                              initializer=_set_barrier,
                                              initargs=(barrier,)) as pool:
    futures = [pool.submit(_alone, family, docs_per_chunk, epochs) for _ in range(processes)]
    return sum(f.result() for f in futures)


def consumer_ceiling(family: str, *, batch_size: int, docs_per_chunk: int | None,
                     chunks: int = 40) -> float:
  """Tokens/s the training process itself can take from workers at best: for `chunks` chunks
  made beforehand, what it does per chunk (slice it into batches and copy each out of the
  segment, as `Pipeline._batches` does with a worker's chunk), timed alone. Workers cannot
  deliver faster than this on any number of cores."""
  pipe, seq_len = runlocal_pipeline(family, workers=0, prefetch=0, batch_size=batch_size,
                                    docs_per_chunk=docs_per_chunk)
  made = [pipe.chunk_examples(0, c % pipe._num_chunks(0), 0)  # pylint: disable=protected-access
          for c in range(chunks)]
  pipe.close()
  rows = 0
  start = time.perf_counter()
  for examples in made:
    n = len(next(iter(examples.values())))
    for offset in range(0, n, batch_size):
      pipeline.Pipeline._concat([{k: v[offset:offset + batch_size].copy()  # pylint: disable=protected-access
                                  for k, v in examples.items()}])
    rows += n
  return rows * seq_len / (time.perf_counter() - start)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--families", default="bert,roberta,spanbert,electra,t5")
  parser.add_argument("--workers", default="2", help="worker counts besides 0 and 1")
  parser.add_argument("--batches", type=int, default=40000)
  parser.add_argument("--warmup_epochs", type=int, default=3)
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--docs_per_chunk", type=int, default=None,
                      help="data.docs_per_chunk (default: the config's)")
  parser.add_argument("--processes", type=int, default=2,
                      help="processes of the independent-processes column")
  args = parser.parse_args()
  counts = sorted({0, 1, *(int(w) for w in args.workers.split(","))})   # 0 and 1: the references
  most = counts[-1]
  common = dict(batches=args.batches, warmup_epochs=args.warmup_epochs,
                batch_size=args.batch_size, docs_per_chunk=args.docs_per_chunk)
  print("| family | 0 workers, thread | " + " | ".join(f"{w} workers" for w in counts) +
        f" | {most} / 0, thread | {most} / 0 | {most} / 1 | "
        f"{args.processes} independent processes / 1 | consumer ceiling |")
  print("|---|" + "---|" * (len(counts) + 6))
  for family in args.families.split(","):
    threaded = throughput(family, 0, prefetch=2, **common)
    rates = {w: throughput(family, w, **common) for w in counts}
    machine = (independent_processes(family, args.processes, docs_per_chunk=args.docs_per_chunk)
               / independent_processes(family, 1, docs_per_chunk=args.docs_per_chunk))
    ceiling = consumer_ceiling(family, batch_size=args.batch_size,
                               docs_per_chunk=args.docs_per_chunk)
    print(f"| {family} | {threaded / 1e6:.2f} M | " +
          " | ".join(f"{r / 1e6:.2f} M" for r in rates.values()) +
          f" | {rates[most] / threaded:.2f}× | {rates[most] / rates[0]:.2f}× | "
          f"{rates[most] / rates[1]:.2f}× | {machine:.2f}× | "
          f"{ceiling / 1e6:.0f} M |", flush=True)


if __name__ == "__main__":
  main()
