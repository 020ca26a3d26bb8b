"""The one family pipeline. A family's `export(...)` writes its fixed-shape ONNX files and returns one
`Exported` record per engine; `build` gates the records' export verdicts, compiles each through
`converters.build.engine.build_engine` and reports. A `Job` (converters/family/declaration.py) from the
`convert <name>` command or from a recipe goes through the same `run`, so `--onnx`, `--skip-rknn` and
`make engines` behave alike for every family.

Export verdicts travel in the ONNX contract (`record_export` writes them), so a later `--onnx` build or a
recipe shows the same verdicts as a fresh export."""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from core.contract import get_contract
from core.errors import SetupError
from core.paths import end_to_end_inputs, end_to_end_spec, engine_name, reference_path, selfcheck_path
from gates.verdict import require
from runtime.board.verdict import Verdict


@dataclass(frozen=True)
class Exported:
    """One engine's export: its ONNX, the self-check inputs beside it, the exact fp32 twin the simulator
    is compared with (when the engine graph relies on fp16 arithmetic), the export-stage verdicts, and the
    end-to-end golden (`<name>.e2e.json`) whose loop runs this engine, if the family declared one."""

    onnx: Path
    selfcheck: Path
    reference: Path | None = None
    verdicts: tuple[Verdict, ...] = ()
    end_to_end: Path | None = None

    @classmethod
    def from_onnx(cls, onnx_path: Path, family: str | None = None) -> "Exported":
        """The record of an ONNX exported earlier (by `convert <family> --skip-rknn`): everything is read from
        its contract and the files beside it; `family` refuses an ONNX another family wrote."""
        from core.onnx_graph import load_model

        onnx_path = Path(onnx_path)
        contract = get_contract(load_model(onnx_path))
        command = f"convert {family.replace('_', '-')}" if family else "convert <family>"
        if family is not None and contract.get("family") != family:
            raise SetupError(f"{onnx_path} was not written by `{command}` (its contract names family "
                             f"{contract.get('family')!r}); export it first with `{command} --skip-rknn`")
        selfcheck = selfcheck_path(onnx_path)
        reference = onnx_path.parent / contract["reference_onnx"] if contract.get("reference_onnx") else None
        for needed, what in ((selfcheck, "self-check inputs"), (reference, "exact fp32 twin")):
            if needed is not None and not needed.is_file():
                raise SetupError(f"no {what} {needed} beside {onnx_path}; export it with `{command} --skip-rknn`")
        verdicts = tuple(Verdict.from_json(v) for v in contract.get("export_verdicts", []))
        spec = next((path for path in sorted(onnx_path.parent.glob("*.e2e.json"))
                     if onnx_path.name in json.loads(path.read_text())["onnx"]), None)
        return cls(onnx_path, selfcheck, reference, verdicts, spec)


def record_export(onnx_path: Path, verdicts, *, feeds: dict | None = None, reference: Path | None = None) -> Exported:
    """Finish one engine's export: store `verdicts` (and the twin's file name) in the ONNX contract, write the
    self-check `feeds` (input name -> array) when given, and return the record `build` takes. The self-check
    and the twin use the names `core.paths` defines (`<stem>.selfcheck.npz`, `<stem>.fp32.onnx`)."""
    import numpy as np
    import onnx

    from core.contract import set_contract
    from runtime.board.golden import as_stored

    onnx_path = Path(onnx_path)
    if reference is not None and Path(reference) != reference_path(onnx_path):
        raise ValueError(f"the fp32 twin of {onnx_path.name} must be {reference_path(onnx_path).name}")
    model = onnx.load(str(onnx_path))
    contract = dict(get_contract(model))
    contract["export_verdicts"] = [v.to_json() for v in verdicts]
    if reference is not None:
        contract["reference_onnx"] = Path(reference).name
    onnx.save(set_contract(model, contract), str(onnx_path))
    if feeds is not None:  # in the kit's storage form: the golden's fp32 outputs are then those of the board's inputs
        np.savez(selfcheck_path(onnx_path), **{name: as_stored(value) for name, value in feeds.items()})
    if not selfcheck_path(onnx_path).is_file():
        raise ValueError(f"{onnx_path.name} has no self-check inputs: pass feeds=")
    return Exported(onnx_path, selfcheck_path(onnx_path), Path(reference) if reference else None, tuple(verdicts))


def record_end_to_end(name: str, loop: str, records: list[Exported], inputs: dict, params: dict | None = None,
                      description: str = "") -> list[Exported]:
    """Declare a family's end-to-end golden: its runtime loop (`"runtime.<module>:<function>"`, see
    runtime/board/golden.py) run over the engines of `records` on `inputs` (name -> array) with `params` (JSON).
    Writes `<name>.e2e.json` and `.e2e.npz` beside the ONNX files; returns the records that now name it. The
    build records every engine call of the loop (fp32) and the board kit replays it (converters/build/goldens.py, converters/release/kit.py)."""
    import numpy as np

    from runtime.board.golden import as_stored, load_loop

    load_loop(loop)  # a typo fails at export, not on the board
    spec = end_to_end_spec(records[0].onnx.parent, name)
    spec.write_text(json.dumps({"name": name, "loop": loop, "onnx": [r.onnx.name for r in records],
                                "engines": [engine_name(r.onnx) for r in records], "params": params or {},
                                "description": description}, indent=2) + "\n")
    np.savez(end_to_end_inputs(spec), **{key: as_stored(value) for key, value in inputs.items()})
    return [replace(record, end_to_end=spec) for record in records]


def build(exported: list[Exported], out_dir: Path, options, *, context: str, advice: str = "",
          say: Callable[[str], None] = print) -> list:
    """Print and gate every export verdict, then (unless `options` is None: --skip-rknn) compile each record
    with `options` (`converters.build.engine.BuildOptions`), printing the build's own verdicts and what it wrote,
    and write the self-test kit's golden I/O (`selftest/`) beside the engines.
    Returns the `EngineResult`s in the records' order (what packaging assembles)."""
    from converters.build import goldens
    from converters.build.engine import build_engine

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
    """What a `convert <family>` command and a recipe both do with a `Job` (converters.family.declaration): take
    the records of `--onnx` (the family's own read-back where it declares one) or of the component's export, then
    `build` them into `job.out` with the job's gates (no engine with --skip-rknn), then the family's after-build."""
    from converters.family.declaration import build_options
    from toolkit.versions import check_toolkit

    options = None if skip_rknn else build_options(job.gates, job.target, check_toolkit(job.toolkit), reproduce)
    if from_onnx is not None:
        exported = (job.family.from_onnx(job, Path(from_onnx)) if job.family.from_onnx is not None
                    else [Exported.from_onnx(from_onnx, job.family.name)])
    else:
        exported = job.component.export(job)
    results = build(exported, job.out, options, context=job.context, advice=job.component.advice, say=say)
    if job.family.after_build is not None:
        job.family.after_build(job, results)
    return results


def recipe_snapshot(source: dict, resolve: Callable[[str], object], repo_id: str) -> str:
    """The first of a recipe's `source.dir` (environment variables expanded; an unset one skips it) and
    `source.repo` (a huggingface_hub cache id) that `resolve` accepts; MissingSource saying why none did."""
    import os

    from core.errors import MissingSource

    expanded = os.path.expandvars(source.get("dir") or "")
    errors = []
    for candidate in (c for c in (expanded if "$" not in expanded else "", source.get("repo")) if c):
        try:
            resolve(candidate)
            return candidate
        except SetupError as error:
            errors.append(str(error))
    raise MissingSource(f"no {repo_id} snapshot ({'; '.join(errors) or 'recipe names no source'}); set "
                        "RKAUDIO_MODELS to a folder holding it or put it in the huggingface_hub cache")


def say_engines(job, results: list, say: Callable[[str], None] = print) -> None:
    """Each engine's bytes and CPU-placed ops (an `after_build` for families whose NPU shaping is measured by them)."""
    for result in results:
        cpu = [f"{op['type']}:{op['name']}" for op in result.manifest_data.get("ops", {}).get("cpu_ops", [])]
        say(f"{result.rknn.name}: {result.rknn.stat().st_size} bytes; CPU ops ({len(cpu)}): {', '.join(cpu) or 'none'}")
