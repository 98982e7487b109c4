"""The host input pipeline: documents -> sentences -> tokens -> packed examples -> noised batches.

Deterministic from (config.seed, position) and exactly resumable: the position after the last
batch handed out is three small ints, `state()`, and `restore(state)` continues the stream bit
for bit. Each process reads its own documents (`sources.process_shard`) and produces local
batches; `make_global_batch` assembles them into global `jax.Array`s.

Layout of one epoch on one process: the process's documents are permuted and cut into chunks of
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
Every generator is `np.random.default_rng([seed, purpose, seed_value, process_index, chunk_id])`.
"""

from __future__ import annotations

import itertools
import queue
import threading
from typing import Callable, Iterator, NamedTuple, Sequence

from absl import logging
import jax
from jax.sharding import NamedSharding, PartitionSpec
import ml_collections
import numpy as np

from bertfam_jax import config_lib
from bertfam_jax.data import packing
from bertfam_jax.data import sources
from bertfam_jax.data import tokenizers

Batch = dict[str, np.ndarray]
FeaturesFn = Callable[[Batch, np.random.Generator], Batch]

# Generator purposes (the second entry of every seed sequence).
_DOC_ORDER, _PACK, _MASK, _CHUNK_ORDER, _EXAMPLE_ORDER = range(5)
# Tokenized documents are kept in memory when the source is an in-memory list of at most this many
# characters (the embedded corpus is 2.6 M), so later epochs do not re-tokenize.
_MEMO_MAX_CHARS = 100_000_000


class _Position(NamedTuple):
  """Where the stream stands: the next example is `offset` in chunk `chunk` of `epoch`."""
  epoch: int
  chunk: int
  offset: int


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


class Pipeline:
  """An endless, resumable iterator of local batches (dicts of [local_batch_size, ...] arrays).

  Example:
    pipe = Pipeline(config, tokenizer, sources.get_documents(config.data, 'train'),
                    objective.make_features(config, tokenizer), jax.process_index(),
                    jax.process_count(), config.train.batch_size // jax.process_count())
    pipe.restore(saved_state)          # optional
    batch = next(pipe); saved_state = pipe.state()
  """

  def __init__(self, config: ml_collections.ConfigDict, tokenizer: tokenizers.Tokenizer,
               documents: Sequence[str], features_fn: FeaturesFn, process_index: int,
               process_count: int, local_batch_size: int, *, epoch_mode: str | None = None,
               segment_len: int | None = None, replace_examples: bool = False):
    """Builds the pipeline; no document is read until the first batch.

    Args:
      config: the full config (reads `seed`, `data.*`, `objective.masking/dupe_factor`).
      tokenizer: turns sentences into ids and supplies the special ids.
      documents: all documents of the split (every process passes the same sequence).
      features_fn: the objective's host-side noising, applied to a whole chunk of packed
        examples with a generator seeded by mask_seed; its outputs are merged over the packed
        arrays (so it may return only the keys it adds or changes).
      process_index, process_count: this process and the number of processes.
      local_batch_size: examples per batch on this process.
      epoch_mode: 'static' or 'dynamic' (see the module docstring); defaults to
        `config.objective.masking`, else 'dynamic'.
      segment_len: raw tokens per segment of `data.packing='t5_segments'` (T5 derives it from
        the objective: `objectives.t5.pipeline_options`); default `data.seq_len`.
      replace_examples: `features_fn` returns the whole batch, not keys to merge (T5 packs
        several noised segments into one row, so its rows are not the packed ones).
    """
    self._config = config
    self._tokenizer = tokenizer
    self._documents = documents
    self._features_fn = features_fn
    self._segment_len = segment_len or config.data.seq_len
    self._replace_examples = replace_examples
    self._process_index = process_index
    self._batch_size = local_batch_size
    self._doc_ids = sources.process_shard(len(documents), process_index, process_count)
    if not len(self._doc_ids):
      raise config_lib.ConfigError(
          f"Process {process_index} of {process_count} gets none of the {len(documents)} "
          f"documents; use a larger corpus or fewer processes.")
    self._docs_per_chunk = config.data.docs_per_chunk
    self._num_chunks = -(-len(self._doc_ids) // self._docs_per_chunk)
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
    self._doc_order_cache: tuple[int, np.ndarray] | None = None
    self._position = _Position(0, 0, 0)
    self._stream = None   # a _Prefetcher or a generator, started lazily from self._position

  # -- seeds and layout ---------------------------------------------------------------------

  def _rng(self, purpose: int, seed_value: int, chunk_id: int = 0) -> np.random.Generator:
    return np.random.default_rng(
        [self._config.seed, purpose, seed_value, self._process_index, chunk_id])

  def _seeds(self, epoch: int) -> tuple[int, int, int]:
    """(layout_seed, mask_seed, order_seed) of an epoch."""
    if self._epoch_mode == "static":
      return epoch % self._dupe_factor, epoch % self._dupe_factor, epoch
    return 0, epoch, epoch

  def _doc_order(self, layout_seed: int) -> np.ndarray:
    cached = self._doc_order_cache   # read once: eval_batches may run beside the prefetcher
    if cached is None or cached[0] != layout_seed:
      cached = (layout_seed, self._rng(_DOC_ORDER, layout_seed).permutation(self._doc_ids))
      self._doc_order_cache = cached
    return cached[1]

  def _chunk_id(self, epoch: int, chunk: int) -> int:
    """Which chunk of the epoch's document order is visited `chunk`-th."""
    order_seed = self._seeds(epoch)[2]
    return int(self._rng(_CHUNK_ORDER, order_seed).permutation(self._num_chunks)[chunk])

  def chunk_documents(self, epoch: int, chunk: int) -> np.ndarray:
    """[<= docs_per_chunk] indices into `documents` of the `chunk`-th chunk of `epoch`."""
    chunk_id = self._chunk_id(epoch, chunk)
    order = self._doc_order(self._seeds(epoch)[0])
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
      # the objective has none.
      pair_mode = self._config.objective.get("sentence_task") or "nsp"
      return packing.sentence_pairs(docs, data.seq_len, rng, short_seq_prob=data.short_seq_prob,
                                    cls_id=tok.cls_id, sep_id=tok.sep_id, pad_id=tok.pad_id,
                                    pair_mode=pair_mode)
    if data.packing == "t5_segments":
      return packing.token_segments(docs, self._segment_len, pad_id=tok.pad_id,
                                    concat_documents=self._config.objective.get(
                                        "concat_documents", True))
    if data.packing == "electra_segments":
      return packing.electra_segments(docs, data.seq_len, rng, cls_id=tok.cls_id,
                                      sep_id=tok.sep_id, pad_id=tok.pad_id)
    blocks = {"full_sentences": packing.full_sentences, "document_blocks": packing.document_blocks}
    if data.packing in blocks:
      return blocks[data.packing](docs, data.seq_len, cls_id=tok.cls_id, sep_id=tok.sep_id,
                                  pad_id=tok.pad_id)
    raise config_lib.ConfigError(f"data.packing={data.packing!r}; choose one of "
                                 f"{config_lib.PACKINGS}.")

  def chunk_examples(self, epoch: int, chunk: int) -> Batch:
    """All examples of one chunk, noised and shuffled: dict of [n_chunk, ...] arrays."""
    layout_seed, mask_seed, order_seed = self._seeds(epoch)
    chunk_id = self._chunk_id(epoch, chunk)
    docs = self._tokenize(self.chunk_documents(epoch, chunk))
    # Seeded by the chunk's identity (not its visiting position), so with a repeated layout
    # seed the same documents give the same instances and, in static mode, the same masks.
    examples = self._pack(docs, self._rng(_PACK, layout_seed, chunk_id))
    features = self._features_fn(examples, self._rng(_MASK, mask_seed, chunk_id))
    examples = features if self._replace_examples else {**examples, **features}
    order = self._rng(_EXAMPLE_ORDER, order_seed, chunk_id).permutation(
        len(examples["input_ids"]))
    return {key: value[order] for key, value in examples.items()}

  # -- the batch stream -----------------------------------------------------------------------

  def _too_small(self, num_examples: int) -> config_lib.ConfigError:
    data = self._config.data
    return config_lib.ConfigError(
        f"One epoch of this process's {len(self._doc_ids)} documents packs into only "
        f"{num_examples} examples (data.packing={data.packing}, seq_len={data.seq_len}), fewer "
        f"than one local batch of {self._batch_size}. Lower --config.data.seq_len or "
        f"--config.train.batch_size, or use a larger corpus (--config.data.source).")

  def _batches(self, position: _Position) -> Iterator[tuple[Batch, _Position]]:
    """Yields (batch, position after it) from `position` on, forever."""
    epoch, chunk, offset = position
    parts, num_pending = [], 0
    epoch_examples = 0 if (chunk, offset) == (0, 0) else None   # counted only for whole epochs
    while True:
      examples = self.chunk_examples(epoch, chunk)
      num_examples = len(examples["input_ids"])
      if epoch_examples is not None:
        epoch_examples += num_examples - offset
      while offset < num_examples:
        take = min(self._batch_size - num_pending, num_examples - offset)
        parts.append({k: v[offset:offset + take] for k, v in examples.items()})
        num_pending += take
        offset += take
        if num_pending == self._batch_size:
          if offset == num_examples:   # report a finished chunk as the start of the next one
            break
          yield self._concat(parts), _Position(epoch, chunk, offset)
          parts, num_pending = [], 0
      chunk, offset = chunk + 1, 0
      if chunk == self._num_chunks:
        if epoch_examples is not None and epoch_examples < self._batch_size:
          raise self._too_small(epoch_examples)
        epoch, chunk, epoch_examples = epoch + 1, 0, 0
      if num_pending == self._batch_size:
        yield self._concat(parts), _Position(epoch, chunk, 0)
        parts, num_pending = [], 0

  @staticmethod
  def _concat(parts: list[Batch]) -> Batch:
    if len(parts) == 1:
      return {k: np.ascontiguousarray(v) for k, v in parts[0].items()}
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

  # -- public iteration and state -------------------------------------------------------------

  def __iter__(self) -> "Pipeline":
    return self

  def __next__(self) -> Batch:
    if self._stream is None:
      stream = self._batches(self._position)
      depth = self._config.data.prefetch
      self._stream = _Prefetcher(stream, depth) if depth > 0 else stream
    if isinstance(self._stream, _Prefetcher):
      batch, self._position = self._stream.get()
    else:
      batch, self._position = next(self._stream)
    return batch

  def state(self) -> dict[str, int]:
    """The position after the last batch handed out (what the consumer has received)."""
    return dict(self._position._asdict())

  def restore(self, state: dict[str, int]) -> None:
    """Continues from a `state()`; the following batches equal the uninterrupted stream's."""
    self.close()
    self._position = _Position(int(state["epoch"]), int(state["chunk"]), int(state["offset"]))

  def close(self) -> None:
    """Stops the prefetch thread (restarted by the next `next()`)."""
    if isinstance(self._stream, _Prefetcher):
      self._stream.close()
    self._stream = None

  def eval_batches(self, num_batches: int) -> list[Batch]:
    """The first `num_batches` batches of the stream from its start: the same on every call.

    Independent of the iteration position. If the split is smaller than `num_batches` batches,
    later batches repeat examples (with the next epoch's masks); this is logged.
    """
    stream = self._batches(_Position(0, 0, 0))
    batches, positions = [], []
    for batch, position in itertools.islice(stream, num_batches):
      batches.append(batch)
      positions.append(position)
    if positions and positions[-1].epoch > 0:
      logging.warning("eval_batches(%d) wraps around the eval split (%d documents on process "
                      "%d); examples repeat.", num_batches, len(self._doc_ids),
                      self._process_index)
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
