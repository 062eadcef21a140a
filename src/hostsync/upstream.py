"""A case's pinned release as a git repository, the patch queue on it, and the trees under test.

`work/clones/<case>` is where a contributor edits. Its base is the release tag the case card pins,
from a `git clone` when the remote answers, otherwise from the sha256-verified PyPI sdist
committed as one reproducible commit under that tag. The branch `patched` holds
`patches/<case>/` applied in `series` order, one commit per patch; `export-patches` writes it
back. The trees the sessions measure are detached worktrees under `work/trees/<case>/`,
regenerated from those commits, never edited by hand, each run by the environment that fits its
release (`envs`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from hostsync import cases, envs
from hostsync.cases import Case, Release, Sdist
from hostsync.errors import WorkspaceError, last_line
from hostsync.files import sha256
from hostsync.layout import Layout
from hostsync.options import add_case, case_layouts
from hostsync.projects import Project
from hostsync.sdists import fetch_sdist

log = logging.getLogger(__name__)

PATCHED = "patched"
SERIES_HEADER = "# Applied in this order by `nox -s clone`; rewritten by `nox -s export_patches`.\n"
_IDENTITY = {"name": "hostsync", "email": "hostsync@localhost"}
_REMOTE_TIMEOUT_S = 30
_CLONE_TIMEOUT_S = 900


class PatchDoesNotApply(WorkspaceError):
    """A patch of the series conflicts with the tree it is applied to."""


@dataclass(frozen=True)
class Tree:
    """One source tree under test, imported by path, run by the interpreter `python`."""

    label: str
    root: Path
    version: str
    commit: str
    origin: str
    project: Project
    python: str = ""
    # Other cases' patched trees imported with it (other projects), e.g. to hunt with every
    # carried fix applied.
    stacked: tuple[Path, ...] = ()

    @property
    def src(self) -> Path:
        """What goes first on PYTHONPATH to import the project from this tree."""
        return (self.root / self.project.import_root).resolve()


# --- git -----------------------------------------------------------------------------------------


def git(repo: Path, *args: str, check: bool = True, timeout: float | None = None,
        isolated: bool = True, env: dict[str, str] | None = None,
        ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """Run git in `repo`.

    `isolated` ignores user and system config, and commits get a fixed committer: the commits
    and patch files the workspace makes come out the same on every machine.
    """
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", LC_ALL="C", **(env or {}))
    if isolated:
        env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)
    for role in ("AUTHOR", "COMMITTER"):
        env.setdefault(f"GIT_{role}_NAME", _IDENTITY["name"])
        env.setdefault(f"GIT_{role}_EMAIL", _IDENTITY["email"])
    result = subprocess.run(
        ["git", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and result.returncode != 0:
        raise WorkspaceError(
            f"git {' '.join(args[:3])} failed in {repo}: {last_line(result.stderr)}"
        )
    return result


def _rev(repo: Path, ref: str) -> str:
    """The commit `ref` names, or "" when there is none."""
    found = git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
    return found.stdout.strip()


def _state_file(repo: Path) -> Path:
    """Bookkeeping inside the repository's git dir: invisible to `git status`, gone with it."""
    return repo / git(repo, "rev-parse", "--git-path", "hostsync.json").stdout.strip()


def _read_state(repo: Path) -> dict:
    path = _state_file(repo)
    return json.loads(path.read_text()) if path.exists() else {}


def _write_state(repo: Path, **updates: object) -> None:
    state = _read_state(repo) | updates
    _state_file(repo).write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")


def _uncommitted(repo: Path) -> list[str]:
    """Tracked files with edits, plus an interrupted `git am`: what a reset would destroy."""
    changed = git(repo, "status", "--porcelain", "--untracked-files=no").stdout.splitlines()
    if (repo / git(repo, "rev-parse", "--git-path", "rebase-apply").stdout.strip()).exists():
        changed.append("an interrupted `git am` (rebase-apply)")
    return changed


# --- sdists --------------------------------------------------------------------------------------


def series(layout: Layout) -> list[Path]:
    """The case's patches in patches/<case>/series order (blank lines and # comments skipped)."""
    series_file = layout.patches / "series"
    if not series_file.exists():
        return []
    names = [line.strip() for line in series_file.read_text().splitlines()]
    return [layout.patches / name for name in names if name and not name.startswith("#")]


def pypi_sdist(project: Project, version: str) -> Sdist:
    """The sdist of a release as PyPI's JSON simple index describes it."""
    request = urllib.request.Request(
        project.pypi_simple, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            files = json.load(response)["files"]
    except OSError as error:
        raise WorkspaceError(f"cannot read the PyPI index for {project.name} ({error})") from None
    wanted = f"{project.name}-{version}.tar.gz"
    for entry in files:
        if entry["filename"] == wanted:
            return Sdist(entry["url"], entry["size"], entry["hashes"]["sha256"])
    raise WorkspaceError(f"PyPI has no sdist {wanted}: check the version number")


def release_for(case: Case, version: str) -> Release:
    """A release by version: the case's pinned and fixed ones from its card, any other from
    PyPI's index (its tag named like the pinned one's)."""
    for known in (case.pin, case.fixed):
        if known is not None and known.version == version:
            return known
    tag = case.pin.tag.replace(case.pin.version, version)
    return Release(version=version, tag=tag, sdist=pypi_sdist(case.project, version))


# --- materialising a release as a git repository -------------------------------------------------


def materialise(layout: Layout, project: Project, release: Release, dest: Path,
                remote: str | None = None) -> None:  # fmt: skip
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
        _write_state(partial, origin=origin)
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


def _as_url(remote: str) -> str:
    """Local paths as file:// URLs, so that --depth applies to them too."""
    return Path(remote).resolve().as_uri() if Path(remote).exists() else remote


def _import_sdist(layout: Layout, project: Project, release: Release, dest: Path) -> str:
    archive = fetch_sdist(layout, release.sdist)
    with tempfile.TemporaryDirectory(dir=dest.parent) as unpacked, tarfile.open(archive) as tar:
        tar.extractall(unpacked, filter="data")
        (top,) = Path(unpacked).iterdir()
        top.rename(dest)
        released = int(tar.getmember(f"{top.name}/PKG-INFO").mtime)
    origin = f"PyPI sdist {release.sdist.filename} (sha256 {release.sdist.sha256})"
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
    return origin


def _check_version(repo: Path, project: Project, release: Release) -> None:
    found = project.version_in(repo)
    if found != release.version:
        raise WorkspaceError(
            f"{release.tag} holds {project.name} {found}, not {release.version}: fix the case card"
        )


# --- the patch queue -----------------------------------------------------------------------------


def touched_files(patch: Path) -> list[str]:
    """The files a patch changes, both names of a rename."""
    pairs = re.findall(r"^diff --git a/(\S+) b/(\S+)$", patch.read_text(), re.MULTILINE)
    return sorted({path for pair in pairs for path in pair})


def added_files(patch: Path) -> dict[str, str]:
    """The files a patch creates, with their whole text (its `+` lines)."""
    found = {}
    for diff in re.split(r"^diff --git ", patch.read_text(), flags=re.MULTILINE)[1:]:
        if "\nnew file mode" not in diff.split("@@", 1)[0]:
            continue
        path = re.search(r"^\+\+\+ b/(\S+)$", diff, re.MULTILINE)[1]
        body = diff.split("\n@@", 1)[1].split("\n", 1)[1]
        lines = [line[1:] for line in body.splitlines() if line.startswith("+")]
        found[path] = "\n".join(lines) + "\n"
    return found


def touches_only_tests(patch: Path) -> bool:
    """A test patch: every file it changes lies under tests/ (applies to any release)."""
    files = touched_files(patch)
    return bool(files) and all(path.startswith("tests/") for path in files)


def apply_patches(repo: Path, patches: list[Path], base: str, where: str) -> None:
    """`git am -3` each patch onto HEAD (already at `base`); on a conflict, back to `base`."""
    for patch in patches:
        result = git(repo, "am", "-3", "--committer-date-is-author-date", str(patch), check=False)
        if result.returncode != 0:
            files = _failing_files(result.stdout + result.stderr)
            git(repo, "am", "--abort", check=False)
            git(repo, "reset", "--quiet", "--hard", base)
            raise PatchDoesNotApply(
                f"{patch.parent.name}/{patch.name} does not apply to {where}"
                f" (conflict in {', '.join(files) or 'an unknown file'}): rebase it in the clone"
                " and run `nox -s export_patches`, or drop it from the series"
            )


def _failing_files(output: str) -> list[str]:
    patterns = (
        r"^error: patch failed: (\S+?):\d+$",
        r"^CONFLICT \([^)]*\): Merge conflict in (\S+)$",
        r"^error: (\S+): does not exist in index$",
        r"^error: (\S+): already exists in (?:index|working directory)$",
    )
    found = [m for p in patterns for m in re.findall(p, output, re.MULTILINE)]
    return sorted(set(found))


def _series_state(layout: Layout) -> dict[str, str]:
    return {p.name: sha256(p) for p in series(layout)}


def clone(layout: Layout, remote: str | None = None) -> str | None:
    """Make the case's clone its pinned tag plus its patches on `patched`; say what was done.

    Idempotent: None when there was nothing to do. Refuses, naming the way out, whenever going
    on could lose work in the clone.
    """
    case = cases.load(layout.root, layout.case)
    repo, tag = layout.clone, case.pin.tag
    where = f"{case.project.name} {tag}"
    if not repo.exists():
        materialise(layout, case.project, case.pin, repo, remote)
        git(repo, "checkout", "--quiet", "-B", PATCHED, tag)
        return f"{_read_state(repo)['origin']}: " + _apply_queue(layout, repo, tag, where)

    if not (repo / ".git").exists() or not _rev(repo, tag):
        raise WorkspaceError(
            f"{repo} is not a clone of {where} (the case card changed?): move it aside and rerun"
        )
    _refuse_to_lose_work(repo, where="the clone")
    branch = git(repo, "branch", "--show-current").stdout.strip()
    if branch != PATCHED:
        raise WorkspaceError(
            f"the clone has {branch or 'a detached HEAD'} checked out, not {PATCHED}:"
            f" run `git -C {_shown(layout, repo)} switch {PATCHED}` first"
        )
    state, head = _read_state(repo), _rev(repo, "HEAD")
    if head == state.get("head"):
        if state.get("series") == _series_state(layout):
            return None
        git(repo, "reset", "--quiet", "--hard", tag)
        return "patches/ changed since the last run: " + _apply_queue(layout, repo, tag, where)
    if _format_patches(repo, tag) == _read_patches(layout):
        _write_state(repo, head=head, series=_series_state(layout))
        return None
    commits = git(repo, "rev-list", "--count", f"{tag}..{PATCHED}").stdout.strip()
    raise WorkspaceError(
        f"{PATCHED} in {_shown(layout, repo)} ({commits} commits on {tag}) differs from patches/:"
        " keep it with `nox -s export_patches`, or discard it with"
        f" `git -C {_shown(layout, repo)} reset --hard {state.get('head', tag)}`"
    )


def _apply_queue(layout: Layout, repo: Path, tag: str, where: str) -> str:
    """Apply the series on `tag`; the recorded state says what is applied, if anything."""
    patches = series(layout)
    try:
        apply_patches(repo, patches, tag, where)
    except PatchDoesNotApply:
        _write_state(repo, head=_rev(repo, "HEAD"), series={})
        raise
    _write_state(repo, head=_rev(repo, "HEAD"), series=_series_state(layout))
    return f"applied {len(patches)} patch(es) from patches/{layout.case}/series on {PATCHED}"


def _refuse_to_lose_work(repo: Path, where: str) -> None:
    changed = _uncommitted(repo)
    if changed:
        raise WorkspaceError(
            f"{where} has uncommitted changes ({len(changed)}: {changed[0].strip()}, ...):"
            f" commit them and run `nox -s export_patches`, or discard them with"
            f" `git -C {repo} checkout -- .`"
        )


def _shown(layout: Layout, path: Path) -> str:
    return str(path.relative_to(layout.root)) if path.is_relative_to(layout.root) else str(path)


# --- exporting the branch back into patches/ -----------------------------------------------------


def _format_patches(repo: Path, base: str) -> dict[str, bytes]:
    """The commits of `patched` as patch files, byte-stable across machines and git configs."""
    with tempfile.TemporaryDirectory() as out:
        git(
            repo, "format-patch", f"{base}..{PATCHED}", "--quiet", "--output-directory", out,
            "--no-signature", "--zero-commit", "--full-index", "--no-numbered",
            "--diff-algorithm=myers", "--stat=72", "--summary",
        )  # fmt: skip
        return {p.name: p.read_bytes() for p in sorted(Path(out).iterdir())}


def _read_patches(layout: Layout) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in series(layout)}


def export_patches(layout: Layout) -> dict[str, list[str]]:
    """Write the clone's `patched` commits into patches/<case>/; return the names by change."""
    repo, tag = layout.clone, cases.load(layout.root, layout.case).pin.tag
    if not repo.exists():
        raise WorkspaceError(f"no clone at {_shown(layout, repo)}: run `nox -s clone` first")
    _refuse_to_lose_work(repo, where="the clone")
    new, old = _format_patches(repo, tag), _read_patches(layout)
    report = {
        "added": sorted(set(new) - set(old)),
        "changed": sorted(n for n in set(new) & set(old) if new[n] != old[n]),
        "removed": sorted(set(old) - set(new)),
        "unchanged": sorted(n for n in set(new) & set(old) if new[n] == old[n]),
    }
    layout.patches.mkdir(parents=True, exist_ok=True)
    for name in report["added"] + report["changed"]:
        (layout.patches / name).write_bytes(new[name])
    for name in report["removed"]:
        (layout.patches / name).unlink()
    (layout.patches / "series").write_text(SERIES_HEADER + "".join(f"{n}\n" for n in sorted(new)))
    _write_state(repo, head=_rev(repo, "HEAD"), series=_series_state(layout))
    return report


# --- trees under test ----------------------------------------------------------------------------


def tree(layout: Layout, name: str) -> Tree:
    """The tree `name` as a detached worktree under work/trees/<case>/, created or refreshed.

    `pinned` and `patched` come from the clone (which `clone` brings up to date first); `fixed`
    is upstream's fixed release and a version like `5.14.0` that release, as published.
    `+tests` applies only the test patches of the series on top, `+series` the whole series.
    """
    case = cases.load(layout.root, layout.case)
    name = case.tree_name(name)
    base_name, _, extra = name.partition("+")
    if extra not in ("", "tests", "series"):
        raise WorkspaceError(f"unknown tree {name!r}: use NAME, NAME+tests or NAME+series")
    if base_name in ("pinned", PATCHED):
        said = clone(layout)
        if said:
            log.info("%s", said)
        repo, base = layout.clone, (case.pin.tag if base_name == "pinned" else PATCHED)
        version = case.pin.version
    else:
        version = base_name
        repo = layout.releases / f"{case.project.name}-{version}"
        if not repo.exists():
            materialise(layout, case.project, release_for(case, version), repo)
        base = release_for(case, version).tag
    patches = [p for p in series(layout) if extra == "series" or touches_only_tests(p)]
    patches = patches if extra else []
    where = f"{case.project.name} {version}" + (" (pinned)" if base_name == "pinned" else "")
    root = _worktree(layout, repo, base, patches, layout.trees / name, where)
    origin = _read_state(repo)["origin"]
    if base_name == PATCHED:
        origin += " + the case's patch series"
    if extra:
        origin += f" + {extra} patches: {', '.join(p.name for p in patches) or 'none'}"
    made = Tree(name, root, version, _rev(root, "HEAD"), origin, case.project)
    release = case.pin if base_name in ("pinned", PATCHED) else release_for(case, version)
    return dataclasses.replace(made, python=envs.python_for(layout, case.project, release, root))


def trees(layout: Layout, names: list[str]) -> list[Tree]:
    """The trees asked for; `patched` is skipped, saying so, while the series is empty."""
    if PATCHED in names and not series(layout):
        log.info("the case's series is empty: skipping the patched tree (it equals pinned)")
        names = [name for name in names if name != PATCHED]
        if not names:
            raise WorkspaceError(
                "the case's series is empty, so the patched tree is the pinned one: add the fix"
                " to patches/<case>/ (nox -s export_patches), or ask for --trees pinned"
            )
    return [tree(layout, name) for name in names]


def describe_trees(layout: Layout, trees: list[Tree]) -> dict:
    """What a result file says of each tree it measured."""
    return {
        tree.label: {
            "project": tree.project.name,
            "version": tree.version,
            "commit": tree.commit,
            "origin": tree.origin,
            "src": str(tree.src.relative_to(layout.root.resolve())),
        }
        for tree in trees
    }


def _worktree(layout: Layout, repo: Path, base: str, patches: list[Path], path: Path,
              where: str) -> Path:  # fmt: skip
    wanted = {
        "base": _rev(repo, base),
        "patches": {p.name: sha256(p) for p in patches},
    }
    if path.exists() and not _is_worktree_of(path, repo):
        log.info("replacing %s: it is no worktree of %s", path, repo)
        shutil.rmtree(path)
    if path.exists():
        _refuse_to_lose_work(path, where=_shown(layout, path))
        if {k: _read_state(path).get(k) for k in wanted} == wanted:
            return path
        git(path, "checkout", "--quiet", "--detach", wanted["base"])
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        git(repo, "worktree", "prune")
        git(repo, "worktree", "add", "--quiet", "--detach", str(path), wanted["base"])
    apply_patches(path, patches, wanted["base"], where)
    _write_state(path, **wanted)
    return path


def _is_worktree_of(path: Path, repo: Path) -> bool:
    """False for a leftover whose repository was moved away or recreated."""
    found = git(path, "rev-parse", "--path-format=absolute", "--git-common-dir", check=False)
    return found.returncode == 0 and Path(found.stdout.strip()) == (repo / ".git").resolve()


# --- command line --------------------------------------------------------------------------------


def clone_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hostsync clone",
        description="Materialise a case's pinned release in work/clones/<case>, apply its patches.",
    )
    add_case(parser)
    parser.add_argument("--remote", help="git remote to clone from (default: the project's)")
    args = parser.parse_args(argv)
    for layout in case_layouts(args.case):
        said = clone(layout, remote=args.remote)
        log.info("%s: %s", layout.case, said or "the clone matches the patches: nothing to do")
    return 0


def export_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hostsync export-patches",
        description="Write the commits of `patched` in a case's clone back into patches/<case>/.",
    )
    add_case(parser)
    args = parser.parse_args(argv)
    for layout in case_layouts(args.case):
        report = export_patches(layout)
        for change in ("added", "changed", "removed"):
            for name in report[change]:
                log.info("%s patches/%s/%s", change, layout.case, name)
        if not any(report[change] for change in ("added", "changed", "removed")):
            log.info("patches/%s already matches the clone: nothing changed", layout.case)
    return 0
