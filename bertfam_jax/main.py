"""The one entry point: `python -m bertfam_jax.main --config=configs/roberta.py:runlocal --workdir=DIR`
pre-trains; `--config=configs/finetune.py:task=NAME,init=PATH` (a config with a `finetune`
section) fine-tunes and evaluates.

Multi-host: `jax.distributed` is initialised when the environment is a multi-process job (srun
with SLURM_NTASKS > 1, a multi-host Cloud TPU / GKE slice, a multislice job) or when
--coordinator_address, --num_processes and --process_id are given (`train/distributed.py`).
"""

import os
import sys
import traceback

from absl import app, flags, logging
from ml_collections import config_flags

from bertfam_jax import errors, fileio
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.train import distributed

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, e.g. configs/roberta.py:runlocal. Fields can be overridden with "
    "--config.<section>.<key>=value.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints, metrics and config.json go; "
                               "re-running with the same workdir resumes.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes (hosts).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index.")
_DISTRIBUTED = flags.DEFINE_enum(
    "distributed", "auto", ["auto", "on", "off"],
    "auto: initialise jax.distributed when the flags above or a multi-process SLURM/TPU "
    "environment ask for it; on: always (JAX detects the rest, e.g. from Cloud TPU metadata); "
    "off: never.")
flags.mark_flags_as_required(["config", "workdir"])

def _maybe_initialize_distributed():
  import jax  # pylint: disable=g-import-not-at-top
  kwargs = distributed.init_kwargs(_DISTRIBUTED.value, _COORDINATOR.value, _NUM_PROCESSES.value,
                                   _PROCESS_ID.value, os.environ)
  if kwargs is None:
    return
  jax.distributed.initialize(**kwargs)
  logging.info("jax.distributed: process %d of %d", jax.process_index(), jax.process_count())


def _parse_flags(argv):
  """absl's parser, with every user error in the command line turned into one line and exit 2
  (absl would print them as tracebacks): an unknown config field (ml_collections raises
  AttributeError/KeyError), a value of the wrong type or a missing --workdir (flags.Error), a
  config argument its file refuses (ConfigError)."""
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError) as e:
    field = str(e).strip("\"'")
    given = [a.split("=")[0] for a in argv if a.startswith("--config.") and field in a]
    _usage_error(f"unknown config field {field!r} ({', '.join(given) or 'in the overrides'}); the "
                 f"config file lists the fields it has, and unknown keys are rejected so that "
                 f"typos never pass silently.")
  except flags.Error as e:
    message = str(e)
    if "Traceback" in message:  # the config file raised: its exception's own line says why
      flag = message.split(": Error whilst parsing")[0]
      cause = message.strip().splitlines()[-1].rpartition("Error: ")[2]
      _usage_error(f"{flag}: {cause}")
    _usage_error(" ".join(message.split()) + " (see --helpfull)")
  except ConfigError as e:
    _usage_error(f"--config: {e}")


def _load_config(argv):
  """The --config file's config. ml_collections reads the file when the config is first used,
  and reports a missing or broken file there, as an OSError whose message holds a traceback."""
  try:
    config = _CONFIG.value
    "seed" in config  # pylint: disable=pointless-statement  (the first use reports the error)
    return config
  except OSError as e:
    given = next((a.partition("=")[2] for a in reversed(argv) if a.startswith("--config=")), "")
    path = given.partition(":")[0]
    reason = ("no such file" if path and not fileio.exists(path)
              else " ".join(str(e).split())[:200])
    _usage_error(f"--config={given} could not be loaded ({reason}); pass a config file such as "
                 f"configs/roberta.py:runlocal.")
  except ConfigError as e:
    _usage_error(f"--config: {e}")


def _usage_error(message: str):
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(2)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    # orbax and absl log every checkpoint phase at INFO; the progress lines are printed anyway.
    logging.set_verbosity(logging.WARNING)
  config = _load_config(sys.argv)
  finetuning = "finetune" in config
  if config.finetune.data_dir if finetuning else config.data.source == "tfds":
    # TensorFlow (used only by the optional tf.data reader) must never take the GPUs from JAX.
    try:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      tf.config.set_visible_devices([], "GPU")
    except ImportError:
      pass
  try:
    _maybe_initialize_distributed()   # before anything touches a device
  except ConfigError as e:
    _fail(e)
  # Only the loop that runs is imported (fine-tuning's metrics import scipy.stats: ~1 s).
  # pylint: disable=g-import-not-at-top
  from bertfam_jax.train import loop
  if finetuning:
    from bertfam_jax.finetune.run import run
  else:
    from bertfam_jax.train.train import run
  # pylint: enable=g-import-not-at-top
  try:
    run(config, _WORKDIR.value)
  except (ConfigError, loop.NonFiniteLossError) as e:
    _fail(e)
  except Exception as e:  # pylint: disable=broad-except
    if errors.no_space(e) is not None:   # a full disk, wherever the write was
      _fail(errors.no_space_error(e, _WORKDIR.value, f"a file of --workdir={_WORKDIR.value}"))
    if not _in_distributed_job():
      raise
    traceback.print_exc()
    _exit_now(1)


def _fail(error: Exception):
  """The one line, and exit 2. After a full disk at once: the checkpoint writes still in flight
  would otherwise fail one by one on a closed event loop, each with a traceback, while Python
  shuts down (what is complete on disk stays so; orbax ignores a half-written checkpoint)."""
  print(f"error: {error}", file=sys.stderr, flush=True)
  if _in_distributed_job() or errors.no_space(error) is not None:
    _exit_now(2)
  sys.exit(2)


def _in_distributed_job() -> bool:
  return "jax" in sys.modules and sys.modules["jax"].distributed.is_initialized()


def _exit_now(code: int):
  """Ends a process of a multi-process job that failed, possibly alone (an error on one host):
  Python's own exit would first wait in jax.distributed's shutdown for processes that are
  waiting for this one in a collective, and the job would hang instead of failing. Exiting at
  once lets the coordination service, `srun --kill-on-bad-exit` or the TPU launcher end the
  others."""
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
