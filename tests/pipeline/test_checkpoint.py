"""The one checkpoint lookup (rkaudio.pipeline.checkpoint): a local folder ($VARS and ~ expanded, one naming an
unset variable skipped), else the huggingface_hub cache, never the network, and one message naming every place."""
from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from rkaudio.core.errors import MissingSource, SetupError
from rkaudio.pipeline.checkpoint import as_repo_id, recipe_checkpoint, resolve_checkpoint

REPO = "owner/model-x"
FILES = ("config.json", "weights/model.bin")
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def write_files(folder: Path, files=FILES) -> Path:
    for name in files:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("x")
    return folder


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> SimpleNamespace:
    """An empty huggingface_hub cache (HF_HUB_CACHE: `path`) in offline mode, with every connection refused and
    the arguments of every snapshot_download call recorded (`calls`)."""
    import huggingface_hub
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))  # huggingface_hub reads the variable once, at import

    def refuse(sock, address):
        raise AssertionError(f"the checkpoint lookup opened a connection to {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    calls = []
    download = huggingface_hub.snapshot_download

    def recorded(repo_id, **kwargs):
        calls.append(kwargs)
        return download(repo_id, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", recorded)
    return SimpleNamespace(path=cache, calls=calls)


def cached(cache: Path, repo: str = REPO, files=FILES) -> Path:
    """A snapshot of `repo` in the cache, laid out as huggingface_hub writes one (refs/main -> snapshots/<commit>)."""
    storage = cache / f"models--{repo.replace('/', '--')}"
    (storage / "refs").mkdir(parents=True)
    (storage / "refs" / "main").write_text(COMMIT)
    snapshot = storage / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    return write_files(snapshot, files)


def test_a_local_folder_holding_the_files_is_the_checkpoint_variables_and_home_expanded(tmp_path, monkeypatch,
                                                                                       hub_cache):
    folder = write_files(tmp_path / "models" / "model-x")
    monkeypatch.setenv("RKAUDIO_MODELS", str(tmp_path / "models"))
    assert resolve_checkpoint("$RKAUDIO_MODELS/model-x", REPO, FILES, "model-x snapshot") == folder
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_checkpoint("~/models/model-x", None, FILES, "model-x snapshot") == folder
    assert hub_cache.calls == []  # found locally: the cache is not even looked at


def test_glob_patterns_name_the_files(tmp_path):
    folder = write_files(tmp_path / "ckpt", ("speech_tokenizer/config.json",))
    assert resolve_checkpoint(folder, None, ("speech_tokenizer/*",), "tokenizer") == folder
    with pytest.raises(SetupError):
        resolve_checkpoint(folder, None, ("speech_tokenizer/*.safetensors",), "tokenizer")


def test_the_hub_cache_is_read_without_the_network(tmp_path, hub_cache):
    snapshot = cached(hub_cache.path)
    assert resolve_checkpoint(tmp_path / "absent", REPO, FILES, "model-x snapshot") == snapshot
    assert hub_cache.calls == [{"local_files_only": True, "allow_patterns": list(FILES)}]


def test_a_folder_naming_an_unset_variable_is_skipped(tmp_path, monkeypatch, hub_cache):
    monkeypatch.delenv("RKAUDIO_MODELS", raising=False)
    monkeypatch.chdir(tmp_path)
    write_files(tmp_path / "$RKAUDIO_MODELS" / "model-x")  # the unexpanded path, literally: still not a place
    snapshot = cached(hub_cache.path)
    assert resolve_checkpoint("$RKAUDIO_MODELS/model-x", REPO, FILES, "model-x snapshot") == snapshot
    with pytest.raises(MissingSource, match=r"in \$RKAUDIO_MODELS/model-x \(\$RKAUDIO_MODELS is not set\) or the "
                                            r"huggingface_hub cache of other/model-y;"):
        recipe_checkpoint({"dir": "$RKAUDIO_MODELS/model-x", "repo": "other/model-y"}, FILES, "model-y snapshot")


def test_a_cached_snapshot_without_every_file_is_missing(tmp_path, hub_cache):
    cached(hub_cache.path, files=FILES[:1])
    with pytest.raises(SetupError, match=r"in the huggingface_hub cache of owner/model-x \(its snapshot is without "
                                         r"weights/model.bin\);"):
        resolve_checkpoint(None, REPO, FILES, "model-x snapshot")


def test_missing_is_one_line_naming_every_place_and_every_way(tmp_path, monkeypatch, hub_cache):
    monkeypatch.setenv("RKAUDIO_MODELS", str(tmp_path / "models"))
    with pytest.raises(MissingSource) as caught:
        recipe_checkpoint({"dir": "$RKAUDIO_MODELS/model-x", "repo": REPO}, FILES, "model-x snapshot")
    assert str(caught.value) == (
        f"no model-x snapshot (config.json, weights/model.bin) in {tmp_path / 'models' / 'model-x'} (no such folder) "
        f"or the huggingface_hub cache of {REPO}; put it in a folder under $RKAUDIO_MODELS (a recipe's dir), pass its "
        f"folder with --model-dir or fetch it with `huggingface-cli download {REPO}` on a machine with network and "
        "copy that cache here")
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(SetupError) as caught:  # a command's lookup: its own option, no repo to fetch
        resolve_checkpoint(tmp_path / "ckpt", None, ("model.pth",), "model-x checkpoint", flag="--checkpoint")
    assert str(caught.value) == (
        f"no model-x checkpoint (model.pth) in {tmp_path / 'ckpt'} (without model.pth); put it in a folder under "
        "$RKAUDIO_MODELS (a recipe's dir) or pass its folder with --checkpoint")
    with pytest.raises(MissingSource, match=r"no model-x snapshot \(config.json, weights/model.bin\) anywhere \(no "
                                            r"folder or repo was named\)"):
        recipe_checkpoint({}, FILES, "model-x snapshot")


def test_a_command_source_is_a_folder_or_a_repo_id():
    assert as_repo_id("Qwen/Qwen3-TTS-12Hz-0.6B-Base") == "Qwen/Qwen3-TTS-12Hz-0.6B-Base"
    assert as_repo_id(Path("owner/name")) == "owner/name"
    for folder in ("/models/x", "./x/y", "~/x", "$RKAUDIO_MODELS/x", "a/b/c", "x", None):
        assert as_repo_id(folder) is None
