"""experiments/electra_ablation.py: equal-compute configs, the rows, the paper's column; no
training (the report of an encoder comparison is tested in masking_schemes_test.py)."""

import os
import sys

import pytest

# `experiments/` is not part of the installed package: import it from the checkout.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

from experiments import common  # noqa: E402
from experiments import electra_ablation as ea  # noqa: E402

PRETRAINED = [(name, overrides) for name, overrides in ea.ROWS if overrides is not None]


@pytest.fixture(scope="module")
def configs():
  return {name: ea.pretrain_config(ea.SCALES["cpu"], overrides, seed=3)
          for name, overrides in PRETRAINED}


def test_rows_are_the_paper_rows_and_the_floor():
  assert [name for name, _ in ea.ROWS] == ["ELECTRA", "All-Tokens MLM", "Replace MLM",
                                           "ELECTRA 15%", "BERT", common.NO_PRETRAINING]
  assert set(ea.PAPER_GLUE) == {name for name, _ in PRETRAINED}


def test_equal_compute(configs):
  scale = ea.SCALES["cpu"]
  budget = (ea.flops_per_token(configs["ELECTRA"]) * scale["electra_steps"] *
            scale["batch_size"] * 128)
  steps = {name: c.train.total_steps for name, c in configs.items()}
  assert steps["ELECTRA"] == steps["ELECTRA 15%"] == scale["electra_steps"]
  assert steps["BERT"] > steps["ELECTRA"] > steps["Replace MLM"] > steps["All-Tokens MLM"]
  for name, c in configs.items():
    per_step = ea.flops_per_token(c) * c.train.batch_size * c.data.seq_len
    assert abs(per_step * c.train.total_steps - budget) <= per_step / 2, name
    expected_warmup = round(scale["warmup_steps"] * steps[name] / scale["electra_steps"])
    assert c.optimizer.warmup_steps == expected_warmup
    assert c.train.checkpoint_every == steps[name]
    assert c.train.eval_every == steps[name] // 4


def test_rows_differ_only_in_objective(configs):
  def rest(c):
    d = c.to_dict()
    del d["objective"], d["train"]["total_steps"], d["train"]["log_every"]
    del d["train"]["eval_every"], d["train"]["checkpoint_every"], d["optimizer"]["warmup_steps"]
    return d
  reference = rest(configs["ELECTRA"])
  for name, c in configs.items():
    assert rest(c) == reference, name
    assert c.seed == 3 and c.data.packing == "electra_segments" and c.data.wordnet_glosses


def test_objectives(configs):
  o = {name: c.objective for name, c in configs.items()}
  assert [o[n].variant for n in ("ELECTRA", "All-Tokens MLM", "Replace MLM", "ELECTRA 15%")] == [
      "electra", "all_tokens_mlm", "replace_mlm", "electra_15"]
  assert o["ELECTRA"].discriminator_weight == o["ELECTRA 15%"].discriminator_weight == 50.0
  assert o["All-Tokens MLM"].discriminator_weight == o["Replace MLM"].discriminator_weight == 1.0
  bert = o["BERT"]
  assert (bert.name, bert.mask_style, bert.mask_scheme, bert.masking, bert.sentence_task,
          bert.max_predictions) == ("mlm", "bert", "token", "dynamic", "", 20)
  assert (bert.mask_token_prob, bert.random_token_prob) == (0.8, 0.1)


def test_both_scales_take_the_reference_setup(configs):
  """configs/electra.py's Glorot-uniform bare dense layers and pooler-free task heads at both
  scales (the cpu records were re-run with them): nothing is pinned."""
  gpu = ea.pretrain_config(ea.SCALES["gpu"], dict(ea.ROWS)["ELECTRA"], seed=0)
  for config in [*configs.values(), gpu]:
    assert (config.model.bare_dense_init, config.model.classifier_pooler) == (
        "glorot_uniform", False)
  for scale in ("cpu", "gpu"):
    assert "Pinned" not in ea.setup_text(scale, ea.SCALES[scale])


def test_paper_scale_configures():
  c = ea.pretrain_config(ea.SCALES["paper"], dict(ea.ROWS)["BERT"], seed=0)
  assert (c.data.seq_len, c.model.hidden, c.model.layers, c.objective.max_predictions) == (
      512, 768, 12, 80)
  assert c.train.checkpoint_every == 10_000


def test_the_paper_column_is_table_5():
  assert ea.COMPARISON.paper == {name: {"GLUE": value} for name, value in ea.PAPER_GLUE.items()}
  assert ea.PAPER_GLUE == {"ELECTRA": 85.0, "All-Tokens MLM": 84.3, "Replace MLM": 82.4,
                           "ELECTRA 15%": 82.4, "BERT": 82.2}
  assert ea.COMPARISON.rows == [name for name, _ in ea.ROWS]
  assert ea.COMPARISON.primary.paper == "GLUE"


def test_floor_row_records_no_flops(monkeypatch):
  calls = []

  def fake_score(name, config, seed, scale, workdir, task, eval_keys):
    calls.append((name, config.objective.name, workdir, eval_keys))
    return dict(row=name, seed=seed, input_tokens=0)
  monkeypatch.setattr(common, "pretrain_and_score", fake_score)
  record = ea.run_row(common.NO_PRETRAINING, None, 0, ea.SCALES["cpu"], "/nonexistent", None)
  assert calls == [(common.NO_PRETRAINING, "electra", None, ())]
  assert (record["pretrain_steps"], record["train_flops"]) == (0, 0.0)


def test_every_row_fine_tunes_with_the_same_recipe(configs):
  """An ELECTRA checkpoint's own recipe (layer-wise decay 0.8) would give the detection rows
  another fine-tuning than BERT's: every row, the floor included, gets the same settings."""
  from bertfam_jax.finetune import run as finetune_run  # pylint: disable=import-outside-toplevel
  scale = ea.SCALES["cpu"]
  settings = []
  for config in [*configs.values(), ea.base_config(scale, 3)]:
    resolved = finetune_run.resolved_config(common.finetune_config(scale, 0), config)
    settings.append({k: resolved[k].to_dict() for k in ("finetune", "optimizer", "train")})
  assert all(s == settings[0] for s in settings)
  assert settings[0]["finetune"]["layer_decay"] == 1.0
