"""A CosyVoice3 flow package as `convert aperture` reads it, manifests and exec_plan only (no engine is built): the
figures each rung's estimate comes from, chosen by the test (tests/families/cosyvoice3 and tests/cli share it)."""
from __future__ import annotations

import json

MIB = 1 << 20


def fake_manifest(length: int, weight_mib: float, internal_mib: float) -> dict:
    return {"family": "cosyvoice3", "component": "flow", "role": "main",
            "rknn": {"path": f"cosyvoice3_flow_s{length}.rknn", "bytes": int((weight_mib + 20) * MIB)},
            "weight_bytes": int(weight_mib * MIB), "internal_bytes": int(internal_mib * MIB),
            "contract": {"length": length, "ladder_key": length}}


def fake_package(directory, internal: dict, weight_mib: float = 600.0, plan: list | None = None):
    directory.mkdir(parents=True, exist_ok=True)
    for length, internal_mib in internal.items():
        (directory / f"cosyvoice3_flow_s{length}.manifest.json").write_text(
            json.dumps(fake_manifest(length, weight_mib, internal_mib)))
    if plan is not None:
        (directory / "exec_plan.json").write_text(json.dumps({"cosyvoice3.exec_plan": {"flow": {
            "impl": "rknn", "artifacts": {"main": ",".join(f"cosyvoice3_flow_s{s}.rknn" for s in plan)}}}}))
    return directory
