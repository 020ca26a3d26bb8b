"""The `kokoro` package's own Generator (kokoro/istftnet.py), imported without the package __init__
(which pulls misaki/transformers), and a way to read its conv_post output for a given `har`."""
from __future__ import annotations

import importlib.util
import sys
import types


def istftnet_module():
    """kokoro.istftnet loaded from its file; `kokoro` is registered as a bare namespace for its imports."""
    if "kokoro.istftnet" in sys.modules:
        return sys.modules["kokoro.istftnet"]
    spec = importlib.util.find_spec("kokoro")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the kokoro package is not installed in this venv")
    root = list(spec.submodule_search_locations)[0]
    if "kokoro" not in sys.modules:
        package = types.ModuleType("kokoro")
        package.__path__ = [root]
        sys.modules["kokoro"] = package
    for name in ("custom_stft", "istftnet"):
        full = f"kokoro.{name}"
        if full not in sys.modules:
            file_spec = importlib.util.spec_from_file_location(full, f"{root}/{name}.py")
            module = importlib.util.module_from_spec(file_spec)
            sys.modules[full] = module
            file_spec.loader.exec_module(module)
    return sys.modules["kokoro.istftnet"]


def reference_generator(config):
    """An untrained `kokoro.istftnet.Generator` of `config`'s architecture (weights loaded by the caller)."""
    c = config
    return istftnet_module().Generator(
        c.style_dim, list(c.resblock_kernel_sizes), list(c.upsample_rates), c.upsample_initial_channel,
        [list(d) for d in c.resblock_dilation_sizes], list(c.upsample_kernel_sizes), c.gen_istft_n_fft,
        c.gen_istft_hop_size)


def reference_spec_phase(generator, x, s, har):
    """The reference generator's conv_post output when its noise convolutions read `har` (hooks replace
    the har its own random source synthesis made, so both sides see the same conditioning)."""
    import torch

    frames = x.shape[-1]
    captured = {}
    hooks = [conv.register_forward_pre_hook(lambda _m, _args: (har,)) for conv in generator.noise_convs]
    hooks.append(generator.conv_post.register_forward_hook(lambda _m, _args, out: captured.setdefault("out", out)))
    try:
        with torch.no_grad():
            generator(x, s, torch.full((1, frames), 100.0))
    finally:
        for hook in hooks:
            hook.remove()
    return captured["out"]
