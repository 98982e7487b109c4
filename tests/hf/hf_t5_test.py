"""bertfam_jax.hf's T5 family: T5ForConditionalGeneration ↔ models/t5.py (v1.0: ReLU, tied and
scaled output; v1.1: gated tanh GELU, untied lm_head), in both directions with transformers' logits
(CPU, fp32, random small models, no downloads); one of our T5 runs exports with its tokenizer
(sentinels <extra_id_k> included) and imports back into a workdir that pre-training and
text-to-text fine-tuning read; T5 tokenizers (T5Tokenizer spiece.model, tokenizer.json) give
transformers' ids; configs we cannot map are refused with the fix. The transformers comparisons
skip without torch."""

import importlib.util
import io
import json
import os

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import pytest
import sentencepiece as spm

from bertfam_jax import config_lib, hf, objectives
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.data import sources
from bertfam_jax.data import tokenizers as sp_tokenizers
from bertfam_jax import workdir as workdir_lib
from bertfam_jax.finetune import seq2seq
from bertfam_jax.hf import io as hf_io
from bertfam_jax.hf import families
from bertfam_jax.data import hf_tokenizer as tokenizer_lib

from helpers import our_runs

HAS_TORCH = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="needs torch and transformers "
                                 "(/tmp/venv_parity)")
# 50 SentencePiece pieces + 11 sentinels; few buckets and a short max distance, so 16 positions
# reach the log-spaced and the last buckets.
PIECES, EXTRA_IDS = 50, 11
VOCAB = PIECES + EXTRA_IDS
SMALL = dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=3,
             num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=12,
             dropout_rate=0.0)
TOL = dict(rtol=0, atol=1e-4)
TEXTS = ["Anarchism is a political philosophy.", "Café naïve résumé, 1958 and 3.14!"]


def inputs(vocab=VOCAB, length=16, target_length=9):
  """Right-padded encoder rows (the second ends in 5 pads, id 0) and decoder inputs starting
  with id 0, T5's decoder start."""
  rng = np.random.default_rng(0)
  mask = (np.arange(length)[None] < np.array([[length], [length - 5]])).astype(np.int64)
  ids = np.where(mask > 0, rng.integers(2, vocab, (2, length)), 0)
  decoder = np.concatenate([np.zeros((2, 1), np.int64),
                            rng.integers(2, vocab, (2, target_length - 1))], axis=1)
  return ids, mask, decoder


def hf_outputs(model, ids, mask, decoder):
  import torch  # noqa: PLC0415
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                decoder_input_ids=torch.tensor(decoder))
  return out.logits.numpy(), out.encoder_last_hidden_state.numpy()


def load_in_transformers(path):
  """transformers' T5ForConditionalGeneration of a directory, checking it found every weight."""
  import transformers  # noqa: PLC0415
  model, info = transformers.T5ForConditionalGeneration.from_pretrained(
      path, attn_implementation="eager", output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  return model.eval()


def assert_same_outputs(ours, reference, vocab=VOCAB):
  """Our HFModel gives the transformers model's logits and, at real tokens, encoder outputs."""
  ids, mask, decoder = inputs(vocab)
  logits, encoded = hf_outputs(reference, ids, mask, decoder)
  out = ours(ids, mask, decoder_input_ids=decoder)
  np.testing.assert_allclose(out["logits"], logits, **TOL)
  real = mask > 0  # HF's padded query rows attend differently; nothing reads them
  np.testing.assert_allclose(np.asarray(out["hidden_states"])[real], encoded[real], **TOL)


def t5_spiece(sentences, directory):
  """A T5-layout SentencePiece model (<pad> 0, </s> 1, <unk> 2) of PIECES pieces, saved with
  tokenizer_config.json naming T5Tokenizer and EXTRA_IDS sentinels."""
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(sentences), model_writer=model, vocab_size=PIECES, pad_id=0,
      eos_id=1, unk_id=2, bos_id=-1, model_type="unigram", character_coverage=0.98,
      minloglevel=2)
  os.makedirs(directory, exist_ok=True)
  (directory / "spiece.model").write_bytes(model.getvalue())
  (directory / "tokenizer_config.json").write_text(json.dumps(dict(
      tokenizer_class="T5Tokenizer", extra_ids=EXTRA_IDS)))


@pytest.fixture(scope="module")
def sentences():
  docs = sources.embedded_wiki(config_lib.default_cache_dir())  # the session's test cache
  return [s for d in docs[:2] for s in sources.split_sentences(d)][:400] + TEXTS


def saved_t5(version, directory, seed=0):
  """A random transformers T5 (weights N(0, 0.2²) added; v1.1's lm_head its own, N(0, 1 /
  d_model)) saved in `directory`; returns it."""
  import torch  # noqa: PLC0415
  import transformers  # noqa: PLC0415
  from helpers import hf_reference as reference  # noqa: PLC0415  (needs torch)
  config = transformers.T5Config(**SMALL, feed_forward_proj="relu" if version == "1.0" else
                                 "gated-gelu", tie_word_embeddings=version == "1.0",
                                 attn_implementation="eager")
  model, _ = reference.randomised(transformers.T5ForConditionalGeneration(config), seed)
  if version == "1.1":
    # transformers 5 ties lm_head to the shared table at construction (configuration_t5.py); a
    # v1.1 checkpoint has a head of its own.
    model.lm_head.weight = torch.nn.Parameter(SMALL["d_model"] ** -0.5 * torch.randn(
        VOCAB, SMALL["d_model"], generator=torch.Generator().manual_seed(seed)))
  model.save_pretrained(directory)
  return model


@needs_torch
@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_from_pretrained_and_save_pretrained_match_transformers(version, tmp_path):
  reference = saved_t5(version, tmp_path / "hf")
  ours = hf.from_pretrained(str(tmp_path / "hf"))
  m = ours.config.model
  assert (ours.architecture, ours.fresh, ours.config.objective.name) == (
      "T5ForConditionalGeneration", (), "t5")
  assert (m.tie_embeddings, m.gated_mlp, m.activation, m.decoder_layers) == (
      (True, False, "relu", 3) if version == "1.0" else (False, True, "gelu_tanh", 3))
  assert_same_outputs(ours, reference)
  hf.save_pretrained(ours, str(tmp_path / "ours"))
  assert_same_outputs(ours, load_in_transformers(str(tmp_path / "ours")))
  with pytest.raises(TypeError, match="decoder_input_ids"):
    ours(*inputs()[:2])


@needs_torch
def test_imported_workdir_fine_tunes_and_exports(sentences, tmp_path):
  """A v1.1 checkpoint with a T5Tokenizer imports into a workdir that text-to-text fine-tuning
  reads (its model kind, its tokenizer's EOS and sentinels, the model's parameters) and exports
  back to transformers with the same logits; the tokenizer gives transformers' ids."""
  import transformers  # noqa: PLC0415
  reference = saved_t5("1.1", tmp_path / "hf")
  t5_spiece(sentences, tmp_path / "hf")
  m = hf.import_to_workdir(str(tmp_path / "hf"), str(tmp_path / "workdir"))
  assert m.config.data.packing == "t5_segments" and m.config.optimizer.name == "adafactor"
  theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
  assert [theirs(t).input_ids for t in TEXTS] == [
      x.tolist() + [1] for x in m.tokenizer.encode(TEXTS)]
  assert theirs.convert_tokens_to_ids(["<extra_id_0>", "<extra_id_10>"]) == [VOCAB - 1, PIECES]

  workdir = str(tmp_path / "workdir")
  # Both the import and the transformers directory itself fine-tune text-to-text.
  assert workdir_lib.read_config(workdir).model.kind == "t5"
  assert hf_io.read_hf_config(str(tmp_path / "hf"))["model_type"] == "t5"
  config, tokenizer, params = workdir_lib.load(workdir)
  assert (tokenizer.eos_id, tokenizer.pad_id, tokenizer.mask_id) == (1, 0, None)
  assert (tokenizer.num_pieces, tokenizer.sentinel_start) == (PIECES, VOCAB - 1)
  features = seq2seq.featurize(tokenizer, [dict(inputs=TEXTS[0], targets=TEXTS[1])],
                               inputs_length=16, targets_length=16)
  assert features["decoder_input_ids"][0, 0] == 0 and 1 in features["decoder_target_ids"][0]
  model = seq2seq.build_model(config.model)
  zeros = np.zeros((1, 8), np.int32)
  fresh = jax.eval_shape(lambda: nn.meta.unbox(model.init(jax.random.key(0), zeros, zeros,
                                                          deterministic=True))["params"])
  assert jax.tree.map(lambda x: x.shape, fresh) == jax.tree.map(lambda x: x.shape, params)

  hf.export_workdir(workdir, str(tmp_path / "exported"))
  assert_same_outputs(hf.from_pretrained(str(tmp_path / "exported")), reference)
  assert_same_outputs(m, load_in_transformers(str(tmp_path / "exported")))


def test_tokenizer_json_and_spiece_t5_layouts_agree(sentences, tmp_path):
  """T5's layout read from spiece.model (T5Tokenizer) and from the tokenizer.json it serialises
  to: the same ids, EOS </s> = 1, no [CLS] / [SEP] / [MASK], sentinels the last ids in
  reverse."""
  t5_spiece(sentences, tmp_path / "spiece")
  from_spiece = tokenizer_lib.from_dir(str(tmp_path / "spiece"))
  (tmp_path / "json").mkdir()
  (tmp_path / "json" / "tokenizer.json").write_text(from_spiece._tokenizer.to_str())
  from_json = tokenizer_lib.from_dir(str(tmp_path / "json"))
  for tokenizer in (from_spiece, from_json):
    assert (tokenizer.vocab_size, tokenizer.extra_ids, tokenizer.eos_id) == (VOCAB, EXTRA_IDS, 1)
    assert (tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id) == (None, None, None)
    assert tokenizer.pair_separator_ids == ()
    ids = tokenizer.encode(["<extra_id_0> a <extra_id_3>"])[0].tolist()
    assert (ids[0], ids[-1]) == (VOCAB - 1, VOCAB - 4)
  assert ([x.tolist() for x in from_json.encode(TEXTS)] ==
          [x.tolist() for x in from_spiece.encode(TEXTS)])


# ------------------------------------------------------------------------------- our T5 runs


def our_t5_config(vocab_size):
  """A tiny T5 v1.1 run (untied head, scanned layers: export must unstack them)."""
  config = config_lib.base_config()
  config.model = config_lib.t5_model("mini", "1.1", hidden=32, heads=2, head_dim=16, mlp=48,
                                     vocab_size=vocab_size, scan_layers=True)
  config.objective = config_lib.t5_objective(targets_length=8)
  config.optimizer = config_lib.t5_adafactor()
  config.data.update(packing="t5_segments", seq_len=32)
  config.tokenizer.update(vocab_size=300, extra_ids=10)
  config.train.update(batch_size=8, total_steps=10)
  return config


@pytest.fixture(scope="module")
def our_t5_run(sentences, tmp_path_factory):
  """A T5 workdir as train.run leaves it (config.json, a checkpoint of random parameters, the
  SentencePiece model at tokenizer.model_path). Returns (workdir, config, params)."""
  root = tmp_path_factory.mktemp("t5run")
  proto = sp_tokenizers.train_sentencepiece(sentences, 300, "unigram")
  (root / "spm.model").write_bytes(proto)
  config = our_t5_config(320)
  config.tokenizer.model_path = str(root / "spm.model")
  workdir = str(root / "workdir")
  return workdir, config, our_runs.write_run(config, workdir)


def our_logits(config, params, ids, mask, decoder):
  model = objectives.get("t5").build_model(config)
  return jax.jit(lambda p: model.apply({"params": p}, ids, decoder, mask.astype(np.int32),
                                       deterministic=True))(params)


def test_our_run_exports_with_its_tokenizer_and_reimports(our_t5_run, tmp_path):
  workdir, config, params = our_t5_run
  exported = hf.export_workdir(workdir, str(tmp_path / "hf"))
  assert exported.architecture == "T5ForConditionalGeneration"
  assert sorted(os.listdir(tmp_path / "hf")) == [
      "config.json", "model.safetensors", "spiece.model", "tokenizer.json",
      "tokenizer_config.json"]
  written = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert {k: written[k] for k in ("feed_forward_proj", "tie_word_embeddings", "num_layers",
                                  "eos_token_id", "pad_token_id", "decoder_start_token_id")} == (
      dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False, num_layers=2,
           eos_token_id=3, pad_token_id=0, decoder_start_token_id=0))
  again = hf.from_pretrained(str(tmp_path / "hf"))
  assert again.config.model.to_dict() == dict(config.model.to_dict(), scan_layers=False)
  ids, mask, decoder = inputs(320)
  np.testing.assert_allclose(again(ids, mask, decoder_input_ids=decoder)["logits"],
                             our_logits(config, params, ids, mask, decoder), rtol=0, atol=1e-5)
  ours = sp_tokenizers.Tokenizer.from_file(config.tokenizer.model_path, extra_ids=10)
  text = ["a <extra_id_0> Café naïve <extra_id_9>."]
  assert ([x.tolist() for x in again.tokenizer.encode(TEXTS)] ==
          [x.tolist() for x in ours.encode(TEXTS)])
  assert again.tokenizer.encode(text)[0].tolist().count(ours.sentinel_start - 9) == 1
  assert (again.tokenizer.eos_id, again.tokenizer.sentinel_start, again.tokenizer.num_pieces) == (
      ours.eos_id, ours.sentinel_start, ours.num_pieces)


@needs_torch
def test_our_run_loads_in_transformers(our_t5_run, tmp_path):
  """transformers' T5ForConditionalGeneration and AutoTokenizer read the export: our logits,
  our ids with EOS ([SEP]) appended, the sentinels at our ids."""
  import transformers  # noqa: PLC0415
  workdir, config, params = our_t5_run
  hf.export_workdir(workdir, str(tmp_path / "hf"))
  ids, mask, decoder = inputs(320)
  logits, _ = hf_outputs(load_in_transformers(str(tmp_path / "hf")), ids, mask, decoder)
  np.testing.assert_allclose(logits, our_logits(config, params, ids, mask, decoder), **TOL)
  theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
  ours = sp_tokenizers.Tokenizer.from_file(config.tokenizer.model_path, extra_ids=10)
  assert [theirs(t).input_ids for t in TEXTS] == [
      x.tolist() + [ours.eos_id] for x in ours.encode(TEXTS)]
  assert theirs.convert_tokens_to_ids([f"<extra_id_{k}>" for k in (0, 9)]) == [
      ours.sentinel_start, ours.sentinel_start - 9]


def test_imported_t5_workdir_feeds_the_t5_objective(our_t5_run, sentences, tmp_path):
  """Our export imported into a workdir: T5's recipe (span corruption, Adafactor) with the
  workdir's own tokenizer files (kind 'hf'), whose ids the objective's features use: sentinels
  counted down from the last id in the inputs and targets, EOS ([SEP]) ending every example."""
  workdir, config, _ = our_t5_run
  hf.export_workdir(workdir, str(tmp_path / "hf"))
  target = str(tmp_path / "imported")
  hf.import_to_workdir(str(tmp_path / "hf"), target)
  saved = ml_collections.ConfigDict(json.loads((tmp_path / "imported" / "config.json").read_text()))
  assert (saved.objective.name, saved.optimizer.name, saved.data.packing) == (
      "t5", "adafactor", "t5_segments")
  assert (saved.tokenizer.kind, saved.tokenizer.model_path) == ("hf", "tokenizer")
  tokenizer = workdir_lib.load_tokenizer(saved, target)
  saved.data.seq_len = 32
  t5_objective = objectives.get("t5")
  length = t5_objective.segment_length(saved)
  pieces = [ids[:length] for ids in tokenizer.encode(sentences[:8])]
  tokens = np.stack([np.pad(x, (0, length - len(x))) for x in pieces])
  batch = t5_objective.make_features(saved, tokenizer)(dict(
      tokens=tokens, lengths=np.array([len(x) for x in pieces]),
      sentence_start=np.zeros_like(tokens, bool)), np.random.default_rng(0))
  sentinels = range(tokenizer.sentinel_start - 9, tokenizer.sentinel_start + 1)
  assert np.isin(batch["input_ids"], sentinels).any()
  assert np.isin(batch["decoder_target_ids"], sentinels).any()
  for key in ("input_ids", "decoder_target_ids"):
    assert (batch[key] == tokenizer.eos_id).sum() == len(pieces) and tokenizer.eos_id == 3


def test_config_round_trip_and_refusals():
  t5 = families.get("t5")
  arch = t5.architecture("T5ForConditionalGeneration")
  for version in ("1.0", "1.1"):
    model = config_lib.t5_model("small", version, vocab_size=100)
    written = families.model_to_hf(t5, arch, model, {})
    assert written["feed_forward_proj"] == ("relu" if version == "1.0" else "gated-gelu")
    assert families.model_from_hf(t5, written) == model
  full = families.full_hf_config(t5, dict(model_type="t5", **SMALL))
  assert full["num_decoder_layers"] == 3 and full["feed_forward_proj"] == "relu"
  # transformers 5 always writes tie_word_embeddings=true; scale_decoder_outputs says v1.0.
  assert not families.model_from_hf(t5, dict(SMALL, tie_word_embeddings=True,
                                             scale_decoder_outputs=False)).tie_embeddings
  assert families.model_from_hf(t5, dict(SMALL, feed_forward_proj="gelu")).activation == "gelu"
  with pytest.raises(ConfigError, match="feed_forward_proj='gated-silu'.*supported"):
    families.model_from_hf(t5, dict(SMALL, feed_forward_proj="gated-silu"))
  with pytest.raises(ConfigError, match="pad with id 0"):
    families.model_from_hf(t5, dict(SMALL, decoder_start_token_id=2))
  with pytest.raises(ConfigError, match="gelu_tanh"):
    families.model_to_hf(t5, arch, config_lib.t5_model("mini", "1.1", activation="gelu"), {})
  with pytest.raises(ConfigError, match="encoder_decoder run"):
    families.model_to_hf(t5, arch, config_lib.t5_model("mini", architecture="decoder_only"), {})
  with pytest.raises(ConfigError, match="lacks \\['d_kv'\\]"):
    families.model_from_hf(t5, {k: v for k, v in SMALL.items() if k != "d_kv"})
