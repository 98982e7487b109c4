"""data.workers: chunks packed and noised in worker processes give the batches, positions and
resumes of the in-process pipeline, whatever the number of workers."""

import itertools
import os

import numpy as np
import pytest

from bertfam_jax import config_lib, objectives
from bertfam_jax.data import pipeline, shared_arrays, sources, tokenizers

BATCH = 8


def make_config(cache_dir, workers):
  c = config_lib.base_config()   # BERT: sentence pairs, NSP, 80/10/10 masking (static, dupe 3)
  c.data.update(seq_len=64, docs_per_chunk=3, prefetch=2, cache_dir=cache_dir, workers=workers)
  c.objective.dupe_factor = 3
  c.model.vocab_size = 1000
  c.tokenizer.update(model_type="bpe", train_max_sentences=4000)
  return c


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  cache_dir = str(tmp_path_factory.getbasetemp() / "bertfam_cache")
  config = make_config(cache_dir, 0)
  tokenizer = tokenizers.load_or_train(config, sources.get_documents(config.data, "train"))
  # 10 short documents -> 4 chunks of 3, 3, 3 and 1 per epoch: batches cross chunks and epochs.
  documents = [d[:1000] for d in sources.get_documents(config.data, "train")[:10]]
  return cache_dir, tokenizer, documents


def build(setup, workers):
  cache_dir, tokenizer, documents = setup
  config = make_config(cache_dir, workers)
  features_fn = objectives.get("mlm").make_features(config, tokenizer)
  return pipeline.Pipeline(config, tokenizer, documents, features_fn, 0, 1, BATCH)


def batches_and_states(p, n):
  out = []
  for batch in itertools.islice(p, n):
    out.append((batch, p.state()))
  return out


def assert_same(first, second):
  assert len(first) == len(second)
  for (a, state_a), (b, state_b) in zip(first, second):
    assert state_a == state_b
    assert a.keys() == b.keys()
    for key in a:
      np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_any_number_of_workers_gives_the_same_batches_and_resume(setup):
  reference_pipe = build(setup, 0)
  reference = batches_and_states(reference_pipe, 14)
  reference_pipe.close()
  assert reference[-1][1]["epoch"] >= 1          # the stream crossed an epoch (new masks)
  for workers in (1, 2):
    p = build(setup, workers)
    assert_same(batches_and_states(p, 14), reference)
    p.close()
  # Killed after 5 batches and resumed with 2 workers: the rest of the stream, exactly.
  resumed = build(setup, 2)
  resumed.restore([reference[4][1]])
  assert_same(batches_and_states(resumed, 9), reference[5:])
  # Evaluation batches (from the stream's start) too.
  np.testing.assert_array_equal(resumed.eval_batches(3)[2]["input_ids"],
                                reference[2][0]["input_ids"])
  resumed.close()
  assert resumed._pool is None   # pylint: disable=protected-access


@pytest.mark.skipif(not os.path.isdir(shared_arrays.SHM_DIR), reason="no /dev/shm")
def test_chunks_come_through_reused_segments_and_none_is_left_behind(setup, monkeypatch):
  """The workers' chunks arrive in shared-memory segments, which go back to their workers and
  are written again (a few per worker for a stream of many chunks); stopped with chunks computed
  ahead and never read, the pipeline leaves none of its workers' segments behind, and the
  batches handed out stay as they were (copies, not views of a segment written again)."""
  payloads = []
  load = shared_arrays.Reader.load
  monkeypatch.setattr(shared_arrays.Reader, "load",
                      lambda self, payload: payloads.append(payload) or load(self, payload))
  p = build(setup, 2)
  reference = build(setup, 0)
  batches = [next(p) for _ in range(60)]
  worker_pids = p._pool.pids   # pylint: disable=protected-access
  assert len(payloads) > 12 and all(isinstance(x, shared_arrays.Shared) for x in payloads)
  names = [x.name for x in payloads]
  assert len(set(names)) < len(names) // 2          # segments are written again and again
  p.close()                                        # 4 chunks were out: computed or not
  left = [f for f in os.listdir(shared_arrays.SHM_DIR)
          if any(f.startswith(f"{shared_arrays.PREFIX}{pid}_") for pid in worker_pids)]
  assert not left
  for batch in batches:
    assert batch["input_ids"].flags.writeable
  assert_same([(b, {}) for b in batches], [(next(reference), {}) for _ in range(60)])
  reference.close()


def test_a_workers_error_reaches_the_consumer(setup):
  """A chunk that fails in a worker raises its own error in the training process; noising that
  cannot go to a worker process is refused in one line naming data.workers."""
  cache_dir, tokenizer, documents = setup
  config = make_config(cache_dir, 2)
  config.data.packing = "no_such_packing"
  features_fn = objectives.get("mlm").make_features(config, tokenizer)
  p = pipeline.Pipeline(config, tokenizer, documents, features_fn, 0, 1, BATCH)
  with pytest.raises(config_lib.ConfigError, match="data.packing='no_such_packing'"):
    next(p)
  p.close()
  local = pipeline.Pipeline(make_config(cache_dir, 2), tokenizer, documents,
                            lambda examples, rng: {}, 0, 1, BATCH)
  with pytest.raises(config_lib.ConfigError, match="data.workers=2 sends the objective's"):
    next(local)
  local.close()
