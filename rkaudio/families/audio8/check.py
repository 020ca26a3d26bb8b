"""`convert check audio8`: a WAV decoded twice by the board's runtime (rkaudio.board.audio8.Audio8Runtime: encoder,
adapter, prefill, one step per K/V bucket, head shards), once over the plain fp32 graphs and once over the engines
(`--backend onnx`: onnxruntime with every tensor rounded to fp16; `--backend simulator`: each graph compiled for
the target in the rknn-toolkit2 simulator); both token lists and where they part. The graphs are a plan
directory's (`convert audio8`) or a package's (`--package`). On a board the kit runs the same runtime over the
.rknn engines with rknn-toolkit-lite2."""
from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Callable

from rkaudio.core.errors import SetupError


def graph_files(plan_dir: Path | None, engines) -> tuple[Path, str, Callable[[Path], Path]]:
    """Where the runtime reads its plan, which plan column it opens (`onnx` or `rknn`), and the ONNX that stands for
    each file it opens: a plan directory's own ONNX, or for --package the ONNX its manifests name for each engine
    (one engine compiled for every bucket, `--ladder dynamic`, is one ONNX, opened once as on the board)."""
    from rkaudio.core.paths import engine_name
    from rkaudio.board.audio8 import PLAN_FILE

    if engines.package is None:
        if plan_dir is None:
            raise SetupError("give --plan DIR (written by `convert audio8`) or --package DIR (built by "
                             "`convert engines`)")
        return Path(plan_dir), "onnx", lambda path: path
    if plan_dir is not None:
        raise SetupError(f"--plan {plan_dir} and --package {engines.package} both name the graphs: give one")
    onnx_of_engine = {engine_name(onnx): onnx for onnx in engines.package_onnx()}

    def onnx_of(engine: Path) -> Path:
        if engine.name not in onnx_of_engine:
            raise SetupError(f"the {PLAN_FILE} of {engines.package} names {engine.name}, which no manifest there "
                             "describes: rebuild the package")
        return onnx_of_engine[engine.name]

    return Path(engines.package), "rknn", onnx_of


def decode_check(plan_dir: Path | None, wav: Path, max_new_tokens: int, engines) -> None:
    """Print the clip's length, the greedy tokens through the fp32 graphs and through `engines`, how many agree and
    where they first differ (with whether an fp16 tie explains it), and the engines' buckets and milliseconds."""
    from rkaudio.families.audio8.checks import first_divergence, margin_explained_verdict
    from rkaudio.board.audio8 import Audio8Runtime
    from rkaudio.board.mel import log_mel
    from rkaudio.host.audio import read_wav

    directory, artifact, onnx_of = graph_files(plan_dir, engines)
    audio, rate = read_wav(wav)
    with Audio8Runtime(directory, backend_for=lambda path: engines.fp32(onnx_of(path)), artifact=artifact) as fp32:
        fields = fp32.fields
        if rate != fields.sample_rate:
            raise SetupError(f"{wav} is {rate} Hz; resample it to {fields.sample_rate} Hz")
        features = log_mel(audio, fields.mel_bins)
        reference = fp32.transcribe(features, audio.size, max_new_tokens, keep_logits=True)
    print(f"{wav}: {audio.size / rate:.2f} s, decoded through the fp32 graphs and through {engines.label}")
    with ExitStack() as opened, Audio8Runtime(
            directory, backend_for=lambda path: opened.enter_context(engines.open(onnx_of(path))),
            artifact=artifact) as runtime:
        decoded = runtime.transcribe(features, audio.size, max_new_tokens)
    print("tokens (fp32):", ",".join(map(str, reference.tokens)))
    print(f"tokens ({engines.label}):", ",".join(map(str, decoded.tokens)))
    parted = first_divergence(reference.tokens, decoded.tokens)
    if parted is None:
        print(f"agree: all {len(reference.tokens)} tokens")
    else:
        explained = margin_explained_verdict("tokens", reference.tokens, reference.step_logits, decoded.tokens)
        print(f"agree: the first {parted} of {len(reference.tokens)} fp32 tokens ({len(decoded.tokens)} through "
              f"{engines.label}); {explained.detail}")
    print("buckets:", " -> ".join(map(str, decoded.buckets)))
    print("timings:", {k: round(v, 2) if isinstance(v, float) else v for k, v in decoded.timings.to_json().items()})
