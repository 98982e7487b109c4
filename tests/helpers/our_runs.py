"""A workdir as one of our pre-training runs leaves it, written without training, for the export
tests (tests/hf/hf_t5_test.py, hf_xlnet_test.py)."""

import os

import flax.linen as nn
import jax

from bertfam_jax import objectives
from bertfam_jax import workdir as run_reader
from bertfam_jax.hf import workdir as workdir_lib


def write_run(config, workdir: str) -> dict:
  """Validates `config`, writes `workdir`'s config.json and a step-0 checkpoint of a model
  initialised from key 1; returns its parameters (host arrays)."""
  objectives.validate(config)
  os.makedirs(workdir)
  run_reader.check_or_write_config(workdir, config)
  objective = objectives.get(config.objective.name)
  model = objective.build_model(config)
  params = jax.jit(lambda: nn.meta.unbox(model.init(
      jax.random.key(1), **objectives.init_inputs(objective, config),
      deterministic=True)))()["params"]
  workdir_lib.save_initial_checkpoint(config, params, os.path.join(workdir, "checkpoints"))
  return jax.device_get(params)
