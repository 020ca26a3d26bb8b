"""The exported graphs of a small random-init model decode exactly like the torch FP32 model, each gate fails
on a known-bad artifact, and inputs that do not fit the buckets fail loudly."""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest

from rkaudio.families.audio8 import checks, graphs_job
from rkaudio.families.audio8.export import cache_free_verdict
from rkaudio.core.contract import contract_of, get_contract
from rkaudio.core.errors import SetupError
from rkaudio.core.paths import engine_name
from rkaudio.board.audio8 import PLAN_FILE, Audio8Runtime, BucketError, Timings
from rkaudio.board.mel import log_mel
from rkaudio.host.backends import OnnxBackend


def test_graph_decoding_matches_torch_greedy_and_stress(small_model, small_plan):
    lines = []
    verdicts = checks.graph_verdicts(small_model, small_plan, say=lines.append)
    failed = [v.line() for v in verdicts if not v.passed]
    assert not failed, failed
    names = {v.name for v in verdicts}
    # clips of any length, not only the spec's 2/4/6/8 s, through the one adapter and the one prefill
    assert checks.PROBE_SECONDS == (0.7, 1.9, 3.1, 4.4, 5.6, 7.9)
    assert {f"{gate}[{s:g}s]" for s in checks.PROBE_SECONDS
            for gate in ("greedy_tokens", "adapter_rel_l2", "prefill_logits_rel_l2", "step_logits_rel_l2")} <= names
    assert {"stress_tokens[S110+403]", "stress_step_logits_rel_l2[S110+403]"} <= names
    # the fp32 export gates measure at the fp32 floor, well inside their thresholds (measured <= 8.7e-06)
    assert all(v.value < v.threshold / 5 for v in verdicts if v.unit == "ratio"), [v.line() for v in verdicts]
    print("\n".join(lines))
    placeholders = [int(line.split(": ")[1].split()[0]) for line in lines if not line.startswith("stress")]
    assert placeholders == [8, 23, 38, 55, 70, 98], lines
    # every natural run stops at EOS, and the stress run crosses both migrations
    assert sum("ends with EOS: True" in line for line in lines) == 6, lines
    assert any("buckets [128, 256, 512]" in line and line.startswith("stress") for line in lines), lines


def test_plan_lists_every_graph_with_role_and_bucket(small_plan):
    plan = json.loads((small_plan / PLAN_FILE).read_text())
    roles = sorted({(g["contract"]["component"], g["contract"]["role"]) for g in plan["graphs"]})
    assert roles == [("adapter", "main"), ("decoder", "head"), ("decoder", "step_128"), ("decoder", "step_256"),
                     ("decoder", "step_512"), ("encoder", "main"), ("prefill", "main")]
    for entry in plan["graphs"]:
        assert get_contract(small_plan / entry["onnx"]) == entry["contract"]
    # one adapter for every N, one prefill for every prompt length: no ladder of either
    assert [g["onnx"] for g in plan["graphs"] if g["contract"]["component"] in ("adapter", "prefill")] == [
        "adapter.onnx", "prefill.onnx"]
    assert all("ladder_key" not in g["contract"] for g in plan["graphs"] if g["contract"]["component"] != "decoder")
    assert len(plan["graphs"]) == 3 + 3 + 2  # frontend + prefill, a step per bucket, head shards
    steps = [g["contract"] for g in plan["graphs"] if g["contract"]["role"].startswith("step_")]
    assert [(c["role"], c["bucket"], "ladder_key" in c) for c in steps] == [
        (f"step_{b}", b, False) for b in (128, 256, 512)]

    def io(stem):
        graph = onnx.load(str(small_plan / f"{stem}.onnx")).graph
        return ({i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input},
                {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in graph.output})

    # the step: every layer's K/V buffer in (this position unwritten), every layer's new row out
    inputs, outputs = io("step_s256")
    assert inputs == {"hidden": [1, 1, 64], "cos": [1, 16], "sin": [1, 16], "mask": [4, 1, 256],
                      **{f"{kind}_{i}": [4, 256, 16] for i in range(2) for kind in ("full_k", "full_v")}}
    assert outputs == {"hidden_out": [1, 1, 64], **{f"{kind}_{i}": [4, 1, 16] for i in range(2)
                                                    for kind in ("key_delta", "value_delta")}}
    inputs, outputs = io("adapter")
    assert inputs == {"audio_hidden": [104, 48], "pool": [1, 100, 104]} and outputs == {"audio_embeddings": [100, 64]}
    inputs, outputs = io("prefill")
    assert inputs == {"inputs_embeds": [1, 110, 64], "cos": [110, 16], "sin": [110, 16], "select": [1, 110]}
    assert outputs == {"last_hidden": [1, 1, 64], **{f"{kind}_{i}": [4, 110, 16] for i in range(2)
                                                     for kind in ("key", "value")}}
    prefill = onnx.load(str(small_plan / "prefill.onnx")).graph
    # no LM head inside (the head shards give the logits), no index Gather for the last position
    assert not any(o.type.tensor_type.shape.dim[-1].dim_value == 160 for o in prefill.output)
    assert not [n.op_type for n in prefill.node if n.op_type in ("Gather", "GatherElements", "GatherND")]



def test_each_graphs_contract_is_its_typed_fields(small_plan):
    """A graph's family fields are exactly those of its kind (`rkaudio.board.audio8`): every graph the shared ones
    (the prompt typed too), the adapter its row count, the prefill its length, a step its bucket, a head shard its
    place and its [start, stop) vocabulary rows (its ladder key the place)."""
    from rkaudio.board.audio8 import (Audio8AdapterFields, Audio8Fields, Audio8HeadFields, Audio8PrefillFields,
                                      Audio8StepFields, Prompt)
    from rkaudio.board.contract import EngineContract

    kinds = {("encoder", "main"): Audio8Fields, ("adapter", "main"): Audio8AdapterFields,
             ("prefill", "main"): Audio8PrefillFields, ("decoder", "head"): Audio8HeadFields}
    plan = json.loads((small_plan / PLAN_FILE).read_text())
    heads = []
    for entry in plan["graphs"]:
        contract = EngineContract.from_json(entry["contract"])
        kind = Audio8StepFields if contract.role.startswith("step_") else kinds[contract.component, contract.role]
        fields = kind.of(contract)
        assert fields.to_fields() == dict(contract.fields) and isinstance(fields.prompt, Prompt)
        if kind is Audio8StepFields:
            assert contract.role == f"step_{fields.bucket}"
        if kind is Audio8HeadFields:
            heads.append((contract.ladder_key, fields.shard, fields.rows))
    vocab = fields.vocab
    assert heads == [(0, 0, [0, vocab // 2]), (1, 1, [vocab // 2, vocab])]

def test_export_records_the_token_gates_on_every_graph(small_model, tmp_path):
    """One record per graph, all carrying the same token verdicts, readable back for `--onnx`; the plan
    carries each graph's contract as the graph does and names its engine."""
    from rkaudio.families.audio8.export import export
    from rkaudio.pipeline.pipeline import Exported

    records = export(graphs_job(tmp_path, [128, 256], head_shards=2), small_model, stress=False, say=lambda _: None,
                     clips=[1.9])
    plan = json.loads((tmp_path / PLAN_FILE).read_text())
    assert [r.onnx.name for r in records] == [g["onnx"] for g in plan["graphs"]]
    assert {r.verdicts for r in records} == {records[0].verdicts}
    assert [v.name for v in records[0].verdicts] == ["greedy_tokens[1.9s]", "adapter_rel_l2[1.9s]",
                                                     "prefill_logits_rel_l2[1.9s]", "step_logits_rel_l2[1.9s]"]
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


def _attention_graph(tmp_path, name, forward):
    """A one-token attention over a K/V buffer `full_k`/`full_v` and this token's `key`/`value`, as `forward`."""
    import torch

    module = type(name, (torch.nn.Module,), {"forward": lambda self, *args: forward(*args)})()
    path = tmp_path / f"{name}.onnx"
    torch.onnx.export(module, (torch.ones(4, 1, 16), torch.ones(4, 8, 16), torch.ones(4, 8, 16),
                               torch.ones(4, 1, 16), torch.ones(4, 1, 16)), str(path),
                      input_names=["query", "full_k", "full_v", "key", "value"], output_names=["out"],
                      opset_version=17, dynamo=False)
    return cache_free_verdict(onnx.load(str(path)), name)


def test_cache_free_gate_admits_the_score_concat_and_fails_on_a_buffer_concat_or_scatter(small_plan, tmp_path):
    """The step's Concat of its two score vectors passes; a Concat of the buffer with the new row (an in-graph
    cache, even behind a Transpose) and a ScatterND write into the buffer each fail, naming the node."""
    import torch

    def scores(q, full_k, full_v, key, value):  # the step's form: softmax over [cache scores, own score]
        weights = torch.softmax(torch.cat([q @ full_k.transpose(1, 2), (q * key).sum(-1, keepdim=True)], -1), -1)
        return weights[..., :8] @ full_v + weights[..., 8:] * value

    def concat(q, full_k, full_v, key, value):
        keys = torch.cat([full_k.transpose(1, 2), key.transpose(1, 2)], dim=2)
        return torch.softmax(q @ keys, -1) @ torch.cat([full_v, value], dim=1)

    def scatter(q, full_k, full_v, key, value):
        written = full_k.clone()
        written[:, 3:4] = key  # exports as ScatterND
        return torch.softmax(q @ written.transpose(1, 2), -1) @ full_v

    assert _attention_graph(tmp_path, "scores", scores).passed
    for name, forward, op in (("concat", concat, "Concat"), ("scatter", scatter, "ScatterND")):
        verdict = _attention_graph(tmp_path, name, forward)
        assert not verdict.passed and op in verdict.detail, verdict.line()
    steps = [g for g in json.loads((small_plan / PLAN_FILE).read_text())["graphs"] if g["onnx"].startswith("step_")]
    step = onnx.load(str(small_plan / steps[0]["onnx"]))
    assert [n.op_type for n in step.graph.node].count("Concat") == 2  # one score Concat per layer
    assert cache_free_verdict(step, "step").passed


def _replace_graph(plan_dir, stem, module, example_inputs, input_names, output_names):
    """Overwrite one exported graph with `module`, keeping its contract (a known-bad artifact)."""
    from rkaudio.families.audio8.export import _export

    contract = contract_of(plan_dir / f"{stem}.onnx")
    _export(module, example_inputs, input_names, output_names, contract, plan_dir / f"{stem}.onnx")


class FirstRowsOfTheLargestPooling(Audio8Runtime):
    """The spec's early mistake, in the one-adapter form: the pooling for the most placeholders (the old T100
    adapter's) fed for every clip, and its first N rows kept, instead of pooling to N."""

    def _pooling(self, placeholders):
        return super()._pooling(self.fields.max_placeholders)


def test_adapter_gate_catches_first_rows_of_the_largest_pooling(small_model, small_plan):
    clips = (0.7, 3.1, 8.0)  # 8, 38 and 100 placeholders
    verdicts = {v.name: v for v in checks.graph_verdicts(small_model, small_plan, stress=False, say=lambda _: None,
                                                         runtime_class=FirstRowsOfTheLargestPooling, clips=clips)}
    print(verdicts["adapter_rel_l2[3.1s]"].line(), verdicts["greedy_tokens[3.1s]"].line())
    for name in ("0.7s", "3.1s"):
        assert not verdicts[f"adapter_rel_l2[{name}]"].passed and verdicts[f"adapter_rel_l2[{name}]"].value > 0.3
    assert verdicts["adapter_rel_l2[8s]"].passed  # the largest N: the mistake is invisible there


def test_prefill_gate_catches_a_prefill_without_rope(small_model, small_plan, tmp_path):
    """RoPE left out of the one prefill: its logit figure fails for every clip length."""
    import torch

    from rkaudio.families.audio8.graphs import PrefillGraph

    class PrefillWithoutRope(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = PrefillGraph(small_model.decoder, 110)

        def forward(self, inputs_embeds, cos, sin, select):
            return self.inner(inputs_embeds, torch.ones_like(cos), torch.zeros_like(sin), select)

    bad = tmp_path / "bad"
    shutil.copytree(small_plan, bad)
    caches = [f"{kind}_{i}" for i in range(2) for kind in ("key", "value")]
    select = torch.zeros(1, 110)
    select[0, 40] = 1.0
    _replace_graph(bad, "prefill", PrefillWithoutRope(), (torch.zeros(1, 110, 64), torch.ones(110, 16),
                   torch.zeros(110, 16), select), ["inputs_embeds", "cos", "sin", "select"], ["last_hidden", *caches])
    clips = (0.7, 4.4, 7.9)
    verdicts = {v.name: v for v in checks.graph_verdicts(small_model, bad, stress=False, say=lambda _: None,
                                                         clips=clips)}
    print("\n".join(v.line() for v in verdicts.values()))
    assert all(not verdicts[f"prefill_logits_rel_l2[{c:g}s]"].passed for c in clips)
    assert all(verdicts[f"adapter_rel_l2[{c:g}s]"].passed for c in clips)


def test_stress_gate_catches_a_512_step_without_rope(small_model, small_plan, tmp_path):
    """RoPE left out of the 512 bucket's step: only the stress run reaches the 512 bucket to catch it."""
    import torch

    from rkaudio.families.audio8.graphs import StepGraph, step_input_names, step_output_names

    class StepWithoutRope(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = StepGraph(small_model.decoder)

        def forward(self, hidden, cos, sin, mask, *caches):
            return self.inner(hidden, torch.ones_like(cos), torch.zeros_like(sin), mask, *caches)

    bad = tmp_path / "bad"
    shutil.copytree(small_plan, bad)
    _replace_graph(bad, "step_s512", StepWithoutRope(),
                   (torch.zeros(1, 1, 64), torch.ones(1, 16), torch.zeros(1, 16), torch.zeros(4, 1, 512),
                    *[torch.zeros(4, 512, 16)] * 4), step_input_names(2), step_output_names(2))
    verdicts = {v.name: v for v in checks.graph_verdicts(small_model, bad, say=lambda _: None, clips=(1.9, 7.9))}
    failed = sorted(name for name, v in verdicts.items() if not v.passed)
    assert failed and all(name.startswith("stress_") for name in failed), failed
    assert any(name.startswith("stress_tokens") for name in failed), failed


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


def test_any_clip_up_to_8_s_and_loud_errors_past_it(small_plan):
    with Audio8Runtime(small_plan, backend_for=OnnxBackend) as runtime:
        counts = [runtime.check_audio(int(seconds * 16000)) for seconds in (0.5, 0.7, 1.9, 3.0, 3.1, 7.9, 8.0)]
        assert counts == [6, 8, 23, 37, 38, 98, 100]
        with pytest.raises(BucketError, match=r"8\.01 s is longer than the 8 s .*split it into clips of at most 8 s"):
            runtime.check_audio(8 * 16000 + 160)
        with pytest.raises(BucketError, match="empty"):
            runtime.check_audio(0)
        features = np.zeros((128, 200), np.float32)
        embeds = runtime.prompt_embeddings(features, 25, Timings())
        with pytest.raises(BucketError, match="past the largest K/V bucket 512"):
            runtime.decode(embeds, 512 - embeds.shape[1] + 2, ignore_eos=True)


def test_lazy_loading_and_release(small_plan):
    opened = []

    def backend_for(path):
        opened.append(path.name)
        return OnnxBackend(path)

    with Audio8Runtime(small_plan, backend_for=backend_for) as runtime:
        audio = checks.probe_audio(100)
        decoded = runtime.transcribe(log_mel(audio, 128), audio.size, 300, ignore_eos=True)
        assert decoded.buckets == [128, 256, 512]
        loaded = {key[:2] for key in runtime.loaded()}
    assert opened[:3] == ["encoder.onnx", "adapter.onnx", "prefill.onnx"]
    assert sum(name.startswith(("adapter", "prefill")) for name in opened) == 2  # opened once each
    # the frontend and the outgrown buckets were released; only the 512 step and the head stay open
    assert loaded == {("decoder", "step_512"), ("decoder", "head")}


def test_runtime_opens_engine_artifacts(small_plan, tmp_path):
    """On a board the plan names .rknn engines: the runtime opens those (here a fake backend serves them)."""
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


def test_step_buffers_are_held_and_fed_in_the_dtype_the_step_graph_takes(small_plan):
    """Every step contract feeds the mask and each layer's K/V in fp16 (`feed_dtypes`). Over backends fed as an
    engine is (their input_dtypes from the contract, as an engine's manifest gives them to rknnlite) the runtime
    holds those buffers in fp16 across a bucket migration and feeds them so, every other input in fp32, and
    decodes the fp32 tokens or diverges only at an fp16 tie; over the ONNX on onnxruntime it holds them in fp32."""
    from rkaudio.core.contract import fed_inputs

    plan = json.loads((small_plan / PLAN_FILE).read_text())
    buffers = {"mask", *[f"{kind}_{i}" for i in range(2) for kind in ("full_k", "full_v")]}
    for entry in plan["graphs"]:
        assert entry["contract"].get("feed_dtypes", {}) == (
            {name: "float16" for name in buffers} if entry["contract"]["role"].startswith("step_") else {})
    fed = {"engine": [], "onnx": []}

    def fed_as(kind):
        class Recorded:
            def __init__(self, path):
                self.graph = OnnxBackend(path)  # casts what it is fed to the ONNX's fp32 at its boundary
                entries = [{"name": name, "dtype": dtype.name} for name, dtype in self.graph.input_dtypes.items()]
                self.input_dtypes = ({e["name"]: np.dtype(e["dtype"]) for e in fed_inputs(entries, contract_of(path))}
                                     if kind == "engine" else self.graph.input_dtypes)

            def run(self, feeds):
                if "full_k_0" in feeds:
                    fed[kind].append({name: np.asarray(value).dtype.name for name, value in feeds.items()})
                return self.graph.run(feeds)

            def close(self):
                self.graph.close()
        return Recorded

    audio = checks.probe_clip(7.9)
    decoded = {}
    for kind in fed:
        with Audio8Runtime(small_plan, backend_for=fed_as(kind)) as runtime:
            embeds = runtime.prompt_embeddings(log_mel(audio, 128), runtime.check_audio(audio.size), Timings())
            decoded[kind] = runtime.decode(embeds, 40, ignore_eos=True, keep_logits=True)
    assert decoded["engine"].buckets == [128, 256]  # a migration on the way
    step_inputs = set(fed["engine"][0])
    assert all(call == {name: "float16" if name in buffers else "float32" for name in step_inputs}
               for call in fed["engine"])
    assert all(set(call.values()) == {"float32"} for call in fed["onnx"])
    verdict = checks.margin_explained_verdict("fp16_buffers", decoded["onnx"].tokens, decoded["onnx"].step_logits,
                                              decoded["engine"].tokens)
    assert verdict.passed, verdict.line()


def test_a_missing_engine_is_a_clear_error(small_plan):
    """The plan names engines before they are built: running one that is absent says how to build it."""
    from rkaudio.board.rknnlite import RknnLiteBackend

    with Audio8Runtime(small_plan, backend_for=RknnLiteBackend, artifact="rknn") as runtime:
        with pytest.raises(SetupError, match=r"no encoder\.rknn in .*without --skip-rknn"):
            runtime.prompt_embeddings(np.zeros((128, 400), np.float32), 50, Timings())


def test_missing_snapshot_is_a_clear_error(tmp_path):
    from rkaudio.families.audio8 import _snapshot_dir
    from rkaudio.families.audio8.model import load_snapshot
    from rkaudio.core.errors import MissingSource

    with pytest.raises(SetupError, match="no Audio8-ASR snapshot"):
        load_snapshot(tmp_path)
    with pytest.raises(MissingSource, match="no Audio8-ASR snapshot"):
        _snapshot_dir({"dir": str(tmp_path / "absent")})
