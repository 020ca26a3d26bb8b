"""Recipe machinery with fake families: a missing source is one skip line, a failing gate or a family bug
fails that recipe only (exit code 3) and never leaves its package dir, the others still build."""
import hashlib
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from rkaudio.engine import goldens
from rkaudio.release import kit, recipes, scheduler
from rkaudio.pipeline.pipeline import Exported
from typing import Optional

from rkaudio.cli.commands import engines
from rkaudio.cli.families import declaration
from rkaudio.engine.build import EngineResult
from rkaudio.pipeline.declaration import Component, Family, Table, option
from rkaudio.core.errors import GateFailure, MissingSource, SetupError
from rkaudio.core.manifest import write_manifest
from rkaudio.board.verdict import at_least, at_most


def _write_recipe(directory: Path, package: str, family: str, targets=("rk3588",), extra: str = "") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    listed = ", ".join(f'"{t}"' for t in targets)
    (directory / f"{package}.toml").write_text(f'package = "{package}"\nfamily = "{family}"\ntargets = [{listed}]\n{extra}')


def _fake_engine(work_dir: Path, stem: str, snr: float, component: str = "decoder", outputs: dict | None = None,
                 ladder_key: int | None = None) -> EngineResult:
    """An engine as build_engine leaves it: .rknn, manifest and log in the work dir (`outputs`: its fp32 and
    simulator outputs of the self-check, for the kit)."""
    rknn, manifest, log = work_dir / f"{stem}.rknn", work_dir / f"{stem}.manifest.json", work_dir / f"{stem}.build.log"
    rknn.write_bytes(b"\0" * 100)
    log.write_text("build log\n")
    verdict = at_least("simulator_snr[y]", snr, 35.0, "dB")
    contract = {"family": "fake", "component": component, "role": "main", "exec_plan_option": "piper_tts.exec_plan"}
    digest = hashlib.sha256(b"\0" * 100).hexdigest()
    data = {"family": "fake", "component": component, "role": "main", "target": "rk3588", "toolkit_version": "2.3.2",
            "producer": {}, "inputs": [], "outputs": [], "onnx": {"path": f"{stem}.onnx", "sha256": "", "bytes": 0},
            "rknn": {"path": f"{stem}.rknn", "sha256": digest, "bytes": 100, "normalized_sha256": digest},
            "build": {}, "build_log": log.name, "regtask": {"lines": 0, "worst_ratio": 0.0, "fields": []},
            "ops": {"npu": 0, "cpu": 0, "cpu_boundary": 0, "layers": 0, "cpu_ops": []}, "est_cycles": 0, "rw_kb": 0.0,
            "weight_bytes": 0, "internal_bytes": 0, "simulator": {}, "gates": [verdict.to_json()], "exec_plan": {},
            "contract": {**contract, **({"ladder_key": ladder_key} if ladder_key is not None else {})}}
    write_manifest(manifest, data)
    result = EngineResult(rknn, manifest, log, data, [verdict], dict(outputs or {}), dict(outputs or {}))
    # What pipeline.build leaves beside the engines: the self-test goldens (none to record for a fake graph).
    selfcheck = work_dir / f"{stem}.selfcheck.npz"
    np.savez(selfcheck)
    goldens.write_goldens(work_dir, [Exported(work_dir / f"{stem}.onnx", selfcheck)], [result], [], 35.0)
    return result


class FakeSource(Table):
    path: Optional[str] = option(None, "A checkpoint path.")


class FakeOptions(Table):
    window: int = option(109, "Latent slices.")
    context: int = option(32, "Context slices.")
    frames: list[int] = option([128], "Widths.")


class FakeGates(Table):
    max_drift_pct: Optional[float] = option(None, "Drift threshold.")


FAKE_BUILDS: dict = {}


def _family(monkeypatch, name: str, build_recipe, sources=None) -> None:
    """A fake family: a declaration (two components, like a voice) whose recipe parts `build_recipe(recipe, target,
    toolkit, work_dir)` turns into engine results without compiling anything."""
    module = types.ModuleType(f"rkaudio.families.{name}")
    module.FAMILY = Family(name, "A fake family.", tuple(Component(c, None, f"{name}.exec_plan", FakeOptions, FakeGates)
                                                        for c in ("decoder", "duration_encoder")),
                           source=FakeSource, sources=sources)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    FAKE_BUILDS[name] = build_recipe
    monkeypatch.setattr(recipes, "build_part", lambda family, recipe, target, toolkit, work_dir, reproduce=False:
                        FAKE_BUILDS[family.name](recipe, target, toolkit, work_dir))


def _ok(recipe, target, toolkit, work_dir):
    return [_fake_engine(work_dir, f"{recipe['package']}_{target}_engine", 60.0)]


def _missing(recipe, target, toolkit, work_dir):
    raise MissingSource(f"checkpoint {recipe['source']['path']} not found; download the voice there")


def _failing_gate(recipe, target, toolkit, work_dir):
    (work_dir / "model.onnx").write_text("exported before the gate failed")
    raise GateFailure([at_least("simulator_snr[y]", 12.0, 35.0, "dB")], advice="look for fp16 overflow")


def _slower_than_real_time(recipe, target, toolkit, work_dir):
    (work_dir / "model.onnx").write_text("exported before the real-time gate refused it")
    raise GateFailure([at_most("real_time_factor", 1.7, 1.0, "x real time", "keeps 134 CPU ops")],
                      advice="it cannot keep up on this SoC")


def _buggy(recipe, target, toolkit, work_dir):
    raise ZeroDivisionError("a family bug")


@pytest.fixture
def fake_families(monkeypatch):
    for name, build in (("fake_ok", _ok), ("fake_missing", _missing), ("fake_gate", _failing_gate),
                        ("fake_buggy", _buggy), ("fake_slow", _slower_than_real_time)):
        _family(monkeypatch, name, build)


def test_recipe_validation_names_the_file_and_the_problem(tmp_path):
    _write_recipe(tmp_path, "good", "example", extra="[gates]\nmin_simulator_snr_db = 50.0\n")
    recipe = recipes.load_recipe(tmp_path / "good.toml", declaration)
    assert recipe["source"] == {} and recipe["options"] == {} and recipe["gates"] == {"min_simulator_snr_db": 50.0}
    (tmp_path / "no_family.toml").write_text('package = "x"\ntargets = ["rk3588"]\n')
    with pytest.raises(SetupError, match=r"no_family.toml: family: missing \(required\)"):
        recipes.load_recipe(tmp_path / "no_family.toml", declaration)
    _write_recipe(tmp_path, "rv", "example", targets=("rv1106",))
    with pytest.raises(SetupError, match="rv1106"):
        recipes.load_recipe(tmp_path / "rv.toml", declaration)
    (tmp_path / "broken.toml").write_text("package = \n")
    with pytest.raises(SetupError, match="not valid TOML"):
        recipes.load_recipe(tmp_path / "broken.toml", declaration)


def test_gates_table_reaches_build_options(tmp_path):
    from rkaudio.pipeline.declaration import build_options
    from rkaudio.pipeline.schema import recipe_job

    _write_recipe(tmp_path, "gated", "example", targets=("RK3576",),
                  extra="[gates]\nmin_simulator_snr_db = 55.0\nmax_regtask_lines = 0\n")
    recipe = recipes.load_recipe(tmp_path / "gated.toml", declaration)
    assert recipe["targets"] == ["rk3576"]
    [part] = recipes.recipes_for(recipe, "rk3576")
    job = recipe_job(declaration("example"), part, "rk3576", tmp_path, "2.5.0")
    options = build_options(job.gates, job.target, job.toolkit)
    assert (options.target, options.toolkit, options.min_simulator_snr_db, options.max_regtask_lines,
            options.fail_on_cpu_ops) == ("rk3576", "2.5.0", 55.0, 0, False)


def test_missing_source_is_one_skip_line_and_no_package(tmp_path, fake_families):
    _write_recipe(tmp_path / "r", "voice", "fake_missing", extra='[source]\npath = "/nowhere/voice.pt"\n')
    lines = []
    rows = recipes.build_all("rk3588", declaration, recipes_dir=tmp_path / "r", dist_dir=tmp_path / "dist", say=lines.append)
    assert [r["status"] for r in rows] == ["missing source"]
    skips = [line for line in lines if line.startswith("skip")]
    assert skips == ["skip voice_rk3588: checkpoint /nowhere/voice.pt not found; download the voice there"]
    assert [p.name for p in (tmp_path / "dist" / "rk3588").iterdir()] == [scheduler.LOCK_NAME]


def test_failures_leave_no_package_dir_and_the_other_recipes_still_build(tmp_path, fake_families):
    recipes_dir, dist = tmp_path / "r", tmp_path / "dist"
    _write_recipe(recipes_dir, "a_gate", "fake_gate")
    _write_recipe(recipes_dir, "b_bug", "fake_buggy")
    _write_recipe(recipes_dir, "c_ok", "fake_ok", targets=("rk3566", "rk3588"))
    _write_recipe(recipes_dir, "d_other_target", "fake_ok", targets=("rk3576",))
    lines = []
    rows = recipes.build_all("rk3588", declaration, recipes_dir=recipes_dir, dist_dir=dist, say=lines.append)
    assert [(r["package"], r["status"]) for r in rows] == [
        ("a_gate_rk3588", "FAILED"), ("b_bug_rk3588", "FAILED"), ("c_ok_rk3588", "ok")]
    assert rows[0]["gates"] == "0/1" and rows[0]["worst_snr_db"] == 12.0
    assert rows[2]["gates"] == "1/1" and rows[2]["engine_bytes"] == 100
    text = "\n".join(lines)
    assert "look for fp16 overflow" in text and "ZeroDivisionError: a family bug" in text
    published = sorted(p.name for p in (dist / "rk3588").iterdir() if p.name != scheduler.LOCK_NAME)
    # Failed recipes keep their work dir (ONNX, logs) beside, never under the package name.
    assert published == ["a_gate_rk3588.failed", "b_bug_rk3588.failed", "c_ok_rk3588"]
    assert (dist / "rk3588" / "a_gate_rk3588.failed" / "model.onnx").is_file()
    package = dist / "rk3588" / "c_ok_rk3588"
    assert sorted(p.name for p in package.iterdir()) == [
        "README.md", "SHA256SUMS", "c_ok_rk3588_engine.build.log", "c_ok_rk3588_engine.manifest.json",
        "c_ok_rk3588_engine.rknn", "exec_plan.json", "rkaudio", "selftest", "selftest.py"]
    assert sorted(p.name for p in (package / "rkaudio").iterdir()) == ["__init__.py", "board"]
    assert json.loads((package / "exec_plan.json").read_text()) == {
        "piper_tts.exec_plan": {"decoder": {"impl": "rknn", "artifacts": {"main": "c_ok_rk3588_engine.rknn"}}}}


def test_a_cell_only_the_real_time_gate_fails_is_refused_not_failed(tmp_path, fake_families):
    """The computed refusal (issue #42): a package whose one failing gate is real_time_factor (it keeps CPU ops and
    cannot keep up) is `refused` in the summary with that gate's figure, leaves no package and no work dir, and
    `convert engines` exits 0; any other failing gate beside it keeps it FAILED."""
    app = _engines_app()
    recipes_dir, dist = tmp_path / "r", tmp_path / "dist"
    _write_recipe(recipes_dir, "slow", "fake_slow")
    _write_recipe(recipes_dir, "good", "fake_ok")
    lines = []
    rows = recipes.build_all("rk3588", declaration, recipes_dir=recipes_dir, dist_dir=dist, say=lines.append)
    assert [(r["package"], r["status"]) for r in rows] == [("good_rk3588", "ok"), ("slow_rk3588", "refused")]
    assert rows[1]["gates"] == "0/1"
    assert any(line.startswith("refused slow_rk3588 (computed): ") and "real_time_factor" in line for line in lines)
    assert sorted(p.name for p in (dist / "rk3588").iterdir() if p.name != scheduler.LOCK_NAME) == ["good_rk3588"]
    result = CliRunner().invoke(app, ["engines", "--target", "rk3588", "--recipes", str(recipes_dir), "--dist",
                                      str(dist)])
    assert result.exit_code == 0, result.output
    assert [line.split()[:2] for line in result.output.splitlines()[-2:]] == [["good_rk3588", "ok"],
                                                                             ["slow_rk3588", "refused"]]


def test_only_selects_packages_and_rejects_unknown_names(tmp_path, fake_families):
    recipes_dir = tmp_path / "r"
    _write_recipe(recipes_dir, "one", "fake_ok")
    _write_recipe(recipes_dir, "two", "fake_ok")
    rows = recipes.build_all("rk3588", declaration, recipes_dir=recipes_dir, dist_dir=tmp_path / "dist", only=["two"],
                             say=lambda line: None)
    assert [r["package"] for r in rows] == ["two_rk3588"]
    with pytest.raises(SetupError, match="three"):
        recipes.build_all("rk3588", declaration, recipes_dir=recipes_dir, dist_dir=tmp_path / "dist", only=["three"])


def test_unknown_family_fails_before_anything_is_built(tmp_path, fake_families):
    recipes_dir = tmp_path / "r"
    _write_recipe(recipes_dir, "a_ok", "fake_ok")
    _write_recipe(recipes_dir, "b_typo", "no_such_family_here")
    with pytest.raises(SetupError, match="no family 'no_such_family_here'"):
        recipes.build_all("rk3588", declaration, recipes_dir=recipes_dir, dist_dir=tmp_path / "dist", say=lambda line: None)
    assert not (tmp_path / "dist" / "rk3588" / "a_ok_rk3588").exists()


def _engines_app() -> typer.Typer:
    app = typer.Typer()
    app.callback()(lambda: None)  # a group, like `convert`: the command is chosen by name
    app.command("engines")(engines)
    return app


def test_engines_command_prints_the_summary_and_exits_3_on_a_failed_recipe(tmp_path, fake_families):
    app = _engines_app()
    recipes_dir = tmp_path / "r"
    _write_recipe(recipes_dir, "good", "fake_ok")
    _write_recipe(recipes_dir, "missing", "fake_missing", extra='[source]\npath = "/nowhere/x.pt"\n')
    args = ["engines", "--target", "rk3588", "--recipes", str(recipes_dir), "--dist", str(tmp_path / "dist")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "good_rk3588" in result.output and "missing source" in result.output
    _write_recipe(recipes_dir, "gate", "fake_gate")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 3
    summary = result.output.splitlines()[-5:]
    assert summary[0].split()[:2] == ["package", "status"]
    assert [line.split()[:2] for line in summary[2:]] == [
        ["gate_rk3588", "FAILED"], ["good_rk3588", "ok"], ["missing_rk3588", "missing"]]
    listing = CliRunner().invoke(app, ["engines", "--target", "rk3576", "--list", "--recipes", str(recipes_dir)])
    assert listing.exit_code == 0 and "fake_missing" in listing.output and "False" in listing.output


def test_a_write_failure_while_packaging_publishes_nothing_and_names_the_file(tmp_path, fake_families, monkeypatch):
    import errno
    import shutil as real_shutil

    from rkaudio.release import package as package_module

    def copy2(source, target, *args, **kwargs):
        if str(target).endswith(".rknn"):
            raise OSError(errno.EFBIG, "File too large")  # what a file-size limit (RLIMIT_FSIZE) gives
        return real_shutil.copy2(source, target, *args, **kwargs)

    monkeypatch.setattr(package_module.shutil, "copy2", copy2)
    recipes_dir, dist = tmp_path / "r", tmp_path / "dist"
    _write_recipe(recipes_dir, "c_ok", "fake_ok")
    lines = []
    rows = recipes.build_all("rk3588", declaration, recipes_dir=recipes_dir, dist_dir=dist, say=lines.append)
    assert [r["status"] for r in rows] == ["FAILED"]
    failure = next(line for line in lines if line.startswith("FAIL"))
    assert "could not write" in failure and "c_ok_rk3588_engine.rknn" in failure and "File too large" in failure
    assert sorted(p.name for p in (dist / "rk3588").iterdir()) == [scheduler.LOCK_NAME, "c_ok_rk3588.failed"]


def test_files_a_contract_names_reach_the_package_when_the_onnx_is_kept_beside_dist(tmp_path, monkeypatch):
    def with_plan(recipe, target, toolkit, work_dir):
        (work_dir / "plan.json").write_text("{}")
        result = _fake_engine(work_dir, "planned", 60.0)
        result.manifest_data["contract"]["package_files"] = ["plan.json"]
        return [result]

    _family(monkeypatch, "fake_files", with_plan)
    recipes_dir, dist = tmp_path / "r", tmp_path / "dist"
    _write_recipe(recipes_dir, "p", "fake_files")
    rows = recipes.build_all("rk3588", declaration, recipes_dir=recipes_dir, dist_dir=dist, say=lambda _: None)
    assert [r["status"] for r in rows] == ["ok"]
    package = dist / "rk3588" / "p_rk3588"
    assert (package / "plan.json").is_file()
    manifest = json.loads((package / "planned.manifest.json").read_text())
    assert (package / manifest["onnx"]["path"]).parent.resolve() == (tmp_path / "work" / "dist" / "rk3588" / "p_rk3588")


VOICE = '''
[gates]
min_simulator_snr_db = 35.0
[components.decoder.options]
window = 109
[components.duration_encoder]
targets = ["rk3588"]
[components.duration_encoder.options]
frames = [128, 192]
[components.duration_encoder.gates]
max_drift_pct = 7.0
'''


def _voice(recipe, target, toolkit, work_dir):
    """A two-component family: the decoder one engine, the duration encoder a ladder; each build writes its kit."""
    assert recipe["gates"]["min_simulator_snr_db"] == 35.0
    shared = np.linspace(-1, 1, 64, dtype=np.float32)  # an array both components' kits hold: stored once when merged
    if recipe["component"] == "decoder":
        assert recipe["options"] == {"window": 109} and "max_drift_pct" not in recipe["gates"]
        return [_fake_engine(work_dir, "voice_decoder", 60.0, "decoder", {"audio": shared})]
    assert recipe["options"] == {"frames": [128, 192]} and recipe["gates"]["max_drift_pct"] == 7.0
    results = [_fake_engine(work_dir, f"voice_encoder_w{width}", 61.0, "duration_encoder",
                            {"shared": shared, f"hidden_{width}": np.full(8, width, np.float32)}, ladder_key=width)
               for width in recipe["options"]["frames"]]
    goldens.write_goldens(work_dir, [Exported(work_dir / f"voice_encoder_w{w}.onnx", work_dir / f"voice_encoder_w{w}.selfcheck.npz")
                                 for w in recipe["options"]["frames"]], results, [], 35.0)
    return results


def test_a_recipe_with_components_is_one_package_with_one_exec_plan_and_one_kit(tmp_path, monkeypatch):
    from rkaudio.release.package import onnx_dir
    from rkaudio.board.golden import ArrayReader, as_stored, read_index

    _family(monkeypatch, "fake_voice", _voice)
    recipes_dir, dist = tmp_path / "r", tmp_path / "dist"
    _write_recipe(recipes_dir, "voice", "fake_voice", targets=("rk3588", "rk3576"), extra=VOICE)
    checkpoint = tmp_path / "voice.onnx"
    checkpoint.write_bytes(b"weights")
    _family(monkeypatch, "fake_voice", _voice, sources=lambda job: [checkpoint])
    rows = recipes.build_all("rk3588", declaration, recipes_dir=recipes_dir, dist_dir=dist, say=lambda line: None)
    assert [(r["package"], r["status"], r["components"], r["gates"]) for r in rows] == [
        ("voice_rk3588", "ok", "decoder+duration_encoder", "3/3")]
    package = dist / "rk3588" / "voice_rk3588"
    # The card names the checkpoint the build key hashed.
    assert f"checkpoint file `voice.onnx`: sha256 `{hashlib.sha256(b'weights').hexdigest()}`" in (
        package / "README.md").read_text()
    assert json.loads((package / "exec_plan.json").read_text()) == {"piper_tts.exec_plan": {
        "decoder": {"impl": "rknn", "artifacts": {"main": "voice_decoder.rknn"}},
        "duration_encoder": {"impl": "rknn", "artifacts": {"main": "voice_encoder_w128.rknn,voice_encoder_w192.rknn"}}}}
    assert kit.verify(package) == []
    index = read_index(package / "selftest")
    assert [e["engine"] for e in index["engines"]] == [
        "voice_decoder.rknn", "voice_encoder_w128.rknn", "voice_encoder_w192.rknn"]
    reader = ArrayReader(package / "selftest" / index["file"])
    arrays = {(e["engine"], a["role"], a["tensor"]): reader.get(a) for e in index["engines"] for a in e["arrays"]}
    assert float(arrays[("voice_encoder_w192.rknn", "fp32", "hidden_192")][0]) == 192.0
    # Stored in fp16 (lossy above 70 dB): the merged kit keeps the stored bytes and the storage figure.
    assert np.array_equal(arrays[("voice_decoder.rknn", "fp32", "audio")], as_stored(np.linspace(-1, 1, 64, dtype=np.float32)))
    assert all("storage_snr_db" in a for e in index["engines"] for a in e["arrays"] if a["tensor"] in ("audio", "shared"))
    keys = {a["key"] for e in index["engines"] for a in e["arrays"]}
    with np.load(package / "selftest" / index["file"]) as data:
        assert sorted(data.files) == sorted(keys) and len(keys) == 3  # shared once, hidden_128, hidden_192
    kept = onnx_dir(dist, "rk3588", "voice_rk3588")  # the work dir: the component kits were merged away
    assert (kept / "selftest").is_dir() and not list(kept.glob("selftest.*"))

    rows = recipes.build_all("rk3576", declaration, recipes_dir=recipes_dir, dist_dir=dist, say=lambda line: None)
    assert [(r["package"], r["components"]) for r in rows] == [
        ("voice_rk3576", "decoder; no duration_encoder (rk3588 only)")]
    plan = json.loads((dist / "rk3576" / "voice_rk3576" / "exec_plan.json").read_text())
    assert list(plan["piper_tts.exec_plan"]) == ["decoder"]


def test_component_tables_are_checked_when_the_recipe_loads(tmp_path, fake_families):
    cases = {
        "typo": ('[components.decoder]\noptoins = {}\n', r"components.decoder.optoins: unknown; did you mean options\?"),
        "outside": ('[components.decoder]\ntargets = ["rk3566"]\n',
                    r"components.decoder.targets.rk3566: not a target of this recipe"),
        "uncovered": ('[components.decoder]\ntargets = ["rk3588"]\n', r"no component lists target rk3576"),
        "scalar": ('[components]\ndecoder = 3\n', r"components.decoder: input should be"),
    }
    for name, (extra, message) in cases.items():
        _write_recipe(tmp_path, name, "fake_ok", targets=("rk3588", "rk3576"), extra=extra)
        with pytest.raises(SetupError, match=message):
            recipes.load_recipe(tmp_path / f"{name}.toml", declaration)


def test_an_option_may_be_per_target_and_only_its_own_target_rebuilds(tmp_path, fake_families):
    extra = '[options]\nwindow = { rk3588 = 237, rk3576 = 173 }\ncontext = 32\n'
    _write_recipe(tmp_path, "voice", "fake_ok", targets=("rk3588", "rk3576"), extra=extra)
    recipe = recipes.load_recipe(tmp_path / "voice.toml", declaration)
    assert [r["options"] for r in recipes.recipes_for(recipe, "rk3576")] == [{"window": 173, "context": 32}]
    key_3588 = recipes.package_key(recipe, "rk3588", "2.3.2", [])["key"]
    _write_recipe(tmp_path, "voice", "fake_ok", targets=("rk3588", "rk3576"),
                  extra=extra.replace("rk3576 = 173", "rk3576 = 205"))
    changed = recipes.load_recipe(tmp_path / "voice.toml", declaration)
    assert recipes.package_key(changed, "rk3588", "2.3.2", [])["key"] == key_3588
    assert recipes.package_key(changed, "rk3576", "2.3.2", [])["key"] != recipes.package_key(recipe, "rk3576", "2.3.2", [])["key"]
    _write_recipe(tmp_path, "short", "fake_ok", targets=("rk3588", "rk3566"), extra=extra)
    with pytest.raises(SetupError, match=r"options.window: per target, and names no value for rk3566"):
        recipes.load_recipe(tmp_path / "short.toml", declaration)


def test_a_build_the_measured_table_says_will_not_fit_is_skipped_before_it_starts(tmp_path, fake_families,
                                                                                   monkeypatch):
    """A clean clone has no manifests: the measured peak (package data) decides, and the skip says both figures."""
    table = tmp_path / "build_peaks.json"
    table.write_text(json.dumps({"regenerate": "make bench NAME=targets", "peaks": [
        {"package": "big", "target": "rk3588", "peak_rss_bytes": 18 << 30, "measured_at": "2026-12-02"},
        {"package": "big", "target": "rk3566", "peak_rss_bytes": 2 << 30}]}))
    monkeypatch.setattr(scheduler, "MEASURED_PEAKS", table)
    monkeypatch.setattr(recipes, "available_memory", lambda: 16 << 30)
    _write_recipe(tmp_path / "r", "big", "fake_ok", targets=("rk3588", "rk3566"))
    lines = []
    rows = recipes.build_all("rk3588", declaration, recipes_dir=tmp_path / "r", dist_dir=tmp_path / "dist",
                             say=lines.append)
    assert [r["status"] for r in rows] == ["too big for this machine"]
    assert f"skip big_rk3588: its build needs 18.0 GiB at its peak (the measured table {table} (2026-12-02)) and " \
           "this machine has 16.0 GiB available" in "\n".join(lines)
    assert not (tmp_path / "dist" / "rk3588" / "big_rk3588").exists()
    rows = recipes.build_all("rk3566", declaration, recipes_dir=tmp_path / "r", dist_dir=tmp_path / "dist",
                             say=lines.append)
    assert [r["status"] for r in rows] == ["ok"]


def test_a_refused_target_is_a_summary_row_with_its_reason(tmp_path, fake_families):
    _write_recipe(tmp_path / "r", "slow", "fake_ok", extra='[refused]\nrk3566 = "1 core: 3.1x the time budget"\n')
    lines = []
    rows = recipes.build_all("rk3566", declaration, recipes_dir=tmp_path / "r", dist_dir=tmp_path / "dist",
                             say=lines.append)
    assert [(r["package"], r["status"]) for r in rows] == [("slow_rk3566", "refused")]
    assert lines == ["refused slow_rk3566: 1 core: 3.1x the time budget"]
    result = CliRunner().invoke(_engines_app(), ["engines", "--list", "--recipes", str(tmp_path / "r")])
    assert "slow on rk3566: 1 core: 3.1x the time budget" in result.output, result.output


def test_an_unmeasured_package_is_never_refused_on_the_default_guess(tmp_path, fake_families, monkeypatch):
    monkeypatch.setattr(scheduler, "MEASURED_PEAKS", tmp_path / "no_table.json")
    monkeypatch.setattr(recipes, "available_memory", lambda: 1 << 30)  # under DEFAULT_PEAK_RSS
    _write_recipe(tmp_path / "r", "unmeasured", "fake_ok")
    rows = recipes.build_all("rk3588", declaration, recipes_dir=tmp_path / "r", dist_dir=tmp_path / "dist",
                             say=lambda line: None)
    assert [r["status"] for r in rows] == ["ok"]
