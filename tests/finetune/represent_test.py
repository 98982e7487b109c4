"""bertfam_jax.represent: per-token and per-word vectors of a run of every family. The vectors are
the model's own hidden states (against a forward pass written here), a text's vectors do not
depend on what it is batched with (padding, left for XLNet), word pooling equals a word-by-word
loop, and the CLI writes its files or one line."""

import copy
import os
import subprocess
import sys

import numpy as np
import pytest

from bertfam_jax import config_lib as cl
from bertfam_jax import represent
from bertfam_jax import workdir as workdir_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.models import encoder as encoder_lib
from bertfam_jax.models import finetune as finetune_models
from bertfam_jax.models import t5 as t5_model
from bertfam_jax.train import train
from helpers import tiny

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXTS = ["The dog barked at the postman yesterday .", "Hot dogs", "A bank of the river , and a "
         "bank that lends money ; both are banks 1999 ."]


def family_config(family: str):
  """configs/<family>.py:runlocal, a 2-layer 32-wide model over 512 pieces, 2 steps."""
  c = cl.load_config(os.path.join(_ROOT, "configs", f"{family}.py"), "runlocal")
  c.data.update(seq_len=32, docs_per_chunk=16)
  if family == "bert":
    c.model = tiny.encoder(max_positions=64)
    c.objective.max_predictions = 5
  elif family == "xlnet":
    c.model.update(hidden=32, heads=2, head_dim=16, mlp=64, layers=2, vocab_size=512,
                   reuse_len=16, mem_len=16)
    c.objective.update(num_predict=6, perm_size=16)
  elif family == "elmo":   # [forward; backward] 32 wide
    c.model.update(vocab_size=512, max_characters=12, char_embedding_dim=4,
                   char_filters=((1, 8), (2, 8)), projection_dim=16, lstm_cells=24)
  else:
    c.model.update(hidden=32, heads=2, head_dim=16, mlp=64, layers=2, decoder_layers=2,
                   vocab_size=532)
    c.tokenizer.extra_ids = 20
    c.objective.targets_length = 12
  c.tokenizer.vocab_size = 512
  c.optimizer.warmup_steps = 1
  c.train.update(batch_size=8, total_steps=2, log_every=1, eval_batches=0, checkpoint_every=2)
  return c


_RUNS = {}


def trained(family: str, tmp_path_factory):
  """(family, workdir, Representer) of a 2-step run of `family`, once per module."""
  if family not in _RUNS:
    workdir = str(tmp_path_factory.mktemp(family))
    train.run(family_config(family), workdir)
    _RUNS[family] = (family, workdir, represent.load(workdir))
  return _RUNS[family]


@pytest.fixture(scope="module", params=["bert", "xlnet", "t5", "elmo"])
def run(request, tmp_path_factory):
  return trained(request.param, tmp_path_factory)


@pytest.fixture(scope="module", params=["xlnet", "t5"])
def last_layer_run(request, tmp_path_factory):
  return trained(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory):
  return trained("bert", tmp_path_factory)


@pytest.fixture(scope="module")
def t5_run(tmp_path_factory):
  return trained("t5", tmp_path_factory)


def test_a_text_is_represented_the_same_alone_or_batched_with_longer_ones(run):
  _, _, r = run
  together = represent.represent(r, TEXTS, unit="token", batch_size=3)
  for text, vectors in zip(TEXTS, together):
    alone, = represent.represent(r, [text], unit="token", max_tokens=48)
    assert vectors.shape == alone.shape == (len(r.tokenizer.encode([" ".join(text.split())])[0]),
                                            32)
    np.testing.assert_allclose(vectors, alone, atol=2e-5)


def test_a_text_without_words_has_no_vectors(run):
  _, _, r = run
  empty, words = represent.represent(r, ["", "two words"], unit="word")
  assert empty.shape == (0, 32) and words.shape == (2, 32) and np.isfinite(words).all()


def test_word_pooling_equals_a_word_by_word_loop(run):
  """SentencePiece pieces never cross a space, so a word's tokens are its own encoding's, less a
  bare '▁' (a word start holding no character, which belongs to no word, as in tagging)."""
  _, _, r = run
  bare = r.tokenizer.piece_id("▁")
  tokens = represent.represent(r, TEXTS, unit="token")
  for pooling in represent.POOLINGS:
    words = represent.represent(r, TEXTS, unit="word", pooling=pooling)
    for text, token_vectors, word_vectors in zip(TEXTS, tokens, words):
      start, expected = 0, []
      for word in text.split():
        ids = r.tokenizer.encode([word])[0]
        own = np.flatnonzero(ids != bare) + start
        mine = token_vectors[own]
        start += len(ids)
        expected.append(mine[0] if pooling == "first" else mine[-1] if pooling == "last"
                        else mine.mean(axis=0))
      assert start == len(token_vectors)
      np.testing.assert_allclose(word_vectors, np.stack(expected), rtol=1e-6, atol=1e-6)


def test_the_last_layer_equals_the_network_on_an_unpadded_row(last_layer_run):
  """XLNet: the text, <sep>, <cls> (segments 0, 0, 2) with no left padding; T5: the text and
  EOS; against `represent`'s rows of 64 (padded), from the first token on."""
  family, workdir, r = last_layer_run
  assert r.num_states == 1   # XLNet's content stream and T5's encoder: the last layer
  with pytest.raises(ConfigError, match="gives 1 hidden state"):
    represent.represent(r, TEXTS, layers="0,1")
  t, params = r.tokenizer, workdir_lib.restore_params(workdir)
  ids = [int(i) for i in t.encode([TEXTS[0]])[0]]
  if family == "xlnet":
    row = np.asarray([ids + [t.sep_id, t.cls_id]], np.int32)
    segments = np.asarray([[0] * (len(ids) + 1) + [2]], np.int32)
    tree = {k: v for k, v in params.items() if k != "lm_loss"}
    expected = finetune_models.XLNetContent(r.config.model).apply(
        {"params": tree}, row, np.ones_like(row), segments, deterministic=True)
  else:
    row = np.asarray([ids + [t.eos_id]], np.int32)
    expected = t5_model.T5(r.config.model).apply({"params": params}, row, np.ones_like(row),
                                                 deterministic=True, method=t5_model.T5.encode)
  got, = represent.represent(r, TEXTS[:1], unit="token", max_tokens=64)
  np.testing.assert_allclose(got, np.asarray(expected)[0, :len(ids)], rtol=2e-5, atol=2e-5)


def test_every_layer_equals_the_encoder_forward_pass(bert_run):
  _, workdir, r = bert_run
  ids = [r.tokenizer.cls_id, *r.tokenizer.encode([TEXTS[0]])[0], r.tokenizer.sep_id]
  inputs = np.asarray([ids], np.int32)
  _, all_states = encoder_lib.Encoder(r.config.model).apply(
      {"params": workdir_lib.restore_params(workdir)["encoder"]},
      inputs, np.ones_like(inputs), np.zeros_like(inputs), deterministic=True,
      return_all_layers=True)
  expected = np.asarray(all_states)[:, 0, 1:-1].transpose(1, 0, 2)   # [tokens, 3, hidden]
  got, = represent.represent(r, TEXTS[:1], unit="token", layers="all")
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
  mean, = represent.represent(r, TEXTS[:1], unit="token", layers="0,-1", mix="mean")
  np.testing.assert_allclose(mean, (expected[:, 0] + expected[:, 2]) / 2, rtol=1e-5, atol=1e-5)
  with pytest.raises(ConfigError, match="finetune.features=weighted_sum"):
    represent.represent(r, TEXTS, layers="all", mix="learned")


@pytest.mark.parametrize("layer_norm", [False, True])
def test_the_learned_mix_is_the_trained_scalar_mix(bert_run, layer_norm):
  """mix='learned': γ·Σ softmax(w)_j·h_j with the run's weights; after finetune.mix_layer_norm
  each layer is first normalised as in training (bilm-tf's _do_ln over the batch's real
  tokens, [CLS] and [SEP] included)."""
  _, _, trained_run = bert_run
  r = copy.copy(trained_run)
  r.mix_params = {"weights": np.array([0.5, -1.0, 2.0], np.float32), "gamma": np.float32(1.7)}
  r.mix_layer_norm = layer_norm
  ids = r.tokenizer.encode(TEXTS)
  inputs, starts = r.rows(ids, 64)
  states = r.hidden_states(inputs).astype(np.float64)      # [3, texts, 64, hidden]
  if layer_norm:
    mask = inputs["input_mask"][..., None].astype(np.float64)
    count = mask.sum() * states.shape[-1]
    means = [(h * mask).sum() / count for h in states]
    states = np.stack([(h - m) / np.sqrt((((h * mask - m) * mask) ** 2).sum() / count + 1e-12)
                       for h, m in zip(states, means)])
  w = np.exp(r.mix_params["weights"]) / np.exp(r.mix_params["weights"]).sum()
  mixed = 1.7 * np.einsum("n,nbld->bld", w, states)
  got = represent.represent(r, TEXTS, unit="token", layers="all", mix="learned", max_tokens=64)
  for text, (vectors, start) in enumerate(zip(got, starts)):
    np.testing.assert_allclose(vectors, mixed[text, start:start + len(ids[text])], rtol=1e-4,
                               atol=1e-4)


def test_elmo_gives_its_token_layer_and_both_lstm_layers(tmp_path_factory):
  """ELMo's three layers per word, [forward; backward], from the biLM run on the text's words
  (<S> text </S>), each piece carrying its word's vectors."""
  from bertfam_jax.models import elmo as elmo_model  # pylint: disable=g-import-not-at-top
  from bertfam_jax.objectives import elmo as elmo_objective  # pylint: disable=g-import-not-at-top
  _, workdir, r = trained("elmo", tmp_path_factory)
  assert r.num_states == 3
  ids = np.asarray([r.tokenizer.cls_id, *r.tokenizer.encode([TEXTS[0]])[0], r.tokenizer.sep_id])
  words, owner = elmo_objective.WordTable(r.tokenizer, 12).words_of_pieces(ids)
  chars = np.stack([c for c, _ in words])[None]
  outputs = elmo_model.BiLM(r.config.model).apply(
      {"params": workdir_lib.restore_params(workdir)}, chars, np.ones(chars.shape[:2], np.int32))
  expected = np.asarray(elmo_model.representation_layers(outputs))[:, 0, owner[1:-1]]
  got, = represent.represent(r, TEXTS[:1], unit="token", layers="all")
  np.testing.assert_allclose(got, expected.transpose(1, 0, 2), rtol=1e-5, atol=1e-5)
  assert len(words) < len(ids)   # some words are several pieces


def cli(*args):
  return subprocess.run([sys.executable, "-m", "bertfam_jax.represent", *args], cwd=_ROOT,
                        capture_output=True, text=True, check=False)


def test_the_cli_writes_vectors_and_rows_or_one_line(bert_run, tmp_path):
  _, workdir, r = bert_run
  (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n\n")
  args = [f"--workdir={workdir}", f"--input={tmp_path / 'texts.txt'}",
          f"--output={tmp_path / 'out' / 'reps.npy'}", "--pooling=mean"]
  done = cli(*args)
  assert done.returncode == 0, done.stderr
  vectors = np.load(tmp_path / "out" / "reps.npy")
  rows = (tmp_path / "out" / "reps.tsv").read_text().splitlines()
  assert vectors.shape == (sum(len(t.split()) for t in TEXTS), 32) == (len(rows), 32)
  assert rows[1] == "0\t1\tdog" and rows[-1].startswith("2\t")
  np.testing.assert_allclose(vectors, np.concatenate(represent.represent(r, TEXTS,
                                                                         pooling="mean")),
                             rtol=1e-5, atol=1e-6)
  for bad, message in (("--layers=7", "error: layers='7': this model gives 3 hidden state(s)"),
                       (f"--input={tmp_path}", f"error: --input={tmp_path} is not a file")):
    done = cli(*args, bad)
    assert done.returncode == 2 and done.stderr.splitlines()[-1].startswith(message), done.stderr


def test_the_cli_names_each_token_row_by_its_text(t5_run, tmp_path):
  _, workdir, _ = t5_run
  (tmp_path / "texts.txt").write_text("Hot dogs\n")
  done = cli(f"--workdir={workdir}", f"--input={tmp_path / 'texts.txt'}",
             f"--output={tmp_path / 'reps.npy'}", "--unit=token")
  assert done.returncode == 0, done.stderr
  rows = [row.split("\t") for row in (tmp_path / "reps.tsv").read_text().splitlines()]
  assert "".join(row[2] for row in rows) == "Hotdogs" and len(rows) == len(np.load(
      tmp_path / "reps.npy"))
