"""TinyBERT's objective: the layer map, the losses against the reference's formulas, a student
equal to its teacher at zero loss, the sown scores leaving the forward pass unchanged, and the
refusals."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import linen as nn
import pytest

from bertfam_jax import config_lib as cl
from bertfam_jax import objectives
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.models import encoder, layers, pretraining
from bertfam_jax.objectives import tinybert
from helpers import tiny


@pytest.mark.parametrize("teacher, student, expected", [
    (12, 4, [2, 5, 8, 11]),    # general_distill.py: the last of each block of three
    (12, 6, [1, 3, 5, 7, 9, 11]),
    (2, 1, [1]),
    (4, 4, [0, 1, 2, 3]),
])
def test_uniform_layer_map(teacher, student, expected):
  assert tinybert.uniform_layer_map(teacher, student) == expected


def config(teacher_layers=4, layers=2, **objective):
  """A `layers`-deep, 16-wide student of a tiny `teacher_layers`-deep encoder."""
  c = cl.base_config()
  c.data.seq_len = tiny.LENGTH
  c.model = tiny.encoder(layers=layers, hidden=16, mlp=32)
  c.objective = ml_collections.ConfigDict(dict(
      name="tinybert", teacher="/teacher", teacher_model=tiny.encoder(layers=teacher_layers),
      teacher_layers="", mask_rate=0.0, max_predictions=20, mask_token_prob=0.8,
      random_token_prob=0.1))
  c.objective.update(objective)
  return c


def test_layer_losses_equal_the_reference_formulas():
  """general_distill.py: scores with the −10000 mask added, those <= −100 set to 0, MSELoss over
  every element per mapped layer, summed; hidden states likewise from the embedding output."""
  rng = np.random.default_rng(0)
  batch, heads, length, width = 2, 3, 5, 4
  mask = np.ones((batch, length), np.int32)
  mask[1, 3:] = 0
  student_scores = [rng.normal(size=(batch, heads, length, length)) for _ in range(2)]
  teacher_scores = [rng.normal(size=(batch, heads, length, length)) for _ in range(4)]
  student_reps = rng.normal(size=(3, batch, length, width))
  teacher_reps = rng.normal(size=(5, batch, length, width))
  att, rep = tinybert.layer_losses(student_scores, teacher_scores, student_reps, teacher_reps,
                                   mask, [1, 3])

  def reference_scores(s):
    s = s + (1.0 - mask[:, None, None, :]) * -10000.0
    return np.where(s <= -1e2, 0.0, s)

  want_att = sum(np.mean((reference_scores(student_scores[m]) - reference_scores(
      teacher_scores[j])) ** 2) for m, j in enumerate([1, 3]))
  want_rep = sum(np.mean((student_reps[i] - teacher_reps[j]) ** 2)
                 for i, j in enumerate([0, 2, 4]))
  np.testing.assert_allclose([float(att), float(rep)], [want_att, want_rep], rtol=1e-5)


def _ids():
  ids = np.arange(2 * tiny.LENGTH, dtype=np.int32).reshape(2, -1) % tiny.VOCAB
  mask = np.ones_like(ids)
  mask[1, 20:] = 0
  return ids, mask


def test_rows_have_one_token_corrupted_as_the_pregenerated_instances():
  """pregenerate_training_data.py at its masked_lm_prob 0.0: max(1, round(0 · len)) = 1 token a
  row, never [CLS] / [SEP], 80% [MASK] / 10% kept / 10% random; at 0.15, 15% of each row."""
  tokenizer = type("T", (), dict(vocab_size=tiny.VOCAB, special_ids=np.array([0, 2, 3, 4]),
                                 mask_id=4, word_start=np.ones(tiny.VOCAB, bool)))()
  n, length = 3000, 40
  ids = np.random.default_rng(0).integers(5, tiny.VOCAB, (n, length)).astype(np.int32)
  ids[:, 0], ids[:, -1], ids[:, 20] = 2, 3, 3   # [CLS] A [SEP] B [SEP]
  rows = dict(input_ids=ids, input_mask=np.ones_like(ids), segment_ids=np.zeros_like(ids))
  out = tinybert.make_features(config(), tokenizer)(rows, np.random.default_rng(1))
  assert set(out) == set(rows)
  changed = out["input_ids"] != ids
  assert changed.sum(axis=1).max() == 1 and not changed[:, [0, 20, -1]].any()
  masked = (out["input_ids"] == 4).sum(axis=1)
  random = changed.sum(axis=1) - masked
  np.testing.assert_allclose([masked.mean(), random.mean()], [0.8, 0.1], atol=0.02)
  out = tinybert.make_features(config(mask_rate=0.15), tokenizer)(rows, np.random.default_rng(1))
  replaced = (out["input_ids"] != ids).sum(axis=1)   # 6 of 40 chosen, 90% of them replaced
  np.testing.assert_allclose(replaced.mean(), 0.9 * round(0.15 * length), atol=0.1)


def test_a_student_equal_to_its_teacher_has_zero_loss():
  """Same width and depth (map 0, 1), the teacher's weights and `fit_dense` the identity: both
  losses 0. The sown scores are read from the right layers of the right encoder. The projection
  exists at equal widths too, as TinyBertForPreTraining's."""
  c = config(teacher_layers=2, layers=2)
  c.model = tiny.encoder(dropout=0.0, attention_dropout=0.0)
  model = tinybert.build_model(c)
  params = nn.meta.unbox(jax.device_get(model.init(
      jax.random.key(0), **tinybert.init_inputs(c), deterministic=True)))
  hidden = c.model.hidden
  assert params["params"]["fit_dense"]["kernel"].shape == (hidden, hidden)
  ids, mask = _ids()
  batch = dict(input_ids=ids, input_mask=mask)
  teacher = params[pretraining.TEACHER]["teacher"]
  identity = {"kernel": np.eye(hidden, dtype=np.float32), "bias": np.zeros(hidden, np.float32)}
  same = {"params": {"encoder": teacher, "fit_dense": identity},
          pretraining.TEACHER: {"teacher": teacher}}
  loss, metrics = tinybert.loss_fn(model, same, batch, jax.random.key(1), c, deterministic=True)
  assert float(loss) < 1e-8
  loss, metrics = tinybert.loss_fn(model, params, batch, jax.random.key(1), c,
                                   deterministic=True)
  assert float(metrics["att_loss"][0]) > 1e-6 and float(metrics["rep_loss"][0]) > 1e-3


@pytest.mark.parametrize("attention_dropout", [0.0, 0.1])
def test_sowing_scores_leaves_the_encoder_output_unchanged(attention_dropout):
  """The scores are sown from the explicit path; the output equals the usual one (deterministic:
  jax.nn.dot_product_attention when attention dropout is 0), and the sown scores are
  softmax's input: QKᵀ/√d of the layer's own projections."""
  c = tiny.encoder(attention_dropout=attention_dropout)
  model = encoder.Encoder(c)
  ids, mask = _ids()
  variables = model.init(jax.random.key(0), ids, mask, deterministic=True)
  assert layers.SCORES not in variables
  plain = model.apply(variables, ids, mask, deterministic=True)
  sown, state = model.apply(variables, ids, mask, deterministic=True, mutable=[layers.SCORES])
  np.testing.assert_allclose(sown, plain, rtol=1e-5, atol=1e-6)
  scores = [state[layers.SCORES][f"layer_{i}"]["attention"]["scores"][0]
            for i in range(c.layers)]
  assert [s.shape for s in scores] == [(2, 4, tiny.LENGTH, tiny.LENGTH)] * 2
  _, all_layers = model.apply(variables, ids, mask, deterministic=True, return_all_layers=True)
  attention = jax.tree.map(np.asarray, nn.meta.unbox(variables["params"])["layer_0"]["attention"])
  x = np.asarray(all_layers[0])
  q = np.einsum("bld,dnh->blnh", x, attention["query"]["kernel"]) + attention["query"]["bias"]
  k = np.einsum("bld,dnh->blnh", x, attention["key"]["kernel"]) + attention["key"]["bias"]
  np.testing.assert_allclose(scores[0], np.einsum("bqnh,bknh->bnqk", q, k) / np.sqrt(8),
                             rtol=1e-4, atol=1e-5)


def test_the_student_starts_at_random_beside_the_teacher():
  """initial_params: the student as `init` draws it from the seed, the teacher's encoder as read."""
  c = config()
  model = tinybert.build_model(c)
  drawn = nn.meta.unbox(jax.device_get(jax.jit(lambda: model.init(   # jitted, as init_state's
      {"params": jax.random.key(c.seed), "dropout": jax.random.key(c.seed)},
      **tinybert.init_inputs(c), deterministic=True))()))
  teacher = {"encoder": drawn[pretraining.TEACHER]["teacher"], "mlm_head": {}}
  start = tinybert.initial_params(c, lambda workdir: teacher if workdir == "/teacher" else 0)
  jax.tree.map(np.testing.assert_array_equal, start, drawn)
  with pytest.raises(ConfigError, match="has no encoder parameters"):
    tinybert.initial_params(c, lambda workdir: {"generator": {}})


@pytest.mark.parametrize("change, message", [
    (dict(model=dict(heads=2)), "model.heads=2 differs from the teacher's 4"),
    (dict(model=dict(vocab_size=100)), "model.vocab_size=100 differs"),
    (dict(model=dict(layers=3)), "no uniform layer map"),
    (dict(model=dict(layers=6)), "model.layers=6 exceeds the teacher's 4"),
    (dict(model=dict(hidden=18)), "model.hidden=18 is not divisible by model.heads=4"),
    (dict(objective=dict(teacher_layers="0,4")), "objective.teacher_layers='0,4'"),
    (dict(objective=dict(teacher_layers="1")), "objective.teacher_layers='1' must list 2"),
    (dict(objective=dict(teacher="")), "objective.teacher is empty"),
    (dict(objective=dict(mask_rate=1.0)), "objective.mask_rate=1.0"),
    (dict(model=dict(scan_layers=True), teacher=dict(scan_layers=True)),
     "needs a BERT-style encoder"),
])
def test_refusals_name_the_field(change, message):
  c = config()
  for section, values in change.items():
    (c.objective.teacher_model if section == "teacher" else c[section]).update(values)
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
    objectives.validate(c)
