"""Pure train and eval steps for any objective, and the sharded initial state."""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any, Callable, NamedTuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from bertfam_jax import objectives
from bertfam_jax.train import optimizer as optimizer_lib
from bertfam_jax.train import sharding as sharding_lib
from bertfam_jax.train import threefry


@flax.struct.dataclass
class TrainState:
  step: jax.Array      # int32 scalar: the number of updates applied
  params: Any
  opt_state: Any
  # Recurrent state an objective threads from one step to the next (XLNet's memory: per layer
  # [batch, mem_len, hidden]); None for every other objective.
  carry: Any = None


# The variable collection that trains. Any other collection in a state's `params` (DistilBERT's
# 'teacher', models/pretraining.Distiller) is a constant of the run: the loss reads it, the
# checkpoints hold it, but it is neither differentiated nor updated and has no optimizer state.
TRAINED = "params"


def trained(variables):
  """The collections of `variables` that train: {TRAINED: ...} (the whole tree for every model
  that keeps only parameters)."""
  return {k: v for k, v in variables.items() if k == TRAINED}


def param_axes(model, inputs):
  """The logical axis names of `model`'s parameters, a tree like its variables with a tuple of
  names per parameter (None where it has none; a scanned stack's first name is 'layers'), from
  an abstract init: what Adafactor factors by (`optimizer.make_optimizer`)."""
  def init():   # the key made inside: nothing concrete, so it also runs for devices not here
    rng = jax.random.key(0)
    return model.init({"params": rng, "dropout": rng}, **inputs, deterministic=True)

  boxed = trained(jax.eval_shape(init))
  is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)  # noqa: E731
  return jax.tree.map(lambda x: tuple(x.names) if is_box(x) else None, boxed, is_leaf=is_box)


def make_optimizer(config, model, inputs):
  """`optimizer.make_optimizer` for `model`, with its parameters' axis names where the optimizer
  factors by them (Adafactor)."""
  axes = param_axes(model, inputs) if config.optimizer.name == "adafactor" else None
  return optimizer_lib.make_optimizer(config, axes)


def abstract_state(model, tx, mesh, inputs, carry=None):
  """Shapes and NamedShardings of the train state, computed without allocating anything.
  `inputs`: the keyword inputs that trace `model.init` (`objectives.init_inputs`);
  `carry`: the objective's abstract carry (`objectives.init_carry`), batch-sharded, or None."""
  def init():   # the key made inside: nothing concrete, so it also runs for devices not here
    rng = jax.random.key(0)
    return model.init({"params": rng, "dropout": rng}, **inputs, deterministic=True)

  boxed = jax.eval_shape(init)
  param_sh = sharding_lib.logical_to_shardings(boxed, mesh)
  is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)  # noqa: E731  (Q8BERT's ranges are not)
  params = jax.tree.map(lambda x: x.unbox(apply_constraint=False) if is_box(x) else x, boxed,
                        is_leaf=is_box)
  opt_state = jax.eval_shape(tx.init, trained(params))
  replicated = NamedSharding(mesh, P())
  batch_sh = sharding_lib.batch_sharding(mesh)
  shardings = TrainState(step=replicated, params=param_sh,
                         opt_state=sharding_lib.opt_state_shardings(opt_state, trained(param_sh),
                                                                    mesh),
                         carry=jax.tree.map(lambda _: batch_sh, carry))
  shapes = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=params, opt_state=opt_state,
                      carry=carry)
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                      shapes, shardings), shardings


def init_state(model, tx, shardings, seed: int, inputs, carry=None, *,
               on_host: bool | None = None) -> TrainState:
  """Initialises parameters into their shardings; `inputs` and `carry` as for `abstract_state`
  (the carry starts at zeros).

  `on_host` (None: on a GPU whose process has a CPU backend too) draws the parameters on the
  host's CPU, then places them and builds the optimizer state on the devices; else one jitted
  function draws them directly into their shardings (never materialised whole on one device).
  On an H100 that function took 62 s to compile for BERT-base (a kernel per parameter's random
  draw; 0.01 s to run), the host draw 4.5 s (benchmarks/init_time.py, docs/results.md). The
  random bits do not depend on where or how they are drawn, so on a CPU the two are equal bit
  for bit (tested); on a GPU the normal draws' float transforms (erf_inv) may differ from the
  CPU's in the last bits. A draw on a CPU takes its bits from threefry unrolled
  (`threefry.unroll_on_cpu`)."""
  threefry.unroll_on_cpu()
  if on_host is None:
    on_host = jax.default_backend() == "gpu" and _host_cpu() is not None
  zeros_carry = lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), carry)  # noqa: E731

  def init_params():
    rng = jax.random.key(seed)
    return nn.meta.unbox(model.init({"params": rng, "dropout": rng}, **inputs,
                                    deterministic=True))

  if not on_host:
    def init():
      params = init_params()
      return TrainState(step=jnp.zeros([], jnp.int32), params=params,
                        opt_state=tx.init(trained(params)), carry=zeros_carry())
    return jax.jit(init, out_shardings=shardings)()

  host_params = _draw_on_host(init_params, jax.tree.leaves(shardings.params)[0].mesh)
  return state_of(_placed(host_params, shardings.params), tx, shardings, carry)


def state_of(params, tx, shardings, carry=None) -> TrainState:
  """The step-0 state of placed `params` (in `shardings.params`; donated): the optimizer state
  built from them, the carry (abstract, as `init_state`'s) at zeros."""
  def complete(params):
    return TrainState(step=jnp.zeros([], jnp.int32), params=params,
                      opt_state=tx.init(trained(params)),
                      carry=jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), carry))

  return jax.jit(complete, out_shardings=shardings, donate_argnums=0)(params)


def place(host_tree, abstract):
  """Host numpy arrays → arrays in the shardings of `abstract` (a tree of ShapeDtypeStructs of
  the same structure); each process places only what its devices hold. A tree of another
  structure, shape or dtype is a ValueError naming the first difference (our bug, not the
  user's: the objective built both)."""
  flat, treedef = jax.tree_util.tree_flatten_with_path(host_tree)
  if treedef != jax.tree.structure(abstract):
    raise ValueError(f"initial parameters of structure {treedef} for a state of structure "
                     f"{jax.tree.structure(abstract)}")
  for (path, x), a in zip(flat, jax.tree.leaves(abstract)):
    if x.shape != a.shape or x.dtype != a.dtype:
      raise ValueError(f"{jax.tree_util.keystr(path)}: {x.shape} {x.dtype}, the state has "
                       f"{a.shape} {a.dtype}")
  return _placed(host_tree, jax.tree.map(lambda a: a.sharding, abstract))


def _placed(host_tree, shardings):
  """Host numpy arrays → global arrays in `shardings` (a tree of the same structure); each
  process places only what its devices hold."""
  return jax.tree.map(
      lambda x, sh: jax.make_array_from_callback(x.shape, sh, lambda index: x[index]),
      host_tree, shardings)


def _host_cpu():
  """This host's first CPU device, or None where the process has no CPU backend
  (JAX_PLATFORMS=cuda)."""
  try:
    return jax.local_devices(backend="cpu")[0]
  except RuntimeError:
    return None


def _draw_on_host(init_params, mesh):
  """Runs `init_params` jitted on this host's first CPU device (its logical sharding constraints
  resolved on a one-CPU mesh with `mesh`'s axis names) → a tree of numpy arrays."""
  cpu = _host_cpu()
  host_mesh = jax.sharding.Mesh(np.array([cpu]).reshape((1,) * len(mesh.axis_names)),
                                mesh.axis_names)
  with jax.default_device(cpu), jax.set_mesh(host_mesh), nn.logical_axis_rules(
      sharding_lib.LOGICAL_AXIS_RULES):
    return jax.device_get(jax.jit(init_params)())


class TrainParts(NamedTuple):
  """What a run of an objective builds before any state exists (`train_parts`)."""
  model: Any
  tx: Any
  schedule: Any
  inputs: Any       # the keyword inputs that trace `model.init` (`objectives.init_inputs`)
  carry: Any        # the abstract step-to-step state (`objectives.init_carry`), or None
  abstract: Any     # the train state's ShapeDtypeStructs
  shardings: Any    # the train state's NamedShardings


def train_parts(config, mesh, objective) -> TrainParts:
  """The model, optimizer and schedule of `objective` (an objectives/ module) under `config`, the
  inputs that trace its init, its abstract carry, and the train state's shapes and shardings on
  `mesh`; nothing is allocated."""
  model = objective.build_model(config)
  inputs = objectives.init_inputs(objective, config)
  tx, schedule = make_optimizer(config, model, inputs)
  carry = objectives.init_carry(objective, config)
  abstract, shardings = with_mesh_context(abstract_state, mesh)(model, tx, mesh, inputs, carry)
  return TrainParts(model, tx, schedule, inputs, carry, abstract, shardings)


def fresh_train_step(config, mesh, objective, batch_shapes=None):
  """A fresh sharded `TrainState` (seed `config.seed`) and the jitted train step of `objective`
  (an objectives/ module) on `mesh`: what benchmarks and tests run without data or checkpoints.
  With `batch_shapes` (the batch's ShapeDtypeStructs) the step is compiled for them while the
  state is built (`compile_ahead`). Returns (state, train_step)."""
  p = train_parts(config, mesh, objective)
  train_step = make_train_step(p.model, p.tx, p.schedule, objective.loss_fn, config,
                               p.shardings, mesh)
  compiling = (compile_ahead(train_step, p.abstract, batch_shapes, mesh)
               if batch_shapes is not None else None)
  state = with_mesh_context(init_state, mesh)(p.model, p.tx, p.shardings, config.seed, p.inputs,
                                              p.carry)
  if compiling is not None:
    compiling.result()
  return state, train_step


def make_train_step(model, tx, schedule, loss_fn: Callable, config, state_shardings, mesh,
                    mutable: tuple[str, ...] = ()):
  """Returns jitted `step(state, batch) -> (state, metrics)`; metrics are {name: (sum, count)}
  plus scalars learning_rate and grad_norm (as (value, 1)); the loop adds `param_norm` at the
  steps it logs (a pass over every parameter: on an H200 the per-leaf reductions of the two
  norms took 4.8% of a BERT-base step, 7.1% of a BERT-large one, this norm about half of it).

  With `grad_accum_steps = k` the global batch is split into k micro-batches scanned in sequence;
  the update uses the mean of their gradients (each micro-batch loss is already a mean).

  When the state has a carry (`objectives.init_carry`), `loss_fn(..., carry=state.carry)` returns
  `(loss, metrics, new_carry)` and the new carry (no gradient flows into it) is the next step's.
  `mutable` names collections of the parameters that the loss updates without gradients (Q8BERT's
  activation ranges, finetune/quantize.py): `loss_fn` then returns `(loss, metrics, {name: new
  value})` and the new values replace the old in the next state.

  Dropout keys are `fold_in(key(config.seed + 1), step)`. The seed is an argument of the compiled
  program, not a constant in it: `step.with_seed(s)` runs the same executable for another seed
  (an experiment's sweep compiles each shape once). On the CPU the random bits come from
  threefry unrolled (`threefry.unroll_on_cpu`: the same bits, fused; installed for the whole
  process, so CPU programs compiled after this call draw theirs that way too).
  """
  threefry.unroll_on_cpu()
  accum = config.train.grad_accum_steps
  carrying = state_shardings.carry is not None
  if (carrying or mutable) and accum > 1:
    raise ValueError("A loss that carries state between steps (XLNet's memory, Q8BERT's "
                     "ranges) cannot split a batch into micro-batches: set "
                     "--config.train.grad_accum_steps=1.")
  if carrying and mutable:
    raise ValueError("make_train_step takes a carry or mutable collections, not both.")

  def micro_grads(params, batch, rng, carry=None):
    """Gradients with respect to the TRAINED collection; the others enter as constants."""
    def loss_and_aux(trained_params):
      p = {**params, **trained_params}
      if mutable:
        loss, metrics, updated = loss_fn(model, p, batch, rng, config)
        return loss, (metrics, {k: updated[k] for k in mutable})
      if not carrying:
        loss, metrics = loss_fn(model, p, batch, rng, config)
        return loss, (metrics, None)
      loss, metrics, new_carry = loss_fn(model, p, batch, rng, config, carry=carry)
      return loss, (metrics, new_carry)

    (loss, (metrics, new_carry)), grads = jax.value_and_grad(loss_and_aux, has_aux=True)(
        trained(params))
    return grads, dict(metrics, loss=(loss, jnp.ones([], jnp.float32))), new_carry

  def step(state, batch, base_rng):
    rng = jax.random.fold_in(base_rng, state.step)
    carry = state.carry
    updated = {}
    if accum == 1:
      grads, metrics, carry = micro_grads(state.params, batch, rng, carry)
      if mutable:
        carry, updated = state.carry, jax.lax.stop_gradient(carry)
    else:
      # Strided micro-batches (rows i, i+k, i+2k, ...) keep every device's rows on that device;
      # contiguous slices of a batch-sharded array would reshuffle data between devices.
      micro = jax.tree.map(
          lambda x: x.reshape((x.shape[0] // accum, accum) + x.shape[1:]).swapaxes(0, 1), batch)

      def body(total, inputs):
        index, mb = inputs
        grads, metrics, _ = micro_grads(state.params, mb, jax.random.fold_in(rng, index))
        return jax.tree.map(jnp.add, total, (grads, metrics)), None

      zero = jax.tree.map(jnp.zeros_like, jax.eval_shape(
          lambda *a: micro_grads(*a)[:2], state.params, jax.tree.map(lambda x: x[0], micro), rng))
      (grads, metrics), _ = jax.lax.scan(body, zero, (jnp.arange(accum), micro))
      grads = jax.tree.map(lambda g: g / accum, grads)
    updates, opt_state = tx.update(grads, state.opt_state, trained(state.params))
    params = {**state.params, **updated,
              **optax.apply_updates(trained(state.params), updates)}
    one = jnp.ones([], jnp.float32)
    metrics = dict(metrics,
                   learning_rate=(schedule(state.step), one),
                   grad_norm=(optax.tree.norm(grads), one))
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state,
                      carry=carry), metrics

  batch_sh = sharding_lib.batch_sharding(mesh)
  replicated = NamedSharding(mesh, P())
  jitted = with_mesh_context(jax.jit(step, in_shardings=(state_shardings, batch_sh, replicated),
                                     out_shardings=(state_shardings, replicated),
                                     donate_argnums=(0,),
                                     compiler_options=compiler_options(config, mesh)), mesh)
  return SeededStep(jitted, config.seed, config.train.get("rng_impl", "threefry"))


class SeededStep:
  """`step(state, batch) -> (state, metrics)`: a jitted `fn(state, batch, key)` with the key of
  `seed` bound (`make_train_step`); `lower(state, batch)` lowers it ahead of time.

  `impl` (`train.rng_impl`, config_lib.RNG_IMPLS) is the generator of the step's random bits:
  JAX's threefry2x32 (the default: ~20 rounds of 32-bit work per word drawn), or XLA's
  RngBitGenerator ('rbg': Philox where the backend has it, the bits still a pure function of
  the key; 'unsafe_rbg': also its fold_in and split without threefry's mixing). Dropout masks
  and ELECTRA's sampling keep their distribution; the streams, hence the runs, differ by
  generator."""

  def __init__(self, jitted, seed: int, impl: str = "threefry"):
    self.jitted, self.seed, self.impl = jitted, seed, impl
    self.key = jax.random.key(seed + 1, impl="threefry2x32" if impl == "threefry" else impl)

  def __call__(self, state, batch):
    return self.jitted(state, batch, self.key)

  def lower(self, state, batch):
    return self.jitted.lower(state, batch, self.key)

  def with_seed(self, seed: int) -> "SeededStep":
    return SeededStep(self.jitted, seed, self.impl)


def compile_ahead(train_step: SeededStep, abstract_state, abstract_batch, mesh
                  ) -> concurrent.futures.Future:
  """Starts compiling `train_step` for the state's and batch's shapes and shardings
  (ShapeDtypeStructs) in a background thread, so that compiling overlaps building the state;
  JAX keeps the executable, and the step's first call with arrays of those shapes and shardings
  runs it without compiling again (tests/train/step_test.py). BERT-large on an H100 spent 10 s
  building its state, then 28 s compiling its step (docs/results.md). Call `.result()` before the
  first step: it raises what compiling raised."""
  future = concurrent.futures.Future()
  compile_ = with_mesh_context(lambda: train_step.lower(abstract_state, abstract_batch).compile(),
                               mesh)

  def run():
    try:
      future.set_result(compile_())
    except BaseException as e:  # pylint: disable=broad-except  (handed to `.result()`)
      future.set_exception(e)

  # Not a daemon: a set-up that fails while it compiles waits for the compile before the process
  # exits (a daemon thread killed inside XLA's C++ at exit aborts the process, 'FATAL: exception
  # not rethrown', instead of the run's one-line error and exit 2).
  threading.Thread(target=run, name="compile_ahead").start()
  return future


def abstract_batch(host_batch: dict[str, np.ndarray], mesh, process_count: int = 1
                   ) -> dict[str, jax.ShapeDtypeStruct]:
  """The global batch's shapes and shardings (`pipeline.make_global_batch`'s) from one process's
  host batch [local_batch, ...]."""
  sharding = sharding_lib.batch_sharding(mesh)
  return {key: jax.ShapeDtypeStruct((value.shape[0] * process_count,) + value.shape[1:],
                                    value.dtype, sharding=sharding)
          for key, value in host_batch.items()}


def make_eval_step(model, loss_fn: Callable, config, state_shardings, mesh):
  """Returns jitted `eval_step(params, batch) -> metrics` (deterministic: no dropout)."""

  def eval_step(params, batch):
    loss, metrics = loss_fn(model, params, batch, jax.random.key(0), config, deterministic=True)
    return dict(metrics, loss=(loss, jnp.ones([], jnp.float32)))

  return with_mesh_context(jax.jit(eval_step, in_shardings=(state_shardings.params,
                                                            sharding_lib.batch_sharding(mesh)),
                                   out_shardings=NamedSharding(mesh, P()),
                                   compiler_options=compiler_options(config, mesh)), mesh)


def compiler_options(config, mesh) -> dict[str, str] | None:
  """XLA options for compiling a step of `config` on `mesh`: on CPU devices, the op kinds
  `train.cpu_ynn_fusion` hands to YNNPACK ("": XLA's default, which hands it some; T5's step
  runs faster with every matmul, elementwise op and reduction there, BERT's slower:
  docs/results.md); none elsewhere, where the option does not exist."""
  fusion = config.train.get("cpu_ynn_fusion", "")
  if not fusion or mesh.devices.flat[0].platform != "cpu":
    return None
  kinds = [] if fusion == "none" else fusion.split(",")
  return {"xla_cpu_experimental_ynn_fusion_type": ",".join(
      f"LIBRARY_FUSION_TYPE_{kind.upper()}" for kind in kinds)}


def with_mesh_context(fn, mesh):
  """Calls `fn` with the mesh and logical-axis rules active, so that the models'
  `nn.with_logical_constraint` annotations resolve when `fn` is traced."""

  def call(*args):
    with jax.set_mesh(mesh), nn.logical_axis_rules(sharding_lib.LOGICAL_AXIS_RULES):
      return fn(*args)

  if hasattr(fn, "lower"):  # a jitted `fn`: keep ahead-of-time lowering (benchmarks/profile_step.py)
    call.lower = with_mesh_context(fn.lower, mesh)
  return call


@jax.jit
def param_norm(params) -> jax.Array:
  """The global L2 norm of a (sharded) parameter tree's TRAINED collection: a replicated float32
  scalar."""
  return optax.tree.norm(trained(params))


@jax.jit
def accumulate_metrics(total, metrics):
  """Adds two {name: (sum, count)} trees of device scalars in one dispatch (leaf by leaf, the
  20 adds of a typical step took 5.1 ms per step on 8 CPU devices; jitted, 0.6 ms)."""
  return jax.tree.map(lambda a, b: a + b, total, metrics)


def finalize_metrics(metrics) -> dict[str, float]:
  """{name: (sum, count)} (host numpy) → {name: sum / count}."""
  return {k: float(s) / max(float(c), 1e-12) for k, (s, c) in metrics.items()}

