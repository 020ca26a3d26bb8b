"""The small random-init Kokoro generator the Kokoro tests share (`from tests.kokoro.kokoro_small import ...`, as
tests/structure does: pytest runs in importlib mode from the repository root)."""
from __future__ import annotations

import torch

from converters.families.kokoro.generator import GeneratorConfig
from converters.families.kokoro.reference import reference_generator

SMALL = GeneratorConfig(style_dim=8, upsample_initial_channel=16)


def small_reference(seed: int = 0, gains: bool = True) -> tuple[torch.nn.Module, dict]:
    """The reference Generator (weight norm in) with non-trivial Snake alphas (and weight-norm gains), and a copy
    of its state dict."""
    torch.manual_seed(seed)
    reference = reference_generator(SMALL).eval()
    with torch.no_grad():
        for name, parameter in reference.named_parameters():
            if "alpha" in name:
                parameter.uniform_(0.5, 3.0)
            elif gains and name.endswith("weight_g"):
                parameter.uniform_(0.5, 1.5)
    return reference, {k: v.clone() for k, v in reference.state_dict().items()}
