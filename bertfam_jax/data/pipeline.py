"""The host input pipeline: documents -> sentences -> tokens -> packed examples -> noised batches.

Deterministic from (config.seed, position) and exactly resumable: the position after the last
batch handed out is three small ints per data shard, `state()`, and `restore` of every process's
state continues the stream bit for bit. `make_global_batch` assembles every process's local batch
into global `jax.Array`s.

Data shards: the documents are split into `data.num_shards` disjoint contiguous shards
(`sources.process_shard`; default 0 = one per process), each an independent stream with its own
position. Process p of P reads the contiguous block of shards `process_shards(S, p, P)`, and its
local batch is its shards' batches of batch_size / S rows concatenated in shard order, so the
global batch is every shard's batch in shard order, a function of (seed, step, num_shards) alone
(processes own the batch rows in process order, as on the meshes `sharding.make_mesh` builds on
CPU: tests/integration/multiprocess_test.py). With a fixed num_shards, 1 process x 8 devices and
2 processes x 4 devices see the same batches, and a checkpoint (every shard's position) resumes
on any number of processes dividing num_shards.

Layout of one epoch of one shard: the shard's documents are permuted and cut into chunks of
`data.docs_per_chunk` documents; the chunks are visited in a permuted order; a chunk is split into
sentences, tokenized, packed (`data.packing`), noised by the objective's `features_fn` as a whole,
and its examples are shuffled. Batches may span chunk and epoch boundaries.

Three seeds per epoch decide what changes between epochs:
  layout_seed  document permutation and packing randomness (which examples exist);
  mask_seed    the generator handed to `features_fn` (which tokens are masked);
  order_seed   chunk order and example order within a chunk.
  'static' (BERT, create_pretraining_data with `dupe_factor`): layout = mask = epoch % dupe_factor,
    order = epoch, so every instance keeps one of dupe_factor fixed masks.
  'dynamic' (RoBERTa, fairseq): layout = 0 (fixed blocks), mask = order = epoch, so every time an
    example is seen it gets a new mask.
Every generator is `np.random.default_rng([seed, purpose, seed_value, shard, chunk_id])` (with one
shard per process, shard = process index).

Workers: a chunk's examples are a pure function of (seed, epoch, chunk, shard), so with
`data.workers` = N > 0, N worker processes (spawned, each with a copy of the pipeline's
documents, tokenizer and noising) compute the next chunks ahead while the batches of the current
one are handed out, and return them through shared memory (`data.shared_arrays`); the batches,
their positions and every resume are the same for any N (tests/data/pipeline_workers_test.py).
"""

from __future__ import annotations

import collections
import itertools
import pickle
import queue
import threading
from typing import Callable, Iterator, Mapping, NamedTuple, Sequence

from absl import logging
import jax
from jax.sharding import NamedSharding, PartitionSpec
import ml_collections
import numpy as np

from bertfam_jax import config_lib
from bertfam_jax.data import packing
from bertfam_jax.data import shared_arrays
from bertfam_jax.data import sources
from bertfam_jax.data import tokenizers
from bertfam_jax.data import workers

Batch = dict[str, np.ndarray]
FeaturesFn = Callable[[Batch, np.random.Generator], Batch]

# Generator purposes (the second entry of every seed sequence).
_DOC_ORDER, _PACK, _MASK, _CHUNK_ORDER, _EXAMPLE_ORDER = range(5)
# Tokenized documents are kept in memory when the source is an in-memory list of at most this many
# characters (the embedded corpus is 2.6 M), so later epochs do not re-tokenize.
_MEMO_MAX_CHARS = 100_000_000


class _Position(NamedTuple):
  """Where a shard's stream stands: the next example is `offset` in chunk `chunk` of `epoch`."""
  epoch: int
  chunk: int
  offset: int


def _state_key(field: str, local_shard: int) -> str:
  """The `Pipeline.state()` key of a position field of a process's `local_shard`-th shard:
  'epoch', 'chunk', 'offset' for the first (the format of checkpoints before data shards), then
  'epoch_1', ..."""
  return f"{field}_{local_shard}" if local_shard else field


def shard_positions(process_states: Sequence[Mapping[str, int]]) -> list[_Position]:
  """Every shard's position, in shard order, from every process's `Pipeline.state()` in process
  order."""
  return [_Position(*(int(state[_state_key(f, j)]) for f in _Position._fields))
          for state in process_states for j in range(len(state) // len(_Position._fields))]


def process_shards(num_shards: int, process_index: int, process_count: int) -> range:
  """The data shards process `process_index` reads: the contiguous block of
  num_shards / process_count shards, so that the processes' local batches in process order hold
  the shards in order."""
  if num_shards % process_count:
    raise config_lib.ConfigError(
        f"data.num_shards={num_shards} is not a multiple of the {process_count} processes; use a "
        f"multiple of {process_count}, or 0 (one shard per process).")
  per_process = num_shards // process_count
  return range(process_index * per_process, (process_index + 1) * per_process)


class _Failure(NamedTuple):
  """An exception raised in the prefetch thread, re-raised in the consumer."""
  error: BaseException


class _Prefetcher:
  """Runs a (batch, position) iterator in a background thread, `depth` items ahead."""

  def __init__(self, stream: Iterator, depth: int):
    self._queue = queue.Queue(maxsize=depth)
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, args=(stream,), daemon=True)
    self._thread.start()

  def _put(self, item) -> bool:
    while not self._stop.is_set():
      try:
        self._queue.put(item, timeout=0.1)
        return True
      except queue.Full:
        continue
    return False

  def _run(self, stream: Iterator) -> None:
    try:
      for item in stream:
        if not self._put(item):
          return
    except BaseException as e:  # pylint: disable=broad-except  (handed to the consumer)
      self._put(_Failure(e))

  def get(self):
    item = self._queue.get()
    if isinstance(item, _Failure):
      raise item.error
    return item

  def close(self) -> None:
    self._stop.set()
    self._thread.join()


# In a worker process (set by `_start_worker`): the pipeline it computes chunks with, and the
# shared-memory segments it returns them in.
_WORKER_PIPELINE: "Pipeline | None" = None
_WORKER_SEGMENTS: "shared_arrays.Segments | None" = None


def _start_worker(pipeline: "Pipeline") -> None:
  global _WORKER_PIPELINE, _WORKER_SEGMENTS
  _WORKER_PIPELINE, _WORKER_SEGMENTS = pipeline, shared_arrays.Segments()


def _end_worker() -> None:
  _WORKER_SEGMENTS.close()


def _worker_chunk(epoch: int, chunk: int, shard: int) -> shared_arrays.Shared | Batch:
  return _WORKER_SEGMENTS.export(_WORKER_PIPELINE.chunk_examples(epoch, chunk, shard))


def _release_segments(names: list[str]) -> None:
  _WORKER_SEGMENTS.release(names)


class Pipeline:
  """An endless, resumable iterator of local batches (dicts of [local_batch_size, ...] arrays):
  the concatenated batches of the data shards this process reads.

  Example:
    pipe = Pipeline(config, tokenizer, sources.get_documents(config.data, 'train'),
                    objective.make_features(config, tokenizer), jax.process_index(),
                    jax.process_count(), config.train.batch_size // jax.process_count())
    pipe.restore(saved_states)         # optional: every process's state(), in process order
    batch = next(pipe); saved_state = pipe.state()
  """

  def __init__(self, config: ml_collections.ConfigDict, tokenizer: tokenizers.Tokenizer,
               documents: Sequence[str], features_fn: FeaturesFn, process_index: int,
               process_count: int, local_batch_size: int, *, epoch_mode: str | None = None,
               segment_len: int | None = None, replace_examples: bool = False,
               ordered: bool = False):
    """Builds the pipeline; no document is read until the first batch.

    Args:
      config: the full config (reads `seed`, `data.*` including `data.num_shards`,
        `objective.masking/dupe_factor`).
      tokenizer: turns sentences into ids and supplies the special ids.
      documents: all documents of the split (every process passes the same sequence).
      features_fn: the objective's host-side noising, applied to a whole chunk of packed
        examples with a generator seeded by mask_seed; its outputs are merged over the packed
        arrays (so it may return only the keys it adds or changes).
      process_index, process_count: this process and the number of processes.
      local_batch_size: examples per batch on this process (its shards share it equally).
      epoch_mode: 'static' or 'dynamic' (see the module docstring); defaults to
        `config.objective.masking`, else 'dynamic'.
      segment_len: raw tokens per segment of `data.packing='t5_segments'` (T5 derives it from
        the objective: `objectives.t5.pipeline_options`); default `data.seq_len`.
      replace_examples: `features_fn` returns the whole batch, not keys to merge (T5 packs
        several noised segments into one row, so its rows are not the packed ones).
      ordered: keep the examples of a chunk in `features_fn`'s order (no example shuffle):
        XLNet emits consecutive windows of its batch's parallel streams, step-major, so that
        row r of a batch continues row r of the one before (its memory).
    """
    self._config = config
    self._tokenizer = tokenizer
    self._documents = documents
    self._features_fn = features_fn
    self._segment_len = segment_len or config.data.seq_len
    self._replace_examples = replace_examples
    self._ordered = ordered
    self._process_index = process_index
    self._num_shards = config.data.num_shards or process_count
    self.shards = process_shards(self._num_shards, process_index, process_count)
    if local_batch_size % len(self.shards):
      raise config_lib.ConfigError(
          f"The local batch of {local_batch_size} examples does not split over the "
          f"{len(self.shards)} data shards of a process; use a train.batch_size divisible by "
          f"data.num_shards={self._num_shards}.")
    self._batch_size = local_batch_size // len(self.shards)   # per shard
    self._doc_ids = {shard: sources.process_shard(len(documents), shard, self._num_shards)
                     for shard in self.shards}
    for shard, doc_ids in self._doc_ids.items():
      if not len(doc_ids):
        raise config_lib.ConfigError(
            f"Data shard {shard} of {self._num_shards} gets none of the {len(documents)} "
            f"documents; use a larger corpus or fewer shards (data.num_shards, or processes).")
    self._docs_per_chunk = config.data.docs_per_chunk
    self._epoch_mode = epoch_mode or config.objective.get("masking", "dynamic")
    if self._epoch_mode == "static":
      self._dupe_factor = config.objective.get("dupe_factor", 0)
      if self._dupe_factor < 1:
        raise config_lib.ConfigError("objective.masking='static' needs objective.dupe_factor >= 1 "
                                     "(BERT used 10).")
    elif self._epoch_mode != "dynamic":
      raise config_lib.ConfigError(
          f"epoch mode / objective.masking={self._epoch_mode!r}; choose static or dynamic.")
    memoise = (isinstance(documents, list) and
               sum(len(d) for d in documents) <= _MEMO_MAX_CHARS)
    self._token_memo: dict[int, list[np.ndarray]] | None = {} if memoise else None
    self._doc_order_cache: dict[int, tuple[int, np.ndarray]] = {}   # shard: (layout_seed, order)
    self._workers = config.data.get("workers", 0)
    self._pool: workers.WorkerPool | None = None   # started at first use
    self._reader: shared_arrays.Reader | None = None   # the pool's segments, mapped
    self._positions = (_Position(0, 0, 0),) * len(self.shards)
    self._stream = None   # a _Prefetcher or a generator, started lazily from self._positions
    self._peeked: tuple[Batch, tuple[_Position, ...]] | None = None   # (batch, positions after)

  # -- seeds and layout ---------------------------------------------------------------------

  def _rng(self, purpose: int, seed_value: int, shard: int,
           chunk_id: int = 0) -> np.random.Generator:
    return np.random.default_rng([self._config.seed, purpose, seed_value, shard, chunk_id])

  def _seeds(self, epoch: int) -> tuple[int, int, int]:
    """(layout_seed, mask_seed, order_seed) of an epoch."""
    if self._epoch_mode == "static":
      return epoch % self._dupe_factor, epoch % self._dupe_factor, epoch
    return 0, epoch, epoch

  def _num_chunks(self, shard: int) -> int:
    return -(-len(self._doc_ids[shard]) // self._docs_per_chunk)

  def _doc_order(self, shard: int, layout_seed: int) -> np.ndarray:
    # Read once: eval_batches may run beside the prefetcher.
    cached = self._doc_order_cache.get(shard)
    if cached is None or cached[0] != layout_seed:
      order = self._rng(_DOC_ORDER, layout_seed, shard).permutation(self._doc_ids[shard])
      cached = self._doc_order_cache[shard] = (layout_seed, order)
    return cached[1]

  def _chunk_id(self, shard: int, epoch: int, chunk: int) -> int:
    """Which chunk of the shard's epoch document order is visited `chunk`-th."""
    order_seed = self._seeds(epoch)[2]
    order = self._rng(_CHUNK_ORDER, order_seed, shard).permutation(self._num_chunks(shard))
    return int(order[chunk])

  def chunk_documents(self, epoch: int, chunk: int, shard: int | None = None) -> np.ndarray:
    """[<= docs_per_chunk] indices into `documents` of the `chunk`-th chunk of `epoch` of `shard`
    (one of `shards`; default the first)."""
    shard = self.shards[0] if shard is None else shard
    chunk_id = self._chunk_id(shard, epoch, chunk)
    order = self._doc_order(shard, self._seeds(epoch)[0])
    return order[chunk_id * self._docs_per_chunk:(chunk_id + 1) * self._docs_per_chunk]

  # -- one chunk ------------------------------------------------------------------------------

  def _tokenize(self, doc_ids: np.ndarray) -> list[list[np.ndarray]]:
    """Documents as lists of [len] int32 sentence ids, with one batched encode call."""
    memo = self._token_memo if self._token_memo is not None else {}
    missing = [int(i) for i in doc_ids if int(i) not in memo]
    split = [sources.split_sentences(self._documents[i]) for i in missing]
    ids = iter(self._tokenizer.encode([s for sentences in split for s in sentences]))
    fresh = {i: list(itertools.islice(ids, len(sentences))) for i, sentences in zip(missing, split)}
    memo.update(fresh)
    return [memo[int(i)] for i in doc_ids]

  def _pack(self, docs: list[list[np.ndarray]], rng: np.random.Generator) -> Batch:
    data, tok = self._config.data, self._tokenizer
    if data.packing == "sentence_pairs":
      # The sentence-level task decides how B is drawn (NSP, SOP, StructBERT); NSP's rule when
      # the objective has none; B is a random document's text with `random_next_prob` (BERT's
      # 0.5; UniLM's 0: B always follows A, but in one-sentence chunks).
      objective = self._config.objective
      pair_mode = objective.get("sentence_task") or "nsp"
      return packing.sentence_pairs(docs, data.seq_len, rng, short_seq_prob=data.short_seq_prob,
                                    random_next_prob=objective.get("random_next_prob", 0.5),
                                    cls_id=tok.cls_id, sep_id=tok.sep_id, pad_id=tok.pad_id,
                                    pair_mode=pair_mode)
    if data.packing == "t5_segments":
      return packing.token_segments(docs, self._segment_len, pad_id=tok.pad_id,
                                    concat_documents=self._config.objective.get(
                                        "concat_documents", True))
    if data.packing == "xlnet_streams":
      objective = self._config.objective
      streams = packing.xlnet_streams(docs, self._batch_size, bi_data=objective.bi_data,
                                      eod_id=packing.eod_id(tok), use_eod=objective.use_eod)
      packing.check_xlnet_rows(streams["input_ids"].shape[1], self._batch_size, len(docs),
                               data.docs_per_chunk, data.seq_len)
      return streams
    if data.packing == "lm_stream":
      return packing.lm_stream(docs, data.seq_len, eod_id=packing.eod_id(tok), pad_id=tok.pad_id)
    if data.packing == "electra_segments":
      return packing.electra_segments(docs, data.seq_len, rng, cls_id=tok.cls_id,
                                      sep_id=tok.sep_id, pad_id=tok.pad_id)
    if data.packing == "full_sentences":
      return packing.full_sentences(docs, data.seq_len, cls_id=tok.cls_id, sep_id=tok.sep_id,
                                    pad_id=tok.pad_id,
                                    document_separator=data.get("document_separator", False))
    if data.packing == "document_blocks":
      return packing.document_blocks(docs, data.seq_len, cls_id=tok.cls_id, sep_id=tok.sep_id,
                                     pad_id=tok.pad_id)
    raise config_lib.ConfigError(f"data.packing={data.packing!r}; choose one of "
                                 f"{config_lib.PACKINGS}.")

  def chunk_examples(self, epoch: int, chunk: int, shard: int | None = None) -> Batch:
    """All examples of one chunk of `shard` (default the first of `shards`), noised and
    shuffled: dict of [n_chunk, ...] arrays."""
    shard = self.shards[0] if shard is None else shard
    layout_seed, mask_seed, order_seed = self._seeds(epoch)
    chunk_id = self._chunk_id(shard, epoch, chunk)
    doc_ids = self.chunk_documents(epoch, chunk, shard)
    # The documents a process actually reads (--verbosity=1); tests/integration checks them.
    logging.debug("Data shard %d of %d (process %d) reads documents %s of %d.", shard,
                  self._num_shards, self._process_index, doc_ids.tolist(), len(self._documents))
    docs = self._tokenize(doc_ids)
    # Seeded by the chunk's identity (not its visiting position), so with a repeated layout
    # seed the same documents give the same instances and, in static mode, the same masks.
    examples = self._pack(docs, self._rng(_PACK, layout_seed, shard, chunk_id))
    features = self._features_fn(examples, self._rng(_MASK, mask_seed, shard, chunk_id))
    examples = features if self._replace_examples else {**examples, **features}
    if self._ordered:
      return examples
    order = self._rng(_EXAMPLE_ORDER, order_seed, shard, chunk_id).permutation(
        _num_rows(examples))
    return {key: value[order] for key, value in examples.items()}

  def __getstate__(self) -> dict:
    """What a worker process needs: the pure parts (documents, tokenizer, noising, seeds), no
    stream, pool or memo."""
    state = dict(self.__dict__)
    state.update(_pool=None, _reader=None, _stream=None, _peeked=None, _doc_order_cache={},
                 _token_memo=None if self._token_memo is None else {})
    return state

  def _next_chunk(self, shard: int, epoch: int, chunk: int) -> tuple[int, int]:
    """The (epoch, chunk) visited after (epoch, chunk) in `shard`."""
    return (epoch, chunk + 1) if chunk + 1 < self._num_chunks(shard) else (epoch + 1, 0)

  def _chunks(self, shard: int, epoch: int, chunk: int
              ) -> Iterator[tuple[int, int, Batch, bool]]:
    """(epoch, chunk, its examples, whether they are views to copy before the next chunk) from
    (epoch, chunk) on, forever: computed here, or with `data.workers` > 0 by the worker
    processes, up to twice as many chunks ahead as there are workers, handed out in order. A
    worker's chunk is read in place from its shared-memory segment, which goes back to the
    worker when the next chunk is asked for."""
    if not self._workers:
      while True:
        yield epoch, chunk, self.chunk_examples(epoch, chunk, shard), False
        epoch, chunk = self._next_chunk(shard, epoch, chunk)
    if self._pool is None:
      try:
        pickle.dumps(self)
      except (pickle.PicklingError, AttributeError, TypeError) as e:
        raise config_lib.ConfigError(
            f"data.workers={self._workers} sends the objective's noising to worker processes, "
            f"and it cannot be pickled ({e}); use --config.data.workers=0.") from None
      self._pool = workers.WorkerPool(self._workers, _start_worker, (self,),
                                      finalizer=_end_worker, discard=self._release,
                                      reap=shared_arrays.remove_segments_of)
      self._reader = shared_arrays.Reader()
    pending, reading = collections.deque(), None
    try:
      while True:
        while len(pending) < 2 * self._workers:
          pending.append((epoch, chunk, self._pool.submit(_worker_chunk, epoch, chunk, shard)))
          epoch, chunk = self._next_chunk(shard, epoch, chunk)
        done_epoch, done_chunk, request = pending.popleft()
        reading = (request.worker, request.result())
        examples, views = self._reader.load(reading[1])
        yield done_epoch, done_chunk, examples, views
        self._release(*reading)
        reading = None
    finally:
      for *_, request in pending:
        request.abandon()   # its segment goes back when it arrives
      if reading is not None:
        self._release(*reading)

  def _release(self, worker: int, payload) -> None:
    """Hands a chunk's segment back to the worker that wrote it."""
    if isinstance(payload, shared_arrays.Shared) and self._pool is not None:
      self._pool.notify(worker, _release_segments, [payload.name])

  # -- the batch stream -----------------------------------------------------------------------

  def _too_small(self, shard: int, num_examples: int) -> config_lib.ConfigError:
    data = self._config.data
    return config_lib.ConfigError(
        f"One epoch of data shard {shard}'s {len(self._doc_ids[shard])} documents packs into only "
        f"{num_examples} examples (data.packing={data.packing}, seq_len={data.seq_len}), fewer "
        f"than one batch of {self._batch_size} (per shard). Lower --config.data.seq_len, "
        f"--config.train.batch_size or data.num_shards, or use a larger corpus "
        f"(--config.data.source).")

  def _batches(self, shard: int, position: _Position) -> Iterator[tuple[Batch, _Position]]:
    """Yields (batch of one shard, its position after it) from `position` on, forever."""
    first_epoch, first_chunk, offset = position
    parts, num_pending = [], 0
    epoch_examples = 0 if (first_chunk, offset) == (0, 0) else None   # only for whole epochs
    for epoch, chunk, examples, views in self._chunks(shard, first_epoch, first_chunk):
      num_examples = _num_rows(examples)
      if epoch_examples is not None:
        epoch_examples += num_examples - offset
      while offset < num_examples:
        take = min(self._batch_size - num_pending, num_examples - offset)
        parts.append({k: v[offset:offset + take].copy() if views else v[offset:offset + take]
                      for k, v in examples.items()})
        num_pending += take
        offset += take
        if num_pending == self._batch_size:
          if offset == num_examples:   # report a finished chunk as the start of the next one
            break
          yield self._concat(parts), _Position(epoch, chunk, offset)
          parts, num_pending = [], 0
      epoch_after, chunk_after = self._next_chunk(shard, epoch, chunk)
      offset = 0
      if chunk_after == 0:
        if epoch_examples is not None and epoch_examples < self._batch_size:
          raise self._too_small(shard, epoch_examples)
        epoch_examples = 0
      if num_pending == self._batch_size:
        yield self._concat(parts), _Position(epoch_after, chunk_after, 0)
        parts, num_pending = [], 0

  def _local_batches(self, positions: Sequence[_Position]
                     ) -> Iterator[tuple[Batch, tuple[_Position, ...]]]:
    """Yields (local batch, this process's shards' positions after it): the shards' batches in
    order."""
    streams = [self._batches(shard, position) for shard, position in zip(self.shards, positions)]
    for items in zip(*streams):
      batches, after = zip(*items)
      yield self._concat(list(batches)), after

  @staticmethod
  def _concat(parts: list[Batch]) -> Batch:
    if len(parts) == 1:
      return {k: np.ascontiguousarray(v) for k, v in parts[0].items()}
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

  # -- public iteration and state -------------------------------------------------------------

  def __iter__(self) -> "Pipeline":
    return self

  def __next__(self) -> Batch:
    if self._peeked is not None:
      batch, self._positions = self._peeked
      self._peeked = None
      return batch
    if self._stream is None:
      stream = self._local_batches(self._positions)
      # Workers compute ahead already; a thread would only add its hand-offs to the process
      # that trains (data.prefetch 2: -16% of RoBERTa's batches/s with 2 workers, 2 cores).
      depth = 0 if self._workers else self._config.data.prefetch
      self._stream = _Prefetcher(stream, depth) if depth > 0 else stream
    try:
      if isinstance(self._stream, _Prefetcher):
        batch, self._positions = self._stream.get()
      else:
        batch, self._positions = next(self._stream)
    except BaseException:
      self._stop_stream()   # a failed stream is finished: the next call starts a new one here
      raise
    return batch

  def peek(self) -> Batch:
    """The next batch, without consuming it: the following `next` returns it (and `state` stays
    where it was until then). Set-up draws it so that a corpus too small for one batch is
    refused before anything is written."""
    if self._peeked is None:
      before = self._positions
      self._peeked = (next(self), self._positions)
      self._positions = before
    return self._peeked[0]

  def state(self) -> dict[str, int]:
    """The positions of this process's shards after the last batch handed out (what the consumer
    has received): epoch, chunk, offset of its first shard, epoch_1, chunk_1, offset_1 of its
    second, ..."""
    return {_state_key(field, j): value for j, position in enumerate(self._positions)
            for field, value in position._asdict().items()}

  def restore(self, process_states: Sequence[Mapping[str, int]]) -> None:
    """Continues from every process's `state()`, in process order (as a checkpoint holds them;
    with one process, `[state()]`): the following batches equal the uninterrupted stream's.

    The states may come from another number of processes holding the same shards. Another number
    of shards raises when data.num_shards is set; with the default (one shard per process, here
    a checkpoint of another process count) the stream restarts.
    """
    positions = shard_positions(process_states)
    if len(positions) != self._num_shards:
      fix = (f"--config.data.num_shards={len(positions)} (on a number of processes dividing it) "
             f"continues the checkpoint's stream")
      if self._config.data.num_shards:
        raise config_lib.ConfigError(
            f"The checkpoint holds the positions of {len(positions)} data shards but this run "
            f"reads data.num_shards={self._num_shards}; {fix}.")
      logging.warning("The checkpoint holds the positions of %d data shards and this run reads "
                      "%d (one per process): the data restarts at the beginning of the stream; "
                      "%s.", len(positions), self._num_shards, fix)
      positions = [_Position(0, 0, 0)] * self._num_shards
    self._stop_stream()
    self._peeked = None
    self._positions = tuple(positions[shard] for shard in self.shards)

  def _stop_stream(self) -> None:
    if isinstance(self._stream, _Prefetcher):
      self._stream.close()
    self._stream = None

  def close(self) -> None:
    """Stops the prefetch thread and the worker processes (restarted by the next `next()`)."""
    self._stop_stream()
    if self._pool is not None:
      try:
        self._pool.close()
      finally:
        self._reader.close()
        self._pool = self._reader = None

  def eval_batches(self, num_batches: int) -> list[Batch]:
    """The first `num_batches` batches of the stream from its start: the same on every call.

    Independent of the iteration position. If the split is smaller than `num_batches` batches,
    later batches repeat examples (with the next epoch's masks); this is logged.
    """
    stream = self._local_batches((_Position(0, 0, 0),) * len(self.shards))
    batches, positions = [], []
    for batch, after in itertools.islice(stream, num_batches):
      batches.append(batch)
      positions = after
    if any(position.epoch > 0 for position in positions):
      logging.warning("eval_batches(%d) wraps around the eval split (%d documents in data shards "
                      "%s); examples repeat.", num_batches,
                      sum(len(self._doc_ids[s]) for s in self.shards), list(self.shards))
    return batches


def make_global_batch(local_batch: Batch, mesh: jax.sharding.Mesh,
                      batch_spec: PartitionSpec) -> dict[str, jax.Array]:
  """Assembles every process's local batch into global arrays sharded as `batch_spec`.

  Args:
    local_batch: dict of [local_batch_size, ...] numpy arrays (this process's slice).
    mesh: the device mesh.
    batch_spec: how the leading (batch) dimension is sharded, e.g. P(('data', 'fsdp')).

  Returns:
    dict of [local_batch_size * process_count, ...] `jax.Array`s.
  """
  sharding = NamedSharding(mesh, batch_spec)
  return {key: jax.make_array_from_process_local_data(sharding, value)
          for key, value in local_batch.items()}


def _num_rows(examples: dict[str, np.ndarray]) -> int:
  """The examples (rows) in a chunk: every array's leading dimension."""
  return len(next(iter(examples.values())))
