"""The families (rkaudio/families/<name>/, each exporting `FAMILY = rkaudio.pipeline.declaration.Family(...)`)
and the `convert <family>` command made from each declaration: its switches (`--encoder`), `[source]` fields,
every component's options, its own gates, then the shared options (target, toolkit, out, --skip-rknn, --onnx and
the shared gates at the family's defaults). The command validates what it was given against the declaration and
runs `rkaudio.pipeline.pipeline.run`, the call a recipe makes too."""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import typing
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from rkaudio.cli.options import FromOnnx, OutDir, SkipRknn, TargetOption, ToolkitOption, gate_option
from rkaudio.core.errors import SetupError
from rkaudio.core.paths import work_dir
from rkaudio.toolkit.versions import DEFAULT_TOOLKIT

FAMILIES_PACKAGE = "rkaudio.families"
SHARED = ("target", "toolkit", "out", "skip_rknn", "onnx")


def family_names() -> list[str]:
    """Every family package (or module) under rkaudio/families/, by name."""
    import rkaudio.families as families

    return sorted(info.name for info in pkgutil.iter_modules(families.__path__))


def declaration(name: str):
    """The `Family` of rkaudio/families/<name>/, or a SetupError naming what was expected."""
    from rkaudio.pipeline.schema import closest

    try:
        module = importlib.import_module(f"{FAMILIES_PACKAGE}.{name}")
    except ModuleNotFoundError as error:
        if error.name != f"{FAMILIES_PACKAGE}.{name}":
            raise
        guess = closest(name, family_names())
        raise SetupError(f"no family '{name}' (expected rkaudio/families/{name}/)"
                         + (f"; did you mean {guess}?" if guess else "")) from None
    family = getattr(module, "FAMILY", None)
    if family is None:
        raise SetupError(f"rkaudio/families/{name} declares no FAMILY = Family(...)")
    return family


def flag_of(model, name: str) -> str:
    from rkaudio.pipeline.declaration import field_extra

    return field_extra(model, name)["flag"] or "--" + name.replace("_", "-")


def _is_int_list(annotation) -> bool:
    return typing.get_origin(annotation) is list and typing.get_args(annotation) == (int,)


def _cli_type(annotation):
    """What typer parses a field as: its own type, a comma-separated string for a list of integers, str for a
    choice (pydantic checks the choice) or anything else the family parses itself (`option(cli_parse=...)`)."""
    optional = type(None) in typing.get_args(annotation)
    inner = next((a for a in typing.get_args(annotation) if a is not type(None)), annotation) if optional else annotation
    kind = inner if inner in (int, float, str, bool, Path) else str
    return Optional[kind] if optional else kind


def _cli_default(model, name: str):
    from rkaudio.pipeline.declaration import SAME_DEFAULT, field_extra

    info, extra = model.model_fields[name], field_extra(model, name)
    default = info.default if extra["cli_default"] == SAME_DEFAULT else extra["cli_default"]
    if _is_int_list(info.annotation) and isinstance(default, (list, tuple)):
        return ",".join(map(str, default))
    return default


def _parameter(model, name: str, default=None) -> inspect.Parameter:
    from rkaudio.pipeline.declaration import field_extra

    info, extra = model.model_fields[name], field_extra(model, name)
    flag = flag_of(model, name)
    if extra["negatable"]:
        flag = f"{flag}/--no-{flag[2:]}"
    names = (flag, extra["short"]) if extra["short"] else (flag,)
    annotation = Annotated[_cli_type(info.annotation), typer.Option(*names, help=info.description)]
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                             default=_cli_default(model, name) if default is None else default)


def _parsed(model, name: str, value: Any) -> Any:
    """A command-line value in the declared type: comma lists, the family's own parser."""
    from rkaudio.pipeline.declaration import field_extra

    parse = (model.model_fields[name].json_schema_extra or {}).get("cli_parse")
    if value is None or parse is None and not _is_int_list(model.model_fields[name].annotation):
        return value
    if parse is not None:
        return parse(value)
    try:
        return [int(part) for part in str(value).replace(" ", "").split(",") if part]
    except ValueError:
        raise SetupError(f"{flag_of(model, name)} {value!r}: expected comma-separated integers, e.g. 128,192") from None


def _validated(model, values: dict, label: str):
    """`model` of the command-line values, every problem named by its flag."""
    from pydantic import ValidationError

    from rkaudio.pipeline.declaration import subset

    cli_model = subset(model, "cli")
    data = {name: _parsed(cli_model, name, values[name]) for name in cli_model.model_fields}
    try:
        return cli_model.model_validate(data, strict=False)
    except ValidationError as error:
        from rkaudio.pipeline.schema import message

        lines = [(f"{flag_of(cli_model, str(record['loc'][0]))}: " if record["loc"] else "")
                 + f"{message(record)}, got {record.get('input')!r}" for record in error.errors()]
        raise SetupError(f"{label}: " + "; ".join(lines)) from None


def family_command(family):
    """The `convert <family>` function of a declaration, with a signature typer reads as its options."""
    from rkaudio.pipeline.declaration import BuildGates, declared, subset

    parameters: dict[str, inspect.Parameter] = {}
    for component in family.components[1:]:
        if component.switch is not None:
            flag, text = component.switch
            parameters[component.name] = inspect.Parameter(
                component.name, inspect.Parameter.KEYWORD_ONLY, default=False,
                annotation=Annotated[bool, typer.Option(flag, help=text)])
    models = [family.source] + [family.options_model(c) for c in family.components] + [c.gates for c in family.components]
    for model in models:
        for name in declared(model, "cli"):
            parameters.setdefault(name, _parameter(model, name))
    gates = family.gates_model(family.components[0])
    shared = {
        "target": (TargetOption, "rk3588"), "toolkit": (ToolkitOption, DEFAULT_TOOLKIT),
        "out": (OutDir, work_dir(family.name)), "skip_rknn": (SkipRknn, False), "onnx": (FromOnnx, None),
        **{name: (gate_option(name), gates.model_fields[name].default) for name in BuildGates.model_fields},
    }
    for name, (annotation, default) in shared.items():
        parameters[name] = inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                                             default=default)

    def command(**values) -> None:
        from rkaudio.pipeline import pipeline
        from rkaudio.pipeline.declaration import Job

        chosen = [c for c in family.components[1:] if c.switch is not None and values.get(c.name)]
        if len(chosen) > 1:
            raise SetupError(f"give one of {', '.join(c.switch[0] for c in chosen)}")
        component = chosen[0] if chosen else family.components[0]
        label = f"convert {family.command_name}"
        job = Job(family, component, _validated(family.source, values, label),
                  _validated(family.options_model(component), values, label),
                  _validated(family.gates_model(component), values, label),
                  values["target"], Path(values["out"]), values["toolkit"])
        pipeline.run(job, skip_rknn=values["skip_rknn"], from_onnx=values["onnx"],
                     say=typer.echo)

    command.__signature__ = inspect.Signature(list(parameters.values()))
    command.__doc__ = family.help
    command.__name__ = f"convert_{family.name}"
    return command


def check_command(family, check):
    """`convert check <name>`: the family's check as declared, plus, when it takes `engines`
    (rkaudio.release.check.EngineChoice), the options every check shares: --backend, --target, --toolkit and
    --package, made into that choice. `engines` is that choice or nothing: a parameter of that name with another
    type would be replaced by it silently (an always-true `--engines` flag once sent a check to rknnlite)."""
    import functools

    from rkaudio.release.check import Backend, EngineChoice, Package

    signature = inspect.signature(check, eval_str=True)
    if "engines" not in signature.parameters:
        return check
    if signature.parameters["engines"].annotation is not EngineChoice:
        raise ValueError(f"check {check.__name__} declares `engines` as "
                         f"{signature.parameters['engines'].annotation!r}: that name is the shared "
                         "rkaudio.release.check.EngineChoice (--backend, --target, --toolkit, --package); "
                         "annotate it so, or name the parameter otherwise")
    shared = {"backend": (Backend, "onnx"), "target": (TargetOption, "rk3588"), "toolkit": (ToolkitOption, DEFAULT_TOOLKIT),
              "package": (Package, None)}
    own = [p for name, p in signature.parameters.items() if name != "engines"]
    taken = {p.name for p in own} & set(shared)
    if taken:
        raise ValueError(f"check {check.__name__} declares {sorted(taken)}, which every check shares")
    parameters = own + [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
                        for name, (annotation, default) in shared.items()]

    @functools.wraps(check)
    def command(**values) -> None:
        choice = EngineChoice(family.name, values.pop("backend"), values.pop("target"), values.pop("toolkit"),
                              values.pop("package"), declaration)
        check(engines=choice, **values)

    command.__signature__ = inspect.Signature(parameters)
    return command


def register(app: typer.Typer, check_app: typer.Typer) -> None:
    """Every family's `convert <name>`, its `convert check <name>` and its extra commands."""
    for name in family_names():
        family = declaration(name)
        app.command(family.command_name)(family_command(family))
        for check_name, check in family.checks.items():
            check_app.command(check_name)(check_command(family, check))
        for tool_name, tool in family.tools.items():
            app.command(tool_name)(tool)
