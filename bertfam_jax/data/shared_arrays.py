"""Dicts of numpy arrays handed from worker processes to the training process through reused
shared-memory segments.

A worker of the host pipeline (`data.workers`) returns a chunk of examples, tens of KB to
hundreds of MB of arrays. Sent through a pipe, every byte is pickled, written in 64 KB pieces,
read and unpickled again; written to a new shared-memory file per chunk, every page is allocated
by the filesystem and freed again (0.25 ms of a RoBERTa chunk's 2 ms, docs/results.md, "Worker
processes"). Here each worker keeps its own segments, files of the POSIX shared-memory
filesystem (/dev/shm): a chunk is written into a free segment large enough (one `pwrite` per
array: a copy into pages that already exist), the training process reads it through a mapping it
keeps per segment (`Reader`, read-only: it copies the batches out) and hands the segment back
(`Segments.release`, through the worker's pipe) once it has taken every batch of the chunk.

Cleanup: a worker unlinks its segments when it ends (`Segments.close`), and keeps at most
`KEEP_FREE` free ones; the parent removes what a dead worker left (`remove_segments_of`); each
segment is registered with multiprocessing's resource tracker, which the spawned workers share
with their parent, so none outlives the parent either.

Where shared memory cannot take the arrays (no /dev/shm, not enough room in it, arrays of Python
objects), `Segments.export` returns the arrays themselves, which the pipe carries pickled: the
arrays are the same either way.
"""

from __future__ import annotations

import glob
import mmap
import os
from multiprocessing import resource_tracker
from typing import Mapping, NamedTuple
import uuid

import numpy as np

# The POSIX shared-memory filesystem (Linux). Where it is missing, arrays go through the pipe.
SHM_DIR = "/dev/shm"
PREFIX = "bertfam_"
_ALIGN = 64                 # bytes: each array starts at a cache-line boundary
_GRANULE = 1 << 20          # segments are whole MiBs, 25% larger than the chunk that made them
KEEP_FREE = 2               # free segments a worker keeps; more are unlinked


class Shared(NamedTuple):
  """A dict of arrays in a segment: its name, each array's (key, dtype, shape, byte offset), and
  the worker's segments unlinked since its last export (the reader drops their mappings)."""
  name: str
  layout: tuple[tuple[str, np.dtype, tuple[int, ...], int], ...]
  retired: tuple[str, ...] = ()


def _layout(arrays: Mapping[str, np.ndarray]) -> tuple[tuple, int]:
  layout, offset = [], 0
  for key, value in arrays.items():
    layout.append((key, value.dtype, value.shape, offset))
    offset += -(-value.nbytes // _ALIGN) * _ALIGN
  return tuple(layout), offset


def _write_all(fd: int, data: np.ndarray, offset: int) -> None:
  view = memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
  while len(view):
    written = os.pwrite(fd, view, offset)
    view, offset = view[written:], offset + written


def _unlink(name: str) -> None:
  """Removes a segment's file (if still there) and its resource-tracker entry."""
  try:
    os.unlink(os.path.join(SHM_DIR, name))
  except FileNotFoundError:
    pass
  resource_tracker.unregister("/" + name, "shared_memory")


class Segments:
  """A worker's segments: `export` writes into a free one (or a new one), `release` frees the
  ones the training process has read, `close` unlinks them all."""

  def __init__(self):
    self._files: dict[str, tuple[int, int]] = {}   # name: (open descriptor, capacity in bytes)
    self._free: set[str] = set()
    # The smallest capacity /dev/shm could not hold, not tried again (0: no /dev/shm at all).
    self._refused = None if os.path.isdir(SHM_DIR) else 0
    self._retired: list[str] = []   # unlinked since the last export

  def _new(self, size: int) -> str | None:
    capacity = -(-(size + size // 4 + 1) // _GRANULE) * _GRANULE
    if self._refused is not None and capacity >= self._refused:
      return None
    name = f"{PREFIX}{os.getpid()}_{uuid.uuid4().hex[:12]}"
    path = os.path.join(SHM_DIR, name)
    try:
      fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError:   # read-only, no permission, no descriptors left: the pipe instead
      self._refused = 0
      return None
    resource_tracker.register("/" + name, "shared_memory")
    try:
      os.posix_fallocate(fd, 0, capacity)   # a full /dev/shm fails here, not later
    except OSError:
      os.close(fd)
      _unlink(name)
      self._refused = capacity
      return None
    self._files[name] = (fd, capacity)
    return name

  def export(self, arrays: Mapping[str, np.ndarray]) -> Shared | dict[str, np.ndarray]:
    """Writes `arrays` into a free segment and returns where (`Shared`), or returns `arrays` as
    a plain dict where shared memory cannot hold them. The segment stays taken until released."""
    arrays = dict(arrays)
    if any(v.dtype.hasobject for v in arrays.values()):
      return arrays
    layout, size = _layout(arrays)
    fits = [name for name in self._free if self._files[name][1] >= size]
    name = min(fits, key=lambda n: self._files[n][1]) if fits else self._new(size)
    if name is None:
      return arrays
    self._free.discard(name)
    fd = self._files[name][0]
    try:
      for key, _, _, offset in layout:
        _write_all(fd, arrays[key], offset)
    except OSError:
      self._free.add(name)
      return arrays
    retired, self._retired = tuple(self._retired), []
    return Shared(name, layout, retired)

  def release(self, names) -> None:
    """The training process has read these segments: they may be written again (the smallest
    free ones beyond `KEEP_FREE` are unlinked)."""
    self._free.update(name for name in names if name in self._files)
    for name in sorted(self._free, key=lambda n: self._files[n][1])[:-KEEP_FREE]:
      self._free.remove(name)
      os.close(self._files.pop(name)[0])
      _unlink(name)
      self._retired.append(name)

  def close(self) -> None:
    """Unlinks every segment (the training process keeps what it still maps)."""
    for name, (fd, _) in self._files.items():
      os.close(fd)
      _unlink(name)
    self._files.clear()
    self._free.clear()


def remove_segments_of(pid: int) -> None:
  """Unlinks the segments a worker process left (it died, or was killed before its cleanup)."""
  for path in glob.glob(os.path.join(SHM_DIR, f"{PREFIX}{pid}_*")):
    _unlink(os.path.basename(path))


class Reader:
  """The training process's read-only mappings of the workers' segments, one per segment, kept
  (a segment is written again and again)."""

  def __init__(self):
    self._mappings: dict[str, mmap.mmap] = {}

  def load(self, payload: Shared | dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], bool]:
    """(the arrays `export` returned, whether they are read-only views of a segment, to copy
    before the segment is released)."""
    if not isinstance(payload, Shared):
      return payload, False
    for name in payload.retired:
      self._mappings.pop(name, None)
    mapping = self._mappings.get(payload.name)
    if mapping is None:
      fd = os.open(os.path.join(SHM_DIR, payload.name), os.O_RDONLY)
      try:
        mapping = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
      finally:
        os.close(fd)
      self._mappings[payload.name] = mapping
    return {key: np.ndarray(shape, dtype, buffer=mapping, offset=offset)
            for key, dtype, shape, offset in payload.layout}, True

  def close(self) -> None:
    """Drops the mappings (each is unmapped when no array uses it)."""
    self._mappings.clear()
