"""Publishing: the model card every package carries, `convert publish` against a stand-in for HfApi (no network
here; the live upload is exercised by release engineers), the CI matrix and workflow."""
from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import yaml

from rkaudio.cli.families import declaration
from rkaudio.release import recipes
from rkaudio.release.publish import git_blob_sha1, publish
from rkaudio.core.errors import SetupError
from rkaudio.core.paths import REPO_ROOT
from rkaudio.board.files import sha256_file


class StandInHub:
    """Records every call; models the remote files (path -> (kind, hash)) and tags like the Hub does."""

    def __init__(self):
        self.calls, self.files, self.tags, self.exists = [], {}, set(), False

    def list_repo_tree(self, repo_id, recursive=False, revision=None):
        from huggingface_hub.utils import RepositoryNotFoundError

        self.calls.append(("list_repo_tree", repo_id))
        if not self.exists:
            raise RepositoryNotFoundError("no such repo", response=SimpleNamespace(headers={}, status_code=404,
                                                                                    request=None, url=""))
        return [SimpleNamespace(path=p, lfs={"sha256": h} if kind == "sha256" else None,
                                blob_id=h if kind == "git" else None) for p, (kind, h) in self.files.items()]

    def list_repo_refs(self, repo_id):
        self.calls.append(("list_repo_refs", repo_id))
        return SimpleNamespace(tags=[SimpleNamespace(name=t) for t in self.tags])

    def create_repo(self, repo_id, exist_ok=False):
        self.calls.append(("create_repo", repo_id))
        self.exists = True

    def create_commit(self, repo_id, operations, commit_message):
        self.calls.append(("create_commit", repo_id, [op.path_in_repo for op in operations]))
        for op in operations:  # LFS for engines and arrays, git blobs for text, as the Hub stores them
            local = op.path_or_fileobj
            lfs = op.path_in_repo.endswith((".rknn", ".npz"))
            self.files[op.path_in_repo] = ("sha256", sha256_file(local)) if lfs else ("git", git_blob_sha1(local))

    def create_tag(self, repo_id, tag):
        self.calls.append(("create_tag", repo_id, tag))
        self.tags.add(tag)


def test_the_package_carries_a_model_card_with_front_matter(package):
    card = (package / "README.md").read_text()
    front = yaml.safe_load(card.split("---")[1])
    assert front["library_name"] == "rknn" and "rk3588" in front["tags"] and "rknn" in front["tags"]
    assert front["license"] == recipes.load_recipe(REPO_ROOT / "recipes" / "example_conv.toml", declaration)["card"]["license"]
    assert "librknnrt.so` 2.3.2 or newer" in card and "python3 selftest.py" in card
    assert "`example_c16_t64.rknn`" in card and '"example.exec_plan"' in card
    listed = (package / "SHA256SUMS").read_text()
    assert "  README.md\n" in listed  # the card is part of what the package proves


def test_publish_dry_run_lists_the_operations_and_uploads_nothing(package):
    hub = StandInHub()
    lines = []
    operations = publish(package.parent, "test/rkaudio", "v0.1.0", dry_run=True, replay="onnx", api=hub,
                         say=lines.append)
    uploads = [target for verb, target in operations if verb == "upload"]
    assert f"{package.name}/example_c16_t64.rknn" in uploads and f"{package.name}/README.md" in uploads
    assert f"{package.name}/SHA256SUMS" in uploads and ("tag", "v0.1.0") in operations
    assert not [c for c in hub.calls if c[0] in ("create_repo", "create_commit", "create_tag")]
    assert any(line.startswith("would upload") for line in lines)


def test_publish_uploads_then_a_rerun_uploads_nothing(package):
    hub = StandInHub()
    publish(package.parent, "test/rkaudio", "v0.1.0", replay="none", api=hub, say=lambda _: None)
    [commit] = [c for c in hub.calls if c[0] == "create_commit"]
    assert len(commit[2]) == len(hub.files) > 10 and ("create_tag", "test/rkaudio", "v0.1.0") in hub.calls
    hub.calls.clear()
    operations = publish(package.parent, "test/rkaudio", "v0.1.0", replay="none", api=hub, say=lambda _: None)
    assert {verb for verb, _ in operations} == {"unchanged", "unchanged tag"}
    assert not [c for c in hub.calls if c[0] in ("create_commit", "create_tag")]


def test_a_tampered_package_is_refused_before_any_upload(package):
    hub = StandInHub()
    (package / "exec_plan.json").write_text("{}\n")
    with pytest.raises(SetupError, match="refused before any upload.*changed: exec_plan.json"):
        publish(package.parent, "test/rkaudio", None, replay="none", api=hub, say=lambda _: None)
    assert hub.calls == []


def test_a_failed_upload_says_what_to_do(package):
    class Failing(StandInHub):
        def create_commit(self, *args, **kwargs):
            raise ConnectionError("network unreachable")

    with pytest.raises(SetupError, match="upload to test/rkaudio failed.*rerun"):
        publish(package.parent, "test/rkaudio", "v1", replay="none", api=Failing(), say=lambda _: None)


class OfflineHub(StandInHub):
    """No network: every call fails as requests does when the Hub cannot be reached."""

    def list_repo_tree(self, repo_id, recursive=False, revision=None):
        import requests

        self.calls.append(("list_repo_tree", repo_id))
        raise requests.exceptions.ConnectionError("Max retries exceeded with url: /api/models/test/rkaudio/tree/main")

    def list_repo_refs(self, repo_id):
        return self.list_repo_tree(repo_id)


def test_without_the_hub_a_dry_run_lists_every_file_and_a_live_run_stops_with_a_line(package):
    lines = []
    operations = publish(package.parent, "test/rkaudio", "v0.1.0", dry_run=True, replay="none", api=OfflineHub(),
                         say=lines.append)
    assert any(line.startswith("the Hub is not reachable (ConnectionError") for line in lines)
    assert {verb for verb, _ in operations} == {"upload", "tag"}
    hub = OfflineHub()
    with pytest.raises(SetupError, match=r"cannot list test/rkaudio on the Hub \(ConnectionError.*nothing was uploaded"):
        publish(package.parent, "test/rkaudio", "v0.1.0", dry_run=False, replay="none", api=hub, say=lambda line: None)
    assert [c[0] for c in hub.calls] == ["list_repo_tree"]


def test_the_ci_matrix_matches_the_recipes_and_the_workflow_uses_real_commands():
    from typer.testing import CliRunner

    from rkaudio import cli
    from rkaudio.cli.commands import SHARED_COMMANDS

    if not cli.app.registered_commands:
        cli._register_all()
    result = CliRunner().invoke(cli.app, ["engines", "--matrix-json"])
    assert result.exit_code == 0, result.output
    matrix = json.loads(result.output)["include"]
    expected = {(r["package"], t) for r in recipes.load_recipes(REPO_ROOT / "recipes", declaration) for t in r["targets"]}
    assert {(m["package"], m["target"]) for m in matrix} == expected and len(matrix) == len(expected)

    workflow = yaml.safe_load((REPO_ROOT / ".github" / "workflows" / "engines.yml").read_text())
    assert {"matrix", "build", "publish"} <= set(workflow["jobs"])
    assert "fromJSON(needs.matrix.outputs.matrix)" in workflow["jobs"]["build"]["strategy"]["matrix"]
    assert workflow["jobs"]["publish"]["if"].startswith("startsWith(github.ref, 'refs/tags/')")
    runs = [step["run"] for job in workflow["jobs"].values() for step in job["steps"] if "run" in step]
    commands = {m for run in runs for m in re.findall(r"rkaudio\.cli (\w+)", run)}
    makes = {m for run in runs for m in re.findall(r"make ([\w-]+)", run)}
    assert commands and commands <= set(SHARED_COMMANDS)
    targets = set(re.findall(r"^([\w-]+):", (REPO_ROOT / "Makefile").read_text(), re.M))
    assert makes and makes <= targets


def test_the_card_row_of_an_engine_without_an_snr_gate_says_so():
    """An engine whose gates hold no SNR (only counts, or an at-most dB figure) gets '-' in the card, not an error."""
    from rkaudio.release.card import model_card
    from rkaudio.board.verdict import at_most

    manifest = {"rknn": {"path": "x.rknn", "bytes": 10}, "ops": {"cpu": 0}, "regtask": {"lines": 0},
                "toolkit_version": "2.3.2", "producer_version": "0", "gates": [
                    at_most("regtask_lines", 0, 0, "lines").to_json(), at_most("leak", 37.0, 40.0, "dB").to_json()]}
    recipe = recipes.load_recipe(REPO_ROOT / "recipes" / "example_conv.toml", declaration)
    card = model_card(recipe, "rk3588", [manifest], {})
    assert "| `x.rknn` | 10 | 2/2 | - | 0 | 0 |" in card
