"""TFDS fine-tuning tasks read from prepared array_record files without TensorFlow and without
the datasets' builder code (`tfds.builder` prefers registered code, and TFDS's SuperGLUE code
cannot be constructed without TF).

The builders below write datasets with the features, names and versions of TFDS's own
(tensorflow_datasets/text/glue.py, text/super_glue.py, datasets/squad/squad_dataset_builder.py),
to `<data_dir>/<name>/<config>/<version>/` as `tfds build NAME --data_dir=DIR
--file_format=array_record` does. They are not registered (TFDS's real glue / super_glue code is,
see `data_dir`), so only the files can be read. They live in this importable module because TFDS
cannot locate builder classes in `__main__`.
"""

import contextlib
import importlib
import importlib.util
import json
import shutil

import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds

from bertfam_jax import config_lib
from bertfam_jax.data import tokenizers
from bertfam_jax.finetune import features
from bertfam_jax.finetune import tasks

_MRPC = {
    "train": [
        dict(sentence1="Amrozi accused his brother, whom he called \"the witness\", of "
                       "deliberately distorting his evidence.",
             sentence2="Referring to him as only \"the witness\", Amrozi accused his brother of "
                       "deliberately distorting his evidence.", label=1, idx=0),
        dict(sentence1="Yucaipa owned Dominick's before selling the chain to Safeway in 1998.",
             sentence2="Yucaipa bought Dominick's in 1995 for $693 million and sold it to "
                       "Safeway for $1.8 billion in 1998.", label=0, idx=1),
    ],
    "validation": [
        dict(sentence1="He said the foodservice pie business doesn't fit the company's "
                       "long-term growth strategy.",
             sentence2="\"The foodservice pie business does not fit our long-term growth "
                       "strategy.", label=1, idx=0),
        dict(sentence1="Magnarelli said Racicot hated the Iraqi regime and looked forward to "
                       "using his years of training in the war.",
             sentence2="His wife said he was \"100 percent behind George Bush\" and looked "
                       "forward to using his years of training in the war.", label=0, idx=1),
        dict(sentence1="The dollar was at 116.92 yen against the yen, flat on the session.",
             sentence2="The dollar was at 116.78 yen, virtually flat on the session.", label=0,
             idx=2),
        dict(sentence1="The café in Zürich opened a naïve exhibit.",
             sentence2="A naïve exhibit opened at the Zürich café.", label=1, idx=3),
    ],
    "test": [
        dict(sentence1="PCCW's chief operating officer, Mike Butcher, will report directly to "
                       "Mr So.",
             sentence2="Current Chief Operating Officer Mike Butcher will report to So.",
             label=-1, idx=0),
    ],
}
_STSB = {
    "validation": [
        dict(sentence1="A man with a hard hat is dancing.",
             sentence2="A man wearing a hard hat is dancing.", label=5.0, idx=0),
        dict(sentence1="A young child is riding a horse.", sentence2="A child is riding a horse.",
             label=4.75, idx=1),
        dict(sentence1="A man is playing the cello.", sentence2="A man seated is playing the "
                                                                "cello.", label=4.25, idx=2),
        dict(sentence1="A woman is dancing.", sentence2="A man is talking.", label=0.6, idx=3),
    ],
}
_COPA = {
    "validation": [
        dict(premise="The man turned on the faucet.", choice1="The toilet filled with water.",
             choice2="Water flowed from the spout.", question="effect", label=1, idx=0),
        dict(premise="The girl found a bug in her cereal.", choice1="She poured milk in the bowl.",
             choice2="She lost her appetite.", question="effect", label=1, idx=1),
        dict(premise="The woman retired.", choice1="She received her pension.",
             choice2="She paid off her mortgage.", question="effect", label=0, idx=2),
        dict(premise="My body cast a shadow over the grass.", choice1="The sun was rising.",
             choice2="The grass was cut.", question="cause", label=0, idx=3),
    ],
}
_NO_ANSWER = dict(text=[], answer_start=[])
_SQUAD_V2 = {
    "validation": [
        dict(id="56ddde6b9a695914005b9628", title="Normans",
             context="The Normans were the people who in the 10th and 11th centuries gave their "
                     "name to Normandy , a region in France .",
             question="In what country is Normandy located?",
             answers=dict(text=["France", "France", "in France"], answer_start=[105, 105, 102]),
             plausible_answers=_NO_ANSWER, is_impossible=False),
        dict(id="5ad39d53604f3c001a3fe8d1", title="Normans",
             context="The Normans were the people who in the 10th and 11th centuries gave their "
                     "name to Normandy , a region in France .",
             question="What is France a region of?", answers=_NO_ANSWER,
             plausible_answers=dict(text=["Normandy"], answer_start=[82]), is_impossible=True),
        dict(id="56de0f6a4396321400ee2596", title="Zürich",
             context="Zürich is the largest city in Switzerland , on Lake Zürich .",
             question="Which lake is Zürich on?",
             answers=dict(text=["Lake Zürich"], answer_start=[47]),
             plausible_answers=_NO_ANSWER, is_impossible=False),
    ],
    "train": [
        dict(id="5733be284776f41900661182", title="University_of_Notre_Dame",
             context="Architecturally , the school has a Catholic character .",
             question="What character does the school have?",
             answers=dict(text=["Catholic"], answer_start=[35]),
             plausible_answers=_NO_ANSWER, is_impossible=False),
    ],
}
_RECORDS = {"glue/mrpc": _MRPC, "glue/stsb": _STSB, "super_glue/copa": _COPA,
            "squad/v2.0": _SQUAD_V2}


class _Prepared(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Writes `_RECORDS[name/config]`; subclasses give TFDS's name, configs, version, features."""

  def _features(self) -> dict:
    raise NotImplementedError

  def _info(self):
    # DatasetInfo directly: `dataset_info_from_configs` looks for metadata files in a package.
    return tfds.core.DatasetInfo(builder=self,
                                 features=tfds.features.FeaturesDict(self._features()))

  def _split_generators(self, dl_manager):
    del dl_manager
    splits = _RECORDS[f"{self.name}/{self.builder_config.name}"]
    return {split: self._generate_examples(records) for split, records in splits.items()}

  def _generate_examples(self, records):
    yield from enumerate(records)


class Glue(_Prepared, skip_registration=True):
  """tensorflow_datasets/text/glue.py: version 2.0.0; Text features, ClassLabel or float32
  label, int32 idx."""
  VERSION = tfds.core.Version("2.0.0")
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="mrpc"), tfds.core.BuilderConfig(name="stsb")]

  def _features(self):
    label = (tfds.features.ClassLabel(names=["not_equivalent", "equivalent"])
             if self.builder_config.name == "mrpc" else np.float32)
    return {"sentence1": tfds.features.Text(), "sentence2": tfds.features.Text(),
            "label": label, "idx": np.int32}


class SuperGlue(_Prepared, skip_registration=True):
  """tensorflow_datasets/text/super_glue.py, COPA: version 1.0.2."""
  VERSION = tfds.core.Version("1.0.2")
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="copa")]

  def _features(self):
    return {**{key: tfds.features.Text() for key in ("premise", "choice1", "choice2", "question")},
            "idx": np.int32, "label": tfds.features.ClassLabel(names=["choice1", "choice2"])}


class Squad(_Prepared, skip_registration=True):
  """tensorflow_datasets/datasets/squad/squad_dataset_builder.py, v2.0: version 3.0.0."""
  VERSION = tfds.core.Version("3.0.0")
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="v2.0")]

  def _features(self):
    def answers():
      return tfds.features.Sequence({"text": tfds.features.Text(), "answer_start": np.int32})
    return {"id": np.str_, "title": tfds.features.Text(), "context": tfds.features.Text(),
            "plausible_answers": answers(), "question": tfds.features.Text(),
            "is_impossible": np.bool_, "answers": answers()}


_BUILDERS = {"glue/mrpc": (Glue, "2.0.0"), "glue/stsb": (Glue, "2.0.0"),
             "super_glue/copa": (SuperGlue, "1.0.2"), "squad/v2.0": (Squad, "3.0.0")}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  # The real builder code registered, as in any process that imported it: without TensorFlow,
  # `tfds.builder` then picks that code over the files and fails constructing super_glue.
  for module in ("tensorflow_datasets.text.glue", "tensorflow_datasets.text.super_glue"):
    with contextlib.suppress(ImportError):
      importlib.import_module(module)
  data_dir = tmp_path_factory.mktemp("tfds")
  for name, (builder, version) in _BUILDERS.items():
    builder(config=name.split("/")[1], data_dir=str(data_dir),
            file_format="array_record").download_and_prepare()
    prepared = data_dir / name / version
    assert (prepared / "dataset_info.json").exists() and (prepared / "features.json").exists()
    assert (prepared / f"{name.split('/')[0]}-validation.array_record-00000-of-00001").exists()
  return data_dir


def _sorted(examples, key):
  return sorted(examples, key=lambda e: e[key])


def test_glue_mrpc(data_dir):
  task = tasks.get("glue/mrpc")
  for split, records in _MRPC.items():
    examples = task.load(split, str(data_dir))
    expected = [dict(text=r["sentence1"], text_b=r["sentence2"], label=r["label"])
                for r in records]
    assert _sorted(examples, "text") == _sorted(expected, "text"), split
  assert task.load("test", str(data_dir))[0]["label"] == -1   # GLUE's hidden test labels
  first_two = task.load("validation", str(data_dir), max_examples=2)
  assert len(first_two) == 2 and all(e in task.load("validation", str(data_dir))
                                     for e in first_two)


def test_glue_stsb_regression(data_dir):
  examples = _sorted(tasks.get("glue/stsb").load("validation", str(data_dir)), "text")
  expected = _sorted([dict(text=r["sentence1"], text_b=r["sentence2"], label=r["label"])
                      for r in _STSB["validation"]], "text")
  assert [e["text"] for e in examples] == [e["text"] for e in expected]
  assert [e["text_b"] for e in examples] == [e["text_b"] for e in expected]
  assert all(isinstance(e["label"], float) for e in examples)
  np.testing.assert_allclose([e["label"] for e in examples], [e["label"] for e in expected],
                             rtol=1e-6)   # float32 on disk


def test_super_glue_copa(data_dir):
  examples = tasks.get("super_glue/copa").load("validation", str(data_dir))
  assert _sorted(examples, "question") == _sorted(
      [dict(question=f"{r['premise']} What was the {r['question']}?",
            choices=[r["choice1"], r["choice2"]], label=r["label"])
       for r in _COPA["validation"]], "question")


def test_squad_v2_answers_and_impossible(data_dir):
  task = tasks.get("squad/v2.0")
  examples = {e["id"]: e for e in task.load("validation", str(data_dir))}
  assert set(examples) == {r["id"] for r in _SQUAD_V2["validation"]}
  france = examples["56ddde6b9a695914005b9628"]
  assert france == dict(id="56ddde6b9a695914005b9628",
                        question="In what country is Normandy located?",
                        context=_SQUAD_V2["validation"][0]["context"],
                        answers=[dict(text="France", answer_start=105),
                                 dict(text="France", answer_start=105),
                                 dict(text="in France", answer_start=102)],
                        is_impossible=False)
  for answer in france["answers"]:
    start = answer["answer_start"]
    assert france["context"][start:start + len(answer["text"])] == answer["text"]
  impossible = examples["5ad39d53604f3c001a3fe8d1"]
  assert impossible["is_impossible"] is True and impossible["answers"] == []  # not plausible_
  zurich = examples["56de0f6a4396321400ee2596"]
  assert zurich["answers"] == [dict(text="Lake Zürich", answer_start=47)]
  assert zurich["context"][47:58] == "Lake Zürich"   # character offsets, not UTF-8 bytes
  assert task.gold([france, impossible]) == [["France", "France", "in France"], []]
  assert len(task.load("train", str(data_dir))) == 1


def test_newest_prepared_version_is_read(data_dir, tmp_path):
  """glue's older versions (1.0.0, 1.0.1) may sit beside 2.0.0; here 1.0.1 has no validation."""
  shutil.copytree(data_dir / "glue" / "mrpc", tmp_path / "glue" / "mrpc")
  old = tmp_path / "glue" / "mrpc" / "1.0.1"
  shutil.copytree(tmp_path / "glue" / "mrpc" / "2.0.0", old)
  info = json.loads((old / "dataset_info.json").read_text())
  info["version"] = "1.0.1"
  info["splits"] = [s for s in info["splits"] if s["name"] != "validation"]
  (old / "dataset_info.json").write_text(json.dumps(info))
  assert len(tasks.get("glue/mrpc").load("validation", str(tmp_path))) == 4


@pytest.mark.parametrize("name", ["glue/mrpc", "super_glue/copa", "squad/v1.1"])
def test_missing_dataset_names_the_build_command(name, data_dir, tmp_path):
  # squad/v1.1 next to a prepared squad/v2.0, glue/mrpc in an empty dir.
  directory = data_dir if name == "squad/v1.1" else tmp_path
  with pytest.raises(config_lib.ConfigError,
                     match=f"tfds build {name} --data_dir=DIR --file_format=array_record"):
    tasks.get(name).load("validation", str(directory))


def test_unknown_split_names_the_flag(data_dir):
  with pytest.raises(config_lib.ConfigError, match="splits.*eval_split"):
    tasks.get("glue/stsb").load("test", str(data_dir))


def test_tfrecord_without_tensorflow_names_the_fix(data_dir, tmp_path):
  if importlib.util.find_spec("tensorflow") is not None:
    pytest.skip("TensorFlow is installed; this checks the message shown without it.")
  # The same prepared dataset, declared as tfrecord (preparing tfrecord itself needs TF).
  shutil.copytree(data_dir / "glue" / "mrpc", tmp_path / "glue" / "mrpc")
  info_path = tmp_path / "glue" / "mrpc" / "2.0.0" / "dataset_info.json"
  info = json.loads(info_path.read_text())
  info["fileFormat"] = "tfrecord"
  info_path.write_text(json.dumps(info))
  with pytest.raises(config_lib.ConfigError, match=r"tfrecord.*bertfam_jax\[tfds\].*"
                     r"tfds build glue/mrpc --data_dir=DIR --file_format=array_record"):
    tasks.get("glue/mrpc").load("validation", str(tmp_path))


# ----------------------------------------------------------------------------- featurize


@pytest.fixture(scope="module")
def tokenizer():
  texts = [str(v) for splits in _RECORDS.values() for records in splits.values()
           for record in records for v in record.values() if isinstance(v, str)]
  return tokenizers.Tokenizer(tokenizers.train_sentencepiece(texts * 20, 200, "bpe"))


def _ft(max_seq_len):
  """The `config.finetune` fields `features.featurize` reads."""
  return ml_collections.ConfigDict(dict(max_seq_len=max_seq_len, doc_stride=16, max_query_len=16))


@pytest.mark.parametrize("name", ["glue/mrpc", "glue/stsb"])
def test_featurize_pairs(name, data_dir, tokenizer):
  task = tasks.get(name)
  examples = task.load("validation", str(data_dir))
  data = features.featurize(task, tokenizer, examples, _ft(128), training=True)
  assert data["input_ids"].shape == (len(examples), 128)
  for row, example in zip(range(len(examples)), examples):
    ids, segments = data["input_ids"][row], data["segment_ids"][row]
    length = int(data["input_mask"][row].sum())
    assert ids[0] == tokenizer.cls_id and ids[length - 1] == tokenizer.sep_id
    first = ids[1:length][segments[1:length] == 0][:-1]    # [CLS] A [SEP] | B [SEP]
    second = ids[1:length][segments[1:length] == 1][:-1]
    assert tokenizer.decode(first) == example["text"]
    assert tokenizer.decode(second) == example["text_b"]
  labels = np.asarray([e["label"] for e in examples])
  np.testing.assert_allclose(data["label"], labels, rtol=1e-6)
  assert data["label"].dtype == (np.float32 if task.kind == "regression" else np.int32)


def test_featurize_copa(data_dir, tokenizer):
  task = tasks.get("super_glue/copa")
  examples = task.load("validation", str(data_dir))
  data = features.featurize(task, tokenizer, examples, _ft(64), training=True)
  assert data["input_ids"].shape == (len(examples), 2, 64)
  np.testing.assert_array_equal(data["label"], [e["label"] for e in examples])
  for index, example in enumerate(examples):
    for choice in range(2):
      ids, segments = data["input_ids"][index, choice], data["segment_ids"][index, choice]
      second = ids[(segments == 1) & (data["input_mask"][index, choice] == 1)][:-1]
      assert tokenizer.decode(second) == example["choices"][choice]


def test_featurize_squad_v2_spans(data_dir, tokenizer):
  task = tasks.get("squad/v2.0")
  examples = task.load("validation", str(data_dir))
  data = features.featurize(task, tokenizer, examples, _ft(48), training=True)
  # Contexts longer than a window are split into several features, doc_stride apart.
  assert set(data["example_index"]) == set(range(len(examples)))
  assert len(data["example_index"]) > len(examples)
  found = set()
  for row, index in enumerate(data["example_index"]):
    example = examples[index]
    start, end = data["start_position"][row], data["end_position"][row]
    if start == 0:
      assert end == 0
      continue
    offsets = data["token_offsets"][row]
    span = example["context"][offsets[start, 0]:offsets[end, 1]]
    assert span == example["answers"][0]["text"]
    found.add(example["id"])
  # Every answerable example's answer lies inside some window; the impossible one in none.
  assert found == {e["id"] for e in examples if not e["is_impossible"]}
