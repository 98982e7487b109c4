"""metrics.jsonl on resume: later records dropped, a last line cut short by a kill repaired with
a warning, a damaged line before it refused naming the file and line."""

import json

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
