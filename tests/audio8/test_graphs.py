"""The exported graphs of a small random-init model decode exactly like the torch FP32 model, each gate fails
on a known-bad artifact, and inputs that do not fit the buckets fail loudly."""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest

from converters.families.audio8 import checks
from converters.families.audio8.export import cache_free_verdict
from core.contract import get_contract
from core.errors import SetupError
from core.paths import engine_name
from runtime.kv_buckets import PLAN_FILE, Audio8Runtime, BucketError, Timings
from runtime.mel import log_mel


def test_graph_decoding_matches_torch_greedy_and_stress(small_model, small_plan):
    lines = []
    verdicts = checks.graph_verdicts(small_model, small_plan, say=lines.append)
    failed = [v.line() for v in verdicts if not v.passed]
    assert not failed, failed
    names = {v.name for v in verdicts}
    assert {f"{gate}[T{t}]" for t in (25, 50, 75, 100) for gate in ("greedy_tokens", "step_logits_rel_l2")} <= names
    assert {"stress_tokens[S110+403]", "stress_step_logits_rel_l2[S110+403]"} <= names
    # the fp32 export gates measure at the fp32 floor, well inside their thresholds (measured <= 8.7e-06)
    assert all(v.value < v.threshold / 5 for v in verdicts if v.unit == "ratio"), [v.line() for v in verdicts]
    # every natural run stops at EOS, and the stress run crosses both migrations
    assert sum("ends with EOS: True" in line for line in lines) == 4, lines
    assert any("buckets [128, 256, 512]" in line and line.startswith("stress") for line in lines), lines


def test_plan_lists_every_graph_with_role_and_bucket(small_plan):
    plan = json.loads((small_plan / PLAN_FILE).read_text())
    roles = sorted({(g["contract"]["component"], g["contract"]["role"]) for g in plan["graphs"]})
    assert roles == [("adapter", "main"), ("decoder", "block_128"), ("decoder", "block_256"),
                     ("decoder", "block_512"), ("decoder", "head"), ("decoder", "kv"), ("encoder", "main"),
                     ("prefill", "main")]
    for entry in plan["graphs"]:
        assert get_contract(small_plan / entry["onnx"]) == entry["contract"]
    blocks = [g["contract"] for g in plan["graphs"] if g["contract"]["role"].startswith("block_")]
    assert sorted((c["layer"], c["bucket"]) for c in blocks) == [(l, b) for l in range(2) for b in (128, 256, 512)]
    block = onnx.load(str(small_plan / "block_l1_s256.onnx"))
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in block.graph.input}
    assert shapes["full_k"] == shapes["full_v"] == [4, 256, 16] and shapes["mask"] == [4, 1, 256]


def test_export_records_the_token_gates_on_every_graph(small_model, tmp_path):
    """One record per graph, all carrying the same token verdicts, readable back for `--onnx`; the plan
    carries each graph's contract as the graph does and names its engine."""
    from converters.families.audio8.export import export
    from converters.pipeline import Exported

    records = export(small_model, tmp_path, [25], [128, 256], head_shards=2, stress=False, say=lambda _: None)
    plan = json.loads((tmp_path / PLAN_FILE).read_text())
    assert [r.onnx.name for r in records] == [g["onnx"] for g in plan["graphs"]]
    assert {r.verdicts for r in records} == {records[0].verdicts}
    assert [v.name for v in records[0].verdicts] == ["greedy_tokens[T25]", "adapter_rel_l2[T25]",
                                                     "prefill_logits_rel_l2[T25]", "step_logits_rel_l2[T25]"]
    for record, entry in zip(records, plan["graphs"]):
        assert get_contract(record.onnx) == entry["contract"] and entry["rknn"] == engine_name(record.onnx)
        assert Exported.from_onnx(record.onnx, "audio8") == record


def test_cache_free_gate_fails_on_an_in_graph_concat_cache(tmp_path):
    import torch

    class ConcatCache(torch.nn.Module):
        def forward(self, past, new):
            return torch.cat([past, new], dim=1)

    path = tmp_path / "concat.onnx"
    torch.onnx.export(ConcatCache(), (torch.zeros(4, 7, 16), torch.zeros(4, 1, 16)), str(path),
                      input_names=["past_key", "key_delta"], opset_version=17, dynamo=False)
    verdict = cache_free_verdict(onnx.load(str(path)), "concat")
    assert not verdict.passed and verdict.value == 2  # the Concat and the past_* input


def _replace_graph(plan_dir, stem, module, example_inputs, input_names, output_names):
    """Overwrite one exported graph with `module`, keeping its contract (a known-bad artifact)."""
    from converters.families.audio8.export import _export

    contract = get_contract(plan_dir / f"{stem}.onnx")
    _export(module, example_inputs, input_names, output_names, contract, plan_dir / f"{stem}.onnx")


def test_adapter_gate_catches_first_rows_of_the_largest_adapter(small_model, small_plan, tmp_path):
    """The spec's early mistake: the T100 adapter's first N rows instead of pooling to N."""
    import torch

    from converters.families.audio8.graphs import AdapterGraph

    class FirstRows(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.full = AdapterGraph(small_model.adapter, 104, 100)

        def forward(self, audio_hidden):
            return self.full(audio_hidden)[:25]

    bad = tmp_path / "bad"
    shutil.copytree(small_plan, bad)
    _replace_graph(bad, "adapter_t25", FirstRows(), (torch.zeros(104, 48),), ["audio_hidden"], ["audio_embeddings"])
    verdicts = {v.name: v for v in checks.graph_verdicts(small_model, bad, stress=False, say=lambda _: None)}
    print(verdicts["adapter_rel_l2[T25]"].line(), verdicts["greedy_tokens[T25]"].line())
    assert not verdicts["adapter_rel_l2[T25]"].passed and verdicts["adapter_rel_l2[T25]"].value > 0.3
    assert verdicts["adapter_rel_l2[T50]"].passed


def test_prefill_and_stress_gates_catch_a_graph_without_rope(small_model, small_plan, tmp_path):
    """RoPE left out of the S35 prefill and of one layer's 512 block: the prefill figure catches the first, and
    only the stress run reaches the 512 bucket to catch the second."""
    import torch

    from converters.families.audio8.graphs import BlockGraph, PrefillGraph

    class PrefillWithoutRope(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = PrefillGraph(small_model.decoder, 35)

        def forward(self, inputs_embeds, cos, sin):
            return self.inner(inputs_embeds, torch.ones_like(cos), torch.zeros_like(sin))

    class BlockWithoutRope(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = BlockGraph(small_model.decoder, 0)

        def forward(self, hidden, full_k, full_v, cos, sin, mask):
            return self.inner(hidden, full_k, full_v, torch.ones_like(cos), torch.zeros_like(sin), mask)

    bad = tmp_path / "bad"
    shutil.copytree(small_plan, bad)
    caches = [f"{kind}_{i}" for i in range(2) for kind in ("key", "value")]
    _replace_graph(bad, "prefill_s35", PrefillWithoutRope(), (torch.zeros(1, 35, 64), torch.ones(35, 16),
                   torch.zeros(35, 16)), ["inputs_embeds", "cos", "sin"], ["last_logits", *caches])
    _replace_graph(bad, "block_l0_s512", BlockWithoutRope(),
                   (torch.zeros(1, 1, 64), torch.zeros(4, 512, 16), torch.zeros(4, 512, 16), torch.ones(1, 16),
                    torch.zeros(1, 16), torch.zeros(4, 1, 512)),
                   ["hidden", "full_k", "full_v", "cos", "sin", "mask"], ["hidden_out"])
    verdicts = {v.name: v for v in checks.graph_verdicts(small_model, bad, say=lambda _: None)}
    failed = sorted(name for name, v in verdicts.items() if not v.passed)
    assert "prefill_logits_rel_l2[T25]" in failed and any(name.startswith("stress_tokens") for name in failed)
    assert not any(name.endswith(("[T50]", "[T75]", "[T100]")) for name in failed), failed


def test_token_gate_fails_on_a_different_sequence():
    assert checks.token_verdict("t", [1, 2, 3], [1, 2, 3]).passed
    assert not checks.token_verdict("t", [1, 2, 3], [1, 2, 4]).passed
    assert not checks.token_verdict("t", [1, 2, 3], [1, 2]).passed  # EOS missing counts


def test_margin_gate_explains_only_fp16_ties():
    logits = [np.array([0.0, 40.0, 39.99, 1.0]), np.array([0.0, 40.0, 39.0, 1.0])]
    # step 0 diverges with a 0.01 margin: below fp16's 0.03125 spacing at 40
    assert checks.margin_explained_verdict("m", [1, 5], logits, [2, 7]).passed
    # step 1 diverges with a 1.0 margin: a real error
    assert not checks.margin_explained_verdict("m", [1, 1], logits, [1, 2]).passed


def test_bucket_errors_are_loud(small_plan):
    with Audio8Runtime(small_plan) as runtime:
        with pytest.raises(BucketError, match="longer than the largest adapter bucket"):
            runtime.check_audio(8 * 16000 + 160)
        with pytest.raises(BucketError, match="37 audio placeholders"):
            runtime.check_audio(3 * 16000)
        features = np.zeros((128, 200), np.float32)
        embeds = runtime.prompt_embeddings(features, 25, Timings())
        with pytest.raises(BucketError, match="past the largest K/V bucket 512"):
            runtime.decode(embeds, 512 - embeds.shape[1] + 2, ignore_eos=True)


def test_lazy_loading_and_release(small_plan):
    opened = []

    def backend_for(path):
        from runtime.backends import OnnxBackend

        opened.append(path.name)
        return OnnxBackend(path)

    with Audio8Runtime(small_plan, backend_for=backend_for) as runtime:
        audio = checks.probe_audio(100)
        decoded = runtime.transcribe(log_mel(audio, 128), audio.size, 300, ignore_eos=True)
        assert decoded.buckets == [128, 256, 512]
        loaded = {key[:2] for key in runtime.loaded()}
    assert not any(name.startswith(("adapter_t25", "adapter_t50", "prefill_s35")) for name in opened)
    # the frontend and the outgrown buckets were released; only the 512 blocks, K/V and head stay open
    assert loaded == {("decoder", "kv"), ("decoder", "block_512"), ("decoder", "head")}


def test_runtime_opens_engine_artifacts(small_plan, tmp_path):
    """On a board the plan names .rknn engines: the runtime opens those (here a fake backend serves them)."""
    from runtime.backends import OnnxBackend

    plan_dir = tmp_path / "engines"
    shutil.copytree(small_plan, plan_dir)
    plan = json.loads((plan_dir / PLAN_FILE).read_text())
    for entry in plan["graphs"]:
        assert entry["rknn"] == engine_name(entry["onnx"])  # the export names each graph's engine
        (plan_dir / entry["rknn"]).touch()  # stand-ins for the built engines
    opened = []

    def fake_rknn(path):
        opened.append(path.suffix)
        return OnnxBackend(path.with_suffix(".onnx"))

    with Audio8Runtime(plan_dir, backend_for=fake_rknn, artifact="rknn") as runtime:
        embeds = runtime.prompt_embeddings(np.zeros((128, 400), np.float32), 50, Timings())
        runtime.decode(embeds, 3, ignore_eos=True)
    assert opened and set(opened) == {".rknn"}


def test_a_missing_engine_is_a_clear_error(small_plan):
    """The plan names engines before they are built: running one that is absent says how to build it."""
    with Audio8Runtime(small_plan, artifact="rknn") as runtime:
        with pytest.raises(SetupError, match=r"no encoder\.rknn in .*without --skip-rknn"):
            runtime.prompt_embeddings(np.zeros((128, 400), np.float32), 50, Timings())


def test_missing_snapshot_is_a_clear_error(tmp_path):
    from converters.families.audio8 import _snapshot_dir
    from converters.families.audio8.model import load_snapshot
    from core.errors import MissingSource

    with pytest.raises(SetupError, match="no Audio8-ASR snapshot"):
        load_snapshot(tmp_path)
    with pytest.raises(MissingSource, match="no Audio8-ASR snapshot"):
        _snapshot_dir({"dir": str(tmp_path / "absent")})


def test_check_command_decodes_a_wav(small_plan, tmp_path):
    import typer
    from typer.testing import CliRunner

    from converters.families.audio8 import register
    from runtime.audio import write_wav

    app, check_app = typer.Typer(), typer.Typer()
    app.add_typer(check_app, name="check")
    register(app, check_app)
    wav = write_wav(tmp_path / "probe.wav", checks.probe_audio(75), 16000)
    result = CliRunner().invoke(app, ["check", "audio8", "--plan", str(small_plan), "--wav", str(wav)])
    assert result.exit_code == 0, result.output
    assert "tokens:" in result.output and "buckets: 128" in result.output
    too_long = write_wav(tmp_path / "long.wav", np.zeros(9 * 16000), 16000)
    result = CliRunner().invoke(app, ["check", "audio8", "--plan", str(small_plan), "--wav", str(too_long)])
    assert result.exit_code != 0 and "longer than the largest adapter bucket" in str(result.exception)
