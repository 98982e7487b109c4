"""Files wherever they live. A local path goes through `os` (so local behaviour is unchanged); a
URL (`gs://bucket/run`, `s3://…`, any scheme `etils.epath` knows) through `etils.epath`, which
reaches Cloud Storage through gcsfs (the `[gcs]` extra). Orbax writes the checkpoints under the
same path itself. Object stores have no rename and no append: `write_atomically` is one upload
there (an object appears whole or not at all), and `train/metrics.py` writes metrics.jsonl in
bounded parts instead of appending. A URL whose scheme has no filesystem package installed is a
ConfigError naming the extra."""

from __future__ import annotations

import builtins
import contextlib
import fcntl
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
  """A local path made absolute (`os.path.abspath`); a URL as it is."""
  return str(path) if is_remote(path) else os.path.abspath(path)


@contextlib.contextmanager
def _package_named(path: str):
  """Turns a missing filesystem package (gcsfs for gs://) into one line naming the extra."""
  try:
    yield
  except ImportError as e:
    raise errors.ConfigError(f"{path} needs a filesystem package for its scheme ({e}); for "
                             f"gs:// install the [gcs] extra: pip install 'bertfam_jax[gcs]'."
                             ) from None


def exists(path: str) -> bool:
  if not is_remote(path):
    return os.path.exists(path)
  with _package_named(path):
    return epath.Path(path).exists()


def isdir(path: str) -> bool:
  if not is_remote(path):
    return os.path.isdir(path)
  with _package_named(path):
    return epath.Path(path).is_dir()


def isfile(path: str) -> bool:
  if not is_remote(path):
    return os.path.isfile(path)
  with _package_named(path):
    return epath.Path(path).is_file()


def listdir(path: str) -> list[str]:
  """The names in a directory (a URL's prefix), sorted."""
  if not is_remote(path):
    return sorted(os.listdir(path))
  with _package_named(path):
    return sorted(p.name for p in epath.Path(path).iterdir())


def glob(pattern: str) -> list[str]:
  """Paths matching a shell pattern, sorted ([] when nothing, not even the bucket, exists); `~`
  expanded locally."""
  if not is_remote(pattern):
    return sorted(glob_lib.glob(os.path.expanduser(pattern)))
  scheme, rest = str(pattern).split("://", 1)
  bucket, _, within = rest.partition("/")
  root = epath.Path(f"{scheme}://{bucket}")
  with _package_named(pattern):
    try:
      return sorted(str(p) for p in root.glob(within)) if within else [str(root)]
    except FileNotFoundError:
      return []


def makedirs(path: str) -> None:
  """Creates a directory and its parents; object stores have none to create."""
  if not is_remote(path):
    os.makedirs(path, exist_ok=True)


def open(path: str, mode: str = "r", encoding: str | None = None) -> IO:  # pylint: disable=redefined-builtin
  """A file object; on a URL, reads and whole writes ('w', 'wb'), never appends."""
  if not is_remote(path):
    return builtins.open(path, mode, encoding=encoding)
  if "a" in mode or "+" in mode:
    raise ValueError(f"{path}: mode {mode!r} is not available on an object store")
  with _package_named(path):
    if "b" in mode:
      return epath.Path(path).open(mode)
    return epath.Path(path).open(mode, encoding=encoding)


def read_bytes(path: str) -> bytes:
  with open(path, "rb") as f:
    return f.read()


def read_text(path: str) -> str:
  with open(path, "r", encoding="utf-8") as f:
    return f.read()


def remove(path: str) -> None:
  if not is_remote(path):
    os.remove(path)
    return
  with _package_named(path):
    epath.Path(path).unlink()


def rmtree(path: str, ignore_errors: bool = True) -> None:
  """Removes a directory and everything under it; with `ignore_errors` (locally), also when it
  does not exist or a file cannot be removed."""
  if not is_remote(path):
    shutil.rmtree(path, ignore_errors=ignore_errors)
    return
  with _package_named(path):
    if epath.Path(path).exists():
      epath.Path(path).rmtree()


@contextlib.contextmanager
def exclusive(path: str):
  """Holds an exclusive lock on the local file PATH.lock while the block runs, so that processes
  sharing a cache (a sweep's parallel jobs, test workers) build one entry once: the others wait,
  then find it. Object stores have no locks: there the block runs unguarded (its writes are
  atomic, `write_atomically`, so concurrent builders only repeat the work)."""
  if is_remote(path):
    yield
    return
  makedirs(os.path.dirname(path) or ".")
  with builtins.open(f"{path}.lock", "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


def write_atomically(path: str, data: bytes) -> None:
  """Writes `data` so that a crash never leaves a half-written file and concurrent writers
  (several hosts) are harmless: locally a temp file in the target directory renamed into place;
  on an object store a single upload, which is atomic there."""
  if is_remote(path):
    with _package_named(path):
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
