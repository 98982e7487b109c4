"""Train steps of one objective on a mesh, for the sharded-equals-single-device tests."""

import jax

from bertfam_jax.train import sharding, step as step_lib


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
