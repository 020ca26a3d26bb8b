"""Pieces checked against independent float64 references: mel frontend, pooling matrix, rotate-half, RoPE."""
from __future__ import annotations

import numpy as np
import pytest

from converters.families.audio8 import graphs
from runtime.kv_buckets import placeholder_count, rope_tables
from runtime.mel import log_mel


def test_log_mel_matches_whisper_feature_extractor():
    from transformers import WhisperFeatureExtractor

    audio = (0.1 * np.random.default_rng(0).standard_normal(32000)).astype(np.float32)
    reference = WhisperFeatureExtractor(feature_size=128)(audio, sampling_rate=16000, return_tensors="np",
                                                          padding=False)["input_features"][0]
    ours = log_mel(audio, 128)
    assert ours.shape == reference.shape == (128, 200)
    assert np.abs(ours - reference).max() < 1e-4


@pytest.mark.parametrize("target", [25, 50, 75, 100])
def test_pooling_matrix_is_adaptive_average_pooling(target):
    x = np.random.default_rng(target).standard_normal((104, 6))
    expected = np.stack([x[(i * 104) // target: -((-(i + 1) * 104) // target)].mean(axis=0) for i in range(target)])
    np.testing.assert_allclose(graphs.pooling_matrix(104, target) @ x, expected, rtol=0, atol=1e-12)


def test_rotate_half_matrix():
    x = np.random.default_rng(1).standard_normal((3, 64))
    expected = np.concatenate([-x[:, 32:], x[:, :32]], axis=-1)
    np.testing.assert_array_equal(x @ graphs.rotate_half_matrix(64).astype(np.float64), expected)


def test_rope_tables_match_transformers():
    import torch
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

    config = Qwen2Config(hidden_size=512, num_attention_heads=8, rope_theta=1e6)
    rotary = Qwen2RotaryEmbedding(config)
    positions = np.array([0, 1, 127, 128, 511])
    cos_ref, sin_ref = rotary(torch.zeros(1, 1, 64), torch.from_numpy(positions)[None])
    cos, sin = rope_tables(positions, 64, 1e6)
    assert np.abs(cos - cos_ref[0].numpy()).max() < 1e-6 and np.abs(sin - sin_ref[0].numpy()).max() < 1e-6


def test_placeholder_counts_of_the_spec():
    assert [placeholder_count(s * 16000, 160) for s in (2, 4, 6, 8)] == [25, 50, 75, 100]
    assert placeholder_count(10, 160) == 1


def test_rms_norm_matches_float64_reference():
    import torch
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    norm = Qwen2RMSNorm(64, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_()
    x = np.random.default_rng(2).standard_normal((5, 64))
    expected = norm.weight.detach().double().numpy() * x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6)
    with torch.no_grad():
        ours = graphs.rms_norm(norm, torch.from_numpy(x).float()).double().numpy()
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)
