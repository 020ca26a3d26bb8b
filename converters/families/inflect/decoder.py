"""Inflect v2 decoder slice: check the official files, cut decode.onnx at the pre-flow latent, mask
the decoder half, fold at the window, and gate the windowed decode against a full-length one.

The noise head of decode.onnx (`z = m_p + exp(logs_p) * zp_noise * noise_scale`) stays outside the
slice: the runtime draws the noise itself (`noise_head`) and hands the engine the finished latent."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.errors import SetupError

FAMILY = "inflect"
COMPONENT = "decoder"
ROLE = "main"
EXEC_PLAN_OPTION = "inflect_v2.exec_plan"
DECODE_INPUTS = ("m_p_exp", "logs_p_exp", "y_mask", "zp_noise", "noise_scale")
DECODE_OUTPUT = "waveform"
DURATION_INPUTS = ("tokens", "lengths", "length_scale")
DURATION_OUTPUTS = ("m_p_exp", "logs_p_exp", "y_mask")
LATENT_INPUT, MASK_INPUT = "z", "y_mask"
DEFAULT_SAMPLE_RATE, DEFAULT_HOP = 24000, 256  # both official sizes; config.json overrides them
N_SYMBOLS = 178  # token vocabulary of both sizes (0 is the blank)
DEFAULT_VARIATION = 0.667  # prior noise scale, as VITS-family exports default noise_scale
OFFICIAL_HINT = ("pass onnx/decode.onnx and onnx/duration.onnx of owensong/Inflect-Micro-v2-ONNX or "
                 "owensong/Inflect-Nano-v2-ONNX")


@dataclass(frozen=True)
class InflectModel:
    """What the slice and the runtime need to know about one official model."""

    channels: int  # latent width C (Micro 192, Nano 128)
    hop: int       # waveform samples per latent slice
    sample_rate: int


def _io_names(values) -> list[str]:
    return [v.name for v in values]


def _channels_of(value, path: Path, which: str) -> int:
    dims = value.type.tensor_type.shape.dim
    if len(dims) != 3 or not dims[1].dim_value:
        raise SetupError(f"{which} {path}: {value.name} should be [1, C, mel_len] with a fixed C, "
                         f"got {[d.dim_value or d.dim_param for d in dims]}; {OFFICIAL_HINT}")
    return int(dims[1].dim_value)


def load_decode(path: Path):
    """decode.onnx checked for the official I/O; returns (ModelProto, latent channels)."""
    import onnx

    path = Path(path)
    if not path.is_file():
        raise SetupError(f"no decode.onnx at {path}; {OFFICIAL_HINT}")
    model = onnx.load(str(path))
    inputs, outputs = _io_names(model.graph.input), _io_names(model.graph.output)
    missing = [name for name in DECODE_INPUTS if name not in inputs]
    if missing or DECODE_OUTPUT not in outputs:
        raise SetupError(
            f"{path} is not an Inflect v2 decode.onnx: it has inputs {inputs} and outputs {outputs}, "
            f"expected inputs {list(DECODE_INPUTS)} and output '{DECODE_OUTPUT}' "
            f"(missing: {missing or [DECODE_OUTPUT]}); {OFFICIAL_HINT}")
    m_p = next(v for v in model.graph.input if v.name == "m_p_exp")
    return model, _channels_of(m_p, path, "decode.onnx")


def check_duration(path: Path, channels: int) -> None:
    """duration.onnx must have the official I/O and produce latents of the decoder's width."""
    import onnx

    path = Path(path)
    if not path.is_file():
        raise SetupError(f"no duration.onnx at {path}; {OFFICIAL_HINT}")
    model = onnx.load(str(path), load_external_data=False)
    inputs, outputs = _io_names(model.graph.input), _io_names(model.graph.output)
    if any(n not in inputs for n in DURATION_INPUTS) or any(n not in outputs for n in DURATION_OUTPUTS):
        raise SetupError(f"{path} is not an Inflect v2 duration.onnx: inputs {inputs}, outputs {outputs}; expected "
                         f"inputs {list(DURATION_INPUTS)} and outputs {list(DURATION_OUTPUTS)}; {OFFICIAL_HINT}")
    m_p = next(v for v in model.graph.output if v.name == "m_p_exp")
    found = _channels_of(m_p, path, "duration.onnx")
    if found != channels:
        raise SetupError(f"{path} produces latents of C={found} channels but the decoder takes C={channels}: "
                         "duration.onnx and decode.onnx come from different models (Micro is C=192, Nano C=128); "
                         "pass the two files of one model")


def config_beside(onnx_path: Path) -> Path | None:
    """The model's config.json: beside the onnx/ folder (the official layout) or beside the file."""
    for config in (Path(onnx_path).parent.parent / "config.json", Path(onnx_path).parent / "config.json"):
        if config.is_file():
            return config
    return None


def config_values(config_path: Path | None) -> tuple[int, int]:
    """(hop, sample rate) from config.json (`data.hop_length`, `data.sampling_rate`); v2 defaults where absent."""
    data = json.loads(Path(config_path).read_text()).get("data", {}) if config_path else {}
    return int(data.get("hop_length", DEFAULT_HOP)), int(data.get("sampling_rate", DEFAULT_SAMPLE_RATE))


def full_decode(decode_session, latent: np.ndarray) -> np.ndarray:
    """decode.onnx on a finished latent (noise head made the identity): the full-length fp32 reference."""
    latent = np.asarray(latent, dtype=np.float32)
    zeros = np.zeros_like(latent)
    mask = np.ones((1, 1, latent.shape[2]), dtype=np.float32)
    return decode_session.run([DECODE_OUTPUT], {"m_p_exp": latent, "logs_p_exp": zeros, "y_mask": mask,
                                                "zp_noise": zeros, "noise_scale": np.array(0.0, np.float32)})[0]


def describe(decode_path: Path, duration_path: Path | None) -> tuple["onnx.ModelProto", InflectModel]:
    """Load and cross-check the official files; the hop is measured by decoding a short latent."""
    import onnxruntime as ort

    model, channels = load_decode(decode_path)
    if duration_path is not None:
        check_duration(duration_path, channels)
    probe_slices = 4
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    samples = full_decode(session, np.zeros((1, channels, probe_slices), np.float32)).shape[-1]
    return model, InflectModel(channels, samples // probe_slices, config_values(config_beside(decode_path))[1])


def noise_head(m_p: np.ndarray, logs_p: np.ndarray, variation: float, rng: np.random.Generator) -> np.ndarray:
    """The part of decode.onnx the engine leaves out: z = m_p + exp(logs_p) * N(0,1) * variation."""
    noise = rng.standard_normal(m_p.shape)
    return (m_p + np.exp(logs_p) * noise * variation).astype(np.float32)


def _declare_inputs(model, channels: int):
    """Type the cut's inputs (it leaves them shapeless): z [1,C,N], y_mask [1,1,N]."""
    import onnx

    shapes = {LATENT_INPUT: [1, channels, "N"], MASK_INPUT: [1, 1, "N"]}
    for graph_input in model.graph.input:
        graph_input.CopyFrom(onnx.helper.make_tensor_value_info(graph_input.name, onnx.TensorProto.FLOAT,
                                                                shapes[graph_input.name]))
    return model


def slice_decoder(decode_model, model: InflectModel, window: int, context: int, dec_mask: bool = True):
    """decode.onnx -> fixed-window engine graph z [1,C,W], y_mask [1,1,W] -> waveform, folded, with its contract."""
    from core.contract import make_contract
    from surgery.graph.conv_pad import cap_conv_padding
    from runtime.window_walk import WindowContract
    from surgery.graph.flip_fold import FlipFoldError, fold_flips
    from surgery.graph.fold import fold_fixed
    from surgery.graph.mask import mask_decoder
    from core.contract import set_contract
    from surgery.graph.vits_seam import SeamError, cut_at_seam, find_vits_seam
    from core.onnx_graph import rename_tensors

    walk_contract = WindowContract(window=window, context=context, emitted=window - 2 * context, hop=model.hop,
                                   latent_input=LATENT_INPUT, output=DECODE_OUTPUT, mask_input=MASK_INPUT,
                                   latent_channels=model.channels)
    try:
        seam = find_vits_seam(decode_model)
        sliced = cut_at_seam(decode_model, seam)
    except SeamError as error:
        raise SetupError(f"decode.onnx has no reverse-flow seam to cut at: {error}; {OFFICIAL_HINT}") from None
    if seam.cond is not None:
        raise SetupError(f"decode.onnx reads a conditioning tensor {seam.cond!r} besides the latent and mask: "
                         f"Inflect v2 is single-speaker; {OFFICIAL_HINT}")
    sliced = _declare_inputs(rename_tensors(sliced, {seam.latent: LATENT_INPUT, seam.mask: MASK_INPUT}),
                             model.channels)
    try:
        sliced = fold_flips(sliced)
    except FlipFoldError as error:
        raise SetupError(f"decode.onnx's reverse flow has a channel flip that cannot be folded: {error}") from None
    if dec_mask:
        sliced = mask_decoder(sliced, seam.decoder_input, MASK_INPUT)
    folded = cap_conv_padding(fold_fixed(sliced, {LATENT_INPUT: [1, model.channels, window],
                                                  MASK_INPUT: [1, 1, window]}))
    contract = make_contract(FAMILY, COMPONENT, ROLE, EXEC_PLAN_OPTION, **walk_contract.fields(),
                             sample_rate=model.sample_rate, dec_mask=dec_mask,
                             nodes_before_fold=len(sliced.graph.node), nodes_after_fold=len(folded.graph.node))
    return set_contract(folded, contract)


# ---------------------------------------------------------------- self-check gates

def prior_latent(duration_session, slices: int, variation: float = DEFAULT_VARIATION, seed: int = 0) -> np.ndarray:
    """The model's own prior sample of `slices` slices: duration.onnx on random blank-interleaved
    tokens, then the noise head; cropped to `slices`."""
    rng = np.random.default_rng(seed)
    symbols = 8
    while True:
        phonemes = rng.integers(1, N_SYMBOLS, symbols)
        tokens = np.zeros((1, 2 * symbols + 1), dtype=np.int64)
        tokens[0, 1::2] = phonemes  # blank (0) between and around the symbols
        m_p, logs_p, _ = duration_session.run(
            list(DURATION_OUTPUTS), {"tokens": tokens, "lengths": np.array([tokens.shape[1]], np.int64),
                                     "length_scale": np.array(1.0, np.float32)})
        if m_p.shape[2] >= slices:
            return noise_head(m_p, logs_p, variation, rng)[:, :, :slices]
        symbols *= 2


def windowed_decode(backend, latent: np.ndarray, window: int, context: int, hop: int):
    """The runtime's walk of `latent` over a fixed-window backend at `context` (emitted = window - 2*context)."""
    from runtime.window_walk import WindowContract, walk

    contract = WindowContract(window=window, context=context, emitted=window - 2 * context, hop=hop,
                              latent_input=LATENT_INPUT, output=DECODE_OUTPUT, mask_input=MASK_INPUT)
    return walk(backend, latent, contract)


def tail_figures(backend, decode_session, latents: dict[int, np.ndarray], window: int, context: int,
                 hop: int) -> dict[int, float]:
    """SNR (dB) of the windowed decode of each short latent against a full-length decode.onnx decode."""
    from gates.snr import snr_db

    return {n: snr_db(full_decode(decode_session, z), windowed_decode(backend, z, window, context, hop).output)
            for n, z in latents.items()}


def interior_figures(backend, decode_session, latent: np.ndarray, window: int, context: int,
                     hop: int) -> dict[int, float]:
    """SNR (dB) per interior window (neither first nor last) against a full-length decode."""
    from gates.snr import snr_db

    reference = full_decode(decode_session, latent)
    result = windowed_decode(backend, latent, window, context, hop)
    return {w.index: snr_db(reference[..., result.span(w)], result.output[..., result.span(w)])
            for w in result.windows if w.kind == "interior"}


def context_table(backend, decode_session, latent: np.ndarray, window: int, contexts, hop: int) -> dict[int, float]:
    """Global SNR of the whole windowed decode against a full-length decode, per context width."""
    from gates.snr import snr_db

    reference = full_decode(decode_session, latent)
    return {c: snr_db(reference, windowed_decode(backend, latent, window, c, hop).output) for c in contexts}
