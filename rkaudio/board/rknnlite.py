"""The board side: an engine on the NPU through rknn-toolkit-lite2, and what the board says about itself (SoC,
NPU cores, kernel, driver and runtime versions). Shipped in the self-test kit: the stdlib and numpy at module
level, rknnlite imported only when an engine is opened (it exists for aarch64 only), Python 3.8 syntax."""
from __future__ import annotations

import json
import os
import platform
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from rkaudio.board.files import MANIFEST_SUFFIX
from rkaudio.board.shapes import matching_set, output_shapes
from rkaudio.board.soc import NPU_CORES

CORE_MASKS = ("0", "1", "2", "0_1", "0_1_2")
RUNTIME_LIBRARY_PATHS = ("/usr/lib/librknnrt.so", "/usr/lib64/librknnrt.so", "/usr/lib/aarch64-linux-gnu/librknnrt.so",
                         "/usr/local/lib/librknnrt.so")
DRIVER_VERSION_PATHS = ("/sys/kernel/debug/rknpu/version", "/proc/debug/rknpu/version", "/sys/module/rknpu/version")
RUNTIME_VERSION = re.compile(rb"librknnrt version: (\d+\.\d+\.\d+)")
RUNTIME_FIX = ("update the board's runtime: copy librknnrt.so {toolkit} or newer (rknn-toolkit2's "
               "rknpu2/runtime/Linux/librknn_api/aarch64/librknnrt.so) to /usr/lib, or rebuild the package with the "
               "board's toolkit version: make engines TARGET=<soc> RKNN_TOOLKIT=<board runtime version>")


class RuntimeRefused(RuntimeError):
    """rknnlite could not load or initialise an engine: on a board this is almost always a runtime older than
    the toolkit that built the engine ("Invalid RKNN model version")."""


def manifest_of(rknn_path: Path) -> dict:
    path = Path(rknn_path).with_name(Path(rknn_path).stem + MANIFEST_SUFFIX)
    return json.loads(path.read_text())


def core_mask_constant(api_class, core_mask: str):
    return getattr(api_class, "NPU_CORE_AUTO" if core_mask == "AUTO" else f"NPU_CORE_{core_mask}")


class RknnLiteBackend:
    """An engine on the board's NPU through rknn-toolkit-lite2. Input order and dtypes and output shapes come from
    the manifest beside the engine: each input goes in the dtype the manifest says it is fed in (float16 for a
    buffer the engine's contract feeds in fp16: rknnlite takes the array's dtype as the input's type, and the
    engine holds the input in fp16, so nothing is converted on the CPU); outputs come back as float32. An engine of
    several shape sets (`shape_sets` in its manifest) runs a feed at the shapes of one of its sets, and refuses any
    other (`rkaudio.board.shapes.ShapeRefused`, naming the shapes).
    `core_mask` is "0", "1", "2", "0_1", "0_1_2" or "AUTO"; with `strict=False` a mask the runtime refuses falls
    back to AUTO (`self.core_mask` says which ran), with `strict=True` it raises."""

    def __init__(self, rknn_path, core_mask: str = "0_1_2", strict: bool = False):
        from rknnlite.api import RKNNLite  # only on the board

        manifest = manifest_of(Path(rknn_path))
        self.input_names = [t["name"] for t in manifest["inputs"]]
        self.input_dtypes = {t["name"]: np.dtype(t["dtype"]) for t in manifest["inputs"]}
        self.output_names = [t["name"] for t in manifest["outputs"]]
        self._output_shapes = {t["name"]: tuple(t["shape"]) for t in manifest["outputs"]}
        self.name = Path(rknn_path).name
        # an engine of several shape sets: a feed picks its set, and its outputs come back in that set's shapes
        self._sets = [{"inputs": {t["name"]: t["shape"] for t in entry["inputs"]},
                       "outputs": {t["name"]: t["shape"] for t in entry["outputs"]}}
                      for entry in manifest.get("shape_sets") or []]
        self._lite = RKNNLite()
        toolkit = manifest.get("toolkit_version", "?")
        if self._lite.load_rknn(str(rknn_path)) != 0:
            raise RuntimeRefused(f"rknnlite could not load {Path(rknn_path).name} (built by rknn-toolkit2 {toolkit})")
        self.core_mask = core_mask
        if self._init(core_mask_constant(RKNNLite, core_mask)) != 0:
            if strict or core_mask == "AUTO":
                self._lite.release()
                raise RuntimeRefused(f"rknnlite init_runtime failed for {Path(rknn_path).name} with core mask "
                                     f"{core_mask} (built by rknn-toolkit2 {toolkit})")
            self.core_mask = "AUTO"
            if self._init(RKNNLite.NPU_CORE_AUTO) != 0:
                self._lite.release()
                raise RuntimeRefused(f"rknnlite init_runtime failed for {Path(rknn_path).name} (core mask "
                                     f"{core_mask} and AUTO; built by rknn-toolkit2 {toolkit})")

    def _init(self, mask) -> int:
        try:
            return self._lite.init_runtime(core_mask=mask)
        except Exception:  # some runtimes raise instead of returning -1 (a mask the SoC lacks, a model too new)
            return -1

    def run(self, feeds: dict) -> dict:
        arrays = [np.ascontiguousarray(feeds[name], dtype=self.input_dtypes[name]) for name in self.input_names]
        shapes = self._output_shapes
        if self._sets:  # refused here, before the runtime sees a shape it was not compiled for
            fed = {name: array.shape for name, array in zip(self.input_names, arrays)}
            shapes = output_shapes(self._sets, matching_set(self._sets, fed, self.name))
        outputs = self._lite.inference(inputs=arrays, data_format=["nchw"] * len(arrays))
        if outputs is None:
            raise RuntimeError("rknnlite inference returned None")
        return {name: np.asarray(value).reshape(shapes[name]) for name, value in zip(self.output_names, outputs)}

    def close(self) -> None:
        self._lite.release()

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()


def version_tuple(version: str) -> Tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def read_text(path: str) -> Optional[str]:
    try:
        return Path(path).read_text(errors="replace").strip("\x00\n ")
    except OSError:
        return None


def runtime_library_version(paths=RUNTIME_LIBRARY_PATHS) -> Tuple[Optional[str], Optional[str]]:
    """(version, library path) of librknnrt.so from the version string it embeds; (None, None) when not found."""
    for path in [os.environ.get("RKNN_RT_LIB", "")] + list(paths):
        if not path or not os.path.isfile(path):
            continue
        with open(path, "rb") as handle:
            found = RUNTIME_VERSION.search(handle.read())
        if found:
            return found.group(1).decode(), path
    return None, None


def soc_name(compatible: Optional[str]) -> Optional[str]:
    """The SoC named in /proc/device-tree/compatible (NUL-separated vendor,name pairs), e.g. "rk3588"."""
    for entry in re.split(r"[\x00\s]+", compatible or ""):
        name = entry.split(",")[-1].lower()
        if name in NPU_CORES:
            return name
    return None


def board_info() -> Dict[str, object]:
    """What the report records about the machine it ran on."""
    compatible = read_text("/proc/device-tree/compatible")
    soc = soc_name(compatible)
    driver = next((text for text in (read_text(p) for p in DRIVER_VERSION_PATHS) if text), None)
    runtime, library = runtime_library_version()
    try:
        import rknnlite  # noqa: F401  (only its version is read)
        from importlib import metadata
        lite = metadata.version("rknn-toolkit-lite2")
    except Exception:
        lite = None
    return {"compatible": compatible.replace("\x00", " ").strip() if compatible else None,
            "model": read_text("/proc/device-tree/model"), "soc": soc, "npu_cores": NPU_CORES.get(soc or ""),
            "kernel": platform.release(), "machine": platform.machine(), "python": platform.python_version(),
            "driver_version": driver, "runtime_version": runtime, "runtime_library": library,
            "rknn_toolkit_lite2": lite}


def masks_for(requested: List[str], cores: Optional[int]) -> Tuple[List[str], List[str]]:
    """(masks to run, masks skipped because the SoC lacks a core they name); unknown core count runs them all."""
    run, skipped = [], []
    for mask in requested:
        if mask != "AUTO" and mask not in CORE_MASKS:
            raise ValueError(f"core mask {mask!r}: expected one of {', '.join(CORE_MASKS)} or AUTO")
        needed = 0 if mask == "AUTO" else max(int(core) for core in mask.split("_")) + 1
        (skipped if cores is not None and needed > cores else run).append(mask)
    return run, skipped
