"""`make_optimizer` against float64 numpy re-implementations of the reference optimizers.

References (specs/objectives.md §0, "Optimizer family"):
  BERT     google-research/bert optimization.py: AdamWeightDecayOptimizer.apply_gradients after
           tf.clip_by_global_norm(grads, 1.0); the learning rate of create_optimizer
           (polynomial_decay from step 0, replaced by lr·step/W while step < W).
  fairseq  fairseq/optim/adam.py Adam.step with polynomial_decay_schedule.py; the update with index
           s (0-based) runs at the rate set by step_update(s), or at lr/W before the first update.
  ALBERT   google-research/albert lamb_optimizer.py LAMBOptimizer.apply_gradients after
           clip_by_global_norm(grads, 1.0), at BERT's learning rate (optimization.py
           create_optimizer with poly_power 1).
  GPT      finetune-transformer-lm opt.py `adam` with `warmup_cosine`.
  TinyBERT TinyBERT transformer/optimization.py BertAdam with WarmupLinearSchedule.
BERT's, GPT's and TinyBERT's share one loop (helpers/reference_adam.py), their rates, decayed
parameters and clipping passed in. The references are written in their own code's structure,
not in optax's, and are compared with
the parameters after every one of 5 updates on a tree holding a kernel, a bias, a LayerNorm
`norm/{scale,bias}` and an `output_bias` (our naming, see models/layers.py and models/heads.py).
"""

import importlib.util
import math
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertfam_jax import config_lib as cl
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.objectives import mlm
from bertfam_jax.train import optimizer
from helpers import reference_adam

WARMUP, TOTAL, STEPS = 2, 8, 5
# Large rate and decay so that a decay applied to the wrong leaves moves a parameter by ~1e-2,
# a thousand times the tolerance of the comparisons.
PEAK_LR, WEIGHT_DECAY = 0.1, 0.1
# Global gradient norms of the 5 updates: clipping at 1.0 is active at some steps and not others.
GRAD_NORMS = (3.0, 0.4, 2.0, 0.7, 1.5)
SHAPES = {"dense/kernel": (4, 3), "dense/bias": (3,), "block/norm/scale": (3,),
          "block/norm/bias": (3,), "head/output_bias": (5,)}
# BERT's exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"]: only the kernel decays.
BERT_DECAYED = {"dense/kernel"}


def nest(flat):
  """{'a/b': x} → {'params': {'a': {'b': x}}} (the layout of flax variables)."""
  tree = {}
  for name, value in flat.items():
    *modules, leaf = name.split("/")
    node = tree
    for module in modules:
      node = node.setdefault(module, {})
    node[leaf] = value
  return {"params": tree}


def flatten(tree):
  return {"/".join(k.key for k in path[1:]): np.asarray(leaf, np.float64)
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def tiny_problem(seed=0):
  """Float64 initial parameters and STEPS gradients with the global norms GRAD_NORMS.

  Gradient entries have magnitudes in [0.5, 1.5) before scaling, so no entry is near zero."""
  rng = np.random.default_rng(seed)
  params = {k: rng.normal(1.0, 0.5, s) for k, s in SHAPES.items()}
  grads = []
  for norm in GRAD_NORMS:
    g = {k: rng.choice([-1.0, 1.0], s) * rng.uniform(0.5, 1.5, s) for k, s in SHAPES.items()}
    total = math.sqrt(sum(np.sum(x**2) for x in g.values()))
    grads.append({k: x * norm / total for k, x in g.items()})
  return params, grads


def run_ours(config, params, grads):
  """Parameters (flat, float64) after each update of `make_optimizer(config)`."""
  tx, _ = optimizer.make_optimizer(config)
  theta = jax.tree.map(lambda x: x.astype(np.float32), nest(params))
  state = tx.init(theta)
  update = jax.jit(tx.update)
  history = []
  for g in grads:
    updates, state = update(jax.tree.map(lambda x: x.astype(np.float32), nest(g)), state, theta)
    theta = jax.tree.map(lambda p, u: p + u, theta, updates)
    history.append(flatten(theta))
  return history


def bert_lr(step, peak, warmup, total, end=0.0):
  """optimization.py create_optimizer: polynomial_decay(power=1, cycle=False) of the global step
  (0-based: read before the increment), replaced by peak·step/warmup while step < warmup."""
  decayed = (peak - end) * (1.0 - min(step, total) / total) + end
  if step < warmup:
    return peak * step / warmup
  return decayed


def fairseq_lr(step, peak, warmup, total, end=0.0):
  """polynomial_decay_schedule.py (power 1): __init__ sets peak/warmup; after update k the trainer
  calls step_update(k), whose rate the next update (index k) uses."""
  if step == 0:
    return peak / warmup
  if step <= warmup:
    return peak * step / warmup
  if step >= total:
    return end
  return (peak - end) * (1.0 - (step - warmup) / (total - warmup)) + end


def bert_reference(params, grads, o, total):
  """AdamWeightDecayOptimizer.apply_gradients after clip_by_global_norm, in float64."""
  return reference_adam.adam_decay_history(
      params, grads, rate=lambda step: bert_lr(step, o.peak_lr, o.warmup_steps, total, o.end_lr),
      decays=lambda name, _: name in BERT_DECAYED,
      clip=lambda g: reference_adam.clip_global(g, o.clip_norm),  # TF's formula
      b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay)


def fairseq_reference(params, grads, o, total):
  """fairseq Adam.step (no amsgrad): eps is added to sqrt of the *uncorrected* second moment and
  the bias corrections fold into step_size; decay `p -= wd·lr·p` on every parameter first."""
  theta = dict(params)
  m = {k: np.zeros_like(x) for k, x in params.items()}
  v = {k: np.zeros_like(x) for k, x in params.items()}
  history = []
  for step, g in enumerate(grads):
    lr = fairseq_lr(step, o.peak_lr, o.warmup_steps, total, o.end_lr)
    t = step + 1  # state["step"] after its increment
    step_size = lr * math.sqrt(1.0 - o.b2**t) / (1.0 - o.b1**t)
    for k in theta:
      m[k] = o.b1 * m[k] + (1.0 - o.b1) * g[k]
      v[k] = o.b2 * v[k] + (1.0 - o.b2) * g[k]**2
      denom = np.sqrt(v[k]) + o.eps
      theta[k] = theta[k] - o.weight_decay * lr * theta[k]
      theta[k] = theta[k] - step_size * m[k] / denom
    history.append(dict(theta))
  return history


def gpt_reference(params, grads, o, total):
  """finetune-transformer-lm opt.py `adam` with `warmup_cosine`, in float64: global-norm
  clipping, lrt = lr·√(1 − β2^t)/(1 − β1^t)·schedule(t_before / total) and
  p − lrt·(m/(√v + e) + l2·p) on parameters of rank > 1 only (no `vector_l2`)."""
  warmup = o.warmup_steps / total

  def lrt(step):
    x, t = step / total, step + 1
    schedule = x / warmup if x <= warmup else 0.5 * (1 + math.cos(math.pi * x))
    return o.peak_lr * math.sqrt(1 - o.b2**t) / (1 - o.b1**t) * schedule

  return reference_adam.adam_decay_history(
      params, grads, rate=lrt, decays=lambda _, value: value.ndim > 1,
      clip=lambda g: reference_adam.clip_global(g, o.clip_norm),
      b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay)


def tinybert_reference(params, grads, o, total):
  """TinyBERT transformer/optimization.py BertAdam with WarmupLinearSchedule, in float64: each
  parameter's gradient clipped to norm max_grad_norm on its own (torch's clip_grad_norm_:
  max_norm / (‖g‖ + 1e-6) when below 1), no bias correction, decay on BERT's decayed names, the
  rate lr · schedule(step / t_total) with step counted before the update, except the first
  update's: 0 there, lr / W in ours (`linear_after_warmup`, fairseq's start), taken here."""
  warmup = o.warmup_steps / total

  def rate(step):
    if not step:
      return o.peak_lr / o.warmup_steps
    progress = step / total
    return o.peak_lr * (progress / warmup if progress < warmup
                        else max((progress - 1.0) / (warmup - 1.0), 0.0))

  return reference_adam.adam_decay_history(
      params, grads, rate=rate, decays=lambda name, _: name in BERT_DECAYED,
      clip=lambda g: reference_adam.clip_each(g, o.clip_norm),
      b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay)


def lamb_reference(params, grads, o, total, adapted):
  """LAMBOptimizer.apply_gradients after clip_by_global_norm, in float64. `adapted`: the names
  that get weight decay and the trust ratio (exclude_from_layer_adaptation defaults to
  exclude_from_weight_decay)."""
  theta = dict(params)
  m = {k: np.zeros_like(x) for k, x in params.items()}
  v = {k: np.zeros_like(x) for k, x in params.items()}
  history = []
  for step, g in enumerate(grads):
    lr = bert_lr(step, o.peak_lr, o.warmup_steps, total, o.end_lr)
    g = reference_adam.clip_global(g, o.clip_norm)
    for k in theta:
      m[k] = o.b1 * m[k] + (1.0 - o.b1) * g[k]
      v[k] = o.b2 * v[k] + (1.0 - o.b2) * g[k]**2
      update = m[k] / (np.sqrt(v[k]) + o.eps)
      ratio = 1.0
      if k in adapted:
        update = update + o.weight_decay * theta[k]
        w_norm, g_norm = np.linalg.norm(theta[k]), np.linalg.norm(update)
        ratio = w_norm / g_norm if w_norm > 0 and g_norm > 0 else 1.0
      theta[k] = theta[k] - ratio * lr * update
    history.append(dict(theta))
  return history


def make_config(optimizer_config):
  c = cl.base_config()
  c.optimizer = optimizer_config
  c.train.total_steps = TOTAL
  return c


def assert_histories_close(ours, reference):
  """Float32 against float64: rounding differs by ~6e-7 relative on this problem."""
  for step, (a, b) in enumerate(zip(ours, reference, strict=True)):
    for k in b:
      np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=f"{k} after {step + 1}")


def test_tiny_problem_exercises_clipping_on_and_off():
  _, grads = tiny_problem()
  norms = [math.sqrt(sum(np.sum(x**2) for x in g.values())) for g in grads]
  np.testing.assert_allclose(norms, GRAD_NORMS)
  assert min(norms) < 1.0 < max(norms)


def test_bert_adam_weight_decay_matches_reference():
  o = cl.bert_adamw(peak_lr=PEAK_LR, warmup_steps=WARMUP, weight_decay=WEIGHT_DECAY)
  params, grads = tiny_problem()
  ours = run_ours(make_config(o), params, grads)
  assert_histories_close(ours, bert_reference(params, grads, o, TOTAL))
  # Step 0 runs at rate 0 (BERT's warmup starts from zero): nothing moves.
  for k in SHAPES:
    np.testing.assert_allclose(ours[0][k], params[k], rtol=1e-6)


# RoBERTa's adam_eps, and a large eps under which fairseq's placement (eps added to sqrt(v) of the
# uncorrected moment) visibly differs from optax/PyTorch's (eps added to sqrt(v̂)).
@pytest.mark.parametrize("eps", [1e-6, 1e-2])
def test_fairseq_adam_matches_reference(eps):
  o = cl.fairseq_adam(peak_lr=PEAK_LR, b2=0.98, eps=eps, warmup_steps=WARMUP,
                      weight_decay=WEIGHT_DECAY)
  params, grads = tiny_problem(seed=1)
  assert_histories_close(run_ours(make_config(o), params, grads),
                         fairseq_reference(params, grads, o, TOTAL))


def test_gpt_adam_matches_opt_py():
  """GPT's decay takes the bias correction (lrt), and its warmup reaches the peak at step W
  (`x <= warmup`): at t = 1-5 the correction √(1 − β2^t)/(1 − β1^t) is 0.3-0.11, so a decay
  outside it would move the kernel ~3-9× too far."""
  o = cl.gpt_adam(peak_lr=PEAK_LR, warmup_steps=WARMUP, weight_decay=WEIGHT_DECAY)
  params, grads = tiny_problem(seed=2)
  ours = run_ours(make_config(o), params, grads)
  assert_histories_close(ours, gpt_reference(params, grads, o, TOTAL))
  tx, schedule = optimizer.make_optimizer(make_config(o))
  assert float(schedule(0)) == 0.0 and float(schedule(WARMUP)) == pytest.approx(PEAK_LR)
  # The state's layout is the decay-outside chain's, so older GPT checkpoints restore.
  o.decay_bias_corrected = False
  outside, _ = optimizer.make_optimizer(make_config(o))
  theta = nest(params)
  assert jax.tree.structure(tx.init(theta)) == jax.tree.structure(outside.init(theta))


def test_tinybert_bert_adam_matches_its_optimization_py():
  """configs/tinybert.py's optimizer: BertAdam's per-parameter clipping (the kernel's gradient
  clipped at every step, the other leaves' not) and WarmupLinearSchedule (but its first
  update's rate, tinybert_reference)."""
  c = cl.load_config(str(pathlib.Path(__file__).parents[2] / "configs" / "tinybert.py"), None)
  o = c.optimizer
  o.update(peak_lr=PEAK_LR, warmup_steps=WARMUP, weight_decay=WEIGHT_DECAY)
  params, grads = tiny_problem(seed=3)
  # The kernel's gradient at norm 2-3 (clipped), each other leaf's at 0.6 (not clipped, while
  # a global clipping would scale every leaf: the global norm is above 2).
  grads = [{k: x * ((2.0 + 0.2 * step) if k == "dense/kernel" else 0.6) / np.linalg.norm(x)
            for k, x in g.items()} for step, g in enumerate(grads)]
  assert o.clip_per_tensor and o.schedule == "linear_after_warmup"
  assert_histories_close(run_ours(make_config(o), params, grads),
                         tinybert_reference(params, grads, o, TOTAL))


def test_linear_from_zero_values():
  # BERT's recipe (lr 1e-4, W 10k, T 1M): zero at 0, linear warmup, then 1e-4·(1 - s/T), so the
  # rate drops from 1e-4·0.9999 at s = W-1 to 1e-4·0.99 at s = W.
  steps = (0, 5_000, 9_999, 10_000, 500_000, 1_000_000, 1_200_000)
  expected = (0.0, 5e-5, 9.999e-5, 9.9e-5, 5e-5, 0.0, 0.0)
  o = cl.bert_adamw(peak_lr=1e-4, warmup_steps=10_000)
  schedule = optimizer.learning_rate_schedule(o, 1_000_000)
  ours = [float(schedule(s)) for s in steps]
  np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=1e-12)
  np.testing.assert_allclose(ours, [bert_lr(s, 1e-4, 10_000, 1_000_000) for s in steps],
                             rtol=1e-6, atol=1e-12)
  drop = float(schedule(9_999)) - float(schedule(10_000))
  np.testing.assert_allclose(drop, 1e-4 * (0.9999 - 0.99), rtol=1e-4)


def test_linear_after_warmup_values():
  # RoBERTa's recipe (lr 5e-4, W 10k, T 125k): lr/W at 0, peak at W, linear to 0 at T.
  o = cl.fairseq_adam(peak_lr=5e-4, warmup_steps=10_000)
  schedule = optimizer.learning_rate_schedule(o, 125_000)
  steps = (0, 1, 5_000, 10_000, 67_500, 125_000, 130_000)
  expected = (5e-8, 5e-8, 2.5e-4, 5e-4, 2.5e-4, 0.0, 0.0)
  ours = [float(schedule(s)) for s in steps]
  np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=1e-12)
  np.testing.assert_allclose(ours, [fairseq_lr(s, 5e-4, 10_000, 125_000) for s in steps],
                             rtol=1e-6, atol=1e-12)


def test_warmup_times_linear_values():
  # ELECTRA-Small (lr 5e-4, W 10k, T 1M; model/optimization.py): polynomial_decay(power 1) times
  # min(1, s/W), so warmup already carries the decay: 5e-4·0.5·0.995 at s = 5k.
  o = cl.bert_adamw(peak_lr=5e-4, warmup_steps=10_000, schedule="warmup_times_linear")
  schedule = optimizer.learning_rate_schedule(o, 1_000_000)
  steps = (0, 5_000, 10_000, 500_000, 1_000_000, 1_100_000)
  expected = (0.0, 5e-4 * 0.5 * 0.995, 5e-4 * 0.99, 2.5e-4, 0.0, 0.0)
  np.testing.assert_allclose([float(schedule(s)) for s in steps], expected, rtol=1e-6,
                             atol=1e-12)


def test_schedules_honour_end_lr():
  o = cl.fairseq_adam(peak_lr=1e-3, warmup_steps=10, end_lr=1e-5)
  schedule = optimizer.learning_rate_schedule(o, 110)
  np.testing.assert_allclose([float(schedule(s)) for s in (60, 110, 200)],
                             [fairseq_lr(s, 1e-3, 10, 110, 1e-5) for s in (60, 110, 200)],
                             rtol=1e-6)
  o = cl.bert_adamw(peak_lr=1e-3, warmup_steps=10, end_lr=1e-5)
  schedule = optimizer.learning_rate_schedule(o, 110)
  np.testing.assert_allclose([float(schedule(s)) for s in (60, 110, 200)],
                             [bert_lr(s, 1e-3, 10, 110, 1e-5) for s in (60, 110, 200)], rtol=1e-6)


def load_config(name, arg):
  """`configs/<name>.py:<arg>`, loaded from its file as config_flags does."""
  path = pathlib.Path(__file__).resolve().parents[2] / "configs" / f"{name}.py"
  spec = importlib.util.spec_from_file_location(f"configs_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def real_params(config_name, **model_overrides):
  """Abstract parameters of the MaskedLM of `configs/<config_name>.py:runlocal`."""
  config = load_config(config_name, "runlocal")
  config.model.update(model_overrides)
  model = mlm.build_model(config)
  rng = jax.random.key(0)
  return jax.eval_shape(lambda: nn.meta.unbox(model.init(
      {"params": rng, "dropout": rng}, **mlm.init_inputs(config), deterministic=True)))


@pytest.mark.parametrize("config_name, scan_layers, num_decayed", [
    # Per layer q, k, v, o, intermediate, output kernels (x2 layers unless scanned); word, position
    # and type embeddings; the MLM transform kernel; with NSP the pooler and classifier kernels.
    ("bert", False, 6 * 2 + 3 + 1 + 2),
    ("bert", True, 6 + 3 + 1 + 2),
    ("roberta", False, 6 * 2 + 3 + 1),
    # ALBERT: one shared layer's 6 kernels, the 3 tables and their E→H projection kernel, the MLM
    # transform, the pooler and SOP classifier kernels.
    ("albert", False, 6 + 3 + 1 + 1 + 2),
])
def test_decay_mask_on_masked_lm(config_name, scan_layers, num_decayed):
  mask = optimizer.decay_mask(real_params(config_name, scan_layers=scan_layers))
  decayed, excluded = [], []
  for path, value in jax.tree_util.tree_flatten_with_path(mask)[0]:
    names = [k.key for k in path]
    (decayed if value else excluded).append("/".join(names))
    is_norm = any(n.endswith("_ln") for n in names[:-2]) and names[-2] == "norm"
    if is_norm or names[-1] in ("bias", "output_bias"):
      assert not value, names
    elif names[-1] in ("kernel", "embedding"):
      assert value, names
    else:
      raise AssertionError(f"unclassified parameter {names}: decide whether it decays")
  assert len(decayed) == num_decayed, decayed
  assert "params/encoder/position_embeddings/embedding" in decayed
  assert "params/encoder/type_embeddings/embedding" in decayed
  assert "params/encoder/word_embeddings/embedding" in decayed
  assert "params/mlm_head/output_bias" in excluded
  assert "params/mlm_head/transform_ln/norm/scale" in excluded
  assert "params/encoder/embeddings_ln/norm/bias" in excluded


@pytest.mark.parametrize("field, value", [("name", "sgd"), ("schedule", "cosine")])
def test_unknown_names_raise_config_error(field, value):
  config = make_config(cl.bert_adamw())
  config.optimizer[field] = value
  with pytest.raises(ConfigError, match=value):
    optimizer.make_optimizer(config)


# LAMB's trust ratio on a parameter whose norm is 0 is 1 (the reference's `where`): a
# zero-initialised kernel exercises it at the first update with a non-zero rate.
ZERO_KERNEL = "zero/kernel"


@pytest.mark.parametrize("decay_norm_and_bias", [False, True])
def test_albert_lamb_matches_reference(decay_norm_and_bias):
  o = cl.albert_lamb(peak_lr=PEAK_LR, warmup_steps=WARMUP, weight_decay=WEIGHT_DECAY,
                     decay_norm_and_bias=decay_norm_and_bias)
  params, grads = tiny_problem(seed=2)
  rng = np.random.default_rng(3)
  params[ZERO_KERNEL] = np.zeros((3, 2))
  for g in grads:
    g[ZERO_KERNEL] = rng.normal(0.0, 0.3, (3, 2))
  adapted = set(params) if decay_norm_and_bias else BERT_DECAYED | {ZERO_KERNEL}
  ours = run_ours(make_config(o), params, grads)
  assert_histories_close(ours, lamb_reference(params, grads, o, TOTAL, adapted))
  # Steps 0 (rate 0) and 1 leave / move the zero kernel; later its trust ratio is not 1.
  np.testing.assert_array_equal(ours[0][ZERO_KERNEL], 0.0)
  assert np.abs(ours[1][ZERO_KERNEL]).min() > 0


def test_lamb_trust_ratio_is_per_layer_in_a_scanned_stack():
  """scan_layers stacks the layers' parameters under `layers` along axis 0; LAMB's norms are those
  of each layer's slice, so the update equals that of the unstacked layers."""
  rng = np.random.default_rng(4)
  per_layer = [rng.normal(0.0, scale, (4, 3)) for scale in (0.5, 2.0)]
  grads = [[rng.normal(0.0, 1.0, (4, 3)) for _ in per_layer] for _ in range(3)]
  o = cl.albert_lamb(peak_lr=PEAK_LR, warmup_steps=1, weight_decay=WEIGHT_DECAY)
  unstacked = {f"layer_{i}/dense/kernel": p for i, p in enumerate(per_layer)}
  stacked = {"layers/dense/kernel": np.stack(per_layer)}
  ours_unstacked = run_ours(make_config(o), unstacked,
                            [{f"layer_{i}/dense/kernel": x for i, x in enumerate(g)}
                             for g in grads])
  ours_stacked = run_ours(make_config(o), stacked,
                          [{"layers/dense/kernel": np.stack(g)} for g in grads])
  for a, b in zip(ours_stacked, ours_unstacked, strict=True):
    np.testing.assert_allclose(a["layers/dense/kernel"],
                               np.stack([b["layer_0/dense/kernel"], b["layer_1/dense/kernel"]]),
                               rtol=1e-6, atol=1e-7)


def test_rsqrt_and_constant_schedules():
  """T5: 1/sqrt(max(step, W)) scaled so that the first W steps run at peak_lr; constant."""
  o = cl.t5_adafactor(peak_lr=0.01, warmup_steps=10_000)
  schedule = optimizer.learning_rate_schedule(o, total_steps=2**19)
  for step in (0, 1, 9_999, 10_000):
    assert float(schedule(step)) == pytest.approx(0.01)
  assert float(schedule(40_000)) == pytest.approx(1 / math.sqrt(40_000))
  assert float(schedule(2**19 - 1)) == pytest.approx(1 / math.sqrt(2**19 - 1))
  o.update(schedule="constant", peak_lr=1e-3)
  constant = optimizer.learning_rate_schedule(o, total_steps=100)
  assert [float(constant(s)) for s in (0, 50, 99)] == pytest.approx([1e-3] * 3)


def test_adafactor_is_t5s():
  """name='adafactor' is optax.adafactor with T5's settings (decay 0.8, update clipping 1,
  parameter scaling, factored above 128) and our schedule; a global clip composes before it."""
  config = cl.base_config()
  config.optimizer = cl.t5_adafactor(peak_lr=0.02, warmup_steps=3)
  config.train.total_steps = 10
  tx, schedule = optimizer.make_optimizer(config)
  reference = optax.adafactor(learning_rate=schedule, decay_rate=0.8, clipping_threshold=1.0,
                              multiply_by_parameter_scale=True, min_dim_size_to_factor=128)
  rng = np.random.default_rng(0)
  params = {"matrix": jnp.asarray(rng.normal(size=(256, 130)), jnp.float32),
            "vector": jnp.asarray(rng.normal(size=(7,)), jnp.float32)}
  ours_state, ref_state = tx.init(params), reference.init(params)
  for _ in range(4):
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
    ours, ours_state = tx.update(grads, ours_state, params)
    ref, ref_state = reference.update(grads, ref_state, params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9), ours, ref)
    params = optax.apply_updates(params, ours)
  shapes = {leaf.shape for leaf in jax.tree.leaves(ours_state)}
  assert (256,) in shapes and (130,) in shapes and (256, 130) not in shapes  # factored moments


def _t5x_moment_sizes(names, shape, min_dim_size_to_factor=128):
  """Per layer: the sizes of t5x's factored row and column moments ({a, b}), or None for a full
  moment, for a parameter as t5x stores it. An independent transcription of t5x/adafactor.py's
  `_parse_rule` + `_factored_dims` with `standard_logical_factor_rules`, on t5x's layout:
  attention kernels 2-D (DenseGeneral's [embed, heads·kv] and [heads·kv, embed]), a scanned
  stack with a 'layers' axis, which is a batch axis."""
  kinds = {"vocab": "col", "embed": "row", "mlp": "col", "heads": "col", "kv": "col",
           "relpos_buckets": None, "layers": "batch"}
  scanned = "layers" in names
  merged = []   # t5x's storage: heads and kv are one 'joined_kv' (column) axis
  for name, size in zip(names, shape):
    if name == "kv" and merged and merged[-1][0] == "heads":
      merged[-1] = ("joined_kv", merged[-1][1] * size)
    else:
      merged.append((name, size))
  kinds["joined_kv"] = "col"
  per_layer = [(kinds[n], s) for n, s in merged if n != "layers"]
  if not scanned:   # rank <= 2: the heuristic on the two largest dims
    sizes = sorted(s for _, s in per_layer)
    if len(sizes) < 2 or sizes[-2] < min_dim_size_to_factor:
      return None
    return sorted(sizes[-2:])
  rows = math.prod(s for k, s in per_layer if k == "row")
  cols = math.prod(s for k, s in per_layer if k == "col")
  has_rows, has_cols = any(k == "row" for k, _ in per_layer), any(k == "col" for k, _ in per_layer)
  if not (has_rows or has_cols):
    return None
  # v_row drops the column axes, v_col the row axes (the layers kept in both).
  return sorted([rows * math.prod(s for k, s in per_layer if k is None),
                 cols * math.prod(s for k, s in per_layer if k is None)])


@pytest.mark.parametrize("version", ["1.0", "1.1"])
@pytest.mark.parametrize("scan", [False, True])
def test_adafactor_state_of_t5_base_is_t5xs(version, scan):
  """The state Adafactor keeps for every parameter of T5-base (abstract: nothing allocated)
  matches t5x's factoring: attention kernels factored as [d_model, heads·d_kv] (optax factors a
  3-D [d_model, heads, d_kv] kernel by its two largest axes, 768 and 64, and keeps a full
  moment), each layer of a scanned stack on its own."""
  from bertfam_jax import objectives  # pylint: disable=g-import-not-at-top
  from bertfam_jax.train import step  # pylint: disable=g-import-not-at-top
  config = cl.base_config()
  config.model = cl.t5_model("base", version, scan_layers=scan)
  config.objective = cl.t5_objective()
  config.optimizer = cl.t5_adafactor()
  objective = objectives.get("t5")
  model, inputs = objective.build_model(config), objectives.init_inputs(objective, config)
  axes = step.param_axes(model, inputs)
  tx, _ = step.make_optimizer(config, model, inputs)
  boxed = jax.eval_shape(lambda: model.init({"params": jax.random.key(0),
                                             "dropout": jax.random.key(0)}, **inputs,
                                            deterministic=True))
  params = nn.meta.unbox(boxed)
  state = [s for s in jax.eval_shape(tx.init, params) if isinstance(s, optimizer.AdafactorState)]
  treedef = jax.tree.structure(params)
  leaves = zip(treedef.flatten_up_to(params), treedef.flatten_up_to(axes),
               *(treedef.flatten_up_to(t) for t in (state[0].v_row, state[0].v_col, state[0].v)))
  factored = 0
  for param, names, v_row, v_col, v in leaves:
    layers = param.shape[0] if names[0] == "layers" else 1
    expected = _t5x_moment_sizes(names, param.shape)
    if expected is None:
      assert v.shape == param.shape and v_row.shape == v_col.shape == (1,), names
    else:
      assert v.shape == (1,), names
      assert sorted([v_row.size // layers, v_col.size // layers]) == expected, (names, param.shape)
      factored += 1
  assert factored >= (4 if scan else 100)


def test_adafactor_clips_and_scales_each_layer_of_a_scanned_stack():
  """A stack of 3 layers (scan_layers: one [layers, ...] array) gets the updates of 3 separate
  layers: moments, update clipping and parameter scale per layer, not over the whole stack
  (layer 0's gradients are 100× the others', and its parameters 10×)."""
  rng = np.random.default_rng(0)
  layers, width = 3, 16
  kernel_names, scale_names = ("embed", "heads", "kv"), ("embed",)
  stacked = {"kernel": jnp.asarray(rng.normal(size=(layers, width, 2, 8)), jnp.float32),
             "scale": jnp.asarray(rng.normal(size=(layers, width)), jnp.float32)}
  stacked = jax.tree.map(lambda x: x.at[0].multiply(10.0), stacked)
  stacked_axes = {"kernel": ("layers",) + kernel_names, "scale": ("layers",) + scale_names}
  unrolled = {f"layer_{i}": {k: v[i] for k, v in stacked.items()} for i in range(layers)}
  unrolled_axes = {f"layer_{i}": {"kernel": kernel_names, "scale": scale_names}
                   for i in range(layers)}

  def transform(axes):
    return optimizer.scale_by_t5x_adafactor(0.01, axes, min_dim_size_to_factor=4)

  tx_stacked, tx_unrolled = transform(stacked_axes), transform(unrolled_axes)
  state_stacked, state_unrolled = tx_stacked.init(stacked), tx_unrolled.init(unrolled)
  for _ in range(3):
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), stacked)
    grads = jax.tree.map(lambda g: g.at[0].multiply(100.0), grads)
    ours, state_stacked = tx_stacked.update(grads, state_stacked, stacked)
    separate, state_unrolled = tx_unrolled.update(
        {f"layer_{i}": {k: v[i] for k, v in grads.items()} for i in range(layers)},
        state_unrolled, unrolled)
    for i in range(layers):
      for key in stacked:
        np.testing.assert_allclose(ours[key][i], separate[f"layer_{i}"][key], rtol=2e-5,
                                   atol=1e-9)
    stacked = optax.apply_updates(stacked, ours)
    unrolled = optax.apply_updates(unrolled, separate)
  assert state_stacked.v_row["kernel"].shape == (layers, width)   # factored per layer


@pytest.mark.parametrize("untie_r", [False, True])
def test_xlnet_decays_its_relative_attention_biases(untie_r):
  """xlnet/model_utils.py: include_in_weight_decay=["r_s_bias", "r_r_bias", "r_w_bias"] wins over
  exclude_from_weight_decay=[..., "bias"]; the other biases and the norms stay undecayed."""
  from bertfam_jax.objectives import xlnet  # pylint: disable=import-outside-toplevel
  config = load_config("xlnet", "runlocal")
  config.model.untie_r = untie_r
  model = xlnet.build_model(config)
  rng = jax.random.key(0)
  params = jax.eval_shape(lambda: nn.meta.unbox(model.init(
      {"params": rng, "dropout": rng}, **xlnet.init_inputs(config), deterministic=True)))
  mask = {"/".join(k.key for k in path): value
          for path, value in jax.tree_util.tree_flatten_with_path(optimizer.decay_mask(params))[0]}
  relative = {name: value for name, value in mask.items()
              if name.rpartition("/")[2] in optimizer.DECAYED_BIASES}
  assert len(relative) == 3 * (config.model.layers if untie_r else 1), relative
  assert all(relative.values())
  other_biases = [v for n, v in mask.items() if "bias" in n.rpartition("/")[2]
                  and n not in relative]
  assert other_biases and not any(other_biases)


def test_xlnet_schedule_decays_to_a_thousandth_of_the_peak():
  """model_utils.py: warmup, then polynomial (power 1) decay from the peak at W to
  peak · min_lr_ratio (0.001) at T, following an overridden peak."""
  config = load_config("xlnet", None)
  o = config.optimizer
  assert (o.schedule, o.min_lr_ratio) == ("linear_after_warmup", 0.001)
  schedule = optimizer.learning_rate_schedule(o, 500_000)
  steps = (40_000, 270_000, 500_000, 600_000)
  peak = 4e-4
  expected = [peak, peak - (peak - peak / 1000) / 2, peak / 1000, peak / 1000]
  np.testing.assert_allclose([float(schedule(s)) for s in steps], expected, rtol=1e-5)
  o.peak_lr = 1e-3
  np.testing.assert_allclose(float(optimizer.learning_rate_schedule(o, 500_000)(500_000)), 1e-6,
                             rtol=1e-5)
  o.min_lr_ratio = 1.5
  with pytest.raises(ConfigError, match="optimizer.min_lr_ratio"):
    cl.check_fields(config, cl.FIELD_RULES)
