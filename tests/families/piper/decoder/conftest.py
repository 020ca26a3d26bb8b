"""Fixtures: the joe voice (sliced once), its exported decoder ONNX files, and a small random-init
multi-speaker VITS built with piper-tts's own training modules and exported with its own exporter."""
from __future__ import annotations

import functools
import sys
import types
from pathlib import Path

import pytest

from tests.real_checkpoints import real_checkpoint


@pytest.fixture(scope="session")
@real_checkpoint
def joe():
    import onnx

    from rkaudio.families.piper import decoder
    from rkaudio.families.piper.voice import resolve_voice
    from rkaudio.host.backends import OnnxBackend

    voice = resolve_voice(None)
    model = onnx.load(str(voice.onnx_path))
    piece = decoder.slice_voice(model)
    latents = decoder.voice_latents(model, piece.seam, voice.config)
    return types.SimpleNamespace(voice=voice, model=model, piece=piece, latents=latents,
                                 full=OnnxBackend(piece.model, threads=1))


@pytest.fixture(scope="session")
@real_checkpoint
def joe_exports(tmp_path_factory):
    """The default 109/45/32 window and its --dec-mask twin, exported for rk3588 (no polyphase tail)."""
    from rkaudio.families.piper import FAMILY, decoder

    out = tmp_path_factory.mktemp("joe_decoder")
    return {dec_mask: decoder.export(FAMILY.job("decoder", target="rk3588", out=out, options={"dec_mask": dec_mask}))[0]
            for dec_mask in (False, True)}


def _random_multispeaker_vits():
    import torch

    from piper.train.vits.models import SynthesizerTrn

    torch.manual_seed(0)
    net = SynthesizerTrn(n_vocab=20, spec_channels=17, segment_size=8, inter_channels=16, hidden_channels=16,
                         filter_channels=32, n_heads=2, n_layers=1, kernel_size=3, p_dropout=0.0, resblock="2",
                         resblock_kernel_sizes=(3,), resblock_dilation_sizes=((1, 2),), upsample_rates=(4, 2),
                         upsample_initial_channel=16, upsample_kernel_sizes=(8, 4), n_speakers=3, gin_channels=8)
    # VITS zero-initialises each coupling's `post` conv; a trained voice has none, so give them weights.
    with torch.no_grad():
        for flow in net.flow.flows:
            if hasattr(flow, "post"):
                flow.post.weight.normal_(0.0, 0.1)
                flow.post.bias.normal_(0.0, 0.1)
    return net.eval()


@pytest.fixture(scope="session")
def multispeaker_onnx(tmp_path_factory) -> Path:
    """Export through `piper.train.export_onnx.main` itself. Two shims, both test-only: its checkpoint
    loader (a Lightning module; lightning is not installed) returns the random model, and torch 2.13's
    default dynamo exporter (needs onnxscript) is switched to the legacy one piper 1.8 was written for."""
    import torch

    net = _random_multispeaker_vits()
    path = tmp_path_factory.mktemp("multispeaker") / "ms.onnx"
    stub = types.ModuleType("piper.train.vits.lightning")
    stub.VitsModel = types.SimpleNamespace(load_from_checkpoint=lambda *a, **k: types.SimpleNamespace(model_g=net))
    saved_module = sys.modules.get("piper.train.vits.lightning")
    saved_export, saved_argv = torch.onnx.export, sys.argv
    sys.modules["piper.train.vits.lightning"] = stub
    sys.modules.pop("piper.train.export_onnx", None)
    try:
        import piper.train.export_onnx as exporter

        torch.onnx.export = functools.partial(saved_export, dynamo=False)
        sys.argv = ["export_onnx", "--checkpoint", "random.ckpt", "--output-file", str(path)]
        exporter.main()
    finally:
        torch.onnx.export, sys.argv = saved_export, saved_argv
        sys.modules.pop("piper.train.export_onnx", None)
        if saved_module is None:
            sys.modules.pop("piper.train.vits.lightning", None)
        else:
            sys.modules["piper.train.vits.lightning"] = saved_module
    return path
