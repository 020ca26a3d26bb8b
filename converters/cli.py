"""`convert`: one sub-command per family plus build / check / inspect / engines.

Families are discovered from `converters.families`: each module's `register(app)` adds its commands.
Heavy imports (torch, onnx, the model packages) happen inside the commands, so `--help` is fast."""
from __future__ import annotations

import importlib
import pkgutil
import sys

import typer

from converters.toolkit import SetupError
from gates.verdict import GateFailure

app = typer.Typer(
    name="convert",
    help="Turn TTS/ASR checkpoints into validated fp16 .rknn engines for Rockchip NPUs. "
    "Every artifact passes numeric gates (SNR against fp32, REGTASK log, CPU placement) before it is written.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
check_app = typer.Typer(help="End-to-end checks that render audio through the windowed engine path.", no_args_is_help=True)
app.add_typer(check_app, name="check")


def _register_all() -> None:
    import converters.families as families
    importlib.import_module("converters.spine_commands").register(app, check_app)
    from converters import recipes

    recipes.register(app)

    for info in sorted(pkgutil.iter_modules(families.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"converters.families.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(app, check_app)


def main() -> None:
    _register_all()
    try:
        app()
    except (SetupError, GateFailure) as error:
        typer.secho(f"error: {error}", fg=typer.colors.RED, err=True)
        sys.exit(2 if isinstance(error, SetupError) else 3)


if __name__ == "__main__":
    main()
