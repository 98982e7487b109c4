"""HF checkpoints ↔ workdirs (the layouts train.run and finetune.run write).

import_to_workdir(hf_path, workdir) writes
  workdir/config.json      the full config, as train.run writes it (tokenizer.kind 'hf',
                           tokenizer.model_path 'tokenizer', relative to the workdir)
  workdir/checkpoints/0/   TrainState(step 0, the imported params, a fresh optimizer state; no
                           XLNet memory: it restores at zeros) and the data position of a fresh
                           stream, saved by train/checkpoint.py, so `train.init_from=
                           workdir/checkpoints`, resuming the workdir itself,
                           `bertfam_jax.workdir.load(workdir)` and fine-tuning with init=workdir
                           (T5: text-to-text) work
  workdir/tokenizer/       the checkpoint's tokenizer files
  workdir/hf_import.json   source, model_type, architecture, HF config, freshly initialised
                           modules
A fine-tuned checkpoint (a task class) imports as that pre-training workdir: its encoder, fresh
pre-training heads, its task head left out (fine-tuning starts a head of its own).

export_workdir(workdir, hf_path) writes the latest checkpoint as a transformers directory: a
pre-training run as its *ForPreTraining / *ForMaskedLM class (T5ForConditionalGeneration,
XLNetLMHeadModel), a fine-tuning run (finetune.run) as the task class of its kind, e.g.
BertForSequenceClassification with the task's labels (T5 and XLNet have no task classes here).
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import ml_collections
from absl import logging

from bertfam_jax import fileio, objectives
from bertfam_jax import workdir as workdir_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.finetune import tasks
from bertfam_jax.hf import families, io
from bertfam_jax.data import hf_tokenizer as tokenizer_lib
from bertfam_jax.train import checkpoint as checkpoint_lib
from bertfam_jax.train import step as step_lib

TOKENIZER_DIR = "tokenizer"
IMPORT_RECORD = "hf_import.json"
# A fresh pipeline's position (data/pipeline.py Pipeline.state() before the first batch).
DATA_START = dict(epoch=0, chunk=0, offset=0)


def import_to_workdir(hf_path: str, workdir: str, generator_path: str | None = None
                      ) -> io.HFModel:
  """Writes the transformers checkpoint at `hf_path` as a pre-training workdir (module
  docstring); `generator_path`: an ELECTRA generator checkpoint for a discriminator's generator
  (freshly initialised without one). Returns the imported model."""
  io.check_empty_target(workdir)
  m = io.from_pretrained(hf_path, generator_path, task_head=False)
  config = ml_collections.ConfigDict(m.config.to_dict())
  config.tokenizer.model_path = TOKENIZER_DIR if m.tokenizer is not None else ""
  objectives.validate(config)
  fileio.makedirs(workdir)
  workdir_lib.check_or_write_config(workdir, config)
  if m.tokenizer is not None:
    m.tokenizer.save(os.path.join(workdir, TOKENIZER_DIR))
  save_initial_checkpoint(config, m.params, os.path.join(workdir, "checkpoints"))
  record = dict(source=fileio.absolute(hf_path), model_type=m.hf_config["model_type"],
                architecture=m.architecture, hf_config=m.hf_config,
                freshly_initialised=list(m.fresh), **m.notes)
  with fileio.open(os.path.join(workdir, IMPORT_RECORD), "w") as f:
    json.dump(record, f, indent=2)
  return m


def save_initial_checkpoint(config, params, directory: str) -> None:
  """TrainState(step 0, params, tx.init(params)) as train.run's Checkpointer saves it; no carry
  (XLNet's memory restores from it at zeros, a fresh stream's, at any train.batch_size)."""
  objective = objectives.get(config.objective.name)
  tx, _ = step_lib.make_optimizer(config, objective.build_model(config),
                                  objectives.init_inputs(objective, config))
  variables = jax.tree.map(jnp.asarray, {"params": params})
  state = step_lib.TrainState(step=jnp.zeros([], jnp.int32), params=variables,
                              opt_state=jax.jit(tx.init)(variables))
  checkpointer = checkpoint_lib.Checkpointer(directory, config.train.keep_checkpoints)
  try:
    checkpointer.save(0, state, DATA_START)
  finally:
    checkpointer.close()


def run_family(config) -> families.Family:
  """The HF family of one of our runs' model: T5's or XLNet's for those models, GPT-2's for a
  pre-LN causal LM and OpenAI GPT's for a post-LN one, ELECTRA's for an ELECTRA objective (its
  discriminator), else ALBERT's with every layer shared, BERT's with none."""
  if config.model.get("kind") in families.FAMILIES:
    return families.get(config.model.kind)
  if config.objective.name == "causal_lm":
    return families.get("gpt2" if config.model.pre_layer_norm else "openai-gpt")
  if config.objective.name == "electra":
    return families.get("electra")
  if config.model.share_layers not in ("none", "all"):
    raise ConfigError(f"model.share_layers={config.model.share_layers!r} has no HF class (BERT "
                      "shares nothing, ALBERT everything).")
  return families.get("albert" if config.model.share_layers == "all" else "bert")


def run_architecture(config) -> tuple[families.Family, families.Architecture]:
  """The HF family and class of one of our pre-training runs: T5 → T5ForConditionalGeneration,
  XLNet → XLNetLMHeadModel; GPT → GPT2LMHeadModel (pre-LN) or OpenAIGPTLMHeadModel; ELECTRA (detection head) → ElectraForPreTraining; masked LM with
  every layer shared → ALBERT, else BERT; with NSP / SOP the *ForPreTraining class, without the
  *ForMaskedLM one."""
  o = config.objective
  if config.model.get("kind") in families.FAMILIES or o.name == "causal_lm":
    family = run_family(config)
    return family, family.architectures[0]
  if o.name == "electra":
    if o.variant not in ("electra", "electra_15"):
      raise ConfigError(f"objective.variant={o.variant!r} has no detection head; HF's "
                        "ElectraForPreTraining holds ELECTRA's (variant electra / electra_15).")
    family = run_family(config)
    return family, family.architecture("ElectraForPreTraining")
  if o.name != "mlm" or o.sentence_task not in ("", "nsp", "sop"):
    raise ConfigError(f"objective {o.name!r} with sentence_task {o.get('sentence_task')!r} has no "
                      "HF class; export handles masked LM (+ NSP / SOP) and ELECTRA runs.")
  family = run_family(config)
  return family, family.architectures[0 if o.sentence_task else -1]


def hf_source(path: str) -> dict:
  """What a run knows of the HF checkpoint it descends from, {model_type, hf_config, ...}, or {}
  for runs of ours. `path`: a transformers directory (itself), a workdir with an hf_import.json
  (import_to_workdir's record), or a fine-tuning run's workdir (its init's, followed back)."""
  if workdir_lib.is_transformers_checkpoint(path):
    hf_config = io.read_hf_config(path)
    return dict(model_type=hf_config["model_type"], hf_config=hf_config)
  record_path = os.path.join(path, IMPORT_RECORD)
  if fileio.exists(record_path):
    with fileio.open(record_path) as f:
      return json.load(f)
  config = workdir_lib.read_config(path)
  if "finetune" not in config:
    return {}
  init = config.finetune.init
  if fileio.isdir(init):
    return hf_source(init)
  if config.tokenizer.kind == "hf":
    raise ConfigError(f"{path} was fine-tuned from finetune.init={init!r}, an imported HF "
                      "checkpoint that is not there (relative paths are read from the current "
                      "directory); its HF family and config.json come from it, so run the "
                      "export where that path leads to it.")
  return {}


def _run_tokenizer(config, workdir: str):
  """The run's tokenizer (the workdir's own, `bertfam_jax.workdir.tokenizer_location`) as an
  HFTokenizer, or None (with a warning) when it cannot be found."""
  path = workdir_lib.tokenizer_location(config, workdir)
  if fileio.isdir(path):
    return tokenizer_lib.from_dir(path)
  if not fileio.exists(path):
    logging.warning("The tokenizer of %s is not at %s; exporting the weights without it.",
                    workdir, path)
    return None
  with fileio.open(path, "rb") as f:
    try:
      return tokenizer_lib.from_files(tokenizer_lib.sentencepiece_files(
          f.read(), config.tokenizer.get("extra_ids", 0), config.tokenizer.get("normalize", "")))
    except ConfigError as e:
      logging.warning("Exporting the weights of %s without its tokenizer: %s", workdir, e)
      return None


def _task_class(config, source: dict) -> tuple[families.Architecture, dict, str, int]:
  """(task class, HF config fields, kind, num_outputs) of a fine-tuning run; a ConfigError for
  what no HF task class holds."""
  ft = config.finetune
  if ft.features != "last":
    raise ConfigError(f"finetune.features={ft.features!r}: HF's task classes read the last "
                      "layer, and the learned mix of every layer ('scalar_mix') has no "
                      "counterpart there, so this run cannot be exported; fine-tune with "
                      "features='last' to export.")
  family = families.get(source["model_type"]) if source else run_family(config)
  if not family.tasks:
    raise ConfigError(f"hf/ maps no fine-tuned {family.model_type} classes (T5's text-to-text "
                      "and XLNet's task runs), so this fine-tuning run cannot be exported; "
                      "export the pre-training workdir it started from.")
  task = tasks.get(ft.task)
  if task.kind == "extractive_qa" and ft.get("qa_head") == "joint":
    raise ConfigError("finetune.qa_head='joint' (ELECTRA's QA head: the end given the start, and "
                      "an answerable classifier) has no transformers class, whose QA head is "
                      "run_squad.py's, so this run cannot be exported; fine-tune with "
                      "--config.finetune.qa_head=independent to export.")
  arch = family.task_architecture(task.kind)
  families.check_exportable(arch, config.model)
  hf_config = {**source.get("hf_config", dict(model_type=family.model_type)),
               **families.task_config(task.kind, task.num_outputs, task.label_names)}
  return arch, hf_config, task.kind, task.num_outputs


def export_workdir(workdir: str, hf_path: str) -> io.HFModel:
  """Writes the latest checkpoint of `workdir` as a transformers checkpoint directory at
  `hf_path`, in the HF family of the checkpoint the run descends from (`hf_source`, keeping its
  config fields) or of our run (`run_family`), with the run's tokenizer (ours, SentencePiece, as
  an AlbertTokenizer).

  A pre-training run: its *ForPreTraining / *ForMaskedLM class (an imported workdir: its own;
  ELECTRA: the discriminator, its generator in hf_path/generator; an imported ELECTRA generator
  that was freshly initialised and never trained is left out). A fine-tuning run: the task class
  of its kind with the task's labels (families.task_config); ConfigError for ELECTRA sequence
  classification / regression (HF's head applies GELU, ours tanh), adapters and
  features='weighted_sum', which no HF class holds. Returns the exported model."""
  io.check_empty_target(hf_path)
  config = workdir_lib.read_config(workdir)
  source = hf_source(workdir)
  fresh, kind, num_outputs = (), "", 0
  if "finetune" in config:
    arch, hf_config, kind, num_outputs = _task_class(config, source)
  elif source:
    family = families.get(source["model_type"])
    arch, hf_config = family.architecture(source["architecture"]), source["hf_config"]
    # Modules freshly initialised at import stay unexported until training has updated them.
    if workdir_lib.latest_step(workdir) == 0:
      fresh = tuple(source.get("freshly_initialised", ()))
  else:
    family, arch = run_architecture(config)
    hf_config = dict(model_type=family.model_type)
  params = workdir_lib.restore_params(workdir)
  m = io.HFModel(config, params, _run_tokenizer(config, workdir), hf_config, arch.name, fresh,
                 kind=kind, num_outputs=num_outputs)
  io.save_pretrained(m, hf_path)
  return m
