"""build_engine's up-front checks, the contract helpers, the adb safety net and RknnLiteBackend (fake rknnlite):
everything that needs no converter child."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import types

import numpy as np
import onnx
import pytest

from rkaudio.board.contract import EngineContract
from rkaudio.toolkit.session import CUSTOM_STRING_MAX_BYTES, custom_string, graph_io, kill_stray_adb, random_feeds, toolkit_readable
from rkaudio.engine.build import BuildOptions, build_engine
from rkaudio.core.errors import SetupError
from rkaudio.core.manifest import exec_plan_fragment


def test_symbolic_input_is_a_setup_error_naming_input_and_dimension(graph, tmp_path):
    path = graph("symbolic", dims=[1, 8, "T"])
    with pytest.raises(SetupError, match=r"input 'x'.*symbolic dimension 'T' at axis 2"):
        build_engine(path, tmp_path / "out", BuildOptions(target="rk3588"))
    assert not (tmp_path / "out" / "symbolic.rknn").exists()


def test_constant_beyond_fp16_fails_before_the_build(graph, tmp_path):
    """Weights of 1e5 are inf in an fp16 engine: the fp16_constants gate names the tensor and stops the build
    before the compiler runs (no child, no artifacts)."""
    from rkaudio.gates.fp16_range import fp16_constants_verdict
    from rkaudio.core.errors import GateFailure

    path = graph("huge", gain=3e5)
    verdict = fp16_constants_verdict(onnx.load(str(path)))
    assert not verdict.passed and "w0 max|x|" in verdict.detail
    assert fp16_constants_verdict(onnx.load(str(graph("fits")))).passed
    with pytest.raises(GateFailure, match=r"fp16_constants.*w0"):
        build_engine(path, tmp_path / "out", BuildOptions(target="rk3588"))
    assert not list((tmp_path / "out").glob("huge*"))


@pytest.mark.parametrize("target, reason", [("rv1106", "no fp16 build"), ("rk9999", "unknown target")])
def test_unsupported_target_refused_before_any_build(graph, tmp_path, target, reason):
    with pytest.raises(SetupError, match=reason):
        build_engine(graph("small"), tmp_path / "out", BuildOptions(target=target))
    assert not (tmp_path / "out").exists()


def test_ir_version_lowered_for_old_toolkit_onnx(graph):
    model = onnx.load(str(graph("small")))
    model.ir_version = 11
    assert toolkit_readable(model, "2.3.2").ir_version == 10
    assert toolkit_readable(model, "2.5.0") is model  # onnx 1.18 reads IR 11 as is
    model.opset_import[0].version = 22
    with pytest.raises(SetupError, match="opset 22.*<= 21"):
        toolkit_readable(model, "2.3.2")


def test_custom_string_fits_the_toolkit_limit():
    contract = EngineContract.from_json({
        "family": "piper", "component": "decoder", "role": "main", "exec_plan_option": "piper_tts.exec_plan",
        "producer": {"rkaudio": "0.1.0", "git": "abc"}, "exec_params": {"table": list(range(1000))}})
    text = custom_string(contract)
    assert len(text.encode()) <= CUSTOM_STRING_MAX_BYTES
    kept = json.loads(text)
    assert kept["family"] == "piper" and kept["git"] == "abc" and "exec_params" not in kept
    small = json.loads(custom_string(contract.replace(exec_params={"overlap": 0})))
    assert small["exec_params"] == {"overlap": 0}


def test_exec_plan_fragment_from_contract():
    contract = EngineContract.from_json({"exec_plan_option": "kokoro_tts.exec_plan", "component": "generator",
                                         "role": "main", "exec_params": {"overlap": 0, "gain": False}})
    assert exec_plan_fragment(contract, "gen_w128.rknn") == {"kokoro_tts.exec_plan": {"generator": {
        "impl": "rknn", "artifacts": {"main": "gen_w128.rknn"}, "params": {"overlap": 0, "gain": False}}}}
    assert exec_plan_fragment(EngineContract.from_json({}), "x.rknn") == {}


def test_random_feeds_deterministic_and_typed(graph):
    inputs, _ = graph_io(onnx.load(str(graph("small"))))
    first, again = random_feeds(inputs), random_feeds(inputs)
    assert first["x"].dtype == np.float32 and first["x"].shape == (1, 8, 64)
    np.testing.assert_array_equal(first["x"], again["x"])
    assert 0.5 < first["x"].std() < 1.5


def test_kill_stray_adb_kills_only_adb_inside_the_venv(tmp_path):
    venv, elsewhere = tmp_path / "venv" / "rknn" / "bin", tmp_path / "other"
    venv.mkdir(parents=True)
    elsewhere.mkdir()
    sleep = shutil.which("sleep")
    shutil.copy(sleep, venv / "adb")
    shutil.copy(sleep, elsewhere / "adb")
    inside = subprocess.Popen([str(venv / "adb"), "30"])
    outside = subprocess.Popen([str(elsewhere / "adb"), "30"])
    try:
        assert kill_stray_adb(tmp_path / "venv") == [inside.pid]
        assert inside.wait(timeout=10) < 0
        assert outside.poll() is None
    finally:
        for proc in (inside, outside):
            proc.kill()
            proc.wait()


class FakeRKNNLite:
    """Stands in for rknnlite.api.RKNNLite: refuses the three-core mask like a single-core SoC."""
    NPU_CORE_AUTO, NPU_CORE_0, NPU_CORE_0_1_2 = 0, 1, 7
    instances: list = []

    def __init__(self):
        self.masks, self.released = [], False
        FakeRKNNLite.instances.append(self)

    def load_rknn(self, path):
        self.path = path
        return 0

    def init_runtime(self, core_mask):
        self.masks.append(core_mask)
        return -1 if core_mask == self.NPU_CORE_0_1_2 else 0

    def inference(self, inputs, data_format=None):
        self.inputs = inputs
        # Outputs come back 4-D (as the runtime does for 3-D tensors): a + 2b, flattened.
        return [(inputs[0] + 2 * inputs[1]).reshape(1, 2, 1, -1)]

    def release(self):
        self.released = True


def fake_rknnlite_engine(tmp_path, monkeypatch, b_dtype: str, lengths: tuple = ()):
    """RknnLiteBackend over FakeRKNNLite, and an engine whose manifest takes a (float32) and b (`b_dtype`), [1, 2, 3]
    or, with `lengths`, compiled for the shape sets [1, 2, length]."""
    api = types.ModuleType("rknnlite.api")
    api.RKNNLite = FakeRKNNLite
    monkeypatch.setitem(sys.modules, "rknnlite", types.ModuleType("rknnlite"))
    monkeypatch.setitem(sys.modules, "rknnlite.api", api)
    from rkaudio.board.rknnlite import RknnLiteBackend

    engine = tmp_path / "e.rknn"
    engine.write_bytes(b"fake")
    (tmp_path / "e.manifest.json").write_text(json.dumps({  # the fields RknnLiteBackend reads, no whole manifest
        "toolkit_version": "2.3.2",
        "inputs": [{"name": "a", "shape": [1, 2, 3], "dtype": "float32"},
                   {"name": "b", "shape": [1, 2, 3], "dtype": b_dtype}],
        "outputs": [{"name": "y", "shape": [1, 2, 3], "dtype": "float32"}],
        **({"shape_sets": [{"inputs": [{"name": name, "shape": [1, 2, length], "dtype": "float32"} for name in "ab"],
                            "outputs": [{"name": "y", "shape": [1, 2, length], "dtype": "float32"}],
                            "contract": {"role": "main", "ladder_key": length}} for length in lengths]}
           if lengths else {})}))
    return RknnLiteBackend, engine


def test_rknnlite_backend_uses_manifest_order_and_falls_back_to_auto(tmp_path, monkeypatch):
    RknnLiteBackend, engine = fake_rknnlite_engine(tmp_path, monkeypatch, b_dtype="float32")
    a, b = np.ones((1, 2, 3), np.float32), np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    with RknnLiteBackend(engine) as backend:
        out = backend.run({"b": b, "a": a})  # dict order differs from the manifest's
        lite = FakeRKNNLite.instances[-1]
        assert lite.masks == [FakeRKNNLite.NPU_CORE_0_1_2, FakeRKNNLite.NPU_CORE_AUTO]
        assert backend.core_mask == "AUTO"
        assert backend.input_names == ["a", "b"]
    np.testing.assert_array_equal(lite.inputs[0], a)
    np.testing.assert_array_equal(out["y"], a + 2 * b)
    assert lite.released


def test_rknnlite_backend_feeds_each_input_in_the_manifests_dtype(tmp_path, monkeypatch):
    """An input the manifest says is fed in float16 reaches rknnlite as a float16 array (rknnlite takes the array's
    dtype as the input's type), whatever dtype the caller holds it in; the others as the manifest says."""
    RknnLiteBackend, engine = fake_rknnlite_engine(tmp_path, monkeypatch, b_dtype="float16")
    b = np.arange(6, dtype=np.float32).reshape(1, 2, 3) / 3
    with RknnLiteBackend(engine, core_mask="AUTO") as backend:
        backend.run({"a": np.ones((1, 2, 3), np.float64), "b": b})
        lite = FakeRKNNLite.instances[-1]
    assert [array.dtype for array in lite.inputs] == [np.float32, np.float16]
    np.testing.assert_array_equal(lite.inputs[1], b.astype(np.float16))


def test_a_child_reports_its_own_peak_memory_not_its_parents():
    """A compiler child started by a large parent (an export holding a model) must report its own peak: the
    getrusage figure it used to send carries the parent's high-water mark across execve."""
    from rkaudio.core.paths import REPO_ROOT

    held = np.ones(512 * 1024**2 // 8)  # the parent holds 512 MiB when it starts the child
    probe = ("import resource; from rkaudio.toolkit.child import own_peak_rss_kb; "
             "print(own_peak_rss_kb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    own_kb, inherited_kb = map(int, out.stdout.split())
    assert held.nbytes // 1024 <= inherited_kb  # the old figure: at least the parent's 512 MiB
    assert own_kb < 256 * 1024, own_kb  # a bare interpreter's own peak


def test_rknnlite_backend_runs_each_shape_set_and_refuses_an_unlisted_shape(tmp_path, monkeypatch):
    """An engine of several shape sets runs a feed at any listed set's shapes, its outputs in that set's shapes; a
    shape outside the list is refused before the runtime sees it, with an error naming the fed and listed shapes."""
    from rkaudio.board.shapes import ShapeRefused

    RknnLiteBackend, engine = fake_rknnlite_engine(tmp_path, monkeypatch, b_dtype="float32", lengths=(3, 5))
    with RknnLiteBackend(engine, core_mask="AUTO") as backend:
        for length in (3, 5):
            a = np.ones((1, 2, length), np.float32)
            assert backend.run({"a": a, "b": a})["y"].shape == (1, 2, length)
        calls = len(FakeRKNNLite.instances[-1].inputs)
        with pytest.raises(ShapeRefused, match=r"e\.rknn: fed a \[1, 2, 4\].*\[1, 2, 3\].*\[1, 2, 5\]"):
            backend.run({"a": np.ones((1, 2, 4), np.float32), "b": np.ones((1, 2, 4), np.float32)})
        assert len(FakeRKNNLite.instances[-1].inputs) == calls  # nothing reached the runtime


def test_a_compile_parent_hands_back_the_heap_it_freed():
    """What an export or the host references freed stays mapped in glibc's heap until it is trimmed: the parent of
    a real-shape compile would sit on GBs beside a 10 GB child. `release_freed_heap` (run before every child starts)
    hands it back."""
    from rkaudio.core.paths import REPO_ROOT

    probe = """
from rkaudio.toolkit.session import release_freed_heap

def resident_kb():
    return int(next(line for line in open("/proc/self/status") if line.startswith("VmRSS")).split()[1])

blocks = [bytes(4000) for _ in range(100_000)]  # 400 MB in malloc blocks (above pymalloc's size)
kept = blocks[::64] + [blocks[-1]]  # a few stay alive, the last at the heap's top: no automatic trim
del blocks
held = resident_kb()
release_freed_heap()
print(held, resident_kb())
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    held_kb, released_kb = map(int, out.stdout.split())
    assert held_kb > 350 * 1024, held_kb  # freed, yet still resident
    assert released_kb < 100 * 1024, released_kb


def test_the_weightless_graph_keeps_what_a_build_reads_after_its_host_runs(tmp_path):
    """After the host references, a build reads the graph's I/O, node names and contract only: the weightless copy
    gives the same, in a few kB, whatever the weights weighed."""
    from rkaudio.core.contract import get_contract
    from rkaudio.core.onnx_graph import weightless
    from tests.conv_graphs import conv_graph

    model = onnx.load(str(conv_graph(tmp_path / "w.onnx", channels=128, length=256)))
    skeleton = weightless(model)
    assert graph_io(skeleton) == graph_io(model) and get_contract(skeleton) == get_contract(model)
    assert [n.name for n in skeleton.graph.node] == [n.name for n in model.graph.node]
    assert [(t.name, list(t.dims)) for t in skeleton.graph.initializer] == [
        (t.name, list(t.dims)) for t in model.graph.initializer]
    assert skeleton.ByteSize() < 4096 < model.ByteSize() // 10
