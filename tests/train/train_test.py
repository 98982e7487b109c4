"""The train loop on the embedded corpus: resume, resharding, refusals, NaN handling."""

import json
import os
import re
import shutil

import jax
import numpy as np
import pytest

from bertfam_jax import config_lib as cl
from bertfam_jax import workdir as workdir_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.train import checkpoint, loop, train
from helpers.run_records import copy_until, damage_array_files, train_records
from helpers import tiny


def tiny_config(**train_overrides):
  """A model that compiles in a few seconds; real text, a 512-piece tokenizer, 32-token rows."""
  c = cl.base_config()
  c.data.update(source="embedded_wiki", seq_len=32, docs_per_chunk=16)
  c.model = tiny.encoder(heads=2)
  c.objective.max_predictions = 5
  c.optimizer.update(peak_lr=5e-3, warmup_steps=2)
  c.train.update(batch_size=8, total_steps=8, log_every=1, eval_every=4, eval_batches=2,
                 checkpoint_every=4, keep_checkpoints=5)
  c.train.update(train_overrides)
  return c


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("uninterrupted"))
  train.run(tiny_config(), workdir)
  return workdir


def test_writes_metrics_checkpoints_and_config(uninterrupted):
  metrics = train_records(uninterrupted)
  assert sorted(metrics) == list(range(1, 9))
  for key in ("loss", "mlm_accuracy", "learning_rate", "tokens_per_sec", "nsp_accuracy"):
    assert key in metrics[8], key
  assert sorted(os.listdir(os.path.join(uninterrupted, "checkpoints"))) == ["4", "8"]
  with open(os.path.join(uninterrupted, "config.json")) as f:
    assert json.load(f)["model"]["hidden"] == 32
  assert any(f.startswith("events.out.tfevents") for f in
             os.listdir(os.path.join(uninterrupted, "tensorboard")))


@pytest.mark.parametrize("mesh", [dict(data=8), dict(data=2, fsdp=2, tensor=2)])
def test_resume_from_checkpoint_reproduces_the_run(uninterrupted, tmp_path, mesh):
  """Steps 5..8 after restoring step 4 equal the uninterrupted run's: exactly on the same mesh,
  to float tolerance when the checkpoint is restored onto another mesh (reduction order)."""
  workdir = str(tmp_path / "resumed")
  copy_until(uninterrupted, workdir, 4)
  config = tiny_config()
  config.mesh.update({**dict(data=-1, fsdp=1, tensor=1), **mesh})
  train.run(config, workdir)
  resumed, reference = train_records(workdir), train_records(uninterrupted)
  assert sorted(resumed) == list(range(1, 9))  # lines after step 4 were replaced, not duplicated
  losses = [resumed[s]["loss"] for s in range(5, 9)]
  expected = [reference[s]["loss"] for s in range(5, 9)]
  if mesh == dict(data=8):
    assert losses == expected
  else:
    np.testing.assert_allclose(losses, expected, rtol=2e-5)


def test_checkpoint_restores_onto_a_smaller_mesh(uninterrupted):
  """A checkpoint written on 8 devices restores bit-exactly onto 4 devices with other shardings."""
  config = tiny_config()
  config.mesh.update(data=2, fsdp=1, tensor=2)
  from bertfam_jax.objectives import mlm  # pylint: disable=g-import-not-at-top
  from bertfam_jax.train import optimizer, sharding, step  # pylint: disable=g-import-not-at-top
  results = []
  for devices in (jax.devices(), jax.devices()[:4]):
    mesh_config = dict(data=-1, fsdp=1, tensor=1) if len(devices) == 8 else config.mesh
    mesh = sharding.make_mesh(mesh_config, devices)
    model, (tx, _) = mlm.build_model(config), optimizer.make_optimizer(config)
    abstract, _ = step.with_mesh_context(step.abstract_state, mesh)(model, tx, mesh,
                                                                    mlm.init_inputs(config))
    ckpt = checkpoint.Checkpointer(os.path.join(uninterrupted, "checkpoints"), keep=5)
    state, data_state = ckpt.restore(4, abstract)
    ckpt.close()
    kernel = state.params["params"]["encoder"]["layer_0"]["mlp"]["intermediate"]["kernel"]
    assert len(kernel.sharding.device_set) == len(devices)
    results.append((jax.device_get(state.params), data_state))
  jax.tree.map(np.testing.assert_array_equal, results[0][0], results[1][0])
  assert results[0][1] == results[1][1]


def test_refuses_a_workdir_of_another_model(uninterrupted, tmp_path):
  workdir = str(tmp_path / "other")
  shutil.copytree(uninterrupted, workdir)
  before = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
  config = tiny_config()
  config.model.hidden = 64
  with pytest.raises(ConfigError, match=r"model.hidden: 32 → 64.*new --workdir"):
    train.run(config, workdir)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == before


def test_a_workdir_from_before_a_new_field_resumes_while_it_holds_its_default(tmp_path):
  """config.json written before ALBERT's fields existed: resuming with them at their defaults
  (BERT's behaviour) is accepted; setting one is a different model."""
  config = tiny_config()
  saved = json.loads(config.to_json())
  for key in ("embedding_size", "share_layers", "hidden_groups"):
    del saved["model"][key]
  del saved["objective"]["mask_scheme"]
  (tmp_path / "config.json").write_text(json.dumps(saved))
  workdir_lib.check_or_write_config(str(tmp_path), config)
  config.model.share_layers = "all"
  with pytest.raises(ConfigError, match=r"model.share_layers: absent \('none': the run predates "
                     r"the field\) → 'all'.*new --workdir, or pass the original settings to "
                     r"resume it \(--config.model.share_layers=none\)"):
    workdir_lib.check_or_write_config(str(tmp_path), config)


@pytest.mark.parametrize("family, key, now, then", [
    ("mass", "objective.decoder_sees_masked", False, True),     # before 8d56e2e
    ("distilbert", "objective.freeze_positions", True, False),   # before 56b4376
    ("gpt", "model.embedding_dropout", "table", "output"),       # before GPT's table dropout
    ("t5", "model.relpos_bias_init", "glorot_uniform", "normal"),  # before fd6e7b2
    ("t5", "model.prefix_lm_buckets", "bidirectional", "causal"),  # before fd6e7b2
    ("albert", "tokenizer.normalize", "albert", ""),             # before d917a0d
    ("roberta", "model.weight_init", "normal", "truncated_normal"),  # before e834a29
    ("spanbert", "model.weight_init", "normal", "truncated_normal"),  # before e834a29
])
def test_a_field_whose_absence_meant_another_value_names_the_flag_that_resumes(
    tmp_path, family, key, now, then):
  """A MASS, DistilBERT, GPT, T5 or ALBERT run saved before its field existed behaved as the
  field's other value, which base_config (an MLM's) or the family's defaults do not hold: the
  refusal names the flag that restores that behaviour (an empty value as ''), and the flag
  resumes; read back, the run's config holds that value."""
  config = cl.load_config(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))), "configs", f"{family}.py"), "runlocal")
  section, field = key.split(".")
  assert config[section][field] == now
  saved = json.loads(config.to_json())
  del saved[section][field]
  (tmp_path / "config.json").write_text(json.dumps(saved))
  flag = str(then) or "''"
  with pytest.raises(ConfigError, match=re.escape(
      f"{key}: absent ({then!r}: the run predates the field) → {now!r}") + ".*" + re.escape(
          f"--config.{key}={flag}")):
    workdir_lib.check_or_write_config(str(tmp_path), config)
  if section == "model":   # filled in, or left absent for the model code's own default
    assert workdir_lib.read_config(str(tmp_path))[section].get(field, then) == then
  config[section][field] = then
  workdir_lib.check_or_write_config(str(tmp_path), config)


@pytest.mark.parametrize("family", ["distilbert", "tinybert"])
def test_a_distillation_from_before_a_new_model_field_resumes(tmp_path, family):
  """A student's config.json holds its teacher's `model` section under objective.teacher_model;
  one written before a model field existed (ELECTRA's `bare_dense_init`, `classifier_pooler`;
  `weight_init`) resumes while the teacher holds what the field's absence meant, and is refused,
  naming the field, when it does not."""
  config = cl.load_config(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))), "configs", f"{family}.py"), "runlocal")
  saved = json.loads(config.to_json())
  for field in ("bare_dense_init", "classifier_pooler", "weight_init"):
    del saved["objective"]["teacher_model"][field]
  (tmp_path / "config.json").write_text(json.dumps(saved))
  workdir_lib.check_or_write_config(str(tmp_path), config)
  config.objective.teacher_model.bare_dense_init = "glorot_uniform"
  with pytest.raises(ConfigError, match=re.escape(
      "objective.teacher_model.bare_dense_init: absent ('truncated_normal': the run predates "
      "the field) → 'glorot_uniform'")):
    workdir_lib.check_or_write_config(str(tmp_path), config)


def test_a_field_the_codebase_dropped_is_refused_without_a_flag(tmp_path):
  """A saved field the current config lacks cannot be set by a flag: the refusal offers none."""
  config = tiny_config()
  saved = json.loads(config.to_json())
  saved["model"]["retired_field"] = True
  (tmp_path / "config.json").write_text(json.dumps(saved))
  with pytest.raises(ConfigError, match=r"model.retired_field: True → None") as refusal:
    workdir_lib.check_or_write_config(str(tmp_path), config)
  assert "--config." not in str(refusal.value)


def test_non_finite_loss_stops_without_checkpointing_it_nor_blocking_the_fix(tmp_path):
  """A run that fails before its first checkpoint (here: diverging at step 1) leaves its files
  provisional: the corrected re-run, even of another model, starts afresh in the same workdir."""
  config = tiny_config(checkpoint_every=2)
  config.optimizer.peak_lr = 1e39  # finite, as the config's range asks, but inf in float32
  workdir = str(tmp_path / "nan")
  # The first update already uses lr = inf·0 = NaN, so the parameters after step 1 are NaN.
  with pytest.raises(loop.NonFiniteLossError, match="between steps 1 and 1; no checkpoint"):
    train.run(config, workdir)
  assert checkpoint.Checkpointer(os.path.join(workdir, "checkpoints"), keep=1).latest_step() is None
  assert os.path.exists(os.path.join(workdir, "config.json"))
  fixed = tiny_config(total_steps=2, checkpoint_every=2, eval_every=100)
  fixed.model.hidden = 64
  train.run(fixed, workdir)
  assert sorted(train_records(workdir)) == [1, 2]   # the failed start's step 1 was dropped
  assert workdir_lib.read_config(workdir).model.hidden == 64


@pytest.mark.parametrize("overrides, message", [
    (dict(train=dict(batch_size=6)), "not divisible by the data-parallel size 8"),
    (dict(mesh=dict(data=3)), "has 3 devices but 8 are present"),
    (dict(data=dict(seq_len=64)), "exceeds model.max_positions=32"),
    (dict(data=dict(source="text", text_files="/nonexistent/*.txt")), "/nonexistent"),
])
def test_bad_configs_name_the_fix(tmp_path, overrides, message):
  config = tiny_config()
  for section, values in overrides.items():
    config[section].update(values)
  with pytest.raises(ConfigError, match=message):
    train.run(config, str(tmp_path / "bad"))


def test_corpus_too_small_for_the_batch(tmp_path):
  corpus = tmp_path / "tiny.txt"
  # 150 sentences are enough to train a tokenizer but pack into fewer rows than one batch.
  corpus.write_text("".join(f"Sentence number {i} is short.\n" for i in range(150)))
  config = tiny_config()
  config.data.update(source="text", text_files=str(corpus), eval_fraction=0.0)
  config.model.vocab_size = 100
  config.train.batch_size = 512
  with pytest.raises(ConfigError, match="examples"):
    train.run(config, str(tmp_path / "small"))
  assert not os.path.exists(tmp_path / "small")   # refused during set-up: nothing written


@pytest.mark.parametrize("content, message", [
    (b"", "holds no text"),
    (b"\n\n  \n", "holds no text"),
    (b"GIF89a\x01\x00\xff\xfe binary", r"not UTF-8 text \(byte 8"),
])
def test_corpus_files_that_hold_no_text(tmp_path, content, message):
  corpus = tmp_path / "corpus.txt"
  corpus.write_bytes(content)
  config = tiny_config()
  config.data.update(source="text", text_files=str(corpus))
  with pytest.raises(ConfigError, match=message) as raised:
    train.run(config, str(tmp_path / "run"))
  assert str(corpus) in str(raised.value) or "holds no text" in str(raised.value)
  assert not os.path.exists(tmp_path / "run")


def test_unwritable_workdir(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("x")
  with pytest.raises(ConfigError, match="cannot be written"):
    train.run(tiny_config(), str(blocker / "workdir"))
  with pytest.raises(ConfigError, match="is a file, not a directory"):
    train.run(tiny_config(), str(blocker))
  assert blocker.read_text() == "x"


def test_a_workdir_holds_its_tokenizer_and_data(uninterrupted, tmp_path):
  """Copied to a machine whose cache is empty, a workdir resumes on its own tokenizer (none is
  trained) to the uninterrupted run's losses, and reads back without the original cache."""
  data = json.loads(open(os.path.join(uninterrupted, workdir_lib.DATA_FILE)).read())
  assert data["source"] == "embedded_wiki" and len(data["documents"]) == 64
  workdir, cache = str(tmp_path / "copied"), tmp_path / "empty_cache"
  copy_until(uninterrupted, workdir, 4)
  config = tiny_config()
  config.data.cache_dir = str(cache)
  train.run(config, workdir)
  assert not os.path.exists(cache / "tokenizers")   # the corpus is re-extracted, the vocabulary not
  resumed, reference = train_records(workdir), train_records(uninterrupted)
  assert [resumed[s]["loss"] for s in range(5, 9)] == [reference[s]["loss"] for s in range(5, 9)]
  _, tokenizer, params = workdir_lib.load(workdir)
  with open(os.path.join(uninterrupted, "tokenizer.model"), "rb") as f:
    assert tokenizer.model_proto == f.read()
  assert "encoder" in params
  from bertfam_jax import hf  # pylint: disable=g-import-not-at-top  (the [hf] extra)
  exported = tmp_path / "exported"
  hf.export_workdir(workdir, str(exported))
  assert {"model.safetensors", "config.json"} <= set(os.listdir(exported))
  from bertfam_jax.data import hf_tokenizer  # pylint: disable=g-import-not-at-top
  assert hf_tokenizer.has_tokenizer(str(exported))   # the workdir's own; the cache is empty


def _embedded_corpus_as_text(path, config):
  from bertfam_jax.data import sources  # pylint: disable=g-import-not-at-top
  documents = sources.get_documents(config.data, "train")
  path.write_text("\n\n".join(documents[:40]))


def test_resuming_on_other_data_is_refused_unless_allowed(uninterrupted, tmp_path, caplog):
  """The finding of the hardening review: re-run with another data.source, a finished workdir
  trained a new tokenizer and resumed with other ids. Now the change is named and refused, and
  with data.allow_change it resumes on the workdir's own tokenizer, logged."""
  workdir = str(tmp_path / "resumed")
  copy_until(uninterrupted, workdir, 4)
  corpus = tmp_path / "other.txt"
  _embedded_corpus_as_text(corpus, tiny_config())
  config = tiny_config()
  config.data.update(source="text", text_files=str(corpus))
  tokenizer_before = open(os.path.join(workdir, "tokenizer.model"), "rb").read()
  with pytest.raises(ConfigError, match=r"data.source: 'embedded_wiki' → 'text'.*allow_change"):
    train.run(config, workdir)
  assert sorted(train_records(workdir)) == list(range(1, 9))   # untouched
  config.data.allow_change = True
  train.run(config, workdir)
  assert "data.allow_change=True: resuming" in caplog.text
  assert open(os.path.join(workdir, "tokenizer.model"), "rb").read() == tokenizer_before
  recorded = json.loads(open(os.path.join(workdir, workdir_lib.DATA_FILE)).read())
  assert recorded["source"] == "text" and recorded["paths"] == [str(corpus)]
  corpus.write_text(corpus.read_text() + "\n\nOne more document, which changes the hash.")
  config.data.allow_change = False
  config.train.total_steps = 9
  with pytest.raises(ConfigError, match=r"data files \[other.txt sha256 \w{12}\] → "):
    train.run(config, workdir)


def test_init_from_starts_a_new_run_from_trained_parameters(uninterrupted, tmp_path):
  """BERT's 128→512 recipe: a second phase starts at step 0 with the first phase's parameters."""
  config = tiny_config(total_steps=2, checkpoint_every=2, eval_every=100)
  config.train.init_from = os.path.join(uninterrupted, "checkpoints")
  workdir = str(tmp_path / "phase2")
  train.run(config, workdir)
  phase2, phase1 = train_records(workdir), train_records(uninterrupted)
  assert sorted(phase2) == [1, 2]
  assert phase2[1]["loss"] < phase1[1]["loss"] - 0.3  # trained, not random, parameters


def test_two_phases_of_one_schedule(uninterrupted, tmp_path):
  """BERT's 90% / 10% recipe as two runs: phase 1 stops at train.stop_step with the uninterrupted
  run's steps; phase 2 (init_state='all') continues its step, Adam moments and learning-rate
  schedule to total_steps."""
  phase1 = str(tmp_path / "phase1")
  train.run(tiny_config(stop_step=4), phase1)
  first, reference = train_records(phase1), train_records(uninterrupted)
  assert sorted(first) == [1, 2, 3, 4]
  for step in first:
    assert first[step]["loss"] == reference[step]["loss"]
  phase2 = str(tmp_path / "phase2")
  config = tiny_config(init_state="all", init_from=os.path.join(phase1, "checkpoints"))
  train.run(config, phase2)
  second = train_records(phase2)
  assert sorted(second) == [5, 6, 7, 8]
  for step in second:
    assert second[step]["learning_rate"] == pytest.approx(reference[step]["learning_rate"])
  assert second[5]["loss"] < reference[1]["loss"] - 0.3  # a trained model's, not a fresh one's
  with pytest.raises(ConfigError, match="init_from"):
    train.run(tiny_config(init_state="all"), str(tmp_path / "nothing_to_continue"))
  with pytest.raises(ConfigError, match="stop_step=9"):
    train.run(tiny_config(stop_step=9), str(tmp_path / "past_the_end"))


def test_init_from_without_a_checkpoint(tmp_path):
  config = tiny_config(total_steps=2)
  config.train.init_from = str(tmp_path / "empty")
  with pytest.raises(ConfigError, match="holds no checkpoint"):
    train.run(config, str(tmp_path / "run"))
  assert not os.path.exists(config.train.init_from)  # nothing created in another run's place


def test_a_checkpoint_from_before_the_carry_restores(uninterrupted, tmp_path):
  """Checkpoints hold {step, params, opt_state} (+ carry only for objectives that keep one, e.g.
  XLNet's memory), so one written before `TrainState.carry` existed (that tree, saved by orbax as
  the loop did then) still restores, into a TrainState without carry, or with its carry at zeros
  where the state has one."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from bertfam_jax.objectives import mlm  # pylint: disable=g-import-not-at-top
  from bertfam_jax.train import optimizer, sharding, step  # pylint: disable=g-import-not-at-top
  config = tiny_config()
  mesh = sharding.make_mesh(config.mesh)
  model, (tx, _) = mlm.build_model(config), optimizer.make_optimizer(config)
  abstract, _ = step.with_mesh_context(step.abstract_state, mesh)(model, tx, mesh,
                                                                  mlm.init_inputs(config))
  ckpt = checkpoint.Checkpointer(os.path.join(uninterrupted, "checkpoints"), keep=5)
  state, _ = ckpt.restore(4, abstract)
  ckpt.close()
  old_format = dict(step=state.step, params=state.params, opt_state=state.opt_state)
  manager = ocp.CheckpointManager(str(tmp_path / "old"))
  manager.save(4, args=ocp.args.Composite(state=ocp.args.StandardSave(old_format),
                                          data=ocp.args.JsonSave({"keys": [], "processes": [[]]})))
  manager.wait_until_finished()
  manager.close()
  ckpt = checkpoint.Checkpointer(str(tmp_path / "old"), keep=5)
  restored, _ = ckpt.restore(4, abstract)
  ckpt.close()
  assert isinstance(restored, step.TrainState) and restored.carry is None
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored.params),
               jax.device_get(state.params))
  # Into a state that keeps a carry (an imported XLNet's first start): the carry starts at zeros,
  # sharded as the state asks.
  memory = jax.ShapeDtypeStruct((8, 6, 32), np.float32, sharding=sharding.batch_sharding(mesh))
  ckpt = checkpoint.Checkpointer(str(tmp_path / "old"), keep=5)
  restored, _ = ckpt.restore(4, abstract.replace(carry=(memory, memory)))
  ckpt.close()
  assert [(m.shape, m.sharding) for m in restored.carry] == [(memory.shape, memory.sharding)] * 2
  assert not any(np.any(np.asarray(m)) for m in restored.carry)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored.params),
               jax.device_get(state.params))


def test_rerunning_a_finished_run_says_so_and_writes_nothing(uninterrupted, tmp_path, capsys):
  workdir = str(tmp_path / "finished")
  shutil.copytree(uninterrupted, workdir)
  files = lambda: sorted(os.path.relpath(os.path.join(root, name), workdir)  # noqa: E731
                         for root, _, names in os.walk(workdir) for name in names)
  before, metrics_before = files(), train_records(workdir)
  capsys.readouterr()
  assert train.run(tiny_config(), workdir) == {}
  assert "Already finished at step 8 (train.total_steps=8)." in capsys.readouterr().out
  assert files() == before and train_records(workdir) == metrics_before   # no new events file


def test_start_up_phases_and_the_summary_are_printed(tmp_path, capsys):
  """Before the first step a person sees what the start-up is doing (the corpus, the tokenizer
  being trained, the compilation), and the run ends with one summary line."""
  config = tiny_config(total_steps=2, checkpoint_every=2, eval_every=2)
  config.data.cache_dir = str(tmp_path / "empty_cache")   # the tokenizer must be trained
  workdir = str(tmp_path / "run")
  train.run(config, workdir)
  out = capsys.readouterr().out.splitlines()
  phases = ["Reading the corpus (data.source=embedded_wiki)...",
            "Training a 512-piece SentencePiece tokenizer on the corpus (cached for later runs)...",
            "Compiling the train step (the first step)...", "step 1/2 "]
  positions = [next(i for i, line in enumerate(out) if line.startswith(p)) for p in phases]
  assert positions == sorted(positions)
  summary = out[-1]
  assert summary.startswith("Finished at step 2/2 in ") and "k tok/s while training" in summary
  assert "best eval loss" in summary and summary.endswith(f"; workdir {workdir}.")


def test_a_workdir_from_before_it_held_its_tokenizer_keeps_its_tokenizer_path(uninterrupted,
                                                                             tmp_path):
  """An older workdir (no tokenizer.model, no data.json) has only its config's tokenizer path to
  go by: another tokenizer.model_path is refused, as before workdirs held their tokenizer,
  rather than resumed and adopted."""
  from bertfam_jax.data import sources, tokenizers  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / "older")
  copy_until(uninterrupted, workdir, 4)
  for name in ("tokenizer.model", workdir_lib.DATA_FILE):
    os.remove(os.path.join(workdir, name))
  config = tiny_config()
  sentences = tokenizers.training_sentences(sources.get_documents(config.data, "train"), 5000)
  other = tmp_path / "other.model"
  other.write_bytes(tokenizers.train_sentencepiece(sentences, 512, "bpe"))
  config.tokenizer.model_path = str(other)
  with pytest.raises(ConfigError, match=r"tokenizer.model_path: '' → "):
    train.run(config, workdir)
  assert not os.path.exists(os.path.join(workdir, "tokenizer.model"))


def test_a_damaged_record_is_one_line(uninterrupted, tmp_path):
  workdir = str(tmp_path / "damaged")
  copy_until(uninterrupted, workdir, 4)
  with open(os.path.join(workdir, workdir_lib.DATA_FILE), "w") as f:
    f.write('{"source": "embedded')
  with pytest.raises(ConfigError, match=r"data.json is damaged"):
    train.run(tiny_config(), workdir)


@pytest.mark.parametrize("arg, seq_len, max_predictions, stop_step, init_state", [
    ("", 128, 20, 900_000, "params"),
    ("phase=2", 512, 80, 0, "all"),
    ("runlocal", 128, 20, 0, "params"),
    ("runlocal,phase=1", 128, 20, 1_800, "params"),
])
def test_bert_phases_are_configuration(arg, seq_len, max_predictions, stop_step, init_state):
  config = cl.load_config(os.path.join(os.path.dirname(__file__), "..", "..", "configs",
                                       "bert.py"), arg)
  assert (config.data.seq_len, config.objective.max_predictions, config.train.stop_step,
          config.train.init_state) == (seq_len, max_predictions, stop_step, init_state)
  assert config.train.total_steps == (2_000 if "runlocal" in arg else 1_000_000)


def test_a_profiler_trace_inside_a_real_run(tmp_path):
  """train.profile_steps=1:3 leaves a jax.profiler trace in WORKDIR/profile; with
  train.metric_writers empty only metrics.jsonl is written."""
  workdir = str(tmp_path / "profiled")
  train.run(tiny_config(total_steps=3, checkpoint_every=3, eval_every=3, profile_steps="1:3",
                        metric_writers=""), workdir)
  traces = [name for _, _, names in os.walk(os.path.join(workdir, "profile")) for name in names
            if name.endswith(".xplane.pb")]
  assert len(traces) == 1
  assert sorted(train_records(workdir)) == [1, 2, 3]
  assert not os.path.exists(os.path.join(workdir, "tensorboard"))


def test_two_data_workers_train_exactly_as_none(uninterrupted, tmp_path):
  """data.workers=2 (chunks packed and noised in worker processes) logs the losses of the
  in-process pipeline, step for step."""
  workdir = str(tmp_path / "workers")
  config = tiny_config()
  config.data.workers = 2
  train.run(config, workdir)
  reference, got = train_records(uninterrupted), train_records(workdir)
  assert [got[s]["loss"] for s in range(1, 9)] == [reference[s]["loss"] for s in range(1, 9)]


def test_the_writes_left_after_a_full_disk_stay_quiet(tmp_path, monkeypatch):
  """A checkpoint write that finds no room is raised once, as the one line naming the
  checkpoint; TensorStore completes the other writes after that, up to the process's exit, each
  reporting "Event loop is closed" as unraisable with a traceback (a CI run under load printed
  them above main's one line): those stay dropped, anything else still reaches the hook. A save
  that succeeds leaves the hook as it found it."""
  import errno  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top
  reported = []
  monkeypatch.setattr(sys, "unraisablehook", reported.append)
  ckpt = checkpoint.Checkpointer(str(tmp_path / "checkpoints"), keep=1)
  with ckpt._no_space_named():   # pylint: disable=protected-access
    pass
  assert sys.unraisablehook == reported.append
  ckpt._pending = (4, 3 * 2**20)   # pylint: disable=protected-access  (what save records)
  with pytest.raises(ConfigError, match=r"No room to write checkpoint 4 \(3.0 MiB\)"):
    with ckpt._no_space_named():   # pylint: disable=protected-access
      raise OSError(errno.ENOSPC, "No space left on device")
  for error in (RuntimeError("Event loop is closed"), ValueError("ours")):
    sys.unraisablehook(types.SimpleNamespace(exc_type=type(error), exc_value=error,
                                             exc_traceback=None, err_msg=None, object=None))
  assert [str(u.exc_value) for u in reported] == ["ours"]
  ckpt.close()


def test_a_corrupt_checkpoint_is_reported_once(uninterrupted, tmp_path, monkeypatch):
  """The restore of a checkpoint whose array files are damaged raises one ConfigError naming it;
  orbax's other reads, abandoned pending and failing the same way, are reported nowhere else
  (Python would print each as an unraisable exception with a traceback when it is collected,
  which broke main's one-line error at random)."""
  import gc  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  from bertfam_jax.objectives import mlm  # pylint: disable=g-import-not-at-top
  from bertfam_jax.train import optimizer, sharding, step  # pylint: disable=g-import-not-at-top
  directory = str(tmp_path / "checkpoints")
  shutil.copytree(os.path.join(uninterrupted, "checkpoints"), directory)
  assert damage_array_files(os.path.join(directory, "4"))
  reported = []
  monkeypatch.setattr(sys, "unraisablehook", reported.append)
  config = tiny_config()
  mesh = sharding.make_mesh(config.mesh)
  model, (tx, _) = mlm.build_model(config), optimizer.make_optimizer(config)
  abstract, _ = step.with_mesh_context(step.abstract_state, mesh)(model, tx, mesh,
                                                                  mlm.init_inputs(config))
  ckpt = checkpoint.Checkpointer(directory, keep=5, read_only=True)
  with pytest.raises(ConfigError, match=f"Checkpoint {directory}/4 cannot be restored"):
    ckpt.restore(4, abstract)
  ckpt.close()
  with pytest.raises(ConfigError, match=f"Checkpoint {directory}/4 cannot be read"):
    checkpoint.read_params(directory, 4)
  time.sleep(1)  # the abandoned reads finish failing
  gc.collect()
  assert not reported, [(u.exc_value, u.object) for u in reported]
  # Only orbax's abandoned reads are dropped: any other unraisable still reaches the hook.
  import types  # pylint: disable=g-import-not-at-top
  sys.unraisablehook(types.SimpleNamespace(exc_type=ValueError, exc_value=ValueError("ours"),
                                           exc_traceback=None, err_msg=None, object=None))
  assert [str(u.exc_value) for u in reported] == ["ours"]
  # An abandoned read that is an asyncio Task is logged by the event loop's exception handler
  # instead (one CI run printed it under the one-line error): asyncio's logger drops orbax's, and
  # only orbax's.
  import logging  # pylint: disable=g-import-not-at-top
  logged = []
  handler = logging.Handler()
  handler.emit = lambda record: logged.append(record.getMessage())
  asyncio_logger = logging.getLogger("asyncio")
  asyncio_logger.addHandler(handler)
  try:
    orbax_task = (f"Task exception was never retrieved\nfuture: <Task finished coro=<"
                  f"async_deserialize() done, defined at {os.sep}venv{os.sep}orbax{os.sep}"
                  f"checkpoint{os.sep}serialization.py:394>>")
    asyncio_logger.error(orbax_task)
    # The gather of several such reads (CI runs at e27f260 and 5cb6811 printed one under the
    # error): its message names no file; the exception it logs was raised inside orbax.
    orbax_file = os.path.join(os.sep, "venv", "orbax", "checkpoint", "serialization.py")
    try:
      exec(compile("raise ValueError('OUT_OF_RANGE')", orbax_file, "exec"))  # pylint: disable=exec-used
    except ValueError as read_error:
      try:
        raise Exception("Encountered error while reading array index") from read_error  # pylint: disable=broad-exception-raised
      except Exception as gathered:  # pylint: disable=broad-except
        asyncio_logger.error(
            "_GatheringFuture exception was never retrieved\nfuture: <_GatheringFuture finished "
            "exception=Exception('Encountered error while reading array index')>",
            exc_info=(type(gathered), gathered, gathered.__traceback__))
    asyncio_logger.error("Task exception was never retrieved\nfuture: <Task ours.py:1>")
    try:
      raise ValueError("ours")
    except ValueError as ours:
      asyncio_logger.error("_GatheringFuture exception was never retrieved\nfuture: <ours.py:2>",
                           exc_info=(type(ours), ours, ours.__traceback__))
  finally:
    asyncio_logger.removeHandler(handler)
  assert logged == ["Task exception was never retrieved\nfuture: <Task ours.py:1>",
                    "_GatheringFuture exception was never retrieved\nfuture: <ours.py:2>"]
