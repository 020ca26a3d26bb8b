"""`convert audio8 --model-dir` on a damaged snapshot: one line naming the file, exit 2, no traceback (issue #14).
The checks run before transformers reads anything (`model.check_snapshot_files`)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from rkaudio.families.audio8.model import check_snapshot_files
from rkaudio.core.errors import SetupError
from rkaudio.core.paths import REPO_ROOT

CONFIG = {"model_type": "arkasr", "auto_map": {"AutoModel": "modeling_arkasr.ArkasrForConditionalGeneration"}}


def _weights() -> dict:
    return {"decoder.lm_head.weight": torch.randn(64, 32), "encoder.conv2d1.weight": torch.randn(8, 1, 3, 3)}


def _snapshot(tmp_path, weights: str = "safetensors", config: bytes | None = None):
    """A snapshot directory: config.json (or `config` bytes) and one weight file of `weights` format."""
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    (snapshot / "config.json").write_bytes(config if config is not None else json.dumps(CONFIG).encode())
    if weights == "safetensors":
        from safetensors.torch import save_file

        path = snapshot / "model.safetensors"
        save_file(_weights(), str(path))
    else:
        path = snapshot / f"pytorch_model.{weights}"
        torch.save(_weights(), str(path))
    return snapshot, path


def _truncate(path, keep: float = 0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])  # an interrupted download


def convert_audio8(snapshot, out) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rkaudio.cli", "audio8", "--model-dir", str(snapshot),
                           "--skip-rknn", "--out", str(out)], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=300)




@pytest.mark.parametrize("weights", ["safetensors", "bin"])
def test_truncated_weights_are_refused_in_one_line(tmp_path, weights, refused_in_one_line):
    snapshot, path = _snapshot(tmp_path, weights)
    _truncate(path)
    line = refused_in_one_line(convert_audio8(snapshot, tmp_path / "out"), path)
    assert "is not a readable checkpoint file" in line and "truncated download" in line
    assert not (tmp_path / "out").exists()


def test_config_that_is_not_json_is_refused_in_one_line(tmp_path, refused_in_one_line):
    snapshot, _ = _snapshot(tmp_path, config=json.dumps(CONFIG).encode()[:25])  # cut short
    line = refused_in_one_line(convert_audio8(snapshot, tmp_path / "out"), snapshot / "config.json")
    assert "is not valid JSON" in line and "line 1 column" in line


@pytest.mark.parametrize("weights", ["safetensors", "bin", "pth"])
@pytest.mark.parametrize("keep", [0.5, 0.99, 0.0001])
def test_every_weight_format_cut_anywhere(tmp_path, weights, keep):
    snapshot, path = _snapshot(tmp_path, weights)
    check_snapshot_files(snapshot)  # whole: accepted
    _truncate(path, keep)
    with pytest.raises(SetupError, match=f"{path}.* is not a readable checkpoint file"):
        check_snapshot_files(snapshot)


@pytest.mark.parametrize("content,words", [
    (b"\x89PNG\r\n\x1a\n\x00\x00\xff", "not valid JSON (not UTF-8 text)"),
    (b"[1, 2, 3]", "is a JSON list, not an object"),
    (b'{"model_type": "arkasr",}', "is not valid JSON"),
])
def test_config_json_variants(tmp_path, content, words):
    snapshot, _ = _snapshot(tmp_path, config=content)
    with pytest.raises(SetupError, match=f"{snapshot / 'config.json'}.*{words}".replace("(", r"\(").replace(")", r"\)")):
        check_snapshot_files(snapshot)


def test_other_json_a_missing_shard_and_no_weights(tmp_path):
    snapshot, path = _snapshot(tmp_path)
    (snapshot / "generation_config.json").write_text('{"eos_token_id": ')
    with pytest.raises(SetupError, match="generation_config.json is not valid JSON"):
        check_snapshot_files(snapshot)
    (snapshot / "generation_config.json").unlink()
    (snapshot / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(SetupError, match="names weight shards that are not in .*: model-00002-of-00002.safetensors"):
        check_snapshot_files(snapshot)
    (snapshot / "model.safetensors.index.json").unlink()
    path.unlink()
    with pytest.raises(SetupError, match="no weights"):
        check_snapshot_files(snapshot)
