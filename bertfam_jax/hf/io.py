"""transformers checkpoint directories ↔ `HFModel` (our config, our parameters, HF's names).

  m = from_pretrained("bert-dir")               # config.json + model.safetensors (or .bin)
  out = m(input_ids, attention_mask, token_type_ids)
  out["hidden_states"], out["logits"], out.get("sentence_logits")
  save_pretrained(m, "out-dir")                 # transformers' from_pretrained loads it
  t5 = from_pretrained("t5-dir")                # T5ForConditionalGeneration
  t5(input_ids, attention_mask, decoder_input_ids=targets_shifted)["logits"]
  xlnet = from_pretrained("xlnet-dir")          # XLNetLMHeadModel
  xlnet(input_ids, attention_mask, token_type_ids, perm_mask=..., target_mapping=...)["logits"]

A fine-tuned checkpoint (a task class: *ForSequenceClassification, *ForTokenClassification,
*ForQuestionAnswering, *ForMultipleChoice) reads as our `models.finetune.FineTuneModel`: `m.kind`
and `m.num_outputs` say which, `m.params` is its tree and `m(...)["logits"]` its output.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import os
import posixpath
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import traverse_util
from safetensors import numpy as safetensors_numpy

from bertfam_jax import config_lib, fileio, objectives
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.hf import families, mapping
from bertfam_jax.data import hf_tokenizer as tokenizer_lib
from bertfam_jax.models import finetune as finetune_models
from bertfam_jax.objectives import electra as electra_objective

SAFETENSORS, TORCH_BIN = "model.safetensors", "pytorch_model.bin"
GENERATOR_DIR = "generator"  # where an ELECTRA export puts its generator checkpoint


@dataclasses.dataclass
class HFModel:
  """An HF checkpoint in our terms.

  config: a full bertfam config (config_lib.base_config) whose `model`, `objective` (the
    checkpoint's heads; for a task class the family's pre-training recipe, Family.base) and
    `tokenizer` (kind 'hf') describe the checkpoint.
  params: the parameter tree of `build_model(config, kind, num_outputs)`: the objective's model,
    or for a task class our FineTuneModel ({'encoder', and 'classification_head', 'token_head',
    'span_head' or 'choice_head'}).
  tokenizer: an HFTokenizer, or None when the directory has no tokenizer files.
  hf_config: the HF config.json (dict); architecture: its HF class, e.g. 'BertForPreTraining'.
  fresh: our top-level parameter modules the checkpoint did not hold, freshly initialised (an
    ELECTRA discriminator's generator, the MLM head of a bare BertModel).
  notes: facts of the import worth recording (hf_import.json).
  kind: for a task class, its FineTuneModel kind (classification, regression,
    token_classification, extractive_qa, multiple_choice); '' for a pre-training class.
  num_outputs: the FineTuneModel's num_outputs (labels; 1 regression / multiple choice; 2 QA).
  """
  config: ml_collections.ConfigDict
  params: Any
  tokenizer: Any
  hf_config: dict
  architecture: str
  fresh: tuple[str, ...] = ()
  notes: dict = dataclasses.field(default_factory=dict)
  kind: str = ""
  num_outputs: int = 0
  _apply: Any = dataclasses.field(default=None, init=False, repr=False, compare=False)

  @property
  def family(self) -> families.Family:
    return families.get(self.hf_config["model_type"])

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None,
               **family_inputs) -> dict[str, jax.Array]:
    """input_ids, attention_mask (1 = token), token_type_ids: [batch, length] (defaults: all
    ones, all zeros), and the inputs of the family (OUTPUTS). Returns hidden_states [batch,
    length, hidden] (the last layer) and the pre-training head's logits: MLM [batch, length,
    vocab] at every position, or ELECTRA's replaced-token logits [batch, length]; plus
    sentence_logits [batch, 2] with NSP / SOP.
    T5 takes decoder_input_ids [batch, target length] (required; no token types) and returns
    the LM logits [batch, target length, vocab] and the encoder's output as hidden_states.
    XLNet takes perm_mask [batch, length, length] and target_mapping [batch, P, length]
    (optional, HF's) and returns the content stream as hidden_states and the LM logits of the
    query stream [batch, P, vocab] (with target_mapping) or of every position (without);
    token_type_ids None there means no segment term, as in HF.
    A task class returns its FineTuneModel's output as logits (`kind`: classification [batch,
    labels], regression [batch], token_classification [batch, length, labels], extractive_qa
    [batch, length, 2] start / end); multiple choice takes [batch, choices, length] inputs and
    returns logits [batch, choices], hidden_states [batch, choices, length, hidden].
    RoBERTa derives positions from padding; right-padded rows match HF at their real tokens."""
    outputs, names = ((_task_outputs, ()) if self.kind
                      else OUTPUTS[self.config.objective.name])
    unknown = sorted(set(family_inputs) - set(names))
    if unknown:
      raise TypeError(f"{self.architecture} takes no inputs {unknown}.")
    input_ids = jnp.asarray(input_ids, jnp.int32)
    mask = jnp.ones_like(input_ids) if attention_mask is None else attention_mask
    types = None if token_type_ids is None else jnp.asarray(token_type_ids, jnp.int32)
    extra = {k: jnp.asarray(family_inputs[k]) if k in family_inputs else None for k in names}
    if self._apply is None:
      model = build_model(self.config, self.kind, self.num_outputs)
      self._apply = jax.jit(functools.partial(outputs, model))
    return self._apply(self.params, input_ids, jnp.asarray(mask, jnp.int32), types, **extra)


def build_model(config, kind: str = "", num_outputs: int = 0):
  """The model of an HFModel: our FineTuneModel for a task class (`kind`), else the objective's."""
  if kind:
    return finetune_models.FineTuneModel(ml_collections.FrozenConfigDict(config.model), kind,
                                         num_outputs)
  return objectives.get(config.objective.name).build_model(config)


def _init_inputs(config, kind: str) -> dict[str, jax.Array]:
  """Inputs that trace `build_model(config, kind, ...).init`: the objective's (one row), or for
  a FineTuneModel, whose parameter shapes depend on neither length, [1, 8] ([1, 2, 8] for
  multiple choice)."""
  if not kind:
    return objectives.init_inputs(objectives.get(config.objective.name), config)
  zeros = jnp.zeros((1, 2, 8) if kind == "multiple_choice" else (1, 8), jnp.int32)
  return dict(input_ids=zeros, input_mask=jnp.ones_like(zeros), segment_ids=zeros)


def _zeros_if_none(types, input_ids):
  """BERT-style token types: all zeros when not given."""
  return jnp.zeros_like(input_ids) if types is None else types


def _task_outputs(model, params, input_ids, mask, types):
  """A FineTuneModel's output (`logits`) and its encoder's last layer (`hidden_states`, captured
  on the way: [..., length, hidden] with the inputs' leading axes)."""
  types = _zeros_if_none(types, input_ids)
  logits, state = model.apply(
      {"params": params}, input_ids, mask, types, deterministic=True, mutable=["intermediates"],
      capture_intermediates=lambda m, method: m.scope.path == ("encoder",) and method == "__call__")
  x_BLD = state["intermediates"]["encoder"]["__call__"][0]
  return {"hidden_states": x_BLD.reshape(input_ids.shape + x_BLD.shape[-1:]), "logits": logits}


def _pretraining_outputs(model, params, input_ids, mask, types):
  return model.apply({"params": params}, input_ids, mask, _zeros_if_none(types, input_ids),
                     method=_pretraining_heads)


def _pretraining_heads(m, input_ids, mask, types):
  """The encoder and the pre-training head of a MaskedLM or an Electra (discriminator)."""
  x_BLD = m.encoder(input_ids, mask, types, deterministic=True)
  out = {"hidden_states": x_BLD}
  if hasattr(m, "rtd_head"):
    out["logits"] = m.rtd_head(x_BLD)
  else:
    every_BL = jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
    out["logits"] = m.mlm_head(x_BLD, every_BL, m.encoder.attend)
  if getattr(m, "sentence_classes", 0):
    out["sentence_logits"] = m.sentence_head(x_BLD)
  return out


def _t5_outputs(model, params, input_ids, mask, types, decoder_input_ids):
  """T5ForConditionalGeneration's logits [batch, Lt, vocab] (float32) for decoder_input_ids
  [batch, Lt] and the encoder's output [batch, Li, hidden]; `mask` is the encoder's padding
  (HF attention_mask), `types` unused (T5 has no token types)."""
  del types
  if decoder_input_ids is None:
    raise TypeError("T5ForConditionalGeneration needs decoder_input_ids [batch, target length] "
                    "(the targets shifted right, starting with decoder_start_token_id 0).")
  variables = {"params": params}
  encoded_BLD = model.apply(variables, input_ids, mask, deterministic=True, method="encode")
  logits_BTV = model.apply(variables, encoded_BLD, mask, decoder_input_ids.astype(jnp.int32),
                           deterministic=True, method="decode")
  return {"hidden_states": encoded_BLD, "logits": logits_BTV.astype(jnp.float32)}


def _xlnet_outputs(model, params, input_ids, mask, types, perm_mask, target_mapping):
  """XLNetLMHeadModel's outputs: the content stream [batch, L, hidden] and the logits (float32)
  of the query stream at target_mapping's P rows [batch, P, vocab], or without target_mapping of
  the content stream at every position [batch, L, vocab]. perm_mask [batch, L, L] (1 = may not
  attend) as HF's; `types` None: no segment term (HF's token_type_ids=None)."""
  return model.apply({"params": params}, input_ids, types, mask, perm_mask, target_mapping,
                     method=_xlnet_heads)


def _xlnet_heads(m, input_ids, types, mask, perm_mask, target_mapping):
  out = m(input_ids, types, mask, perm_mask, target_mapping, deterministic=True)
  logits = (out["logits"] if target_mapping is not None
            else m.lm_loss(m.word_embedding.attend(out["content"])))
  return {"hidden_states": out["content"], "logits": logits.astype(jnp.float32)}


def _causal_lm_outputs(model, params, input_ids, mask, types):
  """GPT2LMHeadModel's / OpenAIGPTLMHeadModel's next-token logits [batch, length, vocab]
  (float32) and the last hidden states (after GPT-2's ln_f); `types` unused (no token types)."""
  del types
  return model.apply({"params": params}, input_ids, mask, method=_causal_lm_heads)


def _causal_lm_heads(m, input_ids, mask):
  x_BLD = m.encoder(input_ids, mask, deterministic=True)
  return {"hidden_states": x_BLD, "logits": m.encoder.attend(x_BLD).astype(jnp.float32)}


# objective → (the HFModel outputs of its model, the keyword inputs beyond input_ids,
# attention_mask and token_type_ids that they take).
OUTPUTS = {"mlm": (_pretraining_outputs, ()), "electra": (_pretraining_outputs, ()),
           "t5": (_t5_outputs, ("decoder_input_ids",)),
           "xlnet": (_xlnet_outputs, ("perm_mask", "target_mapping")),
           "causal_lm": (_causal_lm_outputs, ())}


# ------------------------------------------------------------------------------------ reading


def read_hf_config(path: str) -> dict:
  config_path = os.path.join(path, "config.json")
  if not fileio.exists(config_path):
    raise ConfigError(f"{path} has no config.json; pass a transformers checkpoint directory "
                      f"(save_pretrained's output).")
  with fileio.open(config_path) as f:
    return json.load(f)


def _weight_files(path: str) -> tuple[str, list[str]]:
  """(format, files) of the checkpoint's weights, sharded (an *.index.json) or not; every file
  inside `path` (`_inside`)."""
  for name in (SAFETENSORS, TORCH_BIN):
    index = os.path.join(path, f"{name}.index.json")
    if fileio.exists(index):
      with fileio.open(index) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
      return name, [_inside(path, shard, index) for shard in shards]
    if fileio.exists(os.path.join(path, name)):
      return name, [_inside(path, name, os.path.join(path, name))]
  raise ConfigError(f"{path} holds no {SAFETENSORS} or {TORCH_BIN}.")


def _inside(directory: str, name: str, named_in: str) -> str:
  """`directory`/`name`, refused unless it resolves inside `directory` (an absolute or `../`
  name, or a symlink out of it, would read a file elsewhere). A URL has no links: its names
  are checked as paths."""
  if fileio.is_remote(directory):
    if posixpath.isabs(name) or ".." in posixpath.normpath(name).split("/"):
      raise ConfigError(f"{named_in} names the weights file {name!r}, outside {directory}; a "
                        f"checkpoint's files must lie in its directory.")
    return posixpath.join(directory, posixpath.normpath(name))
  root = os.path.realpath(directory)
  path = os.path.realpath(os.path.join(directory, name))
  if os.path.commonpath([root, path]) != root:
    raise ConfigError(f"{named_in} names the weights file {name!r}, which resolves to {path}, "
                      f"outside {directory}; a checkpoint's files must lie in its directory (a "
                      f"hub cache snapshot links into blobs/: copy it with `cp -rL` first).")
  return path


def _read_torch(file: str) -> dict[str, np.ndarray]:
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ConfigError(f"{file} is a PyTorch pickle, which needs torch: pip install torch, or "
                      f"convert the checkpoint to {SAFETENSORS} (transformers' save_pretrained "
                      f"writes it).") from e
  state = torch.load(io.BytesIO(fileio.read_bytes(file)) if fileio.is_remote(file) else file,
                     map_location="cpu", weights_only=True)
  return {k: (v.float() if v.is_floating_point() else v).numpy() for k, v in state.items()}


def read_state_dict(path: str) -> dict[str, np.ndarray]:
  """The checkpoint's parameters, HF name → numpy (floats as float32), legacy LayerNorm names
  (gamma/beta) renamed; Network.names then adds what a bare model class's names lack."""
  kind, files = _weight_files(path)
  state_dict = {}
  for file in files:
    if kind != SAFETENSORS:
      state_dict.update(_read_torch(file))
    elif fileio.is_remote(file):
      state_dict.update(safetensors_numpy.load(fileio.read_bytes(file)))
    else:
      state_dict.update(safetensors_numpy.load_file(file))
  return {_modern_name(k): (v.astype(np.float32) if v.dtype.kind == "f" else v)
          for k, v in state_dict.items()}


def family_state_dict(path: str, family: families.Family, hf: dict) -> dict[str, np.ndarray]:
  """read_state_dict under the names of `family`'s mapping (Network.names; `hf`: the full HF
  config)."""
  return family.network.names(family, hf, read_state_dict(path))


def _modern_name(name: str) -> str:
  for old, new in ((".gamma", ".weight"), (".beta", ".bias")):
    if name.endswith(old):
      return name[:-len(old)] + new
  return name


def _complete(config, imported: dict, kind: str = "", num_outputs: int = 0
              ) -> tuple[dict, tuple[str, ...]]:
  """The full parameter tree of `build_model(config, kind, num_outputs)`: `imported` where it
  holds a module, fresh initialisation (seed config.seed) of the others, which alone are
  computed. Returns (params, the fresh top-level modules)."""
  model = build_model(config, kind, num_outputs)
  rng = jax.random.key(config.seed)

  def init():
    return nn.meta.unbox(model.init({"params": rng, "dropout": rng},
                                    **_init_inputs(config, kind), deterministic=True))["params"]

  shapes = traverse_util.flatten_dict(jax.eval_shape(init))
  flat = traverse_util.flatten_dict(imported)
  fresh = tuple(sorted({path[0] for path in shapes} - {path[0] for path in flat}))
  expected = {path: x.shape for path, x in shapes.items() if path[0] not in fresh}
  got = {path: x.shape for path, x in flat.items()}
  if expected != got:
    differ = sorted(set(expected.items()) ^ set(got.items()))[:5]
    raise ConfigError(f"The mapped checkpoint does not fit the model its config describes "
                      f"(first differences: {differ}); is config.json the checkpoint's own?")
  if fresh:
    initialised = jax.jit(lambda: {k: v for k, v in init().items() if k in fresh})()
    flat.update(traverse_util.flatten_dict(jax.device_get(initialised)))
  return traverse_util.unflatten_dict(flat), fresh


def _generator(generator_path: str, config) -> tuple[dict, dict]:
  """An ElectraForMaskedLM checkpoint as our Electra's generator. Sets the generator fractions of
  `config.objective`; returns (its parameters, notes)."""
  family = families.get("electra")
  hf_config = read_hf_config(generator_path)
  state_dict = family_state_dict(generator_path, family,
                                 families.full_hf_config(family, hf_config))
  arch, missing = family.detect(state_dict)
  if hf_config.get("model_type") != "electra" or arch.name != "ElectraForMaskedLM" or missing:
    raise ConfigError(f"generator_path={generator_path} is not an ElectraForMaskedLM checkpoint.")
  theirs = families.model_from_hf(family, hf_config)
  families.check_head_activation(arch, theirs)
  d = config.model
  fractions = dict(generator_hidden_fraction=theirs.hidden / d.hidden,
                   generator_layers_fraction=theirs.layers / d.layers)
  ours = config_lib.electra_generator(d, *fractions.values())
  fields = ("hidden", "layers", "heads", "mlp", "vocab_size", "max_positions", "type_vocab_size",
            "activation")
  differ = [f"{k}: {theirs[k]} vs {ours[k]}" for k in fields if theirs[k] != ours[k]]
  if (theirs.embedding_size or theirs.hidden) != ours.embedding_size:
    differ.append(f"embedding width: {theirs.embedding_size or theirs.hidden} vs "
                  f"{ours.embedding_size}")
  if differ:
    raise ConfigError(f"The generator at {generator_path} is not the generator our ELECTRA "
                      f"derives from the discriminator (hidden·fraction, heads hidden/64, FFN "
                      f"4·hidden, the discriminator's embeddings): {'; '.join(differ)}.")
  config.objective.update(fractions)
  params = mapping.params_from_hf(state_dict, mapping.electra_entries(ours, "generator"))
  return params, {"generator_path": fileio.absolute(generator_path)}


def from_pretrained(path: str, generator_path: str | None = None, *,
                    task_head: bool = True) -> HFModel:
  """Reads a transformers checkpoint directory (config.json + model.safetensors, or
  pytorch_model.bin when torch is installed; tokenizer files if present).

  A task class (config.json's `architectures`, e.g. BertForSequenceClassification) reads as our
  FineTuneModel (`kind`, `num_outputs`); a head that differs from ours (ELECTRA's GELU
  classification head) is a ConfigError. With `task_head=False` a task class's head is left
  out instead: the encoder goes into the family's pre-training model (Family.base) with fresh
  heads, as a pre-training workdir (import_to_workdir) needs.

  For an ELECTRA discriminator the generator is freshly initialised, or read from
  `generator_path` (an ElectraForMaskedLM checkpoint whose shape our ELECTRA derives from the
  discriminator's; the discriminator's copy of the shared embeddings is kept)."""
  hf_config = read_hf_config(path)
  family = families.get(hf_config.get("model_type"))
  hf = families.full_hf_config(family, hf_config)
  state_dict = family_state_dict(path, family, hf)
  task = family.task((hf_config.get("architectures") or [""])[0])
  kind, num_outputs, notes = "", 0, {}
  if task is None:
    arch, missing_heads = family.detect(state_dict)
  elif task_head:
    families.check_task_class(task, hf)
    arch, missing_heads = task, ()
    kind, num_outputs = families.task_head(task, hf)
  else:
    arch = family.architecture(family.base)
    missing_heads = tuple(arch.heads)
    notes["task_head_left_out"] = task.name
  model = families.model_from_hf(family, hf_config)
  families.check_head_activation(arch, model)
  tokenizer = tokenizer_lib.from_dir(path) if tokenizer_lib.has_tokenizer(path) else None
  config = families.run_config(family, family.architecture(family.base) if kind else arch, model,
                               fileio.absolute(path) if tokenizer else "")
  imported = mapping.params_from_hf(
      state_dict, families.entries(family, arch, model, hf, heads=not missing_heads))
  if generator_path:
    if arch.objective != "electra":
      raise ConfigError(f"generator_path is for ELECTRA discriminators; {path} is {arch.name}.")
    generator, generator_notes = _generator(generator_path, config)
    notes.update(generator_notes)
    shared = generator.pop("encoder")
    notes["generator_embeddings_max_abs_diff"] = max(
        float(np.abs(a - b).max()) for a, b in zip(jax.tree.leaves(shared), jax.tree.leaves(
            {k: imported["encoder"][k] for k in shared})))
    imported.update(generator)
  params, fresh = _complete(config, imported, kind, num_outputs)
  return HFModel(config, params, tokenizer, hf, arch.name, fresh, notes, kind, num_outputs)


# ------------------------------------------------------------------------------------ writing


def check_empty_target(path: str) -> None:
  if fileio.isdir(path) and fileio.listdir(path):
    raise ConfigError(f"{path} is not empty; choose a new directory (nothing is overwritten).")


def unscanned(params: dict) -> dict:
  """`params` with every scanned layer stack (a module 'layers' at any depth whose leaves have a
  leading [layers] axis: model.scan_layers) split into layer_{i}."""
  out = {}
  for name, module in params.items():
    if name == "layers":
      for i in range(jax.tree.leaves(module)[0].shape[0]):
        out[f"layer_{i}"] = jax.tree.map(lambda x, i=i: x[i], module)
    else:
      out[name] = unscanned(module) if isinstance(module, Mapping) else module
  return out


def _write(path: str, hf_config: dict, state_dict: dict, tokenizer) -> None:
  fileio.makedirs(path)
  with fileio.open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf_config, f, indent=2, sort_keys=True)
  if fileio.is_remote(path):   # one upload; locally written as it is made
    fileio.write_atomically(os.path.join(path, SAFETENSORS),
                            safetensors_numpy.save(state_dict, metadata={"format": "pt"}))
  else:
    safetensors_numpy.save_file(state_dict, os.path.join(path, SAFETENSORS),
                                metadata={"format": "pt"})
  if tokenizer is not None:
    tokenizer.save(path)


def save_pretrained(m: HFModel, path: str) -> None:
  """Writes `m` as a transformers checkpoint directory: config.json, model.safetensors and the
  tokenizer files; a task class keeps m.hf_config's labels (families.task_config). An ELECTRA
  model whose generator was not freshly initialised also writes the generator as an
  ElectraForMaskedLM checkpoint in path/generator."""
  check_empty_target(path)
  family, model = m.family, m.config.model
  arch = family.architecture(m.architecture)
  families.check_head_activation(arch, model)
  base = dict(m.hf_config)
  if m.tokenizer is not None:
    base.update(family.network.token_ids(m.tokenizer))
  hf = families.model_to_hf(family, arch, model, base)
  params = unscanned(jax.device_get(m.params))
  _write(path, hf, mapping.params_to_hf(params, families.entries(family, arch, model, hf)),
         m.tokenizer)
  if arch.objective == "electra" and "generator" not in m.fresh:
    generator = electra_objective.generator_config(m.config)
    generator_arch = family.architecture("ElectraForMaskedLM")
    families.check_head_activation(generator_arch, generator)
    _write(os.path.join(path, GENERATOR_DIR),
           families.model_to_hf(family, generator_arch, generator, base),
           mapping.params_to_hf(params, mapping.electra_entries(generator, "generator")),
           m.tokenizer)
