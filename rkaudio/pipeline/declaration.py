"""A family, declared once. `Family` names its components, its `[source]`, typed `Options` and `Gates` per component
(pydantic models: types, defaults, bounds, help text), its export, its recipe sources, its runtime loops and its
extra commands. The `convert <family>` command and its `--help` (rkaudio/cli/families.py), the recipe schema and
the recipe adapter (rkaudio/release/recipes.py) are derived from it, so a recipe key or a command option that
the family does not declare cannot exist.

Why pydantic: it is already in the export venv (huggingface_hub and typer's stack pull it), it validates strictly
(no "5" for 5, no unknown key) with per-field bounds, and its error records carry the key path, the input and the
kind of failure, from which `schema.problems` writes the one-line refusal."""
from __future__ import annotations

from dataclasses import dataclass, field, fields as dataclass_fields
from pathlib import Path
from typing import Any, Callable, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo

from rkaudio.board.contract import EngineContract
from rkaudio.board.soc import Target
from rkaudio.core.contract import make_contract
from rkaudio.engine.build import BuildOptions
from rkaudio.gates.real_time import RealTime
from rkaudio.toolkit.versions import Toolkit


class Table(BaseModel):
    """A recipe table or a command's option set: unknown keys, wrong types and out-of-range values are refused."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


SAME_DEFAULT = "<the recipe's default>"  # option(cli_default=...) unset: the command's default is the field's


def option(default: Any, help: str, *, flag: str | None = None, short: str | None = None, cli: bool = True,
           recipe: bool = True, negatable: bool = False, cli_default: Any = SAME_DEFAULT,
           cli_parse: Callable[[str], Any] | None = None, **bounds) -> Any:
    """One declared field: its default, help text and bounds (`ge`, `le`, `gt`, ...). `flag` is the option's
    spelling when it is not `--<field-name>`; `cli` / `recipe` say where it exists (a command-only switch, a
    recipe-only table); `negatable` makes a boolean `--x/--no-x`; `cli_default` is the command's default where it
    differs from the recipe's (the CLI builds the small example window, the recipe the release one); `cli_parse`
    turns the command's text into the declared type where a plain str/int/comma list does not fit (e.g. `--parts
    400:2,500:2` for an int-or-table field)."""
    extra = {"flag": flag, "short": short, "cli": cli, "recipe": recipe, "negatable": negatable,
             "cli_default": cli_default}
    if cli_parse is not None:
        extra["cli_parse"] = cli_parse
    return Field(default, description=help, json_schema_extra=extra, **bounds)


def field_extra(model: type[BaseModel], name: str) -> dict:
    """The `option(...)` markers of one field (defaults for a plain pydantic Field)."""
    extra = model.model_fields[name].json_schema_extra or {}
    return {"flag": None, "short": None, "cli": True, "recipe": True, "negatable": False,
            "cli_default": SAME_DEFAULT, **extra}


def declared(model: type[BaseModel], where: str) -> list[str]:
    """The field names of `model` that exist in `where` ("cli" or "recipe")."""
    return [name for name in model.model_fields if field_extra(model, name)[where]]


def subset(model: type[BaseModel], where: str) -> type[BaseModel]:
    """`model` restricted to the fields that exist in `where`: what a recipe table (or a command) may name."""
    names = declared(model, where)
    if names == list(model.model_fields):
        return model
    return create_model(f"{model.__name__}_{where}", __base__=Table,
                        **{name: (model.model_fields[name].annotation, model.model_fields[name]) for name in names})


class NoTable(Table):
    """A family (or component) that declares no fields here."""


_BUILD_DEFAULTS = {f.name: f.default for f in dataclass_fields(BuildOptions)}


class BuildGates(Table):
    """The gates `build_engine` applies, shared by every family (`[gates]` keys and command options alike).
    Their one fallback default is `BuildOptions`'s; a family states its own defaults in `Family.build_defaults`."""

    max_regtask_lines: int = option(
        _BUILD_DEFAULTS["max_regtask_lines"], "Fail the build past this many REGTASK field-overflow lines (an op's "
        "axis longer than its register field: the engine is corrupted on the board, and the simulator cannot see "
        "it). Raise it only on purpose.", ge=0)
    fail_on_cpu_ops: bool = option(
        _BUILD_DEFAULTS["fail_on_cpu_ops"], "Fail if the layer table places any compute op on the CPU "
        "(Input/OutputOperator and their rank-adapting Reshapes do not count).")
    max_cpu_ops: Optional[int] = option(
        _BUILD_DEFAULTS["max_cpu_ops"], "Fail past this many compute ops on the CPU (each is named in the manifest "
        "with the predicted ms it costs); unset: not gated, --fail-on-cpu-ops: 0.", ge=0)
    max_real_time_factor: Optional[float] = option(
        _BUILD_DEFAULTS["max_real_time_factor"], "Fail an engine that keeps a CPU op past this predicted board time "
        "per second of real time (the predicted board ms per call over the real time one call covers, which the "
        "family declares: 1.0 is real time; an all-NPU engine records it); unset: not gated.", gt=0)
    min_simulator_snr_db: float = option(
        _BUILD_DEFAULTS["min_simulator_snr_db"], "Fail when the simulator's output is below this SNR (dB) against "
        "onnxruntime fp32 (the exact fp32 twin where the engine graph has one).", flag="--min-snr-db")


class LadderChoice(Table):
    """The shared option of a ladder-shaped component (`Component.ladder`)."""

    ladder: Literal["static", "dynamic"] = option(
        "static", "static: one engine per rung (bucket, role), each with its own copy of the weights. dynamic: one "
        "engine compiled for every rung's shapes (rknn-toolkit2 dynamic_input), the weights stored once; opt-in "
        "until a board run of its kit passes (the simulator has missed board failures of dynamic engines).")


def build_options(gates: BaseModel, target: str, toolkit: str, reproduce: bool = False,
                  real_time: Callable | None = None) -> BuildOptions:
    """The `BuildOptions` of a validated gates table (its shared keys; the rest are the family's own gates), with
    the family's `real_time` (what the real-time gate divides by)."""
    return BuildOptions(target=target, toolkit=toolkit, reproduce=reproduce, real_time=real_time,
                        **{name: getattr(gates, name) for name in BuildGates.model_fields})


@dataclass(frozen=True)
class Job:
    """One export of one component, from a command line or a recipe: every value validated against the
    declaration, the target normalised, the toolkit that will compile it (an export may measure in its simulator).
    `recipe` is the recipe (package, path) when a recipe asked for it."""

    family: "Family"
    component: "Component"
    source: BaseModel
    options: BaseModel
    gates: BaseModel
    target: Target
    out: Path
    toolkit: Toolkit = _BUILD_DEFAULTS["toolkit"]
    recipe: dict | None = None

    @property
    def context(self) -> str:
        """What a failed export gate is reported against: the package, or the component's own label."""
        return self.recipe["package"] if self.recipe else self.component.context or f"{self.family.name} export"

    def contract(self, role: str, *, component: str | None = None, **fields) -> EngineContract:
        """The contract of an engine this job exports: its identity from the declaration (the family's contract
        name, the component or one of its `contract_components`, the component's exec_plan option) and `fields`
        (the family's own, and shared ones such as `ladder_key` or `exec_params`)."""
        named = component or self.component.name
        if named not in (self.component.name, *self.component.contract_components):
            raise ValueError(f"{self.family.name}: component {self.component.name!r} declares no contract component "
                             f"{named!r} (contract_components: {self.component.contract_components})")
        return make_contract(self.family.contract_name, named, role, self.component.exec_plan_option, **fields)


@dataclass(frozen=True)
class Component:
    """One engine set of a family, with its exec_plan component name. `export(job) -> list[Exported]` is the one
    export both the command and the recipe call. `switch` is the command flag that selects it when it is not the
    family's first component (`--encoder`). `ladder` names the roles whose engines are one model at several
    shapes (rungs, buckets, first/main): the component then takes the shared `ladder` option (static: one engine
    each; dynamic: one engine for all their shapes, rkaudio/pipeline/ladder.py)."""

    name: str
    export: Callable[[Job], list]
    exec_plan_option: str  # the consumer's exec_plan option that switches the component
    options: type[BaseModel] = NoTable
    gates: type[BaseModel] = NoTable
    advice: str = ""
    context: str = ""
    switch: tuple[str, str] | None = None  # (flag, help)
    ladder: tuple[str, ...] = ()  # the roles whose engines form a ladder (`<n>`: digits): `ladder` option
    contract_components: tuple[str, ...] = ()  # the exec_plan components its engines name, where not `name`


@dataclass(frozen=True)
class Family:
    """A family's declaration (rkaudio/families/<name>/: `FAMILY = Family(...)`).

    `sources(job) -> [checkpoint files]` names what a recipe's package is built from (MissingSource when absent;
    None: always rebuilt). `from_onnx(job, onnx)` replaces the plain read-back of `--onnx` where the family checks
    or re-measures an earlier export (None: `Exported.from_onnx`). `after_build(job, results)` reports or writes
    what the family adds beside its engines. `checks` / `tools` are its `convert check <name>` and extra commands
    (typer functions); `loops` the runtime loops its end-to-end goldens name.
    `random_source(directory, shape, recipe) -> dict` stands in for a checkpoint this machine lacks: random weights
    of `shape` ("real": the published shapes; "small": the tests' model), written under `directory` where the
    family reads files, returned as the family's command-level `[source]` fields; `recipe` is the recipe part it
    stands in for (a family of several sizes reads which one from it). None: the family's checkpoint ships in the
    export venv (or it needs none), so a recipe always builds from its own source.
    `real_time(contract) -> RealTime | None` is the real time one call of an engine covers (`rkaudio.gates.real_time`:
    seconds of audio produced, of input audio, of generated mel over the ODE, of speech), what the real-time gate and
    bench/targets.py divide by; None (or a role it returns None for): the gate says it is not judged."""

    name: str
    help: str
    components: tuple[Component, ...]
    source: type[BaseModel] = NoTable
    build_defaults: dict = field(default_factory=dict)
    command: str | None = None
    sources: Callable[[Job], list] | None = None
    from_onnx: Callable[[Job, Path], list] | None = None
    after_build: Callable[[Job, list], None] | None = None
    checks: dict = field(default_factory=dict)
    tools: dict = field(default_factory=dict)
    loops: tuple[str, ...] = ()
    random_source: Callable[[Path, str, dict], dict] | None = None
    real_time: Callable[[EngineContract], RealTime | None] | None = None

    def __post_init__(self) -> None:
        unknown = set(self.build_defaults) - set(BuildGates.model_fields)
        if unknown:
            raise ValueError(f"family {self.name}: build_defaults names {sorted(unknown)}, not shared build gates")

    @property
    def command_name(self) -> str:
        return self.command or self.name.replace("_", "-")

    @property
    def contract_name(self) -> str:
        """What the engine contracts (and so manifests and exec_plans) name the family by: its command name."""
        return self.command_name

    def component(self, name: str | None) -> Component:
        """The component `name` (the first when None); KeyError for an undeclared one (the schema refuses it)."""
        if name is None:
            return self.components[0]
        return next(c for c in self.components if c.name == name)

    def job(self, component: str | None = None, *, target: str, out: Path,
            toolkit: str = _BUILD_DEFAULTS["toolkit"], source: dict | None = None, options: dict | None = None,
            gates: dict | None = None) -> Job:
        """A job of `component` (the first when None) outside a command or a recipe (a check's own export, a test, a
        bench script): each table validated, at the declaration's defaults where not given."""
        part = self.component(component)
        return Job(self, part, self.source(**(source or {})), self.options_model(part)(**(options or {})),
                   self.gates_model(part)(**(gates or {})), Target(target), Path(out), Toolkit(toolkit))

    def options_model(self, component: Component) -> type[BaseModel]:
        """The component's whole options table: its own (its validators too), plus the shared `ladder` choice when
        it declares one."""
        if not component.ladder:
            return component.options
        return create_model(f"{self.name}_{component.name}_options", __base__=component.options,
                            **{name: (info.annotation, info) for name, info in LadderChoice.model_fields.items()})

    def gates_model(self, component: Component) -> type[BaseModel]:
        """The component's whole gates table: the shared build gates at this family's defaults, then its own."""
        shared = {name: (info.annotation, self._with_default(info, name)) for name, info in BuildGates.model_fields.items()}
        own = {name: (info.annotation, info) for name, info in component.gates.model_fields.items()}
        return create_model(f"{self.name}_{component.name}_gates", __base__=Table, **shared, **own)

    def _with_default(self, info, name: str):
        if name not in self.build_defaults:
            return info
        return FieldInfo.merge_field_infos(info, default=self.build_defaults[name])
