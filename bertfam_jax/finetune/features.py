"""Fine-tuning features: raw examples (`finetune.tasks` formats) -> fixed-length numpy arrays.

The tokenizer is duck-typed: `bertfam_jax.data.tokenizers.Tokenizer` or `bertfam_jax.hf`'s
HFTokenizer, anything with pad_id, cls_id, sep_id, pair_separator_ids, encode(texts) and
encode_with_offsets(texts) (character [start, end) of each token, never covering the whitespace
before a word). Layouts are BERT's (google-research/bert run_classifier.py, run_squad.py):

  single text   [CLS] A [SEP]                    segment 0
  pair          [CLS] A <separator> B [SEP]      segment 0 up to the separator, 1 for B [SEP]
  QA            [CLS] question <separator> context-window [SEP]

with <separator> = tokenizer.pair_separator_ids ([SEP] for BERT/ALBERT/ELECTRA, </s></s> for
RoBERTa, whose <s> / </s> are cls_id / sep_id). Every function returns int32 arrays padded with
pad_id (input_mask 0 there).

XLNet's layout (`layout='xlnet'`, xlnet classifier_utils.py convert_single_example) for
classification, regression and multiple choice: `A <sep> (B <sep>) <cls>` with segments 0, 1 and
2 (SEG_ID_CLS), padded on the LEFT with segment 4 (SEG_ID_PAD), so that <cls>, the summary
token, is always last. Tagging and QA rows keep BERT's layout for XLNet too (the reference's
SQuAD puts the context first; not built).

GPT's input transformations (`layout='gpt'`, Radford et al. 2018 §3.3, finetune-transformer-lm
train.py transform_roc): `[start] A [extract]` and `[start] A [delim] B [extract]` (one row per
choice for multiple choice: context as A, the choice as B), padded on the RIGHT (its positions
are absolute), segment 0 everywhere. GPT adds three tokens at fine-tuning; here they are the
tokenizer's cls_id, sep_id and mask_id, pieces that causal pre-training never reads
(`packing.lm_stream` rows hold text and <eod> only), and their embedding rows start from the
fresh initialisation as the paper's new ones (`run.with_fresh_token_rows`; the pre-trained rows
were trained as never-correct classes of the tied softmax).
Similarity (`ft.pair_orders=2`): both orders of each pair, [examples, 2, length].
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from bertfam_jax.config_lib import ConfigError
from bertfam_jax.finetune import metrics


def truncated_pair_lengths(length_a: int, length_b: int, max_tokens: int) -> tuple[int, int]:
  """The lengths BERT's `_truncate_seq_pair` leaves: it drops the last token of the longer segment
  (of B on a tie) until both fit in `max_tokens`; computed in closed form."""
  if length_a + length_b <= max_tokens:
    return length_a, length_b
  kept_a = min(length_a, max(max_tokens - length_b, (max_tokens + 1) // 2))
  return kept_a, max_tokens - kept_a


def _empty_inputs(num_rows: int, seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
  return dict(input_ids=np.full((num_rows, seq_len), pad_id, np.int32),
              input_mask=np.zeros((num_rows, seq_len), np.int32),
              segment_ids=np.zeros((num_rows, seq_len), np.int32))


def _put(inputs: dict[str, np.ndarray], row: int, ids: Sequence[int], length_a: int) -> None:
  """Writes one row: `ids` from position 0, segment 1 from `length_a` on."""
  inputs["input_ids"][row, :len(ids)] = ids
  inputs["input_mask"][row, :len(ids)] = 1
  inputs["segment_ids"][row, length_a:len(ids)] = 1


LAYOUTS = ("bert", "xlnet", "gpt")
XLNET_SEGMENT_CLS, XLNET_SEGMENT_PAD = 2, 4


def _put_xlnet(inputs: dict[str, np.ndarray], row: int, segments: Sequence[Sequence[int]],
               cls_id: int) -> None:
  """Writes one XLNet row right-aligned: segment k's ids with segment id k, then <cls> (2); the
  left padding keeps segment 4."""
  ids = [i for segment in segments for i in segment] + [cls_id]
  segment_ids = [k for k, segment in enumerate(segments) for _ in segment] + [XLNET_SEGMENT_CLS]
  start = inputs["input_ids"].shape[1] - len(ids)
  inputs["input_ids"][row, start:] = ids
  inputs["input_mask"][row, start:] = 1
  inputs["segment_ids"][row, :start] = XLNET_SEGMENT_PAD
  inputs["segment_ids"][row, start:] = segment_ids


def encode_pairs(tokenizer, texts: Sequence[str], seq_len: int,
                 texts_b: Sequence[str] | None = None, layout: str = "bert"
                 ) -> dict[str, np.ndarray]:
  """BERT's `convert_single_example` for classification and regression (XLNet's with
  `layout='xlnet'`, GPT's input transformations with 'gpt': the module docstring).

  Single texts are cut to seq_len - 2 tokens; pairs lose tokens from the end of the longer
  segment first (`truncated_pair_lengths`), to seq_len - 3 in both layouts.

  Returns:
    input_ids, input_mask, segment_ids: [examples, seq_len] int32.
  """
  if layout not in LAYOUTS:
    raise ValueError(f"layout={layout!r}; choose one of {LAYOUTS}.")
  separator = [] if texts_b is None else list(tokenizer.pair_separator_ids)
  specials = 2 + len(separator)
  if layout == "gpt":
    separator = [] if texts_b is None else [tokenizer.sep_id]
    specials = 2 + len(separator)
    if None in (tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id):
      raise ConfigError("GPT's input transformations take the tokenizer's [CLS], [SEP] and [MASK] "
                        "as start, delimiter and extract tokens, and this tokenizer lacks one "
                        "(GPT-2's has <|endoftext|> only); fine-tune a GPT of configs/gpt.py.")
  if seq_len <= specials:
    raise ConfigError(f"seq_len={seq_len} leaves no room for text after {specials} special tokens.")
  if texts_b is not None and len(texts_b) != len(texts):
    raise ValueError(f"{len(texts)} first texts but {len(texts_b)} second texts.")
  pieces_a = tokenizer.encode(texts)
  pieces_b = tokenizer.encode(texts_b) if texts_b is not None else [None] * len(pieces_a)
  inputs = _empty_inputs(len(pieces_a), seq_len, tokenizer.pad_id)
  for row, (a, b) in enumerate(zip(pieces_a, pieces_b)):
    if layout == "xlnet":
      kept_a, kept_b = ((min(len(a), seq_len - 2), 0) if b is None else
                        truncated_pair_lengths(len(a), len(b), seq_len - specials))
      segments = [[*a[:kept_a], tokenizer.sep_id]]
      if b is not None:
        segments.append([*b[:kept_b], tokenizer.sep_id])
      _put_xlnet(inputs, row, segments, tokenizer.cls_id)
      continue
    last = tokenizer.mask_id if layout == "gpt" else tokenizer.sep_id   # GPT's extract token
    if b is None:
      ids = [tokenizer.cls_id, *a[:seq_len - 2], last]
      length_a = len(ids)
    else:
      kept_a, kept_b = truncated_pair_lengths(len(a), len(b), seq_len - specials)
      ids = [tokenizer.cls_id, *a[:kept_a], *separator, *b[:kept_b], last]
      length_a = 1 + kept_a + len(separator)
    _put(inputs, row, ids, length_a if layout != "gpt" else len(ids))
  return inputs


def choice_features(tokenizer, examples: Sequence[dict], seq_len: int, layout: str = "bert"
                    ) -> dict[str, np.ndarray]:
  """Multiple choice ({question, choices, label}) as BERT's SWAG recipe: one pair
  `[CLS] question <separator> choice [SEP]` per choice (XLNet's RACE: its pair layout).

  Returns:
    input_ids, input_mask, segment_ids: [examples, choices, seq_len] int32; label [examples] int32.
  """
  num_choices = {len(e["choices"]) for e in examples}
  if len(num_choices) != 1:
    raise ValueError(f"Every example needs the same number of choices; got {sorted(num_choices)}.")
  (choices,) = num_choices
  flat = encode_pairs(tokenizer, [e["question"] for e in examples for _ in e["choices"]], seq_len,
                      [c for e in examples for c in e["choices"]], layout)
  features = {k: v.reshape(len(examples), choices, seq_len) for k, v in flat.items()}
  features["label"] = np.asarray([e["label"] for e in examples], np.int32).reshape(-1)
  return features


# ----------------------------------------------------------------------------- token classification


def token_words(words: Sequence[str], offsets: np.ndarray) -> np.ndarray:
  """For each token of " ".join(words), the index of the word holding its last character, or -1
  for a token of no character (a bare '▁') or of whitespace only."""
  starts = np.cumsum([0] + [len(w) + 1 for w in words])[:-1]
  ends = starts + np.asarray([len(w) for w in words], np.int64)
  last = offsets[:, 1] - 1
  token_word = np.searchsorted(starts, last, side="right") - 1
  inside = (offsets[:, 1] > offsets[:, 0]) & (token_word >= 0)
  inside &= last < ends[np.maximum(token_word, 0)]
  return np.where(inside, token_word, -1)


def tagging_features(tokenizer, examples: Sequence[dict], seq_len: int) -> dict[str, np.ndarray]:
  """Token classification ({words, labels}) as BERT's NER recipe: each word's label on its first
  sub-token, label_weights 1 there and 0 on every other position.

  The words are joined by spaces and tokenized as one text (`encode_with_offsets`), tokens
  mapped to words by character offsets. For WordPiece and SentencePiece that gives the tokens of
  BERT's README recipe (tokenize each word on its own), since neither lets a token cross a
  space; for byte-level BPE it gives what pre-training saw ('Ġword' after a space), which
  word-by-word encoding would not. Words beyond seq_len - 2 tokens are cut (their
  `word_positions` are -1; `word_predictions` fills them with label 0).

  Returns:
    input_ids, input_mask, segment_ids, labels, label_weights: [examples, seq_len] int32;
    word_positions: [examples, max words] int32, the position of each word's first sub-token (-1
    past the sentence or when cut).
  """
  ids, offsets = tokenizer.encode_with_offsets([" ".join(e["words"]) for e in examples])
  inputs = _empty_inputs(len(examples), seq_len, tokenizer.pad_id)
  labels = np.zeros((len(examples), seq_len), np.int32)
  weights = np.zeros((len(examples), seq_len), np.int32)
  max_words = max([len(e["words"]) for e in examples], default=0)
  word_positions = np.full((len(examples), max_words), -1, np.int32)
  for row, (example, row_ids, row_offsets) in enumerate(zip(examples, ids, offsets)):
    if len(example["labels"]) != len(example["words"]):
      raise ValueError(f"Example {row} has {len(example['words'])} words but "
                       f"{len(example['labels'])} labels.")
    kept = min(len(row_ids), seq_len - 2)
    ids_row = [tokenizer.cls_id, *row_ids[:kept], tokenizer.sep_id]
    _put(inputs, row, ids_row, len(ids_row))   # one segment
    token_word = token_words(example["words"], np.asarray(row_offsets).reshape(-1, 2))[:kept]
    for token, word in enumerate(token_word):
      if word >= 0 and word_positions[row, word] < 0:
        word_positions[row, word] = token + 1   # after [CLS]
    kept_words = word_positions[row, :len(example["words"])] >= 0
    first = word_positions[row, :len(example["words"])][kept_words]
    labels[row, first] = np.asarray(example["labels"])[kept_words]
    weights[row, first] = 1
  return dict(inputs, labels=labels, label_weights=weights, word_positions=word_positions)


def word_predictions(predicted_ids: np.ndarray, word_positions: np.ndarray,
                     num_words: Sequence[int]) -> list[list[int]]:
  """[examples, seq_len] predicted label ids -> each example's per-word labels (label 0 for a
  word cut by truncation), the input of `metrics.tagging_metrics` after mapping to names."""
  predicted_ids = np.asarray(predicted_ids)
  return [[int(predicted_ids[row, p]) if p >= 0 else 0 for p in word_positions[row, :n]]
          for row, n in enumerate(num_words)]


# ------------------------------------------------------------------------------- extractive QA


def _answer_tokens(example: dict, offsets: np.ndarray) -> tuple[int, int] | None:
  """The first answer's [first, last] context token, or None when the example has no answer or
  its answer_start does not point at its text (run_squad.py drops those when training).

  Tokens are those overlapping the answer's characters, so an answer inside a token ('Japan' of
  'Japanese') takes the whole token, as run_squad.py's whitespace words do."""
  if example.get("is_impossible") or not example["answers"]:
    return None
  answer = example["answers"][0]
  start, text = answer["answer_start"], answer["text"]
  end = start + len(text)
  if not text or example["context"][start:end] != text:
    return None
  overlapping = np.flatnonzero((offsets[:, 0] < end) & (offsets[:, 1] > start))
  return (int(overlapping[0]), int(overlapping[-1])) if overlapping.size else None


def doc_windows(num_tokens: int, max_tokens: int, doc_stride: int) -> list[tuple[int, int]]:
  """run_squad.py's sliding windows (start, length) over `num_tokens` context tokens: each
  starts min(length, doc_stride) after the previous one, the last ends at the last token."""
  windows, start = [], 0
  while True:
    length = min(num_tokens - start, max_tokens)
    windows.append((start, length))
    if start + length >= num_tokens:
      return windows
    start += min(length, doc_stride)


def max_context_window(windows: Sequence[tuple[int, int]], position: int) -> int:
  """run_squad.py `_check_is_max_context`: the window where the token has the most context,
  score min(left, right) + 0.01 · length, the first on ties; -1 if no window holds it."""
  best, best_score = -1, None
  for index, (start, length) in enumerate(windows):
    if start <= position < start + length:
      score = min(position - start, start + length - 1 - position) + 0.01 * length
      if best_score is None or score > best_score:
        best, best_score = index, score
  return best


def qa_features(tokenizer, examples: Sequence[dict], seq_len: int = 384, doc_stride: int = 128,
                max_query_len: int = 64, *, is_training: bool = False) -> dict[str, np.ndarray]:
  """run_squad.py `convert_examples_to_features` on tokenizer character offsets.

  The question is cut to max_query_len tokens; the context is covered by windows of
  seq_len - question - 2 - len(separator) tokens, doc_stride apart (`doc_windows`), one feature
  each. start/end_position are the answer's tokens in the feature (the first answer's, by its
  answer_start), or 0 ([CLS]) when the example is unanswerable or the answer lies outside the
  window. With is_training, answerable examples whose answer_start does not point at the answer
  text are dropped, as run_squad.py's read_squad_examples does.

  Returns:
    input_ids, input_mask, segment_ids: [features, seq_len] int32;
    start_position, end_position, example_index: [features] int32;
    is_impossible: [features] int32, the example's flag (ELECTRA's answerable classifier's
      label: 0 also for a window of an answerable example that misses the answer, as
      qa_tasks.py's featurize);
    token_offsets: [features, seq_len, 2] int32, the character [start, end) in the example's
      context of each context token, -1 elsewhere (question, specials, padding);
    token_is_max_context: [features, seq_len] bool, whether this feature is the token's
      max-context window (`max_context_window`).
  """
  if seq_len <= max_query_len + 3:
    raise ConfigError(f"seq_len={seq_len} must exceed max_query_len={max_query_len} + 3 "
                      f"(run_squad.py's check).")
  separator = list(tokenizer.pair_separator_ids)
  queries = tokenizer.encode([e["question"] for e in examples])
  contexts, context_offsets = tokenizer.encode_with_offsets([e["context"] for e in examples])
  example_index, windows_ids, context_starts, window_offsets, max_contexts, positions = (
      [] for _ in range(6))
  impossible = []
  for index, (example, query, ids, offsets) in enumerate(
      zip(examples, queries, contexts, context_offsets)):
    offsets = np.asarray(offsets, np.int32).reshape(-1, 2)
    answer = _answer_tokens(example, offsets)
    if is_training and answer is None and not example.get("is_impossible"):
      continue
    prefix = [tokenizer.cls_id, *query[:max_query_len], *separator]
    windows = doc_windows(len(ids), seq_len - len(prefix) - 1, doc_stride)
    for window_index, (start, length) in enumerate(windows):
      example_index.append(index)
      impossible.append(bool(example.get("is_impossible")))
      windows_ids.append([*prefix, *ids[start:start + length], tokenizer.sep_id])
      context_starts.append(len(prefix))
      window_offsets.append(offsets[start:start + length])
      max_contexts.append([max_context_window(windows, p) == window_index
                           for p in range(start, start + length)])
      inside = answer is not None and start <= answer[0] and answer[1] < start + length
      positions.append([len(prefix) + t - start for t in answer] if inside else [0, 0])

  inputs = _empty_inputs(len(windows_ids), seq_len, tokenizer.pad_id)
  token_offsets = np.full((len(windows_ids), seq_len, 2), -1, np.int32)
  is_max_context = np.zeros((len(windows_ids), seq_len), bool)
  for row, (ids, at, offsets) in enumerate(zip(windows_ids, context_starts, window_offsets)):
    _put(inputs, row, ids, at)
    token_offsets[row, at:at + len(offsets)] = offsets
    is_max_context[row, at:at + len(offsets)] = max_contexts[row]
  positions = np.asarray(positions, np.int32).reshape(-1, 2)
  return dict(inputs, start_position=positions[:, 0], end_position=positions[:, 1],
              example_index=np.asarray(example_index, np.int32),
              is_impossible=np.asarray(impossible, np.int32), token_offsets=token_offsets,
              token_is_max_context=is_max_context)


def _best_span(start_logits: np.ndarray, end_logits: np.ndarray, valid_start: np.ndarray,
               valid_end: np.ndarray, n_best: int, max_answer_len: int
               ) -> tuple[float, int, int] | None:
  """The best (score, start, end) of one feature among run_squad.py's candidates: the n_best
  highest start and end logits (stable order), start a max-context context token, end a context
  token, start <= end < start + max_answer_len. Ties go to the first candidate in run_squad.py's
  loop order (start rank, then end rank)."""
  starts = np.argsort(-start_logits, kind="stable")[:n_best]
  ends = np.argsort(-end_logits, kind="stable")[:n_best]
  s, e = starts[:, None], ends[None, :]
  ok = valid_start[s] & valid_end[e] & (e >= s) & (e - s + 1 <= max_answer_len)
  if not ok.any():
    return None
  scores = np.where(ok, start_logits[s] + end_logits[e], -np.inf)
  i, j = np.unravel_index(np.argmax(scores), scores.shape)
  return float(scores[i, j]), int(starts[i]), int(ends[j])


def _best_beam_span(start_top_log_probs: np.ndarray, start_top_index: np.ndarray,
                    end_top_log_probs: np.ndarray, end_top_index: np.ndarray,
                    valid_start: np.ndarray, valid_end: np.ndarray, max_answer_len: int
                    ) -> tuple[float, int, int] | None:
  """The best (score, start, end) of one feature among the joint head's beam (ELECTRA
  qa_metrics.py `write_predictions` with joint_prediction): start i of the K kept and its end j
  of the K kept, score start_top_log_probs[i] + end_top_log_probs[i, j], start a max-context
  context token, end a context token, start <= end < start + max_answer_len; ties to the first
  in beam order."""
  s, e = start_top_index[:, None], end_top_index
  ok = valid_start[s] & valid_end[e] & (e >= s) & (e - s + 1 <= max_answer_len)
  if not ok.any():
    return None
  scores = np.where(ok, start_top_log_probs[:, None] + end_top_log_probs, -np.inf)
  i, j = np.unravel_index(np.argmax(scores), scores.shape)
  return float(scores[i, j]), int(s[i, 0]), int(e[i, j])


def qa_predictions(start_logits, end_logits, features: dict[str, np.ndarray],
                   examples: Sequence[dict], n_best: int = 20, max_answer_len: int = 30,
                   null_threshold: float = 0.0, version_2: bool = False) -> dict[str, str]:
  """run_squad.py `write_predictions`: each example's answer text.

  Over all features of an example the best-scoring valid span (`_best_span`, score start logit +
  end logit) wins; its text is the context between its tokens' character offsets (tokens of no
  character, a bare SentencePiece '▁', are never a span's start or end). With
  version_2, the null score is the minimum over the example's features of start_logits[0] +
  end_logits[0], and the answer is "" when null score - best span score > null_threshold (or
  no span is valid). Without version_2 an example without a valid span gets "" (run_squad.py
  writes the placeholder 'empty').

  Args:
    start_logits, end_logits: [features, seq_len] model outputs for `features` (`qa_features` of
      `examples`).

  Returns:
    {example id: answer text}.
  """
  start_logits, end_logits = np.asarray(start_logits), np.asarray(end_logits)
  return _answers(
      features, examples,
      lambda f, valid_start, valid_end: _best_span(start_logits[f], end_logits[f], valid_start,
                                                   valid_end, n_best, max_answer_len),
      null_scores=start_logits[:, 0] + end_logits[:, 0],
      is_null=lambda null, best: version_2 and null - best > null_threshold)


def joint_qa_predictions(outputs: dict[str, np.ndarray], features: dict[str, np.ndarray],
                         examples: Sequence[dict], max_answer_len: int = 30,
                         answerable_threshold: float = -2.75, version_2: bool = False
                         ) -> dict[str, str]:
  """ELECTRA qa_metrics.py `write_predictions` for its joint head (`heads.JointSpanHead`): the
  best valid span of the beam over all the example's features (`_best_beam_span`); with
  version_2 the answer is "" when the example's null score, the least answerable_logit (the
  logit of 'no answer') over its features, exceeds `answerable_threshold` (ELECTRA's
  qa_na_threshold, −2.75), whatever the span's score; "" too when no span is valid (where
  qa_metrics.py writes its placeholder text 'empty').

  Args:
    outputs: the joint head's prediction outputs for `features`, each [features, ...].
  """
  o = {k: np.asarray(v) for k, v in outputs.items()}
  return _answers(
      features, examples,
      lambda f, valid_start, valid_end: _best_beam_span(
          o["start_top_log_probs"][f], o["start_top_index"][f], o["end_top_log_probs"][f],
          o["end_top_index"][f], valid_start, valid_end, max_answer_len),
      null_scores=o["answerable_logit"],
      is_null=lambda null, best: version_2 and null > answerable_threshold)


def _answers(features, examples, best_span, null_scores, is_null) -> dict[str, str]:
  """{example id: answer text}: for each example, the best `best_span(feature, valid_start,
  valid_end)` (score, start, end) over its features (the first on ties) and the least of its
  features' `null_scores`; "" when no span is valid or `is_null(null score, best score)`."""
  # Context tokens of at least one character: a bare SentencePiece '▁' (empty span) would add
  # only whitespace to an answer, or make an empty one.
  valid_end = features["token_offsets"][..., 1] > features["token_offsets"][..., 0]
  valid_start = features["token_is_max_context"] & valid_end
  best = [None] * len(examples)
  null_score = [np.inf] * len(examples)
  for f, index in enumerate(features["example_index"]):
    null_score[index] = min(null_score[index], float(null_scores[f]))
    span = best_span(f, valid_start[f], valid_end[f])
    if span is not None and (best[index] is None or span[0] > best[index][0]):
      best[index] = (span[0], f, span[1], span[2])
  predictions = {}
  for index, example in enumerate(examples):
    if best[index] is None or is_null(null_score[index], best[index][0]):
      predictions[example["id"]] = ""
      continue
    _, f, start, end = best[index]
    offsets = features["token_offsets"][f]
    predictions[example["id"]] = example["context"][offsets[start, 0]:offsets[end, 1]]
  return predictions


# -------------------------------------------------------------------- per task kind (the runner)


def featurize(task, tokenizer, examples: Sequence[dict], ft, training: bool,
              layout: str = "bert") -> dict[str, np.ndarray]:
  """A task's raw examples -> the arrays its kind trains on (`finetune.losses` batch keys).

  Args:
    task: a `finetune.tasks.Task`.
    ft: the `config.finetune` section (max_seq_len, doc_stride, max_query_len).
    training: QA drops examples whose answer_start misses the answer text (run_squad.py).
    layout: 'bert', or 'xlnet' / 'gpt' for an XLNet's / a GPT's classification, regression and
      multiple choice.
  """
  if task.kind in ("classification", "regression"):
    texts_b = [e["text_b"] for e in examples]
    if any(t is None for t in texts_b) and not all(t is None for t in texts_b):
      raise ValueError(f"Task {task.name!r} mixes single texts and pairs.")
    texts_a = [e["text"] for e in examples]
    pairs = not all(t is None for t in texts_b)
    data = encode_pairs(tokenizer, texts_a, ft.max_seq_len, texts_b if pairs else None, layout)
    if getattr(ft, "pair_orders", 1) == 2:
      if not pairs:
        raise ConfigError(f"finetune.pair_orders=2 reads both orders of a pair; {task.name} has "
                          "single texts: set --config.finetune.pair_orders=1.")
      swapped = encode_pairs(tokenizer, texts_b, ft.max_seq_len, texts_a, layout)
      data = {k: np.stack([v, swapped[k]], axis=1) for k, v in data.items()}
    dtype = np.float32 if task.kind == "regression" else np.int32
    return dict(data, label=np.asarray([e["label"] for e in examples], dtype).reshape(-1))
  if task.kind == "token_classification":
    return tagging_features(tokenizer, examples, ft.max_seq_len)
  if task.kind == "extractive_qa":
    return qa_features(tokenizer, examples, ft.max_seq_len, ft.doc_stride, ft.max_query_len,
                       is_training=training)
  if task.kind == "multiple_choice":
    return choice_features(tokenizer, examples, ft.max_seq_len, layout)
  raise ValueError(f"Unknown task kind {task.kind!r}.")


def decode_predictions(task, outputs: np.ndarray, data: dict[str, np.ndarray],
                       examples: Sequence[dict], tokenizer, ft) -> list:
  """Model outputs over `data` (= featurize(task, ..., examples)) -> one prediction per example,
  what `Task.score` takes: a class id (classification, multiple choice), a float (regression),
  per-word label ids (token classification), an answer text (extractive QA, `qa_predictions`
  with ft.n_best, ft.max_answer_len, ft.null_threshold; the joint head's, `joint_qa_predictions`
  with ft.max_answer_len and ft.answerable_threshold).

  Args:
    outputs: [rows, classes], [rows], [rows, seq_len, labels], [features, seq_len, 2] (start,
      end), the joint QA head's dict, or [rows, choices], as `models.finetune.FineTuneModel`
      returns them.
  """
  del tokenizer   # offsets were kept in `data`
  if isinstance(outputs, dict):
    answers = joint_qa_predictions(outputs, data, examples, ft.max_answer_len,
                                   ft.answerable_threshold, task.version_2)
    return [answers[e["id"]] for e in examples]
  outputs = np.asarray(outputs)
  if task.kind == "regression":
    return [float(x) for x in outputs.reshape(-1)]
  if task.kind == "token_classification":
    return word_predictions(outputs.argmax(-1), data["word_positions"],
                            [len(e["words"]) for e in examples])
  if task.kind == "extractive_qa":
    answers = qa_predictions(outputs[..., 0], outputs[..., 1], data, examples, ft.n_best,
                             ft.max_answer_len, ft.null_threshold, task.version_2)
    return [answers[e["id"]] for e in examples]
  return [int(x) for x in outputs.argmax(-1)]


def gold_nll(task, outputs: np.ndarray, data: dict[str, np.ndarray]) -> list[float] | None:
  """The gold label's negative log-probability per example (nats; the softmax over classes or
  choices), for classification and multiple choice; None for the other kinds. What moves long
  before accuracy does (EXPERIMENTS.md §2).

  Args:
    outputs: [rows, classes] or [rows, choices], one row per example.
    data: the features, with `label` [rows].
  """
  if task.kind not in ("classification", "multiple_choice"):
    return None
  return [float(x) for x in metrics.gold_nll(outputs, data["label"])]
