"""Tokenizers: a SentencePiece model with BERT's special tokens, loaded or trained and cached.

Id layout of the models trained here (ALBERT's released SentencePiece layout):
  0 <pad>, 1 <unk>, 2 [CLS], 3 [SEP], 4 [MASK]; no BOS/EOS pieces; then the pieces of
  `tokenizer.user_symbols` (XLNet's `<eod>`, the end-of-document token: 5).
RoBERTa's `<s>` / `</s>` map onto [CLS] / [SEP] (see `packing.full_sentences`); T5's EOS is [SEP]
(`eos_id`) and its decoder BOS is <pad> (seqio's `bos_id=0`).
T5's sentinels (`tokenizer.extra_ids`, 100 in T5) are ids appended after the SentencePiece pieces
in reverse, as seqio's `reverse_extra_ids`: `<extra_id_0>` is the last id (`sentinel_start`),
`<extra_id_k>` = sentinel_start − k.
"""

from __future__ import annotations

import hashlib
import io
import os
import string
import time
import unicodedata
from typing import Sequence

from absl import logging
import ml_collections
import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as sp_model_pb2
from sentencepiece import sentencepiece_pb2

from bertfam_jax import config_lib, fileio
from bertfam_jax.data import sources

CLS, SEP, MASK = "[CLS]", "[SEP]", "[MASK]"
EOD = "<eod>"  # XLNet's end of document, where `tokenizer.user_symbols` asks for it
_NUM_THREADS = min(os.cpu_count() or 1, 16)
_PRINTABLE_ASCII = "".join(chr(c) for c in range(33, 127))
# Bump when the training recipe below changes, so cached models are not reused across recipes.
_RECIPE_VERSION = 1


# The references' `special_pieces`: one punctuation character (the string in both codebases
# lists '"' twice and has no apostrophe; ALBERT also adds '€' and '£' as bytes, which never equal
# a Python 3 piece).
_REFERENCE_PUNCTUATION = frozenset('!"#$%&"()*+,-./:;?@[\\]^_`{|}~')
_ENGLISH_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyz")
WORD_START_RULES = ("bert", "albert", "xlnet", "bart")
# `tokenizer.normalize`: what a text goes through before SentencePiece, in training and encoding.
NORMALIZERS = config_lib.NORMALIZERS


def normalize_text(text: str, normalize: str) -> tuple[str, np.ndarray]:
  """(`text` as the `normalize` rule gives it, [len(result)] int32: the index in `text` of the
  character each character came from).

  '': unchanged. 'albert': ALBERT's `preprocess_text(lower=True)` (tokenization.py; its
  create_pretraining_data.py and run_classifier.py lower-case by default): whitespace runs become
  one space and the ends are stripped, NFKD, combining marks dropped, lower-cased; character by
  character, so that each output character knows its source (the whole string's lower() differs
  only for a word-final Greek capital sigma).
  """
  if not normalize:
    return text, np.arange(len(text), dtype=np.int32)
  chars, origins = [], []
  space = None   # where a pending run of whitespace began
  for i, ch in enumerate(text):
    if ch.isspace():   # str.split()'s whitespace
      space = i if space is None else space
      continue
    if space is not None and chars:
      chars.append(" ")
      origins.append(space)
    space = None
    for c in unicodedata.normalize("NFKD", ch):
      if not unicodedata.combining(c):
        for lowered in c.lower():
          chars.append(lowered)
          origins.append(i)
  return "".join(chars), np.asarray(origins, np.int32)


def starts_word(piece: str, rule: str) -> bool:
  """Whether SentencePiece `piece` begins a word by the reference rule `rule`:
  - 'bart' (fairseq's GPT-2 BPE `is_beginning_of_word`: the piece decodes with a leading
    space): it starts with '▁' or '<'; punctuation joined to a word ('▁Hello' ',') continues it;
  - 'xlnet' (xlnet/data_utils.py `_is_start_piece`): it starts with '▁' or '<', or is one
    punctuation character;
  - 'albert' (albert/create_pretraining_data.py `_is_start_piece_sp`): the same, or any of its
    characters is outside [a-z] (lower-cased) and that punctuation, so that digits and non-ASCII
    pieces ("for foreign characters, we always treat them as a whole piece") each start a word,
    while a piece of several punctuation characters ('...', '),') continues one.
  ('bert', `Tokenizer.word_start`, is a table, not a rule of one piece: it marks special pieces.)
  """
  if piece.startswith(("▁", "<")):
    return True
  if rule == "bart":
    return False
  if piece in _REFERENCE_PUNCTUATION:
    return True
  if rule == "xlnet":
    return False
  if rule == "albert":
    return not all(ch.lower() in _ENGLISH_LETTERS or ch in _REFERENCE_PUNCTUATION
                   for ch in piece)
  raise ValueError(f"word start rule {rule!r}: choose one of {WORD_START_RULES}")


class Tokenizer:
  """A SentencePiece model plus the ids and word-start table the objectives need.

  Attributes:
    vocab_size: number of ids: the SentencePiece pieces, then `extra_ids` sentinels.
    extra_ids: sentinel ids after the pieces (T5: 100; 0 for the BERT family).
    sentinel_start: the id of `<extra_id_0>` (vocab_size − 1; sentinel k is sentinel_start − k).
    eos_id: end of sequence for sequence-to-sequence targets ([SEP]).
    eod_id: the `<eod>` piece, or None when the vocabulary has none (`packing.eod_id`).
    pad_id, unk_id, cls_id, sep_id, mask_id: special ids.
    special_ids: [num_special] int32, the control and user-defined pieces (pad, [CLS], [SEP],
      [MASK]); `<unk>` is an ordinary, maskable token as BERT's [UNK] is.
    word_start: [vocab_size] bool, True where a piece begins a word by BERT's rule (a WordPiece
      not prefixed with ##, punctuation always its own word): it starts with '▁', or is a
      special piece, or is punctuation; whole-word, span and n-gram masking use it.
      `word_start_for(rule)` gives ALBERT's, XLNet's and BART's rules.
    pair_separator_ids: what separates the two segments of a pair, (sep_id,) as in BERT's
      `[CLS] A [SEP] B [SEP]` (RoBERTa's `</s></s>` tokenizers have two).
  """

  def __init__(self, model_proto: bytes, extra_ids: int = 0, normalize: str = ""):
    if normalize not in NORMALIZERS:
      raise config_lib.ConfigError(f"tokenizer.normalize={normalize!r}; choose one of "
                                   f"{NORMALIZERS}.")
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    self.model_proto = model_proto
    self.normalize = normalize
    self.num_pieces = self._sp.get_piece_size()
    self.extra_ids = extra_ids
    self.vocab_size = self.num_pieces + extra_ids
    self.sentinel_start = self.vocab_size - 1
    self.pad_id = self._sp.pad_id()
    self.unk_id = self._sp.unk_id()
    self.cls_id, self.sep_id, self.mask_id = (self._special_id(p) for p in (CLS, SEP, MASK))
    self.eos_id = self.sep_id
    self.eod_id = self.piece_id(EOD)
    if self.pad_id < 0:
      raise config_lib.ConfigError("The SentencePiece model has no pad piece (pad_id=-1); "
                                   "train it with --pad_id=0.")
    piece_types = [p.type for p in sp_model_pb2.ModelProto.FromString(model_proto).pieces]
    special_types = (sp_model_pb2.ModelProto.SentencePiece.CONTROL,
                     sp_model_pb2.ModelProto.SentencePiece.USER_DEFINED)
    self.special_ids = np.asarray(
        [i for i, t in enumerate(piece_types) if t in special_types]
        + list(range(self.num_pieces, self.vocab_size)), np.int32)
    self.word_start = self._word_start_table()
    self.pair_separator_ids = (self.sep_id,)
    self._splits = self._digit_comma_splits() if normalize == "albert" else {}

  def _digit_comma_splits(self) -> dict[int, list[tuple[int, int]]]:
    """{id of a piece ending in a digit and ',': [(id, surface length)] of the pieces ALBERT's
    `encode_pieces` replaces it with}: the piece without its ',' (and its '▁'), encoded again,
    keeping the original's word start, then ','."""
    splits = {}
    for i in range(self.num_pieces):
      piece = self._sp.id_to_piece(i)
      if len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit():
        parts = self._sp.encode_as_pieces(piece[:-1].replace("▁", ""))
        if piece[0] != "▁" and parts and parts[0][0] == "▁":
          parts = parts[1:] if len(parts[0]) == 1 else [parts[0][1:], *parts[1:]]
        splits[i] = [(self._sp.piece_to_id(q), len(q.replace("▁", ""))) for q in [*parts, ","]]
    return splits

  @classmethod
  def from_file(cls, path: str, extra_ids: int = 0, normalize: str = "") -> "Tokenizer":
    """The SentencePiece model file at `path`; a ConfigError naming it when it is not one."""
    if fileio.isdir(path):
      raise config_lib.ConfigError(f"{path} is a directory, not a SentencePiece model file; a "
                                   f"transformers tokenizer directory needs tokenizer.kind='hf'.")
    with fileio.open(path, "rb") as f:
      proto = f.read()
    try:   # parsed here first: SentencePiece logs to stderr, and accepts an empty model
      pieces = len(sp_model_pb2.ModelProto.FromString(proto).pieces)
    except Exception:  # pylint: disable=broad-except  (protobuf's DecodeError, by version)
      pieces = 0
    if not pieces:
      raise config_lib.ConfigError(
          f"{path} is not a SentencePiece model ({len(proto):,} bytes that hold no pieces); pass "
          f"a .model file that spm_train wrote, or leave tokenizer.model_path empty to train one "
          f"on the corpus.")
    return cls(proto, extra_ids, normalize)

  def pieces(self) -> list[str]:
    """Every piece's text, by id ('▁' marking a word start), then '' for each extra id."""
    return [self._sp.id_to_piece(i) for i in range(self.num_pieces)] + [""] * self.extra_ids

  def piece_id(self, piece: str) -> int | None:
    """The id of `piece`, or None when the vocabulary does not have it."""
    piece_id = self._sp.piece_to_id(piece)  # the <unk> id for a piece it does not have
    return piece_id if self._sp.id_to_piece(piece_id) == piece else None

  def _special_id(self, piece: str) -> int:
    piece_id = self._sp.piece_to_id(piece)
    if piece_id == self._sp.unk_id():
      raise config_lib.ConfigError(
          f"The SentencePiece model has no {piece} piece; train it with "
          f"--user_defined_symbols={CLS},{SEP},{MASK} (or leave tokenizer.model_path empty).")
    return piece_id

  def _word_start_table(self) -> np.ndarray:
    punctuation = set(string.punctuation)
    starts = np.zeros(self.vocab_size, bool)
    for i in range(self.num_pieces):
      piece = self._sp.id_to_piece(i)
      starts[i] = (piece.startswith("▁") or self._sp.is_unknown(i) or
                   all(ch in punctuation for ch in piece))
    starts[self.special_ids] = True
    return starts

  def word_start_for(self, rule: str) -> np.ndarray:
    """[vocab_size] bool: the pieces that begin a word by `rule` (WORD_START_RULES): 'bert' is
    `word_start`; 'albert', 'xlnet' and 'bart' are `starts_word` of each piece, special pieces
    and sentinels included."""
    if rule == "bert":
      return self.word_start
    starts = np.zeros(self.vocab_size, bool)
    starts[:self.num_pieces] = [starts_word(self._sp.id_to_piece(i), rule)
                                for i in range(self.num_pieces)]
    starts[self.special_ids] = True
    return starts

  def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
    """Tokenizes a batch of strings (multi-threaded inside SentencePiece).

    Returns:
      One [len_i] int32 array of piece ids per text; no special tokens are added.
    """
    if self.normalize:
      texts = [normalize_text(text, self.normalize)[0] for text in texts]
    ids = [np.asarray(x, np.int32)
           for x in self._sp.encode(list(texts), out_type=int, num_threads=_NUM_THREADS)]
    if self._splits:
      ids = [self._split_digit_commas(x) for x in ids]
    return ids

  def encode_with_offsets(self, texts: Sequence[str]
                          ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """`encode`, plus where each piece lies in its text.

    Returns:
      (ids, offsets): per text [len_i] int32 piece ids (as `encode`) and [len_i, 2] int32 character
      offsets [start, end) into the ORIGINAL text, so that text[start:end] is the piece's surface
      without the whitespace its '▁' marker stands for ('▁dog' -> 'dog'; a bare '▁' -> '', an
      empty span where the next word begins). Normalisation is undone: a piece of a NFKC-expanded
      character ('ﬁ' -> 'f', 'i') spans the original character or nothing.
    """
    normalized = [normalize_text(text, self.normalize) for text in texts]
    protos = self._sp.encode([text for text, _ in normalized], out_type="serialized_proto",
                             num_threads=_NUM_THREADS)
    ids, offsets = [], []
    for (text, source), proto in zip(normalized, protos):
      pieces = sentencepiece_pb2.SentencePieceText.FromString(proto).pieces
      byte_spans = np.asarray([(p.begin, p.end) for p in pieces], np.int64).reshape(-1, 2)
      spans = np.searchsorted(_char_byte_starts(text), byte_spans).astype(np.int32)
      for span in spans:   # SentencePiece's surface of '▁word' includes the space before it
        while span[0] < span[1] and text[span[0]].isspace():
          span[0] += 1
      piece_ids = np.asarray([p.id for p in pieces], np.int32)
      if self._splits:
        piece_ids, spans = self._split_digit_commas(piece_ids, spans)
      if self.normalize:   # spans of the normalized text → of the original
        ends = np.where(spans[:, 1] > spans[:, 0], source[np.maximum(spans[:, 1] - 1, 0)] + 1,
                        0)
        starts = source[np.minimum(spans[:, 0], len(source) - 1)] if len(source) else spans[:, 0]
        spans = np.stack([starts, np.where(spans[:, 1] > spans[:, 0], ends, starts)], 1)
        spans = spans.astype(np.int32).reshape(-1, 2)
      ids.append(piece_ids)
      offsets.append(spans)
    return ids, offsets

  def _split_digit_commas(self, piece_ids: np.ndarray, spans: np.ndarray | None = None):
    """ALBERT's `encode_pieces` on ids [n]: each piece of `_splits` replaced by its parts →
    [n'] ids, and with `spans` [n, 2] also their [n', 2] spans, laid end to end over the piece's
    surface (the ',' its last character)."""
    with_spans = spans is not None
    if not np.isin(piece_ids, list(self._splits)).any():
      return (piece_ids, spans) if with_spans else piece_ids
    new_ids, new_spans = [], []
    for i, (start, end) in zip(piece_ids.tolist(),
                               spans.tolist() if with_spans else [(0, 0)] * len(piece_ids)):
      for part, length in self._splits.get(i, [(i, end - start)]):
        new_ids.append(part)
        new_spans.append((start, min(start + length, end)))
        start = min(start + length, end)
    ids = np.asarray(new_ids, np.int32)
    return (ids, np.asarray(new_spans, np.int32).reshape(-1, 2)) if with_spans else ids

  def decode(self, ids) -> str:
    """Detokenizes [len] ids; pad is dropped, [CLS]/[SEP]/[MASK] appear as text, sentinels as
    `<extra_id_k>`."""
    text, run = [], []
    for i in (int(i) for i in np.asarray(ids).reshape(-1)):
      if i < self.num_pieces:
        run.append(i)
        continue
      text.append(self._sp.decode(run))
      text.append(f"<extra_id_{self.sentinel_start - i}>")
      run = []
    text.append(self._sp.decode(run))
    return " ".join(t for t in text if t)


def _char_byte_starts(text: str) -> np.ndarray:
  """[len(text) + 1] int64: the UTF-8 byte offset where each character starts, then the length."""
  code_points = np.frombuffer(text.encode("utf-32-le"), np.uint32)
  byte_lengths = 1 + (code_points >= 0x80) + (code_points >= 0x800) + (code_points >= 0x10000)
  return np.concatenate([[0], np.cumsum(byte_lengths, dtype=np.int64)])


def training_sentences(documents: Sequence[str], max_sentences: int) -> list[str]:
  """The first `max_sentences` sentences of the documents, in document order (deterministic)."""
  sentences = []
  for i in range(len(documents)):
    sentences.extend(sources.split_sentences(documents[i]))
    if len(sentences) >= max_sentences:
      break
  return sentences[:max_sentences]


def train_sentencepiece(sentences: Sequence[str], vocab_size: int, model_type: str,
                        user_symbols: Sequence[str] = ()) -> bytes:
  """Trains a SentencePiece model with the layout above (`user_symbols` after [MASK]) and returns
  its serialized proto.

  Deterministic: the sentences are given explicitly (no sampling: input_sentence_size covers
  all of them, no shuffling) and SentencePiece's own generator is seeded.
  """
  spm.set_random_generator_seed(0)
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model,
        vocab_size=vocab_size, model_type=model_type,
        pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
        user_defined_symbols=[CLS, SEP, MASK, *user_symbols],
        # Printable ASCII always gets a piece, so rare punctuation ('?', '~') never becomes <unk>
        # in small corpora (character_coverage alone drops the rarest characters); a user
        # symbol of one character (ALBERT's punctuation) has its piece already.
        required_chars="".join(c for c in _PRINTABLE_ASCII if c not in user_symbols),
        input_sentence_size=len(sentences), shuffle_input_sentence=False,
        max_sentence_length=1 << 14, num_threads=_NUM_THREADS, minloglevel=2)
  except RuntimeError as e:
    # SentencePiece refuses a vocab the corpus cannot fill: "Vocabulary size is too high ...".
    raise config_lib.ConfigError(
        f"SentencePiece training failed for vocab_size={vocab_size} on {len(sentences)} "
        f"sentences: {e}. Lower --config.model.vocab_size or use a larger corpus.") from None
  return model.getvalue()


def cache_path(config: ml_collections.ConfigDict) -> str:
  """Where a trained tokenizer for this (source, vocab, type, sample size, user symbols,
  normalizer) is cached (keys without user symbols or a normalizer are those of the models
  trained before they existed)."""
  normalize = config.tokenizer.get("normalize", "")
  key = "|".join([sources.source_identity(config.data), config.tokenizer.kind,
                  str(num_pieces(config)), config.tokenizer.model_type,
                  str(config.tokenizer.train_max_sentences), str(_RECIPE_VERSION)]
                 + list(user_symbols(config)) + ([f"normalize={normalize}"] if normalize else []))
  digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
  return os.path.join(sources.cache_root(config.data), "tokenizers", f"{digest}.model")


def user_symbols(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """`tokenizer.user_symbols` as a tuple of pieces."""
  return tuple(s.strip() for s in config.tokenizer.get("user_symbols", "").split(",") if s.strip())


def num_pieces(config: ml_collections.ConfigDict) -> int:
  """SentencePiece pieces to train: `tokenizer.vocab_size`, or model.vocab_size − extra_ids (T5's
  32,000 pieces + 100 sentinels in a 32,128-row table set tokenizer.vocab_size=32000)."""
  t = config.tokenizer
  return t.get("vocab_size", 0) or config.model.vocab_size - t.get("extra_ids", 0)


def _check_vocab(tokenizer: Tokenizer, config: ml_collections.ConfigDict, origin: str) -> None:
  missing = [s for s in user_symbols(config) if tokenizer.piece_id(s) is None]
  if missing:
    raise config_lib.ConfigError(
        f"The tokenizer at {origin} has no {', '.join(missing)} piece, which "
        f"tokenizer.user_symbols={config.tokenizer.user_symbols!r} asks for; train it with "
        f"--user_defined_symbols={CLS},{SEP},{MASK},{config.tokenizer.user_symbols} (or leave "
        f"tokenizer.model_path empty), or set --config.tokenizer.user_symbols=''.")
  if tokenizer.num_pieces != num_pieces(config) or tokenizer.vocab_size > config.model.vocab_size:
    raise config_lib.ConfigError(
        f"The tokenizer at {origin} has {tokenizer.num_pieces} pieces (+ {tokenizer.extra_ids} "
        f"extra ids) but the config asks for {num_pieces(config)} pieces in "
        f"model.vocab_size={config.model.vocab_size} rows; set --config.model.vocab_size="
        f"{tokenizer.vocab_size} (and --config.tokenizer.vocab_size) or use another tokenizer.")


def is_available(config: ml_collections.ConfigDict) -> bool:
  """Whether `load_or_train` finds its tokenizer (a model_path, or one cached) or trains one."""
  return bool(config.tokenizer.model_path) or config.tokenizer.kind != "sentencepiece" or (
      fileio.exists(cache_path(config)))


def load_or_train(config: ml_collections.ConfigDict, documents: Sequence[str],
                  workdir: str = "") -> Tokenizer:
  """The configured tokenizer: `tokenizer.model_path` if set, else one trained and cached.

  Args:
    config: the full config (reads `tokenizer.*`, `model.vocab_size`, `data.*`).
    documents: the training documents, used only when a tokenizer has to be trained (from at
      most `tokenizer.train_max_sentences` of their sentences).

  Returns:
    A Tokenizer whose vocab size equals `model.vocab_size`.
  """
  kind = config.tokenizer.kind
  if kind == "hf":
    return _load_hf(config, workdir)
  if kind != "sentencepiece":
    raise config_lib.ConfigError(f"tokenizer.kind={kind!r}; choose sentencepiece (trained or "
                                 f"loaded here) or hf (a checkpoint's tokenizer files).")

  path = config.tokenizer.model_path or cache_path(config)
  if config.tokenizer.model_path and not fileio.exists(path):
    raise config_lib.ConfigError(
        f"tokenizer.model_path={path!r} does not exist; fix the path or leave "
        f"--config.tokenizer.model_path empty to train one on the corpus.")
  extra_ids = config.tokenizer.get("extra_ids", 0)
  normalize = config.tokenizer.get("normalize", "")
  if not fileio.exists(path):
    # One process trains; the others sharing the cache wait, then load what it wrote.
    with fileio.exclusive(path):
      if not fileio.exists(path):
        _train_into(path, config, documents, normalize)
  tokenizer = Tokenizer.from_file(path, extra_ids, normalize)
  _check_vocab(tokenizer, config, path)
  return tokenizer


def _train_into(path: str, config: ml_collections.ConfigDict, documents: Sequence[str],
                normalize: str) -> None:
  """Trains the configured SentencePiece model on `documents`, their text normalized as
  `normalize` says, and writes it to `path`."""
  start = time.time()
  sentences = [normalize_text(s, normalize)[0] for s in
               training_sentences(documents, config.tokenizer.train_max_sentences)]
  proto = train_sentencepiece(sentences, num_pieces(config), config.tokenizer.model_type,
                              user_symbols(config))
  fileio.write_atomically(path, proto)
  logging.info("Trained a %d-piece %s SentencePiece model on %d sentences in %.1f s: %s",
               num_pieces(config), config.tokenizer.model_type, len(sentences),
               time.time() - start, path)


def _load_hf(config: ml_collections.ConfigDict, workdir: str):
  """`tokenizer.kind='hf'`: the transformers tokenizer files in the directory
  `tokenizer.model_path` (WordPiece, byte-level BPE or SentencePiece; `bertfam_jax.hf`), e.g.
  `<imported workdir>/tokenizer` to continue pre-training an imported checkpoint. A relative
  path is looked up in `workdir` first (an imported workdir names its own 'tokenizer')."""
  path = config.tokenizer.model_path
  if path and workdir and not fileio.is_absolute(path) and fileio.isdir(os.path.join(workdir, path)):
    path = os.path.join(workdir, path)
  if not path or not fileio.isdir(path):
    raise config_lib.ConfigError(
        f"tokenizer.kind='hf' needs tokenizer.model_path to be a directory of tokenizer files; "
        f"got {path!r}. For an imported checkpoint pass --config.tokenizer.model_path="
        f"<its workdir>/tokenizer.")
  # Imported here: it needs the `tokenizers` package (the [hf] extra).
  from bertfam_jax.data import hf_tokenizer  # pylint: disable=g-import-not-at-top
  tokenizer = hf_tokenizer.from_dir(path)
  if tokenizer.vocab_size > config.model.vocab_size:
    raise config_lib.ConfigError(
        f"The tokenizer at {path} has {tokenizer.vocab_size} pieces, more than "
        f"model.vocab_size={config.model.vocab_size}; use the checkpoint's own model section.")
  return tokenizer
