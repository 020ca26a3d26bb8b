"""The SoCs rkaudio builds for, and what is known about each: which targets build fp16 engines, how many NPU
cores each has, and the register-field limits that shape its graphs. Every per-SoC fact is stated here once; the
CLI, the build, the exporters and the board self-test read it from here. Shipped in the self-test kit: the stdlib
only, Python 3.8 syntax."""
from __future__ import annotations

from rkaudio.board.errors import SetupError

# Targets that build fp16 (w16a16) with both toolkits (measured on this machine kind).
FP16_TARGETS = ("rk3588", "rk3576", "rk3566", "rk3568", "rk3562")
# The SoCs every shipped recipe answers for: each builds there, or its recipe's `refused` says why not (measured).
PROMISED_TARGETS = ("rk3588", "rk3576", "rk3566")
REFUSED_TARGETS = {
    "rv1106": "rv1106 has no fp16 build (the toolkit says 'not support do_quantization = False'); "
    "rkaudio builds fp16 engines only, because Snake activations make int8 audibly noisy",
    "rv1103": "rv1103 has no fp16 build (same NPU generation as rv1106); rkaudio builds fp16 engines only",
}

# NPU cores per SoC, by the name its device tree gives (/proc/device-tree/compatible): what the self-test's core
# masks can address (RK3588 has 3, RK3576 2, RK3566/RK3568/RK3562 1).
NPU_CORES = {"rk3588": 3, "rk3588s": 3, "rk3576": 2, "rk3566": 1, "rk3568": 1, "rk3562": 1}

# Register-field limits: past them the compiler logs REGTASK field-overflow lines (the build's REGTASK gate).
# The longest full-rate time axis a target's op registers hold (the REGTASK "limit" field, measured on this
# toolkit: rk3576 0x3fff, rk3566/rk3568 0x1fff; rk3588 and rk3562 log no REGTASK line even at 65537 samples,
# so they have no entry). A decoder window (Piper, Inflect) runs every upsampling level whose full-rate axis
# overflows it in polyphase form (rkaudio/surgery/graph/polyphase_levels.py: overflowing_levels, polyphase_levels).
TIME_FIELD_LIMIT = {"rk3576": 0x3FFF, "rk3566": 0x1FFF, "rk3568": 0x1FFF}
# The NPU encodes a Concat/Slice/conv axis in a 13-bit field: along a time axis longer than this the rk3588
# compiler logs REGTASK lines (measured: 10240 samples logs them, 7680 does not). So the row forms (the Kokoro
# generator's fine stage, the Qwen3 decoder step) hold no time axis past it: they work on rows [1, C, rows,
# row_length] of consecutive samples with a halo (rkaudio/surgery/modules/rows.py).
ROW_SAMPLES_LIMIT = 8191
# The widest 1-D conv kernel, and the widest pad, whose padding the compiler keeps inside the conv: past either, a
# conv whose input channels are neither 1 nor a multiple of PAD_LAYER_CHANNEL_MULTIPLE gets its padding as a Pad
# layer on the CPU (toolkit 2.3.2 on [1, C, 4096], rk3588 and rk3576: C = 4 and 12 with kernel 17 pad 8, kernel 41
# pad 20, kernel 7 pad 20 do; C = 1, 8, 16, 24, 32 with the same, and C = 16 with kernel 128 pad 64, do not; kernel
# 15 pad 7 and kernel 7 pad 12 at C = 12 do not). The RK3566, and toolkit 2.5.0 on the rk3588, keep every one of
# them inside the conv (PAD_LAYER_TOOLKITS). The pass: rkaudio.surgery.graph.conv_pad (its MAX_CONV_PAD is the pad).
PADDED_KERNEL_LIMIT = {"rk3588": 15, "rk3576": 15}
PAD_LAYER_CHANNEL_MULTIPLE = 8
PAD_LAYER_TOOLKITS = ("2.3.2",)
# The largest queries x keys plane of a rank-3 [heads, T, S] score tensor (heads >= 2) that the RK3566 compiler
# builds without REGTASK lines (toolkit 2.3.2, a Sigmoid or MatMul writing it): [2,1500,1200] and [8,1500,750] build
# clean; [2,1500,1500], [4,1400,1400] (1.96M) and [8,1500,1500] log lines at 1.02-1.20x the 0x1fff field. One head
# holds more ([1,2000,2000] clean, [1,3000,1500] not), and so does rank 4 ([1,4,1500,1500] clean), which the RK3566
# runs on its CPU. Past it the attention pass computes the heads apart (rkaudio.surgery.graph.attention.heads_apart).
HEADS_SCORE_PLANE_LIMIT = {"rk3566": 1_800_000}


class Target(str):
    """A target SoC as every step after its entry (a command's --target, a recipe, a Python API object) takes it:
    lower case and supported. `Target(name)` is the one check (SetupError naming a refused or unknown one); a Target
    passes through unchanged, so nothing downstream checks it again."""

    def __new__(cls, name: str) -> "Target":
        if isinstance(name, Target):
            return name
        target = str(name).lower()
        if target in REFUSED_TARGETS:
            raise SetupError(f"target {target} refused: {REFUSED_TARGETS[target]}")
        if target not in FP16_TARGETS:
            raise SetupError(f"unknown target {target!r}; supported: {', '.join(FP16_TARGETS)}")
        return super().__new__(cls, target)
