"""What `pip install .` puts into site-packages: one top-level package, `rkaudio`, and the two console scripts (no
generic `core` or `runtime` for another distribution to collide with)."""
from __future__ import annotations

import configparser
import importlib.metadata
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from rkaudio.core.paths import PACKAGE_ROOT, REPO_ROOT

CONSOLE_SCRIPTS = {"convert": "rkaudio.cli:main", "rkaudio": "rkaudio.cli:main"}


def _wheel(tmp_path: Path) -> zipfile.ZipFile:
    """The wheel pip builds from the project as it stands (pyproject.toml and the package, copied: building in the
    repository would leave build/ and egg-info behind for the other test workers)."""
    source = tmp_path / "source"
    shutil.copytree(PACKAGE_ROOT, source / "rkaudio", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO_ROOT / "pyproject.toml", source / "pyproject.toml")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                            "--wheel-dir", str(tmp_path / "wheel"), str(source)], capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    return zipfile.ZipFile(next((tmp_path / "wheel").glob("rkaudio-*.whl")))


def test_the_wheel_installs_one_top_level_package_and_the_console_scripts(tmp_path):
    wheel = _wheel(tmp_path)
    names = wheel.namelist()
    top_level = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top_level == {"rkaudio"}
    # the package data the code reads travels with it
    assert {"rkaudio/gates/board_time_constants.json", "rkaudio/release/build_peaks.json"} <= set(names)
    info = next(name.split("/")[0] for name in names if name.endswith(".dist-info/METADATA"))
    assert wheel.read(f"{info}/top_level.txt").decode().split() == ["rkaudio"]
    entry_points = configparser.ConfigParser()
    entry_points.read_string(wheel.read(f"{info}/entry_points.txt").decode())
    assert dict(entry_points["console_scripts"]) == CONSOLE_SCRIPTS


def test_the_installed_distribution_names_rkaudio_alone():
    """The export venv's editable install, what every test and `make engines` import."""
    distribution = importlib.metadata.distribution("rkaudio")
    assert distribution.read_text("top_level.txt").split() == ["rkaudio"]
    assert {ep.name: ep.value for ep in distribution.entry_points if ep.group == "console_scripts"} == CONSOLE_SCRIPTS
