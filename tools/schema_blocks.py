#!/usr/bin/env python3
"""schema_blocks: HACKING.md's JSON schema blocks, generated from the models they document, so the docs cannot
drift from what is validated.

    python tools/schema_blocks.py          # exit 1 naming each block that is not its model's schema
    python tools/schema_blocks.py --write  # rewrite the blocks from the models

A model's block is the first ```json block after the model's dotted name in backquotes (the sentence introducing
it), with no other fenced block between. It holds `model_json_schema()` less what JSON Schema implies anyway (the
titles, `"additionalProperties": true`), each value on one line where it fits. Run it in the export venv (pydantic,
rkaudio installed)."""
from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from pathlib import Path

HACKING = Path(__file__).resolve().parents[1] / "HACKING.md"
MODELS = ("rkaudio.core.manifest_model.Manifest", "rkaudio.release.report_model.SelftestReport")
WIDTH = 118


def plain(schema: dict) -> dict:
    """`schema` without titles and `"additionalProperties": true` (the default), in every nested schema."""
    out = {}
    for key, value in schema.items():
        if key == "title" or (key == "additionalProperties" and value is True):
            continue
        if key in ("properties", "$defs"):
            value = {name: plain(entry) for name, entry in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            value = plain(value)
        elif key == "anyOf":
            value = [plain(entry) for entry in value]
        out[key] = value
    return out


def layout(value, indent: int = 0, lead: int = 0) -> str:
    """`value` as JSON: on one line when that fits in WIDTH after `indent` spaces and `lead` characters, else one
    member per line, each one space deeper."""
    flat = json.dumps(value)
    if indent + lead + len(flat) <= WIDTH or not isinstance(value, (dict, list)) or not value:
        return flat
    pad = " " * (indent + 1)
    if isinstance(value, dict):
        members = [f"{pad}{json.dumps(key)}: " + layout(item, indent + 1, len(json.dumps(key)) + 2)
                   for key, item in value.items()]
        return "{\n" + ",\n".join(members) + "}"
    return "[\n" + ",\n".join(pad + layout(item, indent + 1) for item in value) + "]"


def schema_block(dotted: str) -> str:
    module, name = dotted.rsplit(".", 1)
    return layout(plain(getattr(importlib.import_module(module), name).model_json_schema())) + "\n"


def block_pattern(dotted: str) -> re.Pattern:
    return re.compile(r"`" + re.escape(dotted) + r"`(?:(?!```).)*?```json\n(.*?)```", re.S)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the blocks from the models")
    args = parser.parse_args(argv)
    text = HACKING.read_text()
    stale = []
    for dotted in MODELS:
        match = block_pattern(dotted).search(text)
        if match is None:
            print(f"{HACKING.name}: no ```json block after `{dotted}`", file=sys.stderr)
            return 1
        block = schema_block(dotted)
        if match.group(1) != block:
            stale.append(dotted)
            text = text[:match.start(1)] + block + text[match.end(1):]
    if args.write:
        HACKING.write_text(text)
        print(f"{HACKING.name}: rewrote the schema of " + (", ".join(stale) or "nothing (all current)"))
        return 0
    for dotted in stale:
        print(f"{HACKING.name}: the block after `{dotted}` is not its model_json_schema(); "
              f"run python tools/schema_blocks.py --write", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
