"""experiments/t5_architectures.py, the sweep (tests/objectives/t5_architectures_test.py tests
the decoder-only objective): Table 2's rows as configuration at the paper's cost units (2P / P
parameters, M / M/2 FLOPs), and the report out of results; no training."""

import os
import sys

import numpy as np
import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

from experiments import common, report  # noqa: E402
from experiments import t5_architectures as arch  # noqa: E402
from experiments import t5_objectives as t5x  # noqa: E402


@pytest.fixture(scope="module")
def configs():
  return {name: arch.pretrain_config(arch.SCALES["cpu"], spec, seed=1)
          for name, spec in arch.ROWS if spec is not None}


def test_rows_are_table_2s():
  names = [name for name, _ in arch.ROWS]
  assert len(names) == len(set(names)) == 11 and names[-1] == common.NO_PRETRAINING
  assert not any("," in name for name in names)   # --rows is a comma-separated list
  assert {name for _, group in arch.TABLE_GROUPS for name in group} == set(names)
  assert arch.SCALES["cpu"]["rows"] == names[:5] + [common.NO_PRETRAINING]


def test_paper_columns_are_table_2s():
  """Every row has the paper's seven validation scores; spot checks against the print."""
  assert set(arch.PAPER) == {name for name, _ in arch.ROWS}
  assert all(len(v) == len(t5x.PAPER_COLUMNS) for v in arch.PAPER.values())
  assert arch.PAPER[arch.BASELINE] == t5x.PAPER[t5x.BASELINE]   # the ★ row of every table
  assert arch.PAPER["Language model · LM"][2] == 53.81      # SQuAD
  assert arch.PAPER["Prefix LM · Denoising"][3] == 68.11    # SGLUE
  assert arch.COMPARISON.paper["Enc-dec (6 layers) · LM"]["EnFr"] == 38.42


def test_rows_differ_in_architecture_and_objective_only(configs):
  def rest(c):
    d = c.to_dict()
    del d["objective"], d["model"]
    return d
  reference = rest(configs[arch.BASELINE])
  for name, c in configs.items():
    assert rest(c) == reference, name
  objectives = {name: c.objective.noise_mask for name, c in configs.items()}
  assert {v for k, v in objectives.items() if "Denoising" in k} == {"iid"}
  assert {v for k, v in objectives.items() if k.endswith("· LM")} == {"random_prefix"}
  models = {name.split(" · ")[0]: c.model for name, c in configs.items()}
  assert models["Enc-dec (shared)"].share_encoder_decoder
  assert models["Language model"].architecture == "decoder_only"
  assert models["Prefix LM"].architecture == "prefix_lm"
  assert (models["Enc-dec (6 layers)"].layers, models["Encoder-decoder"].layers) == (1, 2)


def test_costs_are_the_papers_units(configs):
  """2P for the encoder-decoder, about P for the others (cross-attention aside, which the
  paper's accounting leaves out), M FLOPs per example, about M/2 for half the depth; the
  decoder-only rows over inputs + targets about M (the paper's units count the layers only)."""
  cost = {name.split(" · ")[0]: arch.cost(c) for name, c in configs.items()
          if name.endswith("Denoising")}
  params = {k: p for k, (p, _) in cost.items()}
  flops = {k: f for k, (_, f) in cost.items()}
  two_p = params["Encoder-decoder"]
  assert params["Language model"] == params["Prefix LM"]
  p = params["Language model"]   # L layers of self-attention + MLP: the paper's P
  assert two_p > 2 * p and params["Enc-dec (6 layers)"] == pytest.approx(two_p / 2)
  assert p < params["Enc-dec (shared)"] < 1.5 * p
  m = flops["Encoder-decoder"]
  assert flops["Enc-dec (shared)"] == m
  # The layers halve; the output layer (6·d·V per target token) does not, and at this scale
  # (V 4,224, d 128) it is a large share: between M/2 and 0.7 M.
  assert m / 2 < flops["Enc-dec (6 layers)"] < 0.7 * m
  # A decoder-only row also computes logits over its inputs (6·d·V per token): above M here.
  assert m < flops["Language model"] == flops["Prefix LM"] < 1.5 * m


def _fake_results(examples=60, seeds=(0, 1, 2)):
  rng = np.random.default_rng(0)
  results = []
  for seed in seeds:
    for i, (name, spec) in enumerate(arch.ROWS):
      metrics, per_example = {}, {}
      for _, task, metric, _ in t5x.TASKS:
        scores = (rng.uniform(size=examples) < 0.3 - 0.01 * i).astype(float)
        nll = rng.uniform(2, 4, size=examples) + 0.05 * i
        per_example[task] = {metric: scores.tolist(), "target_nll": nll.tolist()}
        metrics.update({f"{task}/{metric}": scores.mean(), f"{task}/target_loss": nll.mean(),
                        f"{task}/distinct": 40})
      results.append(dict(row=name, seed=seed, scale="test", commit="abc", metrics=metrics,
                          examples=per_example, degenerate=[], pretrain={}))
  return results


def test_report_from_fake_results():
  constants = {"wordnet_supersense_t2t": 0.12, "wordnet_qa_t2t": 0.0, "wordnet_define": 0.02}
  markdown = report.markdown(_fake_results(), arch.COMPARISON, setup="Fake.",
                             constants=constants, degenerate={}, resamples=200)
  assert "Table 2: denoising objective" in markdown and "Table 2: LM objective" in markdown
  assert f"| {arch.BASELINE} |" in markdown and "Enc-dec (6 layers) P, M/2" in markdown
  assert "83.28" in markdown and "Kendall" in markdown   # the paper's column and rank agreement


def test_differences_with_two_seeds_are_the_rows_mean_differences():
  """With 2 seeds the bootstrap adds Student-t(1) seed errors, which have no mean: the printed
  difference is the rows' means' difference (inside its interval), never the resamples' mean
  (which came out as −179.7 points of accuracy in a real 2-seed report)."""
  results = _fake_results(seeds=(0, 1))
  markdown = report.markdown(results, arch.COMPARISON, setup="Fake.", constants={},
                             degenerate={}, resamples=2000)
  table = report.summarise(results, arch.COMPARISON)
  section = markdown.split("## Differences against")[1].split("##")[0]
  column = arch.COMPARISON.columns[0]
  for name in table:
    if name == arch.BASELINE:
      continue
    line = next(l for l in section.splitlines() if l.startswith(f"| {name} |"))
    cell = line.split(" | ")[1]
    point = float(cell.split(" [")[0])
    expected = table[name][column.key][0] - table[arch.BASELINE][column.key][0]
    assert point == pytest.approx(expected, abs=0.051)
    low, high = (float(x) for x in cell.split(" [")[1].rstrip("]").split(", "))
    assert low <= point <= high
