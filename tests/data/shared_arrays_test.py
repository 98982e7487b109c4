"""data.shared_arrays: a worker's arrays reach the parent through a shared-memory file, equal,
writable and with the file gone; where shared memory cannot hold them, the arrays themselves."""

import concurrent.futures
import errno
import multiprocessing
import os

import numpy as np
import pytest

from bertfam_jax.data import shared_arrays


def chunk_like():
  rng = np.random.default_rng(0)
  return {
      "input_ids": rng.integers(0, 30000, (37, 64), dtype=np.int32),
      "mlm_weights": rng.random((37, 9), dtype=np.float32),
      "sentence_label": rng.integers(0, 2, (37,)).astype(np.int64),
      "strided": np.arange(200, dtype=np.int16).reshape(20, 10)[:, ::3],   # not contiguous
      "empty": np.zeros((0, 5), np.int32),
      "bools": rng.random((37, 3)) > 0.5,
  }


def our_files():
  return {f for f in os.listdir(shared_arrays.SHM_DIR) if f.startswith(shared_arrays._PREFIX)}  # pylint: disable=protected-access


def assert_same_arrays(got, want):
  assert list(got) == list(want)
  for key, value in want.items():
    assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
    np.testing.assert_array_equal(got[key], value, err_msg=key)


needs_shm = pytest.mark.skipif(not os.path.isdir(shared_arrays.SHM_DIR),
                               reason="no POSIX shared-memory filesystem (Linux's /dev/shm)")


def export_chunk():   # in a spawned process, as the pipeline's workers
  return shared_arrays.export(chunk_like())


@needs_shm
def test_arrays_from_a_spawned_process_arrive_equal_and_the_file_is_gone():
  before = our_files()
  with concurrent.futures.ProcessPoolExecutor(
      1, mp_context=multiprocessing.get_context("spawn")) as pool:
    payload = pool.submit(export_chunk).result()
  assert isinstance(payload, shared_arrays.Shared)
  assert payload.name in our_files() - before
  arrays = shared_arrays.load(payload)
  assert our_files() == before                      # unlinked on load, read in place
  assert_same_arrays(arrays, chunk_like())
  arrays["input_ids"][0, 0] = -1                    # writable, as arrays made here are
  for _, _, _, offset in payload.layout:
    assert offset % 64 == 0


@needs_shm
def test_discard_removes_an_unread_payload():
  before = our_files()
  payload = shared_arrays.export(chunk_like())
  assert our_files() - before == {payload.name}
  shared_arrays.discard(payload)
  shared_arrays.discard(payload)                    # twice is harmless
  assert our_files() == before


def test_without_shared_memory_the_arrays_travel_themselves(monkeypatch, tmp_path):
  monkeypatch.setattr(shared_arrays, "SHM_DIR", str(tmp_path / "missing"))
  payload = shared_arrays.export(chunk_like())
  assert isinstance(payload, dict)
  assert_same_arrays(shared_arrays.load(payload), chunk_like())


@needs_shm
def test_a_full_shared_memory_filesystem_falls_back_and_leaves_no_file(monkeypatch):
  def full(fd, data, offset):
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(os, "pwrite", full)
  before = our_files()
  payload = shared_arrays.export(chunk_like())
  assert isinstance(payload, dict) and our_files() == before
  assert_same_arrays(shared_arrays.load(payload), chunk_like())


def test_arrays_of_python_objects_travel_themselves():
  arrays = {"texts": np.array(["a", None], dtype=object), "ids": np.arange(3)}
  payload = shared_arrays.export(arrays)
  assert isinstance(payload, dict) and payload["texts"][0] == "a"
