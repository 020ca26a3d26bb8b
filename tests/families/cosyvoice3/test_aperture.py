"""`convert aperture`: the per-rung estimates, the refused rung, the rung sets within the budget, aperture.json."""
from __future__ import annotations

import json

import pytest

from rkaudio.families.cosyvoice3 import aperture as A
from rkaudio.core.errors import SetupError
from tests.fake_cosyvoice3_package import MIB, fake_manifest, fake_package


def test_costs_sets_and_a_refused_rung(tmp_path):
    """weight 600 MiB, internal 100/400/4000 MiB, no attention term: contexts 700/1000/4600 MiB, init mappings
    0.10/0.42/4.19 GB: the third is over a 4 GB ceiling and drops out of every set."""
    rungs = A.read_rungs(fake_package(tmp_path / "pkg", {110: 100, 200: 400, 500: 4000}, plan=[110, 200, 500]))
    assert [r.length for r in rungs] == [110, 200, 500]
    result = A.account(rungs, budget_mib=2300, ceiling_gb=4.0, tensors=0.0)
    rows = {row["length"]: row for row in result["rungs"]}
    assert [rows[s]["context_mib"] for s in (110, 200, 500)] == [700.0, 1000.0, 4600.0]
    assert rows[500]["refused"] and not rows[110]["refused"] and not rows[200]["refused"]
    assert rows[500]["mapping_gb"] == pytest.approx(4000 * MIB / 1e9, abs=1e-3)
    assert rows[110]["spec_context_mib"] == 786 and rows[110]["spec_over_estimate"] == round(786 / 700, 3)
    # every multiset within 2300 MiB: 700, 1000, 1400, 1700, 2000, 2100 (110x3); 110+110+200 = 2400 is over
    assert [s["set"] for s in result["sets"]] == ["110", "200", "110+110", "110+200", "200+200", "110+110+110"]
    assert result["maximal_sets"] == ["110+200", "200+200", "110+110+110"]
    spec = {entry["set"]: entry for entry in result["spec_sets"]}
    assert spec["110+500"]["estimate"] is False  # the refused rung never admits
    assert spec["110+110+110+110"]["estimate"] is False and spec["110+110+110+110"]["estimated_mib"] == 2800.0
    assert spec["110+200+250"]["estimate"] is None  # this package has no 250 rung
    report = A.format_report(result)
    assert "REFUSED: its init mapping 4.19 GB is over the 4 GB ceiling" in report
    assert "6 rung set(s) fit 2300 MiB" in report and "spec refused 110+500 (4538 MiB): estimate refused" in report


def test_attention_term_is_per_block_score_tensors(tmp_path):
    """tensors * depth * heads * S^2 * 2 bytes on top of the toolkit's figure, from the engine's own contract."""
    manifest = fake_manifest(100, 600, 10)
    manifest["contract"]["estimator"] = {"depth": 2, "heads": 4, "dim": 256, "dim_head": 64}
    rung = A.rung_from_manifest(manifest)
    assert rung.context_mib(10.0) == pytest.approx(610 + 10 * 2 * 4 * 100 * 100 * 2 / MIB)
    assert rung.mapping_gb(10.0) == pytest.approx((10 * MIB + 10 * 2 * 4 * 100 * 100 * 2) / 1e9)
    assert A.rung_from_manifest(fake_manifest(100, 600, 10)).depth == 22  # no estimator fields: the real shape


def test_cost_need_not_grow_with_the_length(tmp_path):
    """A longer rung with less internal memory costs less (the spec: S=900 reports less than S=500): the
    estimate takes each engine's host figures as they are."""
    rungs = A.read_rungs(fake_package(tmp_path, {500: 3000, 900: 400}))
    result = A.account(rungs, budget_mib=3900, tensors=0.0)
    rows = {row["length"]: row for row in result["rungs"]}
    assert rows[900]["context_mib"] < rows[500]["context_mib"]
    names = [s["set"] for s in result["sets"]]
    assert "500+900" not in names and "900+900+900" in names


def test_spec_sets_under_the_spec_figures_reproduce_the_spec():
    """The set arithmetic on the board's own per-context figures gives the spec's admitted/refused sets."""
    costs = {s: c for s, c in A.SPEC_CONTEXT_MIB.items() if s <= 500}
    fitting = set(A.multisets(costs, A.DEFAULT_BUDGET_MIB))
    assert all(tuple(sorted(c)) in fitting for c in A.SPEC_ADMITTED)
    assert not any(tuple(sorted(c)) in fitting for c in A.SPEC_REFUSED)


def test_the_ladder_must_be_in_length_order_and_take_no_params(tmp_path):
    with pytest.raises(SetupError, match="not this package's rungs in length order"):
        A.read_rungs(fake_package(tmp_path / "a", {110: 100, 200: 400}, plan=[200, 110]))
    package = fake_package(tmp_path / "b", {110: 100})
    (package / "exec_plan.json").write_text(json.dumps({"cosyvoice3.exec_plan": {"flow": {
        "impl": "rknn", "artifacts": {"main": "cosyvoice3_flow_s110.rknn"}, "params": {"x": 1}}}}))
    with pytest.raises(SetupError, match="takes no exec_plan params"):
        A.read_rungs(package)
    with pytest.raises(SetupError, match="no cosyvoice3 flow engine manifest"):
        A.read_rungs(tmp_path)


def test_calibration_constant_is_the_fit_of_the_recorded_rungs():
    assert A.fit_calibration() == pytest.approx(A.ATTENTION_TENSORS, abs=0.05)
    # board - toolkit = 3 tensors' worth exactly at two rungs: the fit gives 3
    unit = {s: A.attention_bytes(s, 22, 16, 1.0) / MIB for s in (100, 300)}
    board = {s: 600 + 10 + 3 * unit[s] for s in unit}
    assert A.fit_calibration({s: (600, 10) for s in unit}, board) == pytest.approx(3.0)


def test_a_split_rung_sums_its_parts_and_maps_each(tmp_path):
    """Both parts of a chain are resident: their costs add; each part's init maps its own arena (the larger
    one is what the ceiling judges); the exec_plan lists the parts in order."""
    package = tmp_path / "pkg"
    package.mkdir()
    for part, internal in enumerate((30, 50)):
        manifest = fake_manifest(400, 300, internal)
        name = f"cosyvoice3_flow_s400_p{part + 1}of2.rknn"
        manifest["rknn"]["path"] = name
        manifest["contract"].update(chain={"part": part, "parts": 2, "blocks": [0, 11] if part == 0 else [11, 22]},
                                    estimator={"depth": 22, "heads": 16})
        (package / name.replace(".rknn", ".manifest.json")).write_text(json.dumps(manifest))
    [rung] = A.read_rungs(package)
    assert rung.depth == 22 and rung.weight_bytes == 600 * MIB and rung.internal_bytes == 80 * MIB
    attention = A.attention_bytes(400, 22, 16)
    assert rung.context_mib() == pytest.approx(680 + attention / MIB)
    assert rung.mapping_gb() == pytest.approx((50 * MIB + attention / 2) / 1e9)
    (package / "exec_plan.json").write_text(json.dumps({"cosyvoice3.exec_plan": {"flow": {"impl": "rknn", "artifacts": {
        "main": "cosyvoice3_flow_s400_p2of2.rknn,cosyvoice3_flow_s400_p1of2.rknn"}}}}))
    with pytest.raises(SetupError, match="length order"):
        A.read_rungs(package)
    (package / "cosyvoice3_flow_s400_p2of2.manifest.json").unlink()
    with pytest.raises(SetupError, match="incomplete chain"):
        A.read_rungs(package)


def test_tiny_rungs_enumerate_at_most_max_set_size(tmp_path):
    """Engines of a few MiB against 3900 MiB: sets stop at MAX_SET_SIZE rungs (not thousands)."""
    rungs = A.read_rungs(fake_package(tmp_path, {24: 1, 32: 1}, weight_mib=1.0))
    result = A.account(rungs)
    assert len(result["sets"]) == sum(k + 1 for k in range(1, A.MAX_SET_SIZE + 1))  # (a, b) counts, a+b = k
    assert max(len(s["set"].split("+")) for s in result["sets"]) == A.MAX_SET_SIZE


def dynamic_package(directory, host_mib: dict, plan: bool = True):
    """One `--ladder dynamic` engine holding every rung of `host_mib` (S -> (weight MiB, internal MiB) of its
    shape set), as the build writes its manifest."""
    directory.mkdir(parents=True, exist_ok=True)
    largest = max(host_mib)
    manifest = fake_manifest(largest, *host_mib[largest])
    manifest["rknn"]["path"] = "cosyvoice3_flow_ladder.rknn"
    manifest["contract"]["estimator"] = {"depth": 22, "heads": 16, "dim": 1024, "dim_head": 64}
    manifest["shape_sets"] = [{"contract": {"length": s, "ladder_key": s, "role": "main"},
                               "weight_bytes": int(w * MIB), "internal_bytes": int(i * MIB)}
                              for s, (w, i) in sorted(host_mib.items())]
    (directory / "cosyvoice3_flow_ladder.manifest.json").write_text(json.dumps(manifest))
    if plan:
        (directory / "exec_plan.json").write_text(json.dumps({"cosyvoice3.exec_plan": {"flow": {
            "impl": "rknn", "artifacts": {"main": "cosyvoice3_flow_ladder.rknn"}}}}))
    return directory


def test_a_dynamic_engine_is_one_context_beside_its_rungs_as_static_contexts(tmp_path):
    """The calibrated real-shape figures in one engine: each set costs what its static engine would (the static
    sets unchanged), and one context holding all five rungs costs the weights once plus the S=500 set's internal
    memory and attention scratch: within 3900 MiB, where the static engines admit at most 110+400-like pairs."""
    package = dynamic_package(tmp_path / "pkg", A.CALIBRATION_HOST_MIB)
    rungs = A.read_rungs(package)
    assert [r.length for r in rungs] == [110, 200, 250, 400, 500]
    assert {r.engine for r in rungs} == {"cosyvoice3_flow_ladder.rknn"}
    result = A.account(rungs)
    static = A.account(A.read_rungs(fake_package(tmp_path / "static", {
        s: i for s, (_, i) in A.CALIBRATION_HOST_MIB.items()}, weight_mib=632.54)))
    assert [row["context_mib"] for row in result["rungs"]] == [row["context_mib"] for row in static["rungs"]]
    assert result["sets"] == static["sets"] and static["one_context"] == []
    (context,) = result["one_context"]
    weight, internal = A.CALIBRATION_HOST_MIB[500]
    assert context["context_mib"] == pytest.approx(weight + internal + A.attention_bytes(500, 22, 16) / MIB, abs=0.1)
    assert context["context_mib"] == result["rungs"][-1]["context_mib"]  # the S=500 rung alone
    assert context["holds"] == "110+200+250+400+500" and context["fits"] and context["contexts_in_budget"] == 1
    assert context["static_mib"] == pytest.approx(sum(row["context_mib"] for row in static["rungs"]), abs=0.5)
    assert "unmeasured" in context["assumption"]
    assert "one context of cosyvoice3_flow_ladder.rknn holds 110+200+250+400+500 at once" in A.format_report(result)
