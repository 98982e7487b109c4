"""experiments/masking_schemes.py and the encoder-experiment machinery of experiments/common.py:
the rows as the paper's ablation, the collapse and degenerate checks, a tiny sweep end to end
(pre-training, fine-tuning, probe, the report's files), with per-example scores that add up to
the reported ones."""

import json
import os
import sys

import numpy as np
import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:  # the repository's experiments/, not this tests/experiments/
  sys.path.insert(0, _ROOT)

from bertfam_jax import config_lib  # noqa: E402
from experiments import common, report  # noqa: E402
from experiments import masking_schemes as ms  # noqa: E402

PRETRAINED = [(name, spec) for name, spec in ms.ROWS if spec is not None]


@pytest.fixture(scope="module")
def configs():
  return {name: ms.pretrain_config(ms.SCALES["cpu"], spec, seed=2) for name, spec in PRETRAINED}


def test_rows_are_the_papers_ablation(configs):
  """Table 6's setup: bi-sequence training with NSP, no SBO; the rows differ only in what they
  mask, and every row has the paper's seven numbers."""
  assert [name for name, _ in ms.ROWS] == ["Subword Tokens", "Whole Words", "Named Entities",
                                           "Noun Phrases", "Geometric Spans",
                                           common.NO_PRETRAINING]
  assert set(ms.PAPER) == set(configs) and all(len(v) == 7 for v in ms.PAPER.values())
  assert ms.PAPER["Geometric Spans"][0] == 85.4 and ms.PAPER["Subword Tokens"][6] == 83.2

  def rest(c):
    d = c.to_dict()
    for key in ("mask_scheme", "span_source", "replace_per"):
      d["objective"].pop(key)
    return d
  reference = rest(configs["Subword Tokens"])
  for name, c in configs.items():
    assert rest(c) == reference, name
    assert (c.data.packing, c.objective.sentence_task, c.objective.sbo) == (
        "sentence_pairs", "nsp", False)
    assert c.data.wordnet_glosses and c.seed == 2
  assert configs["Geometric Spans"].objective.mask_scheme == "span"
  assert configs["Noun Phrases"].objective.span_source == "noun_phrases"


def test_both_scales_take_the_reference_setup(configs):
  """Per-segment masking of the pair, eps 6e-6 and no clip on the mean loss, the decay counted
  from step 0 and pair_bert.py's uncut init, at both scales (the cpu records were re-run with
  them): nothing is pinned."""
  def setup(c):
    return (c.objective.mask_per_segment, c.optimizer.clip_norm, c.optimizer.eps,
            c.optimizer.schedule, c.model.weight_init)
  gpu = ms.pretrain_config(ms.SCALES["gpu"], dict(ms.ROWS)["Subword Tokens"], seed=0)
  for c in (configs["Subword Tokens"], gpu):
    assert setup(c) == (True, 0.0, 6e-6, "linear_from_zero", "normal")
  for scale in ("cpu", "gpu"):
    assert "Pinned" not in ms.setup_text(scale, ms.SCALES[scale])


class _FakeTokenizer:
  pad_id, cls_id, sep_id = 0, 2, 3

  def encode(self, texts):
    return [np.array([4 + sum(map(ord, w)) % 90 for w in text.split()], np.int32) for text in texts]


def test_token_cosine_detects_a_collapsed_encoder():
  model = config_lib.encoder("mini", vocab_size=100, max_positions=16, layers=1)
  params = common.random_encoder(model, 16, 0)
  texts = [f"w{i} x{i % 7} y{i % 5} z" for i in range(20)]
  fresh = common.token_cosine(model, params, _FakeTokenizer(), texts, 16)
  assert fresh < 0.6
  # The last LayerNorm with scale 0 maps every token to its bias: one vector.
  ln = dict(params["layer_0"]["output_ln"]["norm"])
  ln["scale"] = np.zeros_like(ln["scale"])
  ln["bias"] = np.ones_like(ln["bias"])
  collapsed = {**params, "layer_0": {**params["layer_0"], "output_ln": {"norm": ln}}}
  assert common.token_cosine(model, collapsed, _FakeTokenizer(), texts, 16) == pytest.approx(1.0)


def test_degenerate_flags():
  healthy = {f"{common.SUPERSENSE}/distinct": 30, f"{common.PROBE}/distinct": 12,
             "token_cosine": 0.4}
  assert common.degenerate_flags(healthy, 2.5) == []
  constant = dict(healthy, **{f"{common.SUPERSENSE}/distinct": 1}, token_cosine=0.99)
  assert common.degenerate_flags(constant, float("nan")) == [common.SUPERSENSE, "collapse",
                                                             "nonfinite"]


def test_final_eval_metrics(tmp_path):
  with open(tmp_path / "metrics.jsonl", "w") as f:
    f.write(json.dumps(dict(step=5, loss=1.0)) + "\n")
    f.write(json.dumps(dict(step=5, eval_loss=2.0, eval_mlm_accuracy=0.3)) + "\n")
    f.write(json.dumps(dict(step=10, loss=0.5)) + "\n")
    f.write(json.dumps(dict(step=10, eval_loss=1.5, eval_mlm_accuracy=0.4)) + "\n")
  assert common.final_eval_metrics(str(tmp_path)) == dict(loss=1.5, mlm_accuracy=0.4)
  record = common.pretrain_record(str(tmp_path), ("discriminator_accuracy", "mlm_accuracy"))
  assert record["eval_accuracy"] == 0.4
  assert record["curve"] == dict(steps=[5, 10], loss=[1.0, 0.5], eval_steps=[5, 10],
                                 eval_accuracy=[0.3, 0.4])


TINY = dict(ms.SCALES["cpu"], name="tiny", pretrain=dict(total_steps=4, batch_size=8),
            warmup_steps=1, finetune_train=64, finetune_eval=40, finetune_epochs=1,
            # The tokenizer from 4,000 sentences, as the data tests' (the whole corpus and
            # glosses took 40 s).
            config_overrides=["model.vocab_size=1000", "tokenizer.vocab_size=1000",
                              "tokenizer.train_max_sentences=4000", "data.seq_len=64",
                              "model.max_positions=64", "objective.max_predictions=10"])


def test_a_tiny_sweep_end_to_end(tmp_path):
  """A row pre-trained 4 steps and the floor, fine-tuned, probed and reported: the records
  carry per-example scores on the same examples, whose means are the reported scores."""
  task = common.supersense_task(TINY)
  results = common.run_sweep(
      ms.ROWS, ["Geometric Spans", common.NO_PRETRAINING], [0], str(tmp_path / "results.jsonl"),
      lambda name, spec, seed: ms.run_row(name, spec, seed, TINY, str(tmp_path / "runs"), task))
  assert [r["row"] for r in results] == ["Geometric Spans", common.NO_PRETRAINING]
  for r in results:
    for name in (common.SUPERSENSE, common.PROBE):
      examples = r["examples"][name]
      assert len(examples["accuracy"]) == len(examples["target_nll"]) == 40
      assert np.mean(examples["accuracy"]) == pytest.approx(r["metrics"][f"{name}/accuracy"])
      assert np.mean(examples["target_nll"]) == pytest.approx(
          r["metrics"][f"{name}/target_loss"], abs=1e-4)
      assert all(x > 0 for x in examples["target_nll"])
    assert 0 < r["metrics"]["token_cosine"] < 1
    assert r["host"] == common.host() and len(r["host"]["cpu_flags"]) == 12
  geometric, floor = results
  assert floor["pretrain"] == {} and floor["input_tokens"] == 0
  assert geometric["input_tokens"] == 4 * 8 * 64
  assert geometric["pretrain"]["curve"]["steps"][-1] == 4
  assert geometric["pretrain"]["eval_accuracy"] is not None

  markdown = ms.write_summary(results, str(tmp_path), "cpu")
  assert markdown.startswith("# SpanBERT masking schemes")
  assert "| Masking scheme | Supersense acc | Probe acc |" in markdown
  assert "| 85.40 | 73.00 | 78.80 | 76.40 | 87.00 | 93.30 | 83.40 |" in markdown
  meta = json.loads((tmp_path / "meta.json").read_text())
  assert meta["evaluation_examples"] == {common.SUPERSENSE: 40, common.PROBE: 40}
  assert meta["paper_column"] == "GLUE"
  for name in ("table.md", "plot.png", "curves.png"):
    assert (tmp_path / name).stat().st_size > 0


def test_collapse_is_marked_in_the_table():
  results = []
  rng = np.random.default_rng(0)
  for name in ("Subword Tokens", "Whole Words", common.NO_PRETRAINING):
    for seed in range(3):
      examples = {t: {"accuracy": rng.integers(0, 2, 30).tolist(),
                      "target_nll": rng.uniform(1, 3, 30).round(4).tolist()}
                  for t in (common.SUPERSENSE, common.PROBE)}
      metrics = {f"{t}/{m}": float(np.mean(examples[t][k]))
                 for t in examples for m, k in (("accuracy", "accuracy"),
                                                ("target_loss", "target_nll"))}
      results.append(dict(row=name, seed=seed, metrics=metrics, examples=examples,
                          degenerate=["collapse"] if name == "Whole Words" else []))
  markdown = report.markdown(results, ms.COMPARISON, setup="Fake.",
                             constants={common.SUPERSENSE: 0.1, common.PROBE: 0.1},
                             degenerate={"Whole Words": {"collapse"}}, resamples=200)
  assert "| Whole Words‡ |" in markdown and "| Subword Tokens |" in markdown
  assert "‡ collapsed" in markdown
  assert "track pre-training" not in markdown   # no record carries pre-training accuracy

  # Each seed's held-out pre-training accuracy ordered as its probe accuracy in one row and
  # reversed in the other: ρ +1 and −1 within them, the floor left out, 0 on average.
  for r in results:
    if r["row"] != common.NO_PRETRAINING:
      probe = r["metrics"][f"{common.PROBE}/accuracy"]
      r["pretrain"] = dict(eval_accuracy=probe if r["row"] == "Subword Tokens" else -probe)
  markdown = report.markdown(results, ms.COMPARISON, setup="Fake.",
                             constants={common.SUPERSENSE: 0.1, common.PROBE: 0.1},
                             degenerate={}, resamples=200)
  assert "## Does Probe acc track pre-training?" in markdown
  assert "the mean over 2 rows is ρ = +0.00" in markdown
  assert "Per row: Subword Tokens +1.00, Whole Words -1.00." in markdown


def test_constant_outputs_and_the_floor_against_them():
  task = common.supersense_task(dict(finetune_train=4000, finetune_eval=2000))
  constants = common.constant_scores(task)
  labels = np.asarray(task.validation.labels)
  majority = np.bincount(task.train.labels).argmax()
  assert constants[common.SUPERSENSE] == pytest.approx(np.mean(labels == majority))
  # The training frequencies beat the uniform distribution and lose to a perfect model.
  assert 0 < constants[f"{common.SUPERSENSE}/target_nll"] < np.log(len(task.label_names))
  table = {"Subword Tokens": {k: (0.0, 1.0) for k in [c.key for c in ms.COMPARISON.columns]},
           common.NO_PRETRAINING: {k: (-10.0, 1.0) for k in [c.key for c in
                                                             ms.COMPARISON.columns]}}
  valid, lines, *_ = report.floor_check(table, ms.COMPARISON, {
      common.SUPERSENSE: 0.05, f"{common.SUPERSENSE}/target_nll": 20.0})
  assert valid
  assert "the floor is above the constant output (-20.000)" in lines[2]   # log-lik
  assert "the floor is not above the constant output (5.0)" in lines[0]  # accuracy ×100
