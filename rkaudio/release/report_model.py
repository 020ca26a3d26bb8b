"""The board self-test report (`selftest-report.json`) as a pydantic model: the host's mirror of what
`rkaudio.board.selftest.selftest` writes with the stdlib on the board (the kit ships no pydantic). The tests validate
real reports with it (`rkaudio.core.manifest_model.schema_problems`), and HACKING.md shows its generated schema
(`tools/schema_blocks.py`). Strict, unknown keys kept, as the manifest's model (rkaudio/core/manifest_model.py)."""
from __future__ import annotations

from typing import Dict, List, Literal, Optional

from pydantic import Field

from rkaudio.board.selftest import REPORT_SCHEMA
from rkaudio.core.manifest_model import Entry, Figure, Gate


class Board(Entry):
    """The board the kit ran on (rknnlite.board_info), or {host: true, backend} for a host replay."""

    compatible: Optional[str] = None
    model: Optional[str] = None
    soc: Optional[str] = None
    npu_cores: Optional[int] = None
    kernel: Optional[str] = None
    machine: Optional[str] = None
    python: Optional[str] = None
    driver_version: Optional[str] = None
    runtime_version: Optional[str] = None
    runtime_library: Optional[str] = None
    rknn_toolkit_lite2: Optional[str] = None
    host: Optional[bool] = None
    backend: Optional[str] = None


class Versions(Entry):
    """The toolkit that built the engines (the newest the manifests name) and the board runtime's version."""

    toolkit: str
    runtime: Optional[str]


class Latency(Entry):
    """Milliseconds of the timed runs (None without any)."""

    min: Optional[float]
    median: Optional[float]
    p90: Optional[float]


class Gated(Entry):
    """A row judged by gates: `passed` when every gate passed, the failed gates' details as `detail`."""

    name: str
    passed: bool
    detail: Optional[str] = None
    gates: List[Gate] = []


class EngineOutput(Gated):
    """One output of an engine against the fp32 reference and the simulator outputs the build stored."""

    snr_db_vs_fp32: Figure
    max_abs_vs_fp32: Figure
    snr_db_vs_simulator: Figure
    max_abs_vs_simulator: Figure
    simulator_snr_db_at_build: Figure
    threshold_db: float
    bit_exact_vs_simulator: Optional[bool] = None


class SkippedMask(Entry):
    mask: str
    reason: str


class MaskRun(Entry):
    """One core mask's run: its times and each output's SNR against fp32."""

    init_ms: float
    latency_ms: Latency
    snr_db_vs_fp32: Dict[str, Figure]


class MaskPair(Entry):
    """One output of two core masks compared."""

    a: str
    b: str
    output: str
    snr_db: Figure
    max_abs: Figure


class CoreMasks(Entry):
    """With --core-masks: each mask's run (masks the SoC lacks skipped), the outputs compared."""

    ran: List[str]
    skipped: List[SkippedMask]
    per_mask: Dict[str, MaskRun]
    pairwise: List[MaskPair]


class EngineRun(Entry):
    """One engine (or one shape set of a dynamic engine) on its golden inputs."""

    engine: str
    shape_set: Optional[int] = None
    init_ms: float
    init_rss_kb: Optional[int] = None
    latency_ms: Latency
    predicted_ms: Optional[float] = None
    core_mask: str
    outputs: List[EngineOutput]
    core_masks: Optional[CoreMasks] = None
    passed: bool


class LoopCall(Entry):
    """One engine call of an end-to-end loop against the host's record of it."""

    engine: str
    inputs_identical_to_host: bool
    worst_snr_db_vs_fp32: Optional[Figure]


class LoopOutput(Gated):
    """One output of an end-to-end loop: float outputs by SNR, integer ones identical (or an fp16 tie)."""

    snr_db_vs_fp32: Optional[Figure] = None
    max_abs_vs_fp32: Optional[Figure] = None
    simulator_snr_db_at_build: Optional[Figure] = None
    threshold_db: Optional[float] = None
    identical: Optional[bool] = None
    first_difference: Optional[int] = None
    fp32_margin_there: Optional[float] = None
    tie_margin: Optional[float] = None


class Hearing(Entry):
    """The loop's speech: its WAV, transcript and word error rate (else `detail` says why not)."""

    text: str
    wav: str
    transcript: Optional[str]
    wer: Optional[float]
    errors: Optional[int] = None
    words: Optional[int] = None
    detail: Optional[str] = None


class LoopRun(Entry):
    """One end-to-end golden through the packaged runtime loop."""

    name: str
    loop: str
    calls: int
    recorded_calls: int
    elapsed_ms: float
    calls_with_host_inputs: int
    worst_call_snr_db_vs_fp32: Optional[Figure] = None
    per_call: List[LoopCall]
    outputs: List[LoopOutput]
    hearing: Optional[Hearing] = None
    passed: bool


class SelftestReport(Entry):
    """A self-test run's report; after a setup problem, `error` says what and later sections are absent."""

    schema_: Literal[REPORT_SCHEMA] = Field(alias="schema")
    package: str
    started: str
    runs: int
    core_masks_requested: List[str] = []
    files_checked: Optional[int] = None
    backend: Optional[Literal["rknnlite", "simulator", "onnx"]] = None
    board: Optional[Board] = None
    versions: Optional[Versions] = None
    engines: Optional[List[EngineRun]] = None
    end_to_end: Optional[List[LoopRun]] = None
    passed: Optional[bool] = None
    error: Optional[str] = None
    exit_code: Literal[0, 2, 3]
