"""Where a family's checkpoint comes from: a local folder, else the huggingface_hub cache of its repo, never a
download. `resolve_checkpoint` is the one lookup (a command's --model-dir, a recipe's `[source]` `dir` and `repo`
through `recipe_checkpoint`), and its message is the one a missing checkpoint is told in: every place tried and
the three ways to supply it ($RKAUDIO_MODELS, the command's folder option, `huggingface-cli download`)."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Sequence

from rkaudio.core.errors import MissingSource, SetupError

MODELS_VARIABLE = "RKAUDIO_MODELS"  # the models root a recipe's `dir` names


def resolve_checkpoint(local: str | Path | None, repo_id: str | None, required: Sequence[str], what: str, *,
                       missing: type[Exception] = SetupError, flag: str = "--model-dir") -> Path:
    """The folder holding every `required` file (paths or glob patterns relative to it): `local` with its $VARS and
    ~ expanded (skipped while it still names an unset variable, `$RKAUDIO_MODELS/...` without RKAUDIO_MODELS),
    else the huggingface_hub cache's snapshot of `repo_id`, looked up without the network. Neither holds them:
    `missing` (MissingSource for a recipe, its skip; SetupError for a command) saying `what` is missing, every
    place tried, and how to supply it (`flag` is the command's option that names the folder)."""
    tried = []
    if local:
        folder = Path(os.path.expanduser(os.path.expandvars(str(local))))
        unset = re.search(r"\$\{?(\w+)", str(folder))
        if unset is not None:
            tried.append(f"{local} (${unset.group(1)} is not set)")
        elif not folder.is_dir():
            tried.append(f"{folder} (no such folder)")
        elif not _lacking(folder, required):
            return folder
        else:
            tried.append(f"{folder} (without {', '.join(_lacking(folder, required))})")
    if repo_id:
        snapshot = _cached_snapshot(repo_id, required)
        if snapshot is not None and not _lacking(snapshot, required):
            return snapshot
        lacks = f" (its snapshot is without {', '.join(_lacking(snapshot, required))})" if snapshot is not None else ""
        tried.append(f"the huggingface_hub cache of {repo_id}{lacks}")
    where = f"in {' or '.join(tried)}" if tried else "anywhere (no folder or repo was named)"
    ways = [f"put it in a folder under ${MODELS_VARIABLE} (a recipe's dir)", f"pass its folder with {flag}"]
    if repo_id:
        ways.append(f"fetch it with `huggingface-cli download {repo_id}` on a machine with network and copy that "
                    "cache here")
    raise missing(f"no {what} ({', '.join(required)}) {where}; {', '.join(ways[:-1])} or {ways[-1]}")


def recipe_checkpoint(source: dict, required: Sequence[str], what: str) -> Path:
    """The checkpoint a recipe's `[source]` names, its `dir` else the huggingface_hub cache of its `repo`
    (`resolve_checkpoint`); MissingSource, the recipe's skip, when neither holds it."""
    return resolve_checkpoint(source.get("dir"), source.get("repo"), required, what, missing=MissingSource)


def as_repo_id(source: str | Path | None) -> str | None:
    """`source` itself when it reads as a hub repo id (`owner/name`: one slash, not a relative or absolute
    path), else None: a command's --model-dir names a folder or a repo id alike."""
    text = str(source or "")
    return text if text.count("/") == 1 and not text.startswith((".", "/", "~", "$")) else None


def _lacking(folder: Path, required: Sequence[str]) -> list[str]:
    """The `required` names or patterns that no file in `folder` matches."""
    return [pattern for pattern in required if not any(match.is_file() for match in folder.glob(pattern))]


def _cached_snapshot(repo_id: str, required: Sequence[str]) -> Path | None:
    """The snapshot folder of `repo_id` in the huggingface_hub cache (its HF_HUB_CACHE), or None. With
    `local_files_only` snapshot_download reads the cache's refs and never opens a connection; it raises
    LocalEntryNotFoundError for a repo it has no snapshot of, and HFValidationError for an id that cannot name
    one. It does not check the files: `_lacking` does."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True, allow_patterns=list(required)))
    except (LocalEntryNotFoundError, HFValidationError):
        return None
