"""experiments/runlocal_check.py: a quick-start run passes only when it beats every trivial
baseline of its family (the unigram predictor; ELECTRA's detector base rate), and every family's
runlocal config loads."""

import os
import sys

import numpy as np
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


@pytest.mark.parametrize("family, prefix", [("t5", "t5"), ("mass", "t5"), ("xlnet", "plm")])
def test_t5_mass_and_xlnet_are_checked_on_their_own_targets(family, prefix):
  rows = runlocal_check.comparisons(family, {f"{prefix}_accuracy": 0.3, f"{prefix}_loss": 4.0},
                                    UNIGRAM)
  assert [(name, beats) for name, _, _, beats in rows] == [(f"{prefix}_accuracy", True),
                                                           (f"{prefix}_loss", True)]


@pytest.mark.parametrize("family", runlocal_check.FAMILIES)
def test_every_family_has_a_runlocal_config(family):
  config = runlocal_check.family_config(family)
  assert config.data.source == "embedded_wiki" and config.train.total_steps > 0


@pytest.mark.parametrize("family", ["t5", "mass", "xlnet"])
def test_the_unigram_baseline_reads_each_objectives_targets(family):
  """The baseline counts T5's and MASS's decoder targets and XLNet's permutation targets: a
  most-frequent
  token that is right on some of them, and a cross-entropy between 0 and log(vocabulary)."""
  import math  # pylint: disable=import-outside-toplevel
  from experiments.unigram_baseline import unigram_baseline  # pylint: disable=import-outside-toplevel
  config = runlocal_check.family_config(family)
  config.train.update(batch_size=4, eval_batches=2)
  baseline = unigram_baseline(config, train_batches=3)
  assert baseline["eval_predictions"] > 20
  assert 0 < baseline["unigram_accuracy"] < 0.5
  assert 1 < baseline["unigram_cross_entropy"] < math.log(config.model.vocab_size) + 1


def test_elmos_baseline_counts_both_directions_targets():
  """ELMo's targets are each direction's (`elmo.shifted_targets`): `<S> a b </S> <S> c </S>`
  gives forward a b </S> c </S> and backward <S> a b <S> c, none of the certain boundaries."""
  from bertfam_jax.models import elmo as elmo_model  # pylint: disable=import-outside-toplevel
  from experiments.unigram_baseline import prediction_targets  # pylint: disable=import-outside-toplevel
  bos, eos, a, b, c = 2, 3, 5, 6, 7
  words = np.array([[bos, a, b, eos, bos, c, eos, 0]])
  codes = np.full((1, 8, 4), elmo_model.PAD_CHAR)
  codes[0, [0, 4], 1], codes[0, [3, 6], 1] = elmo_model.BOS_CHAR, elmo_model.EOS_CHAR
  batch = dict(word_ids=words, input_mask=(np.arange(8) < 7).astype(np.int32)[None],
               char_ids=codes)
  np.testing.assert_array_equal(prediction_targets("elmo", batch),
                                [a, b, eos, c, eos, bos, a, b, bos, c])
