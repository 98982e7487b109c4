"""DistilBERT: a student of half its teacher's depth distilled from a masked LM (Sanh et al., 2019,
arXiv:1910.01108; objectives/distillation.py, spec §8).

Constants from huggingface transformers examples/research_projects/distillation (README.md,
train.py, distiller.py, scripts/extract_distilbert.py): the student has the teacher's width,
half its layers (from teacher layers 0, 2, 4, 7, 9, 11 of 12), no token types and no pooler,
its position table the teacher's and never trained (training_configs' sinusoidal_pos_embds);
loss 5.0 · KL at T = 2 (× T²) + 2.0 · MLM + 1.0 · cosine of the last hidden states; masking of
15% of the tokens with rare-token smoothing count^−0.7, 80/10/10; AdamW (0.9, 0.98), ε 1e-6,
lr 5e-4, no weight decay, 5% linear warmup then linear decay, gradient clipping at 5; batches of
about 4k sequences of up to 512 tokens (5 per GPU × 50 accumulation × 16 GPUs); 3 epochs of
Toronto Books + English Wikipedia, about 6,000 such steps (3 × 3.3 B words ≈ 13 B tokens / 2.1 M
per step; the reference counts epochs, not steps).

The teacher is the config argument `teacher=DIR`: a masked-LM workdir of ours, or a transformers
BERT imported as one (`python -m bertfam_jax.hf import --hf_path=bert-base-uncased
--workdir=DIR`). Its model, tokenizer and vocabulary are read from DIR; the student's width and
vocabulary follow. Without a teacher the config describes DistilBERT of BERT-base and refuses
to run until one is given.

  # Offline on a 2-core CPU: a runlocal BERT teacher, then its 1-layer student (measured: 20 and
  # 35 minutes while the CPU also ran tests; the KL over every position's logits costs more than
  # BERT's 20 predictions per row; docs/results.md):
  python -m bertfam_jax.main --config=configs/bert.py:runlocal --workdir=runs/bert-local
  python -m bertfam_jax.main --config=configs/distilbert.py:runlocal,teacher=runs/bert-local \
      --workdir=runs/distilbert-local
  # The paper's recipe, from an imported bert-base-uncased:
  python -m bertfam_jax.main --config=configs/distilbert.py:teacher=$TEACHER --workdir=$WORKDIR \
      --config.data.tfds_data_dir=$TFDS_DATA_DIR
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
  config.model.update(layers=max(1, teacher_model.layers // 2), type_vocab_size=0)
  config.objective = ml_collections.ConfigDict(dict(
      name="distillation",
      teacher=arg.teacher,
      teacher_model=ml_collections.ConfigDict(teacher_model.to_dict()),
      student_layers="",      # teacher layers the student starts from; '' = evenly spaced
      mask_rate=0.15,
      smoothing=0.7,          # masking weight max(count, 1)^-smoothing (train.py mlm_smoothing)
      mask_token_prob=0.8,
      random_token_prob=0.1,
      temperature=2.0,
      alpha_ce=5.0,
      alpha_mlm=2.0,
      alpha_cos=1.0,
      # The position table stays the teacher's: the reference's training config builds the
      # student with sinusoidal_pos_embds, whose table has requires_grad=False, then loads the
      # teacher's learned table into it (scripts/extract_distilbert.py), so it never trains.
      freeze_positions=True,
  ))
  config.data.update(source="tfds", tfds_name="wikipedia/20230601.en", train_split="train[:99%]",
                     eval_split="train[99%:]", seq_len=512, packing="full_sentences")
  config.train.update(batch_size=4096, total_steps=6000)
  # 5% of the steps (warmup_prop 0.05); set both when overriding train.total_steps.
  config.optimizer = cl.fairseq_adam(peak_lr=5e-4, b2=0.98, weight_decay=0.0, clip_norm=5.0,
                                     warmup_steps=config.train.total_steps // 20)
  if arg.runlocal:
    model = dict(config.model)
    cl.shrink_for_local(config)
    config.model.update(model)   # the student keeps the teacher's width and vocabulary
    config.data.seq_len = min(128, config.model.max_positions)
    config.train.update(total_steps=1000, eval_every=250, checkpoint_every=250)
    config.optimizer.update(peak_lr=1e-3, warmup_steps=config.train.total_steps // 20)
  return config
