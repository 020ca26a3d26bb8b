"""Where a recipe's official Inflect v2 files come from: a local directory, or the huggingface_hub
cache of the official ONNX repo (never downloaded here)."""
from __future__ import annotations

from pathlib import Path

from rkaudio.pipeline.checkpoint import recipe_checkpoint

FILES = ("onnx/decode.onnx", "onnx/duration.onnx", "config.json")


def resolve_source(source: dict) -> tuple[Path, Path]:
    """(decode.onnx, duration.onnx) for a recipe's `[source]` (`dir` and/or `repo`); raises
    `rkaudio.core.errors.MissingSource` naming what is missing and how to supply it."""
    root = recipe_checkpoint(source, FILES, "official Inflect v2 ONNX files")
    return root / FILES[0], root / FILES[1]
