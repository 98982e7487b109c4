"""Files wherever they live. A local path goes through `os` (so local behaviour is unchanged); a
URL (`gs://bucket/run`, `s3://…`, any scheme `etils.epath` knows) through `etils.epath`, which
reaches Cloud Storage through gcsfs (the `[gcs]` extra). Orbax writes the checkpoints under the
same path itself. Object stores have no rename and no append: `write_atomically` is one upload
there (an object appears whole or not at all), and `train/metrics.py` writes metrics.jsonl in
bounded parts instead of appending."""

from __future__ import annotations

import builtins
import glob as glob_lib
import os
import shutil
import tempfile
from typing import IO

from etils import epath

from bertfam_jax import errors


def is_remote(path: str) -> bool:
  """True for a URL ('gs://bucket/run'), False for a local path."""
  return "://" in str(path)


def is_absolute(path: str) -> bool:
  """A URL, or an absolute local path."""
  return is_remote(path) or os.path.isabs(path)


def absolute(path: str) -> str:
  """A local path made absolute; a URL as it is."""
  return str(path) if is_remote(path) else os.path.abspath(os.path.expanduser(path))


def exists(path: str) -> bool:
  return epath.Path(path).exists() if is_remote(path) else os.path.exists(path)


def isdir(path: str) -> bool:
  return epath.Path(path).is_dir() if is_remote(path) else os.path.isdir(path)


def isfile(path: str) -> bool:
  return epath.Path(path).is_file() if is_remote(path) else os.path.isfile(path)


def listdir(path: str) -> list[str]:
  """The names in a directory (a URL's prefix), sorted."""
  if is_remote(path):
    return sorted(p.name for p in epath.Path(path).iterdir())
  return sorted(os.listdir(path))


def glob(pattern: str) -> list[str]:
  """Paths matching a shell pattern, sorted; `~` expanded locally."""
  if not is_remote(pattern):
    return sorted(glob_lib.glob(os.path.expanduser(pattern)))
  scheme, rest = str(pattern).split("://", 1)
  bucket, _, within = rest.partition("/")
  root = epath.Path(f"{scheme}://{bucket}")
  return sorted(str(p) for p in root.glob(within)) if within else [str(root)]


def makedirs(path: str) -> None:
  """Creates a directory and its parents; object stores have none to create."""
  if not is_remote(path):
    os.makedirs(path, exist_ok=True)


def open(path: str, mode: str = "r", encoding: str | None = None) -> IO:  # pylint: disable=redefined-builtin
  """A file object; on a URL, text or binary reads and whole writes ('w', 'wb'), never 'a'."""
  if not is_remote(path):
    return builtins.open(path, mode, encoding=encoding)
  if "a" in mode or "+" in mode:
    raise ValueError(f"{path}: mode {mode!r} is not available on an object store")
  return epath.Path(path).open(mode, encoding=encoding) if "b" not in mode else (
      epath.Path(path).open(mode))


def read_bytes(path: str) -> bytes:
  with open(path, "rb") as f:
    return f.read()


def read_text(path: str) -> str:
  with open(path, "r", encoding="utf-8") as f:
    return f.read()


def remove(path: str) -> None:
  if is_remote(path):
    epath.Path(path).unlink()
  else:
    os.remove(path)


def rmtree(path: str) -> None:
  """Removes a directory and everything under it, if it exists."""
  if is_remote(path):
    if epath.Path(path).exists():
      epath.Path(path).rmtree()
  else:
    shutil.rmtree(path, ignore_errors=True)


def write_atomically(path: str, data: bytes) -> None:
  """Writes `data` so that a crash never leaves a half-written file and concurrent writers
  (several hosts) are harmless: locally a temp file in the target directory renamed into place;
  on an object store a single upload, which is atomic there."""
  if is_remote(path):
    epath.Path(path).write_bytes(data)
    return
  directory = os.path.dirname(path) or "."
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    os.chmod(tmp, 0o644)   # mkstemp creates 0600; caches may be shared between users
    os.replace(tmp, path)
  except BaseException as e:
    os.unlink(tmp)
    if errors.no_space(e) is not None:
      raise errors.no_space_error(e, directory, f"{path} ({len(data):,} bytes)") from e
    raise
