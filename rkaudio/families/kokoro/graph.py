"""The Kokoro generator's export graph at one window: the window's shape and inputs, the torch module built
from the weights and rewritten for the NPU, and how to run it in torch (fp32, or float64 to measure below
fp32 noise). The exporter and the verdicts share these."""
from __future__ import annotations

from rkaudio.core.errors import SetupError
from rkaudio.board.soc import ROW_SAMPLES_LIMIT

FIELD_LIMIT = ROW_SAMPLES_LIMIT + 1  # the 13-bit time field (rkaudio.board.soc): the plain fine axis 60W+1 stays below
CONTEXT = 28  # measured receptive field of the Kokoro-82M generator, latent frames per side
INPUTS = ("x", "har", "style", "mask_coarse", "mask_fine")
OUTPUT = "spec_phase"
# The fine stage's layout: "plain" (one 60W+1 axis, W <= 136), "rows" (rows.RowGenerator: the fine axis as rows of
# at most 8191 samples with their halos), "auto" (plain where it fits, else rows).
FINE_LAYOUTS = ("plain", "rows", "auto")
ROW_HALO, ROW_MULTIPLE = 25, 6  # Kokoro-82M's widest fine-rate halo (kernel 11, dilation 5) and the last rate


def fine_layout(frames: int, layout: str = "auto", hop: int = 60) -> str:
    """The concrete layout of `layout` at `frames` ("auto": plain when 60W+1 fits the field, else rows)."""
    if layout not in FINE_LAYOUTS:
        raise SetupError(f"--fine-layout {layout!r}: one of {', '.join(FINE_LAYOUTS)}")
    if layout == "auto":
        return "plain" if hop * frames + 1 < FIELD_LIMIT else "rows"
    return layout


def row_coarse_axis(frames: int, hop: int = 60, coarse_hop: int = 10) -> int:
    """The longest coarse axis of the row form at `frames`: the last upsampling's phases padded to the rows."""
    from rkaudio.surgery.modules.rows import row_layout

    rows, length = row_layout(hop * frames + 1, ROW_HALO, FIELD_LIMIT - 1, ROW_MULTIPLE)
    return rows * length // (hop // coarse_hop) + 1


def check_frames(frames: int, hop: int = 60, layout: str = "plain") -> int:
    """Refuse windows whose longest axis does not fit the 13-bit field, before anything is built: the fine axis
    60W+1 in the plain layout, the coarse axis (10W+1 and the rows' padding) in the row layout."""
    fine = hop * frames + 1
    if frames < 2 * CONTEXT + 1:
        raise SetupError(f"--frames {frames} leaves no emitted frame: the window carries {CONTEXT} context "
                         f"frames per side, so it needs at least {2 * CONTEXT + 1}")
    layout = fine_layout(frames, layout, hop)
    if layout == "plain" and fine >= FIELD_LIMIT:
        widest = (FIELD_LIMIT - 2) // hop
        raise SetupError(f"--frames {frames} refused: the fine axis 60W+1 = {fine} must stay under {FIELD_LIMIT} "
                         f"(a 13-bit op-encoding field on the NPU; past it the compiler emits REGTASK overflow "
                         f"lines and the engine voices clipped noise). Widest plain window: {widest}; default 128; "
                         f"--fine-layout rows carries the fine axis as rows and takes wider windows.")
    if layout == "rows" and row_coarse_axis(frames, hop) >= FIELD_LIMIT:
        widest = max(w for w in range(2 * CONTEXT + 1, frames) if row_coarse_axis(w, hop) < FIELD_LIMIT)
        raise SetupError(f"--frames {frames} refused: the row form carries only the fine axis as rows; its coarse "
                         f"axis ({row_coarse_axis(frames, hop)} phases of the last upsampling) must stay under "
                         f"{FIELD_LIMIT}. Widest row-form window: {widest}.")
    return frames


def row_form(graph, frames: int):
    """The prepared graph with its fine stage on rows (rows.RowGenerator) at one window of `frames`."""
    from rkaudio.families.kokoro.rows import RowGenerator

    return RowGenerator(graph, frames)


def sine_form(sin_reduce: bool) -> str:
    return "round" if sin_reduce else "clip"


def build_module(config, state):
    """The export-friendly generator with `state` loaded and weight norm folded (exact sine, unfolded Snake)."""
    from rkaudio.families.kokoro.generator import KokoroGenerator, load_reference_state
    from rkaudio.surgery.modules.weight_norm import fold_weight_norm

    has_weight_norm = any(key.endswith("weight_g") for key in state)
    module = load_reference_state(KokoroGenerator(config, weight_norm=has_weight_norm), state)
    return fold_weight_norm(module).eval()


def prepare(module, form: str, snake_fold: bool):
    """The export graph: resblock mean folded, polyphase upsampling, masked GAP instance norm, optional alpha
    fold, sine form."""
    from rkaudio.families.kokoro.ada_snake import fold_snake_alpha
    from rkaudio.families.kokoro.generator import fold_resblock_mean
    from rkaudio.surgery.modules.instance_norm import mask_instance_norm
    from rkaudio.surgery.modules.polyphase import polyphase_upsample
    from rkaudio.surgery.modules.snake import reduce_snake_sine

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


def interior(config, frames: int, array):
    """The fine-rate columns of the emitted frames (context excluded)."""
    hop = config.rates(1)[1] - 1
    return array[..., CONTEXT * hop: (frames - CONTEXT) * hop]


def module_feeds(module, feeds: dict) -> dict:
    """One window's feeds in the layout `module` takes: har and mask_fine as rows for a row-form module."""
    from rkaudio.board.kokoro import to_rows

    rows = getattr(module, "rows", None)
    if rows is None or feeds["har"].ndim == 4:
        return feeds
    return {**feeds, **{name: to_rows(feeds[name], rows, module.row_length) for name in ("har", "mask_fine")}}


def run_torch(module, feeds: dict):
    """spec_phase [1, 22, 60W+1] of `module` on one window's feeds (plain, or rows for a row-form module), in
    the module's own precision, as float64."""
    import numpy as np
    import torch

    from rkaudio.board.kokoro import from_rows

    dtype = next(module.parameters()).dtype
    feeds = module_feeds(module, feeds)
    with torch.no_grad():
        out = module(*(torch.from_numpy(feeds[name]).to(dtype) for name in INPUTS))
    columns = getattr(module, "fine", None) or out.shape[-1]
    return from_rows(out.numpy().astype(np.float64), columns)


def float64(module):
    """A float64 copy (the rounding shift becomes float64's 1.5*2^52), to measure exactness below fp32 noise."""
    import copy

    from rkaudio.families.kokoro.ada_snake import AdaSnakeConv

    module = copy.deepcopy(module).double()
    for unit in module.modules():
        if isinstance(unit, AdaSnakeConv):
            unit.round_shift.fill_(1.5 * 2.0**52)
    return module
