"""CosyVoice3 flow ladder aperture accounting (host side): per rung, the host proxies the toolkit gives in every
manifest next to the board figures the spec measured (rknn-decoder-path.md, "The IOVA ceiling").

    python bench/cosyvoice3_aperture.py DIR [DIR ...] [--budget-mib 3900]

DIR holds `cosyvoice3_flow_s<S>.manifest.json` (+ .rknn) built by `convert cosyvoice3`. Proxy for the per-context
cost: weight_bytes + internal_bytes of the manifest (MiB); the ratio board/proxy is printed per rung where the
spec has a figure, and the sets of rungs whose board cost (or, without one, calibrated proxy) fits the budget are
listed. The single mapping requested at rknn_init has no host proxy yet. Writes bench/results/cosyvoice3_aperture.json."""
from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

MIB = 1 << 20
# Board-measured per-context cost (MiB, RKNN_QUERY_MEM_SIZE) of the spec's estimator, per compiled S.
SPEC_CONTEXT_MIB = {110: 786, 200: 1129, 250: 1426, 400: 2615, 500: 3752, 900: 1039}
SPEC_REFUSED_AT_INIT = {900: 4.71, 1100: 4.66, 2000: 5.77}  # GB requested as one mapping: over the ~4 GB ceiling
SPEC_ADMITTED = ["110+200+250", "110+110+110+110", "200+200+200", "250+250+110", "110+400", "200+400"]
SPEC_REFUSED = ["250+400", "110+500"]


def rungs(directories: list[Path]) -> list[dict]:
    rows = []
    for directory in directories:
        for path in sorted(Path(directory).glob("cosyvoice3_flow_s*.manifest.json")):
            manifest = json.loads(path.read_text())
            length = int(manifest["contract"]["length"])
            proxy = (manifest["weight_bytes"] + manifest["internal_bytes"]) / MIB
            rknn = path.with_name(path.name.replace(".manifest.json", ".rknn"))
            rows.append({"S": length, "batch": manifest["contract"].get("batch", 1),
                         "rknn_mib": round(rknn.stat().st_size / MIB, 1) if rknn.is_file() else None,
                         "weight_mib": round(manifest["weight_bytes"] / MIB, 1),
                         "internal_mib": round(manifest["internal_bytes"] / MIB, 1), "proxy_mib": round(proxy, 1),
                         "est_cycles": manifest.get("est_cycles"), "rw_kb": manifest.get("rw_kb"),
                         "build_peak_rss_gib": round(manifest["build"].get("peak_rss_bytes", 0) / (1 << 30), 2),
                         "spec_context_mib": SPEC_CONTEXT_MIB.get(length),
                         "board_over_proxy": round(SPEC_CONTEXT_MIB[length] / proxy, 3) if length in SPEC_CONTEXT_MIB
                         else None})
    return sorted(rows, key=lambda r: r["S"])


def admissible(costs: dict, budget: float, most: int = 4) -> list[str]:
    sets = []
    for size in range(1, most + 1):
        for combo in itertools.combinations_with_replacement(sorted(costs), size):
            if sum(costs[s] for s in combo) <= budget:
                sets.append("+".join(str(s) for s in combo))
    return sets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--budget-mib", type=float, default=3900.0)
    arguments = parser.parse_args()
    rows = rungs(arguments.dirs)
    columns = list(rows[0]) if rows else []
    print(" | ".join(columns))
    for row in rows:
        print(" | ".join(str(row[c]) for c in columns))
    spec_sets = admissible({s: c for s, c in SPEC_CONTEXT_MIB.items() if s not in SPEC_REFUSED_AT_INIT},
                           arguments.budget_mib)
    print(f"spec figures, budget {arguments.budget_mib:g} MiB: admitted sets of up to 4 rungs: {', '.join(spec_sets)}")
    print(f"spec measured admitted {', '.join(SPEC_ADMITTED)}; refused {', '.join(SPEC_REFUSED)}")
    result = {"rungs": rows, "budget_mib": arguments.budget_mib, "sets_from_spec_figures": spec_sets}
    out = Path(__file__).resolve().parent / "results" / "cosyvoice3_aperture.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
