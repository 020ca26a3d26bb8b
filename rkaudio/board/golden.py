"""Golden I/O of the board self-test kit: how arrays are stored, how an end-to-end loop is named and run over
any backend, and how the engine calls along it are recorded. Shipped in every package (numpy and the stdlib only,
Python 3.8 syntax): the host writes the goldens with it and the board replays them with it.

An end-to-end golden is a family's runtime loop (`"runtime.<module>:<function>"`, signature
`loop(engines: list[Engine], inputs: dict, params: dict) -> dict`) run on fixed inputs. On the host every
engine call is recorded (inputs and fp32 outputs, in order) together with the loop's final output, so a board
can compare each call and a test double can replay them."""
from __future__ import annotations

import hashlib
import importlib
import json
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from rkaudio.board.contract import EngineContract
from rkaudio.board.numeric import snr_db
from rkaudio.board.shapes import check_set

INDEX_NAME = "index.json"
SCHEMA_VERSION = 1


class _Slot:
    """One opened backend, shared by the views of an engine compiled for several shape sets."""

    def __init__(self, open_backend: Callable[[], object]):
        self.open_backend, self.backend, self.opened = open_backend, None, 0


class Engine:
    """One engine as a loop sees it: its file name, its contract (the manifest's / ONNX metadata's) and `run`.
    The backend is opened on first use by `open_backend()` (a pool may close it again to bound memory). An engine
    compiled for several shape sets is one view per set (`EngineContract.views`), sharing one backend: a view
    runs only the shapes of its own set."""

    def __init__(self, name: str, contract: EngineContract, open_backend: Callable[[], object],
                 on_run: Optional[Callable[["Engine", dict, dict], None]] = None, slot: Optional[_Slot] = None):
        self.name, self.contract = name, contract
        self._slot, self._on_run = slot or _Slot(open_backend), on_run

    @property
    def opened(self) -> int:
        """How many times the backend was opened (a pool that thrashes shows here)."""
        return self._slot.opened

    @property
    def is_open(self) -> bool:
        return self._slot.backend is not None

    @property
    def backend(self):
        if self._slot.backend is None:
            self._slot.backend = self._slot.open_backend()
            self._slot.opened += 1
        return self._slot.backend

    @property
    def input_names(self) -> List[str]:
        return list(self.backend.input_names)

    @property
    def output_names(self) -> List[str]:
        return list(self.backend.output_names)

    @property
    def input_dtypes(self) -> dict:
        return dict(self.backend.input_dtypes)

    def run(self, feeds: dict) -> dict:
        check_set(self.contract, {name: np.shape(value) for name, value in feeds.items()}, self.name)
        outputs = self.backend.run(feeds)
        if self._on_run is not None:
            self._on_run(self, feeds, outputs)
        return outputs

    def close(self) -> None:
        if self._slot.backend is not None:
            self._slot.backend.close()
            self._slot.backend = None


class EnginePool:
    """Engines of one package opened lazily, at most `max_open` at a time (least recently used closed first);
    `max_open=None` keeps every opened engine (a board runtime holds all its contexts). An engine of several shape
    sets enters the pool as one view per set (`Engine`), opened once. `entries`: (engine file name, its contract)."""

    def __init__(self, entries: List[Tuple[str, EngineContract]], opener: Callable[[str], object],
                 max_open: Optional[int] = None, on_run: Optional[Callable[[Engine, dict, dict], None]] = None):
        self.max_open = max_open
        self._recent: List[Engine] = []
        self.engines = []
        for name, contract in entries:
            slot = _Slot(self._opener_for(name, opener))
            self.engines += [Engine(name, view, slot.open_backend, on_run, slot) for view in contract.views()]

    def _opener_for(self, name: str, opener: Callable[[str], object]) -> Callable[[], object]:
        def open_backend():
            alive = [e for e in self._recent if e.is_open and e.name != name]
            while self.max_open is not None and len(alive) >= self.max_open:
                alive.pop(0).close()  # the one opened longest ago
            backend = opener(name)
            self._recent = alive + [self.by_name(name)]
            return backend
        return open_backend

    def by_name(self, name: str) -> Engine:
        return next(e for e in self.engines if e.name == name)

    def close(self) -> None:
        for engine in self.engines:
            engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()


class CallLog:
    """Every engine call of a loop, in order: (engine name, feeds, outputs), arrays copied."""

    def __init__(self):
        self.calls: List[tuple] = []

    def __call__(self, engine: Engine, feeds: dict, outputs: dict) -> None:
        self.calls.append((engine.name, {k: np.array(v) for k, v in feeds.items()},
                           {k: np.array(v) for k, v in outputs.items()}))


# Where the loops of packages built before today's layout lived: their index.json names these modules, and a host
# replay (`convert selftest`, `convert publish`) of such a package runs the same loop from its new home. Packages
# built before rkaudio/ name `runtime.board.<module>`; those built before the board folder, the modules below.
LOOP_PACKAGE = "rkaudio.board"
MOVED_LOOP_PACKAGES = {"runtime.board": LOOP_PACKAGE}
MOVED_LOOP_MODULES = {
    "runtime.vits_decoder": "rkaudio.board.piper", "runtime.kokoro_walk": "rkaudio.board.kokoro",
    "runtime.inflect_synth": "rkaudio.board.inflect", "runtime.kv_buckets": "rkaudio.board.audio8",
    "runtime.flow_ladder": "rkaudio.board.cosyvoice3", "runtime.stream": "rkaudio.board.qwen3_vocoder",
    "runtime.ladder": "rkaudio.board.ladder", "runtime.window_walk": "rkaudio.board.window_walk",
}


def loop_module(module_name: str) -> str:
    """The module that holds a loop today, for a module name any published package's index.json gives."""
    package, _, module = module_name.rpartition(".")
    if package in MOVED_LOOP_PACKAGES:
        return MOVED_LOOP_PACKAGES[package] + "." + module
    return MOVED_LOOP_MODULES.get(module_name, module_name)


def load_loop(name: str) -> Callable:
    """The loop function named `"rkaudio.board.<module>:<function>"` (a module shipped beside the kit; the module
    of a package built before today's layout is found where it moved, `loop_module`)."""
    module_name, _, function = name.partition(":")
    module_name = loop_module(module_name)
    if not module_name.startswith(LOOP_PACKAGE + ".") or not function:
        raise ValueError(f"an end-to-end loop is named '{LOOP_PACKAGE}.<module>:<function>', got {name!r}")
    return getattr(importlib.import_module(module_name), function)


def run_loop(loop_name: str, engines: List[Engine], inputs: dict, params: dict) -> Dict[str, np.ndarray]:
    outputs = load_loop(loop_name)(engines, inputs, params)
    return {name: np.asarray(value) for name, value in outputs.items()}


def by_role(engines: List[Engine], role: str, component: Optional[str] = None) -> List[Engine]:
    """The engines filling `role` (and `component`), in ladder order (`EngineContract.ladder_order`)."""
    chosen = [e for e in engines
              if e.contract.role == role and (component is None or e.contract.component == component)]
    return sorted(chosen, key=lambda e: e.contract.ladder_order)


def only_engine(engines: List[Engine]) -> Engine:
    if len(engines) != 1:
        raise ValueError(f"this loop runs one engine, got {len(engines)}: {[e.name for e in engines]}")
    return engines[0]


# --- storage -------------------------------------------------------------------------------------------------
# A float array is stored in fp16 when that is exact (what an fp16 engine produced, masks, fp16-rounded inputs),
# or when fp16 keeps it within LOSSY_FP16_MIN_DB (the board gates sit at <= 60 dB, so a 70 dB storage error moves
# a figure by < 0.5 dB); otherwise in its own dtype. Inputs are stored in this form before anything is computed
# from them (`as_stored`), so a golden's outputs are those of exactly the inputs the board will read back.
GOLDEN_FILE = "golden.npz"
LOSSY_FP16_MIN_DB = 70.0


def storage_form(array) -> tuple:
    """(the array as stored, the storage SNR in dB when fp16 is not exact, else None)."""
    array = np.asarray(array)
    if array.dtype.kind != "f" or array.dtype == np.float16:
        return array, None
    with np.errstate(over="ignore", invalid="ignore"):
        narrow = array.astype(np.float16)
    back = narrow.astype(array.dtype)
    if np.array_equal(back, array, equal_nan=True):
        return narrow, None
    if np.all(np.isfinite(back)) and np.all(np.isfinite(array)):
        fidelity = snr_db(array, back)
        if fidelity >= LOSSY_FP16_MIN_DB:
            return narrow, fidelity
    return array, None


def as_stored(array) -> np.ndarray:
    """`array` as a board will read it back from the kit (in its own dtype)."""
    array = np.asarray(array)
    return storage_form(array)[0].astype(array.dtype)


def digest(array) -> str:
    """sha256 of an array's bytes in C order (how a board checks that its loop fed what the host's did)."""
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


class ArrayWriter:
    """Every array of a kit in one .npz under short keys (a0, a1, ...), identical arrays stored once, and the
    index entry of each: role, tensor, dtype, shape, the dtype it is stored in and, when fp16 is not exact, its
    storage SNR."""

    def __init__(self):
        self.arrays: Dict[str, np.ndarray] = {}
        self._keys: Dict[tuple, str] = {}

    def add(self, role: str, tensor: str, value, **extra) -> dict:
        value = np.asarray(value)
        stored, fidelity = storage_form(value)
        entry = {"key": self._key(str(value.dtype), stored), "role": role, "tensor": tensor, "dtype": str(value.dtype),
                 "shape": list(value.shape), "stored_dtype": str(stored.dtype), **extra}
        if fidelity is not None:
            entry["storage_snr_db"] = fidelity
        return entry

    def adopt(self, entry: dict, stored: np.ndarray) -> dict:
        """An entry of another kit with its array as stored there, keyed in this one (merging kits)."""
        return {**entry, "key": self._key(entry["dtype"], stored)}

    def _key(self, dtype: str, stored: np.ndarray) -> str:
        key = self._keys.setdefault((dtype, str(stored.dtype), stored.shape, digest(stored)), f"a{len(self._keys)}")
        self.arrays[key] = stored
        return key

    def save(self, path: Path) -> int:
        np.savez_compressed(path, **self.arrays)
        return Path(path).stat().st_size


class ArrayReader:
    """The arrays of a kit's .npz, back in their engine dtypes."""

    def __init__(self, path: Path):
        with np.load(path) as data:
            self._arrays = {key: data[key] for key in data.files}

    def get(self, entry: dict) -> np.ndarray:
        return self._arrays[entry["key"]].astype(entry["dtype"])

    def tensors(self, entries: List[dict], role: str) -> Dict[str, np.ndarray]:
        return {e["tensor"]: self.get(e) for e in entries if e["role"] == role}


def read_index(kit_dir: Path) -> dict:
    path = Path(kit_dir) / INDEX_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no self-test index at {path}")
    return json.loads(path.read_text())


def write_index(kit_dir: Path, index: dict) -> Path:
    path = Path(kit_dir) / INDEX_NAME
    path.write_text(json.dumps(index, indent=2) + "\n")
    return path
