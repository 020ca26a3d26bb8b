"""Board milliseconds of one engine call, predicted from the compiler's layer table and the call's I/O.

The layer table prices convolution-type layers only: every elementwise layer (Add, Mul, Pad, Concat, Transpose,
...) shows 0 cycles, and the table has no per-layer dispatch or per-call cost. The spec's board figures show those
are most of the time (Kokoro W=128: about 84 M cycles, 565 ms measured per window). So the prediction is five
terms, each a constant times a figure the layer table or the manifest gives:

- compute:     estimated cycles (DDR/NPU total of every layer) x ms per cycle;
- elementwise: the RW bytes of the NPU layers the table costs at 0 cycles x ms per MB;
- cpu_ops:     the RW bytes of the compute ops placed on the CPU (each a round trip: the NPU hands the tensor to
               the CPU and takes it back) x ms per MB;
- dispatch:    layers (every row but the Input/OutputOperators) x ms per layer;
- call I/O:    per call, the tensors fed and read x ms per tensor, plus their bytes x ms per MB: each input in
               the dtype it is fed (the manifest's, `rkaudio.core.contract.fed_inputs`: float32 unless the contract feeds it
               in fp16, the dtype the engine holds it in), each output as rknnlite returns it (float32 always: its
               Python API has no way to ask for the engine's fp16); the engine holds fp16 in the NPU layout and the
               runtime converts what differs on the CPU.

The constants per SoC are `CONSTANTS` (board_time_constants.json, written by bench/board_time.py from the spec's
board measurements, with which terms were fitted and which assumed)."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from rkaudio.gates.layer_table import BOUNDARY_OPS, LayerTable, parse_layer_table

CONSTANTS_FILE = Path(__file__).with_name("board_time_constants.json")
MB = 1024 * 1024
RETURNED_ITEM_BYTES = 4  # rknnlite returns every output as float32 (rknn_outputs_get with want_float)
TERMS = ("compute", "elementwise", "cpu_ops", "dispatch", "call_io")


@dataclass(frozen=True)
class CallFigures:
    """What the prediction reads from one engine: the layer table's figures and the call's I/O."""
    cycles: int  # estimated cycles, every layer
    elementwise_bytes: int  # RW bytes of the NPU layers the table costs at 0 cycles
    cpu_bytes: int  # RW bytes of the compute ops on the CPU
    layers: int  # table rows other than the Input/OutputOperators
    io_tensors: int  # inputs + outputs of one call
    io_bytes: int  # their bytes as fed (each input's dtype) and returned (float32)

    @classmethod
    def from_table(cls, table: LayerTable, inputs: list[dict], outputs: list[dict]) -> "CallFigures":
        """`inputs` / `outputs`: the manifest's tensor entries ({"shape": [...], "dtype": ...} each)."""
        tensors = [*inputs, *outputs]
        fed = sum(math.prod(t["shape"]) * np.dtype(t["dtype"]).itemsize for t in inputs)
        returned = sum(math.prod(t["shape"]) * RETURNED_ITEM_BYTES for t in outputs)
        return cls(
            cycles=table.est_cycles,
            elementwise_bytes=round(sum(l.rw_kb for l in table.layers if l.cycles_total == 0 and l.target == "NPU"
                                        and l.op_type not in BOUNDARY_OPS) * 1024),
            cpu_bytes=round(sum(l.rw_kb for l in table.cpu_compute) * 1024),
            layers=sum(l.op_type not in BOUNDARY_OPS for l in table.layers),
            io_tensors=len(tensors),
            io_bytes=fed + returned)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Constants:
    """ms per unit of each term's figure, for one SoC."""
    ms_per_cycle: float
    ms_per_elementwise_mb: float
    ms_per_cpu_mb: float
    ms_per_layer: float
    ms_per_io_tensor: float
    ms_per_io_mb: float

    def terms(self, figures: CallFigures) -> dict[str, float]:
        return {
            "compute": figures.cycles * self.ms_per_cycle,
            "elementwise": figures.elementwise_bytes / MB * self.ms_per_elementwise_mb,
            "cpu_ops": figures.cpu_bytes / MB * self.ms_per_cpu_mb,
            "dispatch": figures.layers * self.ms_per_layer,
            "call_io": figures.io_tensors * self.ms_per_io_tensor + figures.io_bytes / MB * self.ms_per_io_mb,
        }

    @classmethod
    def from_json(cls, data: dict) -> "Constants":
        return cls(**{name: float(data[name]) for name in cls.__dataclass_fields__})


def load_constants(path: Path = CONSTANTS_FILE) -> dict:
    """{soc: {"constants": {...}, "basis": "fitted ..." | "assumed ..."}} as bench/board_time.py wrote it."""
    return json.loads(Path(path).read_text())["socs"]


def predict(figures: CallFigures, target: str, constants: dict | None = None) -> dict:
    """The manifest's `predicted_board_ms`: {"ms", "terms": {term: ms}, "figures", "basis"}; None when `target`
    has no constants (a SoC neither fitted nor scaled)."""
    socs = load_constants() if constants is None else constants
    if target not in socs:
        return None
    terms = Constants.from_json(socs[target]["constants"]).terms(figures)
    return {"ms": round(sum(terms.values()), 3), "terms": {name: round(terms[name], 3) for name in TERMS},
            "figures": figures.to_json(), "basis": socs[target]["basis"]}


def priced_ops(table: LayerTable, target: str, constants: dict | None = None) -> dict:
    """The layer table's op counts (`LayerTable.ops_json`) with each CPU compute op's traffic and the ms the model
    predicts it costs (its share of the cpu_ops term; none where `target` has no constants): what a cell that keeps
    a CPU op ships with, so the op and its price are named in the manifest, the summary and the model card."""
    ops = table.ops_json()
    socs = load_constants() if constants is None else constants
    rate = Constants.from_json(socs[target]["constants"]).ms_per_cpu_mb if target in socs else None
    for entry, layer in zip(ops["cpu_ops"], table.cpu_compute):
        entry["rw_kb"] = round(layer.rw_kb, 3)
        if rate is not None:
            entry["predicted_ms"] = round(layer.rw_kb * 1024 / MB * rate, 4)
    return ops


def figures_from_log(manifest: dict, log_text: str) -> CallFigures:
    """The figures of a built engine: its manifest's I/O and its build log's layer table."""
    return CallFigures.from_table(parse_layer_table(log_text), manifest["inputs"], manifest["outputs"])


def predict_from_log(manifest: dict, log_text: str, constants: dict | None = None) -> dict | None:
    """The prediction for an engine built before the model existed, from its manifest and build log."""
    return predict(figures_from_log(manifest, log_text), manifest["target"], constants)

