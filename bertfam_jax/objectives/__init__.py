"""Pre-training objectives: the one seam between the data pipeline, the models and the train loop.

An objective is a module. It provides these functions, and `train/` calls nothing else of it;
the hooks with a default are read through the accessors below (`init_carry(objective, config)`,
...), which supply it:

Required:
  build_model(config) -> flax.linen.Module
      The network and heads this objective trains.
  init_inputs(config) -> dict[str, array]
      Keyword inputs of one row that trace `model.init` (shapes only matter).
  make_features(config, tokenizer) -> Callable[[dict[str, np.ndarray], np.random.Generator], dict]
      Host-side numpy noising (masking, corruption, permutations) applied to packed examples
      (see `bertfam_jax.data.packing`). Deterministic given the generator.
  loss_fn(model, params, batch, rng, config, *, deterministic=False)
      -> tuple[jax.Array, dict[str, tuple[jax.Array, jax.Array]]]
      The scalar loss to differentiate and metrics as (sum, count) pairs; the loop sums both
      across micro-batches and logs sum / count.
  flops_per_token(config) -> float
      Model training FLOPs per token (`bertfam_jax.flops` conventions), for the logged MFU.

Optional (the defaults are defined here):
  FIELD_RULES: {"objective.<field>": config_lib.Range, a tuple of choices or a frozenset of
                kinds written as a comma-separated subset}
      What each of the objective's own numbers and choices may be, checked with the shared
      sections' `config_lib.FIELD_RULES` before anything runs (`field_rules`). Default: none.
  validate(config) -> None
      Raises `ConfigError` naming the fix for the objective's own fields (`config_lib.validate`
      checks the sections every run has; `validate` below runs both). Default: nothing to check.
  init_carry(config, batch_size) -> pytree
      State threaded from one step to the next (XLNet's memory); `loss_fn` then takes
      `carry=` and returns `(loss, metrics, new_carry)`. Default: none.
  pipeline_options(config) -> dict
      Extra `data.pipeline.Pipeline` keywords (T5: the raw segment length; features that replace
      the packed rows). Default: none.
  describe(config) -> str
      The run's one-line header. Default: the objective's name and sequence length.
  initial_params(config, restore_params) -> variables (host numpy arrays)
      What a fresh run starts from instead of random parameters, the whole variables tree of
      `build_model(config)` (DistilBERT: the teacher, and the student made from its layers);
      `restore_params(workdir)` reads another run's latest parameters.
      Not called on resume, nor with `train.init_from`. Default: random initialisation.
      Collections other than 'params' (DistilBERT's 'teacher') are constants of the run: the
      loss reads them, checkpoints hold them, nothing trains them (train/step.py TRAINED).

Batch keys (all numpy on the host, `jax.Array` on device; `n` = examples, `L` = sequence length,
`P` = max predictions per sequence):
  input_ids       [n, L] int32   token ids after noising; `pad_id` beyond the example.
  segment_ids     [n, L] int32   token type: 0 for [CLS] A [SEP], 1 for B [SEP]; 0 when unused.
  input_mask      [n, L] int32   1 for real tokens, 0 for padding.
  mlm_positions   [n, P] int32   positions of the predicted tokens, ascending, 0-padded.
  mlm_targets     [n, P] int32   original token ids at those positions, 0-padded.
  mlm_weights     [n, P] float32 1.0 for a real prediction, 0.0 for padding.
  sentence_label  [n]    int32   NSP: 0 = IsNext, 1 = random next (BERT's convention); SOP:
                                 1 = swapped; StructBERT: 1 = previous, 2 = other document.
  sbo_boundaries  [n, P, 2] int32  SpanBERT: the slot's span boundaries (s - 1, e + 1).
  sbo_offsets     [n, P] int32   SpanBERT: the slot's offset in its span.
  sbo_weights     [n, P] float32 SpanBERT: 1.0 where the slot is an SBO target (= mlm_targets).
  shuffle_positions / shuffle_targets / shuffle_weights [n, P]  StructBERT's shuffled trigrams.
Encoder-decoder objectives (objectives/t5.py; `Li` = data.seq_len, `Lt` = targets_length; several
examples packed per row, segment ids 1..k, 0 = padding):
  input_ids, input_mask, input_segment_ids, input_positions                [n, Li] int32
  decoder_target_ids   [n, Lt] int32  EOS-terminated targets, 0-padded
  decoder_input_ids    [n, Lt] int32  targets shifted right within each segment, 0 (BOS) first
  decoder_segment_ids, decoder_positions                                   [n, Lt] int32
  decoder_loss_weights [n, Lt] float32 1.0 on every real target token
  targets_cut          [n] int32   the row's examples whose targets were cut at Lt (logged as
                                   the share `targets_cut`)
  cross_segment_ids    [n, Li] int32 objective.decoder_sees_masked=False only (MASS):
                                   input_segment_ids, 0 where the input holds the mask id
  A decoder-only or prefix-LM model (`model.architecture`) gets each example's inputs and targets
  concatenated instead (packing.pack_decoder_only, seqio's PrefixLMFeatureConverter), rows of
  L = Li + Lt: decoder_target_ids, decoder_input_ids, decoder_segment_ids, decoder_positions
  [n, L] int32; decoder_causal_attention [n, L] int32 1 on the inputs and one position more (the
  prefix LM's bidirectional part); decoder_loss_weights [n, L] float32 on the targets (or every
  token: objective.loss_on_targets_only=False); targets_cut as above.
GPT (objectives/causal_lm.py; rows of one document stream, `packing.lm_stream`):
  input_ids, input_mask [n, L] int32; target_ids [n, L] int32 the next token of the stream;
  loss_weights [n, L] float32 1.0 on real targets
UniLM (objectives/unilm.py): the masked LM's keys, segment_ids the LM type's token types, and
  lm_type [n] int32 (bidirectional 0, left-to-right 1, right-to-left 2, seq2seq 3)
XLNet (objectives/xlnet.py; `P` = objective.num_predict; rows are consecutive windows of parallel
streams, so the batch's row r continues row r of the previous batch):
  input_ids, segment_ids (0 R / A / first <sep>, 1 B / second <sep>, 2 <cls>), input_mask [n, L]
  perm_rank        [n, L] int32   rank of each position in the factorisation order within its half,
                                  -1 for non-targets (context, placed first); `device_masks` turns
                                  it into perm_mask [n, L, L] (1 = may not attend) on the device
  target_positions [n, P] int32   the targets, in increasing position order (target_mapping rows)
  target_ids       [n, P] int32   their tokens;  target_weights [n, P] float32 1.0 real, 0.0 padding
  direction        [n]    float32 +1 forward row, -1 reversed row (bi_data)

ELMo (objectives/elmo.py; `W` = data.seq_len words, `C` = model.max_characters):
  char_ids [n, W, C] int32 each word's characters (bilm-tf's codes); input_mask [n, W] int32;
  word_ids [n, W] int32 each word's softmax id (its piece, or <unk> for a word of several)

Adding an objective touches its module, one line in OBJECTIVES, its config and its tests; never
`train/`.
"""

import jax

from bertfam_jax import config_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.objectives import causal_lm, distillation, electra, elmo, mlm, t5, tinybert
from bertfam_jax.objectives import unilm, xlnet

OBJECTIVES = {
    "mlm": mlm,
    "distillation": distillation,
    "tinybert": tinybert,
    "causal_lm": causal_lm,
    "unilm": unilm,
    "electra": electra,
    "t5": t5,
    "xlnet": xlnet,
    "elmo": elmo,
}


def get(name: str):
  """Returns the objective module registered as `name`."""
  if name not in OBJECTIVES:
    raise ConfigError(f"Unknown objective {name!r}; choose one of {sorted(OBJECTIVES)} "
                      "(config.objective.name).")
  return OBJECTIVES[name]


def validate(config) -> None:
  """Raises ConfigError naming the fix for a pre-training config that cannot run: the sections
  every run has (`config_lib.validate`), then its objective's own `validate`."""
  objective = get(config.objective.name)
  config_lib.validate(config)
  config_lib.check_fields(config, field_rules(objective))
  own = getattr(objective, "validate", None)
  if own:
    own(config)


def field_rules(objective) -> dict:
  """`objective.FIELD_RULES` ({} by default): its own fields' ranges and choices."""
  return getattr(objective, "FIELD_RULES", {})


def init_inputs(objective, config) -> dict:
  """The keyword inputs of one row that trace `objective.build_model(config).init`."""
  return objective.init_inputs(config)


def init_carry(objective, config):
  """The abstract step-to-step state of `objective` for the global batch
  (`init_carry(config, train.batch_size)` as ShapeDtypeStructs), or None when it keeps none."""
  make = getattr(objective, "init_carry", None)
  carry = jax.eval_shape(lambda: make(config, config.train.batch_size)) if make else None
  return carry if jax.tree.leaves(carry) else None


def initial_params(objective, config, restore_params):
  """`objective.initial_params(config, restore_params)`: the variables a fresh run starts from,
  or None for a random initialisation (the default)."""
  make = getattr(objective, "initial_params", None)
  return make(config, restore_params) if make else None


def pipeline_options(objective, config) -> dict:
  """Extra `data.pipeline.Pipeline` keywords of `objective` ({} by default)."""
  options = getattr(objective, "pipeline_options", None)
  return options(config) if options else {}


def describe(objective, config) -> str:
  """The run's header line: the objective's own `describe`, else its name and length (every
  objective registered today has its own)."""
  own = getattr(objective, "describe", None)
  return own(config) if own else (f"objective {config.objective.name} on "
                                  f"{config.data.seq_len}-token rows")
