"""The random-init reference models export with exactly the official I/O, dynamic along the length."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import torch

from rkaudio.families.inflect.reference import build_models, one_torch_thread
from rkaudio.board.numeric import snr_db
from rkaudio.surgery.graph.fold import op_histogram


def _dims(value):
    return [d.dim_value or d.dim_param for d in value.type.tensor_type.shape.dim]


def test_official_io_and_shape_glue(official):
    cfg, paths = official
    decode = onnx.load(str(paths["decode"]))
    assert [i.name for i in decode.graph.input] == ["m_p_exp", "logs_p_exp", "y_mask", "zp_noise", "noise_scale"]
    assert [o.name for o in decode.graph.output] == ["waveform"]
    assert _dims(decode.graph.input[0])[:2] == [1, cfg.inter_channels]
    assert isinstance(_dims(decode.graph.input[0])[2], str)  # dynamic length
    ops = op_histogram(decode)
    # Sized from the latent length like the official export: the glue the fold must remove.
    assert ops["Shape"] == ops["ConstantOfShape"] == 24
    duration = onnx.load(str(paths["duration"]))
    assert [i.name for i in duration.graph.input] == ["tokens", "lengths", "length_scale"]
    assert [o.name for o in duration.graph.output] == ["m_p_exp", "logs_p_exp", "y_mask"]


def test_exported_decode_matches_torch_at_two_lengths(official):
    cfg, paths = official
    _, decode = build_models(cfg, seed=0)
    session = ort.InferenceSession(str(paths["decode"]), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for frames in (20, 37):
        m_p = rng.standard_normal((1, cfg.inter_channels, frames)).astype(np.float32)
        logs_p = (rng.standard_normal(m_p.shape) * 0.1 - 1.5).astype(np.float32)
        noise = rng.standard_normal(m_p.shape).astype(np.float32)
        mask = np.ones((1, 1, frames), np.float32)
        scale = np.array(0.667, np.float32)
        got = session.run(None, {"m_p_exp": m_p, "logs_p_exp": logs_p, "y_mask": mask, "zp_noise": noise,
                                 "noise_scale": scale})[0]
        with torch.no_grad(), one_torch_thread():
            want = decode(*(torch.from_numpy(a) for a in (m_p, logs_p, mask, noise, scale))).numpy()
        assert got.shape == (1, 1, frames * cfg.hop_length)
        assert snr_db(want, got) > 100.0


def test_duration_regulates_length_in_graph(official):
    """Each output frame carries the prior stats of exactly one token, tokens in order, every token >= 1 frame."""
    cfg, paths = official
    duration, _ = build_models(cfg, seed=0)
    session = ort.InferenceSession(str(paths["duration"]), providers=["CPUExecutionProvider"])
    tokens = np.array([[0, 5, 0, 17, 0, 99, 0]], np.int64)
    m_p, logs_p, y_mask = session.run(None, {"tokens": tokens, "lengths": np.array([7]),
                                             "length_scale": np.array(1.0, np.float32)})
    assert m_p.shape[1] == logs_p.shape[1] == cfg.inter_channels
    with torch.no_grad(), one_torch_thread():
        x = duration.emb(torch.from_numpy(tokens)).transpose(1, 2)
        for conv in duration.convs:
            x = x + torch.relu(conv(x))
        token_means = duration.proj(x)[0, : cfg.inter_channels].double().numpy()  # [C, L]
    # float64 nearest token for every frame: must be a non-decreasing run over all 7 tokens.
    distance = ((m_p[0].T[:, None, :] - token_means.T[None, :, :]) ** 2).sum(-1)
    owner = distance.argmin(1)
    assert np.all(np.diff(owner) >= 0) and set(owner) == set(range(7))
    assert distance.min(1).max() < 1e-8
    assert np.all(y_mask == 1.0)
