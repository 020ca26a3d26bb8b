"""The compiler's per-layer table (verbose build log): placement, estimated cycles, traffic, memory.

Input/OutputOperator rows and the rank-adapting Reshapes next to them sit on the CPU in every engine:
they are boundary glue, counted apart from the CPU compute ops that `fail_on_cpu_ops` rejects."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from rkaudio.board.verdict import Verdict, at_most

LOG_PREFIX = re.compile(r"^[DIWE] RKNN: \[[^\]]*\]\s?")
MEMORY_LINE = re.compile(r"Total (?P<kind>Internal|Weight) Memory Size: (?P<size>[0-9.]+)\s*(?P<unit>[KMG]?B)")
UNIT_BYTES = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}
BOUNDARY_OPS = ("InputOperator", "OutputOperator")

ADVICE = ("the listed ops run on the CPU between NPU layers (a round trip through DDR each): rewrite them into "
          "NPU ops (see surgery/; on the RK3566 the attention form of rkaudio/surgery/graph/attention.py), or allow "
          "them (--max-cpu-ops N, a recipe's max_cpu_ops) if their predicted cost, named in the manifest, is "
          "acceptable")


@dataclass(frozen=True)
class Layer:
    id: int
    op_type: str
    dtype: str
    target: str  # NPU or CPU
    input_shapes: tuple[tuple[int, ...], ...]
    output_shape: tuple[int, ...]
    cycles_ddr: int
    cycles_npu: int
    cycles_total: int
    rw_kb: float
    name: str  # the table's FullName, e.g. 'Sin:/dec/Sin'

    @property
    def node(self) -> str:
        """The ONNX node name without the 'OpType:' prefix of FullName."""
        prefix = f"{self.op_type}:"
        return self.name[len(prefix):] if self.name.startswith(prefix) else self.name


@dataclass
class LayerTable:
    layers: list[Layer] = field(default_factory=list)
    boundary_ids: frozenset = frozenset()  # CPU rows that are I/O glue, not compute
    weight_bytes: int = 0
    internal_bytes: int = 0

    @property
    def cpu_compute(self) -> list[Layer]:
        return [l for l in self.layers if l.target == "CPU" and l.id not in self.boundary_ids]

    @property
    def est_cycles(self) -> int:
        return sum(l.cycles_total for l in self.layers)

    @property
    def rw_kb(self) -> float:
        return sum(l.rw_kb for l in self.layers)

    def io_dtypes(self) -> dict:
        """{"inputs": {name: dtype}, "outputs": {...}}: the type the engine holds each graph input and output in
        (the Input/OutputOperator rows; FLOAT16 in an fp16 build, whatever dtype the caller feeds)."""
        return {kind: {l.node: l.dtype for l in self.layers if l.op_type == op}
                for kind, op in (("inputs", "InputOperator"), ("outputs", "OutputOperator"))}

    def ops_json(self) -> dict:
        return {"npu": sum(l.target == "NPU" for l in self.layers), "cpu": len(self.cpu_compute),
                "cpu_boundary": len(self.boundary_ids), "layers": len(self.layers),
                "cpu_ops": [{"name": l.node, "type": l.op_type} for l in self.cpu_compute]}


def _shapes(text: str) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(d) for d in group.split(",") if d) for group in re.findall(r"\(([0-9,]*)\)", text))


def _rank_adapting(layer: Layer) -> bool:
    """A Reshape that only adds or drops unit axes (3-D <-> 4-D around the I/O operators)."""
    if layer.op_type != "Reshape" or not layer.input_shapes:
        return False
    squeeze = lambda shape: tuple(d for d in shape if d != 1)  # noqa: E731
    return squeeze(layer.input_shapes[0]) == squeeze(layer.output_shape)


def _boundary_ids(layers: list[Layer]) -> frozenset:
    """I/O operators, plus the rank-adapting Reshapes in the runs right after the inputs / before the outputs."""
    ids = {l.id for l in layers if l.op_type in BOUNDARY_OPS}
    # The toolkit names an input's adapter '<input>_rs' and may place it later, right before its first use, and an
    # output's '<output>-rs', placed right before that output's operator, which may sit before another output's
    # last layers (a step's cache_out before its pcm).
    adapters = {f"{l.node}_rs" for l in layers if l.op_type == "InputOperator"}
    adapters |= {f"{l.node}-rs" for l in layers if l.op_type == "OutputOperator"}
    ids |= {l.id for l in layers if l.node in adapters and l.target == "CPU" and _rank_adapting(l)}
    for run in (layers, layers[::-1]):
        for layer in run:
            if layer.op_type in BOUNDARY_OPS:
                continue
            if not _rank_adapting(layer):
                break
            if layer.target == "CPU":
                ids.add(layer.id)
    return frozenset(ids)


# ID OpType DataType Target InputShape OutputShape Cycles(DDR/NPU/Total) [SparseRatio, rk3576/2.5.0] RW(KB) FullName
LAYER_ROW = re.compile(
    r"^(?P<id>\d+)\s+(?P<op>\S+)\s+(?P<dtype>\S+)\s+(?P<target>\S+)\s+(?P<inputs>\S+)\s+(?P<output>\S+)\s+"
    r"(?P<ddr>\d+)/(?P<npu>\d+)/(?P<total>\d+)\s+(?:\S+%\s+)?(?P<rw>[0-9.]+)\s+(?P<name>\S.*?)\s*$")


def _table_rows(lines: list[str]) -> list[list[str]]:
    """Row lines of every 'Network Layer Information Table' (after its 'ID  OpType ...' header)."""
    tables, rows = [], None
    for line in lines:
        if line.startswith("ID ") and "OpType" in line and "FullName" in line:
            rows = []
            tables.append(rows)
        elif rows is not None:
            if line.startswith("---"):
                if rows:
                    rows = None
                continue
            rows.append(line)
    return tables


def parse_layer_table(log_text: str) -> LayerTable:
    """Parse the last layer table and the memory totals of a verbose build log (ValueError if there is none)."""
    lines = [LOG_PREFIX.sub("", line) for line in log_text.splitlines()]
    tables = _table_rows(lines)
    if not tables:
        raise ValueError("no 'Network Layer Information Table' in the build log (was the build verbose?)")
    layers = []
    for row in tables[-1]:
        match = LAYER_ROW.match(row)
        if match is None:
            continue
        output_shapes = _shapes(match["output"])
        layers.append(Layer(int(match["id"]), match["op"], match["dtype"], match["target"], _shapes(match["inputs"]),
                            output_shapes[0] if output_shapes else (), int(match["ddr"]), int(match["npu"]),
                            int(match["total"]), float(match["rw"]), match["name"]))
    table = LayerTable(layers, _boundary_ids(layers))
    for line in lines:
        match = MEMORY_LINE.search(line)
        if match:
            size = round(float(match["size"]) * UNIT_BYTES[match["unit"]])
            setattr(table, "internal_bytes" if match["kind"] == "Internal" else "weight_bytes", size)
    return table


DYNAMIC_GRAPH_DONE = re.compile(r"Dynamic Shape: build graph\[(\d+)\] done!")


def shape_set_logs(log_text: str, sets: list[dict]) -> list[str]:
    """The part of a dynamic-shape build log that belongs to each shape set, in `sets` order: the compiler builds
    one graph per set (largest first, whatever the list order) and ends each with 'Dynamic Shape: build graph[i]
    done!', so each part holds that graph's REGTASK lines, its layer table and its memory totals. A part is matched
    to its set by the input shapes of its table's InputOperator rows. ValueError when the log holds another number
    of graphs or a table that matches no set (or two)."""
    ends = [match.end() for match in DYNAMIC_GRAPH_DONE.finditer(log_text)]
    if len(ends) != len(sets):
        raise ValueError(f"the build log ends {len(ends)} dynamic-shape graphs, the engine lists {len(sets)} "
                         "shape sets")
    parts, start = [], 0
    for end in ends:
        parts.append(log_text[start:end])
        start = end
    ordered: list = [None] * len(sets)
    for part in parts:
        fed = {layer.node: layer.output_shape for layer in parse_layer_table(part).layers
               if layer.op_type == "InputOperator"}
        matches = [number for number, entry in enumerate(sets)
                   if all(_elements(fed.get(name, ())) == _elements(shape) for name, shape in entry["inputs"].items())]
        if len(matches) != 1 or ordered[matches[0]] is not None:
            raise ValueError(f"a dynamic-shape layer table with inputs {fed} matches shape sets {matches}")
        ordered[matches[0]] = part
    return ordered


def _elements(shape) -> int:
    count = 1
    for dim in shape:
        count *= int(dim)
    return count


def cpu_ops_verdict(table: LayerTable, allowed: int = 0) -> Verdict:
    """Fails when more than `allowed` compute ops (not I/O glue) are placed on the CPU."""
    ops = table.cpu_compute
    detail = ", ".join(f"{l.op_type}:{l.node}" for l in ops[:20])
    if len(ops) > 20:
        detail += f", ... ({len(ops)} in all)"
    return at_most("cpu_compute_ops", len(ops), allowed, "ops", detail)
