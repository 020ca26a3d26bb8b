"""Pieces checked against independent float64 references: mel frontend, pooling matrix, rotate-half, RoPE."""
from __future__ import annotations

import numpy as np
import pytest

from rkaudio.families.audio8 import graphs
from rkaudio.board.audio8 import BucketError, padded_pooling, placeholder_count, rope_tables
from rkaudio.board.mel import log_mel


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


def test_step_graph_equals_the_decoder_with_its_own_cache(small_model):
    """The step (attention over the buffer without this token's row plus that row, one softmax) gives the logits
    and the K/V rows transformers' decoder computes for the same token after the same history, in every layout
    bench/audio8.py measures: all layers in one graph, with or without the head, or layer by layer."""
    import torch

    decoder = small_model.decoder
    rng = np.random.default_rng(4)
    heads, bucket, head_dim, position = 4, 128, 16, 40
    sequence = torch.from_numpy(rng.standard_normal((1, position + 1, 64)).astype(np.float32))
    with torch.no_grad():
        reference = decoder(inputs_embeds=sequence, use_cache=True)
    history = reference.past_key_values.to_legacy_cache()  # per layer (key, value) [1, heads, position + 1, hd]
    caches = []
    for key, value in history:  # rows past the history are garbage the mask hides; this row is not written yet
        for rows in (key, value):
            buffer = rng.standard_normal((heads, bucket, head_dim)).astype(np.float32)
            buffer[:, :position] = rows[0, :, :position].numpy()
            caches.append(torch.from_numpy(buffer))
    mask = torch.full((heads, 1, bucket), graphs.MASKED)
    mask[:, :, :position] = 0.0
    cos, sin = (torch.from_numpy(t) for t in rope_tables([position], head_dim, decoder.config.rope_theta))
    token = sequence[:, position:]
    with torch.no_grad():
        logits, *deltas = graphs.StepGraph(decoder, head=True)(token, cos, sin, mask, *caches)
        hidden, *same = graphs.StepGraph(decoder)(token, cos, sin, mask, *caches)
        layered = token
        for layer in range(2):
            layered, *_ = graphs.StepGraph(decoder, layers=[layer])(layered, cos, sin, mask, *caches[2 * layer:][:2])
        shard = graphs.HeadShardGraph(decoder, 0, 160)
        torch.testing.assert_close(logits[0], reference.logits[0, -1], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(shard(hidden), logits)
        torch.testing.assert_close(shard(layered), logits)
    for index, (key, value) in enumerate(history):
        for got in (deltas, same):
            torch.testing.assert_close(got[2 * index], key[0, :, position:], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(got[2 * index + 1], value[0, :, position:], rtol=1e-5, atol=1e-5)


def test_mel_chunks_are_the_encoders_own_chunking(small_model):
    """The runtime's numpy chunking feeds the encoder graph what the reference encoder builds from [mel, frames]."""
    import torch

    from rkaudio.board.audio8 import mel_chunks

    encoder = small_model.encoder
    frames = encoder.config.max_frames
    features = np.random.default_rng(5).standard_normal((encoder.config.num_mel_bins, frames)).astype(np.float32)
    chunks = mel_chunks(features, encoder.config.chunk_frames)
    assert chunks.shape == (frames // encoder.config.chunk_frames, 1, features.shape[0], encoder.config.chunk_frames)
    width = encoder.config.chunk_frames
    np.testing.assert_array_equal(chunks[1, 0], features[:, width: 2 * width])
    with torch.no_grad():
        expected = encoder(torch.from_numpy(features)).numpy()
        ours = graphs.EncoderGraph(encoder)(torch.from_numpy(chunks)).numpy()
    np.testing.assert_array_equal(ours, expected)
