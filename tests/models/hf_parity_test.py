"""Parity with HuggingFace's PyTorch BERT, RoBERTa, ALBERT and ELECTRA (transformers 5 has no Flax
classes; STACK.md §5): random HF weights mapped onto our parameter tree give the same MLM and
NSP/SOP logits (and ALBERT's hidden states), ELECTRA's discriminator and generator checkpoints give
the same detection logits, generator MLM logits and hidden states in our one `Electra` (whose
generator reads the discriminator's tables), and the parameter counts of the released models agree.
The name mapping under test is the package's (bertfam_jax/hf/mapping.py, families.py).

Needs torch and transformers (e.g. a venv with `pip install torch==2.13.0 transformers`); skipped
without them.
"""

import importlib.util
import math
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertfam_jax import config_lib
from bertfam_jax.hf import families, mapping
from bertfam_jax.hf.mapping import SHARED_EMBEDDINGS
from bertfam_jax.models import electra, pretraining

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _load(path):
  """A test module loaded by path under a name of its own: a bare `import` by basename would
  meet a same-named module of another test folder."""
  spec = importlib.util.spec_from_file_location(f"hf_parity_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


# The exact HF counts and the released configs, from the torch-free ELECTRA tests.
electra_test = _load(pathlib.Path(__file__).with_name("electra_test.py"))
from helpers.hf_reference import randomised  # noqa: E402  (needs torch: after the importorskip)

BATCH, LENGTH, VOCAB, HIDDEN, LAYERS, HEADS, MLP = 2, 16, 101, 32, 2, 4, 64
REAL_TOKENS = (LENGTH, 11)  # the second row ends in 5 padding positions
MLM_POSITIONS = np.array([[0, 5, 15], [3, 7, 10]], np.int64)  # all at real tokens
TOL = dict(rtol=1e-5, atol=1e-5)

def params_from_hf(state_dict, config, hf_config, architecture):
  """An HF state_dict → our parameter tree (jnp) of `architecture`, through the package's
  mapping (bertfam_jax/hf/families.py)."""
  family = families.get(hf_config.model_type)
  hf = families.full_hf_config(family, hf_config.to_dict())
  entries = families.entries(family, family.architecture(architecture), config, hf)
  return jax.tree.map(jnp.asarray, mapping.params_from_hf(state_dict, entries))


def electra_params_from_hf(state_dict, config, network):
  """An HF ElectraForPreTraining ('discriminator') or ElectraForMaskedLM ('generator')
  state_dict → its part of our Electra's parameter tree (mapping.electra_entries)."""
  return jax.tree.map(jnp.asarray,
                      mapping.params_from_hf(state_dict, mapping.electra_entries(config, network)))


def make_inputs(*, pad_id, first_id):
  """Right-padded rows of ids in [first_id, VOCAB), two segments (B from position 6)."""
  rng = np.random.default_rng(0)
  input_mask = (np.arange(LENGTH)[None] < np.array(REAL_TOKENS)[:, None]).astype(np.int64)
  input_ids = np.where(input_mask > 0, rng.integers(first_id, VOCAB, (BATCH, LENGTH)), pad_id)
  segment_ids = input_mask * (np.arange(LENGTH)[None] >= 6)
  return input_ids, input_mask, segment_ids


def check_tree_and_count(params, model, hf_model, extra_hf_params=0, part=lambda tree: tree):
  """The mapped tree is exactly our model's tree (or `part` of it, for a checkpoint that holds
  only that), and every HF parameter has a counterpart."""
  ids = jnp.zeros((1, LENGTH), jnp.int32)
  shapes = part(jax.eval_shape(lambda: nn.meta.unbox(
      model.init(jax.random.key(0), ids, ids, ids, ids[:, :1], deterministic=True))["params"]))
  assert jax.tree.structure(params) == jax.tree.structure(shapes)
  assert jax.tree.map(jnp.shape, params) == jax.tree.map(lambda s: s.shape, shapes)
  ours = sum(x.size for x in jax.tree.leaves(params))
  assert ours + extra_hf_params == sum(p.numel() for p in hf_model.parameters())


def our_logits(model, params, input_ids, input_mask, segment_ids, method=None):
  as_int32 = lambda x: jnp.asarray(x, jnp.int32)  # noqa: E731
  return model.apply({"params": params}, as_int32(input_ids), as_int32(input_mask),
                     as_int32(segment_ids), as_int32(MLM_POSITIONS), deterministic=True,
                     method=method)


def at_masked_positions(logits_BLV):
  return logits_BLV[np.arange(BATCH)[:, None], MLM_POSITIONS]


@pytest.mark.parametrize("activation, hidden_act", [
    ("gelu", "gelu"),            # HF's BERT: exact GELU
    ("gelu_tanh", "gelu_new"),   # TF BERT's tanh approximation (HF's 'gelu_new')
])
def test_bert_for_pretraining_parity(activation, hidden_act):
  hf_config = transformers.BertConfig(
      vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
      intermediate_size=MLP, max_position_embeddings=LENGTH, type_vocab_size=2,
      hidden_act=hidden_act, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
      layer_norm_eps=1e-12, attn_implementation="eager")
  hf_model, sd = randomised(transformers.BertForPreTraining(hf_config))
  # Our head is tied to the input embedding, so HF's must be too.
  np.testing.assert_array_equal(sd["cls.predictions.decoder.weight"],
                                sd["bert.embeddings.word_embeddings.weight"])
  config = config_lib.encoder("base", hidden=HIDDEN, layers=LAYERS, heads=HEADS, mlp=MLP,
                              vocab_size=VOCAB, max_positions=LENGTH, activation=activation,
                              layer_norm_eps=1e-12)
  model = pretraining.MaskedLM(config, sentence_classes=2)
  params = params_from_hf(sd, config, hf_config, "BertForPreTraining")
  check_tree_and_count(params, model, hf_model)

  input_ids, input_mask, segment_ids = make_inputs(pad_id=0, first_id=1)
  with torch.no_grad():
    hf = hf_model(input_ids=torch.tensor(input_ids), attention_mask=torch.tensor(input_mask),
                  token_type_ids=torch.tensor(segment_ids))
  ours = our_logits(model, params, input_ids, input_mask, segment_ids)
  np.testing.assert_allclose(ours["mlm_logits"], at_masked_positions(hf.prediction_logits.numpy()),
                             **TOL)
  np.testing.assert_allclose(ours["sentence_logits"], hf.seq_relationship_logits.numpy(), **TOL)


def test_roberta_for_masked_lm_parity():
  pad_id = 1  # fairseq's <pad>; HF's positions of real tokens start at pad_id + 1
  hf_config = transformers.RobertaConfig(
      vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
      intermediate_size=MLP, max_position_embeddings=LENGTH + pad_id + 1, type_vocab_size=1,
      hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
      layer_norm_eps=1e-5, pad_token_id=pad_id, attn_implementation="eager")
  hf_model, sd = randomised(transformers.RobertaForMaskedLM(hf_config))
  np.testing.assert_array_equal(sd["lm_head.decoder.weight"],
                                sd["roberta.embeddings.word_embeddings.weight"])
  np.testing.assert_array_equal(sd["lm_head.decoder.bias"], sd["lm_head.bias"])
  config = config_lib.encoder("base", hidden=HIDDEN, layers=LAYERS, heads=HEADS, mlp=MLP,
                              vocab_size=VOCAB, max_positions=LENGTH, activation="gelu",
                              layer_norm_eps=1e-5, type_vocab_size=1)
  model = pretraining.MaskedLM(config)
  params = params_from_hf(sd, config, hf_config, "RobertaForMaskedLM")
  # HF's position rows 0 and 1 are never used by a real token.
  check_tree_and_count(params, model, hf_model, extra_hf_params=(pad_id + 1) * HIDDEN)

  # Real ids avoid pad_id, from which HF derives its position ids; padded positions get HF's
  # padding row, which only padded queries see, and we compare real positions only.
  input_ids, input_mask, _ = make_inputs(pad_id=pad_id, first_id=pad_id + 2)
  segment_ids = np.zeros_like(input_ids)
  with torch.no_grad():
    hf = hf_model(input_ids=torch.tensor(input_ids), attention_mask=torch.tensor(input_mask))
  ours = our_logits(model, params, input_ids, input_mask, segment_ids)
  assert ours.keys() == {"mlm_logits"}
  np.testing.assert_allclose(ours["mlm_logits"], at_masked_positions(hf.logits.numpy()), **TOL)


@pytest.mark.parametrize("groups", [1, 2])  # 3 layers in 2 groups: layers 0, 1 → 0 and 2 → 1
def test_albert_for_pretraining_parity(groups):
  embedding, layers = 16, 3
  hf_config = transformers.AlbertConfig(
      vocab_size=VOCAB, embedding_size=embedding, hidden_size=HIDDEN, num_hidden_layers=layers,
      num_hidden_groups=groups, num_attention_heads=HEADS, intermediate_size=MLP,
      max_position_embeddings=LENGTH, type_vocab_size=2, hidden_act="gelu_new",
      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0,
      layer_norm_eps=1e-12, attn_implementation="eager")
  hf_model, sd = randomised(transformers.AlbertForPreTraining(hf_config))
  np.testing.assert_array_equal(sd["predictions.decoder.weight"],
                                sd["albert.embeddings.word_embeddings.weight"])
  config = config_lib.albert_encoder("base", hidden=HIDDEN, layers=layers, heads=HEADS, mlp=MLP,
                                     embedding_size=embedding, vocab_size=VOCAB,
                                     max_positions=LENGTH, hidden_groups=groups)
  model = pretraining.MaskedLM(config, sentence_classes=2)
  params = params_from_hf(sd, config, hf_config, "AlbertForPreTraining")
  check_tree_and_count(params, model, hf_model)

  input_ids, input_mask, segment_ids = make_inputs(pad_id=0, first_id=1)
  torch_inputs = dict(input_ids=torch.tensor(input_ids), attention_mask=torch.tensor(input_mask),
                      token_type_ids=torch.tensor(segment_ids))
  with torch.no_grad():
    hf = hf_model(**torch_inputs)
    hf_hidden = hf_model.albert(**torch_inputs).last_hidden_state.numpy()
  ours = our_logits(model, params, input_ids, input_mask, segment_ids)
  np.testing.assert_allclose(ours["mlm_logits"], at_masked_positions(hf.prediction_logits.numpy()),
                             **TOL)
  np.testing.assert_allclose(ours["sentence_logits"], hf.sop_logits.numpy(), **TOL)
  hidden = model.apply({"params": params}, *(jnp.asarray(x, jnp.int32) for x in
                                             (input_ids, input_mask, segment_ids)),
                       deterministic=True, method=lambda m, *a, **kw: m.encoder(*a, **kw))
  real = input_mask > 0
  np.testing.assert_allclose(np.asarray(hidden)[real], hf_hidden[real], **TOL)


# ELECTRA: a discriminator with a factorised embedding (E 16 < H 32, so `embeddings_project` is
# used) and a generator of hidden 24 reading those 16-wide tables through its own projection.
ELECTRA_EMBEDDING, GENERATOR_HIDDEN, GENERATOR_HEADS = 16, 24, 2


def electra_configs():
  """(discriminator, generator) `model` sections. ELECTRA's own defaults are under test: exact GELU
  (HF 'gelu', also hard-wired in its generator head) and LN ε 1e-12, as HF's ElectraConfig."""
  discriminator = config_lib.electra_encoder(
      "small", hidden=HIDDEN, layers=LAYERS, heads=HEADS, mlp=MLP,
      embedding_size=ELECTRA_EMBEDDING, vocab_size=VOCAB, max_positions=LENGTH)
  assert (discriminator.activation, discriminator.layer_norm_eps) == ("gelu", 1e-12)
  generator = config_lib.electra_generator(discriminator, hidden_fraction=0.75,
                                           layers_fraction=1.0)
  assert (generator.hidden, generator.embedding_size) == (GENERATOR_HIDDEN, ELECTRA_EMBEDDING)
  generator.heads = GENERATOR_HEADS  # max(1, 24 // 64) = 1 would not exercise the head split
  return discriminator, generator


def hf_electra(model_class, config, seed):
  """A randomised HF ELECTRA network with the shape of our `config`, dropout off."""
  hf_config = transformers.ElectraConfig(
      vocab_size=VOCAB, embedding_size=config.embedding_size, hidden_size=config.hidden,
      num_hidden_layers=config.layers, num_attention_heads=config.heads,
      intermediate_size=config.mlp, max_position_embeddings=LENGTH, type_vocab_size=2,
      hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
      layer_norm_eps=1e-12, attn_implementation="eager")
  return randomised(model_class(hf_config), seed)


def electra_inputs():
  input_ids, input_mask, segment_ids = make_inputs(pad_id=0, first_id=1)
  torch_inputs = dict(input_ids=torch.tensor(input_ids), attention_mask=torch.tensor(input_mask),
                      token_type_ids=torch.tensor(segment_ids))
  return (input_ids, input_mask, segment_ids), torch_inputs


def our_hidden(model, params, inputs, network):
  """Hidden states [batch, length, width] of `network` ('encoder' or 'generator') in our Electra."""
  return np.asarray(model.apply(
      {"params": params}, *(jnp.asarray(x, jnp.int32) for x in inputs), deterministic=True,
      method=lambda m, *a, **kw: getattr(m, network)(*a, **kw)))


def test_electra_discriminator_parity():
  discriminator, generator = electra_configs()
  model = electra.Electra(discriminator, generator)
  hf_model, sd = hf_electra(transformers.ElectraForPreTraining, discriminator, seed=0)
  assert "electra.embeddings_project.weight" in sd
  params = electra_params_from_hf(sd, discriminator, "discriminator")
  # The discriminator checkpoint is exactly our `encoder` + `rtd_head`.
  check_tree_and_count(params, model, hf_model,
                       part=lambda tree: {k: tree[k] for k in ("encoder", "rtd_head")})

  inputs, torch_inputs = electra_inputs()
  with torch.no_grad():
    hf = hf_model(**torch_inputs)
    hf_hidden = hf_model.electra(**torch_inputs).last_hidden_state.numpy()
  ours = our_logits(model, params, *inputs, method="discriminate")
  assert ours.keys() == {"rtd_logits"}
  real = inputs[1] > 0
  np.testing.assert_allclose(np.asarray(ours["rtd_logits"])[real], hf.logits.numpy()[real], **TOL)
  np.testing.assert_allclose(our_hidden(model, params, inputs, "encoder")[real], hf_hidden[real],
                             **TOL)


def test_electra_generator_parity():
  discriminator, generator = electra_configs()
  model = electra.Electra(discriminator, generator)
  hf_model, sd = hf_electra(transformers.ElectraForMaskedLM, generator, seed=1)
  np.testing.assert_array_equal(sd["generator_lm_head.weight"],
                                sd["electra.embeddings.word_embeddings.weight"])
  assert "electra.embeddings_project.weight" in sd
  # HF's generator embeddings land in OUR discriminator's tables, which our generator reads; the
  # rest is `generator` + `generator_head`. HF counts its tied decoder weight once, as we do.
  params = electra_params_from_hf(sd, generator, "generator")
  check_tree_and_count(params, model, hf_model, part=lambda tree: {
      "encoder": {k: tree["encoder"][k] for k in SHARED_EMBEDDINGS},
      "generator": tree["generator"], "generator_head": tree["generator_head"]})

  inputs, torch_inputs = electra_inputs()
  with torch.no_grad():
    hf = hf_model(**torch_inputs)
    hf_hidden = hf_model.electra(**torch_inputs).last_hidden_state.numpy()
  ours = our_logits(model, params, *inputs, method="generate")
  np.testing.assert_allclose(ours, at_masked_positions(hf.logits.numpy()), **TOL)
  real = inputs[1] > 0
  np.testing.assert_allclose(our_hidden(model, params, inputs, "generator")[real],
                             hf_hidden[real], **TOL)


def test_electra_checkpoint_pair_fills_our_model():
  """A discriminator and a generator checkpoint whose embeddings are equal (the released pairs
  were trained sharing them) together are exactly our whole Electra, and its `__call__` gives
  both networks' logits."""
  discriminator, generator = electra_configs()
  model = electra.Electra(discriminator, generator)
  hf_discriminator, disc_sd = hf_electra(transformers.ElectraForPreTraining, discriminator, seed=0)
  hf_generator, _ = hf_electra(transformers.ElectraForMaskedLM, generator, seed=1)
  with torch.no_grad():
    for name, p in hf_generator.electra.embeddings.named_parameters():
      p.copy_(hf_discriminator.electra.embeddings.get_parameter(name))
  gen_sd = {k: v.detach().numpy() for k, v in hf_generator.state_dict().items()}
  disc_params = electra_params_from_hf(disc_sd, discriminator, "discriminator")
  gen_params = electra_params_from_hf(gen_sd, generator, "generator")
  # The generator's copy of the shared tables is the discriminator's: nothing is lost by merging.
  jax.tree.map(np.testing.assert_array_equal, gen_params["encoder"],
               {k: disc_params["encoder"][k] for k in SHARED_EMBEDDINGS})
  params = {**gen_params, **disc_params}
  shared = sum(p.numel() for p in hf_generator.electra.embeddings.parameters())
  check_tree_and_count(params, model, hf_discriminator,
                       extra_hf_params=shared - sum(p.numel() for p in hf_generator.parameters()))

  inputs, torch_inputs = electra_inputs()
  with torch.no_grad():
    hf_rtd = hf_discriminator(**torch_inputs).logits.numpy()
    hf_mlm = hf_generator(**torch_inputs).logits.numpy()
  ours = our_logits(model, params, *inputs)
  real = inputs[1] > 0
  np.testing.assert_allclose(np.asarray(ours["rtd_logits"])[real], hf_rtd[real], **TOL)
  np.testing.assert_allclose(ours["generator_logits"], at_masked_positions(hf_mlm), **TOL)


def abstract_param_count(config, sentence_classes):
  model = pretraining.MaskedLM(config, sentence_classes)
  ids = jnp.zeros((1, 8), jnp.int32)
  shapes = jax.eval_shape(lambda: nn.meta.unbox(
      model.init(jax.random.key(0), ids, ids, ids, ids[:, :1], deterministic=True)))
  return sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))


def hf_param_count(model_class, hf_config):
  with torch.device("meta"):  # shapes only: nothing is allocated
    return sum(p.numel() for p in model_class(hf_config).parameters())


def test_base_parameter_counts_equal_hf():
  bert = config_lib.encoder("base", vocab_size=30522)
  hf_bert = transformers.BertConfig(vocab_size=30522, max_position_embeddings=512,
                                    type_vocab_size=2)
  assert abstract_param_count(bert, 2) == hf_param_count(transformers.BertForPreTraining,
                                                         hf_bert)
  roberta = config_lib.encoder("base", vocab_size=50265, type_vocab_size=1)
  hf_roberta = transformers.RobertaConfig(vocab_size=50265, max_position_embeddings=514,
                                          type_vocab_size=1, pad_token_id=1)
  # HF's 2 extra position rows: its positions start at padding_idx + 1.
  assert abstract_param_count(roberta, 0) + 2 * roberta.hidden == hf_param_count(
      transformers.RobertaForMaskedLM, hf_roberta)
  albert = config_lib.albert_encoder("base")
  hf_albert = transformers.AlbertConfig(vocab_size=30000, embedding_size=128, hidden_size=768,
                                        num_hidden_layers=12, num_attention_heads=12,
                                        intermediate_size=3072)
  assert abstract_param_count(albert, 2) == hf_param_count(transformers.AlbertForPreTraining,
                                                           hf_albert)


@pytest.mark.parametrize("size", ["small", "base", "large"])
def test_electra_parameter_counts_equal_hf(size):
  """Re-derives electra_test.py's hard-coded HF counts from HF's classes, and checks ours against
  them: discriminator = ElectraForPreTraining (ElectraModel without `rtd_head`, spec §11), and the
  generator = ElectraForMaskedLM at the generator's config less its `electra.embeddings.*`, which
  ours shares with the discriminator."""
  discriminator, generator = electra_test.released(size, scan_layers=True)
  params = electra_test.abstract_params(electra.Electra(discriminator, generator))

  def hf_config(c):
    return transformers.ElectraConfig(
        vocab_size=c.vocab_size, embedding_size=c.embedding_size or c.hidden,
        hidden_size=c.hidden, num_hidden_layers=c.layers, num_attention_heads=c.heads,
        intermediate_size=c.mlp, max_position_embeddings=c.max_positions,
        type_vocab_size=c.type_vocab_size)

  with torch.device("meta"):
    hf_generator = transformers.ElectraForMaskedLM(hf_config(generator))
  hf_shared = sum(p.numel() for p in hf_generator.electra.embeddings.parameters())
  hf = {"model": hf_param_count(transformers.ElectraModel, hf_config(discriminator)),
        "for_pretraining": hf_param_count(transformers.ElectraForPreTraining,
                                          hf_config(discriminator)),
        "generator": sum(p.numel() for p in hf_generator.parameters()),
        "generator_embeddings": hf_shared}
  assert hf == {"model": electra_test.HF_ELECTRA_MODEL[size],
                "for_pretraining": electra_test.HF_ELECTRA_FOR_PRETRAINING[size],
                "generator": electra_test.HF_GENERATOR[size],
                "generator_embeddings": electra_test.HF_GENERATOR_EMBEDDINGS[size]}
  count = lambda *names: sum(electra_test.count_params(params[n]) for n in names)  # noqa: E731
  assert count("encoder") == hf["model"]
  assert count("encoder", "rtd_head") == hf["for_pretraining"]
  assert count("generator", "generator_head") == hf["generator"] - hf["generator_embeddings"]
