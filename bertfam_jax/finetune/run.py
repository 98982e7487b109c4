"""The fine-tuning run behind `python -m bertfam_jax.main --config=configs/finetune.py:task=NAME,
init=PATH --workdir=W`: one task, one pre-trained encoder, one head.

  init      a pre-training workdir of ours, one written by `python -m bertfam_jax.hf import`, or a
            transformers checkpoint directory (imported in memory)
  task      `finetune/tasks.py` (raw examples) → `finetune/features.py` (arrays) →
            `models/finetune.py` (encoder + the task's head) → `finetune/losses.py`
  optimizer `finetune/optim.py`: BERT's AdamW, warmup + linear decay, layer-wise decay, frozen
            layers, adapters

Training is the one train loop's (`train/loop.py`) through `finetune/recipe.py`: the sharded
step, the stop at a non-finite loss, checkpoints after every epoch and at a preemption notice
(SIGTERM), exact resume (batches are a pure function of seed and step). After every epoch the
evaluation split is predicted and scored; the workdir gets

  config.json          the resolved config (the encoder's `model` and `tokenizer` included)
  metrics.jsonl        training records every `train.log_every` steps and eval_* per epoch
  eval_results.json    the last evaluation: task, split, step, examples, scores, trained fraction
  predictions.jsonl    one line per evaluation example: its id / index, prediction and gold label
  checkpoints/<step>/  the fine-tuned state (latest `train.keep_checkpoints`)

A T5 `init` is fine-tuned text-to-text by `finetune/seq2seq.py` (a `Recipe` of its model,
optimizer and loss, and its decoding as the score), a UniLM `init` on a text task by
`finetune/unilm_seq2seq.py` (its seq2seq mask). `fine_tune` is the same run in memory, with
no workdir: the experiments' fine-tuning.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from typing import Any, Callable, Sequence

import flax.linen as nn
from flax import traverse_util
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bertfam_jax import config_lib, fileio
from bertfam_jax import workdir as workdir_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.finetune import distill, features, optim, quantize, recipe as recipe_lib
from bertfam_jax.finetune import seq2seq, tasks
from bertfam_jax.finetune import text_tasks, unilm_seq2seq
from bertfam_jax.finetune import losses as finetune_losses
from bertfam_jax.models import finetune as finetune_models
from bertfam_jax.train import metrics as train_metrics
from bertfam_jax.train import sharding as sharding_lib
from bertfam_jax.train import train as train_lib

INPUT_KEYS = ("input_ids", "input_mask", "segment_ids")
LABEL_KEYS = ("label", "labels", "label_weights", "start_position", "end_position",
              "is_impossible")


# ------------------------------------------------------------------------------------ the encoder


def model_config(init_model: ml_collections.ConfigDict, ft) -> ml_collections.ConfigDict:
  """The pre-trained `model` section with the fine-tuning changes: `model.dropout` from
  `finetune.dropout` (T5: every dropout; an encoder's attention_dropout stays its own); adapters
  when `method='adapters'`; Q, K and V projected one by one when quantizing (the fused matmul would
  bypass the projections quantize.py intercepts; the same values either way), and no FP8 matmuls
  then (Q8BERT's int8 fake quantization replaces those matmuls)."""
  m = ml_collections.ConfigDict(init_model.to_dict())
  if ft.dropout is not None:
    m.dropout = ft.dropout
  if ft.method == "adapters":
    m.adapter_size = ft.adapter_size
  if ft.get("quantize"):
    for field in ("fused_qkv", "fp8_matmuls"):
      if m.get(field):
        m[field] = False
  return m


def transfer_pretrained(fresh, pretrained, *, reuse_pooler: bool):
  """The fresh fine-tuning parameters with every pre-trained encoder leaf copied in.

  Args:
    fresh: {'encoder', <head>, ['scalar_mix']} of the fine-tuning model.
    pretrained: the pre-trained run's parameters ({'encoder', 'mlm_head', ['sentence_head']...}).
    reuse_pooler: copy the pre-trained pooler (`sentence_head/pooler`, BERT's NSP pooler) into
      the head's pooler, as run_classifier.py and HF's *ForSequenceClassification do.

  Leaves the fresh encoder has and the pre-trained one lacks must be adapters (added for
  fine-tuning); any other difference is a ConfigError.
  """
  flat_fresh = traverse_util.flatten_dict(fresh["encoder"], sep="/")
  flat_given = traverse_util.flatten_dict(pretrained["encoder"], sep="/")
  unexpected = sorted(set(flat_given) - set(flat_fresh))
  missing = sorted(k for k in set(flat_fresh) - set(flat_given) if "adapter" not in k)
  wrong = sorted(k for k in set(flat_fresh) & set(flat_given)
                 if np.shape(flat_fresh[k]) != np.shape(flat_given[k]))
  if unexpected or missing or wrong:
    detail = "; ".join(f"{name}: {keys[:3]}" for name, keys in
                       (("unexpected", unexpected), ("missing", missing), ("shape", wrong)) if keys)
    raise ConfigError(f"The pre-trained encoder does not fit the fine-tuning model ({detail}); "
                      f"the model section comes from `finetune.init`, do not override it.")
  merged = dict(fresh)
  merged["encoder"] = traverse_util.unflatten_dict(
      {k: jnp.asarray(flat_given.get(k, v), dtype=v.dtype) for k, v in flat_fresh.items()},
      sep="/")
  pooler = pretrained.get("sentence_head", {}).get("pooler")
  for head in ("classification_head", "choice_head"):
    if reuse_pooler and pooler is not None and "pooler" in merged.get(head, {}):
      merged[head] = dict(merged[head], pooler=jax.tree.map(jnp.asarray, pooler))
  return merged


def with_fresh_token_rows(transfer, token_ids: Sequence[int]):
  """`transfer`, then the rows `token_ids` of the word table from the fresh initialisation: GPT's
  fine-tuning tokens ([start], [delim], [extract]: our cls, sep and mask ids) as the new
  embeddings finetune-transformer-lm train.py appends (N(0, 0.02)), not the pre-trained rows,
  which the tied softmax trained as never-correct classes and the decay shrank."""
  rows = np.asarray(token_ids)

  def apply(fresh):
    params = transfer(fresh)
    table = params["encoder"]["word_embeddings"]["embedding"]
    fresh_rows = fresh["encoder"]["word_embeddings"]["embedding"][rows]
    word_embeddings = dict(params["encoder"]["word_embeddings"],
                           embedding=table.at[rows].set(fresh_rows))
    return dict(params, encoder=dict(params["encoder"], word_embeddings=word_embeddings))
  return apply


# ------------------------------------------------------------------------------------------- run


def check_workdir(workdir: str, task: str, qa_head: str = "") -> bool:
  """`workdir.check_writable`, then refuses, before anything in it is read or written, a workdir
  whose checkpoints belong to another run than a fine-tuning on `task` (a pre-training run, or a
  fine-tuning on another task), or, given the `qa_head` of an extractive QA run, with another
  one (a run saved before the field was recorded had run_squad.py's): they would otherwise be
  resumed as this run's. Returns whether the workdir holds a checkpoint (read once, on every
  process: orbax's reader syncs them)."""
  workdir_lib.check_writable(workdir)
  path = os.path.join(workdir, workdir_lib.CONFIG_FILE)
  resuming = workdir_lib.latest_step(workdir) is not None
  # Without a checkpoint its files are a failed start's, which this run replaces.
  if not resuming or not fileio.exists(path):
    return resuming
  saved_finetune = workdir_lib.read_json(path).get("finetune", {})
  saved = saved_finetune.get("task")
  if saved != task:
    held = f"a fine-tuning on {saved!r}" if saved else "a pre-training run"
    raise ConfigError(f"--workdir={workdir} holds {held}, not a fine-tuning on {task!r}, and "
                      f"is left untouched; use a new --workdir.")
  saved_head = saved_finetune.get("qa_head") or "independent"
  if qa_head and saved_head != qa_head:
    raise ConfigError(f"--workdir={workdir} was fine-tuned with finetune.qa_head="
                      f"{saved_head!r}, not {qa_head!r}; pass --config.finetune.qa_head="
                      f"{saved_head} to resume it, or use a new --workdir.")
  return resuming


def check_batches(config, mesh) -> None:
  """`train.check_batch` for the training batches, and the same divisibility for the evaluation
  batches (`train.eval_batch_size`), which are split over the mesh's batch axes too."""
  train_lib.check_batch(config, mesh)
  eval_batch, dp = config.train.eval_batch_size, sharding_lib.data_parallel_size(mesh)
  multiple = math.lcm(dp, jax.process_count())
  if eval_batch % multiple:
    raise ConfigError(f"train.eval_batch_size={eval_batch} is not divisible by the data-parallel "
                      f"size {dp} (mesh data×fsdp) and the {jax.process_count()} processes; use a "
                      f"multiple of {multiple}.")


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Fine-tunes and evaluates `config.finetune` in `workdir` (the module docstring); returns the
  last eval_results. Nothing in `workdir` is touched before the config is known to run."""
  ft = config.finetune
  if ft.task not in tasks.TASKS and ft.task not in text_tasks.TASKS:
    raise ConfigError(f"Unknown task {ft.task!r} (finetune.task); choose one of "
                      f"{sorted(tasks.TASKS)} (encoders) or {sorted(text_tasks.TASKS)} (T5s, UniLM).")
  if not ft.init:
    raise ConfigError("finetune.init is empty: pass the pre-trained model, "
                      "--config=configs/finetune.py:task=NAME,init=PATH (a workdir of ours, one "
                      "from `python -m bertfam_jax.hf import`, or a transformers checkpoint dir).")
  if not fileio.isdir(ft.init):
    raise ConfigError(f"finetune.init={ft.init!r} is not a directory; pass a pre-training workdir "
                      f"or a transformers checkpoint directory.")
  init_config, tokenizer, pretrained = load_init(ft.init)
  resolved = resolved_config(config, init_config,
                             tokenizer_path=workdir_lib.tokenizer_location(init_config, ft.init))
  qa = ft.task in tasks.TASKS and tasks.get(ft.task).kind == "extractive_qa"
  resuming = check_workdir(workdir, ft.task, resolved.finetune.qa_head if qa else "")
  workdir_lib.check_resumable(workdir, resolved, tokenizer, None, resuming=resuming)
  mesh = sharding_lib.make_mesh(config.mesh)
  check_batches(resolved, mesh)
  recipe = make_recipe(resolved, tokenizer, None if ft.from_scratch else pretrained, mesh)
  workdir_lib.record(workdir, resolved, tokenizer, None, resuming=resuming)
  _keep_hf_source(ft.init, init_config, workdir)
  results = recipe_lib.train_and_evaluate(resolved, recipe, mesh, workdir)
  return {k: v for k, v in results.items() if k != "predictions"}


def load_init(path: str) -> tuple[ml_collections.ConfigDict, Any, Any]:
  """(config, tokenizer, params) of `finetune.init`: a workdir of ours (`bertfam_jax.workdir`)
  or a transformers checkpoint directory, imported in memory (its encoder; heads start fresh)."""
  if not workdir_lib.is_transformers_checkpoint(path):
    return workdir_lib.load(path)
  from bertfam_jax.hf import io as hf_io  # pylint: disable=g-import-not-at-top  (the [hf] extra)
  imported = hf_io.from_pretrained(path, task_head=False)
  if imported.tokenizer is None:
    raise ConfigError(f"{path} holds no tokenizer files (tokenizer.json, vocab.txt, vocab.json + "
                      f"merges.txt or spiece.model); copy the checkpoint's tokenizer into it.")
  return imported.config, imported.tokenizer, jax.device_get(imported.params)


def fine_tune(config: ml_collections.ConfigDict, tokenizer, params, *, mesh=None
              ) -> dict[str, Any]:
  """`run` in memory: fine-tunes `params` (the pre-trained run's tree, or None to train from
  scratch) with the resolved `config` (`resolved_config`) on every device, data-parallel, unless
  given a mesh; nothing is written. Returns the evaluation's results (task, split, examples,
  main_metric, scores, predictions, step, ...); deterministic given config.seed and the mesh."""
  unresolved = [f"{section}.{key}" for section in ("finetune", "optimizer", "train")
                for key, value in config[section].items() if value is None]
  if unresolved or "model" not in config:
    missing = ", ".join(unresolved) or "the model section"
    raise ConfigError(f"fine_tune needs the config `resolved_config` returns ({missing} unset); "
                      f"pass resolved_config(config, init_config).")
  mesh = sharding_lib.make_mesh(config.mesh) if mesh is None else mesh
  check_batches(config, mesh)
  params = None if config.finetune.from_scratch else params
  return recipe_lib.train_and_evaluate(config, make_recipe(config, tokenizer, params, mesh), mesh)


def make_recipe(config, tokenizer, params, mesh) -> recipe_lib.Recipe:
  """The `Recipe` of a resolved config: text-to-text for a T5 (`seq2seq.make_recipe`), else the
  task's head on the encoder (`encoder_recipe`)."""
  seq2seq_run = config.model.get("kind") == "t5" or text_to_text(config.finetune.task, config)
  if seq2seq_run and (config.finetune.get("quantize") or config.finetune.get("teacher")):
    raise ConfigError("finetune.quantize and finetune.teacher apply to encoder tasks (a head on "
                      "a BERT-family encoder); a text-to-text fine-tuning takes neither: set "
                      "them to ''.")
  if config.model.get("kind") == "t5":
    return seq2seq.make_recipe(config, tokenizer, params, mesh)
  if text_to_text(config.finetune.task, config):
    return unilm_seq2seq.make_recipe(config, tokenizer, params, mesh)
  return encoder_recipe(config, tokenizer, params, mesh)


def text_to_text(task: str, init_config) -> bool:
  """Whether `task` runs text-to-text for this pre-trained run: any task for a T5, a text task
  (`finetune.text_tasks`) for a UniLM (its seq2seq mask), never for the other encoders."""
  if init_config.model.get("kind") == "t5":
    return True
  return init_config.objective.name == "unilm" and task in text_tasks.TASKS


def encoder_recipe(config, tokenizer, params, mesh) -> recipe_lib.Recipe:
  """The task's data, the encoder with the task's head (`models/finetune.py`), the fine-tuning
  optimizer (`finetune/optim.py`) and the task's loss and scores. `params`: the pre-trained
  run's tree ({'encoder', heads...}; an XLNet's whole model) or None."""
  ft = config.finetune
  task = tasks.get(ft.task)
  if config.model.get("kind") == "xlnet":
    if ft.method == "adapters":
      raise ConfigError("Adapters are built into the BERT-family encoder only; fine-tune XLNet "
                        "with --config.finetune.method=full.")
    # The XLNet module is the whole pre-trained model: all but the output bias is the backbone
    # (its mask_emb, the query stream's start, is kept and unused).
    params = None if params is None else {
        "encoder": {k: v for k, v in params.items() if k != "lm_loss"}}
  check_gpt_fields(ft, task, finetune_models.backbone_for(config.model))
  if ft.max_seq_len > config.model.get("max_positions", ft.max_seq_len):
    raise ConfigError(f"finetune.max_seq_len={ft.max_seq_len} exceeds the encoder's "
                      f"max_positions={config.model.max_positions}; pass "
                      f"--config.finetune.max_seq_len={config.model.max_positions} or less.")
  start = time.time()
  load = lambda split, limit: task.load(split, data_dir=ft.data_dir,  # noqa: E731
                                        max_examples=limit or None)
  train_examples = load(ft.train_split or task.train_split, ft.max_train_examples)
  eval_examples = load(ft.eval_split or task.eval_split, ft.max_eval_examples)
  train_data = featurize(task, tokenizer, train_examples, config, training=True)
  eval_data = featurize(task, tokenizer, eval_examples, config, training=False)
  num_train = len(train_data["input_ids"])
  batch_size = config.train.batch_size
  if num_train < batch_size:
    raise ConfigError(f"{ft.task} has {num_train} training rows, fewer than train.batch_size="
                      f"{batch_size}; lower the batch size or raise finetune.max_train_examples.")
  total_steps = config.train.total_steps or max(1, int(num_train / batch_size * ft.epochs))
  train_metrics.print_progress(
      f"{ft.task} ({task.kind}): {len(train_examples)} train examples → {num_train} rows, "
      f"{len(eval_examples)} {ft.eval_split or task.eval_split} examples; {total_steps} steps of "
      f"{batch_size}; mesh {dict(mesh.shape)}; data ready in {time.time() - start:.1f} s.")

  model, example = build_model(config)
  check_joint_qa(config, task)
  loss_fn = _make_loss_fn(task.kind, ft.get("lm_coef", 0.0),
                          gold_starts=task.kind == "extractive_qa" and model.qa_head == "joint")
  transfer = None if params is None else functools.partial(
      transfer_pretrained, pretrained=params, reuse_pooler=ft.reuse_pooler)
  if transfer and finetune_models.backbone_for(config.model) == "causal":
    transfer = with_fresh_token_rows(
        transfer, (tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id))
  constants = {}
  if ft.get("teacher"):   # TinyBERT's task-specific distillation (finetune/distill.py)
    teacher_config, teacher_params = distill.load_teacher(config, task.kind)
    model = distill.build_model(model, teacher_config)
    loss_fn = distill.make_loss_fn(task.kind, ft.distill, ft.distill_temperature,
                                   distill.layer_map(config, teacher_config), config.model.layers,
                                   teacher_config.model.layers)
    transfer = transfer and distill.with_fit_dense(transfer, params)
    constants = distill.teacher_variables(teacher_params)
  quantize.check(config, finetune_models.backbone_for(config.model))
  predict_quant = "none"
  if ft.quantize:   # Q8BERT (finetune/quantize.py): evaluated through the int8 path
    model, predict_quant = quantize.wrap(model, ft), "int8"
    if ft.quantize == "qat":
      loss_fn = quantize.qat_loss_fn(task.kind)
  loss_fn = with_mix_penalty(loss_fn, ft.get("mix_l2", 0.0))
  shapes = {"params": _abstract_params(model, example)["params"]}
  tx, schedule = optim.make_finetune_optimizer(config, shapes, total_steps)
  fraction = optim.trainable_fraction(ft, config.model, shapes)
  train_metrics.print_progress(f"method {ft.method}: {100 * fraction:.2f}% of the parameters "
                               f"are trained.")

  def predict(variables, inputs):
    quant = {} if predict_quant == "none" else {"quant": predict_quant}
    return model.apply(variables, *(inputs[k] for k in INPUT_KEYS), deterministic=True, **quant)

  return recipe_lib.Recipe(
      model=model, example=example, tx=tx, schedule=schedule,
      loss_fn=loss_fn, transfer=transfer, constants=constants,
      mutable=(quantize.RANGES,) if ft.quantize == "qat" else (),
      train_data=train_data, total_steps=total_steps, steps_per_epoch=num_train // batch_size,
      tokens_per_row=ft.max_seq_len,
      make_predict=lambda shardings: recipe_lib.sharded_predict(predict, shardings.params, mesh),
      score=functools.partial(evaluate, task, eval_data=eval_data, eval_examples=eval_examples,
                              tokenizer=tokenizer, config=config, mesh=mesh),
      extra=dict(trained_fraction=fraction))


def check_gpt_fields(ft, task, backbone: str) -> None:
  """GPT's fields belong to a causal backbone, which fine-tunes the sequence-level kinds, and
  pair_orders=2 (similarity) to a pair classification or regression task."""
  if backbone != "causal":
    if ft.lm_coef or ft.pair_orders != 1:
      raise ConfigError(f"finetune.lm_coef={ft.lm_coef} and pair_orders={ft.pair_orders} are "
                        "GPT's (a causal_lm init); set --config.finetune.lm_coef=0 and "
                        "--config.finetune.pair_orders=1.")
    return
  if task.kind not in finetune_models.SEQUENCE_KINDS:
    raise ConfigError(f"A GPT fine-tunes {', '.join(finetune_models.SEQUENCE_KINDS)} tasks (its "
                      f"input transformations); {ft.task} is {task.kind}.")
  if ft.pair_orders == 2 and task.kind == "multiple_choice":
    raise ConfigError("finetune.pair_orders=2 is GPT's similarity input for pair "
                      "classification or regression, not multiple choice; set it to 1.")


def check_joint_qa(config, task) -> None:
  """ELECTRA's joint QA head reads the answer mask from the segment ids (the context is segment
  1) and needs the gold starts in its forward pass, which the distillation and quantization
  losses do not pass."""
  ft = config.finetune
  if task.kind != "extractive_qa" or ft.qa_head != "joint":
    return
  if config.model.get("type_vocab_size", 2) < 2:
    raise ConfigError(f"finetune.qa_head='joint' finds the context by its segment ids, and this "
                      f"encoder has type_vocab_size={config.model.type_vocab_size} (none); set "
                      f"--config.finetune.qa_head=independent.")
  if ft.get("teacher") or ft.get("quantize"):
    raise ConfigError("finetune.qa_head='joint' is not combined with finetune.teacher or "
                      "finetune.quantize; set --config.finetune.qa_head=independent for them.")


def featurize(task, tokenizer, examples, config, training: bool) -> dict[str, np.ndarray]:
  """`features.featurize`, then every array the train step does not read dropped from training
  data, and the segment ids zeroed for encoders with one token type (RoBERTa: its pairs are
  `<s> A </s></s> B </s>`, all type 0)."""
  backbone = finetune_models.backbone_for(config.model)
  layout = {"xlnet": "xlnet", "causal": "gpt"}.get(backbone, "bert")
  data = features.featurize(task, tokenizer, examples, config.finetune, training, layout)
  if config.model.get("type_vocab_size", 2) <= 1:  # XLNet's relative segments: A vs B matters
    data["segment_ids"] = np.zeros_like(data["segment_ids"])
  if training:
    data = {k: v for k, v in data.items() if k in INPUT_KEYS + LABEL_KEYS}
  return data


def _keep_hf_source(init: str, init_config, workdir: str) -> None:
  """A run of an imported or transformers checkpoint keeps that checkpoint's record (family and
  config.json, `hf.workdir.hf_source`) in its workdir, so that exporting it does not depend on
  `init` staying where it is."""
  if init_config.tokenizer.kind != "hf" or jax.process_index() != 0:
    return
  from bertfam_jax.hf import workdir as hf_workdir  # pylint: disable=g-import-not-at-top
  record = hf_workdir.hf_source(init)
  if record:
    fileio.write_atomically(os.path.join(workdir, hf_workdir.IMPORT_RECORD),
                            json.dumps(record, indent=2).encode("utf-8"))


def resolved_config(config, init_config, *, tokenizer_path: str = ""
                    ) -> ml_collections.ConfigDict:
  """The fine-tuning config with the defaults of its recipe filled in (an encoder's task head or
  a T5's text-to-text, as `init_config` says; `config_lib.resolve_finetune`) and the pre-trained
  run's model, tokenizer and objective sections, as written to config.json; `tokenizer_path`:
  where the tokenizer is (absolute), recorded as tokenizer.model_path."""
  if init_config.model.get("kind") == "elmo":
    raise ConfigError(f"finetune.init={config.finetune.init!r} is an ELMo biLM, which takes no "
                      f"task head here; use its layers as features (python -m "
                      f"bertfam_jax.represent, or the probe of experiments/representations.py), "
                      f"or fine-tune a BERT-family, XLNet, GPT or T5 workdir.")
  seq2seq_run = text_to_text(config.finetune.task, init_config)
  task_kind = "" if seq2seq_run else tasks.get(config.finetune.task).kind
  recipe = config_lib.finetune_recipe(seq2seq_run, task_kind, init_config.objective.name,
                                      init_config.objective.get("mask_style", ""))
  resolved = config_lib.resolve_finetune(config, recipe, hidden=init_config.model.hidden,
                                         dropout=init_config.model.dropout)
  resolved.model = model_config(init_config.model, resolved.finetune)
  resolved.tokenizer = ml_collections.ConfigDict(init_config.tokenizer.to_dict())
  if tokenizer_path:
    resolved.tokenizer.model_path = tokenizer_path
  resolved.objective = ml_collections.ConfigDict(init_config.objective.to_dict())
  return resolved


def build_model(config) -> tuple[finetune_models.FineTuneModel, dict[str, np.ndarray]]:
  """The fine-tuning model of a resolved config and inputs that trace its `init` ([1, 8] rows;
  [1, 2, 8] for multiple choice): parameter shapes depend on neither length."""
  task = tasks.get(config.finetune.task)
  model = finetune_models.FineTuneModel(
      ml_collections.FrozenConfigDict(config.model), task.kind, task.num_outputs,
      features=config.finetune.features, backbone=finetune_models.backbone_for(config.model),
      orders=config.finetune.get("pair_orders", 1),
      mix_layer_norm=config.finetune.get("mix_layer_norm", False),
      qa_head=config.finetune.get("qa_head") or "independent", qa_beam=config.finetune.n_best,
      head_dropout=config.finetune.get("head_dropout"),
      head_init=config.finetune.get("head_init") or "model")
  folded = task.kind == "multiple_choice" or config.finetune.get("pair_orders", 1) == 2
  shape = (1, 2, 8) if folded else (1, 8)
  example = dict(input_ids=np.zeros(shape, np.int32), input_mask=np.ones(shape, np.int32),
                 segment_ids=np.zeros(shape, np.int32))
  return model, example


def _abstract_params(model, example):
  rng = jax.random.key(0)
  boxed = jax.eval_shape(lambda: model.init({"params": rng}, *(example[k] for k in INPUT_KEYS),
                                            deterministic=True))
  return nn.meta.unbox(boxed)


def _make_loss_fn(kind: str, lm_coef: float = 0.0, gold_starts: bool = False) -> Callable:
  """The task's loss (`finetune.losses`); with `lm_coef` > 0 (GPT) plus lm_coef × the auxiliary
  LM loss as finetune-transformer-lm's train.py computes it: each input row's mean next-token
  cross-entropy over its real tokens, averaged over the rows (every choice a row), logged as
  lm_loss. `gold_starts`: the model takes the batch's start_position (the joint QA head)."""

  def loss_fn(model, params, batch, rng, config, *, deterministic=False):
    del config
    inputs = [batch[k] for k in INPUT_KEYS]
    if not lm_coef:
      starts = dict(start_positions=batch["start_position"]) if gold_starts else {}
      outputs = model.apply(params, *inputs, deterministic=deterministic, rngs={"dropout": rng},
                            **starts)
      return finetune_losses.task_loss(kind, outputs, batch)
    outputs, lm_logits = model.apply(params, *inputs, deterministic=deterministic,
                                     rngs={"dropout": rng}, with_lm=True)
    loss, metrics = finetune_losses.task_loss(kind, outputs, batch)
    ids, mask = batch["input_ids"], batch["input_mask"]
    logits_RLV = lm_logits.reshape((-1,) + lm_logits.shape[-2:])[:, :-1]
    targets_RL = ids.reshape(-1, ids.shape[-1])[:, 1:]
    weights_RL = mask.reshape(-1, mask.shape[-1])[:, 1:].astype(jnp.float32)
    per_token = optax.softmax_cross_entropy_with_integer_labels(
        logits_RLV.astype(jnp.float32), targets_RL)
    per_row = jnp.sum(per_token * weights_RL, -1) / jnp.maximum(jnp.sum(weights_RL, -1), 1.0)
    rows = jnp.asarray(per_row.size, jnp.float32)
    metrics["lm_loss"] = (jnp.sum(per_row), rows)
    return loss + lm_coef * jnp.mean(per_row), metrics

  return loss_fn


def with_mix_penalty(loss_fn: Callable, coef: float) -> Callable:
  """`loss_fn` plus bilm-tf's regulariser of the scalar mix's weights, coef · Σ_j w_j², which
  pulls the mix towards the average of the layers (Peters et al. 2018 §3.3, λ); logged as
  mix_penalty. `loss_fn` itself with coef 0."""
  if not coef:
    return loss_fn

  def penalised(model, params, batch, rng, config, *, deterministic=False):
    loss, metrics, *rest = loss_fn(model, params, batch, rng, config, deterministic=deterministic)
    # The trained mix only: a distillation teacher's sits in another collection, fixed.
    mixes = [leaf for path, leaf in jax.tree_util.tree_flatten_with_path(params["params"])[0]
             if [getattr(k, "key", None) for k in path[-2:]] == ["scalar_mix", "weights"]]
    penalty = coef * sum(jnp.sum(jnp.square(w)) for w in mixes)
    metrics["mix_penalty"] = (penalty, jnp.ones((), jnp.float32))
    return (loss + penalty, metrics, *rest)   # QAT's loss also returns its range updates

  return penalised


# ------------------------------------------------------------------------------------ evaluation


def evaluate(task, predict, params, *, eval_data, eval_examples, tokenizer, config, mesh
             ) -> dict[str, Any]:
  """Predicts the evaluation split and scores it with the task's metrics.

  Returns: task, split, examples, scores {metric: value}, main_metric, predictions (one dict per
  example: its index (and id where the task has one), prediction, gold label and, for
  classification and multiple choice, gold_nll: the gold label's negative log-probability)."""
  ft = config.finetune
  outputs = recipe_lib.predict_all(predict, params, eval_data, config.train.eval_batch_size, mesh,
                                   INPUT_KEYS)
  predictions = features.decode_predictions(task, outputs, eval_data, eval_examples, tokenizer, ft)
  scores = task.score(eval_examples, predictions)
  nll = features.gold_nll(task, outputs, eval_data)
  return dict(task=ft.task, split=ft.eval_split or task.eval_split, examples=len(eval_examples),
              main_metric=task.main_metric, scores=scores,
              predictions=[dict(index=i, **({"id": e["id"]} if "id" in e else {}),
                                prediction=_jsonable(p), label=_jsonable(g),
                                **({} if nll is None else {"gold_nll": nll[i]}))
                           for i, (e, p, g) in enumerate(zip(eval_examples, predictions,
                                                             task.gold(eval_examples)))])


def _jsonable(value):
  if isinstance(value, np.ndarray):
    return value.tolist()
  if isinstance(value, np.generic):
    return value.item()
  return value
