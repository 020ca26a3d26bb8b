"""Assemble a release package: `dist/<target>/<package>_<target>/` with every engine, its manifest and
build log, one merged `exec_plan.json`, the model card (rkaudio/release/card.py) and the board self-test
kit (rkaudio/release/kit.py: `selftest/`, `selftest.py`, `rkaudio/board/`, `SHA256SUMS`); plus the summary
table `make engines` prints. The ONNX files the engines were compiled from stay in `onnx_dir()` (beside dist/,
named by each manifest relatively) for host replays.

The package is staged in a hidden directory beside its final place and renamed in one step, so a
failed or interrupted build never leaves a half-written package behind."""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from rkaudio.board.contract import EngineContract
from rkaudio.release import kit
from rkaudio.release.card import CARD_NAME, model_card
from rkaudio.release.kit import write_file
from rkaudio.core.errors import PackageError
from rkaudio.core.manifest import manifest_text


KEY_NAME = "build-key.json"  # what determined the package (rkaudio.release.recipes.package_key)


def package_name(package: str, target: str) -> str:
    return f"{package}_{target}"


def onnx_dir(dist_dir: Path, target: str, name: str) -> Path:
    """Where `convert engines` keeps a package's ONNX (and self-check inputs, twins, goldens): work/dist/<target>/
    <package>_<target>/ beside dist/."""
    return Path(dist_dir).resolve().parent / "work" / Path(dist_dir).name / target / name


def merge_exec_plan(engines: list[tuple[str, EngineContract]]) -> dict:
    """The consumer's session options selecting every engine: `{option: {component: {impl, artifacts, params}}}`.

    `engines` are (file name in the package, contract). Engines sharing a component and role form a ladder:
    a comma-separated `main` (or other role) in `ladder_key` order, as the runtime expects. An engine of several
    shape sets fills the role of each of its sets, and a ladder role it fills alone names it once."""
    slots: dict[tuple[str, str, str], list[tuple[EngineContract, str]]] = {}
    params: dict[tuple[str, str], dict] = {}
    for file_name, contract in engines:
        for view in contract.views():
            slots.setdefault((view.exec_plan_option, view.component, view.role), []).append((view, file_name))
        option, component = contract.exec_plan_option, contract.component
        if contract.exec_params is not None:
            known = params.setdefault((option, component), contract.exec_params)
            if known != contract.exec_params:
                raise PackageError(f"engines of {option} component '{component}' disagree on exec_params: "
                                   f"{known} vs {contract.exec_params} ({file_name})")
    plan: dict = {}
    for (option, component, role), members in sorted(slots.items()):
        if len(members) > 1 and any(view.ladder_key is None for view, _ in members):
            raise PackageError(f"{len(members)} engines fill {option} '{component}' role '{role}' "
                               f"({', '.join(name for _, name in members)}) but not all carry a ladder_key "
                               "to order them")
        ordered = list(dict.fromkeys(name for _, name in sorted(members, key=lambda m: m[0].ladder_order)))
        entry = plan.setdefault(option, {}).setdefault(component, {"impl": "rknn", "artifacts": {}})
        entry["artifacts"][role] = ",".join(ordered)
        if (option, component) in params:
            entry["params"] = params[(option, component)]
    return plan


@contextmanager
def staged_package(dist_target_dir: Path, name: str, keep_work_at: Path | None = None) -> Iterator[tuple[Path, Path]]:
    """Yield (work_dir, package_dir) inside a hidden staging dir; on normal exit the package dir replaces
    `dist_target_dir/name` (and the work dir replaces `keep_work_at`, when given). On any error nothing is
    published and the staging dir is removed."""
    dist_target_dir.mkdir(parents=True, exist_ok=True)
    for stale in dist_target_dir.glob(f".{name}.*.partial"):  # left by a killed run
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".partial", dir=dist_target_dir))
    work_dir, package_dir = staging / "work", staging / name
    work_dir.mkdir()
    package_dir.mkdir()
    try:
        yield work_dir, package_dir
        if keep_work_at is not None:
            keep_work_at = Path(keep_work_at)
            keep_work_at.parent.mkdir(parents=True, exist_ok=True)
            if keep_work_at.exists():
                keep_work_at.rename(staging / "previous-work")
            work_dir.rename(keep_work_at)
        final = dist_target_dir / name
        if final.exists():
            # Rename the old one aside first: the final name never points at a mix of old and new.
            old = staging / "previous"
            final.rename(old)
        package_dir.rename(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def assemble(results: list, package_dir: Path, work_dir: Path | None = None,
             onnx_home: tuple[Path, Path] | None = None, recipe: dict | None = None,
             target: str | None = None, build_key: dict | None = None) -> list[dict]:
    """Copy each engine (`rkaudio.engine.build.EngineResult`), its manifest and build log, and the files its
    contract lists under `package_files`, into `package_dir`; write the merged `exec_plan.json`; add the
    self-test kit from `work_dir` (where the engines were built: its `selftest/`) with SHA256SUMS.
    `onnx_home` = (final ONNX folder, final package folder): each manifest then names its ONNX relatively.
    With `recipe` and `target`, the model card (README.md, rkaudio/release/card.py) is written too; `build_key`
    (rkaudio.release.recipes.package_key) goes into build-key.json.
    Returns the manifests as written."""
    from rkaudio.host.exec_plan import plan_problems, shared_file_problems

    seen: set[str] = set()
    manifests, engines = [], []
    for result in results:
        files = (Path(result.rknn), Path(result.manifest), Path(result.build_log))
        clash = [f.name for f in files if f.name in seen]
        if clash:
            raise PackageError(f"two engines of the package write {clash}: give their ONNX files distinct names")
        for source in files:
            write_file(package_dir / source.name, source)
            seen.add(source.name)
        built_onnx = Path(result.manifest).parent / result.manifest_data["onnx"]["path"]
        manifest = result.manifest_data
        if onnx_home is not None:
            onnx_folder, final_dir = onnx_home
            manifest = {**manifest, "onnx": {**manifest["onnx"], "path": os.path.relpath(
                Path(onnx_folder) / built_onnx.name, final_dir)}}
            write_file(package_dir / Path(result.manifest).name, text=manifest_text(manifest))
        manifests.append(manifest)
        contract = EngineContract.from_json(manifest["contract"])
        engines.append((Path(result.rknn).name, contract))
        # Files the runtime needs beside the engines (a plan, a CPU-side table), named by the contract
        # relative to the ONNX they were exported with; shared by many engines, copied once.
        for name in contract.package_files or []:
            if name not in seen:
                source = built_onnx.parent / name
                if not source.is_file():
                    raise PackageError(f"{Path(result.rknn).name}'s contract names {name}, not found at {source}")
                write_file(package_dir / name, source)
                seen.add(name)
    plan = merge_exec_plan(engines)
    refused = plan_problems(plan) + shared_file_problems(plan, {Path(r.rknn).name: m for r, m in zip(results, manifests)})
    if refused:  # the consumer would refuse the package: a contract that disagrees with the spec's table
        raise PackageError("the merged exec_plan.json breaks the consumer's rules (rkaudio/host/exec_plan.py): "
                           + "; ".join(refused))
    write_file(package_dir / "exec_plan.json", text=json.dumps(plan, indent=2) + "\n")
    if recipe is not None:
        write_file(package_dir / CARD_NAME, text=model_card(recipe, target, manifests, plan,
                                                                (build_key or {}).get("sources")))
    if build_key is not None:
        write_file(package_dir / KEY_NAME, text=json.dumps(build_key, indent=2) + "\n")
    if work_dir is not None:
        kit.add_to_package(package_dir, work_dir)
    return manifests


def summary_row(package: str, status: str, manifests: list[dict] = (), gate_results: list[dict] = (),
                package_dir: Path | None = None, components: str | None = None) -> dict:
    """One line of the `make engines` table from the package's manifests (or, for a failed build, from the
    verdicts of the failure); with `package_dir`, the package's and its self-test kit's bytes; `components`:
    what a several-component package holds on this target (rkaudio.release.recipes.components_cell)."""
    from rkaudio.board.verdict import worst_snr_db

    gates = [g for m in manifests for g in m.get("gates", [])] + list(gate_results)
    return {
        "package": package,
        "status": status,
        "components": components,
        "gates": f"{sum(bool(g['passed']) for g in gates)}/{len(gates)}" if gates else "-",
        "worst_snr_db": worst_snr_db(gates),
        "engine_bytes": sum(m["rknn"]["bytes"] for m in manifests) if manifests else None,
        "cpu_ops": sum(m["ops"]["cpu"] for m in manifests) if manifests else None,
        "cpu_op_types": cpu_op_types(manifests),
        "regtask_lines": sum(m["regtask"]["lines"] for m in manifests) if manifests else None,
        "predicted_board_ms": predicted_span(manifests),
        "kit_bytes": kit.kit_size(package_dir) if package_dir is not None else None,
        "package_bytes": kit.tree_bytes(package_dir) if package_dir is not None else None,
    }


def cpu_op_types(manifests: list[dict]) -> str | None:
    """The CPU ops of a package's engines by type, with their predicted ms summed: "3 Transpose 0.21 ms; 1 Mul"
    (None when there are none)."""
    by_type: dict[str, list] = {}
    for op in (op for m in manifests for op in m["ops"].get("cpu_ops", [])):
        by_type.setdefault(op["type"], []).append(op.get("predicted_ms"))
    if not by_type:
        return None
    parts = []
    for op_type, costs in sorted(by_type.items(), key=lambda item: -len(item[1])):
        priced = [c for c in costs if c is not None]
        parts.append(f"{len(costs)} {op_type}" + (f" {sum(priced):.3g} ms" if priced else ""))
    return "; ".join(parts)


def predicted_span(manifests: list[dict]) -> str | None:
    """The engines' predicted board ms per call (manifest `predicted_board_ms`): one figure, or the range over a
    package's engines (a ladder's rungs are alternatives, so a sum would mean nothing)."""
    values = sorted(m["predicted_board_ms"]["ms"] for m in manifests if m.get("predicted_board_ms"))
    if not values:
        return None
    return f"{values[0]:,.1f}" if values[0] == values[-1] else f"{values[0]:,.1f}-{values[-1]:,.1f}"


def format_table(rows: list[dict], columns: list[str] | None = None) -> str:
    """Rows of dicts as an aligned text table (None prints as '-', floats with 4 significant digits)."""
    columns = columns or list(dict.fromkeys(key for row in rows for key in row))

    def cell(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.4g}" if math.isfinite(value) else str(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return f"{value:,}"
        return str(value)

    cells = [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) if cells else len(c) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines)
