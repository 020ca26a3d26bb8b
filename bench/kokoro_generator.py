"""Kokoro-82M generator at W=128 on rk3588 / toolkit 2.3.2, one engine per Snake sine form (clip = the spec's
`--no-sin-reduce`, floor = the spec's range reduction, round = the default NPU-native fp16 rounding), all with
the alpha fold, from the embedded int8 model (real-size weights): engine bytes, estimated cycles and RW traffic
from the layer table, CPU ops, REGTASK lines, sine-level SNR (the form's sin^2 against the exact one over
|alpha x| <= 20.5, the range measured on real decodes) and generator-level SNR (the simulator engine against the
onnxruntime fp32 exact-sine graph on the same window), and each form's cycles / traffic relative to clip.

--scratch names the scratch directory (default: the system temp dir)."""
from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

import numpy as np

FRAMES, TARGET, TOOLKIT = 128, "rk3588", "2.3.2"
FORMS = ("clip", "floor", "round")
ARGUMENT_RANGE = 20.5  # |alpha*x| reached on real decodes (measured-facts: 19.6-20.5 rad)


def sine_snr_db(form: str) -> float:
    from rkaudio.board.numeric import snr_db
    from rkaudio.surgery.modules.snake import half_turn_sin2_reference

    w = np.linspace(-ARGUMENT_RANGE, ARGUMENT_RANGE, 200001) / math.pi
    return snr_db(half_turn_sin2_reference(w, "exact"), half_turn_sin2_reference(w, form))


def main(argv: list[str] | None = None) -> list[dict]:
    import run
    from rkaudio.engine.build import BuildOptions, build_engine
    from rkaudio.families.kokoro import FAMILY
    from rkaudio.families.kokoro.export import export
    from rkaudio.families.kokoro.graph import OUTPUT, interior
    from rkaudio.families.kokoro.sources import load_generator
    from rkaudio.families.kokoro.verdicts import onnx_outputs
    from rkaudio.board.numeric import snr_db

    parser = run.parser(__file__, __doc__)
    parser.add_argument("--scratch", type=Path, default=Path(tempfile.gettempdir()), metavar="DIR",
                        help="the engines go to its bench-kokoro-generator/ (default: the system temp dir)")
    work = parser.parse_args(argv).scratch / "bench-kokoro-generator"
    config, state, label, _ = load_generator(None, None, work, use_cache=False)
    [exact_record] = export(FAMILY.job(target=TARGET, out=work / "exact", options={"frames": FRAMES}), config, state,
                            label, "exact")
    options = BuildOptions(TARGET, TOOLKIT, max_regtask_lines=100_000, fail_on_cpu_ops=False, min_simulator_snr_db=0.0)
    rows = []
    for form in FORMS:
        started = time.perf_counter()
        [record] = export(FAMILY.job(target=TARGET, out=work / form, options={"frames": FRAMES}), config, state, label,
                          form)
        exported = time.perf_counter()
        result = build_engine(record.onnx, work / form, options, selfcheck=record.selfcheck,
                              export_verdicts=record.verdicts, reference_onnx=record.reference)
        built = time.perf_counter()
        feeds = dict(np.load(record.selfcheck))
        exact = onnx_outputs(exact_record.onnx, feeds)
        simulated = np.asarray(result.simulator_outputs[OUTPUT], dtype=np.float64).reshape(exact.shape)
        manifest = result.manifest_data
        rows.append({
            "form": form, "export_s": round(exported - started, 1), "build_s": round(built - exported, 1),
            "engine_bytes": manifest["rknn"]["bytes"], "est_cycles": manifest["est_cycles"],
            "rw_kb": manifest["rw_kb"], "cpu_ops": manifest["ops"]["cpu"],
            "cpu_op_types": sorted({op["type"] for op in manifest["ops"]["cpu_ops"]}),
            "regtask_lines": manifest["regtask"]["lines"],
            "sine_snr_db": round(sine_snr_db(form), 1),
            "generator_snr_db": round(snr_db(interior(config, FRAMES, exact), interior(config, FRAMES, simulated)), 1),
            "sim_vs_own_fp32_db": round(manifest["simulator"][OUTPUT]["snr_db"], 1),
        })
    clip = rows[0]
    for row in rows:
        row["cycles_vs_clip"] = round(row["est_cycles"] / clip["est_cycles"], 4)
        row["rw_vs_clip"] = round(row["rw_kb"] / clip["rw_kb"], 4)
    return rows


if __name__ == "__main__":
    import run

    run.script(__file__)
