"""A real example package (two rk3588 engines, their goldens, the kit) and a board stand-in: a venv holding numpy
alone, with a test double of `rknnlite.api.RKNNLite` that replays the package's stored outputs. The board, release and
engine tests share these fixtures (tests/conftest.py offers them, so the session's package is built once)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rkaudio.release import recipes
from rkaudio.cli.families import declaration
from rkaudio.toolkit.versions import converter_python

# The double: loads the package's golden index with numpy. For inputs equal to an engine's self-check it returns
# that engine's simulator outputs; for an end-to-end call it returns the recorded fp32 output of the call whose
# input digests match (or, when the carried state differs, the next recorded call of that engine).
# RKNNLITE_DOUBLE selects a fault: refuse_init, zeros, regtask:<engine> (a contiguous 1/8 of one output replaced).
# With RKNNLITE_DOUBLE_LOG it logs each load (the board's sys.path) and each inference (the dtypes it was fed).
DOUBLE = r'''
import hashlib, json, os, sys
from pathlib import Path
import numpy as np

MODE = os.environ.get("RKNNLITE_DOUBLE", "replay")
LOG = os.environ.get("RKNNLITE_DOUBLE_LOG")


def _log(line):
    if LOG:
        with open(LOG, "a") as handle:
            handle.write(line + "\n")


def _digest(array):
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


class RKNNLite:
    NPU_CORE_AUTO, NPU_CORE_0, NPU_CORE_1, NPU_CORE_2, NPU_CORE_0_1, NPU_CORE_0_1_2 = 0, 1, 2, 4, 3, 7
    _consumed = {}

    def load_rknn(self, path):
        self.path = Path(path)
        _log("load " + self.path.name + " " + json.dumps(sys.path))
        kit = self.path.parent / "selftest"
        self.index = json.loads((kit / "index.json").read_text())
        with np.load(kit / self.index["file"]) as data:
            self.arrays = {key: data[key] for key in data.files}
        return 0

    def init_runtime(self, core_mask=0):
        if MODE == "refuse_init":
            print("E RKNN: Invalid RKNN model version 6")
            return -1
        self.core_mask = core_mask
        return 0

    def _get(self, entry):
        return self.arrays[entry["key"]].astype(entry["dtype"])

    def _outputs(self, inputs):
        name = self.path.name
        for engine in self.index["engines"]:
            if engine["engine"] != name:
                continue
            golden = [self._get(e) for e in engine["arrays"] if e["role"] == "input"]
            if all(np.array_equal(a, b) for a, b in zip(golden, inputs)):
                return [self._get(e) for e in engine["arrays"] if e["role"] == "simulator"]
        calls = [(loop, number, call) for loop in self.index["end_to_end"]
                 for number, call in enumerate(loop["calls"]) if call["engine"] == name]
        digests = [_digest(array) for array in inputs]
        chosen = next((c for c in calls if [i["sha256"] for i in c[2]["inputs"]] == digests), None)
        if chosen is None:
            position = self._consumed.get(name, 0)
            chosen = calls[min(position, len(calls) - 1)]
        self._consumed[name] = calls.index(chosen) + 1
        loop, number, _ = chosen
        return [self._get(e) for e in loop["arrays"] if e["role"] == "call_output" and e["call"] == number]

    def inference(self, inputs, data_format=None):
        _log("feed " + self.path.name + " " + ",".join(str(array.dtype) for array in inputs))
        outputs = [np.array(o) for o in self._outputs(inputs)]
        if MODE == "zeros":
            outputs = [np.zeros_like(o) for o in outputs]
        elif MODE.startswith("regtask:") and MODE.split(":", 1)[1] == self.path.name:
            flat = outputs[0].reshape(-1)
            eighth = flat.size // 8
            flat[3 * eighth: 4 * eighth] = 0.0
        return outputs

    def release(self):
        pass
'''


@pytest.fixture(scope="session")
def example_package(tmp_path_factory) -> Path:
    """dist/rk3588/example_conv_rk3588 built by the real recipe (about 20 s)."""
    converter_python("2.3.2")
    dist = tmp_path_factory.mktemp("kit") / "dist"
    rows = recipes.build_all("rk3588", declaration, "2.3.2", only=["example_conv"], dist_dir=dist, say=lambda _: None)
    assert rows[0]["status"] == "ok", rows
    return dist / "rk3588" / "example_conv_rk3588"


@pytest.fixture
def package(example_package, tmp_path) -> Path:
    """A private copy of the example package (tests may damage it), with its ONNX work dir where the manifests name it."""
    from rkaudio.release.package import onnx_dir

    dist = example_package.parent.parent
    copy = tmp_path / "dist" / "rk3588" / example_package.name
    shutil.copytree(example_package, copy)
    shutil.copytree(onnx_dir(dist, "rk3588", example_package.name), onnx_dir(copy.parent.parent, "rk3588", copy.name))
    return copy


@pytest.fixture(scope="session")
def board_python(tmp_path_factory) -> Path:
    """A venv with numpy and the RKNNLite double only: no torch, onnx, onnxruntime, no rkaudio."""
    root = tmp_path_factory.mktemp("board")
    venv = root / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    numpy_dir = Path(np.__file__).parent
    for name in ("numpy", "numpy.libs"):
        if (numpy_dir.parent / name).exists():
            os.symlink(numpy_dir.parent / name, site / name)
    (site / "rknnlite").mkdir()
    (site / "rknnlite" / "__init__.py").write_text("")
    (site / "rknnlite" / "api.py").write_text(DOUBLE)
    return venv / "bin" / "python"


@pytest.fixture
def run_kit(board_python, tmp_path):
    """Run `python3 selftest.py` of a package on the stand-in board from an unrelated working directory."""
    def run(package: Path, *args: str, mode: str = "replay", runtime_version: str | None = None):
        work = tmp_path / "board-cwd"
        work.mkdir(exist_ok=True)
        log = tmp_path / "double.log"
        env = {"PATH": "/usr/bin:/bin", "RKNNLITE_DOUBLE": mode, "RKNNLITE_DOUBLE_LOG": str(log)}
        if runtime_version is not None:  # a librknnrt.so stand-in carrying its version string
            library = tmp_path / "librknnrt.so"
            library.write_bytes(b"\x00ELF...librknnrt version: " + runtime_version.encode() + b" (abc@2025)\x00")
            env["RKNN_RT_LIB"] = str(library)
        result = subprocess.run([str(board_python), "-E", "-s", str(package / "selftest.py"), *args], cwd=work,
                                env=env, capture_output=True, text=True, timeout=300)
        result.report = work / "selftest-report.json"
        result.loads = log.read_text().splitlines() if log.exists() else []
        return result
    return run

