"""data.shared_arrays: a chunk's arrays written into a worker's shared-memory segment read back
equal through the training process's mapping; a released segment is written again, a taken one
never; closing unlinks every segment; where shared memory cannot hold the arrays, the arrays
themselves."""

import errno
import os

import numpy as np
import pytest

from bertfam_jax.data import shared_arrays


def chunk_like(seed=0, rows=37):
  rng = np.random.default_rng(seed)
  return {
      "input_ids": rng.integers(0, 30000, (rows, 64), dtype=np.int32),
      "mlm_weights": rng.random((rows, 9), dtype=np.float32),
      "sentence_label": rng.integers(0, 2, (rows,)).astype(np.int64),
      "strided": np.arange(20 * rows, dtype=np.int16).reshape(rows, 20)[:, ::3],   # a view
      "empty": np.zeros((0, 5), np.int32),
      "bools": rng.random((rows, 3)) > 0.5,
  }


def our_files():
  """This process's segments (another test worker may have its own meanwhile)."""
  mine = f"{shared_arrays.PREFIX}{os.getpid()}_"
  return {f for f in os.listdir(shared_arrays.SHM_DIR) if f.startswith(mine)}


def assert_same_arrays(got, want):
  assert list(got) == list(want)
  for key, value in want.items():
    assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
    np.testing.assert_array_equal(got[key], value, err_msg=key)


needs_shm = pytest.mark.skipif(not os.path.isdir(shared_arrays.SHM_DIR),
                               reason="no POSIX shared-memory filesystem (Linux's /dev/shm)")


@needs_shm
def test_segments_are_read_equal_reused_once_released_and_unlinked_at_close():
  before = our_files()
  segments, reader = shared_arrays.Segments(), shared_arrays.Reader()
  first = segments.export(chunk_like(0))
  assert isinstance(first, shared_arrays.Shared) and our_files() - before == {first.name}
  arrays, views = reader.load(first)
  assert views and all(offset % 64 == 0 for *_, offset in first.layout)
  assert_same_arrays(arrays, chunk_like(0))
  with pytest.raises(ValueError, match="read-only"):
    arrays["input_ids"][0, 0] = 1                 # the training process copies its batches
  taken = segments.export(chunk_like(1))          # the first is not released: another segment
  assert taken.name != first.name
  segments.release([first.name])
  again = segments.export(chunk_like(2, rows=20))   # fits the released one: written again
  assert again.name == first.name
  assert_same_arrays(reader.load(again)[0], chunk_like(2, rows=20))
  assert_same_arrays(reader.load(taken)[0], chunk_like(1))
  segments.release([taken.name])
  larger = segments.export(chunk_like(3, rows=20000))   # larger than both free ones
  assert larger.name not in (first.name, taken.name)
  assert_same_arrays(reader.load(larger)[0], chunk_like(3, rows=20000))
  kept = reader.load(taken)[0]
  segments.close()
  reader.close()
  assert our_files() == before
  assert_same_arrays(kept, chunk_like(1))          # still mapped after the unlink


def test_without_shared_memory_the_arrays_travel_themselves(monkeypatch, tmp_path):
  monkeypatch.setattr(shared_arrays, "SHM_DIR", str(tmp_path / "missing"))
  payload = shared_arrays.Segments().export(chunk_like())
  assert isinstance(payload, dict)
  arrays, views = shared_arrays.Reader().load(payload)
  assert not views
  assert_same_arrays(arrays, chunk_like())


@needs_shm
def test_a_full_shared_memory_filesystem_falls_back_and_leaves_no_file(monkeypatch):
  def full(fd, offset, length):
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(os, "posix_fallocate", full)
  before = our_files()
  payload = shared_arrays.Segments().export(chunk_like())
  assert isinstance(payload, dict) and our_files() == before
  assert_same_arrays(payload, chunk_like())


@needs_shm
def test_a_worker_keeps_few_free_segments_and_a_dead_ones_are_removed():
  """Beyond KEEP_FREE free segments a worker unlinks them, and the reader drops its mappings of
  those at the next chunk; the parent removes a dead worker's segments."""
  segments, reader = shared_arrays.Segments(), shared_arrays.Reader()
  payloads = [segments.export(chunk_like(seed)) for seed in range(5)]   # 5 segments taken
  for payload in payloads:
    reader.load(payload)
  segments.release([p.name for p in payloads])
  assert len(our_files()) == shared_arrays.KEEP_FREE
  after = segments.export(chunk_like(9))
  assert len(after.retired) == 5 - shared_arrays.KEEP_FREE
  reader.load(after)
  assert set(reader._mappings) == {p.name for p in payloads} - set(after.retired)  # pylint: disable=protected-access
  shared_arrays.remove_segments_of(os.getpid())        # as the parent does for a dead worker
  assert not our_files()


@needs_shm
def test_an_unwritable_shared_memory_directory_falls_back(monkeypatch):
  def refuse(*args, **kwargs):
    raise PermissionError(errno.EACCES, "Permission denied")
  segments = shared_arrays.Segments()
  monkeypatch.setattr(os, "open", refuse)
  assert isinstance(segments.export(chunk_like()), dict)
  monkeypatch.undo()
  assert isinstance(segments.export(chunk_like()), dict)   # not tried again
  assert not our_files()


def test_arrays_of_python_objects_travel_themselves():
  arrays = {"texts": np.array(["a", None], dtype=object), "ids": np.arange(3)}
  payload = shared_arrays.Segments().export(arrays)
  assert isinstance(payload, dict) and payload["texts"][0] == "a"
