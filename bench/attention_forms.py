"""The attention forms per target (issue #42): the native Softmax form against the exp-ratio form
(`rkaudio.surgery.graph.attention.exp_ratio_attention`) with each of its shifts (the constant bound 8, each row's
max), each graph built for every target, ranked by predicted board ms per call (`rkaudio.gates.board_time`), with its
CPU ops, REGTASK lines and simulator SNR beside its fp16 floor.

The graphs are the families' native exports for rk3588 (`--skip-rknn`) of their tiny models: the CosyVoice3 s32 rung
and the Qwen3 step. The exp-ratio form is the shared pass applied to that graph; a family's own rk3566 extras (Qwen3's
keys padded to a multiple of 4, a split CosyVoice3 rung's channel-first `hidden`) are not in it, so its rk3566 rows
show what the pass alone leaves on the CPU. This is the evidence for the families' tables (`AttentionForms`): a
target keeps the native form unless the exp-ratio form predicts less."""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

TARGETS = ("rk3588", "rk3576", "rk3566")
LOGIT_BOUND = 8.0
TOOLKIT = "2.3.2"
# form name -> the exp-ratio shift (None: each row's max); the native form is the export itself
EXP_RATIO_SHIFTS = {"exp_ratio": LOGIT_BOUND, "exp_ratio_row_max": None}


def exports(models_dir: Path, work: Path) -> dict:
    """{graph name: its `Exported` record (native ONNX, self-check, exact fp32 twin)} from the family commands for
    rk3588."""
    from rkaudio.pipeline.exported import Exported

    commands = {
        "cosyvoice3_s32": (["cosyvoice3", "--random-weights", "small", "--lengths", "32"], "cosyvoice3_flow_s32"),
        "qwen3_step_main_64": (["qwen3-vocoder", "--model-dir", str(models_dir / "qwen3_vocoder_tiny"),
                                "--codes-length", "64"], "qwen3_vocoder_main_64"),
    }
    found = {}
    for name, (argv, stem) in commands.items():
        out = work / name
        subprocess.run([sys.executable, "-m", "rkaudio.cli", *argv, "--target", "rk3588", "--skip-rknn",
                        "--out", str(out)], check=True, capture_output=True)
        found[name] = Exported.from_onnx(out / f"{stem}.onnx")
    return found


def measure(name: str, form: str, onnx_path: Path, exported, target: str, out: Path) -> dict:
    """One build of one form of one graph for one target, gated by nothing (every figure is recorded); the
    simulator is compared with the native export's exact fp32 twin (the graph itself where it has none)."""
    import math

    from rkaudio.engine.build import BuildOptions, build_engine

    options = BuildOptions(target, TOOLKIT, max_regtask_lines=10**9, fail_on_cpu_ops=False,
                           min_simulator_snr_db=-math.inf)
    result = build_engine(onnx_path, out, options, selfcheck=exported.selfcheck,
                          reference_onnx=exported.reference or exported.onnx)
    manifest = result.manifest_data
    simulator = manifest["simulator"]
    return {"graph": name, "form": form, "target": target,
            "predicted_ms": (manifest.get("predicted_board_ms") or {}).get("ms"),
            "cpu_ops": manifest["ops"]["cpu"], "regtask_lines": manifest["regtask"]["lines"],
            "est_cycles": manifest["est_cycles"], "engine_bytes": manifest["rknn"]["bytes"],
            # per output: the simulator's dB and its distance above the fp16 floor's (the gate's measure)
            "simulator_db": {output: round(v["snr_db"], 2) for output, v in simulator.items()},
            "floor_gap_db": {output: round(v["fp16_floor_gap_db"], 2) for output, v in simulator.items()}}


def main(argv: list[str] | None = None) -> list[dict]:
    import onnx

    import run
    from rkaudio.surgery.graph.attention import exp_ratio_attention

    parser = run.parser(__file__, __doc__)
    parser.add_argument("--models", type=Path, required=True,
                        help="the small deterministic models (tools/release_diff.py models): qwen3_vocoder_tiny/")
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma list of targets")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-attention-forms-") as scratch:
        work = Path(scratch)
        for name, exported in exports(args.models, work).items():
            native = exported.onnx
            paths = {"native": native}
            for form, shift in EXP_RATIO_SHIFTS.items():
                paths[form] = native.with_name(f"{native.stem}_{form}.onnx")
                onnx.save(exp_ratio_attention(onnx.load(str(native)), shift), str(paths[form]))
            for target in args.targets.split(","):
                for form, path in paths.items():
                    row = measure(name, form, path, exported, target, work / "engines" / target / form)
                    rows.append(row)
                    print(row, flush=True)
    return rows


if __name__ == "__main__":
    import run

    run.script(__file__)
