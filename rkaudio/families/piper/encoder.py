"""Piper text encoder + duration-predictor conditioning as fixed-width engines (a width ladder).

The slice runs from the scaled token embedding `x_emb` [1, C, N] and the token mask `x_mask` [1, 1, N] to the
prior stats (`enc_p.proj`, [1, 2*inter_channels, N]) and the duration flows' conditioning (`dp.proj`). The
embedding lookup and the mask stay on the host (a data-dependent Gather and a Range/Less run on the CPU);
`scales` is not an input (all three feed strictly downstream of the seam). Tokens are right-padded to N.
Relative-shift chains are rewritten to the banded form (rkaudio.surgery.graph.relshift) of the target's attention form
(`ATTENTION`); a graph with a chain left is refused.
With a drift threshold, each width's fp16 duration drift is measured in the simulator at export, and a width past it
is refused there, before any build: nothing downstream (engines, self-test goldens, the ladder's golden) names it."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rkaudio.pipeline.pipeline import Exported, record_export
from rkaudio.core.errors import GateFailure, SetupError
from rkaudio.core.paths import engine_name
from rkaudio.gates.verdict import refuse_degenerate
from rkaudio.board.verdict import Verdict, at_least, at_most, judged
from rkaudio.host.backends import OnnxBackend, SimulatorBackend
from rkaudio.pipeline.attention import AttentionForms

# Seam tensors of a Piper (VITS) voice ONNX, and the names the engine gives them.
SEAM_INPUTS = {"/enc_p/Transpose_output_0": "x_emb", "/enc_p/Cast_1_output_0": "x_mask"}
SEAM_OUTPUTS = {"/enc_p/proj/Conv_output_0": "stats", "/dp/proj/Conv_output_0": "dp_cond"}
# Downstream of the seam, for the duration drift measurement: the dp flows' noise and the per-token frame counts.
DP_NOISE, DURATIONS = "/dp/RandomNormalLike_output_0", "/Ceil_output_0"

MIN_REWRITE_DB = 120.0  # rewritten vs raw slice, fp32 (the rewrite is exact up to summation order)
MIN_PADDED_DB = 110.0  # padded run vs the exact-length run on the real frames, fp32
DEFAULT_MAX_DRIFT_PCT = 7.0  # spec: +-7% is the scale of the flow's own seeded sampling noise
# Full scale of the encoder outputs for the degenerate-reference rule: both live on the latent's unit-normal
# scale (joe on SAMPLE_TEXT: stats |x| <= 13.9, RMS 0.60; dp_cond |x| <= 1.3, RMS 0.21).
OUTPUT_FULL_SCALE = 1.0
LADDER_JSON = "piper_encoder_ladder.json"
# The relative-attention form per target (`banded_relative_attention`'s form, shifted by each row's max): the RK3566
# runs each layer's Softmax and the banded form's Transposes on its CPU (joe w128, toolkit 2.3.2: 25 CPU ops and
# 33.4 ms predicted in the native form; 0 CPU ops, 26.2 ms, simulator 65.0/63.3 dB against fp16 floors 62.0/60.4 dB
# in the exp-ratio form). joe's logits reach 17.4 with rows 16.3 wide: no constant bound fits them.
ATTENTION = AttentionForms(forms={"rk3566": "exp_ratio"})
ADVICE = ("a relative-shift chain the rewrite did not recognise, or a rewrite that changed the numbers: "
          "check the voice is a standard Piper/VITS export (window-limited relative attention)")

# Real text for self-checks and drift: several sentences, phonemized with the voice's own phonemizer.
SAMPLE_TEXT = (
    "The quick brown fox jumps over the lazy dog, and then it runs back into the forest before anyone sees it. "
    "Rockchip engines need fixed shapes, so every chunk of phonemes is padded to the next width on the ladder. "
    "On a quiet morning in late November, the harbour lights went out one by one while the ferry crossed the bay. "
    "She asked whether the library would stay open through the holidays, and the answer surprised everyone. "
    "Numbers such as twenty-seven thousand, four hundred and twelve are spelled out before they are spoken. "
    "A long sentence keeps going, clause after clause, with commas and pauses, until the reader wonders where "
    "it will finally end, which is right about here, after one more breath."
)


def slice_encoder(voice, width: int | None = None):
    """The encoder slice of a voice ONNX; with `width`, token axis pinned to it and constant-folded."""
    import onnx
    from onnx.utils import Extractor

    from rkaudio.core.onnx_graph import rename_tensors
    from rkaudio.surgery.graph.fold import fold_fixed, fold_static_shapes

    missing = [n for n in [*SEAM_INPUTS, *SEAM_OUTPUTS] if not any(n in node.output for node in voice.graph.node)]
    if missing:
        raise SetupError(f"the voice ONNX has no tensors {missing}: not a Piper (VITS) voice export")
    model = Extractor(voice).extract_model(list(SEAM_INPUTS), list(SEAM_OUTPUTS))
    # The voice's symbolic value_info (batch_size, phonemes) would block shape inference once N is pinned.
    del model.graph.value_info[:]
    for output in model.graph.output:
        output.type.tensor_type.ClearField("shape")
    model = rename_tensors(model, {**SEAM_INPUTS, **SEAM_OUTPUTS})
    if width is None:
        return model
    channels = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    from rkaudio.surgery.graph.fold import pin_input_shapes

    pinned = pin_input_shapes(model, {"x_emb": [1, channels, width], "x_mask": [1, 1, width]})
    return fold_fixed(fold_static_shapes(pinned))


def npu_form(raw, target: str):
    """The raw fixed-width slice with each relative-attention core in the banded form of `target`'s attention form
    (`ATTENTION`, rkaudio.surgery.graph.relshift)."""
    from rkaudio.surgery.graph.relshift import banded_relative_attention

    form = ATTENTION.form(target)
    return banded_relative_attention(raw, form, ATTENTION.logit_bound if form == "exp_ratio" else None)


def attention_verdicts(raw, target: str, feeds: dict, width: int) -> list[Verdict]:
    """The logit gates of `target`'s exp-ratio form on the raw slice's attention logits (`feeds`), none for the
    native form (rkaudio.gates.logit_bound)."""
    from rkaudio.gates.logit_bound import logit_bound_verdicts
    from rkaudio.pipeline.attention import attention_logits

    if ATTENTION.form(target) == "native":
        return []
    return logit_bound_verdicts(attention_logits(raw, feeds), ATTENTION.logit_bound, f"[N={width}]")


def host_prefix(voice):
    """Token ids + lengths -> (x_emb, x_mask): the voice's own embedding and mask, run on the host."""
    from onnx.utils import Extractor

    from rkaudio.core.onnx_graph import rename_tensors

    model = Extractor(voice).extract_model(["input", "input_lengths"], list(SEAM_INPUTS))
    del model.graph.value_info[:]
    return rename_tensors(model, SEAM_INPUTS)


def duration_tail(voice):
    """(dp_cond, x_mask, dp noise, scales) -> per-token frame counts: the voice's own duration flows."""
    from onnx.utils import Extractor

    from rkaudio.core.onnx_graph import rename_tensors

    model = Extractor(voice).extract_model(
        ["/dp/proj/Conv_output_0", "/enc_p/Cast_1_output_0", DP_NOISE, "scales"], [DURATIONS])
    del model.graph.value_info[:]
    return rename_tensors(model, {"/dp/proj/Conv_output_0": "dp_cond", "/enc_p/Cast_1_output_0": "x_mask"})


class Voice:
    """A resolved voice with the host-side graphs the encoder path needs (loaded once)."""

    def __init__(self, voice_onnx: Path | None):
        import onnx

        from rkaudio.families.piper.voice import load_voice

        resolved, self.model = load_voice(voice_onnx)
        self.path, self.config = resolved.onnx_path, resolved.config
        self._prefix = OnnxBackend(host_prefix(self.model))
        self.dynamic = slice_encoder(self.model)
        self._duration_tail = None

    def duration_tail(self):
        """onnxruntime backend of the voice's duration flows (see `duration_tail`), built on first use."""
        if self._duration_tail is None:
            self._duration_tail = OnnxBackend(duration_tail(self.model))
        return self._duration_tail

    def sample_ids(self) -> list[int]:
        """Phoneme ids of SAMPLE_TEXT, sentences concatenated (real phoneme statistics at any length)."""
        from rkaudio.families.piper.voice import phoneme_ids

        return [i for sentence in phoneme_ids(SAMPLE_TEXT, self.config) for i in sentence]

    def feeds(self, ids: list[int], width: int | None = None) -> dict[str, np.ndarray]:
        """Encoder inputs for `ids`, right-padded (zeros, mask 0) to `width` if given."""
        prefix = self._prefix.run({"input": np.array([ids], dtype=np.int64),
                                   "input_lengths": np.array([len(ids)], dtype=np.int64)})
        x_emb, x_mask = prefix["x_emb"], prefix["x_mask"]
        if width is not None:
            if len(ids) > width:
                raise SetupError(f"{len(ids)} tokens do not fit width {width}")
            pad = [(0, 0), (0, 0), (0, width - len(ids))]
            x_emb, x_mask = np.pad(x_emb, pad), np.pad(x_mask, pad)
        return {"x_emb": x_emb.astype(np.float32), "x_mask": x_mask.astype(np.float32)}


def _min_snr(reference: dict[str, np.ndarray], test: dict[str, np.ndarray], length: int) -> float:
    from rkaudio.board.numeric import snr_db

    return min(snr_db(reference[name][..., :length], test[name][..., :length]) for name in reference)


def _judged_per_output(verdict: Verdict, references: list[tuple[dict, int]]) -> Verdict:
    """`verdict` judged (`rkaudio.board.verdict.judged`, at OUTPUT_FULL_SCALE) on each output's whole reference:
    all the runs it compared, each on its first `length` frames; the first degenerate one is named."""
    for name in references[0][0]:
        whole = np.concatenate([run[name][..., :length].reshape(-1) for run, length in references])
        judged_here = judged(verdict, whole, OUTPUT_FULL_SCALE, label=name)
        if judged_here is not verdict:
            return judged_here
    return verdict


def shift_chain_verdict(model) -> Verdict:
    """Gate: the graph an engine is compiled from must hold no relative-shift chain (the NPU computes them wrong)."""
    from rkaudio.surgery.graph.relshift import find_shift_chains

    chains = find_shift_chains(model)
    names = ", ".join(model.graph.node[c.nodes[0]].name or c.source for c in chains[:4])
    return at_most("relative-shift chains", len(chains), 0, "chains",
                   f"Pad+Reshape+Slice skews left in: {names}" if chains else "")


def export_verdicts(voice: Voice, raw, rewritten, width: int) -> list[Verdict]:
    """Gates on the graph the engine is compiled from: no shift chain left; rewritten == raw slice (fp32);
    a padded run reproduces the exact-length run of the voice's own slice on the real frames."""
    ids = voice.sample_ids()
    if len(ids) < width:
        ids = ids * (width // len(ids) + 1)
    raw_run, new_run, exact_run = OnnxBackend(raw), OnnxBackend(rewritten), OnnxBackend(voice.dynamic)
    verdicts = [shift_chain_verdict(rewritten)]
    lengths = sorted({min(17, width), width - 1, width})
    rewrite_db, padded_db, raw_refs, exact_refs = [], [], [], []
    for length in lengths:
        padded = voice.feeds(ids[:length], width)
        new = new_run.run(padded)
        raw_refs.append((raw_run.run(padded), width))  # padding included
        exact_refs.append((exact_run.run(voice.feeds(ids[:length])), length))
        rewrite_db.append(_min_snr(raw_refs[-1][0], new, width))
        padded_db.append(_min_snr(exact_refs[-1][0], new, length))
    verdicts.append(_judged_per_output(
        at_least(f"relshift_rewrite_vs_raw[N={width}]", min(rewrite_db), MIN_REWRITE_DB, "dB",
                 f"fp32, all {width} frames, n={lengths}: " + ", ".join(f"{v:.1f}" for v in rewrite_db)), raw_refs))
    verdicts.append(_judged_per_output(
        at_least(f"padded_vs_exact[N={width}]", min(padded_db), MIN_PADDED_DB, "dB",
                 f"fp32, n={lengths}: " + ", ".join(f"{v:.1f}" for v in padded_db)), exact_refs))
    return refuse_degenerate(verdicts, "piper encoder export")


def export_width(job, voice: Voice, width: int) -> Exported:
    """Write `piper_encoder_w{N}.onnx` (banded, contract in metadata) and its self-check into the job's folder: one
    width's record."""
    import onnx

    from rkaudio.core.contract import set_contract

    raw = slice_encoder(voice.model, width)
    rewritten = npu_form(raw, job.target)
    feeds = voice.feeds(selfcheck_ids(voice, width), width)
    verdicts = [*export_verdicts(voice, raw, rewritten, width), *attention_verdicts(raw, job.target, feeds, width)]
    contract = job.contract("main", ladder_key=width, frames=width, voice=voice.path.name, seam_inputs=SEAM_INPUTS,
                            seam_outputs=SEAM_OUTPUTS)
    out_dir = Path(job.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx_path = out_dir / f"piper_encoder_w{width}.onnx"
    onnx.save(set_contract(rewritten, contract), str(onnx_path))
    return record_export(onnx_path, verdicts, feeds=feeds)


def selfcheck_ids(voice: Voice, width: int) -> list[int]:
    """A width's self-check (and end-to-end) token sequence: real phonemes, 3 short of the width."""
    ids = voice.sample_ids()
    return ids[: min(len(ids), width - 3)]


def with_end_to_end(voice: Voice, records: list[Exported], widths: list[int]) -> list[Exported]:
    """The encoder's end-to-end golden: each width's self-check sequence as one chunk, unpadded, through the
    runtime's width ladder (rkaudio.board.ladder.golden_loop pads x_emb and x_mask with zeros to the width that fits)."""
    from rkaudio.pipeline.pipeline import record_end_to_end

    inputs = {f"{name}@{k}": value for k, width in enumerate(widths)
              for name, value in voice.feeds(selfcheck_ids(voice, width)).items()}
    return record_end_to_end("piper_encoder_ladder", "rkaudio.board.ladder:golden_loop", records, inputs,
                             {"width_key": "frames", "axis": -1},
                             "one real token sequence per width (3 short of it), right-padded, through the ladder")


def export(job) -> list[Exported]:
    """One engine record per phoneme-token width of the job's `frames` (the ladder, narrowest first), with the
    ladder's end-to-end golden (`piper_encoder_ladder.e2e.*`) and `piper_encoder_ladder.json` (widths kept, refused,
    drift per width, the exec_plan). With the job's `max_drift_pct`, each width's fp16 duration drift is measured in
    its target's simulator: a width past it is refused (its ONNX removed, no record), a kept one carries its drift
    verdict among its export verdicts. GateFailure when every width is refused."""
    from rkaudio.core.contract import contract_of
    from rkaudio.core.manifest import exec_plan_fragment

    frames, max_drift_pct = job.options.frames, job.gates.max_drift_pct
    widths = sorted(set(frames))
    if not widths or widths[0] < 2:
        raise SetupError(f"--frames needs token widths >= 2, got {frames}")
    voice, out_dir = Voice(job.source.voice_onnx), Path(job.out)
    chunks = drift_chunks(voice, widths) if max_drift_pct is not None else {}
    records, refused, ladder = [], [], {"widths": [], "refused": {}, "drift_pct": {}, "max_drift_pct": max_drift_pct}
    for width in widths:
        record = export_width(job, voice, width)
        if chunks:
            drifts = measure_drift(voice, record.onnx, width, job.target, job.toolkit, chunks[width])
            verdict = drift_verdict(width, drifts, max_drift_pct)
            ladder["drift_pct"][width] = drifts
            if not verdict.passed:
                print(f"refused width {width}: {verdict.line()}")
                ladder["refused"][width] = verdict.line()
                refused.append(verdict)
                record.onnx.unlink()
                record.selfcheck.unlink()
                continue
            record = record_export(record.onnx, [*record.verdicts, verdict])
        ladder["widths"].append(width)
        records.append(record)
    if not records:
        raise GateFailure(refused, advice="every width drifts past the threshold: use narrower --frames or raise "
                          "--max-drift-pct", context="piper encoder export")
    # the exec_plan of the ladder's engines, all of one role: their names, comma-separated
    ladder["exec_plan"] = exec_plan_fragment(contract_of(records[0].onnx),
                                             ",".join(engine_name(r.onnx) for r in records))
    (out_dir / LADDER_JSON).write_text(json.dumps(ladder, indent=2) + "\n")
    return with_end_to_end(voice, records, ladder["widths"])


def drift_chunks(voice: Voice, widths: list[int], per_width: int = 3) -> dict[int, list[list[int]]]:
    """Real-phoneme chunks per width: token counts spread over (previous width, width], the chunks a
    runtime would send to that engine."""
    ids = voice.sample_ids()
    chunks, previous = {}, 0
    for width in sorted(widths):
        stream = ids * (2 * width // len(ids) + 2)
        lengths = np.linspace(max(previous + 1, width * 3 // 4), width, per_width).astype(int)
        # each chunk starts at a different phoneme (stride 37 ids) so the chunks are not prefixes of each other
        chunks[width] = [stream[offset * 37: offset * 37 + int(n)] for offset, n in enumerate(lengths)]
        previous = width
    return chunks


def duration_drift(voice: Voice, reference: dict, test: dict, length: int, seed: int = 0) -> float:
    """Relative change (%) of a chunk's total frame count when the fp32 conditioning is replaced by `test`'s,
    with the same seeded dp noise and the voice's scales."""
    from rkaudio.families.piper.voice import voice_feeds

    tail = voice.duration_tail()
    scales = voice_feeds([0], voice.config)["scales"]
    mask = reference["x_mask"][..., :length]
    noise = np.random.default_rng(seed).standard_normal((1, 2, length)).astype(np.float32)
    totals = []
    for run in (reference, test):
        frames = tail.run({"dp_cond": run["dp_cond"][..., :length].astype(np.float32), "x_mask": mask,
                           DP_NOISE: noise, "scales": scales})[DURATIONS]
        totals.append(float(np.sum(frames)))
    return 100.0 * (totals[1] - totals[0]) / totals[0]


def measure_drift(voice: Voice, onnx_path: Path, width: int, target: str, toolkit: str,
                  chunks: list[list[int]]) -> list[float]:
    """Duration drift (%) of the fp16 simulator engine against onnxruntime fp32, one figure per chunk."""
    fp32 = OnnxBackend(onnx_path)
    drifts = []
    with SimulatorBackend(onnx_path, target, toolkit) as simulator:
        for chunk in chunks:
            feeds = voice.feeds(chunk, width)
            reference = fp32.run(feeds, ["stats", "dp_cond"])
            simulated = simulator.run(feeds)
            drifts.append(duration_drift(voice, {**reference, **feeds}, {**simulated, **feeds}, len(chunk)))
    return drifts


def drift_verdict(width: int, drifts: list[float], max_drift_pct: float) -> Verdict:
    """Gate: the worst chunk's duration drift at this width stays within +-max_drift_pct."""
    worst = max(drifts, key=abs)
    return at_most(f"duration_drift[N={width}]", abs(worst), max_drift_pct, "%",
                   "per chunk: " + ", ".join(f"{d:+.2f}" for d in drifts))
