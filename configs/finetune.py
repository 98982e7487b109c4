"""Fine-tuning a pre-trained encoder on a downstream task (BERT's run_classifier.py / run_squad.py,
ELECTRA's run_finetuning.py, adapter-bert, ELMo's scalar mix).

  python -m bertfam_jax.main --config=configs/finetune.py:task=wordnet_supersense,init=runs/bert \
      --workdir=runs/bert-supersense
  # a HuggingFace checkpoint, imported first (or pass its directory as init directly):
  python -m bertfam_jax.hf import --hf_path=DIR --workdir=runs/hf-bert
  python -m bertfam_jax.main --config=configs/finetune.py:task=wordnet_qa,init=runs/hf-bert \
      --workdir=runs/hf-bert-qa
  # GLUE / SuperGLUE / SQuAD from a prepared TFDS data_dir:
  python -m bertfam_jax.main --config=configs/finetune.py:task=glue/mrpc,init=runs/bert \
      --config.finetune.data_dir=$TFDS_DATA_DIR --workdir=runs/bert-mrpc
  # A T5 workdir fine-tunes text-to-text (bertfam_jax.finetune.text_tasks, finetune/seq2seq.py):
  python -m bertfam_jax.main --config=configs/finetune.py:task=wordnet_define,init=runs/t5,runlocal \
      --workdir=runs/t5-define

Arguments: `task=NAME` (`bertfam_jax.finetune.tasks`), `init=PATH` (a pre-training workdir of
ours, an imported one, or a transformers checkpoint directory), `runlocal` (4,000 training and
1,000 evaluation examples, 128 tokens, lr 5e-4: minutes on a CPU for the `:runlocal` models).
The model comes from `init`; everything else is `config.finetune`.

Defaults are the papers': classification / regression / multiple choice as run_classifier.py
(128 tokens, batch 32, lr 5e-5, 3 epochs, 10% warmup, AdamW with weight decay 0.01, clip 1.0);
extractive QA as run_squad.py (384 tokens, doc_stride 128, queries of <= 64 tokens, answers of
<= 30, n-best 20, batch 32, lr 3e-5, 2 epochs); token classification as BERT's NER setting (128
tokens, lr 5e-5, 3 epochs). Adapters: Houlsby et al. (2019) size 64, lr 1e-3 (their sweep's best
for BERT-base on GLUE); layer-wise decay: ELECTRA's 0.8 (base) when enabled. Text-to-text (a T5
init): T5's fine-tuning (Raffel et al. §3.1.4): Adafactor at a constant 0.001, 512 input tokens,
the task's target length, greedy decoding; `runlocal`: 128 input tokens, 1,000 steps at 0.01.
"""


from bertfam_jax import config_lib as cl

_KIND_DEFAULTS = {
    "classification": dict(max_seq_len=128, peak_lr=5e-5, epochs=3.0),
    "regression": dict(max_seq_len=128, peak_lr=5e-5, epochs=3.0),
    "multiple_choice": dict(max_seq_len=128, peak_lr=5e-5, epochs=3.0),
    "token_classification": dict(max_seq_len=128, peak_lr=5e-5, epochs=3.0),
    "extractive_qa": dict(max_seq_len=384, peak_lr=3e-5, epochs=2.0),
}
# `runlocal`: a CPU-sized slice for the `:runlocal` pre-trained models (128 positions).
# lr 5e-4: a 2-layer, 128-wide encoder needs more than the papers' base-size rates.
_RUNLOCAL = dict(max_train_examples=4000, max_eval_examples=1000, peak_lr=5e-4, max_seq_len=128)
_RUNLOCAL_QA = dict(doc_stride=64, max_query_len=32)


def parse_finetune_arg(arg):
  """`task=NAME,init=PATH,runlocal` → dict(task, init, runlocal)."""
  values = dict(task="wordnet_supersense", init="", runlocal=False)
  for item in filter(None, (arg or "").split(",")):
    key, sep, value = item.partition("=")
    if key == "runlocal" and not sep:
      value = "true"
    if key not in values:
      raise cl.ConfigError(f"Unknown argument {key!r} in configs/finetune.py:{arg}; known: "
                           f"task=NAME, init=PATH, runlocal.")
    values[key] = value.lower() in ("1", "true", "yes") if key == "runlocal" else value
  return values


_TEXT_TO_TEXT = dict(max_seq_len=512, peak_lr=1e-3, epochs=3.0)
# The `:runlocal` T5s are 2 + 2 layers, 128 wide: at T5's 0.001 they still emit one label after
# 150 steps of supersense (0% accuracy), at 0.01 they reach 20% (measured on a runlocal T5).
_TEXT_TO_TEXT_RUNLOCAL = dict(max_train_examples=4000, max_eval_examples=500, max_seq_len=128,
                              steps=1000, peak_lr=1e-2)


def get_config(arg=None):
  from bertfam_jax import workdir  # pylint: disable=g-import-not-at-top
  from bertfam_jax.finetune import tasks, text_tasks  # pylint: disable=g-import-not-at-top
  args = parse_finetune_arg(arg)
  config = cl.finetune_config()
  if workdir.model_kind(args["init"]) == "t5" or (args["task"] in text_tasks.TASKS and args["task"] not in tasks.TASKS):
    text_tasks.get(args["task"])   # an unknown name fails here, naming the text-to-text tasks
    config.finetune.update(task=args["task"], init=args["init"], **_TEXT_TO_TEXT)
    if args["runlocal"]:
      config.finetune.update(**_TEXT_TO_TEXT_RUNLOCAL)
    return config
  kind = tasks.get(args["task"]).kind
  config.finetune.update(task=args["task"], init=args["init"], **_KIND_DEFAULTS[kind])
  if args["runlocal"]:
    config.finetune.update(**_RUNLOCAL, **(_RUNLOCAL_QA if kind == "extractive_qa" else {}))
  return config
