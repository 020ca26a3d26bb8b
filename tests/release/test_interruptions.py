"""`convert engines` interrupted or run twice at once, as CI cancellation, `timeout` and impatient users do it:
SIGINT, SIGTERM or SIGKILL of the parent, SIGKILL of the compiler child. The child never outlives the parent,
no package is half-written, no adb server and no child work directory stay behind (after a SIGKILL of the
parent, which allows no cleanup, the next run removes them), and a second run on the same dist refuses."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rkaudio.core.paths import REPO_ROOT, venv_root
from rkaudio.toolkit.session import CHILD_DIR_PREFIX


def _default_sigint() -> None:
    """In the victim, before exec: SIGINT at its default. A background job (`make test > log 2>&1 &`) starts
    with SIGINT ignored, an ignored signal stays ignored across fork and exec, and Python leaves an ignored
    SIGINT alone: the victim would shrug off the SIGINT this test sends and finish with exit 0."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _victim(args: list[str]) -> subprocess.Popen:
    """`args` started as from a terminal (SIGINT at its default), output merged."""
    return subprocess.Popen(args, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_default_sigint)


def _start(dist: Path) -> subprocess.Popen:
    return _victim([sys.executable, "-m", "rkaudio.cli", "engines", "--target", "rk3588", "--only",
                    "example_conv", "--dist", str(dist)])


def _first_child(run: subprocess.Popen, what: str) -> int:
    """The first compiler child of `run`; a run that ends before starting one fails at once, with its output."""
    def started() -> bool:
        if run.poll() is not None:
            pytest.fail(f"the run ended (exit {run.returncode}) before {what} started:\n{run.stdout.read()}")
        return bool(_children(run.pid))

    _wait_for(started, what=what)
    return _children(run.pid)[0]


def _child_dirs(parent: int) -> list[Path]:
    return list(Path(tempfile.gettempdir()).glob(f"{CHILD_DIR_PREFIX}{parent}-*"))


def _children(parent: int) -> list[int]:
    """Compiler children of `parent`: processes whose working directory is one of its child work dirs."""
    prefix = str(Path(tempfile.gettempdir()) / f"{CHILD_DIR_PREFIX}{parent}-")
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.readlink(entry / "cwd").startswith(prefix):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _adb_processes() -> list[int]:
    venvs, found = venv_root().resolve(), []
    for entry in Path("/proc").iterdir():
        try:
            exe = Path(os.readlink(entry / "exe"))
        except OSError:
            continue
        if exe.name.startswith("adb") and venvs in exe.parents:
            found.append(int(entry.name))
    return found


def _wait_for(condition, timeout: float = 180.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


def _assert_nothing_left(parent: int, dist: Path, stale_dirs_allowed: bool) -> None:
    _wait_for(lambda: not _children(parent), 15, "the compiler child to die with its parent")
    assert not _adb_processes()
    if not stale_dirs_allowed:
        assert not _child_dirs(parent)
        assert not list((dist / "rk3588").glob(".*.partial"))
    assert not (dist / "rk3588" / "example_conv_rk3588").exists()  # never half-written


def test_a_victim_gets_sigint_at_its_default_when_the_suite_ignores_it():
    """What `make test > log 2>&1 &` does to the suite (SIGINT ignored) does not reach the victim."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        probe = _victim([sys.executable, "-c", "import signal; "
                         "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"])
        output, _ = probe.communicate(timeout=60)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert probe.returncode == 0 and output.strip() == "True", output


@pytest.mark.parametrize("victim, signum", [("parent", signal.SIGINT), ("parent", signal.SIGTERM),
                                            ("parent", signal.SIGKILL), ("child", signal.SIGKILL)],
                         ids=["SIGINT-parent", "SIGTERM-parent", "SIGKILL-parent", "SIGKILL-child"])
def test_an_interrupted_run_leaves_nothing_and_a_rerun_completes(tmp_path, victim, signum, require_converter):
    require_converter("2.3.2")
    dist = tmp_path / "dist"
    run = _start(dist)
    child = _first_child(run, "the first compiler child")
    os.kill(run.pid if victim == "parent" else child, signum)
    if victim == "child":  # the parent reports the dead child, fails that package, and finishes
        output, _ = run.communicate(timeout=300)
        assert run.returncode == 3, output
        assert "killed by signal SIGKILL" in output
        (dist / "rk3588" / "example_conv_rk3588.failed").is_dir()
    else:
        run.wait(timeout=60)
        assert run.returncode == {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGKILL: -9}[signum]
    _assert_nothing_left(run.pid, dist, stale_dirs_allowed=signum == signal.SIGKILL and victim == "parent")

    rerun = _start(dist)
    output, _ = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, output
    assert (dist / "rk3588" / "example_conv_rk3588" / "SHA256SUMS").is_file()
    assert not _child_dirs(run.pid) and not _child_dirs(rerun.pid)  # stale ones cleared by the rerun
    assert not list((dist / "rk3588").glob(".*.partial"))
    assert not _adb_processes()


def test_a_second_run_on_the_same_dist_refuses_and_the_first_completes(tmp_path, require_converter):
    require_converter("2.3.2")
    dist = tmp_path / "dist"
    first = _start(dist)
    _first_child(first, "the first run's compiler child")
    second = _start(dist)
    output, _ = second.communicate(timeout=120)
    assert second.returncode == 2, output
    assert f"pid {first.pid}" in output and "--dist" in output
    output, _ = first.communicate(timeout=300)
    assert first.returncode == 0, output
    assert (dist / "rk3588" / "example_conv_rk3588" / "SHA256SUMS").is_file()
