"""The Kokoro generator's export verdicts: the exported ONNX against the torch graph it was traced from, the
module against kokoro's own Generator, and a padded window against the same frames unpadded."""
from __future__ import annotations

from pathlib import Path

from converters.families.kokoro.graph import OUTPUT, float64, interior, prepare, run_torch, window_inputs

MIN_EXPORT_DB = 124.6  # exported ONNX fp32 vs the torch graph in float64, same sine form, the spec's level: real walk
# windows of the embedded model measure 127.0-135.6 dB here; random N(0,1) windows (the small test models) 122.9 dB
# at real size, so a source without a kokoro-onnx model to tap gates at RANDOM_WINDOW_EXPORT_DB instead.
RANDOM_WINDOW_EXPORT_DB = 115.0
MIN_REFERENCE_DB = 100.0  # exact-sine module vs kokoro's Generator on the same fp32 weights (spec 60.5 vs q8_0)
MIN_PADDED_DB = 135.0  # padded window vs the same frames unpadded (spec 135.1)


def onnx_outputs(path: Path, feeds: dict):
    """spec_phase of the ONNX at `path` in onnxruntime fp32, as float64."""
    import numpy as np

    from runtime.backends import OnnxBackend

    return OnnxBackend(path).run(feeds, [OUTPUT])[OUTPUT].astype(np.float64)


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
