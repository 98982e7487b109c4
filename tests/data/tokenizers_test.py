"""Tests for bertfam_jax.data.tokenizers: layout, round trip, training cache, errors."""

import concurrent.futures
import json
import os
import time

import numpy as np
import pytest

from bertfam_jax import config_lib
from bertfam_jax.data import sources
from bertfam_jax.data import tokenizers

VOCAB = 1000


@pytest.fixture(scope="module")
def config(tmp_path_factory):
  c = config_lib.base_config()
  # The embedded corpus cache is shared by every test module of the session (same basetemp).
  c.data.cache_dir = str(tmp_path_factory.getbasetemp() / "bertfam_cache")
  c.model.vocab_size = VOCAB
  c.tokenizer.model_type = "bpe"           # 0.1 s to train here; unigram is tested below
  c.tokenizer.train_max_sentences = 4000
  return c


@pytest.fixture(scope="module")
def documents(config):
  return sources.get_documents(config.data, "train")


@pytest.fixture(scope="module")
def tokenizer(config, documents):
  return tokenizers.load_or_train(config, documents)


def test_special_id_layout(tokenizer):
  assert tokenizer.vocab_size == VOCAB
  assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id,
          tokenizer.mask_id) == (0, 1, 2, 3, 4)
  np.testing.assert_array_equal(tokenizer.special_ids, [0, 2, 3, 4])
  assert tokenizer.decode([2, 4, 3]) == "[CLS][MASK][SEP]"
  assert tokenizer.decode([0, 0]) == ""


def test_word_start(tokenizer):
  ids = tokenizer.encode(["The international organisations, however, disagreed."])[0]
  pieces = [tokenizer._sp.id_to_piece(int(i)) for i in ids]
  expected = [p.startswith("▁") or p in (",", ".") for p in pieces]
  np.testing.assert_array_equal(tokenizer.word_start[ids], expected)
  assert not all(expected)   # some words are split into several pieces at this vocab size
  assert tokenizer.word_start[tokenizer.special_ids].all()
  assert tokenizer.word_start.shape == (VOCAB,) and tokenizer.word_start.dtype == bool


@pytest.mark.parametrize("piece, albert, xlnet", [
    ("▁in", True, True), ("ing", False, False), ("<eod>", True, True), (",", True, True),
    # ALBERT: digits and non-ASCII pieces each begin a word ("▁1 9 9 9" is four words) ...
    ("9", True, False), ("99", True, False), ("é", True, False), ("naïve", True, False),
    # ... an apostrophe is not among the references' punctuation ...
    ("'s", True, False),
    # ... and a piece of several punctuation characters continues a word in both.
    ("...", False, False), ("),", False, False), ("Ing", False, False),
])
def test_albert_and_xlnet_word_starts_follow_the_references(piece, albert, xlnet):
  """albert/create_pretraining_data.py `_is_start_piece_sp`, xlnet/data_utils.py
  `_is_start_piece`, piece by piece; BART's (fairseq's GPT-2 `is_beginning_of_word`: a piece
  that decodes with a leading space) only at the word marker, so ',' joined to a word, digits
  and '...' continue it."""
  assert tokenizers.starts_word(piece, "albert") is albert
  assert tokenizers.starts_word(piece, "xlnet") is xlnet
  assert tokenizers.starts_word(piece, "bart") is piece.startswith(("▁", "<"))


def test_word_start_tables_by_rule(tokenizer):
  pieces = [tokenizer._sp.id_to_piece(i) for i in range(tokenizer.num_pieces)]
  np.testing.assert_array_equal(tokenizer.word_start_for("bert"), tokenizer.word_start)
  for rule in ("albert", "xlnet", "bart"):
    table = tokenizer.word_start_for(rule)
    assert table[tokenizer.special_ids].all()
    ordinary = np.setdiff1d(np.arange(tokenizer.num_pieces), tokenizer.special_ids)
    np.testing.assert_array_equal(table[ordinary],
                                  [tokenizers.starts_word(pieces[i], rule) for i in ordinary])
  # The rules differ on this vocabulary: digit pieces begin words for ALBERT only.
  digits = [i for i, p in enumerate(pieces) if p.isdigit()]
  assert digits and tokenizer.word_start_for("albert")[digits].all()
  assert not tokenizer.word_start_for("xlnet")[digits].any()
  assert not tokenizer.word_start[digits].any()
  punctuation = [i for i, p in enumerate(pieces) if p in (",", ".")]
  assert len(punctuation) == 2 and tokenizer.word_start[punctuation].all()
  assert not tokenizer.word_start_for("bart")[punctuation].any()


def test_albert_masks_with_albert_word_starts(config, tokenizer):
  from bertfam_jax.objectives import mlm  # pylint: disable=import-outside-toplevel
  albert = config_lib.load_config(os.path.join(os.path.dirname(__file__), "..", "..", "configs",
                                               "albert.py"), "runlocal")
  assert albert.objective.word_start_rule == "albert"
  features = mlm.make_features(albert, tokenizer)
  np.testing.assert_array_equal(features.keywords["word_start_table"],
                                tokenizer.word_start_for("albert"))


def test_encode_decode_round_trip(tokenizer, documents):
  sentences = sources.split_sentences(documents[0])[:50]
  encoded = tokenizer.encode(sentences)
  assert len(encoded) == len(sentences)
  assert all(ids.dtype == np.int32 and ids.ndim == 1 and len(ids) for ids in encoded)
  assert all(((ids > 4) | (ids == tokenizer.unk_id)).all() for ids in encoded)
  ascii_sentences = [s for s in sentences if s.isascii()]
  assert len(ascii_sentences) > 20
  for sentence, ids in zip(sentences, encoded):
    if sentence.isascii():
      assert tokenizer.decode(ids) == sentence


def test_cached_model_is_reused_not_retrained(config, documents, tokenizer, monkeypatch):
  path = tokenizers.cache_path(config)
  assert os.path.exists(path)
  assert os.path.dirname(path).endswith("tokenizers")
  monkeypatch.setattr(tokenizers, "train_sentencepiece", lambda *a: pytest.fail("retrained"))
  again = tokenizers.load_or_train(config, documents)
  assert again.model_proto == tokenizer.model_proto
  # A different vocab is a different cache entry.
  other = config.copy_and_resolve_references()
  other.model.vocab_size = VOCAB + 1
  assert tokenizers.cache_path(other) != path


def test_concurrent_loads_train_once_and_share_the_model(config, documents, tmp_path, monkeypatch):
  """Two loads of one uncached tokenizer at the same time (a sweep's parallel jobs, test workers
  sharing a cache): one trains, the other waits for it and loads the same model."""
  c = config.copy_and_resolve_references()
  c.data.cache_dir = str(tmp_path / "cache")
  trained, train = [], tokenizers.train_sentencepiece

  def slow_train(*args):
    trained.append(args[1])
    time.sleep(0.5)   # long enough for the other thread to arrive while this one trains
    return train(*args)
  monkeypatch.setattr(tokenizers, "train_sentencepiece", slow_train)
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    loaded = list(pool.map(lambda _: tokenizers.load_or_train(c, documents), range(2)))
  assert trained == [VOCAB]
  assert loaded[0].model_proto == loaded[1].model_proto
  name = os.path.basename(tokenizers.cache_path(c))
  assert sorted(os.listdir(os.path.dirname(tokenizers.cache_path(c)))) == [name, name + ".lock"]


def test_training_is_deterministic(documents):
  sentences = tokenizers.training_sentences(documents, 1500)
  assert len(sentences) == 1500
  first = tokenizers.train_sentencepiece(sentences, 600, "unigram")
  assert tokenizers.train_sentencepiece(sentences, 600, "unigram") == first
  assert tokenizers.Tokenizer(first).vocab_size == 600


def test_model_path_vocab_mismatch(config, documents, tokenizer):
  c = config.copy_and_resolve_references()
  c.tokenizer.model_path = tokenizers.cache_path(config)
  assert tokenizers.load_or_train(c, documents).vocab_size == VOCAB
  c.model.vocab_size = 30522
  with pytest.raises(config_lib.ConfigError, match="--config.model.vocab_size=1000"):
    tokenizers.load_or_train(c, documents)


def test_missing_model_path_and_wordpiece(config, documents):
  c = config.copy_and_resolve_references()
  c.tokenizer.model_path = "/nonexistent/sp.model"
  with pytest.raises(config_lib.ConfigError, match="does not exist"):
    tokenizers.load_or_train(c, documents)
  c.tokenizer.kind = "wordpiece"
  with pytest.raises(config_lib.ConfigError, match="choose sentencepiece.*or hf"):
    tokenizers.load_or_train(c, documents)
  c.tokenizer.kind = "hf"
  with pytest.raises(config_lib.ConfigError, match="directory of tokenizer files"):
    tokenizers.load_or_train(c, documents)


def test_vocab_too_large_for_corpus(config):
  with pytest.raises(config_lib.ConfigError, match="Lower --config.model.vocab_size"):
    tokenizers.train_sentencepiece(["A tiny corpus.", "Two sentences only."], 5000, "unigram")


def test_encode_with_offsets_maps_pieces_to_the_original_text(tokenizer):
  texts = ["  The café   costs naïve Zürich",
           "日本語 and ﬁne ５ dollars",   # NFKC: the ligature and the fullwidth digit change
           "x\u0301y e\u0301 😀 end", "", "plain ascii text, with punctuation."]
  ids, offsets = tokenizer.encode_with_offsets(texts)
  for text, piece_ids, spans, expected in zip(texts, ids, offsets, tokenizer.encode(texts)):
    np.testing.assert_array_equal(piece_ids, expected)
    assert spans.shape == (len(piece_ids), 2) and spans.dtype == np.int32
    assert (spans[:, 0] <= spans[:, 1]).all() and (np.diff(spans[:, 0]) >= 0).all()
    surfaces = [text[s:e] for s, e in spans]
    assert not any(s[:1].isspace() for s in surfaces)
    # Every non-space character is covered by exactly one piece.
    covered = sorted(i for s, e in spans for i in range(s, e))
    assert covered == [i for i, ch in enumerate(text) if not ch.isspace()] or "\u0301" in text
    pieces = [tokenizer._sp.id_to_piece(int(i)) for i in piece_ids]
    for piece, surface, piece_id in zip(pieces, surfaces, piece_ids):
      if text.isascii() and piece_id != tokenizer.unk_id:
        assert surface == piece.lstrip("▁")
  first = offsets[0]
  assert texts[0][first[-1][0]:first[-1][1]] in "Zürich" and texts[0][:first[0][1]].strip() in "The"
  assert tokenizer.pair_separator_ids == (tokenizer.sep_id,)


def test_t5_extra_ids_follow_the_pieces_in_reverse(config, documents, tokenizer):
  """T5 / seqio layout: `tokenizer.extra_ids` sentinels after the pieces, <extra_id_0> last;
  the model's table may be larger (HF pads 32,100 ids to 32,128 rows)."""
  c = config_lib.base_config()
  c.update_from_flattened_dict({"data.cache_dir": config.data.cache_dir,
                                "tokenizer.model_type": "bpe",
                                "tokenizer.train_max_sentences": 4000,
                                "tokenizer.extra_ids": 10, "tokenizer.vocab_size": VOCAB,
                                "model.vocab_size": VOCAB + 16})
  t5_tokenizer = tokenizers.load_or_train(c, documents)
  assert t5_tokenizer.model_proto == tokenizer.model_proto   # the same 1000-piece model, cached
  assert (t5_tokenizer.num_pieces, t5_tokenizer.vocab_size) == (VOCAB, VOCAB + 10)
  assert t5_tokenizer.sentinel_start == VOCAB + 9 and t5_tokenizer.eos_id == tokenizer.sep_id
  assert set(range(VOCAB, VOCAB + 10)) <= set(t5_tokenizer.special_ids.tolist())
  assert t5_tokenizer.word_start.shape == (VOCAB + 10,)
  ids = tokenizer.encode(["The cat sat."])[0]
  with_sentinels = np.concatenate([ids[:2], [VOCAB + 9], ids[2:], [VOCAB + 8]])
  assert t5_tokenizer.decode(with_sentinels) == (
      f"{tokenizer.decode(ids[:2])} <extra_id_0> {tokenizer.decode(ids[2:])} <extra_id_1>")
  c.model.vocab_size = VOCAB + 5   # the sentinels no longer fit the table
  with pytest.raises(config_lib.ConfigError, match="model.vocab_size=1010"):
    tokenizers.load_or_train(c, documents)


def test_user_symbols_follow_mask_and_name_the_eod(config, documents, tokenizer):
  """XLNet's `<eod>`: a user-defined piece right after [MASK], in its own cache entry; the
  default layout (no user symbols) keeps the cache key it always had and has no eod_id."""
  assert tokenizer.eod_id is None
  c = config.copy_and_resolve_references()
  c.tokenizer.user_symbols = "<eod>"
  assert tokenizers.cache_path(c) != tokenizers.cache_path(config)
  with_eod = tokenizers.load_or_train(c, documents)
  assert with_eod.eod_id == 5 and with_eod.vocab_size == VOCAB
  assert 5 in with_eod.special_ids and with_eod.word_start[5]
  assert with_eod.encode(["end<eod>"])[0][-1] == 5
  # A given model without the piece is refused with the fix.
  c.tokenizer.model_path = tokenizers.cache_path(config)
  with pytest.raises(config_lib.ConfigError, match="no <eod> piece.*user_symbols=''"):
    tokenizers.load_or_train(c, documents)


def test_albert_normalizer_is_preprocess_text_with_each_characters_source():
  """ALBERT's preprocess_text(lower=True): whitespace runs joined and the ends stripped, NFKD,
  combining marks dropped, lower-cased; each output character maps to its source."""
  text = "  Café\t\tDÉJÀ vu ﬁn "
  out, source = tokenizers.normalize_text(text, "albert")
  assert out == "cafe deja vu fin"
  assert [text[i] for i in source] == list("Café\tDÉJÀ vu ﬁﬁn")
  assert tokenizers.normalize_text(text, "")[0] == text


@pytest.fixture(scope="module")
def albert_tokenizer(config, documents):
  """A tokenizer as configs/albert.py trains one, on the corpus with numbers written 1,000."""
  albert = config.copy_and_resolve_references()
  albert.tokenizer.update(normalize="albert", user_symbols='(,),",-,.,–,£,€', model_type="unigram")
  numbers = [f"In {1000 + i} there were {i % 9 + 1},{i % 7}00 people." for i in range(3000)]
  return tokenizers.load_or_train(albert, [" ".join(numbers)] + list(documents))


def test_albert_tokenizer_folds_case_and_accents_and_splits_digit_commas(albert_tokenizer):
  """ALBERT's text: 'CAFÉ' encodes as 'cafe'; its punctuation symbols are pieces of their own; a
  piece ending in a digit and ',' (learned from 1,000-style numbers) is split as
  tokenization.py's encode_pieces does; offsets still point into the original text."""
  tok = albert_tokenizer
  assert tok.normalize == "albert"
  np.testing.assert_array_equal(tok.encode(["The CAFÉ"])[0], tok.encode(["the cafe"])[0])
  pieces = tok.pieces()
  assert all(tok.piece_id(s) is not None for s in '()"-.–£€')
  assert tok._splits, "the corpus should teach a digit-comma piece"
  text = "Then 4,300 Zürich people."
  ids, spans = (x[0] for x in tok.encode_with_offsets([text]))
  np.testing.assert_array_equal(tok.encode([text])[0], ids)
  surfaces = [pieces[i] for i in ids]
  assert not any(len(p) > 1 and p[-1] == "," and p[-2].isdigit() for p in surfaces)
  assert "," in surfaces
  for piece, (start, end) in zip(surfaces, spans):
    original = text[start:end]
    assert tokenizers.normalize_text(original, "albert")[0] == piece.replace("▁", "") or (
        piece == "▁" and start == end), (piece, original)
  # Exported for transformers: lower-cased, accents stripped.
  from bertfam_jax.data import hf_tokenizer  # pylint: disable=import-outside-toplevel
  config = json.loads(hf_tokenizer.sentencepiece_files(tok.model_proto, 0, "albert")[
      "tokenizer_config.json"])
  assert config["do_lower_case"] and not config["keep_accents"]
