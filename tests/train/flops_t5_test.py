"""bertfam_jax.flops.t5_train_flops_per_input_token against the T5's own parameter shapes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from bertfam_jax import config_lib as cl
from bertfam_jax.models import t5
from bertfam_jax import flops


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_weight_flops_are_six_per_matmul_parameter(version):
  """Every matmul weight costs 6 FLOPs per token it is applied to (2 forward, 4 backward):
  encoder weights per input token, the cross-attention K/V per input token, the other decoder
  weights and the logits per target token; what remains is attention (QKᵀ and AV in full)."""
  model = cl.t5_model("small", version, vocab_size=1000)
  inputs, targets = 64, 16
  variables = jax.eval_shape(lambda: t5.T5(model).init(
      jax.random.key(0), jnp.zeros((1, inputs), jnp.int32), jnp.zeros((1, targets), jnp.int32),
      deterministic=True))
  flat = {"/".join(k): np.prod(v.shape) for k, v in traverse_util.flatten_dict(
      jax.tree.map(lambda x: getattr(x, "value", x), variables["params"],
                   is_leaf=lambda x: hasattr(x, "value"))).items()}
  def matmul_params(prefix, exclude=()):
    return sum(n for k, n in flat.items() if k.startswith(prefix) and "norm" not in k
               and "relpos" not in k and not any(e in k for e in exclude))
  encoder = matmul_params("encoder/")
  cross_kv_names = ("encoder_decoder_attention/key", "encoder_decoder_attention/value")
  cross_kv = matmul_params("decoder/") - matmul_params("decoder/", cross_kv_names)
  decoder = matmul_params("decoder/") - cross_kv
  logits = flat["token_embedder/embedding"] if model.tie_embeddings else 0  # untied: in decoder
  weights = 6 * (encoder + cross_kv) + 6 * (decoder + logits) * targets / inputs
  a = model.heads * model.head_dim
  attention = (12 * model.layers * inputs * a
               + 12 * model.decoder_layers * (targets + inputs) * a * targets / inputs)
  assert flops.t5_train_flops_per_input_token(model, inputs, targets) == pytest.approx(
      weights + attention, rel=1e-12)
  assert cross_kv == model.decoder_layers * 2 * model.hidden * a
