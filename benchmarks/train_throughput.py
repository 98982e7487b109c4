r"""Throughput and MFU of the jitted train step on the present devices, per batch size.

For each --batch_sizes entry the real model, optimizer, sharded state and train step of --config are
built on the config's mesh, and one synthetic batch of the objective's shapes (random ids, every
position real, sorted random prediction positions) is made on device, so no data pipeline runs:
this measures the step alone. The time to the first step (the state built while the step compiles,
`step.compile_ahead`, then one step) is timed on its own, --warmup more steps follow untimed, then --steps steps are dispatched back to back and timed to
`block_until_ready`; step time is their mean.

Model FLOPs per token are the objective's `flops_per_token` (for the MLM family
`flops.encoder_train_flops_per_token`; ../shared/PERF.md §3, MaxText's convention: matmul FLOPs of
forward + backward = 3x forward; remat recompute not counted):
  6·L·(4d² + 2df)          weights: 6N per token for the attention and MLP matrices
  + 12·L·S·d               bidirectional attention (QKᵀ and AV, counted in full)
  + 6·E·d                  ALBERT's factorised embedding projection (E = embedding width)
  + 6·(P/S)·(dE + EV)      MLM head (transform + tied decoder) at the P = max_predictions positions
                           it computes, not at every position (StructBERT: 2P slots)
  + 6·(P/S)·((2d+s)d + dE + EV)  SpanBERT's SBO head on the same P slots
  + 6·(d² + dc)/S          pooler and c-way sentence classifier, once per sequence
For T5 (`flops.t5_train_flops_per_input_token`) the encoder, the cross-attention K/V and the
decoder over objective.targets_length tokens (self-attention in full, logits over the vocabulary),
per encoder-input token: tokens/s counts the encoder inputs (batch × data.seq_len), one example
per row with every position real.
Model TFLOP/s = FLOPs/token x tokens/s over all devices; MFU divides by the device count times the
dense bf16 peak of `flops.peak_flops_per_device()` (also for float32 runs; none is known for CPU).
Peak memory is `peak_bytes_in_use` of `device.memory_stats()` (max over local devices; the peak
since the process started, so run batch sizes in increasing order), where the backend reports it.

  python benchmarks/train_throughput.py --config=configs/bert.py:size=base \
      --config.data.seq_len=128 --batch_sizes=32,64 --steps=20
  python benchmarks/train_throughput.py --config=configs/roberta.py:size=large \
      --config.data.seq_len=512 --config.model.dtype=bfloat16 --batch_sizes=16,32 \
      --output=throughput.jsonl
  python benchmarks/train_throughput.py --config=configs/t5.py:size=base \
      --config.model.dtype=bfloat16 --batch_sizes=64,128
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import jax
import jax.numpy as jnp
from absl import app, flags
from ml_collections import config_flags

from bertfam_jax import objectives
from bertfam_jax.config_lib import ConfigError
from bertfam_jax import flops as flops_lib
from bertfam_jax.objectives import t5 as t5_objective
from bertfam_jax.train import sharding as sharding_lib
from bertfam_jax.train import step as step_lib
from bertfam_jax.train import train as train_lib

if __name__ == "__main__":
  # Flags only when run as a script: benchmarks/hf_compare.py imports the functions below and
  # defines its own.
  _CONFIG = config_flags.DEFINE_config_file(
      "config", None, "Config file, e.g. configs/bert.py:size=base; override fields with "
      "--config.<section>.<key>=value (e.g. --config.model.dtype=bfloat16).", lock_config=True)
  _BATCH_SIZES = flags.DEFINE_list("batch_sizes", [], "Global batch sizes to measure, in this "
                                   "order; default: the config's train.batch_size.")
  _STEPS = flags.DEFINE_integer("steps", 20, "Timed steps per batch size.")
  _WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed steps after the first (compiling) step.")
  _OUTPUT = flags.DEFINE_string("output", None, "Optional JSONL file; one object per batch size is "
                                "appended.")
  flags.mark_flag_as_required("config")

COLUMNS = ("device", "config", "batch", "seq", "dtype", "to first step s", "step ms", "tokens/s",
           "model TFLOP/s", "MFU", "peak mem GiB", "MFLOP/token")


@dataclasses.dataclass
class Result:
  """One measured batch size; None where the backend does not say (memory) or it ran out of it."""
  device: str
  config: str
  batch_size: int
  seq_len: int
  dtype: str
  flops_per_token: float
  setup_s: float | None = None  # the state built and the step compiled, side by side; the batch
  first_step_s: float | None = None  # from the start of set-up to the end of the first step
  compiled_step_s: float | None = None  # the first step's call alone (after set-up)
  step_s: float | None = None
  tokens_per_s: float | None = None
  model_tflops_per_s: float | None = None
  mfu: float | None = None
  peak_memory_bytes: int | None = None
  error: str | None = None

  def markdown_row(self) -> str:
    fmt = format_cell
    if self.error:
      mfu = self.error
    elif self.mfu is None:
      mfu = f"n/a (no peak for {jax.devices()[0].platform})"
    else:
      mfu = f"{100 * self.mfu:.1f}%"
    cells = (self.device, f"`{self.config}`", self.batch_size, self.seq_len, self.dtype,
             fmt(self.first_step_s, ".1f"), fmt(self.step_s, ".1f", 1e3),
             fmt(self.tokens_per_s, ",.0f"), fmt(self.model_tflops_per_s, ".3f"), mfu,
             fmt(self.peak_memory_bytes, ".2f", 2.0**-30), fmt(self.flops_per_token, ".1f", 1e-6))
    return markdown_line(cells)


def format_cell(value, spec: str, scale: float = 1.0) -> str:
  """A table cell: `value * scale` formatted with `spec`, or '–' when not measured."""
  return "–" if value is None else format(value * scale, spec)


def markdown_line(cells) -> str:
  return "| " + " | ".join(str(c) for c in cells) + " |"


def markdown_header(columns) -> str:
  return markdown_line(columns) + "\n|" + "---|" * len(columns)


def config_arg() -> str:
  """The --config argument and its overrides as given on the command line."""
  flag = flags.FLAGS["config"]
  overrides = config_flags.get_override_values(flag)
  return " ".join([f"--config={config_flags.get_config_filename(flag)}"] +
                  [f"--config.{k}={v}" for k, v in overrides.items()])


def synthetic_batch(config, batch_size: int, mesh) -> dict[str, jax.Array]:
  """A batch with the keys and shapes of objectives/__init__.py (`batch_fn`), created sharded on
  device."""
  return jax.jit(batch_fn(config, batch_size),
                 out_shardings=sharding_lib.batch_sharding(mesh))(jax.random.key(0))


def abstract_batch(config, batch_size: int, mesh) -> dict[str, jax.ShapeDtypeStruct]:
  """`synthetic_batch`'s shapes and shardings, without creating it (ahead-of-time compilation
  for devices this machine does not have: tpu/aot.py)."""
  shapes = jax.eval_shape(batch_fn(config, batch_size), jax.random.key(0))
  sharding = sharding_lib.batch_sharding(mesh)
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), shapes)


def batch_fn(config, batch_size: int):
  """`make(rng) -> batch` of the keys and shapes of objectives/__init__.py.

  Every position is a real token (input_mask all 1, the padded-FLOP convention of flops.py); the
  second half of each row is segment 1 (all 0 with fewer than 2 token types, e.g. RoBERTa's one);
  `max_predictions` sorted random positions, all weighted.
  """
  if config.objective.name == "t5":
    return _t5_batch_fn(config, batch_size)
  if config.objective.name == "xlnet":
    return _xlnet_batch_fn(config, batch_size)
  if config.objective.name == "causal_lm":
    return _causal_lm_batch_fn(config, batch_size)
  length, preds = config.data.seq_len, config.objective.max_predictions
  vocab = config.model.vocab_size
  objective = config.objective
  sentence_task = bool(objective.get("sentence_task"))
  two_segments = config.model.type_vocab_size > 1  # an id past the table would look up NaNs

  def make(rng):
    ids_rng, pos_rng, target_rng, label_rng = jax.random.split(rng, 4)
    segment_L = (jnp.arange(length) >= length // 2) if two_segments else jnp.zeros(length)
    batch = dict(
        input_ids=jax.random.randint(ids_rng, (batch_size, length), 5, vocab, jnp.int32),
        input_mask=jnp.ones((batch_size, length), jnp.int32),
        segment_ids=jnp.broadcast_to(segment_L.astype(jnp.int32), (batch_size, length)),
        mlm_positions=jnp.sort(jax.random.randint(pos_rng, (batch_size, preds), 1, length,
                                                  jnp.int32), axis=1),
        mlm_targets=jax.random.randint(target_rng, (batch_size, preds), 5, vocab, jnp.int32),
        mlm_weights=jnp.ones((batch_size, preds), jnp.float32))
    if sentence_task:
      batch["sentence_label"] = jax.random.randint(label_rng, (batch_size,), 0, 2, jnp.int32)
    if objective.get("sbo"):  # every slot an SBO target: boundaries around it, offset 0
      positions = batch["mlm_positions"]
      batch.update(sbo_boundaries=jnp.stack([positions - 1, jnp.minimum(positions + 1,
                                                                         length - 1)], -1),
                   sbo_offsets=jnp.zeros_like(positions), sbo_weights=batch["mlm_weights"])
    if objective.name == "unilm":   # the LM types in turn, with their token types
      from bertfam_jax.objectives import unilm  # pylint: disable=g-import-not-at-top
      lm_type = jnp.arange(batch_size, dtype=jnp.int32) % len(unilm.LM_TYPES)
      type_ids = jnp.asarray([unilm.LM_TYPE_IDS[t] for t in range(len(unilm.LM_TYPES))])
      batch.update(lm_type=lm_type,
                   segment_ids=type_ids[lm_type[:, None],
                                          (jnp.arange(length) >= length // 2).astype(jnp.int32)])
    if objective.get("word_shuffle_rate"):  # as many word-order slots as MLM slots
      batch.update(shuffle_positions=batch["mlm_positions"],
                   shuffle_targets=batch["mlm_targets"], shuffle_weights=batch["mlm_weights"])
    return batch

  return make


def _causal_lm_batch_fn(config, batch_size: int):
  """GPT's rows: random ids, their next tokens as targets, every position real."""
  length, vocab = config.data.seq_len, config.model.vocab_size

  def make(rng):
    ids = jax.random.randint(rng, (batch_size, length + 1), 5, vocab, jnp.int32)
    ones = jnp.ones((batch_size, length), jnp.int32)
    return dict(input_ids=ids[:, :-1], target_ids=ids[:, 1:], input_mask=ones,
                loss_weights=ones.astype(jnp.float32))

  return make


def _t5_batch_fn(config, batch_size: int):
  """The encoder-decoder batch of objectives/__init__.py: one example per row filling both
  lengths (segment 1 everywhere), random ids, every target weighted; for a decoder-only model
  (`model.architecture`) the same example concatenated into one row (`packing.
  pack_decoder_only`'s keys), its inputs the prefix."""
  inputs, targets = config.data.seq_len, config.objective.targets_length
  vocab = config.model.vocab_size

  def concatenated(rng):
    length = inputs + targets
    ids = jax.random.randint(rng, (batch_size, length), 5, vocab, jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch_size, length))
    return dict(
        decoder_target_ids=ids, decoder_input_ids=jnp.pad(ids[:, :-1], ((0, 0), (1, 0))),
        decoder_segment_ids=jnp.ones((batch_size, length), jnp.int32),
        decoder_positions=positions,
        decoder_causal_attention=(positions <= inputs).astype(jnp.int32),
        decoder_loss_weights=(positions >= inputs).astype(jnp.float32))

  def make(rng):
    input_rng, target_rng = jax.random.split(rng)
    target_ids = jax.random.randint(target_rng, (batch_size, targets), 5, vocab, jnp.int32)
    ones = lambda length: jnp.ones((batch_size, length), jnp.int32)  # noqa: E731
    positions = lambda length: jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32),  # noqa: E731
                                                (batch_size, length))
    return dict(
        input_ids=jax.random.randint(input_rng, (batch_size, inputs), 5, vocab, jnp.int32),
        input_mask=ones(inputs), input_segment_ids=ones(inputs), input_positions=positions(inputs),
        decoder_target_ids=target_ids,
        decoder_input_ids=jnp.pad(target_ids[:, :-1], ((0, 0), (1, 0))),
        decoder_segment_ids=ones(targets), decoder_positions=positions(targets),
        decoder_loss_weights=jnp.ones((batch_size, targets), jnp.float32))

  return concatenated if t5_objective.decoder_only(config) else make


def _xlnet_batch_fn(config, batch_size: int):
  """XLNet's batch of objectives/__init__.py: a window of R (reuse_len) then A / B segments with
  <cls> (segment 2) last, num_predict targets split between the halves as the reference's goals
  (⌈P/2⌉, ⌊P/2⌋), random ranks within each half, half the rows reversed."""
  length, reuse = config.data.seq_len, config.model.reuse_len
  preds, vocab = config.objective.num_predict, config.model.vocab_size

  def make(rng):
    ids_rng, first_rng, second_rng, rank_rng, target_rng = jax.random.split(rng, 5)
    halves = [(first_rng, 0, reuse, preds - preds // 2), (second_rng, reuse, length, preds // 2)]
    positions = jnp.concatenate([
        start + jnp.sort(jax.vmap(lambda k: jax.random.permutation(k, end - start)[:count])(
            jax.random.split(key, batch_size)), axis=1)
        for key, start, end, count in halves], axis=1)
    ranks = jnp.concatenate([
        start + jax.vmap(lambda k: jax.random.permutation(k, end - start))(
            jax.random.split(jax.random.fold_in(rank_rng, start), batch_size))
        for _, start, end, _ in halves], axis=1)
    is_target = jnp.zeros((batch_size, length), bool).at[
        jnp.arange(batch_size)[:, None], positions].set(True)
    segment_L = jnp.where(jnp.arange(length) < (reuse + length) // 2, 0, 1).at[-1].set(2)
    return dict(
        input_ids=jax.random.randint(ids_rng, (batch_size, length), 5, vocab, jnp.int32),
        segment_ids=jnp.broadcast_to(segment_L.astype(jnp.int32), (batch_size, length)),
        input_mask=jnp.ones((batch_size, length), jnp.int32),
        perm_rank=jnp.where(is_target, ranks, -1).astype(jnp.int32),
        target_positions=positions.astype(jnp.int32),
        target_ids=jax.random.randint(target_rng, (batch_size, preds), 5, vocab, jnp.int32),
        target_weights=jnp.ones((batch_size, preds), jnp.float32),
        direction=jnp.where(jnp.arange(batch_size) % 2 == 0, 1.0, -1.0).astype(jnp.float32))

  return make


def peak_memory_bytes() -> int | None:
  stats = [d.memory_stats() for d in jax.local_devices()]
  peaks = [s["peak_bytes_in_use"] for s in stats if s and "peak_bytes_in_use" in s]
  return max(peaks) if peaks else None


def with_batch_size(config, batch_size: int, mesh):
  """A copy of `config` with `train.batch_size`; ConfigError if the mesh cannot split it."""
  config = config.copy_and_resolve_references()
  config.train.batch_size = batch_size
  train_lib.check_batch(config, mesh)
  return config


def measure(config, mesh, result: Result, *, steps: int, warmup: int):
  """Builds the state and step for `config.train.batch_size` and fills the timings of `result`:
  the first (compiling) step alone, `warmup` untimed steps, then the mean of `steps` timed ones.
  Returns the last step's metrics."""
  batch_size = config.train.batch_size
  start = time.perf_counter()
  state, train_step = step_lib.fresh_train_step(config, mesh,
                                                objectives.get(config.objective.name),
                                                abstract_batch(config, batch_size, mesh))
  batch = jax.block_until_ready(synthetic_batch(config, batch_size, mesh))
  jax.block_until_ready(state)
  result.setup_s = time.perf_counter() - start

  first = time.perf_counter()
  state, metrics = jax.block_until_ready(train_step(state, batch))
  result.first_step_s = time.perf_counter() - start
  result.compiled_step_s = time.perf_counter() - first
  for _ in range(warmup):
    state, metrics = train_step(state, batch)
  jax.block_until_ready((state, metrics))

  start = time.perf_counter()
  for _ in range(steps):
    state, metrics = train_step(state, batch)
  jax.block_until_ready((state, metrics))
  result.step_s = (time.perf_counter() - start) / steps

  result.tokens_per_s = batch_size * config.data.seq_len / result.step_s
  flops_per_s = result.flops_per_token * result.tokens_per_s
  result.model_tflops_per_s = flops_per_s / 1e12
  peak = flops_lib.peak_flops_per_device()
  result.mfu = flops_per_s / (peak * jax.device_count()) if peak else None
  result.peak_memory_bytes = peak_memory_bytes()
  return metrics


def run(config) -> None:
  """Prints the header and one markdown row (and --output line) per batch size."""
  objectives.validate(config)
  mesh = sharding_lib.make_mesh(config.mesh)
  devices = jax.devices()
  device = f"{devices[0].device_kind} x{len(devices)}"
  arg = config_arg()
  flops_per_token = objectives.get(config.objective.name).flops_per_token(config)
  batch_sizes = [int(b) for b in _BATCH_SIZES.value] or [config.train.batch_size]
  configs = [with_batch_size(config, b, mesh) for b in batch_sizes]  # all checked before any runs

  print(f"{arg}\njax {jax.__version__}; {device}; mesh {dict(mesh.shape)}; "
        f"{_STEPS.value} timed steps after 1 + {_WARMUP.value} warm-up; "
        f"{flops_per_token / 1e6:.1f} MFLOP/token\n", flush=True)
  print(markdown_header(COLUMNS), flush=True)
  for batch_config in configs:
    result = Result(device=device, config=arg, batch_size=batch_config.train.batch_size,
                    seq_len=config.data.seq_len, dtype=config.model.dtype,
                    flops_per_token=flops_per_token)
    try:
      measure(batch_config, mesh, result, steps=_STEPS.value, warmup=_WARMUP.value)
    except jax.errors.JaxRuntimeError as e:
      if "RESOURCE_EXHAUSTED" not in str(e):
        raise
      result.error = "out of memory"
    print(result.markdown_row(), flush=True)
    if _OUTPUT.value and jax.process_index() == 0:
      with open(_OUTPUT.value, "a") as f:
        f.write(json.dumps(dataclasses.asdict(result)) + "\n")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  try:
    run(_CONFIG.value)
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr, flush=True)
    sys.exit(2)


if __name__ == "__main__":
  app.run(main)
