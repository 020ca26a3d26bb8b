"""Validation against a declaration: one line per refused key, naming where it is, what is wrong and, for an
unknown key, the closest valid one ("recipes/x.toml: gates.max_regtask_line: unknown; did you mean
max_regtask_lines?"). The recipe loader and the generated commands both refuse through here (a SetupError: exit 2)."""
from __future__ import annotations

import difflib
from typing import Any, Optional

from pydantic import BaseModel, ValidationError

from rkaudio.core.errors import SetupError


def closest(name: str, valid) -> str | None:
    """The valid name most like `name`, if any is close."""
    found = difflib.get_close_matches(str(name), [str(v) for v in valid], n=1, cutoff=0.5)
    return found[0] if found else None


def unknown_line(where: str, key: str, valid) -> str:
    """`where.key: unknown; did you mean X?` (or the list of valid keys when none is close)."""
    guess = closest(key, valid)
    hint = f"did you mean {guess}?" if guess else f"valid: {', '.join(map(str, valid)) or 'none'}"
    return f"{where}{key}: unknown; {hint}"


def _described(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def message(record: dict) -> str:
    """A pydantic error message as the rest of a refusal line: its first letter in lower case."""
    text = record["msg"]
    return text[:1].lower() + text[1:]


def problems(error: ValidationError, model: type[BaseModel], where: str) -> list[str]:
    """One line per pydantic error record: its key path under `where` (e.g. "recipes/x.toml: options.")."""
    lines = []
    for record in error.errors():
        path = ".".join(str(part) for part in record["loc"])
        if record["type"] == "extra_forbidden":
            *parents, key = record["loc"]
            prefix = "".join(f"{part}." for part in parents)
            lines.append(unknown_line(where + prefix, str(key), list(_model_at(model, parents).model_fields)))
        elif record["type"] == "missing":
            lines.append(f"{where}{path}: missing (required)")
        else:
            lines.append(f"{where}{path or 'table'}: {message(record)}, got {_described(record.get('input'))}")
    return lines


def _model_at(model: type[BaseModel], path) -> type[BaseModel]:
    """The model of the table at key path `path` inside `model` (through nested models and tables of models)."""
    import typing

    annotation: Any = model
    for part in path:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            annotation = annotation.model_fields[part].annotation
        elif typing.get_origin(annotation) in (dict, list):  # a table of tables, a list of tables
            annotation = typing.get_args(annotation)[-1]
        annotation = next((a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)),
                          annotation) if typing.get_origin(annotation) is typing.Union else annotation
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else model


def validate(model: type[BaseModel], data: dict, where: str, strict: bool = True) -> BaseModel:
    """`model` of `data`, or a SetupError with every problem on its own line. `strict` refuses any conversion
    (a recipe says what it means); a command line comes typed from its parser and is checked for bounds only."""
    try:
        return model.model_validate(data, strict=strict)
    except ValidationError as error:
        raise SetupError("\n".join(problems(error, model, where))) from None


def _recipe_models():
    from rkaudio.pipeline.declaration import Table, option

    class Card(Table):
        """A recipe's [card]: what the model card (README.md of the package) says of the source model."""

        license: str = option("other", "The source model's license (Hub front matter).")
        pipeline_tag: Optional[str] = option(None, "The Hub pipeline tag, e.g. text-to-speech.")
        tags: list[str] = option([], "Extra Hub tags.")
        source: Optional[str] = option(None, "One line on where the weights come from.")

    class ComponentTable(Table):
        """A [components.<name>] table: the targets it builds for (a subset; default all), options and gates
        over the recipe's own."""

        targets: Optional[list[str]] = option(None, "Targets this component is built for.")
        refused: dict[str, str] = option({}, "Targets of the recipe this component is left out on, each with the "
                                         "measured reason (`convert engines --list` and the summary say it).")
        options: dict = option({}, "Export options over the recipe's [options].")
        gates: dict = option({}, "Gates over the recipe's [gates].")

    class RecipeFile(Table):
        """A recipe's top level; the family-specific tables are checked against the family's declaration."""

        package: str = option(..., "Published as dist/<target>/<package>_<target>/.")
        family: str = option(..., "rkaudio/families/<family>/, whose declaration builds it.")
        targets: list[str] = option(..., "The SoCs it is built for.", min_length=1)
        refused: dict[str, str] = option({}, "SoCs it is not built for, each with the measured reason "
                                         "(`convert engines --list` and the summary say it).")
        source: dict = option({}, "Where the checkpoint comes from (the family's [source] fields).")
        options: dict = option({}, "The family's export options.")
        gates: dict = option({}, "Thresholds: the shared build gates and the family's own.")
        card: Card = option(Card(), "The model card.")
        components: dict[str, ComponentTable] = option({}, "A model of several components, one table each.")

    return RecipeFile


def takes_table(model: type[BaseModel], name: str) -> bool:
    """Whether field `name` of `model` holds a table itself (so a table value is not one value per target)."""
    import types
    import typing

    annotation = model.model_fields[name].annotation
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    kinds = typing.get_args(annotation) if union else (annotation,)
    return any(typing.get_origin(kind) is dict or kind is dict or
               (isinstance(kind, type) and issubclass(kind, BaseModel)) for kind in kinds)


def per_target_keys(model: type[BaseModel], table: dict) -> list[str]:
    """The keys of `table` whose value is one value per target (a table where the field takes a plain value)."""
    return sorted(key for key, value in table.items()
                  if isinstance(value, dict) and key in model.model_fields and not takes_table(model, key))


def resolve(table: dict, per_target: list[str], target: str) -> dict:
    """`table` with each per-target value replaced by `target`'s."""
    return {key: (value[target] if key in per_target else value) for key, value in table.items()}


def _check_per_target(table: dict, keys: list[str], targets: list[str], where: str) -> list[str]:
    lines = []
    for key in keys:
        for named in table[key]:
            if named not in targets:
                lines.append(unknown_line(f"{where}{key}.", named, targets).replace(": unknown;", ": not a target of "
                                                                                   "this recipe;"))
        lines += [f"{where}{key}: per target, and names no value for {target}" for target in targets
                  if target not in table[key]]
    return lines


def load_recipe_table(recipe: dict, where: str, family_for) -> dict:
    """A parsed recipe checked whole against the recipe schema and its family's declaration (`family_for(name)`):
    every problem as one SetupError, one line each. Returns the recipe with its tables defaulted, its targets
    normalised (and each component's), and `per_target`: the keys of its option and gate tables that hold one
    value per target (what `resolve` picks from)."""
    from rkaudio.board.soc import Target

    model = _recipe_models()
    lines = _problems_of(model, recipe, f"{where}: ")
    if lines:
        raise SetupError("\n".join(lines))
    recipe = {key: value for key, value in recipe.items()}
    for table in ("source", "options", "gates", "card", "components"):
        recipe.setdefault(table, {})
    targets = []
    for name in recipe["targets"]:
        try:
            targets.append(Target(name))
        except SetupError as error:
            lines.append(f"{where}: targets: {error}")
    recipe["targets"] = targets
    recipe["refused"], refusal_lines = _refusals(recipe.get("refused", {}), targets, f"{where}: refused.")
    lines += refusal_lines
    for name, table in recipe["components"].items():
        table = recipe["components"][name] = {"options": {}, "gates": {}, **table}
        refused = {str(n).lower() for n in table.get("refused", {})}
        named = [n.lower() for n in table.get("targets") or [t for t in targets if t not in refused]]
        lines += [unknown_line(f"{where}: components.{name}.targets.", n, targets).replace(
            ": unknown;", ": not a target of this recipe;") for n in named if n not in targets]
        table["targets"] = [n for n in named if n in targets]
        table["refused"], refusal_lines = _refusals(table.get("refused", {}), table["targets"],
                                                    f"{where}: components.{name}.refused.", within=targets)
        lines += refusal_lines
    if recipe["components"]:
        empty = [t for t in targets if not any(t in c["targets"] for c in recipe["components"].values())]
        lines += [f"{where}: no component lists target {t}; drop it from `targets`" for t in empty]
    if lines:
        raise SetupError("\n".join(lines))
    try:
        family = family_for(recipe["family"])
    except SetupError as error:
        raise SetupError(f"{where}: family: {error}") from None
    recipe["per_target"] = check_family_tables(recipe, family, where)
    return recipe


def _refusals(refused: dict, built: list[str], where: str, within: list[str] | None = None) -> tuple[dict, list[str]]:
    """A `refused` table with its targets normalised, and one line per problem: an unknown target, one that is also
    built, one outside `within` (a component can only be refused on a target of its recipe), an empty reason."""
    from rkaudio.board.soc import Target

    normalised, lines = {}, []
    for name, reason in refused.items():
        try:
            target = Target(name)
        except SetupError as error:
            lines.append(f"{where}{name}: {error}")
            continue
        if target in built:
            lines.append(f"{where}{target}: also listed in targets; a target is built or refused, not both")
        elif within is not None and target not in within:
            lines.append(f"{where}{target}: not a target of this recipe (refuse it in the recipe's own `refused`)")
        elif not reason.strip():
            lines.append(f"{where}{target}: give the measured reason")
        normalised[target] = reason.strip()
    return normalised, lines


def check_family_tables(recipe: dict, family, where: str) -> dict:
    """The recipe's [source], [options], [gates] and [components.*] against `family`'s declaration, per target
    and component: a SetupError with one line per problem; else the per-target keys ({"options", "gates"})."""
    from rkaudio.pipeline.declaration import subset

    lines = _problems_of(subset(family.source, "recipe"), recipe["source"], f"{where}: source.")
    names = [component.name for component in family.components]
    parts = []
    for name, table in recipe["components"].items():
        if name not in names:
            lines.append(unknown_line(f"{where}: components.", name, names))
        else:
            parts.append((family.component(name), table, f"components.{name}."))
    if not recipe["components"]:
        parts.append((family.component(None), {"targets": recipe["targets"]}, ""))
    per_target: dict[str, set] = {"options": set(), "gates": set()}
    for component, table, label in parts:
        for kind, model in (("options", subset(family.options_model(component), "recipe")),
                            ("gates", subset(family.gates_model(component), "recipe"))):
            merged = {**recipe[kind], **table.get(kind, {})}
            keys = per_target_keys(model, merged)
            per_target[kind].update(keys)
            lines += _check_per_target(merged, keys, table["targets"], f"{where}: {label}{kind}.")
            for target in table["targets"]:
                resolved = resolve({k: v for k, v in merged.items() if k not in keys or target in v}, keys, target)
                lines += _problems_of(model, resolved, f"{where}: {label}{kind}.")
    if lines:
        raise SetupError("\n".join(dict.fromkeys(lines)))  # a problem met once per target is said once
    return {kind: sorted(keys) for kind, keys in per_target.items()}


def _problems_of(model: type[BaseModel], data: dict, where: str) -> list[str]:
    if not isinstance(data, dict):
        return [f"{where.rstrip('.')}: must be a table, got {_described(data)}"]
    try:
        model.model_validate(data, strict=True)
        return []
    except ValidationError as error:
        return problems(error, model, where)


def recipe_job(family, recipe: dict, target: str, work_dir, toolkit: str, source: dict | None = None):
    """The `Job` of one built part of a recipe (`recipes_for`'s: component set, per-target values resolved).
    `source` replaces the recipe's [source] with the family's command-level fields (`Family.random_source`'s)."""
    from pathlib import Path

    from rkaudio.pipeline.declaration import Job, subset

    component = family.component(recipe.get("component"))
    where = f"recipe {recipe['path']}: "
    return Job(family, component,
               validate(family.source, source, f"{family.name} random_source: ") if source is not None else
               validate(subset(family.source, "recipe"), recipe.get("source", {}), where + "source."),
               validate(subset(family.options_model(component), "recipe"), recipe.get("options", {}), where + "options."),
               validate(subset(family.gates_model(component), "recipe"), recipe.get("gates", {}), where + "gates."),
               target, Path(work_dir), toolkit, recipe)
