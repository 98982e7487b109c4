"""Parity of bertfam_jax.models.t5 with HuggingFace's PyTorch T5ForConditionalGeneration: random HF
weights mapped onto our tree give the same encoder outputs and logits (fp32, padded inputs) for
v1.0 (ReLU, tied, decoder output scaled by hidden^-0.5) and v1.1 (gated tanh-GELU, untied lm_head,
no scaling), and our relative bucket function equals HF's `_relative_position_bucket`.

The HF → bertfam_jax name mapping under test is the package's (bertfam_jax/hf/mapping.py).
Needs torch and transformers (run with /tmp/venv_parity/bin/python); skipped without them.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertfam_jax import config_lib
from bertfam_jax.hf import mapping
from bertfam_jax.models import t5

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB, HIDDEN, HEADS, HEAD_DIM, MLP = 61, 32, 4, 8, 48
ENCODER_LAYERS, DECODER_LAYERS = 2, 3
# Few buckets and a short max distance, so 16 positions reach the log-spaced and the last buckets.
BUCKETS, MAX_DISTANCE = 8, 12
INPUT_LENGTHS, TARGET_LENGTH = (16, 11), 9


def our_config(version):
  """configs' T5 of `version` at the test's size, without dropout (as the HF model in eval)."""
  return config_lib.t5_model(
      "small", version, vocab_size=VOCAB, hidden=HIDDEN, layers=ENCODER_LAYERS,
      decoder_layers=DECODER_LAYERS, heads=HEADS, head_dim=HEAD_DIM, mlp=MLP, dropout=0.0,
      relative_buckets=BUCKETS, relative_max_distance=MAX_DISTANCE)


def hf_model(version):
  torch.manual_seed(0)
  config = transformers.T5Config(
      vocab_size=VOCAB, d_model=HIDDEN, d_kv=HEAD_DIM, d_ff=MLP, num_layers=ENCODER_LAYERS,
      num_decoder_layers=DECODER_LAYERS, num_heads=HEADS, relative_attention_num_buckets=BUCKETS,
      relative_attention_max_distance=MAX_DISTANCE, dropout_rate=0.0,
      feed_forward_proj="relu" if version == "1.0" else "gated-gelu",
      tie_word_embeddings=version == "1.0", attn_implementation="eager")
  model = transformers.T5ForConditionalGeneration(config).eval()
  if version == "1.1":
    # transformers 5 always ties lm_head to the shared table (configuration_t5.py); v1.1
    # checkpoints have their own, so give it distinct weights to test the untied path.
    model.lm_head.weight = torch.nn.Parameter(torch.randn(VOCAB, HIDDEN) * HIDDEN ** -0.5)
  with torch.no_grad():  # layer norms start at 1: make them matter
    for name, value in model.named_parameters():
      if "layer_norm" in name:
        value.uniform_(0.5, 1.5)
  return model


def params_from_hf(model, version):
  """HF T5ForConditionalGeneration state → our parameter tree by the package's name table
  (bertfam_jax/hf/mapping.py t5_entries)."""
  state_dict = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  tree = mapping.params_from_hf(state_dict, mapping.t5_entries(our_config(version)))
  return jax.tree.map(jnp.asarray, tree)


def make_inputs():
  """Right-padded encoder rows (ids ≥ 2, 0 = pad) and decoder inputs starting with BOS 0."""
  rng = np.random.default_rng(0)
  length = max(INPUT_LENGTHS)
  input_mask = np.arange(length)[None] < np.array(INPUT_LENGTHS)[:, None]
  input_ids = np.where(input_mask, rng.integers(2, VOCAB, (2, length)), 0)
  decoder_input_ids = np.concatenate(
      [np.zeros((2, 1), np.int64), rng.integers(2, VOCAB, (2, TARGET_LENGTH - 1))], axis=1)
  return input_ids, input_mask, decoder_input_ids


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_logits_and_encoder_outputs_match_hf(version):
  model = hf_model(version)
  input_ids, input_mask, decoder_input_ids = make_inputs()
  with torch.no_grad():
    hf = model(input_ids=torch.tensor(input_ids), attention_mask=torch.tensor(input_mask),
               decoder_input_ids=torch.tensor(decoder_input_ids))
  ours = t5.T5(our_config(version))
  params = {"params": params_from_hf(model, version)}
  shapes = jax.eval_shape(lambda: ours.init(jax.random.key(0), input_ids, decoder_input_ids,
                                            deterministic=True))
  assert (jax.tree.map(lambda x: x.shape, params)
          == jax.tree.map(lambda x: x.shape, nn.unbox(shapes)))
  logits = ours.apply(params, jnp.asarray(input_ids), jnp.asarray(decoder_input_ids),
                      deterministic=True)
  np.testing.assert_allclose(np.asarray(logits), hf.logits.numpy(), rtol=1e-4, atol=1e-4)
  encoded = ours.apply(params, jnp.asarray(input_ids), deterministic=True, method=t5.T5.encode)
  real = input_mask.astype(bool)  # HF's padded query positions attend differently; unused
  np.testing.assert_allclose(np.asarray(encoded)[real], hf.encoder_last_hidden_state.numpy()[real],
                             rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 12)])
def test_relative_position_bucket_matches_hf(bidirectional, num_buckets, max_distance):
  relative = np.arange(-300, 301)
  hf = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(
      torch.tensor(relative), bidirectional=bidirectional, num_buckets=num_buckets,
      max_distance=max_distance)
  ours = t5.relative_position_bucket(relative, bidirectional=bidirectional,
                                     num_buckets=num_buckets, max_distance=max_distance)
  np.testing.assert_array_equal(np.asarray(ours), hf.numpy())
