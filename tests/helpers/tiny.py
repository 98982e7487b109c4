"""The suite's tiny models: one size shared by every test, each family built by its `config_lib`
constructor, so that a test states only what it changes (its vocabulary, a layer count, the
feature under test).

hidden 32, 2 layers, 4 heads of 8, FFN 64: every block at a size that compiles in seconds on the
2-core CI machine, with more than one head and layer so that head splits and layer stacking are
exercised.
"""

from bertfam_jax import config_lib

SIZE = dict(hidden=32, layers=2, heads=4, mlp=64)
VOCAB, LENGTH = 512, 32


def encoder(**overrides):
  """The BERT-family encoder's `model` section (`config_lib.encoder`)."""
  return config_lib.encoder("base", **{**SIZE, "vocab_size": VOCAB, "max_positions": LENGTH,
                                       **overrides})


def albert(**overrides):
  """ALBERT's encoder (`config_lib.albert_encoder`: shared layers, no dropout) with a 16-wide
  factorised embedding."""
  return config_lib.albert_encoder("base", **{**SIZE, "embedding_size": 16, "vocab_size": VOCAB,
                                              "max_positions": LENGTH, **overrides})


def electra(**overrides):
  """ELECTRA's discriminator (`config_lib.electra_encoder`: exact GELU, dropout 0.1) with a
  16-wide factorised embedding; its generator is derived from it by the objective."""
  return config_lib.electra_encoder("small", **{**SIZE, "embedding_size": 16,
                                                "vocab_size": VOCAB, "max_positions": LENGTH,
                                                **overrides})


def t5(**overrides):
  """A T5 (`config_lib.t5_model`: v1.0 unless `version` is given) of SIZE per stack, heads of
  8, no dropout, 8 relative-position buckets."""
  version = overrides.pop("version", "1.0")
  return config_lib.t5_model("mini", version, **{
      **SIZE, "decoder_layers": SIZE["layers"], "head_dim": 8, "vocab_size": VOCAB,
      "dropout": 0.0, "relative_buckets": 8, "relative_max_distance": 12, **overrides})


def xlnet(**overrides):
  """An XLNet (`config_lib.xlnet_model`) of SIZE, heads of 8, no dropout, memory 6."""
  return config_lib.xlnet_model("mini", **{
      **SIZE, "head_dim": 8, "vocab_size": VOCAB, "dropout": 0.0, "attention_dropout": 0.0,
      "mem_len": 6, "reuse_len": 6, **overrides})


def gpt(version=1, **overrides):
  """A GPT (`config_lib.gpt_model`: post-LN GPT-1, or pre-LN GPT-2 with `version=2`) of SIZE, no
  dropout."""
  return config_lib.gpt_model("mini", version, **{
      **SIZE, "vocab_size": VOCAB, "max_positions": LENGTH, "dropout": 0.0,
      "attention_dropout": 0.0, **overrides})
