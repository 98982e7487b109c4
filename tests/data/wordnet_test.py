"""Tests for bertfam_jax.data.wordnet: database parsing, the supersense task, the lexicon."""

import numpy as np
import pytest

from bertfam_jax import config_lib
from bertfam_jax.data import wordnet

try:
  wordnet.find_wordnet_dir()
except config_lib.ConfigError as e:
  pytest.skip(f"WordNet 3.0 is not installed ({e})", allow_module_level=True)


@pytest.fixture(scope="module")
def synsets():
  return wordnet.load_synsets()


@pytest.fixture(scope="module")
def task():
  return wordnet.supersense_task()


def test_missing_directory_names_the_fix(tmp_path):
  with pytest.raises(config_lib.ConfigError, match=r"pip install 'bertfam_jax\[wordnet\]'"):
    wordnet.find_wordnet_dir(str(tmp_path))


def test_synset_counts(synsets):
  # WordNet 3.0's published statistics (wnstats(7WN)).
  assert len(synsets) == 117_659
  counts = {t: sum(s.ss_type == t for s in synsets) for t in "nvasr"}
  assert counts == dict(n=82_115, v=13_767, a=7_463, s=10_693, r=3_621)
  assert sum(len(s.examples) for s in synsets) > 45_000
  assert all(s.definition for s in synsets)


def test_parse_data_line():
  line = ("00001740 00 a 01 able(p) 0 002 = 05200169 n 0000 ! 00002098 a 0101 | (usually followed "
          "by `to') having the necessary means or skill; \"able to swim\"; \"she was able\"  \n")
  synset = wordnet.parse_data_line(line)
  assert synset == wordnet.Synset(
      offset=1740, ss_type="a", lexname_id=0, words=("able",),
      pointers=(("=", 5200169, "n"), ("!", 2098, "a")),
      definition="(usually followed by `to') having the necessary means or skill",
      examples=("able to swim", "she was able"))


def test_dog_synset(synsets):
  dog = next(s for s in synsets if s.words[:2] == ("dog", "domestic_dog"))
  assert wordnet.lexnames()[dog.lexname_id] == "noun.animal"
  assert dog.words == ("dog", "domestic_dog", "Canis_familiaris")
  assert dog.examples == ("the dog barked all night",)
  assert dog.definition.startswith("a member of the genus Canis")
  assert not dog.definition.endswith(";")


def test_split_gloss_drops_attributions():
  assert wordnet.split_gloss('bodily; "that which is created" - Benjamin Jowett') == (
      "bodily", ("that which is created",))


def test_lexnames():
  names = wordnet.lexnames()
  assert names == wordnet.LEXNAMES
  assert len(names) == 45 and names[5] == "noun.animal" and names[44] == "adj.ppl"


def test_supersense_splits(task, synsets):
  splits = [task.train, task.validation, task.test]
  sizes = [len(split.texts) for split in splits]
  assert sum(sizes) == len(synsets)
  np.testing.assert_allclose(np.array(sizes) / sum(sizes), [0.8, 0.1, 0.1], atol=0.01)
  texts = [set(split.texts) for split in splits]
  assert not (texts[0] & texts[1] or texts[0] & texts[2] or texts[1] & texts[2])
  for split in splits:
    assert split.labels.dtype == np.int32 and len(split.labels) == len(split.texts)
    assert 0 <= split.labels.min() and split.labels.max() < 45
  assert task.label_names == wordnet.LEXNAMES
  assert len(np.unique(task.train.labels)) == 45
  # The text is the definition alone, with neither lemma nor examples.
  dog = next(s for s in synsets if s.words[:2] == ("dog", "domestic_dog"))
  assert dog.definition in set.union(*texts)


def test_supersense_is_deterministic_and_subsamples_stably(task):
  small = wordnet.supersense_task(max_examples=500)
  assert [len(s.texts) for s in small[1:]] == [500, 500, 500]
  for full, part in zip(task[1:], small[1:]):
    assert part.texts == full.texts[:500]
    np.testing.assert_array_equal(part.labels, full.labels[:500])
  # Not in file order, which groups the classes.
  assert len(np.unique(small.train.labels[:100])) > 15
  # Built once a process; a caller's edits do not reach the next call.
  small.train.texts[0], small.train.labels[0] = "edited", -1
  again = wordnet.supersense_task(max_examples=500)
  assert again.train.texts[0] == task.train.texts[0] and again.train.labels[0] >= 0


def test_supersense_rejects_bad_fractions():
  with pytest.raises(ValueError, match="sum to 1"):
    wordnet.supersense_task(fractions=(0.8, 0.1, 0.2))


def test_lexicon():
  lexicon = wordnet.load_lexicon()
  expected = dict(dog="noun", dogs="noun", quickly="adv", went="verb", children="noun",
                  barked="verb", older="adj", stopped="verb", ice_cream="noun", Dog="noun")
  assert {w: lexicon.most_frequent_pos(w) for w in expected} == expected
  assert lexicon.most_frequent_pos("qwertyuiop") is None
  assert lexicon.parts_of_speech["use"] == ("verb", "noun")   # most frequent first
  assert {"Albert_Einstein", "Paris", "New_York", "World_War_II"} <= lexicon.entity_names
  assert "dog" not in lexicon.entity_names
  assert 7_730 <= len(lexicon.entity_names) < 20_000
  assert {"ice_cream", "new_york", "carry_out"} <= lexicon.multiword_lemmas
  assert wordnet.load_lexicon() is lexicon   # cached


@pytest.fixture(scope="module")
def qa_task():
  return wordnet.definition_qa_task()


def test_lemma_finder(synsets):
  dog = next(s for s in synsets if s.words[:2] == ("dog", "domestic_dog"))
  find = wordnet.lemma_finder(dog)
  words = wordnet.split_words("Dogs chase the dog's dogma; domestic  dogs bark")
  assert [w for w, _, _ in words][:5] == ["Dogs", "chase", "the", "dog", "'"]
  assert [" ".join(w for w, _, _ in words[a:b]) for a, b in find(words)] == [
      "Dogs", "dog", "domestic dogs"]
  assert "ice creams" in wordnet.lemma_forms(
      next(s for s in synsets if "ice_cream" in s.words))


def test_definition_qa(qa_task, synsets):
  splits = [qa_task.train, qa_task.validation, qa_task.test]
  examples = [e for split in splits for e in split]
  assert len(examples) == sum(bool(s.examples) for s in synsets) == 32_923
  impossible = sum(e["is_impossible"] for e in examples)
  assert impossible == 1_497   # 95.5% answerable
  by_id = {wordnet.synset_id(s): s for s in synsets}
  for example in examples[::50]:
    assert example["is_impossible"] == (not example["answers"])
    for answer in example["answers"]:
      start = answer["answer_start"]
      assert example["context"][start:start + len(answer["text"])] == answer["text"]
    synset = by_id[example["id"]]
    assert example["question"] == synset.definition
    assert all(sentence in example["context"] for sentence in synset.examples)
    assert example["context"].count("; ") >= len(synset.examples) + 2   # 3 distractors
  # The same definition lands in the same split as in the supersense task.
  supersense = wordnet.supersense_task()
  assert {e["question"] for e in qa_task.test} <= set(supersense.test.texts)
  small = wordnet.definition_qa_task(max_examples=10)
  assert list(small.train) == qa_task.train[:10] and len(small.test) == 10


def test_examples_are_made_when_first_read_and_kept():
  made = []

  def make(item):
    made.append(item)
    return dict(value=item)

  examples = wordnet.MadeOnRead(range(100), make)
  assert len(examples) == 100 and made == []
  examples[0]["value"] = -1   # a copy: the kept example stays as made
  assert examples[0]["value"] == 0 and examples[-1]["value"] == 99 and made == [0, 99]
  assert [e["value"] for e in examples[2:4]] == [2, 3] and made == [0, 99, 2, 3]
  assert [e["value"] for e in examples.head(3)] == [0, 1, 2] and len(examples.head(None)) == 100
  with pytest.raises(IndexError):
    examples[100]   # noqa: B018


def test_lemma_tagging():
  task = wordnet.lemma_tagging_task(max_examples=2000)
  assert task.label_names == wordnet.bio_label_names() and len(task.label_names) == 91
  assert task.label_names[1 + 2 * 5] == "B-noun.animal"
  for example in [*task.train, *task.test]:
    labels = example["labels"]
    assert len(labels) == len(example["words"]) and any(labels)
    for previous, label in zip([0] + labels, labels):
      if label and label % 2 == 0:   # an I- tag continues the span of its B- tag
        assert previous in (label - 1, label)
  full = wordnet.lemma_tagging_task()
  dog = next(e for e in [*full.train, *full.test, *full.validation]
             if e["words"] == ["the", "dog", "barked", "all", "night"])
  assert [task.label_names[i] for i in dog["labels"]] == ["O", "B-noun.animal", "O", "O", "O"]


def test_lemma_choice(synsets):
  task = wordnet.lemma_choice_task()
  examples = [*task.train, *task.validation, *task.test]
  assert len(examples) == len(synsets)
  labels = np.asarray([e["label"] for e in examples])
  np.testing.assert_allclose(np.bincount(labels) / len(labels), 0.25, atol=0.01)
  dog = next(e for e in examples if e["question"].startswith("a member of the genus Canis"))
  assert dog["choices"][dog["label"]] == "dog" and len(set(dog["choices"])) == 4
  lexicon = wordnet.load_lexicon()
  for choice in dog["choices"]:
    assert "noun" in lexicon.parts_of_speech[choice.replace(" ", "_").lower()] or \
        "noun" in lexicon.parts_of_speech.get(choice.replace(" ", "_"), ())
