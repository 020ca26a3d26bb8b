"""`convert`: one sub-command per family plus build / check / inspect / engines.

Families are discovered from `rkaudio.families` (rkaudio.cli.commands.register): each family's
`register(app, check_app)` adds its commands. Heavy imports (torch, onnx, the model packages) happen inside
the commands, so `--help` is fast. Errors a user can hit end in one clean line with the exit code that
`rkaudio.core.errors` assigns them (2 setup, 3 gate, 4 dead build child)."""
from __future__ import annotations

import signal
import sys
from pathlib import Path

import typer

from rkaudio.cli import commands
from rkaudio.core.errors import exit_code

app = typer.Typer(
    name="convert",
    help="Turn TTS/ASR checkpoints into validated fp16 .rknn engines for Rockchip NPUs. "
    "Every artifact passes numeric gates (SNR against fp32, REGTASK log, CPU placement) before it is written.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
check_app = typer.Typer(help="End-to-end checks that run a family's runtime path (a windowed decoder, a ladder, "
                        "an ODE) through its engines.", no_args_is_help=True)
app.add_typer(check_app, name="check")

# Old spellings of renamed flags, accepted (and not shown) for one release.
FLAG_ALIASES = {"--min-snr": "--min-snr-db", "--min-simulator-snr-db": "--min-snr-db"}


def _register_all() -> None:
    commands.register(app, check_app)


def _respell(argv: list[str]) -> list[str]:
    """argv with every old flag spelling (`--old` or `--old=value`) replaced by the current one."""
    out = []
    for arg in argv:
        flag, sep, value = arg.partition("=")
        out.append(FLAG_ALIASES[flag] + sep + value if flag in FLAG_ALIASES else arg)
    return out


def _terminated(signum, _frame) -> None:
    """SIGTERM (CI cancellation, `timeout`) unwinds like Ctrl-C: every `finally` runs, so the compiler child
    is killed and no staging directory stays behind."""
    raise SystemExit(128 + signum)


def _program_name() -> str:
    """What the user typed: `rkaudio` or `convert` (the console scripts); `convert` for `python -m rkaudio.cli`."""
    typed = Path(sys.argv[0]).name
    return typed if typed in ("convert", "rkaudio") else "convert"


def main() -> None:
    _register_all()
    signal.signal(signal.SIGTERM, _terminated)
    try:
        app(args=_respell(sys.argv[1:]), prog_name=_program_name())
    except Exception as error:
        code = exit_code(error)
        if code is None:
            raise
        typer.secho(f"error: {error}", fg=typer.colors.RED, err=True)
        sys.exit(code)


if __name__ == "__main__":
    main()
