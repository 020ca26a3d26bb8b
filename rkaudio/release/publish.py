"""Publishing a release (`convert publish`): it checks each package (SHA256SUMS and manifests, the host replay of its
self-test) before anything is uploaded, then uploads to one Hub repository, a folder per package, only the files
whose remote hashes differ, and tags the revision. The live upload is exercised by release engineers only: tests
run it against a stand-in for `huggingface_hub.HfApi` that records calls and models the remote files and tags."""
from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Callable

from rkaudio.release.kit import HostOpener, package_files, verify
from rkaudio.core.errors import SetupError
from rkaudio.board.files import SUMS_NAME


def git_blob_sha1(path: Path) -> str:
    """The Hub's id of a small (non-LFS) file: git's blob hash."""
    data = Path(path).read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def remote_hashes(api, repo_id: str, revision: str | None) -> dict[str, tuple[str, str]]:
    """{path in repo: (kind, hash)} of the repository's files ("sha256" for LFS files, "git" otherwise);
    empty when the repository does not exist yet."""
    from huggingface_hub.utils import RepositoryNotFoundError, RevisionNotFoundError

    try:
        entries = api.list_repo_tree(repo_id, recursive=True, revision=revision)
        found = {}
        for entry in entries:
            lfs = getattr(entry, "lfs", None)
            if lfs is not None:
                found[entry.path] = ("sha256", lfs["sha256"] if isinstance(lfs, dict) else lfs.sha256)
            elif getattr(entry, "blob_id", None):
                found[entry.path] = ("git", entry.blob_id)
        return found
    except (RepositoryNotFoundError, RevisionNotFoundError):
        return {}


def _same(local: Path, remote: tuple[str, str] | None) -> bool:
    from rkaudio.board.files import sha256_file

    if remote is None:
        return False
    kind, value = remote
    return value == (sha256_file(local) if kind == "sha256" else git_blob_sha1(local))


def packages_in(dist_target_dir: Path) -> list[Path]:
    found = sorted(p for p in Path(dist_target_dir).iterdir() if p.is_dir() and (p / SUMS_NAME).is_file())
    if not found:
        raise SetupError(f"no package in {dist_target_dir} (a package is a folder with {SUMS_NAME}); run "
                         "`make engines TARGET=<soc>` first")
    return found


def check_packages(packages: list[Path], replay: str, say: Callable[[str], None]) -> None:
    """Refuse the whole release, before any upload, when a package fails `convert verify` or its host replay."""
    from rkaudio.board.selftest import selftest

    for package in packages:
        problems = verify(package)
        if problems:
            raise SetupError(f"{package.name} is refused before any upload: " + "; ".join(problems))
        if replay == "none":
            continue
        say(f"host replay of {package.name} ({replay}) ...")
        with tempfile.TemporaryDirectory(prefix="rkaudio-publish-") as scratch:
            code = selftest(package, HostOpener(package, replay), runs=1, report_path=Path(scratch) / "report.json",
                            say=lambda _: None)
        if code != 0:
            raise SetupError(f"{package.name} is refused before any upload: its self-test replay ({replay}) exited "
                             f"{code}; run `convert selftest {package} --backend {replay}` to see why")


def publish(dist_target_dir: Path, repo_id: str, revision: str | None = None, dry_run: bool = False,
            replay: str = "simulator", api=None, say: Callable[[str], None] = print) -> list[tuple[str, str]]:
    """Check every package, then upload what differs into `repo_id` (a folder per package) and tag `revision`.
    Returns the operations as (verb, path in repo); with `dry_run` nothing is sent."""
    packages = packages_in(dist_target_dir)
    check_packages(packages, replay, say)
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi()
    try:
        remote = remote_hashes(api, repo_id, None)
    except OSError as error:  # requests' errors are OSErrors: no network, DNS, a proxy, a refused token
        reason = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
        if not dry_run:
            raise SetupError(f"cannot list {repo_id} on the Hub ({reason}); nothing was uploaded. Check the network "
                             "and the token (`huggingface-cli login`), or use --dry-run") from None
        say(f"the Hub is not reachable ({reason}): the dry run compares with an empty repository, so every file "
            "reads as an upload")
        remote = {}
    operations: list[tuple[str, str]] = []
    uploads = []
    for package in packages:
        for name in package_files(package) + [SUMS_NAME]:
            path_in_repo, local = f"{package.name}/{name}", package / name
            verb = "unchanged" if _same(local, remote.get(path_in_repo)) else "upload"
            operations.append((verb, path_in_repo))
            if verb == "upload":
                uploads.append((path_in_repo, local))
    tags = set()
    if revision:
        try:
            tags = {ref.name for ref in api.list_repo_refs(repo_id).tags}
        except Exception:  # a repository that does not exist yet has no tags
            tags = set()
        operations.append(("unchanged tag" if revision in tags else "tag", revision))
    for verb, target in operations:
        if verb != "unchanged":
            say(f"{'would ' if dry_run else ''}{verb} {target}")
    say(f"{len(uploads)} file(s) to upload, {sum(v == 'unchanged' for v, _ in operations)} unchanged, into {repo_id}")
    if dry_run:
        return operations
    from huggingface_hub import CommitOperationAdd

    try:
        api.create_repo(repo_id, exist_ok=True)
        if uploads:
            api.create_commit(repo_id, [CommitOperationAdd(path_in_repo=p, path_or_fileobj=str(l)) for p, l in uploads],
                              commit_message=f"rkaudio release {revision or ''}".strip())
        if revision and revision not in tags:
            api.create_tag(repo_id, tag=revision)
    except Exception as error:
        raise SetupError(f"the upload to {repo_id} failed ({type(error).__name__}: {error}); nothing was tagged. "
                         "Check the token (`huggingface-cli login`) and rerun: files already uploaded are skipped") from None
    return operations
