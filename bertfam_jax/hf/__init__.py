"""HuggingFace interop: transformers checkpoints ↔ our models, tokenizers and workdirs.

  m = hf.from_pretrained(path)             # HFModel: .config .params .tokenizer, m(input_ids, ...)
  hf.save_pretrained(m, path)              # transformers' AutoModel*.from_pretrained loads it
  hf.import_to_workdir(path, workdir)      # a pre-training workdir (init_from, fine-tuning)
  hf.export_workdir(workdir, path)         # our run's latest checkpoint as a transformers dir
  python -m bertfam_jax.hf import|export ...

Fine-tuned checkpoints: a fine-tuning run (finetune.run) exports as its kind's task class
(*ForSequenceClassification, *ForTokenClassification, *ForQuestionAnswering,
*ForMultipleChoice) and from_pretrained reads those classes as our FineTuneModel (m.kind).

T5 and XLNet: m(input_ids, mask, decoder_input_ids=...) / m(input_ids, mask, types,
perm_mask=..., target_mapping=...) as T5ForConditionalGeneration / XLNetLMHeadModel compute them.

Families: bert, roberta, albert, electra, t5, xlnet (families.py); needs
`pip install 'bertfam_jax[hf]'` (safetensors, tokenizers), and torch only to read
pytorch_model.bin.
"""

import importlib.util

from bertfam_jax.config_lib import ConfigError

_MISSING = [name for name in ("safetensors", "tokenizers")
            if importlib.util.find_spec(name) is None]
if _MISSING:
  raise ConfigError(f"bertfam_jax.hf needs {' and '.join(_MISSING)}: "
                    "pip install 'bertfam_jax[hf]'.")

# pylint: disable=wrong-import-position
from bertfam_jax.hf.io import HFModel, from_pretrained, save_pretrained  # noqa: E402
from bertfam_jax.hf.workdir import export_workdir, import_to_workdir  # noqa: E402

__all__ = ["HFModel", "from_pretrained", "save_pretrained", "import_to_workdir", "export_workdir"]
