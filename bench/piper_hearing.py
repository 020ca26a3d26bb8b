"""What the Piper decoder engine changes in what a listener hears (#29): three texts (one word, a number-heavy
sentence, a 300-character paragraph) rendered by `convert check piper --backend simulator` on joe at the window
the recipe ships for --target (default rk3588), each render transcribed by pocketsphinx. Rows: the engine's SNR
against the fp32 walk, each render's word error rate against the text, and the engine render's against the fp32
render's transcript; the last row pools the three (the acceptance figure: at most 5%)."""
from __future__ import annotations

import tempfile
from pathlib import Path

TEXTS = {
    "one word": "Hello.",
    "numbers": "Flight 370 left gate 12 at 9:45 with 227 passengers, 14 crew and 3,500 kilograms of cargo, 2 hours late.",
    "paragraph": "The old lighthouse stood at the edge of the cliff, its white paint peeling after decades of salt and "
                 "wind. Every evening the keeper climbed the narrow stairs, trimmed the wick, and watched the beam "
                 "sweep across the dark water. Ships passed safely through the strait, and few of their sailors ever "
                 "knew his name.",
}


def main(argv: list[str] | None = None) -> list[dict]:
    import run
    from rkaudio.cli.families import declaration
    from rkaudio.families.piper import DEFAULT_CONTEXT, FAMILY
    from rkaudio.families.piper.check import render_check
    from rkaudio.families.piper.decoder import export
    from rkaudio.release.check import EngineChoice
    from rkaudio.toolkit.versions import DEFAULT_TOOLKIT

    parser = run.parser(__file__, __doc__)
    parser.add_argument("--target", default="rk3588", help="whose recipe window is rendered (default: rk3588)")
    target = parser.parse_args(argv).target
    engines = EngineChoice("piper", "simulator", target, DEFAULT_TOOLKIT, None, declaration)
    window = engines.recipe_option("decoder", "window")
    rows, pooled_errors, pooled_words = [], 0, 0
    with tempfile.TemporaryDirectory(prefix="piper-hearing-") as scratch:
        job = FAMILY.job("decoder", target=target, out=Path(scratch),
                         options={"window": window, "context": DEFAULT_CONTEXT})
        (exported,) = export(job)
        for name, text in TEXTS.items():
            figures = render_check(text, job, exported.onnx, Path(scratch) / f"{name.replace(' ', '_')}.wav", engines)
            asr = figures["asr"]
            if "detail" in asr:
                raise SystemExit(f"pocketsphinx is needed here: {asr['detail']}")
            pooled_errors += asr["engine_vs_fp32"]["errors"]
            pooled_words += asr["engine_vs_fp32"]["words"]
            rows.append({"text": name, "target": target, "window": window, "chars": len(text),
                         "engine_calls": len(figures["spans"]), "snr_db_engine_vs_fp32": round(figures["snr_db"], 1),
                         "worst_call_db": round(min(row["snr_db"] for row in figures["spans"]), 1),
                         "wer_fp32_vs_text": round(asr["fp32"]["wer"], 3),
                         "wer_engine_vs_text": round(asr["engine"]["wer"], 3),
                         "wer_engine_vs_fp32": round(asr["engine_vs_fp32"]["wer"] or 0.0, 3),
                         "engine_heard": asr["engine"]["transcript"]})
    rows.append({"text": "pooled", "target": target, "window": window,
                 "wer_engine_vs_fp32": round(pooled_errors / pooled_words, 3),
                 "engine_heard": f"{pooled_errors} of {pooled_words} words differ from the fp32 render's transcript"})
    return rows


if __name__ == "__main__":
    import run

    run.script(__file__)
