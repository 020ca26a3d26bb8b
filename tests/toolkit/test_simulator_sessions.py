"""The compiler child's simulator sessions run without onnxruntime's CPU memory arena (rkaudio/toolkit/child.py
`_sessions_without_arena`): the simulator keeps one session per layer to the end, and each arena keeps its layer's
largest buffers. Without the arenas the outputs must not change, and every session the simulator made must have
its arena off."""
from __future__ import annotations

import json
import subprocess
import textwrap

import numpy as np

from rkaudio.core.paths import REPO_ROOT


def test_simulator_sessions_have_no_arena_and_give_the_same_outputs(tmp_path, require_converter):
    require_converter()
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from rkaudio.toolkit.versions import converter_python

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal((8, 8, 3)) * 0.3).astype(np.float32), f"w{i}")
               for i in range(3)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1]), helper.make_node("Tanh", ["a"], ["b"]),
             helper.make_node("Conv", ["b", "w1"], ["c"], pads=[1, 1]), helper.make_node("Add", ["a", "c"], ["d"]),
             helper.make_node("Conv", ["d", "w2"], ["y"], pads=[1, 1])]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4096])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4096])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "chain.onnx")
    np.save(tmp_path / "x.npy", rng.standard_normal((1, 8, 4096)).astype(np.float32))
    script = textwrap.dedent(f"""
        import gc, json, sys
        import numpy as np
        import onnxruntime
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from rknn.api import RKNN
        from rkaudio.toolkit.child import _sessions_without_arena

        def simulated():
            rknn = RKNN(verbose=False)
            rknn.config(target_platform="rk3588", float_dtype="float16")
            assert rknn.load_onnx(model={str(tmp_path / "chain.onnx")!r}) == 0 and rknn.build(do_quantization=False) == 0
            assert rknn.init_runtime() == 0
            out = rknn.inference(inputs=[np.load({str(tmp_path / "x.npy")!r})], data_format=["nchw"])[0]
            return rknn, out

        with_arena, reference = simulated()
        with_arena.release()
        gc.collect()
        _sessions_without_arena()
        rknn, out = simulated()
        sessions = [o for o in gc.get_objects() if isinstance(o, onnxruntime.InferenceSession)]
        arenas = [s.get_session_options().enable_cpu_mem_arena for s in sessions]
        np.save({str(tmp_path / "reference.npy")!r}, reference)
        np.save({str(tmp_path / "out.npy")!r}, out)
        print(json.dumps({{"sessions": len(sessions), "with_arena": sum(arenas)}}))
    """)
    done = subprocess.run([str(converter_python()), "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts["sessions"] >= 5 and counts["with_arena"] == 0, counts
    reference, out = np.load(tmp_path / "reference.npy"), np.load(tmp_path / "out.npy")
    assert np.array_equal(reference, out) and np.abs(reference).max() > 0
