"""The model card every package carries (`README.md`, written at packaging so SHA256SUMS covers it): Hub front
matter, the source checkpoint's files, the toolkit (the oldest board runtime that loads the engines), a table of
engines with bytes, gates and figures, the exec_plan snippet, the self-test line."""
from __future__ import annotations

import json
from pathlib import Path

from rkaudio.board.files import SUMS_NAME
from rkaudio.board.verdict import worst_snr_db
from rkaudio.core.manifest import cpu_op_price

CARD_NAME = "README.md"


def model_card(recipe: dict, target: str, manifests: list[dict], plan: dict, sources: dict | None = None) -> str:
    """The package's model card: Hub front matter, source (`sources`: checkpoint file -> sha256), toolkit (the
    oldest board runtime that loads the engines), a table of engines with bytes, gates and figures, the
    exec_plan snippet, the self-test line."""
    card = recipe.get("card", {})
    toolkits = sorted({m["toolkit_version"] for m in manifests})
    producers = sorted({f"{m.get('producer_version')} ({m.get('producer_git')})" for m in manifests})
    tags = ["rknn", "rockchip", target, "npu", recipe["family"], *card.get("tags", [])]
    front = ["---", "library_name: rknn", f"license: {card.get('license', 'other')}", "tags:"]
    front += [f"- {tag}" for tag in dict.fromkeys(tags)]
    if card.get("pipeline_tag"):
        front.append(f"pipeline_tag: {card['pipeline_tag']}")
    front.append("---")
    source_lines = [f"- {card.get('source', 'see the recipe')}"]
    # The checkpoint's files as the build key hashed them (rkaudio.release.recipes.package_key: the family's
    # recipe_sources), so the card names exactly what the engines were built from.
    source_lines += [f"- checkpoint file `{Path(path).name}`: sha256 `{digest}`"
                     for path, digest in sorted((sources or {}).items())]
    if not sources:
        source_lines.append("- checkpoint files: none (the family builds from code, or names no files)")
    rows = ["| engine | bytes | gates | worst SNR (dB) | CPU ops | REGTASK lines | predicted board ms per call |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for m in manifests:
        gates = m.get("gates", [])
        worst = worst_snr_db(gates)
        predicted = (m.get("predicted_board_ms") or {}).get("ms")
        rows.append(f"| `{m['rknn']['path']}` | {m['rknn']['bytes']:,} | {sum(bool(g['passed']) for g in gates)}/"
                    f"{len(gates)} | {'-' if worst is None else f'{worst:.1f}'} | {m['ops']['cpu']} | "
                    f"{m['regtask']['lines']} | {'-' if predicted is None else f'{predicted:,.1f}'} |")
    lines = front + [
        f"# {recipe['package']} for {target.upper()}", "",
        f"fp16 `.rknn` engines built by rkaudio {', '.join(producers)} with rknn-toolkit2 {', '.join(toolkits)}: "
        f"the board needs `librknnrt.so` {toolkits[-1]} or newer (older runtimes refuse the engines).", "",
        "## Source", *source_lines, "",
        "## Engines", *rows, "",
        "Every figure is measured on the host at build time (fp32 onnxruntime and the toolkit simulator); the "
        "self-test below measures them again on the board. The predicted board time is a model ("
        "rkaudio/gates/board_time.py: the layer table's cycles, elementwise traffic and layers, and the call's I/O, with "
        "constants fitted to board measurements); the self-test prints it beside the measured latency.", "",
        *cpu_op_section(manifests),
        "## exec_plan", "```json", json.dumps(plan, indent=2), "```", "",
        "## On the board", "Copy this folder to the board (Python 3.8+, numpy, rknn-toolkit-lite2), then in it:",
        "```", "python3 selftest.py", "```",
        f"It checks every file against {SUMS_NAME}, the runtime version, every engine and the end-to-end goldens; "
        "exit 0 means every gate passed.", ""]
    return "\n".join(lines)


def cpu_op_section(manifests: list[dict]) -> list[str]:
    """The card's "CPU ops" section: every op an engine runs on the board's CPU, with its traffic and predicted ms
    (none when every op is on the NPU)."""
    lines = [f"- `{m['rknn']['path']}`: {op['type']} `{op['name']}`" + cpu_op_price(op)
             for m in manifests for op in m["ops"].get("cpu_ops", [])]
    if not lines:
        return []
    return ["## CPU ops", "These ops run on the board's CPU (each a round trip of its tensor through DDR); the "
            "predicted ms is their share of the board-time model's cpu_ops term.", *lines, ""]
