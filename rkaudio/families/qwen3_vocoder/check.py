"""`convert check qwen3-vocoder`: code frames through the stateful stream a board runs
(rkaudio.board.qwen3_vocoder.golden_loop: the first group on the `first` step, every later one on `main`, the cache
carried from call to call, a short last group right-padded), once over the steps' exact fp32 twins and once over the
engines (onnxruntime or the toolkit simulator), beside the package decoder's full decode; hear all three
(rkaudio.host.hearing)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from rkaudio.board.contract import EngineContract
from rkaudio.board.qwen3_vocoder import CODE_FRAME_RATE_HZ, StepContract
from rkaudio.core.errors import SetupError

STREAM_ROLES = ("first", "main")  # the stateful steps; the window role decodes statelessly and is no part of it
# One code frame per push, as a talker emits them (the golden's schedule).
STREAM_PARAMS = {"event_frames": 1}


def render_check(engines, steps: list[Path], family: str, model_dir: str | None, codes: Path | None,
                 frames: int | None, seed: int, out: Path) -> dict:
    """Write `out` (the engine render of the stream over `steps`, ONNX written by `convert qwen3-vocoder`, whose
    contracts name `family`), `<out>.fp32.wav`, `<out>.full.wav` (with `model_dir`: the package decoder's one-call
    decode) and `<out>.png`; print the engine's SNR against fp32 per stream call and overall. Returns the figures."""
    from contextlib import ExitStack

    from rkaudio.families.qwen3_vocoder.snapshot import load
    from rkaudio.host.hearing import Render, compare

    stream = stream_steps(steps, family)
    contracts = [contract for _, contract in stream]
    source = load(model_dir) if model_dir is not None else None
    code_ids = _codes(codes, frames, seed, contracts, source)
    fp32, spans = render_stream(stream, code_ids, engines.fp32)
    with ExitStack() as opened:
        rendered, _ = render_stream(stream, code_ids, lambda onnx: opened.enter_context(engines.open(onnx)))
    rate = CODE_FRAME_RATE_HZ * StepContract.of(contracts[0]).samples_per_frame
    full = Render(_full_decode(source, code_ids, fp32.size), rate) if source is not None else None
    steps_said = " + ".join(f"{step.role} B={StepContract.of(step).frames}" for step in contracts)
    title = (f"qwen3-vocoder stream of {code_ids.shape[1]} code frames, {steps_said} "
             f"({engines.label})")
    return compare(Path(out), Render(fp32, rate), Render(rendered, rate), spans, title=title, full=full)


def stream_steps(onnx_paths: list[Path], family: str) -> list[tuple[Path, EngineContract]]:
    """(ONNX, contract) of each stateful step of `family` (as contracts name it), first before main; anything else
    is refused by name."""
    from rkaudio.core.contract import contract_of

    found: dict[str, tuple[Path, EngineContract]] = {}
    for path in map(Path, onnx_paths):
        contract = contract_of(path)
        role = contract.role
        if contract.family != family:
            raise SetupError(f"{path} is not a {family} step (its contract names family {contract.family!r})")
        if role not in STREAM_ROLES:
            raise SetupError(f"{path} is a {role} engine: the stream runs the stateful steps ({', '.join(STREAM_ROLES)})")
        if role in found:
            raise SetupError(f"two {role} steps, {found[role][0]} and {path}: the stream runs one of each role")
        found[role] = (path, contract)
    return [found[role] for role in STREAM_ROLES if role in found]


def render_stream(stream: list[tuple[Path, EngineContract]], codes: np.ndarray, open_backend
                  ) -> tuple[np.ndarray, list]:
    """The board's stream (golden_loop) over `open_backend(onnx)` for each step: (pcm, the span of every call,
    its kind the step's role, or `padded` for the flushed short group)."""
    from rkaudio.core.paths import engine_name
    from rkaudio.board.golden import Engine
    from rkaudio.board.qwen3_vocoder import golden_loop
    from rkaudio.host.hearing import Span

    calls: list[dict] = []
    loop_engines = [Engine(engine_name(path), contract, lambda path=path: open_backend(path),
                           on_run=lambda engine, feeds, outputs: calls.append(engine.contract))
                    for path, contract in stream]
    pcm = np.asarray(golden_loop(loop_engines, {"codes": codes}, STREAM_PARAMS)["pcm"]).reshape(-1)
    spans, start = [], 0
    for contract in calls:
        step = StepContract.of(contract)
        group = step.frames * step.samples_per_frame
        # Every call emits a full group but the flush, whose right padding emits nothing: the pcm ends there.
        stop = min(start + group, pcm.size)
        spans.append(Span(start, stop, contract.role if stop - start == group else "padded"))
        start = stop
    return pcm, spans


def default_frames(contracts: list[EngineContract]) -> int:
    """The golden's codes (a group on `first`, two on `main`: the cache carried across both steps and main to
    main) and half a main group more, so the flushed, right-padded call is heard too."""
    from rkaudio.board.qwen3_vocoder import golden_codes_length

    return golden_codes_length(contracts) + max(1, StepContract.of(contracts[-1]).frames // 2)


def _codes(path: Path | None, frames: int | None, seed: int, contracts: list[EngineContract], source) -> np.ndarray:
    """Code ids [num_quantizers, T]: `path`'s (.npy, [K, T] or [1, K, T]) or `frames` random ones from `seed`
    (the codebook size is the snapshot's)."""
    quantizers = StepContract.of(contracts[0]).num_quantizers
    book = int(source.decoder_config["codebook_size"]) if source is not None else None
    if path is None:
        if book is None:
            raise SetupError("random codes need the codebook size of a snapshot: give --model-dir or --codes FILE.npy")
        length = frames or default_frames(contracts)
        return np.random.default_rng(seed).integers(0, book, (quantizers, length), dtype=np.int64)
    if frames is not None:
        raise SetupError("--frames is the length of random codes; --codes brings its own")
    try:
        ids = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise SetupError(f"--codes {path} is not a readable .npy ({error})") from None
    ids = ids[0] if ids.ndim == 3 and ids.shape[0] == 1 else ids
    if ids.ndim != 2 or ids.shape[0] != quantizers or ids.shape[1] == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise SetupError(f"--codes {path}: expected integer code ids [{quantizers}, frames], got {ids.dtype} "
                         f"{list(ids.shape)}")
    if ids.min() < 0 or (book is not None and ids.max() >= book):
        raise SetupError(f"--codes {path}: ids run {ids.min()}..{ids.max()}, outside the codebook "
                         f"[0, {book if book is not None else 'its size'})")
    return ids.astype(np.int64)


def _full_decode(source, codes: np.ndarray, samples: int) -> np.ndarray:
    """The package decoder's one-call decode of every code frame (what the stream's steps must add up to)."""
    import torch

    from rkaudio.families.qwen3_vocoder.reference import reference_decoder

    decoder = reference_decoder(source.decoder_config, source.state_dict)
    with torch.no_grad():
        pcm = decoder(torch.from_numpy(codes)[None])[0, 0].numpy()
    if pcm.size != samples:
        raise SetupError(f"--model-dir's decoder gives {pcm.size} samples for {codes.shape[1]} frames, the steps "
                         f"{samples}: the steps were exported from another snapshot")
    return pcm
