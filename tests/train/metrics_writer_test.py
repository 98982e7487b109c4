"""metrics.jsonl on resume: later records dropped, a last line cut short by a kill repaired with
a warning, a damaged line before it refused naming the file and line."""

import json
import time

import pytest

from bertfam_jax.config_lib import ConfigError
from bertfam_jax.train import metrics


def write(path, text):
  path.write_text(text)
  return path


RECORDS = "".join(json.dumps(dict(step=s, loss=1.0 / s)) + "\n" for s in (1, 2, 3))


def test_a_resume_keeps_the_records_up_to_its_step_and_drops_a_torn_last_line(tmp_path):
  write(tmp_path / "metrics.jsonl", RECORDS + '{"step": 4, "lo')
  writer = metrics.MetricsWriter(str(tmp_path), resume_step=2)
  writer.write(3, dict(loss=0.5))
  writer.close()
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == [1, 2, 3] and records[-1]["loss"] == 0.5


def test_a_damaged_line_before_the_last_is_refused(tmp_path):
  lines = RECORDS.splitlines(keepends=True)
  write(tmp_path / "metrics.jsonl", lines[0] + "\n" + "garbage\n" + "".join(lines[1:]))
  before = (tmp_path / "metrics.jsonl").read_text()
  with pytest.raises(ConfigError, match=r"metrics.jsonl line 3 is not a JSON record"):
    metrics.MetricsWriter(str(tmp_path), resume_step=2)
  assert (tmp_path / "metrics.jsonl").read_text() == before


def test_writers_and_profile_steps_are_checked():
  from bertfam_jax import config_lib  # pylint: disable=import-outside-toplevel
  assert config_lib.parse_metric_writers(" tensorboard , wandb") == ("tensorboard", "wandb")
  assert config_lib.parse_metric_writers("") == ()
  with pytest.raises(ConfigError, match=r"train.metric_writers='tb': unknown \['tb'\]"):
    config_lib.parse_metric_writers("tb")
  assert config_lib.parse_profile_steps("") is None
  assert config_lib.parse_profile_steps("10:15") == (10, 15)
  for bad in ("5:5", "7", "a:b", "-1:3"):
    with pytest.raises(ConfigError, match="train.profile_steps="):
      config_lib.parse_profile_steps(bad)
  config = config_lib.base_config()
  config.train.wandb_mode = "cloud"
  with pytest.raises(ConfigError, match="train.wandb_mode"):
    config_lib.validate(config)


def test_wandb_missing_is_one_line(monkeypatch):
  from bertfam_jax import config_lib  # pylint: disable=import-outside-toplevel
  real = config_lib.importlib.util.find_spec
  monkeypatch.setattr(config_lib.importlib.util, "find_spec",
                      lambda name, *a: None if name == "wandb" else real(name, *a))
  with pytest.raises(ConfigError, match=r"pip install 'bertfam_jax\[wandb\]'"):
    config_lib.parse_metric_writers("tensorboard,wandb")


def _offline_records(path, expected: bytes, timeout_s: float = 30.0) -> bytes:
  """The bytes of a W&B offline run file once they hold `expected`: W&B's service process may
  still be writing the file after `finish()` returns (seen once in CI: its 9-byte header only)."""
  deadline = time.monotonic() + timeout_s
  while expected not in path.read_bytes() and time.monotonic() < deadline:
    time.sleep(0.2)
  return path.read_bytes()


def test_wandb_offline_run_records_and_resumes_the_same_run(tmp_path):
  """The W&B writer in offline mode: the run's files hold the logged names and values, a
  resumed writer continues the same run id, and metrics.jsonl is written beside it."""
  from bertfam_jax import config_lib  # pylint: disable=import-outside-toplevel
  config = config_lib.base_config()
  config.train.metric_writers = "wandb"
  writer = metrics.MetricsWriter(str(tmp_path), resume_step=None, config=config)
  writer.write(1, dict(loss=2.5, grad_norm=float("nan")))
  writer.write(2, dict(mlm_accuracy=0.125), prefix="eval_")
  writer.close()
  run_id = json.loads((tmp_path / metrics.WANDB_RUN_FILE).read_text())["id"]
  runs = sorted((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))
  assert len(runs) == 1
  data = _offline_records(runs[0] / f"run-{run_id}.wandb", b"eval_mlm_accuracy")
  assert b"eval_mlm_accuracy" in data and b"0.125" in data and b"2.5" in data
  assert b"grad_norm" not in data            # a non-finite value is left out, not logged as NaN
  assert not (tmp_path / "tensorboard").exists()
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert records == [dict(step=1, loss=2.5, grad_norm=None), dict(step=2, eval_mlm_accuracy=0.125)]
  time.sleep(1.1)   # W&B names run directories by the second
  resumed = metrics.MetricsWriter(str(tmp_path), resume_step=2, config=config)
  resumed.write(3, dict(loss=2.75))
  resumed.close()
  runs = sorted((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))
  assert len(runs) == 2 and b"2.75" in _offline_records(runs[1] / f"run-{run_id}.wandb", b"2.75")
  # A writer that records nothing (a re-run of a finished workdir) starts no W&B run.
  metrics.MetricsWriter(str(tmp_path), resume_step=3, config=config).close()
  assert len(sorted((tmp_path / "wandb").glob("offline-run-*"))) == 2


def test_wandb_online_without_a_login_is_one_line(tmp_path, monkeypatch):
  from bertfam_jax import config_lib  # pylint: disable=import-outside-toplevel
  monkeypatch.delenv("WANDB_API_KEY", raising=False)
  monkeypatch.setenv("HOME", str(tmp_path))
  config = config_lib.base_config()
  config.train.update(metric_writers="wandb", wandb_mode="online")
  with pytest.raises(ConfigError, match=r"wandb_mode=online needs a W&B login"):
    metrics.MetricsWriter(str(tmp_path), resume_step=None, config=config)
