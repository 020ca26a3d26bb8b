"""Weight-norm fold: bake `g * v / ||v||` into a plain weight before tracing."""
from __future__ import annotations

import copy


def fold_weight_norm(module):
    """Replace every weight-normalised parameter by its plain weight: left in, the norm traces to
    ReduceL2 nodes that `rknn.build` aborts on."""
    import torch
    from torch.nn.utils import parametrize
    from torch.nn.utils.weight_norm import WeightNorm

    with torch.no_grad():  # old-style weight norm leaves a non-leaf `weight` that deepcopy refuses
        for sub in module.modules():
            for hook in sub._forward_pre_hooks.values():
                if isinstance(hook, WeightNorm):
                    hook(sub, None)
    module = copy.deepcopy(module)
    for sub in module.modules():
        if parametrize.is_parametrized(sub):
            for name in list(sub.parametrizations.keys()):
                parametrize.remove_parametrizations(sub, name, leave_parametrized=True)
        for hook in list(sub._forward_pre_hooks.values()):
            if isinstance(hook, WeightNorm):  # old-style torch.nn.utils.weight_norm (weight_g / weight_v)
                torch.nn.utils.remove_weight_norm(sub, hook.name)
    return module
