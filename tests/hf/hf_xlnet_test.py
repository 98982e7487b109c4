"""bertfam_jax.hf's XLNet family: XLNetLMHeadModel ↔ models/xlnet.py (content and query streams,
mask_emb, relative position and segment biases, the tied output with its bias) in both directions
with transformers' logits (CPU, fp32, random small models, no downloads): the query stream under
a permutation mask and target mapping, and the content stream at every position; a workdir round
trip; one of our XLNet runs (biases shared by the layers, scanned) exports and re-imports with its
logits; options we do not compute are refused with the fix. The transformers comparisons skip
without torch."""

import importlib.util
import io
import json

import jax
import numpy as np
import pytest
import sentencepiece as spm

from bertfam_jax import config_lib, hf, objectives
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.data import sources
from bertfam_jax.hf import families

from helpers import our_runs

HAS_TORCH = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="needs torch and transformers "
                                 "(/tmp/venv_parity)")
VOCAB, BATCH, LENGTH = 60, 2, 10
SMALL = dict(vocab_size=VOCAB, d_model=16, n_layer=2, n_head=2, d_inner=32, dropout=0.0,
             mem_len=6, reuse_len=4)
TOL = dict(rtol=0, atol=1e-4)
TEXTS = ["Anarchism is a political philosophy.", "Café naïve résumé, 1958 and 3.14!"]


def inputs(vocab=VOCAB):
  """Rows with 2 padding positions in the second, three segments (0, 1, 2 for <cls>), a random
  factorisation order as perm_mask (1 = may not attend) and 3 targets per row (target_mapping)."""
  rng = np.random.default_rng(0)
  mask = (np.arange(LENGTH)[None] < np.array([[LENGTH], [LENGTH - 2]])).astype(np.float32)
  ids = rng.integers(0, vocab, (BATCH, LENGTH))
  types = np.tile(np.array([0] * 4 + [1] * 5 + [2], np.int32), (BATCH, 1))
  rank = np.stack([rng.permutation(LENGTH) for _ in range(BATCH)])
  perm = (rank[:, None, :] >= rank[:, :, None]).astype(np.float32)
  mapping = np.zeros((BATCH, 3, LENGTH), np.float32)
  for b in range(BATCH):
    mapping[b, np.arange(3), np.sort(rng.choice(LENGTH - 2, 3, replace=False))] = 1.0
  return dict(ids=ids, mask=mask, types=types, perm=perm, mapping=mapping)


def hf_logits(model, x, query):
  import torch  # noqa: PLC0415
  t = torch.from_numpy
  kwargs = dict(perm_mask=t(x["perm"]), target_mapping=t(x["mapping"])) if query else {}
  with torch.no_grad():
    return model(input_ids=t(x["ids"]), attention_mask=t(x["mask"]),
                 token_type_ids=t(x["types"]), **kwargs).logits.numpy()


def our_logits(m, x, query):
  kwargs = dict(perm_mask=x["perm"], target_mapping=x["mapping"]) if query else {}
  return np.asarray(m(x["ids"], x["mask"], x["types"], **kwargs)["logits"])


def assert_same_logits(ours, reference):
  """Query-stream logits [B, 3, V], and content-stream logits [B, L, V] at real tokens."""
  x = inputs()
  np.testing.assert_allclose(our_logits(ours, x, True), hf_logits(reference, x, True), **TOL)
  real = x["mask"] > 0
  np.testing.assert_allclose(our_logits(ours, x, False)[real],
                             hf_logits(reference, x, False)[real], **TOL)


def saved_xlnet(directory, seed=0, **overrides):
  import transformers  # noqa: PLC0415
  from helpers import hf_reference as reference  # noqa: PLC0415  (needs torch)
  config = transformers.XLNetConfig(**{**SMALL, **overrides})
  model, _ = reference.randomised(transformers.XLNetLMHeadModel(config), seed)
  model.save_pretrained(directory)
  return model


def load_in_transformers(path):
  import transformers  # noqa: PLC0415
  model, info = transformers.XLNetLMHeadModel.from_pretrained(path, output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  return model.eval()


@needs_torch
@pytest.mark.parametrize("activation", ["gelu", "gelu_new"])
def test_from_pretrained_and_save_pretrained_match_transformers(activation, tmp_path):
  reference = saved_xlnet(tmp_path / "hf", ff_activation=activation)
  ours = hf.from_pretrained(str(tmp_path / "hf"))
  m = ours.config.model
  assert (ours.architecture, ours.fresh, ours.config.objective.name) == (
      "XLNetLMHeadModel", (), "xlnet")
  assert (m.activation, m.untie_r, m.mem_len, m.reuse_len, m.head_dim) == (
      {"gelu": "gelu", "gelu_new": "gelu_tanh"}[activation], True, 6, 4, 8)
  assert_same_logits(ours, reference)
  hf.save_pretrained(ours, str(tmp_path / "ours"))
  assert_same_logits(ours, load_in_transformers(str(tmp_path / "ours")))


def xlnet_spiece(directory):
  """XLNet's SentencePiece layout (<unk> 0, <s> 1, </s> 2, <cls> 3, <sep> 4, <pad> 5, <mask> 6,
  <eod> 7, <eop> 8) with VOCAB pieces, saved with tokenizer_config.json naming XLNetTokenizer."""
  docs = sources.embedded_wiki(config_lib.default_cache_dir())  # the session's test cache
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter([s for d in docs[:2] for s in sources.split_sentences(d)][:400]),
      model_writer=model, vocab_size=VOCAB, unk_id=0, bos_id=1, eos_id=2, pad_id=5,
      control_symbols=["<cls>", "<sep>", "<mask>"], user_defined_symbols=["<eod>", "<eop>"],
      model_type="unigram", character_coverage=0.98, minloglevel=2)
  (directory / "spiece.model").write_bytes(model.getvalue())
  (directory / "tokenizer_config.json").write_text(json.dumps(dict(
      tokenizer_class="XLNetTokenizer")))


@needs_torch
def test_workdir_round_trip(tmp_path):
  """An XLNetLMHeadModel with XLNet's tokenizer imports into a workdir (XLNet's recipe: windows
  of 2 · reuse_len, permutation blocks of reuse_len, no memory in the checkpoint; the
  tokenizer's <cls>, <sep> and <eod> with transformers' ids) and exports back."""
  import transformers  # noqa: PLC0415
  reference = saved_xlnet(tmp_path / "hf")
  xlnet_spiece(tmp_path / "hf")
  m = hf.import_to_workdir(str(tmp_path / "hf"), str(tmp_path / "workdir"))
  t = m.tokenizer
  assert (t.unk_id, t.cls_id, t.sep_id, t.pad_id, t.mask_id, t.eod_id) == (0, 3, 4, 5, 6, 7)
  theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
  assert [theirs(x).input_ids for x in TEXTS] == [ids.tolist() + [4, 3]
                                                  for ids in t.encode(TEXTS)]
  assert (m.config.data.seq_len, m.config.objective.perm_size, m.config.objective.num_predict) == (
      8, 4, 1)
  hf.export_workdir(str(tmp_path / "workdir"), str(tmp_path / "exported"))
  assert_same_logits(m, reference)
  assert_same_logits(m, load_in_transformers(str(tmp_path / "exported")))
  again = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "exported"))
  assert [again(x).input_ids for x in TEXTS] == [theirs(x).input_ids for x in TEXTS]


@needs_torch
def test_bare_xlnet_model_imports_with_a_fresh_output_bias(tmp_path):
  import transformers  # noqa: PLC0415
  reference = saved_xlnet(tmp_path / "full")
  reference.transformer.save_pretrained(tmp_path / "bare")  # XLNetModel: no 'transformer.'
  ours = hf.from_pretrained(str(tmp_path / "bare"))
  assert (ours.architecture, ours.fresh) == ("XLNetLMHeadModel", ("lm_loss",))
  assert not np.any(ours.params["lm_loss"]["bias"])
  with_zero_bias = transformers.XLNetLMHeadModel(reference.config).eval()
  with_zero_bias.load_state_dict({**reference.state_dict(),
                                  "lm_loss.bias": 0 * reference.lm_loss.bias})
  assert_same_logits(ours, with_zero_bias)


# ---------------------------------------------------------------------------- our XLNet runs


@pytest.fixture(scope="module")
def our_xlnet_run(tmp_path_factory):
  """An XLNet workdir of random parameters with the biases shared by the layers (untie_r=False)
  and scanned layers; no tokenizer. Returns (workdir, config, params)."""
  config = config_lib.base_config()
  config.model = config_lib.xlnet_model("mini", vocab_size=VOCAB, hidden=16, layers=2, heads=2,
                                        head_dim=8, mlp=32, mem_len=8, reuse_len=8, untie_r=False,
                                        scan_layers=True)
  config.objective = config_lib.xlnet_objective(num_predict=4, perm_size=8)
  config.data.update(packing="xlnet_streams", seq_len=16)
  config.tokenizer.model_path = "/nonexistent/spm.model"  # exported without one, with a warning
  config.train.batch_size = 2
  workdir = str(tmp_path_factory.mktemp("xlnet") / "workdir")
  return workdir, config, our_runs.write_run(config, workdir)


def test_our_run_exports_and_reimports(our_xlnet_run, tmp_path):
  workdir, config, params = our_xlnet_run
  exported = hf.export_workdir(workdir, str(tmp_path / "hf"))
  assert exported.architecture == "XLNetLMHeadModel"
  written = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert {k: written[k] for k in ("d_model", "n_head", "d_head", "mem_len", "reuse_len",
                                  "ff_activation", "bi_data")} == dict(
      d_model=16, n_head=2, d_head=8, mem_len=8, reuse_len=8, ff_activation="gelu_new",
      bi_data=False)
  again = hf.from_pretrained(str(tmp_path / "hf"))
  assert again.config.model.to_dict() == dict(config.model.to_dict(), untie_r=True,
                                              scan_layers=False)
  for i in range(2):  # every layer holds the shared biases
    np.testing.assert_array_equal(again.params[f"layer_{i}"]["rel_attn"]["r_w_bias"],
                                  params["r_w_bias"])
  x = inputs()
  model = objectives.get("xlnet").build_model(config)
  out = jax.jit(lambda p: model.apply(
      {"params": p}, x["ids"], x["types"], x["mask"], x["perm"], x["mapping"],
      deterministic=True))(params)
  np.testing.assert_allclose(our_logits(again, x, True), out["logits"], rtol=0, atol=1e-5)


@needs_torch
def test_our_run_loads_in_transformers(our_xlnet_run, tmp_path):
  workdir, _, _ = our_xlnet_run
  m = hf.export_workdir(workdir, str(tmp_path / "hf"))
  assert_same_logits(m, load_in_transformers(str(tmp_path / "hf")))


def test_config_round_trip_and_refusals():
  xlnet = families.get("xlnet")
  arch = xlnet.architecture("XLNetLMHeadModel")
  model = config_lib.xlnet_model("base", vocab_size=100)
  assert families.model_from_hf(xlnet, families.model_to_hf(xlnet, arch, model, {})) == model
  # HF's defaults: mem_len 512, no reuse_len (ours: the paper's 256), exact GELU.
  imported = families.model_from_hf(xlnet, dict(SMALL, mem_len=None, reuse_len=None))
  assert (imported.mem_len, imported.reuse_len, imported.activation) == (384, 256, "gelu")
  for field, value in (("same_length", True), ("attn_type", "uni"), ("bi_data", True)):
    with pytest.raises(ConfigError, match=f"'{field}': {value!r}.*set those in config.json"):
      families.model_from_hf(xlnet, dict(SMALL, **{field: value}))
  with pytest.raises(ConfigError, match="ff_activation='swish'"):
    families.model_from_hf(xlnet, dict(SMALL, ff_activation="swish"))
  with pytest.raises(ConfigError, match="heads · head_dim = hidden"):
    families.model_to_hf(xlnet, arch, config_lib.xlnet_model("mini", head_dim=32), {})
