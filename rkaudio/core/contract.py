"""The contract an exported ONNX carries: one JSON document in its `metadata_props` under `rkaudio`, the JSON of
`rkaudio.board.contract.EngineContract` (its fields and what each means are stated there, the family's own in its
`ContractFields`). This module is the contract's ONNX side: `make_contract` (through `Job.contract`), `set_contract`
/ `store_contract` to write it, `contract_of` to read it back as the model (`get_contract`: the raw JSON, for the
serialiser), `fed_inputs`, and the producer record. Every later stage (build, manifest, packaging, runtime) reads the
contract back from the ONNX or the manifest, so nothing is restated downstream. onnx is imported only by the
functions that touch a model."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from rkaudio.board.contract import EngineContract
from rkaudio.core.paths import REPO_ROOT

KEY = "rkaudio"


def producer_info() -> dict:
    """rkaudio version, git commit (with a +dirty mark) and the command line that produced the file."""
    try:
        version = metadata.version("rkaudio")
    except metadata.PackageNotFoundError:
        version = "0+unknown"
    try:
        commit = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        commit += "+dirty" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    argv = ["convert", *sys.argv[1:]] if sys.argv and sys.argv[0].endswith(("convert", "cli.py")) else sys.argv
    return {"rkaudio": version, "git": commit, "command": shlex.join(argv)}


def make_contract(family: str, component: str, role: str, exec_plan_option: str, **fields) -> EngineContract:
    """The contract of an exported component (`Job.contract` states its identity from the declaration). `fields`
    are the family's own (window, context, hop, cache layout, ...) and optional shared ones (`exec_params`,
    `ladder_key`, ...), sorted into the model by name."""
    return EngineContract.from_json({"family": family, "component": component, "role": role,
                                     "exec_plan_option": exec_plan_option, "producer": producer_info(), **fields})


def fed_inputs(inputs: list[dict], contract: EngineContract) -> list[dict]:
    """The engine's inputs as its caller feeds them: the ONNX's entries ({"name", "shape", "dtype"}), each with the
    dtype the contract's `feed_dtypes` names for it (a buffer the runtime holds in fp16: the engine holds every
    input in fp16 already, so rknnlite takes it without a CPU conversion), else the ONNX's own."""
    feed = contract.feed_dtypes or {}
    return [{**entry, "dtype": feed.get(entry["name"], entry["dtype"])} for entry in inputs]


def set_contract(model, contract: EngineContract | dict):
    """A copy of `model` (onnx.ModelProto) storing `contract` (an EngineContract, or its JSON object as an exporter
    assembles it), replacing an earlier one."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    store_contract(out, contract)
    return out


def store_contract(model, contract: EngineContract | dict) -> None:
    """`set_contract` in place: for a model too large to copy (CosyVoice3's estimator, 1.3 GB at the real shape)."""
    if isinstance(contract, EngineContract):
        contract = contract.to_json()
    kept = [p for p in model.metadata_props if p.key != KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    entry = model.metadata_props.add()
    entry.key = KEY
    entry.value = json.dumps(contract, sort_keys=True)


def contract_of(model) -> EngineContract:
    """The stored contract of a ModelProto or an ONNX path (empty for an ONNX that rkaudio did not write)."""
    return EngineContract.from_json(get_contract(model))


def get_contract(model) -> dict:
    """The stored contract of a ModelProto or an ONNX path, or `{}` for an ONNX that rkaudio did not write."""
    if isinstance(model, (str, Path)):
        import onnx

        model = onnx.load(str(model), load_external_data=False)
    for prop in model.metadata_props:
        if prop.key == KEY:
            return json.loads(prop.value)
    return {}
