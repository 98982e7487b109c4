"""The masked-LM family wired end to end: each paper config's features on real text, the heads
and losses they imply (SOP, StructBERT, SBO, word order), and SBO learning on a tiny model."""

import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertfam_jax import config_lib, objectives
from bertfam_jax.data import packing, sources, tokenizers, wordnet
from bertfam_jax.objectives import mlm

PAPERS = ("bert", "roberta", "albert", "spanbert", "structbert")


CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"


def paper_config(name, cache_dir):
  config = config_lib.load_config(str(CONFIGS / f"{name}.py"), "runlocal")
  config.data.cache_dir = cache_dir
  config.model.vocab_size = 1000
  config.tokenizer.train_max_sentences = 4000
  return config


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  # The embedded corpus cache is shared by every test module of the session (same basetemp).
  return str(tmp_path_factory.getbasetemp() / "bertfam_cache")


@pytest.fixture(scope="module")
def documents(cache_dir):
  config = paper_config("bert", cache_dir)
  return sources.get_documents(config.data, "train")[:30]


def packed(config, tokenizer, documents):
  docs = [[np.asarray(s, np.int32) for s in tokenizer.encode(sources.split_sentences(d))]
          for d in documents]
  kwargs = dict(cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id, pad_id=tokenizer.pad_id)
  if config.data.packing == "sentence_pairs":
    return packing.sentence_pairs(docs, config.data.seq_len, np.random.default_rng(0),
                                  short_seq_prob=0.1, pair_mode=config.objective.sentence_task
                                  or "nsp", **kwargs)
  blocks = dict(full_sentences=packing.full_sentences, document_blocks=packing.document_blocks)
  return blocks[config.data.packing](docs, config.data.seq_len, **kwargs)


@pytest.mark.parametrize("name", PAPERS)
def test_paper_configs_validate_and_their_features_feed_their_loss(name, cache_dir, documents):
  config = paper_config(name, cache_dir)
  objectives.validate(config)
  objectives.validate(config_lib.load_config(str(CONFIGS / f"{name}.py")))
  tokenizer = tokenizers.load_or_train(config, documents)
  batch = mlm.make_features(config, tokenizer)(packed(config, tokenizer, documents),
                                               np.random.default_rng(1))
  n, length = batch["input_ids"].shape
  o = config.objective
  assert n > 50 and length == config.data.seq_len
  assert batch["mlm_positions"].shape == (n, o.max_predictions)
  weights = batch["mlm_weights"]
  assert 0.10 < weights.sum() / batch["input_mask"].sum() < 0.16
  if o.sentence_task:
    classes = packing.PAIR_CLASSES[o.sentence_task]
    assert set(np.unique(batch["sentence_label"])) == set(range(classes))
  if o.sbo:
    assert batch["sbo_boundaries"].shape == (n, o.max_predictions, 2)
    assert 0.3 < batch["sbo_weights"].sum() / weights.sum() <= 1.0
  if o.word_shuffle_rate:
    assert batch["shuffle_weights"].sum() > 0
  batch = jax.tree.map(lambda x: x[:4], batch)
  model = mlm.build_model(config)
  params = model.init(jax.random.key(0), batch["input_ids"], batch["input_mask"],
                      batch["segment_ids"], batch["mlm_positions"], deterministic=True)
  loss, metrics = mlm.loss_fn(model, params, batch, jax.random.key(1), config, deterministic=True)
  expected = {"mlm_loss", "mlm_accuracy"}
  if o.sentence_task:
    expected |= {f"{o.sentence_task}_loss", f"{o.sentence_task}_accuracy"}
  if o.sbo:
    expected |= {"sbo_loss", "sbo_accuracy"}
  if o.word_shuffle_rate:
    expected |= {"word_order_loss", "word_order_accuracy"}
  assert set(metrics) == expected
  # The total is the sum of the parts' means (each normalised by its own count).
  offsets = dict(mlm=1e-5, sbo=1.0, word_order=1e-5)
  parts = sum(float(total) / (float(count) + offsets.get(key[:-5], 0.0))
              for key, (total, count) in metrics.items() if key.endswith("_loss"))
  np.testing.assert_allclose(float(loss), parts, rtol=1e-5)


def test_units_scheme_masks_entities(cache_dir, documents):
  try:
    wordnet.find_wordnet_dir()
  except config_lib.ConfigError as e:
    pytest.skip(f"WordNet 3.0 is not installed ({e})")

  def capitalised_share(**objective):
    config = paper_config("spanbert", cache_dir)
    config.objective.update(sbo=False, **objective)
    tokenizer = tokenizers.load_or_train(config, documents)
    batch = mlm.make_features(config, tokenizer)(packed(config, tokenizer, documents),
                                                 np.random.default_rng(2))
    targets = batch["mlm_targets"][batch["mlm_weights"] > 0]
    pieces = [tokenizer.decode([t]) for t in targets]
    return np.mean([p[:1].isupper() for p in pieces])

  # Half the draws are entities, so capitalised pieces are far above their share of words.
  assert capitalised_share(mask_scheme="units", span_source="entities") > 2 * capitalised_share(
      mask_scheme="whole_word")


def _per_segment_counts(batch, special_ids):
  """[n, 2] predictions in each segment, and [n, 2] SpanBERT's budget ⌈0.15·|segment|⌉."""
  n = batch["input_ids"].shape[0]
  chosen = np.zeros(batch["input_ids"].shape, bool)
  rows = np.repeat(np.arange(n), batch["mlm_positions"].shape[1])
  weights = batch["mlm_weights"].reshape(-1) > 0
  chosen[rows[weights], batch["mlm_positions"].reshape(-1)[weights]] = True
  # The originals: a chosen token's target, every other token as it stands.
  originals = np.where(chosen, 0, batch["input_ids"])
  np.put_along_axis(originals, batch["mlm_positions"],
                    np.where(batch["mlm_weights"] > 0, batch["mlm_targets"],
                             np.take_along_axis(originals, batch["mlm_positions"], 1)), 1)
  maskable = (batch["input_mask"] > 0) & ~np.isin(originals, special_ids)
  segments = [batch["segment_ids"] == s for s in (0, 1)]
  counts = np.stack([np.count_nonzero(chosen & seg, 1) for seg in segments], 1)
  budgets = np.stack([np.ceil(0.15 * np.count_nonzero(maskable & seg, 1)) for seg in segments], 1)
  return counts, budgets


def test_spanbert_pairs_mask_each_segment_on_its_own(cache_dir, documents):
  """SpanBERT's sentence pairs (span_bert_dataset.py): ⌈0.15·|A|⌉ predictions in A and
  ⌈0.15·|B|⌉ in B, no span across the middle [SEP]; one segment draws as before."""
  config = paper_config("spanbert", cache_dir)
  config.data.packing = "sentence_pairs"
  config.objective.update(sentence_task="nsp", sbo=False)
  tokenizer = tokenizers.load_or_train(config, documents)
  examples = packed(config, tokenizer, documents)
  special_ids = np.asarray(tokenizer.special_ids)

  def noised(**objective):
    config.objective.update(objective)
    return mlm.make_features(config, tokenizer)(examples, np.random.default_rng(3))

  counts, budgets = _per_segment_counts(noised(mask_per_segment=True), special_ids)
  np.testing.assert_array_equal(counts, budgets)
  joint_counts, joint_budgets = _per_segment_counts(noised(mask_per_segment=False), special_ids)
  assert (joint_counts != joint_budgets).any(axis=1).mean() > 0.3
  assert joint_counts.sum() < budgets.sum()
  # Blocks of one segment: the per-segment selection is the joint one, draw for draw.
  config.data.packing = "document_blocks"
  config.objective.sentence_task = ""
  examples = packed(config, tokenizer, documents)
  per_segment, joint = noised(mask_per_segment=True), noised(mask_per_segment=False)
  for key in joint:
    np.testing.assert_array_equal(per_segment[key], joint[key], err_msg=key)


def test_per_segment_units_stay_in_their_segment():
  """Units (entities / noun phrases) with per-segment masking: each segment's row sees only its
  own units, and draws its own budget from them."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  o = ml_collections.ConfigDict(dict(mask_style="spanbert", mask_rate=0.3, max_predictions=8,
                                     mask_scheme="units"))
  ids = np.array([[2, 5, 6, 7, 8, 9, 3, 10, 11, 12, 13, 14, 15, 3, 0, 0]] * 2)
  real = ids > 0
  maskable = real & ~np.isin(ids, [2, 3])
  segment_ids = np.where(np.arange(16) >= 7, 1, 0)[None].repeat(2, 0) * real
  unit_ids = np.zeros_like(ids)
  unit_ids[:, 2:4], unit_ids[:, 8:10] = 1, 2   # one two-word unit in A, one in B
  for seed in range(5):
    chosen = mlm._select_per_segment(o, real, maskable, segment_ids, maskable,
                                     dict(unit_ids=unit_ids, unit_prob=1.0),
                                     np.random.default_rng(seed))
    # ⌈0.3 · 5⌉ = 2 in A, ⌈0.3 · 6⌉ = 2 in B: with unit_prob 1 each segment takes its unit.
    np.testing.assert_array_equal(chosen[:, 2:4], True)
    np.testing.assert_array_equal(chosen[:, 8:10], True)
    assert chosen.sum() == 8


def test_sbo_head_shapes_and_loss_decreases():
  """A tiny SpanBERT learns its boundary task: SBO loss falls on a fixed batch."""
  config = config_lib.base_config()
  config.model.update(hidden=32, layers=1, heads=2, mlp=64, vocab_size=40, max_positions=16,
                      dropout=0.0, attention_dropout=0.0)
  config.data.seq_len = 16
  config.objective.update(mask_style="spanbert", mask_scheme="span", replace_per="span",
                          sentence_task="", sbo=True, max_predictions=6, sbo_max_targets=4,
                          sbo_position_size=8)
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 40, (8, 16)).astype(np.int32)
  ids[:, 0], ids[:, -1] = 2, 3
  positions = np.tile(np.array([[3, 4, 5, 9, 10, 0]], np.int32), (8, 1))
  batch = dict(input_ids=ids.copy(), input_mask=np.ones_like(ids), segment_ids=np.zeros_like(ids),
               mlm_positions=positions,
               mlm_targets=np.take_along_axis(ids, positions, 1),
               mlm_weights=np.array([[1, 1, 1, 1, 1, 0]] * 8, np.float32),
               sbo_boundaries=np.array([[[2, 6]] * 3 + [[8, 11]] * 2 + [[0, 0]]] * 8, np.int32),
               sbo_offsets=np.array([[0, 1, 2, 0, 1, 0]] * 8, np.int32),
               sbo_weights=np.array([[1, 1, 1, 1, 1, 0]] * 8, np.float32))
  batch["input_ids"][np.arange(8)[:, None], positions[:, :5]] = 4   # [MASK]
  model = mlm.build_model(config)
  params = nn.meta.unbox(model.init(jax.random.key(0), batch["input_ids"], batch["input_mask"],
                                    batch["segment_ids"], batch["mlm_positions"],
                                    deterministic=True))
  assert params["params"]["sbo_head"]["offset_embeddings"]["embedding"].shape == (4, 8)
  assert params["params"]["sbo_head"]["transform_1"]["kernel"].shape == (2 * 32 + 8, 32)
  out = model.apply(params, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                    batch["mlm_positions"], sbo_boundaries=batch["sbo_boundaries"],
                    sbo_offsets=batch["sbo_offsets"], deterministic=True)
  assert out["sbo_logits"].shape == (8, 6, 40)
  tx = optax.adam(3e-3)

  @jax.jit
  def step(params, opt_state):
    (loss, metrics), grads = jax.value_and_grad(
        lambda p: mlm.loss_fn(model, p, batch, jax.random.key(0), config, deterministic=True),
        has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state, metrics["sbo_loss"]

  opt_state = tx.init(params)
  sbo_losses = []
  for _ in range(60):
    params, opt_state, (total, count) = step(params, opt_state)
    sbo_losses.append(float(total / count))
  assert sbo_losses[-1] < 0.5 * sbo_losses[0]
  # The SBO logits depend on the boundaries: moving them changes the prediction.
  moved = model.apply(params, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                      batch["mlm_positions"], sbo_boundaries=batch["sbo_boundaries"] + 1,
                      sbo_offsets=batch["sbo_offsets"], deterministic=True)
  assert not jnp.allclose(moved["sbo_logits"], out["sbo_logits"])
