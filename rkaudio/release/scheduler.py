"""How `convert engines` runs its packages: one run at a time per dist/<target> (`dist_lock`), and with `--jobs`
several packages at once in spawned processes, bounded by a memory budget (`build_parallel`: MemAvailable
against each package's expected compiler peak RSS, `expected_peak_rss`: its last build, else the measured peaks)."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from rkaudio.core.errors import SetupError

LOCK_NAME = ".lock"

DEFAULT_PEAK_RSS = 4 << 30  # a package neither measured nor built here: assume 4 GiB
# Package data: each (package, target)'s largest compiler-child peak RSS, written by bench/targets.py from its table
# (its "regenerate" key names the command). A clean clone has no old manifests, yet must know before it starts
# which builds fit this machine.
MEASURED_PEAKS = Path(__file__).with_name("build_peaks.json")


def measured_peak_rss(package: str, target: str) -> tuple[int, str] | None:
    """The largest compiler-child peak RSS measured for (package, target) (MEASURED_PEAKS), and where it was
    measured (for the message); None when no row of it was measured."""
    import json

    table = MEASURED_PEAKS
    if not Path(table).is_file():
        return None
    peak = next((row for row in json.loads(Path(table).read_text())["peaks"]
                 if row["package"] == package and row["target"] == target), None)
    if peak is None:
        return None
    return int(peak["peak_rss_bytes"]), f"the measured table {table} ({peak.get('measured_at', 'undated')})"


def last_peak_rss(package_dir: Path) -> int | None:
    """The largest compiler-child peak RSS the package's manifests recorded at its last build here (None when it
    was never built here)."""
    import json

    peaks = [json.loads(p.read_text()).get("build", {}).get("peak_rss_bytes") or 0
             for p in Path(package_dir).glob("*.manifest.json")]
    return max(peaks) if peaks and max(peaks) > 0 else None


def expected_peak_rss(package: str, target: str, package_dir: Path) -> tuple[int, str | None]:
    """What a package's build will need at its peak, and whence the figure: its last build here, else the
    measured peaks, else DEFAULT_PEAK_RSS with None (a guess: it budgets --jobs, it refuses nothing)."""
    last = last_peak_rss(package_dir)
    if last is not None:
        return last, f"its last build in {package_dir}"
    return measured_peak_rss(package, target) or (DEFAULT_PEAK_RSS, None)


def available_memory() -> int:
    """MemAvailable of /proc/meminfo, in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise SetupError("no MemAvailable in /proc/meminfo: --jobs needs Linux")


def _run_task(connection, function: Callable, task: tuple, label: str) -> None:
    import signal

    # SIGTERM (the parent interrupted) unwinds like Ctrl-C here too: staging dirs and compiler children go.
    signal.signal(signal.SIGTERM, lambda signum, _: (_ for _ in ()).throw(SystemExit(128 + signum)))
    try:
        connection.send(function(*task))
    except BaseException as error:  # a bug outside build_package's own handling: a failed row
        connection.send({"package": label, "status": "FAILED", "error": repr(error)})
    finally:
        connection.close()


def build_parallel(tasks: list, function: Callable, jobs: int, estimates: list[int], memory: int,
                   say: Callable[[str], None], labels: list[str] | None = None) -> list[dict]:
    """Run `function(*task)` in fresh (spawned: a fork of a process holding torch's thread pools can deadlock)
    processes, at most `jobs` at once and never more than `memory` bytes of estimated peak RSS at once (a task
    alone over the budget still runs, by itself); rows in task order. `function` and tasks must pickle."""
    import multiprocessing
    from multiprocessing.connection import wait

    context = multiprocessing.get_context("spawn")
    labels = labels or [f"task {number + 1}" for number in range(len(tasks))]
    rows: dict[int, dict] = {}
    pending = list(range(len(tasks)))
    running: dict = {}  # connection -> (task number, process)

    try:
        while pending or running:
            used = sum(estimates[number] for number, _ in running.values())
            while pending and len(running) < jobs and (not running or used + estimates[pending[0]] <= memory):
                number = pending.pop(0)
                parent_end, child_end = context.Pipe(duplex=False)
                process = context.Process(target=_run_task, args=(child_end, function, tasks[number], labels[number]))
                process.start()
                child_end.close()
                running[parent_end] = (number, process)
                used += estimates[number]
            for connection in wait(list(running)):
                number, process = running.pop(connection)
                try:
                    rows[number] = connection.recv()
                except EOFError:  # the worker died without a word (OOM killer, a signal)
                    rows[number] = {"package": labels[number], "status": "FAILED"}
                    say(f"FAIL {labels[number]}: its build process died (exit {process.exitcode})")
                process.join()
    finally:  # interrupted: each worker unwinds as on SIGTERM (its staging dir and compiler child go)
        for _, process in running.values():
            process.terminate()
        for _, process in running.values():
            process.join(timeout=30)
            if process.exitcode is None:
                process.kill()
    return [rows[number] for number in range(len(tasks))]


@contextmanager
def dist_lock(target_dir: Path) -> Iterator[None]:
    """One `convert engines` at a time per dist/<target>: a second run refuses at once, naming the first (the
    lock is an flock on dist/<target>/.lock, released by the kernel however the holder ends)."""
    import fcntl

    target_dir.mkdir(parents=True, exist_ok=True)
    with open(target_dir / LOCK_NAME, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise SetupError(f"another `convert engines` ({holder}) is building into {target_dir}; wait for it to "
                             "finish, or build into another directory with --dist") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            handle.truncate(0)
