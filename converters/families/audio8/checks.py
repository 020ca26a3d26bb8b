"""Audio8 gates: greedy tokens through the exported graphs against the torch FP32 model's own decoding.

Hard gates: identical token sequences (EOS included) for every adapter bucket, and a stress run that ignores
EOS through the largest K/V bucket. Secondary figures: adapter embedding and prefill logits relative L2."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from gates.verdict import Verdict, at_most

MAX_ADAPTER_REL_L2 = 0.05  # the board measured 0.75-1.1 % in fp16; the first-N-rows mistake gave 156.97 %
MAX_PREFILL_REL_L2 = 0.05  # the board measured 0.43-1.48 % in fp16
MAX_NEW_TOKENS = 200
ADVICE = ("the exported graphs decode differently from the torch model: compare the figures above (adapter L2 "
          "points at pooling, prefill L2 at the decoder cut)")


def relative_l2(reference, test) -> float:
    reference = np.asarray(reference, dtype=np.float64)
    test = np.asarray(test, dtype=np.float64)
    if reference.shape != test.shape:
        raise ValueError(f"shape mismatch: reference {reference.shape} vs test {test.shape}")
    return float(np.linalg.norm(reference - test) / np.linalg.norm(reference))


def first_divergence(reference: list[int], test: list[int]) -> int | None:
    """Index of the first differing token (a length difference counts), or None when identical."""
    for index, (a, b) in enumerate(zip(reference, test)):
        if a != b:
            return index
    return None if len(reference) == len(test) else min(len(reference), len(test))


def token_verdict(name: str, reference: list[int], test: list[int]) -> Verdict:
    """Passes only for identical sequences; the value is the number of tokens from the first divergence on."""
    index = first_divergence(reference, test)
    differing = 0 if index is None else max(len(reference), len(test)) - index
    detail = f"{len(reference)} tokens identical" if index is None else (
        f"first divergence at token {index}: reference {reference[index:index + 3]} vs {test[index:index + 3]}")
    return at_most(name, differing, 0, "tokens", detail)


def margin_explained_verdict(name: str, reference: list[int], reference_logits: list[np.ndarray],
                             test: list[int]) -> Verdict:
    """For an fp16 path: identical tokens, or a first divergence where the fp32 top-2 logit margin is below
    fp16 resolution (one fp16 spacing at the top logit's magnitude), i.e. a tie fp16 cannot resolve."""
    index = first_divergence(reference, test)
    if index is None:
        return at_most(name, 0, 0, "unexplained divergences", f"{len(reference)} tokens identical")
    if index >= len(reference_logits):
        return at_most(name, 1, 0, "unexplained divergences", f"length differs at token {index}")
    top = np.sort(np.asarray(reference_logits[index], dtype=np.float64))[::-1]
    margin, resolution = top[0] - top[1], float(np.spacing(np.float16(abs(top[0]))))
    explained = margin < resolution
    return at_most(name, 0 if explained else 1, 0, "unexplained divergences",
                   f"first divergence at token {index}: fp32 top-2 margin {margin:.4g}, fp16 resolution "
                   f"{resolution:.4g} at |logit| {abs(top[0]):.4g} ({'explained' if explained else 'NOT explained'})")


def probe_audio(placeholders: int, hop: int = 160, seed: int = 0) -> np.ndarray:
    """Deterministic audio (a chirp in noise) giving exactly `placeholders` audio tokens at 16 kHz."""
    samples = placeholders * 8 * hop
    t = np.arange(samples) / 16000.0
    rng = np.random.default_rng(seed + placeholders)
    chirp = 0.3 * np.sin(2 * np.pi * (200.0 + 400.0 * t) * t)
    return (chirp + 0.02 * rng.standard_normal(samples)).astype(np.float32)


def _padded(features: np.ndarray, contract: dict) -> np.ndarray:
    """Features zero-padded to the encoder's fixed frame count, as the runtime feeds them."""
    padded = np.zeros((contract["mel_bins"], contract["max_frames"]), np.float32)
    padded[:, : features.shape[1]] = features
    return padded


def graph_verdicts(model, plan_dir: Path, backend_for=None, max_new_tokens: int = MAX_NEW_TOKENS,
                   stress: bool = True, say=print) -> list[Verdict]:
    """Run the exported graphs (onnxruntime unless `backend_for` says otherwise) against the torch FP32 model:
    per adapter bucket tokens + relative L2 figures, then the stress run through the largest K/V bucket."""
    import torch

    from runtime.kv_buckets import Audio8Runtime, Timings
    from runtime.mel import log_mel

    verdicts = []
    with Audio8Runtime(plan_dir, backend_for=backend_for) as runtime:
        contract = runtime.contract
        for tokens in contract["adapter_tokens"]:
            audio = probe_audio(tokens, contract["hop"])
            features = log_mel(audio, contract["mel_bins"])
            placeholders = runtime.check_audio(audio.size)
            padded = torch.from_numpy(_padded(features, contract))
            with torch.no_grad():
                reference_audio = model.adapter(model.encoder(padded), placeholders).numpy()
            reference = model.greedy(model.prompt_embeddings(padded, placeholders), max_new_tokens)
            timings = Timings()
            embeds = runtime.prompt_embeddings(features, placeholders, timings)
            slots = np.array(runtime.prompt_ids(placeholders)) == contract["prompt"]["audio_token_id"]
            decoded = runtime.decode(embeds, max_new_tokens, keep_logits=True, timings=timings)
            with torch.no_grad():
                reference_logits = model.decoder(inputs_embeds=torch.from_numpy(embeds)).logits[0, -1].numpy()
            verdicts += [
                token_verdict(f"greedy_tokens[T{tokens}]", reference, decoded.tokens),
                at_most(f"adapter_rel_l2[T{tokens}]", relative_l2(reference_audio, embeds[0][slots]),
                        MAX_ADAPTER_REL_L2, "ratio", "adapter graph vs torch adaptive pooling"),
                at_most(f"prefill_logits_rel_l2[T{tokens}]", relative_l2(reference_logits, decoded.step_logits[0]),
                        MAX_PREFILL_REL_L2, "ratio", "prefill graph vs torch on the same embeddings"),
            ]
            say(f"T{tokens}: {len(decoded.tokens)} tokens, ends with EOS: "
                f"{decoded.tokens[-1] == contract['prompt']['eos_token_id']}, buckets {decoded.buckets}")
        if stress:
            verdicts.append(stress_verdict(model, runtime, say))
    return verdicts


def stress_verdict(model, runtime, say=print) -> Verdict:
    """Largest prompt, EOS ignored, through the last position of the largest bucket: tokens vs the torch forced run."""
    import torch

    from runtime.kv_buckets import Timings
    from runtime.mel import log_mel

    contract = runtime.contract
    tokens = max(contract["adapter_tokens"])
    features = log_mel(probe_audio(tokens, contract["hop"]), contract["mel_bins"])
    embeds = runtime.prompt_embeddings(features, tokens, Timings())
    length = embeds.shape[1]
    count = max(contract["kv_buckets"]) - length + 1  # the last token is never fed back, so needs no position
    decoded = runtime.decode(embeds, count, ignore_eos=True)
    reference = model.forced_greedy(torch.from_numpy(embeds), count)
    say(f"stress: {count} tokens from a {length}-token prompt, buckets {decoded.buckets}, migrations "
        f"{[(m['from'], m['to'], round(m['ms'], 2)) for m in decoded.timings.migrations]}")
    return token_verdict(f"stress_tokens[S{length}+{count}]", reference, decoded.tokens)
