"""T5's denoising objectives (Raffel et al. 2020 §3.3) and BART's, on an encoder-decoder.

Every row of the T5 objective comparison is configuration of one composition, the reference's
`denoise` (t5/data/preprocessors.py), host-side in numpy (`objectives/t5_noise.py`):

  segments   `data.packing='t5_segments'`: documents concatenated (`concat_documents`, T5's
             reduce_concat_tokens; off for prefix LM and deshuffling) and cut into raw segments
             (`segment_length`: random_spans_helper's length for random spans, else
             data.seq_len − 1 as split_tokens_to_inputs_length).
  noise mask `noise_mask`        random_spans | iid | random_prefix (`noise_density`,
                                 `mean_noise_span_length`), mass_fragment (MASS: one contiguous
                                 fragment of density · length), or bart_infilling (BART's
                                 Poisson spans, each one <mask>; `poisson_lambda`, `mask_random`).
  inputs     `inputs_encoding`   e.g. noise_span_to_unique_sentinel (T5), noise_token_to_sentinel
                                 (MASS-style), noise_token_to_random_token_or_sentinel
                                 (BERT-style, `random_prob`), noise_token_to_sentinel_keep_or_
                                 random (MASS's 80/10/10, `random_prob`, `keep_prob`), drop_noise_tokens, permute_noise_
                                 tokens (deshuffling), drop_nonnoise_tokens (prefix LM's prefix).
  targets    `targets_encoding`  nonnoise_span_to_unique_sentinel (T5), original (full text),
                                 drop_nonnoise_tokens, drop_noise_tokens (prefix LM's suffix).
  sentences  `permute_sentences` BART's sentence permutation, before the noise.
  EOS        append_eos_after_trim to data.seq_len / objective.targets_length, then several
             examples packed per row (seqio trim_and_pack) with segment ids and positions.

The architecture (`model.architecture`, models/t5.py) decides the last step, as t5x's feature
converters do: encoder_decoder packs inputs and targets side by side (`EncDecFeatureConverter`,
`packing.pack_seq2seq`); decoder_only and prefix_lm pack each example's inputs and targets
concatenated into one sequence of data.seq_len + targets_length (`PrefixLMFeatureConverter`,
`packing.pack_decoder_only`), the prefix LM attending bidirectionally over its inputs, the
loss on the targets only (`objective.loss_on_targets_only`, seqio's default) or on the whole
sequence (a plain language model's). So every objective trains every architecture from one config.

Loss: token cross-entropy over every weighted target (sentinels and EOS included, as seqio's
`decoder_loss_weights`), averaged over target tokens, plus t5x's z-loss (`z_loss`). Batch keys:
objectives/__init__.py.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from bertfam_jax import config_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.data import packing
from bertfam_jax.data import sources as sources_lib
from bertfam_jax.models import t5 as t5_model
from bertfam_jax.objectives import losses, t5_noise
from bertfam_jax import flops


def build_model(config):
  return t5_model.T5(config.model)


FIELD_RULES = {
    "objective.noise_mask": t5_noise.MASK_CHOICES,
    "objective.inputs_encoding": tuple(t5_noise.ENCODINGS),
    "objective.targets_encoding": tuple(t5_noise.ENCODINGS),
    "objective.noise_density": config_lib.Range(0, 1, low_open=True),
    "objective.mean_noise_span_length": config_lib.Range(1),
    "objective.random_prob": config_lib.PROBABILITY,
    "objective.keep_prob": config_lib.PROBABILITY,
    "objective.targets_length": config_lib.Range(2),
    "objective.permute_sentences": config_lib.PROBABILITY,
    "objective.poisson_lambda": config_lib.POSITIVE,
    "objective.mask_random": config_lib.PROBABILITY,
    "objective.z_loss": config_lib.AT_LEAST_0,
    "objective.loss_on_targets_only": (True, False),
    # Absent = True; False (configs/mass.py): the decoder's cross-attention skips the inputs
    # holding the shared mask (MASS's enc_mask), the batch key cross_segment_ids.
    "objective.decoder_sees_masked": (True, False),
}


def validate(config) -> None:
  """T5's objective: known masks and encodings, and lengths the objective can fill."""
  o = config.objective
  if config.data.packing != "t5_segments":
    raise ConfigError("T5 reads token segments: set --config.data.packing=t5_segments.")
  if o.noise_mask == "random_prefix" and o.noise_density > 0.5:
    raise ConfigError("objective.noise_mask='random_prefix' needs noise_density <= 0.5 (the "
                      "reference's random_prefix_noise_mask raises above it).")
  if (o.permute_sentences or o.noise_mask == "bart_infilling") and o.targets_encoding != "original":
    raise ConfigError(f"objective.permute_sentences={o.permute_sentences} / noise_mask="
                      f"{o.noise_mask!r}: BART's target is the segment in its order, not "
                      f"{o.targets_encoding!r}: set --config.objective.targets_encoding=original "
                      f"(BART writes its own inputs; inputs_encoding is not read).")
  if config.tokenizer.kind == "sentencepiece" and config.tokenizer.extra_ids < 1 and (
      "sentinel" in o.inputs_encoding + o.targets_encoding):
    raise ConfigError("Sentinel encodings need sentinel ids: set --config.tokenizer.extra_ids=100.")
  if not o.decoder_sees_masked:
    if decoder_only(config):
      raise ConfigError("objective.decoder_sees_masked=False hides masked inputs from the "
                        "decoder's cross-attention, which a decoder-only model has not: set "
                        "--config.model.architecture=encoder_decoder.")
    if o.inputs_encoding not in _ONE_MASK_ENCODINGS or o.noise_mask == "bart_infilling":
      raise ConfigError(f"objective.decoder_sees_masked=False hides the inputs holding the shared "
                        f"mask (the first sentinel), which needs inputs_encoding in "
                        f"{sorted(_ONE_MASK_ENCODINGS)} and a noise_mask other than "
                        f"bart_infilling (got {o.inputs_encoding!r}, {o.noise_mask!r}); or set "
                        f"--config.objective.decoder_sees_masked=True.")
    if config.model.attention_impl == "cudnn":
      raise ConfigError("objective.decoder_sees_masked=False leaves holes in the cross-attention, "
                        "which cuDNN's padding lengths cannot express: set "
                        "--config.model.attention_impl=xla.")


# The inputs encodings that write one shared mask id (the first sentinel) over noise tokens or
# spans (and no other sentinel).
_ONE_MASK_ENCODINGS = frozenset({"noise_token_to_sentinel", "noise_token_to_sentinel_keep_or_random",
                                 "noise_token_to_random_token_or_sentinel",
                                 "noise_span_to_sentinel"})


def decoder_only(config) -> bool:
  """Whether the model is one decoder stack over inputs + targets (decoder_only, prefix_lm)."""
  return config.model.architecture != "encoder_decoder"


def init_inputs(config) -> dict[str, jax.ShapeDtypeStruct]:
  """One row of the model's inputs, to trace `T5.init`: encoder and decoder inputs, or the one
  sequence of a decoder-only model."""
  inputs, targets = config.data.seq_len, config.objective.targets_length
  i32 = jnp.int32
  if decoder_only(config):
    row = jnp.ones((1, inputs + targets), i32)
    prefix = dict(decoder_causal_attention=row) if config.model.architecture == "prefix_lm" else {}
    return dict(input_ids=None, decoder_input_ids=row, input_segment_ids=None,
                decoder_segment_ids=row, **prefix)
  return dict(input_ids=jnp.zeros((1, inputs), i32), decoder_input_ids=jnp.zeros((1, targets), i32),
              input_segment_ids=jnp.ones((1, inputs), i32),
              decoder_segment_ids=jnp.ones((1, targets), i32))


def segment_length(config) -> int:
  """Raw tokens per segment: for random spans the largest length whose noised inputs fill
  data.seq_len (`random_spans_helper`; 568 for 512 at 15% / mean 3), else data.seq_len − 1 (room
  for EOS, `split_tokens_to_inputs_length`); BART's full-text target bounds it by targets_length."""
  o, inputs = config.objective, config.data.seq_len
  if o.noise_mask == "random_spans":
    raw, needed = t5_noise.random_spans_helper(inputs, o.noise_density, o.mean_noise_span_length)
    if o.targets_encoding == "nonnoise_span_to_unique_sentinel" and o.targets_length < needed:
      raise ConfigError(
          f"objective.targets_length={o.targets_length} is below the {needed} targets that "
          f"{o.noise_density:.0%} random spans of mean {o.mean_noise_span_length} make from "
          f"{raw} raw tokens (random_spans_helper); set --config.objective.targets_length="
          f"{needed}.")
    return raw
  if o.noise_mask == "bart_infilling":
    return min(inputs, o.targets_length) - 1
  return inputs - 1


def pipeline_options(config) -> dict:
  """Pipeline keywords: the raw segment length; the features replace the packed segments."""
  return dict(segment_len=segment_length(config), replace_examples=True)


def describe(config) -> str:
  o = config.objective
  return (f"T5 objective: {o.noise_mask} noise {o.noise_density:.0%}, inputs {o.inputs_encoding}, "
          f"targets {o.targets_encoding}; {segment_length(config)} raw tokens -> "
          f"{config.data.seq_len} inputs / {o.targets_length} targets")


def flops_per_token(config) -> float:
  inputs, targets = config.data.seq_len, config.objective.targets_length
  if decoder_only(config):
    return flops.decoder_only_train_flops_per_input_token(config.model, inputs, targets)
  return flops.t5_train_flops_per_input_token(config.model, inputs, targets)


def make_features(config, tokenizer):
  """Returns the host-side `fn(segments, rng) -> batch` (see the module docstring)."""
  segment_length(config)  # the length check, before any data is read
  config_lib.check_vocabulary(config, tokenizer)
  # cuDNN attention takes padding as lengths, which cannot separate packed examples
  # (models/t5.py): on it each row holds one example.
  examples_per_row = 1 if config.model.attention_impl == "cudnn" else None
  return functools.partial(t5_features, config=config.objective,
                           inputs_length=config.data.seq_len, eos_id=tokenizer.eos_id,
                           examples_per_row=examples_per_row, decoder_only=decoder_only(config),
                           **_noise_ids(tokenizer))


def _noise_ids(tokenizer) -> dict:
  """The ids `noise_segments` reads from the tokenizer."""
  return dict(sentinel_start=tokenizer.sentinel_start, vocab_size=tokenizer.vocab_size,
              mask_id=tokenizer.mask_id, word_start_table=tokenizer.word_start_for("bart"),
              num_reserved_tokens=reserved_ids(tokenizer))


def target_lengths(config, tokenizer, documents, num_documents: int = 400,
                   seed: int = 0) -> np.ndarray:
  """[examples] the targets' lengths (EOS included, before any cut) that the objective makes from
  the raw segments of the first `num_documents` documents, noised with generator `seed`: the
  distribution `objective.targets_length` is sized from, per row (experiments/t5_objectives.py).
  Independent of `targets_length` (except BART's, whose segments it bounds)."""
  docs = [tokenizer.encode(sources_lib.split_sentences(documents[i]))
          for i in range(min(num_documents, len(documents)))]
  segments = packing.token_segments(docs, segment_length(config),
                                    concat_documents=config.objective.concat_documents,
                                    pad_id=tokenizer.pad_id)
  _, (_, lengths) = noise_segments(
      segments["tokens"], segments["lengths"], segments["sentence_start"],
      np.random.default_rng(seed), config=config.objective, **_noise_ids(tokenizer))
  return np.asarray(lengths, np.int64) + 1


def reserved_ids(tokenizer) -> int:
  """The number of leading ids that are special (pad, unk, EOS, [CLS], [MASK], user symbols):
  what random-token noise never draws, as the reference's `num_reserved_tokens=3` keeps T5's
  pad, EOS and unk out (3 for T5's own vocabulary, 5 for ours, 6 with XLNet's <eod>)."""
  special = set(np.asarray(tokenizer.special_ids).tolist()) | {tokenizer.unk_id}
  reserved = 0
  while reserved in special:
    reserved += 1
  return reserved


def noise_segments(tokens, lengths, sentence_start, rng: np.random.Generator, *, config,
                   sentinel_start: int, vocab_size: int, mask_id: int,
                   word_start_table: np.ndarray, num_reserved_tokens: int = 3):
  """One objective's (inputs, targets) of raw segments, before EOS.

  Args:
    tokens: [n, T] int32 raw segments (0-padded), lengths [n], sentence_start [n, T] bool.
    rng: the only randomness.
    config: the `objective` section.
    num_reserved_tokens: leading special ids random-token noise never draws (`reserved_ids`).

  Returns:
    ((inputs [n, Li'], input_lengths [n]), (targets [n, Lt'], target_lengths [n])).
  """
  o = config
  originals = tokens
  if o.permute_sentences:  # the inputs only: the target is the document in its order (fairseq)
    tokens = t5_noise.bart_permute_sentences(tokens, lengths, sentence_start, rng,
                                             ratio=o.permute_sentences)
  if o.noise_mask == "bart_infilling":
    word_start = word_start_table[tokens] & (np.arange(tokens.shape[1]) < lengths[:, None])
    inputs = t5_noise.bart_text_infilling(
        tokens, lengths, word_start, rng, mask_ratio=o.noise_density,
        poisson_lambda=o.poisson_lambda, mask_id=mask_id, random_ratio=o.mask_random,
        vocab_size=vocab_size)
    return inputs, (originals, lengths)
  mask_params = (dict(mean_noise_span_length=o.mean_noise_span_length)
                 if o.noise_mask == "random_spans" else {})
  random_params = {
      "noise_token_to_random_token_or_sentinel": dict(random_prob=o.random_prob),
      "noise_token_to_sentinel_keep_or_random": dict(random_prob=o.random_prob,
                                                     keep_prob=o.keep_prob),
  }.get(o.inputs_encoding, {})
  if "random" in o.inputs_encoding:
    random_params["num_reserved_tokens"] = num_reserved_tokens
  noised = t5_noise.denoise(
      tokens, lengths, rng, noise_density=o.noise_density,
      noise_mask_fn=functools.partial(t5_noise.NOISE_MASKS[o.noise_mask], **mask_params),
      inputs_fn=functools.partial(t5_noise.ENCODINGS[o.inputs_encoding], **random_params),
      targets_fn=t5_noise.ENCODINGS[o.targets_encoding], sentinel_start=sentinel_start,
      vocab_size=vocab_size)
  targets = ((originals, lengths) if o.permute_sentences   # validated: targets are the original
             else (noised["targets"], noised["target_lengths"]))
  return (noised["inputs"], noised["input_lengths"]), targets


def t5_features(segments, rng: np.random.Generator, *, config, inputs_length: int,
                sentinel_start: int, vocab_size: int, eos_id: int, mask_id: int,
                word_start_table: np.ndarray, num_reserved_tokens: int = 3,
                examples_per_row: int | None = None, decoder_only: bool = False) -> dict:
  """Noises `packing.token_segments` output and packs the examples into rows (at most
  `examples_per_row` each, when given): side by side for an encoder-decoder, concatenated for a
  `decoder_only` model (the module docstring).

  Args:
    segments: tokens [n, T], lengths [n], sentence_start [n, T] from `packing.token_segments`.
    rng: the only randomness.
    config: the `objective` section.
    inputs_length: data.seq_len.

  Returns:
    The encoder-decoder batch of objectives/__init__.py, [rows, Li] and [rows, Lt]; or the
    decoder-only batch, [rows, Li + Lt].
  """
  (inputs, input_lengths), (targets, target_lengths) = noise_segments(
      segments["tokens"], segments["lengths"], segments["sentence_start"], rng, config=config,
      sentinel_start=sentinel_start, vocab_size=vocab_size, mask_id=mask_id,
      word_start_table=word_start_table, num_reserved_tokens=num_reserved_tokens)
  inputs, input_lengths = t5_noise.append_eos_after_trim(inputs, input_lengths, inputs_length,
                                                         eos_id)
  cut = np.asarray(target_lengths) + 1 > config.targets_length   # EOS included
  targets, target_lengths = t5_noise.append_eos_after_trim(targets, target_lengths,
                                                           config.targets_length, eos_id)
  if decoder_only:
    return packing.pack_decoder_only(
        inputs, input_lengths, targets, target_lengths, inputs_length=inputs_length,
        targets_length=config.targets_length, cut=cut, examples_per_row=examples_per_row,
        loss_on_targets_only=config.loss_on_targets_only)
  batch = packing.pack_seq2seq(inputs, input_lengths, targets, target_lengths,
                               inputs_length=inputs_length, targets_length=config.targets_length,
                               cut=cut, examples_per_row=examples_per_row)
  if not config.decoder_sees_masked:
    batch["cross_segment_ids"] = cross_segment_ids(batch, sentinel_start)
  return batch


def cross_segment_ids(batch: dict, mask_id: int) -> np.ndarray:
  """[rows, Li] int32: input_segment_ids with 0 where the input holds `mask_id`, the encoder
  positions the decoder's cross-attention skips (MASS-unsupNMT trainer.py `mass_step`:
  `enc_mask = x1.ne(mask_index)`, applied to the decoder's `src_mask`). The kept and random
  tokens of the fragment stay visible, as there."""
  return np.where(batch["input_ids"] == mask_id, 0, batch["input_segment_ids"]).astype(np.int32)


def loss_fn(model, params, batch, rng, config, *, deterministic=False):
  """Returns (mean target-token CE + z-loss, {metric: (sum, count)}); an encoder-decoder batch
  (it has input_ids) or a decoder-only one."""
  if "input_ids" in batch:
    logits = model.apply(
        params, batch["input_ids"], batch["decoder_input_ids"], batch["input_segment_ids"],
        batch["decoder_segment_ids"], deterministic=deterministic, rngs={"dropout": rng},
        cross_segment_ids=batch.get("cross_segment_ids"))
  else:
    prefix = ({"decoder_causal_attention": batch["decoder_causal_attention"]}
              if config.model.architecture == "prefix_lm" else {})
    logits = model.apply(params, None, batch["decoder_input_ids"], None,
                         batch["decoder_segment_ids"], deterministic=deterministic,
                         rngs={"dropout": rng}, **prefix)
  total, z_total, correct, count = losses.token_cross_entropy(
      logits, batch["decoder_target_ids"], batch["decoder_loss_weights"], config.objective.z_loss)
  metrics = {"t5_loss": (total - z_total, count), "t5_accuracy": (correct, count),
             "z_loss": (z_total, count), **fill_metrics(batch, config)}
  return total / jnp.maximum(count, 1.0), metrics


def fill_metrics(batch, config) -> dict:
  """What a row of the comparison saw, logged with every step: the share of input and target
  positions holding tokens (× length × batch × steps: the tokens seen), and the share of
  examples whose targets were cut at objective.targets_length (`targets_cut`, pre-training
  batches only). A decoder-only row's shares are of rows × data.seq_len input and rows ×
  targets_length target positions, as an encoder-decoder's."""
  f32 = jnp.float32
  if "input_ids" in batch:
    input_tokens = batch["input_segment_ids"] > 0
    metrics = {"input_fill": (jnp.sum(input_tokens.astype(f32)), f32(input_tokens.size)),
               "target_fill": (jnp.sum(batch["decoder_loss_weights"]),
                               f32(batch["decoder_loss_weights"].size))}
  else:   # the prefix mask holds the inputs and one target position per example
    rows = batch["decoder_segment_ids"].shape[0]
    tokens = jnp.sum((batch["decoder_segment_ids"] > 0).astype(f32))
    inputs = (jnp.sum(batch["decoder_causal_attention"].astype(f32))
              - jnp.sum(_example_starts(batch).astype(f32)))
    metrics = {"input_fill": (inputs, f32(rows * config.data.seq_len)),
               "target_fill": (tokens - inputs, f32(rows * config.objective.targets_length))}
  if "targets_cut" in batch:
    metrics["targets_cut"] = (jnp.sum(batch["targets_cut"].astype(f32)),
                              jnp.sum(_example_starts(batch).astype(f32)))
  return metrics


def _example_starts(batch):
  """[rows, L] bool: each packed example's first decoder position (pre-training batches only:
  fine-tuning's have no decoder_positions)."""
  return (batch["decoder_positions"] == 0) & (batch["decoder_segment_ids"] > 0)
