"""Statistical and structural tests of the masked-LM noising against spec §1.1 step 9 and §2.

The BERT and RoBERTa rules are exercised end to end through `mlm.make_features(config, tokenizer)`
with the objective settings of configs/bert.py (mask_style='bert') and configs/roberta.py
(mask_style='fairseq'), both with token-level selection; the budget, selection, packing and
corruption primitives of objectives/noise.py are also tested on their own.

Statistical checks compare a count with its exact expectation under the reference rule and allow
5 standard deviations of that count (computed from the sample size), so a false failure has
probability ~6e-7 per check while a wrong rate (e.g. 80/15/5 or half-up rounding) fails.
"""

import pathlib
import types

import numpy as np
import pytest

from bertfam_jax import config_lib
from bertfam_jax.objectives import mlm, noise

SDS = 5.0
# The project tokenizer layout (data/tokenizers.py); the vocabulary is tiny so that every id is
# drawn often. fairseq's dictionary puts its 4 never-random entries (<s>, <pad>, </s>, <unk>)
# first too: here pad, unk, [CLS] (= <s>) and [SEP] (= </s>).
PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
NUM_NEVER_RANDOM = 4
V = 32
WORD = 7  # The one "word" id of the constant-body batches used for replacement statistics.
TOKENIZER = types.SimpleNamespace(pad_id=PAD, unk_id=UNK, cls_id=CLS, sep_id=SEP, mask_id=MASK,
                                  special_ids=np.array([PAD, CLS, SEP, MASK]),
                                  word_start=np.ones(V, bool),
                                  word_start_for=lambda rule: np.ones(V, bool))
# The noising fields of configs/bert.py and configs/roberta.py that these tests rely on.
BERT_RULE = dict(mask_style="bert", mask_scheme="token", mask_rate=0.15, replace_per="token",
                 random_tokens="uniform", sbo=False, word_shuffle_rate=0.0)
ROBERTA_RULE = dict(BERT_RULE, mask_style="fairseq")


def _batch(lengths, seq_len, rng, *, body=None):
  """[CLS] body [SEP] pad... rows; body ids uniform in [5, V) or the constant `body`."""
  lengths = np.asarray(lengths)
  n = lengths.size
  input_mask = (np.arange(seq_len) < lengths[:, None]).astype(np.int32)
  ids = rng.integers(5, V, (n, seq_len)) if body is None else np.full((n, seq_len), body)
  ids = np.where(input_mask > 0, ids, PAD)
  ids[:, 0] = np.where(lengths > 0, CLS, PAD)
  ids[np.arange(n), np.maximum(lengths - 1, 0)] = np.where(lengths > 1, SEP, ids[:, 0])
  return dict(input_ids=ids.astype(np.int32), input_mask=input_mask,
              segment_ids=np.zeros((n, seq_len), np.int32),
              sentence_label=rng.integers(0, 2, n).astype(np.int32))


def _features(rule, *, max_predictions=20, mask_rate=0.15):
  """`mlm.make_features` of a base config whose objective follows `rule`."""
  config = config_lib.base_config()
  config.model.vocab_size = V
  config.objective.update(rule)
  config.objective.update(max_predictions=max_predictions, mask_rate=mask_rate)
  return mlm.make_features(config, TOKENIZER)


def _bert(examples, seed=0, **overrides):
  return _features(BERT_RULE, **overrides)(examples, np.random.default_rng(seed))


def _roberta(examples, seed=0, **overrides):
  return _features(ROBERTA_RULE, **overrides)(examples, np.random.default_rng(seed))


def _load_config(name):
  return config_lib.load_config(str(pathlib.Path(__file__).resolve().parents[2] / "configs" / f"{name}.py"))


@pytest.mark.parametrize("name, rule", [("bert", BERT_RULE), ("roberta", ROBERTA_RULE)])
def test_the_rules_tested_here_are_the_shipped_configs(name, rule):
  objective = _load_config(name).objective
  assert {key: objective[key] for key in rule} == rule


def test_make_features_passes_the_tokenizer_layout():
  bert, roberta = _features(BERT_RULE).keywords, _features(ROBERTA_RULE).keywords
  assert bert["num_never_random"] == 0  # BERT draws random tokens from the whole vocabulary.
  assert roberta["num_never_random"] == NUM_NEVER_RANDOM
  for keywords in (bert, roberta):
    assert keywords["mask_id"] == MASK and keywords["vocab_size"] == V
    np.testing.assert_array_equal(keywords["special_ids"], [PAD, CLS, SEP, MASK])


def _assert_close(observed, mean, var, what):
  tol = SDS * np.sqrt(var)
  assert abs(observed - mean) <= tol, f"{what}: {observed}, expected {mean:.2f} ± {tol:.2f}"


def _predicted(out):
  """[n, L] bool map of the predicted positions, from the packed slots."""
  chosen = np.zeros(out["input_ids"].shape, bool)
  rows, slots = np.nonzero(out["mlm_weights"])
  chosen[rows, out["mlm_positions"][rows, slots]] = True
  return chosen


def test_bert_num_to_predict_is_round_half_even_with_floor_one_and_cap():
  lengths = np.arange(0, 513)
  input_mask = (np.arange(512) < lengths[:, None]).astype(np.int32)
  for cap in (20, 1000):
    expected = [min(cap, max(1, round(length * 0.15))) for length in lengths]  # Python 3 round.
    np.testing.assert_array_equal(noise.bert_num_to_predict(input_mask, 0.15, cap), expected)
  # 0.15 * 30 = 4.5 rounds to 4 (half-even), not 5 (half-up); 0.15 * 10 = 1.5 rounds to 2.
  assert noise.bert_num_to_predict(input_mask[[10, 30]], 0.15, 1000).tolist() == [2, 4]


def test_bert_mask_count_per_row_is_exact():
  lengths = [2, 3, 10, 30, 64, 127, 128]  # 2 = [CLS][SEP]: budget 1 but no candidate.
  out = _bert(_batch(lengths, 128, np.random.default_rng(1)))
  expected = [min(20, max(1, round(length * 0.15)), length - 2) for length in lengths]
  np.testing.assert_array_equal(out["mlm_weights"].sum(1), expected)


@pytest.mark.parametrize("length", [100, 77])
def test_fairseq_num_to_predict_has_the_expected_mean(length):
  n = 20_000
  input_mask = np.ones((n, length), np.int32)
  counts = noise.fairseq_num_to_predict(input_mask, 0.15, np.random.default_rng(2))
  x = 0.15 * length
  frac = x - np.floor(x)
  assert set(np.unique(counts)) <= {np.floor(x), np.floor(x) + 1}
  # int(x + U) is floor(x) + Bernoulli(frac(x)): mean x, variance frac (1 - frac) per row.
  _assert_close(counts.sum(), n * x, n * frac * (1 - frac), f"fairseq count sum, len {length}")


def test_roberta_mask_count_per_row_follows_the_fairseq_rule():
  n = 5000
  out = _roberta(_batch([100] * n + [77] * n, 128, np.random.default_rng(3)))
  counts = out["mlm_weights"].sum(1)
  np.testing.assert_array_equal(counts[:n], 15)  # 0.15 * 100 has no fractional part.
  assert set(np.unique(counts[n:])) <= {11, 12}
  _assert_close(counts[n:].sum(), n * 11.55, n * 0.55 * 0.45, "roberta count sum, len 77")


def _split_moments(out, mask_id, random_probs, replace_probs=noise.BERT_REPLACE_PROBS):
  """Exact mean and variance of the [MASK] / kept / other counts over the predicted slots."""
  p_mask, p_keep, p_random = replace_probs
  targets = out["mlm_targets"][out["mlm_weights"] > 0]
  probs = {"mask": p_mask + p_random * random_probs[mask_id],
           "keep": p_keep + p_random * random_probs[targets]}
  probs["other"] = 1.0 - probs["mask"] - probs["keep"]
  return {k: (np.sum(np.broadcast_to(p, targets.shape)),
              np.sum(np.broadcast_to(p * (1 - p), targets.shape))) for k, p in probs.items()}


def _split_counts(out, original, mask_id):
  real = out["mlm_weights"] > 0
  rows = np.broadcast_to(np.arange(real.shape[0])[:, None], real.shape)[real]
  noised = out["input_ids"][rows, out["mlm_positions"][real]]
  before = original[rows, out["mlm_positions"][real]]
  is_mask = noised == mask_id
  is_keep = ~is_mask & (noised == before)
  return {"mask": is_mask.sum(), "keep": is_keep.sum(), "other": (~is_mask & ~is_keep).sum()}


def _uniform(num_special=0):
  q = np.ones(V)
  q[:num_special] = 0.0
  return q / q.sum()


@pytest.mark.parametrize("rule", ["bert", "roberta"])
def test_80_10_10_split_of_predicted_tokens(rule):
  examples = _batch(np.full(4000, 128), 128, np.random.default_rng(4))
  if rule == "bert":
    out, q = _bert(examples), _uniform()
  else:
    out, q = _roberta(examples), _uniform(NUM_NEVER_RANDOM)
  observed = _split_counts(out, examples["input_ids"], MASK)
  for k, (mean, var) in _split_moments(out, MASK, q).items():
    _assert_close(observed[k], mean, var, f"{rule} {k} count")


def _select_pack_corrupt(examples, budget, rng, *, max_predictions, **corrupt):
  """Token masking from the primitives: select_uniform, pack_predictions, corrupt_positions."""
  input_ids = examples["input_ids"]
  chosen = noise.select_uniform(examples["input_mask"] > 0, budget, rng)
  predictions = noise.pack_predictions(chosen, input_ids, max_predictions)
  noised = noise.corrupt_positions(input_ids, predictions["mlm_positions"],
                                   predictions["mlm_weights"], rng, mask_id=MASK, vocab_size=V,
                                   **corrupt)
  return dict(input_ids=noised, **predictions)


def test_replace_probs_without_random_tokens():
  # ELECTRA's 85% [MASK] / 15% unchanged (spec §5): no random replacement may appear.
  examples = _batch(np.full(2000, 128), 128, np.random.default_rng(5))
  out = _select_pack_corrupt(examples, np.full(2000, 19), np.random.default_rng(5),
                             max_predictions=20, replace_probs=(0.85, 0.15, 0.0))
  np.testing.assert_array_equal(out["mlm_weights"].sum(1), 19)
  observed = _split_counts(out, examples["input_ids"], MASK)
  assert observed["other"] == 0
  mean, var = _split_moments(out, MASK, _uniform(), (0.85, 0.15, 0.0))["mask"]
  _assert_close(observed["mask"], mean, var, "electra mask count")


def _replacement_histogram(out, original, mask_id):
  """Counts per id of predicted tokens that became neither [MASK] nor their original id."""
  chosen = _predicted(out)
  noised = out["input_ids"][chosen]
  other = (noised != mask_id) & (noised != original[chosen])
  return np.bincount(noised[other], minlength=V), chosen.sum()


def test_bert_random_tokens_cover_the_whole_vocab():
  examples = _batch(np.full(4000, 128), 128, np.random.default_rng(6), body=WORD)
  hist, num_predicted = _replacement_histogram(_bert(examples), examples["input_ids"], MASK)
  p = 0.1 / V  # Per prediction, the chance of a random draw equal to a given id.
  for token in set(range(V)) - {WORD, MASK}:
    _assert_close(hist[token], num_predicted * p, num_predicted * p * (1 - p), f"id {token}")
  assert hist[[PAD, UNK, CLS, SEP]].min() > 0, "BERT draws specials too"


def test_roberta_random_tokens_skip_the_first_four_ids():
  examples = _batch(np.full(4000, 128), 128, np.random.default_rng(7), body=WORD)
  hist, num_predicted = _replacement_histogram(_roberta(examples), examples["input_ids"], MASK)
  np.testing.assert_array_equal(hist[:NUM_NEVER_RANDOM], 0)  # pad, unk, <s>, </s>
  p = 0.1 / (V - NUM_NEVER_RANDOM)
  for token in set(range(NUM_NEVER_RANDOM, V)) - {WORD, MASK}:
    _assert_close(hist[token], num_predicted * p, num_predicted * p * (1 - p), f"id {token}")


def test_bert_never_predicts_or_changes_cls_and_sep():
  examples = _batch(np.random.default_rng(8).integers(2, 129, 3000), 128,
                    np.random.default_rng(8))
  out = _bert(examples)
  special = np.isin(examples["input_ids"], (CLS, SEP)) & (examples["input_mask"] > 0)
  assert not (_predicted(out) & special).any()
  np.testing.assert_array_equal(out["input_ids"][special], examples["input_ids"][special])


def test_roberta_predicts_bos_and_eos_at_the_uniform_rate():
  n, length = 4000, 100
  examples = _batch(np.full(n, length), 128, np.random.default_rng(9))
  chosen = _predicted(_roberta(examples))
  p = 15 / length  # Exactly 15 of the 100 positions per row, uniformly.
  for position, name in ((0, "<s>"), (length - 1, "</s>")):
    _assert_close(chosen[:, position].sum(), n * p, n * p * (1 - p), f"{name} predictions")
    assert chosen[:, position].any()


def test_selection_is_uniform_over_candidates():
  n, length = 4000, 64
  chosen = _predicted(_bert(_batch(np.full(n, length), 128, np.random.default_rng(10))))
  k, m = round(0.15 * length), length - 2  # Budget 10 among the 62 non-special positions.
  p = k / m
  for position in range(1, length - 1):
    _assert_close(chosen[:, position].sum(), n * p, n * p * (1 - p), f"position {position}")


@pytest.mark.parametrize("mask_fn", [_bert, _roberta])
def test_max_predictions_caps_the_budget(mask_fn):
  # ALBERT's shipped 512 / 20 setting: every full row predicts 20 tokens, ~3.9% instead of 15%.
  examples = _batch(np.full(64, 512), 512, np.random.default_rng(11))
  out = mask_fn(examples, max_predictions=20)
  assert out["mlm_positions"].shape == (64, 20)
  np.testing.assert_array_equal(out["mlm_weights"].sum(1), 20)
  assert out["mlm_weights"].sum() / examples["input_mask"].sum() == pytest.approx(20 / 512)


@pytest.mark.parametrize("mask_fn", [_bert, _roberta])
def test_layout_of_the_predictions(mask_fn):
  rng = np.random.default_rng(12)
  examples = _batch(rng.integers(0, 129, 500), 128, rng)
  original = {k: v.copy() for k, v in examples.items()}
  out = mask_fn(examples, max_predictions=20)
  for key in original:  # Inputs are not modified.
    np.testing.assert_array_equal(examples[key], original[key])
  for key in ("segment_ids", "sentence_label", "input_mask"):  # Pass-through keys.
    assert out[key] is examples[key]
  assert out["input_ids"].dtype == np.int32 and out["input_ids"].shape == (500, 128)
  assert out["mlm_positions"].dtype == out["mlm_targets"].dtype == np.int32
  assert out["mlm_weights"].dtype == np.float32
  positions, targets, weights = out["mlm_positions"], out["mlm_targets"], out["mlm_weights"]
  lengths = examples["input_mask"].sum(1)
  counts = weights.sum(1).astype(int)
  real = np.arange(20) < counts[:, None]
  np.testing.assert_array_equal(weights, real.astype(np.float32))  # Real slots first, then 0s.
  np.testing.assert_array_equal(positions[~real], 0)
  np.testing.assert_array_equal(targets[~real], 0)
  # Ascending and unique (strictly increasing), and inside the non-pad tokens.
  assert (np.diff(positions, axis=1)[real[:, 1:]] > 0).all()
  assert (positions < lengths[:, None])[real].all()
  np.testing.assert_array_equal(targets, np.where(
      real, np.take_along_axis(original["input_ids"], positions, axis=1), 0))
  # Only predicted positions may change; padding is never touched.
  untouched = ~_predicted(out)
  np.testing.assert_array_equal(out["input_ids"][untouched], original["input_ids"][untouched])


@pytest.mark.parametrize("mask_fn", [_bert, _roberta])
def test_deterministic_for_a_seed_and_different_across_seeds(mask_fn):
  examples = _batch(np.full(64, 128), 128, np.random.default_rng(13))
  first, again, other = mask_fn(examples, seed=5), mask_fn(examples, seed=5), mask_fn(examples, 6)
  for key in first:
    np.testing.assert_array_equal(first[key], again[key])
  assert (first["mlm_positions"] != other["mlm_positions"]).any()
  assert (first["input_ids"] != other["input_ids"]).any()


@pytest.mark.parametrize("mask_style", ["bert", "fairseq", "spanbert"])
def test_make_features_truncates_a_budget_above_max_predictions(mask_style):
  # mask_rate 0.8 asks for ~100 of 128 tokens (fairseq and spanbert budgets have no cap of
  # their own); max_predictions keeps 20.
  examples = _batch(np.full(8, 128), 128, np.random.default_rng(14))
  out = _features(dict(BERT_RULE, mask_style=mask_style), mask_rate=0.8)(
      examples, np.random.default_rng(14))
  assert out["mlm_positions"].shape == (8, 20)
  np.testing.assert_array_equal(out["mlm_weights"].sum(1), 20)


def test_select_uniform_takes_every_candidate_when_the_budget_exceeds_them():
  rng = np.random.default_rng(15)
  candidates = rng.random((50, 64)) < 0.3
  chosen = noise.select_uniform(candidates, np.full(50, 100), rng)
  np.testing.assert_array_equal(chosen, candidates)
  chosen = noise.select_uniform(candidates, np.full(50, 5), rng)
  assert not (chosen & ~candidates).any()
  np.testing.assert_array_equal(chosen.sum(1), np.minimum(5, candidates.sum(1)))


def test_random_token_weights_must_match_the_vocab():
  with pytest.raises(ValueError, match="random_token_weights"):
    noise.sample_tokens(4, np.random.default_rng(0), vocab_size=V, weights=np.ones(V - 1))


def test_pack_predictions_refuses_more_than_max_predictions():
  chosen = np.zeros((2, 8), bool)
  chosen[1, :5] = True
  with pytest.raises(ValueError, match="max_predictions=4"):
    noise.pack_predictions(chosen, np.zeros((2, 8), np.int32), 4)
