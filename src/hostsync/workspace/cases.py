"""A case: one hidden host sync carried upstream, described by its card `cases/<name>.toml`.

The engine holds no word of any one bug. Everything about one comes from its card: the project
and release it pins, upstream's own fix when one is released, what upstream knows of it, how its
reproducer is launched and what it prints, which of its tests must fail on the pinned release,
and which host-sync sites its fix removes (`[[carries]]`, each a `SiteRule`, as an allow rule is).
Its patches, rank scripts, results and drafts live in folders of the same name (see `Layout`).

A card is checked field by field when it is read, before anything runs: a wrong type, an
unknown key or a value outside its choices is refused in one line naming the card and the field.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hostsync.detector.codec import RecordError, Strict
from hostsync.detector.sites import AllowRule, SiteRule
from hostsync.workspace import projects
from hostsync.workspace.config import load_toml
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import Layout
from hostsync.workspace.records import (
    Launcher,
    PrChangeSource,
    ThreadKind,
    ThreadState,
    TreeRole,
    UpstreamState,
)

# A case's name is a folder name in four places: plain words only, and none that profiles/
# keeps for results of no one case.
NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")
RESERVED = ("sites", "watch")
# A thread's repository, `owner/name`, and the day it opened, `YYYY-MM-DD`.
REPOSITORY = re.compile(r"[\w.-]+/[\w.-]+")
DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


@dataclass(frozen=True)
class Sdist(Strict):
    url: str
    size: int
    sha256: str

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Release(Strict):
    """One release of the case's project, reachable as a git tag or as its PyPI sdist."""

    version: str
    tag: str
    sdist: Sdist


@dataclass(frozen=True)
class PrChange(Strict):
    """An open PR's own change, carried as `patch` of the series: from its diff, or from its
    description where no diff is on record, which the comment and the checklist then say."""

    patch: str
    follows: PrChangeSource


@dataclass(frozen=True)
class Thread(Strict):
    """An upstream issue or PR the card or its drafts cite, as read in the stored public record:
    `opened` is the day of its first entry there, `does` one line of what it does. A draft cites
    no thread the card lacks, and says what one does with its line
    (`{{case:upstream.threads[number=8614].does}}`), not with words of its own."""

    number: int
    repository: str
    kind: ThreadKind
    state: ThreadState
    opened: str
    does: str

    def __post_init__(self) -> None:
        if self.number < 1:
            raise RecordError("number", "must be the thread's number, 1 or more")
        if not REPOSITORY.fullmatch(self.repository):
            raise RecordError("repository", f"must be owner/name, not {self.repository!r}")
        if self.kind == ThreadKind.ISSUE and self.state == ThreadState.MERGED:
            raise RecordError("state", "an issue is open or closed, never merged")
        if not DAY.fullmatch(self.opened):
            raise RecordError(
                "opened", f'must be the day it opened, "YYYY-MM-DD", not {self.opened!r}'
            )
        if not self.does.strip() or "\n" in self.does:
            raise RecordError(
                "does", "must be one line: what the thread does, as read in the record"
            )


@dataclass(frozen=True)
class Guard(Strict):
    """A test of the series that passes on the release without the fix, by design: it guards
    behaviour the fix keeps, and `keeps` says which, in one line."""

    test: str
    keeps: str

    def __post_init__(self) -> None:
        if not self.keeps.strip() or "\n" in self.keeps:
            raise RecordError("keeps", "must be one line: the behaviour the fix keeps")


@dataclass(frozen=True)
class Callers(Strict):
    """A function the fix changes, whose callers the drafts name (`[[upstream.callers]]`):
    `function` is `Class.method` or a function's name; each of `projects` is searched in the
    release the repro ran beside (the case's own at its pin), never typed. `without`: the
    arguments the drafts say no caller passes."""

    function: str
    projects: tuple[str, ...]
    without: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        parts = self.function.split(".")
        if len(parts) > 2 or not all(part.isidentifier() for part in parts):
            raise RecordError("function", "must be `Class.method` or a function's name")
        unknown = sorted(set(self.projects) - set(projects.PROJECTS))
        if not self.projects or unknown:
            raise RecordError(
                "projects",
                f"must name projects of {', '.join(projects.PROJECTS)}"
                + (f", not {', '.join(unknown)}" if unknown else ""),
            )


@dataclass(frozen=True)
class Upstream(Strict):
    """What upstream knows of the bug, and where that was seen: `seen` starts with the date of
    the newest record read (a thread's last entry, a release), not the day it was read."""

    state: UpstreamState
    seen: str
    issue: int = 0
    pull_request: int = 0
    reviewers: tuple[str, ...] = ()
    notes: str = ""
    # What only the contributor can do for this case before sending (the outbox's checklist).
    to_do: tuple[str, ...] = ()
    # An open PR: the patch of the series that carries that PR's own change, so that the figures
    # are the PR's. Without it the outbox sends nothing: a comment would speak of another variant
    # than the one under review.
    pr_change: PrChange | None = None
    # An open PR that removes the read right before the series' own where the project's defaults
    # apply, so that until it lands the series' read waits for almost nothing: nothing is sent.
    gains_after_pr: int = 0
    # The link to a maintainer's approval in the issue's thread, where the project holds a PR
    # until there is one (`Project.pr_after_approval`): until then the outbox sends the issue.
    approved: str = ""
    # Every upstream thread the card and its drafts cite (`[[upstream.threads]]`).
    threads: tuple[Thread, ...] = ()
    # The series' tests that pass without the fix by design (`[[upstream.guards]]`): any other
    # that passes there proves nothing, and `review` refuses it.
    guards: tuple[Guard, ...] = ()
    # The functions the fix changes whose callers the drafts name (`[[upstream.callers]]`).
    callers: tuple[Callers, ...] = ()

    def __post_init__(self) -> None:
        keys = [(thread.repository, thread.number) for thread in self.threads]
        twice = sorted(
            {f"{name}#{number}" for name, number in keys if keys.count((name, number)) > 1}
        )
        if twice:
            raise RecordError("threads", f"lists {', '.join(twice)} more than once: keep one")

    @property
    def cited(self) -> frozenset[int]:
        """The numbers of the threads a draft may cite."""
        return frozenset(thread.number for thread in self.threads)


@dataclass(frozen=True)
class Launch(Strict):
    """One way the reproducer runs: a script of `repro/<case>/`, its launcher and rank counts."""

    script: str
    launcher: Launcher
    scenarios: dict[str, str]
    ranks: tuple[int, ...] = (1,)
    args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.ranks or any(n < 1 for n in self.ranks):
            raise RecordError("ranks", "must list rank counts of at least 1")
        if not self.scenarios:
            raise RecordError("scenarios", "names no scenario")


@dataclass(frozen=True)
class Repro(Strict):
    """How the reproducer runs and what it shows; `snippet` is the one-process script an issue
    quotes, run on every tree, and `snippet_output` the pattern of the line it prints."""

    launch: tuple[Launch, ...]
    columns: tuple[str, ...]
    trees: tuple[str, ...] = (TreeRole.PINNED.value, TreeRole.PATCHED.value)
    compare: tuple[str, ...] = ()
    snippet: str = ""
    snippet_output: str = ""

    def __post_init__(self) -> None:
        if not self.launch:
            raise RecordError("launch", "names no launch: add a [[repro.launch]] table")
        if bool(self.snippet) != bool(self.snippet_output):
            raise RecordError("snippet", "comes with snippet_output, the line it prints")


@dataclass(frozen=True)
class Tests(Strict):
    red_on_pinned: tuple[str, ...] = ()
    # The series' tests as pytest node ids, where they are methods in a file of upstream's beside
    # its own tests; by default every test of the files the test patches touch.
    select: tuple[str, ...] = ()
    # Upstream's test files near the change, or node ids of tests in them.
    neighbours: tuple[str, ...] = ()
    # Upstream's test files the series' tests run on (its conftest, its DistributedTest), which
    # a tree made from an sdist lacks until `test_patch --remote` copies them in.
    harness: tuple[str, ...] = ()
    workspace_only: tuple[str, ...] = ()


@dataclass(frozen=True)
class Profile(Strict):
    """The profile script, its rank count and scenario, and the card's words for the range it
    measures and the part measured apart."""

    script: str
    ranks: int
    scenario: str
    measured: str
    excluded: str
    launcher: Launcher = Launcher.TORCHRUN


@dataclass(frozen=True)
class LintTool(Strict):
    """A formatter's version and config as the project's pre-commit config has them, for a tree
    (an sdist) that lacks that config."""

    version: str
    config: str = ""
    text: str = ""


@dataclass(frozen=True)
class Card(Strict):
    title: str
    project: str
    pin: Release
    upstream: Upstream
    repro: Repro
    summary: str = ""
    fixed: Release | None = None
    tests: Tests = Tests()
    profile: Profile | None = None
    lint: dict[str, LintTool] = field(default_factory=dict)
    carries: tuple[SiteRule, ...] = ()

    def __post_init__(self) -> None:
        scenarios = [name for launch in self.repro.launch for name in launch.scenarios]
        if self.profile and self.profile.scenario not in scenarios:
            raise RecordError("profile.scenario", f"must be one of {', '.join(scenarios)}")
        for base in (tree.partition("+")[0] for tree in self.repro.trees):
            if base == TreeRole.FIXED and self.fixed is None:
                raise RecordError("repro.trees", "names `fixed`, but the card has no [fixed]")


@dataclass(frozen=True)
class Case:
    """A card, read and checked, with its project resolved and its workspace: read once per
    command (`load`) and handed to everything the command does for the case."""

    name: str
    card: Card
    project: projects.Project
    root: Path

    @property
    def layout(self) -> Layout:
        """Where the case's files live."""
        return Layout(self.root, self.name)

    @property
    def title(self) -> str:
        return self.card.title

    @property
    def pin(self) -> Release:
        return self.card.pin

    @property
    def fixed(self) -> Release | None:
        return self.card.fixed

    @property
    def upstream(self) -> Upstream:
        return self.card.upstream

    @property
    def launches(self) -> tuple[Launch, ...]:
        return self.card.repro.launch

    @property
    def trees(self) -> tuple[str, ...]:
        return self.card.repro.trees

    @property
    def columns(self) -> tuple[str, ...]:
        return self.card.repro.columns

    @property
    def compare(self) -> tuple[str, ...]:
        return self.card.repro.compare

    @property
    def red_on_pinned(self) -> frozenset[str]:
        return frozenset(self.card.tests.red_on_pinned)

    @property
    def profile(self) -> Profile | None:
        return self.card.profile

    @property
    def scenarios(self) -> dict[str, str]:
        return {name: text for launch in self.launches for name, text in launch.scenarios.items()}

    def launch_of(self, scenario: str) -> Launch:
        """The launch that runs `scenario`: its arguments set the scenario up (a profile's too)."""
        return next(launch for launch in self.launches if scenario in launch.scenarios)

    @property
    def carries(self) -> tuple[AllowRule, ...]:
        """The sites the fix removes, as rules whose reason is the case's name."""
        return tuple(
            AllowRule(reason=self.name, **dataclasses.asdict(c)) for c in self.card.carries
        )

    def tree_name(self, name: str) -> str:
        """`fixed` stands for upstream's fixed release: `fixed+tests` becomes `5.14.0+tests`."""
        base, plus, extra = name.partition("+")
        if base != TreeRole.FIXED:
            return name
        if self.fixed is None:
            raise WorkspaceError(
                f"case {self.name} has no fixed upstream release: drop the tree {name!r}"
            )
        return self.fixed.version + plus + extra

    def role(self, label: str) -> TreeRole:
        """What the tree `label` (a `tree_name`) is to this case."""
        base = label.partition("+")[0]
        if base in (TreeRole.PINNED, TreeRole.PATCHED):
            return TreeRole(base)
        if self.fixed is not None and base == self.fixed.version:
            return TreeRole.FIXED
        return TreeRole.RELEASE


def card_path(root: Path, name: str) -> Path:
    return root / "cases" / f"{name}.toml"


def names(root: Path) -> list[str]:
    """Every case of the workspace, by name."""
    return sorted(path.stem for path in (root / "cases").glob("*.toml"))


def every(root: Path, loaded: Sequence[Case] = ()) -> tuple[Case, ...]:
    """Every case of the workspace, each card read once: those already `loaded` (the command's
    own) are not read again."""
    return tuple(named(loaded, names(root), root))


def named(known: Sequence[Case], wanted: Sequence[str], root: Path) -> list[Case]:
    """The cases `wanted`, those among `known` not read again; an unknown name is refused as
    `load` refuses it."""
    by_name = {case.name: case for case in known}
    return [by_name[name] if name in by_name else load(root, name) for name in wanted]


def load(root: Path, name: str) -> Case:
    """The card of case `name`; a missing or malformed one is refused in one line."""
    if not NAME.fullmatch(name) or name in RESERVED:
        raise WorkspaceError(
            f"{name!r} is no case name: name one of {', '.join(names(root)) or 'none'}"
            " (a name, not a path)"
        )
    path = card_path(root, name)
    if not path.exists():
        known = ", ".join(names(root)) or "none"
        raise WorkspaceError(f"no case {name!r} (cases/{name}.toml): the cases are {known}")
    where = f"cases/{name}.toml"
    card = load_toml(path, Card, shown=where, what="card")
    try:
        project = projects.get(card.project)
    except WorkspaceError as error:
        raise WorkspaceError(f"{where}: project: {error}") from None
    return Case(name, card, project, root)
