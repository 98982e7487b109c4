"""Text-to-text fine-tuning: the features seqio would build, decoding ids back to text, and a tiny
T5 that learns a copy task from scratch (teacher forcing, Adafactor, greedy decoding, scoring)."""

import json

import ml_collections
import numpy as np
import pytest

from bertfam_jax import config_lib
from bertfam_jax.data import tokenizers
from bertfam_jax.finetune import classify
from bertfam_jax.finetune import seq2seq
from bertfam_jax.finetune import text_tasks

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


COPY_SPLITS = dict(train=_copy_examples(np.random.default_rng(0), 512),
                   validation=_copy_examples(np.random.default_rng(1), 12))
COPY_TASK = text_tasks.TextTask("copy", "generation", lambda split, data_dir: COPY_SPLITS[split],
                                text_tasks.GENERATION_METRICS, "rouge2", max_target_tokens=8)


@pytest.fixture(scope="module")
def tokenizer():
  texts = [e["inputs"] for e in COPY_SPLITS["train"]]
  return tokenizers.Tokenizer(tokenizers.train_sentencepiece(texts * 4, 170, "bpe"), EXTRA_IDS)


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


def test_init_params_copies_pretrained_and_refuses_another_shape(tokenizer):
  import jax  # pylint: disable=g-import-not-at-top
  model = seq2seq.build_model(_model_config(tokenizer))
  pretrained = jax.device_get(seq2seq.init_params(model, jax.random.key(1)))
  copied = seq2seq.init_params(model, jax.random.key(2), pretrained)
  jax.tree.map(np.testing.assert_array_equal, copied, pretrained)
  other = seq2seq.build_model(_with(_model_config(tokenizer), mlp=96))
  with pytest.raises(config_lib.ConfigError, match="do not fit"):
    seq2seq.init_params(other, jax.random.key(0), pretrained)
  with pytest.raises(config_lib.ConfigError, match="encoder-decoder T5"):
    seq2seq.build_model(_with(_model_config(tokenizer), architecture="decoder_only"))


def test_tiny_t5_learns_to_copy(tokenizer):
  logged = []
  results = seq2seq.fine_tune(
      _model_config(tokenizer), None, tokenizer, COPY_TASK, steps=300, batch_size=32,
      peak_lr=1e-2, inputs_length=10, targets_length=8, seed=0, log_every=100,
      on_log=lambda step, scalars: logged.append((step, scalars)))
  curve = results["train_loss_curve"]
  assert curve[-1] < 0.1 * curve[0], curve
  assert [step for step, _ in logged] == [100, 200, 300]
  assert logged[-1][1]["accuracy"] > 0.99   # teacher-forced token accuracy of the last 100
  predictions = [p["prediction"] for p in results["predictions"]]
  assert predictions == [e["targets"] for e in COPY_SPLITS["validation"]]
  # BLEU needs 4-grams, which 3-word texts lack; ROUGE scores the exact copies 100.
  assert {k: results["scores"][k] for k in ("rouge1", "rouge2", "rougeL")} == pytest.approx(
      dict(rouge1=100.0, rouge2=100.0, rougeL=100.0))


def test_run_writes_the_workdir(tokenizer, tmp_path, monkeypatch):
  init = tmp_path / "t5_run"
  init.mkdir()
  init_config = ml_collections.ConfigDict(dict(
      model=_model_config(tokenizer).to_dict(),
      tokenizer=dict(kind="sentencepiece", model_path=str(init / "spm.model"),
                     extra_ids=EXTRA_IDS)))
  monkeypatch.setitem(text_tasks.TASKS, "copy", COPY_TASK)
  monkeypatch.setattr(classify, "load_pretrained", lambda path: (init_config, tokenizer, None))
  config = config_lib.finetune_config()
  config.finetune.update(task="copy", init=str(init), epochs=0.25, max_seq_len=10, peak_lr=1e-2)
  config.train.update(batch_size=32, log_every=2)
  workdir = tmp_path / "work"
  results = seq2seq.run(config, str(workdir))

  assert results["steps"] == 4 and results["examples"] == 12   # 512 / 32 × 0.25
  saved = json.loads((workdir / "eval_results.json").read_text())
  assert saved["scores"] == pytest.approx(results["scores"]) and saved["main_metric"] == "rouge2"
  predictions = [json.loads(line) for line in (workdir / "predictions.jsonl").open()]
  assert [p["id"] for p in predictions] == [e["id"] for e in COPY_SPLITS["validation"]]
  assert all(p["references"] == [e["targets"]] for p, e in zip(predictions,
                                                               COPY_SPLITS["validation"]))
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").open()]
  assert [r["step"] for r in records] == [2, 4, 4] and "eval_rouge2" in records[-1]
  assert json.loads((workdir / "config.json").read_text())["model"]["kind"] == "t5"
