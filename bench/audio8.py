"""Audio8-ASR bench: per-stage host milliseconds (onnxruntime) for clips of any length, NPU calls and host<->NPU
bytes per token per K/V bucket, K/V migration copy costs, peak RSS, and with --build the engine bytes,
estimated cycles, CPU ops and REGTASK lines per graph.

    make bench NAME=audio8 ARGS="[--real-shape] [--build rk3576] [--out /tmp/audio8/bench]"

Weights are random (no checkpoint here); --real-shape uses the published shapes, so timings and engine
figures are those of the real graphs. The harness writes bench/results/audio8.json."""
from __future__ import annotations

import json
import resource
import time
from pathlib import Path

import numpy as np


def host_timings(plan_dir: Path, steps: int) -> list[dict]:
    """Per probe clip (any length: `checks.PROBE_SECONDS`): frontend, prefill, and per-token decoder stages over
    `steps` tokens (EOS ignored: random weights need not stop), then one stress run through the largest bucket
    for the migrations."""
    from rkaudio.families.audio8.checks import PROBE_SECONDS, clip_name, probe_audio, probe_clip
    from rkaudio.board.audio8 import Audio8Runtime, Timings
    from rkaudio.board.mel import log_mel
    from rkaudio.host.backends import OnnxBackend

    rows = []
    with Audio8Runtime(plan_dir, backend_for=OnnxBackend) as runtime:
        fields = runtime.fields
        for seconds in PROBE_SECONDS:
            audio = probe_clip(seconds)
            start = time.perf_counter()
            features = log_mel(audio, fields.mel_bins)
            mel_ms = (time.perf_counter() - start) * 1000
            timings = Timings()
            embeds = runtime.prompt_embeddings(features, runtime.check_audio(audio.size), timings)
            decoded = runtime.decode(embeds, steps + 1, ignore_eos=True, timings=timings)
            per = max(timings.decode_steps, 1)
            rows.append({"prompt": f"{clip_name(seconds)}/S{embeds.shape[1]}", "mel_ms": round(mel_ms, 2),
                         "encoder_ms": round(timings.encoder_ms, 2), "adapter_ms": round(timings.adapter_ms, 2),
                         "prefill_ms": round(timings.prefill_ms, 2), "step_ms/tok": round(timings.step_ms / per, 3),
                         "head_ms/tok": round(timings.head_ms / per, 3),
                         "kv_write_ms/tok": round(timings.kv_write_ms / per, 4), "tokens": len(decoded.tokens),
                         "load_ms": round(timings.load_ms), "migration": "-"})
        tokens = fields.max_placeholders
        embeds = runtime.prompt_embeddings(log_mel(probe_audio(tokens, fields.hop), fields.mel_bins),
                                           tokens, Timings())
        count = max(fields.kv_buckets) - embeds.shape[1] + 1
        timings = Timings()
        decoded = runtime.decode(embeds, count, ignore_eos=True, timings=timings)
        per = max(timings.decode_steps, 1)
        rows.append({"prompt": f"stress S{embeds.shape[1]}+{count}", "mel_ms": "-", "encoder_ms": "-",
                     "adapter_ms": "-", "prefill_ms": round(timings.prefill_ms, 2),
                     "step_ms/tok": round(timings.step_ms / per, 3), "head_ms/tok": round(timings.head_ms / per, 3),
                     "kv_write_ms/tok": round(timings.kv_write_ms / per, 4), "tokens": len(decoded.tokens),
                     "load_ms": round(timings.load_ms), "migration": ", ".join(f"{m['from']}->{m['to']} {m['ms']:.2f} ms" for m in timings.migrations)})
    return rows


def io_per_token(plan_dir: Path, plan: dict) -> list[dict]:
    """Per K/V bucket: NPU calls per decoded token and the bytes they copy host->device and device->host (the
    graphs' I/O as exported, fp32), from the ONNX files; and the frontend's once-per-clip calls and bytes."""
    import onnx

    itemsize = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.FLOAT16: 2, onnx.TensorProto.INT64: 8}

    def nbytes(values) -> int:
        total = 0
        for value in values:
            shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
            total += itemsize[value.type.tensor_type.elem_type] * int(np.prod(shape))
        return total

    io = {}
    for entry in plan["graphs"]:
        graph = onnx.load(str(plan_dir / entry["onnx"]), load_external_data=False).graph
        c = entry["contract"]
        io.setdefault((c["component"], c["role"]), []).append((nbytes(graph.input), nbytes(graph.output)))
    rows = []
    per_clip = [io[key] for key in (("encoder", "main"), ("adapter", "main"), ("prefill", "main")) if key in io]
    calls = sum(len(v) for v in per_clip) + len(io[("decoder", "head")])
    rows.append({"stage": "frontend+prefill (once per clip)", "npu_calls": calls,
                 "h2d_bytes": sum(i for v in per_clip + [io[("decoder", "head")]] for i, _ in v),
                 "d2h_bytes": sum(o for v in per_clip + [io[("decoder", "head")]] for _, o in v)})
    for bucket in plan["graphs"][0]["contract"]["kv_buckets"]:
        step = io[("decoder", f"step_{bucket}")] + io[("decoder", "head")]
        rows.append({"stage": f"decode step, bucket {bucket}", "npu_calls": len(step),
                     "h2d_bytes": sum(i for i, _ in step), "d2h_bytes": sum(o for _, o in step)})
    return rows


def _old_split_graphs(decoder, layer_index: int):
    """The old layout's two calls for one layer (before issue #17), kept here only to measure the step against:
    this token's K/V rows (the CPU wrote them before the block ran), then attention over the whole buffer."""
    from torch import nn

    from rkaudio.families.audio8 import graphs

    config = decoder.config
    layer = decoder.model.layers[layer_index]
    heads = graphs._RotaryHeads(config.num_attention_heads, config.hidden_size // config.num_attention_heads)

    class KVProjection(nn.Module):
        def forward(self, hidden, cos, sin):
            x = graphs.rms_norm(layer.input_layernorm, hidden.flatten(0, 1))
            return heads.rope(heads.split(layer.self_attn.k_proj(x)), cos, sin), heads.split(layer.self_attn.v_proj(x))

    class Block(nn.Module):
        def forward(self, hidden, full_k, full_v, cos, sin, mask):
            h, attn = hidden.flatten(0, 1), layer.self_attn
            q = heads.rope(heads.split(attn.q_proj(graphs.rms_norm(layer.input_layernorm, h))), cos, sin)
            out = graphs._attention(q, full_k, full_v, mask, heads.head_dim)
            h = h + attn.o_proj(out.transpose(0, 1).reshape(h.shape))
            return (h + layer.mlp(graphs.rms_norm(layer.post_attention_layernorm, h))).unsqueeze(0)

    projection, block = KVProjection(), Block()
    projection.layer = block.layer = layer  # registered submodules: the weights go into the export
    projection.heads = block.heads = heads
    return projection, block


def _onnx_fed_prediction(onnx_path: Path, result) -> float:
    """The board-time model's ms for the engine `result` (build_engine's) with every input fed in its ONNX dtype
    (float32): the runtime before the step buffers went to fp16."""
    import onnx

    from rkaudio.gates.board_time import figures_from_log, predict
    from rkaudio.toolkit.session import graph_io

    inputs = [spec.to_json() for spec in graph_io(onnx.load(str(onnx_path), load_external_data=False))[0]]
    manifest = {**result.manifest_data, "inputs": inputs}
    return predict(figures_from_log(manifest, result.build_log.read_text(errors="replace")), manifest["target"])["ms"]


def step_layouts(model, out: Path, buckets: list[int], steps: int, head_shards: int, build: str | None,
                 toolkit: str) -> list[dict]:
    """The decoder step in four layouts, per K/V bucket: "split (old)" (before issue #17: per layer a K/V
    projection and a block, then the head shards), "per_layer" (one step call per layer, head shards),
    "all_layers (default)" (one step call for every layer, head shards: what `convert audio8` exports) and
    "all_layers+head" (one call). Per token: NPU calls, host->device and device->host bytes (the graphs' fp32
    I/O), host onnxruntime ms (the calls run back to back on example feeds, `steps` times), and with `build` the
    predicted board ms per token (rkaudio/gates/board_time.py) with the mask and K/V buffers fed in fp16 as `convert
    audio8` declares them (`export.STEP_BUFFER_DTYPE`) and with every input fed in fp32 (before), the summed
    layer-table cycles (est_cycles x calls), REGTASK lines and CPU ops."""
    import torch

    from rkaudio.families.audio8 import graphs
    from rkaudio.families.audio8.export import STEP_BUFFER_DTYPE, _export
    from rkaudio.core.contract import make_contract
    from rkaudio.host.backends import OnnxBackend

    config = model.decoder.config
    layers, heads, hidden = config.num_hidden_layers, config.num_attention_heads, config.hidden_size
    head_dim = hidden // heads
    rng = np.random.default_rng(0)
    out.mkdir(parents=True, exist_ok=True)
    exported: dict[str, tuple[Path, dict]] = {}

    def graph(stem, module, feeds, outputs):
        if stem not in exported:
            path = out / f"{stem}.onnx"
            contract = make_contract("audio8", "bench", "step", "audio8_asr.exec_plan", feed_dtypes={
                name: STEP_BUFFER_DTYPE for name in graphs.step_buffer_names(feeds)})
            _export(module, tuple(torch.from_numpy(v) for v in feeds.values()), list(feeds), outputs, contract, path)
            exported[stem] = (path, feeds)
        return stem

    token = rng.standard_normal((1, 1, hidden)).astype(np.float32)
    cos, sin = (t.astype(np.float32) for t in (np.cos(np.ones((1, head_dim))), np.sin(np.ones((1, head_dim)))))
    rows = graphs.shard_ranges(config.vocab_size, head_shards)
    shards = [graph(f"head_{i}", graphs.HeadShardGraph(model.decoder, a, b), {"hidden": token}, ["logits"])
              for i, (a, b) in enumerate(rows)]
    table = []
    for bucket in buckets:
        cache = [rng.standard_normal((heads, bucket, head_dim)).astype(np.float32) for _ in range(2 * layers)]
        mask = np.zeros((heads, 1, bucket), np.float32)
        mask[:, :, bucket // 2:] = graphs.MASKED
        step_feeds = lambda first, count: dict(zip(graphs.step_input_names(count),
                                                   [token, cos, sin, mask, *cache[2 * first:2 * (first + count)]]))
        split = []
        for i in range(layers):
            projection, block = _old_split_graphs(model.decoder, i)
            split += [graph(f"kv_l{i}", projection, {"hidden": token, "cos": cos, "sin": sin},
                            ["key_delta", "value_delta"]),
                      graph(f"block_l{i}_s{bucket}", block,
                            {"hidden": token, "full_k": cache[2 * i], "full_v": cache[2 * i + 1], "cos": cos,
                             "sin": sin, "mask": mask}, ["hidden_out"])]
        per_layer = [graph(f"step_l{i}_s{bucket}", graphs.StepGraph(model.decoder, layers=[i]), step_feeds(i, 1),
                           graphs.step_output_names(1)) for i in range(layers)]
        all_layers = graph(f"step_s{bucket}", graphs.StepGraph(model.decoder), step_feeds(0, layers),
                           graphs.step_output_names(layers))
        with_head = graph(f"step_head_s{bucket}", graphs.StepGraph(model.decoder, head=True), step_feeds(0, layers),
                          graphs.step_output_names(layers, head=True))
        for layout, calls in (("split (old)", split + shards), ("per_layer", per_layer + shards),
                              ("all_layers (default)", [all_layers] + shards), ("all_layers+head", [with_head])):
            table.append({"layout": layout, "bucket": bucket, "calls": calls})
    figures: dict[str, dict] = {}
    for stem, (path, feeds) in exported.items():
        with OnnxBackend(path, threads=1) as backend:
            outputs = backend.run(feeds)
            start = time.perf_counter()
            for _ in range(steps):
                backend.run(feeds)
            figures[stem] = {"ms": (time.perf_counter() - start) * 1000 / steps,
                             "h2d": sum(v.nbytes for v in feeds.values()),
                             "d2h": sum(np.asarray(v).nbytes for v in outputs.values())}
        if build:
            from rkaudio.engine.build import BuildOptions, build_engine

            result = build_engine(path, out / f"engines_{build}", BuildOptions(target=build, toolkit=toolkit,
                                                                              max_regtask_lines=10**9))
            data = result.manifest_data
            figures[stem].update(cycles=data["est_cycles"], engine_bytes=data["rknn"]["bytes"],
                                 regtask=data["regtask"]["lines"], cpu_ops=len(data["ops"]["cpu_ops"]),
                                 predicted_ms=data["predicted_board_ms"]["ms"],
                                 predicted_fp32_fed_ms=_onnx_fed_prediction(path, result))
    rows = []
    for entry in table:
        calls = entry["calls"]
        row = {"layout": entry["layout"], "bucket": entry["bucket"], "npu_calls/tok": len(calls),
               "h2d_bytes/tok": sum(figures[c]["h2d"] for c in calls),
               "d2h_bytes/tok": sum(figures[c]["d2h"] for c in calls),
               "host_ort_ms/tok": round(sum(figures[c]["ms"] for c in calls), 3)}
        if build:
            row.update({"pred_ms/tok fp32 fed": round(sum(figures[c]["predicted_fp32_fed_ms"] for c in calls), 1),
                        "pred_ms/tok fp16 buffers": round(sum(figures[c]["predicted_ms"] for c in calls), 1),
                        "cycles/tok": sum(figures[c]["cycles"] for c in calls),
                        "regtask": sum(figures[c]["regtask"] for c in calls),
                        "cpu_ops": sum(figures[c]["cpu_ops"] for c in set(calls))})
        rows.append(row)
    return rows


def build_all(plan_dir: Path, plan: dict, target: str, toolkit: str) -> list[dict]:
    """Compile every graph (no simulator self-check: build figures only) and read each manifest."""
    from rkaudio.engine.build import BuildOptions, build_engine

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


def _write_layouts_markdown(rows: list[dict], config_name: str, args) -> None:
    """bench/results/audio8_layouts[_<config>].md: the old and the new decoder step side by side."""
    from rkaudio.release.package import format_table

    results = Path(__file__).resolve().parent / "results"
    results.mkdir(parents=True, exist_ok=True)
    engines = f", engines built for {args.build} with rknn-toolkit2 {args.toolkit}" if args.build else ""
    path = results / f"audio8_layouts_{config_name}.md"
    path.write_text(
        f"Audio8-ASR decoder step layouts per token (bench/audio8.py --layouts), {config_name} random weights{engines}, "
        f"measured {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}. Bytes are the graphs' fp32 I/O; host ms is "
        f"onnxruntime with one thread over {args.steps} runs of example feeds; cycles/tok sums the layer-table "
        "estimates over the calls. `split (old)` is the layout before issue #17, `all_layers (default)` what "
        "`convert audio8` exports.\n\n```\n" + format_table(rows) + "\n```\n")
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> list[dict]:
    import run

    parser = run.parser(__file__, __doc__)
    parser.add_argument("--real-shape", action="store_true", help="the published shapes (random weights)")
    parser.add_argument("--build", metavar="TARGET", help="also compile every graph for TARGET")
    parser.add_argument("--toolkit", default="2.3.2")
    parser.add_argument("--steps", type=int, default=32, help="decoder steps timed per prompt")
    parser.add_argument("--head-shards", type=int, default=8)
    parser.add_argument("--buckets", type=int, nargs="+", default=[128, 256, 512], help="K/V buckets (--layouts)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/audio8/bench"))
    parser.add_argument("--reuse", action="store_true", help="keep the graphs already exported in --out")
    parser.add_argument("--skip-host", action="store_true", help="no onnxruntime timings (engine figures only)")
    parser.add_argument("--layouts", action="store_true", help="measure the decoder step layouts (issue #17 item 3) "
                        "instead of the export: calls, bytes, host ms and (with --build) cycles per token")
    args = parser.parse_args(argv)

    from rkaudio.families.audio8 import graphs_job, model as M
    from rkaudio.families.audio8.export import export_all
    from rkaudio.board.audio8 import PLAN_FILE

    config_name = "real-shape" if args.real_shape else "small"
    rows = []
    if args.layouts:
        config = M.real_shape_config() if args.real_shape else M.small_config()
        rows = [{"config": config_name, "part": "layouts", **row} for row in step_layouts(
            M.build_random(config, seed=0), args.out / "layouts", args.buckets, args.steps, args.head_shards,
            args.build, args.toolkit)]
        _write_layouts_markdown(rows, config_name, args)
        return rows
    if args.reuse and (args.out / PLAN_FILE).is_file():
        plan = json.loads((args.out / PLAN_FILE).read_text())
    else:
        start = time.perf_counter()
        config = M.real_shape_config() if args.real_shape else M.small_config()
        plan = export_all(graphs_job(args.out, [128, 256, 512], args.head_shards), M.build_random(config, seed=0))
        rows.append({"config": config_name, "part": "export", "export_s": round(time.perf_counter() - start, 1),
                     "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)})
    rows += [{"config": config_name, "part": "io", **row} for row in io_per_token(args.out, plan)]
    if not args.skip_host:
        # after an export in the same process the peak RSS is the export's
        rows += [{"config": config_name, "part": "host", **row} for row in host_timings(args.out, args.steps)]
    if args.build:
        rows += [{"config": config_name, "part": f"engine {args.build}/{args.toolkit}", **row}
                 for row in build_all(args.out, plan, args.build, args.toolkit)]
    return rows


if __name__ == "__main__":
    import run

    run.script(__file__)
