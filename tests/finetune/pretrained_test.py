"""A real tiny pre-training run read back (`bertfam_jax.workdir`: config, tokenizer, parameters
only) and fine-tuned in memory (`finetune.run.fine_tune`, the experiments' path through the one
train loop): what it reads, what it learns, its determinism, its one compilation per shape."""

import json
import os
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bertfam_jax import config_lib as cl
from bertfam_jax import workdir as workdir_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.data import tokenizers
from bertfam_jax.finetune import recipe, tasks
from bertfam_jax.finetune import run as finetune_run
from bertfam_jax.train import train
from helpers import tiny

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda omicron".split()


def pretraining_config(corpus: str, cache_dir: str):
  """Two BERT (MLM + NSP) steps of a one-layer, 32-wide encoder on a small local corpus."""
  c = cl.base_config()
  c.data.update(source="text", text_files=corpus, seq_len=32, docs_per_chunk=16,
                cache_dir=cache_dir)
  c.model = tiny.encoder(layers=1, heads=2, vocab_size=108)
  c.objective.max_predictions = 5
  c.optimizer.update(peak_lr=5e-3, warmup_steps=1)
  c.train.update(batch_size=8, total_steps=2, log_every=2, eval_batches=0, checkpoint_every=2,
                 keep_checkpoints=1)
  return c


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  """(workdir, the config it was trained with)."""
  root = tmp_path_factory.mktemp("pretrained")
  rng = np.random.default_rng(0)
  documents = ["\n".join(" ".join(rng.choice(WORDS, 8)) + "." for _ in range(10))
               for _ in range(100)]
  (root / "corpus.txt").write_text("\n\n".join(documents))
  config = pretraining_config(str(root / "corpus.txt"), str(root / "cache"))
  train.run(config, str(root / "workdir"))
  return str(root / "workdir"), config


@pytest.fixture(scope="module")
def loaded(pretrained):
  return workdir_lib.load_encoder(pretrained[0])


def test_load_encoder_returns_the_checkpoint_encoder(pretrained, loaded):
  workdir, config = pretrained
  run_config, tokenizer, encoder_params = loaded
  assert run_config.model.to_dict() == config.model.to_dict()
  with open(tokenizers.cache_path(config), "rb") as f:
    assert tokenizer.model_proto == f.read()
  # Read the checkpoint independently of the code under test: orbax without a target tree.
  raw = ocp.StandardCheckpointer().restore(os.path.join(workdir, "checkpoints", "2", "state"))
  expected = raw["params"]["params"]["encoder"]
  assert jax.tree.structure(encoder_params) == jax.tree.structure(expected)
  jax.tree.map(np.testing.assert_array_equal, encoder_params, expected)


def test_bad_workdirs_name_the_fix(pretrained, tmp_path):
  workdir, _ = pretrained
  with pytest.raises(ConfigError, match="no config.json.*--workdir of"):
    workdir_lib.load_encoder(str(tmp_path))
  (tmp_path / "not_started").mkdir()
  shutil.copy(os.path.join(workdir, "config.json"), tmp_path / "not_started")
  with pytest.raises(ConfigError, match="holds no checkpoint"):
    workdir_lib.load_encoder(str(tmp_path / "not_started"))
  assert not (tmp_path / "not_started" / "checkpoints").exists()  # read-only: nothing created
  with pytest.raises(ConfigError, match="is not at /nonexistent.*tokenizer_path"):
    workdir_lib.load_encoder(workdir, tokenizer_path="/nonexistent/spm.model")


def test_parameters_are_read_from_the_checkpoint_alone(pretrained, tmp_path, marker):
  """The parameters come from the checkpoint's own metadata: an edited config.json does not
  change them (nor is an optimizer built), and fine-tuning that run refuses the mismatch."""
  workdir, _ = pretrained
  edited = str(tmp_path / "edited")
  shutil.copytree(workdir, edited)
  with open(os.path.join(edited, "config.json")) as f:
    saved = json.load(f)
  saved["model"]["hidden"] = 64
  saved["optimizer"]["name"] = "no such optimizer"
  with open(os.path.join(edited, "config.json"), "w") as f:
    json.dump(saved, f)
  jax.tree.map(np.testing.assert_array_equal, workdir_lib.restore_params(edited),
               workdir_lib.restore_params(workdir))
  config, tokenizer, params = workdir_lib.load(edited)
  with pytest.raises(ConfigError, match="does not fit the fine-tuning model"):
    finetune_run.fine_tune(finetune_config(config, seed=0), tokenizer, params, mesh=one_device())


def test_a_corrupt_checkpoint_names_the_file(pretrained, tmp_path):
  workdir, _ = pretrained
  broken = str(tmp_path / "broken")
  shutil.copytree(workdir, broken)
  state = os.path.join(broken, "checkpoints", "2", "state")
  for root, _, names in os.walk(state):
    for name in names:
      if name != "_METADATA" and not name.startswith("_"):
        with open(os.path.join(root, name), "wb") as f:
          f.write(b"garbage")
  with pytest.raises(ConfigError, match=f"{broken}/checkpoints/2 cannot be read.*left untouched"):
    workdir_lib.restore_params(broken)


# ---------------------------------------------------------------------------- in-memory fine-tuning

MARKER = "kappa"


def marker_task(examples_per_split=(256, 64)):
  """Label 1 iff the word MARKER occurs in a random 3-6 word text (a task any encoder can learn
  from scratch), registered as a classification task."""
  rng = np.random.default_rng(0)
  others = [w for w in WORDS if w != MARKER]

  def make(count):
    examples = []
    for _ in range(count):
      words = list(rng.choice(others, rng.integers(3, 7)))
      label = int(rng.integers(0, 2))
      if label:
        words[rng.integers(0, len(words))] = MARKER
      examples.append(dict(text=" ".join(words), text_b=None, label=label))
    return examples

  splits = dict(zip(("train", "validation"), map(make, examples_per_split)))
  return tasks.Task("marker", "classification", lambda split, _: splits[split],
                    ("accuracy", "macro_f1", "mcc"), "accuracy", ("absent", "present"))


def finetune_config(init_config, seed: int, **finetune):
  config = cl.finetune_config()
  config.seed = seed
  config.finetune.update(dict(task="marker", max_seq_len=16), **finetune)
  config.optimizer.peak_lr = 2e-3
  config.train.update(batch_size=16, eval_batch_size=16, total_steps=60, log_every=20)
  config.mesh.update(data=1)
  return finetune_run.resolved_config(config, init_config)


@pytest.fixture
def marker(monkeypatch):
  monkeypatch.setitem(tasks.TASKS, "marker", marker_task())


def one_device():
  from bertfam_jax.train import sharding  # pylint: disable=g-import-not-at-top
  return sharding.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])


def test_fine_tune_learns_deterministically_and_compiles_once(pretrained, marker):
  init_config, tokenizer, _ = workdir_lib.load(pretrained[0])
  mesh = one_device()
  recipe._CACHE.clear()  # pylint: disable=protected-access
  run = lambda seed: finetune_run.fine_tune(  # noqa: E731
      finetune_config(init_config, seed, from_scratch=True), tokenizer, None, mesh=mesh)
  result = run(0)
  compiled = list(recipe._CACHE.values())  # pylint: disable=protected-access
  assert result["step"] == 60 and result["scores"]["accuracy"] > 0.9, result["scores"]
  labels = [e["label"] for e in tasks.TASKS["marker"].load("validation")]
  predictions = [p["prediction"] for p in result["predictions"]]
  assert result["scores"]["accuracy"] == np.mean(np.asarray(predictions) == labels)
  assert result["train"]["loss"] < 0.3, result["train"]   # the last 20 steps' mean
  again, other_seed = run(0), run(1)
  timeless = lambda r: dict(r, train={k: v for k, v in r["train"].items()  # noqa: E731
                                      if k != "tokens_per_sec"})
  assert timeless(again) == timeless(result)
  assert other_seed["train"]["loss"] != result["train"]["loss"]
  # Three runs, two seeds: the train step and predict function built by the first are reused,
  # and the reused step trains seed 1 as a freshly built one does (the seed is bound per run).
  assert len(compiled) == 1
  assert list(recipe._CACHE.values()) == compiled  # pylint: disable=protected-access
  recipe._CACHE.clear()  # pylint: disable=protected-access
  assert timeless(run(1)) == timeless(other_seed)


def test_a_roberta_init_learns_with_fairseqs_recipe(pretrained, marker):
  """A run pre-trained with fairseq's masking (RoBERTa's) fine-tunes a classification task with
  fairseq's recipe end to end: its Adam, its head without dropout and with torch's init."""
  init_config, tokenizer, _ = workdir_lib.load(pretrained[0])
  init_config.objective.mask_style = "fairseq"
  config = finetune_config(init_config, seed=0, from_scratch=True)
  # Bias-corrected, its steps are 3-6x shorter than BERT's uncorrected AdamW's at the same rate
  # over these 60 steps (m/√v ≈ (1 − 0.9^t)/√(1 − 0.999^t) there): at 2e-3 it stays at chance.
  config.optimizer.peak_lr = 5e-3
  assert (config.optimizer.adam, config.optimizer.weight_decay, config.optimizer.clip_norm,
          config.finetune.head_dropout, config.finetune.head_init) == (
              "fairseq", 0.1, 0.0, 0.0, "torch_default")
  result = finetune_run.fine_tune(config, tokenizer, None, mesh=one_device())
  assert result["step"] == 60 and result["scores"]["accuracy"] > 0.9, result["scores"]


def test_fine_tuning_starts_from_the_pretrained_encoder(pretrained, marker, tmp_path):
  """At a zero learning rate the fine-tuned encoder, read back from the run's checkpoint, is
  exactly the pre-trained one (the head is new, the pooler fresh: no NSP head in this run)."""
  init_config, tokenizer, params = workdir_lib.load(pretrained[0])
  config = finetune_config(init_config, seed=0)
  config.optimizer.peak_lr = 0.0
  config.train.total_steps = 2
  mesh = one_device()
  recipe.train_and_evaluate(config, finetune_run.make_recipe(config, tokenizer, params, mesh),
                            mesh, str(tmp_path))
  tuned = workdir_lib.restore_params(str(tmp_path))
  jax.tree.map(np.testing.assert_array_equal, tuned["encoder"], params["encoder"])
  assert sorted(tuned) == ["classification_head", "encoder"]


def test_data_that_cannot_train_is_refused(pretrained, marker):
  init_config, tokenizer, params = workdir_lib.load(pretrained[0])
  too_long = finetune_config(init_config, seed=0, max_seq_len=64)
  with pytest.raises(ConfigError, match="max_seq_len=64 exceeds the encoder's max_positions=32"):
    finetune_run.fine_tune(too_long, tokenizer, params, mesh=one_device())
  too_few = finetune_config(init_config, seed=0, max_train_examples=8)
  with pytest.raises(ConfigError, match="8 training rows, fewer than train.batch_size=16"):
    finetune_run.fine_tune(too_few, tokenizer, params, mesh=one_device())
  with pytest.raises(ConfigError, match="fine_tune needs the config `resolved_config` returns"):
    finetune_run.fine_tune(cl.finetune_config(), tokenizer, params, mesh=one_device())
