"""Self-test of one rkaudio package, on the board it was built for: `python3 selftest.py` in the package directory.

Needs Python 3.8+, numpy and rknn-toolkit-lite2, nothing else (no rkaudio install, no torch, no onnx): it is
copied unchanged from rkaudio/board/ into every package, with the folder it imports from.

In order:
1. every file against SHA256SUMS (a changed, missing or truncated file stops it: exit 2, each file named);
2. the engines' toolkit version against the board runtime's (an older runtime refuses them: exit 2);
3. every engine on its golden inputs (an engine of several shape sets: each set's): a warm-up, then --runs timed
   runs; SNR and max|d| against the fp32 reference and against the simulator outputs the build measured; init time
   and latency min / median / p90, beside the board time the build's model predicted (the manifest's
   predicted_board_ms: a report, not a gate);
4. with --core-masks, each engine again per NPU core mask, and the SNR between cores (masks the SoC lacks are
   skipped, never run on AUTO);
5. the end-to-end goldens through the packaged runtime loop (every engine call compared with its fp32 record,
   the loop's output gated); a golden made from a sentence (the Piper voice's) is also written as a WAV beside
   the report and, where pocketsphinx imports, transcribed, with its word error rate reported ("not measured"
   without it; a report, not a gate).
Gate: SNR against fp32 >= max(min(simulator SNR, 60 dB) - 6 dB, the recipe's floor); integer outputs (tokens)
identical, or different only past a step whose fp32 top-2 logit margin is within the fp16 tie margin.
The report (JSON; its model, rkaudio/release/report_model.py on the host, and its schema in HACKING.md) goes
outside the package; a table is printed.
Exit 0: every gate passed; 3: a gate failed; 2: a setup problem (files, versions, runtime)."""
from __future__ import annotations

import sys

sys.dont_write_bytecode = True  # a run must leave the package as SHA256SUMS describes it (no __pycache__)

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable, Dict, List, Optional  # noqa: E402

import numpy as np  # noqa: E402

from rkaudio.board import rknnlite as board  # noqa: E402
from rkaudio.board.contract import EngineContract  # noqa: E402
from rkaudio.board.files import KIT_DIR, SUMS_NAME, sha256_file  # noqa: E402
from rkaudio.board.golden import ArrayReader, CallLog, EnginePool, digest, read_index, run_loop  # noqa: E402
from rkaudio.board.numeric import json_safe, max_abs, snr_db  # noqa: E402
from rkaudio.board.shapes import SET_KEY  # noqa: E402
from rkaudio.board.speech import hearing, write_wav  # noqa: E402
from rkaudio.board.verdict import Verdict, at_least, at_most, judged  # noqa: E402

REPORT_NAME = "selftest-report.json"
REPORT_SCHEMA = "rkaudio-selftest/1"
SNR_CAP_DB, SNR_SLACK_DB = 60.0, 6.0
REPLAY_MIN_DB = 120.0  # a host simulator replay must reproduce the simulator outputs the build stored
EXIT_OK, EXIT_SETUP, EXIT_GATE = 0, 2, 3


class SetupProblem(Exception):
    """Something to fix before the engines can be judged (exit 2)."""


def read_sums(package_dir: Path) -> Dict[str, str]:
    """{relative path: sha256} from SHA256SUMS (`sha256sum -c` format, text or binary mode marker)."""
    path = package_dir / SUMS_NAME
    if not path.is_file():
        raise SetupProblem(f"no {SUMS_NAME} in {package_dir}: is this an rkaudio package directory?")
    sums = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        digest, _, name = line.partition(" ")
        if len(digest) != 64 or not name:
            raise SetupProblem(f"{SUMS_NAME} line {number} is not '<sha256>  <file>': {line!r}")
        sums[name[1:] if name[:1] in (" ", "*") else name] = digest.lower()
    return sums


def check_sums(package_dir: Path) -> int:
    """Every file SHA256SUMS lists, checked; SetupProblem naming each missing or changed one."""
    sums = read_sums(package_dir)
    problems = []
    for name, digest in sorted(sums.items()):
        path = package_dir / name
        if not path.is_file():
            problems.append(f"missing: {name}")
        elif sha256_file(path) != digest:
            problems.append(f"changed: {name} ({path.stat().st_size:,} bytes; sha256 differs from {SUMS_NAME})")
    if problems:
        raise SetupProblem(f"{len(problems)} file(s) of the package do not match {SUMS_NAME} (a truncated copy or "
                           "download, or an edited file); copy the package again:\n  " + "\n  ".join(problems))
    return len(sums)


def gate_threshold(simulator_snr: float, floor_db: float) -> float:
    """What the board must reach against fp32: near what the simulator reached (capped), never below the floor."""
    return max(min(float(simulator_snr), SNR_CAP_DB) - SNR_SLACK_DB, float(floor_db))


def snr_gate(name: str, reference, got, threshold: float) -> Verdict:
    """SNR against fp32 >= `threshold`; a golden that is all zeros, constant or non-finite proves nothing, so the
    gate then fails as degenerate, saying why (no full scale is known here: the RMS rule is skipped)."""
    return judged(at_least(f"snr_vs_fp32[{name}]", snr_db(reference, got), threshold, "dB"), reference, None)


def gated_row(name: str, gates: List[Verdict], **figures) -> dict:
    """A report row: the output's figures, `passed` (every gate passed), the failed gates' details as `detail`,
    and the gates themselves (`Verdict.to_json`)."""
    row = {"name": name, **figures, "passed": all(g.passed for g in gates)}
    details = [g.detail for g in gates if not g.passed and g.detail]
    if details:
        row["detail"] = "; ".join(details)
    row["gates"] = [g.to_json() for g in gates]
    return row


def latency(times_ms: List[float]) -> Dict[str, Optional[float]]:
    if not times_ms:
        return {"min": None, "median": None, "p90": None}
    values = np.asarray(times_ms)
    return {"min": float(values.min()), "median": float(np.median(values)), "p90": float(np.percentile(values, 90))}


def resident_kb() -> Optional[int]:
    """This process's resident memory (VmRSS, kB), None where /proc does not tell it."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    except (OSError, StopIteration, ValueError):
        return None


class BoardOpener:
    """Opens engines with rknn-toolkit-lite2 on this board (the default; host replays pass their own opener)."""

    name = "rknnlite"
    replays_simulator = False

    def __init__(self, package_dir: Path):
        self.package_dir = package_dir
        self.info = board.board_info()

    def runtime_version(self) -> Optional[str]:
        return self.info.get("runtime_version")

    def core_count(self) -> Optional[int]:
        return self.info.get("npu_cores")

    def open(self, engine: str, core_mask: str):
        try:
            return board.RknnLiteBackend(self.package_dir / engine, core_mask=core_mask, strict=core_mask != "AUTO")
        except ImportError as error:
            raise SetupProblem(f"rknn-toolkit-lite2 is not importable here ({error}): install the aarch64 wheel of "
                               "the toolkit version the manifests name (rknn-toolkit2's rknn-toolkit-lite2/packages/) "
                               "with pip3, on the board") from None


class SelfTest:
    def __init__(self, package_dir: Path, opener, runs: int, core_masks: List[str], say: Callable[[str], None],
                 report_path: Optional[Path] = None):
        self.package_dir, self.opener, self.runs, self.say = package_dir, opener, runs, say
        self.report_path = report_path or default_report_path(package_dir)
        self.core_masks = core_masks
        self.kit_dir = package_dir / KIT_DIR
        self.index = read_index(self.kit_dir)
        self.arrays = ArrayReader(self.kit_dir / self.index["file"])
        self.manifests = {}
        for entry in self.index["engines"]:
            path = package_dir / entry["manifest"]
            if not path.is_file():
                raise SetupProblem(f"no manifest {entry['manifest']} for {entry['engine']} in {package_dir}")
            self.manifests[entry["engine"]] = json.loads(path.read_text())

    # --- versions ---------------------------------------------------------------------------------------------
    def toolkit_version(self) -> str:
        versions = {m["toolkit_version"] for m in self.manifests.values()}
        return max(versions, key=board.version_tuple)

    def check_versions(self) -> Dict[str, Optional[str]]:
        toolkit, runtime = self.toolkit_version(), self.opener.runtime_version()
        if runtime is not None and board.version_tuple(runtime) < board.version_tuple(toolkit):
            raise SetupProblem(f"the engines were built by rknn-toolkit2 {toolkit}, and this board's runtime "
                               f"(librknnrt) is {runtime}, older: it refuses them. Fix: "
                               + board.RUNTIME_FIX.format(toolkit=toolkit))
        return {"toolkit": toolkit, "runtime": runtime}

    def open(self, engine: str, core_mask: str):
        try:
            return self.opener.open(engine, core_mask)
        except board.RuntimeRefused as refused:
            if core_mask != "AUTO":
                raise
            toolkit = self.manifests[engine]["toolkit_version"]
            raise SetupProblem(f"{engine}: built by rknn-toolkit2 {toolkit}, and the board runtime refused it "
                               f"({refused}). Fix: " + board.RUNTIME_FIX.format(toolkit=toolkit)) from None

    # --- one engine -------------------------------------------------------------------------------------------
    def timed(self, engine: str, core_mask: str, inputs: dict) -> dict:
        resident = resident_kb()
        started = time.perf_counter()
        backend = self.open(engine, core_mask)
        init_ms = (time.perf_counter() - started) * 1e3
        try:
            outputs = backend.run(inputs)  # warm-up; its outputs are the ones compared
            # what opening and a first run at these shapes added to this process (rknnlite reports no context
            # memory; NPU buffers the driver maps outside the process do not show here)
            grown = resident_kb()
            init_rss_kb = grown - resident if grown is not None and resident is not None else None
            times = []
            for _ in range(self.runs):
                started = time.perf_counter()
                backend.run(inputs)
                times.append((time.perf_counter() - started) * 1e3)
            ran_mask = getattr(backend, "core_mask", core_mask)
        finally:
            backend.close()
        return {"init_ms": init_ms, "init_rss_kb": init_rss_kb, "latency_ms": latency(times), "core_mask": ran_mask,
                "outputs": {name: np.asarray(value) for name, value in outputs.items()}}

    def engine(self, entry: dict) -> dict:
        reader = self.arrays
        inputs = reader.tensors(entry["arrays"], "input")
        fp32, simulated = reader.tensors(entry["arrays"], "fp32"), reader.tensors(entry["arrays"], "simulator")
        run = self.timed(entry["engine"], "AUTO", inputs)
        rows = []
        for name, reference in fp32.items():
            got = run["outputs"][name].reshape(reference.shape)
            stored = float(entry["simulator"][name]["snr_db"])
            threshold = gate_threshold(stored, entry["min_snr_db"])
            figures = {"snr_db_vs_fp32": snr_db(reference, got), "max_abs_vs_fp32": max_abs(reference, got),
                       "snr_db_vs_simulator": snr_db(simulated[name], got),
                       "max_abs_vs_simulator": max_abs(simulated[name], got), "simulator_snr_db_at_build": stored,
                       "threshold_db": threshold}
            gates = [snr_gate(name, reference, got, threshold)]
            if self.opener.replays_simulator:
                figures["bit_exact_vs_simulator"] = bool(np.array_equal(simulated[name], got))
                gates.append(at_least(f"replay_snr_vs_simulator[{name}]", figures["snr_db_vs_simulator"],
                                      REPLAY_MIN_DB, "dB"))
            rows.append(gated_row(name, gates, **figures))
        result = {"engine": entry["engine"], **({SET_KEY: entry[SET_KEY]} if SET_KEY in entry else {}),
                  "init_ms": run["init_ms"], "init_rss_kb": run["init_rss_kb"], "latency_ms": run["latency_ms"],
                  "predicted_ms": entry.get("predicted_ms"), "core_mask": run["core_mask"], "outputs": rows,
                  "passed": all(r["passed"] for r in rows)}
        if self.core_masks:
            result["core_masks"] = self.per_core(entry["engine"], inputs, fp32)
        return result

    def per_core(self, engine: str, inputs: dict, fp32: dict) -> dict:
        masks, skipped = board.masks_for(self.core_masks, self.opener.core_count())
        per_mask, outputs = {}, {}
        for mask in masks:
            run = self.timed(engine, mask, inputs)
            outputs[mask] = run["outputs"]
            per_mask[mask] = {"init_ms": run["init_ms"], "latency_ms": run["latency_ms"],
                              "snr_db_vs_fp32": {n: snr_db(ref, run["outputs"][n].reshape(ref.shape))
                                                 for n, ref in fp32.items()}}
        pairs = [{"a": a, "b": b, "output": name, "snr_db": snr_db(outputs[a][name], outputs[b][name]),
                  "max_abs": max_abs(outputs[a][name], outputs[b][name])}
                 for i, a in enumerate(masks) for b in masks[i + 1:] for name in fp32]
        return {"ran": masks, "skipped": [{"mask": m, "reason": f"the SoC has {self.opener.core_count()} NPU core(s)"}
                                          for m in skipped], "per_mask": per_mask, "pairwise": pairs}

    # --- end to end -------------------------------------------------------------------------------------------
    def end_to_end(self, entry: dict) -> dict:
        reader = self.arrays
        inputs, expected = reader.tensors(entry["arrays"], "input"), reader.tensors(entry["arrays"], "output")
        recorded: Dict[int, dict] = {}
        for item in entry["arrays"]:
            if item["role"] == "call_output":
                recorded.setdefault(item["call"], {})[item["tensor"]] = reader.get(item)
        log = CallLog()
        contracts = [(name, EngineContract.from_json(self.manifests[name]["contract"])) for name in entry["engines"]]
        started = time.perf_counter()
        with EnginePool(contracts, lambda name: self.open(name, "AUTO"), self.opener_max_open(), log) as pool:
            outputs = run_loop(entry["loop"], pool.engines, inputs, entry.get("params", {}))
        elapsed_ms = (time.perf_counter() - started) * 1e3
        calls = []
        for number, (engine, feeds, got) in enumerate(log.calls):
            host = entry["calls"][number] if number < len(entry["calls"]) else {"engine": None, "inputs": []}
            same_inputs = host["engine"] == engine and all(
                item["tensor"] in feeds and digest(np.asarray(feeds[item["tensor"]], item["dtype"])) == item["sha256"]
                for item in host["inputs"])
            snrs = [snr_db(want, np.asarray(got[name]).reshape(want.shape))
                    for name, want in recorded.get(number, {}).items() if name in got]
            calls.append({"engine": engine, "inputs_identical_to_host": same_inputs,
                          "worst_snr_db_vs_fp32": min(snrs) if snrs else None})
        rows = [self.e2e_row(entry, name, expected, outputs) for name in expected if not name.endswith(".margin")]
        same_count = len(log.calls) == len(entry["calls"])
        if not same_count:
            rows.append(gated_row("calls", [Verdict(
                "calls", float(len(log.calls)), float(len(entry["calls"])), "engine calls", False,
                f"the loop made {len(log.calls)} engine calls, the host recorded {len(entry['calls'])}")]))
        call_snrs = [c["worst_snr_db_vs_fp32"] for c in calls if c["worst_snr_db_vs_fp32"] is not None]
        result = {"name": entry["name"], "loop": entry["loop"], "calls": len(log.calls),
                  "recorded_calls": len(entry["calls"]), "elapsed_ms": elapsed_ms,
                  "calls_with_host_inputs": sum(c["inputs_identical_to_host"] for c in calls),
                  "worst_call_snr_db_vs_fp32": min(call_snrs) if call_snrs else None, "per_call": calls,
                  "outputs": rows, "passed": all(r["passed"] for r in rows)}
        speech = entry.get("params", {}).get("speech")
        if speech and speech["output"] in outputs:
            result["hearing"] = self.hear(entry["name"], np.asarray(outputs[speech["output"]]), speech)
        return result

    def hear(self, name: str, audio: np.ndarray, speech: dict) -> dict:
        """The golden's speech as this board rendered it: a WAV beside the report, and (where pocketsphinx
        imports) its transcript and word error rate against the sentence it was made from. A report, not a gate:
        the SNR gates judge the numbers."""
        wav = self.report_path.with_name(f"{self.package_dir.name}.{name}.wav")
        write_wav(wav, audio, int(speech["sample_rate"]))
        heard = hearing(audio, int(speech["sample_rate"]), speech["text"])
        self.say(f"  heard: {heard['transcript']!r}, word error rate {heard['wer']:.1%} against {speech['text']!r}"
                 if heard["transcript"] is not None else f"  word error rate {heard['detail']}")
        return {"text": speech["text"], "wav": str(wav), **heard}

    def opener_max_open(self) -> Optional[int]:
        return getattr(self.opener, "max_open", None)

    def e2e_row(self, entry: dict, name: str, expected: dict, outputs: dict) -> dict:
        reference = expected[name]
        if name not in outputs:
            return gated_row(name, [Verdict(f"returned[{name}]", math.nan, 0.0, "", False,
                                            "the loop did not return this output")])
        got = np.asarray(outputs[name])
        if reference.dtype.kind in "iub":
            same = got.shape == reference.shape and bool(np.array_equal(got, reference))
            margins = expected.get(name + ".margin")
            tie = entry.get("params", {}).get("tie_margin")
            if not same and margins is not None and tie is not None and got.shape == reference.shape:
                # a difference is an fp16 tie when the fp32 top-2 margin at its first step is within tie_margin
                first = int(np.argmax(got.reshape(-1) != reference.reshape(-1)))
                margin = float(margins.reshape(-1)[first])
                gate = at_most(f"fp16_tie[{name}]", margin, float(tie), "logit",
                               f"first difference at {first}, fp32 top-2 margin there {margin:.4g}")
                return gated_row(name, [gate], identical=same, first_difference=first, fp32_margin_there=margin,
                                 tie_margin=float(tie))
            differing = int(np.sum(got != reference)) if got.shape == reference.shape else math.inf
            return gated_row(name, [at_most(f"identical[{name}]", differing, 0, "differing values")], identical=same)
        stored = float(entry["simulator"][name]["snr_db"])
        got = got.reshape(reference.shape)
        threshold = gate_threshold(stored, entry["min_snr_db"])
        return gated_row(name, [snr_gate(name, reference, got, threshold)], snr_db_vs_fp32=snr_db(reference, got),
                         max_abs_vs_fp32=max_abs(reference, got), simulator_snr_db_at_build=stored,
                         threshold_db=threshold)

    # --- all --------------------------------------------------------------------------------------------------
    def run(self, only: Optional[List[str]] = None, end_to_end: bool = True) -> dict:
        engines = [e for e in self.index["engines"] if not only or e["engine"] in only]
        report = {"engines": [], "end_to_end": []}
        for number, entry in enumerate(engines, 1):
            shape_set = f" (shape set {entry[SET_KEY]})" if SET_KEY in entry else ""
            self.say(f"[{number}/{len(engines)}] {entry['engine']}{shape_set} ...")
            report["engines"].append(self.engine(entry))
        if end_to_end:
            for entry in self.index.get("end_to_end", []):
                self.say(f"end to end: {entry['name']} ({entry['loop']}, {len(entry.get('calls', []))} calls) ...")
                report["end_to_end"].append(self.end_to_end(entry))
        report["passed"] = all(r["passed"] for r in report["engines"] + report["end_to_end"])
        return report


def default_report_path(package_dir: Path) -> Path:
    """selftest-report.json in the working directory, unless that is inside the package (which SHA256SUMS
    describes): then beside the package, as <package>.selftest-report.json."""
    cwd = Path.cwd().resolve()
    if cwd == package_dir or package_dir in cwd.parents:
        return package_dir.parent / f"{package_dir.name}.{REPORT_NAME}"
    return cwd / REPORT_NAME


def fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}" if math.isfinite(value) else str(value)
    return str(value)


def table(report: dict) -> str:
    rows = [("engine / loop", "output", "init ms", "median ms", "predicted ms", "p90 ms", "SNR fp32", "need",
             "SNR sim", "")]
    for engine in report.get("engines", []):
        for out in engine["outputs"]:
            rows.append((engine["engine"], out["name"], fmt(engine["init_ms"]), fmt(engine["latency_ms"]["median"], 2),
                         fmt(engine.get("predicted_ms"), 2), fmt(engine["latency_ms"]["p90"], 2),
                         fmt(out["snr_db_vs_fp32"]), fmt(out["threshold_db"]), fmt(out["snr_db_vs_simulator"]),
                         "PASS" if out["passed"] else "FAIL"))
        for pair in engine.get("core_masks", {}).get("pairwise", []):
            rows.append(("  cores " + pair["a"] + " vs " + pair["b"], pair["output"], "", "", "", "",
                         fmt(pair["snr_db"]), "", "", ""))
        for skipped in engine.get("core_masks", {}).get("skipped", []):
            rows.append(("  core mask " + skipped["mask"], "skipped", "", "", "", "", "", "", "", skipped["reason"]))
    for loop in report.get("end_to_end", []):
        for out in loop["outputs"]:
            value = fmt(out.get("snr_db_vs_fp32")) if "snr_db_vs_fp32" in out else (
                "identical" if out.get("identical") else "differs")
            rows.append((f"e2e {loop['name']} ({loop['calls']} calls)", out["name"], "", fmt(loop["elapsed_ms"]),
                         "", "", value, fmt(out.get("threshold_db")), "", "PASS" if out["passed"] else "FAIL"))
        heard = loop.get("hearing")
        if heard:
            rows.append((f"e2e {loop['name']} heard", "WER", "", "", "", "",
                         fmt(heard["wer"] * 100) + "%" if heard["wer"] is not None else "-", "", "",
                         repr(heard["transcript"]) if heard["transcript"] is not None else heard["detail"]))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def selftest(package_dir: Path, opener=None, runs: int = 20, core_masks: Optional[List[str]] = None,
             report_path: Optional[Path] = None, only: Optional[List[str]] = None, end_to_end: bool = True,
             say: Callable[[str], None] = print) -> int:
    """Run the kit of `package_dir` with `opener` (default: rknnlite on this board); write the report; the exit code.
    The report goes outside the package (SHA256SUMS describes every file there; a report inside one is refused), and
    a folder without SHA256SUMS, which is no package, gets none unless `report_path` asks for it."""
    package_dir = Path(package_dir).resolve()
    asked = report_path is not None
    report_path = Path(report_path).resolve() if asked else default_report_path(package_dir)
    if package_dir in report_path.parents:
        say(f"setup problem: the report {report_path} would be a file inside the package, which {SUMS_NAME} "
            f"describes; write it outside {package_dir}")
        return EXIT_SETUP
    write_report = asked or (package_dir / SUMS_NAME).is_file()
    report = {"schema": REPORT_SCHEMA, "package": package_dir.name, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "runs": runs, "core_masks_requested": core_masks or []}
    code = EXIT_SETUP
    try:
        report["files_checked"] = check_sums(package_dir)
        opener = opener or BoardOpener(package_dir)
        report["backend"] = opener.name
        report["board"] = getattr(opener, "info", None)
        test = SelfTest(package_dir, opener, runs, core_masks or [], say, report_path)
        report["versions"] = test.check_versions()
        report.update(test.run(only, end_to_end))
        code = EXIT_OK if report["passed"] else EXIT_GATE
    except SetupProblem as problem:
        report["error"] = str(problem)
        say(f"setup problem: {problem}")
    finally:
        if opener is not None and hasattr(opener, "close"):  # a host replay keeps simulator children between phases
            opener.close()
    report["exit_code"] = code
    if write_report:
        report_path.write_text(json.dumps(json_safe(report), indent=2) + "\n")
    if report.get("engines") is not None:
        say(table(report))
    verdict = {EXIT_OK: "every gate passed", EXIT_GATE: "a gate FAILED", EXIT_SETUP: "setup problem"}[code]
    say(f"{verdict}; report: {report_path}" if write_report else f"{verdict}; no report written")
    return code


def arguments(argv: Optional[List[str]] = None):
    parser = argparse.ArgumentParser(prog="selftest.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Exit codes: 0 every gate passed, 3 a gate failed, 2 a setup problem.")
    parser.add_argument("--runs", type=int, default=20, help="timed runs per engine after one warm-up (default 20)")
    parser.add_argument("--core-masks", default="", help="also run each engine per NPU core mask and compare the "
                        "cores, e.g. 0,1,2,0_1_2 (masks the SoC lacks are reported as skipped)")
    parser.add_argument("--report", type=Path, default=None, help=f"where to write the JSON report, outside the "
                        f"package (default: {REPORT_NAME} in the working directory, or beside the package when run "
                        f"inside it)")
    parser.add_argument("--only", action="append", default=None, metavar="ENGINE", help="test only this engine file")
    parser.add_argument("--no-end-to-end", action="store_true", help="skip the end-to-end goldens")
    args = parser.parse_args(argv)
    if args.runs < 0:
        parser.error("--runs must be >= 0")
    args.core_masks = [m for m in args.core_masks.split(",") if m]
    try:
        board.masks_for(args.core_masks, None)
    except ValueError as error:
        parser.error(str(error))
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = arguments(argv)
    here = Path(os.path.abspath(__file__)).parent
    return selftest(here, runs=args.runs, core_masks=args.core_masks, report_path=args.report, only=args.only,
                    end_to_end=not args.no_end_to_end)


if __name__ == "__main__":
    sys.exit(main())
