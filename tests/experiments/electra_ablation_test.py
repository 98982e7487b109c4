"""experiments/electra_ablation.py: equal-compute configs, ranks, the table; no training."""

import json
import os
import sys

import numpy as np
import pytest

# `experiments/` is not part of the installed package: import it from the checkout.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

from experiments import common, stats  # noqa: E402
from experiments import electra_ablation as ea  # noqa: E402

PRETRAINED = [(name, overrides) for name, overrides in ea.ROWS if overrides is not None]


@pytest.fixture(scope="module")
def configs():
  return {name: ea.pretrain_config(ea.SCALES["runlocal"], overrides, seed=3)
          for name, overrides in PRETRAINED}


def test_rows_are_the_paper_rows_and_the_floor():
  assert [name for name, _ in ea.ROWS] == ["ELECTRA", "All-Tokens MLM", "Replace MLM",
                                           "ELECTRA 15%", "BERT", common.NO_PRETRAINING]
  assert set(ea.PAPER_GLUE) == {name for name, _ in PRETRAINED}


def test_equal_compute(configs):
  scale = ea.SCALES["runlocal"]
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
    assert c.train.checkpoint_every == c.train.eval_every == steps[name]


def test_rows_differ_only_in_objective(configs):
  def rest(c):
    d = c.to_dict()
    del d["objective"], d["train"]["total_steps"], d["train"]["log_every"]
    del d["train"]["eval_every"], d["train"]["checkpoint_every"], d["optimizer"]["warmup_steps"]
    return d
  reference = rest(configs["ELECTRA"])
  for name, c in configs.items():
    assert rest(c) == reference, name
    assert c.seed == 3 and c.data.packing == "electra_segments"


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


def test_paper_scale_configures():
  c = ea.pretrain_config(ea.SCALES["paper"], dict(ea.ROWS)["BERT"], seed=0)
  assert (c.data.seq_len, c.model.hidden, c.model.layers, c.objective.max_predictions) == (
      512, 768, 12, 80)
  assert c.train.checkpoint_every == 10_000


def test_ranks_and_spearman():
  np.testing.assert_array_equal(stats.ranks([85.0, 84.3, 82.4, 82.4, 82.2]), [1, 2, 3.5, 3.5, 5])
  assert stats.spearman_rho([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
  assert stats.spearman_rho([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
  assert np.isnan(stats.spearman_rho([1, 1, 1], [1, 2, 3]))


def _result(name, seed, accuracy):
  return dict(row=name, seed=seed, accuracy=accuracy, macro_f1=0.1, mcc=0.2,
              probe_accuracy=accuracy, probe_macro_f1=0.1, total_seconds=10.0,
              pretrain_steps=0 if name == common.NO_PRETRAINING else 100,
              flops_per_token=0.0 if name == common.NO_PRETRAINING else 4e6,
              train_flops=0.0 if name == common.NO_PRETRAINING else 1.6e15,
              pretrain_eval={} if name == common.NO_PRETRAINING else dict(
                  generator_mlm_accuracy=0.1, discriminator_accuracy=0.9))


def test_sweep_table_and_plot(tmp_path):
  # The paper's order of GLUE scores: our ranks match it, rho = 1.
  accuracy = {"ELECTRA": 0.5, "All-Tokens MLM": 0.4, "Replace MLM": 0.3, "ELECTRA 15%": 0.3,
              "BERT": 0.2, common.NO_PRETRAINING: 0.1}
  path = str(tmp_path / "results.jsonl")
  with open(path, "w") as f:
    f.write(json.dumps(_result("BERT", 0, 0.2)) + "\n")
  calls = []

  def run_row(name, overrides, seed):
    calls.append((name, seed))
    return _result(name, seed, accuracy[name] + 0.01 * seed)

  results = common.run_sweep(ea.ROWS, [n for n, _ in ea.ROWS], [0, 1], path, run_row)
  assert ("BERT", 0) not in calls and len(calls) == 11 and len(common.read_results(path)) == 12
  table = common.summarise(results, [name for name, _ in ea.ROWS])
  assert table[0]["accuracy"][0] == pytest.approx(50.5)
  assert table[0]["accuracy"][1] == pytest.approx(np.std([50, 51], ddof=1))
  markdown = ea.markdown_table(table, results, "runlocal")
  assert "| ELECTRA | 2 | 100 | 4.00 M | 1.6e+15 | G-MLM 10.0 · D 90.0 | – | 50.5 ± 0.7 |" in markdown
  assert "| 1 / 1 | 85.0 | 1 | 10 |" in markdown
  assert "GLUE over the 5 paper rows: 1.00" in markdown
  assert "as quoted in the issue; not verified" in markdown
  common.plot(table, str(tmp_path / "plot.png"), "t", paper=("GLUE", ea.PAPER_GLUE))
  assert os.path.getsize(tmp_path / "plot.png") > 0


def test_final_eval_metrics(tmp_path):
  with open(tmp_path / "metrics.jsonl", "w") as f:
    f.write(json.dumps(dict(step=5, loss=1.0)) + "\n")
    f.write(json.dumps(dict(step=5, eval_loss=2.0, eval_mlm_accuracy=0.3)) + "\n")
    f.write(json.dumps(dict(step=10, eval_loss=1.5, eval_mlm_accuracy=0.4)) + "\n")
  assert common.final_eval_metrics(str(tmp_path)) == dict(loss=1.5, mlm_accuracy=0.4)


class _FakeTokenizer:
  pad_id, cls_id, sep_id = 0, 2, 3

  def encode(self, texts):
    return [np.array([4 + sum(map(ord, w)) % 90 for w in text.split()], np.int32) for text in texts]


def test_token_cosine_detects_a_collapsed_encoder():
  from bertfam_jax import config_lib  # pylint: disable=import-outside-toplevel
  model = config_lib.encoder("mini", vocab_size=100, max_positions=16, layers=1)
  params = common.random_encoder(model, 16, 0)
  texts = [f"w{i} x{i % 7} y{i % 5} z" for i in range(20)]
  fresh = ea.token_cosine(model, params, _FakeTokenizer(), texts, 16)
  assert fresh < 0.6
  # The last LayerNorm with scale 0 maps every token to its bias: one vector.
  ln = dict(params["layer_0"]["output_ln"]["norm"])
  ln["scale"] = np.zeros_like(ln["scale"])
  ln["bias"] = np.ones_like(ln["bias"])
  collapsed = {**params, "layer_0": {**params["layer_0"], "output_ln": {"norm": ln}}}
  assert ea.token_cosine(model, collapsed, _FakeTokenizer(), texts, 16) == pytest.approx(1.0)
