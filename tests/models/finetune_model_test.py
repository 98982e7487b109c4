"""Fine-tuning models: Houlsby adapters and `return_all_layers` in the Encoder against the float64
numpy reference of the BERT tests (adapters at adapter-bert's places; every layer's output),
their scan / remat / ALBERT-sharing variants, and FineTuneModel's heads against their formulas,
with the parameter names that let a pre-trained encoder and NSP pooler drop in.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

# Float64 reference pieces of spec §0 and the tiny inputs, from the BERT tests beside this file.
from encoder_test import (BATCH, F32_TOL, LENGTH, VOCAB, dropout_key, gelu, layer_norm,
                          make_inputs, random_tree, reference_attention, reference_layer,
                          stack_layers)

from bertfam_jax import config_lib, objectives
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.models import encoder, finetune, heads, layers, pretraining
from helpers import tiny

ADAPTER = 8
INPUTS = {k: v for k, v in make_inputs().items() if k != "mlm_positions"}


def tiny_config(**overrides):
  return tiny.encoder(vocab_size=VOCAB, max_positions=LENGTH, **overrides)


def abstract(model, inputs=None):
  inputs = INPUTS if inputs is None else inputs
  return jax.eval_shape(lambda: nn.meta.unbox(
      model.init(jax.random.key(0), **inputs, deterministic=True))["params"])


def random_encoder(config, seed=0):
  """(Encoder, params) with random values (scale 0.2, tables 0.01) of the right names/shapes."""
  model = encoder.Encoder(config)
  return model, random_tree(abstract(model), 0.2, seed, embedding_scale=0.01)


def run_encoder(model, params, **kwargs):
  return model.apply({"params": params}, **INPUTS, deterministic=True, **kwargs)


# ------------------------------------------------------------------------------------ reference


def reference_adapter(x, p):
  """adapter-bert feedforward_adapter: x + gelu(x·W1 + b1)·W2 + b2 (its tanh GELU)."""
  h = gelu(x @ p["down"]["kernel"] + p["down"]["bias"], "gelu_tanh")
  return x + h @ p["up"]["kernel"] + p["up"]["bias"]


def reference_adapter_layer(x, lp, mask, c):
  """adapter-bert transformer_model: the adapter between each sublayer's output (after dropout)
  and the residual + LayerNorm."""
  attn = reference_adapter(reference_attention(x, lp["attention"], mask, c.heads),
                           lp["attention_adapter"])
  x = layer_norm(x + attn, lp["attention_ln"], c.layer_norm_eps)
  ffn = gelu(x @ lp["mlp"]["intermediate"]["kernel"] + lp["mlp"]["intermediate"]["bias"],
             c.activation)
  ffn = reference_adapter(ffn @ lp["mlp"]["output"]["kernel"] + lp["mlp"]["output"]["bias"],
                          lp["ffn_adapter"])
  return layer_norm(x + ffn, lp["output_ln"], c.layer_norm_eps)


def reference_hidden(params, c, layer_params):
  """[layers + 1, B, L, H]: the embedding output, then every layer's; `layer_params(e, i)` is the
  parameter dict applied at layer i."""
  e = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  ids, mask = INPUTS["input_ids"], INPUTS["input_mask"].astype(np.float64)
  x = (e["word_embeddings"]["embedding"][ids] + e["position_embeddings"]["embedding"][None]
       + e["type_embeddings"]["embedding"][INPUTS["segment_ids"]])
  hidden = [layer_norm(x, e["embeddings_ln"], c.layer_norm_eps)]
  step = reference_adapter_layer if c.adapter_size else reference_layer
  for i in range(c.layers):
    lp = layer_params(e, i)
    hidden.append(step(hidden[-1], lp, mask, c) if c.adapter_size else
                  step(hidden[-1], lp, mask, c, c.layer_norm_eps))
  return np.stack(hidden)


def assert_real_close(actual, expected):
  """Compares [..., B, L, H] at the real (unpadded) positions."""
  real = INPUTS["input_mask"] > 0
  np.testing.assert_allclose(np.asarray(actual)[..., real, :], expected[..., real, :], **F32_TOL)


# ------------------------------------------------------------------------------------- adapters


def test_adapter_matches_formula_and_starts_near_identity():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(BATCH, LENGTH, 32))
  adapter = layers.Adapter(64)
  fresh = nn.meta.unbox(adapter.init(jax.random.key(0), jnp.asarray(x, jnp.float32)))
  # adapter_init_scale 1e-3 as TF's truncated_normal_initializer: N(0, 1e-3²) cut at ±2e-3, whose
  # standard deviation is 0.880e-3 (2,048 draws: ±1.6%); zero biases; an output within ~1e-4 of x.
  for name in ("down", "up"):
    kernel = fresh["params"][name]["kernel"]
    assert 0.81e-3 < np.std(kernel) < 0.95e-3 and np.abs(kernel).max() <= 2e-3
    assert not np.any(fresh["params"][name]["bias"])
  y = adapter.apply(fresh, jnp.asarray(x, jnp.float32))
  assert 0 < np.abs(y - x).max() < 1e-4
  variables = random_tree(jax.eval_shape(lambda: fresh), 0.3, seed=1)
  np.testing.assert_allclose(adapter.apply(variables, jnp.asarray(x, jnp.float32)),
                             reference_adapter(x, jax.tree.map(np.float64, variables["params"])),
                             **F32_TOL)


def test_adapters_add_only_their_own_parameters():
  plain = abstract(encoder.Encoder(tiny_config()))
  adapted = abstract(encoder.Encoder(tiny_config(adapter_size=ADAPTER)))
  for i in range(2):
    layer = dict(adapted[f"layer_{i}"])
    shapes = jax.tree.map(lambda s: s.shape, {k: layer.pop(k) for k in
                                              ("attention_adapter", "ffn_adapter")})
    assert shapes == {k: {"down": {"kernel": (32, ADAPTER), "bias": (ADAPTER,)},
                          "up": {"kernel": (ADAPTER, 32), "bias": (32,)}}
                      for k in ("attention_adapter", "ffn_adapter")}
    adapted[f"layer_{i}"] = layer
  assert jax.tree.map(lambda s: s.shape, adapted) == jax.tree.map(lambda s: s.shape, plain)
  with pytest.raises(ConfigError, match="adapter_size"):
    config = config_lib.base_config()
    config.model.adapter_size = -1
    objectives.validate(config)


@pytest.mark.parametrize("variant", [dict(), dict(remat_policy="dots")], ids=["plain", "remat"])
def test_adapter_layers_match_reference_every_layer(variant):
  c = tiny_config(adapter_size=ADAPTER, **variant)
  model, params = random_encoder(c)
  x, hidden = run_encoder(model, params, return_all_layers=True)
  expected = reference_hidden(params, c, lambda e, i: e[f"layer_{i}"])
  assert hidden.shape == (c.layers + 1, BATCH, LENGTH, 32)
  assert_real_close(hidden, expected)
  np.testing.assert_array_equal(hidden[-1], x)
  np.testing.assert_array_equal(run_encoder(model, params), x)


def test_all_layers_of_the_plain_encoder_match_reference():
  c = tiny_config()
  model, params = random_encoder(c)
  _, hidden = run_encoder(model, params, return_all_layers=True)
  assert_real_close(hidden, reference_hidden(params, c, lambda e, i: e[f"layer_{i}"]))


@pytest.mark.parametrize("variant", [dict(scan_layers=True),
                                     dict(scan_layers=True, remat_policy="full")],
                         ids=["scan", "scan-remat"])
def test_scanned_adapters_and_all_layers_equal_unrolled(variant):
  c = tiny_config(adapter_size=ADAPTER)
  model, params = random_encoder(c)
  x, hidden = run_encoder(model, params, return_all_layers=True)
  scanned = encoder.Encoder(tiny_config(adapter_size=ADAPTER, **variant))
  stacked = stack_layers({"encoder": params}, c.layers)["encoder"]
  assert (jax.tree.map(lambda s: s.shape, abstract(scanned))
          == jax.tree.map(jnp.shape, stacked))
  x_scan, hidden_scan = run_encoder(scanned, stacked, return_all_layers=True)
  # float32 through a scanned and an unrolled stack: one element in 3,072 differed by 1.04e-6
  # (values of order 1) with jax 0.10.2 on CPU, so the absolute tolerance is 2e-6.
  np.testing.assert_allclose(hidden_scan, hidden, rtol=1e-5, atol=2e-6)
  np.testing.assert_allclose(x_scan, x, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_albert_sharing_shares_adapters_and_returns_every_layer(scan):
  """3 layers in 2 groups (layers 0, 1 apply group_0, layer 2 group_1), adapters inside them."""
  c = config_lib.albert_encoder("base", hidden=32, layers=3, heads=4, mlp=64, embedding_size=0,
                                vocab_size=VOCAB, max_positions=LENGTH, hidden_groups=2,
                                adapter_size=ADAPTER, scan_layers=scan)
  model, params = random_encoder(c)
  assert sorted(params) == ["embeddings_ln", "group_0", "group_1", "position_embeddings",
                            "type_embeddings", "word_embeddings"]
  assert "attention_adapter" in params["group_0"] and "ffn_adapter" in params["group_1"]
  x, hidden = run_encoder(model, params, return_all_layers=True)
  assert hidden.shape[0] == 4
  assert_real_close(hidden, reference_hidden(params, c, lambda e, i: e[f"group_{i * 2 // 3}"]))
  np.testing.assert_array_equal(hidden[-1], x)


# ------------------------------------------------------------------------------- FineTuneModel


def choice_inputs(choices=3):
  """[batch, choices, length] rows: each choice a different random text."""
  rng = np.random.default_rng(3)
  tile = lambda a: np.repeat(a[:, None], choices, axis=1)  # noqa: E731
  ids = np.where(tile(INPUTS["input_mask"]) > 0, rng.integers(1, VOCAB, (BATCH, choices, LENGTH)),
                 0).astype(np.int32)
  return dict(input_ids=ids, input_mask=tile(INPUTS["input_mask"]),
              segment_ids=tile(INPUTS["segment_ids"]))


def random_model(kind, num_outputs=0, features="last", config=None, inputs=None, seed=0):
  model = finetune.FineTuneModel(config or tiny_config(), kind, num_outputs, features)
  return model, random_tree(abstract(model, inputs), 0.2, seed, embedding_scale=0.01)


def apply(model, params, inputs=None, **kwargs):
  kwargs.setdefault("deterministic", True)
  return model.apply({"params": params}, **(INPUTS if inputs is None else inputs), **kwargs)


@pytest.mark.parametrize("config", [tiny_config(), tiny_config(scan_layers=True),
                                    config_lib.albert_encoder("base", hidden=32, layers=2, heads=4,
                                                              mlp=64, embedding_size=16,
                                                              vocab_size=VOCAB,
                                                              max_positions=LENGTH)],
                         ids=["bert", "scanned", "albert"])
def test_pretrained_encoder_and_pooler_drop_in(config):
  pretrained = abstract(pretraining.MaskedLM(config, 2), dict(INPUTS, mlm_positions=np.zeros(
      (BATCH, 2), np.int32)))
  shapes = lambda t: jax.tree.map(lambda s: (s.shape, s.dtype), t)  # noqa: E731
  for kind, head in [("classification", "classification_head"),
                     ("regression", "classification_head")]:
    params = abstract(finetune.FineTuneModel(config, kind, 3 if kind == "classification" else 0))
    assert sorted(params) == sorted(["encoder", head])
    assert shapes(params["encoder"]) == shapes(pretrained["encoder"])
    assert shapes(params[head]["pooler"]) == shapes(pretrained["sentence_head"]["pooler"])


def test_heads_match_their_formulas():
  rows = lambda t: np.asarray(t, np.float64)  # noqa: E731
  model, params = random_model("classification", 3)
  x = rows(run_encoder(encoder.Encoder(model.config), params["encoder"]))
  p = jax.tree.map(rows, params)
  pooled = np.tanh(x[:, 0] @ p["classification_head"]["pooler"]["kernel"]
                   + p["classification_head"]["pooler"]["bias"])
  cls = p["classification_head"]["classifier"]
  np.testing.assert_allclose(apply(model, params), pooled @ cls["kernel"] + cls["bias"], **F32_TOL)
  # The same encoder and pooler/classifier values under the other kinds' names.
  for kind, name, width in [("regression", "classification_head", 0),
                            ("token_classification", "token_head", 5),
                            ("extractive_qa", "span_head", 0)]:
    other, other_params = random_model(kind, width, seed=1)
    other_params = dict(other_params, encoder=params["encoder"])
    out = np.asarray(apply(other, other_params))
    h = jax.tree.map(rows, other_params[name])
    if kind == "regression":
      pooled = np.tanh(x[:, 0] @ h["pooler"]["kernel"] + h["pooler"]["bias"])
      expected = (pooled @ h["classifier"]["kernel"] + h["classifier"]["bias"])[:, 0]
    else:
      expected = x @ h["classifier"]["kernel"] + h["classifier"]["bias"]
    assert out.shape == expected.shape == {"regression": (BATCH,),
                                           "token_classification": (BATCH, LENGTH, 5),
                                           "extractive_qa": (BATCH, LENGTH, 2)}[kind]
    np.testing.assert_allclose(out, expected, **F32_TOL, err_msg=kind)


def test_electra_classification_and_regression_read_the_first_token_without_a_pooler():
  """ELECTRA's get_pooled_output is `sequence_output[:, 0]`; its classifier and regression heads
  are one dense layer on it (classification_tasks.py). Multiple choice keeps the pooler (HF's
  ElectraForMultipleChoice summary projection; ELECTRA's code has no such task)."""
  rows = lambda t: np.asarray(t, np.float64)  # noqa: E731
  config = tiny_config(classifier_pooler=False)
  for kind, width in [("classification", 3), ("regression", 0)]:
    model, params = random_model(kind, width, config=config)
    assert sorted(params["classification_head"]) == ["classifier"]
    x = rows(run_encoder(encoder.Encoder(config), params["encoder"]))
    h = jax.tree.map(rows, params["classification_head"]["classifier"])
    expected = x[:, 0] @ h["kernel"] + h["bias"]
    np.testing.assert_allclose(apply(model, params),
                               expected[:, 0] if kind == "regression" else expected, **F32_TOL)
  inputs = choice_inputs()
  _, params = random_model("multiple_choice", config=config, inputs=inputs)
  assert sorted(params["choice_head"]) == ["classifier", "pooler"]


def test_multiple_choice_scores_each_choice_as_its_own_row():
  inputs = choice_inputs()
  model, params = random_model("multiple_choice", inputs=inputs)
  scores = apply(model, params, inputs)
  assert scores.shape == (BATCH, 3)
  # A regression model holding the same values scores one choice at a time.
  single = finetune.FineTuneModel(tiny_config(), "regression")
  same = {"encoder": params["encoder"], "classification_head": params["choice_head"]}
  for choice in range(3):
    row = {k: v[:, choice] for k, v in inputs.items()}
    np.testing.assert_allclose(scores[:, choice], apply(single, same, row), **F32_TOL)


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_weighted_sum_is_elmo_scalar_mix(scan):
  config = tiny_config(scan_layers=scan)
  model, params = random_model("token_classification", 4, "weighted_sum", config)
  assert params["scalar_mix"]["weights"].shape == (3,) and params["scalar_mix"]["gamma"].shape == ()
  _, hidden = run_encoder(encoder.Encoder(config), params["encoder"], return_all_layers=True)
  w = np.asarray(params["scalar_mix"]["weights"], np.float64)
  mixed = float(params["scalar_mix"]["gamma"]) * np.einsum(
      "n,nbld->bld", np.exp(w) / np.exp(w).sum(), np.asarray(hidden, np.float64))
  h = jax.tree.map(lambda a: np.asarray(a, np.float64), params["token_head"]["classifier"])
  np.testing.assert_allclose(apply(model, params), mixed @ h["kernel"] + h["bias"], **F32_TOL)
  # At initialisation the mix is the plain average of the layers.
  fresh = nn.meta.unbox(model.init(jax.random.key(0), **INPUTS, deterministic=True))["params"]
  np.testing.assert_array_equal(fresh["scalar_mix"]["weights"], np.zeros(3))
  assert float(fresh["scalar_mix"]["gamma"]) == 1.0


def bilm_tf_do_ln(x_BLD, mask_BL):
  """bilm-tf elmo.py weight_layers' _do_ln in numpy (float64): one mean and variance over the
  batch's real tokens and every feature, no scale, ε 1e-12."""
  mask = np.asarray(mask_BL, np.float64)[..., None]
  x_masked = x_BLD * mask
  count = mask.sum() * x_BLD.shape[-1]
  mean = x_masked.sum() / count
  variance = (((x_masked - mean) * mask) ** 2).sum() / count
  return (x_BLD - mean) / np.sqrt(variance + 1e-12)


def test_scalar_mix_with_layer_norm_is_bilm_tfs():
  """finetune.mix_layer_norm: each layer normalised over the real tokens only (the padding's
  huge values change nothing), then γ·Σ softmax(w)_j·h_j; without it the same mix unnormalised."""
  rng = np.random.default_rng(0)
  hidden = rng.normal(2.0, 3.0, size=(3, 2, 5, 4)) * np.array([1.0, 5.0, 0.2])[:, None, None,
                                                                                  None]
  mask = np.array([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
  hidden[:, mask == 0] = 1e6
  params = {"weights": np.array([0.5, -1.0, 2.0], np.float32), "gamma": np.float32(1.7)}
  softmax = np.exp(params["weights"]) / np.exp(params["weights"]).sum()
  for layer_norm in (True, False):
    got = heads.ScalarMix(3, layer_norm).apply({"params": params}, jnp.asarray(hidden, jnp.float32),
                                               jnp.asarray(mask))
    layers_ = [bilm_tf_do_ln(h, mask) if layer_norm else h for h in hidden]
    expected = 1.7 * sum(w * h for w, h in zip(softmax, layers_))
    np.testing.assert_allclose(np.asarray(got)[mask > 0], expected[mask > 0], rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("head, dropped", [
    (lambda c: heads.ClassificationHead(c, 3), True),      # run_classifier.py: on the pooled output
    (lambda c: heads.TokenClassificationHead(c, 3), True),
    (heads.SpanHead, False),                               # run_squad.py: none
])
def test_head_dropout(head, dropped):
  module = head(tiny_config(dropout=0.5))
  x = jnp.asarray(np.random.default_rng(0).normal(size=(BATCH, LENGTH, 32)), jnp.float32)
  variables = random_tree(jax.eval_shape(lambda: nn.meta.unbox(
      module.init(jax.random.key(0), x, deterministic=True))), 0.2, seed=0)
  run = lambda deterministic: module.apply(  # noqa: E731
      variables, x, deterministic=deterministic, rngs={"dropout": dropout_key(0)})
  assert np.allclose(run(False), run(True)) != dropped


def test_kinds_and_widths_are_checked():
  for kind, width in [("ranking", 2), ("classification", 0), ("extractive_qa", 3)]:
    with pytest.raises(ConfigError, match=kind):
      abstract(finetune.FineTuneModel(tiny_config(), kind, width))


def test_xlnet_classification_reads_the_last_position():
  """An XLNet's rows end with <cls> (left padding): its classification head pools the last
  position, BERT's the first."""
  assert finetune.SUMMARY_POSITION == {"encoder": 0, "xlnet": -1, "causal": 0}
  config = tiny.xlnet()
  x = jax.random.normal(jax.random.key(0), (2, 6, config.hidden))
  head = heads.ClassificationHead(config, 3, summary_position=-1)
  params = head.init(jax.random.key(1), x, deterministic=True)
  out = head.apply(params, x, deterministic=True)
  np.testing.assert_allclose(head.apply(params, x.at[:, :-1].set(0.0), deterministic=True), out)
  assert not jnp.allclose(head.apply(params, x.at[:, -1].set(0.0), deterministic=True), out)


def test_the_adapter_reads_the_dropped_sublayer_output_in_training():
  """adapter-bert transformer_model: x = LN(x + Adapter(Drop(sublayer(x)))). With a sublayer that
  outputs 0, zero adapter kernels and an `up` bias c, a training step gives LN(x + c) whatever
  the dropout key; an adapter before the dropout would give LN(x + Drop(c))."""
  from typing import Any  # pylint: disable=import-outside-toplevel

  class Block(nn.Module):
    config: Any

    @nn.compact
    def __call__(self, x, deterministic):
      return encoder._residual(self.config, x, "ln", "adapter",  # pylint: disable=protected-access
                               jnp.zeros_like, deterministic)

  config = tiny_config(adapter_size=4, dropout=0.5)
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 5, 32)), jnp.float32)
  block = Block(config)
  params = nn.meta.unbox(block.init(jax.random.key(0), x, True))["params"]
  params = jax.tree_util.tree_map_with_path(   # every weight 0, LayerNorm scales 1
      lambda path, v: jnp.ones_like(v) if path[-1].key == "scale" else jnp.zeros_like(v), params)
  c = np.linspace(-1.0, 1.0, 32)
  params["adapter"]["up"]["bias"] = jnp.asarray(c, jnp.float32)
  expected = layer_norm(np.asarray(x, np.float64) + c[None, None],
                        {"norm": {"scale": 1.0, "bias": 0.0}}, config.layer_norm_eps)
  for key in (1, 2):
    out = block.apply({"params": params}, x, False, rngs={"dropout": jax.random.key(key)})
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ ELECTRA's joint QA head


def _softmax(z):
  z = np.exp(z - z.max(-1, keepdims=True))
  return z / z.sum(-1, keepdims=True)


def _log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def reference_joint_head(x, p, input_mask, segment_ids, starts):
  """electra qa_tasks.py get_prediction_module (joint_prediction, answerable_classifier,
  answerable_uses_start_logits), is_training, in float64 with explicit concatenations."""
  dense = lambda h, q: h @ q["kernel"] + q["bias"]  # noqa: E731
  answer_mask = input_mask * segment_ids + np.eye(x.shape[1])[0]
  start = dense(x, p["start"])[..., 0] + 1000.0 * (answer_mask - 1)
  start_features = np.repeat(x[np.arange(len(x)), starts][:, None], x.shape[1], axis=1)
  final_repr = np.concatenate([start_features, x], -1)
  end = dense(gelu(dense(final_repr, p["qa_hidden"]), "gelu"), p["qa_logits"])[..., 0]
  end += 1000.0 * (answer_mask - 1)
  start_feature = (_softmax(start)[..., None] * x).sum(1)
  summary = np.concatenate([x[:, 0], start_feature], -1)
  answerable = dense(gelu(dense(summary, p["answerable_hidden"]), "gelu"),
                     p["answerable"])[:, 0]
  return start, end, answerable, answer_mask > 0


def joint_model(beam=4, seed=0):
  model = finetune.FineTuneModel(tiny_config(), "extractive_qa", qa_head="joint", qa_beam=beam)
  return model, random_tree(abstract(model), 0.2, seed, embedding_scale=0.01)


def test_joint_qa_head_matches_electras_formula_given_the_gold_starts():
  rows = lambda t: np.asarray(t, np.float64)  # noqa: E731
  model, params = joint_model()
  starts = np.array([9, 0], np.int32)   # an answer in row 0's context; row 1's no-answer [CLS]
  out = apply(model, params, start_positions=starts)
  x = rows(run_encoder(encoder.Encoder(model.config), params["encoder"]))
  start, end, answerable, inside = reference_joint_head(
      x, jax.tree.map(rows, params["span_head"]), INPUTS["input_mask"], INPUTS["segment_ids"],
      starts)
  assert set(out) == {"start_logits", "end_logits", "answerable_logit"}
  for name, expected in [("start_logits", start), ("end_logits", end)]:
    got = np.asarray(out[name])
    assert got.shape == (BATCH, LENGTH) and got.dtype == np.float32
    np.testing.assert_allclose(got[inside], expected[inside], **F32_TOL, err_msg=name)
    assert np.all(got[~inside] < -900), name   # the question and padding: never a boundary
  np.testing.assert_allclose(out["answerable_logit"], answerable, **F32_TOL)
  # The end logits depend on the start they are given.
  other = apply(model, params, start_positions=np.array([7, 0], np.int32))
  assert not np.allclose(other["end_logits"][0], out["end_logits"][0])
  np.testing.assert_array_equal(other["end_logits"][1], out["end_logits"][1])


def test_joint_qa_head_beam_is_the_top_starts_and_the_top_ends_of_each():
  """Prediction keeps the K best starts of log_softmax(start logits) and, for each, the K best
  ends of the end logits that training computes given that start."""
  beam = 4
  model, params = joint_model(beam, seed=3)
  out = jax.tree.map(np.asarray, apply(model, params))
  assert {k: v.shape for k, v in out.items()} == {
      "start_top_log_probs": (BATCH, beam), "start_top_index": (BATCH, beam),
      "end_top_log_probs": (BATCH, beam, beam), "end_top_index": (BATCH, beam, beam),
      "answerable_logit": (BATCH,)}
  start = np.asarray(apply(model, params, start_positions=np.zeros(BATCH, np.int32))[
      "start_logits"], np.float64)
  order = np.argsort(-start, axis=-1, kind="stable")[:, :beam]
  np.testing.assert_array_equal(out["start_top_index"], order)
  np.testing.assert_allclose(out["start_top_log_probs"],
                             np.take_along_axis(_log_softmax(start), order, -1), **F32_TOL)
  for i in range(beam):
    given = apply(model, params, start_positions=out["start_top_index"][:, i])
    end = _log_softmax(np.asarray(given["end_logits"], np.float64))
    ends = np.argsort(-end, axis=-1, kind="stable")[:, :beam]
    np.testing.assert_array_equal(out["end_top_index"][:, i], ends)
    np.testing.assert_allclose(out["end_top_log_probs"][:, i],
                               np.take_along_axis(end, ends, -1), **F32_TOL)
    np.testing.assert_allclose(out["answerable_logit"], given["answerable_logit"], **F32_TOL)
  inside = INPUTS["input_mask"] * INPUTS["segment_ids"] + np.eye(LENGTH)[0] > 0
  for row in range(BATCH):
    assert inside[row, out["start_top_index"][row]].all()
    assert inside[row, out["end_top_index"][row]].all()


def test_joint_qa_head_is_electras_bare_glorot_layers():
  config = tiny_config(bare_dense_init="glorot_uniform")
  model = finetune.FineTuneModel(config, "extractive_qa", qa_head="joint")
  params = nn.meta.unbox(model.init(jax.random.key(0), **INPUTS, deterministic=True))["params"]
  head = params["span_head"]
  hidden = config.hidden
  assert {k: v["kernel"].shape for k, v in head.items()} == {
      "start": (hidden, 1), "qa_hidden": (2 * hidden, heads.JOINT_QA_HIDDEN),
      "qa_logits": (heads.JOINT_QA_HIDDEN, 1),
      "answerable_hidden": (2 * hidden, heads.JOINT_QA_HIDDEN),
      "answerable": (heads.JOINT_QA_HIDDEN, 1)}
  kernel = np.asarray(head["qa_hidden"]["kernel"])
  limit = np.sqrt(6 / (2 * hidden + heads.JOINT_QA_HIDDEN))   # tf.glorot_uniform of the kernel
  assert np.abs(kernel).max() <= limit and np.abs(kernel).max() > 0.95 * limit
  assert np.std(kernel) == pytest.approx(limit / np.sqrt(3), rel=0.05)
  assert all(np.all(np.asarray(v["bias"]) == 0) for v in head.values())


def test_robertas_head_is_fairseqs_classification_head():
  """fairseq's RobertaClassificationHead, registered after init_bert_params: torch's default
  nn.Linear init, U(±1/√fan_in) for weights and biases alike, and no dropout (pooler_dropout
  0); the model's law and dropout otherwise."""
  config = tiny_config(hidden=256, heads=4)
  x = jax.random.normal(jax.random.key(0), (4, 3, 256))
  head = heads.ClassificationHead(config, 64, head_init="torch_default", dropout=0.0)
  params = nn.meta.unbox(head.init(jax.random.key(1), x, deterministic=True))["params"]
  bound = 1 / 16
  for layer in ("pooler", "classifier"):
    for name in ("kernel", "bias"):
      value = np.asarray(params[layer][name])
      assert np.abs(value).max() <= bound and np.abs(value).max() > 0.9 * bound, (layer, name)
      assert np.std(value) == pytest.approx(bound / np.sqrt(3), rel=0.1 if value.ndim > 1 else 0.2)
  run = lambda module, **kw: module.apply({"params": params}, x, **kw)  # noqa: E731
  rngs = dict(rngs={"dropout": jax.random.key(2)})
  np.testing.assert_array_equal(run(head, deterministic=False, **rngs),
                                run(head, deterministic=True))
  dropped = heads.ClassificationHead(config, 64)   # the model's dropout (0.1) and init
  assert not np.allclose(run(dropped, deterministic=False, **rngs),
                         run(dropped, deterministic=True))
  model = nn.meta.unbox(dropped.init(jax.random.key(1), x, deterministic=True))["params"]
  assert not np.asarray(model["classifier"]["bias"]).any()
  assert np.std(model["pooler"]["kernel"]) < 0.021
  # FineTuneModel passes them to every sequence-level head.
  for kind, name in [("classification", "classification_head"), ("regression",
                     "classification_head"), ("multiple_choice", "choice_head")]:
    model = finetune.FineTuneModel(tiny_config(), kind, 3 if kind == "classification" else 0,
                                   head_init="torch_default")
    inputs = INPUTS if kind != "multiple_choice" else {k: v[:, None] for k, v in INPUTS.items()}
    bias = nn.meta.unbox(model.init(jax.random.key(0), **inputs, deterministic=True))["params"][
        name]["pooler"]["bias"]
    assert np.asarray(bias).any(), kind
