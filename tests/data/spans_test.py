"""Tests for bertfam_jax.data.spans: entity and noun-phrase units on real tokenized text."""

import numpy as np
import pytest

from bertfam_jax import config_lib
from bertfam_jax.data import packing
from bertfam_jax.data import sources
from bertfam_jax.data import spans
from bertfam_jax.data import tokenizers
from bertfam_jax.data import wordnet
from bertfam_jax.objectives import noise

try:
  wordnet.find_wordnet_dir()
except config_lib.ConfigError as e:
  pytest.skip(f"WordNet 3.0 is not installed ({e})", allow_module_level=True)

SEQ_LEN = 32


@pytest.fixture(scope="module")
def config(tmp_path_factory):
  c = config_lib.base_config()
  # The embedded corpus cache is shared by every test module of the session (same basetemp).
  c.data.cache_dir = str(tmp_path_factory.getbasetemp() / "bertfam_cache")
  c.model.vocab_size = 1000          # small: many words span several pieces
  c.tokenizer.model_type = "bpe"
  c.tokenizer.train_max_sentences = 4000
  return c


@pytest.fixture(scope="module")
def documents(config):
  return sources.get_documents(config.data, "train")


@pytest.fixture(scope="module")
def tokenizer(config, documents):
  return tokenizers.load_or_train(config, documents)


def _batch(tokenizer, texts, seq_len=SEQ_LEN):
  """[CLS] text [SEP] per row, padded: input_ids, maskable, word_start, each [n, seq_len]."""
  rows = [[tokenizer.cls_id, *ids, tokenizer.sep_id] for ids in tokenizer.encode(texts)]
  input_ids = np.zeros((len(rows), seq_len), np.int32)
  for i, row in enumerate(rows):
    input_ids[i, :len(row)] = row
  maskable = ~np.isin(input_ids, tokenizer.special_ids)
  return input_ids, maskable, noise.word_starts(input_ids, maskable, tokenizer.word_start)


def _unit_texts(tokenizer, input_ids, unit_ids):
  """The decoded units of each row, left to right."""
  texts = []
  for row_ids, row_units in zip(input_ids, unit_ids):
    texts.append([tokenizer.decode(row_ids[row_units == u]) for u in dict.fromkeys(row_units)
                  if u > 0])
  return texts


SENTENCES = [
    "The old dog barked at the children in New York.",
    "Albert Einstein visited Paris and the Bank of England in 1921.",
    "Dogs chase small cats.",
    "In 1905, the young physicist published the theory of special relativity.",
    "Prices rise after a sharp rise in demand.",
]


def test_noun_phrases_on_sentences(tokenizer):
  batch = _batch(tokenizer, SENTENCES)
  assert (~tokenizer.word_start[batch[0][batch[1]]]).any()   # multi-piece words are exercised
  units = spans.make_span_source("noun_phrases", tokenizer)(*batch)
  got = _unit_texts(tokenizer, batch[0], units)
  assert got[0] == ["The old dog", "the children", "New York"]
  assert got[1][:2] == ["Albert Einstein", "Paris"]
  assert got[2] == ["Dogs", "small cats"]
  assert got[3] == ["the young physicist", "the theory", "special relativity"]
  # 'rise' and 'demand' are verbs first in WordNet; after a determiner or preposition, nouns.
  assert got[4] == ["Prices", "a sharp rise", "demand"]


def test_entities_on_sentences(tokenizer):
  batch = _batch(tokenizer, SENTENCES)
  units = spans.make_span_source("entities", tokenizer)(*batch)
  assert _unit_texts(tokenizer, batch[0], units) == [
      ["New York"], ["Albert Einstein", "Paris", "Bank of England"], [], [], []]


def test_sentence_initial_capitals(tokenizer):
  entities = spans.make_span_source("entities", tokenizer)
  batch = _batch(tokenizer, ["Einstein slept. Dogs barked. Then Paris woke."])
  # 'Einstein' is a gazetteer name and 'Paris' is mid-sentence; 'Dogs' and 'Then' open
  # sentences and are ordinary words in lower case.
  assert _unit_texts(tokenizer, batch[0], entities(*batch)) == [["Einstein", "Paris"]]


def test_word_hash_is_the_hash_of_its_text(tokenizer):
  input_ids, maskable, word_start = _batch(tokenizer, SENTENCES + ["(Coca-Cola's U.S. sales)"])
  words = spans._words(input_ids, maskable, word_start, spans._piece_tables(tokenizer.model_proto))
  flat_ids = input_ids.ravel()[words.tokens]
  texts = [tokenizer.decode(flat_ids[words.word_of_token == w]) for w in range(len(words.cased))]
  keys = [spans._key(text) for text in texts]
  np.testing.assert_array_equal(words.cased, spans._hash_keys(keys))
  np.testing.assert_array_equal(words.folded, spans._hash_keys([k.lower() for k in keys]))
  np.testing.assert_array_equal(words.empty, [not k for k in keys])
  np.testing.assert_array_equal(words.capitalised, [k[:1].isupper() for k in keys])


@pytest.mark.parametrize("name", sorted(spans.SPAN_SOURCES))
def test_contract_on_packed_wikipedia(name, documents, tokenizer):
  encoded = [tokenizer.encode(sources.split_sentences(doc)) for doc in documents[:6]]
  batch = packing.document_blocks(encoded, 128, cls_id=tokenizer.cls_id,
                                  sep_id=tokenizer.sep_id, pad_id=tokenizer.pad_id)
  input_ids = np.concatenate([batch["input_ids"], np.zeros((1, 128), np.int32)])  # + a pad row
  maskable = ~np.isin(input_ids, tokenizer.special_ids)
  word_start = noise.word_starts(input_ids, maskable, tokenizer.word_start)
  units = spans.make_span_source(name, tokenizer)(input_ids, maskable, word_start)

  assert units.shape == input_ids.shape and units.dtype == np.int32
  assert (units >= 0).all() and not (units[~maskable] > 0).any()
  assert not units[-1].any()
  # Whole words: a token that continues a word has its word's unit id.
  continues = maskable & ~word_start
  assert (units[:, 1:][continues[:, 1:]] == units[:, :-1][continues[:, 1:]]).all()
  # Every positive id is one contiguous run.
  flat = units.ravel()
  run_starts = flat[(flat > 0) & (flat != np.concatenate([[0], flat[:-1]]))]
  assert len(run_starts) == len(np.unique(run_starts))
  coverage = (units > 0).sum() / maskable.sum()
  assert (0.08 < coverage < 0.3) if name == "entities" else (0.35 < coverage < 0.7)
  # The consumer accepts them.
  chosen = noise.select_units(maskable, word_start, np.full(len(units), 19),
                              np.random.default_rng(0), unit_ids=units)
  assert chosen.sum() > 0


def test_empty_batches(tokenizer):
  for name in spans.SPAN_SOURCES:
    source = spans.make_span_source(name, tokenizer)
    for shape in [(0, 16), (2, 16)]:
      input_ids = np.zeros(shape, np.int32)
      units = source(input_ids, np.zeros(shape, bool), np.zeros(shape, bool))
      assert units.shape == shape and not units.any()


def test_unknown_source_names_the_choices(tokenizer):
  with pytest.raises(config_lib.ConfigError, match="entities.*noun_phrases"):
    spans.make_span_source("chunks", tokenizer)
