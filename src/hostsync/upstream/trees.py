"""The trees the commands measure: detached worktrees under `work/trees/<case>/`, regenerated
from the clone's commits or from a release, never edited by hand.

`prepare_tree` does everything a tree needs before it can run, and says so as it goes: it brings
the clone up to date with `patches/` (the patch queue), makes the release's repository if it is
missing, checks the worktree out, and picks (or builds) the environment that fits the release.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hostsync.upstream import envs, harness
from hostsync.upstream.git import (
    INTERRUPTED_AM,
    git,
    read_state,
    refuse_to_lose_work,
    rev,
    uncommitted,
    write_state,
)
from hostsync.upstream.patchqueue import (
    PATCHED,
    PatchDoesNotApply,
    apply_patches,
    clone,
    series,
    shown,
    touches_only_tests,
)
from hostsync.upstream.records import GitState, UpstreamTests
from hostsync.upstream.releases import materialise, release_for
from hostsync.workspace.cases import Case, Release
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.files import sha256
from hostsync.workspace.layout import Layout
from hostsync.workspace.projects import Project
from hostsync.workspace.records import TreeInfo, TreeRole

log = logging.getLogger(__name__)

EXTRAS = ("", "tests", "series")


@dataclass(frozen=True)
class Tree:
    """One source tree under test, imported by path, run by the interpreter `python`."""

    label: str
    role: TreeRole
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

    def info(self, workspace: Path) -> TreeInfo:
        return TreeInfo(
            project=self.project.name,
            version=self.version,
            commit=self.commit,
            origin=self.origin,
            src=str(self.src.relative_to(workspace.resolve())),
        )


def prepare_tree(case: Case, name: str, tests_from: UpstreamTests | None = None) -> Tree:
    """The tree `name` as a detached worktree under work/trees/<case>/, created or refreshed,
    with the interpreter of its environment.

    `pinned` and `patched` come from the clone (which `clone` brings up to date first); `fixed`
    is upstream's fixed release and a version like `5.14.0` that release, as published.
    `+tests` applies only the test patches of the series on top, `+series` the whole series.
    `tests_from` copies upstream's tests/ in first (`harness`), in a tree of its own under
    `upstream-tests/`: `patched` is then the tag, those tests and the series.
    """
    tree, release = _checkout(case, name, tests_from)
    python = envs.python_for(case.layout, tree.project, release, tree.root)
    return dataclasses.replace(tree, python=python)


def checkout_tree(case: Case, name: str) -> Tree:
    """The tree `name` as `prepare_tree` makes it, without an environment: enough to read it,
    or to learn whether the series applies (`PatchDoesNotApply` when it does not)."""
    return _checkout(case, name)[0]


def _checkout(
    case: Case, name: str, tests_from: UpstreamTests | None = None
) -> tuple[Tree, Release]:
    layout = case.layout
    name = case.tree_name(name)
    base_name, _, extra = name.partition("+")
    if extra not in EXTRAS:
        raise WorkspaceError(f"unknown tree {name!r}: use NAME, NAME+tests or NAME+series")
    role = case.role(name)
    if role in (TreeRole.PINNED, TreeRole.PATCHED):
        said = clone(case)
        if said:
            log.info("%s", said)
        repo, base = layout.clone, (case.pin.tag if role == TreeRole.PINNED else PATCHED)
        release = case.pin
    else:
        release = release_for(case, base_name)
        repo = layout.releases / f"{case.project.name}-{release.version}"
        if not repo.exists():
            materialise(layout, case.project, release, repo)
        base = release.tag
    patches = [p for p in series(layout) if extra == "series" or touches_only_tests(p)]
    patches = patches if extra else []
    path = layout.trees / name
    if tests_from is not None:
        path = layout.trees / "upstream-tests" / name
        if role == TreeRole.PATCHED:  # the series applied after upstream's tests, as on pinned
            base, patches = case.pin.tag, series(layout)
    where = f"{case.project.name} {release.version}" + (
        " (pinned)" if role == TreeRole.PINNED else ""
    )
    root = _worktree(layout, repo, base, patches, path, where, tests_from)
    state = read_state(repo)
    from_clone = base == PATCHED  # the clone's base (the tag and upstream's tests) and series
    origin = state.origin
    if tests_from is not None:
        source = harness.shown(tests_from.repository)
        origin += f" + upstream's tests/ from {source} at {tests_from.commit[:12]}"
    if from_clone and state.upstream_tests:
        origin += f" + upstream's tests/ at {state.upstream_tests[:12]}"
    if role == TreeRole.PATCHED:
        origin += " + the case's patch series"
    if extra:
        origin += f" + {extra} patches: {', '.join(p.name for p in patches) or 'none'}"
    origin += _left_out(read_state(root), *([state] if from_clone else []))
    return Tree(name, role, root, release.version, rev(root, "HEAD"), origin, case.project), release


def prepare_trees(case: Case, names: list[str]) -> list[Tree]:
    """The trees asked for; `patched` is skipped, saying so, while the series is empty."""
    if PATCHED in names and not series(case.layout):
        log.info("the case's series is empty: skipping the patched tree (it equals pinned)")
        names = [name for name in names if name != PATCHED]
        if not names:
            raise WorkspaceError(
                "the case's series is empty, so the patched tree is the pinned one: add the fix"
                " to patches/<case>/ (nox -s export_patches), or ask for --trees pinned"
            )
    return [prepare_tree(case, name) for name in names]


def prepare_stack(
    layout: Layout, loaded: Sequence[Case], *, fixes: bool = True, runs: bool = True
) -> Tree:
    """One release with the series of every case `loaded` applied in turn (all of them pin
    one project at one release): every carried fix of that project on one tree. Without
    `fixes`, the release as published. Series that conflict are refused in one line. A tree
    that only `runs` beside another one's interpreter gets no environment of its own."""
    names = [case.name for case in loaded]
    first = loaded[0]
    release = first.pin
    others = [
        c.name for c in loaded if (c.project, c.pin.version) != (first.project, release.version)
    ]
    if others:
        raise WorkspaceError(
            f"{', '.join(others)} pin another project or release than {first.name}"
            f" ({first.project.name} {release.version}): stack cases of one release on one tree"
        )
    repo = layout.releases / f"{first.project.name}-{release.version}"
    if not repo.exists():
        materialise(layout, first.project, release, repo)
    patches = [patch for case in loaded for patch in series(case.layout)] if fixes else []
    # Two projects may pin one version (accelerate and TRL 1.16.0): each tree names its project.
    label = "+".join([f"{first.project.name}-{release.version}", *(names if fixes else [])])
    where = f"{first.project.name} {release.version}"
    try:
        root = _worktree(layout, repo, release.tag, patches, layout.stacks / label, where)
    except PatchDoesNotApply as error:
        raise WorkspaceError(
            f"the series of {', '.join(names)} do not stack on {where}: {error}; rebase the later"
            " case's series onto the earlier one's, or stack them apart"
        ) from None
    origin = read_state(repo).origin
    if fixes:
        origin += f" + the series of {', '.join(names)}" + _left_out(read_state(root))
    role = TreeRole.PATCHED if fixes else TreeRole.RELEASE
    made = Tree(label, role, root, release.version, rev(root, "HEAD"), origin, first.project)
    if not runs:
        return made
    python = envs.python_for(layout, first.project, release, root)
    return dataclasses.replace(made, python=python)


def stack_trees(layout: Layout, loaded: Sequence[Case], *, fixes: bool = True) -> list[Tree]:
    """The cases `loaded` grouped by project, one tree per project (`prepare_stack`), in the
    order the projects first appear; only the first, which the ranks run, gets an environment
    (the others are imported beside it)."""
    return [
        prepare_stack(layout, group, fixes=fixes, runs=number == 0)
        for number, group in enumerate(by_project(loaded))
    ]


def by_project(loaded: Sequence[Case]) -> list[list[Case]]:
    """The cases grouped by their project, in the order the projects first appear."""
    groups: dict[str, list[Case]] = {}
    for case in loaded:
        groups.setdefault(case.project.name, []).append(case)
    return list(groups.values())


def stack(layout: Layout, loaded: Sequence[Case], *, fixes: bool = True) -> Tree:
    """The first case's project as the tree under test, every other project's tree imported
    beside it (`stack_trees`)."""
    first, *others = stack_trees(layout, loaded, fixes=fixes)
    return dataclasses.replace(first, stacked=tuple(tree.src for tree in others))


def infos(layout: Layout, trees: list[Tree]) -> dict[str, TreeInfo]:
    """What a result file says of each tree it measured, by label."""
    return {tree.label: tree.info(layout.root) for tree in trees}


def _worktree(
    layout: Layout,
    repo: Path,
    base: str,
    patches: list[Path],
    path: Path,
    where: str,
    tests_from: UpstreamTests | None = None,
) -> Path:
    commit = rev(repo, base)
    wanted: dict[str, object] = {
        "base": commit,
        "patches": {p.name: sha256(p) for p in patches},
        "upstream_tests": tests_from.commit if tests_from else "",
    }
    if path.exists() and not _is_worktree_of(path, repo):
        log.info("replacing %s: it is no worktree of %s", path, repo)
        shutil.rmtree(path)
    if path.exists():
        if uncommitted(path) == [INTERRUPTED_AM]:  # trees are ours: an apply cut short
            git(path, "am", "--abort", check=False)
        refuse_to_lose_work(path, where=shown(layout, path))
        if {k: getattr(read_state(path), k) for k in wanted} == wanted:
            return path
        git(path, "checkout", "--quiet", "--detach", commit)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        git(repo, "worktree", "prune")
        git(repo, "worktree", "add", "--quiet", "--detach", str(path), commit)
    if tests_from is not None:
        harness.copy_into(tests_from, path)
    left_out = apply_patches(path, patches, rev(path, "HEAD"), where)
    write_state(path, **wanted, left_out=tuple(left_out))
    return path


def _left_out(*states: GitState) -> str:
    """What a tree's origin adds for the test patches left out of it or of the clone it is."""
    names = [name for state in states for name in state.left_out]
    return f" (left out, for want of upstream's tests: {', '.join(names)})" if names else ""


def _is_worktree_of(path: Path, repo: Path) -> bool:
    """False for a leftover whose repository was moved away or recreated."""
    found = git(path, "rev-parse", "--path-format=absolute", "--git-common-dir", check=False)
    return found.returncode == 0 and Path(found.stdout.strip()) == (repo / ".git").resolve()
