"""ELECTRA's objective: its masking statistics, sampling, what the discriminator sees and is asked,
loss weighting and gradient paths, the efficiency-analysis variants, sharding and resume."""

import pathlib
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertfam_jax import config_lib as cl
from bertfam_jax import objectives
from bertfam_jax import workdir as workdir_lib
from bertfam_jax.objectives import electra
from bertfam_jax.train import sharding, step as step_lib, train
from helpers.run_records import copy_until, train_records
from helpers import tiny

# The project tokenizer layout: <pad> 0, <unk> 1, [CLS] 2, [SEP] 3, [MASK] 4.
VOCAB, LENGTH, BATCH = 61, 32, 8
MASK_ID = 4
TOKENIZER = types.SimpleNamespace(pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=MASK_ID,
                                  special_ids=np.array([0, 2, 3, 4]),
                                  word_start=np.ones(VOCAB, bool),
                                  word_start_for=lambda rule: np.ones(VOCAB, bool))


def tiny_config(variant="electra", **objective):
  c = cl.base_config()
  c.model = tiny.electra(heads=2, vocab_size=VOCAB, max_positions=LENGTH)
  c.objective = cl.electra_objective(
      variant=variant, max_predictions=cl.electra_max_predictions(LENGTH, 0.15),
      generator_hidden_fraction=0.5, **objective)
  c.data.update(seq_len=LENGTH, packing="electra_segments")
  c.optimizer.update(peak_lr=1e-2, warmup_steps=2, schedule="warmup_times_linear")
  c.train.update(batch_size=BATCH, total_steps=100)
  return c


def examples(rows, length=LENGTH, seed=0):
  """[CLS] A [SEP] B [SEP] rows of random ordinary tokens, the last 3 positions padding."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, VOCAB, (rows, length)).astype(np.int32)
  ids[:, 0], ids[:, length // 2], ids[:, length - 4] = 2, 3, 3
  mask = np.ones_like(ids)
  mask[:, length - 3:] = 0
  ids *= mask
  segments = ((np.arange(length) > length // 2) & (mask > 0)).astype(np.int32)
  return dict(input_ids=ids, input_mask=mask, segment_ids=segments)


def features(config, rows=BATCH, seed=0):
  noise = electra.make_features(config, TOKENIZER)
  return noise(examples(rows, config.data.seq_len, seed), np.random.default_rng(seed + 100))


def init(config, seed=0):
  model = electra.build_model(config)
  batch = features(config)
  params = nn.meta.unbox(model.init(
      {"params": jax.random.key(seed)}, batch["input_ids"], batch["input_mask"],
      batch["segment_ids"], batch["mlm_positions"], deterministic=True))
  return model, params, batch


def loss_and_metrics(config, model, params, batch, deterministic=True):
  return electra.loss_fn(model, params, batch, jax.random.key(3), config,
                         deterministic=deterministic)


def ratio(metrics, name):
  total, count = metrics[name]
  return float(total) / float(count)


CONFIG = str(pathlib.Path(__file__).resolve().parents[2] / "configs" / "electra.py")


@pytest.mark.parametrize("size, seq_len, rate, slots, batch, lr, fraction, steps", [
    ("small", 128, 0.15, 19, 128, 5e-4, 0.25, 1_000_000),
    ("base", 512, 0.15, 79, 256, 2e-4, 1 / 3, 766_000),
    ("large", 512, 0.25, 130, 2048, 2e-4, 0.25, 400_000),
])
def test_paper_recipes(size, seq_len, rate, slots, batch, lr, fraction, steps):
  """configure_pretraining.py's constants, per size (spec §5; 25% masking for large only)."""
  c = cl.load_config(CONFIG, f"size={size}")
  assert (c.train.total_steps, c.optimizer.warmup_steps) == (steps, 10_000)
  assert (c.optimizer.weight_decay, c.optimizer.clip_norm, c.optimizer.b1, c.optimizer.b2) == (
      0.01, 1.0, 0.9, 0.999)
  assert (c.objective.mask_style, c.objective.masking, c.objective.disallow_correct,
          c.objective.generator_layers_fraction) == ("bert", "dynamic", False, 1.0)
  objectives.validate(c)
  o = c.objective
  assert (c.data.seq_len, o.mask_rate, o.max_predictions) == (seq_len, rate, slots)
  assert (c.train.batch_size, c.optimizer.peak_lr) == (batch, lr)
  assert o.generator_hidden_fraction == pytest.approx(fraction)
  assert (o.mask_token_prob, o.random_token_prob, o.mask_scheme) == (
      0.85, 0.0, "token_with_replacement")
  assert (o.generator_weight, o.discriminator_weight, o.temperature) == (1.0, 50.0, 1.0)
  assert (c.model.activation, c.data.packing, c.optimizer.schedule) == (
      "gelu", "electra_segments", "warmup_times_linear")
  assert not c.optimizer.bias_correction and c.optimizer.eps == 1e-6


@pytest.mark.parametrize("overrides, message", [
    (dict(variant="electra_50"), "objective.variant"),
    (dict(sentence_task="nsp"), "sentence_task=''"),
    (dict(generator_hidden_fraction=0.001), "generator_hidden_fraction"),
    (dict(mask_token_prob=0.9, random_token_prob=0.2), "mask_token_prob"),
])
def test_bad_electra_settings_name_the_fix(overrides, message):
  config = cl.load_config(CONFIG, "runlocal")
  config.objective.update(overrides)
  with pytest.raises(cl.ConfigError, match=message):
    objectives.validate(config)


# -- host-side masking -----------------------------------------------------------------------


def test_masking_draws_positions_with_replacement_85_mask_15_kept():
  """pretrain_helpers.mask at 64 tokens: N = int(0.155·64) = 9 draws with replacement among the
  58 non-special real tokens, so E[distinct] = 58·(1 − (57/58)^9); 85% [MASK], 15% unchanged, no
  random tokens, never [CLS] / [SEP] / padding."""
  config = tiny_config()
  config.data.seq_len = 64
  config.objective.max_predictions = cl.electra_max_predictions(64, 0.15)
  assert config.objective.max_predictions == 9
  rows = 4000
  batch = features(config, rows=rows)
  ex = examples(rows, 64)
  real = batch["mlm_weights"] > 0
  distinct = real.sum(1)
  candidates = 64 - 3 - 3  # minus padding, [CLS] and two [SEP]
  expected = candidates * (1 - (1 - 1 / candidates) ** 9)
  variance_bound = 9 / 4  # any count in [0, 9] has variance <= 9²/4; loose but honest
  assert abs(distinct.mean() - expected) < 5 * np.sqrt(variance_bound / rows) + 0.02, (
      distinct.mean(), expected)
  assert distinct.max() == 9 and (distinct < 9).mean() > 0.3  # duplicates do happen
  rows_idx = np.arange(rows)[:, None]
  positions = batch["mlm_positions"]
  assert np.all(np.isin(ex["input_ids"][rows_idx, positions][real], [0, 2, 3], invert=True))
  assert np.all(ex["input_mask"][rows_idx, positions][real] == 1)
  placed = batch["input_ids"][rows_idx, positions][real]
  targets = batch["mlm_targets"][real]
  n = placed.size
  masked = np.mean(placed == MASK_ID)
  assert abs(masked - 0.85) < 5 * np.sqrt(0.85 * 0.15 / n)
  assert np.all((placed == MASK_ID) | (placed == targets))  # never a random token
  untouched = np.ones_like(ex["input_ids"], bool)
  untouched[rows_idx, positions] &= ~real
  np.testing.assert_array_equal(batch["input_ids"][untouched], ex["input_ids"][untouched])


def test_a_short_row_draws_its_own_budget_of_positions():
  """pretrain_helpers.mask: a row of n real tokens draws k = max(1, min(N, round(0.15·n)))
  positions with replacement ([CLS] and [SEP] counted in n), not always N: 40 real tokens of 128
  draw round(6.0) = 6 of the 19 slots, so E[distinct] = c·(1 − (1 − 1/c)^6) over its c = 37
  candidates."""
  config = tiny_config()
  config.data.seq_len = 128
  config.objective.max_predictions = cl.electra_max_predictions(128, 0.15)
  rows = 4000
  ex = examples(rows, 128)
  ex["input_mask"][:, 40:] = 0
  ex["input_ids"] *= ex["input_mask"]
  ex["input_ids"][:, 39] = 3
  batch = electra.make_features(config, TOKENIZER)(ex, np.random.default_rng(100))
  distinct = (batch["mlm_weights"] > 0).sum(1)
  candidates = 40 - 3          # [CLS] and two [SEP]
  expected = candidates * (1 - (1 - 1 / candidates) ** 6)
  assert distinct.max() == 6 and abs(distinct.mean() - expected) < 0.05, distinct.mean()


# -- sampling and the discriminator's input --------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_gumbel_max_samples_follow_the_generator_softmax(temperature):
  """x̂ ~ softmax(logits / T); with disallow_correct the target's tempered logit loses 1000
  (run_pretraining.py subtracts after dividing: at T = 1000 a penalty divided by T would leave
  the target a likely draw)."""
  logits = jnp.array([2.0, 1.0, 0.0, -1.0, 0.5])
  draws = 40_000
  sample = lambda t, disallow: np.asarray(electra.sample_replacements(  # noqa: E731
      jnp.broadcast_to(logits, (1, draws, 5)), jnp.zeros((1, draws), jnp.int32),
      jax.random.key(0), temperature=t, disallow_correct=disallow))
  frequencies = np.bincount(sample(temperature, False).ravel(), minlength=5) / draws
  p = np.asarray(jax.nn.softmax(logits / temperature))
  np.testing.assert_array_less(np.abs(frequencies - p), 5 * np.sqrt(p * (1 - p) / draws))
  for t in (0.25, 1000.0):
    assert not np.any(sample(t, True) == 0)  # the true token (id 0) is never drawn


def test_discriminator_input_holds_samples_and_labels_compare_with_the_original():
  masked = jnp.array([[2, MASK_ID, 7, 8, MASK_ID, 3, 0]])
  positions = jnp.array([[1, 3, 4, 0]])  # slot 1 (position 3) is a kept token; slot 3 is padding
  targets = jnp.array([[6, 8, 9, 0]])
  weights = jnp.array([[1.0, 1.0, 1.0, 0.0]])
  sampled = jnp.array([[6, 11, 12, 13]])  # slot 0 samples the original back
  originals, fake = electra.discriminator_inputs(masked, positions, targets, weights, sampled)
  np.testing.assert_array_equal(originals, [[2, 6, 7, 8, 9, 3, 0]])
  np.testing.assert_array_equal(fake, [[2, 6, 7, 11, 12, 3, 0]])  # padding slot wrote nothing
  np.testing.assert_array_equal(fake != originals, [[0, 0, 0, 1, 1, 0, 0]])


@pytest.mark.parametrize("variant", electra.VARIANTS)
def test_the_discriminator_never_sees_mask_and_is_fed_the_samples(variant):
  config = tiny_config(variant)
  model, params, batch = init(config)
  seen = {}
  apply = model.apply

  def spy(params, input_ids, *args, method=None, **kwargs):
    seen[method] = np.asarray(input_ids)
    return apply(params, input_ids, *args, method=method, **kwargs)

  object.__setattr__(model, "apply", spy)  # flax modules are frozen dataclasses
  _, metrics = loss_and_metrics(config, model, params, batch)
  assert np.any(seen["generate"] == MASK_ID)
  assert not np.any(seen["discriminate"] == MASK_ID)
  real = batch["mlm_weights"] > 0
  rows = np.arange(BATCH)[:, None]
  unmasked = np.ones((BATCH, LENGTH), bool)
  unmasked[rows, batch["mlm_positions"]] &= ~real
  np.testing.assert_array_equal(seen["discriminate"][unmasked], batch["input_ids"][unmasked])
  # A freshly initialised generator almost never samples the original among 61 ids.
  assert ratio(metrics, "sampled_original") < 0.2


# -- losses, weights and gradient paths ------------------------------------------------------


def test_loss_is_generator_weight_times_mlm_plus_discriminator_weight_times_detection():
  config = tiny_config(generator_weight=2.0, discriminator_weight=3.0)
  model, params, batch = init(config)
  loss, metrics = loss_and_metrics(config, model, params, batch)
  generator = metrics["generator_mlm_loss"][0] / (metrics["generator_mlm_loss"][1] + 1e-6)
  detection = metrics["discriminator_loss"][0] / (metrics["discriminator_loss"][1] + 1e-6)
  np.testing.assert_allclose(loss, 2.0 * generator + 3.0 * detection, rtol=1e-6)
  # Detection is over every real token, [CLS] and [SEP] included.
  assert float(metrics["discriminator_loss"][1]) == batch["input_mask"].sum()
  assert float(metrics["generator_mlm_loss"][1]) == batch["mlm_weights"].sum()


def test_electra_15_scores_the_discriminator_on_the_masked_tokens_only():
  config = tiny_config("electra_15")
  model, params, batch = init(config)
  _, metrics = loss_and_metrics(config, model, params, batch)
  assert float(metrics["discriminator_loss"][1]) == batch["mlm_weights"].sum()
  full = tiny_config("electra")
  _, all_tokens = loss_and_metrics(full, model, params, batch)
  assert float(all_tokens["discriminator_loss"][1]) > float(metrics["discriminator_loss"][1])


def _grads(config, model, params, batch):
  return jax.grad(lambda p: loss_and_metrics(config, model, p, batch)[0])(params)


def _norm(tree):
  return float(optax.tree.norm(tree))


@pytest.mark.parametrize("variant", electra.VARIANTS)
def test_no_gradient_reaches_the_generator_through_its_samples(variant):
  """With the generator's own loss weighted 0, its parameters get exactly zero gradient from the
  discriminator's loss; the shared embeddings get gradient from both losses."""
  model, params, batch = init(tiny_config(variant))
  only_discriminator = _grads(tiny_config(variant, generator_weight=0.0), model, params, batch)
  generator_side = {k: only_discriminator["params"][k] for k in ("generator", "generator_head")}
  assert _norm(generator_side) == 0.0
  table = ("params", "encoder", "word_embeddings", "embedding")
  get = lambda tree: tree[table[0]][table[1]][table[2]][table[3]]
  assert _norm(get(only_discriminator)) > 0
  only_generator = _grads(tiny_config(variant, discriminator_weight=0.0), model, params, batch)
  assert _norm(get(only_generator)) > 0
  assert _norm(only_generator["params"]["generator"]) > 0
  assert _norm({k: v for k, v in only_generator["params"].items()
                if k not in ("generator", "generator_head", "encoder")}) == 0.0


def test_all_tokens_mlm_loss_is_the_copy_mixture_cross_entropy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 5, 7)).astype(np.float32)
  copy = rng.normal(size=(2, 5)).astype(np.float32)
  inputs = rng.integers(0, 7, (2, 5))
  originals = np.where(rng.random((2, 5)) < 0.5, inputs, rng.integers(0, 7, (2, 5)))
  weights = np.ones((2, 5), np.float32)
  weights[1, 3:] = 0
  metrics = {}
  loss = electra._copy_mlm_loss(jnp.asarray(logits), jnp.asarray(copy), jnp.asarray(inputs),
                                jnp.asarray(originals), jnp.asarray(weights), metrics)
  softmax = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  gate = 1 / (1 + np.exp(-copy))
  mixture = (1 - gate)[..., None] * softmax + gate[..., None] * np.eye(7)[inputs]
  p = np.take_along_axis(mixture, originals[..., None], -1)[..., 0]
  np.testing.assert_allclose(loss, -(np.log(p) * weights).sum() / (weights.sum() + 1e-6),
                             rtol=1e-5)
  accuracy = ((mixture.argmax(-1) == originals) * weights).sum() / weights.sum()
  np.testing.assert_allclose(ratio(metrics, "mlm_accuracy"), accuracy, rtol=1e-6)


def test_a_sample_equal_to_the_original_is_labelled_original(monkeypatch):
  """run_pretraining.py `_get_fake_data`: labels = fake != original, so a generator that samples
  every original back leaves nothing replaced, and the detector's loss is its sigmoid
  cross-entropy against all-zero labels over the real tokens."""
  config = tiny_config()
  model, params, batch = init(config)
  monkeypatch.setattr(electra, "sample_replacements",
                      lambda logits, targets, rng, **kw: targets)
  _, metrics = loss_and_metrics(config, model, params, batch)
  assert ratio(metrics, "replaced_fraction") == 0.0 and ratio(metrics, "sampled_original") == 1.0
  originals = electra.scatter_positions(batch["input_ids"], batch["mlm_positions"],
                                        batch["mlm_targets"], batch["mlm_weights"])
  logits = model.apply(params, originals, batch["input_mask"], batch["segment_ids"],
                       batch["mlm_positions"], deterministic=True,
                       method="discriminate")["rtd_logits"]
  real = np.asarray(batch["input_mask"], np.float64)
  expected = np.sum(np.logaddexp(0.0, np.asarray(logits, np.float64)) * real)   # −log(1 − σ)
  total, count = metrics["discriminator_loss"]
  np.testing.assert_allclose([float(total), float(count)], [expected, real.sum()], rtol=1e-5)


def test_detection_metrics_count_replaced_tokens():
  """The loss Σ w·[y·softplus(−x) + (1 − y)·softplus(x)] / (Σ w + 1e-6), and the metrics."""
  logits = jnp.array([[3.0, -2.0, 1.0, -1.0, 5.0]])
  replaced = jnp.array([[True, True, False, False, True]])
  weights = jnp.array([[1, 1, 1, 1, 0]])
  metrics = {}
  loss = electra._detection_loss(logits, replaced, weights, metrics)
  x, y, w = (np.asarray(a, np.float64) for a in (logits, replaced, weights))
  expected = np.sum(w * (y * np.logaddexp(0, -x) + (1 - y) * np.logaddexp(0, x)))
  np.testing.assert_allclose(float(loss), expected / (4 + 1e-6), rtol=1e-6)
  assert ratio(metrics, "discriminator_accuracy") == 0.5     # right on tokens 0 and 3
  assert ratio(metrics, "discriminator_precision") == 0.5    # predicted 0, 2; replaced 0
  assert ratio(metrics, "discriminator_recall") == 0.5       # replaced 0, 1; found 0
  assert ratio(metrics, "replaced_share") == 0.5             # 2 of the 4 weighted tokens


# -- training ---------------------------------------------------------------------------------


def _run_steps(config, batches, devices=None):
  mesh = sharding.make_mesh(config.mesh, devices)
  state, train_step = step_lib.fresh_train_step(config, mesh, electra)
  losses = []
  for batch in batches:
    batch = {k: jax.device_put(v, sharding.batch_sharding(mesh)) for k, v in batch.items()}
    state, metrics = train_step(state, batch)
    losses.append(step_lib.finalize_metrics(jax.device_get(metrics)))
  return losses, jax.device_get(state.params)


# What falls on a fixed batch: the detection loss (ELECTRA), the MLM head's loss (Replace /
# All-Tokens MLM). ELECTRA 15%'s detection loss on the masked tokens alone does not: as the
# generator learns the batch, its samples there turn into the originals, so the labels it scores
# move (its loss stays level, 1.0-1.2× the first steps'); its generator's does.
LEARNING_KEY = dict(electra="discriminator_loss", electra_15="generator_mlm_loss",
                    replace_mlm="mlm_loss", all_tokens_mlm="mlm_loss")


@pytest.mark.parametrize("variant", electra.VARIANTS)
def test_each_variant_learns_one_batch(variant):
  """40 steps at 5e-3 (at 1e-2, with ELECTRA's Glorot-uniform embeddings_project, Replace MLM's
  loss oscillates around 0.65-0.8 of its start)."""
  config = tiny_config(variant)
  config.model.update(dropout=0.0, attention_dropout=0.0)
  config.optimizer.peak_lr = 5e-3
  metrics, _ = _run_steps(config, [features(config)] * 40, jax.devices()[:1])
  losses = [m[LEARNING_KEY[variant]] for m in metrics]
  assert np.mean(losses[-5:]) < 0.5 * losses[0], losses
  assert metrics[-1]["generator_mlm_loss"] < metrics[0]["generator_mlm_loss"]
  assert all(np.isfinite(value) for m in metrics for value in m.values())


def test_sharded_step_equals_single_device():
  """Samples are drawn from the step's key, so every mesh feeds the discriminator the same
  tokens; losses and parameters after 3 updates agree."""
  batches = [features(tiny_config(), seed=s) for s in range(3)]
  reference, reference_params = _run_steps(tiny_config(), batches, jax.devices()[:1])
  config = tiny_config()
  config.mesh.update(data=2, fsdp=2, tensor=2)
  sharded, params = _run_steps(config, batches)
  for a, b in zip(sharded, reference):
    np.testing.assert_allclose([a["loss"], a["sampled_original"], a["replaced_fraction"]],
                               [b["loss"], b["sampled_original"], b["replaced_fraction"]],
                               rtol=2e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6), params,
               reference_params)


def _corpus_config():
  """ELECTRA on the embedded corpus at test size (a 512-piece tokenizer, 32-token rows)."""
  c = tiny_config()
  c.model.update(vocab_size=512, max_positions=32)
  c.data.update(source="embedded_wiki", seq_len=32, docs_per_chunk=16)
  c.train.update(batch_size=8, total_steps=6, log_every=1, eval_every=3, eval_batches=2,
                 checkpoint_every=3, keep_checkpoints=5)
  return c


def _losses(workdir):
  return {step: (r["loss"], r["generator_mlm_loss"], r["discriminator_loss"])
          for step, r in train_records(workdir).items() if "tokens_per_sec" in r}


def test_resume_restores_generator_discriminator_and_optimizer_exactly(tmp_path):
  """Steps 4..6 after restoring the step-3 checkpoint equal the uninterrupted run's, term by
  term: generator, discriminator and optimizer state all come back (one TrainState)."""
  uninterrupted = str(tmp_path / "uninterrupted")
  train.run(_corpus_config(), uninterrupted)
  resumed = str(tmp_path / "resumed")
  copy_until(uninterrupted, resumed, 3)
  train.run(_corpus_config(), resumed)
  expected, got = _losses(uninterrupted), _losses(resumed)
  assert sorted(got) == list(range(1, 7))
  assert [got[s] for s in range(4, 7)] == [expected[s] for s in range(4, 7)]
  # Fine-tuning reads the discriminator: the checkpoint's `encoder`, a BERT encoder's layout.
  config, _, encoder_params = workdir_lib.load_encoder(resumed)
  assert config.model.hidden == 32 and "word_embeddings" in encoder_params
  state = checkpoint_params(resumed)
  jax.tree.map(np.testing.assert_array_equal, encoder_params, state["encoder"])
  assert "generator" in state and "generator" not in encoder_params


def checkpoint_params(workdir):
  """The latest checkpoint's parameters, restored without the train loop."""
  return workdir_lib.restore_params(workdir)
