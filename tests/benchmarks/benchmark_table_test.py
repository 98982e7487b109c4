"""benchmarks/table.py: its rows are the recipes on the fast path, its HF peers are the same models
(parameter for parameter), and its memory arithmetic is right."""

import math
import os
import sys

import jax
import numpy as np
import pytest

REPO = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import table  # noqa: E402  pylint: disable=wrong-import-position
import train_throughput as tt  # noqa: E402  pylint: disable=wrong-import-position

from bertfam_jax import config_lib, objectives  # noqa: E402
from bertfam_jax.objectives import xlnet as xlnet_objective  # noqa: E402
from bertfam_jax.train import optimizer as optimizer_lib, sharding, step as step_lib  # noqa: E402


def our_parameter_count(config) -> int:
  objective = objectives.get(config.objective.name)
  tx, _ = optimizer_lib.make_optimizer(config)
  mesh = sharding.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])
  abstract, _ = step_lib.with_mesh_context(step_lib.abstract_state, mesh)(
      objective.build_model(config), tx, mesh, objectives.init_inputs(objective, config))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract.params))


# HF's RoBERTa positions start after fairseq's pad id: 2 more rows of its position table.
EXTRA_HF_PARAMETERS = {"roberta-base-512": 2 * 768}


@pytest.mark.parametrize("row", [row.name for row in table.ROWS if row.hf])
def test_hf_peer_is_the_same_model(row):
  """Every row with an HF peer (all but UniLM's) has it with our parameter count (tied tables
  counted once: ELECTRA's shared embeddings, the tied MLM / SBO decoders), built on the meta
  device (shapes only)."""
  hf_compare = pytest.importorskip("hf_compare")
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  # Without the fast path: cuDNN attention cannot even be traced on a CPU; parameters are the same.
  config = table.row_config(table.ROWS_BY_NAME[row], fast_path=False)
  with torch.device("meta"):
    model, _ = hf_compare.hf_model_with_attention(config, transformers)
  assert (sum(p.numel() for p in model.parameters())
          == our_parameter_count(config) + EXTRA_HF_PARAMETERS.get(row, 0))


def tiny_config(family: str, overrides=()):
  """configs/<family>.py:runlocal (mini model, 128 tokens, vocabulary 8,000), 2 rows."""
  config = config_lib.load_config(os.path.join(REPO, "configs", f"{family}.py"), "runlocal")
  config_lib.apply_overrides(config, ["train.batch_size=2", *overrides])
  return config


def electra_initial_loss(config, ln_vocab):
  """generator_weight·ln V + discriminator_weight·ln 2: uniform generator, undecided detector."""
  o = config.objective
  return o.generator_weight * ln_vocab + o.discriminator_weight * math.log(2)


def spanbert_initial_loss(config, ln_vocab):
  """MLM ln V + SBO ln V·Σw / (Σw + 1), Σw = rows × max_predictions SBO slots."""
  slots = config.train.batch_size * config.objective.max_predictions
  return ln_vocab + ln_vocab * slots / (slots + 1)


@pytest.mark.parametrize("family, overrides, expected", [
    ("electra", (), electra_initial_loss),
    ("electra", ("objective.generator_weight=2.0", "objective.discriminator_weight=10.0"),
     electra_initial_loss),
    ("spanbert", (), spanbert_initial_loss),
    ("xlnet", (), lambda config, ln_vocab: ln_vocab),  # CE at the targets
])
def test_hf_step_has_our_loss_terms(family, overrides, expected):
  """Two HF train steps through `hf_compare.measure_hf` on the CPU (the second with XLNet's
  carried memory): the loss is finite and, at initialisation (near-uniform softmaxes, sigmoids
  at 1/2; the schedule's first rates are ~0), our loss's terms with our weights."""
  hf_compare = pytest.importorskip("hf_compare")
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  torch.manual_seed(0)
  config = tiny_config(family, overrides)
  mesh = sharding.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])
  batch = tt.synthetic_batch(config, config.train.batch_size, mesh)
  model, _ = hf_compare.hf_model_with_attention(config, transformers)
  row = hf_compare.Row("HF")
  hf_compare.measure_hf(config, batch, row, 1.0, torch, model, "cpu", steps=1, warmup=0,
                        compile_model=False)
  assert math.isfinite(row.final_loss)
  assert row.final_loss == pytest.approx(expected(config, math.log(config.model.vocab_size)),
                                         rel=0.01)


def test_xlnet_peer_rows_are_forward_first():
  """HF's bi_data runs the first half of the batch forward: the forward rows (direction +1, even
  rows of the synthetic batch) come first, with our perm_mask / target_mapping rows; labels are
  the targets; an unequal split is a ConfigError."""
  hf_compare = pytest.importorskip("hf_compare")
  torch = pytest.importorskip("torch")
  config = tiny_config("xlnet", ("train.batch_size=4",))
  mesh = sharding.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])
  batch = tt.synthetic_batch(config, 4, mesh)
  inputs = hf_compare.hf_inputs(config, batch, torch, "cpu")
  order = [0, 2, 1, 3]
  np.testing.assert_array_equal(np.asarray(batch["direction"])[order], [1, 1, -1, -1])
  perm_mask, target_mapping = xlnet_objective.device_masks(batch, config.model.reuse_len)
  for key, ours in (("input_ids", batch["input_ids"]), ("token_type_ids", batch["segment_ids"]),
                    ("perm_mask", perm_mask), ("target_mapping", target_mapping),
                    ("labels", batch["target_ids"])):
    np.testing.assert_array_equal(inputs[key].numpy(), np.asarray(ours)[order], err_msg=key)
  odd = {k: v[:3] for k, v in batch.items()}  # 2 forward rows, 1 reversed
  with pytest.raises(config_lib.ConfigError, match="even --batch_size"):
    hf_compare.hf_inputs(config, odd, torch, "cpu")


def test_structbert_has_no_hf_peer():
  hf_compare = pytest.importorskip("hf_compare")
  config = config_lib.load_config(os.path.join(REPO, "configs", "structbert.py"), "runlocal")
  with pytest.raises(config_lib.ConfigError, match="no HF peer"):
    hf_compare.peer_family(config)


def test_rows_are_the_recipes_on_the_fast_path():
  bert = table.row_config(table.ROWS_BY_NAME["bert-base-512"], fast_path=True)
  assert (bert.model.dtype, bert.model.attention_impl, bert.model.fused_qkv) == (
      "bfloat16", "cudnn", True)
  assert (bert.model.attention_dropout, bert.model.dropout) == (0.0, 0.1)  # only attention's off
  assert (bert.data.seq_len, bert.train.batch_size, bert.objective.max_predictions) == (512, 64, 80)
  albert = table.row_config(table.ROWS_BY_NAME["albert-base-512"], fast_path=True)
  assert albert.optimizer.name == "adamw" and albert.objective.sentence_task == "sop"
  t5 = table.row_config(table.ROWS_BY_NAME["t5-base-512"], fast_path=True)
  assert (t5.model.dropout, t5.objective.targets_length, t5.optimizer.name) == (0.0, 114, "adamw")
  faithful = table.row_config(table.ROWS_BY_NAME["bert-base-512"], fast_path=False)
  assert (faithful.model.dtype, faithful.model.attention_dropout) == ("float32", 0.1)
  gpt2 = table.row_config(table.ROWS_BY_NAME["gpt2-medium-1024"], fast_path=True)
  assert (gpt2.model.attention_impl, gpt2.model.causal, gpt2.model.max_positions) == (
      "cudnn", True, 1024)
  unilm = table.row_config(table.ROWS_BY_NAME["unilm-large-512"], fast_path=True)
  assert (unilm.model.dtype, unilm.model.attention_impl) == ("bfloat16", "")


@pytest.mark.parametrize("family", ["gpt", "unilm"])
def test_synthetic_batches_train_the_new_objectives(family):
  """train_throughput's synthetic batch has every key the objective's loss reads: one step of
  the :runlocal model runs to a finite loss."""
  config = tiny_config(family)
  mesh = sharding.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])
  batch = tt.synthetic_batch(config, config.train.batch_size, mesh)
  state, train_step = step_lib.fresh_train_step(config, mesh, objectives.get(config.objective.name))
  _, metrics = train_step(state, batch)
  assert np.isfinite(step_lib.finalize_metrics(jax.device_get(metrics))["loss"])


def test_state_bytes_are_the_allocated_state():
  config = table.row_config(table.ROWS_BY_NAME["bert-mini-128"], fast_path=False)
  mesh = sharding.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])
  state, _ = step_lib.fresh_train_step(config, mesh, objectives.get(config.objective.name))
  assert table.state_bytes(config, mesh) == sum(x.nbytes for x in jax.tree.leaves(state))


def test_predicted_max_batch():
  gib = 2**30
  # 10 GiB of state, 2 GiB per example at batch 8, 80 GiB limit: (0.97·80 - 10) / 2 = 33.8 → 32.
  record = dict(peak_memory_bytes=26 * gib, state_bytes=10 * gib, bytes_limit=80 * gib,
                cell=dict(batch=8))
  assert table.predicted_max_batch(record) == 32
  assert table.predicted_max_batch(dict(record, peak_memory_bytes=None)) is None


def test_variants_are_the_row_as_is_around_each_setting(monkeypatch):
  variants = table.parse_variants(
      "fused=model.fused_qkv=true,model.vocab_multiple=128; lt=--xla_gpu_enable_cublaslt=true")
  assert variants == {"fused": (["model.fused_qkv=true", "model.vocab_multiple=128"], ""),
                      "lt": ([], "--xla_gpu_enable_cublaslt=true")}
  with pytest.raises(ValueError, match="name="):
    table.parse_variants("fused=")
  monkeypatch.setenv("XLA_FLAGS", "--own=1")
  base = dict(row="bert-mini-128", extra=["train.total_steps=9"])
  cells = table.variant_cells(base, variants, None)
  assert [name for name, _, _ in cells] == ["as is", "fused", "lt", "as is, again"]
  assert cells[1][1]["extra"] == ["train.total_steps=9", "model.fused_qkv=true",
                                  "model.vocab_multiple=128"]
  assert [env["XLA_FLAGS"] for _, _, env in cells] == [
      "--own=1", "--own=1", "--own=1 --xla_gpu_enable_cublaslt=true", "--own=1"]
  # The run's own --xla_flags replace the environment's, the variant's flags follow them.
  assert table.variant_cells(base, variants, "--run=2")[2][2]["XLA_FLAGS"] == (
      "--run=2 --xla_gpu_enable_cublaslt=true")
