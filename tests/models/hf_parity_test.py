"""Parity with HuggingFace's PyTorch BERT, RoBERTa, ALBERT and ELECTRA (transformers 5 has no Flax
classes; STACK.md §5): random HF weights mapped onto our parameter tree give the same MLM and
NSP/SOP logits (and ALBERT's hidden states), ELECTRA's discriminator and generator checkpoints give
the same detection logits, generator MLM logits and hidden states in our one `Electra` (whose
generator reads the discriminator's tables), and the parameter counts of the released models agree.

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
from bertfam_jax.models import electra, pretraining
from bertfam_jax.models.encoder import factorized_embedding

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _load_beside(name):
  """A test module beside this file, loaded by path under a name of its own: a bare `import` by
  basename would meet a same-named module of another test folder."""
  spec = importlib.util.spec_from_file_location(f"hf_parity_{name}",
                                                pathlib.Path(__file__).with_name(f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


# The exact HF counts and the released configs, from the torch-free ELECTRA tests.
electra_test = _load_beside("electra_test")

BATCH, LENGTH, VOCAB, HIDDEN, LAYERS, HEADS, MLP = 2, 16, 101, 32, 2, 4, 64
REAL_TOKENS = (LENGTH, 11)  # the second row ends in 5 padding positions
MLM_POSITIONS = np.array([[0, 5, 15], [3, 7, 10]], np.int64)  # all at real tokens
TOL = dict(rtol=1e-5, atol=1e-5)

# Our Transformer-layer parameters → HF's names inside one layer module.
BERT_LAYER = dict(query="attention.self.query", key="attention.self.key",
                  value="attention.self.value", output="attention.output.dense",
                  attention_ln="attention.output.LayerNorm", intermediate="intermediate.dense",
                  mlp_output="output.dense", output_ln="output.LayerNorm")
ALBERT_LAYER = dict(query="attention.query", key="attention.key", value="attention.value",
                    output="attention.dense", attention_ln="attention.LayerNorm",
                    intermediate="ffn", mlp_output="ffn_output",
                    output_ln="full_layer_layer_norm")


def dense(sd, name):  # torch Linear weight [out, in] → kernel [in, out]
  return {"kernel": sd[f"{name}.weight"].T, "bias": sd[f"{name}.bias"]}


def layer_norm(sd, name):
  return {"norm": {"scale": sd[f"{name}.weight"], "bias": sd[f"{name}.bias"]}}


def head_params(sd, names):
  """{our parameter: HF name} of a head → its tree: our '*_ln' are LayerNorms, 'output_bias' a
  bare vector, the rest Linear layers."""
  return {ours: (sd[theirs] if ours == "output_bias" else
                 layer_norm(sd, theirs) if ours.endswith("_ln") else dense(sd, theirs))
          for ours, theirs in names.items()}


def mlm_head_names(transform, transform_ln, output_bias):
  return dict(transform=transform, transform_ln=transform_ln, output_bias=output_bias)


def encoder_params_from_hf(sd, config, *, prefix, position_offset=0, layers=None,
                           layer_names=BERT_LAYER, projection=None):
  """An HF BERT-style encoder's state_dict entries → our `Encoder`'s parameter tree (numpy).

  Args:
    sd: HF parameter name → numpy array.
    config: our `config.model` section (hidden, heads, layers, max_positions).
    prefix: the encoder's name, 'bert', 'roberta', 'albert' or 'electra'.
    position_offset: the first row of HF's position table that a real token uses (RoBERTa: its
      padding_idx + 1 = 2); our table is the `max_positions` rows from there.
    layers: {our layer module: HF layer module}; default BERT's `layer_{i}` ←
      `{prefix}.encoder.layer.{i}`.
    layer_names: the parameter names inside an HF layer module (BERT_LAYER or ALBERT_LAYER).
    projection: HF name of the embedding → hidden projection of a factorised embedding (ALBERT's
      `albert.encoder.embedding_hidden_mapping_in`, ELECTRA's `electra.embeddings_project`), or
      None.
  """
  hidden, heads = config.hidden, config.heads

  def qkv(name):  # [heads·head_dim, hidden] → [hidden, heads, head_dim] (HF splits head-major)
    return {"kernel": sd[f"{name}.weight"].T.reshape(hidden, heads, -1),
            "bias": sd[f"{name}.bias"].reshape(heads, -1)}

  def attention_output(name):  # [hidden, heads·head_dim] → [heads, head_dim, hidden]
    return {"kernel": sd[f"{name}.weight"].T.reshape(heads, -1, hidden),
            "bias": sd[f"{name}.bias"]}

  embeddings = f"{prefix}.embeddings"
  positions = sd[f"{embeddings}.position_embeddings.weight"]
  encoder = {
      "word_embeddings": {"embedding": sd[f"{embeddings}.word_embeddings.weight"]},
      "position_embeddings": {
          "embedding": positions[position_offset:position_offset + config.max_positions]},
      "type_embeddings": {"embedding": sd[f"{embeddings}.token_type_embeddings.weight"]},
      "embeddings_ln": layer_norm(sd, f"{embeddings}.LayerNorm"),
  }
  if projection:
    encoder["embeddings_projection"] = dense(sd, projection)
  if layers is None:
    layers = {f"layer_{i}": f"{prefix}.encoder.layer.{i}" for i in range(config.layers)}
  for ours, theirs in layers.items():
    name = {k: f"{theirs}.{v}" for k, v in layer_names.items()}
    encoder[ours] = {
        "attention": {
            "query": qkv(name["query"]),
            "key": qkv(name["key"]),
            "value": qkv(name["value"]),
            "output": attention_output(name["output"]),
        },
        "attention_ln": layer_norm(sd, name["attention_ln"]),
        "mlp": {"intermediate": dense(sd, name["intermediate"]),
                "output": dense(sd, name["mlp_output"])},
        "output_ln": layer_norm(sd, name["output_ln"]),
    }
  return encoder


def flax_params_from_hf(state_dict, config, *, prefix, mlm_head, sentence_head=None,
                        **encoder_kwargs):
  """Maps an HF BERT-style PyTorch state_dict onto our MaskedLM parameter tree.

  Args:
    state_dict: HF parameter name → numpy array.
    config: our `config.model` section.
    prefix: the encoder's name, 'bert', 'roberta' or 'albert'.
    mlm_head: names of the MLM head's (dense, LayerNorm, output bias), e.g.
      ('lm_head.dense', 'lm_head.layer_norm', 'lm_head.bias').
    sentence_head: names of (pooler dense, classifier), or None when the model has neither.
    **encoder_kwargs: position_offset, layers, layer_names, projection of
      `encoder_params_from_hf`.

  Returns:
    The parameter tree {'encoder', 'mlm_head'[, 'sentence_head']} of jnp arrays.
  """
  params = {"encoder": encoder_params_from_hf(state_dict, config, prefix=prefix,
                                              **encoder_kwargs),
            "mlm_head": head_params(state_dict, mlm_head_names(*mlm_head))}
  if sentence_head:
    pooler, classifier = sentence_head
    params["sentence_head"] = head_params(state_dict, dict(pooler=pooler, classifier=classifier))
  return jax.tree.map(jnp.asarray, params)


# ELECTRA (spec §10): HF's discriminator and generator are separate checkpoints, each an
# `electra.*` encoder with its own head; ours is one `Electra` whose generator reads the
# discriminator's embedding tables and LayerNorm (SHARED_EMBEDDINGS).
ELECTRA_HEADS = {
    "discriminator": {"rtd_head": dict(transform="discriminator_predictions.dense",
                                       prediction="discriminator_predictions.dense_prediction")},
    "generator": {"generator_head": mlm_head_names("generator_predictions.dense",
                                                   "generator_predictions.LayerNorm",
                                                   "generator_lm_head.bias")},
}
SHARED_EMBEDDINGS = ("word_embeddings", "position_embeddings", "type_embeddings", "embeddings_ln")


def electra_params_from_hf(state_dict, config, network):
  """An HF ElectraForPreTraining (network='discriminator') or ElectraForMaskedLM ('generator')
  state_dict → the part of our Electra's parameter tree it holds, as jnp arrays:
    discriminator  {'encoder', 'rtd_head'}
    generator      {'encoder': the SHARED_EMBEDDINGS only, 'generator', 'generator_head'}
  `config` is that network's `model` section (the generator's from config_lib.electra_generator)."""
  network_params = encoder_params_from_hf(
      state_dict, config, prefix="electra",
      projection="electra.embeddings_project" if factorized_embedding(config) else None)
  params = {name: head_params(state_dict, names) for name, names in ELECTRA_HEADS[network].items()}
  if network == "discriminator":
    params["encoder"] = network_params
  else:
    params["encoder"] = {k: network_params.pop(k) for k in SHARED_EMBEDDINGS}
    params["generator"] = network_params
  return jax.tree.map(jnp.asarray, params)


def randomised(hf_model, seed=0):
  """`hf_model` in eval mode with N(0, 0.2²) added to every parameter (HF's init leaves biases at
  0 and LayerNorm at 1/0, under which a misplaced bias would go unnoticed); tied weights stay
  tied. Returns (model, state_dict as numpy)."""
  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in hf_model.parameters():
      p.add_(0.2 * torch.randn(p.shape, generator=generator))
  hf_model.eval()
  return hf_model, {k: v.detach().numpy() for k, v in hf_model.state_dict().items()}


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
  params = flax_params_from_hf(
      sd, config, prefix="bert",
      mlm_head=("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                "cls.predictions.bias"),
      sentence_head=("bert.pooler.dense", "cls.seq_relationship"))
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
  params = flax_params_from_hf(
      sd, config, prefix="roberta",
      mlm_head=("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"), position_offset=pad_id + 1)
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
  params = flax_params_from_hf(
      sd, config, prefix="albert",
      mlm_head=("predictions.dense", "predictions.LayerNorm", "predictions.bias"),
      sentence_head=("albert.pooler", "sop_classifier.classifier"),
      layers={f"group_{g}": f"albert.encoder.albert_layer_groups.{g}.albert_layers.0"
              for g in range(groups)},
      layer_names=ALBERT_LAYER, projection="albert.encoder.embedding_hidden_mapping_in")
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
