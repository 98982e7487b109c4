"""Command line: HF checkpoint ↔ workdir.

  python -m bertfam_jax.hf import --hf_path=DIR --workdir=W [--generator_path=DIR]
  python -m bertfam_jax.hf export --workdir=W --hf_path=DIR

import writes a pre-training workdir (a fine-tuned checkpoint's encoder, its task head left
out); export writes a pre-training run as its pre-training class and a fine-tuning run as the
task class of its kind (e.g. BertForSequenceClassification).

A target directory that is not empty is refused; errors are one line on stderr, exit status 2.
"""

from __future__ import annotations

import sys

from absl import app, flags, logging

from bertfam_jax.config_lib import ConfigError

flags.DEFINE_string("hf_path", None, "A transformers checkpoint directory (import: read, "
                    "export: written).")
flags.DEFINE_string("workdir", None, "A workdir (import: a pre-training one, written; export: "
                    "a pre-training or fine-tuning run's, read).")
flags.DEFINE_string("generator_path", None, "import: an ELECTRA generator checkpoint for the "
                    "discriminator at --hf_path.")
FLAGS = flags.FLAGS
COMMANDS = ("import", "export")


def run(argv) -> str:
  """Runs the command in argv[1:]; returns the line to print."""
  from bertfam_jax import hf  # pylint: disable=import-outside-toplevel  (ConfigError if missing)
  if len(argv) != 2 or argv[1] not in COMMANDS:
    raise ConfigError(f"usage: python -m bertfam_jax.hf {'|'.join(COMMANDS)} --hf_path=DIR "
                      f"--workdir=W (got {argv[1:]}).")
  if not FLAGS.hf_path or not FLAGS.workdir:
    raise ConfigError("pass both --hf_path and --workdir.")
  if argv[1] == "import":
    m = hf.import_to_workdir(FLAGS.hf_path, FLAGS.workdir, FLAGS.generator_path)
    fresh = f"; freshly initialised: {', '.join(m.fresh)}" if m.fresh else ""
    task = m.notes.get("task_head_left_out")
    left_out = f" (the encoder of {task}, its task head left out)" if task else ""
    return (f"Imported {m.architecture}{left_out} from {FLAGS.hf_path} into "
            f"{FLAGS.workdir}{fresh}.")
  if FLAGS.generator_path:
    raise ConfigError("--generator_path is for import; export writes an ELECTRA generator to "
                      "HF_PATH/generator itself.")
  m = hf.export_workdir(FLAGS.workdir, FLAGS.hf_path)
  return f"Exported {FLAGS.workdir} as {m.architecture} to {FLAGS.hf_path}."


def main(argv):
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint phase at INFO
  try:
    print(run(argv))
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  app.run(main)
