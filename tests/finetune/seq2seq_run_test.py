"""The text-to-text run (`finetune.run.run` of a T5 init) on a 2x2x2 (data, fsdp, tensor) mesh of the 8 emulated
devices: it writes the workdir, trains and decodes (beam search) as one device does, a run resumed
from its checkpoint equals the uninterrupted one, and a workdir that holds another run is refused
and left untouched."""

import json
import os

import jax
import ml_collections
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from bertfam_jax import config_lib
from bertfam_jax import workdir as workdir_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.finetune import recipe
from bertfam_jax.finetune import run as run_lib
from bertfam_jax.finetune import seq2seq
from bertfam_jax.finetune import text_tasks
from bertfam_jax.train import sharding
from helpers.run_records import copy_until, metric_records, train_records
from seq2seq_test import (COPY_SPLITS, COPY_TASK, _fresh_params, _model_config, _with,
                          copy_tokenizer, init_config as make_init_config)

F32_TOL = dict(rtol=2e-5, atol=2e-6)
# 4 steps of 16 of the copy task's first 32 examples: an epoch is 2 steps, so evaluations and
# checkpoints follow steps 2 and 4; beam search over the first 4 validation examples. A small
# learning rate keeps the decoded outputs of `t5_init`'s weights varied.
RUN = dict(max_train_examples=32, max_eval_examples=4, max_seq_len=10, targets_length=6,
           beam_size=2)


@pytest.fixture(scope="module")
def tokenizer():
  return copy_tokenizer()


@pytest.fixture(scope="module")
def t5_init(tokenizer, tmp_path_factory):
  """`workdir.load` patched to give a tiny "pre-trained" T5 (one layer a stack,
  dropout 0.1, untied output layer whose pad column is negated: random weights otherwise decode
  nothing but pads, these decode varied, input-dependent ids) and the copy task registered as
  'copy' and 'copy_again'. Yields (init directory, its model section, its parameters)."""
  init = tmp_path_factory.mktemp("t5_init")
  model_config = _with(_model_config(tokenizer), layers=1, decoder_layers=1, dropout=0.1,
                       tie_embeddings=False)
  init_config = make_init_config(model_config, str(init / "spm.model"))
  params = jax.tree.map(np.array, _fresh_params(seq2seq.build_model(model_config), 7))
  params["decoder"]["logits_dense"]["kernel"][:, 0] *= -1.0
  with pytest.MonkeyPatch.context() as patch:
    patch.setitem(text_tasks.TASKS, "copy", COPY_TASK)
    patch.setitem(text_tasks.TASKS, "copy_again", COPY_TASK)
    patch.setattr(workdir_lib, "load", lambda path: (init_config, tokenizer, params))
    yield str(init), model_config, params


def run_config(init, task="copy"):
  config = config_lib.finetune_config()
  config.finetune.update(task=task, init=init, **RUN)
  config.optimizer.peak_lr = 1e-4
  config.train.update(batch_size=16, eval_batch_size=4, total_steps=4, log_every=1,
                      keep_checkpoints=2)
  config.mesh.update(data=2, fsdp=2, tensor=2)
  return config


@pytest.fixture(scope="module")
def uninterrupted(t5_init, tmp_path_factory):
  """(workdir, results) of an uninterrupted `run_config` run."""
  workdir = str(tmp_path_factory.mktemp("uninterrupted") / "work")
  return workdir, run_lib.run(run_config(t5_init[0]), workdir)


def read(workdir, name):
  with open(os.path.join(workdir, name)) as f:
    return f.read()


def test_run_writes_the_workdir(uninterrupted):
  workdir, results = uninterrupted
  assert results["step"] == 4 and results["examples"] == 4 and results["main_metric"] == "rouge2"
  saved = json.loads(read(workdir, "eval_results.json"))
  assert saved["scores"] == pytest.approx(results["scores"])
  predictions = [json.loads(line) for line in read(workdir, "predictions.jsonl").splitlines()]
  validation = COPY_SPLITS["validation"][:4]
  assert [p["id"] for p in predictions] == [e["id"] for e in validation]
  assert [p["references"] for p in predictions] == [[e["targets"]] for e in validation]
  records = metric_records(workdir)
  assert [r["step"] for r in records] == [1, 2, 2, 3, 4, 4]   # train, train, eval_*, ...
  assert "eval_rouge2" in records[2] and "t5_accuracy" in records[0]
  config = json.loads(read(workdir, "config.json"))
  assert config["model"]["kind"] == "t5" and config["finetune"]["task"] == "copy"
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2", "4"]


def test_2x2x2_mesh_trains_and_decodes_as_one_device(t5_init, uninterrupted, tokenizer,
                                                     tmp_path):
  init, model_config, params = t5_init
  workdir, _ = uninterrupted
  config = run_lib.resolved_config(run_config(init), workdir_lib.load(init)[0])
  mesh = sharding.make_mesh(config.mesh)
  shardings = recipe._compiled(  # pylint: disable=protected-access
      run_lib.make_recipe(config, tokenizer, params, mesh), config, mesh).shardings
  layer = shardings.params["params"]["decoder"]["layer_0"]
  assert shardings.params["params"]["token_embedder"]["embedding"].spec == P("tensor", "fsdp")
  assert layer["mlp"]["wi"]["kernel"].spec == P("fsdp", "tensor")

  single = str(tmp_path / "one_device")
  one_mesh = sharding.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])
  one = recipe.train_and_evaluate(config, run_lib.make_recipe(config, tokenizer, params, one_mesh),
                                  one_mesh, single)
  sharded, logged = train_records(workdir), train_records(single)
  assert sorted(sharded) == sorted(logged) == [1, 2, 3, 4]
  for key in ("loss", "t5_loss", "t5_accuracy", "grad_norm", "param_norm"):
    np.testing.assert_allclose([sharded[s][key] for s in sharded],
                               [logged[s][key] for s in sharded], **F32_TOL, err_msg=key)
  # The checkpoints' parameters, read back as another fine-tuning's init would read them.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **F32_TOL),
               workdir_lib.restore_params(workdir), workdir_lib.restore_params(single))
  predictions = [json.loads(line)["prediction"]
                 for line in read(workdir, "predictions.jsonl").splitlines()]
  assert predictions == [p["prediction"] for p in one["predictions"]]
  assert len(set(predictions)) > 2   # varied outputs (`t5_init`), some ending early in EOS
  # In memory (the experiments' path): the same training, scored once at the end.
  in_memory = run_lib.fine_tune(config, tokenizer, params, mesh=one_mesh)
  assert in_memory["train"]["loss"] == logged[4]["loss"]
  assert [p["prediction"] for p in in_memory["predictions"]] == predictions


def test_resumed_run_equals_uninterrupted(t5_init, uninterrupted, tmp_path):
  full, _ = uninterrupted
  # Killed after the checkpoint of step 2: its later checkpoint and results never written.
  resumed = str(tmp_path / "resumed")
  copy_until(full, resumed, 2)
  for name in ("eval_results.json", "predictions.jsonl"):
    os.remove(os.path.join(resumed, name))
  run_lib.run(run_config(t5_init[0]), resumed)
  assert [r["step"] for r in metric_records(resumed)] == [1, 2, 2, 3, 4, 4]
  untimed = lambda workdir: [{k: v for k, v in r.items() if k != "tokens_per_sec"}  # noqa: E731
                             for r in metric_records(workdir)]
  assert untimed(resumed) == untimed(full)   # the same losses, bit for bit
  for name in ("eval_results.json", "predictions.jsonl"):
    assert read(resumed, name) == read(full, name)
  assert sorted(os.listdir(os.path.join(resumed, "checkpoints"))) == ["2", "4"]


def _snapshot(workdir):
  """{path: (size, mtime)} of every file under workdir."""
  stats = {os.path.join(root, name): os.stat(os.path.join(root, name))
           for root, _, names in os.walk(workdir) for name in names}
  return {path: (s.st_size, s.st_mtime_ns) for path, s in stats.items()}


def test_a_workdir_of_another_run_is_refused_and_kept(t5_init, uninterrupted, tokenizer,
                                                      tmp_path, monkeypatch):
  init, model_config, _ = t5_init
  workdir, _ = uninterrupted
  before = _snapshot(workdir)
  with pytest.raises(ConfigError, match="holds a fine-tuning on 'copy', not a fine-tuning on "
                                        "'copy_again'.*new --workdir"):
    run_lib.run(run_config(init, task="copy_again"), workdir)
  wider = ml_collections.ConfigDict(workdir_lib.load(init)[0].to_dict())
  wider.model.mlp = 96
  monkeypatch.setattr(workdir_lib, "load", lambda path: (wider, tokenizer, None))
  with pytest.raises(ConfigError, match="different model.*model.mlp: 128 → 96.*new --workdir"):
    run_lib.run(run_config(init), workdir)
  assert _snapshot(workdir) == before

  pretraining = tmp_path / "pretraining"   # e.g. --workdir=<the T5 run> by mistake
  (pretraining / "checkpoints" / "2000").mkdir(parents=True)
  (pretraining / "checkpoints" / "2000" / "state").write_text("weights")
  (pretraining / "config.json").write_text(wider.to_json())
  before = _snapshot(pretraining)
  with pytest.raises(ConfigError, match="holds a pre-training run"):
    run_lib.run(run_config(init), str(pretraining))
  assert _snapshot(pretraining) == before
