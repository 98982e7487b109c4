"""The fine-tuning optimizer on tiny FineTuneModel trees: with nothing frozen or decayed it is
train/optimizer.py's BERT AdamW step for step; frozen parameters never move and hold no optimizer
state (nor enter the clipped norm); adapter training moves exactly the adapters, LayerNorms and
head; layer-wise decay follows ELECTRA's `_get_layer_lrs`; and Houlsby's BERT-base budget.
"""

import math

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import optax
import pytest

from bertfam_jax import config_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.finetune import optim
from bertfam_jax.models import finetune
from bertfam_jax.train import optimizer
from helpers import reference_adam, tiny, trees

TOTAL, STEPS = 8, 3
IDS = np.ones((1, 8), np.int32)


def ft(**overrides):
  """config.finetune's and config.optimizer's fields; a large rate and decay so that any update
  shows."""
  return ml_collections.ConfigDict(dict(dict(
      peak_lr=0.1, warmup_fraction=0.25, weight_decay=0.1, clip_norm=1.0, layer_decay=1.0,
      freeze_layers=0, method="full"), **overrides))


def run_config(settings, model):
  """A resolved fine-tuning config of `settings` (`ft`) and the encoder's `model` section."""
  return ml_collections.ConfigDict(dict(finetune=settings, model=model,
                                        optimizer=dict(settings, name="adamw")))


def tiny_config(**overrides):
  return tiny.encoder(vocab_size=50, max_positions=8, **overrides)


def abstract_params(config, features="last"):
  model = finetune.FineTuneModel(config, "classification", 3, features)
  return jax.eval_shape(lambda: nn.meta.unbox(model.init(
      jax.random.key(0), IDS, IDS, IDS, deterministic=True))["params"])


def random_like(shapes, seed, norm=None):
  """N(0, 1) values in the tree's shapes; with `norm`, scaled to that global norm."""
  rng = np.random.default_rng(seed)
  tree = jax.tree.map(lambda s: rng.normal(size=s.shape).astype(np.float32), shapes)
  if norm is not None:
    total = math.sqrt(sum(np.sum(np.square(x)) for x in jax.tree.leaves(tree)))
    tree = jax.tree.map(lambda x: x * np.float32(norm / total), tree)
  return tree


def gradients(shapes, seed=1):
  """STEPS gradient trees of global norm 3, 0.5, 3: clipping at 1 acts at some steps only."""
  return [random_like(shapes, seed + i, norm) for i, norm in enumerate((3.0, 0.5, 3.0))]


def trajectory(tx, params, grads):
  """Parameters after each update."""
  state = tx.init(params)
  update = jax.jit(tx.update)
  history = []
  for g in grads:
    updates, state = update(g, state, params)
    params = optax.apply_updates(params, updates)
    history.append(params)
  return history, state


flat = trees.leaves_by_path


def test_full_training_is_berts_adamw():
  config = tiny_config()
  shapes = abstract_params(config)
  params, grads = random_like(shapes, 0), gradients(shapes)
  tx, schedule = optim.make_finetune_optimizer(run_config(ft(), config), shapes, TOTAL)
  reference = ml_collections.ConfigDict(dict(
      optimizer=config_lib.bert_adamw(peak_lr=0.1, weight_decay=0.1, clip_norm=1.0,
                                      warmup_steps=2),
      train=dict(total_steps=TOTAL)))
  ref_tx, ref_schedule = optimizer.make_optimizer(reference)
  ours, _ = trajectory(tx, params, grads)
  theirs, _ = trajectory(ref_tx, params, grads)
  for a, b in zip(ours, theirs):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7), a, b)
  assert [float(schedule(s)) for s in range(TOTAL)] == [float(ref_schedule(s))
                                                        for s in range(TOTAL)]
  assert optim.trainable_fraction(ft(), config, shapes) == 1.0


def test_gpts_recipe_is_opt_pys_adam_with_warmup_linear():
  """finetune-transformer-lm train.py fine-tunes with opt.py's `adam` (bias-corrected, ε 1e-8,
  lrt = lr·√(1 − β2^t)/(1 − β1^t)·warmup_linear(t / T), p − lrt·(m/(√v + e) + l2·p) on weights
  of rank > 1, global clipping first): a numpy port of it, float64, against ours in float32."""
  config = tiny_config()
  shapes = abstract_params(config)
  params, grads = random_like(shapes, 0), gradients(shapes)
  settings = ft(warmup_fraction=0.25)   # W = 2 of T = 8 steps: rates 0, lr/2·(7/8), lr·(6/8)
  run = run_config(settings, config)
  run.optimizer.adam = "gpt"
  tx, _ = optim.make_finetune_optimizer(run, shapes, TOTAL)
  ours, _ = trajectory(tx, params, grads)

  def lrt(step):   # opt.py: lr·√(1 − β2^t)/(1 − β1^t)·warmup_linear(x), x = t_before / T
    x, t = step / TOTAL, step + 1
    schedule = (x / 0.25 if x <= 0.25 else 1.0) * (1 - x)
    return 0.1 * math.sqrt(1 - 0.999**t) / (1 - 0.9**t) * schedule

  def rank_above_1(name, _):   # in the reference's shapes: not a bias (ours [heads, kv] are its
    names = name.split("/")    # [3 · hidden] reshaped) or a gain
    return "bias" not in names[-1] and "norm" not in names

  reference = reference_adam.adam_decay_history(
      {k: x.astype(np.float64) for k, x in flat(params).items()},
      [{k: x.astype(np.float64) for k, x in flat(g).items()} for g in grads], rate=lrt,
      decays=rank_above_1, clip=lambda g: reference_adam.clip_global(g, 1.0),
      b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.1)
  for t, theta in enumerate(reference):
    for k, value in flat(ours[t]).items():
      np.testing.assert_allclose(value, theta[k], rtol=1e-5, atol=1e-6, err_msg=f"{k} at {t}")
  resolved = config_lib.resolve_finetune(config_lib.finetune_config(), "gpt")
  assert (resolved.optimizer.adam, resolved.optimizer.peak_lr) == ("gpt", 6.25e-5)
  assert config_lib.resolve_finetune(config_lib.finetune_config(), "encoder").optimizer.adam == (
      "bert")


def test_robertas_recipe_is_fairseqs_adam_with_polynomial_decay():
  """adam='fairseq' is train/optimizer.py's fairseq Adam (tested against fairseq's Adam.step
  there): bias-corrected, decoupled decay on every parameter, LayerNorms and biases included,
  warmup then linear decay over the remaining steps."""
  config = tiny_config()
  shapes = abstract_params(config)
  params, grads = random_like(shapes, 0), gradients(shapes)
  run = run_config(ft(clip_norm=0.0), config)
  run.optimizer.adam = "fairseq"
  tx, schedule = optim.make_finetune_optimizer(run, shapes, TOTAL)
  ref_tx, ref_schedule = optimizer.make_optimizer(ml_collections.ConfigDict(dict(
      optimizer=config_lib.fairseq_adam(peak_lr=0.1, weight_decay=0.1, clip_norm=0.0,
                                        warmup_steps=2),
      train=dict(total_steps=TOTAL))))
  ours, _ = trajectory(tx, params, grads)
  theirs, _ = trajectory(ref_tx, params, grads)
  for a, b in zip(ours, theirs):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7), a, b)
  # polynomial_decay: lr/W before the first update counts, lr·n/W in warmup, then lr·(1 − (n − W)
  # / (T − W)) at update n.
  assert [float(schedule(s)) for s in range(TOTAL)] == pytest.approx(
      [0.05, 0.05, 0.1, 0.1 * 5 / 6, 0.1 * 4 / 6, 0.1 * 3 / 6, 0.1 * 2 / 6, 0.1 * 1 / 6])
  assert [float(schedule(s)) for s in range(TOTAL)] == [float(ref_schedule(s))
                                                        for s in range(TOTAL)]
  # Unlike BERT's AdamW, a bias with a zero gradient still decays.
  zero = jax.tree.map(np.zeros_like, grads[0])
  bert, _ = optim.make_finetune_optimizer(run_config(ft(clip_norm=0.0), config), shapes, TOTAL)
  bias = lambda tree: flat(tree)["classification_head/classifier/bias"]  # noqa: E731
  start = bias(params)
  fairseq_bias = bias(trajectory(tx, params, [zero] * 3)[0][-1])
  bert_bias = bias(trajectory(bert, params, [zero] * 3)[0][-1])
  assert (np.abs(fairseq_bias) < np.abs(start)).all() and (bert_bias == start).all()


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_frozen_layers_never_move_and_hold_no_state(scan):
  config = tiny_config(scan_layers=scan)
  shapes = abstract_params(config)
  params, grads = random_like(shapes, 0), gradients(shapes)
  settings = ft(freeze_layers=1)
  tx, _ = optim.make_finetune_optimizer(run_config(settings, config), shapes, TOTAL)
  history, state = trajectory(tx, params, grads)
  before, after = flat(params), flat(history[-1])
  for name, value in after.items():
    if "/layers/" in name:  # the scanned stack: slice 0 frozen, slice 1 trained
      np.testing.assert_array_equal(value[0], before[name][0], err_msg=name)
      assert np.all(value[1] != before[name][1]), name
    elif name.startswith("encoder/") and "layer_1/" not in name:  # embeddings, layer_0
      np.testing.assert_array_equal(value, before[name], err_msg=name)
    else:
      assert np.all(value != before[name]), name
  # Adam's two moments exist for the trained leaves only (a scanned stack is one leaf).
  mask = optim.trainable_mask(settings, config, shapes)
  stated = sum(x.size for x in jax.tree.leaves(state) if np.ndim(x) > 0)
  assert stated == 2 * sum(s.size for s, m in zip(jax.tree.leaves(shapes), jax.tree.leaves(mask))
                           if m.any())
  # The frozen parameters' gradients do not enter the clipped norm.
  louder = [jax.tree.map(lambda g, m: np.where(m, g, 100 * g), g, mask) for g in grads]
  loud_history, _ = trajectory(tx, params, louder)
  jax.tree.map(np.testing.assert_array_equal, loud_history[-1], history[-1])


def test_adapter_training_moves_only_adapters_layernorms_and_head():
  config = tiny_config(adapter_size=4)
  shapes = abstract_params(config, "weighted_sum")
  params, grads = random_like(shapes, 0), gradients(shapes)
  tx, _ = optim.make_finetune_optimizer(run_config(ft(method="adapters"), config), shapes,
                                        TOTAL)
  history, _ = trajectory(tx, params, grads)
  before, after = flat(params), flat(history[-1])
  moved = {name for name in after if np.any(after[name] != before[name])}
  allowed = {name for name in after if "adapter/" in name or "/norm/" in name
             or not name.startswith("encoder/")}
  assert moved == allowed
  assert any("scalar_mix" in name for name in moved) and any("_ln/" in name for name in moved)
  with pytest.raises(ConfigError, match="adapter_size"):
    optim.trainable_mask(ft(method="adapters"), tiny_config(), abstract_params(tiny_config()))


def test_houlsby_adapter_budget_on_bert_base():
  """BERT-base (uncased vocabulary) with 64-wide adapters, a 3-class head: trained are the
  adapters, the 25 LayerNorms and the head (pooler included). Houlsby et al.'s headline 3.6% is
  BERT-Large on GLUE with a size chosen per task from {8, 64, 256}, so it is not this number."""
  config = config_lib.encoder("base", adapter_size=64)
  shapes = abstract_params(config)
  h, layers_, a = 768, 12, 64
  adapters = layers_ * 2 * (2 * h * a + a + h)
  head = (h * h + h) + (h * 3 + 3)
  trained = adapters + (2 * layers_ + 1) * 2 * h + head
  bert_base = 109_482_240  # HF BertModel (with pooler), vocabulary 30,522
  total = bert_base + adapters + h * 3 + 3
  assert sum(s.size for s in jax.tree.leaves(shapes)) == total
  fraction = optim.trainable_fraction(ft(method="adapters"), config, shapes)
  assert fraction == pytest.approx(trained / total, rel=1e-12)
  # 2.69% (2.16% of it without the pooler, which adapter-bert keeps frozen).
  assert 0.0268 < fraction < 0.0270


def electra_multiplier(name, n_layers, decay):
  """ELECTRA model/optimization.py `_get_layer_lrs` with its keys in our parameter names: the
  first key contained in the name gives the depth (an unmatched name is an error there too)."""
  key_to_depths = {"encoder/word_embeddings/": 0, "encoder/position_embeddings/": 0,
                   "encoder/type_embeddings/": 0, "encoder/embeddings_ln/": 0,
                   "classification_head/": n_layers + 2, "scalar_mix/": n_layers + 2}
  key_to_depths.update({f"encoder/layer_{i}/": i + 1 for i in range(n_layers)})
  depths = [depth for key, depth in key_to_depths.items() if key in name + "/"]
  assert len(depths) == 1, name
  return decay ** (n_layers + 2 - depths[0])


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_layer_decay_follows_electra(scan):
  config = tiny_config(adapter_size=4, scan_layers=scan)
  shapes = abstract_params(config, "weighted_sum")
  multipliers = flat(optim.layer_multipliers(ft(layer_decay=0.8), config, shapes))
  for name, value in multipliers.items():
    if "/layers/" in name:
      expected = [electra_multiplier(name.replace("/layers/", f"/layer_{i}/"), 2, 0.8)
                  for i in range(2)]
      np.testing.assert_allclose(value.reshape(-1), expected, rtol=1e-6, err_msg=name)
    else:
      np.testing.assert_allclose(value, electra_multiplier(name, 2, 0.8), rtol=1e-6,
                                 err_msg=name)
  # The updates are the undecayed ones times the multipliers.
  params, grads = random_like(shapes, 0), gradients(shapes)[:1]
  decayed, _ = trajectory(optim.make_finetune_optimizer(run_config(ft(layer_decay=0.8), config),
                                                        shapes, TOTAL)[0], params, grads)
  plain, _ = trajectory(optim.make_finetune_optimizer(run_config(ft(), config), shapes,
                                                      TOTAL)[0], params, grads)
  p0, d, u = flat(params), flat(decayed[0]), flat(plain[0])
  for name, m in multipliers.items():
    np.testing.assert_allclose(d[name] - p0[name], m * (u[name] - p0[name]), rtol=1e-4,
                               atol=1e-7, err_msg=name)


def test_settings_that_cannot_apply_are_refused():
  albert = config_lib.albert_encoder("base", hidden=16, layers=2, heads=2, mlp=32, vocab_size=50,
                                     max_positions=8)
  albert_shapes = abstract_params(albert)
  with pytest.raises(ConfigError, match="layer_decay"):
    optim.layer_multipliers(ft(layer_decay=0.9), albert, albert_shapes)
  with pytest.raises(ConfigError, match="freeze_layers=1 splits"):
    optim.trainable_mask(ft(freeze_layers=1), albert, albert_shapes)
  assert optim.trainable_fraction(ft(freeze_layers=2), albert, albert_shapes) < 0.1
  config = tiny_config()
  for bad, match in [(dict(freeze_layers=3), "freeze_layers"), (dict(method="lora"), "method"),
                     (dict(layer_decay=0.0), "layer_decay")]:
    with pytest.raises(ConfigError, match=match):
      optim.make_finetune_optimizer(run_config(ft(**bad), config), abstract_params(config), TOTAL)


@pytest.mark.parametrize("total", [1000, 1005, 15])
def test_slanted_triangular_rates_are_ulmfits(total):
  """Howard & Ruder (2018) eq. 3, cut_frac 0.1, ratio 32: lr/32 at 0, lr at the cut, back to
  lr/32 at T, linear in between; where T·cut_frac is not whole, fastai v0.7's CircularLR
  (`pct = 1 - (iter - cut_pt)/(nb - cut_pt)`), which reaches lr/32 at T and not before."""
  section = optim.base_optimizer(ml_collections.ConfigDict(dict(
      name="adamw", peak_lr=0.01, weight_decay=0.0, clip_norm=1.0, warmup_fraction=0.1,
      schedule="slanted_triangular", cut_frac=0.1, ratio=32.0)), total)
  _, schedule = optimizer.make_optimizer(section)
  def circular_lr(t, cut_frac=0.1, ratio=32, lr=0.01):
    cut = math.floor(total * cut_frac)
    p = t / cut if t <= cut else 1 - (t - cut) / (total - cut)
    return lr * (1 + p * (ratio - 1)) / ratio
  cut = math.floor(total * 0.1)
  for t in sorted({0, 1, cut // 2, cut - 1, cut, cut + 1, (cut + total) // 2, total - 1, total}):
    np.testing.assert_allclose(float(schedule(t)), circular_lr(t), rtol=1e-6, err_msg=str(t))
  rates = np.asarray([float(schedule(t)) for t in range(total + 1)])
  assert rates[0] == pytest.approx(0.01 / 32) and rates[-1] == pytest.approx(0.01 / 32)
  assert (rates[1:-1] > 0.01 / 32).all() and rates.max() == pytest.approx(0.01)


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_gradual_unfreezing_trains_the_head_then_one_layer_more_each_stage(scan):
  """unfreeze_every=1 on a 2-layer encoder: step 1 moves the head only, step 2 the head and layer
  1, step 3 layer 0 too, step 4 the embeddings too; weight decay moves nothing frozen, and
  frozen leaves build no Adam moments (a leaf unfrozen later starts from zero moments, so its
  first update equals a fresh optimizer's)."""
  config = tiny_config(scan_layers=scan)
  shapes = abstract_params(config)
  params = random_like(shapes, 0)
  grads = [random_like(shapes, 10 + i, 2.0) for i in range(4)]
  tx, _ = optim.make_finetune_optimizer(run_config(ft(unfreeze_every=1, warmup_fraction=0.0),
                                                   config), shapes, TOTAL)
  history, _ = trajectory(tx, params, grads)
  before = flat(params)
  def moved(step, name, layer=None):
    value, start = flat(history[step])[name], flat(history[step - 1] if step else params)[name]
    if layer is not None:
      value, start = value[layer], start[layer]
    return bool(np.any(value != start))
  for name in before:
    if "/layers/" in name:
      expected = [[False, False], [False, True], [True, True], [True, True]]
      assert [[moved(s, name, layer) for layer in (0, 1)] for s in range(4)] == expected, name
      continue
    if not name.startswith("encoder/"):
      first = 0                                  # the head
    elif "layer_1/" in name:
      first = 1
    elif "layer_0/" in name:
      first = 2
    else:
      first = 3                                  # the embeddings
    assert [moved(s, name) for s in range(4)] == [s >= first for s in range(4)], name
  assert [int(optim.unfrozen_depth(s, 2, 1)) for s in range(5)] == [4, 2, 1, 0, 0]
  _, state = trajectory(tx, params, grads[:3])   # the embeddings still frozen: no moments
  moments = [np.abs(leaf).max() for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]
             if "word_embeddings" in jax.tree_util.keystr(path)]
  assert len(moments) == 2 and max(moments) == 0


def test_ulmfit_rates_fall_by_the_factor_from_the_head_down():
  """layer_decay_style='ulmfit' (fastai v0.7 train_clas.py, lrs = [lr/2.6**3, lr/2.6**2,
  lr/2.6, lr] over the embeddings, layer 0, layer 1 and the head of this 2-layer encoder);
  ELECTRA's style puts d² between the head and the top layer."""
  config = tiny_config()
  shapes = abstract_params(config)
  by_name = lambda tree: {k: float(np.max(v)) for k, v in flat(tree).items()}  # noqa: E731
  d = 1 / 2.6
  for style, expected in (("ulmfit", (d ** 3, d ** 2, d, 1.0)),
                          ("electra", (d ** 4, d ** 3, d ** 2, 1.0))):
    rates = by_name(optim.layer_multipliers(ft(layer_decay=d, layer_decay_style=style), config,
                                            shapes))
    got = (rates["encoder/word_embeddings/embedding"],
           rates["encoder/layer_0/attention/query/kernel"],
           rates["encoder/layer_1/mlp/output/kernel"], rates["classification_head/classifier/kernel"])
    np.testing.assert_allclose(got, expected, rtol=1e-6, err_msg=style)


def test_gpt2s_final_layer_norm_sits_with_the_top_layer():
  """GPT-2's `final_ln` follows the last layer: it shares that layer's depth (rate, freezing,
  unfreezing stage), not the embeddings'."""
  config = tiny.gpt(version=2)
  model = finetune.FineTuneModel(config, "classification", 3, backbone="causal")
  shapes = jax.eval_shape(lambda: nn.meta.unbox(model.init(
      jax.random.key(0), IDS, IDS, IDS, deterministic=True))["params"])
  depths = {k: float(v) for k, v in flat(optim.layer_depths(ft(layer_decay=0.5), config,
                                                            shapes)).items()}
  assert depths["encoder/final_ln/norm/scale"] == depths["encoder/layer_1/mlp/output/kernel"] == 2.0
  assert depths["encoder/word_embeddings/embedding"] == 0.0
  frozen = flat(optim.trainable_mask(ft(freeze_layers=1), config, shapes))
  assert frozen["encoder/final_ln/norm/scale"] and not frozen["encoder/layer_0/mlp/output/kernel"]
