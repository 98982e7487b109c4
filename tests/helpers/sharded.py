"""Host batches of an objective's pipeline, and train steps of it on a mesh, for the
sharded-equals-single-device tests."""

import jax
import numpy as np

from bertfam_jax import objectives
from bertfam_jax.data import pipeline as pipeline_lib
from bertfam_jax.data import sources, tokenizers
from bertfam_jax.train import sharding, step as step_lib


def host_batches(config, objective, count: int, batch_size: int, tokenizer=None) -> list[dict]:
  """The first `count` host batches of `objective`'s pipeline over `config.data`'s training
  documents (`tokenizer` trained or loaded from the config when not given)."""
  docs = sources.get_documents(config.data, "train")
  if tokenizer is None:
    tokenizer = tokenizers.load_or_train(config, docs)
  pipe = pipeline_lib.Pipeline(config, tokenizer, docs, objective.make_features(config, tokenizer),
                               0, 1, batch_size, **objectives.pipeline_options(objective, config))
  try:
    return [next(pipe) for _ in range(count)]
  finally:
    pipe.close()


def run_steps(config, objective, batches, devices):
  """One fresh train step per host batch on `config.mesh` over `devices`: (the losses, the
  final train state on the host)."""
  mesh = sharding.make_mesh(config.mesh, devices)
  state, train_step = step_lib.fresh_train_step(config, mesh, objective)
  losses = []
  for batch in batches:
    state, metrics = train_step(state, {k: jax.device_put(v, sharding.batch_sharding(mesh))
                                        for k, v in batch.items()})
    losses.append(step_lib.finalize_metrics(jax.device_get(metrics))["loss"])
  return losses, jax.device_get(state)


def assert_sharded_equals_single(config, objective, batches, compared=lambda state: state.params):
  """`batches`' steps on a 2 x 2 x 2 mesh over the 8 host devices equal those on one device:
  the losses (rtol 2e-5) and `compared(state)` (the parameters unless told; rtol 1e-4, atol
  2e-5, the reduction order's difference). Returns the sharded run's final state for the
  caller's own checks; `config.mesh` is left at one device."""
  config.mesh.update(data=2, fsdp=2, tensor=2)
  losses, state = run_steps(config, objective, batches, jax.devices())
  config.mesh.update(data=1, fsdp=1, tensor=1)
  ref_losses, ref_state = run_steps(config, objective, batches, jax.devices()[:1])
  np.testing.assert_allclose(losses, ref_losses, rtol=2e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5),
               compared(state), compared(ref_state))
  return state
