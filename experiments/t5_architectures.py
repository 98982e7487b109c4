"""The T5 paper's comparison of architectures (Raffel et al. 2020 §3.2, Table 2): encoder-decoder,
encoder-decoder with shared parameters, encoder-decoder of half the depth, a decoder-only language
model and a prefix LM, each pre-trained with the denoising objective (the ★ i.i.d. span
corruption) and with the LM objective (a random prefix predicting the rest), then fine-tuned
text-to-text and scored as experiments/t5_objectives.py does (its tasks, scales, fine-tuning
and report; only the rows differ).

The paper compares the rows at its own cost units: an L + L-layer encoder-decoder has 2P
parameters and costs M FLOPs per example; sharing its layers keeps M at P parameters; halving
both stacks gives P parameters at M/2; a decoder-only model of L layers over inputs + targets has
P parameters and costs about M (tested: `cost`; the units count the layers: the output layer's
FLOPs, 6·d·V per predicted token and for a decoder-only model per input token too, are a large
share at small scales, so there half the depth costs ~0.65 M and a decoder-only row ~1.4 M). At
the `cpu` scale L = 2 (t5_objectives' mini T5), so "6 layers" (the paper's half of 12) is one
layer per stack.

  # The denoising half and the floor × 3 seeds on a 2-core CPU (2 h 50 min in all on a CPU
  # shared with other jobs, 1-24 min per run, the prefix LM the longest: its decoding then
  # recomputed the row at every step, since cached; experiments/results/t5_architectures/cpu):
  python -m experiments.t5_architectures --scale=cpu
  # The LM-objective half × 3 seeds (about 1 h 30 min on the same CPU):
  python -m experiments.t5_architectures --scale=cpu --seeds=0,1,2 --rows="Encoder-decoder · LM,\
Enc-dec (shared) · LM,Enc-dec (6 layers) · LM,Language model · LM,Prefix LM · LM"
  # Every row, one seed, on its own machine:
  python -m experiments.t5_architectures --scale=gpu --rows="Prefix LM · LM" --seeds=0

Paper columns: Table 2's validation scores (checked against an HTML rendering of
arXiv:1910.10683, §3.2.4), the floor's from Table 1, printed beside ours with the rows' cost units.
"""

from __future__ import annotations

import os

from absl import app, flags

from bertfam_jax import flops, objectives
from bertfam_jax.models import t5 as t5_model
from experiments import common, report
from experiments import t5_objectives as t5o

NO_PRETRAINING = common.NO_PRETRAINING
OBJECTIVES = {"Denoising": dict(t5o.ROWS)[t5o.BASELINE],
              "LM": dict(t5o.ROWS)["Prefix language modeling"]}
# Table 2's architectures: (name, the paper's parameters and cost, model overrides from the
# scale's encoder-decoder config `m`). The paper's "Enc-dec, shared" and "Enc-dec, 6 layers" are
# written without commas: --rows is a comma-separated list.
ARCHITECTURES = (
    ("Encoder-decoder", "2P, M", lambda m: {}),
    ("Enc-dec (shared)", "P, M", lambda m: dict(share_encoder_decoder=True)),
    ("Enc-dec (6 layers)", "P, M/2", lambda m: dict(layers=max(1, m.layers // 2),
                                                   decoder_layers=max(1, m.decoder_layers // 2))),
    ("Language model", "P, M", lambda m: dict(architecture="decoder_only",
                                              decoder_layers=m.layers)),
    ("Prefix LM", "P, M", lambda m: dict(architecture="prefix_lm", decoder_layers=m.layers)),
)
BASELINE = "Encoder-decoder · Denoising"
ROWS = [(f"{arch} · {objective}", dict(architecture=arch, objective=objective))
        for objective in OBJECTIVES for arch, _, _ in ARCHITECTURES] + [(NO_PRETRAINING, None)]
_NAMES = [name for name, _ in ROWS]
TABLE_GROUPS = (
    ("Table 2: denoising objective", _NAMES[:5]),
    ("Table 2: LM objective", _NAMES[5:10]),
    ("Floor", _NAMES[10:]),
)
COST = {arch: cost for arch, cost, _ in ARCHITECTURES}

# The paper's validation scores, Table 2 (row names ours; the floor: Table 1's "No pre-training").
PAPER = {
    "Encoder-decoder · Denoising": (83.28, 19.24, 80.88, 71.36, 26.98, 39.82, 27.65),
    "Enc-dec (shared) · Denoising": (82.81, 18.78, 80.63, 70.73, 26.72, 39.03, 27.46),
    "Enc-dec (6 layers) · Denoising": (80.88, 18.97, 77.59, 68.42, 26.38, 38.40, 26.95),
    "Language model · Denoising": (74.70, 17.93, 61.14, 55.02, 25.09, 35.28, 25.86),
    "Prefix LM · Denoising": (81.82, 18.61, 78.94, 68.11, 26.43, 37.98, 27.39),
    "Encoder-decoder · LM": (79.56, 18.59, 76.02, 64.29, 26.27, 39.17, 26.86),
    "Enc-dec (shared) · LM": (79.60, 18.13, 76.35, 63.50, 26.62, 39.17, 27.05),
    "Enc-dec (6 layers) · LM": (78.67, 18.26, 75.32, 64.06, 26.13, 38.42, 26.89),
    "Language model · LM": (73.78, 17.54, 53.81, 56.51, 25.23, 34.31, 25.38),
    "Prefix LM · LM": (79.68, 17.84, 76.87, 64.86, 26.28, 37.51, 26.76),
    NO_PRETRAINING: t5o.PAPER[NO_PRETRAINING],
}

# The scales are t5_objectives' (the same model, data, steps and fine-tuning); `rows`: what a
# scale runs by default (the cpu scale: the denoising half and the floor).
SCALES = {
    "cpu": dict(t5o.SCALES["cpu"], rows=_NAMES[:5] + [NO_PRETRAINING]),
    "gpu": dict(t5o.SCALES["gpu"], rows=_NAMES),
    "paper": dict(t5o.SCALES["paper"], rows=_NAMES),
}


def define_flags() -> None:
  common.define_sweep_flags("t5_architectures", ROWS, SCALES)


def pretrain_config(scale: dict, spec: dict, seed: int):
  """t5_objectives' config of the row's objective at the scale, with the row's architecture."""
  config = t5o.pretrain_config(scale, OBJECTIVES[spec["objective"]], seed)
  overrides = dict(ARCHITECTURES_BY_NAME[spec["architecture"]](config.model))
  config.model.update(overrides)
  objectives.validate(config)
  t5_model.validate(config.model)
  return config


ARCHITECTURES_BY_NAME = {name: make for name, _, make in ARCHITECTURES}


def cost(config) -> tuple[int, float]:
  """(parameters without the token embedding, training FLOPs per example) of a row's config:
  the paper's P and M units (embeddings are not part of its accounting)."""
  m, o = config.model, config.objective
  a = m.heads * m.head_dim
  k = 3 if m.gated_mlp else 2
  attention, mlp = 4 * m.hidden * a, k * m.hidden * m.mlp
  if m.architecture == "encoder_decoder":
    decoder_layer = 2 * attention + mlp          # self-attention, cross-attention, MLP
    stacks = m.decoder_layers * decoder_layer
    params = stacks if m.share_encoder_decoder else stacks + m.layers * (attention + mlp)
    per_token = flops.t5_train_flops_per_input_token(m, config.data.seq_len, o.targets_length)
  else:
    params = m.decoder_layers * (attention + mlp)
    per_token = flops.decoder_only_train_flops_per_input_token(m, config.data.seq_len,
                                                               o.targets_length)
  return params, per_token * config.data.seq_len


def run_row(name: str, spec: dict | None, seed: int, scale: dict, workdirs: str) -> dict:
  return t5o.run_row(name, spec, seed, scale, workdirs, make_config=pretrain_config,
                     floor_spec=dict(ROWS)[BASELINE])


COMPARISON = report.Comparison(
    title="T5 architecture comparison",
    rows=_NAMES, baseline=BASELINE, floor=NO_PRETRAINING, groups=TABLE_GROUPS,
    columns=t5o.COMPARISON.columns, primary_key=t5o.PRIMARY,
    paper={name: dict(zip(t5o.PAPER_COLUMNS, values)) for name, values in PAPER.items()},
    paper_columns=t5o.PAPER_COLUMNS,
    paper_source="Raffel et al. 2020, validation scores of Table 2 (the floor from Table 1; "
                 "checked against an HTML rendering of arXiv:1910.10683). Ours stand in: "
                 "Supersense for GLUE, Definition QA for SQuAD, Define for CNNDM. The rows' "
                 "costs in the paper's units: " + "; ".join(
                     f"{arch} {units}" for arch, units, _ in ARCHITECTURES))


def write_summary(results: list[dict], out: str, scale_name: str) -> str:
  scale = SCALES[scale_name]
  return report.write(results, COMPARISON, out, setup=t5o.setup_text(scale_name, scale),
                      constants=t5o.constant_scores(scale), scale=scale)


def main(argv):
  del argv
  f = flags.FLAGS
  scale = dict(SCALES[f.scale], name=f.scale, config_overrides=f.config_overrides)
  selected = f.rows if f["rows"].present else scale["rows"]
  common.check_rows(selected, ROWS, lambda spec: pretrain_config(scale, spec, 0))
  out, workdirs = common.sweep_dirs("t5_architectures")
  results = common.run_sweep(
      ROWS, selected, list(map(int, f.seeds)), os.path.join(out, "results.jsonl"),
      lambda name, spec, seed: run_row(name, spec, seed, scale, workdirs))
  print(write_summary(results, out, f.scale))


if __name__ == "__main__":
  define_flags()
  app.run(main)
