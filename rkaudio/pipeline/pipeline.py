"""The one family pipeline. A family's `export(...)` writes its fixed-shape ONNX files and returns one
`Exported` record per engine; `build` gates the records' export verdicts, compiles each through
`rkaudio.engine.build.build_engine` and reports. A `Job` (rkaudio/pipeline/declaration.py) from the
`convert <name>` command or from a recipe goes through the same `run`, so `--onnx`, `--skip-rknn` and
`make engines` behave alike for every family.

Export verdicts travel in the ONNX contract (`record_export` writes them), so a later `--onnx` build or a
recipe shows the same verdicts as a fresh export."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from rkaudio.pipeline.exported import Exported, record_end_to_end, record_export  # noqa: F401 (the families' API)
from rkaudio.core.paths import engine_name
from rkaudio.gates.verdict import require


def build(exported: list[Exported], out_dir: Path, options, *, context: str, advice: str = "",
          say: Callable[[str], None] = print) -> list:
    """Print and gate every export verdict, then (unless `options` is None: --skip-rknn) compile each record
    with `options` (`rkaudio.engine.build.BuildOptions`), printing the build's own verdicts and what it wrote,
    and write the self-test kit's golden I/O (`selftest/`) beside the engines.
    Returns the `EngineResult`s in the records' order (what packaging assembles)."""
    from rkaudio.engine import goldens
    from rkaudio.engine.build import build_engine

    # Records of one export often share verdicts (one gate over many graphs): each is shown once.
    verdicts = list(dict.fromkeys(verdict for record in exported for verdict in record.verdicts))
    for verdict in verdicts:
        say(verdict.line())
    require(verdicts, advice=advice, context=context)
    if options is None:
        for record in exported:
            say(f"wrote {record.onnx} and {record.selfcheck.name}")
        return []
    recordings = goldens.record_end_to_end(exported, say)  # fp32 engine calls, run in the simulator at each build
    results = []
    for record in exported:
        calls = goldens.calls_of(recordings, engine_name(record.onnx))
        result = build_engine(record.onnx, out_dir, options, selfcheck=record.selfcheck,
                              export_verdicts=record.verdicts, reference_onnx=record.reference,
                              golden_feeds=[feeds for feeds, _ in calls])
        for verdict in result.verdicts[len(record.verdicts):]:
            say(verdict.line())
        say(f"wrote {result.rknn} and {result.manifest.name}")
        results.append(result)
    kit_dir = goldens.write_goldens(Path(out_dir), exported, results, recordings, options.min_simulator_snr_db)
    say(f"wrote {kit_dir} (self-test golden I/O, {goldens.tree_bytes(kit_dir):,} bytes)")
    return results


def run(job, *, skip_rknn: bool = False, from_onnx: Path | None = None, reproduce: bool = False,
        say: Callable[[str], None] = print) -> list:
    """What a `convert <family>` command and a recipe both do with a `Job` (rkaudio.pipeline.declaration): take
    the records of `--onnx` (the family's own read-back where it declares one) or of the component's export (its
    ladder merged into one engine with `ladder = "dynamic"`, rkaudio.pipeline.ladder), then
    `build` them into `job.out` with the job's gates (no engine with --skip-rknn), then the family's after-build."""
    from rkaudio.pipeline.declaration import build_options

    options = None if skip_rknn else build_options(job.gates, job.target, job.toolkit, reproduce,
                                                   job.family.real_time)
    if from_onnx is not None:
        exported = (job.family.from_onnx(job, Path(from_onnx)) if job.family.from_onnx is not None
                    else [Exported.from_onnx(from_onnx, job.family.contract_name)])
    else:
        exported = job.component.export(job)
        if getattr(job.options, "ladder", "static") == "dynamic":
            from rkaudio.pipeline.ladder import dynamic_ladder

            exported = dynamic_ladder(exported, job.component.ladder, say, job.toolkit)
    results = build(exported, job.out, options, context=job.context, advice=job.component.advice, say=say)
    if job.family.after_build is not None:
        job.family.after_build(job, results)
    return results


def say_engines(job, results: list, say: Callable[[str], None] = print) -> None:
    """Each engine's bytes and CPU-placed ops (an `after_build` for families whose NPU shaping is measured by them)."""
    for result in results:
        cpu = [f"{op['type']}:{op['name']}" for op in result.manifest_data.get("ops", {}).get("cpu_ops", [])]
        say(f"{result.rknn.name}: {result.rknn.stat().st_size} bytes; CPU ops ({len(cpu)}): {', '.join(cpu) or 'none'}")
