"""Fine-tuned models ↔ transformers' task classes (CPU, fp32, tiny random models, no downloads).

A fine-tuning run's workdir (config.json and a checkpoint as finetune.run writes them) of every
family × task kind that HF holds exports to the kind's HF class, which transformers loads with our
FineTuneModel's outputs (padded rows, two token types) and which imports back to the same
parameters; HF task checkpoints import as our FineTuneModel with HF's outputs and save back; the
heads HF computes differently are refused, or left out on request. Skipped without torch and
transformers."""

import json
import os
import pathlib

import jax
import numpy as np
import pytest

from bertfam_jax import hf
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.finetune import run as finetune_run
from bertfam_jax.finetune import tasks
from bertfam_jax.hf import __main__ as cli
from bertfam_jax.hf import io as hf_io

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


from helpers.hf_finetuned import (LENGTH, TASKS, VOCAB,  # noqa: E402
                                  fine_tuned_config, fine_tuned_workdir)
from helpers.hf_reference import randomised  # noqa: E402  N(0, 0.2²) on every HF parameter
BATCH, CHOICES = 2, 3
TOL = dict(rtol=0, atol=1e-4)
PREFIX = dict(bert="Bert", roberta="Roberta", albert="Albert", electra="Electra")
HF_CLASS = dict(classification="ForSequenceClassification", regression="ForSequenceClassification",
                token_classification="ForTokenClassification",
                extractive_qa="ForQuestionAnswering", multiple_choice="ForMultipleChoice")
# ElectraClassificationHead is dense + GELU + out_proj where ours is one dense (ELECTRA's own head):
# no HF class holds those runs.
MAPPED = [(family, kind) for family in PREFIX for kind in TASKS
          if not (family == "electra" and kind in ("classification", "regression"))]


# ------------------------------------------------------------------------------ fine-tuned runs


def roberta_init(directory):
  """A transformers directory's config.json as the fine-tuning init of a RoBERTa run (export
  reads its family and fields, not its weights; its stale task fields are replaced)."""
  os.makedirs(directory)
  (pathlib.Path(directory) / "config.json").write_text(json.dumps(dict(
      model_type="roberta", architectures=["RobertaForMaskedLM"], pad_token_id=1, bos_token_id=0,
      eos_token_id=2, num_labels=7, problem_type="multi_label_classification")))
  return str(directory)


# --------------------------------------------------------------------------- inputs and outputs


def inputs(kind, pad_id):
  """Right-padded rows of random lengths (the first full) with two token types; real ids avoid
  pad_id (RoBERTa derives positions from it). [batch, length], multiple choice [batch, choices,
  length]."""
  rng = np.random.default_rng(0)
  shape = (BATCH, CHOICES, LENGTH) if kind == "multiple_choice" else (BATCH, LENGTH)
  lengths = rng.integers(8, LENGTH + 1, shape[:-1])
  lengths.flat[0] = LENGTH
  mask = (np.arange(LENGTH) < lengths[..., None]).astype(np.int64)
  ids = np.where(mask > 0, rng.integers(pad_id + 2, VOCAB, shape), pad_id)
  return ids, mask, mask * (np.arange(LENGTH) >= 6)


def hf_logits(model, kind, ids, mask, types):
  """The HF model's outputs in our FineTuneModel's layout (regression [batch], extractive QA
  [batch, length, 2])."""
  kwargs = dict(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
  if model.config.type_vocab_size > 1:
    kwargs["token_type_ids"] = torch.tensor(types)
  with torch.no_grad():
    out = model(**kwargs)
  if kind == "extractive_qa":
    return torch.stack([out.start_logits, out.end_logits], -1).numpy()
  return out.logits[:, 0].numpy() if kind == "regression" else out.logits.numpy()


def assert_logits_equal(ours, theirs, kind, mask):
  """Per-token outputs are compared at real tokens (HF's RoBERTa gives padding other positions)."""
  ours = np.asarray(ours)
  assert ours.shape == theirs.shape
  if kind in ("token_classification", "extractive_qa"):
    ours, theirs = ours[mask > 0], theirs[mask > 0]
  np.testing.assert_allclose(ours, theirs, **TOL)


def load_hf(directory, architecture):
  model, info = getattr(transformers, architecture).from_pretrained(
      directory, attn_implementation="eager", output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  return model.eval()


# ------------------------------------------------------------------------------------- export


@pytest.mark.parametrize("family, kind", MAPPED)
def test_fine_tuned_workdir_exports_as_the_task_class(family, kind, tmp_path):
  init = roberta_init(tmp_path / "init") if family == "roberta" else ""
  config = fine_tuned_config(family, kind, init)
  params = fine_tuned_workdir(config, str(tmp_path / "workdir"))
  exported = hf.export_workdir(str(tmp_path / "workdir"), str(tmp_path / "hf"))
  architecture = PREFIX[family] + HF_CLASS[kind]
  assert (exported.architecture, exported.kind) == (architecture, kind)

  hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
  task = tasks.get(TASKS[kind])
  labels = list(task.label_names) or [f"LABEL_{i}" for i in range(task.num_outputs)]
  assert hf_config["id2label"] == {str(i): name for i, name in enumerate(labels)}
  assert hf_config["problem_type"] == dict(classification="single_label_classification",
                                           regression="regression").get(kind)
  model = load_hf(str(tmp_path / "hf"), architecture)
  ids, mask, types = inputs(kind, model.config.pad_token_id)
  types = types if config.model.type_vocab_size > 1 else np.zeros_like(types)
  ours, _ = finetune_run.build_model(config)
  expected = ours.apply({"params": params}, ids, mask, types, deterministic=True)
  assert_logits_equal(expected, hf_logits(model, kind, ids, mask, types), kind, mask)

  again = hf.from_pretrained(str(tmp_path / "hf"))
  assert (again.architecture, again.kind, again.num_outputs) == (architecture, kind,
                                                                 task.num_outputs)
  jax.tree.map(np.testing.assert_array_equal, again.params, hf_io.unscanned(params))


# ------------------------------------------------------------------------------------- import


def hf_task_model(architecture, directory, seed=0, **overrides):
  """A randomised transformers task model, saved to `directory`."""
  family = architecture.split("For")[0]
  fields = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, max_position_embeddings=LENGTH, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0, attn_implementation="eager", num_labels=3)
  if family == "Roberta":
    fields.update(max_position_embeddings=LENGTH + 2, type_vocab_size=1, pad_token_id=1)
  if family in ("Albert", "Electra"):
    fields.update(embedding_size=16)
  fields.update(overrides)
  config = getattr(transformers, f"{family}Config")(**fields)
  model, _ = randomised(getattr(transformers, architecture)(config), seed)
  model.save_pretrained(directory)
  return model


# (architecture, HF config overrides, our kind, num_outputs)
IMPORTS = [(PREFIX[family] + HF_CLASS[kind], {}, kind, 3) for family, kind in MAPPED
           if kind in ("classification", "token_classification")]
IMPORTS += [(PREFIX[family] + HF_CLASS["extractive_qa"], dict(num_labels=2), "extractive_qa", 2)
            for family in PREFIX]
IMPORTS += [(f"{PREFIX[family]}ForSequenceClassification", dict(num_labels=1), "regression", 1)
            for family in ("bert", "roberta", "albert")]
IMPORTS += [(PREFIX[family] + HF_CLASS["multiple_choice"],
             dict(summary_activation="tanh") if family == "electra" else {}, "multiple_choice", 1)
            for family in PREFIX]


@pytest.mark.parametrize("architecture, overrides, kind, num_outputs", IMPORTS)
def test_task_checkpoint_imports_as_fine_tune_model(architecture, overrides, kind, num_outputs,
                                                    tmp_path):
  reference = hf_task_model(architecture, tmp_path / "hf", **overrides)
  ours = hf.from_pretrained(str(tmp_path / "hf"))
  assert (ours.architecture, ours.kind, ours.num_outputs, ours.fresh) == (
      architecture, kind, num_outputs, ())
  heads = set(ours.params) - {"encoder"}
  assert heads == {dict(classification="classification_head", regression="classification_head",
                        token_classification="token_head", extractive_qa="span_head",
                        multiple_choice="choice_head")[kind]}
  ids, mask, types = inputs(kind, reference.config.pad_token_id)
  if reference.config.type_vocab_size == 1:
    types = np.zeros_like(types)
  expected = hf_logits(reference, kind, ids, mask, types)
  out = ours(ids, mask, types)
  assert_logits_equal(out["logits"], expected, kind, mask)
  with torch.no_grad():
    flat = lambda x: torch.tensor(x.reshape(-1, LENGTH))  # noqa: E731
    hidden = reference.base_model(input_ids=flat(ids), attention_mask=flat(mask),
                                  token_type_ids=flat(types)).last_hidden_state.numpy()
  real = mask.reshape(-1, LENGTH) > 0
  np.testing.assert_allclose(np.asarray(out["hidden_states"]).reshape(hidden.shape)[real],
                             hidden[real], **TOL)

  hf.save_pretrained(ours, str(tmp_path / "ours"))
  again = load_hf(str(tmp_path / "ours"), architecture)
  assert again.config.id2label == reference.config.id2label
  assert_logits_equal(hf_logits(again, kind, ids, mask, types), expected, kind, mask)


@pytest.mark.parametrize("architecture, overrides, match", [
    ("ElectraForSequenceClassification", {}, r"dense \+ GELU \+ out_proj"),
    ("ElectraForMultipleChoice", {}, "summary_activation"),
])
def test_heads_hf_computes_otherwise_are_refused_or_left_out(architecture, overrides, match,
                                                             tmp_path):
  """ELECTRA's GELU sequence head (hard-wired) and its default GELU summary are refused with
  the reason; task_head=False (and the CLI import) takes the encoder alone, with HF's hidden
  states, into ElectraForPreTraining with fresh heads."""
  reference = hf_task_model(architecture, tmp_path / "hf", **overrides)
  with pytest.raises(ConfigError, match=match):
    hf.from_pretrained(str(tmp_path / "hf"))
  cli.FLAGS(["prog", f"--hf_path={tmp_path / 'hf'}", f"--workdir={tmp_path / 'workdir'}"])
  assert f"ElectraForPreTraining (the encoder of {architecture}, its task head left out)" in (
      cli.run(["prog", "import"]))
  record = json.loads((tmp_path / "workdir" / "hf_import.json").read_text())
  assert (record["architecture"], record["task_head_left_out"]) == ("ElectraForPreTraining",
                                                                   architecture)
  m = hf.from_pretrained(str(tmp_path / "hf"), task_head=False)
  assert m.kind == "" and m.fresh == ("generator", "generator_head", "rtd_head")
  ids, mask, types = inputs("classification", 0)
  with torch.no_grad():
    hidden = reference.base_model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                                  token_type_ids=torch.tensor(types)).last_hidden_state.numpy()
  np.testing.assert_allclose(np.asarray(m(ids, mask, types)["hidden_states"])[mask > 0],
                             hidden[mask > 0], **TOL)
