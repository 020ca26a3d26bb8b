"""Pieces checked against independent float64 references: mel frontend, pooling matrix, rotate-half, RoPE."""
from __future__ import annotations

import numpy as np
import pytest

from converters.families.audio8 import graphs
from runtime.kv_buckets import BucketError, padded_pooling, placeholder_count, rope_tables
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


def test_padded_pooling_serves_every_placeholder_count():
    """The one adapter's `pool` input: for every N in 1..100 the first N rows pool to N, the rest are zero."""
    import torch

    x = np.random.default_rng(3).standard_normal((104, 5)).astype(np.float32)
    for target in range(1, 101):
        pool = padded_pooling(104, target, 100)
        assert pool.shape == (100, 104) and pool.dtype == np.float32 and not pool[target:].any()
        expected = torch.nn.functional.adaptive_avg_pool1d(torch.from_numpy(x).T[None], target)[0].T.numpy()
        np.testing.assert_allclose(pool[:target] @ x, expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(BucketError, match="101 audio placeholders do not fit"):
        padded_pooling(104, 101, 100)


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


def test_fused_step_layouts_equal_the_split_step(small_model):
    """Issue #17 item 3's layouts (measured by bench/audio8.py --layouts): attention over the cache without this
    token's row plus that row, one softmax, equals the K/V projection + write + block of today's split step."""
    import torch

    decoder = small_model.decoder
    rng = np.random.default_rng(4)
    heads, bucket, head_dim, position = 4, 128, 16, 40
    hidden = torch.from_numpy(rng.standard_normal((1, 1, 64)).astype(np.float32))
    cos, sin = (torch.from_numpy(t) for t in rope_tables([position], head_dim, 1e6))
    caches = [torch.from_numpy(rng.standard_normal((heads, bucket, head_dim)).astype(np.float32)) for _ in range(4)]
    mask = torch.full((heads, 1, bucket), graphs.MASKED)
    mask[:, :, :position] = 0.0
    with torch.no_grad():
        h, written = hidden, []
        for layer in range(2):
            key, value = graphs.KVProjectionGraph(decoder, layer)(h, cos, sin)
            full_k, full_v = caches[2 * layer].clone(), caches[2 * layer + 1].clone()
            full_k[:, position], full_v[:, position] = key[:, 0], value[:, 0]
            open_mask = mask.clone()
            open_mask[:, :, position] = 0.0
            step = graphs.FusedLayerStepGraph(decoder, layer)
            fused, fused_key, fused_value = step(h, caches[2 * layer], caches[2 * layer + 1], cos, sin, mask)
            h = graphs.BlockGraph(decoder, layer)(h, full_k, full_v, cos, sin, open_mask)
            torch.testing.assert_close(fused, h, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(fused_key, key) and torch.testing.assert_close(fused_value, value)
            written += [key, value]
        logits = graphs.HeadShardGraph(decoder, 0, 160)(h)
        outputs = graphs.FusedStepGraph(decoder, head=True)(hidden, cos, sin, mask, *caches)
    torch.testing.assert_close(outputs[0], logits, rtol=1e-5, atol=1e-4)
    for got, want in zip(outputs[1:], written):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
