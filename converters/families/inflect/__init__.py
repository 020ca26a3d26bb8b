"""`convert inflect`: the Inflect v2 (Micro/Nano) decoder engine, sliced from the official decode.onnx.

The slice runs from the pre-flow latent z [1,C,W] and its mask y_mask [1,1,W] through the reverse
flow and HiFi-GAN to the waveform, masked in the decoder half (default), folded at the window, and
gated by a windowed decode against a full-length decode.onnx decode. `convert check inflect` renders
tokens end to end: duration.onnx -> noise head -> windowed engine -> WAV."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from converters.options import FailOnCpuOps, FromOnnx, MaxRegtaskLines, OutDir, SkipRknn, Target, Toolkit
from toolkit.versions import DEFAULT_TOOLKIT
from core.errors import SetupError

# The bars (fp32, onnxruntime): a short latent's tail with the decoder-half mask, and interior windows.
MIN_TAIL_DB = 90.0
MIN_INTERIOR_DB = 120.0
TAIL_LENGTHS = (30, 47, 91, 210)
INTERIOR_LENGTH = 480  # slices, as the spec measured: first, one interior and a last window at 256/32
WINDOW, CONTEXT = 256, 32

DecodeOnnx = Annotated[Optional[Path], typer.Option(
    "--decode-onnx", help="The official onnx/decode.onnx (noise head + reverse flow + HiFi-GAN). Needed to export; "
    "with --onnx it is the full-length reference of the self-check (without it the check degrades).")]
DurationOnnx = Annotated[Optional[Path], typer.Option(
    "--duration-onnx", help="The official onnx/duration.onnx: checked against the decoder's latent width, and "
    "its prior samples feed the self-check (white-noise latents without it).")]
Window = Annotated[int, typer.Option("--window", help="Latent slices the engine is compiled for.")]
Context = Annotated[int, typer.Option("--context", help="Real context slices on each side of a window's emitted "
                                      "slices (emitted = window - 2*context).")]
DecMask = Annotated[bool, typer.Option("--dec-mask/--no-dec-mask", help="Mask after every decoder conv so a short "
                                       "latent's zero padding stays zero (default on: this decoder is unmasked).")]
MinTail = Annotated[float, typer.Option("--min-tail-db", help="Gate: short latents (30/47/91/210 slices) "
                                        "against a full-length decode, with the decoder-half mask.")]
MinInterior = Annotated[float, typer.Option("--min-interior-db", help="Gate: interior windows of a 480-slice "
                                            "latent against a full-length decode.")]
MinSnr = Annotated[float, typer.Option("--min-snr-db", help="Gate: the simulator's output against onnxruntime fp32.")]


def selfcheck_path(onnx_path: Path) -> Path:
    return Path(onnx_path).with_suffix(".selfcheck.npz")


def _sessions(decode_path: Path | None, duration_path: Path | None):
    import onnxruntime as ort

    def session(path):
        return None if path is None else ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    return session(decode_path), session(duration_path)


def _latent(duration_session, channels: int, slices: int, seed: int):
    """The model's own prior sample when duration.onnx is at hand, else a white-noise latent."""
    import numpy as np

    from converters.families.inflect.decoder import prior_latent

    if duration_session is not None:
        return prior_latent(duration_session, slices, seed=seed)
    return np.random.default_rng(seed).standard_normal((1, channels, slices)).astype(np.float32)


def selfcheck_verdicts(onnx_path: Path, decode_path: Path | None, duration_path: Path | None,
                       min_tail_db: float = MIN_TAIL_DB, min_interior_db: float = MIN_INTERIOR_DB,
                       say=print) -> list:
    """Windowed decode through the fixed-window slice against a full-length decode.onnx decode.

    Tails are gated only with the decoder-half mask (without it their deficit is the documented
    trade and is only reported). Without decode.onnx the check degrades, and says so."""
    import numpy as np

    from converters.families.inflect import decoder as D
    from gates.snr import snr_db
    from gates.verdict import at_least
    from runtime.backends import OnnxBackend
    from runtime.window_walk import WindowContract
    from core.contract import get_contract

    contract = get_contract(onnx_path)
    walk = WindowContract.from_contract(contract)
    channels = walk.latent_channels
    decode_channels = D.load_decode(decode_path)[1] if decode_path is not None else channels
    if decode_channels != channels:
        raise SetupError(f"{decode_path} takes latents of {decode_channels} channels but the slice "
                         f"{Path(onnx_path).name} was cut for {channels}: give the decode.onnx it was made from")
    if duration_path is not None:
        D.check_duration(duration_path, channels)
    backend = OnnxBackend(onnx_path)
    decode, duration = _sessions(decode_path, duration_path)
    if decode is None:
        say("note: no decode.onnx given, so there is no full-length reference: the self-check degrades to one "
            "window-length latent decoded against itself (seams and tails are not checked)")
        latent = _latent(duration, channels, walk.window, seed=1)
        direct = backend.run({walk.latent_input: latent,
                              walk.mask_input: np.ones((1, 1, walk.window), np.float32)})[walk.output]
        walked = D.windowed_decode(backend, latent, walk.window, walk.context, walk.hop).output
        return [at_least("window_self_snr", snr_db(direct, walked), min_interior_db, "dB",
                         "one window-length latent, walk vs direct run (degraded: no decode.onnx)")]
    verdicts = []
    tails = D.tail_figures(backend, decode, {n: _latent(duration, channels, n, seed=n) for n in TAIL_LENGTHS},
                           walk.window, walk.context, walk.hop)
    for n, snr in tails.items():
        if contract.get("dec_mask"):
            verdicts.append(at_least(f"tail_snr[{n}]", snr, min_tail_db, "dB",
                                     f"{n}-slice latent vs full-length decode.onnx"))
        else:
            say(f"note: tail {n} slices: {snr:.1f} dB vs full-length decode (--no-dec-mask: not gated)")
    # Long enough for at least one interior window at any context.
    length = max(INTERIOR_LENGTH, 2 * (walk.window - walk.context) + 1)
    interior = D.interior_figures(backend, decode, _latent(duration, channels, length, seed=INTERIOR_LENGTH),
                                  walk.window, walk.context, walk.hop)
    verdicts.append(at_least("interior_snr_min", min(interior.values()), min_interior_db, "dB",
                             f"{len(interior)} interior window(s) of a {length}-slice latent"))
    return verdicts


def export(decode_path: Path, duration_path: Path | None, out_dir: Path, window: int = WINDOW,
           context: int = CONTEXT, dec_mask: bool = True, target: str | None = None, say=print):
    """Write the fixed-window slice `inflect_v2_decoder_c<C>_w<W>.onnx` and its self-check npz;
    returns (onnx path, export verdicts: problem-op scan of the folded graph)."""
    import numpy as np
    import onnx

    from converters.families.inflect import decoder as D
    from gates import opscan
    from core.contract import get_contract

    model, info = D.describe(decode_path, duration_path)
    sliced = D.slice_decoder(model, info, window, context, dec_mask)
    contract = get_contract(sliced)
    say(f"decode.onnx {len(model.graph.node)} nodes; slice {contract['nodes_before_fold']} nodes -> "
        f"{contract['nodes_after_fold']} after the fold at window {window} (C={info.channels}, hop {info.hop}, "
        f"decoder-half mask {'on' if dec_mask else 'off'})")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx_path = out_dir / f"inflect_v2_decoder_c{info.channels}_w{window}.onnx"
    onnx.save(sliced, str(onnx_path))
    _, duration = _sessions(None, duration_path)
    np.savez(selfcheck_path(onnx_path), **{D.LATENT_INPUT: _latent(duration, info.channels, window, seed=window),
                                          D.MASK_INPUT: np.ones((1, 1, window), np.float32)})
    say(f"wrote {onnx_path} and {selfcheck_path(onnx_path)}")
    problems = opscan.scan(sliced, target)
    opscan.warn(problems)
    return onnx_path, [opscan.verdict(problems)]


def _gate_and_build(onnx_path: Path, out_dir: Path, verdicts: list, options, skip_rknn: bool, say=print):
    from converters.engine import build_engine
    from gates.verdict import require

    for verdict in verdicts:
        say(verdict.line())
    require(verdicts, advice="see the failing figures above; a shorter tail gate means the decoder-half mask "
            "is missing, a weak interior means too little context", context=onnx_path.name)
    if skip_rknn:
        return None
    result = build_engine(onnx_path, out_dir, options, selfcheck=selfcheck_path(onnx_path), export_verdicts=verdicts)
    for verdict in result.verdicts[len(verdicts):]:
        say(verdict.line())
    say(f"wrote {result.rknn} and {result.manifest}")
    return result


def convert_inflect(
    decode_onnx: DecodeOnnx = None,
    duration_onnx: DurationOnnx = None,
    target: Target = "rk3588",
    toolkit: Toolkit = DEFAULT_TOOLKIT,
    out: OutDir = Path("work/inflect"),
    window: Window = WINDOW,
    context: Context = CONTEXT,
    dec_mask: DecMask = True,
    skip_rknn: SkipRknn = False,
    from_onnx: FromOnnx = None,
    max_regtask_lines: MaxRegtaskLines = 100_000,
    fail_on_cpu_ops: FailOnCpuOps = False,
    min_tail_db: MinTail = MIN_TAIL_DB,
    min_interior_db: MinInterior = MIN_INTERIOR_DB,
    min_snr_db: MinSnr = 35.0,
) -> None:
    """Slice the official Inflect v2 decode.onnx at the pre-flow latent, fold it at a fixed window, gate the
    windowed decode against a full-length one, and compile it (the engine has no noise input)."""
    from converters.engine import BuildOptions
    from toolkit.versions import check_target

    check_target(target)
    if from_onnx is None:
        if decode_onnx is None:
            raise SetupError("give --decode-onnx (the official onnx/decode.onnx) to export, or --onnx with a slice "
                             "written earlier by `convert inflect --skip-rknn`")
        onnx_path, verdicts = export(decode_onnx, duration_onnx, out, window, context, dec_mask, target)
    else:
        onnx_path, verdicts = Path(from_onnx), []
        if not selfcheck_path(onnx_path).is_file():
            raise SetupError(f"no self-check {selfcheck_path(onnx_path)} beside {onnx_path}; "
                             "export it with `convert inflect --skip-rknn` first")
    verdicts += selfcheck_verdicts(onnx_path, decode_onnx, duration_onnx, min_tail_db, min_interior_db)
    options = BuildOptions(target=target, toolkit=toolkit, max_regtask_lines=max_regtask_lines,
                           fail_on_cpu_ops=fail_on_cpu_ops, min_simulator_snr_db=min_snr_db)
    _gate_and_build(onnx_path, out, verdicts, options, skip_rknn)


def check_inflect(
    duration_onnx: Annotated[Path, typer.Option("--duration-onnx", help="The official onnx/duration.onnx.")],
    engine: Annotated[Path, typer.Option("--engine", help="The decoder: a slice .onnx (run in onnxruntime) or a "
                                         ".rknn with its manifest beside it (run with rknn-toolkit-lite2 on a board).")],
    tokens: Annotated[str, typer.Option("--tokens", help="Comma-separated blank-interleaved token ids (178 symbols).")],
    out: Annotated[Path, typer.Option("--out", help="WAV to write.")] = Path("inflect.wav"),
    config: Annotated[Optional[Path], typer.Option("--config", help="The model's config.json (hop, sample rate); "
                                                   "default: beside the onnx/ folder of --duration-onnx.")] = None,
    decode_onnx: DecodeOnnx = None,
    # 0.667 is decoder.DEFAULT_VARIATION, spelled out so that `--help` does not import numpy.
    variation: Annotated[float, typer.Option("--variation", help="Scale of the prior noise the runtime draws "
                                             "(decode.onnx's noise_scale; 0 = the prior mean).")] = 0.667,
    length_scale: Annotated[float, typer.Option("--length-scale", help="Duration scale (larger = slower).")] = 1.0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the prior noise.")] = 0,
) -> None:
    """Render tokens end to end: duration.onnx -> noise head (CPU) -> windowed decoder engine -> WAV. With
    --decode-onnx, also the full-length decode of the same latent and the SNR between the two."""
    from converters.families.inflect.decoder import config_beside
    from converters.families.inflect.synth import InflectSynth, load_engine, runtime_model
    from runtime.audio import write_wav

    try:
        ids = [int(t) for t in tokens.replace(" ", "").split(",") if t]
    except ValueError:
        ids = []
    if not ids:
        raise SetupError(f"--tokens {tokens!r}: give comma-separated integer token ids, e.g. 0,12,0,40,0")
    model = runtime_model(duration_onnx, config or config_beside(duration_onnx))
    backend, contract = load_engine(engine)
    synth = InflectSynth(duration_onnx, backend, contract, model, engine.name)
    latent = synth.latent(ids, variation, length_scale, seed)
    waveform = synth.decode(latent)
    write_wav(out, waveform, model.sample_rate)
    print(f"wrote {out}: {latent.shape[2]} latent slices, {waveform.size / model.sample_rate:.2f} s")
    if decode_onnx is not None:
        from converters.families.inflect.decoder import full_decode
        from gates.snr import snr_db

        decode, _ = _sessions(decode_onnx, None)
        reference = full_decode(decode, latent).reshape(-1)
        full_out = out.with_name(out.stem + ".full.wav")
        write_wav(full_out, reference, model.sample_rate)
        print(f"wrote {full_out}; windowed engine vs full-length decode: {snr_db(reference, waveform):.1f} dB")


def build_recipe(recipe: dict, target: str, toolkit: str, work_dir: Path) -> list:
    """One engine per recipe: the official files from `source.dir` or the huggingface_hub cache of `source.repo`."""
    from converters.engine import build_engine
    from converters.families.inflect.source import resolve_source
    from converters.recipes import build_options
    from gates.verdict import require

    decode_path, duration_path = resolve_source(recipe["source"])
    options, gates = recipe["options"], recipe["gates"]
    onnx_path, verdicts = export(decode_path, duration_path, work_dir, options.get("window", WINDOW),
                                 options.get("context", CONTEXT), options.get("dec_mask", True), target)
    verdicts += selfcheck_verdicts(onnx_path, decode_path, duration_path, gates.get("min_tail_db", MIN_TAIL_DB),
                                   gates.get("min_interior_db", MIN_INTERIOR_DB))
    require(verdicts, context=recipe["package"])
    return [build_engine(onnx_path, work_dir, build_options(recipe, target, toolkit),
                         selfcheck=selfcheck_path(onnx_path), export_verdicts=verdicts)]


def register(app: typer.Typer, check_app: typer.Typer) -> None:
    app.command("inflect")(convert_inflect)
    check_app.command("inflect")(check_inflect)
