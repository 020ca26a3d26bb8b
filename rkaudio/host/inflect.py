"""Host side of the Inflect v2 runtime (rkaudio/board/inflect.py): the official ONNX files read with onnx (their
I/O, the model's latent width), and an engine file opened with its contract."""
from __future__ import annotations

from pathlib import Path

from rkaudio.core.errors import SetupError
from rkaudio.core.manifest import engine_contract
from rkaudio.board.inflect import (DURATION_INPUTS, DURATION_OUTPUTS, OFFICIAL_HINT, InflectModel,
                                   config_values)


def io_names(values) -> list[str]:
    """Names of an ONNX graph's inputs or outputs."""
    return [v.name for v in values]


def latent_channels(value, path: Path, which: str) -> int:
    """C of an official [1, C, mel_len] latent tensor; refuses a file whose C is not fixed."""
    dims = value.type.tensor_type.shape.dim
    if len(dims) != 3 or not dims[1].dim_value:
        raise SetupError(f"{which} {path}: {value.name} should be [1, C, mel_len] with a fixed C, "
                         f"got {[d.dim_value or d.dim_param for d in dims]}; {OFFICIAL_HINT}")
    return int(dims[1].dim_value)


def load_official(path: Path, which: str):
    """An official ONNX (`which`: decode.onnx, duration.onnx) loaded whole, refused in one line naming the file
    when it is missing, truncated, not ONNX or carries a NaN/Inf constant (rkaudio.core.onnx_graph.load_model)."""
    from rkaudio.core.onnx_graph import load_model  # onnx only when a file is read

    path = Path(path)
    if not path.is_file():
        raise SetupError(f"no {which} at {path}; {OFFICIAL_HINT}")
    return load_model(path, f"Inflect v2 {which}")


def check_duration(path: Path, channels: int) -> None:
    """duration.onnx must have the official I/O and produce latents of the decoder's width."""
    path = Path(path)
    model = load_official(path, "duration.onnx")
    inputs, outputs = io_names(model.graph.input), io_names(model.graph.output)
    if any(n not in inputs for n in DURATION_INPUTS) or any(n not in outputs for n in DURATION_OUTPUTS):
        raise SetupError(f"{path} is not an Inflect v2 duration.onnx: inputs {inputs}, outputs {outputs}; expected "
                         f"inputs {list(DURATION_INPUTS)} and outputs {list(DURATION_OUTPUTS)}; {OFFICIAL_HINT}")
    m_p = next(v for v in model.graph.output if v.name == "m_p_exp")
    found = latent_channels(m_p, path, "duration.onnx")
    if found != channels:
        raise SetupError(f"{path} produces latents of C={found} channels but the decoder takes C={channels}: "
                         "duration.onnx and decode.onnx come from different models (Micro is C=192, Nano C=128); "
                         "pass the two files of one model")


def runtime_model(duration_path: Path, config_path: Path | None = None) -> InflectModel:
    """Latent channels from duration.onnx, hop and sample rate from config.json (v2 defaults without it)."""
    duration = load_official(duration_path, "duration.onnx")
    m_p = next((v for v in duration.graph.output if v.name == DURATION_OUTPUTS[0]), None)
    if m_p is None:
        raise SetupError(f"{duration_path} has no output {DURATION_OUTPUTS[0]!r}: not an Inflect v2 duration.onnx")
    channels = m_p.type.tensor_type.shape.dim[1].dim_value
    check_duration(duration_path, channels)
    hop, rate = config_values(config_path if config_path and Path(config_path).is_file() else None)
    return InflectModel(channels, hop, rate)


def load_engine(path: Path):
    """(backend, contract) for a decoder engine: a slice .onnx runs in onnxruntime (contract in its metadata); a
    .rknn runs with rknn-toolkit-lite2 (contract in the manifest beside it: rkaudio.core.manifest.engine_contract)."""
    path = Path(path)
    contract = engine_contract(path)
    if path.suffix == ".onnx":
        from rkaudio.host.backends import OnnxBackend

        return OnnxBackend(path), contract
    from rkaudio.board.rknnlite import RknnLiteBackend

    return RknnLiteBackend(path), contract
