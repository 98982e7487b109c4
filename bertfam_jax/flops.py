"""Model FLOPs for MFU (../shared/PERF.md §3, MaxText's convention): matmul FLOPs of one forward +
backward pass (×3 of the forward), bidirectional attention counted in full, the MLM head counted only
at the positions it computes, remat recompute and padding of the batch not discounted."""

from __future__ import annotations

import jax

# Dense bf16 peak per device (datasheets / Cloud TPU docs; PERF.md §1). Never the sparse figure.
PEAK_BF16_FLOPS = {
    "H100": 989e12,   # SXM5; H100 PCIe is 756e12 but reports the same device_kind prefix
    "H200": 989e12,
    "A100": 312e12,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v5": 459e12,
    "TPU v6 lite": 918e12,
    "TPU v6e": 918e12,
}


def encoder_train_flops_per_token(model, seq_len: int, predictions_per_seq: int,
                                  sentence_head: bool, *, sentence_classes: int = 2,
                                  sbo_predictions_per_seq: int = 0,
                                  sbo_position_size: int = 0) -> float:
  """Training FLOPs per token of the encoder and its MLM-family heads (× 3 of the forward).

    6·L·(4d² + 2df) + 12·L·S·d         layers (weights; bidirectional attention in full)
    + 6·E·d                            ALBERT's E → d projection (when E ≠ d)
    + 6·p·(d·E + E·V)                  MLM head at its p = predictions / S positions
    + 6·q·((2d + s)·d + d·E + E·V)     SpanBERT's SBO head at q = SBO predictions / S (s = offset
                                       embedding width)
    + 6·(d² + d·c) / S                 pooler and sentence classifier (c classes), once per row

  `model` is `config.model`; E = `embedding_size` when factorised, else d. Cross-layer sharing
  changes parameters, not FLOPs.
  """
  d, f, layers, vocab = model.hidden, model.mlp, model.layers, model.vocab_size
  e = model.get("embedding_size") or d
  dense = 6 * layers * (4 * d * d + 2 * d * f)
  attention = 12 * layers * seq_len * d
  projection = 6 * e * d if e != d else 0.0
  p = predictions_per_seq / seq_len
  head = 6 * p * (d * e + e * vocab)
  q = sbo_predictions_per_seq / seq_len
  sbo = 6 * q * ((2 * d + sbo_position_size) * d + d * e + e * vocab)
  pooler = 6 * (d * d + d * sentence_classes) / seq_len if sentence_head else 0.0
  return float(dense + attention + projection + head + sbo + pooler)


def peak_flops_per_device(device=None) -> float | None:
  """Dense bf16 peak of `device` (default: the first local device); None when unknown (CPU)."""
  device = device or jax.local_devices()[0]
  kind = getattr(device, "device_kind", "")
  for prefix in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
    if kind.startswith(prefix) or prefix in kind:
      return PEAK_BF16_FLOPS[prefix]
  return None


def t5_train_flops_per_input_token(model, inputs_length: int, targets_length: int) -> float:
  """Training FLOPs of T5 (encoder and decoder) per encoder-input token (× 3 of the forward):

    encoder, per input token:   6·Le·(4·d·A + k·d·f) + 12·Le·Li·A
    cross-attention K/V, per input token:   6·Ld·2·d·A
    decoder, per target token:  6·Ld·(6·d·A + k·d·f) + 12·Ld·(Lt + Li)·A + 6·d·V

  with A = heads·head_dim, k = 3 for the gated MLP of v1.1 (else 2), self-attention counted in
  full (as for the encoder), decoder terms scaled by Lt / Li. The train loop's tokens are the
  encoder inputs (batch × data.seq_len), so tokens/s × this = model FLOP/s.
  """
  d, f, vocab = model.hidden, model.mlp, model.vocab_size
  a = model.heads * model.head_dim
  k = 3 if model.gated_mlp else 2
  li, lt, enc, dec = inputs_length, targets_length, model.layers, model.decoder_layers
  encoder = 6 * enc * (4 * d * a + k * d * f) + 12 * enc * li * a
  cross_kv = 6 * dec * 2 * d * a
  decoder = 6 * dec * (6 * d * a + k * d * f) + 12 * dec * (lt + li) * a + 6 * d * vocab
  return float(encoder + cross_kv + decoder * lt / li)


def decoder_only_train_flops_per_input_token(model, inputs_length: int,
                                             targets_length: int) -> float:
  """Training FLOPs of T5's decoder-only / prefix-LM model (one decoder stack, no cross-attention,
  over rows of L = Li + Lt tokens, logits at every position) per data.seq_len token (× 3 of the
  forward), the unit the train loop counts:

    per sequence token:   6·Ld·(4·d·A + k·d·f) + 12·Ld·L·A + 6·d·V,   scaled by L / Li.

  With Ld = Le and L = Li + Lt it is about the encoder-decoder's cost: the "M FLOPs" that Raffel
  et al. §3.2.2 give both architectures."""
  d, f, vocab = model.hidden, model.mlp, model.vocab_size
  a = model.heads * model.head_dim
  k = 3 if model.gated_mlp else 2
  length, dec = inputs_length + targets_length, model.decoder_layers
  per_token = 6 * dec * (4 * d * a + k * d * f) + 12 * dec * length * a + 6 * d * vocab
  return float(per_token * length / inputs_length)
