"""The family's end-to-end golden for the board self-test kit: the probe clip through `rkaudio.board.audio8:
golden_loop` over the kit's engines gives the same tokens as the existing runtime path (the plan directory on
onnxruntime), decodes exactly 5 tokens with a fixed number of engine calls whatever the engines return, and
names exactly the engines it calls."""
from __future__ import annotations

import ast
import shutil
from collections import Counter

import numpy as np
import pytest

from rkaudio.engine import goldens
from rkaudio.release import kit
from rkaudio.families.audio8 import checks, graphs_job
from rkaudio.families.audio8.export import E2E_LOOP, E2E_NAME, E2E_TOKENS, EMBED_FILE, export
from rkaudio.core.contract import contract_of
from rkaudio.core.errors import SetupError
from rkaudio.core.paths import REPO_ROOT, engine_name
from rkaudio.board.golden import as_stored
from rkaudio.board.audio8 import Audio8Runtime, EmbeddingRows
from rkaudio.board.mel import log_mel

SHARDS = 2  # the small model; head_shards=2 below


@pytest.fixture(scope="module")
def exported(small_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("audio8_e2e")
    return out, export(graphs_job(out, [128, 256], head_shards=SHARDS), small_model, stress=False,
                       say=lambda _: None, clips=[1.9])


@pytest.fixture(scope="module")
def recording(exported):
    recordings = goldens.record_end_to_end(exported[1], say=lambda _: None)
    assert len(recordings) == 1
    return recordings[0]


def _runtime_path(plan_dir, calls=None):
    """The existing runtime path: the plan directory on onnxruntime, the probe clip (as the kit stores it: the
    loop's inputs go through fp16 where that keeps 70 dB), 5 tokens, EOS ignored; each call into `calls`."""
    from rkaudio.host.backends import OnnxBackend

    class Logged(OnnxBackend):
        def __init__(self, path):
            super().__init__(path)
            self.name = engine_name(path)

        def run(self, feeds):
            outputs = super().run(feeds)
            calls.append((self.name, {k: np.array(v) for k, v in feeds.items()}, outputs))  # K/V change later
            return outputs

    audio = as_stored(checks.probe_audio(25))
    with Audio8Runtime(plan_dir, backend_for=Logged if calls is not None else OnnxBackend) as runtime:
        return runtime.transcribe(log_mel(audio, 128), audio.size, E2E_TOKENS, ignore_eos=True, keep_logits=True)


def test_loop_gives_the_runtime_paths_tokens_and_margins(exported, recording, tmp_path):
    out, _ = exported
    decoded = _runtime_path(out)
    tokens, margins = recording.outputs["tokens"], recording.outputs["tokens.margin"]
    assert tokens.dtype.kind == "i" and tokens.tolist() == decoded.tokens and len(decoded.tokens) == 5
    top = np.sort(np.stack(decoded.step_logits), axis=-1)
    assert margins.dtype == np.float32 and margins.shape == (5,)
    # the golden's embedding rows are stored in fp16 (>= 70 dB), the plan's table is fp32: margins agree closely
    np.testing.assert_allclose(margins, top[:, -1] - top[:, -2], rtol=0.2, atol=0.05)
    assert decoded.timings.decode_steps == 4 and decoded.buckets == [128]  # token 1 comes from the prefill
    # ... and exactly, call by call, once the plan's table holds the golden's stored rows
    plan = tmp_path / "plan"
    shutil.copytree(out, plan)
    table = np.load(plan / EMBED_FILE)
    table[recording.inputs["embed_ids"]] = recording.inputs["embed_rows"]
    np.save(plan / EMBED_FILE, table)
    calls = []
    decoded = _runtime_path(plan, calls)
    top = np.sort(np.stack(decoded.step_logits), axis=-1)
    assert decoded.tokens == tokens.tolist()
    np.testing.assert_array_equal(margins, top[:, -1] - top[:, -2])
    assert [c[0] for c in calls] == [c[0] for c in recording.calls]
    for (_, feeds, outputs), (_, want_feeds, want_outputs) in zip(calls, recording.calls):
        assert feeds.keys() == want_feeds.keys() and outputs.keys() == want_outputs.keys()
        assert all(np.array_equal(feeds[k], want_feeds[k]) for k in feeds)
        assert all(np.array_equal(outputs[k], want_outputs[k]) for k in outputs)


def test_calls_are_the_probes_and_the_golden_lists_exactly_the_called_engines(exported, recording):
    out, records = exported
    names = [name for name, _, _ in recording.calls]
    per_step = ["step_s128.rknn"] + [f"head_{shard}.rknn" for shard in range(SHARDS)]  # every layer in one call
    heads = [f"head_{shard}.rknn" for shard in range(SHARDS)]  # the prefill's first token: the head shards too
    assert names == ["encoder.rknn", "adapter.rknn", "prefill.rknn"] + heads + per_step * (E2E_TOKENS - 1)
    assert len(names) == 3 + SHARDS + (E2E_TOKENS - 1) * (1 + SHARDS) == 17
    spec = recording.spec
    assert spec["name"] == E2E_NAME and spec["loop"] == E2E_LOOP and spec["params"]["tokens"] == E2E_TOKENS
    assert sorted(spec["engines"]) == sorted(set(names))  # called = listed: no other bucket
    declared = [r for r in records if r.end_to_end is not None]
    assert sorted(engine_name(r.onnx) for r in declared) == sorted(spec["engines"]) and len(records) == 3 + 2 + SHARDS  # two buckets
    # the encoder sees the clip's log-mel, zero-padded to the fixed frame count, as the runtime feeds it
    features = log_mel(recording.inputs["audio"], 128)
    chunks = recording.calls[0][1]["mel_chunks"]  # [chunks, 1, mel, chunk_frames]
    encoder_feeds = chunks[:, 0].transpose(1, 0, 2).reshape(128, -1)  # back to [mel, frames]
    np.testing.assert_array_equal(encoder_feeds[:, : features.shape[1]], features)
    assert not encoder_feeds[:, features.shape[1]:].any()


def test_tie_margin_is_the_margin_gate_threshold_and_the_kit_gate_uses_it(exported, recording):
    from rkaudio.board.selftest import SelfTest

    decoded = _runtime_path(exported[0])
    tie = recording.spec["params"]["tie_margin"]
    assert tie == max(checks.fp16_resolution(np.max(logits)) for logits in decoded.step_logits)
    expected = recording.outputs
    entry = {"params": recording.spec["params"]}
    assert SelfTest.e2e_row(None, entry, "tokens", expected, expected)["passed"]
    margins = expected["tokens.margin"]
    step = int(np.argmin(margins))
    changed = expected["tokens"].copy()
    changed[step:] += 1
    # the small model's margins are far above fp16 resolution, so a different token there is a real error ...
    assert margins[step] > tie and not SelfTest.e2e_row(None, entry, "tokens", expected, {"tokens": changed})["passed"]
    # ... and the same difference where fp32 had a tie passes
    tied = dict(expected, **{"tokens.margin": np.where(np.arange(5) == step, tie / 2, margins).astype(np.float32)})
    assert SelfTest.e2e_row(None, entry, "tokens", tied, {"tokens": changed})["passed"]


def test_the_same_calls_whatever_the_engines_return(exported, recording):
    """Engines that return noise: other tokens (their embedding rows are not in the golden: zeros), same calls."""
    from rkaudio.host.backends import OnnxBackend
    from rkaudio.board.golden import CallLog, EnginePool, run_loop

    out, records = exported
    by_name = {engine_name(r.onnx): r.onnx for r in records}
    rng = np.random.default_rng(1)

    class Noisy:
        def __init__(self, path):
            self.inner = OnnxBackend(path)
            self.input_names, self.output_names = self.inner.input_names, self.inner.output_names
            self.input_dtypes = self.inner.input_dtypes

        def run(self, feeds):
            return {k: (10 * rng.standard_normal(v.shape)).astype(v.dtype) for k, v in self.inner.run(feeds).items()}

        def close(self):
            pass

    log = CallLog()
    entries = [(name, contract_of(by_name[name])) for name in recording.spec["engines"]]
    with EnginePool(entries, lambda name: Noisy(by_name[name]), None, log) as pool:
        outputs = run_loop(E2E_LOOP, pool.engines, recording.inputs, recording.spec["params"])
    assert [c[0] for c in log.calls] == [c[0] for c in recording.calls]
    assert outputs["tokens"].shape == (5,) and outputs["tokens"].tolist() != recording.outputs["tokens"].tolist()


def test_embedding_rows_index_like_the_table():
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    rows = EmbeddingRows([2, 7, 3], table[[2, 7, 3]])
    np.testing.assert_array_equal(rows[np.array([3, 2, 7])], table[[3, 2, 7]])
    np.testing.assert_array_equal(rows[7], table[7])
    assert rows[7].shape == (4,) and not rows[5].any()  # a token outside the golden's rows reads zeros


def test_the_loop_ships_on_numpy_alone_in_python_3_8_syntax():
    modules = kit.kit_modules()  # the shipped folder, rkaudio/board/ (closed: tests/structure checks)
    assert {E2E_LOOP.partition(":")[0], "rkaudio.board.audio8", "rkaudio.board.mel", "rkaudio.board.dsp"} <= set(modules)
    for module in ("rkaudio.board.audio8", "rkaudio.board.mel", "rkaudio.board.dsp"):
        ast.parse(REPO_ROOT.joinpath(*module.split(".")).with_suffix(".py").read_text(), feature_version=(3, 8))


def test_export_names_the_golden_for_an_onnx_rebuild(exported, recording):
    """`--onnx` reads the records back: the golden's graphs name its spec, the others none."""
    from rkaudio.pipeline.pipeline import Exported

    out, records = exported
    for record in records:
        assert Exported.from_onnx(record.onnx, "audio8") == record
    inputs = dict(np.load(out / f"{E2E_NAME}.e2e.npz"))
    assert set(inputs) == {"audio", "embed_ids", "embed_rows"} and inputs["audio"].size == 25 * 8 * 160
    assert set(Counter(inputs["embed_ids"].tolist()).values()) == {1}


def test_the_recipe_build_declares_the_golden(small_model, tmp_path, monkeypatch):
    """`make engines` builds through the declaration's recipe adapter: the records it hands to the pipeline's
    build name the golden; an undeclared option is refused before anything is exported."""
    import rkaudio.families.audio8 as family
    from rkaudio.pipeline import pipeline
    from rkaudio.families.audio8 import model as M
    from rkaudio.release.recipes import build_part

    handed = {}
    monkeypatch.setattr(family, "_snapshot_dir", lambda source: tmp_path)
    monkeypatch.setattr(M, "load_snapshot", lambda path: small_model)
    monkeypatch.setattr(pipeline, "build", lambda exported, out_dir, options, **kw:
                        handed.update(records=exported, context=kw["context"], advice=kw["advice"]) or [])
    recipe = {"package": "audio8_test", "path": "recipes/audio8_test.toml", "family": "audio8", "source": {},
              "options": {"kv_buckets": [128], "head_shards": SHARDS}, "gates": {}}
    assert build_part(family.FAMILY, recipe, "rk3588", "2.3.2", tmp_path / "work") == []  # nothing compiled
    records = handed["records"]
    declared = [r for r in records if r.end_to_end is not None]
    assert declared and declared[0].end_to_end.name == f"{E2E_NAME}.e2e.json"
    assert len(declared) == len(records) == 3 + 1 + SHARDS  # one bucket: every graph runs
    assert (handed["context"], handed["advice"]) == ("audio8_test", checks.ADVICE)
    # the per-N adapters' option: not declared, so refused by the recipe schema (closest key suggested)
    with pytest.raises(SetupError, match="options.adapter_tokens: unknown"):
        build_part(family.FAMILY, dict(recipe, options={"adapter_tokens": [25], "kv_buckets": [128]}), "rk3588",
                   "2.3.2", tmp_path / "work2")
    assert not (tmp_path / "work2").exists()
