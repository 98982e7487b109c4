"""Parity with HuggingFace's PyTorch BERT, RoBERTa and ALBERT (transformers 5 has no Flax classes;
STACK.md §5): random HF weights mapped onto our parameter tree give the same MLM and NSP/SOP logits
(and ALBERT's hidden states), and the parameter counts of the base models agree.

Needs torch and transformers (e.g. a venv with `pip install torch==2.13.0 transformers`); skipped
without them.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertfam_jax import config_lib
from bertfam_jax.models import pretraining

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

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


def flax_params_from_hf(state_dict, config, *, prefix, mlm_head, sentence_head=None,
                        position_offset=0, layers=None, layer_names=BERT_LAYER, projection=None):
  """Maps an HF BERT-style PyTorch state_dict onto our MaskedLM parameter tree.

  Args:
    state_dict: HF parameter name → numpy array.
    config: our `config.model` section (hidden, heads, layers, max_positions).
    prefix: the encoder's name, 'bert', 'roberta' or 'albert'.
    mlm_head: names of the MLM head's (dense, LayerNorm, output bias), e.g.
      ('lm_head.dense', 'lm_head.layer_norm', 'lm_head.bias').
    sentence_head: names of (pooler dense, classifier), or None when the model has neither.
    position_offset: the first row of HF's position table that a real token uses (RoBERTa: its
      padding_idx + 1 = 2); our table is the `max_positions` rows from there.
    layers: {our layer module: HF layer module}; default BERT's `layer_{i}` ←
      `{prefix}.encoder.layer.{i}`.
    layer_names: the parameter names inside an HF layer module (BERT_LAYER or ALBERT_LAYER).
    projection: HF name of the embedding → hidden projection of a factorised embedding (ALBERT's
      `albert.encoder.embedding_hidden_mapping_in`), or None.

  Returns:
    The parameter tree {'encoder', 'mlm_head'[, 'sentence_head']} of jnp arrays.
  """
  sd, hidden, heads = state_dict, config.hidden, config.heads

  def dense(name):  # torch Linear weight [out, in] → kernel [in, out]
    return {"kernel": sd[f"{name}.weight"].T, "bias": sd[f"{name}.bias"]}

  def layer_norm(name):
    return {"norm": {"scale": sd[f"{name}.weight"], "bias": sd[f"{name}.bias"]}}

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
      "embeddings_ln": layer_norm(f"{embeddings}.LayerNorm"),
  }
  if projection:
    encoder["embeddings_projection"] = dense(projection)
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
        "attention_ln": layer_norm(name["attention_ln"]),
        "mlp": {"intermediate": dense(name["intermediate"]), "output": dense(name["mlp_output"])},
        "output_ln": layer_norm(name["output_ln"]),
    }
  transform, transform_ln, output_bias = mlm_head
  params = {"encoder": encoder,
            "mlm_head": {"transform": dense(transform), "transform_ln": layer_norm(transform_ln),
                         "output_bias": sd[output_bias]}}
  if sentence_head:
    pooler, classifier = sentence_head
    params["sentence_head"] = {"pooler": dense(pooler), "classifier": dense(classifier)}
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


def check_tree_and_count(params, model, hf_model, extra_hf_params=0):
  """The mapped tree is exactly our model's tree, and every HF parameter has a counterpart."""
  ids = jnp.zeros((1, LENGTH), jnp.int32)
  shapes = jax.eval_shape(lambda: nn.meta.unbox(
      model.init(jax.random.key(0), ids, ids, ids, ids[:, :1], deterministic=True))["params"])
  assert jax.tree.structure(params) == jax.tree.structure(shapes)
  assert jax.tree.map(jnp.shape, params) == jax.tree.map(lambda s: s.shape, shapes)
  ours = sum(x.size for x in jax.tree.leaves(params))
  assert ours + extra_hf_params == sum(p.numel() for p in hf_model.parameters())


def our_logits(model, params, input_ids, input_mask, segment_ids):
  as_int32 = lambda x: jnp.asarray(x, jnp.int32)  # noqa: E731
  return model.apply({"params": params}, as_int32(input_ids), as_int32(input_mask),
                     as_int32(segment_ids), as_int32(MLM_POSITIONS), deterministic=True)


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
