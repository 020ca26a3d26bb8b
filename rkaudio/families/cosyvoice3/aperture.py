"""Aperture accounting for the flow ladder: what each rung will cost in the RK3588 NPU's 32-bit I/O address space,
from what the host has (the manifest the build wrote), and which rung sets fit one process's budget.

The spec (rknn-decoder-path.md, "The IOVA ceiling") has two board figures per engine that no host tool gives:
- the per-context cost the driver reports (`RKNN_QUERY_MEM_SIZE`): 786/1129/1426/2615/3752 MiB at
  S=110/200/250/400/500 and 1039 MiB at S=900 (cheaper than S=500: the cost is not monotone in S);
- the single mapping requested at `rknn_init`: 4.71 GB at S=900, refused (the ceiling is ~4 GB).

Host proxies (the manifest's toolkit memory report and its contract):
- the toolkit's own figure, weight + internal memory (`weight_bytes` + `internal_bytes`), is not one by itself:
  the internal memory grows linearly in S (22.2/39.6/49.9/78.4/98.0 MiB at S=110..500) while the board figures grow as
  S^2, because the compiler fuses the attention into `exSDPAttention`, whose scratch the report leaves out (0
  estimated cycles, RW linear in S). board / (weight + internal) runs from 1.20 at S=110 to 5.0 at S=500;
- per-context cost ~ weight + internal + ATTENTION_TENSORS * blocks * heads * S^2 * 2 bytes (fp16 score-sized
  tensors per block), ATTENTION_TENSORS fitted to the board figures (`fit_calibration`); a depth-split rung is
  one context per part, summed;
- the single init mapping ~ internal + that attention term (the activation arena), per part, refused over the
  ceiling.
The spec's S=900 figure (1039 MiB reported, yet a 4.71 GB single mapping and a 6.19 GB request at init) says the
reported cost is not monotone in S and understates what init asks for past the ceiling: the estimate takes the
host figures of each engine as they are and judges refusal by the mapping, not by the reported cost. At S=900
(whole depth, built by hand: internal 180.7 MiB, still linear) the model asks 10.39 GB (the board: 4.71): it
refuses the rung, as the board does, at twice the board's figure; the board's reported 1039 MiB there is 1.28x
the toolkit's weight + internal, about the S=110 ratio, as if the report left the attention scratch out.
These are estimates from one board's measurements of another build of this estimator (same shape and toolkit
version); the per-rung ratios say how far to trust them. A package carries them in `aperture.json`.

An engine compiled for every rung (`--ladder dynamic`: its manifest's `shape_sets`, each with its own memory
report) gives one row per set, costed as that rung's static engine would be, so the static sets stay comparable;
and one context holding every rung, assumed (unmeasured: no board has run one) to hold the weights once and the
largest set's internal memory and attention scratch, the sets taking turns in one arena."""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

from rkaudio.board.contract import EngineContract
from rkaudio.board.cosyvoice3 import RungFields
from rkaudio.core.errors import SetupError

MIB = 1 << 20
GB = 1e9
APERTURE_NAME = "aperture.json"
SCHEMA = "rkaudio-aperture/1"
DEFAULT_BUDGET_MIB = 3900.0  # the spec's per-process ceiling, measured by initializing sets in one process
DEFAULT_CEILING_GB = 4.0  # a single mapping above ~4 GB is refused at rknn_init

# The spec's board measurements (RK3588, 6.1.115-vendor-rk35xx, fp16, optimization_level 3).
SPEC_CONTEXT_MIB = {110: 786, 200: 1129, 250: 1426, 400: 2615, 500: 3752, 900: 1039}
SPEC_INIT_REFUSED_GB = {900: 4.71, 1100: 4.66, 2000: 5.77}
SPEC_ADMITTED = [(110, 200, 250), (110, 110, 110, 110), (200, 200, 200), (110, 250, 250), (110, 400), (200, 400)]
SPEC_REFUSED = [(250, 400), (110, 500)]

# Score-sized fp16 tensors [heads, S, S] per block that the board holds beyond the toolkit's report: the least
# squares fit (through 0) of board - (weight + internal) over the real-shape B=1 rungs below (`fit_calibration`).
# Fitted on the whole-depth rungs below; the board figures are 0.979..1.005 of the estimate there.
ATTENTION_TENSORS = 17.89
# S -> (weight MiB, internal MiB) of the whole-depth rungs built by `convert cosyvoice3 --random-weights real`
# (rk3588, toolkit 2.3.2, B=1, plain LayerNorm; S=400/500 also exported by hand without the gates)
CALIBRATION_HOST_MIB = {110: (632.54, 22.17), 200: (632.54, 39.61), 250: (632.54, 49.88), 400: (632.54, 78.43),
                        500: (632.54, 97.98)}
CALIBRATION_SHAPE = {"depth": 22, "heads": 16}


def attention_bytes(length: int, depth: int, heads: int, tensors: float | None = None) -> float:
    """`tensors` fp16 [heads, S, S] tensors per block over `depth` blocks (default ATTENTION_TENSORS)."""
    return (ATTENTION_TENSORS if tensors is None else tensors) * depth * heads * length * length * 2


@dataclass
class Part:
    """One engine of a rung: the whole estimator, or one depth-split part of it (`blocks` transformer blocks)."""
    engine: str
    rknn_bytes: int
    weight_bytes: int
    internal_bytes: int
    blocks: int


@dataclass
class Rung:
    """A rung: its engines (one, or the parts of a depth-split chain, all resident while the rung runs)."""
    length: int
    parts: list
    heads: int

    @property
    def engine(self) -> str:
        return ",".join(p.engine for p in self.parts)

    @property
    def rknn_bytes(self) -> int:
        return sum(p.rknn_bytes for p in self.parts)

    @property
    def weight_bytes(self) -> int:
        return sum(p.weight_bytes for p in self.parts)

    @property
    def internal_bytes(self) -> int:
        return sum(p.internal_bytes for p in self.parts)

    @property
    def depth(self) -> int:
        return sum(p.blocks for p in self.parts)

    @property
    def toolkit_mib(self) -> float:
        """The toolkit's own figure: weight + internal memory (MiB), summed over the parts."""
        return (self.weight_bytes + self.internal_bytes) / MIB

    def context_mib(self, tensors: float | None = None) -> float:
        """Estimated per-context cost (what the driver would report below the ceiling), MiB; a chain's parts
        are one context each, summed."""
        return self.toolkit_mib + attention_bytes(self.length, self.depth, self.heads, tensors) / MIB

    def mapping_gb(self, tensors: float | None = None) -> float:
        """Estimated single mapping requested at rknn_init (the activation arena), GB (1e9 bytes, as the spec):
        the largest over the parts (each part's init maps its own)."""
        return max(p.internal_bytes + attention_bytes(self.length, p.blocks, self.heads, tensors)
                   for p in self.parts) / GB


def rung_of(manifest: dict, name: str = "a manifest") -> RungFields:
    """The rung fields of one engine's manifest (SetupError naming `name` for an engine without a rung)."""
    try:
        return RungFields.of(EngineContract.from_json(manifest.get("contract")))
    except ValueError:
        raise SetupError(f"{name}: its contract has no rung length (not a cosyvoice3 flow engine)") from None


def rung_part(manifest: dict, engine: str | None = None) -> tuple:
    """(length, heads, part index, parts, Part) of one engine's manifest."""
    name = engine or (manifest.get("rknn") or {}).get("path") or "a manifest"
    rung = rung_of(manifest, name)
    for key in ("weight_bytes", "internal_bytes"):
        if not isinstance(manifest.get(key), int) or manifest[key] < 0:
            raise SetupError(f"{name}: no {key} in the manifest (the build log's memory report)")
    shape = rung.estimator or CALIBRATION_SHAPE
    start, stop = rung.chain["blocks"] if rung.chain else (0, shape["depth"])
    return (rung.length, int(shape["heads"]), rung.part, rung.parts,
            Part(name, int(manifest["rknn"]["bytes"]), int(manifest["weight_bytes"]), int(manifest["internal_bytes"]),
                 int(stop) - int(start)))


def rung_from_manifest(manifest: dict, engine: str | None = None) -> Rung:
    """The rung of one whole-estimator engine."""
    return rungs_from_manifests([(engine, manifest)])[0]


def rungs_from_manifests(entries: list) -> list:
    """Rungs from (engine name, manifest) pairs: a depth-split rung's parts grouped in part order."""
    grouped: dict = {}
    for name, manifest in entries:
        length, heads, part, parts, entry = rung_part(manifest, name)
        slot = grouped.setdefault(length, {"heads": heads, "parts": parts, "found": {}})
        if slot["parts"] != parts or part in slot["found"]:
            raise SetupError(f"S={length}: two engines for part {part + 1}, or parts counted {slot['parts']} and {parts}")
        slot["found"][part] = entry
    rungs = []
    for length, slot in sorted(grouped.items()):
        if sorted(slot["found"]) != list(range(slot["parts"])):
            raise SetupError(f"S={length}: parts {[i + 1 for i in sorted(slot['found'])]} of {slot['parts']} "
                             "(an incomplete chain)")
        rungs.append(Rung(length, [slot["found"][i] for i in range(slot["parts"])], slot["heads"]))
    return rungs


def set_manifests(manifest: dict) -> list[dict]:
    """The manifest of an engine of several shape sets as one manifest per set (that set's contract fields and
    memory report); a fixed-shape engine's as it is."""
    return [{**manifest, **{key: entry[key] for key in ("weight_bytes", "internal_bytes") if key in entry},
             "contract": {**manifest.get("contract", {}), **entry.get("contract", {})}}
            for entry in manifest.get("shape_sets") or []] or [manifest]


def flow_manifests(directory: Path) -> list[tuple[str, dict]]:
    """(engine name, manifest) of every cosyvoice3 flow engine in `directory`, one per shape set, in length (then
    part) order."""
    found = []
    for path in sorted(Path(directory).glob("*.manifest.json")):
        manifest = json.loads(path.read_text())
        if manifest.get("family") == "cosyvoice3" and manifest.get("component") == "flow":
            found.extend((Path(manifest["rknn"]["path"]).name, entry) for entry in set_manifests(manifest))

    def ladder_order(item: tuple) -> tuple:
        rung = rung_of(item[1], item[0])
        return rung.length, rung.part

    return sorted(found, key=ladder_order)


def read_rungs(package_dir: Path) -> list[Rung]:
    """The package's rungs, from its manifests, in the exec_plan's order when it has one (it must be length
    order). SetupError when there is no flow engine or the ladder is out of order."""
    package_dir = Path(package_dir)
    if not package_dir.is_dir():
        raise SetupError(f"no package at {package_dir}")
    found = flow_manifests(package_dir)
    if not found:
        raise SetupError(f"{package_dir}: no cosyvoice3 flow engine manifest (*.manifest.json)")
    rungs = rungs_from_manifests(found)
    plan_path = package_dir / "exec_plan.json"
    if plan_path.is_file():
        plan = json.loads(plan_path.read_text()).get("cosyvoice3.exec_plan", {}).get("flow", {})
        if "params" in plan:
            raise SetupError(f"{plan_path}: the flow component takes no exec_plan params")
        ladder = [name for name in plan.get("artifacts", {}).get("main", "").split(",") if name]
        by_name: dict = {}
        for rung in rungs:
            for i, part in enumerate(rung.parts):
                by_name.setdefault(part.engine, []).append((rung.length, i))
        order = [entry for name in ladder for entry in by_name.get(name, [None])]
        if ladder and (None in order or order != sorted(order)):
            raise SetupError(f"{plan_path}: the flow ladder {ladder} is not this package's rungs in length order")
    return rungs


def one_context(rungs: list[Rung]) -> Rung:
    """The rungs one engine holds (`--ladder dynamic`) as one context: per part the largest set's weights (held
    once) and internal memory, and the largest rung's attention scratch. An assumption, not a measurement."""
    largest = max(rungs, key=lambda r: r.length)
    parts = [Part(part.engine, part.rknn_bytes, max(r.parts[i].weight_bytes for r in rungs),
                  max(r.parts[i].internal_bytes for r in rungs), part.blocks) for i, part in enumerate(largest.parts)]
    return Rung(largest.length, parts, largest.heads)


MAX_SET_SIZE = 8  # contexts per process a set may hold (the spec's largest admitted set holds 4)


def multisets(costs: dict, budget: float, max_size: int = MAX_SET_SIZE) -> list[tuple]:
    """Every non-empty multiset of at most `max_size` rungs (sorted tuples of lengths) whose costs sum to
    <= budget. The cap keeps tiny engines (a few MiB each) from enumerating thousands of rungs per set."""
    lengths = sorted(costs)
    if not lengths:
        return []
    cheapest = min(costs.values())
    most = min(max_size, int(budget // cheapest) if cheapest > 0 else max_size)
    found = []
    for size in range(1, most + 1):
        for combo in itertools.combinations_with_replacement(lengths, size):
            if sum(costs[s] for s in combo) <= budget:
                found.append(combo)
    return found


def maximal(sets: list[tuple]) -> list[tuple]:
    """The sets to which no further rung can be added (each fitting set is a sub-multiset of one of these)."""
    def contains(big, small):
        rest = list(big)
        for item in small:
            if item not in rest:
                return False
            rest.remove(item)
        return True

    return [s for s in sets if not any(len(t) > len(s) and contains(t, s) for t in sets)]


def set_name(combo) -> str:
    return "+".join(str(s) for s in combo)


def account(rungs: list[Rung], budget_mib: float = DEFAULT_BUDGET_MIB, ceiling_gb: float = DEFAULT_CEILING_GB,
            tensors: float | None = None) -> dict:
    """The aperture.json content: per rung the host figures, the estimates, the spec's board figure and the
    ratios, refused or not; every rung multiset within the budget (over the rungs not refused); the spec's
    measured sets judged by the estimates."""
    tensors = ATTENTION_TENSORS if tensors is None else tensors
    rows, costs = [], {}
    for rung in sorted(rungs, key=lambda r: r.length):
        context, mapping = rung.context_mib(tensors), rung.mapping_gb(tensors)
        refused = mapping > ceiling_gb
        board = SPEC_CONTEXT_MIB.get(rung.length)
        rows.append({
            "length": rung.length, "engine": rung.engine, "parts": len(rung.parts), "rknn_bytes": rung.rknn_bytes,
            "weight_bytes": rung.weight_bytes, "internal_bytes": rung.internal_bytes,
            "toolkit_mib": round(rung.toolkit_mib, 1), "context_mib": round(context, 1),
            "mapping_gb": round(mapping, 3), "refused": refused, "spec_context_mib": board,
            "spec_over_estimate": round(board / context, 3) if board else None,
            "spec_over_toolkit": round(board / rung.toolkit_mib, 3) if board else None})
        if not refused:
            costs[rung.length] = context
    sets = multisets(costs, budget_mib)
    built = {row["length"] for row in rows}
    held: dict = {}
    for rung in rungs:
        held.setdefault(rung.engine, []).append(rung)
    contexts = []
    for engine, group in held.items():
        if len(group) < 2:
            continue
        context = one_context(group)
        cost, mapping = context.context_mib(tensors), context.mapping_gb(tensors)
        lengths = sorted(r.length for r in group)
        contexts.append({
            "engine": engine, "holds": set_name(lengths), "weight_bytes": context.weight_bytes,
            "internal_bytes": context.internal_bytes, "context_mib": round(cost, 1), "mapping_gb": round(mapping, 3),
            "refused": mapping > ceiling_gb, "fits": mapping <= ceiling_gb and cost <= budget_mib,
            "contexts_in_budget": int(budget_mib // cost) if mapping <= ceiling_gb else 0,
            "static_mib": round(sum(r.context_mib(tensors) for r in group), 1),
            "assumption": f"unmeasured: the weights once, the S={context.length} set's internal memory and "
                          "attention scratch (the sets take turns in one arena)"})

    def spec_set_row(combo, spec):
        """One rung set the spec measured (`spec`: "admitted" or "refused" on the board) beside this estimate."""
        in_package = set(combo) <= built
        admitted = in_package and set(combo) <= set(costs) and sum(costs[s] for s in combo) <= budget_mib
        return {"set": set_name(combo), "spec": spec, "estimate": (admitted if in_package else None),
                "estimated_mib": round(sum(costs[s] for s in combo), 1) if set(combo) <= set(costs) else None,
                "spec_mib": sum(SPEC_CONTEXT_MIB[s] for s in combo)}

    return {
        "schema": SCHEMA, "budget_mib": budget_mib, "ceiling_gb": ceiling_gb,
        "model": {"context_mib": f"weight + internal + {tensors:g} * depth * heads * S^2 * 2 bytes",
                  "mapping_gb": f"(internal + {tensors:g} * depth * heads * S^2 * 2 bytes) / 1e9; refused over "
                                "the ceiling",
                  "attention_tensors": tensors,
                  "calibrated_on": "the spec's board figures at S=110..500 (rknn-decoder-path.md, The IOVA ceiling)"},
        "rungs": rows,
        "sets": [{"set": set_name(c), "mib": round(sum(costs[s] for s in c), 1)} for c in sets],
        "maximal_sets": [set_name(c) for c in maximal(sets)],
        "one_context": contexts,
        "spec_sets": [spec_set_row(c, "admitted") for c in SPEC_ADMITTED]
                     + [spec_set_row(c, "refused") for c in SPEC_REFUSED],
    }


def format_report(result: dict) -> str:
    lines = [f"aperture: budget {result['budget_mib']:g} MiB per process, single-mapping ceiling "
             f"{result['ceiling_gb']:g} GB; context = {result['model']['context_mib']}",
             f"{'rung':>5} {'engine MB':>9} {'toolkit MiB':>11} {'context MiB':>11} {'mapping GB':>10} "
             f"{'spec MiB':>8} {'spec/est':>8} {'spec/toolkit':>12}  verdict"]
    for row in result["rungs"]:
        spec = row["spec_context_mib"]
        lines.append(f"{row['length']:>5} {row['rknn_bytes'] / 1e6:>9.1f} {row['toolkit_mib']:>11.1f} "
                     f"{row['context_mib']:>11.1f} {row['mapping_gb']:>10.3f} {spec or '-':>8} "
                     f"{row['spec_over_estimate'] or '-':>8} {row['spec_over_toolkit'] or '-':>12}  "
                     + (f"REFUSED: its init mapping {row['mapping_gb']:.2f} GB is over the {result['ceiling_gb']:g} GB "
                        "ceiling" if row["refused"] else "ok"))
    sets = result["sets"]
    lines.append(f"{len(sets)} rung set(s) fit {result['budget_mib']:g} MiB: "
                 + (", ".join(f"{s['set']} ({s['mib']:.0f})" for s in sets) or "none"))
    lines.append("maximal: " + (", ".join(result["maximal_sets"]) or "none"))
    for entry in result["one_context"]:
        verdict = ("REFUSED: its init mapping is over the ceiling" if entry["refused"] else
                   f"fits {result['budget_mib']:g} MiB ({entry['contexts_in_budget']} such context(s))"
                   if entry["fits"] else f"over {result['budget_mib']:g} MiB")
        lines.append(f"one context of {entry['engine']} holds {entry['holds']} at once: {entry['context_mib']:.0f} MiB, "
                     f"mapping {entry['mapping_gb']:.3f} GB, {verdict}; as static contexts {entry['static_mib']:.0f} "
                     f"MiB ({entry['assumption']})")
    for entry in result["spec_sets"]:
        verdict = {True: "admitted", False: "refused", None: "not in this package"}[entry["estimate"]]
        agree = "" if entry["estimate"] is None else (
            " (agrees)" if entry["estimate"] == (entry["spec"] == "admitted") else " (DISAGREES)")
        lines.append(f"spec {entry['spec']} {entry['set']} ({entry['spec_mib']} MiB): estimate {verdict}"
                     + (f" at {entry['estimated_mib']:.0f} MiB" if entry["estimated_mib"] is not None else "") + agree)
    return "\n".join(lines)


def write_aperture(directory: Path, budget_mib: float = DEFAULT_BUDGET_MIB,
                   ceiling_gb: float = DEFAULT_CEILING_GB) -> Path:
    """aperture.json beside the flow manifests of `directory` (a build folder; the package copies it)."""
    rungs = rungs_from_manifests(flow_manifests(directory))
    path = Path(directory) / APERTURE_NAME
    path.write_text(json.dumps(account(rungs, budget_mib, ceiling_gb), indent=1) + "\n")
    return path


def fit_calibration(host_mib: dict | None = None, board_mib: dict | None = None,
                    shape: dict | None = None) -> float:
    """ATTENTION_TENSORS: the least-squares fit through 0 of board - (weight + internal) against
    depth * heads * S^2 * 2 bytes over the rungs both have; `host_mib` maps S -> (weight MiB, internal MiB)."""
    host_mib = CALIBRATION_HOST_MIB if host_mib is None else host_mib
    board_mib = {s: c for s, c in SPEC_CONTEXT_MIB.items() if s not in SPEC_INIT_REFUSED_GB} \
        if board_mib is None else board_mib
    shape = CALIBRATION_SHAPE if shape is None else shape
    points = [(attention_bytes(s, shape["depth"], shape["heads"], 1.0) / MIB, board_mib[s] - sum(host_mib[s]))
              for s in sorted(host_mib) if s in board_mib]
    if not points:
        raise ValueError("a calibration needs a rung with a board figure")
    return sum(x * y for x, y in points) / sum(x * x for x, _ in points)
