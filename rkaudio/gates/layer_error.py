"""The per-layer error table of an engine, from rknn-toolkit2's `accuracy_analysis` (simulator, target=None):
where along the graph the simulator leaves the toolkit's fp32 golden, ranked by where the error grows most.

Input: what `rkaudio.toolkit.session.ConverterChild.analyse` returns (the toolkit's error_analysis.txt and, per IR
layer, sum(golden^2) and sum((golden - simulator)^2) from its tensor dumps). The IR names are post-fusion
tensor names (`conv0-rs` for the ONNX tensor `conv0` seen through a reshape): they are mapped back to the
ONNX node that produces the tensor, and from the node's name to a stage (a torch export's module path, or a
`stages` table in the ONNX contract: {node-name prefix: label}).

Figures per layer: `entire` (the simulator run end to end, errors accumulate), `single` (the layer fed the
golden inputs: its own error, the toolkit's euclidean distance against the golden's energy), `lost` (dB of
SNR the layer loses against the worst of its inputs, walking the ONNX graph through fused nodes) and `added`
(the noise it adds, in dB relative to its own signal: 10*log10(1/SNR_out - 1/SNR_worst_input), the rank key;
-60 dB adds as much as a 60 dB stage, whatever came before). All SNRs are against the toolkit's golden."""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

# "[Conv] conv0-rs     1.00000 | 0.0076    1.00000 | 0.0076"
ROW = re.compile(r"^\[(?P<op>[^\]]+)\]\s+(?P<name>\S+)\s+(?P<ecos>\S+)\s*\|\s*(?P<eeuc>\S+)\s+"
                 r"(?P<scos>\S+)\s*\|\s*(?P<seuc>\S+)\s*$")
TOP_ROWS = 5


@dataclass
class LayerError:
    depth: int  # position in the IR graph (the toolkit's row order, topological)
    op: str
    name: str  # IR layer (tensor) name
    onnx_node: str | None
    stage: str | None
    entire_snr_db: float
    single_snr_db: float
    entire_cos: float
    single_cos: float
    growth_db: float  # worst input's entire SNR minus this layer's (nan when its inputs are exact)
    added_db: float  # the noise this layer adds, relative to its signal: 10*log10(NSR_out - NSR_worst_input)
    size: int = 0
    fused: list = field(default_factory=list)  # ONNX nodes between its inputs' layers and its node (fused into it)

    def to_json(self) -> dict:
        return {key: (str(value) if isinstance(value, float) and not math.isfinite(value) else value)
                for key, value in asdict(self).items()}


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def parse_error_analysis(text: str) -> dict[str, dict]:
    """IR layer name -> {op, entire_cos, entire_euc, single_cos, single_euc} from error_analysis.txt."""
    rows = {}
    for line in text.splitlines():
        match = ROW.match(line.strip())
        if match:
            rows[match["name"]] = {"op": match["op"], "entire_cos": _number(match["ecos"]),
                                   "entire_euc": _number(match["eeuc"]), "single_cos": _number(match["scos"]),
                                   "single_euc": _number(match["seuc"])}
    return rows


def _snr(signal: float, noise: float | None) -> float:
    if noise is None or (isinstance(noise, float) and math.isnan(noise)):
        return -math.inf
    if noise == 0:
        return math.inf
    if signal == 0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def module_stage(node_name: str, stages: dict[str, str] | None = None) -> str | None:
    """The stage of an ONNX node: the label of the longest matching prefix in `stages`, else the torch module
    path of its name up to its last indexed part ("/dec/resblocks.3/convs1.0/Conv" -> "dec/resblocks.3/convs1.0"),
    else the path without the op ("/dec/conv_post/Conv" -> "dec/conv_post"); None for a bare name."""
    if stages:
        matches = [prefix for prefix in stages if node_name.startswith(prefix)]
        if matches:
            return stages[max(matches, key=len)]
    parts = [part for part in node_name.split("/") if part]
    if len(parts) < 2:
        return None
    parts = parts[:-1]
    indexed = [i for i, part in enumerate(parts) if re.search(r"[._]\d+$", part)]
    return "/".join(parts[: indexed[-1] + 1] if indexed else parts)


class _OnnxNames:
    """Tensor -> producing node, and IR name -> ONNX tensor (exact, else the longest prefix cut at - or _)."""

    def __init__(self, model):
        self.producer, self.inputs = {}, {}
        for node in model.graph.node:
            for name in node.output:
                self.producer[name] = node
        self.graph_inputs = {value.name for value in model.graph.input}
        self.node_by_name = {node.name: node for node in model.graph.node}

    def tensor(self, ir_name: str) -> str | None:
        candidate = ir_name
        while candidate:
            if candidate in self.producer or candidate in self.graph_inputs:
                return candidate
            if candidate in self.node_by_name and self.node_by_name[candidate].output:
                return self.node_by_name[candidate].output[0]
            cut = max(candidate.rfind("-"), candidate.rfind("_"))
            if cut <= 0:
                return None
            candidate = candidate[:cut]
        return None


def layer_table(summary: dict, model=None, stages: dict[str, str] | None = None) -> list[LayerError]:
    """Rows in graph order from `ConverterChild.analyse`'s summary; `model` (the ONNX) maps names and walks
    inputs for `growth_db` (without it growth is against the previous row)."""
    parsed = parse_error_analysis(summary.get("error_analysis", ""))
    names = _OnnxNames(model) if model is not None else None
    rows: list[LayerError] = []
    tensor_rows: dict[str, int] = {}  # ONNX tensor -> the latest row that holds it
    for depth, layer in enumerate(summary.get("layers", [])):
        text = parsed.get(layer["name"], {})
        signal = float(layer.get("signal", 0.0))
        entire = _snr(signal, layer.get("noise")) if "missing" not in layer else math.nan
        single = _single_snr(signal, entire, text.get("entire_euc", math.nan), text.get("single_euc", math.nan))
        tensor = names.tensor(layer["name"]) if names else None
        node = names.producer.get(tensor) if tensor else None
        fused: list[str] = []
        if tensor in tensor_rows:  # another IR view of a tensor already shown (a reshape, a pad)
            upstream = [tensor_rows[tensor]]
        else:
            upstream = _upstream_rows(names, node, tensor_rows, fused) if names else []
        if not upstream and rows:
            upstream = [len(rows) - 1]
        worst_in = min((rows[i].entire_snr_db for i in upstream), default=math.inf)
        growth, added = _growth(worst_in, entire)
        rows.append(LayerError(depth, text.get("op") or "?", layer["name"], node.name if node is not None else None,
                               module_stage(node.name, stages) if node is not None and node.name else None,
                               entire, single, text.get("entire_cos", math.nan), text.get("single_cos", math.nan),
                               growth, added, int(layer.get("size", 0)), fused))
        if tensor:
            tensor_rows[tensor] = len(rows) - 1
    return rows


def _growth(worst_in: float, entire: float) -> tuple[float, float]:
    """(dB of SNR lost, dB of noise added relative to the signal) from the worst input's SNR to the layer's.
    SNRs are scale-free, so noise-to-signal ratios of a layer and its inputs can be subtracted."""
    if math.isnan(entire) or math.isnan(worst_in):
        return math.nan, math.nan
    if entire == -math.inf:  # non-finite or all noise: this is where it broke, unless it came broken
        return (math.nan, -math.inf) if worst_in == -math.inf else (math.inf, math.inf)
    growth = worst_in - entire if math.isfinite(worst_in) else math.nan
    nsr_out = 10.0 ** (-entire / 10.0) if math.isfinite(entire) else 0.0
    nsr_in = 10.0 ** (-worst_in / 10.0) if math.isfinite(worst_in) else (0.0 if worst_in > 0 else math.inf)
    added = nsr_out - nsr_in
    return growth, (10.0 * math.log10(added) if added > 0 else -math.inf)


def _single_snr(signal: float, entire_db: float, entire_euc: float, single_euc: float) -> float:
    """The layer-alone SNR: the toolkit's single/entire euclidean ratio applied to the dumps' entire SNR (the
    toolkit rescales some tensors before its euclidean distance, the ratio of its two columns is scale-free)."""
    if math.isnan(single_euc):
        return math.nan
    if single_euc == 0:
        return math.inf
    if entire_euc > 0 and math.isfinite(entire_db):
        return entire_db - 20.0 * math.log10(single_euc / entire_euc)
    return _snr(signal, single_euc**2)


def _upstream_rows(names: _OnnxNames, node, tensor_rows: dict[str, int], fused: list | None = None) -> list[int]:
    """Rows of the nearest IR layers feeding `node`, walking up through ONNX nodes fused away (their names are
    appended to `fused`, nearest first)."""
    if node is None:
        return []
    found, seen, stack = set(), set(), list(node.input)
    while stack:
        tensor = stack.pop()
        if not tensor or tensor in seen:
            continue
        seen.add(tensor)
        if tensor in tensor_rows:
            found.add(tensor_rows[tensor])
        elif tensor in names.producer and len(seen) < 10_000:
            producer = names.producer[tensor]
            if fused is not None and producer.op_type != "Constant" and producer.name not in fused:
                fused.append(producer.name or producer.output[0])
            stack.extend(producer.input)
    return sorted(found)


def ranked(rows: list[LayerError], top: int | None = None) -> list[LayerError]:
    """Rows by the noise they add (relative to their signal), largest first; ties: the lower entire SNR."""
    def key(row: LayerError):
        added = row.added_db if not math.isnan(row.added_db) else -math.inf
        return (-added, row.entire_snr_db if not math.isnan(row.entire_snr_db) else math.inf)

    order = sorted(rows, key=key)
    return order[:top] if top else order


def output_row(rows: list[LayerError], output: str) -> LayerError | None:
    """The row of graph output `output` (the IR keeps the ONNX output names), None if absent."""
    matches = [row for row in rows if row.name == output]
    return matches[-1] if matches else None


def format_rows(rows: list[LayerError]) -> list[str]:
    """A fixed-width table: depth, op, IR layer, ONNX node, stage, entire / single SNR, growth."""
    def fmt(value: float) -> str:
        return f"{value:7.2f}" if math.isfinite(value) else f"{value!s:>7}"

    head = (f"{'depth':>5}  {'op':<12} {'added':>7} {'lost':>7} {'entire':>7} {'single':>7}  {'IR layer':<32} "
            f"{'ONNX node':<40} stage")
    lines = [head, "-" * len(head)]
    for row in rows:
        lines.append(f"{row.depth:>5}  {row.op[:12]:<12} {fmt(row.added_db)} {fmt(row.growth_db)} {fmt(row.entire_snr_db)} "
                     f"{fmt(row.single_snr_db)}  {row.name[:32]:<32} {_node_label(row)[:40]:<40} {row.stage or '-'}")
    return lines


def _node_label(row: LayerError) -> str:
    return (row.onnx_node or "-") + (f" +{len(row.fused)} fused" if row.fused else "")


def culprits(rows: list[LayerError], top: int = TOP_ROWS) -> list[str]:
    """Short names of the top rows for a one-line message: "ONNX node (stage, -x dB)"."""
    out, order = [], ranked(rows, top)
    best = order[0].added_db if order else -math.inf
    for row in order:
        if not math.isfinite(row.added_db) or row.added_db < best - 10.0:  # keep the ones that matter
            continue
        where = (row.onnx_node or row.name) + (f" (+{', '.join(row.fused[:3])})" if row.fused else "")
        lost = f"{row.growth_db:.1f} dB lost, " if math.isfinite(row.growth_db) else ""
        out.append(f"{where} ({row.op}{', ' + row.stage if row.stage else ''}: {lost}{row.entire_snr_db:.1f} dB "
                   "after it)")
    return out
