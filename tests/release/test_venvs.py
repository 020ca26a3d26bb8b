"""Venv idempotence (a second `make venvs` with unchanged pins does nothing) and the converter venv's
isolation (the build child imports rkaudio through PYTHONPATH, with none of the export venv's packages)."""
import hashlib
import os
import subprocess

import pytest

from converters.toolkit import DEFAULT_TOOLKIT, REPO_ROOT, converter_python, venv_root

# (venv, pin files in the order venvs/ensure.sh hashes them, the script itself last)
VENVS = [("export", ["venvs/export.txt", "venvs/export-nodeps.txt"]),
         (f"convert-{DEFAULT_TOOLKIT}", [f"venvs/convert-{DEFAULT_TOOLKIT}.txt"])]


def _pins_hash(files: list[str]) -> str:
    data = b"".join((REPO_ROOT / f).read_bytes() for f in [*files, "venvs/ensure.sh"])
    return hashlib.sha256(data).hexdigest()


def test_second_make_venvs_with_unchanged_pins_is_up_to_date_and_recreates_nothing():
    before = {}
    for name, pins in VENVS:
        stamp = venv_root() / name / ".rkaudio-pins"
        # Never let this test rebuild a venv under running tests: stale pins are `make venvs`' job.
        if not stamp.is_file() or stamp.read_text().strip() != _pins_hash(pins):
            pytest.fail(f"{stamp.parent} is not built from the current pins: run `make venvs` first")
        python = venv_root() / name / "bin" / "python"
        before[name] = (stamp.stat().st_mtime_ns, python.lstat().st_ino)
    result = subprocess.run(["make", "--no-print-directory", "venvs", f"VENV_DIR={venv_root()}",
                             f"RKNN_TOOLKIT={DEFAULT_TOOLKIT}"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "creating" not in result.stdout
    for name, _ in VENVS:
        assert f"venv {venv_root() / name} is up to date" in result.stdout
        stamp, python = venv_root() / name / ".rkaudio-pins", venv_root() / name / "bin" / "python"
        assert (stamp.stat().st_mtime_ns, python.lstat().st_ino) == before[name]


def test_converter_child_imports_rkaudio_from_the_repo_without_export_venv_packages(tmp_path):
    probe = ("import importlib.util, importlib.metadata as md, converters.build_engine as b; "
             "print(b.__file__); "
             "print([m for m in ('typer', 'onnxslim', 'transformers', 'piper') if importlib.util.find_spec(m)]); "
             "print([d.metadata['Name'] for d in md.distributions() if d.metadata['Name'] == 'rkaudio'])")
    env = {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    result = subprocess.run([str(converter_python(DEFAULT_TOOLKIT)), "-c", probe], cwd=tmp_path, env=env,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    module_file, export_only, installed = result.stdout.splitlines()
    assert module_file == str(REPO_ROOT / "converters" / "build_engine.py")
    assert export_only == "[]" and installed == "[]"
