"""`--ladder dynamic` on Audio8: the three K/V-bucket step graphs become one step engine (a shape set per bucket).
The small model builds with every gate (the recipe's build gates, the family's token gates, the end-to-end golden),
each set measures what the static step engine of its bucket measures, the package's exec_plan and the plan name the
one file for the three `step_<n>` roles, and the runtime's bucket loop runs 128 -> 256 -> 512 through that one
engine's views, opened once, each fed its own bucket's shapes with the K/V buffers and the mask in fp16."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from rkaudio.families.audio8 import FAMILY, checks
from rkaudio.families.audio8.export import name_built_engines
from rkaudio.pipeline.exported import Exported
from rkaudio.pipeline.ladder import dynamic_ladder
from rkaudio.core.contract import contract_of
from rkaudio.core.paths import engine_name
from rkaudio.board.audio8 import PLAN_FILE, Audio8Runtime
from rkaudio.board.mel import log_mel

BUCKETS = [128, 256, 512]
STEP_ROLES = [f"step_{bucket}" for bucket in BUCKETS]
MERGED = "step_ladder"
SHARDS = 2
GATES = {"max_regtask_lines": 0, "fail_on_cpu_ops": True, "min_simulator_snr_db": 35.0}  # the recipe's
# rk3576: the small model's fixed-shape steps hold 0 CPU ops there; on rk3588 its q/k head-split Reshapes run on the
# CPU at this size (4 per step, static or dynamic; none at real shape, tests/families/audio8/test_norm_placement.py)
TARGET = "rk3576"
SNR_DB_WITHIN, CYCLES_WITHIN = 0.5, 0.02


def _merged_plan(small_plan, directory):
    """A copy of the small model's graphs with its step buckets merged into one shape-generic step graph."""
    shutil.copytree(small_plan, directory)
    plan = json.loads((directory / PLAN_FILE).read_text())
    records = [Exported.from_onnx(directory / entry["onnx"], FAMILY.name) for entry in plan["graphs"]]
    merged = dynamic_ladder(records, FAMILY.components[0].ladder, say=lambda _: None)
    return {engine_name(record.onnx): contract_of(record.onnx) for record in merged}


def test_the_bucket_loop_runs_one_step_engine_through_its_views_fed_in_fp16(small_plan, tmp_path):
    """Over the kit's engines (one view per shape set) and over the plan (the step graphs naming the one engine,
    as `after_build` writes it), decoding through both migrations opens the step engine once; each view takes only
    its bucket's shapes, the buffers in fp16 (the contract's feed_dtypes, as an engine is fed), and the tokens are
    the fp32 plan's or diverge only at an fp16 tie. onnxruntime runs the shape-generic ONNX in the engine's place."""
    from rkaudio.core.contract import fed_inputs
    from rkaudio.board.golden import EnginePool
    from rkaudio.host.backends import OnnxBackend

    directory = tmp_path / "dynamic"
    contracts = _merged_plan(small_plan, directory)
    assert sorted(name for name in contracts if name.startswith("step")) == [f"{MERGED}.rknn"]
    name_built_engines(directory, list(contracts.items()))
    plan = json.loads((directory / PLAN_FILE).read_text())
    assert {e["contract"]["role"]: e["rknn"] for e in plan["graphs"] if e["contract"]["role"] in STEP_ROLES} == {
        role: f"{MERGED}.rknn" for role in STEP_ROLES}
    for name in contracts:
        (directory / name).touch()  # stand-ins for the built engines
    opened, fed = [], []

    class AsEngine:
        """The engine's ONNX on onnxruntime, fed as the engine is (each input in its manifest dtype)."""

        def __init__(self, path):
            opened.append(path.name)
            onnx_path = directory / path.with_suffix(".onnx").name
            self.graph = OnnxBackend(onnx_path)
            entries = [{"name": name, "dtype": dtype.name} for name, dtype in self.graph.input_dtypes.items()]
            self.input_dtypes = {e["name"]: np.dtype(e["dtype"]) for e in fed_inputs(entries, contract_of(onnx_path))}

        def run(self, feeds):
            if "full_k_0" in feeds:
                fed.append((feeds["mask"].shape[-1], feeds["mask"].dtype.name, feeds["full_k_0"].dtype.name))
            return self.graph.run(feeds)

        def close(self):
            self.graph.close()

    audio = checks.probe_audio(100)  # the longest clip: a 110-token prompt, so 160 tokens cross both migrations
    features = log_mel(audio, 128)
    with Audio8Runtime(small_plan, backend_for=OnnxBackend) as runtime:
        reference = runtime.transcribe(features, audio.size, 160, ignore_eos=True, keep_logits=True)
    table = np.load(directory / plan["embed_table"], mmap_mode="r")
    with EnginePool(list(contracts.items()), lambda name: AsEngine(directory / name)) as pool:
        with Audio8Runtime(engines=pool.engines, embed_table=table) as runtime:
            views = runtime.transcribe(features, audio.size, 160, ignore_eos=True)
    with Audio8Runtime(directory, backend_for=AsEngine, artifact="rknn") as runtime:
        planned = runtime.transcribe(features, audio.size, 160, ignore_eos=True)
    for decoded in (views, planned):
        assert decoded.buckets == BUCKETS
        verdict = checks.margin_explained_verdict("fp16_buffers", reference.tokens, reference.step_logits,
                                                  decoded.tokens)
        assert verdict.passed, verdict.line()
    assert views.tokens == planned.tokens
    assert opened.count(f"{MERGED}.rknn") == 2  # once per runtime: kept open through both migrations
    assert sorted(set(fed)) == [(bucket, "float16", "float16") for bucket in BUCKETS]


@pytest.fixture(scope="module")
def builds(small_model, tmp_path_factory):
    """The small model built `--ladder dynamic` as a recipe builds it (the recipe's gates); and
    the static step engines of the same buckets, compiled from the same rung graphs with the same gates."""
    import rkaudio.families.audio8 as family
    from rkaudio.engine.build import BuildOptions, build_engine
    from rkaudio.families.audio8 import model as M
    from rkaudio.release.recipes import build_part
    from rkaudio.core.errors import SetupError
    from rkaudio.core.paths import selfcheck_path
    from rkaudio.toolkit.versions import converter_python

    try:
        converter_python("2.3.2")
    except SetupError as error:  # fails, never skips: `make test` creates the converter venv
        pytest.fail(str(error))
    root = tmp_path_factory.mktemp("audio8_dynamic")
    recipe = {"package": "audio8_dyn", "path": "recipes/audio8_dyn.toml", "family": "audio8", "source": {},
              "options": {"kv_buckets": BUCKETS, "head_shards": SHARDS, "ladder": "dynamic"}, "gates": GATES}
    with pytest.MonkeyPatch.context() as patch:  # the recipe's snapshot is the small model
        patch.setattr(family, "_snapshot_dir", lambda source: root)
        patch.setattr(M, "load_snapshot", lambda path: small_model)
        results = build_part(family.FAMILY, recipe, TARGET, "2.3.2", root / "work")
    options = BuildOptions(target=TARGET, **GATES)
    statics = [build_engine(root / "work" / f"step_s{bucket}.onnx", root / "static", options,
                            selfcheck=selfcheck_path(root / "work" / f"step_s{bucket}.onnx")) for bucket in BUCKETS]
    return {"results": results, "work": root / "work", "statics": statics}


def test_the_small_model_builds_one_step_engine_gated_per_set_as_the_static_steps(builds):
    results = builds["results"]
    steps = [r for r in results if r.manifest_data["contract"]["role"].startswith("step_")]
    assert [r.rknn.name for r in steps] == [f"{MERGED}.rknn"]
    step = steps[0].manifest_data
    gates = [gate for result in results for gate in result.manifest_data["gates"]]
    assert all(gate["passed"] for gate in gates), [gate for gate in gates if not gate["passed"]]
    names = {gate["name"] for gate in step["gates"]}
    # the family's token gates and the merge's exactness travel with the engine, every set gated on its own
    assert {"greedy_tokens[1.9s]", "stress_tokens[S110+403]", "shape_generic_exact"} <= names
    assert {f"regtask_lines@{n}" for n in range(len(BUCKETS))} <= names
    assert [entry["contract"]["role"] for entry in step["shape_sets"]] == STEP_ROLES
    for number, (entry, static) in enumerate(zip(step["shape_sets"], builds["statics"])):
        fixed = static.manifest_data
        assert entry["regtask"]["lines"] == 0 and entry["ops"]["cpu"] == 0
        assert abs(entry["est_cycles"] - fixed["est_cycles"]) <= CYCLES_WITHIN * fixed["est_cycles"], number
        for output, figures in fixed["simulator"].items():
            assert abs(step["simulator"][f"{output}@{number}"]["snr_db"] - figures["snr_db"]) <= SNR_DB_WITHIN, (
                number, output, step["simulator"][f"{output}@{number}"]["snr_db"], figures["snr_db"])
    assert steps[0].rknn.stat().st_size < sum(static.rknn.stat().st_size for static in builds["statics"])


def test_the_package_names_the_one_step_engine_in_the_three_step_roles(builds):
    """The exec_plan packaging merges from the engines (the small model's kit is over its package's 1 MB budget,
    static or dynamic, so no package is assembled), the plan packaged beside them, and the kit's index."""
    from rkaudio.board.contract import EngineContract
    from rkaudio.release.package import merge_exec_plan
    from rkaudio.host.exec_plan import plan_problems, shared_file_problems

    results, work = builds["results"], builds["work"]
    plan = merge_exec_plan([(r.rknn.name, EngineContract.from_json(r.manifest_data["contract"])) for r in results])
    artifacts = plan["audio8_asr.exec_plan"]["decoder"]["artifacts"]
    assert {role: artifacts[role] for role in STEP_ROLES} == {role: f"{MERGED}.rknn" for role in STEP_ROLES}
    assert not plan_problems(plan) + shared_file_problems(plan, {r.rknn.name: r.manifest_data for r in results})
    graphs = json.loads((work / PLAN_FILE).read_text())["graphs"]  # what the board runtime opens its engines by
    assert {entry["rknn"] for entry in graphs} == {r.rknn.name for r in results}
    index = json.loads((work / "selftest" / "index.json").read_text())
    assert [e.get("shape_set") for e in index["engines"] if e["engine"] == f"{MERGED}.rknn"] == [0, 1, 2]
    assert f"{MERGED}.rknn" in index["end_to_end"][0]["engines"]
