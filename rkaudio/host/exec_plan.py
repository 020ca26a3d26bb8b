"""The consumer's rules for `<family>.exec_plan` (spec: rknn-decoder-path.md, "Component execution plans"),
as a checker a package's `exec_plan.json` must pass: unknown options, components, fields, implementations,
artifact roles or params are errors, and an RKNN component must name each required role. The spec's table is
transcribed in OPTIONS; the options it lacks (`audio8_asr.exec_plan`, `example.exec_plan`, `vocoder.exec_plan`) are
rkaudio's own and sit at its end. Stdlib only: the board kit can run it too."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Tuple

from rkaudio.board.contract import EngineContract

FIELDS = ("impl", "backend", "artifacts", "params")
RETAIN = "default"  # `impl=default` (or an empty object) keeps a component's existing selection


@dataclass(frozen=True)
class Role:
    required: bool = True
    ladder: bool = False  # a comma-separated list of engines (per width, length, layer, ...) rather than one


@dataclass(frozen=True)
class Component:
    impls: Tuple[str, ...]
    roles: Dict[str, Role] = field(default_factory=dict)  # RKNN artifact roles; "<n>" in a name matches digits
    params: Dict[str, Callable[[object], bool]] = field(default_factory=dict)  # RKNN params: name -> valid value


def _nonnegative_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


RKNN = ("ggml", "rknn")
MAIN, LADDER = Role(), Role(ladder=True)
OPTIONS: Dict[str, Dict[str, Component]] = {
    "piper_tts.exec_plan": {
        "decoder": Component(RKNN, {"main": MAIN}),
        "duration_encoder": Component(RKNN, {"main": LADDER}),
        "duration_flows": Component(("ggml",)),
    },
    "kokoro_tts.exec_plan": {
        "generator": Component(RKNN, {"main": MAIN},
                               {"overlap": _nonnegative_int, "gain": lambda value: isinstance(value, bool)}),
    },
    "qwen3_tts.exec_plan": {
        "speech_decoder": Component(RKNN, {"main": MAIN, "first": Role(required=False),
                                           "window": Role(required=False)}),
    },
    "sanotts.exec_plan": {"decoder": Component(("default", "ggml", "neon"))},
    "inflect_v2.exec_plan": {"decoder": Component(RKNN, {"main": MAIN})},
    "cosyvoice3.exec_plan": {"flow": Component(RKNN, {"main": LADDER})},
    # Not in the spec's table (rkaudio's own plans):
    "audio8_asr.exec_plan": {
        "encoder": Component(("rknn",), {"main": MAIN}),
        "adapter": Component(("rknn",), {"main": MAIN}),  # one engine for every placeholder count (pooling input)
        "prefill": Component(("rknn",), {"main": MAIN}),  # one engine for every prompt length (right-padded)
        # one step engine per K/V bucket (every layer in one call), the LM head in shards
        "decoder": Component(("rknn",), {"step_<n>": MAIN, "head": LADDER}),
    },
    "example.exec_plan": {"conv": Component(("rknn",), {"main": LADDER})},
    # any decoder walked over one fixed window (`convert build --window`, rkaudio/families/vocoder)
    "vocoder.exec_plan": {"decoder": Component(("rknn",), {"main": MAIN})},
}


def role_matches(pattern: str, role: str) -> bool:
    """Whether an artifact role fills a role pattern ("<n>" in a pattern matches digits: `step_<n>`)."""
    return re.fullmatch(re.escape(pattern).replace(re.escape("<n>"), r"\d+"), role or "") is not None


def _role_rule(component: Component, role: str):
    for pattern, rule in component.roles.items():
        if role_matches(pattern, role):
            return pattern, rule
    return None, None


def component_problems(option: str, name: str, entry) -> List[str]:
    """What the consumer would refuse in one component's entry of `option`."""
    where = f"{option} component {name!r}"
    component = OPTIONS[option][name]
    if not isinstance(entry, dict):
        return [f"{where}: expected an object, got {type(entry).__name__}"]
    problems = [f"{where}: unknown field {key!r} (fields: {', '.join(FIELDS)})" for key in entry if key not in FIELDS]
    impl = entry.get("impl", RETAIN)
    if impl != RETAIN and impl not in component.impls:
        problems.append(f"{where}: impl {impl!r} is not one of {', '.join(component.impls)}")
    artifacts, params = entry.get("artifacts"), entry.get("params")
    if impl != "rknn":
        problems += [f"{where}: `{key}` is for impl rknn only (impl is {impl!r})" for key in ("artifacts", "params")
                     if key in entry]
        return problems
    if "backend" in entry:
        problems.append(f"{where}: impl rknn selects the NPU itself; omit `backend`")
    if not isinstance(artifacts, dict):
        return problems + [f"{where}: impl rknn needs `artifacts`, an object of role -> file(s)"]
    covered = set()
    for role, files in artifacts.items():
        pattern, rule = _role_rule(component, role)
        if rule is None:
            problems.append(f"{where}: unknown artifact role {role!r} (roles: {', '.join(component.roles) or 'none'})")
            continue
        covered.add(pattern)
        names = files.split(",") if isinstance(files, str) else None
        if not names or any(not part.strip() for part in names):
            problems.append(f"{where}: role {role!r} must name file(s) as one string, comma-separated for a ladder")
        elif len(names) > 1 and not rule.ladder:
            problems.append(f"{where}: role {role!r} takes one engine, not a ladder of {len(names)}")
    problems += [f"{where}: required artifact role {pattern!r} is missing" for pattern, rule in component.roles.items()
                 if rule.required and pattern not in covered]
    if params is not None:
        if not isinstance(params, dict):
            return problems + [f"{where}: `params` must be an object"]
        for key, value in params.items():
            if key not in component.params:
                problems.append(f"{where}: unsupported param {key!r} ({', '.join(component.params) or 'it takes none'})")
            elif not component.params[key](value):
                problems.append(f"{where}: param {key!r} = {value!r} is not valid")
    return problems


def plan_problems(plan) -> List[str]:
    """Every problem of an exec_plan.json document: {option: {component: entry}}. Empty: the consumer accepts it."""
    if not isinstance(plan, dict):
        return [f"exec_plan.json must hold an object of options, got {type(plan).__name__}"]
    problems = []
    for option, components in plan.items():
        if option not in OPTIONS:
            problems.append(f"unknown option {option!r} (options: {', '.join(OPTIONS)})")
        elif not isinstance(components, dict):
            problems.append(f"{option}: expected an object of components")
        else:
            for name, entry in components.items():
                if name not in OPTIONS[option]:
                    problems.append(f"{option}: unknown component {name!r} ({', '.join(OPTIONS[option])})")
                else:
                    problems += component_problems(option, name, entry)
    return problems


def shared_file_problems(plan, manifests: Dict[str, dict]) -> List[str]:
    """One engine file in several roles (Audio8's `step_<n>`, Qwen3's `first` and `main`) or listed for a whole
    ladder role: accepted only when the file's manifest lists a shape set for each role it fills (an engine of
    several shape sets, `shape_sets`); a fixed-shape engine fills one role. `manifests`: file name -> manifest."""
    problems = []
    for option, components in plan.items():
        for name, entry in (components.items() if isinstance(components, dict) else ()):
            roles_of: Dict[str, List[str]] = {}
            for role, files in ((entry.get("artifacts") or {}) if isinstance(entry, dict) else {}).items():
                for file_name in (files.split(",") if isinstance(files, str) else []):
                    roles_of.setdefault(file_name.strip(), []).append(role)
            for file_name, roles in roles_of.items():
                manifest = manifests.get(file_name)
                if manifest is None:
                    continue
                sets = manifest.get("shape_sets") or []
                # a set's contract names its role; the engine's own role stands for a set that does not
                listed = {EngineContract.from_json(entry_set["contract"]).role or manifest.get("role")
                          for entry_set in sets}
                if not sets and len(roles) > 1:
                    problems.append(f"{option} component {name!r}: {file_name} fills roles {roles} but is compiled for "
                                    "one shape set")
                elif sets:
                    problems += [f"{option} component {name!r}: {file_name} fills role {role!r} but lists no shape "
                                 f"set for it (its sets: {sorted(listed)})" for role in roles if role not in listed]
    return problems
