r"""Host throughput of the numpy data path, in tokens per second per CPU core.

Stages, each at every --seq_lens:
  mask/bert, mask/roberta         `noise.bert_mask` / `noise.roberta_mask` on packed batches.
  pack+mask/bert                  `packing.sentence_pairs` then `bert_mask` (BERT's pipeline).
  pack+mask/roberta               `packing.full_sentences` then `roberta_mask` (RoBERTa's).

Documents are synthetic (sentences of --min_sentence_len..--max_sentence_len random ids), so no
tokenizer or corpus is needed. A token is one sequence position of the output (n * L), padding
included. The process is pinned to one core and numpy's thread pools to one thread, so tokens/s
is per core.

  python benchmarks/host_pipeline.py --seq_lens=128,512
"""

import os

# Thread pools read these when numpy is first imported, so they come before the imports below.
_THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
for _name in _THREAD_ENV:
  os.environ[_name] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from bertfam_jax import config_lib  # noqa: E402
from bertfam_jax.data import packing  # noqa: E402
from bertfam_jax.objectives import noise  # noqa: E402

# BERT uncased WordPiece layout: [PAD]=0, [CLS]=101, [SEP]=102, [MASK]=103 of 30,522.
BERT_IDS = dict(pad_id=0, cls_id=101, sep_id=102, mask_id=103, vocab_size=30522)
# fairseq RoBERTa dictionary: <s>=0, <pad>=1, </s>=2, <unk>=3 (4 specials), <mask> last of 50,265.
ROBERTA_IDS = dict(cls_id=0, pad_id=1, sep_id=2, mask_id=50264, vocab_size=50265, num_special=4)


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
                 sep_id: int, pad_id: int, vocab_size: int, short_seq_prob: float = 0.1,
                 **unused_ids) -> dict[str, np.ndarray]:
  """`[CLS] body [SEP]` rows: full length, or with `short_seq_prob` a uniform shorter length."""
  del unused_ids
  lengths = np.where(rng.random(num_examples) < short_seq_prob,
                     rng.integers(4, seq_len + 1, num_examples), seq_len)
  input_mask = (np.arange(seq_len) < lengths[:, None]).astype(np.int32)
  input_ids = np.where(input_mask > 0, rng.integers(5, vocab_size, (num_examples, seq_len)), pad_id)
  input_ids[:, 0] = cls_id
  input_ids[np.arange(num_examples), lengths - 1] = sep_id
  return dict(input_ids=input_ids.astype(np.int32), input_mask=input_mask,
              segment_ids=np.zeros_like(input_mask))


def bert_features(examples, rng, *, max_predictions):
  ids = BERT_IDS
  return noise.bert_mask(examples, rng, mask_rate=0.15, max_predictions=max_predictions,
                         special_ids=(ids["cls_id"], ids["sep_id"]), mask_id=ids["mask_id"],
                         vocab_size=ids["vocab_size"])


def roberta_features(examples, rng, *, max_predictions):
  ids = ROBERTA_IDS
  return noise.roberta_mask(examples, rng, mask_rate=0.15, max_predictions=max_predictions,
                            mask_id=ids["mask_id"], vocab_size=ids["vocab_size"],
                            num_special=ids["num_special"])


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

  rows = []
  for seq_len in map(int, args.seq_lens.split(",")):
    # BERT's 20 at 128 (README: ~0.15 L); the +1 covers fairseq's probabilistic rounding up.
    max_predictions = config_lib.mask_budget(seq_len, 0.15) + 1
    bert_batch = packed_batch(args.batch_size, seq_len, rng, **BERT_IDS)
    roberta_batch = packed_batch(args.batch_size, seq_len, rng, **ROBERTA_IDS)
    docs = {name: synthetic_docs(args.num_docs, rng, vocab_size=ids["vocab_size"],
                                 min_sentences=args.min_sentences,
                                 max_sentences=args.max_sentences,
                                 min_len=args.min_sentence_len, max_len=args.max_sentence_len)
            for name, ids in (("bert", BERT_IDS), ("roberta", ROBERTA_IDS))}
    special = {name: dict(cls_id=ids["cls_id"], sep_id=ids["sep_id"], pad_id=ids["pad_id"])
               for name, ids in (("bert", BERT_IDS), ("roberta", ROBERTA_IDS))}

    def mask_only(features, batch):
      return lambda: features(batch, rng, max_predictions=max_predictions)["input_ids"].size

    def bert_end_to_end():
      examples = packing.sentence_pairs(docs["bert"], seq_len, rng, short_seq_prob=0.1,
                                        **special["bert"])
      return bert_features(examples, rng, max_predictions=max_predictions)["input_ids"].size

    def roberta_end_to_end():
      examples = packing.full_sentences(docs["roberta"], seq_len, **special["roberta"])
      return roberta_features(examples, rng, max_predictions=max_predictions)["input_ids"].size

    stages = (("mask/bert", mask_only(bert_features, bert_batch)),
              ("mask/roberta", mask_only(roberta_features, roberta_batch)),
              ("pack+mask/bert", bert_end_to_end),
              ("pack+mask/roberta", roberta_end_to_end))
    for stage, fn in stages:
      rows.append((stage, seq_len, tokens_per_second(fn, args.repeats)))

  print("| stage | L | tokens/s per core |\n|---|---|---|")
  for stage, seq_len, rate in rows:
    print(f"| {stage} | {seq_len} | {rate / 1e6:.2f} M |")


if __name__ == "__main__":
  main()
