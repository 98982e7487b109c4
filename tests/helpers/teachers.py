"""A trained teacher for the distillation tests (tests/integration/distilbert_test.py,
tinybert_test.py): configs/bert.py:runlocal at the suite's tiny size."""

import os

from bertfam_jax import config_lib
from bertfam_jax.train import train

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_config(name: str, arg: str):
  """configs/`name` with its argument `arg`."""
  return config_lib.load_config(os.path.join(_ROOT, "configs", name), arg)


def train_bert_teacher(workdir: str, batch_size: int) -> str:
  """configs/bert.py:runlocal at 32-token rows: a 2-layer 32-wide BERT (4 heads) with NSP,
  trained 60 steps into `workdir`; returns `workdir`."""
  c = load_config("bert.py", "runlocal")
  c.data.update(seq_len=32, docs_per_chunk=16)
  c.model.update(hidden=32, heads=4, mlp=64, layers=2, vocab_size=512, max_positions=32)
  c.objective.max_predictions = 5
  c.optimizer.update(peak_lr=5e-3, warmup_steps=5)
  c.train.update(batch_size=batch_size, total_steps=60, log_every=20, eval_every=60,
                 eval_batches=2, checkpoint_every=60)
  train.run(c, workdir)
  return workdir
