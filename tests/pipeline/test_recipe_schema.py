"""Recipes are checked against their family's declaration when they load: every planted typo below is refused by
`convert engines` (and `--list`) with exit 2, one line naming the file, the table, the key and the closest valid
key, and nothing is built."""
import sys
from pathlib import Path

import pytest

from rkaudio.core.paths import REPO_ROOT

EXAMPLE, PIPER = "example_conv.toml", "piper_joe_medium.toml"

# (recipe, text replaced, replacement, what the refusal says)
PLANTED = {
    "gate key": (EXAMPLE, "max_regtask_lines = 0", "max_regtask_line = 0",
                 "gates.max_regtask_line: unknown; did you mean max_regtask_lines?"),
    "source key": (EXAMPLE, "seed = 0", "sed = 0", "source.sed: unknown; did you mean seed?"),
    "option key": (EXAMPLE, "channels = 16", "chanels = 16", "options.chanels: unknown; did you mean channels?"),
    "card key": (EXAMPLE, 'license = "other"', 'licence = "other"', "card.licence: unknown; did you mean license?"),
    "top-level key": (EXAMPLE, 'targets = [', 'target = "rk3588"\ntargets = [',
                      "target: unknown; did you mean targets?"),
    "component table key": (PIPER, "[components.decoder.options]", "[components.decoder.optons]",
                            "components.decoder.optons: unknown; did you mean options?"),
    "component name": (PIPER, "[components.duration_encoder]\n", "[components.duration_encodr]\n",
                       "components.duration_encodr: unknown; did you mean duration_encoder?"),
    "component option": (PIPER, "context = 32", "contxt = 32",
                         "components.decoder.options.contxt: unknown; did you mean context?"),
    "component gate": (PIPER, "max_drift_pct = 7.0", "max_drift_pc = 7.0",
                       "components.duration_encoder.gates.max_drift_pc: unknown; did you mean max_drift_pct?"),
    "string for a number": (EXAMPLE, "channels = 16", 'channels = "16"',
                            "options.channels: input should be a valid integer, got '16' (str)"),
    "out of range": (EXAMPLE, "channels = 16", "channels = 0",
                     "options.channels: input should be greater than or equal to 1, got 0 (int)"),
    "per-target table naming rk3599": (PIPER, "rk3566 = 127", "rk3599 = 127",
                                       "components.decoder.options.window.rk3599: not a target of this recipe; "
                                       "did you mean"),
    "unknown target": (EXAMPLE, '"rk3566"]', '"rk3599"]', "targets: unknown target 'rk3599'"),
}


def _convert(monkeypatch, capsys, *args) -> tuple[int, str]:
    from rkaudio import cli

    monkeypatch.setattr(sys, "argv", ["convert", *map(str, args)])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    return exited.value.code, capsys.readouterr().err


def _planted(tmp_path: Path, recipe: str, old: str, new: str) -> Path:
    text = (REPO_ROOT / "recipes" / recipe).read_text()
    assert old in text, f"{recipe} no longer holds {old!r}: update the planted typo"
    recipes_dir = tmp_path / "recipes"
    recipes_dir.mkdir()
    (recipes_dir / recipe).write_text(text.replace(old, new, 1))
    return recipes_dir


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_a_planted_typo_is_refused_naming_the_key_and_nothing_is_built(tmp_path, monkeypatch, capsys, case):
    recipe, old, new, said = PLANTED[case]
    recipes_dir, dist = _planted(tmp_path, recipe, old, new), tmp_path / "dist"
    code, err = _convert(monkeypatch, capsys, "engines", "--target", "rk3588", "--recipes", recipes_dir,
                         "--dist", dist)
    assert code == 2, err
    assert said in err and str(recipes_dir / recipe) in err, err
    assert not dist.exists()
    code, err = _convert(monkeypatch, capsys, "engines", "--list", "--recipes", recipes_dir)
    assert code == 2 and said in err, err


def test_every_shipped_recipe_passes_its_declaration(monkeypatch, capsys):
    from rkaudio.cli.families import declaration
    from rkaudio.release import recipes

    loaded = recipes.load_recipes(REPO_ROOT / "recipes", declaration)
    assert {r["family"] for r in loaded} == {"audio8", "cosyvoice3", "example", "inflect", "kokoro", "piper",
                                              "qwen3_vocoder"}
    piper = next(r for r in loaded if r["family"] == "piper")
    assert piper["per_target"] == {"options": ["window"], "gates": []}
    [decoder] = [part for part in recipes.recipes_for(piper, "rk3576") if part["component"] == "decoder"]
    assert decoder["options"]["window"] == 237


def test_a_misspelled_family_names_the_closest(tmp_path, monkeypatch, capsys):
    recipes_dir = _planted(tmp_path, EXAMPLE, 'family = "example"', 'family = "exampel"')
    code, err = _convert(monkeypatch, capsys, "engines", "--list", "--recipes", recipes_dir)
    assert code == 2 and "no family 'exampel'" in err and "did you mean example?" in err, err


REFUSAL_PROBLEMS = {
    "built and refused": ('targets = ["rk3588", "rk3566"]\n[refused]\nrk3566 = "too slow"\n',
                          "refused.rk3566: also listed in targets; a target is built or refused, not both"),
    "unknown refused target": ('targets = ["rk3588"]\n[refused]\nrk3599 = "no such SoC"\n',
                               "refused.rk3599: unknown target 'rk3599'"),
    "no reason": ('targets = ["rk3588"]\n[refused]\nrk3566 = " "\n', "refused.rk3566: give the measured reason"),
}


@pytest.mark.parametrize("case", sorted(REFUSAL_PROBLEMS))
def test_a_refusal_must_name_a_target_left_out_and_its_reason(tmp_path, monkeypatch, capsys, case):
    head, said = REFUSAL_PROBLEMS[case]
    text = (REPO_ROOT / "recipes" / EXAMPLE).read_text()
    recipes_dir = tmp_path / "recipes"
    recipes_dir.mkdir()
    body = "\n".join(line for line in text.splitlines() if not line.startswith("targets"))
    (recipes_dir / EXAMPLE).write_text(body.replace('family = "example"\n', f'family = "example"\n{head}', 1))
    code, err = _convert(monkeypatch, capsys, "engines", "--list", "--recipes", recipes_dir)
    assert code == 2 and said in err, err


def test_every_shipped_recipe_builds_or_refuses_each_promised_target():
    """Issue #26: no silent gap. Each shipped model (the example has no checkpoint and is not promised) is built or
    refused with a reason on every SoC rkaudio promises, and so is each of its components on each recipe target;
    and the committed table (bench/results/targets.json) has measured that cell: engine rows, or the refusal."""
    import json

    from rkaudio.cli.families import declaration
    from rkaudio.release import recipes
    from rkaudio.board.soc import PROMISED_TARGETS

    rows = json.loads((REPO_ROOT / "bench" / "results" / "targets.json").read_text())["rows"]
    gaps = []
    for recipe in recipes.load_recipes(REPO_ROOT / "recipes", declaration):
        if recipe["family"] == "example":
            continue
        gaps += [f"{recipe['package']}: {t} neither in targets nor refused" for t in PROMISED_TARGETS
                 if t not in recipe["targets"] and t not in recipe["refused"]]
        for name, table in recipe["components"].items():
            gaps += [f"{recipe['package']}.{name}: {t} neither in its targets nor refused" for t in recipe["targets"]
                     if t not in table["targets"] and t not in table["refused"]]
        for target in PROMISED_TARGETS:
            cell = [row for row in rows if row["package"] == recipe["package"] and row["target"] == target]
            if not cell or any(row["status"] in ("not measured", "not in recipe") for row in cell):
                gaps.append(f"{recipe['package']} on {target}: no measured row in bench/results/targets.json "
                            f"(make bench NAME=targets ARGS=\"--cells {recipe['package']}:{target}\")")
    assert not gaps, "\n".join(gaps)
