"""Audio8-ASR bench: per-stage host milliseconds (onnxruntime), K/V migration copy costs, peak RSS, and with
--build the engine bytes, estimated cycles, CPU ops and REGTASK lines per graph.

    .venv/export/bin/python bench/audio8.py [--real-shape] [--build rk3576] [--out /tmp/audio8/bench]

Weights are random (no checkpoint here); --real-shape uses the published shapes, so timings and engine
figures are those of the real graphs. Writes bench/results/audio8.json."""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _table(rows: list[dict]) -> str:
    columns = list(rows[0])
    widths = [max(len(str(c)), *(len(str(r[c])) for r in rows)) for c in columns]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(columns, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(str(r[c]).ljust(w) for c, w in zip(columns, widths)) for r in rows]
    return "\n".join(lines)


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
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real-shape", action="store_true", help="the published shapes (random weights)")
    parser.add_argument("--build", metavar="TARGET", help="also compile every graph for TARGET")
    parser.add_argument("--toolkit", default="2.3.2")
    parser.add_argument("--steps", type=int, default=32, help="decoder steps timed per prompt")
    parser.add_argument("--head-shards", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("/tmp/audio8/bench"))
    parser.add_argument("--reuse", action="store_true", help="keep the graphs already exported in --out")
    parser.add_argument("--skip-host", action="store_true", help="no onnxruntime timings (engine figures only)")
    args = parser.parse_args()

    from converters.families.audio8 import model as M
    from converters.families.audio8.export import export_all
    from runtime.kv_buckets import PLAN_FILE

    export_s = None
    if args.reuse and (args.out / PLAN_FILE).is_file():
        plan = json.loads((args.out / PLAN_FILE).read_text())
    else:
        start = time.perf_counter()
        config = M.real_shape_config() if args.real_shape else M.small_config()
        plan = export_all(M.build_random(config, seed=0), args.out, [25, 50, 75, 100], [128, 256, 512],
                          args.head_shards)
        export_s = round(time.perf_counter() - start, 1)
    host = [] if args.skip_host else host_timings(args.out, args.steps)
    if host:
        print(_table(host))
    out = REPO / "bench" / "results" / "audio8.json"
    config_name = "real-shape" if args.real_shape else "small"
    # A run that skips a part keeps that part's figures from the previous run of the same config.
    previous = json.loads(out.read_text()) if out.is_file() else {}
    result = previous if previous.get("config") == config_name else {"config": config_name}
    peak_rss_mib = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    if export_s is not None:
        result.update(export_s=export_s, export_peak_rss_mib=peak_rss_mib)
    if host:
        # after an export in the same process this peak is the export's
        result.update(host_onnxruntime=host, host_peak_rss_mib=peak_rss_mib)
    if args.build:
        engines = build_all(args.out, plan, args.build, args.toolkit)
        print(_table(engines))
        result.update(target=args.build, toolkit=args.toolkit, engines=engines,
                      total_engine_bytes=sum(r["engine_bytes"] for r in engines),
                      total_regtask_lines=sum(r["regtask"] for r in engines))
    print(f"export {export_s} s, peak RSS {peak_rss_mib} MiB")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
