"""Venv idempotence (a second `make venvs` with unchanged pins does nothing) and the converter venv's
isolation (the build child imports rkaudio through PYTHONPATH, with none of the export venv's packages)."""
import hashlib
import os
import subprocess

import pytest

from rkaudio.toolkit.versions import DEFAULT_TOOLKIT, converter_python
from rkaudio.core.paths import REPO_ROOT, venv_root


def _pins_hash(pin_file: str) -> str:
    """The stamp venvs/ensure.sh writes: sha256 of the pin file followed by the script itself."""
    return hashlib.sha256((REPO_ROOT / pin_file).read_bytes() + (REPO_ROOT / "venvs/ensure.sh").read_bytes()).hexdigest()


def test_second_make_venv_with_unchanged_pins_is_up_to_date_and_recreates_nothing():
    # The converter venv: the same ensure.sh mechanism as the export venv, and only `make` writes it.
    venv = venv_root() / f"convert-{DEFAULT_TOOLKIT}"
    stamp, python = venv / ".rkaudio-pins", venv / "bin" / "python"
    # Never let this test rebuild a venv under running tests: stale pins are `make venvs`' job.
    if not stamp.is_file() or stamp.read_text().strip() != _pins_hash(f"venvs/convert-{DEFAULT_TOOLKIT}.txt"):
        pytest.fail(f"{venv} is not built from the current pins: run `make venvs` first")
    before = (stamp.stat().st_mtime_ns, python.lstat().st_ino)
    result = subprocess.run(["make", "--no-print-directory", "venv-convert", f"VENV_DIR={venv_root()}",
                             f"RKNN_TOOLKIT={DEFAULT_TOOLKIT}"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == f"venv {venv} is up to date"
    assert (stamp.stat().st_mtime_ns, python.lstat().st_ino) == before


def test_converter_child_imports_rkaudio_from_the_repo_without_export_venv_packages(tmp_path):
    probe = ("import importlib.util, importlib.metadata as md, rkaudio.toolkit.child as b; "
             "print(b.__file__); "
             "print([m for m in ('typer', 'onnxslim', 'transformers', 'piper') if importlib.util.find_spec(m)]); "
             "import site; print([d.metadata['Name'] for d in md.distributions(path=site.getsitepackages()) "
             "if d.metadata['Name'] == 'rkaudio'])")
    env = {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    result = subprocess.run([str(converter_python(DEFAULT_TOOLKIT)), "-c", probe], cwd=tmp_path, env=env,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    module_file, export_only, installed = result.stdout.splitlines()
    assert module_file == str(REPO_ROOT / "rkaudio" / "toolkit" / "child.py")
    assert export_only == "[]" and installed == "[]"
