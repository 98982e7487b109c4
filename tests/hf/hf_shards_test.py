"""HF import reads a checkpoint's weights from inside its directory only: a shard index naming
an absolute or `../` path, or a weights file that is a symlink out of the directory, is refused
naming the file (`hf.io._weight_files`, before any file is opened)."""

import json
import os

import pytest

pytest.importorskip("safetensors")

from bertfam_jax.config_lib import ConfigError  # noqa: E402
from bertfam_jax.hf import io as hf_io  # noqa: E402


def checkpoint(tmp_path, shards):
  directory = tmp_path / "checkpoint"
  directory.mkdir()
  (directory / "model.safetensors.index.json").write_text(json.dumps(dict(
      weight_map={f"w{i}": shard for i, shard in enumerate(shards)})))
  return str(directory)


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd",
                                   "sub/../../outside.safetensors"])
def test_a_shard_outside_the_directory_is_refused(tmp_path, shard):
  (tmp_path / "outside.safetensors").write_bytes(b"")
  directory = checkpoint(tmp_path, ["model-00001.safetensors", shard])
  with pytest.raises(ConfigError, match=f"index.json names the weights file {shard!r}.*outside"):
    hf_io.read_state_dict(directory)


def test_a_symlink_out_of_the_directory_is_refused(tmp_path):
  (tmp_path / "elsewhere.safetensors").write_bytes(b"")
  directory = checkpoint(tmp_path, ["model-00001.safetensors"])
  os.symlink(tmp_path / "elsewhere.safetensors", os.path.join(directory, "model-00001.safetensors"))
  with pytest.raises(ConfigError, match="model-00001.safetensors.*outside"):
    hf_io.read_state_dict(directory)
  os.remove(os.path.join(directory, "model.safetensors.index.json"))
  os.rename(os.path.join(directory, "model-00001.safetensors"),
            os.path.join(directory, "model.safetensors"))
  with pytest.raises(ConfigError, match="names the weights file 'model.safetensors'.*outside"):
    hf_io.read_state_dict(directory)


def test_shards_inside_are_read(tmp_path):
  directory = checkpoint(tmp_path, ["model-00001.safetensors", "sub/model-00002.safetensors"])
  assert hf_io._weight_files(directory) == (  # pylint: disable=protected-access
      "model.safetensors", [os.path.realpath(os.path.join(directory, name)) for name in
                            ("model-00001.safetensors", "sub/model-00002.safetensors")])
