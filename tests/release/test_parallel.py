"""`convert engines --jobs N`: independent packages built in parallel processes, bounded by memory, give the same
packages as a sequential build (engines are byte-identical builds, so their digests must match)."""
from __future__ import annotations

import json
import shutil
import time

from rkaudio.release import recipes, scheduler
from rkaudio.cli.families import declaration
from rkaudio.core.paths import REPO_ROOT


def logged_sleep(log: str, index: int, package: str) -> dict:
    """A stand-in build (module level: spawned workers import it) that logs when it runs."""
    with open(log, "a") as handle:
        handle.write(f"start {index} {time.monotonic()}\n")
    time.sleep(0.3)
    with open(log, "a") as handle:
        handle.write(f"end {index} {time.monotonic()}\n")
    return {"package": package, "status": "ok"}


def test_the_scheduler_never_runs_more_than_the_memory_budget_at_once(tmp_path):
    log = tmp_path / "log"
    tasks = [(str(log), i, f"p{i}") for i in range(1, 5)]
    # 3 GiB of budget, 2 GiB each: never two at once although 4 jobs are allowed; the 5 GiB one runs alone.
    rows = scheduler.build_parallel(tasks, logged_sleep, 4, [2 << 30, 2 << 30, 5 << 30, 1 << 30], 3 << 30, print)
    assert [r["package"] for r in rows] == ["p1", "p2", "p3", "p4"]
    events = sorted((float(t), kind) for kind, _, t in (line.split() for line in log.read_text().splitlines()))
    running = peak = 0
    for _, kind in events:
        running += 1 if kind == "start" else -1
        peak = max(peak, running)
    assert peak == 1


def test_two_jobs_give_the_same_packages_as_one(tmp_path, require_converter):
    require_converter("2.3.2")
    recipes_dir = tmp_path / "recipes"
    recipes_dir.mkdir()
    shutil.copy(REPO_ROOT / "recipes" / "example_conv.toml", recipes_dir)
    second = (recipes_dir / "example_conv.toml").read_text().replace('package = "example_conv"', 'package = "example_b"')
    (recipes_dir / "example_b.toml").write_text(second.replace("frames = [64, 128]", "frames = [32]"))
    digests = {}
    for jobs in (1, 2):
        dist = tmp_path / f"jobs{jobs}" / "dist"
        rows = recipes.build_all("rk3588", declaration, "2.3.2", recipes_dir, dist, jobs=jobs, say=lambda _: None)
        assert [(r["package"], r["status"]) for r in rows] == [("example_b_rk3588", "ok"), ("example_conv_rk3588", "ok")]
        digests[jobs] = {p.name: json.loads(p.read_text())["rknn"]["sha256"]
                         for p in sorted((dist / "rk3588").glob("*/*.manifest.json"))}
        assert len(digests[jobs]) == 3
    assert digests[1] == digests[2]
