"""A run whose workdir and data are in Cloud Storage (gs://), against a local GCS emulator
(gcp-storage-emulator, in memory): every path of ours goes through `fileio` and etils.epath →
gcsfs, the checkpoints through orbax → tensorstore's gcs driver, the TensorBoard events through
tensorboardX → google-cloud-storage, all pointed at the emulator (`helpers.gcs_emulator`).

Pre-trained on gs://, the run equals the same run on a local disk, loss for loss; killed after its
step-4 checkpoint (the step-8 checkpoint never finished) and resumed, steps 5..8 are the same
again and metrics.jsonl holds each step once; then exported from gs:// to gs://, byte for byte
the local export."""

import os

import numpy as np
import pytest
from etils import epath

from bertfam_jax import fileio
from bertfam_jax import workdir as workdir_lib
from bertfam_jax.config_lib import ConfigError
from bertfam_jax.train import metrics as metrics_lib
from bertfam_jax.train import train
from helpers import gcs_emulator
from train_test import tiny_config  # pylint: disable=g-bad-import-order

BUCKET = "bertfam-test"


@pytest.fixture(scope="module")
def gcs():
  with gcs_emulator.serve(BUCKET) as root:
    yield root


def _losses(records):
  return {r["step"]: r["loss"] for r in records if "loss" in r}


def test_pretrain_kill_resume_and_export_on_gs(gcs, tmp_path):
  # The data too: the embedded corpus as a text file in the bucket.
  local_text = tmp_path / "corpus.txt"
  from bertfam_jax.data import sources  # pylint: disable=g-import-not-at-top
  config = tiny_config()
  documents = sources.embedded_wiki(sources.cache_root(config.data))[:40]
  local_text.write_text("\n\n".join(documents) + "\n")
  epath.Path(f"{gcs}/data/corpus.txt").write_bytes(local_text.read_bytes())

  def config_for(text_files):
    c = tiny_config(checkpoint_every=4)
    c.data.update(source="text", text_files=text_files, text_format="blank_lines")
    return c

  local = str(tmp_path / "local")
  train.run(config_for(str(local_text)), local)
  remote = f"{gcs}/runs/tiny"
  train.run(config_for(f"{gcs}/data/*.txt"), remote)

  reference = _losses(metrics_lib.read_records(local))
  assert sorted(reference) == list(range(1, 9))
  assert _losses(metrics_lib.read_records(remote)) == reference
  assert fileio.listdir(f"{remote}/checkpoints") == ["4", "8"]
  assert any(name.startswith("events.out.tfevents")
             for name in fileio.listdir(f"{remote}/tensorboard"))
  # Records went to parts (an object store has no append), one object per start.
  assert [n for n in fileio.listdir(remote) if n.startswith("metrics")] == [
      "metrics.jsonl.part-00000"]

  # Killed after the step-4 checkpoint: the step-8 one never completed.
  fileio.rmtree(f"{remote}/checkpoints/8")
  assert workdir_lib.latest_step(remote) == 4
  train.run(config_for(f"{gcs}/data/*.txt"), remote)
  records = metrics_lib.read_records(remote)
  assert _losses(records) == reference
  assert [r["step"] for r in records if "loss" in r] == list(range(1, 9))  # each step once
  assert fileio.exists(f"{remote}/metrics.jsonl")   # the first start's records, folded

  from bertfam_jax.hf import workdir as hf_workdir  # pylint: disable=g-import-not-at-top
  hf_workdir.export_workdir(local, str(tmp_path / "export"))
  hf_workdir.export_workdir(remote, f"{gcs}/export")
  names = sorted(os.listdir(tmp_path / "export"))
  assert fileio.listdir(f"{gcs}/export") == names
  for name in names:
    assert fileio.read_bytes(f"{gcs}/export/{name}") == (tmp_path / "export" / name).read_bytes()
  # And read back from gs:// as a transformers checkpoint (import, finetune.init).
  from bertfam_jax.hf import io as hf_io  # pylint: disable=g-import-not-at-top
  remote_state = hf_io.read_state_dict(f"{gcs}/export")
  local_state = hf_io.read_state_dict(str(tmp_path / "export"))
  assert sorted(remote_state) == sorted(local_state) and len(local_state) > 10
  for name, value in local_state.items():
    np.testing.assert_array_equal(remote_state[name], value)


def test_an_unwritable_bucket_is_one_line_before_anything_runs(gcs):
  with pytest.raises(ConfigError, match=r"--workdir=gs://no-such-bucket-here/run cannot be "
                                        r"written .*check the bucket"):
    workdir_lib.check_writable("gs://no-such-bucket-here/run")
  workdir_lib.check_writable(f"{gcs}/writable")   # the probe is removed again
  assert not fileio.exists(f"{gcs}/writable")


def test_metrics_parts_roll_over_fold_and_never_count_twice(gcs, monkeypatch):
  monkeypatch.setattr(metrics_lib, "PART_RECORDS", 3)
  monkeypatch.setattr(metrics_lib, "UPLOAD_SECONDS", 0.0)
  path = f"{gcs}/parts/metrics.jsonl"
  writer = metrics_lib.JsonlWriter(path)
  for step in range(1, 8):
    writer.write(step, {"loss": float(step)})
  writer.close()
  names = [n for n in fileio.listdir(f"{gcs}/parts")]
  assert names == [f"metrics.jsonl.part-0000{i}" for i in range(3)]
  assert [r["step"] for r in metrics_lib.read_records(f"{gcs}/parts")] == list(range(1, 8))
  # The next start (restored at step 5) folds them; a stale part left by a fold that died before
  # removing it adds nothing.
  stale = fileio.read_bytes(f"{path}.part-00000")
  metrics_lib._truncate_after(path, 5)  # pylint: disable=protected-access
  assert fileio.listdir(f"{gcs}/parts") == ["metrics.jsonl"]
  fileio.write_atomically(f"{path}.part-00000", stale)
  assert [r["step"] for r in metrics_lib.read_records(f"{gcs}/parts")] == [1, 2, 3, 4, 5]
