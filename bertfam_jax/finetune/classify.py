"""Sequence-classification fine-tuning of a pre-trained encoder (BERT's run_classifier.py recipe).

The seam an experiment calls after pre-training:

  config, tokenizer, encoder_params = classify.load_pretrained_encoder(workdir)
  train = dict(features.encode_pairs(tokenizer, texts, seq_len=128), label=labels)
  evaluation = dict(features.encode_pairs(tokenizer, eval_texts, seq_len=128), label=eval_labels)
  result = classify.fine_tune(config.model, encoder_params, train, evaluation, num_classes=2)
  result['accuracy'], result['macro_f1'], result['mcc']

A data set is a dict of numpy arrays: input_ids, input_mask, segment_ids [examples, length] int32
(as `features.encode_pairs` returns) and label [examples] int.

Everything runs on one device with a plain `jax.jit`: the small, fast loop the experiments'
sweeps call many times. The command-line fine-tuning (every task kind, sharded, adapters,
layer-wise decay, checkpoints) is `finetune/run.py`; this module also holds the loading of
pre-trained workdirs both use.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any, Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bertfam_jax import config_lib, objectives
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.data import tokenizers
from bertfam_jax.finetune import metrics as metrics_lib
from bertfam_jax.models import classifier
from bertfam_jax.objectives import losses
from bertfam_jax.train import checkpoint as checkpoint_lib
from bertfam_jax.train import optimizer as optimizer_lib
from bertfam_jax.train import sharding as sharding_lib
from bertfam_jax.train import step as step_lib

INPUT_KEYS = ("input_ids", "input_mask", "segment_ids")


# ----------------------------------------------------------------------------- pre-trained encoder


def load_pretrained(path: str, *, tokenizer_path: str = ""
                    ) -> tuple[ml_collections.ConfigDict, Any, Any]:
  """Reads a pre-trained model (read-only): a workdir of ours (its config.json, tokenizer and
  latest checkpoint, as `bertfam_jax.main` or `python -m bertfam_jax.hf import` write them) or a
  transformers checkpoint directory (config.json with a `model_type`, imported in memory).

  Args:
    path: the workdir or the transformers checkpoint directory.
    tokenizer_path: a tokenizer to use instead of the run's (see `load_run_tokenizer`).

  Returns:
    (config, tokenizer, params): the run's full config, its tokenizer (`data.tokenizers.Tokenizer`
    or `hf.tokenizer.HFTokenizer`, same interface) and the parameters of its model as host numpy
    arrays ({'encoder', heads...}; the optimizer state is restored too, then dropped).
  """
  if is_transformers_checkpoint(path):
    from bertfam_jax import hf  # pylint: disable=g-import-not-at-top
    imported = hf.from_pretrained(path, task_head=False)  # the encoder; heads start fresh
    if imported.tokenizer is None:
      raise ConfigError(f"{path} holds no tokenizer files (tokenizer.json, vocab.txt, "
                        f"vocab.json + merges.txt or spiece.model); copy the checkpoint's "
                        f"tokenizer into it.")
    return imported.config, imported.tokenizer, jax.device_get(imported.params)
  config = read_run_config(path)
  tokenizer = load_run_tokenizer(config, path, tokenizer_path)
  return config, tokenizer, restore_params(config, path)


def load_pretrained_encoder(workdir: str, *, tokenizer_path: str = ""
                            ) -> tuple[ml_collections.ConfigDict, Any, Any]:
  """`load_pretrained`, keeping only the 'encoder' subtree of the parameters. For ELECTRA that
  subtree is the discriminator (models/electra.py); the generator is left behind."""
  config, tokenizer, params = load_pretrained(workdir, tokenizer_path=tokenizer_path)
  if "encoder" not in params:
    raise ConfigError(f"The checkpoint in {workdir} has no 'encoder' parameters (it has "
                      f"{sorted(params)}); fine-tuning expects a run whose model keeps its encoder "
                      f"under 'encoder', as pretraining.MaskedLM and electra.Electra do.")
  return config, tokenizer, params["encoder"]


def is_transformers_checkpoint(path: str) -> bool:
  """Whether `path` is a transformers checkpoint directory (its config.json has a model_type)
  rather than a workdir of ours."""
  config_path = os.path.join(path, "config.json")
  if not os.path.exists(config_path):
    return False
  with open(config_path) as f:
    return "model_type" in json.load(f)


def read_run_config(workdir: str) -> ml_collections.ConfigDict:
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise ConfigError(f"{workdir} has no config.json, so it is neither a workdir of ours nor a "
                      f"transformers checkpoint; pass the --workdir of a `python -m "
                      f"bertfam_jax.main` run or of `python -m bertfam_jax.hf import`.")
  with open(path) as f:
    saved = json.load(f)
  # Model fields added to the codebase after the run was written hold their defaults, the
  # behaviour the run had (e.g. `adapter_size`).
  model = saved.get("model", {})
  kind = model.get("kind")
  defaults = (config_lib.t5_model("base", model.get("version", "1.0")) if kind == "t5"
              else config_lib.xlnet_model("base") if kind == "xlnet" else config_lib.encoder("base"))
  saved["model"] = {**defaults.to_dict(), **model}
  return ml_collections.ConfigDict(saved)


def tokenizer_location(config, workdir: str, tokenizer_path: str = "") -> str:
  """Where the tokenizer of the run in `workdir` is: `tokenizer_path`, else the run's
  `tokenizer.model_path` (relative paths, as imported workdirs write them, are relative to the
  workdir), else the model the run trained and cached on this machine. For a transformers
  checkpoint directory, that directory."""
  if tokenizer_path:
    return tokenizer_path
  if is_transformers_checkpoint(workdir):
    return os.path.abspath(workdir)
  path = config.tokenizer.model_path
  if path and not os.path.isabs(path):
    path = os.path.join(workdir, path)
  return os.path.abspath(path or tokenizers.cache_path(config))


def load_run_tokenizer(config, workdir: str, tokenizer_path: str = ""):
  """The tokenizer at `tokenizer_location`: a SentencePiece model file, or a directory of
  transformers tokenizer files (`hf.tokenizer.from_dir`)."""
  path = tokenizer_location(config, workdir, tokenizer_path)
  if not os.path.exists(path):
    raise ConfigError(
        f"The tokenizer of {workdir} is not at {path} (it is cached under data.cache_dir or "
        f"$BERTFAM_CACHE of the machine that pre-trained it, and the cache key changes with the "
        f"corpus files). On that machine `python -m bertfam_jax.train_tokenizer --config=<the "
        f"run's config> --output=PATH` copies it; then pass tokenizer_path=PATH.")
  if os.path.isdir(path):
    from bertfam_jax.hf import tokenizer as hf_tokenizer  # pylint: disable=g-import-not-at-top
    tokenizer = hf_tokenizer.from_dir(path)
  else:
    tokenizer = tokenizers.Tokenizer.from_file(path, config.tokenizer.get("extra_ids", 0))
  if tokenizer.vocab_size > config.model.vocab_size:
    raise ConfigError(f"The tokenizer at {path} has {tokenizer.vocab_size} pieces but {workdir} "
                      f"was trained with model.vocab_size={config.model.vocab_size}; pass that "
                      f"run's tokenizer as tokenizer_path.")
  return tokenizer


def _run_model_and_optimizer(config):
  """(model, tx, init inputs or None, abstract carry or None) whose state a workdir's checkpoints
  hold: a fine-tuning run's `FineTuneModel` (config.finetune) or its pre-training objective's
  model (XLNet's checkpoints hold its memory too)."""
  if "finetune" in config:
    from bertfam_jax.finetune import run  # pylint: disable=g-import-not-at-top
    return run.model_and_optimizer(config) + (None,)
  tx, _ = optimizer_lib.make_optimizer(config)
  objective = objectives.get(config.objective.name)
  return (objective.build_model(config), tx, step_lib.objective_init_inputs(objective, config),
          step_lib.objective_carry(objective, config))


def restore_params(config, workdir: str):
  """The latest checkpoint's parameters ({'encoder': ..., heads...}) as host numpy arrays."""
  checkpointer = checkpoint_lib.Checkpointer(os.path.join(workdir, "checkpoints"), keep=1,
                                             read_only=True)
  try:
    step = checkpointer.latest_step()
    if step is None:
      raise ConfigError(f"{workdir} holds no checkpoint yet; let its pre-training run reach "
                        f"train.checkpoint_every steps, or pass the workdir of a finished run.")
    # Every process reads the whole tree onto a device of its own (the first global device
    # belongs to process 0 alone: another process could not hold the restored arrays).
    mesh = sharding_lib.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.local_devices()[:1])
    model, tx, inputs, carry = _run_model_and_optimizer(config)
    abstract, _ = step_lib.with_mesh_context(step_lib.abstract_state, mesh)(
        model, tx, config, mesh, inputs, carry)
    try:
      state, _ = checkpointer.restore(step, abstract)
    except ConfigError as e:
      raise ConfigError(f"{workdir}/config.json does not describe the model in its checkpoints "
                        f"(was it edited, or the checkpoints copied from another run?); restore "
                        f"the run's own config.json. {e}") from e
  finally:
    checkpointer.close()
  return jax.device_get(state.params["params"])


# ----------------------------------------------------------------------------------------- inputs


def _check_data(data: dict[str, np.ndarray], name: str, num_classes: int, config_model) -> int:
  """Returns the number of examples after checking keys, shapes and labels."""
  missing = [k for k in INPUT_KEYS + ("label",) if k not in data]
  if missing:
    raise ValueError(f"{name} lacks {missing}; build it as "
                     f"dict(features.encode_pairs(...), label=labels).")
  shapes = {k: np.shape(data[k]) for k in INPUT_KEYS + ("label",)}
  shape = shapes["input_ids"]
  if (len(shape) != 2 or any(shapes[k] != shape for k in INPUT_KEYS) or
      shapes["label"] != shape[:1] or not shape[0]):
    raise ValueError(f"{name}: input_ids/input_mask/segment_ids must share one [examples, length] "
                     f"shape and label be [examples] with examples > 0; got {shapes}.")
  if shape[1] > config_model.max_positions:
    raise ConfigError(f"{name} has sequences of {shape[1]} tokens but the encoder has "
                      f"max_positions={config_model.max_positions}; encode with a shorter seq_len.")
  labels = np.asarray(data["label"])
  if labels.min() < 0 or labels.max() >= num_classes:
    raise ValueError(f"{name} has labels outside [0, {num_classes}); check num_classes.")
  return shape[0]


# ------------------------------------------------------------------------------------------ model
#
# The jitted functions below take the model and the optimizer settings as static arguments (both
# hashable: frozen configs), so runs with the same settings (a sweep over seeds) compile once.


def build_model(config_model, num_classes: int) -> classifier.SequenceClassifier:
  """A `SequenceClassifier` over a frozen copy of `config_model` (hashable, see above)."""
  return classifier.SequenceClassifier(ml_collections.FrozenConfigDict(config_model), num_classes)


@functools.partial(jax.jit, static_argnames=("model", "seq_len"))
def _fresh_params(rng, *, model, seq_len):
  ids = jnp.zeros((1, seq_len), jnp.int32)
  return nn.meta.unbox(model.init({"params": rng}, ids, jnp.ones_like(ids), ids,
                                  deterministic=True))


def init_params(model: classifier.SequenceClassifier, seq_len: int, rng: jax.Array,
                encoder_params=None):
  """Fresh {'params': {'encoder', 'sentence_head'}} for `model` (from `build_model`); with
  `encoder_params`, the encoder's are replaced by (copies of) them after checking that every name
  and shape matches.

  The pooler is always fresh, as fairseq's RoBERTa classification head: BERT would carry over the
  pooler its NSP task trained, which runs pre-trained without a sentence task do not have.
  """
  params = _fresh_params(rng, model=model, seq_len=seq_len)
  if encoder_params is None:
    return params
  fresh = params["params"]["encoder"]
  _check_same_shapes(fresh, encoder_params)
  # jnp.array copies, so the train step's buffer donation never consumes the caller's arrays.
  encoder = jax.tree.map(lambda f, p: jnp.array(p, dtype=f.dtype), fresh, encoder_params)
  return {"params": {**params["params"], "encoder": encoder}}


def _check_same_shapes(expected, given) -> None:
  shapes = lambda tree: {jax.tree_util.keystr(path): np.shape(leaf)  # noqa: E731
                         for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}
  want, got = shapes(expected), shapes(given)
  diffs = [f"{k}: {got.get(k, 'missing')} given, {want.get(k, 'absent')} expected"
           for k in sorted(set(want) | set(got)) if want.get(k) != got.get(k)]
  if diffs:
    raise ConfigError(f"encoder_params do not fit config_model ({'; '.join(diffs[:3])}"
                      f"{'; ...' if len(diffs) > 3 else ''}); pass the config.model that "
                      f"load_pretrained_encoder returned with them.")


def optimizer_config(total_steps: int, *, peak_lr: float, warmup_fraction: float,
                     weight_decay: float) -> ml_collections.FrozenConfigDict:
  """BERT's fine-tuning optimizer (run_classifier.py → optimization.create_optimizer): the
  pre-training AdamWeightDecay (clip 1.0, no decay on LayerNorm and biases), warmup over
  `int(total_steps · warmup_fraction)` steps, then linear decay to 0 at `total_steps`. Returns the
  `optimizer` and `train.total_steps` sections `optimizer.make_optimizer` reads."""
  return ml_collections.FrozenConfigDict(dict(
      optimizer=config_lib.bert_adamw(peak_lr=peak_lr, weight_decay=weight_decay,
                                      warmup_steps=int(total_steps * warmup_fraction)),
      train=dict(total_steps=total_steps)))


@functools.partial(jax.jit, static_argnames=("optimizer",))
def init_state(params, *, optimizer) -> step_lib.TrainState:
  """Step 0 and the optimizer state of `optimizer_config` for `params`."""
  tx, _ = optimizer_lib.make_optimizer(optimizer)
  return step_lib.TrainState(step=jnp.zeros([], jnp.int32), params=params,
                             opt_state=tx.init(params))


def _loss(model, params, batch, rng):
  logits = model.apply(params, *(batch[k] for k in INPUT_KEYS), deterministic=False,
                       rngs={"dropout": rng})
  loss_sum, _, count = losses.weighted_cross_entropy(
      logits=logits, targets=batch["label"], weights=jnp.ones(batch["label"].shape))
  return loss_sum / count


@functools.partial(jax.jit, static_argnames=("model", "optimizer"), donate_argnames=("state",))
def train_step(state: step_lib.TrainState, batch, dropout_rng, *, model, optimizer):
  """One update on batch (INPUT_KEYS [batch, length], label [batch]) → (state, mean loss); dropout
  keyed by `fold_in(dropout_rng, state.step)`; `state` is donated."""
  tx, _ = optimizer_lib.make_optimizer(optimizer)
  rng = jax.random.fold_in(dropout_rng, state.step)
  loss, grads = jax.value_and_grad(lambda p: _loss(model, p, batch, rng))(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  return step_lib.TrainState(step=state.step + 1, params=params, opt_state=opt_state), loss


@functools.partial(jax.jit, static_argnames=("model",))
def _predict_batch(params, batch, *, model):
  logits = model.apply(params, *(batch[k] for k in INPUT_KEYS), deterministic=True)
  return jnp.argmax(logits, axis=-1)


def predict(model: classifier.SequenceClassifier, params, data: dict[str, np.ndarray],
            batch_size: int) -> np.ndarray:
  """Argmax classes [examples] int32, deterministic (no dropout). The last batch is padded by
  repeating its final row so every call has the [batch_size, length] shape of the first."""
  rows = len(data["input_ids"])
  outputs = []
  for start in range(0, rows, batch_size):
    batch = {k: np.asarray(data[k][start:start + batch_size]) for k in INPUT_KEYS}
    pad = batch_size - len(batch["input_ids"])
    batch = {k: np.pad(v, ((0, pad), (0, 0)), mode="edge") for k, v in batch.items()}
    outputs.append(_predict_batch(params, batch, model=model))
  return np.concatenate(jax.device_get(outputs))[:rows].astype(np.int32)


# ------------------------------------------------------------------------------------- fine-tuning


def epoch_batches(num_examples: int, batch_size: int, rng: np.random.Generator
                  ) -> Iterator[np.ndarray]:
  """Endless [batch_size] example indices: a fresh permutation every epoch, its last partial batch
  dropped (run_classifier.py's input_fn shuffles and uses drop_remainder=True for training)."""
  while True:
    order = rng.permutation(num_examples)
    for start in range(0, num_examples - batch_size + 1, batch_size):
      yield order[start:start + batch_size]


def fine_tune(config_model, encoder_params, train_data: dict[str, np.ndarray],
              eval_data: dict[str, np.ndarray], *, num_classes: int, batch_size: int = 32,
              epochs: float = 3.0, steps: int | None = None, peak_lr: float = 5e-5,
              warmup_fraction: float = 0.1, weight_decay: float = 0.01, seed: int = 0
              ) -> dict[str, Any]:
  """Fine-tunes a `SequenceClassifier` and evaluates it; deterministic given `seed`.

  Defaults are run_classifier.py's (batch 32, 3 epochs, lr 5e-5, 10% warmup); dropout comes from
  `config_model` (`dropout`, `attention_dropout`).

  Args:
    config_model: the `config.model` section the encoder was built with.
    encoder_params: the 'encoder' parameter subtree (`load_pretrained_encoder`), or None to
      fine-tune from a random initialisation (the no-pre-training baseline).
    train_data, eval_data: data sets as the module docstring describes.
    num_classes: number of labels.
    batch_size: examples per update (and per evaluation call).
    epochs: training length in passes over train_data, `int(examples / batch_size · epochs)`
      updates as run_classifier.py's num_train_steps.
    steps: the number of updates instead, when given.
    peak_lr, warmup_fraction, weight_decay: see `optimizer_config`.
    seed: parameter initialisation, dropout and the data order.

  Returns:
    accuracy, macro_f1, mcc: floats on eval_data;
    predictions: [eval examples] int32 predicted classes;
    train_loss_curve: [min(10, updates)] float32 mean training loss over consecutive tenths of
      the updates;
    steps: the number of updates;
    params: the fine-tuned {'params': {'encoder', 'sentence_head'}}.
  """
  num_train = _check_data(train_data, "train_data", num_classes, config_model)
  _check_data(eval_data, "eval_data", num_classes, config_model)
  if num_train < batch_size:
    raise ConfigError(f"train_data has {num_train} examples, fewer than batch_size={batch_size}.")
  total_steps = steps if steps is not None else int(num_train / batch_size * epochs)
  if total_steps < 1:
    raise ConfigError(f"epochs={epochs} of {num_train} examples at batch_size={batch_size} is no "
                      f"update; raise epochs or pass steps.")

  model = build_model(config_model, num_classes)
  optimizer = optimizer_config(total_steps, peak_lr=peak_lr, warmup_fraction=warmup_fraction,
                               weight_decay=weight_decay)
  init_rng, dropout_rng = jax.random.split(jax.random.key(seed))
  params = init_params(model, train_data["input_ids"].shape[1], init_rng, encoder_params)
  state = init_state(params, optimizer=optimizer)

  batches = epoch_batches(num_train, batch_size, np.random.default_rng(seed))
  step_losses = []
  for _ in range(total_steps):
    indices = next(batches)
    batch = {k: train_data[k][indices] for k in INPUT_KEYS + ("label",)}
    state, loss = train_step(state, batch, dropout_rng, model=model, optimizer=optimizer)
    step_losses.append(loss)  # fetched once at the end, so dispatch runs ahead of the host

  step_losses = np.asarray(jax.device_get(step_losses), np.float32)
  curve = [chunk.mean() for chunk in np.array_split(step_losses, min(10, total_steps))]
  predictions = predict(model, state.params, eval_data, batch_size)
  return dict(metrics_lib.classification_metrics(eval_data["label"], predictions, num_classes),
              predictions=predictions, train_loss_curve=np.asarray(curve, np.float32),
              steps=total_steps, params=state.params)
