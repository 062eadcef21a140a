"""A release as a git repository whose tag is the release as published: from `git clone` when
the project's remote (or `--remote`) answers, else from the sha256-verified PyPI sdist,
committed as one reproducible commit under the release's tag."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from hostsync.upstream.git import git, write_state
from hostsync.upstream.sdists import fetch_sdist, pypi_sdist
from hostsync.workspace.cases import Case, Release
from hostsync.workspace.errors import WorkspaceError, last_line
from hostsync.workspace.layout import Layout
from hostsync.workspace.projects import Project

log = logging.getLogger(__name__)

SDIST_ORIGIN = "PyPI sdist"
_REMOTE_TIMEOUT_S = 30
_CLONE_TIMEOUT_S = 900


def release_for(case: Case, version: str) -> Release:
    """A release by version: the case's pinned and fixed ones from its card, any other from
    PyPI's index (its tag named like the pinned one's)."""
    for known in (case.pin, case.fixed):
        if known is not None and known.version == version:
            return known
    tag = tag_format(case.pin).format(version=version)
    return Release(version=version, tag=tag, sdist=pypi_sdist(case.project, version))


def tag_format(release: Release) -> str:
    """How the project names its release tags, from one it names: `v{version}`."""
    return release.tag.replace(release.version, "{version}")


def materialise(
    layout: Layout, project: Project, release: Release, dest: Path, remote: str | None = None
) -> None:
    """Create `dest` as a git repository whose tag `release.tag` is the release as published.

    Built in a sibling folder and renamed at the end, so a failure leaves nothing half-made.
    """
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        remote = remote or project.repository
        reason = _clone_tag(remote, release.tag, partial)
        if reason:
            log.info("cannot use git (%s); using the PyPI sdist %s", reason, release.sdist.filename)
            origin = _import_sdist(layout, project, release, partial)
        else:
            origin = f"git clone of {remote} at tag {release.tag}"
        _check_version(partial, project, release)
        write_state(partial, origin=origin)
        partial.rename(dest)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _clone_tag(remote: str, tag: str, dest: Path) -> str | None:
    """Clone `tag` of `remote` into `dest`; the reason it could not, or None when it did."""
    probe = ["ls-remote", "--exit-code", remote, f"refs/tags/{tag}"]
    try:
        found = git(Path.cwd(), *probe, check=False, timeout=_REMOTE_TIMEOUT_S, isolated=False)
    except subprocess.TimeoutExpired:
        return f"{remote} did not answer within {_REMOTE_TIMEOUT_S} s"
    if found.returncode != 0:
        return f"{remote} has no tag {tag}" if found.returncode == 2 else last_line(found.stderr)
    log.info("cloning %s at %s", remote, tag)
    clone = ["clone", "--quiet", "--depth=1", f"--branch={tag}", _as_url(remote), str(dest)]
    git(Path.cwd(), *clone, timeout=_CLONE_TIMEOUT_S, isolated=False)
    return None


def from_sdist(origin: str) -> bool:
    """Whether a repository's recorded origin is an imported sdist (which may lack tests/)."""
    return origin.startswith(SDIST_ORIGIN)


def _as_url(remote: str) -> str:
    """Local paths as file:// URLs, so that --depth applies to them too."""
    return Path(remote).resolve().as_uri() if Path(remote).exists() else remote


def _import_sdist(layout: Layout, project: Project, release: Release, dest: Path) -> str:
    """The sdist as one commit at `dest`. The commit is the same every time, so the first
    import of an sdist is kept in the download cache (a bare repository named by its sha256),
    and later ones clone it: hashing and compressing every file again takes seconds."""
    origin = f"{SDIST_ORIGIN} {release.sdist.filename} (sha256 {release.sdist.sha256})"
    imported = layout.cache / "imports" / f"{release.sdist.sha256}.git"
    if imported.exists():
        git(dest.parent, "clone", "--quiet", "--no-checkout", str(imported), str(dest))
        git(dest, "remote", "remove", "origin")
        git(dest, "checkout", "--quiet", "--detach", release.tag)
        return origin
    _commit_sdist(layout, project, release, dest)
    imported.parent.mkdir(parents=True, exist_ok=True)
    partial = imported.with_name(f"{imported.name}.{os.getpid()}.partial")
    git(dest.parent, "clone", "--quiet", "--bare", str(dest), str(partial))
    try:
        partial.rename(imported)
    except OSError:  # another process kept the same commit first
        shutil.rmtree(partial)
    return origin


def _commit_sdist(layout: Layout, project: Project, release: Release, dest: Path) -> None:
    archive = fetch_sdist(layout, release.sdist)
    with tempfile.TemporaryDirectory(dir=dest.parent) as unpacked, tarfile.open(archive) as tar:
        tar.extractall(unpacked, filter="data")
        (top,) = Path(unpacked).iterdir()
        top.rename(dest)
        released = int(tar.getmember(f"{top.name}/PKG-INFO").mtime)
    message = (
        f"{project.name} {release.version} as released on PyPI\n\n"
        f"Imported from {release.sdist.url}\nsha256 {release.sdist.sha256}, {release.sdist.size}"
        " bytes.\n\nAn sdist may lack tests and tooling files that the git tag has.\n"
    )
    # Fixed identity and date: the same sdist gives the same commit on every machine.
    stamp = f"@{released} +0000"
    git(dest, "init", "--quiet", "--initial-branch=main")
    git(dest, "add", "--all")
    dates = {"GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp}
    git(dest, "commit", "--quiet", "--message", message, env=dates)
    git(dest, "tag", release.tag)
    # Like a clone of the tag: HEAD detached at it, no branch of our own making.
    git(dest, "checkout", "--quiet", "--detach", release.tag)
    git(dest, "branch", "--quiet", "--delete", "main")


def _check_version(repo: Path, project: Project, release: Release) -> None:
    found = project.version_in(repo)
    if found != release.version:
        raise WorkspaceError(
            f"{release.tag} holds {project.name} {found}, not {release.version}: fix the case card"
        )
