r"""Does each paper's quick-start recipe learn? `configs/<family>.py:runlocal` trained to its end,
then its last held-out evaluation against the trivial baseline on the same held-out batches:

  MLM families (bert, roberta, albert, spanbert, structbert, unilm), ELECTRA's generator, T5 (span
    corruption's decoder targets), MASS (its fragment, the decoder's targets), XLNet (its permutation LM's targets), GPT (every next token)
    and ELMo (each direction's next word): eval accuracy and cross-entropy against the unigram
    predictor (`unigram_baseline`:
    the most frequent target, and the unigram distribution of the training batches' targets);
  ELECTRA's discriminator: eval accuracy against the base rate, 1 − the replaced share (a
    detector that always says 'original').

A row passes when the model beats every baseline of its family; a row at its baseline has
collapsed (post-LN warmup, too small a discriminator). A finished workdir is read, not retrained.

  python -m experiments.runlocal_check --families=bert,electra --workdirs=/tmp/runlocal_check

Writes results.jsonl (one record per family) and table.md to --out.
"""

from __future__ import annotations

import json
import os
import time

from absl import app, flags

from bertfam_jax import config_lib
from bertfam_jax.train import train
from experiments import common
from experiments.unigram_baseline import unigram_baseline

FAMILIES = ("bert", "roberta", "albert", "spanbert", "structbert", "electra", "t5", "xlnet",
            "gpt", "unilm", "elmo", "mass")
# The held-out metrics' prefixes per family: {prefix}_accuracy and {prefix}_loss.
METRIC_PREFIXES = {"electra": ("generator_mlm",), "t5": ("t5",), "mass": ("t5",),
                   "xlnet": ("plm",), "gpt": ("lm",), "elmo": ("forward", "backward")}
_FAMILIES = flags.DEFINE_list("families", list(FAMILIES), f"Of {FAMILIES}.")
_WORKDIRS = flags.DEFINE_string("workdirs", "/tmp/runlocal_check", "Where the runs train.")
_OUT = flags.DEFINE_string("out", "experiments/results/runlocal_check", "Results folder.")
_TRAIN_BATCHES = flags.DEFINE_integer("train_batches", 200, "Batches the unigram counts read.")
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def family_config(family: str):
  """`configs/<family>.py:runlocal`."""
  return config_lib.load_config(os.path.join(_REPO, "configs", f"{family}.py"), "runlocal")


def comparisons(family: str, final: dict[str, float], baseline: dict[str, float]
                ) -> list[tuple[str, float, float, bool]]:
  """(metric, model, baseline, model beats baseline) of one run's final held-out evaluation."""
  rows = []
  for prefix in METRIC_PREFIXES.get(family, ("mlm",)):
    rows += [(f"{prefix}_accuracy", final[f"{prefix}_accuracy"], baseline["unigram_accuracy"],
              final[f"{prefix}_accuracy"] > baseline["unigram_accuracy"]),
             (f"{prefix}_loss", final[f"{prefix}_loss"], baseline["unigram_cross_entropy"],
              final[f"{prefix}_loss"] < baseline["unigram_cross_entropy"])]
  if family == "electra":
    base_rate = 1 - final["replaced_share"]
    rows.append(("discriminator_accuracy", final["discriminator_accuracy"], base_rate,
                 final["discriminator_accuracy"] > base_rate))
  return rows


def check(family: str, workdir: str, train_batches: int) -> dict:
  """Trains (or reads) `family`'s runlocal run in `workdir`; returns its record."""
  config = family_config(family)
  start = time.time()
  train.run(config, workdir)
  seconds = time.time() - start
  final = common.final_eval_metrics(workdir)
  baseline = unigram_baseline(config, train_batches)
  rows = comparisons(family, final, baseline)
  return dict(family=family, steps=config.train.total_steps, seconds=round(seconds),
              learns=all(beats for *_, beats in rows),
              metrics={m: dict(model=v, baseline=b, beats=beats) for m, v, b, beats in rows},
              eval_predictions=baseline["eval_predictions"], commit=common.commit())


def markdown(records: list[dict]) -> str:
  lines = ["| family | steps | metric | held-out | trivial baseline | beats it |",
           "|---|---|---|---|---|---|"]
  for r in records:
    for metric, m in r["metrics"].items():
      lines.append(f"| {r['family']} | {r['steps']} | {metric} | {m['model']:.4f} | "
                   f"{m['baseline']:.4f} | {'yes' if m['beats'] else '**no**'} |")
  return "\n".join(lines) + "\n"


def main(argv):
  del argv
  unknown = sorted(set(_FAMILIES.value) - set(FAMILIES))
  if unknown:
    raise app.UsageError(f"--families: {unknown} are not among {FAMILIES}.")
  os.makedirs(_OUT.value, exist_ok=True)
  path = os.path.join(_OUT.value, "results.jsonl")
  records = {r["family"]: r for r in common.read_results(path)} if os.path.exists(path) else {}
  for family in _FAMILIES.value:
    records[family] = check(family, os.path.join(_WORKDIRS.value, family), _TRAIN_BATCHES.value)
    with open(path, "w") as f:
      for record in records.values():
        f.write(json.dumps(record) + "\n")
    print(markdown([records[family]]), flush=True)
  with open(os.path.join(_OUT.value, "table.md"), "w") as f:
    f.write(markdown(list(records.values())))


if __name__ == "__main__":
  app.run(main)
