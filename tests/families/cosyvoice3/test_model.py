"""The DiT reference: upstream's key names and shapes load strictly, the snapshot errors are one line, the RoPE
head-0 quirk, and the scale-safe LayerNorm against a planted fp16 overflow."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rkaudio.families.cosyvoice3 import snapshot
from rkaudio.families.cosyvoice3.snapshot import REAL_CONFIG, TINY_CONFIG
from rkaudio.core.errors import SetupError


def upstream_state_shapes(c: dict) -> dict:
    """`decoder.estimator.*` names and shapes transcribed by hand from upstream's dit.py / modules.py
    (FunAudioLLM/CosyVoice: DiT, TimestepEmbedding, InputEmbedding, CausalConvPositionEmbedding, DiTBlock,
    AdaLayerNormZero(_Final), Attention, FeedForward) and x-transformers' RotaryEmbedding buffer."""
    dim, inner, ff = c["dim"], c["heads"] * c["dim_head"], c["dim"] * c["ff_mult"]
    mel = c["mel_dim"]
    shapes = {
        "time_embed.time_mlp.0.weight": (dim, 256), "time_embed.time_mlp.0.bias": (dim,),
        "time_embed.time_mlp.2.weight": (dim, dim), "time_embed.time_mlp.2.bias": (dim,),
        "input_embed.proj.weight": (dim, mel * 2 + c["mu_dim"] + c["spk_dim"]), "input_embed.proj.bias": (dim,),
        "input_embed.conv_pos_embed.conv1.0.weight": (dim, dim // 16, 31),
        "input_embed.conv_pos_embed.conv1.0.bias": (dim,),
        "input_embed.conv_pos_embed.conv2.0.weight": (dim, dim // 16, 31),
        "input_embed.conv_pos_embed.conv2.0.bias": (dim,),
        "rotary_embed.inv_freq": (c["dim_head"] // 2,),
        "norm_out.linear.weight": (2 * dim, dim), "norm_out.linear.bias": (2 * dim,),
        "proj_out.weight": (mel, dim), "proj_out.bias": (mel,),
    }
    for i in range(c["depth"]):
        block = f"transformer_blocks.{i}."
        shapes.update({
            block + "attn_norm.linear.weight": (6 * dim, dim), block + "attn_norm.linear.bias": (6 * dim,),
            block + "attn.to_q.weight": (inner, dim), block + "attn.to_q.bias": (inner,),
            block + "attn.to_k.weight": (inner, dim), block + "attn.to_k.bias": (inner,),
            block + "attn.to_v.weight": (inner, dim), block + "attn.to_v.bias": (inner,),
            block + "attn.to_out.0.weight": (dim, inner), block + "attn.to_out.0.bias": (dim,),
            block + "ff.ff.0.0.weight": (ff, dim), block + "ff.ff.0.0.bias": (ff,),
            block + "ff.ff.2.weight": (dim, ff), block + "ff.ff.2.bias": (dim,),
        })
    return shapes


def upstream_state(c: dict, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    state = {k: 0.05 * torch.randn(shape, generator=generator) for k, shape in upstream_state_shapes(c).items()}
    state["rotary_embed.inv_freq"] = 1.0 / (10000 ** (torch.arange(0, c["dim_head"], 2).float() / c["dim_head"]))
    return state


def test_real_config_has_upstreams_names_shapes_and_parameter_count():
    from rkaudio.families.cosyvoice3.dit import build, parameter_count

    with torch.device("meta"):
        model = build(REAL_CONFIG)
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == upstream_state_shapes(REAL_CONFIG)
    assert parameter_count(model) == 331_142_224  # the 331.1 M


def test_upstream_named_state_dict_loads_strictly(tmp_path):
    state = upstream_state(TINY_CONFIG)
    extra = {"input_embedding.weight": torch.zeros(8, 80), "spk_embed_affine_layer.weight": torch.zeros(80, 192)}
    snapshot.write(tmp_path, TINY_CONFIG, state, extra=extra)
    model, source = snapshot.load_estimator(tmp_path)
    assert source.config == TINY_CONFIG
    assert source.cfm["inference_cfg_rate"] == 0.7 and source.cfm["t_scheduler"] == "cosine"
    for key, value in state.items():
        assert torch.equal(model.state_dict()[key], value), key


def test_wrong_keys_fail_naming_missing_and_unexpected(tmp_path):
    state = upstream_state(TINY_CONFIG)
    state["transformer_blocks.0.attn.to_qq.weight"] = state.pop("transformer_blocks.0.attn.to_q.weight")
    del state["rotary_embed.inv_freq"]
    snapshot.write(tmp_path, TINY_CONFIG, state)
    with pytest.raises(SetupError) as caught:
        snapshot.load_estimator(tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    assert "missing 2 key(s)" in message and "decoder.estimator.transformer_blocks.0.attn.to_q.weight" in message
    assert "decoder.estimator.rotary_embed.inv_freq" in message
    assert "unexpected 1 key(s): decoder.estimator.transformer_blocks.0.attn.to_qq.weight" in message


def test_wrong_shape_fails_naming_the_key(tmp_path):
    state = upstream_state(TINY_CONFIG)
    state["proj_out.weight"] = torch.zeros(100, TINY_CONFIG["dim"])
    snapshot.write(tmp_path, TINY_CONFIG, state)
    with pytest.raises(SetupError, match=r"first decoder.estimator.proj_out.weight is \[100, 64\]"):
        snapshot.load_estimator(tmp_path)


@pytest.mark.parametrize("absent", [snapshot.YAML_NAME, snapshot.WEIGHTS_NAME])
def test_missing_yaml_or_weights_fail_with_one_line(tmp_path, absent):
    snapshot.write(tmp_path, TINY_CONFIG, upstream_state(TINY_CONFIG))
    (tmp_path / absent).unlink()
    with pytest.raises(SetupError) as caught:
        snapshot.load_estimator(tmp_path)
    assert "\n" not in str(caught.value) and f"(without {absent})" in str(caught.value)


def test_missing_directory_and_foreign_weights(tmp_path):
    with pytest.raises(SetupError, match=f"no {snapshot.REPO_ID} snapshot .* in {tmp_path / 'absent'} "
                                         r"\(no such folder\);"):
        snapshot.resolve(tmp_path / "absent")
    snapshot.write(tmp_path, TINY_CONFIG, {})
    torch.save({"encoder.weight": torch.zeros(2)}, str(tmp_path / snapshot.WEIGHTS_NAME))
    with pytest.raises(SetupError, match=r"no 'decoder.estimator.\*' tensors"):
        snapshot.load(tmp_path)


def test_rope_rotates_head_zero_only(tiny_model):
    from rkaudio.families.cosyvoice3.dit import apply_rotary_pos_emb

    heads, dim_head = tiny_model.heads, tiny_model.dim_head
    q = torch.randn(1, 12, heads * dim_head)
    freqs, _ = tiny_model.rotary_embed.forward_from_seq_len(12)
    rotated = apply_rotary_pos_emb(q, freqs)
    assert not torch.allclose(rotated[..., :dim_head], q[..., :dim_head])
    assert torch.equal(rotated[..., dim_head:], q[..., dim_head:])


def test_engine_graph_matches_the_reference_and_the_quirk_matters(tiny_model64):
    """The engine graph (float64) equals the reference DiT; rotating every head (a plausible reading of RoPE)
    does not."""
    from rkaudio.families.cosyvoice3.engine_graph import EstimatorGraph
    from rkaudio.families.cosyvoice3.export import make_inputs, reference_call
    from rkaudio.board.numeric import snr_db
    from rkaudio.board.cosyvoice3 import INPUT_NAMES

    feeds = make_inputs(tiny_model64, 20, 20, seed=3)
    reference = reference_call(tiny_model64, feeds, 20)
    args = [torch.from_numpy(feeds[name]).double() for name in INPUT_NAMES]
    for ln_form in ("plain", "safe"):
        with torch.no_grad():
            got = EstimatorGraph(tiny_model64, ln_form=ln_form)(*args).numpy()
        assert snr_db(reference, got) > 150  # float32 tables and sinusoid: ~180 dB
    with torch.no_grad():
        wrong = EstimatorGraph(tiny_model64, rotate_all_heads=True)(*args).numpy()
    assert snr_db(reference, wrong) < 80


def test_scale_safe_layer_norm_holds_where_fp16_plain_overflows():
    """Planted: a residual row scaled to |x| ~ 2000 (trained DiTs grow such rows; random weights do not). In fp16
    the plain LayerNorm squares past 65504 and returns NaN/Inf; the scale-safe form stays within fp16 rounding
    of the float64 LayerNorm. At unit scale both are exact in float64."""
    from rkaudio.families.cosyvoice3.engine_graph import layer_norm
    from rkaudio.board.numeric import snr_db

    generator = torch.Generator().manual_seed(0)
    row = torch.randn(2, 7, 64, generator=generator, dtype=torch.float64)
    exact = torch.nn.functional.layer_norm(row, (64,), eps=1e-6)
    for form in ("plain", "safe"):
        assert snr_db(exact.numpy(), layer_norm(row, form=form).numpy()) > 250
    big = row * 2000.0
    reference = torch.nn.functional.layer_norm(big, (64,), eps=1e-6).numpy()
    plain = layer_norm(big.half(), form="plain").double().numpy()
    safe = layer_norm(big.half(), form="safe").double().numpy()
    assert snr_db(reference, plain) < 10  # var overflows to inf: every row collapses to 0 (or NaN)
    assert np.all(np.isfinite(safe)) and snr_db(reference, safe) > 50


def test_planted_overflow_plain_layer_norm_holds_on_the_rk3588_simulator(tmp_path, require_converter):
    """Planted at engine level: the residual stream scaled to |x| ~ 1e4 (the input projection x10000), where a
    literal fp16 LayerNorm squares past 65504. rknn-toolkit2 fuses the plain form into exNorm, which holds on the
    simulator (63 dB here, as at unit scale); so the plain form stays the default. The scale-safe form
    (`ln_form="safe"`) is exact in fp32 but crashes the 2.3.2 compiler (fuse_ops: _swap_transpose_expand)."""
    import copy

    from rkaudio.families.cosyvoice3 import export as E
    from rkaudio.families.cosyvoice3.snapshot import TINY_CONFIG, random_estimator
    from rkaudio.board.numeric import snr_db
    from rkaudio.host.backends import OnnxBackend, SimulatorBackend

    require_converter()
    model = random_estimator(TINY_CONFIG, 0)
    with torch.no_grad():
        model.input_embed.proj.weight.mul_(1e4)
        model.input_embed.proj.bias.mul_(1e4)
    feeds = E.make_inputs(model, 24, 24, 0)
    path = tmp_path / "planted.onnx"
    E.export_onnx(model, 24, path, ln_form="plain")
    fp32 = OnnxBackend(path).run(feeds)["dphi_dt"]
    assert snr_db(E.reference_call(copy.deepcopy(model).double(), feeds, 24), fp32) > 100
    from rkaudio.families.cosyvoice3.engine_graph import EstimatorGraph

    with torch.no_grad():  # the residual really is past the plain fp16 range: var > 65504 by far
        h = EstimatorGraph(model)._embed(*(torch.from_numpy(feeds[n]) for n in ("x", "mu", "spks", "cond")))
    centered = h - h.mean(-1, keepdim=True)
    assert float((centered * centered).mean(-1).max()) > 65504 * 100
    with SimulatorBackend(path, "rk3588") as simulator:
        simulated = simulator.run(feeds)["dphi_dt"]
    assert np.all(np.isfinite(simulated)) and snr_db(fp32, simulated) > 50
