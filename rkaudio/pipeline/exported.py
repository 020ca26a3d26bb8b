"""An engine's export record: `Exported` (its ONNX, self-check, fp32 twin, export verdicts, end-to-end golden),
`record_export` (what ends each engine's export) and `record_end_to_end` (a family's end-to-end golden). The
pipeline (`rkaudio.pipeline.pipeline`) builds from these records; `rkaudio.pipeline.ladder` merges them."""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from rkaudio.core.contract import contract_of
from rkaudio.core.errors import SetupError
from rkaudio.core.paths import end_to_end_inputs, end_to_end_spec, engine_name, reference_path, selfcheck_path
from rkaudio.board.verdict import Verdict


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
        its contract and the files beside it; `family` (the family as contracts and commands name it,
        `Family.contract_name`) refuses an ONNX another family wrote."""
        from rkaudio.core.onnx_graph import load_model

        onnx_path = Path(onnx_path)
        contract = contract_of(load_model(onnx_path))
        command = f"convert {family or '<family>'}"
        if family is not None and contract.family != family:
            raise SetupError(f"{onnx_path} was not written by `{command}` (its contract names family "
                             f"{contract.family!r}); export it first with `{command} --skip-rknn`")
        selfcheck = selfcheck_path(onnx_path)
        reference = onnx_path.parent / contract.reference_onnx if contract.reference_onnx else None
        for needed, what in ((selfcheck, "self-check inputs"), (reference, "exact fp32 twin")):
            if needed is not None and not needed.is_file():
                raise SetupError(f"no {what} {needed} beside {onnx_path}; export it with `{command} --skip-rknn`")
        verdicts = tuple(Verdict.from_json(v) for v in contract.export_verdicts or [])
        spec = next((path for path in sorted(onnx_path.parent.glob("*.e2e.json"))
                     if onnx_path.name in json.loads(path.read_text())["onnx"]), None)
        return cls(onnx_path, selfcheck, reference, verdicts, spec)


def record_export(onnx_path: Path, verdicts, *, feeds: dict | None = None, reference: Path | None = None) -> Exported:
    """Finish one engine's export: store `verdicts` (and the twin's file name) in the ONNX contract, write the
    self-check `feeds` (input name -> array) when given, and return the record `build` takes. The self-check
    and the twin use the names `rkaudio.core.paths` defines (`<stem>.selfcheck.npz`, `<stem>.fp32.onnx`)."""
    import numpy as np
    import onnx

    from rkaudio.core.contract import set_contract
    from rkaudio.board.golden import as_stored

    onnx_path = Path(onnx_path)
    if reference is not None and Path(reference) != reference_path(onnx_path):
        raise ValueError(f"the fp32 twin of {onnx_path.name} must be {reference_path(onnx_path).name}")
    model = onnx.load(str(onnx_path))
    contract = contract_of(model).replace(export_verdicts=[v.to_json() for v in verdicts])
    if reference is not None:
        contract = contract.replace(reference_onnx=Path(reference).name)
    onnx.save(set_contract(model, contract), str(onnx_path))
    if feeds is not None:  # in the kit's storage form: the golden's fp32 outputs are then those of the board's inputs
        np.savez(selfcheck_path(onnx_path), **{name: as_stored(value) for name, value in feeds.items()})
    if not selfcheck_path(onnx_path).is_file():
        raise ValueError(f"{onnx_path.name} has no self-check inputs: pass feeds=")
    return Exported(onnx_path, selfcheck_path(onnx_path), Path(reference) if reference else None, tuple(verdicts))


def record_end_to_end(name: str, loop: str, records: list[Exported], inputs: dict, params: dict | None = None,
                      description: str = "") -> list[Exported]:
    """Declare a family's end-to-end golden: its runtime loop (`"runtime.<module>:<function>"`, see
    rkaudio/board/golden.py) run over the engines of `records` on `inputs` (name -> array) with `params` (JSON).
    Writes `<name>.e2e.json` and `.e2e.npz` beside the ONNX files; returns the records that now name it. The
    build records every engine call of the loop (fp32) and the board kit replays it (rkaudio/engine/goldens.py, rkaudio/release/kit.py)."""
    import numpy as np

    from rkaudio.board.golden import as_stored, load_loop

    load_loop(loop)  # a typo fails at export, not on the board
    spec = end_to_end_spec(records[0].onnx.parent, name)
    spec.write_text(json.dumps({"name": name, "loop": loop, "onnx": [r.onnx.name for r in records],
                                "engines": [engine_name(r.onnx) for r in records], "params": params or {},
                                "description": description}, indent=2) + "\n")
    np.savez(end_to_end_inputs(spec), **{key: as_stored(value) for key, value in inputs.items()})
    return [replace(record, end_to_end=spec) for record in records]
