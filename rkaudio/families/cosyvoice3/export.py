"""One fixed-S estimator ONNX per rung, its contract, and the export gates:

- `export_snr[S]`: onnxruntime on the exported graph vs the reference DiT in float64 (>= 100 dB);
- `padding_exact[S]`: a 3/4-real input right-padded with mask 0 vs the unpadded reference (fp32), on the real
  frames (>= 100 dB);
- `mask_one_detected[S]`: the same padded input with mask 1 over the padding must move the engine's real frames
  below that bar (the mask is wired, so the gate above can fail);
- `forbidden_ops[S]`: no IsNaN/Not/Neg/Tile and no non-finite constant in the traced graph (plus
  `rkaudio.gates.opscan` on the written one);
- `attention_logit_max[S]`, `attention_row_max_floor[S]`: on a target whose attention form is `exp_ratio`
  (`ATTENTION`), the attention logits on the self-check inputs within the form's bound
  (`rkaudio.gates.logit_bound`);
- `ode_snr`: the 10-step CFG ODE through `rkaudio.board.cosyvoice3` over onnxruntime vs upstream's solver over the
  float64 reference (>= 80 dB on the mel), at the smallest rung."""
from __future__ import annotations

import copy
import gc
import math
import warnings
from pathlib import Path
from typing import Callable

import numpy as np

from rkaudio.board.cosyvoice3 import FlowFields, RungFields
from rkaudio.pipeline import pipeline
from rkaudio.pipeline.attention import AttentionForms

MIN_EXPORT_SNR_DB = 100.0
MIN_PADDING_SNR_DB = 100.0
MIN_ODE_SNR_DB = 80.0
FORBIDDEN_OPS = ("IsNaN", "Not", "Neg", "Tile")
CHECK_T = 0.3  # the time the single-call gates use
GOLDEN_LOOP = "rkaudio.board.cosyvoice3:golden_loop"
# The attention form of every rung and part per target: the RK3566 runs each block's Softmax and its rank-4 head
# layout on its CPU (tiny s32: 4 CPU ops native, 0 in the exp-ratio form; simulator 61.3 dB against a 61.0 dB fp16
# floor; real shape S=112: 0, S=110: 90, as at every S not a multiple of 8). The exp-ratio form's Neg is its own
# and runs on that NPU: `forbidden_ops` judges the traced graph. Its shift is the constant bound 8 (every rung's
# self-check logits inside [8 - EXP_WINDOW, 8]), not each row's max: the rk3566 cell was built and measured so.
ATTENTION = AttentionForms(forms={"rk3566": "exp_ratio"}, logit_bound=8.0)
# The layout of `hidden` between the parts of a split rung per target (engine_graph.HIDDEN_LAYOUTS; others `rows`):
# the RK3566 compiler puts a Transpose of a [B, S, dim] output on its CPU (tiny s24 part 1 of 2), none of [B, dim, S].
HIDDEN_LAYOUTS = {"rk3566": "channels"}


def onnx_name(length: int, batch: int = 1, part: int = 0, parts: int = 1) -> str:
    return (f"cosyvoice3_flow_s{length}" + ("_b2" if batch == 2 else "")
            + (f"_p{part + 1}of{parts}" if parts > 1 else "") + ".onnx")


def time_freqs(freq_dim: int = 256) -> np.ndarray:
    """Upstream's float32 sinusoid frequencies (SinusPositionEmbedding computes them in torch float32)."""
    import torch

    half = freq_dim // 2
    return torch.exp(torch.arange(half).float() * -(math.log(10000) / (half - 1))).numpy()


def rung_fields(model, length: int, batch: int, ln_form: str, blocks: tuple | None = None, part: int = 0,
                parts: int = 1, hidden_layout: str = "rows") -> RungFields:
    """The contract fields of the engine of rung `length` (or of its part `part` of `parts`, blocks `blocks`,
    chained through `hidden` in `hidden_layout`)."""
    from rkaudio.families.cosyvoice3.dit import FREQ_EMBED_DIM, parameter_count
    from rkaudio.board.cosyvoice3 import CHAIN_INPUT_NAMES, HIDDEN_NAME, INPUT_NAMES, OUTPUT_NAME

    mel, heads, dim_head = model.mel_dim, model.heads, model.dim_head
    shapes = {"x": [batch, mel, length], "mask": [batch, 1, length], "mu": [batch, mel, length],
              "t_freq": [batch, FREQ_EMBED_DIM], "spks": [batch, model.input_embed.spk_dim], "cond": [batch, mel, length],
              "rope_cos": [heads, length, dim_head], "rope_sin": [heads, length, dim_head]}
    inputs, outputs = [{"name": name, "shape": shapes[name]} for name in INPUT_NAMES], \
        [{"name": OUTPUT_NAME, "shape": [batch, mel, length]}]
    chain = None
    if parts > 1:
        axes = "[B, dim, S]" if hidden_layout == "channels" else "[B, S, dim]"
        hidden = {"name": HIDDEN_NAME, "shape": hidden_shape(batch, length, model.dim, hidden_layout)}
        if part > 0:
            inputs = [hidden] + [{"name": name, "shape": shapes[name]} for name in CHAIN_INPUT_NAMES[1:]]
        if part < parts - 1:
            outputs = [hidden]
        chain = {"part": part, "parts": parts, "blocks": list(blocks),
                 "carries": f"{HIDDEN_NAME} {axes} from part {part} to part {part + 1}"
                 if part < parts - 1 else "the velocity"}
    return RungFields(length=length, chain=chain,
                      estimator={"dim": model.dim, "depth": model.depth, "heads": heads, "dim_head": dim_head},
                      io={"inputs": inputs, "outputs": outputs}, ln_form=ln_form, parameters=parameter_count(model))


def flow_fields(model, cfm: dict, batch: int) -> FlowFields:
    """The contract fields every rung of the ladder states: how the ODE runs the estimator at `batch`."""
    from rkaudio.families.cosyvoice3.dit import FREQ_EMBED_DIM, TIME_SCALE
    from rkaudio.board.cosyvoice3 import DEFAULT_STEPS, FRAME_RATE_HZ, UNCONDITIONAL_ZEROED

    inv_freq = model.rotary_embed.inv_freq.detach().float().numpy()
    scheme = "one B=2 call per step (row 1 unconditional)" if batch == 2 else "two B=1 calls per step"
    return FlowFields(
        batch=batch, mel_dim=model.mel_dim, frame_rate_hz=FRAME_RATE_HZ,
        padding="right-pad to the rung with mask 0 and crop: pad frames' outputs are not zero",
        cfg={"scheme": scheme, "rate": float(cfm["inference_cfg_rate"]), "uncond_zeroed": UNCONDITIONAL_ZEROED,
             "combine": "(1 + rate) * cond_out - rate * uncond_out"},
        ode={"solver": "euler", "steps": DEFAULT_STEPS, "schedule": cfm["t_scheduler"],
             "t_span": "1 - cos(linspace(0, 1, steps + 1) * pi / 2)", "noise": "an input (upstream: seeded torch)"},
        time={"freq_dim": FREQ_EMBED_DIM, "scale": TIME_SCALE, "freqs": [float(v) for v in time_freqs(FREQ_EMBED_DIM)],
              "mlp": "in the engine (t_freq is the host's float32 sinusoid)"},
        rope={"heads": model.heads, "dim_head": model.dim_head, "rot_dim": int(2 * inv_freq.size),
              "inv_freq": [float(v) for v in inv_freq], "rotated": "the first rot_dim channels of q/k (head 0)"})


def hidden_shape(batch: int, length: int, dim: int, layout: str) -> list[int]:
    """The shape of `hidden` between the parts of a split rung in `layout` (engine_graph.HIDDEN_LAYOUTS)."""
    return [batch, dim, length] if layout == "channels" else [batch, length, dim]


def prompt_frames(frames: int) -> int:
    """The leading frames of the self-check and ODE inputs whose cond holds a prompt mel (the rest is zero)."""
    return frames // 3


def make_inputs(model, length: int, frames: int, seed: int, t: float = CHECK_T, batch: int = 1) -> dict:
    """Graph feeds (float32) for one call at rung `length` with `frames` real frames (mask 1) and the rest
    zero-padded (mask 0): noise x, a mu, a cond holding a prompt over its first third, a speaker vector."""
    from rkaudio.board.cosyvoice3 import rope_tables, time_sinusoid

    rng = np.random.default_rng(seed)
    mel = model.mel_dim
    x = rng.standard_normal((batch, mel, frames)).astype(np.float32)
    mu = rng.standard_normal((batch, mel, frames)).astype(np.float32)
    cond = np.zeros((batch, mel, frames), dtype=np.float32)
    cond[..., :prompt_frames(frames)] = rng.standard_normal((batch, mel, prompt_frames(frames)))
    spks = rng.standard_normal((batch, model.input_embed.spk_dim)).astype(np.float32)

    def pad(value):
        return np.pad(value, [(0, 0), (0, 0), (0, length - frames)])

    mask = np.zeros((batch, 1, length), dtype=np.float32)
    mask[..., :frames] = 1.0
    cos, sin = rope_tables(length, model.rotary_embed.inv_freq.detach().float().numpy(), model.heads, model.dim_head)
    return {"x": pad(x), "mask": mask, "mu": pad(mu), "t_freq": np.repeat(time_sinusoid([t], time_freqs(), 1000.0),
                                                                            batch, 0),
            "spks": spks, "cond": pad(cond), "rope_cos": cos, "rope_sin": sin}


def reference_call(model, feeds: dict, frames: int, t: float = CHECK_T) -> np.ndarray:
    """The reference DiT (in its own dtype) on the first `frames` frames of `feeds`, unpadded."""
    import torch

    dtype = next(model.parameters()).dtype

    def tensor(name):
        return torch.from_numpy(np.ascontiguousarray(feeds[name][..., :frames] if feeds[name].ndim == 3
                                                     else feeds[name])).to(dtype)

    batch = feeds["x"].shape[0]
    with torch.no_grad():
        out = model(tensor("x"), tensor("mask"), tensor("mu"), torch.full((batch,), t, dtype=dtype),
                    tensor("spks"), tensor("cond"))
    return out.numpy()


def export_onnx(model, length: int, onnx_path: Path, batch: int = 1, ln_form: str = "plain",
                blocks: tuple | None = None, hidden_layout: str = "rows", **planted):
    """Trace the engine graph (or the depth-split part `blocks` = (start, stop), chained through `hidden` in
    `hidden_layout`) at fixed (batch, length), fold it, and save it (no contract yet)."""
    import onnx
    import torch

    from rkaudio.families.cosyvoice3.engine_graph import EstimatorGraph
    from rkaudio.board.cosyvoice3 import HIDDEN_NAME
    from rkaudio.surgery.graph.fold import fold_fixed

    graph = EstimatorGraph(model, ln_form=ln_form, blocks=blocks, hidden_layout=hidden_layout, **planted).eval()
    feeds = make_inputs(model, length, length, 0, batch=batch)
    feeds[HIDDEN_NAME] = np.zeros(hidden_shape(batch, length, model.dim, hidden_layout), dtype=np.float32)
    args = tuple(torch.from_numpy(feeds[name]) for name in graph.input_names)
    onnx_path = Path(onnx_path)
    onnx_path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the legacy exporter is deliberate (dynamo writes opset 18)
        torch.onnx.export(graph, args, str(onnx_path), input_names=graph.input_names,
                          output_names=graph.output_names, opset_version=17, dynamo=False, do_constant_folding=True)
    folded = fold_lean(onnx.load(str(onnx_path)), fold_fixed)
    onnx.save(folded, str(onnx_path))
    return folded


LEAN_FOLD_MIN_ELEMENTS = 1 << 16


def fold_lean(model, fold):
    """`fold` (onnxslim: ~11x the model's bytes in RAM, 15 GB at the real shape) run on the graph without its
    weights: every initializer of >= 64 Ki elements becomes a graph input of its shape while it folds, and comes
    back afterwards. The shape glue the fold removes never depends on a weight (torch already folded those)."""
    from rkaudio.core.onnx_graph import weights_aside, weights_back

    skeleton, aside = weights_aside(model, [init.name for init in model.graph.initializer
                                            if int(np.prod(init.dims)) >= LEAN_FOLD_MIN_ELEMENTS])
    return weights_back(fold(skeleton), aside)


def forbidden(model) -> list[str]:
    """IsNaN/Not/Neg/Tile nodes and non-finite constants (the -inf mask of a plain export), by name."""
    from rkaudio.core.onnx_graph import constant_values

    found = [f"{node.op_type}:{node.name or '(unnamed)'}" for node in model.graph.node if node.op_type in FORBIDDEN_OPS]
    for name, value in constant_values(model.graph).items():
        value = np.asarray(value)
        if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
            found.append(f"non-finite constant {name}")
    return found


def forbidden_verdict(model, length: int):
    from rkaudio.board.verdict import at_most

    found = forbidden(model)
    return at_most(f"forbidden_ops[S={length}]", len(found), 0, "nodes",
                   ", ".join(found[:8]) or "no IsNaN/Not/Neg/Tile, no -inf")


def padded_frames(length: int) -> int:
    """The real frames of the padding gate's and the end-to-end golden's input on a rung of `length`: a quarter
    of the rung (at least one frame) is padding (mask 0)."""
    return length - max(1, length // 4)


def rung_verdicts(model, model64, onnx_path, length: int, seed: int, batch: int = 1) -> list:
    """The single-call gates of one rung (`onnx_path`: the ONNX or an open backend) on inputs of `seed`."""
    from rkaudio.gates.snr import snr_verdict
    from rkaudio.board.numeric import snr_db
    from rkaudio.board.verdict import at_most
    from rkaudio.host.backends import OnnxBackend

    backend = OnnxBackend(onnx_path) if isinstance(onnx_path, (str, Path)) else onnx_path
    full = make_inputs(model, length, length, seed, batch=batch)
    got = backend.run(full)["dphi_dt"]
    verdicts = [snr_verdict(f"export_snr[S={length}]", reference_call(model64, full, length), got,
                            MIN_EXPORT_SNR_DB, "onnxruntime fp32 vs the reference DiT in float64", full_scale=None)]
    frames = padded_frames(length)
    padded = make_inputs(model, length, frames, seed + 1, batch=batch)
    unpadded = reference_call(model, padded, frames)
    masked = backend.run(padded)["dphi_dt"][..., :frames]
    verdicts.append(snr_verdict(f"padding_exact[S={length}]", unpadded, masked, MIN_PADDING_SNR_DB,
                                f"{frames} real frames right-padded with mask 0 vs unpadded (fp32)", full_scale=None))
    marked = backend.run(dict(padded, mask=np.ones_like(padded["mask"])))["dphi_dt"][..., :frames]
    verdicts.append(at_most(f"mask_one_detected[S={length}]", snr_db(masked, marked), MIN_PADDING_SNR_DB, "dB",
                            "the same padding marked 1 must move the real frames below the padding bar (the "
                            "mask is wired)"))
    return verdicts


def ode_inputs(mel: int, spk: int, frames: int, seed: int) -> dict:
    """noise, mu, cond [1, mel, frames], spks [1, spk] for one ODE (cond holds a prompt over its first third)."""
    rng = np.random.default_rng(seed)
    cond = np.zeros((1, mel, frames), dtype=np.float32)
    cond[..., :prompt_frames(frames)] = rng.standard_normal((1, mel, prompt_frames(frames)))
    return {"noise": rng.standard_normal((1, mel, frames)).astype(np.float32),
            "mu": rng.standard_normal((1, mel, frames)).astype(np.float32),
            "spks": rng.standard_normal((1, spk)).astype(np.float32), "cond": cond}


def reference_ode(model64, inputs: dict, steps: int, cfg_rate: float) -> np.ndarray:
    import torch

    from rkaudio.families.cosyvoice3.reference import solve_euler

    frames = inputs["noise"].shape[-1]
    tensors = {name: torch.from_numpy(value.astype(np.float64)) for name, value in inputs.items()}
    mask = torch.ones(1, 1, frames, dtype=torch.float64)
    return solve_euler(model64, tensors["noise"], tensors["mu"], mask, tensors["spks"], tensors["cond"],
                       steps=steps, cfg_rate=cfg_rate).numpy()


def ode_verdict(onnx_paths: dict, flow: FlowFields, model64, inputs: dict, steps: int = 10,
                cfg_rate: float | None = None):
    """The ladder runtime's ODE over onnxruntime (its CFG from the contract's `flow` fields) vs upstream's solver
    over the float64 reference (CFG rate `cfg_rate`, default the contract's)."""
    from rkaudio.gates.snr import snr_verdict
    from rkaudio.host.backends import OnnxBackend
    from rkaudio.board.cosyvoice3 import FlowLadder

    ladder = FlowLadder({length: OnnxBackend(path) if isinstance(path, (str, Path)) else path
                         for length, path in onnx_paths.items()}, flow)
    got = ladder.solve(inputs["noise"], inputs["mu"], inputs["spks"], inputs["cond"], steps=steps)
    frames = inputs["noise"].shape[-1]
    reference = reference_ode(model64, inputs, steps, flow.cfg["rate"] if cfg_rate is None else cfg_rate)
    return snr_verdict("ode_snr", reference, got, MIN_ODE_SNR_DB,
                       f"{steps}-step CFG ODE, {frames} frames on the S={ladder.rung_for(frames)} rung (onnxruntime) "
                       "vs upstream's solver in float64", full_scale=None)


def parts_for(parts, lengths: list[int]) -> dict:
    """{S: number of depth-split parts} from an int (every rung) or a mapping S -> parts (others whole)."""
    if isinstance(parts, dict):
        table = {int(k): int(v) for k, v in parts.items()}
        return {length: table.get(length, 1) for length in lengths}
    return {length: int(parts) for length in lengths}


def export(job, model, cfm: dict, say: Callable[[str], None] = print) -> list:
    """Export `job`'s ladder of `model` (the DiT, `cfm` its flow-matching params) into `job.out`: one rung per
    `options.lengths` (ascending) at `options.batch` and `options.ln_form`, each whole or split by depth into
    `options.parts` (a count, or S -> count) chained through `hidden` (in the target's HIDDEN_LAYOUTS), each graph
    in the target's ATTENTION form; gate each rung (a chain as one estimator) on inputs of `options.seed`, gate the
    ODE at the smallest rung, declare the end-to-end golden (the same ODE) and return the records."""
    import onnx

    from rkaudio.families.cosyvoice3.aperture import APERTURE_NAME
    from rkaudio.families.cosyvoice3.engine_graph import part_input_names, split_blocks
    from rkaudio.core.contract import store_contract
    from rkaudio.gates import opscan
    from rkaudio.host.backends import OnnxBackend
    from rkaudio.board.cosyvoice3 import HIDDEN_NAME, Chain

    options = job.options
    batch, ln_form, seed = options.batch, options.ln_form, options.seed
    lengths = sorted(set(int(s) for s in options.lengths))
    if not lengths or lengths[0] < 4:
        raise ValueError(f"rung lengths {lengths}: each must be at least 4 frames")
    split = parts_for(options.parts, lengths)
    hidden_layout = HIDDEN_LAYOUTS.get(str(job.target), "rows")
    out_dir = Path(job.out)
    model = model.float().eval()
    flow = flow_fields(model, cfm, batch)
    smallest = lengths[0]
    frames = padded_frames(smallest)
    inputs = ode_inputs(model.mel_dim, model.input_embed.spk_dim, frames, seed + 2)
    # One graph in memory at a time (1.3 GB at the real shape): scan it, store its contract in place, drop it;
    # the float64 reference exists only while its rung is gated.
    records_by_length = {}
    for length in lengths:
        count = split[length]
        ranges = split_blocks(model.depth, count)
        # self-check feeds per part: the first part takes the rung's inputs, a later one the hidden state the
        # parts before it give (onnxruntime fp32, in the target's form) on those inputs
        current = make_inputs(model, length, length, seed, batch=batch)
        paths, statics, part_feeds = [], [], []
        for part, blocks in enumerate(ranges):
            path = out_dir / onnx_name(length, batch, part, count)
            say(f"export cosyvoice3 flow estimator S={length} B={batch}"
                + (f" part {part + 1}/{count} (blocks {blocks[0]}..{blocks[1] - 1})" if count > 1 else "")
                + f" -> {path.name}")
            traced = export_onnx(model, length, path, batch=batch, ln_form=ln_form,
                                 blocks=blocks if count > 1 else None, hidden_layout=hidden_layout)
            feeds = {name: current[name] for name in part_input_names(part == 0)}
            exported, bounds = ATTENTION.apply(traced, job.target, feeds, suffix=f"[S={length}]")
            forbidden_ops = forbidden_verdict(traced, length)
            del traced
            key = length if part == 0 else length + part / 100  # the ladder lists rungs in length order, parts in order
            fields = rung_fields(model, length, batch, ln_form, blocks, part, count, hidden_layout)
            # package_files: per-rung NPU address-space estimates, written once the rungs are built
            store_contract(exported, job.contract("main", ladder_key=key, package_files=[APERTURE_NAME],
                                                  **fields.to_fields(), **flow.to_fields()))
            onnx.save(exported, str(path))
            problems = opscan.scan(exported, job.target)
            opscan.warn(problems)
            statics.append([verdict if count == 1 else _part_name(verdict, part)
                            for verdict in (forbidden_ops, opscan.verdict(problems), *bounds)])
            if part < count - 1:
                current[HIDDEN_NAME] = OnnxBackend(exported).run(feeds)[HIDDEN_NAME]
            part_feeds.append(feeds)
            del exported
            gc.collect()
            paths.append(path)
        model64 = copy.deepcopy(model).double()  # per rung: not resident while the next rung traces (2.6 GB)
        backends = [OnnxBackend(path) for path in paths]
        backend = backends[0] if count == 1 else Chain(backends)
        rung = rung_verdicts(model, model64, backend, length, seed, batch)
        if length == smallest:
            rung.append(ode_verdict({length: backend}, flow, model64, inputs,
                                    cfg_rate=float(cfm["inference_cfg_rate"])))
        del backend, backends, model64
        gc.collect()
        records_by_length[length] = [
            pipeline.record_export(path, statics[part] + (rung if part == count - 1 else []), feeds=part_feeds[part])
            for part, path in enumerate(paths)]
    first = records_by_length[smallest]
    declared = pipeline.record_end_to_end(
        f"cosyvoice3_flow_ode_s{smallest}", GOLDEN_LOOP, first, inputs, {"steps": 10},
        f"the 10-step CFG ODE on {frames} frames (right-padded to the S={smallest} rung), seeded noise/mu/cond/spks")
    say(f"end-to-end golden: {frames} frames through {GOLDEN_LOOP} on the S={smallest} rung"
        + (f" ({len(first)} chained parts)" if len(first) > 1 else ""))
    return declared + [record for length in lengths[1:] for record in records_by_length[length]]


def _part_name(verdict, part: int):
    """The same verdict named for one part of a split rung."""
    import dataclasses

    return dataclasses.replace(verdict, name=verdict.name.replace("]", f" part {part + 1}]"))
