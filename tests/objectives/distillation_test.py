"""DistilBERT's objective: the student's layers, the losses against explicit formulas, the masking
statistics of the reference, and the refusals."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import linen as nn
import pytest

from bertfam_jax import config_lib as cl
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.models import pretraining
from bertfam_jax.objectives import distillation
from helpers import tiny


@pytest.mark.parametrize("teacher, student, expected", [
    (12, 6, [0, 2, 4, 7, 9, 11]),    # extract_distilbert.py's layers
    (24, 12, [0, 2, 4, 6, 8, 10, 13, 15, 17, 19, 21, 23]),
    (4, 2, [0, 3]),
    (2, 1, [0]),
    (6, 6, [0, 1, 2, 3, 4, 5]),
])
def test_student_layer_map(teacher, student, expected):
  assert distillation.student_layer_map(teacher, student) == expected


def config(teacher_layers=4, layers=2, **objective):
  """A `layers`-deep student of a tiny `teacher_layers`-deep encoder; `objective` overrides."""
  c = cl.base_config()
  c.data.seq_len = tiny.LENGTH
  c.model = tiny.encoder(layers=layers, type_vocab_size=0)
  c.objective = ml_collections.ConfigDict(dict(
      name="distillation", teacher="/teacher", teacher_model=tiny.encoder(layers=teacher_layers),
      student_layers="", mask_rate=0.15, smoothing=0.7, mask_token_prob=0.8,
      random_token_prob=0.1, temperature=2.0, alpha_ce=5.0, alpha_mlm=2.0, alpha_cos=1.0))
  c.objective.update(objective)
  return c


@pytest.mark.parametrize("student_layers, expected", [("", [0, 3]), ("2,1", [2, 1])])
def test_the_student_starts_from_the_mapped_teacher_layers(student_layers, expected):
  """Every student leaf is the teacher's: embeddings (no token types), MLM head, and layer i =
  teacher layer map[i]; the teacher collection is the teacher without its other heads."""
  c = config(student_layers=student_layers)
  distiller = distillation.build_model(c)
  abstract = jax.eval_shape(lambda: distiller.init(
      jax.random.key(0), **distillation.init_inputs(c), deterministic=True))
  teacher_model = pretraining.MaskedLM(c.objective.teacher_model, sentence_classes=2)
  teacher = jax.device_get(teacher_model.init(
      jax.random.key(1), jnp.zeros((1, 8), jnp.int32), jnp.ones((1, 8), jnp.int32),
      jnp.zeros((1, 8), jnp.int32), jnp.zeros((1, 2), jnp.int32), deterministic=True)["params"])
  teacher = jax.tree.map(np.asarray, nn.meta.unbox(teacher))
  start = distillation.initial_params(c, lambda workdir: teacher if workdir == "/teacher" else 0)
  assert jax.tree.structure(start) == jax.tree.structure(nn.meta.unbox(abstract))
  student, taught = start["params"], start[pretraining.TEACHER]["teacher"]
  assert "type_embeddings" not in student["encoder"]
  for i, j in enumerate(expected):
    jax.tree.map(np.testing.assert_array_equal, student["encoder"][f"layer_{i}"],
                 teacher["encoder"][f"layer_{j}"])
  for name in ("word_embeddings", "position_embeddings", "embeddings_ln"):
    jax.tree.map(np.testing.assert_array_equal, student["encoder"][name], teacher["encoder"][name])
  jax.tree.map(np.testing.assert_array_equal, student["mlm_head"], teacher["mlm_head"])
  assert set(taught) == {"encoder", "mlm_head"}   # the NSP head stays behind
  jax.tree.map(np.testing.assert_array_equal, taught["encoder"], teacher["encoder"])


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_losses_equal_the_reference_formulas():
  """distiller.py: KLDivLoss(batchmean)(log_softmax(s/T), softmax(t/T)) · T² over real tokens,
  CrossEntropy over the masked ones, CosineEmbeddingLoss(target 1) over real tokens; and the
  weighted sum 5 / 2 / 1 of their means."""
  rng = np.random.default_rng(0)
  c = config(teacher_layers=2, layers=1)
  model = distillation.build_model(c)
  ids = rng.integers(5, tiny.VOCAB, (3, tiny.LENGTH)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[0, 20:] = 0
  mask[2, 9:] = 0
  weights = (rng.random(ids.shape) < 0.2) & (mask > 0)
  batch = dict(input_ids=ids, input_mask=mask, mlm_targets=np.roll(ids, 1, axis=1),
               mlm_weights=weights.astype(np.float32))
  params = model.init(jax.random.key(0), **distillation.init_inputs(c), deterministic=True)
  out = jax.device_get(model.apply(params, ids, mask, deterministic=True))
  loss, metrics = distillation.loss_fn(model, params, batch, jax.random.key(1), c,
                                       deterministic=True)
  real = mask > 0
  t = 2.0
  s_log, t_log = _log_softmax(out["student_logits"] / t), _log_softmax(out["teacher_logits"] / t)
  kl = (np.exp(t_log) * (t_log - s_log)).sum(-1)[real].mean() * t * t
  ce = -_log_softmax(out["student_logits"])[weights, batch["mlm_targets"][weights]].mean()
  s, h = out["student_hidden"][real], out["teacher_hidden"][real]
  cos = (1 - (s * h).sum(-1) / np.linalg.norm(s, axis=-1) / np.linalg.norm(h, axis=-1)).mean()
  value = lambda key: float(metrics[key][0] / metrics[key][1])  # noqa: E731
  np.testing.assert_allclose(value("distill_ce"), kl, rtol=1e-4)
  np.testing.assert_allclose(value("mlm_loss"), ce, rtol=1e-5)
  np.testing.assert_allclose(value("cosine_loss"), cos, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(float(loss), 5 * kl + 2 * ce + cos, rtol=1e-4)
  assert kl > 0 and cos > 0.01   # random student and teacher: both terms are live


def test_identical_student_and_teacher_have_zero_distillation_loss():
  """A student equal to its teacher (same layers; a teacher without token types, whose type-0
  embedding the student would lack: extract_distilbert.py drops it) has KL 0 and cosine
  distance 0."""
  c = config(teacher_layers=2, layers=2)
  c.objective.teacher_model.type_vocab_size = 0
  c.model.update(dropout=0.0, attention_dropout=0.0)
  model = distillation.build_model(c)
  params = jax.device_get(model.init(jax.random.key(0), **distillation.init_inputs(c),
                                     deterministic=True))
  params = nn.meta.unbox(params)
  teacher = params[pretraining.TEACHER]["teacher"]
  same = {"params": {"encoder": distillation.student_encoder(teacher["encoder"], [0, 1]),
                     "mlm_head": teacher["mlm_head"]}, pretraining.TEACHER: {"teacher": teacher}}
  ids = np.arange(2 * tiny.LENGTH, dtype=np.int32).reshape(2, -1) % tiny.VOCAB
  batch = dict(input_ids=ids, input_mask=np.ones_like(ids), mlm_targets=ids,
               mlm_weights=np.ones(ids.shape, np.float32))
  _, metrics = distillation.loss_fn(model, same, batch, jax.random.key(1), c, deterministic=True)
  assert abs(float(metrics["distill_ce"][0])) < 1e-4
  assert abs(float(metrics["cosine_loss"][0])) < 1e-4


def _mask(rows, seed=0, **overrides):
  args = dict(special_ids=np.array([0, 2, 3]), mask_id=4, vocab_size=50, mask_rate=0.15,
              smoothing=0.7, replace_probs=(0.8, 0.1, 0.1))
  args.update(overrides)
  return distillation.distil_features(rows, np.random.default_rng(seed), **args)


def test_masking_budget_candidates_and_replacements():
  """ceil(15% of the real tokens) across the rows; never padding or a special token; 80% [MASK],
  10% kept, 10% random; targets are the original ids."""
  rng = np.random.default_rng(1)
  ids = rng.integers(5, 50, (64, 40)).astype(np.int32)
  ids[:, 0], ids[:, -1] = 2, 3
  mask = np.ones_like(ids)
  mask[::2, 30:] = 0
  ids[mask == 0] = 0
  replaced = {"mask": 0, "kept": 0, "random": 0}
  for seed in range(20):
    out = _mask(dict(input_ids=ids, input_mask=mask), seed)
    chosen = out["mlm_weights"] > 0
    assert chosen.sum() == math.ceil(0.15 * mask.sum())
    assert not chosen[(mask == 0) | np.isin(ids, [0, 2, 3])].any()
    np.testing.assert_array_equal(out["mlm_targets"], ids)
    np.testing.assert_array_equal(out["input_ids"][~chosen], ids[~chosen])
    new = out["input_ids"][chosen]
    replaced["mask"] += np.sum(new == 4)
    replaced["kept"] += np.sum(new == ids[chosen])
    replaced["random"] += np.sum((new != 4) & (new != ids[chosen]))
  total = sum(replaced.values())
  # A random id can equal the original (1 in 50) or [MASK]: within 2 points of 80 / 10 / 10.
  assert abs(replaced["mask"] / total - 0.8) < 0.02
  assert abs(replaced["kept"] / total - 0.1) < 0.02
  assert abs(replaced["random"] / total - 0.1) < 0.02


def test_masking_edge_cases():
  """Rows of special tokens only mask nothing; a budget above the candidates masks every
  candidate; mask 0.8 + random 0.2 (kept 1 − 0.8 − 0.2, a float a hair below 0) runs."""
  specials = np.array([[2, 3, 0, 0], [2, 3, 3, 0]], np.int32)
  out = _mask(dict(input_ids=specials, input_mask=(specials > 0).astype(np.int32)))
  assert not out["mlm_weights"].any()
  ids = np.array([[2, 7, 8, 3]], np.int32)
  out = _mask(dict(input_ids=ids, input_mask=np.ones_like(ids)), mask_rate=0.9)
  np.testing.assert_array_equal(out["mlm_weights"], [[0, 1, 1, 0]])
  c = config(mask_token_prob=0.8, random_token_prob=0.2)
  tokenizer = type("T", (), dict(vocab_size=tiny.VOCAB, special_ids=np.array([0, 2, 3]), unk_id=1,
                                 mask_id=4))()
  features = distillation.make_features(c, tokenizer)
  ids = np.random.default_rng(0).integers(1, tiny.VOCAB, (4, 16)).astype(np.int32)
  out = features(dict(input_ids=ids, input_mask=np.ones_like(ids)), np.random.default_rng(1))
  assert out["mlm_weights"].sum() == math.ceil(0.15 * 64)
  assert not out["mlm_weights"][ids == 1].any()   # [UNK] is never masked (train.py)


def test_rare_tokens_are_masked_more_often_as_count_to_the_minus_0_7():
  """Per occurrence, a token seen c times is chosen ∝ c^−0.7: with 1 in 8 tokens rare (count
  r) and the rest common (count 7r), a rare occurrence is chosen 7^0.7 = 3.9 times as often
  (a small budget keeps sampling without replacement near the weights)."""
  ids = np.full((200, 40), 10, np.int32)
  ids[:, ::8] = 11
  rows = dict(input_ids=ids, input_mask=np.ones_like(ids))
  rare = common = 0
  for seed in range(10):
    chosen = _mask(rows, seed, mask_rate=0.02)["mlm_weights"] > 0
    rare += chosen[ids == 11].mean()
    common += chosen[ids == 10].mean()
  np.testing.assert_allclose(rare / common, 7 ** 0.7, rtol=0.08)
  # smoothing 0 is uniform over the real tokens.
  rare = common = 0
  for seed in range(10):
    chosen = _mask(rows, seed, mask_rate=0.02, smoothing=0.0)["mlm_weights"] > 0
    rare += chosen[ids == 11].mean()
    common += chosen[ids == 10].mean()
  np.testing.assert_allclose(rare / common, 1.0, rtol=0.12)


@pytest.mark.parametrize("change, message", [
    (dict(model=dict(hidden=64)), "model.hidden=64 differs from the teacher's 32"),
    (dict(model=dict(layer_norm_eps=1e-5)), "model.layer_norm_eps=1e-05 differs"),
    (dict(model=dict(type_vocab_size=2)), "model.type_vocab_size=2"),
    (dict(model=dict(layers=6)), "model.layers=6 exceeds the teacher's 4"),
    (dict(objective=dict(student_layers="0,4")), "objective.student_layers='0,4'"),
    (dict(objective=dict(student_layers="a")), "objective.student_layers='a'"),
    (dict(objective=dict(teacher="")), "objective.teacher is empty"),
    (dict(objective=dict(temperature=0.0)), "objective.temperature=0"),
    (dict(model=dict(share_layers="all")), "model.share_layers='all' differs"),
    (dict(model=dict(share_layers="all"), teacher=dict(share_layers="all")),
     "needs a BERT-style encoder"),
    (dict(objective=dict(freeze_positions=True), optimizer=dict(weight_decay=0.01)),
     "optimizer.weight_decay=0.01 would still shrink it"),
])
def test_refusals_name_the_field(change, message):
  from bertfam_jax import objectives  # pylint: disable=g-import-not-at-top
  c = config()
  for section, values in change.items():
    (c.objective.teacher_model if section == "teacher" else c[section]).update(values)
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
    objectives.validate(c)


def test_the_memory_floor_counts_the_teacher():
  """A distillation config's floor adds the teacher's tables and feed-forward matrices at 4
  bytes each (no gradient, no kept activations); the same config without a teacher has none."""
  c = config(teacher_layers=4, layers=2)
  t = c.objective.teacher_model
  without = ml_collections.ConfigDict(c.to_dict())
  del without.objective["teacher_model"]
  teacher = (t.vocab_size + t.max_positions) * t.hidden + 4 * 2 * t.hidden * t.mlp
  assert cl.memory_floor_bytes(c) - cl.memory_floor_bytes(without) == 4 * teacher
