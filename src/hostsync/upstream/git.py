"""git, run the same way everywhere, and the bookkeeping kept inside a repository's git dir."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path
from typing import Any

from hostsync.detector.codec import RecordError, read_file, write_file
from hostsync.upstream.records import GitState
from hostsync.workspace.errors import WorkspaceError, last_line

# The committer of the commits the workspace makes itself (imported sdists, applied patches),
# so that they come out the same on every machine.
IDENTITY = {"name": "hostsync", "email": "hostsync@localhost"}


def git(
    repo: Path,
    *args: str,
    check: bool = True,
    timeout: float | None = None,
    isolated: bool = True,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run git in `repo`.

    `isolated` ignores user and system config, and commits get a fixed committer: the commits
    and patch files the workspace makes come out the same on every machine.
    """
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", LC_ALL="C", **(env or {}))
    if isolated:
        env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)
    for role in ("AUTHOR", "COMMITTER"):
        env.setdefault(f"GIT_{role}_NAME", IDENTITY["name"])
        env.setdefault(f"GIT_{role}_EMAIL", IDENTITY["email"])
    result = subprocess.run(
        ["git", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and result.returncode != 0:
        raise WorkspaceError(
            f"git {' '.join(args[:3])} failed in {repo}: {last_line(result.stderr)}"
        )
    return result


def is_repository(path: Path) -> bool:
    """A git repository, bare or not, at `path` or above it."""
    return path.is_dir() and git(path, "rev-parse", "--git-dir", check=False).returncode == 0


def rev(repo: Path, ref: str) -> str:
    """The commit `ref` names, or "" when there is none."""
    found = git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
    return found.stdout.strip()


def _state_file(repo: Path) -> Path:
    """Bookkeeping inside the repository's git dir: invisible to `git status`, gone with it."""
    return repo / git(repo, "rev-parse", "--git-path", "hostsync.json").stdout.strip()


def read_state(repo: Path) -> GitState:
    path = _state_file(repo)
    if not path.exists():
        return GitState()
    try:
        return read_file(GitState, path)
    except RecordError as error:
        raise WorkspaceError(
            f"{error}: the workspace's bookkeeping in {repo} is damaged; move {repo} aside and"
            " rerun, it is made again"
        ) from None


def write_state(repo: Path, **updates: Any) -> None:
    """Change the fields of the repository's `GitState` that `updates` names."""
    write_file(dataclasses.replace(read_state(repo), **updates), _state_file(repo))


INTERRUPTED_AM = "an interrupted `git am` (rebase-apply)"


def uncommitted(repo: Path) -> list[str]:
    """Tracked files with edits, plus an interrupted `git am`: what a reset would destroy."""
    changed = git(repo, "status", "--porcelain", "--untracked-files=no").stdout.splitlines()
    if (repo / git(repo, "rev-parse", "--git-path", "rebase-apply").stdout.strip()).exists():
        changed.append(INTERRUPTED_AM)
    return changed


def refuse_to_lose_work(repo: Path, where: str) -> None:
    changed = uncommitted(repo)
    if changed:
        raise WorkspaceError(
            f"{where} has uncommitted changes ({len(changed)}: {changed[0].strip()}, ...):"
            f" commit them and run `nox -s export_patches`, or discard them with"
            f" `git -C {repo} checkout -- .`"
        )
