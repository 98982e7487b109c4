r"""Host throughput of the numpy data path, in tokens per second per CPU core.

Each rule is the objective and packing of a shipped config, noised by the features function the
trainer uses (the objective's `make_features`), with that model's released vocabulary layout:
  bert            configs/bert.py: token masking never on [CLS]/[SEP], round(15%), 80/10/10
                  with uniform random tokens; `sentence_pairs` (NSP).
  roberta         configs/roberta.py: fairseq masking over all tokens, probabilistic rounding,
                  random tokens never special; `full_sentences`.
  albert-ngram    configs/albert.py: whole-word n-grams up to 3 (p(n) ∝ 1/n); `sentence_pairs`
                  (SOP).
  spanbert-span   configs/spanbert.py: geometric spans of words, ceil(15%), one 80/10/10 draw
                  per span, unigram random tokens, SBO inputs; `document_blocks`.
  electra         configs/electra.py: positions drawn with replacement, 85% [MASK] / 15% kept;
                  `electra_segments` (ExampleBuilder).

Stages, each at every --seq_lens and for every rule:
  mask/<rule>        the features function on ready `[CLS] body [SEP]` batches.
  pack+mask/<rule>   the config's packing of --num_docs documents, then the features function.

Every rule predicts up to 15% of a row (max_predictions = round(0.15 L) + 1, the +1 for
fairseq's rounding up), ALBERT included (its shipped 20 at 512 would predict ~3.9%), so the rows
compare like with like. Documents are synthetic (sentences of
--min_sentence_len..--max_sentence_len random ids; 77% of the pieces begin a word, ~1.3 pieces a
word), so no tokenizer or corpus is needed. A token is one sequence position of the output
(n * L), padding included. The process is pinned to one core and numpy's thread pools to one
thread, so tokens/s is per core.

  python benchmarks/host_pipeline.py --seq_lens=128,512
"""

import os

# Thread pools read these when numpy is first imported, so they come before the imports below.
_THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
for _name in _THREAD_ENV:
  os.environ[_name] = "1"

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import pathlib  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402

import numpy as np  # noqa: E402

from bertfam_jax import config_lib, objectives  # noqa: E402
from bertfam_jax.data import packing  # noqa: E402

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
# Vocabulary layouts of the released models (the vocabulary size comes from the config).
# BERT uncased / SpanBERT cased WordPiece: [PAD]=0, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103.
WORDPIECE_IDS = dict(pad_id=0, unk_id=100, cls_id=101, sep_id=102, mask_id=103)
# fairseq RoBERTa dictionary: <s>=0, <pad>=1, </s>=2, <unk>=3 (never random tokens), <mask> last.
FAIRSEQ_IDS = dict(cls_id=0, pad_id=1, sep_id=2, unk_id=3, mask_id=50264)
# ALBERT SentencePiece (and this project's tokenizer): <pad>=0, <unk>=1, [CLS]=2, [SEP]=3, [MASK]=4.
SENTENCEPIECE_IDS = dict(pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4)
# rule -> (configs/<name>.py, its vocabulary layout).
RULES = {
    "bert": ("bert", WORDPIECE_IDS),
    "roberta": ("roberta", FAIRSEQ_IDS),
    "albert-ngram": ("albert", SENTENCEPIECE_IDS),
    "spanbert-span": ("spanbert", WORDPIECE_IDS),
    "electra": ("electra", WORDPIECE_IDS),
}
WORD_START_SHARE = 0.77  # Share of word-initial pieces: words of ~1.3 pieces, as in WordPiece.


def load_config(name: str):
  """`configs/<name>.py` with its default argument, loaded from its file as config_flags does."""
  spec = importlib.util.spec_from_file_location(f"configs_{name}", CONFIGS / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(None)


def fake_tokenizer(ids: dict, vocab_size: int, rng: np.random.Generator) -> types.SimpleNamespace:
  """The tokenizer attributes `make_features` reads, with a random word-initial piece table."""
  special_ids = np.array([ids["pad_id"], ids["cls_id"], ids["sep_id"], ids["mask_id"]])
  word_start = rng.random(vocab_size) < WORD_START_SHARE
  word_start[special_ids] = True
  return types.SimpleNamespace(**ids, special_ids=special_ids, word_start=word_start)


def pack(config, docs, rng: np.random.Generator, tokenizer) -> dict[str, np.ndarray]:
  """`config.data.packing` of `docs`, as data/pipeline.py packs a chunk."""
  data = config.data
  ids = dict(cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id, pad_id=tokenizer.pad_id)
  if data.packing == "sentence_pairs":
    return packing.sentence_pairs(docs, data.seq_len, rng, short_seq_prob=data.short_seq_prob,
                                  pair_mode=config.objective.sentence_task or "nsp", **ids)
  if data.packing == "electra_segments":
    return packing.electra_segments(docs, data.seq_len, rng, **ids)
  blocks = {"full_sentences": packing.full_sentences, "document_blocks": packing.document_blocks}
  return blocks[data.packing](docs, data.seq_len, **ids)


def synthetic_docs(num_docs: int, rng: np.random.Generator, *, vocab_size: int, min_sentences: int,
                   max_sentences: int, min_len: int, max_len: int) -> list[list[np.ndarray]]:
  """Documents -> sentences -> int32 ids drawn uniformly from [5, vocab_size)."""
  docs = []
  for num_sentences in rng.integers(min_sentences, max_sentences + 1, num_docs):
    lengths = rng.integers(min_len, max_len + 1, num_sentences)
    tokens = rng.integers(5, vocab_size, lengths.sum(), dtype=np.int32)
    docs.append(np.split(tokens, np.cumsum(lengths)[:-1]))
  return docs


def packed_batch(num_examples: int, seq_len: int, rng: np.random.Generator, *, cls_id: int,
                 sep_id: int, pad_id: int, vocab_size: int,
                 short_seq_prob: float = 0.1) -> dict[str, np.ndarray]:
  """`[CLS] body [SEP]` rows: full length, or with `short_seq_prob` a uniform shorter length."""
  lengths = np.where(rng.random(num_examples) < short_seq_prob,
                     rng.integers(4, seq_len + 1, num_examples), seq_len)
  input_mask = (np.arange(seq_len) < lengths[:, None]).astype(np.int32)
  input_ids = np.where(input_mask > 0, rng.integers(5, vocab_size, (num_examples, seq_len)), pad_id)
  input_ids[:, 0] = cls_id
  input_ids[np.arange(num_examples), lengths - 1] = sep_id
  return dict(input_ids=input_ids.astype(np.int32), input_mask=input_mask,
              segment_ids=np.zeros_like(input_mask))


def mask_only(features, batch, rng):
  """A timed call: the features function on a ready batch; returns the tokens produced."""
  return lambda: features(batch, rng)["input_ids"].size


def pack_and_mask(features, config, docs, tokenizer, rng):
  """A timed call: the config's packing of `docs`, then the features function."""
  return lambda: features(pack(config, docs, rng, tokenizer), rng)["input_ids"].size


def tokens_per_second(fn, repeats: int) -> float:
  """Median over `repeats` timed calls (after one warm-up) of output positions per second."""
  fn()
  rates = []
  for _ in range(repeats):
    start = time.perf_counter()
    num_tokens = fn()
    rates.append(num_tokens / (time.perf_counter() - start))
  return statistics.median(rates)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--seq_lens", default="128,512", help="comma-separated sequence lengths")
  parser.add_argument("--batch_size", type=int, default=256, help="examples per masking call")
  parser.add_argument("--num_docs", type=int, default=400, help="documents per packing call")
  parser.add_argument("--min_sentences", type=int, default=5)
  parser.add_argument("--max_sentences", type=int, default=60)
  parser.add_argument("--min_sentence_len", type=int, default=10)
  parser.add_argument("--max_sentence_len", type=int, default=40)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--cpu", type=int, default=0, help="the core to pin the process to")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)

  os.sched_setaffinity(0, {args.cpu})
  rng = np.random.default_rng(args.seed)
  print(f"pinned: CPU affinity {sorted(os.sched_getaffinity(0))}; "
        f"{', '.join(f'{name}=1' for name in _THREAD_ENV)}; numpy {np.__version__}")
  print(f"batch_size={args.batch_size} num_docs={args.num_docs} "
        f"sentences/doc={args.min_sentences}..{args.max_sentences} "
        f"sentence_len={args.min_sentence_len}..{args.max_sentence_len} repeats={args.repeats}\n")

  configs = {rule: load_config(name) for rule, (name, _) in RULES.items()}
  tokenizers = {rule: fake_tokenizer(ids, configs[rule].model.vocab_size, rng)
                for rule, (_, ids) in RULES.items()}
  rows = []
  for seq_len in map(int, args.seq_lens.split(",")):
    # BERT's 20 at 128 (README: ~0.15 L); the +1 covers fairseq's probabilistic rounding up.
    max_predictions = config_lib.mask_budget(seq_len, 0.15) + 1
    mask_stages, end_to_end_stages = [], []
    for rule, shipped in configs.items():
      config = shipped.copy_and_resolve_references()
      tokenizer, vocab_size = tokenizers[rule], config.model.vocab_size
      config.data.seq_len = seq_len
      config.objective.max_predictions = max_predictions
      features = objectives.get(config.objective.name).make_features(config, tokenizer)
      batch = packed_batch(args.batch_size, seq_len, rng, cls_id=tokenizer.cls_id,
                           sep_id=tokenizer.sep_id, pad_id=tokenizer.pad_id,
                           vocab_size=vocab_size)
      docs = synthetic_docs(args.num_docs, rng, vocab_size=vocab_size,
                            min_sentences=args.min_sentences, max_sentences=args.max_sentences,
                            min_len=args.min_sentence_len, max_len=args.max_sentence_len)
      mask_stages.append((f"mask/{rule}", mask_only(features, batch, rng)))
      end_to_end_stages.append((f"pack+mask/{rule}",
                                pack_and_mask(features, config, docs, tokenizer, rng)))
    for stage, fn in mask_stages + end_to_end_stages:
      rows.append((stage, seq_len, tokens_per_second(fn, args.repeats)))

  print("| stage | L | tokens/s per core |\n|---|---|---|")
  for stage, seq_len, rate in rows:
    print(f"| {stage} | {seq_len} | {rate / 1e6:.2f} M |")


if __name__ == "__main__":
  main()
