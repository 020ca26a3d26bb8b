"""`convert --help` and every sub-command's `--help` explain every option: walks all registered commands,
the discovered families' included, so a new option without help text fails here."""
import pytest
import typer
from typer.testing import CliRunner

from rkaudio import cli
from rkaudio.cli.commands import SHARED_COMMANDS
from rkaudio.cli.families import declaration, family_names


def _walk(app: typer.Typer):
    root = typer.main.get_command(app)
    found, stack = [], [((), root)]
    while stack:
        path, command = stack.pop()
        found.append((path, command))
        stack += [((*path, name), sub) for name, sub in getattr(command, "commands", {}).items()]
    return sorted(found, key=lambda item: item[0])


def _undocumented(command) -> list[str]:
    return [param.name for param in command.params
            if param.name != "help" and not (getattr(param, "help", None) or "").strip()]


if not cli.app.registered_commands:  # discovery runs once per process (main() does it at start)
    cli._register_all()
COMMANDS = _walk(cli.app)


def test_the_checker_catches_an_option_without_help():
    app = typer.Typer()

    @app.command()
    def bare(frames: int = typer.Option(8), out: str = typer.Option("x", help="Where to write.")) -> None:
        """A command with one undocumented option."""

    @app.command()
    def other() -> None:
        """Second command, so the app is a group."""

    commands = dict((path, command) for path, command in _walk(app))
    assert _undocumented(commands[("bare",)]) == ["frames"]


def test_the_release_and_example_commands_are_registered():
    paths = {path for path, _ in COMMANDS}
    assert ("engines",) in paths and ("example",) in paths and ("check",) in paths


@pytest.mark.parametrize("path,command", COMMANDS, ids=[" ".join(p) or "convert" for p, _ in COMMANDS])
def test_every_command_and_option_has_help(path, command):
    assert (command.help or "").strip(), f"`convert {' '.join(path)}` has no help text (give it a docstring)"
    missing = _undocumented(command)
    assert not missing, f"`convert {' '.join(path)}`: options without help text: {missing}"
    result = CliRunner().invoke(cli.app, [*path, "--help"])
    assert result.exit_code == 0, result.output


BUILD_OPTIONS = ("--target", "--toolkit", "--out", "--max-regtask-lines", "--fail-on-cpu-ops", "--min-snr-db")
# A family's own tools (e.g. `convert aperture`) read packages and build nothing: its declaration lists them.
TOOLS = [name for family in family_names() for name in declaration(family).tools]
FAMILY_COMMANDS = [(path, command) for path, command in COMMANDS if len(path) == 1
                   and path[0] not in (*SHARED_COMMANDS, "check", *TOOLS)]


@pytest.mark.parametrize("path,command", FAMILY_COMMANDS, ids=[p[0] for p, _ in FAMILY_COMMANDS])
def test_every_family_command_takes_the_same_build_options_and_writes_under_work(path, command):
    options = {name: param for param in command.params for name in param.opts}
    assert all(name in options for name in BUILD_OPTIONS), sorted(set(BUILD_OPTIONS) - set(options))
    assert str(options["--out"].default).startswith("work/"), options["--out"].default
    assert not {"--min-snr", "--min-simulator-snr-db"} & set(options), "old spellings live in cli.FLAG_ALIASES"


def test_old_flag_spellings_reach_the_new_name():
    argv = ["build", "x.onnx", "--min-snr", "30", "--min-simulator-snr-db=31", "--min-snr-db", "32", "--out", "o"]
    assert cli._respell(argv) == ["build", "x.onnx", "--min-snr-db", "30", "--min-snr-db=31", "--min-snr-db", "32",
                                  "--out", "o"]


def test_an_old_spelling_runs_through_main(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["convert", "build", str(tmp_path / "none.onnx"), "--target", "rk3588",
                                     "--min-snr", "30"])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2  # a setup error (no ONNX there), not a usage error about the flag
    assert "no ONNX model at" in capsys.readouterr().err


def test_every_family_command_is_made_from_its_declaration():
    """Each declared option is on the command, with the family's own defaults of the shared gates."""
    from rkaudio.cli.families import flag_of
    from rkaudio.pipeline.declaration import declared

    commands = dict(COMMANDS)
    for name in family_names():
        family = declaration(name)
        command = commands[(family.command_name,)]
        options = {opt: param for param in command.params for opt in param.opts}
        models = [family.source] + [c.options for c in family.components] + [c.gates for c in family.components]
        flags = {flag_of(model, field) for model in models for field in declared(model, "cli")}
        assert flags <= set(options), (name, sorted(flags - set(options)))
        gates = family.gates_model(family.components[0])
        assert options["--max-regtask-lines"].default == gates.model_fields["max_regtask_lines"].default
        assert options["--min-snr-db"].default == gates.model_fields["min_simulator_snr_db"].default


def test_a_check_whose_engines_is_not_the_shared_choice_is_refused_at_registration():
    """`engines` is the name of the shared EngineChoice: a check that gives it another type (an always-true
    `--engines/--onnx` bool once sent `convert check audio8` to rknnlite on the host) is refused, not replaced."""
    from typing import Annotated

    from rkaudio.cli.families import check_command
    from rkaudio.release.check import EngineChoice

    def check_with_a_flag(engines: Annotated[bool, typer.Option("--engines/--onnx", help="x")] = False) -> None:
        """A check that means its own flag."""

    def check_with_the_choice(engines: EngineChoice, text: Annotated[str, typer.Option(help="x")] = "") -> None:
        """A check that takes the shared choice."""

    with pytest.raises(ValueError, match="declares `engines` as .*EngineChoice"):
        check_command(declaration("example"), check_with_a_flag)
    options = [name for name in check_command(declaration("example"), check_with_the_choice).__signature__.parameters]
    assert options == ["text", "backend", "target", "toolkit", "package"]
