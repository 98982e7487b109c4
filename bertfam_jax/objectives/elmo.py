"""ELMo's bidirectional language model objective (Peters et al., 2018; allenai/bilm-tf
bilm/training.py, spec §8 "ELMo biLM"): the joint log-likelihood of a forward and a backward LM
over words, read by their characters (models/elmo.py).

Words and their vocabulary, from the run's SentencePiece tokenizer (a deviation: bilm-tf reads
pre-tokenized text and a word vocabulary file of its own). The pipeline packs whole sentences
(`data.packing='full_sentences'`: `[CLS] s1 [SEP] s2 [SEP] ...`, L pieces a row), and
`word_features` turns each row of pieces into a row of words:
  - a word is a piece that begins a word by BERT's rule (a '▁' piece, punctuation, a special
    piece) and the continuation pieces after it; a piece of punctuation alone is a word of its
    own ('(' then 'quietly'), and a bare '▁' belongs to the word that follows it; its characters
    are its pieces' UTF-8 bytes without the '▁' (every word is read by its characters, whatever
    its frequency; an <unk> piece reads as the characters '<unk>');
  - [CLS] is the sentence start <S> and [SEP] the end </S>, with bilm-tf's character codes, and
    a <S> is inserted after each [SEP] that another sentence follows in the row, so that every
    sentence reads `<S> w1 ... wn </S>` as in bilm-tf's batches;
  - a word's id in the softmax is its piece when it is one piece, else <unk>: the softmax
    vocabulary is the tokenizer's whole-word pieces (ids in falling frequency, as the log-uniform
    sampler assumes), and longer words are <UNK> targets, as bilm-tf's words outside its
    vocabulary file are.
A row keeps its first `data.seq_len` words (rows have at most as many words as pieces, plus one
<S> per sentence after the first).

The loss (bilm-tf `_build_loss`): the forward LM at word t predicts word t + 1, the backward LM
word t − 1, within the row, but never from a sentence's last word in its reading direction
(forward </S>, backward <S>: bilm-tf's batches never input those, so the next sentence's boundary
word, certain, is no target; `shifted_targets`); each direction's mean cross-entropy over its
targets, then ½ (forward + backward). Training uses the sampled softmax when
`objective.sampled_negatives` > 0 (bilm-tf: 8,192 candidates per batch from a log-uniform
sampler, `losses.sampled_softmax_cross_entropy`),
evaluation always the full softmax (bilm-tf's test mode), so held-out losses are exact
perplexities' logarithms: `eval_forward_loss`, `eval_backward_loss`.

Batch keys: char_ids [n, W, max_characters] int32, input_mask [n, W] int32, word_ids [n, W]
int32 (W = data.seq_len).
"""

from __future__ import annotations

import functools
import string

import jax
import jax.numpy as jnp
import numpy as np

from bertfam_jax import config_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.models import elmo as elmo_model
from bertfam_jax.objectives import losses

FIELD_RULES = {"objective.sampled_negatives": config_lib.Range(0)}
DIRECTIONS = (("forward", 1), ("backward", -1))


def validate(config) -> None:
  if config.data.packing != "full_sentences":
    raise ConfigError(f"objective.name='elmo' reads rows of whole sentences; set "
                      f"--config.data.packing=full_sentences (it is {config.data.packing!r}).")
  if config.tokenizer.kind != "sentencepiece":
    raise ConfigError(f"objective.name='elmo' builds its words from SentencePiece pieces; set "
                      f"--config.tokenizer.kind=sentencepiece (it is {config.tokenizer.kind!r}).")
  if config.objective.sampled_negatives >= config.model.vocab_size:
    raise ConfigError(f"objective.sampled_negatives={config.objective.sampled_negatives} must be "
                      f"below model.vocab_size={config.model.vocab_size} (0: the full softmax).")


def build_model(config):
  return elmo_model.BiLM(config.model)


def init_inputs(config) -> dict[str, jnp.ndarray]:
  """One row (char_ids [1, W, C], input_mask [1, W]) to trace `BiLM.init`."""
  words, chars = config.data.seq_len, config.model.max_characters
  return dict(chars_BWC=jnp.zeros((1, words, chars), jnp.int32),
              input_mask_BW=jnp.ones((1, words), jnp.int32))


def word_characters(text_bytes: bytes, max_characters: int) -> np.ndarray:
  """bilm-tf's `_convert_word_to_char_ids`: [begin-of-word, its first max_characters − 2 bytes,
  end-of-word, padding...] → [max_characters] int32."""
  code = np.full(max_characters, elmo_model.PAD_CHAR, np.int32)
  kept = text_bytes[:max_characters - 2]
  code[0] = elmo_model.BOW_CHAR
  code[1:1 + len(kept)] = np.frombuffer(kept, np.uint8)
  code[1 + len(kept)] = elmo_model.EOW_CHAR
  return code


def boundary_characters(char: int, max_characters: int) -> np.ndarray:
  """<S> / </S>: [begin-of-word, BOS_CHAR / EOS_CHAR, end-of-word, padding...] (bilm-tf
  `_make_bos_eos`)."""
  code = np.full(max_characters, elmo_model.PAD_CHAR, np.int32)
  code[:3] = (elmo_model.BOW_CHAR, char, elmo_model.EOW_CHAR)
  return code


class WordTable:
  """What `word_features` reads of a tokenizer: each piece's bytes (without '▁'), whether it
  begins a word (BERT's rule), and the special ids."""

  def __init__(self, tokenizer, max_characters: int):
    pieces = tokenizer.pieces()
    self.piece_bytes = [p.replace("▁", "").encode("utf-8") for p in pieces]
    self.punctuation = [bool(p.replace("▁", "")) and all(c in string.punctuation
                                                          for c in p.replace("▁", ""))
                        for p in pieces]
    self.starts = tokenizer.word_start
    self.cls_id, self.sep_id = tokenizer.cls_id, tokenizer.sep_id
    self.unk_id, self.pad_id = tokenizer.unk_id, tokenizer.pad_id
    self.max_characters = max_characters
    self.bos = boundary_characters(elmo_model.BOS_CHAR, max_characters)
    self.eos = boundary_characters(elmo_model.EOS_CHAR, max_characters)

  def words(self, ids: np.ndarray) -> list[tuple[np.ndarray, int]]:
    """One row's real piece ids → its words as (characters [max_characters], softmax id)."""
    return self.words_of_pieces(ids)[0]

  def words_of_pieces(self, ids: np.ndarray) -> tuple[list[tuple[np.ndarray, int]], np.ndarray]:
    """`words`, and [pieces] int32: the index of the word each piece belongs to ([CLS] and
    [SEP] their <S> and </S>)."""
    out, current, piece_word = [], [], np.zeros(len(ids), np.int32)

    def close():
      if current:
        word_id = current[0] if len(current) == 1 else self.unk_id
        out.append((word_characters(b"".join(self.piece_bytes[i] for i in current),
                                    self.max_characters), word_id))
        current.clear()

    for position, piece in enumerate(ids):
      piece = int(piece)
      if piece in (self.cls_id, self.sep_id):
        close()
        piece_word[position] = len(out)
        out.append((self.bos, piece) if piece == self.cls_id else (self.eos, piece))
        if piece == self.sep_id and position + 1 < len(ids) and ids[position + 1] != self.cls_id:
          out.append((self.bos, self.cls_id))   # the next sentence's <S>
        continue
      if self.starts[piece]:
        close()
      piece_word[position] = len(out)   # the word being built: the next one `close` appends
      if self.piece_bytes[piece]:       # a bare '▁' opens the next word without a character
        current.append(piece)
      if self.punctuation[piece]:
        close()
    close()
    return out, piece_word


def word_features(rows: dict[str, np.ndarray], rng, *, table: WordTable, num_words: int
                  ) -> dict[str, np.ndarray]:
  """Packed rows of pieces (input_ids, input_mask [n, L]) → the batch (module docstring);
  deterministic (`rng` unused)."""
  del rng
  n = len(rows["input_ids"])
  char_ids = np.full((n, num_words, table.max_characters), elmo_model.PAD_CHAR, np.int32)
  word_ids = np.full((n, num_words), table.pad_id, np.int32)
  input_mask = np.zeros((n, num_words), np.int32)
  for row, (ids, mask) in enumerate(zip(rows["input_ids"], rows["input_mask"])):
    words = table.words(ids[mask > 0])[:num_words]
    if words:
      char_ids[row, :len(words)] = np.stack([chars for chars, _ in words])
      word_ids[row, :len(words)] = [word_id for _, word_id in words]
      input_mask[row, :len(words)] = 1
  return dict(char_ids=char_ids, input_mask=input_mask, word_ids=word_ids)


def make_features(config, tokenizer):
  """The host-side `fn(rows, rng) -> batch` (`word_features`), after checking the vocabulary."""
  config_lib.check_vocabulary(config, tokenizer)
  return functools.partial(word_features, table=WordTable(tokenizer, config.model.max_characters),
                           num_words=config.data.seq_len)


def pipeline_options(config) -> dict:
  """The word rows replace the packed rows of pieces (their keys and shapes differ)."""
  del config
  return dict(replace_examples=True)


def shifted_targets(word_ids_BW, input_mask_BW, shift: int, boundary_BW=None):
  """The targets of the LM reading in direction `shift` (+1 forward: word t + 1; −1 backward:
  word t − 1) and their weights, [batch, words] each: 1 where both words are real, except at a
  sentence's last word in the reading direction (forward </S>, backward <S>), which bilm-tf
  never reads as an input (`_get_batch` feeds `[<S> w1 ... wn]` to predict `[w1 ... wn </S>]`,
  the reversed stream `[</S> wn ... w1]`), so that no target is the next sentence's certain
  boundary word.

  Args:
    boundary_BW: [batch, words] each word's second character code (`char_ids[..., 1]`): BOS_CHAR
      at <S>, EOS_CHAR at </S>, a byte elsewhere; None: no sentence boundaries.
  """
  targets = jnp.roll(word_ids_BW, -shift, axis=1)
  real = jnp.roll(input_mask_BW, -shift, axis=1) * input_mask_BW
  edge = word_ids_BW.shape[1] - 1 if shift > 0 else 0
  real = real.at[:, edge].set(0)
  if boundary_BW is not None:
    last = elmo_model.EOS_CHAR if shift > 0 else elmo_model.BOS_CHAR
    real = jnp.where(boundary_BW == last, 0, real)
  return targets, real.astype(jnp.float32)


def loss_fn(model, params, batch, rng, config, *, deterministic=False):
  """Returns (½ (forward + backward mean cross-entropy), {forward_loss, forward_accuracy,
  backward_loss, backward_accuracy}) (module docstring)."""
  dropout_rng, sample_rng = jax.random.split(rng)
  outputs = model.apply(params, batch["char_ids"], batch["input_mask"],
                        deterministic=deterministic, rngs={"dropout": dropout_rng})
  negatives = config.objective.sampled_negatives
  kernel_VP, bias_V = params["params"]["softmax_kernel"], params["params"]["softmax_bias"]
  metrics, total = {}, 0.0
  for (direction, shift), direction_rng in zip(DIRECTIONS, jax.random.split(sample_rng)):
    targets_BW, weights_BW = shifted_targets(batch["word_ids"], batch["input_mask"], shift,
                                             batch["char_ids"][..., 1])
    top_BWP = model.apply(params, outputs, direction, deterministic=deterministic,
                          rngs={"dropout": jax.random.fold_in(dropout_rng, shift % 3)},
                          method=elmo_model.BiLM.top)
    if negatives and not deterministic:
      candidates = losses.log_uniform_candidates(direction_rng, negatives, kernel_VP.shape[0])
      per_word = losses.sampled_softmax_cross_entropy(
          top_BWP.reshape(-1, top_BWP.shape[-1]), targets_BW.reshape(-1), kernel_VP, bias_V,
          candidates)
      weights = weights_BW.reshape(-1)
      loss_sum, count = jnp.sum(per_word * weights), jnp.sum(weights)
      metrics[f"{direction}_sampled_loss"] = (loss_sum, count)
    else:
      logits = model.apply(params, top_BWP, method=elmo_model.BiLM.logits)
      loss_sum, correct, count = losses.weighted_cross_entropy(
          logits=logits, targets=targets_BW, weights=weights_BW)
      metrics[f"{direction}_loss"] = (loss_sum, count)
      metrics[f"{direction}_accuracy"] = (correct, count)
    total = total + 0.5 * loss_sum / jnp.maximum(count, 1.0)
  return total, metrics


def flops_per_token(config) -> float:
  """Training FLOPs per word position (3 × the forward's matmul FLOPs, flops.py's convention):
  the character CNN, highway layers and projection once, then per direction each LSTM layer's
  gates ([input; projection] → 4 × cells) and projection (cells → P), and the softmax over the
  vocabulary (full) or over 1 + sampled_negatives rows."""
  m = config.model
  max_chars, width = m.max_characters, m.char_embedding_dim
  filters = sum(n for _, n in m.char_filters)
  cnn = sum(2 * (max_chars - w + 1) * w * width * n for w, n in m.char_filters)
  cnn += m.highway_layers * 2 * (2 * filters * filters)
  cnn += 2 * filters * m.projection_dim if filters != m.projection_dim else 0
  lstm = m.lstm_layers * (2 * (2 * m.projection_dim) * 4 * m.lstm_cells
                          + 2 * m.lstm_cells * m.projection_dim)
  classes = (1 + config.objective.sampled_negatives if config.objective.sampled_negatives
             else m.vocab_size)
  softmax = 2 * m.projection_dim * classes
  return 3.0 * (cnn + 2 * (lstm + softmax))


def describe(config) -> str:
  m, o = config.model, config.objective
  softmax = f"sampled softmax ({o.sampled_negatives} candidates)" if o.sampled_negatives else (
      "full softmax")
  return (f"ELMo biLM on rows of {config.data.seq_len} words: char-CNN "
          f"{sum(n for _, n in m.char_filters)} filters, {m.lstm_layers} x LSTM {m.lstm_cells} -> "
          f"{m.projection_dim} per direction, {softmax} over {m.vocab_size}")
