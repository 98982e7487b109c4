"""The error every user mistake raises (a bad value, missing data, an impossible length, a corrupt
or mismatched checkpoint, a full disk): `main` prints its message as one line and exits 2. Here,
importing nothing of ours, so that any module can raise it (`config_lib.ConfigError` is the same
class)."""

import errno
import os
import shutil


class ConfigError(ValueError):
  """A configuration or input that cannot run; the message names the field or file and the fix."""


# What a write that found no room raises: the disk or the quota is full, or a file-size limit
# (ulimit -f) is reached.
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_NO_SPACE_TEXT = ("No space left on device", "Disk quota exceeded", "File too large")


def no_space(error: BaseException) -> BaseException | None:
  """The exception in `error`'s chain (causes and contexts) that says a write found no room, or
  None. Orbax and TensorStore wrap the OSError, or keep only its text."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno in _NO_SPACE:
      return error
    if any(text in str(error) for text in _NO_SPACE_TEXT):
      return error
    error = error.__cause__ or error.__context__
  return None


def no_space_error(error: BaseException, directory: str, writing: str) -> ConfigError:
  """The one-line ConfigError for `no_space(error)`: what was being written, how much that
  needed where known, and how much the filesystem of `directory` has left."""
  found = no_space(error)
  name = getattr(found, "filename", None)
  reason = getattr(found, "strerror", None) or next(
      (text for text in _NO_SPACE_TEXT if text in str(found)), type(found).__name__)
  existing = os.path.abspath(directory)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  free = shutil.disk_usage(existing).free
  return ConfigError(
      f"No room to write {name or writing} ({reason}); {free / 2**20:,.0f} MiB are free on the "
      f"filesystem of {directory}. Free some space or raise the limit, then re-run: it "
      f"resumes from the last complete checkpoint, if any (those written are intact).")
