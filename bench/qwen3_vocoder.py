"""Qwen3-TTS speech-tokenizer decoder: what the stateful step buys, and what its engines cost.

Rows:
- host cost per code frame (torch fp32, this machine) of the stateful step at B=16 and B=64 vs the window
  role re-decoding 25 context + 12 new frames per event, and their ratio;
- per engine manifest: engine bytes, estimated cycles per step and per frame, CPU ops.

`--config real` (default) uses the real-shape config with random weights, `tiny` the test config. `--manifests
*.manifest.json ...` adds engine rows from earlier builds, e.g. `convert qwen3-vocoder --onnx step_64.onnx --target
rk3588` outputs."""
from __future__ import annotations

import json
import time
from pathlib import Path

WINDOW_CONTEXT, WINDOW_NEW = 25, 12
REPEATS = 3


def _seconds(function, repeats: int = REPEATS) -> float:
    """Best of `repeats` wall times (the machine is shared: the minimum is the least disturbed run)."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - started)
    return best


def host_rows(config_name: str) -> list[dict]:
    import torch

    from rkaudio.families.qwen3_vocoder.random_model import TINY_CONFIG, random_codes, random_reference, step_of
    from rkaudio.families.qwen3_vocoder.snapshot import REAL_SHAPE_DECODER_CONFIG

    config = REAL_SHAPE_DECODER_CONFIG if config_name == "real" else TINY_CONFIG
    step = step_of(random_reference(config, seed=0), config)
    cache = step.zero_cache()
    rows = []
    with torch.no_grad():
        per_frame = {}
        for frames in (16, 64):
            codes = random_codes(config, frames, seed=frames)
            per_frame[frames] = _seconds(lambda: step(codes, cache)) / frames
            rows.append({"config": config_name, "what": f"stateful step B={frames}",
                         "ms_per_frame": round(1e3 * per_frame[frames], 3)})
        window = random_codes(config, WINDOW_CONTEXT + WINDOW_NEW, seed=1)
        per_window_frame = _seconds(lambda: step(window, step.zero_cache())) / WINDOW_NEW
    rows.append({"config": config_name, "what": f"window {WINDOW_CONTEXT}+{WINDOW_NEW} per event",
                 "ms_per_frame": round(1e3 * per_window_frame, 3),
                 "ratio_vs_step64": round(per_window_frame / per_frame[64], 2)})
    return rows


def engine_rows(manifests: list[Path]) -> list[dict]:
    rows = []
    for path in manifests:
        manifest = json.loads(Path(path).read_text())
        contract = manifest.get("contract", {})
        frames = contract.get("frames") or manifest["inputs"][0]["shape"][-1]
        cycles = manifest.get("est_cycles")
        cpu = [op["type"] for op in manifest.get("ops", {}).get("cpu_ops", [])]
        rows.append({"config": f"engine, cache_numel {contract.get('cache_numel')}",
                     "what": f"{manifest['role']} B={frames} {manifest['target']}",
                     "engine_bytes": manifest["rknn"]["bytes"], "est_cycles_per_step": cycles,
                     "est_cycles_per_frame": round(cycles / frames) if cycles else None,
                     "cpu_ops": len(cpu), "cpu_op_types": ",".join(sorted(set(cpu)))})
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    import run

    parser = run.parser(__file__, __doc__)
    parser.add_argument("--config", choices=("real", "tiny"), default="real",
                        help="real: the real-shape config with random weights (default); tiny: the test config")
    parser.add_argument("--manifests", nargs="+", type=Path, default=[], metavar="MANIFEST",
                        help="engine manifests of earlier builds: one row each")
    options = parser.parse_args(argv)
    return host_rows(options.config) + engine_rows(options.manifests)


if __name__ == "__main__":
    import run

    run.script(__file__)
