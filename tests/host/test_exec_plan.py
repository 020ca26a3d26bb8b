"""The consumer's exec_plan rules (rkaudio/host/exec_plan.py): the spec's own examples pass, every refusal the spec
lists is named, and packaging and `convert verify` apply them."""
import json

import pytest

from rkaudio.host.exec_plan import OPTIONS, plan_problems

# The session options of the spec's "Run" section, verbatim.
SPEC_EXAMPLES = [
    {"qwen3_tts.exec_plan": {"speech_decoder": {"impl": "rknn", "artifacts": {
        "main": "/root/tts-rknn/vocoder/vocoder_stateful_64b_fp16.rknn",
        "first": "/root/tts-rknn/vocoder/vocoder_stateful_16_fp16.rknn"}}}},
    {"piper_tts.exec_plan": {"decoder": {"impl": "rknn", "artifacts": {"main": "/root/tts-rknn/piper-lessac-w93.rknn"}}}},
    {"piper_tts.exec_plan": {"duration_encoder": {"backend": "cpu"}, "duration_flows": {"backend": "cpu"}}},
    {"piper_tts.exec_plan": {
        "decoder": {"impl": "rknn", "artifacts": {"main": "/root/tts-rknn/piper-lessac-w93.rknn"}},
        "duration_encoder": {"impl": "rknn", "artifacts": {
            "main": "/root/tts-rknn/enc/encoder_n128.rknn,/root/tts-rknn/enc/encoder_n192.rknn"}}}},
    {"kokoro_tts.exec_plan": {"generator": {"impl": "rknn", "artifacts": {"main": "/root/tts-rknn/gen_w128.rknn"},
                                            "params": {"overlap": 0, "gain": False}}}},
    {"inflect_v2.exec_plan": {"decoder": {"impl": "rknn", "artifacts": {
        "main": "/root/tts-rknn/inflect-v2-micro-decoder-rk3588.rknn"}}}},
    {},  # omitting every component retains their selection
    {"kokoro_tts.exec_plan": {"generator": {}}, "sanotts.exec_plan": {"decoder": {"impl": "neon"}}},
]


@pytest.mark.parametrize("plan", SPEC_EXAMPLES, ids=range(len(SPEC_EXAMPLES)))
def test_the_spec_examples_pass(plan):
    assert plan_problems(plan) == []


def _kokoro(**entry):
    return {"kokoro_tts.exec_plan": {"generator": {"impl": "rknn", "artifacts": {"main": "g.rknn"}, **entry}}}


REFUSED = {
    "unknown option": ({"kokoro.exec_plan": {}}, "unknown option 'kokoro.exec_plan'"),
    "unknown component": ({"piper_tts.exec_plan": {"vocoder": {}}}, "unknown component 'vocoder'"),
    "unknown field": (_kokoro(engine="g.rknn"), "unknown field 'engine'"),
    "unknown impl": ({"inflect_v2.exec_plan": {"decoder": {"impl": "neon"}}}, "impl 'neon' is not one of ggml, rknn"),
    "unknown role": (_kokoro(artifacts={"main": "g.rknn", "first": "f.rknn"}), "unknown artifact role 'first'"),
    "missing role": ({"qwen3_tts.exec_plan": {"speech_decoder": {"impl": "rknn", "artifacts": {"first": "f.rknn"}}}},
                     "required artifact role 'main' is missing"),
    "no artifacts": ({"cosyvoice3.exec_plan": {"flow": {"impl": "rknn"}}}, "impl rknn needs `artifacts`"),
    "ladder where one engine": ({"piper_tts.exec_plan": {"decoder": {"impl": "rknn", "artifacts": {"main": "a.rknn,b.rknn"}}}},
                                "takes one engine, not a ladder of 2"),
    "unknown param": (_kokoro(params={"overlap": 0, "window": 3}), "unsupported param 'window'"),
    "bad param value": (_kokoro(params={"overlap": -1}), "param 'overlap' = -1 is not valid"),
    "params elsewhere": ({"inflect_v2.exec_plan": {"decoder": {"impl": "rknn", "artifacts": {"main": "d.rknn"},
                                                               "params": {"overlap": 0}}}}, "it takes none"),
    "artifacts without rknn": ({"piper_tts.exec_plan": {"decoder": {"impl": "ggml", "artifacts": {"main": "d.rknn"}}}},
                               "`artifacts` is for impl rknn only"),
    "backend with rknn": (_kokoro(backend="cpu"), "omit `backend`"),
    "audio8 without steps": ({"audio8_asr.exec_plan": {"decoder": {"impl": "rknn", "artifacts": {
        "head": "h0.rknn"}}}}, "required artifact role 'step_<n>' is missing"),
    "audio8 step ladder": ({"audio8_asr.exec_plan": {"decoder": {"impl": "rknn", "artifacts": {
        "step_128": "s0.rknn,s1.rknn", "head": "h0.rknn"}}}}, "takes one engine, not a ladder of 2"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_each_refusal_is_named(case):
    plan, message = REFUSED[case]
    problems = plan_problems(plan)
    assert len(problems) == 1 and message in problems[0], problems


def test_the_table_holds_the_spec_rows_and_rkaudio_own_options():
    assert {(option, component) for option, components in OPTIONS.items() for component in components} >= {
        ("piper_tts.exec_plan", "decoder"), ("piper_tts.exec_plan", "duration_encoder"),
        ("piper_tts.exec_plan", "duration_flows"), ("kokoro_tts.exec_plan", "generator"),
        ("qwen3_tts.exec_plan", "speech_decoder"), ("sanotts.exec_plan", "decoder"),
        ("inflect_v2.exec_plan", "decoder"), ("cosyvoice3.exec_plan", "flow"),
        ("audio8_asr.exec_plan", "decoder"), ("example.exec_plan", "conv")}
    audio8 = {"audio8_asr.exec_plan": {
        "encoder": {"impl": "rknn", "artifacts": {"main": "encoder.rknn"}},
        "adapter": {"impl": "rknn", "artifacts": {"main": "adapter.rknn"}},
        "prefill": {"impl": "rknn", "artifacts": {"main": "prefill.rknn"}},
        "decoder": {"impl": "rknn", "artifacts": {"step_128": "step_s128.rknn", "step_256": "step_s256.rknn",
                                                  "head": "head_0.rknn,head_1.rknn"}}}}
    assert plan_problems(audio8) == []


def test_packaging_refuses_a_contract_the_consumer_would_refuse(tmp_path):
    from types import SimpleNamespace

    from rkaudio.release.package import assemble
    from rkaudio.core.errors import PackageError

    for suffix in (".onnx", ".rknn", ".manifest.json", ".build.log"):
        (tmp_path / f"gen{suffix}").write_text("x")
    contract = {"exec_plan_option": "kokoro_tts.exec_plan", "component": "generator", "role": "window"}
    result = SimpleNamespace(rknn=tmp_path / "gen.rknn", manifest=tmp_path / "gen.manifest.json",
                             build_log=tmp_path / "gen.build.log",
                             manifest_data={"contract": contract, "onnx": {"path": "gen.onnx"}})
    (tmp_path / "pkg").mkdir()
    with pytest.raises(PackageError, match="consumer's rules.*unknown artifact role 'window'"):
        assemble([result], tmp_path / "pkg")
    assert not (tmp_path / "pkg" / "exec_plan.json").exists()


def test_verify_names_a_plan_the_consumer_would_refuse(tmp_path):
    from rkaudio.release import kit

    package = tmp_path / "pkg"
    package.mkdir()
    (package / "exec_plan.json").write_text(json.dumps({"piper_tts.exec_plan": {"decoder": {"impl": "rknn"}}}))
    kit.write_sums(package)
    assert kit.verify(package) == ["exec_plan.json: piper_tts.exec_plan component 'decoder': impl rknn needs "
                                   "`artifacts`, an object of role -> file(s)"]
