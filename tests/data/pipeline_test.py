"""Tests for bertfam_jax.data.pipeline: determinism, exact resume, sharding, data shards, epoch
seeds, errors."""

import itertools

import jax
from jax.sharding import Mesh, PartitionSpec
import numpy as np
import pytest

from bertfam_jax import config_lib
from bertfam_jax.data import pipeline
from bertfam_jax.data import sources
from bertfam_jax.data import tokenizers

BATCH = 16


def record_seed(examples, rng):
  """A stand-in for masking that exposes its generator: the mask seed and one draw per example."""
  n = len(examples["input_ids"])
  mask_seed = rng.bit_generator.seed_seq.entropy[2]   # [seed, purpose, SEED_VALUE, process, chunk]
  return dict(mask_seed=np.full(n, mask_seed, np.int32),
              draw=rng.integers(1 << 30, size=n).astype(np.int32))


def make_config(**data):
  c = config_lib.base_config()
  c.data.update(dict(seq_len=64, docs_per_chunk=4, prefetch=2), **data)
  c.objective.masking = "static"
  c.objective.dupe_factor = 3
  c.model.vocab_size = 1000
  c.tokenizer.model_type = "bpe"
  c.tokenizer.train_max_sentences = 4000
  return c


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  # The embedded corpus cache is shared by every test module of the session (same basetemp).
  return str(tmp_path_factory.getbasetemp() / "bertfam_cache")


@pytest.fixture(scope="module")
def documents(cache_dir):
  # 11 documents -> 3 chunks of 4, 4 and 3 documents: chunk sizes are not multiples of a batch.
  return list(sources.get_documents(make_config(cache_dir=cache_dir).data, "train")[:11])


@pytest.fixture(scope="module")
def tokenizer(cache_dir):
  config = make_config(cache_dir=cache_dir)
  return tokenizers.load_or_train(config, sources.get_documents(config.data, "train"))


@pytest.fixture
def make(cache_dir, tokenizer, documents):
  created = []

  def build(process_index=0, process_count=1, docs=None, batch_size=BATCH, epoch_mode=None,
            seed=0, **data):
    config = make_config(cache_dir=cache_dir, **data)
    config.seed = seed
    p = pipeline.Pipeline(config, tokenizer, documents if docs is None else docs, record_seed,
                          process_index, process_count, batch_size, epoch_mode=epoch_mode)
    created.append(p)
    return p

  yield build
  for p in created:
    p.close()


def take(p, n):
  return list(itertools.islice(p, n))


def assert_batches_equal(first, second):
  assert len(first) == len(second)
  for a, b in zip(first, second):
    assert a.keys() == b.keys()
    for key in a:
      np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_batches_have_the_documented_keys_and_shapes(make):
  batch = next(make())
  assert set(batch) == {"input_ids", "segment_ids", "input_mask", "sentence_label", "mask_seed",
                        "draw"}
  for key in ("input_ids", "segment_ids", "input_mask"):
    assert batch[key].shape == (BATCH, 64) and batch[key].dtype == np.int32
  assert batch["sentence_label"].shape == (BATCH,)


def test_deterministic_and_seed_dependent(make):
  first = take(make(), 5)
  assert_batches_equal(first, take(make(prefetch=0), 5))
  other = take(make(seed=1), 5)
  assert not np.array_equal(first[0]["input_ids"], other[0]["input_ids"])


def test_batches_are_the_chunks_in_sequence(make):
  p = make(prefetch=0)
  chunks = [p.chunk_examples(0, c) for c in range(3)]
  sizes = [len(c["input_ids"]) for c in chunks]
  assert all(size % BATCH for size in sizes)   # so batches straddle chunk boundaries
  stream = np.concatenate([c["input_ids"] for c in chunks])
  batches = take(p, len(stream) // BATCH)
  np.testing.assert_array_equal(np.concatenate([b["input_ids"] for b in batches]),
                                stream[:len(batches) * BATCH])


@pytest.mark.parametrize("packing", ["sentence_pairs", "full_sentences"])
def test_restore_reproduces_the_uninterrupted_stream(make, packing):
  epoch_mode = "static" if packing == "sentence_pairs" else "dynamic"
  per_epoch = sum(len(make(prefetch=0, packing=packing).chunk_examples(0, c)["input_ids"])
                  for c in range(3))
  total = per_epoch * 2 // BATCH + 3   # crosses an epoch boundary
  reference = take(make(packing=packing, epoch_mode=epoch_mode, prefetch=0), total)
  for k in (1, 7, per_epoch // BATCH, per_epoch // BATCH + 1, total - 2):
    p = make(packing=packing, epoch_mode=epoch_mode)    # prefetch on: state must lag the thread
    take(p, k)
    state = p.state()
    assert set(state) == {"epoch", "chunk", "offset"}
    assert all(isinstance(v, int) for v in state.values())
    resumed = make(packing=packing, epoch_mode=epoch_mode)
    resumed.restore([state])
    assert_batches_equal(take(resumed, total - k), reference[k:])
    # Restoring the running pipeline itself rewinds it.
    take(p, 3)
    p.restore([state])
    assert_batches_equal(take(p, 2), reference[k:k + 2])


def test_state_ignores_prefetched_batches(make):
  eager, lazy = make(prefetch=4), make(prefetch=0)
  take(eager, 9)
  take(lazy, 9)
  assert eager.state() == lazy.state()
  assert eager.state()["epoch"] == 0 and eager.state()["offset"] > 0


def test_processes_read_disjoint_documents(make, documents):
  shards = [make(process_index=i, process_count=2) for i in range(2)]
  seen = []
  for p in shards:
    docs = np.concatenate([p.chunk_documents(0, c) for c in range(2)])   # 6 and 5 documents
    assert len(set(docs.tolist())) == len(docs)
    seen.append(set(docs.tolist()))
  assert seen[0].isdisjoint(seen[1])
  assert seen[0] | seen[1] == set(range(len(documents)))
  assert not np.array_equal(next(shards[0])["input_ids"], next(shards[1])["input_ids"])


def global_batches(pipes, n):
  """n global batches: the processes' local batches concatenated in process order."""
  return [{k: np.concatenate([b[k] for b in local]) for k in local[0]}
          for local in zip(*(take(p, n) for p in pipes))]


def test_data_shards_make_the_batches_independent_of_the_process_count(make, documents):
  """With data.num_shards fixed, 1, 2 and 4 processes give the same global batches, and with one
  shard per process a shard's stream is the default pipeline's stream of that process."""
  docs, n = documents[:4], 12   # one document per shard; the last one's epoch is 8 batches
  one = take(make(docs=docs, num_shards=4), n)
  for count in (2, 4):
    pipes = [make(process_index=i, process_count=count, docs=docs, batch_size=BATCH // count,
                  num_shards=4) for i in range(count)]
    assert [list(p.shards) for p in pipes] == np.arange(4).reshape(count, -1).tolist()
    assert_batches_equal(global_batches(pipes, n), one)
  default = [make(process_index=i, process_count=4, docs=docs, batch_size=BATCH // 4)
             for i in range(4)]
  assert_batches_equal(global_batches(default, n), one)


def test_shard_positions_resume_on_another_process_count(make, documents):
  """Two processes' states (a checkpoint) continue on one process, and its state on two."""
  docs = documents[:4]   # shard 1's epoch is 15.25 batches: batches 13-20 cross it
  reference = take(make(docs=docs, num_shards=2, prefetch=0), 20)
  pipes = [make(process_index=i, process_count=2, docs=docs, batch_size=BATCH // 2,
                num_shards=2) for i in range(2)]
  assert_batches_equal(global_batches(pipes, 7), reference[:7])
  one = make(docs=docs, num_shards=2)
  one.restore([p.state() for p in pipes])
  assert set(one.state()) == {"epoch", "chunk", "offset", "epoch_1", "chunk_1", "offset_1"}
  assert_batches_equal(take(one, 6), reference[7:13])
  again = [make(process_index=i, process_count=2, docs=docs, batch_size=BATCH // 2,
                num_shards=2) for i in range(2)]
  for p in again:
    p.restore([one.state()])
  assert_batches_equal(global_batches(again, 7), reference[13:])


def test_restore_with_another_number_of_shards(make):
  two_processes = [dict(epoch=0, chunk=1, offset=3)] * 2
  with pytest.raises(config_lib.ConfigError, match=r"2 data shards.*num_shards=4; "
                                                   r"--config.data.num_shards=2 "):
    make(num_shards=4).restore(two_processes)
  # One shard per process (the default): a checkpoint of 2 processes restarts the stream on 1.
  p = make(prefetch=0)
  p.restore(two_processes)
  assert p.state() == dict(epoch=0, chunk=0, offset=0)
  assert_batches_equal(take(p, 2), take(make(), 2))


def test_data_shards_that_cannot_be_split(make, documents):
  with pytest.raises(config_lib.ConfigError, match=r"num_shards=3 is not a multiple of the 2 "):
    make(process_index=0, process_count=2, num_shards=3)
  with pytest.raises(config_lib.ConfigError, match=r"batch of 6 .*num_shards=4"):
    make(batch_size=6, num_shards=4)
  with pytest.raises(config_lib.ConfigError, match=r"Data shard 0 of 3 gets none of the 2 "):
    make(docs=documents[:2], num_shards=3, batch_size=3)


def epoch_examples(p, epoch):
  """{example row bytes: (mask seed, draw)} over all chunks of one epoch, plus the row order."""
  chunks = [p.chunk_examples(epoch, c) for c in range(3)]
  rows = [row.tobytes() for c in chunks for row in c["input_ids"]]
  marks = [(int(s), int(d)) for c in chunks for s, d in zip(c["mask_seed"], c["draw"])]
  return dict(zip(rows, marks)), rows


def test_static_masking_repeats_dupe_factor_masks(make):
  p = make(epoch_mode="static")   # dupe_factor = 3
  epochs = [epoch_examples(p, e) for e in range(4)]
  assert [next(iter(marks.values()))[0] for marks, _ in epochs] == [0, 1, 2, 0]
  # Epoch 3 re-reads epoch 0's instances with epoch 0's masks, in a new order.
  assert epochs[3][0] == epochs[0][0]
  assert epochs[3][1] != epochs[0][1]
  # Epochs 0 and 1 are different instance sets (new layout: new pairs and truncations).
  assert set(epochs[1][0]) != set(epochs[0][0])


def test_dynamic_masking_draws_new_masks_each_epoch(make):
  p = make(epoch_mode="dynamic", packing="full_sentences")
  (marks0, order0), (marks1, order1) = epoch_examples(p, 0), epoch_examples(p, 1)
  assert set(marks0) == set(marks1)   # fixed blocks
  assert order0 != order1
  assert {s for s, _ in marks0.values()} == {0} and {s for s, _ in marks1.values()} == {1}
  same_draw = np.mean([marks0[row][1] == marks1[row][1] for row in marks0])
  assert same_draw < 0.01


def test_mask_seed_follows_the_epoch_in_the_stream(make, documents):
  p = make(docs=documents[:3], epoch_mode="dynamic", packing="full_sentences")
  for _ in range(500):
    epoch_before = p.state()["epoch"]
    batch = next(p)
    assert set(batch["mask_seed"].tolist()) <= {epoch_before, p.state()["epoch"]}
    if p.state()["epoch"] == 3:
      break
  assert p.state()["epoch"] == 3


def test_eval_batches_are_fixed(make):
  p = make()
  first = p.eval_batches(4)
  take(p, 30)
  state = p.state()
  assert_batches_equal(p.eval_batches(4), first)
  assert p.state() == state
  assert_batches_equal(make(prefetch=0).eval_batches(4), first)
  assert_batches_equal(first, take(make(), 4))   # the start of the epoch-0 stream


@pytest.mark.parametrize("prefetch", [0, 2])
def test_too_small_corpus_names_the_numbers(make, documents, prefetch):
  p = make(docs=documents[:1], seq_len=512, batch_size=64, prefetch=prefetch)
  with pytest.raises(config_lib.ConfigError, match=r"only \d+ examples.*seq_len=512.*batch of 64"):
    next(p)


def test_process_without_documents(make, documents):
  with pytest.raises(config_lib.ConfigError, match="none of the 2 documents"):
    make(docs=documents[:2], process_index=0, process_count=3)


def test_make_global_batch(make):
  batch = next(make())
  mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "fsdp"))
  global_batch = pipeline.make_global_batch(batch, mesh, PartitionSpec(("data", "fsdp")))
  assert set(global_batch) == set(batch)
  for key, value in global_batch.items():
    assert value.shape == batch[key].shape
    assert len(value.sharding.device_set) == 8
    np.testing.assert_array_equal(np.asarray(value), batch[key])
