"""bertfam_jax.hf against transformers' PyTorch classes (CPU, fp32, random small models, no
downloads): from_pretrained gives HF's logits and last hidden states with padding and token types,
our save_pretrained loads back into transformers with the same logits, and a checkpoint survives
import_to_workdir → export_workdir → transformers. Skipped without torch and transformers."""

import json

import numpy as np
import pytest

from bertfam_jax import hf
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.hf import io as hf_io

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# N(0, 0.2²) on every HF parameter, tied weights kept tied (needs torch: after the importorskip)
from helpers.hf_reference import randomised  # noqa: E402

BATCH, LENGTH, VOCAB = 2, 16, 101
SMALL = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=64, max_position_embeddings=LENGTH, hidden_dropout_prob=0.0,
             attention_probs_dropout_prob=0.0, attn_implementation="eager")
TOL = dict(rtol=0, atol=1e-4)


def hf_config(architecture, **overrides):
  family = architecture.split("For")[0]
  config = dict(SMALL)
  if family == "Roberta":
    config.update(max_position_embeddings=LENGTH + 2, type_vocab_size=1, pad_token_id=1)
  if family == "Albert":
    config.update(embedding_size=16, num_hidden_layers=3, num_hidden_groups=2,
                  classifier_dropout_prob=0.0)
  if family == "Electra":
    config.update(embedding_size=16)
  config.update(overrides)
  return getattr(transformers, f"{family}Config")(**config)


# architecture → (HF config overrides, what our freshly initialise)
CASES = {
    "BertForPreTraining": dict(hidden_act="gelu_new"),
    "BertForMaskedLM": dict(hidden_act="gelu"),
    "RobertaForMaskedLM": dict(),
    "AlbertForPreTraining": dict(),
    "ElectraForPreTraining": dict(),
    "ElectraForMaskedLM": dict(hidden_size=24, num_attention_heads=2),
}


def saved_hf_model(architecture, directory, seed=0, **overrides):
  config = hf_config(architecture, **{**CASES.get(architecture, {}), **overrides})
  model, _ = randomised(getattr(transformers, architecture)(config), seed)
  model.save_pretrained(directory)
  return model


def inputs(pad_id):
  """Right-padded rows (the second ends in 5 padding positions) with two token types; real ids
  avoid pad_id (RoBERTa derives positions from it)."""
  rng = np.random.default_rng(0)
  mask = (np.arange(LENGTH)[None] < np.array([[LENGTH], [11]])).astype(np.int64)
  ids = np.where(mask > 0, rng.integers(pad_id + 2, VOCAB, (BATCH, LENGTH)), pad_id)
  return ids, mask, mask * (np.arange(LENGTH)[None] >= 6)


def hf_outputs(model, ids, mask, types):
  kwargs = dict(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                output_hidden_states=True)
  if model.config.type_vocab_size > 1:
    kwargs["token_type_ids"] = torch.tensor(types)
  with torch.no_grad():
    out = model(**kwargs)
  logits = out.prediction_logits if hasattr(out, "prediction_logits") else out.logits
  sentence = getattr(out, "seq_relationship_logits", getattr(out, "sop_logits", None))
  return dict(logits=logits.numpy(), hidden_states=out.hidden_states[-1].numpy(),
              **({} if sentence is None else {"sentence_logits": sentence.numpy()}))


def assert_outputs_equal(ours, theirs, mask):
  assert set(ours) == set(theirs)
  real = mask > 0  # HF's padded positions see other position rows (RoBERTa); compare real ones
  for key in ("logits", "hidden_states"):
    np.testing.assert_allclose(np.asarray(ours[key])[real], theirs[key][real], **TOL)
  if "sentence_logits" in theirs:
    np.testing.assert_allclose(ours["sentence_logits"], theirs["sentence_logits"], **TOL)


def check(ours_or_dir, reference, architecture):
  """A checkpoint (our HFModel, or a directory transformers loads) gives `reference`'s outputs."""
  ids, mask, types = inputs(reference.config.pad_token_id)
  expected = hf_outputs(reference, ids, mask, types)
  if isinstance(ours_or_dir, hf.HFModel):
    types = types if reference.config.type_vocab_size > 1 else np.zeros_like(types)
    assert_outputs_equal(ours_or_dir(ids, mask, types), expected, mask)
    return
  loaded, info = getattr(transformers, architecture).from_pretrained(
      ours_or_dir, attn_implementation="eager", output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert_outputs_equal(hf_outputs(loaded.eval(), ids, mask, types), expected, mask)


@pytest.mark.parametrize("architecture", sorted(CASES))
def test_from_pretrained_and_save_pretrained_match_transformers(architecture, tmp_path):
  reference = saved_hf_model(architecture, tmp_path / "hf")
  ours = hf.from_pretrained(str(tmp_path / "hf"))
  assert ours.architecture == architecture
  assert ours.fresh == (("generator", "generator_head") if architecture == "ElectraForPreTraining"
                        else ())
  assert ours.config.objective.name == ("electra" if architecture == "ElectraForPreTraining"
                                        else "mlm")
  assert ours.config.objective.get("sentence_task") == {
      "BertForPreTraining": "nsp", "AlbertForPreTraining": "sop"}.get(architecture, "")
  check(ours, reference, architecture)
  hf.save_pretrained(ours, str(tmp_path / "ours"))
  check(str(tmp_path / "ours"), reference, architecture)


def test_pytorch_bin_reads_as_safetensors(tmp_path):
  reference = saved_hf_model("BertForPreTraining", tmp_path / "safetensors")
  (tmp_path / "bin").mkdir()
  reference.config.save_pretrained(tmp_path / "bin")
  torch.save(reference.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
  from_bin = hf_io.read_state_dict(str(tmp_path / "bin"))
  from_safetensors = hf_io.read_state_dict(str(tmp_path / "safetensors"))
  assert from_bin.keys() >= from_safetensors.keys()  # .bin also holds the tied decoder weights
  for name, array in from_safetensors.items():
    np.testing.assert_array_equal(from_bin[name], array)


def test_bare_encoder_imports_with_a_fresh_head(tmp_path):
  """A BertModel checkpoint (no heads, names without the 'bert.' prefix) imports as a masked LM
  whose head is freshly initialised; its hidden states are HF's."""
  model, _ = randomised(transformers.BertModel(hf_config("BertForMaskedLM")))
  model.save_pretrained(tmp_path)
  ours = hf.from_pretrained(str(tmp_path))
  assert (ours.architecture, ours.fresh) == ("BertForMaskedLM", ("mlm_head",))
  ids, mask, types = inputs(0)
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                   token_type_ids=torch.tensor(types)).last_hidden_state.numpy()
  real = mask > 0
  np.testing.assert_allclose(np.asarray(ours(ids, mask, types)["hidden_states"])[real],
                             theirs[real], **TOL)


@pytest.mark.parametrize("architecture", ["BertForPreTraining", "RobertaForMaskedLM",
                                          "AlbertForPreTraining"])
def test_workdir_round_trip(architecture, tmp_path):
  reference = saved_hf_model(architecture, tmp_path / "hf")
  hf.import_to_workdir(str(tmp_path / "hf"), str(tmp_path / "workdir"))
  record = json.loads((tmp_path / "workdir" / "hf_import.json").read_text())
  assert (record["architecture"], record["freshly_initialised"]) == (architecture, [])
  hf.export_workdir(str(tmp_path / "workdir"), str(tmp_path / "exported"))
  check(str(tmp_path / "exported"), reference, architecture)


def test_electra_pair_workdir_round_trip(tmp_path):
  """A discriminator with its generator (ELECTRA's generator shape for hidden fraction 3/4: 24
  wide, 1 head, FFN 96, the discriminator's embeddings) import into one Electra and export as
  both checkpoints again."""
  discriminator = saved_hf_model("ElectraForPreTraining", tmp_path / "disc")
  generator_config = dict(hidden_size=24, num_attention_heads=1, intermediate_size=96)
  generator = saved_hf_model("ElectraForMaskedLM", tmp_path / "gen", seed=1, **generator_config)
  with pytest.raises(ConfigError, match="not the generator our ELECTRA derives"):
    saved_hf_model("ElectraForMaskedLM", tmp_path / "bad", num_attention_heads=2,
                   hidden_size=24, intermediate_size=96)
    hf.import_to_workdir(str(tmp_path / "disc"), str(tmp_path / "w0"), str(tmp_path / "bad"))
  m = hf.import_to_workdir(str(tmp_path / "disc"), str(tmp_path / "workdir"),
                           generator_path=str(tmp_path / "gen"))
  assert m.fresh == () and m.config.objective.generator_hidden_fraction == 0.75
  record = json.loads((tmp_path / "workdir" / "hf_import.json").read_text())
  assert record["generator_embeddings_max_abs_diff"] > 0  # separately randomised here
  hf.export_workdir(str(tmp_path / "workdir"), str(tmp_path / "exported"))
  check(str(tmp_path / "exported"), discriminator, "ElectraForPreTraining")
  # The generator reads the discriminator's embeddings (ours are shared), so compare it with
  # the HF generator carrying those.
  with torch.no_grad():
    for name, p in generator.electra.embeddings.named_parameters():
      p.copy_(discriminator.electra.embeddings.get_parameter(name))
  check(str(tmp_path / "exported" / "generator"), generator, "ElectraForMaskedLM")
