"""bertfam_jax.data.hf_tokenizer: every HF tokenizer layout gives transformers' own ids (when
transformers is installed), character offsets into the original text (accents, CJK, emoji), the
special ids and pair separators of its family, and our SentencePiece models export as an
AlbertTokenizer whose transformers ids equal ours."""

import io
import json
import unicodedata

import numpy as np
import pytest
import sentencepiece as spm
import tokenizers

from bertfam_jax import config_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.data import sources
from bertfam_jax.data import tokenizers as sp_tokenizers
from bertfam_jax.data import hf_tokenizer as tokenizer_lib

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Café Ünïcode naïve résumé: Ångström and Œuvre!",
    "東京タワーは1958年に完成しました。 中文也可以。",
    "Numbers: 3.14159, 1,000,000 and -42; dates 2024-01-31.",
    "  extra   spaces\tand\ttabs  ",
    "emoji 🙂👍🏽 and symbols ©®™ — “quotes” ‘single’",
    "punctuation!!! ...?? (brackets) [square] {curly} <angle>",
    "MiXeD CaSe WoRdS and ALLCAPS",
]


@pytest.fixture(scope="module")
def sentences():
  docs = sources.embedded_wiki(config_lib.default_cache_dir())  # the session's test cache
  return [s for d in docs[:3] for s in sources.split_sentences(d)][:600] + TEXTS


@pytest.fixture(scope="module")
def layouts(sentences, tmp_path_factory):
  """{name: directory} of small tokenizers in each file layout, trained on real text."""
  root = tmp_path_factory.mktemp("tokenizers")
  dirs = {}
  for name, cased in (("wordpiece", False), ("wordpiece_cased", True)):
    trainer = tokenizers.BertWordPieceTokenizer(lowercase=not cased, strip_accents=not cased)
    trainer.train_from_iterator(sentences, vocab_size=400,
                                special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    dirs[name] = root / name
    dirs[name].mkdir()
    trainer.save_model(str(dirs[name]))
    if cased:
      (dirs[name] / "tokenizer_config.json").write_text(json.dumps(dict(do_lower_case=False)))
  bpe = tokenizers.ByteLevelBPETokenizer()
  bpe.train_from_iterator(sentences, vocab_size=500,
                          special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
  dirs["byte_level_bpe"] = root / "byte_level_bpe"
  dirs["byte_level_bpe"].mkdir()
  bpe.save_model(str(dirs["byte_level_bpe"]))
  # ALBERT's layout: <pad> 0, <unk> 1, [CLS] 2, [SEP] 3, [MASK] 4 as control symbols; no
  # tokenizer_config.json, so transformers' defaults (lowercase, accents stripped) apply.
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(sentences), model_writer=model, vocab_size=300, pad_id=0, unk_id=1,
      bos_id=-1, eos_id=-1, control_symbols=["[CLS]", "[SEP]", "[MASK]"], model_type="unigram",
      character_coverage=1.0, minloglevel=2)
  dirs["spiece"] = root / "spiece"
  dirs["spiece"].mkdir()
  (dirs["spiece"] / "spiece.model").write_bytes(model.getvalue())
  return dirs


@pytest.fixture(scope="module")
def our_sentencepiece(sentences):
  return sp_tokenizers.train_sentencepiece(sentences, vocab_size=300, model_type="unigram")


def _strip_accents(text, form):
  return "".join(c for c in unicodedata.normalize(form, text) if not unicodedata.combining(c))


# For each layout: the text a token stands for, and the same text normalised as its tokenizer does.
SURFACE = {
    "wordpiece": (lambda piece: piece.removeprefix("##"),
                  lambda s: _strip_accents(s.lower(), "NFD")),  # BertNormalizer
    "wordpiece_cased": (lambda piece: piece.removeprefix("##"), lambda s: s),
    "spiece": (lambda piece: piece.removeprefix("▁"),
               lambda s: _strip_accents(s, "NFKD").lower()),  # ALBERT: NFKD, then lowercase
}


@pytest.mark.parametrize("layout", sorted(SURFACE))
def test_offsets_are_characters_of_the_original_text(layouts, layout):
  """Every non-unknown token's [start, end) slice of the ORIGINAL text (accents, CJK, emoji,
  runs of spaces) normalises to the token's own text (or contains it, where one character
  normalises to several tokens: ™ → 'tm')."""
  tokenizer = tokenizer_lib.from_dir(str(layouts[layout]))
  piece, normalise = SURFACE[layout]
  vocab = tokenizer._tokenizer.get_vocab()  # pylint: disable=protected-access
  vocab = {i: p for p, i in vocab.items()}
  ids, offsets = tokenizer.encode_with_offsets(TEXTS)
  checked = 0
  for text, text_ids, text_offsets in zip(TEXTS, ids, offsets):
    assert text_offsets.shape == (len(text_ids), 2) and text_offsets.dtype == np.int32
    assert np.all(np.diff(text_offsets[:, 0]) >= 0) and np.all(text_offsets[:, 1] <= len(text))
    for token_id, (start, end) in zip(text_ids, text_offsets):
      if token_id != tokenizer.unk_id and piece(vocab[token_id]):
        assert piece(vocab[token_id]) in normalise(text[start:end]), (text, start, end)
        checked += 1
  assert checked > 100


def test_byte_level_offsets_cover_whole_characters(layouts):
  """Byte-level BPE splits multi-byte characters into byte tokens; each token's span is whole
  characters of the original text, trimmed of the leading space, and the spans of a word's
  tokens join into the word."""
  tokenizer = tokenizer_lib.from_dir(str(layouts["byte_level_bpe"]))
  text = "naïve 東京 🙂 café"
  (ids,), (offsets,) = tokenizer.encode_with_offsets([text])
  assert tokenizer.decode(ids) == text
  words = {text[s:e] for s, e in offsets}
  assert " " not in "".join(words)
  for word in ("naïve", "東京", "🙂", "café"):
    start = text.index(word)
    spans = offsets[(offsets[:, 0] >= start) & (offsets[:, 1] <= start + len(word))]
    assert spans[:, 0].min() == start and spans[:, 1].max() == start + len(word)


def test_special_ids_word_starts_and_pair_separators(layouts):
  bert = tokenizer_lib.from_dir(str(layouts["wordpiece"]))
  assert (bert.pad_id, bert.unk_id, bert.cls_id, bert.sep_id, bert.mask_id) == (0, 1, 2, 3, 4)
  assert bert.special_ids.tolist() == [0, 2, 3, 4] and bert.pair_separator_ids == (3,)
  vocab = bert._tokenizer.get_vocab()  # pylint: disable=protected-access
  assert bert.word_start.shape == (bert.vocab_size,)
  assert all(bert.word_start[i] != p.startswith("##") for p, i in vocab.items()
             if i not in bert.special_ids)
  roberta = tokenizer_lib.from_dir(str(layouts["byte_level_bpe"]))
  assert (roberta.cls_id, roberta.pad_id, roberta.sep_id, roberta.unk_id, roberta.mask_id) == (
      0, 1, 2, 3, 4)
  assert roberta.pair_separator_ids == (2, 2)
  # fairseq's BART (GPT-2 `is_beginning_of_word`): a byte-level piece begins a word only with
  # its space marker 'Ġ'; ',' is its own word for the BERT rule only. WordPiece keeps its rule.
  vocab = roberta._tokenizer.get_vocab()  # pylint: disable=protected-access
  comma, word = vocab[","], next(i for p, i in vocab.items() if p.startswith("Ġ") and len(p) > 2)
  bart = roberta.word_start_for("bart")
  assert roberta.word_start[comma] and not bart[comma] and bart[word]
  assert bart[roberta.special_ids].all()
  np.testing.assert_array_equal(bert.word_start_for("bart"), bert.word_start)
  albert = tokenizer_lib.from_dir(str(layouts["spiece"]))
  assert (albert.pad_id, albert.unk_id, albert.cls_id, albert.sep_id, albert.mask_id) == (
      0, 1, 2, 3, 4)
  assert albert.pair_separator_ids == (3,)


@pytest.mark.parametrize("layout", ["wordpiece", "wordpiece_cased", "byte_level_bpe", "spiece"])
def test_save_then_from_dir_is_the_same_tokenizer(layouts, layout, tmp_path):
  tokenizer = tokenizer_lib.from_dir(str(layouts[layout]))
  tokenizer.save(str(tmp_path))
  again = tokenizer_lib.from_dir(str(tmp_path))
  for a, b in zip(tokenizer.encode(TEXTS), again.encode(TEXTS)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("layout", ["wordpiece", "wordpiece_cased", "byte_level_bpe", "spiece"])
def test_ids_equal_transformers(layouts, layout):
  transformers = pytest.importorskip("transformers")
  directory = str(layouts[layout])
  tokenizer_class = {"wordpiece": transformers.BertTokenizer,
                     "wordpiece_cased": transformers.BertTokenizer,
                     "byte_level_bpe": transformers.RobertaTokenizer,
                     "spiece": transformers.AlbertTokenizer}[layout]
  theirs = tokenizer_class.from_pretrained(directory)
  ours = tokenizer_lib.from_dir(directory)
  for text, ids in zip(TEXTS, ours.encode(TEXTS)):
    assert ids.tolist() == theirs(text, add_special_tokens=False)["input_ids"], text
  assert (ours.cls_id, ours.sep_id, ours.pad_id, ours.unk_id, ours.mask_id) == (
      theirs.cls_token_id, theirs.sep_token_id, theirs.pad_token_id, theirs.unk_token_id,
      theirs.mask_token_id)
  # [CLS] A <separator> B [SEP], as transformers builds a pair.
  a, b = ours.encode(TEXTS[:2])
  assert theirs(TEXTS[0], TEXTS[1])["input_ids"] == [
      ours.cls_id, *a, *ours.pair_separator_ids, *b, ours.sep_id]


def test_our_sentencepiece_exports_as_albert_tokenizer(our_sentencepiece, tmp_path):
  """Our SentencePiece model (ALBERT's id layout) written as spiece.model + tokenizer_config.json:
  transformers' AutoTokenizer and our HFTokenizer give the ids of our own Tokenizer."""
  for name, content in tokenizer_lib.sentencepiece_files(our_sentencepiece).items():
    (tmp_path / name).write_bytes(content)
  ours = sp_tokenizers.Tokenizer(our_sentencepiece)
  exported = tokenizer_lib.from_dir(str(tmp_path))
  expected = [x.tolist() for x in ours.encode(TEXTS)]
  assert [x.tolist() for x in exported.encode(TEXTS)] == expected
  assert (exported.pad_id, exported.unk_id, exported.cls_id, exported.sep_id,
          exported.mask_id) == (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id)
  np.testing.assert_array_equal(exported.special_ids, ours.special_ids)
  transformers = pytest.importorskip("transformers")
  theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  assert type(theirs).__name__ == "AlbertTokenizer"
  assert [theirs(t, add_special_tokens=False)["input_ids"] for t in TEXTS] == expected


def test_sentencepiece_bpe_is_not_exported(sentences):
  """transformers would read a BPE spiece.model as Unigram and tokenize differently."""
  bpe = sp_tokenizers.train_sentencepiece(sentences[:200], vocab_size=200, model_type="bpe")
  with pytest.raises(ConfigError, match="Unigram"):
    tokenizer_lib.sentencepiece_files(bpe)
