"""bertfam_jax.hf's GPT families: GPT2LMHeadModel (pre-LN, final LayerNorm) and
OpenAIGPTLMHeadModel (post-LN) ↔ our causal Encoder (models/pretraining.CausalLM), in both
directions with transformers' logits (CPU, fp32, random small models, no downloads), GPT-2's
greedy generation equal to transformers' `generate`, one of our GPT runs (scanned) exporting and
re-importing with its logits, and the options we do not compute refused with the fix. The
transformers comparisons skip without torch."""

import importlib.util
import json

import jax
import numpy as np
import pytest

from bertfam_jax import config_lib, generate, hf, objectives
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.hf import families

from helpers import our_runs

HAS_TORCH = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="needs torch and transformers")
VOCAB, BATCH, LENGTH = 60, 2, 12
SMALL = dict(vocab_size=VOCAB, n_positions=24, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.0,
             embd_pdrop=0.0, attn_pdrop=0.0)
TOL = dict(rtol=0, atol=1e-4)
CLASSES = {"gpt2": ("GPT2Config", "GPT2LMHeadModel"),
           "openai-gpt": ("OpenAIGPTConfig", "OpenAIGPTLMHeadModel")}


def inputs():
  """Two rows, the second right-padded by 3."""
  rng = np.random.default_rng(0)
  mask = (np.arange(LENGTH)[None] < np.array([[LENGTH], [LENGTH - 3]])).astype(np.int64)
  return rng.integers(0, VOCAB, (BATCH, LENGTH)), mask


def hf_logits(model):
  import torch  # noqa: PLC0415
  ids, mask = inputs()
  with torch.no_grad():
    return model(input_ids=torch.from_numpy(ids),
                 attention_mask=torch.from_numpy(mask)).logits.numpy()


def assert_same_logits(ours, reference):
  """Logits [B, L, V] at the real tokens of a right-padded batch."""
  ids, mask = inputs()
  real = mask > 0
  np.testing.assert_allclose(np.asarray(ours(ids, mask)["logits"])[real],
                             hf_logits(reference)[real], **TOL)


def saved_gpt(directory, model_type, seed=0, **overrides):
  import transformers  # noqa: PLC0415
  from helpers import hf_reference as reference  # noqa: PLC0415  (needs torch)
  config_class, model_class = (getattr(transformers, n) for n in CLASSES[model_type])
  model, _ = reference.randomised(model_class(config_class(**{**SMALL, **overrides})), seed)
  model.save_pretrained(directory)
  return model


def load_in_transformers(path, model_type):
  import transformers  # noqa: PLC0415
  model_class = getattr(transformers, CLASSES[model_type][1])
  model, info = model_class.from_pretrained(path, output_loading_info=True)
  assert not info["missing_keys"], info
  return model.eval()


@needs_torch
@pytest.mark.parametrize("model_type,overrides,layout", [
    ("gpt2", {}, dict(pre_layer_norm=True, activation="gelu_tanh", mlp=64)),
    ("gpt2", dict(activation_function="gelu", n_inner=24),
     dict(pre_layer_norm=True, activation="gelu", mlp=24)),
    ("openai-gpt", {}, dict(pre_layer_norm=False, activation="gelu_tanh", mlp=64)),
])
def test_from_pretrained_and_save_pretrained_match_transformers(model_type, overrides, layout,
                                                                tmp_path):
  reference = saved_gpt(tmp_path / "hf", model_type, **overrides)
  ours = hf.from_pretrained(str(tmp_path / "hf"))
  m = ours.config.model
  assert (ours.architecture, ours.fresh, ours.config.objective.name) == (
      CLASSES[model_type][1], (), "causal_lm")
  assert {k: m[k] for k in layout} == layout and m.causal and not m.embedding_layer_norm
  assert_same_logits(ours, reference)
  hf.save_pretrained(ours, str(tmp_path / "ours"))
  assert_same_logits(ours, load_in_transformers(str(tmp_path / "ours"), model_type))


@needs_torch
def test_greedy_generation_equals_transformers_generate(tmp_path):
  """Our cached greedy decode of GPT-2 continues a prompt with transformers' tokens."""
  import torch  # noqa: PLC0415
  reference = saved_gpt(tmp_path / "hf", "gpt2")
  ours = hf.from_pretrained(str(tmp_path / "hf"))
  model = objectives.get("causal_lm").build_model(ours.config)
  prompt = np.random.default_rng(1).integers(0, VOCAB, (1, 5))
  tokens = generate.generate(model, ours.params, prompt, [5], max_length=20,
                             rng=jax.random.key(0), temperature=0.0)
  with torch.no_grad():
    theirs = reference.generate(torch.from_numpy(prompt), max_length=20, do_sample=False,
                                pad_token_id=0, eos_token_id=None).numpy()
  np.testing.assert_array_equal(tokens, theirs)


BYTE_LEVEL_VOCAB = 300  # 256 bytes, <|endoftext|> and merges


def gpt2_tokenizer(directory):
  """A byte-level BPE of BYTE_LEVEL_VOCAB ids whose one special token is <|endoftext|> (id 0), saved as
  transformers' GPT2TokenizerFast saves it (pad_token null)."""
  import transformers  # noqa: PLC0415
  from tokenizers import ByteLevelBPETokenizer  # noqa: PLC0415
  bpe = ByteLevelBPETokenizer()
  bpe.train_from_iterator(["The cat sat on the mat.", "A political philosophy."] * 20,
                          vocab_size=BYTE_LEVEL_VOCAB, special_tokens=["<|endoftext|>"],
                          show_progress=False)
  tokenizer = transformers.GPT2TokenizerFast(tokenizer_object=bpe._tokenizer,  # noqa: SLF001
                                             bos_token="<|endoftext|>",
                                             eos_token="<|endoftext|>",
                                             unk_token="<|endoftext|>")
  tokenizer.save_pretrained(directory)
  return tokenizer


@needs_torch
def test_workdir_round_trip_with_gpt2s_tokenizer_and_generation(tmp_path):
  """A GPT2LMHeadModel with GPT-2's tokenizer imports into a workdir (GPT's recipe: lm_stream
  rows closed by <|endoftext|>, which also pads), generates text through the CLI's function,
  and exports back with the same logits and token ids."""
  import transformers  # noqa: PLC0415
  reference = saved_gpt(tmp_path / "hf", "gpt2", vocab_size=BYTE_LEVEL_VOCAB)
  theirs = gpt2_tokenizer(tmp_path / "hf")
  assert len(theirs.get_vocab()) <= BYTE_LEVEL_VOCAB
  m = hf.import_to_workdir(str(tmp_path / "hf"), str(tmp_path / "workdir"))
  t = m.tokenizer
  assert (t.eod_id, t.pad_id) == (0, 0) and m.config.data.packing == "lm_stream"
  assert [theirs(x).input_ids for x in ("The cat sat.",)] == [t.encode(["The cat sat."])[0].tolist()]
  texts = generate.generate_texts(str(tmp_path / "workdir"), ["The cat", "A"], max_new_tokens=4,
                                  temperature=0.0)
  assert len(texts) == 2 and texts[0].startswith("The cat") and texts[1].startswith("A")
  hf.export_workdir(str(tmp_path / "workdir"), str(tmp_path / "exported"))
  assert_same_logits(m, load_in_transformers(str(tmp_path / "exported"), "gpt2"))
  assert_same_logits(m, reference)
  again = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "exported"))
  assert again("The cat sat.").input_ids == theirs("The cat sat.").input_ids


@pytest.mark.parametrize("model_type,field,value", [
    ("gpt2", "scale_attn_by_inverse_layer_idx", True), ("gpt2", "add_cross_attention", True),
    ("gpt2", "activation_function", "silu"), ("openai-gpt", "afn", "silu")])
def test_options_we_do_not_compute_are_refused(model_type, field, value):
  hf_config = {**SMALL, field: value}
  with pytest.raises(ConfigError, match=field):
    families.model_from_hf(families.get(model_type), hf_config)


# ------------------------------------------------------------------------------ our GPT runs


@pytest.fixture(scope="module")
def our_gpt_run(tmp_path_factory):
  """A GPT-2 workdir of random parameters with scanned layers; no tokenizer. Returns (workdir,
  config, params)."""
  config = config_lib.base_config()
  config.model = config_lib.gpt_model("mini", 2, vocab_size=VOCAB, hidden=16, layers=2, heads=2,
                                      mlp=32, max_positions=16, scan_layers=True)
  config.objective = config_lib.ml_collections.ConfigDict(dict(name="causal_lm"))
  config.data.update(packing="lm_stream", seq_len=16)
  config.tokenizer.model_path = "/nonexistent/spm.model"  # exported without one, with a warning
  config.train.batch_size = 2
  workdir = str(tmp_path_factory.mktemp("gpt") / "workdir")
  return workdir, config, our_runs.write_run(config, workdir)


def test_our_run_exports_and_reimports(our_gpt_run, tmp_path):
  workdir, config, params = our_gpt_run
  exported = hf.export_workdir(workdir, str(tmp_path / "hf"))
  assert exported.architecture == "GPT2LMHeadModel"
  written = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert {k: written[k] for k in ("n_embd", "n_head", "n_inner", "n_positions",
                                  "activation_function", "model_type")} == dict(
      n_embd=16, n_head=2, n_inner=32, n_positions=16, activation_function="gelu_new",
      model_type="gpt2")
  again = hf.from_pretrained(str(tmp_path / "hf"))
  assert again.config.model.to_dict() == dict(config.model.to_dict(), scan_layers=False)
  ids, mask = inputs()
  ids, mask = ids[:, :8], mask[:, :8]
  model = objectives.get("causal_lm").build_model(config)
  out = jax.jit(lambda p: model.apply({"params": p}, ids, mask, deterministic=True))(params)
  np.testing.assert_allclose(np.asarray(again(ids, mask)["logits"]), out, rtol=0, atol=1e-5)


@needs_torch
def test_our_run_loads_in_transformers(our_gpt_run, tmp_path):
  workdir, _, _ = our_gpt_run
  ours = hf.export_workdir(workdir, str(tmp_path / "hf"))
  assert_same_logits(ours, load_in_transformers(str(tmp_path / "hf"), "gpt2"))


@pytest.mark.parametrize("field,value,message", [
    ("pre_layer_norm", False, "pre_layer_norm=False"),
    ("type_vocab_size", 2, "token types"), ("share_layers", "all", "shared layers")])
def test_what_gpt2_cannot_hold_is_refused_on_export(our_gpt_run, tmp_path, field, value,
                                                   message):
  _, config, params = our_gpt_run
  config = config_lib.ml_collections.ConfigDict(config.to_dict())
  config.model[field] = value
  ours = hf.HFModel(config, params, None, {"model_type": "gpt2"}, "GPT2LMHeadModel")
  with pytest.raises(ConfigError, match=message):
    hf.save_pretrained(ours, str(tmp_path / "hf"))
