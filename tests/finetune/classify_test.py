"""Sequence-classification fine-tuning: a real tiny pre-training run, inputs, learning, errors."""

import json
import os
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bertfam_jax import config_lib as cl
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.data import tokenizers
from bertfam_jax.finetune import classify, features
from bertfam_jax.train import train

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda omicron".split()


def pretraining_config(corpus: str, cache_dir: str):
  """Two BERT (MLM + NSP) steps of a one-layer, 32-wide encoder on a small local corpus."""
  c = cl.base_config()
  c.data.update(source="text", text_files=corpus, seq_len=32, docs_per_chunk=16,
                cache_dir=cache_dir)
  c.model.update(hidden=32, layers=1, heads=2, mlp=64, vocab_size=108, max_positions=32)
  c.objective.max_predictions = 5
  c.optimizer.update(peak_lr=5e-3, warmup_steps=1)
  c.train.update(batch_size=8, total_steps=2, log_every=2, eval_batches=0, checkpoint_every=2,
                 keep_checkpoints=1)
  return c


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  """(workdir, the config it was trained with)."""
  root = tmp_path_factory.mktemp("pretrained")
  rng = np.random.default_rng(0)
  documents = ["\n".join(" ".join(rng.choice(WORDS, 8)) + "." for _ in range(10))
               for _ in range(100)]
  (root / "corpus.txt").write_text("\n\n".join(documents))
  config = pretraining_config(str(root / "corpus.txt"), str(root / "cache"))
  train.run(config, str(root / "workdir"))
  return str(root / "workdir"), config


@pytest.fixture(scope="module")
def loaded(pretrained):
  return classify.load_pretrained_encoder(pretrained[0])


def test_load_pretrained_encoder_returns_the_checkpoint_encoder(pretrained, loaded):
  workdir, config = pretrained
  run_config, tokenizer, encoder_params = loaded
  assert run_config.model.to_dict() == config.model.to_dict()
  with open(tokenizers.cache_path(config), "rb") as f:
    assert tokenizer.model_proto == f.read()
  # Read the checkpoint independently of the code under test: orbax without a target tree.
  raw = ocp.StandardCheckpointer().restore(os.path.join(workdir, "checkpoints", "2", "state"))
  expected = raw["params"]["params"]["encoder"]
  assert jax.tree.structure(encoder_params) == jax.tree.structure(expected)
  jax.tree.map(np.testing.assert_array_equal, encoder_params, expected)


def test_fine_tune_starts_from_the_pretrained_encoder(loaded):
  """With a zero learning rate the fine-tuned encoder is exactly the pre-trained one."""
  config, tokenizer, encoder_params = loaded
  texts = [" ".join(WORDS[i:i + 3]) for i in range(10)]
  data = dict(features.encode_pairs(tokenizer, texts, seq_len=32), label=np.arange(10) % 2)
  result = classify.fine_tune(config.model, encoder_params, data, data, num_classes=2,
                              batch_size=4, steps=2, peak_lr=0.0)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(result["params"]["params"]["encoder"]),
               encoder_params)
  assert result["predictions"].shape == (10,) and result["steps"] == 2
  assert sorted(result["params"]["params"]) == ["encoder", "sentence_head"]


def test_encoder_params_must_fit_the_model(loaded):
  config, tokenizer, encoder_params = loaded
  wider = config.model.copy_and_resolve_references()
  wider.update(hidden=64, mlp=128)
  data = dict(features.encode_pairs(tokenizer, WORDS, seq_len=8), label=np.zeros(len(WORDS), int))
  with pytest.raises(ConfigError, match=r"do not fit config_model.*\(32,\) given, \(64,\) exp"):
    classify.fine_tune(wider, encoder_params, data, data, num_classes=2, batch_size=4)


def test_bad_workdirs_name_the_fix(pretrained, tmp_path):
  workdir, _ = pretrained
  with pytest.raises(ConfigError, match="no config.json.*--workdir of"):
    classify.load_pretrained_encoder(str(tmp_path))
  (tmp_path / "not_started").mkdir()
  shutil.copy(os.path.join(workdir, "config.json"), tmp_path / "not_started")
  with pytest.raises(ConfigError, match="holds no checkpoint"):
    classify.load_pretrained_encoder(str(tmp_path / "not_started"))
  assert not (tmp_path / "not_started" / "checkpoints").exists()  # read-only: nothing created
  with pytest.raises(ConfigError, match="is not at /nonexistent.*tokenizer_path"):
    classify.load_pretrained_encoder(workdir, tokenizer_path="/nonexistent/spm.model")


def test_a_config_that_does_not_match_the_checkpoint(pretrained, tmp_path):
  workdir, _ = pretrained
  edited = str(tmp_path / "edited")
  shutil.copytree(workdir, edited)
  with open(os.path.join(edited, "config.json")) as f:
    saved = json.load(f)
  saved["model"]["hidden"] = 64
  with open(os.path.join(edited, "config.json"), "w") as f:
    json.dump(saved, f)
  with pytest.raises(ConfigError, match="does not describe the model.*own config.json"):
    classify.load_pretrained_encoder(edited)




def test_epoch_batches_permute_every_epoch_and_drop_the_remainder():
  batches = classify.epoch_batches(10, 4, np.random.default_rng(0))
  first_epoch = np.concatenate([next(batches), next(batches)])
  second_epoch = np.concatenate([next(batches), next(batches)])
  for epoch in (first_epoch, second_epoch):
    assert len(set(epoch.tolist())) == 8  # two full batches of distinct examples, 2 left out
  assert first_epoch.tolist() != second_epoch.tolist()


def token_presence_task(examples, rng, *, length=8, marker=5, vocab=64):
  """Label 1 iff token `marker` occurs in a random [CLS]-led sequence of random length."""
  ids = rng.integers(marker + 1, vocab, size=(examples, length)).astype(np.int32)
  lengths = rng.integers(4, length + 1, size=examples)
  label = rng.integers(0, 2, size=examples)
  position = 1 + (rng.random(examples) * (lengths - 1)).astype(int)
  ids[label == 1, position[label == 1]] = marker
  ids[:, 0] = 2
  input_mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
  return dict(input_ids=ids * input_mask, input_mask=input_mask,
              segment_ids=np.zeros_like(ids), label=label)


def test_fine_tune_learns_a_synthetic_task_deterministically():
  rng = np.random.default_rng(0)
  train_data, eval_data = token_presence_task(1024, rng), token_presence_task(256, rng)
  model = cl.encoder("mini", hidden=32, layers=1, heads=2, mlp=64, vocab_size=64, max_positions=8)
  run = lambda seed: classify.fine_tune(  # noqa: E731
      model, None, train_data, eval_data, num_classes=2, steps=100, peak_lr=2e-3, seed=seed)
  result = run(0)
  scores = {k: result[k] for k in ("accuracy", "macro_f1", "mcc")}
  assert scores["accuracy"] > 0.9 and scores["macro_f1"] > 0.9 and scores["mcc"] > 0.8, scores
  curve = result["train_loss_curve"]
  assert curve.shape == (10,) and curve[-1] < 0.5 * curve[0]
  assert result["accuracy"] == np.mean(result["predictions"] == eval_data["label"])
  again, other_seed = run(0), run(1)  # the same settings reuse the compiled steps
  np.testing.assert_array_equal(again["train_loss_curve"], curve)
  np.testing.assert_array_equal(again["predictions"], result["predictions"])
  assert not np.array_equal(other_seed["train_loss_curve"], curve)


def test_rejects_data_that_cannot_train():
  model = cl.encoder("mini", hidden=32, layers=1, heads=2, mlp=64, vocab_size=64, max_positions=8)
  data = token_presence_task(16, np.random.default_rng(0), length=16)
  with pytest.raises(ConfigError, match="max_positions=8"):
    classify.fine_tune(model, None, data, data, num_classes=2)
  data = token_presence_task(16, np.random.default_rng(0))
  with pytest.raises(ConfigError, match="fewer than batch_size=32"):
    classify.fine_tune(model, None, data, data, num_classes=2)
  with pytest.raises(ValueError, match="labels outside"):
    classify.fine_tune(model, None, data, data, num_classes=1, batch_size=8)
