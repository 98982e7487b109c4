"""The fine-tuning config: built without reading anything, its recipe's defaults filled in when the
run starts (`config_lib.resolve_finetune`) without overwriting a value given, the optimizer's
defaults following its name, and the one `parse_arg`."""

import os

import pytest

from bertfam_jax import config_lib as cl
from bertfam_jax.config_lib import ConfigError

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(arg: str):
  return cl.load_config(os.path.join(_REPO, "configs", "finetune.py"), arg)


def test_building_reads_nothing_and_leaves_the_recipe_fields_unset():
  config = load("task=glue/mrpc,init=/nonexistent/run,runlocal")   # no such directory: no I/O
  assert (config.finetune.task, config.finetune.init, config.finetune.runlocal) == (
      "glue/mrpc", "/nonexistent/run", True)
  assert config.finetune.max_seq_len is None and config.optimizer.peak_lr is None
  assert config.train.total_steps is None


@pytest.mark.parametrize("recipe, expected", [
    ("encoder", dict(name="adamw", peak_lr=5e-5, warmup_fraction=0.1, weight_decay=0.01,
                     clip_norm=1.0, max_seq_len=128, epochs=3.0, total_steps=0,
                     cpu_ynn_fusion="")),
    ("extractive_qa", dict(name="adamw", peak_lr=3e-5, max_seq_len=384, epochs=2.0,
                           doc_stride=128, max_query_len=64, qa_head="independent")),
    ("text_to_text", dict(name="adafactor", peak_lr=1e-3, warmup_fraction=0.0, weight_decay=0.0,
                          clip_norm=0.0, max_seq_len=512, total_steps=0,
                          cpu_ynn_fusion="dot,eltwise,reduce")),   # configs/t5.py's
])
def test_each_recipe_has_its_papers_defaults(recipe, expected):
  resolved = cl.resolve_finetune(load("task=glue/mrpc,init=x"), recipe)
  flat = {**resolved.optimizer, **resolved.finetune, **resolved.train}
  assert {k: flat[k] for k in expected} == expected


@pytest.mark.parametrize("hidden, task_kind, expected", [
    # configure_finetuning.py and the paper's Table 7: Small 3e-4, Base 1e-4, Large 5e-5 with
    # layer-wise decay 0.9 (0.8 otherwise); SQuAD 2 epochs at 512 tokens.
    (256, "classification", dict(peak_lr=3e-4, layer_decay=0.8, max_seq_len=128, epochs=3.0)),
    (768, "classification", dict(peak_lr=1e-4, layer_decay=0.8, max_seq_len=128, epochs=3.0)),
    (1024, "classification", dict(peak_lr=5e-5, layer_decay=0.9, max_seq_len=128)),
    # SQuAD with qa_tasks.py's joint head (the end given the start, an answerable classifier).
    (768, "extractive_qa", dict(peak_lr=1e-4, layer_decay=0.8, max_seq_len=512, epochs=2.0,
                                qa_head="joint")),
    (128, "classification", dict(peak_lr=1e-4, layer_decay=0.8)),   # :runlocal width: base's
])
def test_an_electra_init_gets_electras_recipe(hidden, task_kind, expected):
  recipe = cl.finetune_recipe(False, task_kind, "electra")
  resolved = cl.resolve_finetune(load("task=glue/mrpc,init=x"), recipe, hidden=hidden)
  flat = {**resolved.optimizer, **resolved.finetune}
  assert {k: flat[k] for k in expected} == expected
  # Any other family keeps BERT's recipe: no layer-wise decay.
  bert = cl.resolve_finetune(load("task=glue/mrpc,init=x"),
                             cl.finetune_recipe(False, task_kind, "mlm"), hidden=hidden)
  assert bert.finetune.layer_decay == 1.0 and bert.optimizer.peak_lr in (5e-5, 3e-5)
  given = load("task=glue/mrpc,init=x")
  given.finetune.update(layer_decay=1.0, qa_head="independent")
  resolved = cl.resolve_finetune(given, recipe, hidden=hidden)
  assert (resolved.finetune.layer_decay, resolved.finetune.qa_head) == (1.0, "independent")
  given.finetune.qa_head = "beam"
  with pytest.raises(ConfigError, match=r"finetune.qa_head='beam'; choose one of \('independent', "
                                        r"'joint'\)"):
    cl.resolve_finetune(given, recipe, hidden=hidden)


@pytest.mark.parametrize("task, kind, expected", [
    # examples/roberta/config/finetuning/*.yaml: Adam (0.9, 0.98) ε 1e-6, decay 0.1, no clip,
    # 6% warmup, 10 epochs, lr 1e-5 and batch 32 (RTE, STS-B 2e-5; RTE, MRPC, CoLA, STS-B batch
    # 16; QQP 28,318 of 113,272 updates warming up), 512 tokens; a head without dropout, torch's
    # default init.
    ("glue/sst2", "classification", dict(name="adamw", adam="fairseq", peak_lr=1e-5,
                                         weight_decay=0.1, clip_norm=0.0, warmup_fraction=0.06,
                                         epochs=10.0, max_seq_len=512, batch_size=32,
                                         head_dropout=0.0, head_init="torch_default")),
    ("glue/rte", "classification", dict(peak_lr=2e-5, batch_size=16, warmup_fraction=0.06)),
    ("glue/stsb", "regression", dict(peak_lr=2e-5, batch_size=16, head_init="torch_default")),
    ("glue/mrpc", "classification", dict(peak_lr=1e-5, batch_size=16)),
    ("glue/cola", "classification", dict(peak_lr=1e-5, batch_size=16)),
    ("glue/qqp", "classification", dict(peak_lr=1e-5, batch_size=32, warmup_fraction=0.25)),
])
def test_a_roberta_init_gets_fairseqs_glue_recipe(task, kind, expected):
  recipe = cl.finetune_recipe(False, kind, "mlm", "fairseq")
  assert recipe == "roberta"
  resolved = cl.resolve_finetune(load(f"task={task},init=x"), recipe, dropout=0.1)
  flat = {**resolved.optimizer, **resolved.finetune, **resolved.train}
  assert {k: flat[k] for k in expected} == expected
  # The runlocal slice: its CPU sizes and 3 epochs.
  local = cl.resolve_finetune(load(f"task={task},init=x,runlocal"), recipe, dropout=0.1)
  assert (local.finetune.epochs, local.finetune.max_seq_len, local.optimizer.adam) == (
      3.0, 128, "fairseq")


def test_robertas_other_tasks_and_other_inits_keep_berts_recipe():
  for kind in ("token_classification", "extractive_qa", "multiple_choice"):
    assert cl.finetune_recipe(False, kind, "mlm", "fairseq") != "roberta"
  assert cl.finetune_recipe(False, "classification", "mlm", "bert") == "encoder"
  assert cl.finetune_recipe(False, "classification", "mlm", "spanbert") == "encoder"
  bert = cl.resolve_finetune(load("task=glue/rte,init=x"), "encoder", dropout=0.1)
  assert (bert.optimizer.adam, bert.train.batch_size, bert.finetune.head_init,
          bert.finetune.head_dropout) == ("bert", 32, "model", 0.1)   # the model's dropout
  given = load("task=glue/rte,init=x")
  given.train.batch_size, given.finetune.head_init = 8, "model"
  roberta = cl.resolve_finetune(given, "roberta", dropout=0.1)
  assert (roberta.train.batch_size, roberta.finetune.head_init) == (8, "model")
  given.finetune.head_init = "xavier"
  with pytest.raises(ConfigError, match="finetune.head_init='xavier' must be one of"):
    cl.resolve_finetune(given, "roberta", dropout=0.1)


def test_gradual_unfreezing_is_refused_with_a_bias_corrected_or_another_optimizer():
  """A layer unfrozen at step s starts from zero moments; a bias correction counted from step 0
  would scale its first updates wrongly (GPT's Adam), and Adafactor is not that optimizer."""
  config = load("task=glue/mrpc,init=x")
  config.finetune.unfreeze_every = 10
  cl.resolve_finetune(config, "encoder")          # BERT's AdamWeightDecay: no bias correction
  for recipe in ("gpt", "text_to_text"):
    with pytest.raises(ConfigError, match="unfreeze_every=10 needs an optimizer without bias "
                                          "correction"):
      cl.resolve_finetune(config, recipe)


def test_adapters_default_to_adapter_berts_rate_and_epochs():
  """adapter-bert's README command: --learning_rate=3e-4 --num_train_epochs=5.0, whatever the
  init's recipe; values given keep theirs."""
  config = load("task=glue/mrpc,init=x")
  config.finetune.method = "adapters"
  for recipe in ("encoder", "electra"):
    resolved = cl.resolve_finetune(config, recipe, hidden=768)
    assert (resolved.optimizer.peak_lr, resolved.finetune.epochs) == (3e-4, 5.0), recipe
  config.optimizer.peak_lr = 1e-3
  assert cl.resolve_finetune(config, "encoder").optimizer.peak_lr == 1e-3
  assert cl.resolve_finetune(load("task=glue/mrpc,init=x"), "encoder").optimizer.peak_lr == 5e-5


@pytest.mark.parametrize("task, epochs", [("glue/rte", 10.0), ("glue/stsb", 10.0),
                                          ("glue/mrpc", 3.0), ("glue/mnli", 3.0)])
def test_electra_trains_rte_and_stsb_ten_epochs(task, epochs):
  """configure_finetuning.py: `if task_name in ["rte", "sts"]: num_train_epochs = 10.0`; BERT's
  recipe keeps 3 for every task."""
  config = load(f"task={task},init=x")
  assert cl.resolve_finetune(config, "electra", hidden=256).finetune.epochs == epochs
  assert cl.resolve_finetune(config, "encoder").finetune.epochs == 3.0


def test_runlocal_comes_first_and_given_values_are_kept():
  config = load("task=wordnet_supersense_t2t,init=x,runlocal")
  config.finetune.max_train_examples = 100
  config.optimizer.peak_lr = 0.5
  resolved = cl.resolve_finetune(config, cl.finetune_recipe(True, ""))
  assert resolved.finetune.max_train_examples == 100 and resolved.optimizer.peak_lr == 0.5
  assert resolved.finetune.max_eval_examples == 500 and resolved.finetune.max_seq_len == 128
  assert resolved.train.total_steps == 1000   # runlocal T5: 1,000 steps
  config.train.total_steps = 0   # given: from epochs, even with runlocal
  assert cl.resolve_finetune(config, "text_to_text").train.total_steps == 0
  qa = cl.resolve_finetune(load("task=wordnet_qa,init=x,runlocal"),
                           cl.finetune_recipe(False, "extractive_qa"))
  assert (qa.finetune.doc_stride, qa.finetune.max_query_len, qa.optimizer.peak_lr) == (64, 32, 5e-4)
  assert cl.resolve_finetune(config, "text_to_text").to_dict() == cl.resolve_finetune(
      cl.resolve_finetune(config, "text_to_text"), "text_to_text").to_dict()   # idempotent


def test_dropout_is_t5s_01_for_text_to_text_and_the_models_own_elsewhere():
  """t5x's finetune.gin re-enables dropout 0.1 whatever pre-training used (v1.1: 0); the encoder
  recipes keep the pre-trained model's; a value given keeps it; [0, 1) only."""
  config = load("task=glue/mrpc,init=x")
  assert cl.resolve_finetune(config, "text_to_text", dropout=0.0).finetune.dropout == 0.1
  assert cl.resolve_finetune(config, "encoder", dropout=0.2).finetune.dropout == 0.2
  assert cl.resolve_finetune(config, "electra", hidden=256, dropout=0.1).finetune.dropout == 0.1
  config.finetune.dropout = 0.0
  assert cl.resolve_finetune(config, "text_to_text", dropout=0.0).finetune.dropout == 0.0
  config.finetune.dropout = 1.0
  with pytest.raises(ConfigError, match=r"finetune.dropout=1.0 must be in \[0, 1\)"):
    cl.resolve_finetune(config, "encoder", dropout=0.1)


def test_the_optimizers_defaults_follow_its_name():
  config = load("task=glue/mrpc,init=x")
  config.optimizer.name = "adamw"
  t5_with_adamw = cl.resolve_finetune(config, "text_to_text")
  assert (t5_with_adamw.optimizer.weight_decay, t5_with_adamw.optimizer.clip_norm,
          t5_with_adamw.optimizer.warmup_fraction) == (0.01, 1.0, 0.1)
  config.optimizer.name = "adafactor"
  assert cl.resolve_finetune(config, "encoder").optimizer.warmup_fraction == 0.0
  config.optimizer.warmup_fraction = 0.1
  with pytest.raises(ConfigError, match="Adafactor fine-tunes at a constant rate"):
    cl.resolve_finetune(config, "encoder")
  config.optimizer.update(name="sgd", warmup_fraction=None)
  with pytest.raises(ConfigError, match="optimizer.name='sgd'"):
    cl.resolve_finetune(config, "encoder")


@pytest.mark.parametrize("field, value, message", [
    ("finetune.max_seq_len", 4, "max_seq_len >= 8"),
    ("finetune.layer_decay", 1.5, "layer_decay=1.5"),
    ("finetune.features", "mean", "features='mean'"),
    ("finetune.mix_l2", 0.001, "mix_l2=0.001 and mix_layer_norm=False shape the scalar mix: "
                               "set --config.finetune.features=weighted_sum"),
    ("finetune.mix_layer_norm", True, "set --config.finetune.features=weighted_sum"),
    ("optimizer.peak_lr", -1.0, "peak_lr"),
    ("train.total_steps", -1, "total_steps must be >= 0"),
    ("train.cpu_ynn_fusion", "matmul", "cpu_ynn_fusion='matmul'; give a comma-separated subset"),
])
def test_bad_values_are_refused_naming_the_field(field, value, message):
  config = load("task=glue/mrpc,init=x")
  section, key = field.split(".")
  config[section][key] = value
  with pytest.raises(ConfigError, match=message):
    cl.resolve_finetune(config, "encoder")


def test_one_parse_arg_for_every_config_file():
  assert vars(cl.parse_arg("large,runlocal", size="base")) == dict(runlocal=True, size="large")
  assert vars(cl.parse_arg("size=large,version=1.1", size="base", version="1.0")) == dict(
      runlocal=False, size="large", version="1.1")
  assert vars(cl.parse_arg("task=a,init=/b", task="", init="")) == dict(
      runlocal=False, task="a", init="/b")
  with pytest.raises(ConfigError, match="Unknown config argument 'foo'.*known: \\['init', "):
    cl.parse_arg("foo", task="", init="")
  with pytest.raises(ConfigError, match="Unknown config argument 'version'"):
    cl.parse_arg("version=1.1", size="base")


def test_the_run_reads_the_family_from_the_pre_trained_config():
  from bertfam_jax.finetune import run  # pylint: disable=import-outside-toplevel
  electra = cl.load_config(os.path.join(_REPO, "configs", "electra.py"), "size=base")
  resolved = run.resolved_config(load("task=wordnet_supersense,init=x"), electra)
  assert (resolved.finetune.layer_decay, resolved.optimizer.peak_lr) == (0.8, 1e-4)
  bert = cl.load_config(os.path.join(_REPO, "configs", "bert.py"), "size=base")
  resolved = run.resolved_config(load("task=wordnet_supersense,init=x"), bert)
  assert (resolved.finetune.layer_decay, resolved.optimizer.peak_lr) == (1.0, 5e-5)


def test_a_t5_v11_fine_tunes_with_dropout_and_an_encoder_keeps_its_own():
  """The run's model section takes finetune.dropout: T5 v1.1 (pre-trained at 0) fine-tunes at
  t5x's 0.1; a BERT pre-trained at 0.2 keeps 0.2."""
  from bertfam_jax.finetune import run  # pylint: disable=import-outside-toplevel
  t5 = cl.load_config(os.path.join(_REPO, "configs", "t5.py"), "size=small,version=1.1")
  assert t5.model.dropout == 0.0
  resolved = run.resolved_config(load("task=wordnet_supersense_t2t,init=x"), t5)
  assert resolved.finetune.dropout == resolved.model.dropout == 0.1
  bert = cl.load_config(os.path.join(_REPO, "configs", "bert.py"), "size=base")
  bert.model.dropout = 0.2
  resolved = run.resolved_config(load("task=wordnet_supersense,init=x"), bert)
  assert resolved.finetune.dropout == resolved.model.dropout == 0.2
  assert resolved.model.attention_dropout == 0.1


def test_a_fine_tuning_saved_at_another_dropout_is_refused_with_the_flag_that_restores_it():
  """A T5 fine-tuning saved before finetune.dropout kept its init's 0; resuming it now (0.1) is
  refused, and the message names --config.finetune.dropout=0.0; another model change offers no
  flag (a fine-tuning's model comes from its init)."""
  import json  # pylint: disable=import-outside-toplevel
  from bertfam_jax import workdir as workdir_lib  # pylint: disable=import-outside-toplevel
  from bertfam_jax.finetune import run  # pylint: disable=import-outside-toplevel
  t5 = cl.load_config(os.path.join(_REPO, "configs", "t5.py"), "size=small,version=1.1")
  resolved = run.resolved_config(load("task=wordnet_supersense_t2t,init=x"), t5)
  saved = json.loads(resolved.to_json())
  saved["model"]["dropout"] = 0.0
  with pytest.raises(ConfigError, match=r"model.dropout: 0.0 → 0.1.*--config.finetune.dropout=0.0"):
    workdir_lib.check_config("/runs/ft", saved, resolved)
  saved["model"]["layers"] = 3
  with pytest.raises(ConfigError) as refused:
    workdir_lib.check_config("/runs/ft", saved, resolved)
  assert "--config" not in str(refused.value)


def test_a_fine_tuning_resumes_whatever_its_fresh_heads_were_drawn_with():
  """A fine-tuning of a transformers RoBERTa saved before the import drew its heads uncut (the
  field absent: truncated) resumes: its heads come from its checkpoint. A pre-training, whose
  config is the run's whole recipe, is still refused for it, with the flag."""
  import json  # pylint: disable=import-outside-toplevel
  from bertfam_jax import workdir as workdir_lib  # pylint: disable=import-outside-toplevel
  from bertfam_jax.finetune import run  # pylint: disable=import-outside-toplevel
  roberta = cl.load_config(os.path.join(_REPO, "configs", "roberta.py"), "size=base")
  resolved = run.resolved_config(load("task=wordnet_supersense,init=x"), roberta)
  assert resolved.model.weight_init == "normal"
  saved = json.loads(resolved.to_json())
  del saved["model"]["weight_init"], saved["model"]["bare_dense_init"]
  workdir_lib.check_config("/runs/ft", saved, resolved)
  saved["model"]["layers"] = 3
  with pytest.raises(ConfigError, match="model.layers"):
    workdir_lib.check_config("/runs/ft", saved, resolved)
  saved = json.loads(roberta.to_json())
  del saved["model"]["weight_init"]
  with pytest.raises(ConfigError, match=r"--config.model.weight_init=truncated_normal"):
    workdir_lib.check_config("/runs/pt", saved, roberta)
