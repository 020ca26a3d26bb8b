#!/usr/bin/env python3
r"""release_diff: capture what a tree of rkaudio does, and compare two captures ("behaviour unchanged").

Standalone (stdlib + numpy). It never imports rkaudio: it runs the repository's CLI in a child process with
PYTHONPATH at the repository (the export venv has /work/main installed editable; PYTHONPATH wins over it).

    # the release engines of a tree (12-14 minutes per target here, one target at a time)
    python tools/release_diff.py engines --repo REPO --dist DIST --logs LOGS --python VENV_PY
    # once, from the BEFORE tree: the small deterministic models the family runs below use
    python tools/release_diff.py models --repo REPO --models MODELS --python VENV_PY
    # help texts of every command, and the verdict lines of each family on the small models
    python tools/release_diff.py collect --repo REPO --dist DIST --out OUT --python VENV_PY --models MODELS [--engines-logs LOGS]
    # every engine, manifest and package file of both dist dirs, the family runs, help texts, verdict lines
    python tools/release_diff.py compare BEFORE_OUT AFTER_OUT      # exit 1 when anything differs

For the refactor of c8d3a2d the BEFORE capture is /tmp/before_collect (dist /tmp/before_dist, models
/tmp/before_models, engine logs /tmp/before_logs); for the AFTER tree:

    PY=/work/main/.venv/export/bin/python
    $PY tools/release_diff.py engines --repo /work/main --dist /tmp/after_dist --logs /tmp/after_logs --python $PY
    $PY tools/release_diff.py collect --repo /work/main --dist /tmp/after_dist --out /tmp/after_collect \
        --python $PY --models /tmp/before_models --engines-logs /tmp/after_logs
    $PY tools/release_diff.py compare /tmp/before_collect /tmp/after_collect

Engines are compared byte for byte after masking the producer commit: every occurrence of the manifest's
`producer_git` hex (and a `+dirty` right after it) is replaced by as many b'0' bytes before hashing. The commit
reaches the engine through the build's custom_string (rkaudio/toolkit/session.py). A clean tree and a dirty one differ
in length (`+dirty` is 6 bytes more in the engine), so build both sides from committed trees.
"""
from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

TARGETS = ("rk3588", "rk3576", "rk3566")
HELP_ENV = {"COLUMNS": "200", "LINES": "50", "TERM": "dumb", "NO_COLOR": "1"}
DROPPED_ENV = ("FORCE_COLOR", "CLICOLOR_FORCE", "PY_COLORS", "RKAUDIO_TOOLKIT", "RKAUDIO_MODELS")

# Step 3: one `convert <family>` run per family that builds no default package here, on the small models that
# `models` writes (the tests' fixtures, fixed seeds). {models} is the models dir, {out} the collect dir (the
# cwd of every run). --out must be absolute: at c8d3a2d a relative --out (the default work/<family> too) reaches
# the compiler child, which runs in its own temporary directory, as a relative engine path, and the build dies
# (exit 4, FileNotFoundError '.<stem>.rknn.partial'); `example_default_out` records that behaviour.
# skip_rknn: build no engine (set where an engine build would take more than ~5 minutes).
FAMILY_RUNS = [
    {"name": "audio8", "skip_rknn": False,
     # tests/families/audio8/conftest.py: build_random(small_config(), seed=0), head_shards=2. The CLI builds this model
     # itself (--random-weights small is seed 0); a snapshot cannot carry it (load_snapshot uses the real
     # tokenizer's prompt ids, past the small vocabulary). models/audio8_small/ keeps its weights for reference.
     "argv": ["audio8", "--random-weights", "small", "--head-shards", "2", "--target", "rk3588",
              "--out", "{out}/families/audio8"]},
    {"name": "qwen3_vocoder", "skip_rknn": False,
     # tests/families/qwen3_vocoder/conftest.py: random_reference(TINY_CONFIG, seed=0, gain=1.0) as a snapshot
     "argv": ["qwen3-vocoder", "--model-dir", "{models}/qwen3_vocoder_tiny", "--codes-length", "64",
              "--target", "rk3588", "--out", "{out}/families/qwen3_vocoder"]},
    {"name": "cosyvoice3", "skip_rknn": False,
     # tests/families/cosyvoice3/conftest.py + test_cli.py: random_estimator(TINY_CONFIG, seed=0) as a snapshot, the
     # tests' ladder (S=24 split by depth in 2, S=32 whole)
     "argv": ["cosyvoice3", "--model-dir", "{models}/cosyvoice3_tiny", "--lengths", "32,24", "--parts", "24:2",
              "--target", "rk3588", "--fail-on-cpu-ops", "--out", "{out}/families/cosyvoice3"]},
    {"name": "example_default_out", "skip_rknn": False,
     # the built-in example with the default --out (work/example, relative to the cwd)
     "argv": ["example", "--frames", "64", "--target", "rk3588"]},
    {"name": "inflect", "skip_rknn": False,
     # tests/families/inflect/conftest.py: export_official(NANO, seed=0): onnx/decode.onnx, onnx/duration.onnx,
     # config.json
     "argv": ["inflect", "--decode-onnx", "{models}/inflect_nano/onnx/decode.onnx",
              "--duration-onnx", "{models}/inflect_nano/onnx/duration.onnx", "--target", "rk3588",
              "--out", "{out}/families/inflect"]},
]

# Engines whose bytes differ from build to build of the same ONNX at c8d3a2d (same length, same gates and figures;
# a few hundred bytes that look like uninitialised memory, also with ASLR off): the audio8 small graphs. Measured on
# encoder.rknn (475,132 bytes): 102-228 bytes differ between any two of 6 builds; prefill 19, step_s128 2 between
# two runs; adapter, head_*, step_s256/512 were identical. `compare` accepts up to this many differing bytes for
# them (marked '~same'); every other engine must be byte-identical (example, kokoro, piper rebuilt identically).
KNOWN_NONDETERMINISTIC = {"family:audio8": 1024}

# `models`: run in the BEFORE tree's venv with PYTHONPATH at that tree; argv[1] is the models directory.
MODELS_SNIPPET = r'''
import hashlib, json, sys
from pathlib import Path
import torch
root = Path(sys.argv[1])
root.mkdir(parents=True, exist_ok=True)

from rkaudio.families.qwen3_vocoder import snapshot as qwen_snapshot
from rkaudio.families.qwen3_vocoder.random_model import TINY_CONFIG as QWEN_TINY, random_reference
qwen_snapshot.write(root / "qwen3_vocoder_tiny", QWEN_TINY, random_reference(QWEN_TINY, seed=0, gain=1.0).state_dict())

from rkaudio.families.cosyvoice3 import snapshot as cosy_snapshot
cosy_snapshot.write(root / "cosyvoice3_tiny", cosy_snapshot.TINY_CONFIG,
                    cosy_snapshot.random_estimator(cosy_snapshot.TINY_CONFIG, seed=0).state_dict())

from rkaudio.families.inflect.reference import NANO, export_official
export_official(root / "inflect_nano", NANO, seed=0)

from rkaudio.families.audio8 import model as M
state = M.build_random(M.small_config(), seed=0).state_dict()
(root / "audio8_small").mkdir(exist_ok=True)
torch.save(state, str(root / "audio8_small" / "state_dict.pt"))
digest = hashlib.sha256()
for key in sorted(state):
    digest.update(key.encode()); digest.update(state[key].detach().cpu().contiguous().numpy().tobytes())
(root / "audio8_small" / "README.txt").write_text(
    "The model `convert audio8 --random-weights small` builds in-process: build_random(small_config(), seed=0).\n"
    f"sha256 over its tensors (sorted by name, raw bytes): {digest.hexdigest()}\n")
print("models written to", root)
'''


# ------------------------------------------------------------------------------------------- helpers

def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run_env(repo: Path, venv_dir: Path | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env.update(HELP_ENV)
    env["PYTHONPATH"] = str(repo)
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # leave the trees under test as they are (no __pycache__)
    if venv_dir is not None:
        env["RKAUDIO_VENV_DIR"] = str(venv_dir)
    return env


def default_venv_dir(python: Path) -> Path:
    """.venv of `.venv/export/bin/python` (where the converter venvs sit beside it)."""
    return Path(python).absolute().parent.parent.parent


def run(cmd: list[str], cwd: Path, env: dict, timeout: float | None = None, log: Path | None = None):
    """(exit code or 'TIMEOUT', stdout, stderr, wall seconds); the child is its own process group, killed whole
    on a timeout."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        code = "TIMEOUT"
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    wall = time.monotonic() - start
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"$ {' '.join(cmd)}\n# cwd {cwd}\n# exit {code}, {wall:.1f} s\n"
                       f"----- stdout\n{out}----- stderr\n{err}")
    return code, out, err, wall


def git_state(repo: Path) -> dict:
    def git(*args):
        r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None
    return {"head": git("rev-parse", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def entry_point(repo: Path, given: str | None) -> str:
    """`module:function` of the `convert` console script: given, or [project.scripts] of the repo's pyproject."""
    if given:
        return given
    import tomllib

    scripts = tomllib.loads((repo / "pyproject.toml").read_text()).get("project", {}).get("scripts", {})
    if "convert" not in scripts:
        sys.exit(f"release_diff: {repo}/pyproject.toml declares no `convert` script; pass --entry MODULE:FUNCTION")
    return scripts["convert"]


def cli(args, repo: Path) -> list[str]:
    """The command line that runs `convert` of `repo`: the console script's entry point called with argv[0]
    'convert' (what `.venv/export/bin/convert` does, whatever module holds the CLI), or `-m --cli-module`."""
    if args.cli_module:
        return [args.python, "-m", args.cli_module]
    module, _, function = entry_point(repo, args.entry).partition(":")
    return [args.python, "-c", f"import sys; sys.argv[0] = 'convert'; from {module} import {function} as main; "
            "sys.exit(main())"]


# The top-level packages a tree of rkaudio installs: one since the package layout, six before it (their CLI and
# shared vocabulary stand for all). The first that imports is the tree's layout.
TREE_PACKAGES = (("rkaudio",), ("converters", "core"))
IMPORT_PROBE = ("import importlib, sys\n"
                "for names in {layouts!r}:\n"
                "    try:\n"
                "        files = [importlib.import_module(name).__file__ for name in names]\n"
                "    except ImportError:\n"
                "        continue\n"
                "    print(*files, sep='\\n'); break\n")


def check_imports(python: str, repo: Path, env: dict) -> None:
    """The child must import the tree under test, not the editable install (whichever layout the tree has)."""
    code, out, err, _ = run([python, "-c", IMPORT_PROBE.format(layouts=TREE_PACKAGES)], repo, env)
    files = out.split()
    if code != 0 or not files or not all(Path(f).resolve().is_relative_to(repo.resolve()) for f in files):
        sys.exit(f"release_diff: {python} with PYTHONPATH={repo} imports {files or err.strip()}, not {repo}")
    print(f"imports from {repo}: {files[0]}")


# ------------------------------------------------------------------------------------------- engines / models

def cmd_engines(args) -> int:
    repo, dist, logs = Path(args.repo).resolve(), Path(args.dist).absolute(), Path(args.logs).absolute()
    venv = Path(args.venv_dir) if args.venv_dir else default_venv_dir(Path(args.python))
    env = run_env(repo, venv)
    for key in HELP_ENV:  # a build log is for people: the CLI's ordinary terminal settings
        env.pop(key, None)
        if key in os.environ:
            env[key] = os.environ[key]
    check_imports(args.python, repo, env)
    logs.mkdir(parents=True, exist_ok=True)
    worst = 0
    for target in args.targets.split(","):
        cmd = [*cli(args, repo), "engines", "--target", target, "--dist", str(dist)]
        print(f"{' '.join(cmd)} ...", flush=True)
        code, out, err, wall = run(cmd, repo, env)
        (logs / f"engines_{target}.log").write_text(out + (("\n----- stderr\n" + err) if err else ""))
        with open(logs / "engines_times.txt", "a") as times:
            times.write(f"{target} rc={code} wall={wall:.0f}s\n")
        print(f"  {target}: exit {code}, {wall:.0f} s, log {logs / f'engines_{target}.log'}")
        worst = worst or (code if isinstance(code, int) else 1)
    return worst


def cmd_models(args) -> int:
    repo, models = Path(args.repo).resolve(), Path(args.models).absolute()
    env = run_env(repo, None)
    check_imports(args.python, repo, env)
    code, out, err, wall = run([args.python, "-c", MODELS_SNIPPET, str(models)], repo, env)
    sys.stdout.write(out)
    if code != 0:
        sys.stderr.write(err)
        return 1
    files = {str(p.relative_to(models)): sha256_bytes(p.read_bytes())
             for p in sorted(models.rglob("*")) if p.is_file() and p.name != "models.json"}
    (models / "models.json").write_text(json.dumps({"repo": str(repo), "git": git_state(repo), "files": files},
                                                   indent=1) + "\n")
    print(f"{len(files)} files, {wall:.0f} s; sha256 of each in {models / 'models.json'}")
    return 0


# ------------------------------------------------------------------------------------------- collect

def help_commands(text: str) -> list[str]:
    """The command names a `--help` text lists: rich's 'Commands' box, or click's plain 'Commands:' section."""
    names, section = [], None
    for line in text.splitlines():
        if re.match(r"^[╭┌+]─+ Commands ", line):
            section = "rich"
            continue
        if line.strip() == "Commands:":
            section = "plain"
            continue
        if section == "rich":
            if line.startswith(("╰", "└")):
                section = None
                continue
            m = re.match(r"^[│|] (\S+)(\s{2,}|\s*[│|]$)", line)
            if m:
                names.append(m.group(1))
        elif section == "plain":
            if not line.strip():
                section = None
                continue
            m = re.match(r"^  (\S+)(\s{2,}|$)", line)
            if m:
                names.append(m.group(1))
    return names


def collect_help(convert: list[str], repo: Path, env: dict, out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    index = {}

    def visit(path: list[str]) -> None:
        name = "_".join(["convert", *path])
        code, out, err, _ = run([*convert, *path, "--help"], repo, env)
        (out_dir / f"{name}.txt").write_text(out)
        if err:
            (out_dir / f"{name}.stderr.txt").write_text(err)
        subcommands = help_commands(out)
        index[name] = {"argv": [*path, "--help"], "exit": code, "subcommands": subcommands}
        for sub in subcommands:
            visit([*path, sub])

    visit([])
    (out_dir / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    return index


VERDICT = re.compile(r"^\[(PASS|FAIL)\]")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def verdict_lines(text: str) -> list[str]:
    return [line.rstrip() for line in ANSI.sub("", text).splitlines() if VERDICT.match(line)]


def cmd_collect(args) -> int:
    repo, out = Path(args.repo).resolve(), Path(args.out).absolute()
    models = Path(args.models).absolute()
    venv = Path(args.venv_dir) if args.venv_dir else default_venv_dir(Path(args.python))
    env = run_env(repo, venv)
    check_imports(args.python, repo, env)
    if out.exists() and any(out.iterdir()) and not args.force:
        sys.exit(f"release_diff: {out} is not empty (--force to write into it)")
    out.mkdir(parents=True, exist_ok=True)
    info = {"repo": str(repo), "git": git_state(repo), "dist": str(Path(args.dist).absolute()), "out": str(out),
            "python": args.python, "venv_dir": str(venv), "models": str(models), "cli": cli(args, repo)[1:],
            "env": {k: env[k] for k in (*HELP_ENV, "RKAUDIO_VENV_DIR")}, "families": {}}
    if info["git"]["dirty"]:
        print(f"WARNING: {repo} has uncommitted changes: engines record '<commit>+dirty'; a clean side and a "
              "dirty side differ by 6 bytes per engine (commit first for a byte comparison)")
    models_index = models / "models.json"
    if models_index.is_file():
        recorded = json.loads(models_index.read_text())["files"]
        changed = [name for name, digest in recorded.items()
                   if not (models / name).is_file() or sha256_bytes((models / name).read_bytes()) != digest]
        info["models_changed"] = changed
        if changed:
            print(f"WARNING: models changed since `models` wrote them: {changed}")

    t0 = time.monotonic()
    index = collect_help(cli(args, repo), repo, env, out / "help")
    print(f"help: {len(index)} texts in {out / 'help'} ({time.monotonic() - t0:.0f} s)")

    if args.engines_logs:
        logs_dir = Path(args.engines_logs)
        (out / "engines_verdicts").mkdir(exist_ok=True)
        for log in sorted(logs_dir.glob("engines_*.log")):
            lines = verdict_lines(log.read_text(errors="replace"))
            (out / "engines_verdicts" / f"{log.stem}.txt").write_text("".join(line + "\n" for line in lines))
        info["engines_logs"] = str(logs_dir.absolute())

    chosen = [r for r in FAMILY_RUNS if args.families in (None, "all") or r["name"] in args.families.split(",")]
    skip = set(args.skip_rknn.split(",")) if args.skip_rknn else set()
    for spec in chosen:
        argv = [part.format(models=models, out=out) for part in spec["argv"]]
        if spec["skip_rknn"] or spec["name"] in skip:
            argv.append("--skip-rknn")
        cmd = [*cli(args, repo), *argv]
        print(f"{spec['name']}: convert {' '.join(argv)} ...", flush=True)
        code, stdout, stderr, wall = run(cmd, out, env, timeout=args.timeout, log=out / "logs" / f"{spec['name']}.log")
        lines = verdict_lines(stdout + "\n" + stderr)
        (out / "verdicts").mkdir(exist_ok=True)
        (out / "verdicts" / f"{spec['name']}.txt").write_text("".join(line + "\n" for line in lines)
                                                                + f"exit code: {code}\n")
        info["families"][spec["name"]] = {"argv": ["convert", *argv], "exit": code, "wall_s": round(wall, 1),
                                          "verdicts": len(lines)}
        print(f"  exit {code}, {len(lines)} verdict lines, {wall:.0f} s")
        if code != 0:
            tail = "\n".join((stderr or stdout).strip().splitlines()[-5:])
            print(f"  last lines:\n{tail}")
    (out / "collect.json").write_text(json.dumps(info, indent=1) + "\n")
    print(f"wrote {out / 'collect.json'}")
    return 0


# ------------------------------------------------------------------------------------------- compare: files

def commit_hex(commit: str | None) -> str | None:
    hexpart = (commit or "").split("+")[0]
    return hexpart if re.fullmatch(r"[0-9a-f]{7,40}", hexpart) else None


def mask_commit(data: bytes, commit: str | None) -> tuple[bytes, int]:
    """`data` with every occurrence of the commit hex (and a `+dirty` after it) replaced by as many b'0'."""
    hexpart = commit_hex(commit)
    if hexpart is None:
        return data, 0
    pattern = re.compile(re.escape(hexpart.encode()) + rb"(?:\+dirty)?")
    return pattern.subn(lambda m: b"0" * len(m.group(0)), data)


def masked_digest(path: Path, commit: str | None) -> tuple[str, int, int]:
    """(sha256 of the engine with the commit masked, file bytes, occurrences masked)."""
    data = path.read_bytes()
    masked, count = mask_commit(data, commit)
    return sha256_bytes(masked), len(data), count


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7


def onnx_graph_digest(path: Path) -> str | None:
    """sha256 of an ONNX ModelProto without its metadata_props (field 14: the rkaudio contract, which holds the
    producer commit and command line); None when the file does not parse as protobuf."""
    data = path.read_bytes()
    digest, i = hashlib.sha256(), 0
    try:
        while i < len(data):
            start = i
            key, i = _varint(data, i)
            wire = key & 7
            if wire == 0:
                _, i = _varint(data, i)
            elif wire == 1:
                i += 8
            elif wire == 2:
                length, i = _varint(data, i)
                i += length
            elif wire == 5:
                i += 4
            else:
                return None
            if i > len(data):
                return None
            if key >> 3 != 14:
                digest.update(data[start:i])
    except IndexError:
        return None
    return digest.hexdigest()


def npz_diff(a: Path, b: Path) -> list[str]:
    """Array-by-array (np.savez stamps the zip entries with the time of writing, so the bytes never match)."""
    import numpy as np

    with np.load(a, allow_pickle=False) as x, np.load(b, allow_pickle=False) as y:
        problems = []
        if sorted(x.files) != sorted(y.files):
            problems.append(f"keys {sorted(set(x.files) ^ set(y.files))} in one only")
        for key in sorted(set(x.files) & set(y.files)):
            u, v = x[key], y[key]
            if u.dtype != v.dtype or u.shape != v.shape:
                problems.append(f"{key}: {u.dtype}{list(u.shape)} vs {v.dtype}{list(v.shape)}")
            elif u.tobytes() != v.tobytes():
                if u.dtype.kind in "fc":
                    d = np.abs(u.astype(np.float64) - v.astype(np.float64))
                    problems.append(f"{key}: values differ (max|d| {np.nanmax(d):.3g}, {int((d > 0).sum())} elements)")
                else:
                    problems.append(f"{key}: values differ ({int((u != v).sum())} elements)")
        return problems


class Side:
    """One capture (a collect dir) and the substitutions that make its text comparable with another's."""

    def __init__(self, out: Path, dist: Path | None = None):
        self.out = Path(out).absolute()
        info_path = self.out / "collect.json"
        self.info = json.loads(info_path.read_text()) if info_path.is_file() else {}
        self.dist = Path(dist).absolute() if dist else (Path(self.info["dist"]) if self.info.get("dist") else None)
        self.repo = self.info.get("repo")
        self.commit = (self.info.get("git") or {}).get("head")

    def normalise(self, text: str, commit: str | None = None) -> str:
        for value, token in ((str(self.dist) if self.dist else None, "<DIST>"), (str(self.out), "<OUT>"),
                             (self.repo, "<REPO>"), (self.dist.name if self.dist else None, "<DIST_NAME>")):
            if value:  # whole path names only: /tmp/before is not the start of /tmp/before_models
                text = re.sub(r"(?<![\w.-])" + re.escape(value) + r"(?![\w.-])", token, text)
        for c in {commit, self.commit}:
            hexpart = commit_hex(c)
            if hexpart:
                text = re.sub(re.escape(hexpart) + r"(\+dirty)?", "<COMMIT>", text)
        return text


def engine_sets(root: Path) -> dict:
    """{(package, target, engine stem): manifest path} under a dist dir (<target>/<package>_<target>/)."""
    found = {}
    if root is None or not root.is_dir():
        return found
    for manifest in sorted(root.glob("*/*/*.manifest.json")):
        package_dir, target = manifest.parent.name, manifest.parent.parent.name
        if package_dir.startswith(".") or package_dir.endswith(".failed"):
            continue
        package = package_dir[: -len(target) - 1] if package_dir.endswith("_" + target) else package_dir
        found[(package, target, manifest.name[: -len(".manifest.json")])] = manifest
    return found


def family_engine_sets(out: Path) -> dict:
    found = {}
    for manifest in sorted((out / "families").glob("*/*.manifest.json")) if (out / "families").is_dir() else []:
        data = json.loads(manifest.read_text())
        found[(f"family:{manifest.parent.name}", data.get("target", "?"), manifest.name[: -len(".manifest.json")])] = manifest
    return found


VOLATILE_MANIFEST_KEYS = ("producer_git", "producer", "build", "gates", "simulator", "onnx")


def manifest_rest(data: dict) -> dict:
    """The manifest without what differs by design (producer, build stats, the ONNX file entry whose bytes hold
    the producer), without the figures compared separately (gates, simulator), and without the engine digest."""
    rest = {k: v for k, v in data.items() if k not in VOLATILE_MANIFEST_KEYS}
    rest["rknn"] = {k: v for k, v in (data.get("rknn") or {}).items() if k not in ("sha256", "normalized_sha256")}
    contract = dict(data.get("contract") or {})
    contract.pop("producer", None)
    contract.pop("export_verdicts", None)  # the same verdicts as `gates`
    rest["contract"] = contract
    return rest


def flat(value, prefix=""):
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out.update(flat(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def as_number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def onnx_of(manifest_path: Path, data: dict) -> Path:
    """The ONNX a manifest names (relative to it); for a moved dist dir, the same name in
    <dist>/../work/<dist name>/<target>/<package>/ (where `convert engines` keeps it)."""
    named = manifest_path.parent / data["onnx"]["path"]
    if named.is_file():
        return named
    package = manifest_path.parent
    dist = package.parent.parent
    moved = dist.parent / "work" / dist.name / package.parent.name / package.name / Path(data["onnx"]["path"]).name
    return moved if moved.is_file() else named


def differing_bytes(ra: Path, rb: Path, commit_a: str | None, commit_b: str | None) -> int:
    """How many bytes two same-length engines differ in once the commit is masked."""
    import numpy as np

    x = np.frombuffer(mask_commit(ra.read_bytes(), commit_a)[0], np.uint8)
    y = np.frombuffer(mask_commit(rb.read_bytes(), commit_b)[0], np.uint8)
    return int((x != y).sum())


def compare_engine(ma: Path, mb: Path) -> dict:
    a, b = json.loads(ma.read_text()), json.loads(mb.read_text())
    row, notes = {}, []
    gates_a = [(g["name"], g.get("threshold"), g.get("unit"), g.get("passed"), g.get("bound")) for g in a.get("gates", [])]
    gates_b = [(g["name"], g.get("threshold"), g.get("unit"), g.get("passed"), g.get("bound")) for g in b.get("gates", [])]
    row["gates"] = gates_a == gates_b
    if not row["gates"]:
        for line in difflib.unified_diff([repr(g) for g in gates_a], [repr(g) for g in gates_b], "before", "after",
                                         lineterm="", n=0):
            notes.append(f"gates: {line}")
    value_diffs = []
    for ga, gb in zip(a.get("gates", []), b.get("gates", [])):
        if ga["name"] == gb["name"] and ga.get("value") != gb.get("value"):
            x, y = as_number(ga.get("value")), as_number(gb.get("value"))
            value_diffs.append(f"{ga['name']}: {ga.get('value')} -> {gb.get('value')}"
                               + (f" (d {y - x:+.3g})" if x is not None and y is not None and x == x and y == y
                                  and abs(x) != float("inf") and abs(y) != float("inf") else ""))
    sim_a, sim_b = flat(a.get("simulator") or {}), flat(b.get("simulator") or {})
    for key in sorted(set(sim_a) | set(sim_b)):
        if sim_a.get(key) != sim_b.get(key):
            value_diffs.append(f"simulator.{key}: {sim_a.get(key)} -> {sim_b.get(key)}")
    row["values"] = not value_diffs
    notes += [f"value: {d}" for d in value_diffs]

    ra, rb = ma.with_name(a["rknn"]["path"]), mb.with_name(b["rknn"]["path"])
    if ra.is_file() and rb.is_file():
        da, row["bytes_a"], ca = masked_digest(ra, a.get("producer_git"))
        db, row["bytes_b"], cb = masked_digest(rb, b.get("producer_git"))
        row["digest"] = da == db
        row["masked"] = (ca, cb)
        row["diff_bytes"] = None
        if not row["digest"] and row["bytes_a"] == row["bytes_b"]:
            row["diff_bytes"] = differing_bytes(ra, rb, a.get("producer_git"), b.get("producer_git"))
        if (a.get("producer_git") or "").endswith("+dirty") != (b.get("producer_git") or "").endswith("+dirty"):
            notes.append(f"producer_git {a.get('producer_git')} vs {b.get('producer_git')}: one side dirty, "
                         "engine lengths differ by the '+dirty' suffix")
        if ca != 1 or cb != 1:
            notes.append(f"commit masked {ca} time(s) before, {cb} after (expected once, in the custom_string)")
    else:
        row["digest"], row["bytes_a"], row["bytes_b"] = False, ra.stat().st_size if ra.is_file() else None, \
            rb.stat().st_size if rb.is_file() else None
        notes.append(f"engine file missing: {ra if not ra.is_file() else rb}")

    rest_a, rest_b = flat(manifest_rest(a)), flat(manifest_rest(b))
    differing = sorted(k for k in set(rest_a) | set(rest_b) if rest_a.get(k) != rest_b.get(k))
    row["manifest"] = not differing
    notes += [f"manifest {k}: {json.dumps(rest_a.get(k))[:150]} -> {json.dumps(rest_b.get(k))[:150]}"
              for k in differing[:20]]

    oa, ob = onnx_of(ma, a), onnx_of(mb, b)
    if oa.is_file() and ob.is_file():
        row["onnx"] = onnx_graph_digest(oa) == onnx_graph_digest(ob)
        if not row["onnx"]:
            notes.append(f"ONNX graph (metadata stripped) differs: {oa} vs {ob}")
    else:  # '-' when neither side kept its ONNX (a dist dir copied without work/), DIFF when one side did
        row["onnx"] = None if not oa.is_file() and not ob.is_file() else False
        notes.append(f"ONNX not found to compare: {', '.join(str(o) for o in (oa, ob) if not o.is_file())}")
    row["notes"] = notes
    return row


SKIP_CONTENT = (".log",)  # build logs carry timings and temp paths: presence only


def compare_tree(da: Path, db: Path, sa: Side, sb: Side, commit_a: str | None, commit_b: str | None,
                 ignore_dirs=("work",)) -> list[str]:
    """Every non-engine file of two package (or family output) dirs; problems as lines. Engines and manifests
    are compared per engine (compare_engine); ONNX by graph digest."""
    def files(root):
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()
                and not any(part in ignore_dirs for part in p.relative_to(root).parts[:-1])}

    fa, fb = files(da), files(db)
    problems = [f"only before: {n}" for n in sorted(fa - fb)] + [f"only after: {n}" for n in sorted(fb - fa)]
    for name in sorted(fa & fb):
        pa, pb = da / name, db / name
        if name.endswith((".rknn", ".manifest.json")) or name.endswith(SKIP_CONTENT) or name == "build-key.json":
            continue
        if name.endswith(".onnx"):
            if onnx_graph_digest(pa) != onnx_graph_digest(pb):
                problems.append(f"{name}: ONNX graph (metadata stripped) differs")
        elif name.endswith(".npz"):
            problems += [f"{name}: {p}" for p in npz_diff(pa, pb)]
        elif Path(name).name == "SHA256SUMS":
            names_a = [line.split(None, 1)[-1] for line in pa.read_text().splitlines() if line.strip()]
            names_b = [line.split(None, 1)[-1] for line in pb.read_text().splitlines() if line.strip()]
            if names_a != names_b:
                problems.append(f"{name}: lists other files ({sorted(set(names_a) ^ set(names_b))})")
        else:
            ba, bb = pa.read_bytes(), pb.read_bytes()
            if ba == bb:
                continue
            try:
                ta, tb = sa.normalise(ba.decode(), commit_a), sb.normalise(bb.decode(), commit_b)
            except UnicodeDecodeError:
                problems.append(f"{name}: bytes differ (binary, {len(ba)} vs {len(bb)} bytes)")
                continue
            if name.endswith(".json"):
                try:
                    if json.loads(ta) == json.loads(tb):
                        continue
                except json.JSONDecodeError:
                    pass
            if ta != tb:
                diff = list(difflib.unified_diff(ta.splitlines(), tb.splitlines(), f"before/{name}", f"after/{name}",
                                                 lineterm="", n=1))
                problems.append(f"{name}: differs\n    " + "\n    ".join(diff[:40])
                                + ("\n    ..." if len(diff) > 40 else ""))
    return problems


def normalise_help(text: str, side: Side) -> str:
    """Repository paths (a default such as --recipes) as <REPO>; on those lines only, the padding before a rich
    box's right border, which follows the path's length."""
    out = []
    for line in text.splitlines():
        new = side.normalise(line)
        if new != line:
            new = re.sub(r" +([│|])$", r" \1", new.rstrip())
        out.append(new)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def compare_text_dirs(name: str, da: Path, db: Path, normalise_a, normalise_b, pattern: str) -> tuple[int, list[str]]:
    fa = {p.name for p in da.glob(pattern)} if da.is_dir() else set()
    fb = {p.name for p in db.glob(pattern)} if db.is_dir() else set()
    lines, differing = [], 0
    for f in sorted(fa - fb):
        lines.append(f"{name}: only before: {f}")
        differing += 1
    for f in sorted(fb - fa):
        lines.append(f"{name}: only after: {f}")
        differing += 1
    for f in sorted(fa & fb):
        ta, tb = normalise_a((da / f).read_text()), normalise_b((db / f).read_text())
        if ta != tb:
            differing += 1
            lines.append(f"{name}: {f} differs")
            lines += list(difflib.unified_diff(ta.splitlines(), tb.splitlines(), f"before/{f}", f"after/{f}",
                                               lineterm=""))
    return differing, lines


def yn(value) -> str:
    return "-" if value is None else ("same" if value else "DIFF")


def cmd_compare(args) -> int:
    sa, sb = Side(args.before, args.before_dist), Side(args.after, args.after_dist)
    failed = False
    print(f"before: {sa.out} (repo {sa.repo} @ {sa.commit}{'+dirty' if (sa.info.get('git') or {}).get('dirty') else ''}, "
          f"dist {sa.dist})")
    print(f"after:  {sb.out} (repo {sb.repo} @ {sb.commit}{'+dirty' if (sb.info.get('git') or {}).get('dirty') else ''}, "
          f"dist {sb.dist})")

    ea, eb = engine_sets(sa.dist), engine_sets(sb.dist)
    ea.update(family_engine_sets(sa.out))
    eb.update(family_engine_sets(sb.out))
    if not ea and not eb:
        print("no engines found in either side")
    rows, notes = [], []
    for key in sorted(set(ea) | set(eb)):
        if key not in ea or key not in eb:
            rows.append((*key, "MISSING", "", "", "", "", "before only" if key in ea else "after only", ""))
            failed = True
            continue
        r = compare_engine(ea[key], eb[key])
        digest_cell = yn(r["digest"])
        tolerated = False
        if not r["digest"] and r.get("diff_bytes") is not None:
            allowed = max(args.max_diff_bytes, KNOWN_NONDETERMINISTIC.get(key[0], 0))
            tolerated = r["diff_bytes"] <= allowed
            digest_cell = f"{'~same' if tolerated else 'DIFF'} ({r['diff_bytes']} B)"
        ok = r["gates"] and (r["digest"] or tolerated) and r["manifest"] and r["onnx"] is not False
        failed |= not ok or (args.strict_values and not r["values"])
        rows.append((*key, yn(r["gates"]), digest_cell, yn(r["manifest"]), yn(r["onnx"]), yn(r["values"]),
                     f"{r['bytes_a']:,}" if r["bytes_a"] is not None else "-",
                     f"{r['bytes_b']:,}" if r["bytes_b"] is not None else "-"))
        notes += [f"{key[0]} {key[1]} {key[2]}: {n}" for n in r["notes"]]
    header = ("package", "target", "engine", "gates", "masked_digest", "manifest", "onnx_graph", "values",
              "bytes_before", "bytes_after")
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)] if rows else [len(h) for h in header]
    print()
    for line in (header, tuple("-" * w for w in widths), *rows):
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip())
    print("(gates: names, thresholds, units, bounds, passed; masked_digest: engine bytes with the producer commit "
          "masked; manifest: the manifest less producer/build/onnx entry/figures; onnx_graph: the ONNX less its "
          "metadata; values: gate and simulator figures, informational unless --strict-values; '~same (N B)': "
          f"a same-length engine differing in N bytes, accepted for {', '.join(KNOWN_NONDETERMINISTIC)} (not "
          "byte-reproducible at c8d3a2d) or under --max-diff-bytes)")
    for note in notes:
        print("  " + note)

    # package / family-output files beside the engines
    print("\npackage files (exec_plan.json, goldens, kit code, SHA256SUMS names, README.md, ...):")
    dirs = []
    for root_a, root_b, label in ((sa.dist, sb.dist, "dist"), (sa.out / "families", sb.out / "families", "families")):
        pa = {str(p.relative_to(root_a)) for p in root_a.glob("*/*") if p.is_dir()} if root_a and root_a.is_dir() else set()
        pb = {str(p.relative_to(root_b)) for p in root_b.glob("*/*") if p.is_dir()} if root_b and root_b.is_dir() else set()
        if label == "families":
            pa = {p.name for p in root_a.iterdir() if p.is_dir()} if root_a.is_dir() else set()
            pb = {p.name for p in root_b.iterdir() if p.is_dir()} if root_b.is_dir() else set()
        for name in sorted(pa | pb):
            if Path(name).name.startswith("."):
                print(f"  {label}/{name}: a staging directory left behind")
                failed = True
                continue
            if name not in pa or name not in pb:
                print(f"  {label}/{name}: only {'before' if name in pa else 'after'}")
                failed = True
                continue
            dirs.append((label, name, root_a / name, root_b / name))
    for label, name, da, db in dirs:
        ca = next((json.loads(m.read_text()).get("producer_git") for m in da.glob("*.manifest.json")), None)
        cb = next((json.loads(m.read_text()).get("producer_git") for m in db.glob("*.manifest.json")), None)
        problems = compare_tree(da, db, sa, sb, ca, cb)
        print(f"  {label}/{name}: {'same' if not problems else f'{len(problems)} difference(s)'}")
        for p in problems:
            print("    " + p)
        failed |= bool(problems)

    # help texts and verdict lines
    print("\nhelp texts:")
    count, lines = compare_text_dirs("help", sa.out / "help", sb.out / "help", lambda t: normalise_help(t, sa),
                                     lambda t: normalise_help(t, sb), "*.txt")
    n_help = len(list((sa.out / "help").glob("*.txt"))) if (sa.out / "help").is_dir() else 0
    print(f"  {n_help} texts before, {count} differ" if count else f"  all {n_help} the same")
    print("\n".join("  " + line for line in lines))
    failed |= bool(count) or n_help == 0
    for sub, what in (("verdicts", "family verdict lines (step 3)"), ("engines_verdicts", "engines log verdict lines")):
        if not (sa.out / sub).is_dir() and not (sb.out / sub).is_dir():
            continue
        count, lines = compare_text_dirs(sub, sa.out / sub, sb.out / sub, sa.normalise, sb.normalise, "*.txt")
        print(f"\n{what}: " + (f"{count} file(s) differ" if count else "the same"))
        print("\n".join("  " + line for line in lines))
        failed |= bool(count)
    fa, fb = sa.info.get("families", {}), sb.info.get("families", {})
    if fa or fb:
        print("\nfamily runs (exit code, wall s):")
        for name in sorted(set(fa) | set(fb)):
            a, b = fa.get(name, {}), fb.get(name, {})
            same_argv = [sa.normalise(x) for x in a.get("argv", [])] == [sb.normalise(x) for x in b.get("argv", [])]
            print(f"  {name}: before exit {a.get('exit')} {a.get('wall_s')} s, after exit {b.get('exit')} "
                  f"{b.get('wall_s')} s" + ("" if same_argv else "  (different commands!)"))
            failed |= a.get("exit") != b.get("exit") or not same_argv
    print(f"\n{'DIFFERENT' if failed else 'SAME'}: before vs after")
    return 1 if failed else 0


# ------------------------------------------------------------------------------------------- main

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p, dist=True):
        p.add_argument("--repo", required=True, help="the rkaudio tree to run (PYTHONPATH and cwd)")
        p.add_argument("--python", required=True, help="the export venv's python, e.g. /work/main/.venv/export/bin/python")
        p.add_argument("--venv-dir", help="RKAUDIO_VENV_DIR for the build child (default: the venv root of --python)")
        p.add_argument("--entry", help="MODULE:FUNCTION of `convert` (default: [project.scripts] convert in the "
                       "repo's pyproject.toml)")
        p.add_argument("--cli-module", help="run `python -m MODULE` instead of the entry point (e.g. rkaudio.cli)")
        if dist:
            p.add_argument("--dist", required=True, help="the dist dir of `engines` for this tree")

    p = sub.add_parser("engines", help="step 1: `convert engines --target T --dist DIST` per target, logs kept")
    common(p)
    p.add_argument("--logs", required=True)
    p.add_argument("--targets", default=",".join(TARGETS))
    p.set_defaults(func=cmd_engines)

    p = sub.add_parser("models", help="write the small deterministic models of step 3 (run once, BEFORE tree)")
    common(p, dist=False)
    p.add_argument("--models", required=True)
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("collect", help="steps 2 and 3: help texts and family verdict lines into --out")
    common(p)
    p.add_argument("--out", required=True)
    p.add_argument("--models", required=True, help="the dir `models` wrote (reused as is for every tree)")
    p.add_argument("--engines-logs", help="dir of engines_<target>.log from step 1: their verdict lines are compared too")
    p.add_argument("--families", help="comma-separated subset of: " + ",".join(r["name"] for r in FAMILY_RUNS))
    p.add_argument("--skip-rknn", help="comma-separated families to run with --skip-rknn")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per family run")
    p.add_argument("--force", action="store_true", help="write into a non-empty --out")
    p.set_defaults(func=cmd_collect)

    p = sub.add_parser("compare", help="compare two collect dirs (and their dist dirs); exit 1 when anything differs")
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--before-dist", help="override the dist dir recorded in BEFORE/collect.json")
    p.add_argument("--after-dist", help="override the dist dir recorded in AFTER/collect.json")
    p.add_argument("--strict-values", action="store_true", help="gate and simulator figures must match too")
    p.add_argument("--max-diff-bytes", type=int, default=0, help="accept (as '~same') a same-length engine whose "
                   "masked bytes differ in at most this many bytes (default 0: byte-identical)")
    p.set_defaults(func=cmd_compare)

    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so that run() kills the child's whole process group on the way out
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
