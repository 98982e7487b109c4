"""Reading a run back: its config, its tokenizer and its parameters, without its optimizer.

A run is a workdir of ours: config.json (`train.run`, `finetune.run` or `python -m
bertfam_jax.hf import` wrote it), the tokenizer it names, checkpoints/<step>/. (A transformers
checkpoint directory is read by `bertfam_jax.hf`; fine-tuning takes either, `finetune.run.
load_init`.)

  config, tokenizer, params = workdir.load(path)          # params: {'encoder', heads...}
  params = workdir.restore_params(path)                   # the latest checkpoint's, host numpy

Parameters are restored against the abstract tree in the checkpoint's own metadata (as MaxText's
`load_params_from_path`): nothing else is read, no optimizer is built and no model is traced, so a
run of any objective, fine-tuned or not, reads the same way. Everything here only reads.
"""

from __future__ import annotations

import json
import os
from typing import Any

import ml_collections

from bertfam_jax import config_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.data import tokenizers
from bertfam_jax.train import checkpoint as checkpoint_lib

CONFIG_FILE = "config.json"
CHECKPOINTS = "checkpoints"


def is_transformers_checkpoint(path: str) -> bool:
  """Whether `path` is a transformers checkpoint directory (its config.json has a model_type)
  rather than a workdir of ours."""
  config_path = os.path.join(path, CONFIG_FILE)
  if not os.path.exists(config_path):
    return False
  with open(config_path) as f:
    return "model_type" in json.load(f)


def read_config(workdir: str) -> ml_collections.ConfigDict:
  """The run's config.json. Model fields added to the codebase after the run was written hold
  their defaults, the behaviour the run had (e.g. `adapter_size`)."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    raise ConfigError(f"{workdir} has no config.json, so it is neither a workdir of ours nor a "
                      f"transformers checkpoint; pass the --workdir of a `python -m "
                      f"bertfam_jax.main` run or of `python -m bertfam_jax.hf import`.")
  with open(path) as f:
    saved = json.load(f)
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


def load_tokenizer(config, workdir: str, tokenizer_path: str = ""):
  """The tokenizer at `tokenizer_location`: a SentencePiece model file
  (`data.tokenizers.Tokenizer`), or a directory of transformers tokenizer files
  (`data.hf_tokenizer.HFTokenizer`, the same interface)."""
  path = tokenizer_location(config, workdir, tokenizer_path)
  if not os.path.exists(path):
    raise ConfigError(
        f"The tokenizer of {workdir} is not at {path} (it is cached under data.cache_dir or "
        f"$BERTFAM_CACHE of the machine that pre-trained it, and the cache key changes with the "
        f"corpus files). On that machine `python -m bertfam_jax.train_tokenizer --config=<the "
        f"run's config> --output=PATH` copies it; then pass tokenizer_path=PATH.")
  if os.path.isdir(path):
    # Imported here: it needs the `tokenizers` package (the [hf] extra).
    from bertfam_jax.data import hf_tokenizer  # pylint: disable=g-import-not-at-top
    tokenizer = hf_tokenizer.from_dir(path)
  else:
    tokenizer = tokenizers.Tokenizer.from_file(path, config.tokenizer.get("extra_ids", 0))
  if tokenizer.vocab_size > config.model.vocab_size:
    raise ConfigError(f"The tokenizer at {path} has {tokenizer.vocab_size} pieces but {workdir} "
                      f"was trained with model.vocab_size={config.model.vocab_size}; pass that "
                      f"run's tokenizer as tokenizer_path.")
  return tokenizer


def latest_step(workdir: str) -> int | None:
  """The latest complete checkpoint step in WORKDIR/checkpoints, or None."""
  return checkpoint_lib.read_latest_step(os.path.join(workdir, CHECKPOINTS))


def restore_params(workdir: str, step: int | None = None) -> Any:
  """The parameters ({'encoder': ..., heads...}) of checkpoint `step` (default: the latest) as
  host numpy arrays (`train.checkpoint.read_params`: neither the optimizer state nor the data
  position is read)."""
  step = latest_step(workdir) if step is None else step
  if step is None:
    raise ConfigError(f"{workdir} holds no checkpoint yet; let its run reach "
                      f"train.checkpoint_every steps, or pass the workdir of a finished run.")
  return checkpoint_lib.read_params(os.path.join(workdir, CHECKPOINTS), step)


def load(path: str, *, tokenizer_path: str = "") -> tuple[ml_collections.ConfigDict, Any, Any]:
  """(config, tokenizer, params) of the workdir `path` (module docstring), read-only.
  `tokenizer_path`: a tokenizer to use instead of the run's."""
  if is_transformers_checkpoint(path):
    raise ConfigError(f"{path} is a transformers checkpoint, not a workdir of ours: import it "
                      f"with `python -m bertfam_jax.hf import --hf_path={path} --workdir=DIR`, "
                      f"or fine-tune it directly (finetune.init={path}).")
  config = read_config(path)
  return config, load_tokenizer(config, path, tokenizer_path), restore_params(path)


def load_encoder(path: str, *, tokenizer_path: str = "") -> tuple[ml_collections.ConfigDict,
                                                                  Any, Any]:
  """`load`, keeping only the 'encoder' subtree of the parameters. For ELECTRA that subtree is
  the discriminator (models/electra.py); the generator is left behind."""
  config, tokenizer, params = load(path, tokenizer_path=tokenizer_path)
  if "encoder" not in params:
    raise ConfigError(f"The checkpoint in {path} has no 'encoder' parameters (it has "
                      f"{sorted(params)}); fine-tuning expects a run whose model keeps its encoder "
                      f"under 'encoder', as pretraining.MaskedLM and electra.Electra do.")
  return config, tokenizer, params["encoder"]
