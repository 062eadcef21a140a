"""Upstream's tests/ for trees made from a PyPI sdist, which ships none (DeepSpeed's does not):
copied, never linked, from a git repository the user names (a local clone or mirror), at the
release's tag where it has it, else at its newest commit, into the trees before the series'
test patches apply. The files the tree already has are its own and stay as released."""

from __future__ import annotations

import logging
import shutil
import tarfile
import tempfile
from pathlib import Path

from hostsync.detector.words import counted
from hostsync.upstream.git import git, rev
from hostsync.upstream.records import UpstreamTests
from hostsync.workspace.errors import WorkspaceError

log = logging.getLogger(__name__)

TESTS = "tests"


def shown(repository: str) -> str:
    """A repository as results name it: a URL as given, a local clone as one (where this
    machine keeps it is no one else's concern, and results are committed)."""
    return repository if "://" in repository or repository.startswith("git@") else "a local clone"


def source(remote: Path, tag: str, tree_origin: str) -> UpstreamTests:
    """The commit of `remote` whose tests/ the trees get: `tag` where it has it, else HEAD."""
    commit = rev(remote, tag)
    ref = f"tag {tag}"
    if not commit:
        commit, ref = rev(remote, "HEAD"), f"its newest commit (it has no tag {tag})"
    has_tests = git(remote, "cat-file", "-e", f"{commit}:{TESTS}", check=False).returncode == 0
    if not commit or not has_tests:
        raise WorkspaceError(
            f"--remote {remote} has no {TESTS}/ at {ref}: give a clone of the project itself"
        )
    committed = git(remote, "log", "-1", "--format=%cI", commit).stdout.strip()
    listed = git(remote, "ls-tree", "-r", "--name-only", commit, "--", TESTS).stdout
    return UpstreamTests(str(remote), commit, committed, ref, len(listed.splitlines()), tree_origin)


def copy_into(tests: UpstreamTests, root: Path) -> None:
    """Copy the tests/ files of `tests` that the worktree `root` lacks and commit them (fixed
    identity and date, and the clone named only as one, so the same source gives the same
    commit wherever it is kept)."""
    remote = Path(tests.repository)
    with tempfile.TemporaryDirectory() as unpacked:
        archive_path = Path(unpacked) / "tests.tar"
        git(remote, "archive", f"--output={archive_path}", tests.commit, "--", TESTS)
        with tarfile.open(archive_path) as tar:
            regular = [member for member in tar.getmembers() if member.isfile()]
            tar.extractall(Path(unpacked) / "out", members=regular, filter="data")
        copied = [
            name
            for name in (member.name for member in regular)
            if not (root / name).exists() and not (root / name).is_symlink()
        ]
        for name in copied:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(unpacked) / "out" / name, root / name)
    if copied:
        git(root, "add", "--", *copied)
        stamp = {"GIT_AUTHOR_DATE": tests.committed, "GIT_COMMITTER_DATE": tests.committed}
        message = (
            f"upstream's {TESTS}/ from {shown(tests.repository)} at {tests.commit} ({tests.ref},"
            f" {tests.committed})\n\n{len(copied)} file(s) the release's tree lacks.\n"
        )
        git(root, "commit", "--quiet", "--no-verify", "--message", message, env=stamp)
    log.info("copied %s of upstream's %s/ into %s", counted(len(copied), "file"), TESTS, root)
