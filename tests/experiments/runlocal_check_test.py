"""experiments/runlocal_check.py: a quick-start run passes only when it beats every trivial
baseline of its family (the unigram predictor; ELECTRA's detector base rate), and every family's
runlocal config loads."""

import os
import sys

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:  # the repository's experiments/, not this tests/experiments/
  sys.path.insert(0, _ROOT)

from experiments import runlocal_check  # noqa: E402

UNIGRAM = dict(unigram_accuracy=0.04, unigram_cross_entropy=6.5, eval_predictions=100)


def test_an_mlm_run_must_beat_the_unigram_on_both_metrics():
  learned = runlocal_check.comparisons("bert", dict(mlm_accuracy=0.2, mlm_loss=5.0), UNIGRAM)
  assert [beats for *_, beats in learned] == [True, True]
  plateau = runlocal_check.comparisons("bert", dict(mlm_accuracy=0.04, mlm_loss=6.6), UNIGRAM)
  assert [beats for *_, beats in plateau] == [False, False]
  assert "**no**" in runlocal_check.markdown([dict(family="bert", steps=2000, metrics={
      m: dict(model=v, baseline=b, beats=beats) for m, v, b, beats in plateau})])


def test_an_electra_discriminator_must_beat_its_base_rate():
  final = dict(generator_mlm_accuracy=0.2, generator_mlm_loss=5.0, replaced_share=0.13)
  collapsed = runlocal_check.comparisons("electra", dict(final, discriminator_accuracy=0.87),
                                         UNIGRAM)
  assert collapsed[-1][0] == "discriminator_accuracy"
  assert collapsed[-1][2] == pytest.approx(0.87) and not collapsed[-1][3]
  learned = runlocal_check.comparisons("electra", dict(final, discriminator_accuracy=0.93),
                                       UNIGRAM)
  assert learned[-1][3]


@pytest.mark.parametrize("family", runlocal_check.FAMILIES)
def test_every_family_has_a_runlocal_config(family):
  config = runlocal_check.family_config(family)
  assert config.data.source == "embedded_wiki" and config.train.total_steps > 0
