"""Text-to-text fine-tuning: the features seqio would build, decoding ids back to text, and a tiny
T5 that learns a copy task from scratch through the one train loop (teacher forcing, Adafactor,
greedy decoding, scoring).
The copy task and the tiny T5 are shared with seq2seq_run_test.py (the workdir run)."""

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import pytest

from bertfam_jax import config_lib
from bertfam_jax.data import tokenizers
from bertfam_jax.finetune import decoding
from bertfam_jax.finetune import recipe
from bertfam_jax.finetune import run as finetune_run
from bertfam_jax.finetune import seq2seq
from bertfam_jax.finetune import text_tasks
from bertfam_jax.train import sharding
from helpers.run_records import train_records

WORDS = ("apple", "river", "stone", "cloud", "green", "seven", "table", "music", "north", "light",
         "paper", "horse")
EXTRA_IDS = 4


def _copy_examples(rng, count):
  """"copy: w1 w2 w3" -> "w1 w2 w3", three distinct words (a T5 has no absolute positions:
  repeated words and varying lengths take it many more steps)."""
  examples = []
  for i in range(count):
    words = " ".join(rng.choice(WORDS, size=3, replace=False))
    examples.append(text_tasks.example(f"copy: {words}", words, f"c{i}"))
  return examples


# 1,280 training copies: 40 steps an epoch, so the 400-step runs below evaluate and checkpoint
# 10 times (25 times at 512 copies, a third of their time).
COPY_SPLITS = dict(train=_copy_examples(np.random.default_rng(0), 1280),
                   validation=_copy_examples(np.random.default_rng(1), 12))
COPY_TASK = text_tasks.TextTask("copy", "generation", lambda split, data_dir: COPY_SPLITS[split],
                                text_tasks.GENERATION_METRICS, "rouge2", max_target_tokens=8)


def copy_tokenizer() -> tokenizers.Tokenizer:
  texts = [e["inputs"] for e in COPY_SPLITS["train"]]
  return tokenizers.Tokenizer(tokenizers.train_sentencepiece(texts * 4, 170, "bpe"), EXTRA_IDS)


@pytest.fixture(scope="module")
def tokenizer():
  return copy_tokenizer()


def _model_config(tokenizer):
  return config_lib.t5_model("mini", vocab_size=tokenizer.vocab_size + 4, hidden=64, heads=4,
                             head_dim=16, mlp=128, dropout=0.0)


def _with(config, **changes):
  return ml_collections.ConfigDict(dict(config.to_dict(), **changes))


def test_encode_texts_trims_then_appends_eos(tokenizer):
  pieces = tokenizer.encode(["copy: apple river stone", "green"])
  ids = seq2seq.encode_texts(tokenizer, ["copy: apple river stone", "green"], 4)
  np.testing.assert_array_equal(ids[0], [*pieces[0][:3], tokenizer.eos_id])
  np.testing.assert_array_equal(ids[1], [*pieces[1], tokenizer.eos_id, *[0] * (3 - len(pieces[1]))])
  with pytest.raises(config_lib.ConfigError, match="no room"):
    seq2seq.encode_texts(tokenizer, ["a"], 1)


def test_featurize_shifts_targets_right_with_bos_0(tokenizer):
  batch = seq2seq.featurize(tokenizer, COPY_SPLITS["validation"][:3], inputs_length=12,
                            targets_length=6)
  targets = batch["decoder_target_ids"]
  np.testing.assert_array_equal(batch["decoder_input_ids"][:, 0], 0)
  np.testing.assert_array_equal(batch["decoder_input_ids"][:, 1:], targets[:, :-1])
  np.testing.assert_array_equal(batch["decoder_loss_weights"], targets != 0)
  np.testing.assert_array_equal(batch["decoder_segment_ids"], targets != 0)
  np.testing.assert_array_equal(batch["input_segment_ids"], batch["input_ids"] != 0)
  assert batch["decoder_loss_weights"].dtype == np.float32
  # Every target ends in EOS (none of these is cut), and nothing follows it.
  for row in targets:
    eos = np.flatnonzero(row == tokenizer.eos_id)
    assert len(eos) == 1 and not row[eos[0] + 1:].any()


def test_decode_texts_stops_at_eos_and_drops_sentinels(tokenizer):
  words = list(tokenizer.encode(["apple river"])[0])
  sentinel = tokenizer.sentinel_start   # <extra_id_0>; tokenizer.vocab_size + 2: a padded row
  rows = [words + [tokenizer.eos_id] + words,
          [sentinel, *words, 0, sentinel - 1, tokenizer.vocab_size + 2]]
  ids = np.asarray([row + [0] * (12 - len(row)) for row in rows])
  assert seq2seq.decode_texts(tokenizer, ids) == ["apple river", "apple river"]


def _fresh_params(model, seed):
  ids = np.zeros((1, 8), np.int32)
  return nn.meta.unbox(model.init(jax.random.key(seed), ids, ids, deterministic=True)["params"])


def test_fit_pretrained_copies_and_refuses_another_shape(tokenizer):
  model = seq2seq.build_model(_model_config(tokenizer))
  pretrained = jax.device_get(_fresh_params(model, 1))
  copied = seq2seq.fit_pretrained(_fresh_params(model, 2), pretrained)
  jax.tree.map(np.testing.assert_array_equal, copied, pretrained)
  other = seq2seq.build_model(_with(_model_config(tokenizer), mlp=96))
  with pytest.raises(config_lib.ConfigError, match="do not fit"):
    seq2seq.fit_pretrained(jax.eval_shape(lambda: _fresh_params(other, 0)), pretrained)
  with pytest.raises(config_lib.ConfigError, match="needs a T5"):
    seq2seq.build_model(config_lib.encoder("mini"))


def test_decoder_only_rows_are_inputs_then_targets(tokenizer):
  """One example a row: inputs + EOS, targets + EOS; the loss on the targets; the prefix (inputs
  and one position more) marked; decoding starts after the inputs."""
  examples = COPY_SPLITS["validation"][:2]
  rows = seq2seq.featurize_decoder_only(tokenizer, examples, inputs_length=10, targets_length=8)
  inputs = seq2seq.encode_texts(tokenizer, [e["inputs"] for e in examples], 10)
  targets = seq2seq.encode_texts(tokenizer, [e["targets"] for e in examples], 8)
  for r in range(2):
    n_in, n_out = int((inputs[r] != 0).sum()), int((targets[r] != 0).sum())
    assert rows["prefix_tokens"][r] == n_in
    np.testing.assert_array_equal(rows["decoder_target_ids"][r, :n_in + n_out],
                                  [*inputs[r, :n_in], *targets[r, :n_out]])
    np.testing.assert_array_equal(rows["decoder_loss_weights"][r],
                                  (np.arange(18) >= n_in) & (np.arange(18) < n_in + n_out))
    np.testing.assert_array_equal(rows["decoder_causal_attention"][r], np.arange(18) <= n_in)
    real = n_in + n_out
    np.testing.assert_array_equal(rows["decoder_input_ids"][r, :real],
                                  [0, *rows["decoder_target_ids"][r, :real - 1]])


@pytest.mark.parametrize("use_cache", [False, True])
@pytest.mark.parametrize("architecture", ["decoder_only", "prefix_lm"])
def test_decoder_only_greedy_equals_a_loop(tokenizer, architecture, use_cache):
  """The jitted search, recomputing or with its prefilled cache, equals re-running the model on
  the hand-built sequence at every step."""
  model = seq2seq.build_model(_with(_model_config(tokenizer), architecture=architecture))
  rows = seq2seq.featurize_decoder_only(tokenizer, COPY_SPLITS["validation"][:3],
                                        inputs_length=10, targets_length=5)
  ids = np.zeros((1, 15), np.int32)
  prefix = dict(decoder_causal_attention=ids) if architecture == "prefix_lm" else {}
  params = nn.meta.unbox(model.init(jax.random.key(3), None, ids, deterministic=True,
                                    **prefix)["params"])
  out = np.asarray(decoding.greedy_decode(model, params, rows["decoder_target_ids"], max_length=5,
                                          eos_id=tokenizer.eos_id, use_cache=use_cache,
                                          prefix_tokens=rows["prefix_tokens"]))
  for r in range(3):
    n = int(rows["prefix_tokens"][r])
    sequence, done = list(rows["decoder_target_ids"][r, :n]), False
    for t in range(5):
      shifted = np.array([[0, *sequence]], np.int32)
      kwargs = {}
      if architecture == "prefix_lm":
        kwargs["decoder_causal_attention"] = (np.arange(len(sequence) + 1) <= n)[None].astype(
            np.int32)
      logits = model.apply({"params": params}, None, shifted, None, np.ones_like(shifted),
                           deterministic=True, **kwargs)
      token = 0 if done else int(np.argmax(logits[0, -1]))
      sequence.append(token)
      done = done or token == tokenizer.eos_id
      assert out[r, t] == token, (r, t)


def test_tiny_prefix_lm_learns_to_copy(tokenizer, copy_task, tmp_path):
  """A prefix-LM T5 (Raffel et al. §3.2) from scratch through the one loop: inputs + targets as
  one sequence, the inputs both ways, greedy decoding from a prefilled cache."""
  config = copy_config(_with(_model_config(tokenizer), architecture="prefix_lm"))
  config.finetune.from_scratch = True
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  results = recipe.train_and_evaluate(
      config, finetune_run.make_recipe(config, tokenizer, None, mesh), mesh, str(tmp_path))
  logged = train_records(str(tmp_path))
  assert logged[400]["t5_loss"] < 0.1 * logged[100]["t5_loss"]
  predictions = [p["prediction"] for p in results["predictions"]]
  assert predictions == [e["targets"] for e in COPY_SPLITS["validation"]]
  assert results["scores"]["target_loss"] < 0.1


def init_config(model_config, tokenizer_path=""):
  """The pre-trained run's config sections a text-to-text fine-tuning reads (`run.resolved_config`):
  the T5 `model_config`, T5's objective (its z-loss) and the copy tokenizer's."""
  return ml_collections.ConfigDict(dict(
      model=model_config.to_dict(), objective=config_lib.t5_objective().to_dict(),
      tokenizer=dict(kind="sentencepiece", model_path=tokenizer_path, extra_ids=EXTRA_IDS)))


def copy_config(model_config, **finetune):
  """A resolved fine-tuning config of the copy task: 400 steps of 32, Adafactor at 0.01 (after
  300 steps one of the 12 validation copies still swaps two words), no dropout (the recipe's 0.1
  leaves the last steps' token accuracy at 98.7%)."""
  config = config_lib.finetune_config()
  config.finetune.update(dict(task="copy", max_seq_len=10, targets_length=8, dropout=0.0),
                         **finetune)
  config.optimizer.peak_lr = 1e-2
  config.train.update(batch_size=32, eval_batch_size=12, total_steps=400, log_every=100)
  config.mesh.update(data=1)
  return finetune_run.resolved_config(config, init_config(model_config))


@pytest.fixture
def copy_task(monkeypatch):
  monkeypatch.setitem(text_tasks.TASKS, "copy", COPY_TASK)


def test_tiny_t5_learns_to_copy(tokenizer, copy_task, tmp_path):
  """From scratch through the one loop (`recipe.train_and_evaluate`, here with a workdir to read
  its metrics), on one device (the fastest here)."""
  config = copy_config(_model_config(tokenizer))
  config.finetune.from_scratch = True
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  results = recipe.train_and_evaluate(
      config, finetune_run.make_recipe(config, tokenizer, None, mesh), mesh, str(tmp_path))
  logged = train_records(str(tmp_path))   # every 100 steps and at every epoch's checkpoint
  assert {100, 200, 300, 400} <= set(logged) and max(logged) == 400
  losses = [logged[step]["t5_loss"] for step in (100, 200, 300, 400)]
  assert losses[-1] < 0.1 * losses[0], losses
  assert logged[400]["t5_accuracy"] > 0.99   # teacher-forced token accuracy of the last steps
  predictions = [p["prediction"] for p in results["predictions"]]
  assert predictions == [e["targets"] for e in COPY_SPLITS["validation"]]
  # BLEU needs 4-grams, which 3-word texts lack; ROUGE scores the exact copies 100.
  assert {k: results["scores"][k] for k in ("rouge1", "rouge2", "rougeL")} == pytest.approx(
      dict(rouge1=100.0, rouge2=100.0, rougeL=100.0))
  # The gold targets' teacher-forced loss: near 0 for a model that copies, the mean of the
  # per-example losses weighted by their tokens, and what each distinct prediction scored.
  per_example = [p["target_nll"] for p in results["predictions"]]
  assert 0 <= results["scores"]["target_loss"] < 0.1 and max(per_example) < 0.5
  assert results["distinct_predictions"] == len(set(predictions)) > 3
