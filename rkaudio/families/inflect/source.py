"""Where a recipe's official Inflect v2 files come from: a local directory, or the huggingface_hub
cache of the official ONNX repo (never downloaded here)."""
from __future__ import annotations

import os
from pathlib import Path

FILES = ("onnx/decode.onnx", "onnx/duration.onnx", "config.json")


def _cached_snapshot(repo: str) -> Path | None:
    """The newest local snapshot of `repo` in the huggingface_hub cache, without touching the network."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.utils import LocalEntryNotFoundError
    except ImportError:
        return None
    try:
        return Path(snapshot_download(repo, local_files_only=True, allow_patterns=list(FILES)))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None


def resolve_source(source: dict) -> tuple[Path, Path]:
    """(decode.onnx, duration.onnx) for a recipe's `[source]` (`dir` and/or `repo`); raises
    `rkaudio.core.errors.MissingSource` naming what is missing and how to supply it."""
    from rkaudio.core.errors import MissingSource

    candidates = []
    if source.get("dir"):
        candidates.append(Path(os.path.expanduser(os.path.expandvars(source["dir"]))))
    if source.get("repo"):
        snapshot = _cached_snapshot(source["repo"])
        if snapshot is not None:
            candidates.append(snapshot)
    for root in candidates:
        if all((root / name).is_file() for name in FILES):
            return root / FILES[0], root / FILES[1]
    places = [str(source["dir"])] if source.get("dir") else []
    if source.get("repo"):
        places.append(f"the huggingface_hub cache of {source['repo']}")
    where = " or ".join(places) or "the recipe (its [source] names no dir or repo)"
    raise MissingSource(f"the official Inflect v2 files ({', '.join(FILES)}) are not in {where}; put them in "
                        "that directory ($RKAUDIO_MODELS names the models root) or copy a huggingface_hub cache "
                        f"of {source.get('repo', 'the official repo')} from a machine with network access")
