"""bertfam_jax.hf without torch: one of our pre-training runs exports to a transformers directory
whose re-import gives our model's logits; an HF directory imports into a workdir that training
(`train.init_from`, resuming) and fine-tuning (`bertfam_jax.workdir.load_encoder`) read exactly as a run's;
HF config ↔ our config for every family; the CLI's refusals."""

import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bertfam_jax import config_lib, hf, objectives
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.data import sources
from bertfam_jax.data import tokenizers as sp_tokenizers
from bertfam_jax import workdir as run_reader
from bertfam_jax.hf import __main__ as cli
from bertfam_jax.hf import families, workdir as workdir_lib
from bertfam_jax.data import hf_tokenizer as tokenizer_lib
from bertfam_jax.train import checkpoint as checkpoint_lib
from bertfam_jax.train import sharding as sharding_lib
from bertfam_jax.train import step as step_lib
from bertfam_jax.train import train

LENGTH = 16
TEXTS = ["Anarchism is a political philosophy.", "Café naïve résumé, 1958 and 3.14!"]


def run_config(vocab_size, **model):
  """A tiny masked LM + NSP run with scanned layers (export must unstack them)."""
  config = config_lib.base_config()
  config.model = config_lib.encoder("mini", hidden=32, layers=2, heads=4, mlp=64,
                                    vocab_size=vocab_size, max_positions=32, scan_layers=True,
                                    **model)
  config.data.seq_len = 32
  config.train.update(batch_size=8, total_steps=10)
  return config


@pytest.fixture(scope="module")
def our_run(tmp_path_factory):
  """A workdir as train.run leaves it: config.json, a checkpoint at step 3 with its data
  position, the SentencePiece model at tokenizer.model_path. Returns (workdir, config, params)."""
  root = tmp_path_factory.mktemp("run")
  docs = sources.embedded_wiki(config_lib.default_cache_dir())  # the session's test cache
  proto = sp_tokenizers.train_sentencepiece(
      [s for d in docs[:2] for s in sources.split_sentences(d)], 300, "unigram")
  (root / "spm.model").write_bytes(proto)
  config = run_config(300, vocab_multiple=128)  # a 384-row table: the export keeps 300
  config.tokenizer.model_path = str(root / "spm.model")
  workdir = str(root / "workdir")
  os.makedirs(workdir)
  run_reader.check_or_write_config(workdir, config)
  mesh = sharding_lib.make_mesh(config.mesh)
  state, _ = step_lib.fresh_train_step(config, mesh, objectives.get("mlm"))
  checkpointer = checkpoint_lib.Checkpointer(os.path.join(workdir, "checkpoints"), 3)
  checkpointer.save(3, state.replace(step=state.step + 3), dict(epoch=0, chunk=1, offset=5))
  checkpointer.close()
  return workdir, config, jax.device_get(state.params["params"])


def our_outputs(config, params, ids, mask, types):
  """Our MaskedLM's MLM logits at every position and NSP logits."""
  model = objectives.get("mlm").build_model(config)
  every = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
  return model.apply({"params": params}, ids, mask, types, every, deterministic=True)


def inputs():
  ids = np.random.default_rng(0).integers(5, 300, (2, LENGTH)).astype(np.int32)
  mask = (np.arange(LENGTH)[None] < np.array([[LENGTH], [11]])).astype(np.int32)
  return ids, mask, mask * (np.arange(LENGTH)[None] >= 6).astype(np.int32)


def test_export_of_our_run_reimports_with_our_logits(our_run, tmp_path):
  workdir, config, params = our_run
  exported = hf.export_workdir(workdir, str(tmp_path / "hf"))
  assert exported.architecture == "BertForPreTraining"
  hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert hf_config["model_type"] == "bert" and hf_config["hidden_act"] == "gelu_new"
  assert hf_config["vocab_size"] == 300 and params["encoder"]["word_embeddings"][
      "embedding"].shape == (384, 32)
  assert sorted(os.listdir(tmp_path / "hf")) == ["config.json", "model.safetensors",
                                                 "spiece.model", "tokenizer_config.json"]
  again = hf.from_pretrained(str(tmp_path / "hf"))
  assert (again.architecture, again.fresh) == ("BertForPreTraining", ())
  ids, mask, types = inputs()
  expected = our_outputs(config, params, ids, mask, types)
  out = again(ids, mask, types)
  np.testing.assert_allclose(out["logits"], expected["mlm_logits"], rtol=0, atol=1e-5)
  np.testing.assert_allclose(out["sentence_logits"], expected["sentence_logits"], rtol=0,
                             atol=1e-5)
  ours = sp_tokenizers.Tokenizer.from_file(config.tokenizer.model_path)
  assert ([x.tolist() for x in again.tokenizer.encode(TEXTS)] ==
          [x.tolist() for x in ours.encode(TEXTS)])
  with pytest.raises(ConfigError, match="not empty"):
    hf.export_workdir(workdir, str(tmp_path / "hf"))


def test_imported_workdir_is_read_as_a_run(our_run, tmp_path):
  """The imported workdir: its config passes validation and the checkpoint identity check; the
  checkpoint restores against the objective's abstract state on the 8-device mesh (what
  `train.init_from` and resuming do) with step 0, the imported params and a fresh stream
  position; `workdir.load_encoder` returns the imported encoder; export goes back to the
  imported HF class."""
  workdir, config, _ = our_run
  hf.export_workdir(workdir, str(tmp_path / "hf"))
  target = str(tmp_path / "imported")
  m = hf.import_to_workdir(str(tmp_path / "hf"), target)
  saved = ml_collections.ConfigDict(json.loads((tmp_path / "imported" / "config.json").read_text()))
  assert saved.tokenizer.to_dict() == dict(config_lib.base_config().tokenizer.to_dict(),
                                           kind="hf", model_path="tokenizer")
  assert saved.objective.sentence_task == "nsp" and not saved.model.scan_layers
  objectives.validate(saved)
  run_reader.check_or_write_config(target, saved)  # same identity: accepted

  mesh = sharding_lib.make_mesh(saved.mesh)
  model = objectives.get(saved.objective.name).build_model(saved)
  inputs = objectives.init_inputs(objectives.get(saved.objective.name), saved)
  tx, _ = step_lib.make_optimizer(saved, model, inputs)
  abstract, _ = step_lib.with_mesh_context(step_lib.abstract_state, mesh)(model, tx, mesh, inputs)
  checkpointer = checkpoint_lib.Checkpointer(os.path.join(target, "checkpoints"), 1,
                                             read_only=True)
  state, data_state = checkpointer.restore(checkpointer.latest_step(), abstract)
  checkpointer.close()
  assert int(state.step) == 0 and data_state == workdir_lib.DATA_START
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.params["params"]), m.params)

  _, tokenizer, encoder = run_reader.load_encoder(
      target, tokenizer_path=config.tokenizer.model_path)
  jax.tree.map(np.testing.assert_array_equal, encoder, m.params["encoder"])
  imported_tokenizer = tokenizer_lib.from_dir(os.path.join(target, "tokenizer"))
  assert ([x.tolist() for x in imported_tokenizer.encode(TEXTS)] ==
          [x.tolist() for x in tokenizer.encode(TEXTS)])

  hf.export_workdir(target, str(tmp_path / "again"))
  assert (json.loads((tmp_path / "again" / "config.json").read_text()) ==
          json.loads((tmp_path / "hf" / "config.json").read_text()))

  # Pre-training goes on in the imported workdir itself: it resumes step 0 and reads the corpus
  # with the workdir's own tokenizer files (kind 'hf', model_path relative to the workdir).
  saved.train.update(total_steps=2, batch_size=8, log_every=2, eval_batches=0, checkpoint_every=2)
  saved.data.update(seq_len=32, docs_per_chunk=16)
  assert np.isfinite(train.run(saved, target)["loss"])
  _, own_tokenizer, trained = run_reader.load_encoder(target)
  assert own_tokenizer.encode(TEXTS)[0].tolist() == imported_tokenizer.encode(TEXTS)[0].tolist()
  assert not np.array_equal(trained["layer_0"]["mlp"]["output"]["kernel"],
                            m.params["encoder"]["layer_0"]["mlp"]["output"]["kernel"])


@pytest.mark.parametrize("family_name, architecture, hf_fields", [
    ("bert", "BertForPreTraining", dict(hidden_act="gelu")),
    ("roberta", "RobertaForMaskedLM", dict(pad_token_id=1, type_vocab_size=1,
                                           layer_norm_eps=1e-5)),
    ("albert", "AlbertForPreTraining", dict(embedding_size=16, num_hidden_groups=2,
                                            hidden_act="gelu_new")),
    ("electra", "ElectraForPreTraining", dict(embedding_size=16)),
])
def test_hf_config_round_trip(family_name, architecture, hf_fields):
  family = families.get(family_name)
  arch = family.architecture(architecture)
  hf_config = dict(model_type=family_name, vocab_size=100, hidden_size=32, num_hidden_layers=2,
                   num_attention_heads=4, intermediate_size=64, max_position_embeddings=20,
                   **hf_fields)
  model = families.model_from_hf(family, hf_config)
  assert model.max_positions == 20 - (2 if family_name == "roberta" else 0)
  assert model.mlp == 64 and model.heads == 4
  assert families.model_from_hf(family, families.model_to_hf(family, arch, model, {})) == model
  written = families.model_to_hf(family, arch, model, {})
  full = families.full_hf_config(family, hf_config)
  assert {k: written[k] for k in full} == full


def test_activation_and_unsupported_families():
  bert = families.get("bert")
  fields = dict(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=16, max_position_embeddings=8)
  assert families.model_from_hf(bert, dict(fields, hidden_act="gelu_pytorch_tanh")).activation == (
      "gelu_tanh")
  with pytest.raises(ConfigError, match="silu"):
    families.model_from_hf(bert, dict(fields, hidden_act="silu"))
  with pytest.raises(ConfigError, match="inner_group_num"):
    families.model_from_hf(families.get("albert"), dict(fields, inner_group_num=2))
  with pytest.raises(ConfigError, match="'llama' is not supported.*'t5', 'xlnet'"):
    families.get("llama")


def test_cli_refuses_a_non_empty_target(our_run, tmp_path, capsys):
  workdir, _, _ = our_run
  (tmp_path / "hf").mkdir()
  (tmp_path / "hf" / "keep.txt").write_text("x")
  cli.FLAGS(["prog", f"--workdir={workdir}", f"--hf_path={tmp_path / 'hf'}"])
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["prog", "export"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and "not empty" in err and err.count("\n") == 1
  assert os.listdir(tmp_path / "hf") == ["keep.txt"]
  with pytest.raises(SystemExit):
    cli.main(["prog", "convert"])
  assert "usage" in capsys.readouterr().err
