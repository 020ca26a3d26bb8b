"""Export one fixed-shape step (or a stateless window decode) to ONNX with its contract, its exact fp32 twin,
self-check inputs and export-stage verdicts (recorded by rkaudio.pipeline.pipeline.record_export)."""
from __future__ import annotations

import math
import sys
from collections import Counter
from pathlib import Path

from rkaudio.board.contract import EngineContract
from rkaudio.pipeline.pipeline import Exported, record_export
from rkaudio.core.paths import reference_path
from rkaudio.gates.verdict import refuse_degenerate
from rkaudio.board.verdict import Verdict, at_least, at_most, nothing_to_judge
from rkaudio.pipeline.attention import AttentionForms

ROLES = ("main", "first", "window")
WINDOW_CONTEXT = 25  # left-context frames of the package's chunked_decode
# The stepwise gate is relative: the fp32 stepwise decode against the reference decoder's float64 full decode
# must land within rkaudio.gates.fp32_floor.FLOOR_MARGIN_DB of the reference's own fp32 full decode against the same
# float64 one (its fp32 floor). The step computes what the decoder computes, so it carries the same rounding and nothing else:
# real steps measure 0-4 dB above the floor (tiny 124.6 vs 124.3; real shape 112.8 vs 108.8), a dilated-conv tail
# read one frame off 16-76 dB, the K/V history one row short 55-104 dB
# (tests/families/qwen3_vocoder/test_planted_faults.py).
# The absolute 40 dB this replaces passed every one of those faults.
# onnxruntime fp32 against the traced torch step: two fp32 computations of the same maths, so they can agree only
# as well as the weights let any fp32 decode agree with float64. The gate is MIN_ONNX_SNR_DB, or the weights' fp32
# floor (the reference decoder's fp32 full decode against its float64 one) less rkaudio.gates.fp32_floor.FLOOR_MARGIN_DB
# where that is lower: a held-out real-shape snapshot has a 78.4 dB floor and its faithful export measures
# 78.62 dB, and a tiny model with Snake spread 1.3 a 79.2 dB floor and 75.4-77.5 dB
# (tests/families/qwen3_vocoder/test_export.py); a planted weight fault lands far below either.
MIN_ONNX_SNR_DB = 80.0
# Full scale the cache comparison is judged at (rkaudio.board.numeric.degenerate_reference): the cache holds the
# decoder's activations (conv input tails, K/V rows), which run at the audio's O(1) scale (RMS 0.72 over the tiny
# random model's warm cache, 0.19-1.1 per entry), so 1.0, as for the pcm; its validity flags are bookkeeping (1 for
# every filled slot whatever the model computes) and left out of the judgement.
CACHE_FULL_SCALE = 1.0
VALIDITY_ENTRY = "attention.valid"
# SnakeBeta sine in the engine graph (rkaudio.surgery.modules.snake): the NPU has no Sin on rk3588 (29 CPU Sin layers at B=64).
DEFAULT_SINE_FORM = "round"
MIN_SINE_FORM_DB = 50.0
OPSET = 17
# The step's attention per target (rkaudio.pipeline.attention): the RK3566 runs Softmax and the rank-4 head
# layouts on its CPU (the tiny B=64 step: 2 exSoftmax13 and 14 head Reshapes / Transposes around them), the
# exp-ratio form keeps them on its NPU; the others keep the native Softmax, their engines unchanged. The tiny step's
# self-check logits reach 2.3 at most, row maxima from -0.03: inside [bound - EXP_WINDOW, bound].
ATTENTION_FORMS = AttentionForms(forms={"rk3566": "exp_ratio"}, logit_bound=8.0)
# Keys of an exp-ratio window (kv_len + B) padded to a multiple of this with masked zero keys: at 94, 95 or 98 keys
# the RK3566 compiler (2.3.2) runs the K Transpose and a Transpose of the weights on its CPU, at 88, 92, 96, 100
# or 136 neither (probes of the rank-3 core [2, 64, keys]).
EXP_RATIO_KEY_MULTIPLE = 4
# The row convs' halo form per target (rkaudio.families.qwen3_vocoder.cache.HALO_FORMS), read off the real-shape rows of
# bench/results/qwen3_halo_forms.md (its rule: within the board-time model's 5.1% error of the fastest predicted ms per
# code frame, the fewest CPU ops). B=16, CPU ops / predicted ms: rk3588 tail_matmul 0 / 774.4, tail_transpose 16 /
# 761.9 (a tie: tail_matmul), channels_last 13 / 936.6; rk3576 tail_transpose 0 / 1,189.0, tail_matmul 10 / 1,270.4,
# channels_last 0 / 1,292.6; rk3566 tail_transpose 69 / 1,795.5, where the tiny step ranks it first too. A target not
# listed takes DEFAULT_HALO_FORM, the form of the two smaller NPUs.
HALO_FORM_BY_TARGET = {"rk3588": "tail_matmul", "rk3576": "tail_transpose", "rk3566": "tail_transpose"}
DEFAULT_HALO_FORM = "tail_transpose"
AUTO = "auto"


def halo_form_for(target, chosen: str = AUTO) -> str:
    """The halo form a step for `target` is exported in: `chosen`, or the target's (HALO_FORM_BY_TARGET) for auto."""
    return HALO_FORM_BY_TARGET.get(str(target), DEFAULT_HALO_FORM) if chosen == AUTO else chosen


# Ops that a decomposed LayerNorm / Softmax (a newer exporter) leaves behind; the compact export has none.
DECOMPOSITION_MARKERS = ("Pad", "Exp", "Shape", "ConstantOfShape")


class _FixedStep:
    """Export wrappers: the stateful step, or a full decode from a zeroed cache (the window role)."""

    @staticmethod
    def stateful(step):
        import torch

        class Step(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.step = step

            def forward(self, codes, cache_in):
                return self.step(codes, cache_in)

        return Step()

    @staticmethod
    def window(step):
        import torch

        class Window(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.step = step

            def forward(self, codes):
                return self.step(codes, torch.zeros(self.step.cache_numel))[0]

        return Window()


def decomposition_counts(model) -> dict[str, int]:
    """How many nodes of each decomposition marker the graph holds, plus `LayerNorm(decomposed)`: a
    ReduceMean whose output is subtracted from its own input (x - mean(x)), the mean-centring of a
    LayerNorm written out as elementwise ops (RMSNorm has no such Sub)."""
    counts = Counter(node.op_type for node in model.graph.node if node.op_type in DECOMPOSITION_MARKERS)
    reduce_means = {node.output[0]: node.input[0] for node in model.graph.node if node.op_type == "ReduceMean"}
    centring = sum(1 for node in model.graph.node if node.op_type == "Sub" and len(node.input) == 2
                   and reduce_means.get(node.input[1]) == node.input[0])
    if centring:
        counts["LayerNorm(decomposed)"] = centring
    return dict(counts)


def export_health(model, stream=None) -> Verdict:
    """Export-health verdict: decomposition markers and problem ops (rkaudio.gates.opscan) of the exported graph.
    Such graphs make `rknn.build` abort inside fold_constant with no traceback, so say it here."""
    from rkaudio.gates import opscan

    counts = decomposition_counts(model)
    problems = [p for p in opscan.scan(model) if p.op_type not in counts and p.op_type not in ("Sin", "Cos")]
    total = sum(counts.values()) + len(problems)
    detail = ", ".join(f"{op} x{n}" for op, n in sorted(counts.items()))
    if total:
        stream = stream or sys.stderr
        print(f"warning: export health: {detail or 'no decomposition markers'}; {len(problems)} problem op(s). "
              "A decomposed LayerNorm/Softmax makes rknn.build abort inside fold_constant with no traceback: export "
              f"with torch.onnx.export(dynamo=False, opset_version={OPSET}) as this family does.", file=stream)
        opscan.warn(problems, stream)
    return at_most("export health", total, 0, "nodes", detail)


def export_step(job, step, frames: int, role: str, onnx_path: Path, *, reference=None, seed: int = 0,
                sine_form: str = DEFAULT_SINE_FORM, halo_form: str = AUTO, say=print) -> Exported:
    """Trace `step` for `frames` code frames, check it, and write two graphs: `onnx_path`, the engine graph
    (SnakeBeta sines in `sine_form`), and its exact fp32 twin (rkaudio.core.paths.reference_path: the host runtime's
    graph and the simulator gate's reference), plus the self-check inputs; their contracts are `job`'s.

    Stateful roles (main, first): the stepwise decode (steps of `frames`) must match a full decode of the same
    codes by `reference` (the package decoder; the step itself at full length when None). The engine graph's
    attention takes `job.target`'s form (ATTENTION_FORMS), judged against the traced step and its logit bound; the
    twin keeps the native Softmax. Both graphs meet their row convs' halos in `halo_form` (`halo_form_for`
    `job.target`), so they share one cache layout."""
    import onnx
    import torch

    from rkaudio.board.window_walk import WindowSpan
    from rkaudio.core.contract import set_contract
    from rkaudio.gates.snr import snr_verdict
    from rkaudio.surgery.graph.round_shift import fp16_round_shift

    if role not in ROLES:
        raise ValueError(f"role {role!r}: one of {ROLES}")
    halo_form = halo_form_for(job.target, halo_form)
    step = step.with_halo_form(halo_form).eval()
    quantizers, book = step.dims["num_quantizers"], step.dims["codebook_size"]
    generator = torch.Generator().manual_seed(seed)
    onnx_path = Path(onnx_path)
    context = f"{onnx_path.name} export"  # a degenerate reference stops the export under this name
    onnx_path.parent.mkdir(parents=True, exist_ok=True)
    twin = reference_path(onnx_path)
    verdicts: list[Verdict] = []
    fields = step.contract_fields(frames, sine_form, halo_form)
    window = {}  # the window role's span fields

    if role == "window":
        if frames <= WINDOW_CONTEXT:
            raise ValueError(f"a window of {frames} frames leaves nothing after {WINDOW_CONTEXT} context frames")
        window = WindowSpan.left_context(frames, WINDOW_CONTEXT).to_fields()
        wrap = _FixedStep.window
        codes = torch.randint(0, book, (1, quantizers, frames), generator=generator)
        _, floor = fp32_floor(reference if reference is not None else step, codes)
        feeds = {"codes": codes}
        names_in, names_out = ["codes"], ["pcm"]
    else:
        # Self-check: steps of `frames` against one full decode, then the ONNX feed is the last step (a warm cache
        # holding a full K/V history, so the engine's cache path is checked too).
        steps = stepwise_steps(frames, step.kv_len)
        codes_all = torch.randint(0, book, (1, quantizers, steps * frames), generator=generator)
        stepwise, warm, floor = stepwise_verdict(step, reference, codes_all, frames)
        verdicts.append(refuse_degenerate([stepwise], context)[0])
        wrap = _FixedStep.stateful
        feeds = {"codes": codes_all[..., -frames:], "cache_in": warm}
        names_in, names_out = ["codes", "cache_in"], ["pcm", "cache_out"]
    feeds["codes"] = feeds["codes"].to(getattr(torch, fields.codes_dtype))  # the engine's input type
    contract = job.contract(role, ladder_key=frames, **fields.to_fields(), **window)

    exact, exact_outputs = _trace(wrap(step), feeds, names_in, names_out, twin)
    verdicts += _onnx_verdicts(exact, feeds, names_out, exact_outputs, "exact sine", step.layout, floor)
    form = ATTENTION_FORMS.form(job.target)
    engine_step, what = (step, "exact sine") if sine_form == "exact" else (step.with_sine_form(sine_form),
                                                                           f"{sine_form} sine")
    if form == "exp_ratio":
        engine_step, what = engine_step.with_key_multiple(EXP_RATIO_KEY_MULTIPLE), f"{what}, aligned keys"
    engine, engine_outputs = exact, exact_outputs
    if engine_step is not step:
        engine, engine_outputs = _trace(wrap(engine_step), feeds, names_in, names_out, onnx_path)
        if sine_form != "exact":
            verdicts.append(snr_verdict(f"sine_form[{sine_form}]", exact_outputs[0], engine_outputs[0],
                                        MIN_SINE_FORM_DB, f"torch fp32, SnakeBeta sine as {sine_form} vs exact"))
        verdicts += _onnx_verdicts(engine, feeds, names_out, engine_outputs, what, step.layout, floor)
    arrays = {name: value.numpy() for name, value in feeds.items()}
    engine, attention = ATTENTION_FORMS.apply(engine, job.target, arrays)
    if attention:  # a form other than native: its logit bound, and the rewritten graph against the traced step
        verdicts += attention + _onnx_verdicts(engine, feeds, names_out, engine_outputs, f"{what}, {form} attention",
                                               step.layout, floor)
    if sine_form == "round":
        engine = fp16_round_shift(engine)
    refuse_degenerate(verdicts, context)  # a degenerate reference: nothing is traced or written
    health = export_health(engine)
    verdicts.append(health)
    print(f"export: {len(engine.graph.node)} nodes, opset {OPSET}; cache_numel {fields.cache_numel}, "
          f"head_dim {fields.head_dim}, kv_len {fields.kv_len}, rows of "
          f"{step.frames_per_row(frames)} frames", file=sys.stderr)

    onnx.save(set_contract(engine, contract), str(onnx_path))
    onnx.save(set_contract(exact, contract.with_fields(sine_form="exact")), str(twin))
    record = record_export(onnx_path, verdicts, feeds=arrays, reference=twin)
    say(describe(onnx_path, contract, f"exact fp32 twin {twin.name}"))
    return record


def describe(onnx_path: Path, contract: EngineContract, source: str) -> str:
    """One line of what a step's contract fixes (role and B, of each shape set of a dynamic ladder; cache size, head
    dim, kv_len), and where it came from."""
    from rkaudio.board.qwen3_vocoder import StepContract

    step = StepContract.of(contract)
    steps = " and ".join(f"role {view.role}, B={StepContract.of(view).frames}" for view in contract.views())
    return (f"{Path(onnx_path).name}: {steps}, cache_numel {step.cache_numel}, head_dim {step.head_dim}, "
            f"kv_len {step.kv_len} ({source})")


def _trace(module, feeds: dict, names_in: list[str], names_out: list[str], path: Path):
    """torch.onnx.export (legacy exporter, OPSET) + fold; returns (model, the torch outputs as numpy)."""
    import onnx
    import torch

    from rkaudio.surgery.graph.fold import fold_fixed

    raw_path = path.with_suffix(".raw.onnx")
    with torch.no_grad():
        expected = module(*feeds.values())
        torch.onnx.export(module, tuple(feeds.values()), str(raw_path), dynamo=False, opset_version=OPSET,
                          input_names=names_in, output_names=names_out, do_constant_folding=True)
    try:
        model = fold_fixed(onnx.load(str(raw_path)))
    finally:
        raw_path.unlink(missing_ok=True)
    expected = expected if isinstance(expected, tuple) else (expected,)
    return model, [value.numpy() for value in expected]


def _onnx_verdicts(model, feeds: dict, names_out: list[str], expected: list, what: str, layout,
                   floor_db: float) -> list[Verdict]:
    """onnxruntime fp32 against the traced torch step, per output, at MIN_ONNX_SNR_DB or, where the weights' fp32
    floor is lower, that floor less the margin (rkaudio.gates.fp32_floor.floor_threshold); the pcm judged whole at audio
    full scale, the cache by its activations (`cache_activations`) at CACHE_FULL_SCALE."""
    from rkaudio.gates.fp32_floor import floor_detail, floor_threshold
    from rkaudio.gates.snr import snr_verdict
    from rkaudio.board.numeric import degenerate_reference, snr_db
    from rkaudio.host.backends import OnnxBackend

    got = OnnxBackend(model).run({name: value.numpy() for name, value in feeds.items()}, names_out)
    threshold = floor_threshold(MIN_ONNX_SNR_DB, floor_db)
    detail = f"onnxruntime fp32 vs the traced torch step; {floor_detail(MIN_ONNX_SNR_DB, floor_db)}"
    verdicts = []
    for name, want in zip(names_out, expected):
        verdict_name = f"onnx_vs_torch[{name}, {what}]"
        if name == "cache_out":
            problem = degenerate_reference(cache_activations(want, layout), CACHE_FULL_SCALE)
            verdict = (nothing_to_judge(verdict_name, threshold, "dB", problem) if problem else
                       at_least(verdict_name, snr_db(want, got[name]), threshold, "dB", detail))
        else:
            verdict = snr_verdict(verdict_name, want, got[name], threshold, detail)
        verdicts.append(verdict)
    return verdicts


def cache_activations(cache, layout):
    """The flat cache without its validity flags (1 for every slot a stream has filled, whatever the model
    computes): what a degenerate-reference judgement of the cache looks at."""
    import numpy as np

    cache = np.asarray(cache).reshape(-1)
    keep = np.ones(cache.size, dtype=bool)
    for entry in layout.to_json():
        if entry["name"] == VALIDITY_ENTRY:
            keep[entry["offset"] : entry["offset"] + math.prod(entry["shape"])] = False
    return cache[keep]


def _full_decode(decoder, codes, dtype):
    """A full decode of codes [1,K,T] by `decoder` (the package decoder: [1,1,S] -> [1,S]; or a step from a zeroed
    cache) in `dtype` (a float64 copy for the floor; the decoder itself in fp32)."""
    import copy

    import torch

    from rkaudio.families.qwen3_vocoder.step import StreamingDecoder

    if dtype == torch.float64:
        decoder = copy.deepcopy(decoder).double()
    with torch.no_grad():
        if isinstance(decoder, StreamingDecoder):
            return decoder(codes, decoder.zero_cache().to(dtype))[0]
        return decoder(codes)[:, 0]


def stepwise_steps(frames: int, kv_len: int) -> int:
    """How many steps of `frames` the stepwise gate decodes: two at least, and enough that the history before
    the last one fills the K/V window (`kv_len` rows), so every query of that step reads a full history (a real
    B=16 step sees 72 frames only from its sixth step on: two steps would leave the history's far end unread)."""
    return max(2, 1 + -(-kv_len // frames))


def fp32_floor(decoder, codes):
    """(`decoder`'s float64 full decode of `codes`, how close its fp32 one comes to it in dB): the weights' fp32
    floor, as close as any fp32 decode of them can come to exact."""
    import torch

    from rkaudio.board.numeric import snr_db

    exact = _full_decode(decoder, codes, torch.float64).numpy()
    return exact, snr_db(exact, _full_decode(decoder, codes, torch.float32).numpy())


def stepwise_verdict(step, reference, codes, frames: int) -> tuple[Verdict, "torch.Tensor", float]:
    """The stepwise gate: codes [1,K,n*B] decoded as n steps of B = `frames` (fp32, the cache carried on) against
    the reference decoder's float64 full decode (the qwen-tts package decoder; the step itself at full length
    when `reference` is None), held to the reference's own fp32 floor (its fp32 full decode against the same
    float64 one) less rkaudio.gates.fp32_floor.FLOOR_MARGIN_DB. A degenerate (silent, constant) reference fails it
    without a figure. Returns (the verdict, the cache before the last step, that floor in dB)."""
    import torch

    from rkaudio.gates.fp32_floor import FLOOR_MARGIN_DB
    from rkaudio.gates.snr import snr_verdict

    steps = int(codes.shape[-1]) // frames
    if steps < 2 or steps * frames != codes.shape[-1]:
        raise ValueError(f"codes of {codes.shape[-1]} frames are not two or more steps of {frames}")
    pieces, cache = [], step.zero_cache()
    with torch.no_grad():
        for index in range(steps):
            warm = cache
            pcm, cache = step(codes[..., index * frames : (index + 1) * frames], cache)
            pieces.append(pcm)
    stepwise = torch.cat(pieces, dim=-1).numpy()
    decoder = reference if reference is not None else step
    exact, floor = fp32_floor(decoder, codes)
    who = "the qwen-tts package decoder" if reference is not None else "the step at full length"
    verdict = snr_verdict(f"stepwise_vs_full[B={frames}]", exact, stepwise, floor - FLOOR_MARGIN_DB,
                          f"{steps} fp32 steps of {frames} frames vs one float64 full decode by {who}, whose own "
                          f"fp32 decode is {floor:.1f} dB from it (threshold: that floor - {FLOOR_MARGIN_DB:g} dB)")
    return verdict, warm, floor


