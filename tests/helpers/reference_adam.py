"""Float64 numpy transcription of the Adam with decoupled weight decay that BERT's
AdamWeightDecayOptimizer (optimization.py), GPT's opt.py `adam` and TinyBERT's BertAdam
(transformer/optimization.py) share: one loop, their differences passed in (the rate of each
update, which parameters decay, how the gradients are clipped)."""

import math

import numpy as np


def clip_global(grads: dict, clip_norm: float) -> dict:
  """tf.clip_by_global_norm: every gradient times clip_norm / max(global norm, clip_norm)."""
  global_norm = math.sqrt(sum(np.sum(x**2) for x in grads.values()))
  return {k: x * clip_norm / max(global_norm, clip_norm) for k, x in grads.items()}


def clip_each(grads: dict, clip_norm: float) -> dict:
  """torch's clip_grad_norm_ on each parameter alone: max_norm / (‖g‖ + 1e-6) when below 1."""
  out = {}
  for k, g in grads.items():
    coef = clip_norm / (np.linalg.norm(g) + 1e-6)
    out[k] = g * coef if coef < 1 else g
  return out


def adam_decay_history(params: dict, grads: list, *, rate, decays, clip, b1: float, b2: float,
                       eps: float, weight_decay: float) -> list[dict]:
  """θ (name → float64 array) after each update: g = clip(g), m and v updated, then
  θ − rate(step) · (m / (√v + eps) + weight_decay · θ where decays(name, θ)), `step` 0-based
  (a bias correction, where the reference has one, is folded into `rate`)."""
  theta = dict(params)
  m = {k: np.zeros_like(x) for k, x in params.items()}
  v = {k: np.zeros_like(x) for k, x in params.items()}
  history = []
  for step, g in enumerate(grads):
    g = clip(g)
    lr = rate(step)
    for k in theta:
      m[k] = b1 * m[k] + (1.0 - b1) * g[k]
      v[k] = b2 * v[k] + (1.0 - b2) * g[k]**2
      update = m[k] / (np.sqrt(v[k]) + eps)
      if decays(k, theta[k]):
        update = update + weight_decay * theta[k]
      theta[k] = theta[k] - lr * update
    history.append(dict(theta))
  return history
