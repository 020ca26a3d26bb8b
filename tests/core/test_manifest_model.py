"""The manifest's model: manifests written before it validate, a broken one is refused naming its field, nothing
invalid is written, and HACKING.md's schema blocks are the models' own."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rkaudio.core.manifest import manifest_text, summary_lines, write_manifest
from rkaudio.core.manifest_model import Manifest, schema_problems, validate_manifest
from rkaudio.core.paths import REPO_ROOT

DATA = Path(__file__).parent / "data"
# Manifests as builds wrote them: a fixed engine (the example family, before the model), a CosyVoice3 part (a
# float ladder_key, package_files) and an engine of several shape sets (the example family's dynamic ladder).
MANIFESTS = sorted(DATA.glob("*.manifest.json"))


def _manifest(name: str = "example_c16_t64") -> dict:
    return json.loads((DATA / f"{name}.manifest.json").read_text())


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda path: path.name)
def test_manifests_written_before_the_model_validate_and_rewrite_unchanged(path):
    text = path.read_text()
    data = json.loads(text)
    assert schema_problems(Manifest, data) == []
    assert manifest_text(data) == text  # validate-only: the file is the dict as given, key order kept


def test_a_manifest_missing_a_required_field_is_refused_naming_it(tmp_path):
    data = _manifest()
    del data["rknn"]
    del data["regtask"]["worst_ratio"]
    with pytest.raises(ValueError, match=r"(?s)Manifest.*\n  rknn: Field required\n  regtask.worst_ratio: Field required"):
        write_manifest(tmp_path / "e.manifest.json", data)
    assert not (tmp_path / "e.manifest.json").exists()


def test_optional_fields_may_be_absent_or_null():
    data = _manifest()
    for key in ("engine_io", "producer_version", "producer_git", "predicted_board_ms"):
        del data[key]
    for key in ("bound", "advice", "degenerate"):
        del data["gates"][0][key]
    del data["build"]["stage_peak_rss_bytes"]
    assert validate_manifest(data) is data
    assert validate_manifest({**_manifest(), "predicted_board_ms": None, "producer_git": None,
                              "a_key_of_a_later_release": 1})


def test_a_figure_json_cannot_hold_is_refused_as_a_float_and_kept_as_its_string():
    data = _manifest()
    data["gates"][0]["value"] = "inf"  # what json_safe writes
    data["simulator"]["y"]["snr_db"] = "nan"
    assert schema_problems(Manifest, data) == []
    data["gates"][0]["value"] = float("inf")  # json.dumps would write Infinity: no JSON
    data["simulator"]["y"]["snr_db"] = "1.5"  # a number written as a string
    problems = schema_problems(Manifest, data)
    assert any(p.startswith("gates.0.value.float: Input should be a finite number") for p in problems), problems
    assert any(p.startswith("simulator.y.snr_db.literal") for p in problems), problems


def test_the_contract_is_checked_through_the_engine_contract():
    data = _manifest()
    data["contract"]["ladder_key"] = "64"
    assert any(p.startswith("contract.ladder_key") for p in schema_problems(Manifest, data))
    data = _manifest()
    data["contract"]["exec_params"] = None  # a shared field present as null does not read back as written
    assert schema_problems(Manifest, data) == [
        "contract: Value error, EngineContract does not write it back unchanged (a shared field is null)"]
    data = _manifest()
    data["contract"]["a_family_field"] = {"free": ["form"]}
    assert schema_problems(Manifest, data) == []


def test_a_dynamic_engines_summary_names_each_sets_role():
    data = _manifest("example_c16_ladder")
    lines = [line for line in summary_lines(data) if line.startswith("  shape set")]
    assert len(lines) == len(data["shape_sets"]) > 1
    assert all("(role main)" in line for line in lines)
    broken = copy.deepcopy(data)
    del broken["shape_sets"][1]["ops"]
    assert schema_problems(Manifest, broken) == ["shape_sets.1.ops: Field required"]


def test_hacking_shows_the_models_schemas():
    """HACKING.md's manifest and report schema blocks are generated from the models (tools/schema_blocks.py)."""
    run = subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "schema_blocks.py")], capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
