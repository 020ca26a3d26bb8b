"""The contract an engine carries: one JSON document in the ONNX `metadata_props` under `rkaudio`.

Every later stage (build, manifest, runtime) reads shapes, window contract, cache layout and bucket
sizes from here, so nothing is restated downstream."""
from __future__ import annotations

import json
from pathlib import Path

import onnx

KEY = "rkaudio"


def set_contract(model: onnx.ModelProto, contract: dict) -> onnx.ModelProto:
    """Store `contract` (JSON-serialisable) in the model's metadata, replacing an earlier one."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = [p for p in out.metadata_props if p.key != KEY]
    del out.metadata_props[:]
    out.metadata_props.extend(kept)
    entry = out.metadata_props.add()
    entry.key = KEY
    entry.value = json.dumps(contract, sort_keys=True)
    return out


def get_contract(model: onnx.ModelProto | str | Path) -> dict:
    """The stored contract, or `{}` for an ONNX that rkaudio did not write."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    for prop in model.metadata_props:
        if prop.key == KEY:
            return json.loads(prop.value)
    return {}
