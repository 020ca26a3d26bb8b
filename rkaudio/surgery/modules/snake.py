"""Snake activation `x + sin(alpha*x)^2 / alpha` in NPU-friendly forms.

The NPU has no Sin on rk3588/rk3566 (it runs on the CPU), so the sine becomes a polynomial. Every form
works on `w = alpha*x/pi` (half-turns) and computes `h(w) = sin(pi*w)^2 / pi`, so that
`snake(x) = (pi/alpha) * (w + h(w))`: the scale pair is exact algebra that a family can fold into
the preceding affine and the following convolution (Kokoro does: rkaudio/families/kokoro/ada_snake.py).

Sine forms (`SINE_FORMS`):
- exact: the Sin node (reference; CPU on rk3588).
- clip:  clamp w to [-1, 1], odd degree-5 minimax sine, squared (the spec's `--no-sin-reduce`).
- floor: w - 2*Floor(w/2 + 1/2) then the same polynomial (the spec's range reduction; Floor is a CPU op).
- round: sin^2 has period pi, i.e. 1 in w: r = w - round(w) in [-1/2, 1/2] and h as an even degree-6
  minimax polynomial of r directly (no square pass). round(w) = relu(w + M) - M with M = 1.5*2^23 in the
  fp32 graph (exact round-to-nearest in fp32) and M = 1536 in the engine (`fp16_round_shift`): fp16 has a
  unit ulp in [1024, 2048), so the NPU rounds natively; the Relu shields the pair from being folded away.
"""
from __future__ import annotations

import copy
import functools
import math

import numpy as np
import torch

SINE_FORMS = ("exact", "clip", "floor", "round")
ROUND_SHIFT_FP32 = 1.5 * 2.0**23  # fp32 ulp is 1 in [2^23, 2^24)
ROUND_SHIFT_FP16 = 1536.0  # fp16 ulp is 1 in [1024, 2048)


def minimax(target, powers: tuple[int, ...], lo: float, hi: float, points: int = 4001) -> np.ndarray:
    """Coefficients c of sum(c_i * r**powers[i]) minimising the max error to `target` on [lo, hi] (an LP)."""
    from scipy.optimize import linprog

    r = np.linspace(lo, hi, points)
    basis = np.stack([r**p for p in powers], axis=1)
    f = target(r)
    ones = np.ones((points, 1))
    a_ub = np.vstack([np.hstack([basis, -ones]), np.hstack([-basis, -ones])])
    cost = np.zeros(len(powers) + 1)
    cost[-1] = 1.0
    result = linprog(cost, A_ub=a_ub, b_ub=np.concatenate([f, -f]),
                     bounds=[(None, None)] * len(powers) + [(0, None)])
    return result.x[: len(powers)]


@functools.cache
def sine_coefficients() -> tuple[float, ...]:
    """Odd degree-5 fit of sin(pi*c)/sqrt(pi) on c in [-1, 1] (its square is h)."""
    return tuple(minimax(lambda c: np.sin(np.pi * c) / math.sqrt(math.pi), (1, 3, 5), 0.0, 1.0))


@functools.cache
def sin2_coefficients(degree: int = 6) -> tuple[float, ...]:
    """Even fit (powers 2, 4, .., degree) of h(r) = sin(pi*r)^2/pi on r in [-1/2, 1/2], zero at 0 (so a masked
    0 stays 0). Sine-level SNR: 60.9 dB at degree 6, 91.9 dB at 8 (one more multiply-add per Snake)."""
    return tuple(minimax(lambda r: np.sin(np.pi * r) ** 2 / np.pi, tuple(range(2, degree + 1, 2)), 0.0, 0.5))


def _odd_sine_squared(c):
    c1, c3, c5 = sine_coefficients()
    c2 = c * c
    s = c * (c1 + c2 * (c3 + c2 * c5))
    return s * s


@functools.cache
def sin2_vertex(degree: int = 6) -> tuple[float, float, float]:
    """(c, a, b) with sin2_coefficients(6) = v*(c*(v + a)^2 + b), v = r^2: the same polynomial in vertex form."""
    if degree != 6:
        raise ValueError(f"the vertex form is the degree-6 polynomial's (asked for degree {degree})")
    c2, c4, c6 = sin2_coefficients(6)
    return c6, c4 / (2 * c6), c2 - c4 * c4 / (4 * c6)


def vertex_sin2(r, degree: int = 6):
    """The round form's polynomial as v*(c*(v + a)^2 + b) with both squares a Pow: on the NPU Pow(x, 2) is one
    unary pass and Horner's v*q products read two tensors, so this is 2 full-tensor reads fewer per Snake."""
    c, a, b = sin2_vertex(degree)
    v = torch.pow(r, 2)
    return v * (c * torch.pow(v + a, 2) + b)


def half_turn_sin2(w, form: str, round_shift, degree: int = 6, evaluation: str = "horner"):
    """h(w) = sin(pi*w)^2/pi in the given form (torch tensors); `round_shift` is a tensor holding M; `degree`
    is the round form's polynomial degree; `evaluation` how the round form evaluates it ("horner": r*r and
    Horner's rule; "vertex": `vertex_sin2`, degree 6 only)."""
    if form == "exact":
        s = torch.sin(w * math.pi)
        return s * s * (1.0 / math.pi)
    if form == "clip":
        return _odd_sine_squared(torch.clamp(w, -1.0, 1.0))
    if form == "floor":
        return _odd_sine_squared(w - 2.0 * torch.floor(w * 0.5 + 0.5))
    if form == "round":
        r = w - (torch.relu(w + round_shift) - round_shift)
        if evaluation == "vertex":
            return vertex_sin2(r, degree)
        v = r * r
        coefficients = sin2_coefficients(degree)
        horner = coefficients[-1]
        for coefficient in reversed(coefficients[:-1]):
            horner = coefficient + v * horner
        return v * horner
    raise ValueError(f"unknown sine form {form!r}; one of {SINE_FORMS}")


def half_turn_sin2_reference(w: np.ndarray, form: str, degree: int = 6) -> np.ndarray:
    """The same forms in numpy float64 with exact rounding (the tests' independent reference)."""
    w = np.asarray(w, dtype=np.float64)
    if form == "exact":
        return np.sin(np.pi * w) ** 2 / np.pi
    c1, c3, c5 = sine_coefficients()
    if form in ("clip", "floor"):
        c = np.clip(w, -1, 1) if form == "clip" else w - 2 * np.floor(w / 2 + 0.5)
        return (c1 * c + c3 * c**3 + c5 * c**5) ** 2
    if form == "round":
        r = w - np.round(w)
        return sum(b * r ** (2 * (i + 1)) for i, b in enumerate(sin2_coefficients(degree)))
    raise ValueError(form)


def reduce_snake_sine(module, form: str):
    """A copy whose every Snake unit (any submodule with a `sine_form`: AdaSnakeConv here, the Qwen3 vocoder's
    SnakeBeta) evaluates its sine in `form` (see SINE_FORMS): the NPU has no Sin on rk3588/rk3566."""
    if form not in SINE_FORMS:
        raise ValueError(f"unknown sine form {form!r}; one of {SINE_FORMS}")
    module = copy.deepcopy(module)
    for unit in module.modules():
        if hasattr(unit, "sine_form"):
            unit.sine_form = form
    return module
