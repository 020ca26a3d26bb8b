"""The simulator SNR, the host fp16 floor (`rkaudio.gates.fp16_floor`) and their gap, per output of every default
engine.

Reads what `convert engines` keeps in `work/dist/<target>/<package>/` (each engine's ONNX, self-check, fp32
twin and manifest; --work-dist points elsewhere): the simulator figure is the manifest's (measured at build
on the same ONNX, whose sha256 is checked), the floor is measured here on the host, so no engine is rebuilt.
A manifest written since the floor exists carries its own floor too (`floor_at_build_db`)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from rkaudio.engine.build import host_references
from rkaudio.core.contract import get_contract
from rkaudio.core.onnx_graph import load_model
from rkaudio.core.paths import selfcheck_path
from rkaudio.gates.fp16_floor import FLOOR_MARGIN_DB, floor_gap
from rkaudio.board.files import sha256_file
from rkaudio.board.numeric import snr_db


def engines(work_dist: Path):
    """(package, manifest path, manifest) of every engine under work_dist, package by package."""
    for manifest_path in sorted(work_dist.glob("*/*.manifest.json")):
        yield manifest_path.parent.name, manifest_path, json.loads(manifest_path.read_text())


def main(argv: list[str] | None = None) -> list[dict]:
    import run

    parser = run.parser(__file__, __doc__)
    parser.add_argument("--target", default="rk3588", help="whose engines work/dist/<target> holds (default: rk3588)")
    parser.add_argument("--work-dist", type=Path, metavar="DIR", help="default: work/dist/<target>")
    options = parser.parse_args(argv)
    work_dist = options.work_dist or Path("work") / "dist" / options.target
    if not work_dist.is_dir():
        raise SystemExit(f"no {work_dist}: run `convert engines --target {options.target}` first (or pass --work-dist)")
    rows = []
    for package, manifest_path, manifest in engines(work_dist):
        onnx_path = manifest_path.parent / Path(manifest["onnx"]["path"]).name
        selfcheck = selfcheck_path(onnx_path)
        if not onnx_path.is_file() or not selfcheck.is_file():
            continue
        stale = sha256_file(onnx_path) != manifest["onnx"]["sha256"]
        model = load_model(onnx_path)
        contract = get_contract(model)
        twin = onnx_path.parent / contract["reference_onnx"] if contract.get("reference_onnx") else onnx_path
        with np.load(selfcheck) as data:
            feeds = {name: data[name] for name in data.files}
        started = time.perf_counter()
        reference, floor = host_references(model, twin, feeds)
        elapsed = time.perf_counter() - started
        for name, ref in reference.items():
            recorded = manifest["simulator"].get(name, {})
            simulator = float(recorded.get("snr_db", "nan"))
            floor_db = snr_db(ref, floor[name])
            gap = floor_gap(simulator, floor_db)
            rows.append({
                "package": package, "engine": onnx_path.stem, "output": name,
                "onnx_mb": round(onnx_path.stat().st_size / 1e6, 1), "fp16_maths": twin != onnx_path,
                "simulator_db": round(simulator, 2), "fp16_floor_db": round(floor_db, 2),
                "floor_minus_sim_db": round(floor_db - simulator, 2), "gap_db": round(gap, 2),
                "gap_gate": "pass" if gap <= FLOOR_MARGIN_DB else "FAIL",
                "floor_at_build_db": recorded.get("fp16_floor_snr_db"),
                "host_s": round(elapsed, 1), "onnx_matches_manifest": not stale,
            })
    return rows


if __name__ == "__main__":
    import run

    run.script(__file__)
