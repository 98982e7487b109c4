"""HF tokenizers with the interface of `bertfam_jax.data.tokenizers.Tokenizer` (duck-typed).

Each file layout is built from `tokenizers` components exactly as transformers 5 builds the
matching class (so ids equal transformers' and offsets are characters of the original text):
  tokenizer.json           the serialised tokenizer itself
  vocab.txt                BertTokenizer: WordPiece, BertNormalizer, BertPreTokenizer
  vocab.json + merges.txt  RobertaTokenizer: byte-level BPE (GPT2Tokenizer: the same, with GPT-2's
                           one special token <|endoftext|>, also its padding here)
  spiece.model             AlbertTokenizer: the SentencePiece pieces and scores as a Unigram model
                           behind ALBERT's normalizers (``/'' → ", NFKD + strip accents unless
                           keep_accents, lowercase if do_lower_case, the model's precompiled
                           charsmap), WhitespaceSplit and Metaspace ('▁' prepended); with
                           tokenizer_class XLNetTokenizer the same, cased by default, accents
                           always stripped, <cls> <sep> <pad> <unk> <mask>; with T5Tokenizer, T5's:
                           the precompiled charsmap alone, then `extra_ids` (100) sentinels
                           <extra_id_k> as the last ids in reverse
`tokenizer_config.json` (optional) sets do_lower_case, keep_accents, strip_accents,
tokenize_chinese_chars, add_prefix_space, extra_ids and the special tokens, as it does for
transformers. T5's layout has <pad>, </s> (EOS) and <unk> but no [CLS], [SEP] or [MASK].

Our own SentencePiece models have ALBERT's id layout, so `sentencepiece_files` exports them as an
AlbertTokenizer (do_lower_case false, keep_accents true), or with T5's sentinels
(tokenizer.extra_ids) as a tokenizer.json whose EOS is our [SEP].
"""

from __future__ import annotations

import json
import os
import re
import string
from typing import Sequence

import numpy as np
import tokenizers
from sentencepiece import sentencepiece_model_pb2 as sp_model_pb2
from tokenizers import decoders, normalizers, pre_tokenizers, processors

from bertfam_jax import fileio
from bertfam_jax.config_lib import ConfigError

# Every file a transformers tokenizer directory may hold that we read or copy.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "spiece.model", "vocab.txt", "vocab.json", "merges.txt")
SPECIAL_ROLES = ("cls", "sep", "pad", "unk", "mask", "eos")
# Default special tokens by layout, as the transformers classes define them (EOS: the separator,
# except in T5's layout, which has no [CLS] / [SEP] / [MASK]).
WORDPIECE_SPECIALS = dict(cls="[CLS]", sep="[SEP]", pad="[PAD]", unk="[UNK]", mask="[MASK]")
BYTE_LEVEL_SPECIALS = dict(cls="<s>", sep="</s>", pad="<pad>", unk="<unk>", mask="<mask>")
SPIECE_SPECIALS = dict(cls="[CLS]", sep="[SEP]", pad="<pad>", unk="<unk>", mask="[MASK]")
XLNET_SPECIALS = dict(cls="<cls>", sep="<sep>", pad="<pad>", unk="<unk>", mask="<mask>")
T5_SPECIALS = dict(eos="</s>", pad="<pad>", unk="<unk>")
# GPT-2's one special token ends documents and stands for unknown bytes; it has no padding token,
# and transformers users pad with it, as we do (padding is never attended to nor predicted).
ENDOFTEXT = "<|endoftext|>"
GPT2_SPECIALS = dict(eos=ENDOFTEXT, pad=ENDOFTEXT, unk=ENDOFTEXT)
# tokenizer.json's layout: the first whose cls (T5: eos) and pad tokens the vocabulary has (XLNet's
# also has RoBERTa's <s>, so it comes first).
LAYOUTS = (WORDPIECE_SPECIALS, XLNET_SPECIALS, BYTE_LEVEL_SPECIALS, SPIECE_SPECIALS, T5_SPECIALS,
           GPT2_SPECIALS)
EOD = "<eod>"  # XLNet's end of document (data.tokenizers.EOD)
SENTINEL = re.compile(r"<extra_id_(\d+)>")
_PUNCTUATION = set(string.punctuation)


class HFTokenizer:
  """A `tokenizers.Tokenizer` plus the ids and tables the objectives and fine-tuning need.

  Attributes: vocab_size; pad_id, unk_id, cls_id, sep_id, mask_id (RoBERTa: <s>, </s>, <mask>;
  None where the layout has no such token, as T5's has no [CLS], [SEP] or [MASK]); eos_id (the
  end of a T5 sequence: the eos_token, else the separator); special_ids [k] int32 (the special
  tokens except unk, which is an ordinary token as in ours); word_start [vocab] bool (a piece
  that begins a word: not a WordPiece '##' continuation, or starting with the byte-level 'Ġ' /
  SentencePiece '▁' word marker, or punctuation, or special); pair_separator_ids: what
  separates segment A from B ((sep,) BERT/ALBERT/ELECTRA, (sep, sep) RoBERTa, () without a
  separator); eod_id: XLNet's <eod> or GPT-2's <|endoftext|>, or None; extra_ids, sentinel_start, num_pieces: T5's
  sentinels `<extra_id_k>` = id sentinel_start − k, the last extra_ids ids, after the
  num_pieces pieces (0, vocab_size − 1, vocab_size without sentinels), as
  data.tokenizers.Tokenizer; files: {name: bytes} of the directory it was read from.
  """

  def __init__(self, tokenizer: tokenizers.Tokenizer, specials: dict[str, str],
               files: dict[str, bytes]):
    self._tokenizer = tokenizer
    self.files = files
    self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    ids = {}
    for role, token in specials.items():
      token_id = tokenizer.token_to_id(token)
      if token_id is None:
        raise ConfigError(f"The tokenizer has no {role} token {token!r}; name it in "
                          f"tokenizer_config.json as {role}_token.")
      ids[role] = token_id
    self.cls_id, self.sep_id, self.pad_id, self.unk_id, self.mask_id = (
        ids.get(r) for r in SPECIAL_ROLES[:5])
    self.eos_id = ids.get("eos", self.sep_id)
    self.eod_id = tokenizer.token_to_id(EOD)
    if self.eod_id is None and specials.get("eos") == ENDOFTEXT:   # GPT-2's layout
      self.eod_id = ids["eos"]
    special = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
    special |= {i for role, i in ids.items() if role != "unk"}
    self.special_ids = np.asarray(sorted(special - {self.unk_id}), np.int32)
    separators = 2 if specials.get("cls") == "<s>" else 1
    self.pair_separator_ids = () if self.sep_id is None else (self.sep_id,) * separators
    self.extra_ids = _sentinels(tokenizer.get_vocab(with_added_tokens=True), self.vocab_size)
    self.sentinel_start = self.vocab_size - 1
    self.num_pieces = self.vocab_size - self.extra_ids
    self.word_start = self._word_start_table()

  def _word_start_table(self, punctuation_starts: bool = True) -> np.ndarray:
    """[vocab_size] bool: a WordPiece not prefixed with its continuation mark, else a piece
    with the word marker ('Ġ', '▁') or the unknown token; with `punctuation_starts` a piece of
    punctuation characters too; special tokens always."""
    model = json.loads(self._tokenizer.to_str())["model"]
    continuation = model.get("continuing_subword_prefix") if model["type"] == "WordPiece" else None
    starts = np.zeros(self.vocab_size, bool)
    for piece, i in self._tokenizer.get_vocab(with_added_tokens=True).items():
      if continuation:
        starts[i] = not piece.startswith(continuation)
      else:
        starts[i] = piece.startswith(("Ġ", "▁")) or i == self.unk_id
      starts[i] |= punctuation_starts and all(ch in _PUNCTUATION for ch in piece)
    starts[self.special_ids] = True
    return starts

  def word_start_for(self, rule: str) -> np.ndarray:
    """`word_start`, whatever the rule but 'bart': ALBERT's and XLNet's rules are rules of
    SentencePiece pieces, and an imported tokenizer's own word marker is the one its model was
    trained with; 'bart' (fairseq's GPT-2 `is_beginning_of_word`) drops the punctuation clause,
    so that ',' joined to a word continues it."""
    return self._word_start_table(punctuation_starts=False) if rule == "bart" else self.word_start

  def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
    """One [len_i] int32 array of ids per text; no special tokens are added."""
    return [np.asarray(e.ids, np.int32) for e in self._encode(texts)]

  def encode_with_offsets(self, texts: Sequence[str]
                          ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(ids [n_i] int32, offsets [n_i, 2] int32) per text: each token's [start, end) character
    span in the original text."""
    encodings = self._encode(texts)
    return ([np.asarray(e.ids, np.int32) for e in encodings],
            [np.asarray(e.offsets, np.int32).reshape(-1, 2) for e in encodings])

  def _encode(self, texts):
    return self._tokenizer.encode_batch(list(texts), add_special_tokens=False)

  def decode(self, ids) -> str:
    """Detokenizes [len] ids; pad is dropped, the other special tokens appear as text."""
    ids = [int(i) for i in np.asarray(ids).reshape(-1) if int(i) != self.pad_id]
    return self._tokenizer.decode(ids, skip_special_tokens=False)

  def save(self, directory: str) -> None:
    """Writes the files `from_dir` read (transformers' AutoTokenizer reads them too)."""
    fileio.makedirs(directory)
    for name, content in self.files.items():
      with fileio.open(os.path.join(directory, name), "wb") as f:
        f.write(content)


def _sentinels(vocab: dict[str, int], vocab_size: int) -> int:
  """The number of T5 sentinels `<extra_id_k>` in `vocab`, which must be its last ids in
  reverse (<extra_id_0> the last: seqio's and transformers' layout); 0 without any."""
  found = {int(m.group(1)): i for t, i in vocab.items() if (m := SENTINEL.fullmatch(t))}
  if found != {k: vocab_size - 1 - k for k in range(len(found))}:
    raise ConfigError("The tokenizer's <extra_id_k> sentinels are not its last ids in reverse "
                      "order (<extra_id_0> the last id), T5's layout, which our T5 objective "
                      "and text-to-text fine-tuning assume.")
  return len(found)


def has_tokenizer(path: str) -> bool:
  return any(fileio.exists(os.path.join(path, name))
             for name in ("tokenizer.json", "spiece.model", "vocab.txt", "vocab.json"))


def from_dir(path: str) -> HFTokenizer:
  """The tokenizer of a transformers checkpoint or tokenizer directory."""
  files = {}
  for name in TOKENIZER_FILES:
    if fileio.exists(os.path.join(path, name)):
      with fileio.open(os.path.join(path, name), "rb") as f:
        files[name] = f.read()
  if not has_tokenizer(path):
    raise ConfigError(f"{path} holds no tokenizer: expected tokenizer.json, spiece.model, "
                      f"vocab.txt or vocab.json + merges.txt.")
  return from_files(files)


def from_files(files: dict[str, bytes]) -> HFTokenizer:
  """The tokenizer of a directory's files ({name: content}, names of TOKENIZER_FILES)."""
  options = json.loads(files.get("tokenizer_config.json", b"{}"))
  if options.get("tokenizer_class") in ("OpenAIGPTTokenizer", "OpenAIGPTTokenizerFast"):
    raise ConfigError("OpenAI GPT's tokenizer (ftfy + spaCy, lower-cased BPE with </w>) is not "
                      "read here; import the checkpoint without its tokenizer files, or give a "
                      "tokenizer_path.")
  if "tokenizer.json" in files:
    tokenizer = tokenizers.Tokenizer.from_str(files["tokenizer.json"].decode())
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    defaults = next((s for s in LAYOUTS
                     if s.get("cls", s.get("eos")) in vocab and s["pad"] in vocab),
                    WORDPIECE_SPECIALS)
  elif "spiece.model" in files and options.get("tokenizer_class") == "T5Tokenizer":
    tokenizer = _t5_spiece(files["spiece.model"], options.get("extra_ids", 100),
                           _token_text(options.get("eos_token", T5_SPECIALS["eos"])))
    defaults = T5_SPECIALS
  elif "spiece.model" in files and options.get("tokenizer_class") == "XLNetTokenizer":
    # transformers 5's XLNetTokenizer: cased by default, accents always stripped.
    tokenizer = _spiece(files["spiece.model"],
                        {"do_lower_case": False, **options, "keep_accents": False})
    defaults = XLNET_SPECIALS
  elif "spiece.model" in files:
    tokenizer, defaults = _spiece(files["spiece.model"], options), SPIECE_SPECIALS
  elif "vocab.txt" in files:
    tokenizer, defaults = _wordpiece(files["vocab.txt"], options), WORDPIECE_SPECIALS
  else:
    tokenizer = _byte_level_bpe(files["vocab.json"], files["merges.txt"], options)
    defaults = (GPT2_SPECIALS if options.get("tokenizer_class") == "GPT2Tokenizer"
                else BYTE_LEVEL_SPECIALS)
  named = {role: options.get(f"{role}_token", defaults.get(role)) for role in SPECIAL_ROLES}
  if defaults is GPT2_SPECIALS:   # its config says pad_token null
    named["pad"] = named["pad"] or named["eos"]
  specials = {role: _token_text(token) for role, token in named.items() if token is not None}
  tokenizer.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                                for t in specials.values()])
  return HFTokenizer(tokenizer, specials, files)


def _token_text(token) -> str:
  """A special token of tokenizer_config.json: a string or an AddedToken dict."""
  return token["content"] if isinstance(token, dict) else token


def _lines(content: bytes) -> list[str]:
  """The lines of a vocabulary file, split at '\\n' only (as transformers' load_vocab)."""
  lines = content.decode("utf-8").split("\n")
  return lines[:-1] if lines and not lines[-1] else lines


def _wordpiece(vocab_txt: bytes, options: dict) -> tokenizers.Tokenizer:
  """transformers' BertTokenizer."""
  vocab = {token.rstrip("\r"): i for i, token in enumerate(_lines(vocab_txt))}
  tokenizer = tokenizers.Tokenizer(tokenizers.models.WordPiece(
      vocab, unk_token=_token_text(options.get("unk_token", "[UNK]"))))
  tokenizer.normalizer = normalizers.BertNormalizer(
      clean_text=True, handle_chinese_chars=options.get("tokenize_chinese_chars", True),
      strip_accents=options.get("strip_accents"), lowercase=options.get("do_lower_case", True))
  tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tokenizer.decoder = decoders.WordPiece(prefix="##")
  return tokenizer


def _byte_level_bpe(vocab_json: bytes, merges_txt: bytes, options: dict) -> tokenizers.Tokenizer:
  """transformers' RobertaTokenizer (its RobertaProcessing trims the offsets of 'Ġ' tokens to
  the word)."""
  merges = [tuple(line.split(" ")) for line in _lines(merges_txt)
            if line and not line.startswith("#version")]
  tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE(
      json.loads(vocab_json), merges, continuing_subword_prefix="", end_of_word_suffix="",
      fuse_unk=False))
  prefix_space = options.get("add_prefix_space", False)
  tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix_space)
  tokenizer.decoder = decoders.ByteLevel()
  tokenizer.post_processor = processors.ByteLevel(
      trim_offsets=options.get("trim_offsets", True))
  return tokenizer


def _spiece(model_proto: bytes, options: dict) -> tokenizers.Tokenizer:
  """transformers' AlbertTokenizer from a SentencePiece model (its SentencePieceExtractor)."""
  proto = sp_model_pb2.ModelProto.FromString(model_proto)
  tokenizer = _unigram(proto, [])
  steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
  if not options.get("keep_accents", False):
    steps += [normalizers.NFKD(), normalizers.StripAccents()]
  if options.get("do_lower_case", True):
    steps.append(normalizers.Lowercase())
  if proto.normalizer_spec.precompiled_charsmap:
    steps.append(normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap))
  tokenizer.normalizer = normalizers.Sequence(steps)
  return tokenizer


def _t5_spiece(model_proto: bytes, extra_ids: int, eos: str) -> tokenizers.Tokenizer:
  """transformers' T5Tokenizer from a SentencePiece model: the pieces, then the sentinels
  <extra_id_{extra_ids − 1}> … <extra_id_0> as special tokens; only the model's precompiled
  charsmap normalises; `eos` is appended to every sequence (and between a pair) when special
  tokens are added. The unknown id is the model's (transformers hard-codes 2, T5's)."""
  proto = sp_model_pb2.ModelProto.FromString(model_proto)
  tokenizer = _unigram(proto, [f"<extra_id_{k}>" for k in reversed(range(extra_ids))])
  if proto.normalizer_spec.precompiled_charsmap:
    tokenizer.normalizer = normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap)
  tokenizer.add_special_tokens([tokenizers.AddedToken(eos, special=True, normalized=False)])
  tokenizer.post_processor = processors.TemplateProcessing(
      single=["$A", eos], pair=["$A", eos, "$B", eos],
      special_tokens=[(eos, tokenizer.token_to_id(eos))])
  return tokenizer


def _unigram(proto, sentinels: list[str]) -> tokenizers.Tokenizer:
  """The SentencePiece model's pieces and scores (then `sentinels`, score 0) as a Unigram model
  behind WhitespaceSplit and Metaspace ('▁' prepended), its control and user-defined pieces and
  the sentinels added tokens (control pieces and sentinels special); no normaliser."""
  tokenizer = tokenizers.Tokenizer(tokenizers.models.Unigram(
      [(p.piece, p.score) for p in proto.pieces] + [(t, 0.0) for t in sentinels],
      unk_id=proto.trainer_spec.unk_id, byte_fallback=False))
  tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.WhitespaceSplit(),
      pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")])
  tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
  kinds = sp_model_pb2.ModelProto.SentencePiece
  tokenizer.add_tokens([tokenizers.AddedToken(p.piece, special=p.type == kinds.CONTROL,
                                              normalized=False)
                        for p in proto.pieces if p.type in (kinds.CONTROL, kinds.USER_DEFINED)])
  tokenizer.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                                for t in sentinels])
  return tokenizer


def sentencepiece_files(model_proto: bytes, extra_ids: int = 0,
                        normalize: str = "") -> dict[str, bytes]:
  """One of our SentencePiece models (ALBERT's id layout, data/tokenizers.py) as the files of a
  transformers tokenizer directory, cased and with accents as the model was trained, or, with
  `tokenizer.normalize='albert'`, lower-cased without accents (`from_files` reads them):
    extra_ids = 0  an AlbertTokenizer: spiece.model + tokenizer_config.json;
    extra_ids > 0  T5's sentinels after the pieces (<extra_id_0> the last id): tokenizer.json
                   (_t5_spiece with EOS [SEP], our T5's) + tokenizer_config.json naming the
                   generic PreTrainedTokenizerFast, since transformers' T5Tokenizer rebuilds
                   the model with T5's unknown id 2 (ours is 1), + spiece.model for
                   sentencepiece users.
  transformers reads spiece.model as a Unigram model, so a SentencePiece BPE model would
  tokenize differently there: ConfigError."""
  if sp_model_pb2.ModelProto.FromString(model_proto).trainer_spec.model_type != (
      sp_model_pb2.TrainerSpec.UNIGRAM):
    raise ConfigError("transformers reads spiece.model as a Unigram model, so this SentencePiece "
                      "BPE model would give other ids there; export a unigram tokenizer "
                      "(tokenizer.model_type=unigram) or ship the .model file for sentencepiece.")
  specials = {f"{role}_token": SPIECE_SPECIALS[role] for role in SPECIAL_ROLES[:5]}
  if extra_ids and normalize:
    raise ConfigError(f"tokenizer.normalize={normalize!r} with T5's sentinels: the exported "
                      f"tokenizer would not normalize; export it with the .model file instead.")
  if extra_ids:
    tokenizer = _t5_spiece(model_proto, extra_ids, SPIECE_SPECIALS["sep"])
    config = dict(tokenizer_class="PreTrainedTokenizerFast", eos_token=SPIECE_SPECIALS["sep"],
                  extra_ids=extra_ids, **specials)
    return {"tokenizer.json": tokenizer.to_str().encode(), "spiece.model": model_proto,
            "tokenizer_config.json": json.dumps(config, indent=2).encode()}
  albert = normalize == "albert"
  config = dict(tokenizer_class="AlbertTokenizer", do_lower_case=albert, keep_accents=not albert,
                **specials, bos_token=SPIECE_SPECIALS["cls"], eos_token=SPIECE_SPECIALS["sep"])
  return {"spiece.model": model_proto,
          "tokenizer_config.json": json.dumps(config, indent=2).encode()}
