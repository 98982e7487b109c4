"""bertfam_jax.models.xlnet (spec §6.4): parity with HF's XLNetLMHeadModel, and the properties the
permutation LM rests on — the query stream factorises over the order, the identity order is a
causal LM, the memory continues one long pass, padding stays out, bf16/scan/remat change nothing
that matters.

The parity test needs torch and transformers (run it with /tmp/venv_parity/bin/python); the others
run anywhere. The HF → bertfam_jax name mapping under test is the package's (bertfam_jax/hf/).
"""

import importlib.util
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertfam_jax.config_lib import ConfigError
from bertfam_jax.models import xlnet
from helpers import tiny

VOCAB, HIDDEN, HEADS, HEAD_DIM, MLP, LAYERS = 37, 16, 2, 8, 32, 2
HAS_TORCH = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))


def tiny_config(**overrides):
  """2 layers, hidden 16 (2 heads of 8), FFN 32, no dropout; the reference's tanh GELU."""
  return tiny.xlnet(**{**dict(vocab_size=VOCAB, hidden=HIDDEN, layers=LAYERS, heads=HEADS,
                               head_dim=HEAD_DIM, mlp=MLP, activation="gelu_tanh"), **overrides})


def random_params(config, seed=0, scale=0.3):
  """Our tree filled with weights that make attention peaked (so masks, distances and segments
  change the outputs visibly): N(0, scale²) projections and biases, N(0, 1) embeddings and
  mask_emb, LayerNorm γ 1 + N(0, 0.1²), β and dense biases N(0, 0.1²)."""
  shapes = jax.eval_shape(
      lambda: nn.unbox(xlnet.XLNet(config).init(
          jax.random.key(0), jnp.zeros((1, 4), jnp.int32), jnp.zeros((1, 4), jnp.int32),
          target_mapping=jnp.zeros((1, 1, 4)), deterministic=True)))
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    names = [p.key for p in path]
    if names[-1] in ("embedding", "mask_emb"):
      std, mean = 1.0, 0.0
    elif names[-1] == "scale":
      std, mean = 0.1, 1.0
    elif names[-1] == "bias":
      std, mean = 0.1, 0.0
    else:
      std, mean = scale, 0.0
    return jnp.asarray(mean + std * rng.normal(size=leaf.shape), jnp.float32)

  return jax.tree_util.tree_map_with_path(draw, shapes)


_APPLY_FNS = {}


def apply_fn(config):
  """Jitted eval-mode `XLNet(config).apply(params, *positional inputs)`, one per distinct config
  (tests with equal configs and shapes share the compilation)."""
  key = config.to_json()
  if key not in _APPLY_FNS:
    model = xlnet.XLNet(config)
    _APPLY_FNS[key] = jax.jit(lambda params, *args: model.apply(params, *args, deterministic=True))
  return _APPLY_FNS[key]


def order_mask(rank_BL):
  """perm_mask [B, L, L] from ranks [B, L] in the factorisation order: query i may not attend to
  key j unless j comes earlier (rank j < rank i); 1 = blocked (the content stream clears the
  diagonal itself)."""
  return (rank_BL[:, None, :] >= rank_BL[:, :, None]).astype(np.float32)


# --------------------------------------------------------------------------------------------
# 1. Parity with HF transformers.
# --------------------------------------------------------------------------------------------

def params_from_hf(model, config):
  """HF XLNetLMHeadModel state → our tree by the package's name table (bertfam_jax/hf/mapping.py
  xlnet_entries and the family's lm_loss head): q/k/v/o/r, the biases and seg_embed keep their
  [hidden, heads, head_dim] / [heads, head_dim] / [2, heads, head_dim] layouts, Linear weights
  are transposed; untie_r=False reads the biases HF stores per layer into our one copy."""
  from bertfam_jax.hf import families, mapping  # noqa: PLC0415  (needs safetensors, tokenizers)
  sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  family = families.get("xlnet")
  entries = families.entries(family, family.architecture("XLNetLMHeadModel"), config, {})
  return {"params": jax.tree.map(jnp.asarray, mapping.params_from_hf(sd, entries))}


def hf_model(config, *, bi_data, hf_activation):
  import torch  # noqa: PLC0415
  import transformers  # noqa: PLC0415
  torch.manual_seed(0)
  hf_config = transformers.XLNetConfig(
      vocab_size=config.vocab_size, d_model=config.hidden, n_layer=config.layers,
      n_head=config.heads, d_inner=config.mlp, ff_activation=hf_activation, attn_type="bi",
      untie_r=True, dropout=0.0, layer_norm_eps=config.layer_norm_eps,
      mem_len=config.mem_len, reuse_len=config.reuse_len, bi_data=bi_data,
      clamp_len=config.clamp_len, same_length=False)
  model = transformers.XLNetLMHeadModel(hf_config).eval()
  assert model.lm_loss.weight is model.transformer.word_embedding.weight  # tied
  shared = {}
  with torch.no_grad():  # peaked attention and non-trivial norms and biases, as random_params
    for name, value in model.named_parameters():
      leaf = name.split(".")[-1]
      if leaf in ("r_w_bias", "r_r_bias", "r_s_bias") and not config.untie_r:
        value.copy_(shared.setdefault(leaf, torch.randn_like(value) * 0.3))  # one for all layers
      elif "layer_norm.weight" in name:
        value.uniform_(0.5, 1.5)
      elif name.endswith("bias"):
        value.normal_(0.0, 0.1)
      elif "word_embedding" in name or "mask_emb" in name:
        value.normal_(0.0, 1.0)
      else:
        value.normal_(0.0, 0.3)
  return model


PARITY_CASES = {
    # bi_data=False; memory, segments, permutation mask, targets with a padding row, padding.
    "memory_segments_perm": dict(bi_data=False, direction=None, memory=True, segments=True,
                                 perm=True, targets=True, overrides=dict(
                                     activation="gelu", mem_len=8, reuse_len=5)),
    # HF bi_data puts the first half of the batch forward and the second half reversed.
    "bi_data_clamped_tanh": dict(bi_data=True, direction=[1.0, -1.0], memory=True, segments=True,
                                 perm=True, targets=True, overrides=dict(
                                     activation="gelu_tanh", clamp_len=4, mem_len=6,
                                     reuse_len=0)),
    # No memory, no segment term, no permutation mask (the query stream then sees its own token),
    # biases shared by all layers (untie_r=False: HF's layers all hold the same values).
    "no_memory_no_segments_tied_r": dict(bi_data=False, direction=None, memory=False,
                                         segments=False, perm=False, targets=True,
                                         overrides=dict(activation="gelu", untie_r=False,
                                                        mem_len=4, reuse_len=6)),
    # Fine-tuning: content stream only, bidirectional, no memory kept.
    "finetune": dict(bi_data=False, direction=None, memory=False, segments=True, perm=False,
                     targets=False, overrides=dict(activation="gelu", mem_len=0, reuse_len=0)),
}


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch and transformers (/tmp/venv_parity)")
@pytest.mark.parametrize("case", sorted(PARITY_CASES))
def test_matches_hf_xlnet_lm_head_model(case):
  """With HF's weights mapped by `params_from_hf`, float32, eval mode, our outputs equal
  transformers.XLNetLMHeadModel's within 1e-4 (atol and rtol):
    logits [B, P, V]  = HF `logits` (query stream through the tied table + bias; a zero
                        target_mapping row included);
    content [B, L, D] = the last layer's content stream, HF `hidden_states[-2]` with a query
                        stream (pairs h, g per layer), else `hidden_states[-1]`;
    new_mems[i]       = HF `mems[i]` transposed from [M, B, D] (the cached layer inputs),
  for the inputs of PARITY_CASES[case]: HF input_mask = 1 − our input_mask, token_type_ids =
  segment_ids, mems = ours transposed to [M, B, D], bi_data ≙ direction [+1, −1]."""
  import torch  # noqa: PLC0415
  spec = PARITY_CASES[case]
  config = tiny_config(**spec["overrides"])
  hf = hf_model(config, bi_data=spec["bi_data"],
                hf_activation={"gelu": "gelu", "gelu_tanh": "gelu_new"}[config.activation])
  params = params_from_hf(hf, config)
  assert (jax.tree.structure(params) == jax.tree.structure(random_params(config)))

  rng = np.random.default_rng(1)
  batch, length, memory, real = 2, 10, 6, (10, 8)
  input_ids = rng.integers(0, VOCAB, (batch, length)).astype(np.int32)
  input_mask = (np.arange(length)[None] < np.array(real)[:, None]).astype(np.int32)
  segment_ids = np.tile(np.array([0] * 4 + [1] * 5 + [2], np.int32), (batch, 1))
  rank = np.stack([rng.permutation(length) for _ in range(batch)])
  perm_mask = order_mask(rank)
  target_mapping = np.zeros((batch, 4, length), np.float32)  # 3 targets + one padding row
  for b in range(batch):
    target_mapping[b, np.arange(3), np.sort(rng.choice(real[b], 3, replace=False))] = 1.0
  mems = tuple(rng.normal(size=(batch, memory, HIDDEN)).astype(np.float32)
               for _ in range(LAYERS))
  ours = apply_fn(config)(
      params, input_ids, segment_ids if spec["segments"] else None, input_mask,
      perm_mask if spec["perm"] else None, target_mapping if spec["targets"] else None,
      mems if spec["memory"] else None,
      None if spec["direction"] is None else np.array(spec["direction"], np.float32))

  t = torch.from_numpy
  with torch.no_grad():
    theirs = hf(input_ids=t(input_ids).long(),
                token_type_ids=t(segment_ids).long() if spec["segments"] else None,
                input_mask=t(1.0 - input_mask.astype(np.float32)),
                perm_mask=t(perm_mask) if spec["perm"] else None,
                target_mapping=t(target_mapping) if spec["targets"] else None,
                mems=[t(m.transpose(1, 0, 2).copy()) for m in mems] if spec["memory"] else None,
                use_mems=True, output_hidden_states=True)
  close = dict(rtol=1e-4, atol=1e-4)
  if spec["targets"]:
    np.testing.assert_allclose(ours["logits"], theirs.logits.numpy(), **close)
    np.testing.assert_allclose(ours["content"], theirs.hidden_states[-2].numpy(), **close)
  else:
    assert ours["logits"] is None and ours["query"] is None
    np.testing.assert_allclose(ours["content"], theirs.hidden_states[-1].numpy(), **close)
  if config.mem_len:
    assert len(ours["new_mems"]) == LAYERS
    for mine, hf_mem in zip(ours["new_mems"], theirs.mems):
      np.testing.assert_allclose(mine, hf_mem.numpy().transpose(1, 0, 2), **close)
  else:
    assert ours["new_mems"] is None


# --------------------------------------------------------------------------------------------
# 2. The query stream factorises over the permutation order.
# --------------------------------------------------------------------------------------------

def test_query_stream_likelihood_depends_exactly_on_the_predecessors():
  """A random order z over L = 8 tokens, every token a target (target_mapping = identity rows),
  perm_mask blocking every key that is not earlier in z, random memory (always visible), two
  segments. For each target t, a second row replaces every token that is not a predecessor of t
  (t itself and every later token in z) by a different id. Then, exactly (≤ 1e-6):
    log p(x_t | ·) from the original row = the same from the corrupted row;
    the content stream at each predecessor j of t is unchanged as well;
  and Σ_t (corrupted-row log-likelihoods) = the one-pass total Σ_t log p(x_t | x_{z<t}), the
  log-likelihood of x under z. Control: replacing t's predecessors instead changes log p(x_t)
  (> 1e-3) for every t with a predecessor, so the equality is not vacuous."""
  config = tiny_config(mem_len=0)
  params = random_params(config, seed=2)
  rng = np.random.default_rng(3)
  length, memory = 8, 3
  ids = rng.integers(0, VOCAB, length).astype(np.int32)
  rank = rng.permutation(length)
  other = lambda x: ((x + rng.integers(1, VOCAB, x.shape)) % VOCAB).astype(np.int32)  # noqa
  hidden_rows, shown_rows = [ids], [ids]  # corrupted: non-predecessors / predecessors replaced
  for t in range(length):
    hidden_rows.append(np.where(rank >= rank[t], other(ids), ids))
    shown_rows.append(np.where(rank < rank[t], other(ids), ids))
  rows = np.stack(hidden_rows + shown_rows[1:])  # [1 + 2L, L]
  batch = rows.shape[0]
  segments = np.tile((np.arange(length) >= 5).astype(np.int32), (batch, 1))
  mems = tuple(np.tile(rng.normal(size=(1, memory, HIDDEN)).astype(np.float32), (batch, 1, 1))
               for _ in range(LAYERS))
  perm = np.tile(order_mask(rank[None]), (batch, 1, 1))
  mapping = np.tile(np.eye(length, dtype=np.float32)[None], (batch, 1, 1))
  out = apply_fn(config)(params, rows, segments, None, perm, mapping, mems, None)
  logp = np.asarray(jax.nn.log_softmax(out["logits"].astype(jnp.float32), axis=-1))
  content = np.asarray(out["content"])
  targets = np.arange(length)
  original = logp[0, targets, ids]
  hidden = logp[1 + targets, targets, ids]
  shown = logp[1 + length + targets, targets, ids]
  np.testing.assert_allclose(hidden, original, rtol=0, atol=1e-6)
  for t in range(length):
    predecessors = rank < rank[t]
    np.testing.assert_allclose(content[1 + t][predecessors], content[0][predecessors], atol=1e-6)
    if predecessors.any():
      assert abs(shown[t] - original[t]) > 1e-3, t
  assert math.isclose(hidden.sum(), original.sum(), abs_tol=1e-5)


# --------------------------------------------------------------------------------------------
# 3. Identity order: a causal language model.
# --------------------------------------------------------------------------------------------

def _gelu_tanh(x):
  return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def _layer_norm(x, p, eps):
  mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * p["norm"]["scale"] + p["norm"]["bias"]


def _reference_attention(p, x_query, query_index, query_segment, keys, key_segments, hidden):
  """Spec §6.4's score, written per key in float64: one query state at index `query_index` of the
  key axis (memory first), attending to `keys` [K, D] → the attention sublayer's output [D]."""
  a = p["rel_attn"]
  q = np.einsum("d,dnh->nh", x_query, a["q"])
  inv_freq = 1.0 / 10000 ** (np.arange(0, hidden, 2) / hidden)
  scores, values = [], []
  for j, (key, segment) in enumerate(zip(keys, key_segments)):
    distance = query_index - j
    r = np.concatenate([np.sin(distance * inv_freq), np.cos(distance * inv_freq)])
    s = a["seg_embed"][int(segment != query_segment)]
    k_j = np.einsum("d,dnh->nh", key, a["k"])
    r_j = np.einsum("d,dnh->nh", r, a["r"])
    scores.append(((q + a["r_w_bias"]) * k_j).sum(-1) + ((q + a["r_r_bias"]) * r_j).sum(-1)
                  + ((q + a["r_s_bias"]) * s).sum(-1))
    values.append(np.einsum("d,dnh->nh", key, a["v"]))
  scores = np.stack(scores) / np.sqrt(a["q"].shape[-1])  # [K, N]
  probs = np.exp(scores - scores.max(0))
  probs /= probs.sum(0)
  return np.einsum("kn,knh,dnh->d", probs, np.stack(values), a["o"])


def _reference_layer(p, x, attention_out, eps):
  x = _layer_norm(x + attention_out, p["rel_attn"]["layer_norm"], eps)
  f = p["ff"]
  y = _gelu_tanh(x @ f["layer_1"]["kernel"] + f["layer_1"]["bias"])
  return _layer_norm(x + y @ f["layer_2"]["kernel"] + f["layer_2"]["bias"], f["layer_norm"], eps)


def causal_lm_reference(params, config, ids, segments, mems, target):
  """Logits [V] for x_target computed from x_<target alone (float64): the content states of
  the prefix, each position attending to the memory and to itself and the positions before it;
  then a query state from mask_emb at position `target` (segment segments[target]) attending at
  every layer to the memory and the prefix's states of that layer; tied output + bias."""
  p = jax.tree.map(lambda x: np.asarray(x, np.float64), params["params"])
  memory, eps = mems[0].shape[0], config.layer_norm_eps
  h = p["word_embedding"]["embedding"][ids[:target]]  # [target, D]; never reads ids[target:]
  g = p["mask_emb"][0, 0]
  key_segments = np.concatenate([np.zeros(memory, np.int64), segments[:target]])
  for i in range(config.layers):
    layer, mem = p[f"layer_{i}"], mems[i].astype(np.float64)
    keys = np.concatenate([mem, h])
    g = _reference_layer(layer, g, _reference_attention(
        layer, g, memory + target, segments[target], keys, key_segments, config.hidden), eps)
    h = np.array([_reference_layer(layer, h[s], _reference_attention(
        layer, h[s], memory + s, segments[s], keys[:memory + s + 1],
        key_segments[:memory + s + 1], config.hidden), eps) for s in range(target)]
                 ).reshape(target, config.hidden)
  return g @ p["word_embedding"]["embedding"].T + p["lm_loss"]["bias"]


def test_identity_order_is_a_causal_language_model():
  """Order = identity, every token a target, random memory M = 3, two segments: our logits for
  target i (one pass, perm_mask[i, j] = 1 iff j ≥ i) equal, within 1e-4, `causal_lm_reference`
  — an independent float64 loop that predicts x_i from x_<i only (the content states of the
  prefix computed causally, the mask_emb query at position i attending to them and the memory,
  relative distances and segment terms written out per key as spec §6.4 states them)."""
  config = tiny_config(mem_len=0)
  params = random_params(config, seed=4)
  rng = np.random.default_rng(5)
  length, memory = 7, 3
  ids = rng.integers(0, VOCAB, length).astype(np.int32)
  segments = (np.arange(length) >= 4).astype(np.int32)
  mems = tuple(rng.normal(size=(memory, HIDDEN)).astype(np.float32) for _ in range(LAYERS))
  perm = order_mask(np.arange(length)[None])
  mapping = np.eye(length, dtype=np.float32)[None]
  out = apply_fn(config)(params, ids[None], segments[None], None, perm, mapping,
                         tuple(m[None] for m in mems), None)
  expected = np.stack([causal_lm_reference(params, config, ids, segments, mems, i)
                       for i in range(length)])
  np.testing.assert_allclose(out["logits"][0], expected, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------------------------
# 4. Segment recurrence.
# --------------------------------------------------------------------------------------------

def test_memory_continues_one_pass_and_carries_no_gradient():
  """Windows w1, w2 of 6 tokens (rows with direction +1 and −1), reuse_len = mem_len = 6,
  w1 in segment 0 (memory keys count as segment 0), w2 in segments 0/1/2:
    A = model(w1) with no memory; B = model(w2, mems=A.new_mems) with a permutation mask and
    targets inside w2;
    C = one pass over [w1; w2] with w1's rows blocked from w2's columns, w2's rows seeing all of
    w1 and, among themselves, B's mask; the same targets shifted by 6; reuse_len = 12, mem_len 6.
  Then (≤ 1e-5): B.content = C.content[:, 6:], B.logits = C.logits and B.new_mems = C.new_mems
  (the last 6 cached layer inputs: w2's). The memory is float32 and stops gradients:
  d B.content.sum() / d (A's parameters) = 0 exactly, while d / d (B's parameters) ≠ 0."""
  config = tiny_config(mem_len=6, reuse_len=6)
  params = random_params(config, seed=6)
  rng = np.random.default_rng(7)
  n, batch = 6, 2
  w1, w2 = (rng.integers(0, VOCAB, (batch, n)).astype(np.int32) for _ in range(2))
  seg1 = np.zeros((batch, n), np.int32)
  seg2 = np.tile(np.array([0, 0, 1, 1, 1, 2], np.int32), (batch, 1))
  direction = np.array([1.0, -1.0], np.float32)
  perm2 = order_mask(np.stack([rng.permutation(n) for _ in range(batch)]))
  mapping2 = np.zeros((batch, 3, n), np.float32)
  mapping2[:, np.arange(3), [1, 3, 4]] = 1.0
  run = apply_fn(config)
  a = run(params, w1, seg1, None, None, None, None, direction)
  b = run(params, w2, seg2, None, perm2, mapping2, a["new_mems"], direction)
  assert all(m.dtype == jnp.float32 and m.shape == (batch, 6, HIDDEN) for m in a["new_mems"])

  perm = np.zeros((batch, 2 * n, 2 * n), np.float32)
  perm[:, :n, n:] = 1.0
  perm[:, n:, n:] = perm2
  mapping = np.concatenate([np.zeros_like(mapping2), mapping2], axis=2)
  both = (np.concatenate([w1, w2], 1), np.concatenate([seg1, seg2], 1), None, perm, mapping,
          None, direction)
  c = apply_fn(tiny_config(mem_len=6, reuse_len=12))(params, *both)
  close = dict(rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(b["content"], c["content"][:, n:], **close)
  np.testing.assert_allclose(b["logits"], c["logits"], **close)
  for i in range(LAYERS):
    np.testing.assert_allclose(b["new_mems"][i], c["new_mems"][i], **close)

  model = xlnet.XLNet(config)

  def second_window(params_a, params_b):
    mems = model.apply(params_a, w1, seg1, deterministic=True)["new_mems"]
    return model.apply(params_b, w2, seg2, mems=mems, deterministic=True)["content"].sum()

  grad_a, grad_b = jax.jit(jax.grad(second_window, argnums=(0, 1)))(params, params)
  assert all(not np.any(g) for g in jax.tree.leaves(grad_a))
  assert any(np.any(g) for g in jax.tree.leaves(grad_b))


# --------------------------------------------------------------------------------------------
# 5. Padding, bfloat16, scan/remat, configuration errors.
# --------------------------------------------------------------------------------------------

def _pretraining_batch(seed, batch=2, length=10, real=(10, 7)):
  rng = np.random.default_rng(seed)
  input_mask = (np.arange(length)[None] < np.array(real)[:, None]).astype(np.int32)
  rank = np.stack([rng.permutation(length) for _ in range(batch)])
  mapping = np.zeros((batch, 3, length), np.float32)
  for b in range(batch):
    mapping[b, np.arange(3), np.sort(rng.choice(real[b], 3, replace=False))] = 1.0
  return dict(
      input_ids=rng.integers(0, VOCAB, (batch, length)).astype(np.int32),
      segment_ids=np.tile((np.arange(length) >= 5).astype(np.int32), (batch, 1)),
      input_mask=input_mask, perm_mask=order_mask(rank), target_mapping=mapping,
      mems=tuple(rng.normal(size=(batch, 4, HIDDEN)).astype(np.float32) for _ in range(LAYERS)),
      direction=np.array([1.0, -1.0], np.float32))


def _run(config, params, batch):
  keys = ("input_ids", "segment_ids", "input_mask", "perm_mask", "target_mapping", "mems",
          "direction")
  return apply_fn(config)(params, *(batch[k] for k in keys))


def test_padding_never_reaches_real_positions():
  """Row 1 has 3 padding positions (input_mask 0). Changing their ids and segment ids and
  their perm_mask rows/columns leaves exactly (≤ 1e-6) unchanged: content at real positions,
  every logit (targets are real tokens) and the new memory (old memory[2:4], then the layer
  inputs of positions 0..5, all real)."""
  config = tiny_config()
  params = random_params(config, seed=8)
  batch = _pretraining_batch(9)
  pad = batch["input_mask"] == 0
  changed = dict(batch)
  rng = np.random.default_rng(10)
  changed["input_ids"] = np.where(pad, rng.integers(0, VOCAB, pad.shape), batch["input_ids"])
  changed["segment_ids"] = np.where(pad, 2, batch["segment_ids"]).astype(np.int32)
  pad_rows_or_cols = pad[:, :, None] | pad[:, None, :]
  changed["perm_mask"] = np.where(pad_rows_or_cols, rng.integers(0, 2, pad_rows_or_cols.shape),
                                  batch["perm_mask"]).astype(np.float32)
  before, after = _run(config, params, batch), _run(config, params, changed)
  real = ~pad
  np.testing.assert_allclose(after["content"][real], before["content"][real], atol=1e-6)
  np.testing.assert_allclose(after["logits"], before["logits"], atol=1e-6)
  for old, new in zip(before["new_mems"], after["new_mems"]):
    np.testing.assert_allclose(new, old, atol=1e-6)
  assert not np.allclose(after["content"][pad], before["content"][pad])  # the pads did change


def test_bfloat16_compute_tracks_float32():
  """Same float32 parameters, dtype='bfloat16': logits and content within 5% of the float32
  run's largest magnitude; outputs in bfloat16; the memory stays float32; init makes float32
  parameters."""
  params = random_params(tiny_config(), seed=11, scale=0.1)
  batch = _pretraining_batch(12)
  full = _run(tiny_config(), params, batch)
  half = _run(tiny_config(dtype="bfloat16"), params, batch)
  assert half["logits"].dtype == jnp.bfloat16 and half["new_mems"][0].dtype == jnp.float32
  for key in ("logits", "content"):
    np.testing.assert_allclose(np.asarray(half[key], np.float32), full[key],
                               atol=0.05 * float(jnp.abs(full[key]).max()))
  init = jax.eval_shape(lambda: nn.unbox(xlnet.XLNet(tiny_config(dtype="bfloat16")).init(
      jax.random.key(0), batch["input_ids"], deterministic=True)))
  assert {x.dtype for x in jax.tree.leaves(init)} == {jnp.dtype(jnp.float32)}


def test_scanned_and_rematerialised_layers_equal_unrolled():
  """scan_layers=True with remat_policy='full' gives the unrolled model's logits, content and
  new memory (≤ 1e-5) when its [layers, ...] parameters stack the unrolled layer_{i}; in
  training mode dropout acts (two keys differ) and one key gives one result; the parameters
  carry logical axis names."""
  config = tiny_config(dropout=0.1, attention_dropout=0.1)
  params = random_params(config, seed=13)
  stacked = dict(params["params"])
  stacked["layers"] = jax.tree.map(lambda *x: jnp.stack(x),
                                   *(stacked.pop(f"layer_{i}") for i in range(LAYERS)))
  batch = _pretraining_batch(14)
  scanned = tiny_config(dropout=0.1, attention_dropout=0.1, scan_layers=True, remat_policy="full")
  unrolled_out = _run(config, params, batch)
  scanned_out = _run(scanned, {"params": stacked}, batch)
  for key in ("logits", "content"):
    np.testing.assert_allclose(scanned_out[key], unrolled_out[key], rtol=1e-5, atol=1e-5)
  for a, b in zip(scanned_out["new_mems"], unrolled_out["new_mems"]):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)

  model = xlnet.XLNet(scanned)
  train = jax.jit(jax.vmap(lambda key: model.apply(
      {"params": stacked}, batch["input_ids"], batch["segment_ids"], batch["input_mask"],
      batch["perm_mask"], batch["target_mapping"], deterministic=False,
      rngs={"dropout": key})["logits"]))
  logits = train(jax.random.split(jax.random.key(0), 2)[jnp.array([0, 0, 1])])
  np.testing.assert_array_equal(logits[0], logits[1])
  assert not np.allclose(logits[0], logits[2])
  boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), batch["input_ids"],
                                            deterministic=True))["params"]
  assert boxed["layers"]["rel_attn"]["q"].names == ("layers", "embed", "heads", "kv")
  assert boxed["word_embedding"]["embedding"].names == ("vocab", "embed")


@pytest.mark.parametrize("overrides, message", [
    (dict(activation="swish"), "model.activation"),
    (dict(remat_policy="everything"), "model.remat_policy"),
    (dict(hidden=15), "must be even"),
])
def test_invalid_config_names_the_field(overrides, message):
  with pytest.raises(ConfigError, match=message):
    xlnet.XLNet(tiny_config(**overrides)).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32),
                                               deterministic=True)


def test_initialisation_is_the_references():
  """modeling.py with init='normal', init_std 0.02: every weight N(0, 0.02²), not truncated
  (some |w| beyond 2σ and 3σ), biases 0, LayerNorm 1 / 0; `mask_emb` from TF's default
  Glorot-uniform for [1, 1, d]: U(±√(6 / (1 + d))), whose std is that limit / √3."""
  config = tiny_config(hidden=512, head_dim=256, mlp=1024, layers=1)
  params = nn.unbox(xlnet.XLNet(config).init(
      jax.random.key(0), jnp.zeros((1, 4), jnp.int32), jnp.zeros((1, 4), jnp.int32),
      target_mapping=jnp.zeros((1, 1, 4)), deterministic=True))["params"]
  weights = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    names, value = [p.key for p in path], np.asarray(leaf)
    if names[-1] == "mask_emb":
      limit = math.sqrt(6 / (1 + value.shape[-1]))
      assert np.abs(value).max() <= limit
      assert np.std(value) == pytest.approx(limit / math.sqrt(3), rel=0.1)
    elif names[-1] == "scale":
      np.testing.assert_array_equal(value, 1.0)
    elif names[-1] == "bias" and "rel_attn" not in names and "r_w_bias" not in names:
      np.testing.assert_array_equal(value, 0.0, err_msg="/".join(names))
    elif value.size > 1000:
      weights.append(value.ravel())
  weights = np.concatenate(weights)
  assert np.std(weights) == pytest.approx(0.02, rel=0.02)
  assert np.mean(np.abs(weights) > 0.06) > 1e-3   # a truncated draw has none beyond 2σ


def test_dropout_acts_where_the_reference_drops():
  """modeling.py's sites, each at its rate and on its tensor (batch 2, L 10, 3 targets, memory
  4, so K = 14 keys and R = 24 relative positions): the word embeddings, the mask_emb rows and
  the relative encoding (`dropout`); per layer and stream the attention probabilities
  (`dropatt`), the attention output before its residual (post_attention) and the FFN's two
  (positionwise_ffn); the returned streams. Nothing else."""
  config = tiny_config(dropout=0.1, attention_dropout=0.2)
  batch = _pretraining_batch(15)
  calls = []

  def record(next_fun, args, kwargs, context):
    if isinstance(context.module, xlnet.layers.Dropout) and context.method_name == "__call__":
      path = [p for p in context.module.path if not p.startswith("layer_")]
      calls.append(("/".join(path[:-1]), context.module.rate, tuple(args[0].shape)))
    return next_fun(*args, **kwargs)

  params = random_params(config, seed=16)
  keys = ("input_ids", "segment_ids", "input_mask", "perm_mask", "target_mapping", "mems",
          "direction")
  with nn.intercept_methods(record):
    xlnet.XLNet(config).apply(params, *(batch[k] for k in keys), deterministic=False,
                              rngs={"dropout": jax.random.key(0)})
  stream_sites = lambda n: [  # noqa: E731  (per layer; n: the stream's length)
      ("rel_attn", 0.2, (2, HEADS, n, 14)), ("rel_attn", 0.1, (2, n, HIDDEN)),
      ("ff", 0.1, (2, n, MLP)), ("ff", 0.1, (2, n, HIDDEN))]
  expected = [("", 0.1, (2, 24, HIDDEN)), ("", 0.1, (2, 10, HIDDEN)), ("", 0.1, (2, 3, HIDDEN)),
              ("", 0.1, (2, 10, HIDDEN)), ("", 0.1, (2, 3, HIDDEN)),
              *(stream_sites(10) + stream_sites(3)) * LAYERS]
  assert sorted(calls) == sorted(expected)
