"""A workdir: what a run records (`record`), what a resume must match (`check_resumable`), and
reading a run back (its config, tokenizer and parameters, without its optimizer).

A run is a workdir of ours, self-contained: config.json (`train.run`, `finetune.run` or `python -m
bertfam_jax.hf import` wrote it), its tokenizer (tokenizer.model, a SentencePiece model, or
tokenizer/, a transformers tokenizer's files), data.json (`data.sources.data_identity`: the
documents it trains on, by content hash), checkpoints/<step>/, metrics.jsonl. Copied to another
machine with an empty cache it resumes and exports as it was. (A transformers checkpoint directory
is read by `bertfam_jax.hf`; fine-tuning takes either, `finetune.run.load_init`.)

The files other than checkpoints are provisional until the first checkpoint: a start that fails
before it leaves nothing that blocks a corrected re-run, which replaces them.

  config, tokenizer, params = workdir.load(path)          # params: {'encoder', heads...}
  params = workdir.restore_params(path)                   # the latest checkpoint's, host numpy

Parameters are restored against the abstract tree in the checkpoint's own metadata (as MaxText's
`load_params_from_path`): nothing else is read, no optimizer is built and no model is traced, so a
run of any objective, fine-tuned or not, reads the same way. Only `record` and `write_config`
write.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import tempfile
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from bertfam_jax import config_lib, fileio
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.data import sources, tokenizers
from bertfam_jax.train import checkpoint as checkpoint_lib
from bertfam_jax.train import metrics as metrics_lib

CONFIG_FILE = "config.json"
CHECKPOINTS = "checkpoints"
TOKENIZER_MODEL = "tokenizer.model"   # a SentencePiece model (data.tokenizers.Tokenizer)
TOKENIZER_DIR = "tokenizer"           # a transformers tokenizer's files (data.hf_tokenizer)
DATA_FILE = "data.json"
# Sections whose change makes an existing checkpoint meaningless (a different network, vocabulary
# or objective). Optimizer, schedule, batch and step counts may change between resumptions; the
# tokenizer's own path may too (its content is compared instead, `check_resumable`).
_IDENTITY_SECTIONS = ("model", "objective", "tokenizer")
# Fields added to a family's config after runs had been saved without them, with the behaviour
# their absence meant where `config_lib.base_config()` (an MLM's) does not hold it: MASS's
# decoder attended to the masked inputs before `8d56e2e`, DistilBERT's student trained its
# positions before `56b4376`, GPT dropped its summed embeddings before its table dropout, GPT-2
# was initialised as every model before its own initialisation (these two touch only a fresh
# start, but the model section is compared whole), T5's bucket tables were HF's normal draw and a
# prefix LM's buckets causal before `fd6e7b2`, ALBERT's text went in cased before `d917a0d`
# (`tokenizer.normalize`, where `read_config` fills nothing: the tokenizer reads its absence as
# ''), SpanBERT's pairs were masked as one row before `0dab57f`, and ELECTRA's bare dense layers
# were BERT's truncated normal and its task heads pooled before `f7baf54`, and every family drew
# BERT's truncated normal before `e834a29` (`model.weight_init`; also for a distillation's
# `objective.teacher_model`, whose absent fields mean what a model's do). A saved
# config lacking the field matches only this value, and `read_config` gives it that value where
# the family's defaults hold the field. (DistilBERT runs saved in the hour between
# `56b4376` and `a6cc996` hold `model.freeze_positions`, a field gone since: they are refused
# with no flag to offer, rightly, as the freezing now lives in the objective.)
_ABSENT_MEANS = {"objective.decoder_sees_masked": True, "objective.freeze_positions": False,
                 "objective.mask_per_segment": False,
                 "model.embedding_dropout": "output", "model.position_initializer_range": 0.0,
                 "model.scale_residual_init": False, "model.relpos_bias_init": "normal",
                 "model.prefix_lm_buckets": "causal", "model.weight_init": "truncated_normal",
                 "model.bare_dense_init": "truncated_normal",
                 "model.classifier_pooler": True, "tokenizer.normalize": ""}


# ------------------------------------------------------------------------------------- writing


def check_writable(workdir: str) -> None:
  """Refuses a --workdir that is a file, or that cannot be created or written, creating nothing:
  the only write is a probe directory, made and removed at once in the nearest existing one."""
  if fileio.is_remote(workdir):
    _check_remote_writable(workdir)
    return
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ConfigError(f"--workdir={workdir} is a file, not a directory; pass a directory (it is "
                      f"created if it does not exist).")
  existing = os.path.abspath(workdir)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  try:   # a directory made and removed at once: os.access says yes to root, even in /proc
    os.rmdir(tempfile.mkdtemp(dir=existing, prefix=".bertfam_write_probe_"))
  except OSError as e:
    raise ConfigError(f"--workdir={workdir} cannot be written ({existing}: {e.strerror}); "
                      f"choose a directory you can write to.") from None


def _check_remote_writable(workdir: str) -> None:
  """An object-store --workdir: a probe object written and removed at once, so that a missing
  bucket or missing credentials is one line before anything runs."""
  # One name per process and call: every process of a pod probes at once.
  probe = os.path.join(workdir, f".bertfam_write_probe_{jax.process_index()}_"
                                f"{secrets.token_hex(4)}")
  try:
    fileio.write_atomically(probe, b"")
    fileio.remove(probe)
  except ConfigError:
    raise
  except Exception as e:  # pylint: disable=broad-except  (each store raises its own errors)
    raise ConfigError(f"--workdir={workdir} cannot be written ({type(e).__name__}: "
                      f"{str(e).splitlines()[0] if str(e) else ''}); check the bucket and your "
                      f"credentials (gcloud auth application-default login).") from None


def tokenizer_files(tokenizer) -> dict[str, bytes]:
  """{path in the workdir: content} of the files that hold `tokenizer`: its SentencePiece model
  as tokenizer.model, or a transformers tokenizer's files under tokenizer/."""
  if hasattr(tokenizer, "model_proto"):
    return {TOKENIZER_MODEL: tokenizer.model_proto}
  return {os.path.join(TOKENIZER_DIR, name): content for name, content in tokenizer.files.items()}


def saved_tokenizer_files(workdir: str) -> dict[str, bytes]:
  """`tokenizer_files` as the workdir holds them ({} for a workdir written before it held its
  tokenizer)."""
  directory = os.path.join(workdir, TOKENIZER_DIR)
  names = ([TOKENIZER_MODEL] if fileio.exists(os.path.join(workdir, TOKENIZER_MODEL)) else
           [os.path.join(TOKENIZER_DIR, n) for n in fileio.listdir(directory)]
           if fileio.isdir(directory) else [])
  out = {}
  for name in names:
    if fileio.isfile(os.path.join(workdir, name)):
      with fileio.open(os.path.join(workdir, name), "rb") as f:
        out[name] = f.read()
  return out


def check_resumable(workdir: str, config, tokenizer, data: dict | None, *,
                    resuming: bool) -> None:
  """For a workdir holding a checkpoint (`resuming`: `latest_step` is not None), refuses a
  config whose model, objective or tokenizer settings differ from those it was started with,
  and, unless `data.allow_change` (logged), a tokenizer or documents (`data`:
  `sources.data_identity`, None for fine-tuning) other than those it recorded. A workdir without
  a checkpoint is never refused: nothing in it would be resumed. Reads only."""
  if not resuming:
    return
  saved = read_json(os.path.join(workdir, CONFIG_FILE))
  if saved is None:
    raise ConfigError(f"{workdir} holds checkpoints but no config.json; use a new --workdir (or "
                      f"restore that file).")
  recorded = saved_tokenizer_files(workdir)
  # A workdir from before workdirs held their tokenizer: its tokenizer is its config's path.
  check_config(workdir, saved, config, compare_tokenizer_path=not recorded)
  changes = []
  if recorded and recorded != tokenizer_files(tokenizer):
    changes.append(f"the tokenizer ({sorted(recorded)} in the workdir; "
                   f"tokenizer.model_path={config.tokenizer.model_path!r} given)")
  saved_data = read_json(os.path.join(workdir, DATA_FILE))
  if data is not None and saved_data is not None:
    changes += sources.identity_changes(saved_data, data)
  if not changes:
    return
  if "data" not in config:   # fine-tuning: its data are the task's; its tokenizer the init's
    raise ConfigError(f"{workdir} was fine-tuned with another tokenizer ({'; '.join(changes)}); "
                      f"fine-tune from the same finetune.init to resume it, or use a new "
                      f"--workdir.")
  if not config.data.get("allow_change", False):
    raise ConfigError(f"{workdir} was trained on other data or with another tokenizer than this "
                      f"config gives ({'; '.join(changes)}); resuming would silently continue on "
                      f"them. Pass the original data, or --config.data.allow_change=True to "
                      f"resume anyway (it is logged), or use a new --workdir.")
  logging.warning("data.allow_change=True: resuming %s with %s.", workdir, "; ".join(changes))


def check_config(workdir: str, saved: dict, config, compare_tokenizer_path: bool = False) -> None:
  """Refuses `config` when its model, objective or tokenizer settings differ from `saved` (the
  workdir's config.json), naming each field and, for a pre-training, the flags that restore the
  saved values (a fine-tuning's model comes from its init); the tokenizer's path only with
  `compare_tokenizer_path` (its content is compared where the workdir holds it)."""
  current = json.loads(config.to_json())
  identity = lambda c: _identity(c, compare_tokenizer_path)  # noqa: E731
  defaults = identity(json.loads(config_lib.base_config().to_json()))
  for key, value in _ABSENT_MEANS.items():
    section, field = key.split(".")
    defaults[section] = dict(defaults.get(section) or {}, **{field: value})
  # A distillation's teacher is a `model` section: a field it lacks meant what a model's did.
  defaults["objective"] = dict(defaults.get("objective") or {}, teacher_model=defaults["model"])
  diffs = _diff(identity(saved), identity(current), defaults)
  if "data" not in config:   # a fine-tuning resumes its heads from its checkpoint
    diffs = [d for d in diffs if d[0] not in _FRESH_DRAW_ONLY]
  if diffs:
    changes = "; ".join(f"{key}: {was} → {now!r}" for key, was, now, _ in diffs[:5])
    if len(diffs) > 5:
      changes += f"; and {len(diffs) - 5} more"
    # Flags can restore a field the current config has; a pre-training's set them all, a
    # fine-tuning's only those of _FINETUNE_FLAGS (the rest of its model comes from its init).
    names = ({key: key for key, *_ in diffs} if "data" in config else _FINETUNE_FLAGS)
    flags = [f"--config.{names[key]}={_flag_value(value)}" for key, _, now, value in diffs
             if key in names and _flag_value(value) is not None and now is not None]
    fix = "pass the original settings to resume it"
    if len(flags) == len(diffs) <= 5:
      fix += f" ({' '.join(flags)})"
    raise ConfigError(f"{workdir} holds a run with a different model/objective/tokenizer "
                      f"({changes}). Use a new --workdir, or {fix}.")


# The model fields a fine-tuning sets itself, and the flag that does (finetune/run.py
# model_config): a T5 fine-tuning saved before `0a99431` kept its init's dropout.
_FINETUNE_FLAGS = {"model.dropout": "finetune.dropout"}
# The model fields that only say how a fine-tuning's fresh task heads are drawn: once it has a
# checkpoint they change nothing, so a fine-tuning from a transformers checkpoint started before
# the import set them (`f7baf54`: ELECTRA; `e834a29`: RoBERTa, GPT, XLNet) resumes.
_FRESH_DRAW_ONLY = ("model.weight_init", "model.bare_dense_init")


def _flag_value(value) -> str | None:
  """How a --config override spells a saved scalar (None: no flag can restore it)."""
  if isinstance(value, (bool, int, float)) or (isinstance(value, str) and " " not in value):
    return str(value) or "''"
  return None


def record(workdir: str, config, tokenizer, data: dict | None, *, resuming: bool) -> None:
  """Writes what a resume or a reader needs (process 0): config.json, the tokenizer and data.json.
  Called once setup has succeeded, just before the first step: a fresh start (not `resuming`: no
  checkpoint yet) replaces what a failed start left (its TensorBoard events too); a resume keeps
  the run's config.json and replaces the tokenizer or data record only where `check_resumable`
  let a change through or an older workdir lacks them. Every process returns or raises together:
  the others would otherwise wait for process 0 in the checkpoint manager's first collective."""
  fresh = not resuming
  error = None
  if jax.process_index() == 0:
    try:
      _write_record(workdir, config, tokenizer, data, fresh)
    except ConfigError as e:
      error = e
  if jax.process_count() > 1:
    failed = multihost_utils.process_allgather(np.int32(error is not None))
    if error is None and np.any(failed):
      error = ConfigError(f"Process 0 could not write {workdir}'s record (its error says why).")
  if error is not None:
    raise error


def _write_record(workdir: str, config, tokenizer, data: dict | None, fresh: bool) -> None:
  fileio.makedirs(workdir)
  if fresh:   # what a start that never checkpointed left: its events and its W&B run's id
    fileio.rmtree(os.path.join(workdir, "tensorboard"))
    with contextlib.suppress(FileNotFoundError):
      fileio.remove(os.path.join(workdir, metrics_lib.WANDB_RUN_FILE))
  if fresh or not fileio.exists(os.path.join(workdir, CONFIG_FILE)):
    write_config(workdir, config)
  files = tokenizer_files(tokenizer)
  if fresh or saved_tokenizer_files(workdir) != files:
    for stale in (TOKENIZER_MODEL, TOKENIZER_DIR):
      stale = os.path.join(workdir, stale)
      if fileio.isdir(stale):
        fileio.rmtree(stale, ignore_errors=False)
      elif fileio.exists(stale):
        fileio.remove(stale)
    for name, content in files.items():
      fileio.write_atomically(os.path.join(workdir, name), content)
  if data is not None and (fresh or read_json(os.path.join(workdir, DATA_FILE)) != data):
    fileio.write_atomically(os.path.join(workdir, DATA_FILE),
                             (json.dumps(data, indent=2) + "\n").encode("utf-8"))


def write_config(workdir: str, config) -> None:
  """WORKDIR/config.json, replaced atomically (process 0)."""
  if jax.process_index() == 0:
    fileio.write_atomically(os.path.join(workdir, CONFIG_FILE),
                             config.to_json(indent=2).encode("utf-8"))


def check_or_write_config(workdir: str, config) -> None:
  """`check_config` against an existing config.json, else `write_config`: for writers of a
  workdir that train nothing (`python -m bertfam_jax.hf import`, tests)."""
  path = os.path.join(workdir, CONFIG_FILE)
  saved = read_json(path)
  if saved is None:
    write_config(workdir, config)
  else:
    check_config(workdir, saved, config)


def read_json(path: str):
  """The JSON at `path`, None when there is no file; a damaged one is a ConfigError naming it."""
  if not fileio.exists(path):
    return None
  with fileio.open(path, "rb") as f:
    content = f.read()
  try:
    return json.loads(content)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ConfigError(f"{path} is damaged ({e}); restore it from a copy of the workdir, or use a "
                      f"new --workdir.") from None


def _identity(config_dict: dict, with_tokenizer_path: bool = False) -> dict:
  identity = {k: config_dict.get(k) for k in _IDENTITY_SECTIONS}
  if isinstance(identity["tokenizer"], dict) and not with_tokenizer_path:
    identity["tokenizer"] = {k: v for k, v in identity["tokenizer"].items() if k != "model_path"}
  return identity


def _diff(saved, current, defaults, prefix="") -> list[tuple[str, str, Any, Any]]:
  """(key, the saved value as the message shows it, the current value, the value that restores
  the run's behaviour) for every differing field. A field the saved config lacks was added to
  the codebase after the run started (e.g. ALBERT's `model.share_layers`); it matches while it
  holds the value its absence meant (`defaults`: `config_lib.base_config()` and `_ABSENT_MEANS`),
  the behaviour the run had."""
  if isinstance(saved, dict) and isinstance(current, dict):
    defaults = defaults if isinstance(defaults, dict) else {}
    out = []
    for key in sorted(set(saved) | set(current)):
      if key not in saved and key in defaults:
        if current.get(key) != defaults[key]:
          out.append((f"{prefix}{key}", f"absent ({defaults[key]!r}: the run predates the field)",
                      current.get(key), defaults[key]))
        continue
      out += _diff(saved.get(key), current.get(key), defaults.get(key), f"{prefix}{key}.")
    return out
  return [] if saved == current else [(prefix[:-1], repr(saved), current, saved)]


# ------------------------------------------------------------------------------------- reading


def is_transformers_checkpoint(path: str) -> bool:
  """Whether `path` is a transformers checkpoint directory (its config.json has a model_type)
  rather than a workdir of ours."""
  config_path = os.path.join(path, CONFIG_FILE)
  if not fileio.exists(config_path):
    return False
  with fileio.open(config_path) as f:
    return "model_type" in json.load(f)


def read_config(workdir: str) -> ml_collections.ConfigDict:
  """The run's config.json. Model fields added to the codebase after the run was written hold
  the behaviour the run had: what their absence means (`_ABSENT_MEANS`, e.g. a T5's
  `prefix_lm_buckets`), else their defaults (e.g. `adapter_size`)."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not fileio.exists(path):
    raise ConfigError(f"{workdir} has no config.json, so it is neither a workdir of ours nor a "
                      f"transformers checkpoint; pass the --workdir of a `python -m "
                      f"bertfam_jax.main` run or of `python -m bertfam_jax.hf import`.")
  with fileio.open(path) as f:
    saved = json.load(f)
  model = saved.get("model", {})
  kind = model.get("kind")
  defaults = (config_lib.t5_model("base", model.get("version", "1.0")) if kind == "t5"
              else config_lib.xlnet_model("base") if kind == "xlnet"
              else config_lib.elmo_model("original") if kind == "elmo"
              else config_lib.encoder("base"))
  defaults = defaults.to_dict()
  # A field the defaults hold but the run predates: what its absence meant.
  defaults.update({key[len("model."):]: value for key, value in _ABSENT_MEANS.items()
                   if key.startswith("model.") and key[len("model."):] in defaults})
  saved["model"] = {**defaults, **model}
  return ml_collections.ConfigDict(saved)


def teacher_sections(workdir: str) -> tuple[ml_collections.ConfigDict, ml_collections.ConfigDict]:
  """(model, tokenizer) sections of the run in `workdir`, the tokenizer's `model_path` where the
  workdir keeps it: what a distillation config (configs/distilbert.py, tinybert.py) takes from
  its teacher."""
  saved = read_config(workdir)
  tokenizer = saved.tokenizer
  tokenizer.model_path = tokenizer_location(saved, workdir)
  return saved.model, tokenizer


def tokenizer_location(config, workdir: str, tokenizer_path: str = "") -> str:
  """Where the tokenizer of the run in `workdir` is: `tokenizer_path`, else the copy the workdir
  holds (tokenizer.model, or tokenizer/ for a transformers tokenizer), else, for workdirs written
  before they held one, the run's `tokenizer.model_path` (relative paths are relative to the
  workdir) or the model the run trained and cached on this machine; '' when there is none. For a
  transformers checkpoint directory, that directory."""
  if tokenizer_path:
    return tokenizer_path
  if is_transformers_checkpoint(workdir):
    return fileio.absolute(workdir)
  for own in (TOKENIZER_MODEL, TOKENIZER_DIR):
    if fileio.exists(os.path.join(workdir, own)):
      return fileio.absolute(os.path.join(workdir, own))
  path = config.tokenizer.model_path
  if path and not fileio.is_absolute(path):
    path = os.path.join(workdir, path)
  if path:
    return fileio.absolute(path)
  # Only a pre-training run of ours trains (and caches) its tokenizer; for anything else there
  # is nowhere else to look.
  trained = config.tokenizer.kind == "sentencepiece" and "data" in config
  return fileio.absolute(tokenizers.cache_path(config)) if trained else ""


def load_tokenizer(config, workdir: str, tokenizer_path: str = ""):
  """The tokenizer at `tokenizer_location`: a SentencePiece model file
  (`data.tokenizers.Tokenizer`), or a directory of transformers tokenizer files
  (`data.hf_tokenizer.HFTokenizer`, the same interface)."""
  path = tokenizer_location(config, workdir, tokenizer_path)
  if tokenizer_path and not fileio.exists(path):
    raise ConfigError(f"The tokenizer of {workdir} is not at {path} (the tokenizer_path given); "
                      f"fix tokenizer_path, or leave it empty to use the workdir's own.")
  if not fileio.exists(path):
    raise ConfigError(
        f"The tokenizer of {workdir} is not at {path or 'any place its config names'}: the "
        f"workdir predates workdirs holding their tokenizer, which was cached under "
        f"data.cache_dir or $BERTFAM_CACHE of the machine that pre-trained it. On that machine `python -m bertfam_jax.train_tokenizer --config="
        f"<the run's config> --output={os.path.join(workdir, TOKENIZER_MODEL)}` copies it in.")
  if fileio.isdir(path):
    # Imported here: it needs the `tokenizers` package (the [hf] extra).
    from bertfam_jax.data import hf_tokenizer  # pylint: disable=g-import-not-at-top
    tokenizer = hf_tokenizer.from_dir(path)
  else:
    tokenizer = tokenizers.Tokenizer.from_file(path, config.tokenizer.get("extra_ids", 0),
                                               config.tokenizer.get("normalize", ""))
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
  params = restore_params(path)
  if config.model.get("share_encoder_decoder", False) and "encoder" in params:
    raise ConfigError(f"{path} holds a shared encoder-decoder T5 from before 7990bb5, whose "
                      f"encoder kept its own bucket table and final norm; the model now reads the "
                      f"decoder's (mesh-tf's bi_v1_shared.gin), so pre-train it again.")
  return config, load_tokenizer(config, path, tokenizer_path), params


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
