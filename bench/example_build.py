"""Export and build times, engine size and simulator SNR of the built-in example conv graph, per toolkit
and length (rk3588). The smallest end-to-end figure of the path: its build time is mostly toolkit start-up."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

from rkaudio.engine.build import BuildOptions, build_engine
from rkaudio.families import example
from rkaudio.toolkit.versions import SUPPORTED_TOOLKITS

CHANNELS = 16
FRAMES = (64, 1024, 8192)
TARGET = "rk3588"


def main(argv: list[str] | None = None) -> list[dict]:
    import run

    run.parser(__file__, __doc__).parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-example-") as scratch:
        for toolkit in SUPPORTED_TOOLKITS:
            for frames in FRAMES:
                out = Path(scratch) / f"{toolkit}_{frames}"
                started = time.perf_counter()
                job = example.FAMILY.job(target=TARGET, out=out, options={"channels": CHANNELS})
                [record] = example.export(job, frames)
                exported = time.perf_counter()
                result = build_engine(record.onnx, out, BuildOptions(TARGET, toolkit), selfcheck=record.selfcheck,
                                      export_verdicts=record.verdicts)
                built = time.perf_counter()
                manifest = result.manifest_data
                rows.append({
                    "toolkit": toolkit, "frames": frames,
                    "export_s": round(exported - started, 2), "build_s": round(built - exported, 2),
                    "engine_bytes": manifest["rknn"]["bytes"], "est_cycles": manifest["est_cycles"],
                    "rw_kb": manifest["rw_kb"], "regtask_lines": manifest["regtask"]["lines"],
                    "simulator_snr_db": min(v.value for v in result.verdicts if v.name.startswith("simulator_snr")),
                })
    return rows


if __name__ == "__main__":
    import run

    run.script(__file__)
