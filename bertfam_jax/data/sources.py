"""Documents as raw strings: the embedded Wikipedia sample, local text files and TFDS datasets.

A document is one `str`; paragraphs (or input lines) inside it are separated by '\n', which
`split_sentences` treats as hard sentence boundaries. Every source is exposed through
`get_documents(data_config, split)` as a `Sequence[str]` (len + random access), so the pipeline
can permute, shard and chunk documents without knowing where they came from.
"""

from __future__ import annotations

import bz2
import collections.abc
import functools
import hashlib
import importlib.util
import json
import os
import re
from typing import Any, Mapping, Sequence

from absl import logging
import ml_collections
import numpy as np

from bertfam_jax import config_lib, fileio

# ---------------------------------------------------------------------------------------------
# Embedded Wikipedia sample (ships inside the gensim wheel, so `pip install` is all it needs).
# ---------------------------------------------------------------------------------------------

_WIKI_DUMP = "test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"

# Sections that hold lists of links and citations rather than running text.
_NON_PROSE_SECTIONS = frozenset([
    "references", "external links", "see also", "further reading", "notes", "bibliography",
    "footnotes", "sources", "citations", "works cited", "notes and references", "gallery",
    "primary sources", "secondary sources", "other sources", "explanatory notes",
])
_HEADING = re.compile(r"^\s*(=+)\s*(.*?)\s*\1\s*$")
# List items, table rows, galleries, image captions and leftover template/markup lines.
_NON_PROSE_LINE = re.compile(
    r"^\s*(?:[*#:;|!{}]|File:|Image:|thumb\||thumbnail\||\d+px\||upright|left\||right\||\w+=)",
    re.IGNORECASE)
_MIN_PARAGRAPH_WORDS = 8   # shorter lines are captions, stubs and list debris
_MIN_DOCUMENT_WORDS = 150  # drops disambiguation pages and stubs (10 of the 106 articles)


def _clean_paragraph(line: str) -> str:
  """Strips the wiki markup `filter_wiki` leaves inside running text."""
  line = re.sub(r"'{2,}", "", line)                       # ''italic'' and '''bold'''
  line = re.sub(r"\b(?:thumb|thumbnail|upright|\d+px)\|", "", line, flags=re.IGNORECASE)
  line = re.sub(r"<[^>]{0,80}>", "", line)                # stray html tags
  # Removed templates ({{lang|...}}, {{convert|...}}) leave "()" or "(; )" and " ," behind.
  for _ in range(2):  # nested: "( () )"
    line = re.sub(r"\(\s*[,;:]?\s*\)", "", line)
  line = re.sub(r"\s+([,.;:!?)])", r"\1", line)
  line = re.sub(r"([(])\s+", r"\1", line)
  line = re.sub(r"\s{2,}", " ", line)
  return line.strip()


def clean_wiki_text(text: str) -> str:
  """Turns `filter_wiki` output into prose paragraphs joined by '\n'.

  As in MediaWiki, a blank line ends a paragraph and a single newline does not (some articles
  hard-wrap their source). Headings end a paragraph and are dropped; sections such as References
  or External links are dropped whole, as are list items, tables, galleries and very short lines.
  """
  paragraphs, current = [], []

  def flush():
    paragraph = _clean_paragraph(" ".join(current))
    if len(paragraph.split()) >= _MIN_PARAGRAPH_WORDS:
      paragraphs.append(paragraph)
    current.clear()

  skipping = False
  for line in text.splitlines():
    heading = _HEADING.match(line)
    if heading or not line.strip() or _NON_PROSE_LINE.match(line):
      flush()
      if heading:
        skipping = heading.group(2).strip().lower() in _NON_PROSE_SECTIONS
    elif not skipping:
      current.append(line.strip())
  flush()
  return "\n".join(paragraphs)


def _extract_wiki_documents() -> list[dict[str, str]]:
  """Reads the gensim dump and returns the cleaned articles, in dump order."""
  import gensim  # pylint: disable=g-import-not-at-top  (heavy; only needed to build the cache)
  from gensim.corpora import wikicorpus  # pylint: disable=g-import-not-at-top

  path = os.path.join(os.path.dirname(gensim.__file__), _WIKI_DUMP)
  documents = []
  with bz2.BZ2File(path) as f:
    # Namespace 0 = articles (no Talk:, Wikipedia:, Template: pages).
    for title, raw, _ in wikicorpus.extract_pages(f, filter_namespaces=("0",)):
      if raw.lstrip().lower().startswith("#redirect"):
        continue
      text = clean_wiki_text(wikicorpus.filter_wiki(raw))
      if len(text.split()) >= _MIN_DOCUMENT_WORDS:
        documents.append(dict(title=title, text=text))
  return documents


def _embedded_wiki_path(cache_dir: str) -> str:
  return os.path.join(cache_dir, "corpora", "embedded_wiki.jsonl")


def embedded_wiki(cache_dir: str) -> list[str]:
  """The embedded English corpus: Wikipedia articles from the sample dump in the gensim wheel.

  Redirects and stubs are dropped and markup is stripped (`clean_wiki_text`); paragraphs are
  joined by '\n'. Measured: 96 documents, 408,734 words (whitespace-split), 2.59 M characters,
  5,031 paragraphs, 18,500 sentences (`split_sentences`); building the cache takes ~5 s on one
  core, reading it back ~10 ms.

  Args:
    cache_dir: root cache directory; the documents are cached as JSONL under
      `cache_dir/corpora/embedded_wiki.jsonl` (one `{"title", "text"}` per line) the first time.

  Returns:
    The document texts, in dump order (deterministic).
  """
  path = _embedded_wiki_path(cache_dir)
  if not os.path.exists(path):
    lines = (json.dumps(doc, ensure_ascii=False) + "\n" for doc in _extract_wiki_documents())
    fileio.write_atomically(path, "".join(lines).encode("utf-8"))
    logging.info("Wrote the embedded Wikipedia corpus to %s.", path)
  with open(path, encoding="utf-8") as f:
    return [json.loads(line)["text"] for line in f]


# ---------------------------------------------------------------------------------------------
# Local text files.
# ---------------------------------------------------------------------------------------------


def _expand_globs(patterns: str) -> list[str]:
  paths = []
  for pattern in filter(None, (p.strip() for p in patterns.split(","))):
    matches = fileio.glob(pattern)
    if not matches:
      raise config_lib.ConfigError(
          f"data.text_files pattern {pattern!r} matches no file; fix --config.data.text_files.")
    directories = [m for m in matches if fileio.isdir(m)]
    if directories:
      raise config_lib.ConfigError(
          f"data.text_files pattern {pattern!r} matches the directory {directories[0]}; name its "
          f"files, e.g. --config.data.text_files='{os.path.join(directories[0], '*.txt')}'.")
    paths.extend(matches)
  return paths


def _file_format(path: str, text_format: str) -> str:
  if text_format != "auto":
    return text_format
  return "jsonl" if path.endswith((".jsonl", ".json")) else "blank_lines"


def _read_text_file(path: str, text_format: str) -> list[str]:
  """Reads one file as documents (paragraphs/lines inside a document joined by '\n').

  blank_lines: documents separated by blank lines, one sentence or paragraph per line (BERT's
    create_pretraining_data input format). lines: every line is a document. jsonl: one JSON
    object per line with a `text` field.
  """
  raw = fileio.read_bytes(path)
  try:
    content = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise config_lib.ConfigError(
        f"{path} is not UTF-8 text (byte {e.start}: {raw[e.start:e.start + 4]!r}); data.text_files "
        f"takes UTF-8 .txt or .jsonl files: convert it (iconv -t UTF-8) or leave it out.") from None
  if text_format == "jsonl":
    docs = [_jsonl_text(path, number, line)
            for number, line in enumerate(content.splitlines(), 1) if line.strip()]
  elif text_format == "lines":
    docs = content.splitlines()
  elif text_format == "blank_lines":
    docs = re.split(r"\n\s*\n", content)
  else:
    raise config_lib.ConfigError(
        f"data.text_format={text_format!r}; choose auto, blank_lines, lines or jsonl.")
  docs = ("\n".join(line.strip() for line in doc.splitlines() if line.strip()) for doc in docs)
  return [doc for doc in docs if doc]


def _jsonl_text(path: str, number: int, line: str) -> str:
  try:
    text = json.loads(line)["text"]
  except (json.JSONDecodeError, KeyError, TypeError):
    text = None
  if not isinstance(text, str):
    raise config_lib.ConfigError(f"{path} line {number} is not a JSON object with a \"text\" "
                                 f"string ({line[:60]!r}); fix the line, or pass "
                                 f"--config.data.text_format=lines to read the file as text.")
  return text


def read_text_files(patterns: str, text_format: str = "auto") -> list[str]:
  """Documents from comma-separated globs of .txt / .jsonl files, in sorted path order."""
  documents = [doc for path in _expand_globs(patterns)
               for doc in _read_text_file(path, _file_format(path, text_format))]
  if not documents:
    raise config_lib.ConfigError(f"data.text_files={patterns!r} holds no text (every file is "
                                 f"empty or blank); point --config.data.text_files at the corpus.")
  return documents


# ---------------------------------------------------------------------------------------------
# TFDS (no TensorFlow needed for array_record datasets).
# ---------------------------------------------------------------------------------------------


class _TextColumn(collections.abc.Sequence):
  """A random-access view of one text feature of TFDS records (`tfds_records`), as `str`."""

  def __init__(self, source: Sequence[Mapping[str, Any]], key: str):
    self._source = source
    self._key = key

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index):
    if isinstance(index, slice):
      return [self[i] for i in range(*index.indices(len(self)))]
    if not -len(self) <= index < len(self):   # array_record raises ValueError; Sequence needs
      raise IndexError(index)                  # IndexError to end iteration
    value = self._source[index % len(self)][self._key]
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _not_prepared_message(data_config: ml_collections.ConfigDict) -> str:
  name = data_config.tfds_name
  data_dir = data_config.tfds_data_dir or "~/tensorflow_datasets (the TFDS default)"
  return (f"TFDS dataset {name!r} is not prepared under {data_dir}, and bertfam_jax never "
          f"downloads. Prepare it once on a machine with network access: "
          f"`tfds build {name} --data_dir=DIR --file_format=array_record` (array_record gives "
          f"random access without TensorFlow), then pass --config.data.tfds_data_dir=DIR. "
          f"To run offline instead, use the embedded corpus: "
          f"`--config=configs/<paper>.py:runlocal` or --config.data.source=embedded_wiki.")


def tfds_records(name: str, split: str, data_dir: str | None, *, not_prepared: str,
                 split_flags: str) -> Sequence[Mapping[str, Any]]:
  """The records of a prepared TFDS split, never downloading.

  The dataset is read from its files alone (`<data_dir>/<name>/<newest version>/`, as
  `tfds build NAME --data_dir=DIR` writes it), never through its builder code, which
  `tfds.builder` prefers whenever it is registered: without TensorFlow that code fails for some
  datasets (SuperGLUE's features name tf.int32), and GLUE's is found only once imported.
  array_record gives a random-access data source; tfrecord is read into memory with TensorFlow.

  Args:
    name: 'dataset', 'dataset/config', optionally pinning a version ('c4/en:3.1.0').
    split: a split, optionally sliced ('train[:99%]').
    data_dir: the TFDS data dir; None for TFDS's default ones.
    not_prepared: the ConfigError message when the dataset is not in data_dir.
    split_flags: the flags that choose the split (named when it does not exist).

  Returns:
    Records as `tfds.data_source` / `tfds.as_numpy` give them (Text features are bytes).
  """
  try:
    # pylint: disable=g-import-not-at-top  (optional extra)
    import tensorflow_datasets as tfds
    from tensorflow_datasets.core import read_only_builder
  except ImportError:
    raise config_lib.ConfigError(
        "Reading TFDS datasets needs tensorflow-datasets: `pip install 'bertfam_jax[tfds]'`. "
        + not_prepared) from None
  try:
    # What `tfds.builder` falls back to when it has no builder code: the newest prepared version
    # (or the one the name pins), in data_dir or else TFDS's default data dirs.
    builder = read_only_builder.builder_from_files(name, data_dir=data_dir)
  except (tfds.core.registered.DatasetNotFoundError, FileNotFoundError):
    raise config_lib.ConfigError(not_prepared) from None
  # A sliced split ('train[:99%]') is checked by its base name; TFDS resolves the slice.
  if split.split("[")[0] not in builder.info.splits:
    raise config_lib.ConfigError(
        f"TFDS dataset {name!r} has splits {sorted(builder.info.splits)}, not {split!r}; set "
        f"{split_flags}.")
  random_access = tfds.core.file_adapters.FileFormat.with_random_access()
  if builder.info.available_file_formats() & set(random_access):
    return builder.as_data_source(split=split)
  if importlib.util.find_spec("tensorflow") is None:
    raise config_lib.ConfigError(
        f"TFDS dataset {name!r} in {builder.data_dir} is stored as tfrecord, which needs "
        f"TensorFlow to read: `pip install 'bertfam_jax[tfds]'`, or re-prepare it as array_record "
        f"(random access without TensorFlow): `tfds build {name} --data_dir=DIR "
        f"--file_format=array_record`.")
  logging.warning("Reading TFDS %s[%s] (tfrecord) into memory; prepare it as array_record for "
                  "random access to large datasets.", name, split)
  return list(tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False)))


def _tfds_documents(data_config: ml_collections.ConfigDict, split_name: str) -> Sequence[str]:
  """The `tfds_text_key` feature of a prepared TFDS split."""
  records = tfds_records(data_config.tfds_name, split_name, data_config.tfds_data_dir or None,
                         not_prepared=_not_prepared_message(data_config),
                         split_flags="--config.data.train_split / --config.data.eval_split")
  return _TextColumn(records, data_config.tfds_text_key)


# ---------------------------------------------------------------------------------------------
# The uniform interface.
# ---------------------------------------------------------------------------------------------


def cache_root(data_config: ml_collections.ConfigDict) -> str:
  """`data.cache_dir`, else $BERTFAM_CACHE, else ~/.cache/bertfam_jax."""
  return data_config.cache_dir or config_lib.default_cache_dir()


def is_eval_document(text: str, eval_fraction: float) -> bool:
  """Holds a document out by a stable hash of its text (never by position), so the split does
  not move when documents are added, removed or reordered."""
  digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
  return int.from_bytes(digest, "little") / 2.0**64 < eval_fraction


def _hash_split(documents: list[str], split: str, eval_fraction: float) -> list[str]:
  held_out = split == "eval"
  return [doc for doc in documents if is_eval_document(doc, eval_fraction) == held_out]


def get_documents(data_config: ml_collections.ConfigDict, split: str) -> Sequence[str]:
  """The documents of one split of the configured source.

  Args:
    data_config: `config.data`.
    split: 'train' or 'eval'. Embedded and text sources hold out `eval_fraction` of their
      documents by hash; TFDS uses its own `train_split` / `eval_split`.

  Returns:
    A `Sequence[str]` with len and random access (a list, or a lazy TFDS view).
  """
  if split not in ("train", "eval"):
    raise ValueError(f"split={split!r}; expected 'train' or 'eval'.")
  source = data_config.source
  if source == "tfds":
    return _tfds_documents(data_config,
                           data_config.train_split if split == "train" else data_config.eval_split)
  if source == "embedded_wiki":
    documents = embedded_wiki(cache_root(data_config))
  elif source == "text":
    documents = read_text_files(data_config.text_files, data_config.text_format)
  else:
    raise config_lib.ConfigError(
        f"data.source={source!r}; choose embedded_wiki, tfds or text.")
  if data_config.get("wordnet_glosses", False):
    documents = documents + list(_gloss_documents())
  return _hash_split(documents, split, data_config.eval_fraction)


@functools.lru_cache(maxsize=1)
def _gloss_documents() -> tuple[str, ...]:
  """`data.wordnet_glosses`' documents (`wordnet.training_gloss_documents`), built once per
  process (each split, the data identity and every experiment row read them)."""
  from bertfam_jax.data import wordnet  # pylint: disable=g-import-not-at-top  (parses on demand)
  return tuple(wordnet.training_gloss_documents())


def _gloss_identity() -> dict[str, str]:
  """{'wordnet_glosses': sha256 of the gloss documents}: what data.json records for them."""
  digest = hashlib.sha256("\f".join(_gloss_documents()).encode("utf-8")).hexdigest()
  return dict(wordnet_glosses=digest)


def data_identity(data_config: ml_collections.ConfigDict) -> dict[str, Any]:
  """What a run's documents are, recorded in its workdir (data.json) and compared on resume:
  the source and its held-out fraction, and the content (sha256) of every text file or of the
  extracted embedded corpus, or the TFDS dataset's name, resolved version and splits. `paths`
  name the files in messages and are never compared (a workdir may move between machines).
  Call it after `get_documents`, which extracts the embedded corpus."""
  d = data_config
  if d.source == "tfds":
    return dict(source="tfds", tfds_name=d.tfds_name, version=_tfds_version(d),
                train_split=d.train_split, eval_split=d.eval_split, text_key=d.tfds_text_key)
  glosses = _gloss_identity() if d.get("wordnet_glosses", False) else {}
  if d.source == "text":
    paths = [fileio.absolute(p) for p in _expand_globs(d.text_files)]
    return dict(source="text", text_format=d.text_format, eval_fraction=d.eval_fraction,
                files=[_sha256(p) for p in paths], paths=paths, **glosses)
  return dict(source=d.source, eval_fraction=d.eval_fraction,
              documents=_sha256(_embedded_wiki_path(cache_root(d))), **glosses)


def identity_changes(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
  """'field: saved → current' for each difference of two `data_identity`s, the source first."""
  keys = sorted((set(saved) | set(current)) - {"paths"}, key=lambda k: (k != "source", k))
  changes = []
  for key in keys:
    before, after = saved.get(key), current.get(key)
    if before == after:
      continue
    if key == "files":
      changes.append(f"data files {_files(saved)} → {_files(current)}")
    elif key == "documents":
      changes.append(f"the embedded corpus (sha256 {str(before)[:12]} → {str(after)[:12]})")
    else:
      changes.append(f"data.{key}: {before!r} → {after!r}")
  return changes


def _files(identity: Mapping[str, Any]) -> str:
  named = zip(identity.get("paths", []), identity.get("files", []))
  return "[" + ", ".join(f"{os.path.basename(p)} sha256 {h[:12]}" for p, h in named) + "]"


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with fileio.open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def _tfds_version(data_config: ml_collections.ConfigDict) -> str:
  """The version of the prepared TFDS dataset a run reads (the newest, unless its name pins
  one): what `tfds_records` opens."""
  # pylint: disable=g-import-not-at-top  (optional extra; tfds_records has already imported it)
  from tensorflow_datasets.core import read_only_builder
  builder = read_only_builder.builder_from_files(data_config.tfds_name,
                                                 data_dir=data_config.tfds_data_dir or None)
  return str(builder.info.version)


def source_identity(data_config: ml_collections.ConfigDict) -> str:
  """A string that changes whenever the training documents may change (keys tokenizer caches).

  Local files are identified by path, size and modification time rather than content, which
  would mean reading every file; files in an object store by content.
  """
  if data_config.source == "tfds":
    parts = ["tfds", data_config.tfds_name, data_config.tfds_data_dir, data_config.train_split,
             data_config.tfds_text_key]
  elif data_config.source == "text":
    parts = ["text", data_config.text_format, str(data_config.eval_fraction)]
    for path in _expand_globs(data_config.text_files):
      if fileio.is_remote(path):
        parts.append(f"{path}:{_sha256(path)}")
      else:
        stat = os.stat(path)
        parts.append(f"{os.path.abspath(path)}:{stat.st_size}:{stat.st_mtime_ns}")
  else:
    parts = [data_config.source, _WIKI_DUMP, str(data_config.eval_fraction)]
  if data_config.get("wordnet_glosses", False):
    parts.append("wordnet_glosses")
  return "|".join(parts)


# ---------------------------------------------------------------------------------------------
# Sentences and sharding.
# ---------------------------------------------------------------------------------------------

# Words that end in '.' without ending a sentence (compared lower-cased, without the dot).
_ABBREVIATIONS = frozenset("""
mr mrs ms dr prof sr jr st mt ft vs v no nos fig figs vol vols ch pp p ed eds rev gen col lt
capt sgt maj cmdr adm gov pres sen rep hon mssrs messrs inc ltd co corp bros dept univ
approx ca cf al jan feb mar apr jun jul aug sep sept oct nov dec est op ibid viz
""".split())
# A sentence ends at . ! or ? (plus closing quotes/brackets), then whitespace, then something that
# can start a sentence: an upper-case letter, a digit, or an opening quote/bracket.
_BOUNDARY = re.compile(r"([.!?]+)([\"'”’)\]]*)\s+(?=[\"'“‘(\[]*[A-Z0-9])")
_LAST_WORD = re.compile(r"(\S+)$")
_INITIALISM = re.compile(r"^(?:[A-Za-z]\.)+[A-Za-z]$")   # e.g, i.e, U.S, Ph.D


def _ends_with_abbreviation(prefix: str) -> bool:
  """Whether the word right before a '.' is an abbreviation or an initial, not a sentence end."""
  match = _LAST_WORD.search(prefix)
  if not match:
    return False
  word = match.group(1).lstrip("\"'“‘([")
  return (word.lower() in _ABBREVIATIONS or
          (len(word) == 1 and word.isalpha()) or   # initials: "J. R. R. Tolkien"
          bool(_INITIALISM.match(word)))


def _split_line(line: str) -> list[str]:
  sentences, start = [], 0
  for match in _BOUNDARY.finditer(line):
    if match.group(1) == "." and _ends_with_abbreviation(line[start:match.start()]):
      continue
    sentences.append(line[start:match.end(2)])
    start = match.end()
  sentences.append(line[start:])
  return [s.strip() for s in sentences if s.strip()]


def split_sentences(text: str) -> list[str]:
  """Splits a document into sentences; newlines (paragraphs, input lines) are hard boundaries.

  A regex splitter in the spirit of Punkt without its trained statistics: breaks after . ! ?
  followed by whitespace and an upper-case letter, digit or opening quote, except after common
  abbreviations ("Mr.", "e.g.", "Fig."), initials ("J. R. R.") and dotted initialisms ("U.S.").
  Decimals ("3.14") never match because no whitespace follows the dot.
  """
  return [sentence for line in text.split("\n") for sentence in _split_line(line)]


def process_shard(num_docs: int, process_index: int, process_count: int) -> np.ndarray:
  """The document indices of shard `process_index` of `process_count` (a data shard of the
  pipeline, by default one per process): contiguous, disjoint, together covering all.

  Contiguous ranges (as `tfds.even_splits`) keep each host's reads local in record files.

  Returns:
    [num_docs // process_count (+1)] int64 indices.
  """
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} outside [0, {process_count}).")
  start = process_index * num_docs // process_count
  stop = (process_index + 1) * num_docs // process_count
  return np.arange(start, stop, dtype=np.int64)
