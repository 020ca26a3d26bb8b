"""Host side of the Piper runtime (rkaudio/board/piper.py): the contract an engine file carries."""
from __future__ import annotations

from pathlib import Path

from rkaudio.core.contract import get_contract
from rkaudio.core.manifest import read_manifest


def engine_contract(engine_path: Path) -> dict:
    """The contract of an engine: from its ONNX metadata, or from the manifest beside a `.rknn`."""
    engine_path = Path(engine_path)
    if engine_path.suffix == ".onnx":
        return get_contract(engine_path)
    return read_manifest(engine_path).get("contract", {})
