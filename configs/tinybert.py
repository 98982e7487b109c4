"""TinyBERT general distillation: a 4-layer, 312-wide student taught layer by layer by a BERT
(Jiao et al., 2020, arXiv:1909.10351; objectives/tinybert.py). The task-specific stage is a
fine-tuning with a teacher: configs/finetune.py's `finetune.teacher` (finetune/distill.py).

Constants from the paper (§4.1-4.2) and huawei-noah TinyBERT (README.md, general_distill.py,
transformer/modeling.py): TinyBERT₄ has 4 layers, hidden 312, feed-forward 1,200 and 12 heads
(the teacher's count: scores are matched head by head); the student starts at random
(`from_scratch`), learns teacher layers 2, 5, 8, 11 (the last of each block of three) and the
embedding output, loss att + rep (MSE, the student's states through a learned 312 → 768
projection); 128-token rows of English Wikipedia with one token a row corrupted as BERT's (the
pre-generation script's masked_lm_prob 0.0, whose budget max(1, round(0 · len)) is 1); batch
256, BertAdam at 5e-5 (no bias correction, weight decay 0.01 on all but biases and LayerNorm,
each parameter's gradient clipped at norm 1) with 10% linear warmup then linear decay from the
peak to 0 (WarmupLinearSchedule; its first update runs at 0, ours at peak / warmup steps); 3
epochs of 2,500 M words, about 300,000 such steps (≈ 3.3 B word pieces / 128 / 256 per epoch;
the reference counts epochs, not steps).

The teacher is the config argument `teacher=DIR`, as configs/distilbert.py: a masked-LM workdir
of ours or a transformers BERT imported as one. Its model and tokenizer are read from DIR.

  # Offline on a 2-core CPU: a runlocal BERT teacher, then its 1-layer, half-width student:
  python -m bertfam_jax.main --config=configs/bert.py:runlocal --workdir=runs/bert-local
  python -m bertfam_jax.main --config=configs/tinybert.py:runlocal,teacher=runs/bert-local \
      --workdir=runs/tinybert-local
"""

import ml_collections

from bertfam_jax import config_lib as cl
from bertfam_jax import workdir as workdir_lib


def get_config(arg=None):
  arg = cl.parse_arg(arg, teacher="")
  config = cl.base_config()
  if arg.teacher:
    teacher_model, config.tokenizer = workdir_lib.teacher_sections(arg.teacher)
  else:
    teacher_model = cl.encoder("base")
  config.model = ml_collections.ConfigDict(teacher_model.to_dict())
  # TinyBertForPreTraining.from_scratch: PyTorch BERT's init_bert_weights, N(0, 0.02) uncut.
  config.model.update(layers=4, hidden=312, mlp=1200, weight_init="normal")
  config.objective = ml_collections.ConfigDict(dict(
      name="tinybert",
      teacher=arg.teacher,
      teacher_model=ml_collections.ConfigDict(teacher_model.to_dict()),
      teacher_layers="",      # the teacher layer of each student layer; '' = uniform
      # pregenerate_training_data.py's masked_lm_prob 0.0 ("no [mask] symbol in corpus"):
      # still max(1, round(0 · len)) = 1 token a row, capped at max_predictions_per_seq 20.
      mask_rate=0.0,
      max_predictions=20,
      mask_token_prob=0.8,
      random_token_prob=0.1,
  ))
  config.data.update(source="tfds", tfds_name="wikipedia/20230601.en", train_split="train[:99%]",
                     eval_split="train[99%:]", seq_len=128, packing="full_sentences")
  config.train.update(batch_size=256, total_steps=300_000)
  # BertAdam as general_distill.py runs it: its --learning_rate default 5e-5 (the README's
  # command keeps it), WarmupLinearSchedule over 10% of the steps (warmup_proportion 0.1; set
  # both when overriding train.total_steps) then linear from the peak to 0, and each parameter's
  # gradient clipped to norm 1 on its own.
  config.optimizer = cl.bert_adamw(peak_lr=5e-5, schedule="linear_after_warmup",
                                   clip_per_tensor=True,
                                   warmup_steps=config.train.total_steps // 10)
  if arg.runlocal:
    model = dict(config.model)
    cl.shrink_for_local(config)
    config.model.update(model)   # the vocabulary, positions and heads stay the teacher's
    # Half the teacher's depth and width (a multiple of its heads), 4× wide feed-forward.
    width = max(teacher_model.heads, teacher_model.hidden // 2 // teacher_model.heads
                * teacher_model.heads)
    config.model.update(layers=max(1, teacher_model.layers // 2), hidden=width, mlp=4 * width)
    config.data.seq_len = min(128, config.model.max_positions)
    config.train.update(total_steps=1000, eval_every=250, checkpoint_every=250)
    config.optimizer.update(peak_lr=1e-3, warmup_steps=config.train.total_steps // 10)
  return config
