"""Dicts of numpy arrays handed from a worker process to its parent through shared memory.

A worker of the host pipeline (`data.workers`) returns a chunk of examples, tens of KB to
hundreds of MB of arrays. Sent through the worker's pipe, every byte is pickled, written
in 64 KB pieces, read and unpickled again, and on a busy host the parent's share of that costs as
much as the packing it was spared (docs/results.md, "Worker processes"). Here the worker writes
the arrays once into a file of the POSIX shared-memory filesystem (/dev/shm) and sends only its
name and layout; the parent maps the file (copy-on-write), unlinks it at once and reads the arrays
in place (the mapping lives as long as an array uses it).

Cleanup: each file is registered with multiprocessing's resource tracker, which the spawned
workers share with their parent, and unregistered by the parent once unlinked, so files a dead
parent never read are removed when the tracker sees it exit.

Where shared memory cannot take the arrays (no /dev/shm, not enough room in it, arrays of Python
objects), `export` returns the arrays themselves, which the pipe carries pickled: the arrays
are the same either way.
"""

from __future__ import annotations

import itertools
import mmap
import os
from multiprocessing import resource_tracker
from typing import Mapping, NamedTuple
import uuid

import numpy as np

# The POSIX shared-memory filesystem (Linux). Where it is missing, arrays go through the pipe.
SHM_DIR = "/dev/shm"
_PREFIX = "bertfam_"
_ALIGN = 64   # bytes: each array starts at a cache-line boundary
_counter = itertools.count()


class Shared(NamedTuple):
  """Where a dict of arrays lies in a shared-memory file: its name and each array's
  (key, dtype string, shape, byte offset)."""
  name: str
  layout: tuple[tuple[str, str, tuple[int, ...], int], ...]
  size: int


def _layout(arrays: Mapping[str, np.ndarray]) -> tuple[tuple, int]:
  layout, offset = [], 0
  for key, value in arrays.items():
    layout.append((key, value.dtype.str, value.shape, offset))
    offset += -(-value.nbytes // _ALIGN) * _ALIGN
  return tuple(layout), max(offset, 1)


def _write_all(fd: int, data: np.ndarray, offset: int) -> None:
  view = memoryview(data)
  while len(view):
    written = os.pwrite(fd, view, offset)
    view, offset = view[written:], offset + written


def export(arrays: Mapping[str, np.ndarray]) -> Shared | dict[str, np.ndarray]:
  """Writes `arrays` to a new shared-memory file (in a worker process) and returns its `Shared`
  description, or returns `arrays` as a plain dict where shared memory cannot hold them."""
  arrays = dict(arrays)
  if not os.path.isdir(SHM_DIR) or any(v.dtype.hasobject for v in arrays.values()):
    return arrays
  layout, size = _layout(arrays)
  name = f"{_PREFIX}{os.getpid()}_{next(_counter)}_{uuid.uuid4().hex[:8]}"
  path = os.path.join(SHM_DIR, name)
  fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
  try:
    # One copy into the filesystem's pages, no page faults; a full tmpfs fails with ENOSPC.
    for key, _, _, offset in layout:
      _write_all(fd, np.ascontiguousarray(arrays[key]).reshape(-1).view(np.uint8), offset)
    os.ftruncate(fd, size)   # the last alignment padding
  except OSError:
    os.close(fd)
    os.unlink(path)
    return arrays
  os.close(fd)
  resource_tracker.register("/" + name, "shared_memory")
  return Shared(name, layout, size)


def load(payload: Shared | dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The arrays `export` returned (in the parent process): read in place from the shared-memory
  file, which is unlinked here; its memory is freed when the last array using it is."""
  if not isinstance(payload, Shared):
    return payload
  path = os.path.join(SHM_DIR, payload.name)
  fd = os.open(path, os.O_RDONLY)
  try:
    # Copy-on-write: the arrays are writable, as the ones computed in this process are.
    mapped = mmap.mmap(fd, payload.size, flags=mmap.MAP_PRIVATE,
                       prot=mmap.PROT_READ | mmap.PROT_WRITE)
  finally:
    os.close(fd)
    os.unlink(path)
    resource_tracker.unregister("/" + payload.name, "shared_memory")
  return {key: np.ndarray(shape, dtype, buffer=mapped, offset=offset)
          for key, dtype, shape, offset in payload.layout}


def discard(payload: Shared | dict[str, np.ndarray]) -> None:
  """Removes the file of a payload that will never be loaded (a chunk computed ahead of a
  pipeline that stops)."""
  if isinstance(payload, Shared):
    try:
      os.unlink(os.path.join(SHM_DIR, payload.name))
    except FileNotFoundError:
      return
    resource_tracker.unregister("/" + payload.name, "shared_memory")
