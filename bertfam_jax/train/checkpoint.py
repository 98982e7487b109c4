"""Orbax checkpoints under WORKDIR/checkpoints: the train state and every process's data position,
saved asynchronously, restored onto any mesh, and read back parameters-only (`read_params`). What
else a workdir holds, and the checks that refuse a workdir of another run, are
`bertfam_jax/workdir.py`."""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
import logging as std_logging

import jax
import jax.numpy as jnp
from absl import logging
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from bertfam_jax import errors, fileio
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.train import step as step_lib

# Replica-parallel saving (orbax's default off GPU) splits every replicated array between its
# replicas, one on-device slice each: for biases and LayerNorm scales that is a dispatch (and, the
# first time for each shape, a compilation) per replica to write a few KiB. Arrays whose share
# per replica would be under 1 MiB are written whole by one replica instead. On 8 CPU devices
# this halved the first save of a tiny model (~10 s of slicing compilations); a BERT-large
# [1024, 4096] matrix over 8 replicas (2 MiB each) is still written in parallel.
# The rest as orbax registers it (its per-host array metadata store included).
_MIN_REPLICA_SLICE_BYTES = 1 << 20


@contextlib.contextmanager
def _orbax_quiet():
  """Errors only from absl logging inside: orbax warns that a read-only manager is read-only and
  that our array handler overrides its own."""
  verbosity = logging.get_verbosity()
  logging.set_verbosity(logging.ERROR)
  try:
    yield
  finally:
    logging.set_verbosity(verbosity)


def _register_array_handler() -> None:
  with _orbax_quiet():
    ocp.type_handlers.register_type_handler(jax.Array, ocp.type_handlers.ArrayHandler(
        min_slice_bytes_for_replica_parallel=_MIN_REPLICA_SLICE_BYTES,
        array_metadata_store=getattr(ocp.type_handlers.get_type_handler(jax.Array),
                                     "_array_metadata_store", None)), override=True)


_register_array_handler()


class _NoSpaceFilter(std_logging.Filter):
  """Drops the traceback orbax's writer thread logs for a full disk: `Checkpointer` reports it
  as one line (`errors.no_space_error`)."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    return not (record.exc_info and errors.no_space(record.exc_info[1]) is not None)


logging.get_absl_handler().addFilter(_NoSpaceFilter())


def _without_closed_loop_errors(unraisablehook):
  """`unraisablehook` except for "Event loop is closed": when one write of a checkpoint fails (a
  full disk), orbax closes its event loop while TensorStore still completes the others, and each
  completion's callback reports that error as unraisable, with a traceback. The failure itself is
  raised (and reported once) by the save."""
  def hook(unraisable):
    if not (unraisable.exc_type is RuntimeError
            and str(unraisable.exc_value) == "Event loop is closed"):
      unraisablehook(unraisable)
  return hook


def _without_abandoned_reads(unraisablehook):
  """`unraisablehook` except for orbax's abandoned array reads: when one array of a corrupt
  checkpoint fails to read, orbax raises that failure while the reads of other arrays are still
  pending; those fail the same way later and, collected as coroutines, would each be reported as
  unraisable with a traceback. The failure itself is reported once, as a ConfigError."""
  def hook(unraisable):
    code = getattr(unraisable.object, "cr_code", None)
    if code is None or not _in_orbax(code.co_filename):
      unraisablehook(unraisable)
  return hook


class _AbandonedTaskFilter(std_logging.Filter):
  """Drops asyncio's "<Task | Future | _GatheringFuture> exception was never retrieved" for
  orbax's own reads: the other face of `_without_abandoned_reads`, when an abandoned read is a
  Task or a gathering future that the event loop's exception handler logs (with a traceback) as
  it is collected, instead of a bare coroutine."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    message = record.getMessage()
    if not message.split("\n", 1)[0].endswith("exception was never retrieved"):
      return True
    error = record.exc_info[1] if record.exc_info else None
    return not (_in_orbax(message) or _raised_in_orbax(error))


def _in_orbax(text: str) -> bool:
  return f"{os.sep}orbax{os.sep}" in text


def _raised_in_orbax(error: BaseException | None) -> bool:
  """Whether `error`, or an exception it was raised from (`raise ... from`), passed through
  orbax's code: a gathering future's log message names no file; its exception's traceback does.
  An exception merely raised while handling one of orbax's (`__context__`) is not orbax's."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if any(_in_orbax(frame.f_code.co_filename)
           for frame, _ in traceback.walk_tb(error.__traceback__)):
      return True
    error = error.__cause__
  return False


_ABANDONED_TASKS = _AbandonedTaskFilter()


@contextlib.contextmanager
def _one_report_per_failed_read():
  """Runs a restore under `_without_abandoned_reads` and `_without_closed_loop_errors` (the
  unraisable hook) and `_ABANDONED_TASKS` (asyncio's logger). If the restore fails, the filters
  stay for the rest of the process: the reads it abandoned fail and are collected at any later
  point, up to interpreter exit, and TensorStore completes some after orbax closed its event
  loop. The failure itself is raised once, as a ConfigError."""
  hook = sys.unraisablehook
  if not getattr(hook, "quiets_failed_reads", False):
    sys.unraisablehook = _without_closed_loop_errors(_without_abandoned_reads(hook))
    sys.unraisablehook.quiets_failed_reads = True
  asyncio_logger = std_logging.getLogger("asyncio")
  filtered = _ABANDONED_TASKS in asyncio_logger.filters
  asyncio_logger.addFilter(_ABANDONED_TASKS)
  yield
  sys.unraisablehook = hook  # not reached when the restore raised
  if not filtered:
    asyncio_logger.removeFilter(_ABANDONED_TASKS)


class Checkpointer:
  """Async orbax CheckpointManager holding the train state and every process's data position."""

  def __init__(self, directory: str, keep: int, *, read_only: bool = False):
    """`read_only` opens another run's checkpoints (init_from) without creating or deleting."""
    self.directory = fileio.absolute(directory)
    self._pending = None   # (step, bytes) of the last checkpoint handed to orbax
    options = ocp.CheckpointManagerOptions(
        max_to_keep=None if read_only else keep, save_interval_steps=0 if read_only else 1,
        enable_async_checkpointing=True, create=not read_only, read_only=read_only)
    with _orbax_quiet() if read_only else contextlib.nullcontext():
      self.manager = ocp.CheckpointManager(self.directory, options=options,
                                           item_names=("state", "data"))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state, data_state: dict[str, int]) -> None:
    """Saves asynchronously; `data_state` is this process's pipeline position (ints only)."""
    keys = sorted(data_state)
    local = np.asarray([data_state[k] for k in keys], np.int64)
    per_process = np.asarray(multihost_utils.process_allgather(local)).reshape(
        jax.process_count(), len(keys))
    data = {"keys": keys, "processes": per_process.tolist()}
    tree = _on_disk(state)
    self._pending = (step, sum(x.nbytes for x in jax.tree.leaves(tree)))
    with self._no_space_named():
      self.manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(tree), data=ocp.args.JsonSave(data)), force=True)
      if jax.default_backend() == "cpu":
        # On CPU the host copy orbax takes before returning can alias the device buffers, which
        # the next (donating) train step overwrites: finish writing first. On GPU/TPU the copy is
        # real and the save stays asynchronous.
        self.manager.wait_until_finished()

  @contextlib.contextmanager
  def _no_space_named(self):
    """A full disk while a checkpoint is written (or finished, asynchronously) becomes one line
    naming the checkpoint and its size (`errors.no_space_error`); the complete checkpoints
    before it are untouched (orbax renames a checkpoint into place only once it is whole).
    After such a failure the closed-loop filter stays for the rest of the process: TensorStore
    completes the other writes after the save raised, up to the process's exit (a run under
    load printed their tracebacks before its one line)."""
    unraisablehook = sys.unraisablehook
    sys.unraisablehook = _without_closed_loop_errors(unraisablehook)
    failed = False
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except  (orbax/tensorstore wrap the OSError)
      if errors.no_space(e) is None or self._pending is None:
        raise
      failed = True
      step, size = self._pending
      raise errors.no_space_error(e, self.directory, f"checkpoint {step} ({size / 2**20:,.1f} "
                                  f"MiB) in {self.directory}") from e
    finally:
      if not failed:
        sys.unraisablehook = unraisablehook

  def restore(self, step: int, abstract_state):
    """Restores onto the shardings in `abstract_state` (any mesh). Returns (state, data_state or
    None when the checkpoint was written by a different number of processes)."""
    state, data_states = self.restore_every_process(step, abstract_state)
    if len(data_states) != jax.process_count():
      return state, None
    return state, data_states[jax.process_index()]

  def restore_every_process(self, step: int, abstract_state):
    """Restores onto the shardings in `abstract_state` (any mesh). Returns (state, the
    data_state of every process that wrote the checkpoint, in process order).

    A checkpoint without the carry the state has (an imported model: `python -m bertfam_jax.hf
    import` of XLNet writes no memory) restores with the carry at zeros, a fresh stream's."""
    try:
      restored = self._restore(step, abstract_state)
    except Exception as e:  # pylint: disable=broad-except  (orbax/tensorstore raise bare Exception)
      if not isinstance(abstract_state, step_lib.TrainState) or abstract_state.carry is None:
        raise self._unrestorable(step, e) from e
      try:
        restored = self._restore(step, abstract_state.replace(carry=None))
      except Exception:  # pylint: disable=broad-except
        raise self._unrestorable(step, e) from e
      restored["state"]["carry"] = jax.tree.map(
          lambda x: jnp.zeros(x.shape, x.dtype, device=x.sharding), abstract_state.carry)
    data = restored["data"]
    state = restored["state"]
    if isinstance(abstract_state, step_lib.TrainState):
      carry = abstract_state.carry
      if carry is not None:  # the tree (tuple of per-layer arrays) the train step was traced with
        carry = jax.tree.unflatten(jax.tree.structure(carry), jax.tree.leaves(state["carry"]))
      state = step_lib.TrainState(step=state["step"], params=state["params"],
                                  opt_state=state["opt_state"], carry=carry)
    return state, [dict(zip(data["keys"], row)) for row in data["processes"]]

  def _restore(self, step: int, abstract_state) -> dict:
    with _one_report_per_failed_read():
      return self.manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(_on_disk(abstract_state)), data=ocp.args.JsonRestore()))

  def _unrestorable(self, step: int, error: Exception) -> ConfigError:
    detail = " ".join(str(error).split())[:300]
    return ConfigError(
        f"Checkpoint {self.directory}/{step} cannot be restored: it is corrupt or does not match "
        f"this model ({type(error).__name__}: {detail}). It is left untouched; move it aside to "
        f"resume from an earlier step, or use a new --workdir.")

  def close(self) -> None:
    with self._no_space_named():
      self.manager.wait_until_finished()
    self.manager.close()


def _on_disk(state):
  """A `TrainState` as the tree its checkpoints hold: {step, params, opt_state}, plus `carry` only
  for objectives that keep one (XLNet's memory), so checkpoints written before the carry existed
  restore unchanged."""
  if not isinstance(state, step_lib.TrainState):
    return state
  tree = dict(step=state.step, params=state.params, opt_state=state.opt_state)
  if state.carry is not None:
    tree["carry"] = state.carry
  return tree


def _params_reader(directory: str) -> ocp.CheckpointManager:
  """A read-only manager of `directory` that knows the items' handlers, so that it can read a
  checkpoint's metadata and restore part of its state (`read_params`)."""
  with _orbax_quiet():
    return ocp.CheckpointManager(
        fileio.absolute(directory),
        options=ocp.CheckpointManagerOptions(read_only=True, create=False),
        item_handlers=dict(state=ocp.PyTreeCheckpointHandler(), data=ocp.JsonCheckpointHandler()))


def read_latest_step(directory: str) -> int | None:
  """The latest complete checkpoint step in `directory`, or None; creates nothing."""
  manager = _params_reader(directory)
  try:
    return manager.latest_step()
  finally:
    manager.close()


def read_params(directory: str, step: int, collection: str = "params"):
  """The parameters of checkpoint `step` in `directory` as host numpy arrays (the variable
  `collection`: 'params', or DistilBERT's 'teacher'), restored against the checkpoint's own
  metadata (as MaxText's load_params_from_path): no model, no optimizer, and neither the
  optimizer state nor the data position is read. A corrupt or incomplete checkpoint is a
  ConfigError naming it."""
  manager = _params_reader(directory)
  try:
    stored = manager.item_metadata(step)["state"]
    # Every process reads the whole tree onto a device of its own (the first global device
    # belongs to process 0 alone).
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                            dict(params={collection: stored["params"][collection]}))
    with _one_report_per_failed_read():
      restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
          item=abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
          partial_restore=True)))
  except Exception as e:  # pylint: disable=broad-except  (orbax/tensorstore raise bare Exception)
    detail = " ".join(str(e).split())[:300]
    raise ConfigError(f"Checkpoint {directory}/{step} cannot be read: it is corrupt or incomplete "
                      f"({type(e).__name__}: {detail}). It is left untouched; move it aside to "
                      f"read an earlier step.") from e
  finally:
    manager.close()
  return jax.tree.map(np.asarray, restored["state"]["params"][collection])
