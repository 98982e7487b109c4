"""Span sources: named-entity and noun-phrase units for whole-unit masking (ERNIE 1.0's entity
and phrase levels, SpanBERT's NER spans; `objectives.noise.select_units`).

No NER model or chunker installs offline (spaCy's and NLTK's models come from hubs), so both
sources are lexicon-driven proxies built from WordNet 3.0 (`bertfam_jax.data.wordnet`).

entities: maximal runs of words that are
  (a) a capitalised WordNet instance name ('Albert Einstein', 'New York', 'World War II'),
      matched case-sensitively as a word sequence, or
  (b) capitalised, not closed-class, not a number, and either not sentence-initial or unknown
      to WordNet in lower case (a sentence-opening 'Dogs' is no entity, 'Einstein' is);
  and a lower-case connective ('of', 'de', 'van', ...) between two entity words joins them
  ('Bank of England').

noun_phrases: a regular-expression chunker over lexicon tags, in the spirit of the spaCy
noun_chunks SpanBERT used: maximal runs of DET? (ADJ | NOUN | NUM)* NOUN, single nouns
included. A word's tag is the first that applies of
  1. its closed-class tag (determiners, numerals, prepositions; pronouns, conjunctions,
     auxiliaries and particles as OTHER: fixed lists below), NUM for digits;
  2. NOUN for a capitalised word under entity rule (b);
  3. OTHER for punctuation and lower-case single letters (debris of 'i.e.');
  4. its most frequent WordNet part of speech, inflections included ('dogs', 'older'), except
     that inside a run led by DET, NUM or PREP (DET ADJ* _) a verb or adverb gives way to the
     word's noun or adjective reading ('the use', 'a small change', 'in demand');
  5. NOUN for an unknown word;
and every word of a WordNet multiword noun ('ice cream', 'body of water', 'Supreme Court')
becomes NOUN, unless a common (not instance) multiword noun opens or closes with a
closed-class word ('might-have-been', 'run-in').

Both are proxies with almost no context: 'Sharp rise in prices' tags 'rise' as a verb (its
most frequent use; no determiner or preposition leads it), and sentence boundaries are guessed
from [CLS] / [SEP] and '.', '!', '?'.

Contract (`SpanSource`): `fn(input_ids [n, L] int32, maskable [n, L] bool, word_start [n, L]
bool) -> unit_ids [n, L] int32`; 0 outside units, every maximal run of one positive id is one
unit, units hold whole words only and never a non-maskable token. A word is a maskable token
that is word-initial (`Tokenizer.word_start`) or follows a non-maskable one, plus the maskable
non-initial tokens after it (`objectives.noise.word_starts`).

How words are matched at batch time, without decoding: a word's key is its alphanumeric
characters ('(New' -> 'New', "dog's" -> 'dogs'), so punctuation glued to a word by the
tokenizer does not matter. Keys are compared by a polynomial hash in uint64,
H(c_0..c_m) = sum_i mix(c_i) * B^i mod 2^64, which is additive over a word's pieces
(H(piece at char offset o) = B^o * H(piece)); so per-piece hashes are tabulated once per
tokenizer, a batch's word hashes are one gather, multiply and segment sum, and lexicon keys
are hashed from their strings, independently of how the tokenizer splits them. A word sequence
hashes by Horner's rule over its word hashes. Lookups are `np.searchsorted` in sorted tables.
Lexicon entries are split into keys at non-alphanumeric characters ('New_York' -> New, York;
'well-known' -> well, known), as the tokenizer splits words at punctuation pieces.
"""

from __future__ import annotations

import functools
import re
from typing import Callable, NamedTuple

import numpy as np
from sentencepiece import sentencepiece_model_pb2 as sp_model_pb2

from bertfam_jax import config_lib
from bertfam_jax.data import tokenizers
from bertfam_jax.data import wordnet

SpanSource = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]

# Word tags for the chunker; VERB, ADV and the closed classes other than DET, NUM and PREP are
# OTHER. PREP acts as OTHER in the grammar; it only leads runs in `_tags`.
OTHER, DET, NUM, ADJ, NOUN, PREP = range(6)
_POS_TAG = {"noun": NOUN, "adj": ADJ, "verb": OTHER, "adv": OTHER}
_MODIFIER_TAGS = (ADJ, NOUN, NUM)

# Closed classes, which take precedence over WordNet (where 'a', 'can', 'does', 'may' and 'will'
# are nouns).
_DETERMINERS = (
    "a an the this that these those some any no every each either neither all both another what "
    "which whose my your his her its our their").split()
_PREPOSITIONS = (
    "of in on at by for with from into onto upon about above below under over between among "
    "amongst through throughout during before after against without within along across behind "
    "beyond near since until till toward towards around via per than despite except unlike "
    "versus").split()
_NUMERALS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty "
    "ninety hundred thousand million billion trillion dozen").split()
_OTHER_CLOSED = (
    # pronouns
    "i me you he him she it we us they them myself yourself himself herself itself ourselves "
    "yourselves themselves who whom mine yours hers ours theirs someone somebody something anyone "
    "anybody anything everyone everybody everything nobody nothing none there here "
    # words that also precede verbs ('to use', 'like running') and particles
    "to like off out up down not "
    # conjunctions and wh-adverbs
    "and or but nor so yet if because although though while whilst whereas unless whether as "
    "where when why how "
    # auxiliaries and clitics ("'s", "n't", "'ll" leave s, t, ll after their apostrophe)
    "be is am are was were been being have has had having do does did doing will would shall "
    "should can could may might must s t ll ve re d m").split()
# Lower-case words that join two entity words: 'Bank of England', 'Leonardo da Vinci'.
_CONNECTIVES = "of de del della der den van von da du la le al bin ibn".split()

_MAX_SEQUENCE_WORDS = 6     # longer lexicon entries (a handful) are never matched
_MAX_KEY_CHARS = 256        # characters past it share one weight; no lexicon key is that long
_U64 = np.uint64


# ---------------------------------------------------------------------------------------------
# Hashing keys (strings of alphanumeric characters) in uint64.
# ---------------------------------------------------------------------------------------------

_BASE = _U64(0x100000001B3)        # odd, so that no power of it is 0 mod 2^64
_SEQUENCE_BASE = _U64(0x9E3779B97F4A7C15)
_POWERS = np.cumprod(np.insert(np.full(_MAX_KEY_CHARS - 1, _BASE), 0, 1).astype(_U64),
                    dtype=_U64)    # B^0 .. B^255 mod 2^64


def _mix(x: np.ndarray) -> np.ndarray:
  """splitmix64's finaliser, elementwise on uint64: spreads each character code over 64 bits."""
  x = x + _U64(0x9E3779B97F4A7C15)
  x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
  x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
  return x ^ (x >> _U64(31))


_ALNUM_RUN = re.compile(r"[^\W_]+")    # a run of characters for which str.isalnum() holds


def _key(text: str) -> str:
  """The alphanumeric characters of `text`, the part of a word that is matched."""
  return "".join(_ALNUM_RUN.findall(text))


def _fold(key: str) -> str:
  """Lower case, character by character (no context rule such as Greek final sigma) and keeping
  the length ('İ' stays), so that a word's folded hash is the sum of its pieces' ones."""
  if key.isascii():
    return key.lower()
  return "".join(ch.lower() if len(ch.lower()) == 1 else ch for ch in key)


def _split_keys(entry: str) -> list[str]:
  """'New_York' -> ['New', 'York']; "o'clock" -> ['o', 'clock']."""
  return [entry] if entry.isalnum() else _ALNUM_RUN.findall(entry)


def _hash_keys(keys: list[str]) -> np.ndarray:
  """[len(keys)] uint64 hashes H(key) = sum_i mix(ord(c_i)) B^i; H('') = 0."""
  lengths = np.fromiter(map(len, keys), np.int64, len(keys))
  codes = np.frombuffer("".join(keys).encode("utf-32-le"), np.uint32).astype(_U64)
  offsets = np.arange(len(codes)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
  terms = _mix(codes) * _POWERS[np.minimum(offsets, _MAX_KEY_CHARS - 1)]
  sums = np.concatenate([np.zeros(1, _U64), np.cumsum(terms, dtype=_U64)])
  ends = np.cumsum(lengths)
  return sums[ends] - sums[ends - lengths]


class _HashMap(NamedTuple):
  keys: np.ndarray     # [m] uint64, sorted, unique
  values: np.ndarray   # [m] int8

  def get(self, query: np.ndarray, default: int) -> np.ndarray:
    """[q] uint64 -> [q] int8, `default` where absent."""
    if not len(self.keys):
      return np.full(query.shape, default, np.int8)
    index = np.minimum(np.searchsorted(self.keys, query), len(self.keys) - 1)
    return np.where(self.keys[index] == query, self.values[index], np.int8(default))


def _hash_map(key_hashes: np.ndarray, values: list[int]) -> _HashMap:
  """{key hash: value}; of equal hashes, the first one's value."""
  hashes, first = np.unique(key_hashes, return_index=True)
  return _HashMap(hashes, np.asarray(values, np.int8)[first])


def _sequence_tables(entries: list[list[str]]) -> tuple[np.ndarray, ...]:
  """Hashes of key sequences, one sorted uint64 table per length 0.._MAX_SEQUENCE_WORDS.

  A sequence w_0..w_{k-1} hashes as Horner's sum_j H(w_j) S^(k-1-j), as `_match_sequences`
  computes it word by word.
  """
  by_length: list[list[list[str]]] = [[] for _ in range(_MAX_SEQUENCE_WORDS + 1)]
  for parts in entries:
    if len(parts) <= _MAX_SEQUENCE_WORDS:
      by_length[len(parts)].append(parts)
  tables = []
  for length, sequences in enumerate(by_length):
    word_hashes = _hash_keys([p for parts in sequences for p in parts]).reshape(-1, max(length, 1))
    combined = np.zeros(len(sequences), _U64)
    for j in range(length):
      combined = combined * _SEQUENCE_BASE + word_hashes[:, j]
    tables.append(np.unique(combined))
  return tuple(tables)


def _is_in(sorted_table: np.ndarray, query: np.ndarray) -> np.ndarray:
  if not len(sorted_table):
    return np.zeros(query.shape, bool)
  index = np.minimum(np.searchsorted(sorted_table, query), len(sorted_table) - 1)
  return sorted_table[index] == query


# ---------------------------------------------------------------------------------------------
# Tables built once: per tokenizer (pieces) and per WordNet (lexicon).
# ---------------------------------------------------------------------------------------------


class _PieceTables(NamedTuple):
  """Per-piece facts, each [vocab_size]. Special, unknown and byte pieces have empty keys."""
  length: np.ndarray          # int64, number of key characters
  cased: np.ndarray           # uint64, H(key)
  folded: np.ndarray          # uint64, H(lower-cased key)
  upper_initial: np.ndarray   # bool, the key starts with an upper-case letter
  non_digit: np.ndarray       # bool, the key holds a character that is not a digit
  ends_sentence: np.ndarray   # bool, punctuation only, with one of . ! ?


@functools.lru_cache(maxsize=4)
def _piece_tables(model_proto: bytes) -> _PieceTables:
  pieces = sp_model_pb2.ModelProto.FromString(model_proto).pieces
  normal = sp_model_pb2.ModelProto.SentencePiece.NORMAL
  texts = [p.piece.replace("▁", "") if p.type == normal else "" for p in pieces]
  keys = [_key(text) for text in texts]
  return _PieceTables(
      length=np.fromiter(map(len, keys), np.int64, len(keys)),
      cased=_hash_keys(keys),
      folded=_hash_keys([_fold(k) for k in keys]),
      upper_initial=np.array([k[:1].isupper() for k in keys], bool),
      non_digit=np.array([not k.isdigit() and bool(k) for k in keys], bool),
      ends_sentence=np.array([bool(t) and not k and any(c in ".!?" for c in t)
                              for t, k in zip(texts, keys)], bool))


class _LexiconTables(NamedTuple):
  closed: _HashMap                  # folded key -> DET / NUM / PREP / OTHER
  pos: _HashMap                     # folded key -> NOUN / ADJ / OTHER (most frequent POS)
  nominal: _HashMap                 # folded key -> NOUN / ADJ, its most frequent of the two, or -1
  noun_sequences: tuple             # folded multiword nouns, per length
  entity_sequences: tuple           # cased WordNet instance names, per length
  connectives: np.ndarray           # sorted hashes of _CONNECTIVES
  letters: np.ndarray               # sorted hashes of 'a' .. 'z'


def _tags_of(parts_of_speech: tuple[str, ...]) -> tuple[int, int]:
  """('verb', 'noun') -> (OTHER, NOUN): the tag of the most frequent part of speech, and of the
  most frequent noun or adjective one (-1 if none)."""
  nominal = [_POS_TAG[p] for p in parts_of_speech if p in ("noun", "adj")]
  return _POS_TAG[parts_of_speech[0]], (nominal + [-1])[0]


@functools.lru_cache(maxsize=2)
def _lexicon_tables(wordnet_dir: str) -> _LexiconTables:
  lexicon = wordnet.load_lexicon(wordnet_dir)
  closed = {**{w: OTHER for w in _OTHER_CLOSED}, **{w: PREP for w in _PREPOSITIONS},
            **{w: NUM for w in _NUMERALS}, **{w: DET for w in _DETERMINERS}}
  names = {name.lower() for name in lexicon.entity_names}
  single, multiword_nouns = [], []
  for word, parts_of_speech in lexicon.parts_of_speech.items():
    keys = [_fold(k) for k in _split_keys(word)]
    if len(keys) == 1:   # "'hood" has the key of 'hood': sorting puts exact spellings first
      single.append((keys[0] != word, keys[0], parts_of_speech))
    # Common multiword nouns that open or close with a closed-class word ('might-have-been',
    # 'run-in') would swallow function words; 'body of water' and 'World War I' are kept.
    elif (len(keys) > 1 and parts_of_speech[0] == "noun"
          and (word in names or (keys[0] not in closed and keys[-1] not in closed))):
      multiword_nouns.append(keys)
  single.sort()
  tags = {p: _tags_of(p) for p in {p for _, _, p in single}}
  single_hashes = _hash_keys([key for _, key, _ in single])
  return _LexiconTables(
      closed=_hash_map(_hash_keys(list(closed)), list(closed.values())),
      pos=_hash_map(single_hashes, [tags[p][0] for _, _, p in single]),
      nominal=_hash_map(single_hashes, [tags[p][1] for _, _, p in single]),
      noun_sequences=_sequence_tables(multiword_nouns),
      entity_sequences=_sequence_tables(
          [_split_keys(name) for name in lexicon.entity_names if name[:1].isupper()]),
      connectives=np.unique(_hash_keys(_CONNECTIVES)),
      letters=np.unique(_hash_keys(list("abcdefghijklmnopqrstuvwxyz"))))


# ---------------------------------------------------------------------------------------------
# Batch time: tokens -> words -> unit flags -> unit ids.
# ---------------------------------------------------------------------------------------------


class _Words(NamedTuple):
  """The words of a batch, numbered 0..W-1 in row-major order."""
  tokens: np.ndarray             # [T] flat indices into [n * L] of the maskable tokens
  word_of_token: np.ndarray      # [T] the word each of them belongs to
  cased: np.ndarray              # [W] uint64 key hash
  folded: np.ndarray             # [W] uint64 lower-cased key hash
  empty: np.ndarray              # [W] bool, punctuation only (no key)
  capitalised: np.ndarray        # [W] bool
  numeric: np.ndarray            # [W] bool, a non-empty key of digits only
  adjacent_next: np.ndarray      # [W] bool, word w + 1 follows w with no token between
  sentence_initial: np.ndarray   # [W] bool


def _from_previous(values: np.ndarray, fill) -> np.ndarray:
  """[W] -> [W]: out[w] = values[w - 1], `fill` at w = 0."""
  out = np.full_like(values, fill)
  out[1:] = values[:-1]
  return out


def _from_next(values: np.ndarray, fill) -> np.ndarray:
  """[W] -> [W]: out[w] = values[w + 1], `fill` at the last word."""
  out = np.full_like(values, fill)
  out[:-1] = values[1:]
  return out


def _words(input_ids, maskable, word_start, pieces: _PieceTables) -> _Words:
  """Groups the maskable tokens of [n, L] arrays into words and hashes their keys."""
  _, length = input_ids.shape
  follows_maskable = np.zeros_like(maskable)
  follows_maskable[:, 1:] = maskable[:, :-1]
  starts = (maskable & (word_start | ~follows_maskable)).ravel()
  tokens = np.flatnonzero(maskable)
  ids = input_ids.ravel()[tokens]
  ends = np.ones(len(tokens), bool)
  ends[:-1] = starts[tokens][1:]
  first = np.flatnonzero(starts[tokens])                      # [W] first token of each word
  last = np.flatnonzero(ends)                                 # [W] last token of each word
  word_of_token = np.cumsum(starts[tokens]) - 1

  key_length = pieces.length[ids]
  chars_before = np.cumsum(key_length) - key_length
  offset = chars_before - chars_before[first][word_of_token]  # key chars before, in its word
  power = _POWERS[np.minimum(offset, _MAX_KEY_CHARS - 1)]
  has_key = key_length > 0

  def any_in_word(flags):
    return np.logical_or.reduceat(flags, first) if len(first) else np.zeros(0, bool)

  def sum_in_word(values):
    return np.add.reduceat(values, first) if len(first) else np.zeros(0, _U64)

  empty = ~any_in_word(has_key)
  # Word w follows w - 1 directly when no token lies between them and w does not open a row.
  flat_first, flat_last = tokens[first], tokens[last]
  follows_previous = (flat_first - 1 == _from_previous(flat_last, -2)) & (flat_first % length > 0)
  adjacent_next = _from_next(follows_previous, False)
  ends_sentence = pieces.ends_sentence[ids[last]]
  sentence_initial = _from_previous(~adjacent_next | ends_sentence, True)
  return _Words(
      tokens=tokens, word_of_token=word_of_token,
      cased=sum_in_word(pieces.cased[ids] * power),
      folded=sum_in_word(pieces.folded[ids] * power),
      empty=empty,
      capitalised=any_in_word((offset == 0) & has_key & pieces.upper_initial[ids]),
      numeric=~empty & ~any_in_word(pieces.non_digit[ids]),
      adjacent_next=adjacent_next, sentence_initial=sentence_initial)


def _match_sequences(tables: tuple, word_hashes: np.ndarray, words: _Words) -> np.ndarray:
  """[W] bool: words inside an occurrence of any sequence of `tables` (`_sequence_tables`)."""
  num_words = len(word_hashes)
  index = np.arange(num_words)
  coverage = np.zeros(num_words + 1, np.int64)
  combined = np.zeros(num_words, _U64)
  chained = np.ones(num_words, bool)          # words i .. i+k-1 exist, are adjacent and non-empty
  for k in range(1, len(tables)):
    end = index + k - 1
    inside = end < num_words
    end = np.minimum(end, num_words - 1)
    chained &= inside & ~words.empty[end]
    if k > 1:
      chained &= words.adjacent_next[end - 1]
    if not chained.any():
      break
    combined = combined * _SEQUENCE_BASE + word_hashes[end]
    starts = np.flatnonzero(chained & _is_in(tables[k], combined))
    coverage += np.bincount(starts, minlength=num_words + 1)
    coverage -= np.bincount(starts + k, minlength=num_words + 1)
  return np.cumsum(coverage[:num_words]) > 0


def _proper(words: _Words, closed: np.ndarray, lexical: np.ndarray) -> np.ndarray:
  """[W] bool: capitalised, not closed-class, not a number, and not sentence-initial unless
  WordNet lacks its lower-case form. `closed`, `lexical`: [W] tags from the lexicon, -1 if none."""
  known = (closed >= 0) | (lexical >= 0)
  return (words.capitalised & (closed < 0) & ~words.numeric
          & (~words.sentence_initial | ~known))


def _run_ids(flags: np.ndarray, words: _Words) -> np.ndarray:
  """[W] int32: 1, 2, ... for each maximal run of adjacent flagged words, 0 elsewhere."""
  continues = _from_previous(flags & words.adjacent_next, False)
  return np.where(flags, np.cumsum(flags & ~continues), 0).astype(np.int32)


def _to_tokens(word_units: np.ndarray, words: _Words, shape) -> np.ndarray:
  unit_ids = np.zeros(shape[0] * shape[1], np.int32)
  unit_ids[words.tokens] = word_units[words.word_of_token]
  return unit_ids.reshape(shape)


def _entity_units(input_ids, maskable, word_start, *, pieces, lexicon) -> np.ndarray:
  input_ids = np.asarray(input_ids)
  words = _words(input_ids, np.asarray(maskable, bool), np.asarray(word_start, bool), pieces)
  proper = _proper(words, lexicon.closed.get(words.folded, -1),
                   lexicon.pos.get(words.folded, -1))
  entity = _match_sequences(lexicon.entity_sequences, words.cased, words) | proper
  # A connective between two adjacent entity words joins them.
  before = _from_previous(entity & words.adjacent_next, False)
  after = _from_next(entity, False) & words.adjacent_next
  connective = _is_in(lexicon.connectives, words.folded) & ~words.capitalised
  entity |= connective & before & after
  return _to_tokens(_run_ids(entity, words), words, input_ids.shape)


def _tags(words: _Words, lexicon: _LexiconTables) -> np.ndarray:
  """[W] int8 chunker tags (module docstring)."""
  closed = lexicon.closed.get(words.folded, -1)
  lexical = lexicon.pos.get(words.folded, -1)
  # Lower-case single letters are mostly debris of abbreviations ('i.e.' -> i, e).
  letter = _is_in(lexicon.letters, words.cased)
  choices = [closed >= 0, words.numeric, _proper(words, closed, lexical), letter | words.empty,
             lexical >= 0]
  tags = np.select(choices, [closed, NUM, NOUN, OTHER, lexical], default=NOUN).astype(np.int8)
  # Inside a run led by a determiner, numeral or preposition ('the use', 'a small change', 'in
  # demand'), a verb or adverb reading yields to the word's noun or adjective reading.
  nominal = lexicon.nominal.get(words.folded, -1)
  switchable = (lexical >= 0) & ~np.any(choices[:-1], axis=0) & (nominal >= 0)
  led = np.isin(tags, (DET, NUM, PREP))   # the run's leader and the adjectives that continue it
  while True:
    after_led = _from_previous(led & words.adjacent_next, False)
    switch = switchable & after_led & (tags == OTHER)
    tags[switch] = nominal[switch]
    grown = led | (after_led & np.isin(tags, (ADJ, NUM)))
    if (grown == led).all():
      break
    led = grown
  tags[_match_sequences(lexicon.noun_sequences, words.folded, words)] = NOUN
  return tags


def _noun_phrase_units(input_ids, maskable, word_start, *, pieces, lexicon) -> np.ndarray:
  input_ids = np.asarray(input_ids)
  words = _words(input_ids, np.asarray(maskable, bool), np.asarray(word_start, bool), pieces)
  tags = _tags(words, lexicon)
  # Runs of modifiers, each cut after its last noun: DET? (ADJ|NOUN|NUM)* NOUN, leftmost-longest.
  runs = _run_ids(np.isin(tags, _MODIFIER_TAGS), words)
  index = np.arange(len(tags))
  last_noun = np.full(runs.max(initial=0) + 1, -1)
  is_noun = tags == NOUN
  np.maximum.at(last_noun, runs[is_noun], index[is_noun])
  units = np.where((runs > 0) & (index <= last_noun[runs]), runs, 0)
  # A determiner directly before a phrase joins it (it is outside any unit, so the next word
  # starts one).
  next_unit = _from_next(units, 0)
  det = (tags == DET) & words.adjacent_next & (next_unit > 0)
  units[det] = next_unit[det]
  return _to_tokens(units.astype(np.int32), words, input_ids.shape)


# ---------------------------------------------------------------------------------------------
# Registry.
# ---------------------------------------------------------------------------------------------


def entities(tokenizer: tokenizers.Tokenizer, wordnet_dir: str | None = None) -> SpanSource:
  """Named-entity units (module docstring, rule (a) + (b)) for batches of this tokenizer."""
  return functools.partial(_entity_units, pieces=_piece_tables(tokenizer.model_proto),
                           lexicon=_lexicon_tables(wordnet.find_wordnet_dir(wordnet_dir)))


def noun_phrases(tokenizer: tokenizers.Tokenizer, wordnet_dir: str | None = None) -> SpanSource:
  """Noun-phrase units (module docstring) for batches of this tokenizer."""
  return functools.partial(_noun_phrase_units, pieces=_piece_tables(tokenizer.model_proto),
                           lexicon=_lexicon_tables(wordnet.find_wordnet_dir(wordnet_dir)))


SPAN_SOURCES = {"entities": entities, "noun_phrases": noun_phrases}


def make_span_source(name: str, tokenizer: tokenizers.Tokenizer,
                     wordnet_dir: str | None = None) -> SpanSource:
  """The span source `name` for batches of `tokenizer`. Its tables are built once per tokenizer
  and WordNet directory (~3 s for WordNet, cached per process); a call then costs a few ms."""
  if name not in SPAN_SOURCES:
    raise config_lib.ConfigError(
        f"span source {name!r} is unknown; choose one of {sorted(SPAN_SOURCES)}.")
  return SPAN_SOURCES[name](tokenizer, wordnet_dir)
