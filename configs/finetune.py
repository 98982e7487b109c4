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

Arguments: `task=NAME` (`bertfam_jax.finetune.tasks`, or `finetune.text_tasks` for a T5),
`init=PATH` (a pre-training workdir of ours, an imported one, or a transformers checkpoint
directory), `runlocal` (4,000 training and 1,000 evaluation examples, 128 tokens, lr 5e-4:
minutes on a CPU for the `:runlocal` models). The model, tokenizer and objective come from
`init` when the run starts; the rest is `config.finetune`, `config.optimizer` (name, peak_lr,
warmup_fraction, weight_decay, clip_norm) and `config.train` (batch sizes, total_steps: 0 = from
finetune.epochs). Fields left None take the recipe's defaults when the run starts, once `init`
tells an encoder from a T5 (`config_lib.FINETUNE_DEFAULTS`, `FINETUNE_RUNLOCAL`); building this
config reads nothing.

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


def get_config(arg=None):
  """`task=NAME,init=PATH,runlocal`; nothing is read here (the module docstring)."""
  args = cl.parse_arg(arg, task="wordnet_supersense", init="")
  config = cl.finetune_config()
  config.finetune.update(task=args.task, init=args.init, runlocal=args.runlocal)
  return config
