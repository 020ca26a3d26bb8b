"""The targets table (issue #26 item 4): each family's random weights stand in for a missing checkpoint
(`Family.random_source`), `recipes.build_cell` builds one (component, target) cell through the recipe's own part,
and bench/targets.py turns manifests into rows and merges a re-run cell into the committed table."""
import dataclasses
import importlib.util
import json

import numpy as np
import pytest

from rkaudio.cli.families import declaration
from rkaudio.pipeline.schema import recipe_job
from rkaudio.release import recipes
from rkaudio.core.contract import get_contract
from rkaudio.core.errors import MissingSource, SetupError
from rkaudio.core.paths import REPO_ROOT, selfcheck_path

_spec = importlib.util.spec_from_file_location("bench_targets", REPO_ROOT / "bench" / "targets.py")
bench_targets = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_targets)

HOOKED = {"audio8": "audio8_asr_0_1b", "cosyvoice3": "cosyvoice3_flow_0_5b",
          "qwen3_vocoder": "qwen3_tts_0_6b_base_speech_decoder", "inflect": "inflect_nano_v2_decoder"}
# Each export at the tests' small shape, its recipe's options cut to one engine where the recipe lists several.
# Audio8's whole small export takes 2 minutes here: its own tests export that model (--random-weights small).
SMALL_OPTIONS = {"cosyvoice3": {"lengths": [16]}, "qwen3_vocoder": {"engines": [{"role": "first", "codes_length": 16}]},
                 "inflect": {}}


def _part(package: str) -> dict:
    """The recipe's part for rk3588, the target every recipe lists."""
    return recipes.recipes_for(recipes.load_recipe(REPO_ROOT / "recipes" / f"{package}.toml", declaration), "rk3588")[0]


def test_every_family_without_a_checkpoint_in_the_venv_declares_random_weights():
    assert {name for name in HOOKED if declaration(name).random_source is not None} == set(HOOKED)
    for name in ("piper", "kokoro", "example"):  # their checkpoints (or seeds) ship in the export venv
        assert declaration(name).random_source is None


@pytest.mark.parametrize("family_name", sorted(SMALL_OPTIONS))
def test_a_small_random_source_is_exported_by_the_family_as_the_recipe_part(family_name, tmp_path):
    """The hook's source replaces the recipe's through the strict recipe job, and the family's own export of the
    recipe part reads it: every graph it writes carries the family's contract."""
    family = declaration(family_name)
    part = _part(HOOKED[family_name])
    part = {**part, "options": {**part["options"], **SMALL_OPTIONS[family_name]}}
    source = family.random_source(tmp_path / "source", "small", part)
    job = recipe_job(family, part, "rk3566", tmp_path / "out", "2.3.2", source)
    exported = family.component(part.get("component")).export(job)
    assert exported and all(get_contract(record.onnx)["component"] for record in exported)
    assert {get_contract(record.onnx)["family"] for record in exported} == {
        get_contract(exported[0].onnx)["family"]}
    with pytest.raises(SetupError, match="random_source"):  # the hook's fields are checked like a command's
        recipe_job(family, part, "rk3566", tmp_path / "out", "2.3.2", {**source, "no_such_field": 1})


def test_audio8_random_source_replaces_the_recipe_snapshot(tmp_path, monkeypatch):
    """The recipe job with the hook's source builds the random model of that shape, with the recipe's graphs
    (the model and the graphs replaced, as tests/families/audio8/test_cli.py does)."""
    import rkaudio.families.audio8 as family
    from rkaudio.families.audio8 import export

    seen = {}
    monkeypatch.setattr(family, "load_model", lambda model_dir, random_weights: seen.setdefault(
        "model", (model_dir, random_weights)))
    monkeypatch.setattr(export, "export", lambda job, model, stress: seen.update(
        buckets=job.options.kv_buckets, stress=stress) or [])
    part = _part(HOOKED["audio8"])
    source = family.FAMILY.random_source(tmp_path, "small", part)
    job = recipe_job(family.FAMILY, part, "rk3566", tmp_path, "2.3.2", source)
    family.FAMILY.component(None).export(job)
    assert seen == {"model": (None, "small"), "buckets": part["options"]["kv_buckets"], "stress": True}


def test_inflect_real_shape_is_the_size_the_package_names(tmp_path, monkeypatch):
    from rkaudio.families import inflect
    from rkaudio.families.inflect import reference

    written = []
    monkeypatch.setattr(reference, "export_official", lambda directory, config: written.append(config.name) or {
        "decode": directory / "decode.onnx", "duration": directory / "duration.onnx"})
    for package in ("inflect_micro_v2_decoder", "inflect_nano_v2_decoder"):
        inflect.FAMILY.random_source(tmp_path, "real", _part(package))
    assert written == ["Micro", "Nano"]
    with pytest.raises(SetupError, match="names none of the sizes"):
        inflect.FAMILY.random_source(tmp_path, "real", {**_part("inflect_micro_v2_decoder"), "package": "inflect_x"})


def _missing(job):
    raise MissingSource("no checkpoint on this machine")


def test_a_cell_without_its_checkpoint_builds_from_random_weights_on_rk3566(tmp_path, require_converter):
    """The example, as if its seed were a missing checkpoint: build_cell falls back to the family's random source
    and builds the recipe's own ladder for the target with the recipe's gates."""
    require_converter("2.3.2")
    example = declaration("example")
    recipe = recipes.load_recipe(REPO_ROOT / "recipes" / "example_conv.toml", declaration)
    recipe = {**recipe, "options": {**recipe["options"], "frames": [32]}}
    stand_in = dataclasses.replace(example, sources=_missing, random_source=lambda directory, shape, part: {"seed": 7})
    results, source = recipes.build_cell(recipe, "conv", "rk3566", "2.3.2", tmp_path, stand_in, "small")
    assert source == "random small-shape"
    manifest = results[0].manifest_data
    assert manifest["target"] == "rk3566" and manifest["contract"]["frames"] == 32
    assert {g["name"]: g["threshold"] for g in manifest["gates"]}["regtask_lines"] == 0  # the recipe's gate
    assert manifest["build"]["stage_peak_rss_bytes"]
    # built from the stand-in's seed, not the recipe's: the self-check input is seed 7's
    (feeds,) = np.load(selfcheck_path(results[0].rknn.with_suffix(".onnx"))).values()
    assert np.allclose(feeds, np.random.default_rng(7).standard_normal((1, 16, 32)), atol=1e-2)
    row = bench_targets.engine_row(manifest, "example")
    # the example declares no real time per call: its cost per call, and the real-time gate not judged
    assert row["unit"] == "call" and row["est_cycles_per_unit"] == manifest["est_cycles"]
    assert row["real_time_factor"] is None


def test_a_cell_without_checkpoint_or_random_weights_is_a_missing_source(tmp_path):
    example = declaration("example")
    recipe = recipes.load_recipe(REPO_ROOT / "recipes" / "example_conv.toml", declaration)
    with pytest.raises(MissingSource, match="no checkpoint on this machine"):
        recipes.build_cell(recipe, "conv", "rk3566", "2.3.2", tmp_path, dataclasses.replace(example, sources=_missing))
    with pytest.raises(SetupError, match="declares no random_source"):
        recipes.build_cell(recipe, "conv", "rk3566", "2.3.2", tmp_path, example, random_weights=True)


MANIFEST = {
    "rknn": {"path": "/x/piper_decoder_w127.rknn", "bytes": 31_000_000}, "est_cycles": 9_500_000,
    "regtask": {"lines": 0}, "ops": {"cpu": 0},
    "contract": {"family": "piper", "component": "decoder", "role": "main", "window": 127, "context": 32,
                 "emitted": 63, "hop": 256, "sample_rate": 22050, "latent_input": "z", "output": "audio"},
    "gates": [{"name": "simulator_snr[audio]", "value": 41.25}, {"name": "simulator_snr[mask]", "value": "inf"},
              {"name": "fp16_floor_gap[audio]", "value": 1.0}, {"name": "max_regtask_lines", "value": 0},
              {"name": "real_time_factor", "value": 0.1585}],
    "simulator": {"audio": {"snr_db": 41.25, "fp16_floor_snr_db": 43.04}, "mask": {"snr_db": "inf"}},
    "build": {"peak_rss_bytes": 3_000_000_000,
              "stage_peak_rss_bytes": {"build": 2_500_000_000, "simulate": 3_000_000_000, "export": 1_000}},
}


def test_an_engine_row_reads_its_figures_from_the_manifest():
    row = bench_targets.engine_row(MANIFEST, "piper")
    # per second of audio: 63 emitted frames x 256 samples / 22050 Hz per call
    assert row == {"engine": "piper_decoder_w127", "engine_bytes": 31_000_000,
                   "est_cycles_per_unit": round(9_500_000 * 22050 / (63 * 256)), "unit": "s of audio",
                   "real_time_factor": 0.1585, "regtask_lines": 0, "cpu_ops": 0, "simulator_db": 41.2,
                   "fp16_floor_db": 43.0, "peak_rss_bytes": 3_000_000_000, "peak_stage": "simulate",
                   "stage_peak_rss_bytes": MANIFEST["build"]["stage_peak_rss_bytes"]}
    no_floor = {**MANIFEST, "simulator": {"audio": {"snr_db": 41.25}}}
    assert bench_targets.engine_row(no_floor, "piper")["fp16_floor_db"] is None


COSYVOICE3 = json.loads((REPO_ROOT / "tests" / "core" / "data" / "cosyvoice3_flow_s24_p2of2.manifest.json")
                        .read_text())["contract"]
AUDIO8 = {"family": "audio8", "sample_rate": 16000, "mel_bins": 128, "n_fft": 400, "hop": 160, "max_frames": 800,
          "chunk_frames": 100, "audio_tokens": 104, "max_placeholders": 100, "prompt_length": 110,
          "kv_buckets": [128, 256, 512], "head_shards": 2, "layers": 2, "heads": 4, "head_dim": 16, "hidden": 64,
          "vocab": 160, "rope_theta": 1e6, "mask_value": -1e4, "kv_layout": "heads,Smax,head_dim",
          "prompt": {"prefix_ids": [1], "audio_token_id": 5, "suffix_ids": [6], "eos_token_id": 159}}
KOKORO = {"family": "kokoro", "component": "generator", "window": 136, "context": 28, "emitted": 80, "hop": 60,
          "latent_input": "x", "output": "spec_phase", "inputs": ["x", "har", "style", "mask_coarse", "mask_fine"],
          "coarse_length": 1360, "fine_length": 8161, "sample_rate": 24000, "n_fft": 20, "istft_hop": 5,
          "sine_form": "round", "snake_fold": True, "source": "x", "exec_params": {"overlap": 0}}


@pytest.mark.parametrize("family, contract, unit, seconds", [
    # one of 20 calls (10 ODE steps x 2 CFG calls at B=1) over the rung's 24 mel frames at 50 Hz
    ("cosyvoice3", COSYVOICE3, "s of generated mel", 24 / 50 / 20),
    ("cosyvoice3", {**COSYVOICE3, "batch": 2}, "s of generated mel", 24 / 50 / 10),
    ("audio8", {**AUDIO8, "component": "decoder", "role": "step_256"}, "s of input audio", 1 / 5),
    ("audio8", {**AUDIO8, "component": "decoder", "role": "head"}, "s of input audio", 1 / 5),
    ("audio8", {**AUDIO8, "component": "encoder", "role": "main"}, "s of input audio", 8.0),
    ("qwen3_vocoder", {"family": "qwen3-vocoder", "role": "main", "frames": 64}, "s of audio", 64 / 12.5),
    ("qwen3_vocoder", {"family": "qwen3-vocoder", "role": "window", "window": 56, "context": 8, "emitted": 48},
     "s of audio", 48 / 12.5),
    ("piper", {"family": "piper", "component": "duration_encoder", "frames": 128}, "s of speech", 128 / 39.5),
    ("piper", MANIFEST["contract"], "s of audio", 63 * 256 / 22050),
    ("kokoro", KOKORO, "s of audio", 80 * 60 * 5 / 24000),
    ("kokoro", {**KOKORO, "exec_params": {"overlap": 8}}, "s of audio", 72 * 60 * 5 / 24000)])
def test_the_real_time_per_call_of_each_family(family, contract, unit, seconds):
    """bench/targets.py and the real-time gate read the family's own declaration (`Family.real_time`)."""
    calls, named = bench_targets.work_unit(family, contract)
    assert named == unit and calls == pytest.approx(1 / seconds)


def _row(package, component, target, status, commit):
    return {column: None for column in bench_targets.COLUMNS} | {
        "package": package, "component": component, "target": target, "status": status, "commit": commit}


def test_a_rerun_cell_replaces_its_rows_and_keeps_every_other_as_measured():
    order = [("p", "decoder", "rk3588"), ("p", "decoder", "rk3566"), ("q", "main", "rk3588")]
    old = [_row("p", "decoder", "rk3588", "ok", "old"), _row("p", "decoder", "rk3566", "FAILED: x", "old"),
           _row("q", "main", "rk3588", "ok", "old")]
    new = [_row("p", "decoder", "rk3566", "ok", "new"), _row("p", "decoder", "rk3566", "ok", "new")]
    merged = bench_targets.merge(old, new, order)
    assert [(r["target"], r["status"], r["commit"]) for r in merged] == [
        ("rk3588", "ok", "old"), ("rk3566", "ok", "new"), ("rk3566", "ok", "new"), ("rk3588", "ok", "old")]
    # a cell no run has measured yet still has its row
    merged = bench_targets.merge(old[:1], [], order)
    assert [(r["package"], r["target"], r["status"]) for r in merged] == [
        ("p", "rk3588", "ok"), ("p", "rk3566", "not measured"), ("q", "rk3588", "not measured")]


def test_a_cell_the_recipe_leaves_out_says_why():
    recipe = {"targets": ["rk3588", "rk3566"], "refused": {"rk3576": "too slow on the board"},
              "components": {"decoder": {"targets": ["rk3588", "rk3566"]},
                             "duration_encoder": {"targets": ["rk3588"], "refused": {"rk3566": "drift"}}}}
    assert bench_targets.not_built(recipe, "decoder", "rk3566") is None
    assert bench_targets.not_built(recipe, "duration_encoder", "rk3566") == "refused: drift"
    assert bench_targets.not_built(recipe, "decoder", "rk3576") == "refused: too slow on the board"
    assert bench_targets.not_built({**recipe, "refused": {}}, "decoder", "rk3576") == "not in recipe"


def test_cells_select_by_package_component_and_target_patterns():
    recipe = {"package": "piper_joe_medium", "family": "piper", "components": {"decoder": {}, "duration_encoder": {}}}
    chosen = bench_targets.cells([recipe], declaration, ("rk3588", "rk3576", "rk3566"),
                                 ["piper_joe_medium.decoder", "piper_joe_medium:rk3566", "kokoro*:rk3588"])
    assert [(c, t) for _, c, t in chosen] == [("decoder", "rk3588"), ("decoder", "rk3576"), ("decoder", "rk3566"),
                                              ("duration_encoder", "rk3566")]
