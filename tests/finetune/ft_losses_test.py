"""Fine-tuning losses against values computed by hand in numpy (float64) from their references:
softmax cross-entropy (run_classifier.py), MSE (STS-B), first-sub-token cross-entropy, and
run_squad.py's (start + end) / 2."""

import numpy as np
import pytest

from bertfam_jax.config_lib import ConfigError
from bertfam_jax.finetune import losses

TOL = dict(rtol=1e-6, atol=1e-6)


def log_softmax(x):
  x = np.asarray(x, np.float64)
  shifted = x - x.max(-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def check(result, loss, metrics):
  got_loss, got_metrics = result
  np.testing.assert_allclose(got_loss, loss, **TOL)
  assert got_metrics.keys() == metrics.keys()
  for name, (total, count) in metrics.items():
    np.testing.assert_allclose(got_metrics[name][0], total, **TOL, err_msg=name)
    np.testing.assert_allclose(got_metrics[name][1], count, **TOL, err_msg=name)


@pytest.mark.parametrize("kind", ["classification", "multiple_choice"])
def test_cross_entropy_of_labels(kind):
  logits = np.array([[2.0, 0.5, -1.0], [0.1, 0.2, 0.3], [-3.0, 4.0, 1.0]], np.float32)
  label = np.array([0, 0, 2])
  # -log p(label): row 0 predicts 0 (correct), row 1 predicts 2, row 2 predicts 1.
  ce = -log_softmax(logits)[np.arange(3), label]
  check(losses.task_loss(kind, logits, dict(label=label)), ce.mean(),
        {"loss": (ce.sum(), 3), "accuracy": (1, 3)})
  # One value by hand: row 0, -log(e² / (e² + e^0.5 + e^-1)).
  np.testing.assert_allclose(ce[0], -np.log(np.exp(2) / (np.exp(2) + np.exp(0.5) + np.exp(-1))))


def test_regression_is_mean_squared_error():
  predictions = np.array([1.5, -0.5, 3.0, 0.0], np.float32)
  label = np.array([1.0, 0.5, 3.0, 2.0], np.float32)
  # (0.25 + 1 + 0 + 4) / 4
  check(losses.task_loss("regression", predictions, dict(label=label)), 5.25 / 4,
        {"loss": (5.25, 4)})


def test_token_loss_counts_first_sub_tokens_only():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 5, 4)).astype(np.float32)
  labels = rng.integers(0, 4, (2, 5))
  weights = np.array([[1, 1, 0, 1, 0], [1, 0, 0, 0, 0]], np.float32)
  ce = -log_softmax(logits)[np.arange(2)[:, None], np.arange(5)[None], labels]
  correct = (logits.argmax(-1) == labels) * weights
  expected = (ce * weights).sum() / 4
  batch = dict(labels=labels, label_weights=weights)
  check(losses.task_loss("token_classification", logits, batch), expected,
        {"loss": ((ce * weights).sum(), 4), "accuracy": (correct.sum(), 4)})
  # Changing the logits or labels of weight-0 positions changes nothing.
  changed = dict(batch, labels=np.where(weights > 0, labels, (labels + 1) % 4))
  check(losses.task_loss("token_classification", logits + 5 * (weights == 0)[..., None] *
                         rng.normal(size=logits.shape), changed), expected,
        {"loss": ((ce * weights).sum(), 4), "accuracy": (correct.sum(), 4)})
  # No labelled position: loss 0, not NaN.
  loss, _ = losses.task_loss("token_classification", logits, dict(batch, label_weights=0 * weights))
  assert float(loss) == 0.0


def test_extractive_qa_is_run_squads_mean_of_start_and_end():
  rng = np.random.default_rng(1)
  outputs = rng.normal(size=(3, 6, 2)).astype(np.float32)
  start, end = np.array([0, 2, 5]), np.array([0, 4, 5])
  # run_squad.py compute_loss: -mean(sum(one_hot(positions) * log_softmax(logits))), per boundary.
  start_ce = -(np.eye(6)[start] * log_softmax(outputs[..., 0])).sum(-1)
  end_ce = -(np.eye(6)[end] * log_softmax(outputs[..., 1])).sum(-1)
  expected = (start_ce.mean() + end_ce.mean()) / 2
  check(losses.task_loss("extractive_qa", outputs, dict(start_position=start, end_position=end)),
        expected,
        {"loss": ((start_ce + end_ce).sum() / 2, 3),
         "start_accuracy": ((outputs[..., 0].argmax(-1) == start).sum(), 3),
         "end_accuracy": ((outputs[..., 1].argmax(-1) == end).sum(), 3)})


def test_joint_qa_adds_half_the_answerable_classifiers_sigmoid_cross_entropy():
  """electra qa_tasks.py: losses = (start_loss + end_loss) / 2 + answerable_weight (0.5) ×
  sigmoid_cross_entropy_with_logits(is_impossible, answerable_logit), averaged over the batch."""
  rng = np.random.default_rng(2)
  start_logits, end_logits = rng.normal(size=(2, 3, 6)).astype(np.float32)
  answerable = np.array([2.0, -1.0, 0.5], np.float32)
  start, end, impossible = np.array([0, 2, 5]), np.array([0, 4, 5]), np.array([1, 0, 0])
  outputs = dict(start_logits=start_logits, end_logits=end_logits, answerable_logit=answerable)
  start_ce = -(np.eye(6)[start] * log_softmax(start_logits)).sum(-1)
  end_ce = -(np.eye(6)[end] * log_softmax(end_logits)).sum(-1)
  sigmoid_ce = np.log1p(np.exp(-answerable)) * impossible + np.log1p(np.exp(answerable)) * (
      1 - impossible)
  per_example = (start_ce + end_ce) / 2 + 0.5 * sigmoid_ce
  check(losses.task_loss("extractive_qa", outputs, dict(start_position=start, end_position=end,
                                                        is_impossible=impossible)),
        per_example.mean(),
        {"loss": (per_example.sum(), 3), "answerable_loss": (sigmoid_ce.sum(), 3),
         "start_accuracy": ((start_logits.argmax(-1) == start).sum(), 3),
         "end_accuracy": ((end_logits.argmax(-1) == end).sum(), 3)})


def test_unknown_kind_names_the_choices():
  with pytest.raises(ConfigError, match="extractive_qa"):
    losses.task_loss("ranking", np.zeros((1, 2)), {})


def test_the_mix_penalty_is_lambda_times_the_squared_weights():
  """finetune.mix_l2 (bilm-tf weight_layers' l2_coef): loss + λ·Σ w² of the scalar mix's
  weights, gradient 2λw on them and nothing on the rest; λ = 0 leaves the loss as it is."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from bertfam_jax.finetune import run  # pylint: disable=import-outside-toplevel
  weights = jnp.asarray([0.5, -1.0, 2.0])
  params = {"params": {"scalar_mix": {"weights": weights, "gamma": jnp.asarray(1.3)},
                       "token_head": {"classifier": {"bias": jnp.ones(2)}}}}
  task = lambda model, p, batch, rng, config, deterministic=False: (  # noqa: E731
      jnp.sum(p["params"]["token_head"]["classifier"]["bias"]), {})
  penalised = run.with_mix_penalty(task, 0.1)
  loss, metrics = penalised(None, params, None, None, None)
  np.testing.assert_allclose(loss, 2.0 + 0.1 * 5.25, **TOL)
  np.testing.assert_allclose(metrics["mix_penalty"][0], 0.525, **TOL)
  grads = jax.grad(lambda p: penalised(None, p, None, None, None)[0])(params)["params"]
  np.testing.assert_allclose(grads["scalar_mix"]["weights"], 0.2 * np.asarray(weights), **TOL)
  assert float(grads["scalar_mix"]["gamma"]) == 0.0
  np.testing.assert_array_equal(grads["token_head"]["classifier"]["bias"], np.ones(2))
  assert run.with_mix_penalty(task, 0.0) is task
  # QAT's loss (finetune/quantize.py) also returns its range updates: they pass through.
  qat = lambda *a, **kw: (*task(*a, **kw), {"ranges": 1})  # noqa: E731
  loss, _, updates = run.with_mix_penalty(qat, 0.1)(None, params, None, None, None)
  np.testing.assert_allclose(loss, 2.0 + 0.1 * 5.25, **TOL)
  assert updates == {"ranges": 1}
  # A distillation teacher's mix (another collection, fixed) is not penalised.
  with_teacher = dict(params, teacher={"scalar_mix": {"weights": jnp.ones(3)}})
  np.testing.assert_allclose(penalised(None, with_teacher, None, None, None)[0], loss, **TOL)
