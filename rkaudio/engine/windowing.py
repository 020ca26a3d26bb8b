"""A fixed window for any decoder exported with a dynamic time axis (a conv vocoder, a conv decoder): which input axis
is time, whether an op reaches across the whole axis (then no window reproduces a full-length run), the hop (output
samples per frame), and the smallest context whose interior windows match a full-length run of the dynamic graph.

What it measures is what the walk runs: rkaudio.board.window_walk plans the windows and rkaudio.gates.walk_vs_full
compares a walk with the full-length run, so the context found is the one the runtime's walk reproduces."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rkaudio.board.window_walk import WindowContract
from rkaudio.core.errors import SetupError

# The reductions whose `axes` say which axes they sum, take the extreme of or count over.
REDUCTIONS = ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin")
GLOBAL_POOLS = ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
NORMS = ("InstanceNormalization", "GroupNormalization", "LayerNormalization", "MeanVarianceNormalization")
RECURRENCES = ("LSTM", "GRU", "RNN", "Scan", "Loop")
ALONG_AXIS = ("Softmax", "LogSoftmax", "Hardmax", "CumSum")
# The lengths the graph is folded at to see which tensors' dimensions follow the time axis, in windows: long enough
# for a downsampling encoder's frames to move (Wav2Vec2's 320x feature stack), as the context search's latent is.
PROBE_WINDOWS = (4, 5)


@dataclass(frozen=True)
class TimeAxis:
    """The latent input a window walk slices, its time axis, and the output it stitches (time-last)."""

    input: str
    axis: int
    rank: int
    output: str

    def shape(self, frames: int, model) -> list[int]:
        """The input's shape at `frames` frames (batch 1; the other dimensions as the graph fixes them)."""
        dims = next(i for i in model.graph.input if i.name == self.input).type.tensor_type.shape.dim
        shape = [d.dim_value if d.HasField("dim_value") else 1 for d in dims]
        shape[self.axis] = frames
        return shape

    @property
    def stored_axis(self) -> int | None:
        """The contract's `time_axis`: None for the last axis, which the walk assumes."""
        return None if self.axis == self.rank - 1 else self.axis


@dataclass(frozen=True)
class Reach:
    """A node whose result depends on every frame of the time axis."""

    node: str
    op_type: str
    kind: str  # "attention", "norm", "reduction", "recurrence", "cumulative"
    why: str

    def line(self) -> str:
        return f"{self.node} ({self.op_type}: {self.why})"


def parse_time_axis(spelt: str) -> tuple[str, int]:
    """`NAME:AXIS` as (name, axis); a SetupError for anything else."""
    name, _, axis = spelt.rpartition(":")
    try:
        return name, int(axis)
    except ValueError:
        raise SetupError(f"--time-axis {spelt!r}: expected NAME:AXIS, e.g. mel:1") from None


def time_axis(model, spelt: str | None = None) -> TimeAxis:
    """The walk's input and time axis: `spelt` (`NAME:AXIS`), else the one input axis past the batch that the export
    left dynamic. The graph must have one latent input and one output; a SetupError says what is missing."""
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    outputs = [o.name for o in model.graph.output]
    if len(outputs) != 1:
        raise SetupError(f"the graph has {len(outputs)} outputs ({', '.join(outputs)}): a window walk stitches one "
                         "time-last output")
    if len(inputs) != 1:
        raise SetupError(f"the graph has {len(inputs)} inputs ({', '.join(i.name for i in inputs)}): a window walk "
                         "feeds one latent input; export the decoder with the others folded in")
    if spelt is not None:
        name, axis = parse_time_axis(spelt)
        chosen = next((i for i in inputs if i.name == name), None)
        if chosen is None:
            raise SetupError(f"--time-axis {spelt}: no input {name!r}; the graph's inputs are "
                             f"{', '.join(i.name for i in inputs)}")
    else:
        chosen = inputs[0]
        dims = chosen.type.tensor_type.shape.dim
        dynamic = [axis for axis, d in enumerate(dims) if axis > 0 and not d.HasField("dim_value")]
        if len(dynamic) != 1:
            shown = ",".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in dims)
            raise SetupError(f"input {chosen.name} [{shown}] has {len(dynamic) or 'no'} dynamic axes past the batch: "
                             f"name its time axis with --time-axis {chosen.name}:AXIS" + (
                                 "" if dynamic else " and export the model with that axis dynamic, so a full-length "
                                 "run can judge the windows"))
        axis = dynamic[0]
    rank = len(chosen.type.tensor_type.shape.dim)
    if not 0 < axis % rank < rank or rank < 2:
        raise SetupError(f"--time-axis {chosen.name}:{axis}: the input has rank {rank} and axis 0 is the batch")
    return TimeAxis(chosen.name, axis % rank, rank, outputs[0])


def _folded(model, axis: TimeAxis, frames: int) -> tuple[dict, object]:
    """(tensor name -> static shape, the folded graph) of `model` pinned and folded at `frames` frames."""
    from rkaudio.core.onnx_graph import static_shapes
    from rkaudio.surgery.graph.fold import fold_fixed

    try:
        folded = fold_fixed(model, {axis.input: axis.shape(frames, model)})
        return static_shapes(folded), folded
    except Exception as error:  # onnxslim and shape inference fail in many ways on a graph that cannot run
        raise SetupError(f"the graph does not fold at {frames} frames on {axis.input} axis {axis.axis} ({error}): "
                         "is that the time axis?") from None


def _axes(node, rank: int, constants: dict) -> list[int] | None:
    """A reduction's axes (None: all of them), from its attribute or its second input."""
    from rkaudio.core.onnx_graph import node_attr

    axes = node_attr(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1] in constants:
        axes = constants[node.input[1]].reshape(-1).tolist()
    if node.op_type in ("ArgMax", "ArgMin"):
        axes = [node_attr(node, "axis", 0)]
    if axes is None or len(axes) == 0:
        return None if not node_attr(node, "noop_with_empty_axes", 0) else []
    return [int(a) % rank for a in axes]


def whole_axis_reach(model, axis: TimeAxis, window: int) -> list[Reach]:
    """Every node whose output reads every frame of the time axis (attention's product over all frames, a norm or
    reduction over the axis, a recurrence, a softmax or running sum along it): the graph has no finite context. The
    time-following dimensions are those that differ between two folds of the graph (PROBE_WINDOWS windows long)."""
    from rkaudio.core.onnx_graph import constant_values, node_attr

    first, folded = _folded(model, axis, PROBE_WINDOWS[0] * window)
    second, _ = _folded(model, axis, PROBE_WINDOWS[1] * window)

    def timed(name: str) -> set[int]:
        a, b = first.get(name), second.get(name)
        if a is None or b is None or len(a) != len(b):
            return set()
        return {i for i, (x, y) in enumerate(zip(a, b)) if x != y}

    constants = constant_values(folded.graph)
    found = []
    for node in folded.graph.node:
        if not node.input or not node.input[0]:
            continue
        data = node.input[0]
        moving, rank = timed(data), len(first.get(data, ()))
        if not moving:
            continue
        name, op = node.name or node.output[0], node.op_type
        if op == "MatMul" and (rank - 1) in moving:
            found.append(Reach(name, op, "attention", "its product sums over every frame of the time axis"))
        elif op in REDUCTIONS:
            axes = _axes(node, rank, constants)
            if axes is None or moving & set(axes):
                found.append(Reach(name, op, "reduction", "it reduces over the time axis"))
        elif op in GLOBAL_POOLS:
            found.append(Reach(name, op, "reduction", "it pools over the time axis"))
        elif op in NORMS:
            normed = set(range(2, rank)) if op != "LayerNormalization" else \
                set(range(node_attr(node, "axis", -1) % rank, rank))
            if op == "MeanVarianceNormalization":
                normed = {int(a) % rank for a in node_attr(node, "axes", [0, 2, 3])}
            if moving & normed:
                found.append(Reach(name, op, "norm", "it normalises over the time axis"))
        elif op in RECURRENCES:
            found.append(Reach(name, op, "recurrence", "it carries a state along the time axis"))
        elif op in ALONG_AXIS and node_attr(node, "axis", -1) % rank in moving:
            kind = "attention" if op in ("Softmax", "LogSoftmax", "Hardmax") else "cumulative"
            found.append(Reach(name, op, kind, "it is taken along the time axis"))
    return found


def refuse_whole_axis(model, axis: TimeAxis, window: int, name: str) -> None:
    """A SetupError naming what reaches across the whole time axis (attention first), when anything does."""
    reach = whole_axis_reach(model, axis, window)
    if not reach:
        return
    order = ("attention", "norm", "reduction", "recurrence", "cumulative")
    groups = []
    for kind in order:
        members = [r for r in reach if r.kind == kind]
        if members:
            shown = "; ".join(r.line() for r in members[:3]) + (f"; and {len(members) - 3} more" if len(members) > 3
                                                                  else "")
            groups.append(f"{kind} ({len(members)} node{'s' * (len(members) != 1)}): {shown}")
    raise SetupError(f"{name} has no finite context along {axis.input} axis {axis.axis}: " + " | ".join(groups)
                     + ". A window cannot reproduce a full-length run of such a graph; compile it at one fixed length "
                     "(convert build --shape) instead")


def hop_of(backend, axis: TimeAxis, model, window: int) -> int:
    """Output samples per latent frame, from runs of one and two windows; a SetupError when the output's last axis
    does not grow by a whole number of samples per frame."""
    sizes, lengths = [], (window, 2 * window)
    for frames in lengths:
        try:
            out = backend.run({axis.input: np.zeros(axis.shape(frames, model), np.float32)})[axis.output]
        except Exception as error:  # onnxruntime's own failure (a fixed-length table added to the time axis)
            raise SetupError(f"the graph does not run at {frames} frames on {axis.input} axis {axis.axis}: "
                             f"{str(error).splitlines()[0][:300]}") from None
        sizes.append(np.shape(out))
    grown = [i for i, (a, b) in enumerate(zip(*sizes)) if a != b]
    step = sizes[1][-1] - sizes[0][-1]
    if grown != [len(sizes[0]) - 1] or step % (lengths[1] - lengths[0]) or sizes[0][-1] != step // (
            lengths[1] - lengths[0]) * lengths[0]:
        raise SetupError(f"output {axis.output} is {list(sizes[0])} at {lengths[0]} frames and {list(sizes[1])} at "
                         f"{lengths[1]}: a window walk needs a time-last output of a whole number of samples per frame")
    return step // (lengths[1] - lengths[0])


@dataclass
class ContextSearch:
    """The worst interior window (dB against the full-length run) per context, and the context chosen: the profile's
    figure for every context, the walk's own for each context a walk confirmed or refused."""

    window: int
    min_db: float
    worst_db: dict = field(default_factory=dict)  # context -> worst interior window's SNR
    context: int | None = None

    def line(self) -> str:
        tried = ", ".join(f"{c}: {db:.1f}" for c, db in sorted(self.worst_db.items())
                          if self.context is None or c <= self.context)
        if self.context is None:
            return (f"window {self.window}: no context reaches {self.min_db:g} dB on every interior window "
                    f"(worst interior dB per context: {tried})")
        return (f"window {self.window}: context {self.context} (emitted {self.window - 2 * self.context}), worst "
                f"interior window {self.worst_db[self.context]:.1f} dB (>= {self.min_db:g}; per context: {tried})")


def contract_at(window: int, context: int, hop: int, axis: TimeAxis, channels: int | None,
                mask_input: str | None = None) -> WindowContract:
    """The window contract of a walk over `axis` (its input, output and time axis)."""
    return WindowContract.two_sided(window, context, hop=hop, latent_input=axis.input, output=axis.output,
                                    latent_channels=channels, time_axis=axis.stored_axis, mask_input=mask_input)


def edge_profile(windowed, latent: np.ndarray, reference: np.ndarray, window: int, hop: int, axis: TimeAxis,
                 mask_input: str | None = None) -> dict[int, float]:
    """Per context, the worst SNR (dB) of the frames a window keeps at that context, over windows placed every
    quarter window across the latent's inside: the error a window makes near its edges, measured once for all
    contexts (a walk per context would run its own windows)."""
    frames, flat = latent.shape[axis.axis], np.reshape(reference, (-1,))
    starts = range(window // 2, frames - window - window // 2 + 1, max(1, window // 4))
    signal, noise = [], []
    for start in starts:
        chunk = np.ascontiguousarray(np.take(latent, np.arange(start, start + window), axis=axis.axis))
        feeds = {axis.input: chunk}
        if mask_input is not None:
            feeds[mask_input] = np.ones((1, 1, window), np.float32)
        out = np.reshape(windowed.run(feeds)[axis.output], (-1,)).astype(np.float64)
        expected = flat[start * hop:(start + window) * hop].astype(np.float64)
        signal.append((expected ** 2).reshape(window, hop).sum(axis=1))
        noise.append(((expected - out) ** 2).reshape(window, hop).sum(axis=1))
    worst = {}
    for context in range((window - 1) // 2 + 1):
        kept = slice(context, window - context)
        ratios = [s[kept].sum() / n[kept].sum() if n[kept].sum() > 0 else np.inf for s, n in zip(signal, noise)]
        worst[context] = float(10 * np.log10(min(ratios))) if min(ratios) > 0 else -np.inf
    return worst


def measure_context(windowed, latent: np.ndarray, reference: np.ndarray, window: int, hop: int, axis: TimeAxis,
                    min_db: float, contexts=None, mask_input: str | None = None) -> ContextSearch:
    """The smallest context whose every interior window of `latent`'s walk over `windowed` (the graph pinned at
    `window`, fed its frame mask as `mask_input` when it has one) is at least `min_db` against `reference` (the
    full-length run). The edge profile proposes the context and the walk confirms it (a refused one is followed by
    the next); `contexts` names the ones to walk instead."""
    from rkaudio.gates.walk_vs_full import WalkBesideFull

    search = ContextSearch(window, min_db)
    channels = np.moveaxis(latent, axis.axis, -1).shape[1]
    if contexts is None:
        search.worst_db = edge_profile(windowed, latent, reference, window, hop, axis, mask_input)
        contexts = [c for c, db in search.worst_db.items() if db >= min_db][:1]
        contexts = range(contexts[0], (window - 1) // 2 + 1) if contexts else []
    for context in contexts:
        contract = contract_at(window, context, hop, axis, channels, mask_input)
        interior = WalkBesideFull.run(windowed, latent, contract, reference).interior()
        if not interior:
            continue
        search.worst_db[context] = min(interior)
        if search.worst_db[context] >= min_db:
            search.context = context
            break
    return search
