"""Inflect on the SoCs with a shorter time field: an Inflect-shaped decoder (the official format and the real
window/hop structure: four levels of 8, 8, 2 and 2 samples, the recipe's window for the target; narrow channels keep
it to about a minute) builds from the recipe for rk3566 with its overflowing levels in polyphase form, 0 REGTASK
lines, 0 CPU ops and every export and build gate passing."""
from __future__ import annotations

from rkaudio.cli.families import declaration
from rkaudio.families.inflect import FAMILY
from rkaudio.families.inflect.reference import InflectConfig, export_official
from rkaudio.release.recipes import build_components, load_recipe, recipes_for
from rkaudio.core.paths import REPO_ROOT
from rkaudio.surgery.graph.polyphase_levels import overflowing_levels, phase_count

NARROW = InflectConfig("Narrow", inter_channels=16, hidden_channels=16, upsample_initial_channel=32)


def test_inflect_shaped_decoder_builds_for_rk3566_with_no_regtask_line(require_converter, tmp_path):
    require_converter("2.3.2")
    target = "rk3566"
    official = export_official(tmp_path / "official", NARROW, seed=0)
    recipe = load_recipe(REPO_ROOT / "recipes" / "inflect_nano_v2_decoder.toml", declaration)
    recipe["source"] = {"dir": str(official["config"].parent)}
    window = recipes_for(recipe, target)[0]["options"]["window"]
    strides = list(NARROW.upsample_rates)
    levels = overflowing_levels(target, window, strides)
    assert levels >= 2  # the window's fine axis passes the field at more than one level
    [result] = build_components(recipe, target, "2.3.2", tmp_path / "work", FAMILY)
    manifest = result.manifest_data
    print(f"{target} w{window}: {levels} levels in {phase_count(strides, levels)} phases, {manifest['est_cycles']} "
          "cycles; " + "; ".join(v.line() for v in result.verdicts))
    assert manifest["contract"]["polyphase"] == phase_count(strides, levels)
    assert manifest["regtask"]["lines"] == 0
    assert manifest["ops"]["cpu"] == 0 and manifest["ops"]["cpu_ops"] == []
    assert all(v.passed for v in result.verdicts), [v.line() for v in result.verdicts if not v.passed]
