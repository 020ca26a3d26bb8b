"""REGTASK and layer-table parsers on real build-log excerpts (tests/gates/data), checked against figures
read off the same text with independent, simpler means."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from rkaudio.core.manifest import worst_overflow
from rkaudio.gates.layer_table import cpu_ops_verdict, parse_layer_table
from rkaudio.gates.regtask import ADVICE, parse_regtask, regtask_verdict

DATA = Path(__file__).parent / "data"
RK3566_SIN = DATA / "rk3566_conv_sin_x3_t16385_2.3.2.log"   # 3 x (Conv, Sin, Add) on [1,22,16385]
RK3576_SIN = DATA / "rk3576_conv_sin_t16385_2.5.0.log"      # has the extra SparseRatio column
RK3588_FLOOR = DATA / "rk3588_conv_floor_t64_2.5.0.log"
# The I/O rows of a tiny Qwen3 step's table (rk3588, 2.3.2): its cache_out adapter sits before the pcm's last layers.
RK3588_STEP_IO = DATA / "rk3588_qwen3_tiny_step_io_2.3.2.log"


def table_rows(text: str) -> list[list[str]]:
    """Rows of the layer table: lines whose text after the log prefix starts with a layer ID and a CamelCase op."""
    rows = []
    for line in text.splitlines():
        body = line.split("] ", 1)[-1]
        if re.match(r"\d+\s+[A-Z]\w+\s+FLOAT16\s+(NPU|CPU)\s", body):
            rows.append(body.split())
    return rows


@pytest.mark.parametrize("log", [RK3566_SIN, RK3576_SIN, RK3588_FLOOR], ids=lambda p: p.stem)
def test_regtask_counts_every_line_and_worst_ratio(log):
    text = log.read_text()
    pairs = [(int(l, 16), int(v, 16)) for l, v in re.findall(r"limit: (0x[0-9a-f]+), value: (0x[0-9a-f]+)", text)]
    report = parse_regtask(text)
    assert report.lines == text.count("REGTASK:") == len(pairs)
    assert report.worst_ratio == pytest.approx(max((v / l for l, v in pairs), default=0.0))
    assert sum(f["lines"] for f in report.fields) == report.lines


def test_regtask_gate_fails_past_the_limit_with_advice():
    report = parse_regtask(RK3566_SIN.read_text())
    assert report.lines > 10
    assert {f["target"] for f in report.fields} == {"lite"}  # rk3566's field set, as the log names it
    failing = regtask_verdict(report, max_lines=10)
    assert not failing.passed and failing.value == report.lines and "lite@0x4038" in failing.detail
    assert regtask_verdict(report, max_lines=report.lines).passed
    assert "narrower window" in ADVICE and "register field" in ADVICE


def test_regtask_none_on_clean_log():
    report = parse_regtask(RK3588_FLOOR.read_text())
    assert (report.lines, report.worst_ratio, report.fields) == (0, 0.0, [])
    assert regtask_verdict(report, max_lines=0).passed


def regtask_log_line(offset: str, limit: str, value: str) -> str:
    return (f"E RKNN: [04:39:33.800] REGTASK: The bit width of field value exceeds the limit, target: lite, "
            f"offset: {offset}, shift = 0, limit: {limit}, value: {value}\n")


def test_the_worst_overflow_is_the_largest_value_over_its_own_fields_limit():
    # 0x1a00 / 0x7ff = 3.25 is the worst although 0x3fe0 (over 0x1fff: 2.00) is the larger value
    log = (regtask_log_line("0x4038", "0x1fff", "0x2011") + regtask_log_line("0x1028", "0x7ff", "0x1a00")
           + regtask_log_line("0x4038", "0x1fff", "0x3fe0"))
    report = parse_regtask(log)
    assert report.worst_ratio == pytest.approx(0x1A00 / 0x7FF)
    worst = "worst 3.25x its field (value 0x1a00, limit 0x7ff, target lite offset 0x1028)"
    assert worst_overflow(report.to_json()) == worst
    verdict = regtask_verdict(report, max_lines=0)
    assert not verdict.passed and verdict.line().endswith(
        f"(threshold 0)  {worst}; fields lite@0x4038 limit 0x1fff x2, lite@0x1028 limit 0x7ff x1")
    assert worst_overflow(parse_regtask(RK3588_FLOOR.read_text()).to_json()) == ""  # no line, no worst


@pytest.mark.parametrize("log", [RK3566_SIN, RK3576_SIN, RK3588_FLOOR], ids=lambda p: p.stem)
def test_layer_table_rows_totals_and_memory(log):
    text = log.read_text()
    rows = table_rows(text)
    table = parse_layer_table(text)
    assert [(l.id, l.op_type, l.target) for l in table.layers] == [(int(r[0]), r[1], r[3]) for r in rows]
    assert table.est_cycles == sum(int(r[6].split("/")[2]) for r in rows)
    # RW(KB) is the second-to-last column in both layouts (with or without SparseRatio).
    assert table.rw_kb == pytest.approx(sum(float(r[-2]) for r in rows))
    internal = re.search(r"Total Internal Memory Size: ([0-9.]+)KB", text)[1]
    weight = re.search(r"Total Weight Memory Size: ([0-9.]+)KB", text)[1]
    assert table.internal_bytes == round(float(internal) * 1024)
    assert table.weight_bytes == round(float(weight) * 1024)


def test_cpu_compute_ops_exclude_io_glue():
    table = parse_layer_table(RK3566_SIN.read_text())
    cpu_rows = [l for l in table.layers if l.target == "CPU"]
    # rk3566 puts the rank-adapting Reshapes next to the I/O operators on the CPU: glue, not compute.
    glue = [l for l in cpu_rows if l.op_type in ("InputOperator", "OutputOperator", "Reshape")]
    assert {l.op_type for l in glue} == {"InputOperator", "OutputOperator", "Reshape"}
    assert table.ops_json()["cpu_boundary"] == len(glue)
    assert [(op["type"], op["name"]) for op in table.ops_json()["cpu_ops"]] == [("Sin", f"sin{i}") for i in range(3)]
    verdict = cpu_ops_verdict(table)
    assert not verdict.passed and verdict.value == 3 and "Sin:sin0" in verdict.detail


def test_an_output_adapter_before_another_outputs_layers_is_io_glue():
    table = parse_layer_table(RK3588_STEP_IO.read_text())
    assert "Reshape:cache_out-rs" in [l.name for l in table.layers if l.target == "CPU"]
    assert [op["name"] for op in table.ops_json()["cpu_ops"]] == ["/step/quantizer/Add"]
    # The same shape change under any other name is compute.
    renamed = parse_layer_table(RK3588_STEP_IO.read_text().replace("Reshape:cache_out-rs", "Reshape:cache_join"))
    assert [op["name"] for op in renamed.ops_json()["cpu_ops"]] == ["/step/quantizer/Add", "cache_join"]


def test_cpu_ops_gate_on_floor_and_clean_npu_sin():
    floor = parse_layer_table(RK3588_FLOOR.read_text())
    assert [op["type"] for op in floor.ops_json()["cpu_ops"]] == ["Floor"]
    assert not cpu_ops_verdict(floor).passed
    rk3576 = parse_layer_table(RK3576_SIN.read_text())  # Sin lands on the NPU on rk3576
    assert rk3576.ops_json()["cpu_ops"] == [] and cpu_ops_verdict(rk3576).passed


def test_a_reshape_inside_the_graph_on_cpu_is_compute():
    text = RK3588_FLOOR.read_text()
    # Move the Floor row's slot to a CPU Reshape that changes the shape (not rank adapting).
    edited = re.sub(r"3    Floor              FLOAT16  CPU    \(1,8,1,64\)                               \(1,8,1,64\)",
                    "3    Reshape            FLOAT16  CPU    (1,8,1,64),(4)                           (1,4,2,64)",
                    text)
    assert edited != text
    table = parse_layer_table(edited)
    assert [op["type"] for op in table.ops_json()["cpu_ops"]] == ["Reshape"]


def test_memory_in_megabytes_and_missing_table():
    text = RK3588_FLOOR.read_text().replace("Total Internal Memory Size: 5KB", "Total Internal Memory Size: 1.5MB")
    assert parse_layer_table(text).internal_bytes == round(1.5 * 1024 * 1024)
    with pytest.raises(ValueError, match="verbose"):
        parse_layer_table("I rknn building done.\n")


@pytest.mark.parametrize("log", [RK3566_SIN, RK3576_SIN, RK3588_FLOOR], ids=lambda p: p.stem)
def test_engine_io_dtypes_are_the_io_operator_rows(log):
    """The type the engine holds each graph input/output in, read off the table's Input/OutputOperator rows."""
    rows = table_rows(log.read_text())
    io = parse_layer_table(log.read_text()).io_dtypes()
    for kind, op in (("inputs", "InputOperator"), ("outputs", "OutputOperator")):
        expected = {r[-1].split(":", 1)[1]: r[2] for r in rows if r[1] == op}
        assert io[kind] == expected and expected, (kind, expected)
