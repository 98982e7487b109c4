"""Exporting fine-tuning runs without torch: a transformers checkpoint fine-tuned by finetune.run
exports as its task class and imports back as the run's FineTuneModel; what no HF task class
holds is refused before anything is written; a run finds the HF checkpoint it descends from
through its init."""

import json
import os
import pathlib

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertfam_jax import config_lib, hf, objectives
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.data import sources
from bertfam_jax.data import tokenizers as sp_tokenizers
from bertfam_jax import workdir as run_reader
from bertfam_jax.finetune import tasks
from bertfam_jax.finetune import run as finetune_run
from bertfam_jax.hf import __main__ as cli
from bertfam_jax.hf import families
from bertfam_jax.data import hf_tokenizer as tokenizer_lib
from bertfam_jax.hf import workdir as workdir_lib
from bertfam_jax.objectives import mlm

from helpers.hf_finetuned import fine_tuned_config  # noqa: E402

_REPO = pathlib.Path(__file__).resolve().parents[2]
SEQ = 32


def write_config(config, workdir):
  os.makedirs(workdir)
  run_reader.check_or_write_config(str(workdir), config)
  return str(workdir)


@pytest.mark.parametrize("family, kind, changes, match", [
    ("electra", "classification", {}, r"dense \+ GELU \+ out_proj"),
    ("electra", "regression", {}, r"dense \+ GELU \+ out_proj"),
    ("bert", "classification", dict(finetune__features="weighted_sum"), "scalar_mix"),
    ("albert", "token_classification", dict(finetune__method="adapters", model__adapter_size=8),
     "no adapter layers"),
    ("electra", "extractive_qa", dict(finetune__qa_head="joint"), "qa_head=independent"),
])
def test_runs_no_hf_class_holds_are_refused(family, kind, changes, match, tmp_path):
  """Refused from config.json alone (before restoring anything), and nothing is written."""
  config = fine_tuned_config(family, kind)
  for key, value in changes.items():
    section, field = key.split("__")
    config[section][field] = value
  workdir = write_config(config, tmp_path / "workdir")
  with pytest.raises(ConfigError, match=match):
    hf.export_workdir(workdir, str(tmp_path / "hf"))
  assert not (tmp_path / "hf").exists()


def test_hf_source_follows_the_init_chain(tmp_path):
  """A run fine-tuned from a fine-tuning run fine-tuned from an imported RoBERTa is RoBERTa with
  that checkpoint's fields; a run of ours has none; an imported init that is gone is refused."""
  imported = tmp_path / "imported"
  imported.mkdir()
  record = dict(model_type="roberta", architecture="RobertaForMaskedLM",
                hf_config=dict(model_type="roberta", pad_token_id=1))
  (imported / workdir_lib.IMPORT_RECORD).write_text(json.dumps(record))
  first = write_config(fine_tuned_config("roberta", "classification", str(imported)),
                       tmp_path / "first")
  second = write_config(fine_tuned_config("roberta", "extractive_qa", first), tmp_path / "second")
  assert workdir_lib.hf_source(second) == record
  ours = write_config(fine_tuned_config("bert", "classification"), tmp_path / "ours")
  assert workdir_lib.hf_source(ours) == {}
  orphan = write_config(fine_tuned_config("roberta", "extractive_qa", str(tmp_path / "gone")),
                        tmp_path / "orphan")
  with pytest.raises(ConfigError, match="not there"):
    workdir_lib.hf_source(orphan)


# ------------------------------------------------------------------------- a real fine-tuning run


@pytest.fixture(scope="module")
def hf_bert(tmp_path_factory):
  """A randomly initialised BertForMaskedLM with a SentencePiece tokenizer, as a transformers
  directory (our save_pretrained's)."""
  root = tmp_path_factory.mktemp("hf_bert")
  docs = sources.embedded_wiki(config_lib.default_cache_dir())  # the session's test cache
  proto = sp_tokenizers.train_sentencepiece(
      [s for d in docs[:2] for s in sources.split_sentences(d)], 300, "unigram")
  family = families.get("bert")
  arch = family.architecture("BertForMaskedLM")
  model = families.model_from_hf(family, dict(
      model_type="bert", vocab_size=300, hidden_size=32, num_hidden_layers=2,
      num_attention_heads=4, intermediate_size=64, max_position_embeddings=SEQ, hidden_act="gelu"))
  config = families.run_config(family, arch, model, "")
  config.data.seq_len = SEQ
  init = nn.meta.unbox(objectives.get("mlm").build_model(config).init(
      {"params": jax.random.key(0)}, **mlm.init_inputs(config), deterministic=True))
  m = hf.HFModel(config, jax.device_get(init["params"]),
                 tokenizer_lib.from_files(tokenizer_lib.sentencepiece_files(proto)),
                 dict(model_type="bert"), arch.name)
  hf.save_pretrained(m, str(root / "hf"))
  return str(root / "hf")


def test_fine_tuned_transformers_checkpoint_exports_as_its_task_class(hf_bert, tmp_path):
  """transformers dir → finetune.run → CLI export → BertForSequenceClassification with the
  task's labels, whose import is the run's FineTuneModel and which fine-tunes further."""
  pytest.importorskip("wn")  # the WordNet task
  config = config_lib.load_config(str(_REPO / "configs" / "finetune.py"),
                                  f"task=wordnet_supersense,init={hf_bert}")
  config.finetune.update(max_train_examples=32, max_eval_examples=8, epochs=1.0, max_seq_len=SEQ)
  config.train.update(batch_size=16, eval_batch_size=16, log_every=5)
  workdir = str(tmp_path / "workdir")
  finetune_run.run(config, workdir)

  cli.FLAGS(["prog", f"--workdir={workdir}", f"--hf_path={tmp_path / 'hf'}"])
  assert cli.run(["prog", "export"]).startswith("Exported")
  exported = json.loads((tmp_path / "hf" / "config.json").read_text())
  labels = tasks.get("wordnet_supersense").label_names
  assert exported["architectures"] == ["BertForSequenceClassification"]
  assert exported["id2label"] == {str(i): name for i, name in enumerate(labels)}
  assert {"spiece.model", "tokenizer_config.json"} <= set(os.listdir(tmp_path / "hf"))

  again = hf.from_pretrained(str(tmp_path / "hf"))
  assert (again.kind, again.num_outputs) == ("classification", len(labels))
  run_config = run_reader.read_config(workdir)
  params = run_reader.restore_params(workdir)
  jax.tree.map(np.testing.assert_array_equal, again.params, params)
  ids = np.asarray(again.tokenizer.encode(["Anarchism is a political philosophy."])[0])[None]
  model, _ = finetune_run.build_model(run_config)
  np.testing.assert_allclose(
      again(ids)["logits"],
      model.apply({"params": params}, ids, np.ones_like(ids), np.zeros_like(ids),
                  deterministic=True), rtol=0, atol=1e-5)
  # Fine-tuning further from the exported directory reads its encoder.
  _, _, pretrained = finetune_run.load_init(str(tmp_path / "hf"))
  jax.tree.map(np.testing.assert_array_equal, pretrained["encoder"], params["encoder"])
