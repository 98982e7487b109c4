"""experiments/common.py's command-line checks and config_lib.apply_overrides, which every sweep
row and benchmark row goes through: a bad override stops the sweep before any row runs, with
one message that names the field; and the constant output's log-likelihood."""

import os
import sys

import numpy as np
import pytest
from absl import app

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:  # the repository's experiments/, not this tests/experiments/
  sys.path.insert(0, _ROOT)

from bertfam_jax import config_lib  # noqa: E402
from experiments import common, masking_schemes  # noqa: E402


def test_overrides_cast_to_the_fields_type():
  config = config_lib.base_config()
  config_lib.apply_overrides(config, ["model.dtype=bfloat16", "train.batch_size=64",
                                      "model.dropout=0", "model.scan_layers=true"])
  assert (config.model.dtype, config.train.batch_size) == ("bfloat16", 64)
  assert config.model.dropout == 0.0 and config.model.scan_layers is True


@pytest.mark.parametrize("item, message", [
    ("model.bogus=1", "no field 'model.bogus'"),
    ("nosection.dtype=1", "no field 'nosection.dtype'"),
    ("model.dtype", "has no value: write model.dtype=VALUE"),
    ("train.batch_size=lots", "train.batch_size is a int, and 'lots' is not one"),
])
def test_bad_overrides_name_the_field(item, message):
  with pytest.raises(config_lib.ConfigError, match=message):
    config_lib.apply_overrides(config_lib.base_config(), [item])


def test_a_bad_override_stops_the_sweep_before_any_row():
  scale = dict(masking_schemes.SCALES["cpu"], config_overrides=["model.bogus=1"])
  with pytest.raises(app.UsageError, match="row 'Whole Words': override 'model.bogus=1'"):
    common.check_rows(["Whole Words"], masking_schemes.ROWS,
                      lambda spec: masking_schemes.pretrain_config(scale, spec, 0))
  with pytest.raises(app.UsageError, match="Unknown rows"):
    common.check_rows(["Whole Word"], masking_schemes.ROWS, lambda spec: None)
  common.check_rows([common.NO_PRETRAINING], masking_schemes.ROWS, lambda spec: 1 / 0)  # no config


def test_unigram_nll_weighs_examples_equally_under_add_one_frequencies():
  # Training tokens 1, 1, 2 over 4 ids: add-one frequencies (1, 3, 2, 1) / 7.
  p = np.array([1, 3, 2, 1]) / 7
  expected = np.mean([-np.log(p[1]), np.mean([-np.log(p[2]), -np.log(p[3])])])
  assert common.unigram_nll([[1, 1], [2]], [[1], [2, 3]], 4) == pytest.approx(expected)
  # Not the token-weighted mean (each example weighs the same, as a row's target_nll).
  assert common.unigram_nll([[1, 1], [2]], [[1], [2, 3]], 4) != pytest.approx(
      -np.log(p[[1, 2, 3]]).mean())
