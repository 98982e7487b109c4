"""experiments/compression.py: the students follow the teacher, the per-example scores, a
quantized row's size (1 byte per int8 entry) against the float row's, latency, and the report
(size table, Pareto plot) from records."""

import json
import os
import sys

import jax
import numpy as np
import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

from bertfam_jax import config_lib  # noqa: E402
from bertfam_jax import workdir as workdir_lib  # noqa: E402
from experiments import common, compression  # noqa: E402
from helpers import teachers  # noqa: E402

TINY = dict(compression.SCALES["cpu"], name="tiny", finetune_train=64, finetune_epochs=1,
            latency_reps=3, tasks={compression.SUPERSENSE: dict(seq_len=16, eval=32)})


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
  return teachers.train_bert_teacher(str(tmp_path_factory.mktemp("teacher")), 8)


def test_students_follow_the_teacher(teacher):
  scale = compression.SCALES["cpu"]
  distil = compression.student_config(compression.DISTILBERT, teacher, scale)
  tiny = compression.student_config(compression.TINYBERT, teacher, scale)
  for config in (distil, tiny):
    assert config.train.total_steps == scale["student_steps"]
    assert config.data.wordnet_glosses   # the teacher's data
    assert config.data.seq_len == 32 and config.model.vocab_size == 512
  assert (distil.model.layers, distil.model.hidden) == (1, 32)     # half the depth
  assert (tiny.model.layers, tiny.model.hidden, tiny.model.mlp) == (1, 16, 64)  # and width
  # The records' student drew BERT's truncated init; configs/tinybert.py now draws its code's.
  assert tiny.model.weight_init == "truncated_normal"
  paper = os.path.join(compression.REPO, "configs", "tinybert.py")
  assert config_lib.load_config(paper, "runlocal").model.weight_init == "normal"
  assert "model.weight_init=truncated_normal" in compression.setup_text("cpu", scale)
  assert compression.teacher_config(scale).train.total_steps == scale["teacher_steps"]


def test_task_scores():
  supersense = [dict(prediction=3, label=3, gold_nll=0.5), dict(prediction=1, label=2,
                                                                   gold_nll=2.5)]
  metrics, examples = compression.task_scores(compression.SUPERSENSE, supersense)
  assert examples == {"accuracy": [1.0, 0.0], "target_nll": [0.5, 2.5]}
  assert metrics["wordnet_supersense/accuracy"] == 0.5
  assert metrics["wordnet_supersense/target_loss"] == 1.5
  tagging = [dict(prediction=[0, 5, 6, 0], label=[0, 5, 7, 0]),   # 1 of 2 tagged words right
             dict(prediction=[3, 0], label=[0, 0]),                # no tagged word: not scored
             dict(prediction=[9, 0], label=[9, 0])]
  metrics, examples = compression.task_scores(compression.TAGGING, tagging)
  assert examples == {"accuracy": [0.5, 1.0]}
  assert metrics["wordnet_tagging/accuracy"] == 0.75 and metrics["wordnet_tagging/distinct"] == 5
  # Every word O (the constant output), on sentences of different lengths: one label, degenerate.
  all_o = [dict(prediction=[0] * len(p["label"]), label=p["label"]) for p in tagging]
  metrics, _ = compression.task_scores(compression.TAGGING, all_o)
  assert metrics["wordnet_tagging/distinct"] == 1 <= common.DEGENERATE


def test_a_quantized_row_takes_a_byte_per_matrix_entry(teacher, tmp_path):
  dirs = {compression.TEACHER: teacher}
  sizes = {}
  for name, spec in (("float", dict(init=compression.TEACHER)),
                     ("ptq", dict(init=compression.TEACHER, quantize="ptq"))):
    workdir = compression.finetune(compression.SUPERSENSE, spec, 0, TINY, dirs,
                                   str(tmp_path / name))
    sizes[name] = compression.footprint(workdir)
    assert 0 < compression.latency_ms(workdir, 2, 16, 3) < 10_000
  params = workdir_lib.restore_params(workdir)
  leaves = jax.tree_util.tree_leaves_with_path(params)
  total = sum(np.size(x) for _, x in leaves)
  matrices = sum(np.size(x) for path, x in leaves
                 if str(getattr(path[-1], "key", "")) in ("kernel", "embedding"))
  assert sizes["float"] == dict(params=total, nonzero_params=sizes["float"]["nonzero_params"],
                                bytes=4 * total)
  assert sizes["ptq"]["params"] == total
  assert sizes["ptq"]["bytes"] == 4 * total - 3 * matrices
  with open(os.path.join(workdir, "predictions.jsonl")) as f:
    assert len(f.readlines()) == 32


def _fake_results():
  rng = np.random.default_rng(0)
  results = []
  for seed in range(3):
    for i, (name, _) in enumerate(compression.ROWS):
      # 50 examples: the teacher and most rows far above the floor, the last compressed row on it.
      right = {len(compression.ROWS) - 2: 11, len(compression.ROWS) - 1: 10}.get(i, 30 - i) + seed
      correct = [1.0] * right + [0.0] * (50 - right)
      nll = rng.uniform(1, 3, 50).round(3).tolist()
      tagged = rng.random(40).tolist()
      results.append(dict(
          row=name, seed=seed,
          metrics={"wordnet_supersense/accuracy": float(np.mean(correct)),
                   "wordnet_supersense/target_loss": float(np.mean(nll)),
                   "wordnet_tagging/accuracy": float(np.mean(tagged))},
          examples={"wordnet_supersense": {"accuracy": correct, "target_nll": nll},
                    "wordnet_tagging": {"accuracy": tagged}},
          size=dict(params=1000 - 50 * i, nonzero_params=900, bytes=4000 - 300 * i),
          latency=dict(latency_ms_batch1=1.0 + i, latency_ms_batch32=10.0 + i)))
  return results


def test_report_has_the_size_table_and_the_pareto_plot(tmp_path, monkeypatch):
  monkeypatch.setitem(compression.SCALES, "tiny", dict(TINY, tasks={
      compression.SUPERSENSE: dict(seq_len=16, eval=50),
      compression.TAGGING: dict(seq_len=16, eval=40)}))
  text = compression.write_summary(_fake_results(), str(tmp_path), "tiny")
  size_lines = text.split("## Size and CPU latency")[1].splitlines()
  teacher_line = next(l for l in size_lines if l.startswith(f"| {compression.BASELINE} |"))
  assert teacher_line.split(" | ")[1:] == ["1,000", "900", "0.00", "1.00", "1.00", "1.00",
                                           "10.00", "1.00 |"]
  second = compression.ROWS[1][0]
  line = next(l for l in size_lines if l.startswith(f"| {second} |"))
  assert line.split(" | ")[4:7] == [f"{4000 / 3700:.2f}", "2.00", "0.50"]
  assert "Rank agreement" not in text and "## Differences against BERT (teacher)" in text
  # The scale is valid when the teacher clears the floor, whatever the compressed rows do.
  assert f"**Valid:** {compression.BASELINE} (the rows" in text
  assert "not separated from the floor: " in text
  assert os.path.getsize(tmp_path / "plot.png") > 0 and os.path.getsize(tmp_path / "scores.png")
  meta = json.loads((tmp_path / "meta.json").read_text())
  assert meta["evaluation_examples"] == {"wordnet_supersense": 50, "wordnet_tagging": 40}
