"""Fine-tuning workdirs for the HF export tests (tests/hf/hf_task_heads_test.py with transformers,
tests/hf/hf_finetune_export_test.py without): config.json and a checkpoint exactly as
finetune.run writes them, with random parameters, without running the fine-tuning."""

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertfam_jax import config_lib
from bertfam_jax import workdir as workdir_lib
from bertfam_jax.finetune import optim
from bertfam_jax.finetune import run as finetune_run
from bertfam_jax.train import checkpoint as checkpoint_lib
from bertfam_jax.train import step as step_lib
from helpers import tiny

LENGTH, VOCAB = 16, 101
# One registered task of every kind (their label names and sizes need no data).
TASKS = dict(classification="wordnet_supersense", regression="glue/stsb",
             token_classification="wordnet_tagging", extractive_qa="wordnet_qa",
             multiple_choice="wordnet_choice")


def fine_tuned_config(family, kind, init="", **model_overrides):
  """A resolved fine-tuning config as finetune.run writes it: the task's finetune section plus
  the pre-trained run's model, objective and tokenizer (one of ours; RoBERTa's an imported
  checkpoint's, so `init` must say where it came from). BERT's layers are scanned (export
  unstacks them); ALBERT and ELECTRA have factorised embeddings."""
  config = config_lib.finetune_config()
  config.finetune.update(task=TASKS[kind], init=init)
  config = config_lib.resolve_finetune(config, config_lib.finetune_recipe(False, kind))
  model = dict(vocab_size=VOCAB, max_positions=LENGTH)
  config.objective = config_lib.mlm_objective(sentence_task="nsp")
  config.tokenizer = config_lib.base_config().tokenizer
  config.tokenizer.model_path = "/nonexistent/spm.model"  # exported without a tokenizer
  if family == "bert":
    model.update(scan_layers=True)
  if family == "albert":
    model.update(share_layers="all", embedding_size=16)
    config.objective = config_lib.mlm_objective(sentence_task="sop")
  if family == "electra":
    model.update(embedding_size=16, activation="gelu")
    config.objective = config_lib.electra_objective()
  if family == "roberta":
    model.update(type_vocab_size=1, layer_norm_eps=1e-5, activation="gelu")
    config.objective = config_lib.mlm_objective(sentence_task="", mask_style="fairseq")
    config.tokenizer.update(kind="hf", model_path="")
  config.model = tiny.encoder(**{**model, **model_overrides})
  return config


def fine_tuned_workdir(config, workdir, seed=0):
  """Writes config.json and a checkpoint (step 7) of the FineTuneModel's TrainState with the
  runner's optimizer, as finetune.run saves it. The parameters are random, N(0, 0.2²) (LayerNorm
  scales 1 + that), so that every bias, LayerNorm and head weight matters (tracing the model's
  shapes instead of running its initialiser keeps the tests fast). Returns them."""
  os.makedirs(workdir)
  workdir_lib.check_or_write_config(workdir, config)
  model, example = finetune_run.build_model(config)
  shapes = jax.eval_shape(lambda: nn.meta.unbox(model.init(
      {"params": jax.random.key(0)}, *(example[k] for k in finetune_run.INPUT_KEYS),
      deterministic=True)))
  tx, _ = optim.make_finetune_optimizer(config, shapes, total_steps=7)
  rng = np.random.default_rng(seed)
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: jnp.asarray((path[-1].key == "scale") + 0.2 * rng.standard_normal(x.shape),
                                  x.dtype), shapes)
  state = step_lib.TrainState(step=jnp.array(7, jnp.int32), params=params,
                              opt_state=tx.init(params))
  checkpointer = checkpoint_lib.Checkpointer(os.path.join(workdir, "checkpoints"), 1)
  checkpointer.save(7, state, {"step": 7})
  checkpointer.close()
  return jax.device_get(params["params"])
