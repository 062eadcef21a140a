"""A case: one hidden host sync carried upstream, described by its card `cases/<name>.toml`.

The engine holds no word of any one bug. Everything about one comes from its card: the project
and release it pins, upstream's own fix when one is released, what upstream knows of it, how its
reproducer is launched and what it prints, which of its tests must fail on the pinned release,
and which host-sync sites its fix removes (`[[carries]]`, matched like the hunt's allow rules).
Its patches, rank scripts, results and drafts live in
folders of the same name (see `Layout`).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hostsync import projects
from hostsync.errors import WorkspaceError

UPSTREAM_STATES = ("none", "issue", "open-pr", "fixed")
LAUNCHERS = ("python", "fork", "torchrun", "accelerate")


@dataclass(frozen=True)
class Sdist:
    url: str
    size: int
    sha256: str

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Release:
    """One release of the case's project, reachable as a git tag or as its PyPI sdist."""

    version: str
    tag: str
    sdist: Sdist


@dataclass(frozen=True)
class Upstream:
    """What upstream knows of the bug, and when and where that was seen."""

    state: str
    seen: str
    issue: int = 0
    pull_request: int = 0
    reviewers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Launch:
    """One way the reproducer runs: a script of `repro/<case>/`, its launcher and rank counts."""

    script: str
    launcher: str
    scenarios: dict[str, str]
    ranks: tuple[int, ...] = (1,)
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Case:
    name: str
    title: str
    project: projects.Project
    pin: Release
    fixed: Release | None
    upstream: Upstream
    launches: tuple[Launch, ...]
    trees: tuple[str, ...]
    columns: tuple[str, ...]
    compare: tuple[str, ...]
    red_on_pinned: frozenset[str]
    neighbours: tuple[str, ...]
    workspace_only: tuple[str, ...]
    profile: dict[str, Any]
    carries: tuple[dict[str, Any], ...]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def scenarios(self) -> dict[str, str]:
        return {name: text for launch in self.launches for name, text in launch.scenarios.items()}

    def tree_name(self, name: str) -> str:
        """`fixed` stands for upstream's fixed release: `fixed+tests` becomes `5.14.0+tests`."""
        base, plus, extra = name.partition("+")
        if base != "fixed":
            return name
        if self.fixed is None:
            raise WorkspaceError(
                f"case {self.name} has no fixed upstream release: drop the tree {name!r}"
            )
        return self.fixed.version + plus + extra


def _release(table: dict[str, Any]) -> Release:
    return Release(table["version"], table["tag"], Sdist(**table["sdist"]))


def card_path(root: Path, name: str) -> Path:
    return root / "cases" / f"{name}.toml"


def names(root: Path) -> list[str]:
    """Every case of the workspace, by name."""
    return sorted(path.stem for path in (root / "cases").glob("*.toml"))


def load(root: Path, name: str) -> Case:
    """The card of case `name`; a missing or malformed one is refused in one line."""
    path = card_path(root, name)
    if not path.exists():
        known = ", ".join(names(root)) or "none"
        raise WorkspaceError(f"no case {name!r} (cases/{name}.toml): the cases are {known}")
    try:
        raw = tomllib.loads(path.read_text())
        return _case(name, raw)
    except (KeyError, TypeError, ValueError, tomllib.TOMLDecodeError) as error:
        raise WorkspaceError(f"cases/{name}.toml is malformed ({error!r}): fix the card") from None


def _case(name: str, raw: dict[str, Any]) -> Case:
    upstream = raw["upstream"]
    if upstream["state"] not in UPSTREAM_STATES:
        raise ValueError(f"upstream.state must be one of {UPSTREAM_STATES}")
    repro, tests = raw["repro"], raw.get("tests", {})
    launches = tuple(
        Launch(
            script=launch["script"],
            launcher=launch["launcher"],
            scenarios=dict(launch["scenarios"]),
            ranks=tuple(launch.get("ranks", (1,))),
            args=tuple(launch.get("args", ())),
        )
        for launch in repro["launch"]
    )
    for launch in launches:
        if launch.launcher not in LAUNCHERS:
            raise ValueError(f"repro.launch.launcher must be one of {LAUNCHERS}")
    return Case(
        name=name,
        title=raw["title"],
        project=projects.get(raw["project"]),
        pin=_release(raw["pin"]),
        fixed=_release(raw["fixed"]) if "fixed" in raw else None,
        upstream=Upstream(
            state=upstream["state"],
            seen=upstream["seen"],
            issue=upstream.get("issue", 0),
            pull_request=upstream.get("pull_request", 0),
            reviewers=tuple(upstream.get("reviewers", ())),
        ),
        launches=launches,
        trees=tuple(repro.get("trees", ("pinned", "patched"))),
        columns=tuple(repro["columns"]),
        compare=tuple(repro.get("compare", ())),
        red_on_pinned=frozenset(tests.get("red_on_pinned", ())),
        neighbours=tuple(tests.get("neighbours", ())),
        workspace_only=tuple(tests.get("workspace_only", ())),
        profile=dict(raw.get("profile", {})),
        carries=tuple(raw.get("carries", ())),
        raw=raw,
    )
