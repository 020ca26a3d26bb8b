"""`convert engines --jobs N` against `--jobs 1` on two small independent recipes (the example family at two
sizes), in one run: wall time per setting and the ratio, and whether the engines came out byte-identical."""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

from rkaudio.release import recipes
from rkaudio.cli.families import declaration
from rkaudio.core.paths import REPO_ROOT

TARGET = "rk3588"


def _recipes(directory: Path) -> None:
    shutil.copy(REPO_ROOT / "recipes" / "example_conv.toml", directory)
    text = (directory / "example_conv.toml").read_text().replace('package = "example_conv"', 'package = "example_wide"')
    (directory / "example_wide.toml").write_text(text.replace("frames = [64, 128]", "frames = [1024, 2048]"))


def main(argv: list[str] | None = None) -> list[dict]:
    import run

    run.parser(__file__, __doc__).parse_args(argv)
    rows, digests = [], {}
    with tempfile.TemporaryDirectory(prefix="bench-jobs-") as scratch:
        recipes_dir = Path(scratch) / "recipes"
        recipes_dir.mkdir()
        _recipes(recipes_dir)
        for jobs in (1, 2):
            dist = Path(scratch) / f"jobs{jobs}" / "dist"
            started = time.perf_counter()
            built = recipes.build_all(TARGET, declaration, recipes_dir=recipes_dir, dist_dir=dist, jobs=jobs,
                                      say=lambda _: None)
            wall = time.perf_counter() - started
            digests[jobs] = {p.name: json.loads(p.read_text())["rknn"]["sha256"]
                             for p in sorted((dist / TARGET).glob("*/*.manifest.json"))}
            rows.append({"jobs": jobs, "packages": len(built), "ok": sum(r["status"] == "ok" for r in built),
                         "wall_s": round(wall, 1)})
    for row in rows:
        row["wall_ratio_vs_jobs1"] = round(row["wall_s"] / rows[0]["wall_s"], 3)
        row["engines_identical_to_jobs1"] = digests[row["jobs"]] == digests[1]
    return rows


if __name__ == "__main__":
    import run

    run.script(__file__)
