r"""Contextual representations out of any run: per-token or per-word vectors of a pre-trained or
fine-tuned workdir of ours (every family; an imported transformers checkpoint is a workdir after
`python -m bertfam_jax.hf import`, and a transformers directory is read directly), as a Python
function and a CLI.

  python -m bertfam_jax.represent --workdir=runs/bert --input=texts.txt --output=reps.npy \
      [--unit=word|token] [--pooling=first|last|mean] [--layers=last|all|0,4,-1] \
      [--mix=none|mean|learned] [--batch_size=32] [--max_tokens=512]

  vectors = represent.represent("runs/bert", ["A dog barked .", "Hot dogs ."], unit="word")
  # [one [words, hidden] float32 array per text]

What each option means:
  unit      word: one vector per whitespace-separated word, pooled over its sub-word tokens
            (`pooling`: its first, its last, or the mean of its tokens); token: one per token
            of the text (no [CLS] / [SEP] / <cls> / EOS), tokens of whitespace only included.
  layers    which hidden states: 'last' (default), 'all' (the embeddings' output as layer 0,
            then every layer), or indices into that list (negative from the end). The BERT
            family (BERT, RoBERTa, ALBERT, SpanBERT, StructBERT, ELECTRA's discriminator) gives
            every layer; XLNet's content stream and T5's encoder give their last layer only;
            ELMo its three: the character CNN's token layer (twice: [x; x]) and each LSTM
            layer, [forward; backward] (`models/elmo.representation_layers`).
  mix       with several layers: none (the vectors keep a layer axis: [units, layers, hidden]),
            mean (ELMo's fixed mix, equal weights), or learned (the scalar mix a fine-tuned
            workdir learned with finetune.features=weighted_sum, over all layers; with its
            finetune.mix_layer_norm, each layer normalised over the batch's real tokens first,
            as in training and bilm-tf, so a vector depends on the texts batched with it).

Words are mapped to tokens by character offsets, as the tagging task does
(`finetune.features.token_words`): a token holding no character of the word (SentencePiece's bare
'▁' before a word it could not attach to) belongs to no word. A text longer than `max_tokens` (default: the model's
positions) is cut: the words past the cut get NaN vectors, and the count is logged. The CLI
writes OUTPUT (.npy: every unit's vector, texts one after another) and OUTPUT with .tsv
(text index, unit index, the unit's text or token id: the row of each vector).
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging

from bertfam_jax import errors, fileio
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.finetune import features
from bertfam_jax.finetune import run as finetune_run
from bertfam_jax.models import elmo as elmo_model
from bertfam_jax.models import encoder as encoder_lib
from bertfam_jax.models import finetune as finetune_models
from bertfam_jax.models import heads
from bertfam_jax.objectives import elmo as elmo_objective

UNITS = ("word", "token")
POOLINGS = ("first", "last", "mean")
MIXES = ("none", "mean", "learned")


class Representer:
  """A loaded run: its input `rows` and their `hidden_states`; built by `load`."""

  def __init__(self, config, tokenizer, params, path: str):
    self.config, self.tokenizer, self.path = config, tokenizer, path
    self.kind = config.model.get("kind", "encoder")
    self.mix_params = params.get("scalar_mix") if isinstance(params, dict) else None
    finetuned = config.get("finetune") or {}
    self.mix_layer_norm = bool(finetuned.get("mix_layer_norm", False))
    network, self.num_states = _network(config.model, params, self.kind)
    if self.kind == "elmo":
      self._word_table = elmo_objective.WordTable(tokenizer, config.model.max_characters)
    self._forward = jax.jit(lambda *a: network(*a).astype(jnp.float32))

  def rows(self, token_ids: Sequence[np.ndarray], length: int) -> tuple[dict, np.ndarray]:
    """The model's input rows of `token_ids` (each at most length − 2 tokens) and the position of
    each text's first token: [CLS] toks [SEP] (BERT family), toks <sep> <cls> left-padded
    (XLNet), toks EOS (T5's encoder)."""
    t = self.tokenizer
    inputs = features._empty_inputs(len(token_ids), length, t.pad_id)  # pylint: disable=protected-access
    starts = np.zeros(len(token_ids), np.int64)
    for row, ids in enumerate(token_ids):
      ids = [int(i) for i in ids]
      if self.kind == "xlnet":
        features._put_xlnet(inputs, row, [ids + [t.sep_id]], t.cls_id)  # pylint: disable=protected-access
        starts[row] = length - len(ids) - 2
      elif self.kind == "t5":
        features._put(inputs, row, ids + [t.eos_id], len(ids) + 1)  # pylint: disable=protected-access
      else:
        features._put(inputs, row, [t.cls_id, *ids, t.sep_id], len(ids) + 2)  # pylint: disable=protected-access
        starts[row] = 1
    return inputs, starts

  def hidden_states(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """[states, rows, length, hidden] float32: every hidden state the network gives (the
    embeddings' output and each layer for the BERT family; the last layer otherwise; ELMo's
    three layers, each piece given the vector of the word it belongs to)."""
    if self.kind == "elmo":
      return self._elmo_states(inputs)
    return np.asarray(self._forward(*(jnp.asarray(inputs[k]) for k in
                                      ("input_ids", "input_mask", "segment_ids"))))

  def _elmo_states(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """ELMo reads words: each row's pieces become words as in pre-training
    (`objectives.elmo.WordTable`), and each piece takes its word's vectors."""
    length = inputs["input_ids"].shape[1]
    rows = len(inputs["input_ids"])
    chars = np.full((rows, length, self.config.model.max_characters), elmo_model.PAD_CHAR,
                    np.int32)
    mask = np.zeros((rows, length), np.int32)
    piece_word = np.zeros((rows, length), np.int32)
    for row, (ids, real) in enumerate(zip(inputs["input_ids"], inputs["input_mask"])):
      words, owner = self._word_table.words_of_pieces(ids[real > 0])
      chars[row, :len(words)] = np.stack([c for c, _ in words])
      mask[row, :len(words)] = 1
      piece_word[row, :len(owner)] = owner
    states = np.asarray(self._forward(jnp.asarray(chars), jnp.asarray(mask), None))
    return np.take_along_axis(states, piece_word[None, :, :, None], axis=2)


def _network(model_config, params, kind: str) -> tuple[Callable, int]:
  """(fn(ids, mask, segments) → [states, batch, length, hidden], states); ELMo's reads
  (characters, mask, None)."""
  if kind == "elmo":
    model = elmo_model.BiLM(model_config)
    def elmo_layers(chars, mask, _):
      return elmo_model.representation_layers(model.apply({"params": params}, chars, mask))
    return elmo_layers, 1 + model_config.lstm_layers
  if kind == "t5":
    from bertfam_jax.models import t5  # pylint: disable=g-import-not-at-top
    model = t5.T5(model_config)
    def t5_encoder(ids, mask, _):
      return model.apply({"params": params}, ids, mask, deterministic=True,
                         method=t5.T5.encode)[None]
    return t5_encoder, 1
  if kind == "xlnet":
    model = finetune_models.XLNetContent(model_config)
    tree = params["encoder"] if "encoder" in params else {
        k: v for k, v in params.items() if k != "lm_loss"}
    def content_stream(ids, mask, segments):
      return model.apply({"params": tree}, ids, mask, segments, deterministic=True)[None]
    return content_stream, 1
  if "encoder" not in params:
    raise ConfigError(f"The parameters have no 'encoder' (they have {sorted(params)}); pass a "
                      f"workdir of a BERT-family, XLNet or T5 run.")
  model = encoder_lib.Encoder(model_config)
  tree = params["encoder"]
  def every_layer(ids, mask, segments):
    _, all_NBLD = model.apply({"params": tree}, ids, mask, segments, deterministic=True,
                              return_all_layers=True)
    return all_NBLD
  return every_layer, model_config.layers + 1


def load(path: str) -> Representer:
  """A workdir of ours (pre-trained or fine-tuned) or a transformers checkpoint directory."""
  config, tokenizer, params = finetune_run.load_init(path)
  return Representer(config, tokenizer, jax.device_get(params), path)


def select_layers(layers: str | int | Sequence[int], num_states: int) -> list[int]:
  """'last' | 'all' | an index | indices ('0,4,-1' or a sequence) → indices into the states."""
  given = layers
  if layers == "last":
    return [num_states - 1]
  if layers == "all":
    return list(range(num_states))
  if isinstance(layers, str):
    try:
      layers = [int(x) for x in layers.split(",") if x.strip()]
    except ValueError:
      raise ConfigError(f"layers={layers!r}; pass 'last', 'all' or comma-separated indices "
                        f"(0 = the embeddings' output, -1 = the last layer).") from None
  chosen = [layers] if isinstance(layers, int) else list(layers)
  bad = [i for i in chosen if not -num_states <= i < num_states]
  if bad or not chosen:
    raise ConfigError(f"layers={given!r}: this model gives {num_states} hidden state(s) "
                      f"(indices 0..{num_states - 1}, or negative from the end).")
  return [i % num_states for i in chosen]


def _mix_weights(mix: str, chosen: list[int], representer: Representer) -> np.ndarray | None:
  """[len(chosen)] the weights that combine the chosen states, or None (keep a layer axis)."""
  if mix == "none":
    return None
  if mix == "mean":
    return np.full(len(chosen), 1.0 / len(chosen), np.float32)
  mixed = representer.mix_params
  if mixed is None:
    raise ConfigError(f"mix='learned' needs the scalar mix of a run fine-tuned with "
                      f"finetune.features=weighted_sum; {representer.path} has none. Use "
                      f"mix='mean' (ELMo's fixed mix) or pick layers.")
  if chosen != list(range(representer.num_states)):
    raise ConfigError("mix='learned' mixes every layer, in order, as it was trained; pass "
                      "layers='all'.")
  weights = np.asarray(mixed["weights"], np.float32)
  weights = np.exp(weights - weights.max())
  return float(np.asarray(mixed["gamma"])) * weights / weights.sum()


def represent(source: str | Representer, texts: Sequence[str], *, unit: str = "word",
              pooling: str = "first", layers: str | int | Sequence[int] = "last",
              mix: str = "none", batch_size: int = 32, max_tokens: int = 0,
              progress: bool = False) -> list[np.ndarray]:
  """One float32 array per text: [units, hidden], or [units, layers, hidden] when several layers
  are kept unmixed (the module docstring says what each option means). `source`: a path, or a
  `Representer` from `load` to reuse."""
  if unit not in UNITS or pooling not in POOLINGS or mix not in MIXES:
    raise ConfigError(f"unit={unit!r}, pooling={pooling!r}, mix={mix!r}; choose unit from "
                      f"{UNITS}, pooling from {POOLINGS}, mix from {MIXES}.")
  if batch_size < 1:
    raise ConfigError(f"batch_size={batch_size}; pass 1 or more.")
  r = load(source) if isinstance(source, str) else source
  chosen = select_layers(layers, r.num_states)
  weights = (np.ones(1, np.float32) if len(chosen) == 1 and mix == "none" else
             _mix_weights(mix, chosen, r))
  positions = r.config.model.get("max_positions", 0) or 512
  length = max_tokens or positions
  if length < 3 or length > positions:
    raise ConfigError(f"max_tokens={max_tokens}: pass 3..{positions} (the model's positions), "
                      f"or 0 for all of them.")
  word_lists = [text.split() for text in texts]
  ids, offsets = r.tokenizer.encode_with_offsets([" ".join(w) for w in word_lists])
  out, cut = [], 0
  for first in range(0, len(texts), batch_size):
    batch = range(first, min(first + batch_size, len(texts)))
    kept = [ids[i][:length - 2] for i in batch]
    inputs, starts = r.rows(kept, length)
    states = r.hidden_states(inputs)[chosen]          # [chosen, rows, length, hidden]
    if mix == "learned" and r.mix_layer_norm:          # as the mix was trained: per batch
      states = np.asarray(heads.normalize_layers(states, inputs["input_mask"]))
    states = (states.transpose(1, 2, 0, 3) if weights is None else
              np.einsum("n,nbld->bld", weights, states))   # [rows, length, (chosen,) hidden]
    for row, i in enumerate(batch):
      tokens = states[row, starts[row]:starts[row] + len(kept[row])]
      if unit == "token":
        cut += len(ids[i]) - len(kept[row])
        out.append(tokens)
        continue
      token_word = features.token_words(word_lists[i], np.asarray(offsets[i]).reshape(-1, 2))
      vectors = pool_words(tokens, token_word[:len(kept[row])], len(word_lists[i]), pooling)
      cut += int(np.isnan(vectors).any(axis=tuple(range(1, vectors.ndim))).sum())
      out.append(vectors)
    if progress:
      print(f"\rrepresent: {batch[-1] + 1}/{len(texts)} texts", end="", file=sys.stderr,
            flush=True)
  if progress:
    print(file=sys.stderr)
  if cut and unit == "word":
    logging.warning("%d word(s) lie past max_tokens=%d tokens (or hold no character a token "
                    "covers): their vectors are NaN.", cut, length)
  elif cut:
    logging.warning("%d token(s) lie past max_tokens=%d tokens: they have no vectors.", cut,
                    length)
  return out


def pool_words(tokens: np.ndarray, token_word: np.ndarray, num_words: int,
               pooling: str) -> np.ndarray:
  """[tokens, ...] vectors and each token's word (-1: none) → [num_words, ...] by `pooling`;
  NaN for a word without tokens (cut off)."""
  out = np.full((num_words, *tokens.shape[1:]), np.nan, np.float32)
  for word in range(num_words):
    mine = np.flatnonzero(token_word == word)
    if len(mine):
      out[word] = (tokens[mine[0]] if pooling == "first" else tokens[mine[-1]]
                   if pooling == "last" else tokens[mine].mean(axis=0))
  return out


# ------------------------------------------------------------------------------------------ CLI

def define_flags() -> None:
  """The CLI's flags (defined when run as a program: other CLIs' modules name theirs alike)."""
  flags.DEFINE_string("workdir", None, "a workdir of ours or a transformers directory")
  flags.DEFINE_string("input", None, "UTF-8 text, one text per line (empty lines skipped)")
  flags.DEFINE_string("output", None, "the .npy of vectors; a .tsv beside it names the rows")
  flags.DEFINE_enum("unit", "word", UNITS, "word or token vectors")
  flags.DEFINE_enum("pooling", "first", POOLINGS, "a word's tokens → its vector")
  flags.DEFINE_string("layers", "last", "last | all | comma-separated indices")
  flags.DEFINE_enum("mix", "none", MIXES, "how several layers combine")
  flags.DEFINE_integer("batch_size", 32, "texts per forward pass")
  flags.DEFINE_integer("max_tokens", 0, "row length; 0 = the model's positions")


def main(argv: Sequence[str]) -> int:
  del argv
  f = flags.FLAGS
  try:
    for name in ("workdir", "input", "output"):
      if not f[name].value:
        raise ConfigError(f"--{name} is required.")
    if not fileio.isfile(f.input):
      raise ConfigError(f"--input={f.input} is not a file; pass a UTF-8 text file, one text per "
                        f"line.")
    try:
      texts = [line for line in fileio.read_text(f.input).splitlines() if line.strip()]
    except UnicodeDecodeError as e:
      raise ConfigError(f"--input={f.input} is not UTF-8 text ({e.reason} at byte {e.start}); "
                        f"pass a UTF-8 text file, one text per line.") from None
    r = load(f.workdir)
    vectors = represent(r, texts, unit=f.unit, pooling=f.pooling, layers=f.layers, mix=f.mix,
                        batch_size=f.batch_size, max_tokens=f.max_tokens, progress=True)
    _write(os.path.splitext(f.output)[0], texts, vectors,
           r.tokenizer if f.unit == "token" else None)
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


def _write(stem: str, texts: Sequence[str], vectors: list[np.ndarray], tokenizer) -> None:
  """STEM.npy (the vectors, texts one after another) and STEM.tsv (text index, unit index, the
  word, or with a `tokenizer` the token's text)."""
  rows = []
  for t, (text, v) in enumerate(zip(texts, vectors)):
    joined = " ".join(text.split())
    if tokenizer is None:
      units = joined.split(" ")
    else:
      (spans,) = tokenizer.encode_with_offsets([joined])[1]
      units = [joined[a:b] for a, b in np.asarray(spans).reshape(-1, 2)]
    rows += [f"{t}\t{u}\t{units[u]}" for u in range(len(v))]
  stacked = np.concatenate(vectors) if vectors else np.zeros((0,), np.float32)
  try:
    fileio.makedirs(os.path.dirname(stem) or ".")
    with fileio.open(stem + ".npy", "wb") as f:
      np.save(f, stacked)
    fileio.write_atomically(stem + ".tsv", "".join(row + "\n" for row in rows).encode("utf-8"))
  except OSError as e:
    if errors.no_space(e) is None:
      raise
    raise errors.no_space_error(e, os.path.dirname(stem) or ".", stem + ".npy") from e
  print(f"Wrote {stacked.shape} vectors of {len(texts)} texts to {stem}.npy (rows: {stem}.tsv).")


if __name__ == "__main__":
  define_flags()
  app.run(main)
