"""Audio8-ASR bench: per-stage host milliseconds (onnxruntime), K/V migration copy costs, peak RSS, and with
--build the engine bytes, estimated cycles, CPU ops and REGTASK lines per graph.

    AUDIO8_BENCH_ARGS="[--real-shape] [--build rk3576] [--out /tmp/audio8/bench]" make bench NAME=audio8

Weights are random (no checkpoint here); --real-shape uses the published shapes, so timings and engine
figures are those of the real graphs. The harness writes bench/results/audio8.json."""
from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import time
from pathlib import Path


def host_timings(plan_dir: Path, steps: int) -> list[dict]:
    """Per adapter bucket: frontend, prefill, and per-token decoder stages over `steps` tokens (EOS ignored:
    random weights need not stop), then one stress run through the largest bucket for the migrations."""
    from converters.families.audio8.checks import probe_audio
    from runtime.kv_buckets import Audio8Runtime, Timings
    from runtime.mel import log_mel

    rows = []
    with Audio8Runtime(plan_dir) as runtime:
        contract = runtime.contract
        for tokens in contract["adapter_tokens"]:
            audio = probe_audio(tokens, contract["hop"])
            start = time.perf_counter()
            features = log_mel(audio, contract["mel_bins"])
            mel_ms = (time.perf_counter() - start) * 1000
            timings = Timings()
            embeds = runtime.prompt_embeddings(features, runtime.check_audio(audio.size), timings)
            decoded = runtime.decode(embeds, steps + 1, ignore_eos=True, timings=timings)
            per = max(timings.decode_steps, 1)
            rows.append({"prompt": f"T{tokens}/S{embeds.shape[1]}", "mel_ms": round(mel_ms, 2),
                         "encoder_ms": round(timings.encoder_ms, 2), "adapter_ms": round(timings.adapter_ms, 2),
                         "prefill_ms": round(timings.prefill_ms, 2), "kv_ms/tok": round(timings.kv_ms / per, 3),
                         "block_ms/tok": round(timings.block_ms / per, 3), "head_ms/tok": round(timings.head_ms / per, 3),
                         "kv_write_ms/tok": round(timings.kv_write_ms / per, 4), "tokens": len(decoded.tokens),
                         "load_ms": round(timings.load_ms), "migration": "-"})
        tokens = max(contract["adapter_tokens"])
        embeds = runtime.prompt_embeddings(log_mel(probe_audio(tokens, contract["hop"]), contract["mel_bins"]),
                                           tokens, Timings())
        count = max(contract["kv_buckets"]) - embeds.shape[1] + 1
        timings = Timings()
        decoded = runtime.decode(embeds, count, ignore_eos=True, timings=timings)
        per = max(timings.decode_steps, 1)
        rows.append({"prompt": f"stress S{embeds.shape[1]}+{count}", "mel_ms": "-", "encoder_ms": "-",
                     "adapter_ms": "-", "prefill_ms": round(timings.prefill_ms, 2),
                     "kv_ms/tok": round(timings.kv_ms / per, 3), "block_ms/tok": round(timings.block_ms / per, 3),
                     "head_ms/tok": round(timings.head_ms / per, 3),
                     "kv_write_ms/tok": round(timings.kv_write_ms / per, 4), "tokens": len(decoded.tokens),
                     "load_ms": round(timings.load_ms), "migration": ", ".join(f"{m['from']}->{m['to']} {m['ms']:.2f} ms" for m in timings.migrations)})
    return rows


def build_all(plan_dir: Path, plan: dict, target: str, toolkit: str) -> list[dict]:
    """Compile every graph (no simulator self-check: build figures only) and read each manifest."""
    from converters.engine import BuildOptions, build_engine

    rows = []
    options = BuildOptions(target=target, toolkit=toolkit, max_regtask_lines=10**9)
    for entry in plan["graphs"]:
        start = time.perf_counter()
        result = build_engine(plan_dir / entry["onnx"], plan_dir / f"engines_{target}", options)
        data = result.manifest_data
        rows.append({"graph": entry["onnx"][:-5], "build_s": round(time.perf_counter() - start, 1),
                     "engine_bytes": data["rknn"]["bytes"], "est_cycles": data["est_cycles"],
                     "rw_kb": round(data["rw_kb"]), "regtask": data["regtask"]["lines"],
                     "cpu_ops": ",".join(f"{op['type']}:{op['name']}" for op in data["ops"]["cpu_ops"]) or "0"})
        print(f"built {rows[-1]['graph']} in {rows[-1]['build_s']} s", flush=True)
    return rows


def main() -> list[dict]:
    """Rows for the harness (`make bench NAME=audio8`); options come from AUDIO8_BENCH_ARGS, e.g.
    AUDIO8_BENCH_ARGS="--real-shape --build rk3576" (the harness passes no argv)."""
    parser = argparse.ArgumentParser(prog="AUDIO8_BENCH_ARGS", description=__doc__.splitlines()[0])
    parser.add_argument("--real-shape", action="store_true", help="the published shapes (random weights)")
    parser.add_argument("--build", metavar="TARGET", help="also compile every graph for TARGET")
    parser.add_argument("--toolkit", default="2.3.2")
    parser.add_argument("--steps", type=int, default=32, help="decoder steps timed per prompt")
    parser.add_argument("--head-shards", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("/tmp/audio8/bench"))
    parser.add_argument("--reuse", action="store_true", help="keep the graphs already exported in --out")
    parser.add_argument("--skip-host", action="store_true", help="no onnxruntime timings (engine figures only)")
    args = parser.parse_args(shlex.split(os.environ.get("AUDIO8_BENCH_ARGS", "")))

    from converters.families.audio8 import model as M
    from converters.families.audio8.export import export_all
    from runtime.kv_buckets import PLAN_FILE

    config_name = "real-shape" if args.real_shape else "small"
    rows = []
    if args.reuse and (args.out / PLAN_FILE).is_file():
        plan = json.loads((args.out / PLAN_FILE).read_text())
    else:
        start = time.perf_counter()
        config = M.real_shape_config() if args.real_shape else M.small_config()
        plan = export_all(M.build_random(config, seed=0), args.out, [25, 50, 75, 100], [128, 256, 512],
                          args.head_shards)
        rows.append({"config": config_name, "part": "export", "export_s": round(time.perf_counter() - start, 1),
                     "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)})
    if not args.skip_host:
        # after an export in the same process the peak RSS is the export's
        rows += [{"config": config_name, "part": "host", **row} for row in host_timings(args.out, args.steps)]
    if args.build:
        rows += [{"config": config_name, "part": f"engine {args.build}/{args.toolkit}", **row}
                 for row in build_all(args.out, plan, args.build, args.toolkit)]
    return rows
