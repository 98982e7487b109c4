"""Each paper's weights are drawn as its reference code draws them (`model.weight_init`):

- TF's truncated normal, cut at 2σ, in google-research/bert's `create_initializer` (BERT,
  StructBERT; ALBERT and ELECTRA run that code);
- an uncut N(0, σ²) in fairseq's `init_bert_params` (RoBERTa), PyTorch BERT's `init_bert_weights`
  (SpanBERT's pair_bert.py, UniLM, TinyBERT's `from_scratch` student), OpenAI GPT's
  `random_normal_initializer` and XLNet's `_get_initializer`.

The check is statistical, on every weight matrix the objective's network draws at σ 0.02. There
are ~10⁴-10⁵ values per model. A truncated draw has none beyond 2σ and a std of 0.88σ. An uncut
draw has 4.55% of its values beyond 2σ and a std of σ.
"""

import os

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertfam_jax import config_lib
from bertfam_jax import objectives
from bertfam_jax.models import finetune, layers
from helpers import tiny, trees

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIGMA = 0.02
# ELECTRA's Glorot-uniform layers (model.bare_dense_init), drawn at another scale.
GLOROT = ("embeddings_projection", "rtd_head/prediction")


def _tiny_config(paper: str):
  """`configs/<paper>.py:runlocal` with its model at the suite's tiny size, `heads` kept where
  the paper ties it to a teacher (TinyBERT)."""
  config = config_lib.load_config(os.path.join(_REPO, "configs", f"{paper}.py"), "runlocal")
  if paper != "tinybert":
    config.model.update(tiny.SIZE)
  return config


def _drawn_weights(config) -> dict[str, np.ndarray]:
  """Every matrix of the objective's `params` drawn at σ 0.02 (not LayerNorm, not a bias, not a
  Glorot layer), flattened, by its path."""
  objective = objectives.get(config.objective.name)
  model = objective.build_model(config)
  params = jax.jit(lambda: nn.meta.unbox(model.init(
      jax.random.key(0), **objectives.init_inputs(objective, config),
      deterministic=True)))()["params"]
  return {name: leaf.ravel() for name, leaf in trees.leaves_by_path(params).items()
          if leaf.ndim >= 2 and not any(g in name for g in GLOROT) and "_ln" not in name}


@pytest.mark.parametrize("paper, weight_init", [
    ("bert", "truncated_normal"), ("structbert", "truncated_normal"),
    ("albert", "truncated_normal"), ("electra", "truncated_normal"),
    ("roberta", "normal"), ("spanbert", "normal"), ("unilm", "normal"), ("gpt", "normal"),
    ("tinybert", "normal"), ("xlnet", "normal"),
])
def test_each_paper_draws_its_weights_as_its_reference(paper, weight_init):
  config = _tiny_config(paper)
  assert config.model.weight_init == weight_init
  drawn = _drawn_weights(config)
  w = np.concatenate(list(drawn.values()))
  assert w.size > 10_000
  beyond = np.mean(np.abs(w) > 2 * SIGMA)
  if weight_init == "normal":
    assert 0.035 < beyond < 0.056 and w.std() == pytest.approx(SIGMA, rel=0.04)
    # No layer keeps a truncated draw of its own: each matrix of ≥ 400 values reaches past 2σ
    # (an uncut draw fails that with probability 0.9545⁴⁰⁰ < 10⁻⁸).
    cut = [name for name, v in drawn.items() if v.size >= 400 and np.abs(v).max() <= 2 * SIGMA]
    assert not cut
  else:
    assert beyond == 0 and w.std() == pytest.approx(0.88 * SIGMA, rel=0.04)


def test_the_setting_reaches_every_layer_both_ways():
  """SpanBERT (uncut by default) with `truncated_normal` draws every σ-0.02 matrix truncated:
  embeddings, Q / K / V / output, FFN, the MLM transform and the span-boundary head alike."""
  config = _tiny_config("spanbert")
  config.model.weight_init = "truncated_normal"
  drawn = _drawn_weights(config)
  assert any("offset_embeddings" in name for name in drawn)
  assert max(np.abs(v).max() for v in drawn.values()) <= 2 * SIGMA


def test_an_unknown_distribution_is_refused():
  with pytest.raises(ValueError, match="model.weight_init"):
    layers.normal_weights(SIGMA, "uniform")


@pytest.mark.parametrize("model_config, weight_init", [
    (tiny.encoder(), "truncated_normal"),
    (tiny.encoder(weight_init="normal"), "normal"),   # RoBERTa's, an imported one's too
    (tiny.xlnet(), "normal"),                          # modeling.py's _get_initializer
])
def test_fine_tuning_heads_draw_as_the_backbone_says(model_config, weight_init):
  """The task head a fine-tuning adds (pooler or summary projection, classifier) draws as its
  model section says: XLNet's classification_loss and summarize_sequence uncut, BERT's cut."""
  assert model_config.weight_init == weight_init
  model = finetune.FineTuneModel(model_config, "classification", 16,
                                 backbone=finetune.backbone_for(model_config))
  ids = np.zeros((2, 8), np.int32)
  params = jax.jit(lambda: nn.meta.unbox(model.init(
      jax.random.key(0), ids, np.ones_like(ids), ids, deterministic=True)))()["params"]
  head = {name: leaf for name, leaf in trees.leaves_by_path(params).items()
          if not name.startswith("encoder/") and leaf.ndim == 2}
  assert len(head) == 2 and all(w.size >= 512 for w in head.values())   # [32, 32], [32, 16]
  for w in head.values():
    assert (np.abs(w).max() > 2 * SIGMA) == (weight_init == "normal")
