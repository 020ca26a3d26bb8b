"""The RK3566 form of the Audio8 export (issue #42): the family's layout (`graphs.LAYOUTS`) and attention form
(`export.ATTENTION_FORMS`) compute what the default graphs compute, rk3588 keeps the native form, and the tiny model
built for rk3566 by `convert audio8` has no REGTASK line and at most the recipe's max_cpu_ops CPU ops per graph."""
from __future__ import annotations

import copy
import json
import subprocess
import sys

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

from rkaudio.core.paths import REPO_ROOT
from rkaudio.families.audio8 import graphs, graphs_job
from rkaudio.families.audio8.export import export_all
from rkaudio.surgery.graph.attention import softmax_as_row_max_exp
from rkaudio.host.backends import OnnxBackend

RK3566 = graphs.LAYOUTS["rk3566"]


def _softmax_model(shape) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Softmax", ["logits"], ["weights"], axis=-1, name="Softmax")], "g",
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("weights", TensorProto.FLOAT, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_softmax_as_row_max_exp_is_exp_below_each_rows_max():
    rng = np.random.default_rng(0)
    logits = (8 * rng.standard_normal((4, 3, 129))).astype(np.float32)
    logits[0, :, 40:] = graphs.MASKED  # a cache bucket's unwritten rows
    logits[1, 0, :] += 25.0  # rows far above any constant bound
    rewritten = softmax_as_row_max_exp(_softmax_model(list(logits.shape)))
    assert "Softmax" not in {node.op_type for node in rewritten.graph.node}
    exp = OnnxBackend(rewritten).run({"logits": logits})["weights"]
    wide = logits.astype(np.float64)
    reference = np.exp(wide - wide.max(-1, keepdims=True))
    # onnxruntime's fp32 Sigmoid is accurate to 1.1e-7 absolute, so its ratio is exp(-r) within 1.1e-3 of the
    # row's peak of 1 (tests/surgery/test_attention.py EXP_RATIO_TOLERANCE)
    np.testing.assert_allclose(exp, reference, rtol=0, atol=1.1e-3)
    # the shift is each row's own max (logits far above 8 too): the largest weight is 1 within fp32 rounding of the
    # tree's sums, not merely within the Sigmoid's tolerance; in rows with masked keys within the tree's rounding of
    # a - b at the fill's magnitude (fp32 ulp of 1e4: 9.8e-4), which the row sum's division cancels
    np.testing.assert_allclose(exp[1:].max(-1), 1.0, rtol=0, atol=1e-5)
    np.testing.assert_allclose(exp[0].max(-1), 1.0, rtol=0, atol=9.8e-4)
    # normalised by its row sum it is the softmax (what the rk3566 step divides by itself)
    np.testing.assert_allclose(exp / exp.sum(-1, keepdims=True), reference / reference.sum(-1, keepdims=True),
                               rtol=0, atol=1.1e-3)


def test_rk3566_layout_graphs_compute_the_default_graphs_in_float64(small_model):
    model = copy.deepcopy(small_model).double()
    decoder, encoder_config = model.decoder, model.encoder.config
    config = decoder.config
    heads, hidden = config.num_attention_heads, config.hidden_size
    head_dim, length, bucket = hidden // heads, 24, 32
    rng = np.random.default_rng(1)

    def normal(*shape):
        return torch.from_numpy(rng.standard_normal(shape))

    tokens = encoder_config.audio_tokens
    mel = normal(encoder_config.max_frames // encoder_config.chunk_frames, 1, encoder_config.num_mel_bins,
                 encoder_config.chunk_frames)
    audio_hidden, pool = normal(tokens, encoder_config.output_dim), normal(1, 20, tokens)
    with torch.no_grad():
        torch.testing.assert_close(graphs.EncoderGraph(model.encoder, RK3566)(mel),
                                   graphs.EncoderGraph(model.encoder)(mel), rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(graphs.AdapterGraph(model.adapter, RK3566)(audio_hidden, pool),
                                   graphs.AdapterGraph(model.adapter)(audio_hidden, pool), rtol=1e-10, atol=1e-10)
    cos, sin = normal(length, head_dim), normal(length, head_dim)
    select = torch.zeros(1, length, dtype=torch.float64)
    select[0, 17] = 1.0
    prefill_in = (normal(1, length, hidden), cos, sin, select)
    with torch.no_grad():
        default = graphs.PrefillGraph(decoder, length).double()(*prefill_in)
        # the rk3566 prefill takes the same embeddings channel-first ([1, hidden, S])
        by_channel = (prefill_in[0].transpose(1, 2), *prefill_in[1:])
        laid_out = graphs.PrefillGraph(decoder, length, RK3566).double()(*by_channel)
        for expected, got in zip(default, laid_out):
            torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
        mask = torch.zeros(heads, 1, bucket, dtype=torch.float64)
        mask[:, :, 9:] = graphs.MASKED
        step_in = (normal(1, 1, hidden), cos[:1], sin[:1], mask,
                   *[normal(heads, bucket, head_dim) for _ in range(2 * config.num_hidden_layers)])
        default = graphs.StepGraph(decoder).double()(*step_in)
        laid_out = graphs.StepGraph(decoder, layout=RK3566).double()(*step_in)
        for expected, got in zip(default, laid_out):
            torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
        rows = config.vocab_size // 2
        torch.testing.assert_close(graphs.HeadShardGraph(decoder, 0, rows, rank3=True)(step_in[0]),
                                   graphs.HeadShardGraph(decoder, 0, rows)(step_in[0]), rtol=1e-10, atol=1e-10)


def _softmax_count(path) -> int:
    return sum(node.op_type == "Softmax" for node in onnx.load(str(path)).graph.node)


def test_rk3588_keeps_the_native_softmax_and_judges_no_logit(small_model, tmp_path):
    plan = export_all(graphs_job(tmp_path, [128], head_shards=2, target="rk3588"), small_model)
    assert plan["attention_verdicts"] == []
    assert [_softmax_count(tmp_path / f"{stem}.onnx") for stem in ("encoder", "prefill", "step_s128")] == [2, 2, 2]
    assert plan["graphs"][2]["contract"]["length"] == 110  # the prompt as it is: no rk3566 rounding


def test_tiny_model_builds_for_rk3566_within_the_recipes_cpu_ops(tmp_path, require_converter):
    """`convert audio8` for rk3566 with the recipe's rk3566 max_cpu_ops: every graph in the exp-ratio form (no
    Softmax left), no REGTASK line, the token gates through the rk3566 graphs, the simulator over the gate and within
    the fp16 floor's margin, the row-max form's logit verdict in each attention graph's manifest."""
    from rkaudio.cli.families import declaration
    from rkaudio.release.recipes import RECIPES_DIR, load_recipe, recipes_for

    require_converter()
    recipe = load_recipe(RECIPES_DIR / "audio8_asr_0_1b.toml", declaration)
    gates = recipes_for(recipe, "rk3566")[0]["gates"]
    allowed = 0 if gates.get("fail_on_cpu_ops") else gates["max_cpu_ops"]
    out = tmp_path / "engines"
    run = subprocess.run([sys.executable, "-m", "rkaudio.cli", "audio8", "--random-weights", "small",
                          "--head-shards", "2", "--kv-buckets", "128", "--no-stress", "--target", "rk3566",
                          "--out", str(out), "--max-cpu-ops", str(allowed)], cwd=REPO_ROOT, capture_output=True,
                         text=True)
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    for stem in ("encoder", "adapter", "prefill", "step_s128", "head_0", "head_1"):
        manifest = json.loads((out / f"{stem}.manifest.json").read_text())
        gates = {g["name"]: g for g in manifest["gates"]}
        assert manifest["regtask"]["lines"] == 0 and gates["regtask_lines"]["value"] == 0, stem
        assert len(manifest["ops"]["cpu_ops"]) <= allowed, (stem, manifest["ops"]["cpu_ops"])
        sim = [g for name, g in gates.items() if name.startswith(("simulator_snr", "fp16_floor_gap"))]
        assert sim and all(g["passed"] for g in sim), (stem, sim)
        if stem in ("encoder", "prefill", "step_s128"):
            assert _softmax_count(out / f"{stem}.onnx") == 0, stem
            assert gates[f"attention_logit_max_abs[{stem}]"]["passed"], stem
