"""Orbax checkpoints under WORKDIR/checkpoints, the run's config.json, and the checks that refuse a
workdir whose checkpoints belong to a different model."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import ml_collections
from absl import logging
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from bertfam_jax import config_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.train import step as step_lib

# Sections whose change makes an existing checkpoint meaningless (a different network, vocabulary
# or objective). Optimizer, schedule, batch and step counts may change between resumptions.
_IDENTITY_SECTIONS = ("model", "objective", "tokenizer")


# Replica-parallel saving (orbax's default off GPU) splits every replicated array between its
# replicas, one on-device slice each: for biases and LayerNorm scales that is a dispatch (and, the
# first time for each shape, a compilation) per replica to write a few KiB. Arrays whose share
# per replica would be under 1 MiB are written whole by one replica instead. On 8 CPU devices
# this halved the first save of a tiny model (~10 s of slicing compilations); a BERT-large
# [1024, 4096] matrix over 8 replicas (2 MiB each) is still written in parallel.
# The rest as orbax registers it (its per-host array metadata store included).
_MIN_REPLICA_SLICE_BYTES = 1 << 20


def _register_array_handler() -> None:
  verbosity = logging.get_verbosity()
  logging.set_verbosity(logging.ERROR)  # orbax warns that the registration overrides its own
  try:
    ocp.type_handlers.register_type_handler(jax.Array, ocp.type_handlers.ArrayHandler(
        min_slice_bytes_for_replica_parallel=_MIN_REPLICA_SLICE_BYTES,
        array_metadata_store=getattr(ocp.type_handlers.get_type_handler(jax.Array),
                                     "_array_metadata_store", None)), override=True)
  finally:
    logging.set_verbosity(verbosity)


_register_array_handler()


def _identity(config_dict: dict) -> dict:
  return {k: config_dict.get(k) for k in _IDENTITY_SECTIONS}


def check_or_write_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Writes WORKDIR/config.json on the first start; afterwards refuses a config whose model,
  objective or tokenizer differs from the one the workdir was started with."""
  path = os.path.join(workdir, "config.json")
  current = json.loads(config.to_json())
  if os.path.exists(path):
    with open(path) as f:
      saved = json.load(f)
    defaults = _identity(json.loads(config_lib.base_config().to_json()))
    diffs = _diff(_identity(saved), _identity(current), defaults)
    if diffs:
      raise ConfigError(
          f"{workdir} holds a run with a different model/objective/tokenizer ({'; '.join(diffs[:5])})"
          f". Use a new --workdir, or pass the original settings to resume it.")
    return
  if jax.process_index() == 0:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
      f.write(config.to_json(indent=2))
    os.replace(tmp, path)


def _diff(saved, current, defaults, prefix="") -> list[str]:
  """'key: saved → current' for every differing field. A field the saved config lacks was added
  to the codebase after the run started (e.g. ALBERT's `model.share_layers`); it matches while it
  holds its default (`defaults`, from `config_lib.base_config()`), the behaviour the run had."""
  if isinstance(saved, dict) and isinstance(current, dict):
    defaults = defaults if isinstance(defaults, dict) else {}
    out = []
    for key in sorted(set(saved) | set(current)):
      if key not in saved and key in defaults and current.get(key) == defaults[key]:
        continue
      out += _diff(saved.get(key), current.get(key), defaults.get(key), f"{prefix}{key}.")
    return out
  return [] if saved == current else [f"{prefix[:-1]}: {saved!r} → {current!r}"]


class Checkpointer:
  """Async orbax CheckpointManager holding the train state and every process's data position."""

  def __init__(self, directory: str, keep: int, *, read_only: bool = False):
    """`read_only` opens another run's checkpoints (init_from) without creating or deleting."""
    self.directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(
        max_to_keep=None if read_only else keep, save_interval_steps=0 if read_only else 1,
        enable_async_checkpointing=True, create=not read_only, read_only=read_only)
    verbosity = logging.get_verbosity()
    if read_only:  # orbax warns that a read-only manager is read-only
      logging.set_verbosity(logging.ERROR)
    try:
      self.manager = ocp.CheckpointManager(self.directory, options=options,
                                           item_names=("state", "data"))
    finally:
      logging.set_verbosity(verbosity)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state, data_state: dict[str, int]) -> None:
    """Saves asynchronously; `data_state` is this process's pipeline position (ints only)."""
    keys = sorted(data_state)
    local = np.asarray([data_state[k] for k in keys], np.int64)
    per_process = np.asarray(multihost_utils.process_allgather(local)).reshape(
        jax.process_count(), len(keys))
    data = {"keys": keys, "processes": per_process.tolist()}
    self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(_on_disk(state)),
                                                    data=ocp.args.JsonSave(data)), force=True)
    if jax.default_backend() == "cpu":
      # On CPU the host copy orbax takes before returning can alias the device buffers, which the
      # next (donating) train step overwrites: finish writing first. On GPU/TPU the copy is real
      # and the save stays asynchronous.
      self.manager.wait_until_finished()

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
    return self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(_on_disk(abstract_state)), data=ocp.args.JsonRestore()))

  def _unrestorable(self, step: int, error: Exception) -> ConfigError:
    detail = " ".join(str(error).split())[:300]
    return ConfigError(
        f"Checkpoint {self.directory}/{step} cannot be restored: it is corrupt or does not match "
        f"this model ({type(error).__name__}: {detail}). It is left untouched; move it aside to "
        f"resume from an earlier step, or use a new --workdir.")

  def close(self) -> None:
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
