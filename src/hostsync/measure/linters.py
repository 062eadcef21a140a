"""Each project's own linters, at the versions its tree pins, with its own configuration.

Upstream's CI rejects a patch its linters reject, so the patches are checked with them: ruff for
transformers (`make style`) and accelerate (`make quality`), DeepSpeed's pre-commit formatters.
Each tool is installed once into the workspace cache from PyPI and run from the tree's root,
where it finds the tree's configuration.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hostsync.upstream import tools
from hostsync.upstream.trees import Tree
from hostsync.workspace.cases import LintTool
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import Layout
from hostsync.workspace.projects import PreCommitLint, RuffLint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Step:
    """One linter call; the files to check are appended to `command`."""

    name: str
    tool: str
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    @property
    def slug(self) -> str:
        return re.sub(r"[^\w.-]+", "-", self.name).strip("-")


def steps(
    layout: Layout, tree: Tree, settings: Mapping[str, LintTool], workdir: Path
) -> list[Step]:
    """The lint steps of the tree's project, as its record says. `settings` is the case card's
    `[lint]`, for a tree that lacks the project's own lint configuration (a PyPI sdist may);
    config files it holds are written to `workdir`."""
    lint = tree.project.lint
    if isinstance(lint, RuffLint):
        return _ruff(layout, tree, lint, settings)
    return _pre_commit(layout, tree, lint, settings, workdir)


def _ruff(
    layout: Layout, tree: Tree, lint: RuffLint, settings: Mapping[str, LintTool]
) -> list[Step]:
    """ruff check and ruff format --check, at the version the tree pins for its style job, or
    the case card's `[lint] ruff` for a tree without the file that pins it (an sdist)."""
    if not (tree.root / lint.file).exists() and "ruff" in settings:
        version = settings["ruff"].version
    else:
        version = pinned(tree, lint.file, lint.pattern)
    tool = f"ruff {version}"
    python, env = installed(layout, f"ruff=={version}")
    prefix = (python, "-m", "ruff")
    return [
        Step(f"{tool} check", tool, (*prefix, "check", "--no-cache"), env),
        Step(f"{tool} format --check", tool, (*prefix, "format", "--check", "--no-cache"), env),
    ]


def _pre_commit(
    layout: Layout, tree: Tree, lint: PreCommitLint, settings: Mapping[str, LintTool], workdir: Path
) -> list[Step]:
    """The formatters of the tree's .pre-commit-config.yaml that check Python files: from the
    tree when it has it (a git clone), else as the case card records them."""
    tools = _pre_commit_versions(tree, lint) or {
        name: (spec.version, _written(workdir, spec)) for name, spec in settings.items()
    }
    missing = [f.name for f in lint.formatters if f.name not in tools]
    if missing:
        raise WorkspaceError(
            f"{tree.label} has no .pre-commit-config.yaml and the case card's [lint] lacks"
            f" {', '.join(missing)}: add them to the card with their versions and configs"
        )
    found = []
    for formatter in lint.formatters:
        version, config = tools[formatter.name]
        flags = formatter.check_flags
        if config and formatter.config_flag:
            flags += (formatter.config_flag, str(config))
        python, env = installed(layout, f"{formatter.name}=={version}")
        tool = f"{formatter.name} {version}"
        found.append(Step(tool, tool, (python, "-m", formatter.module, *flags), env))
    return found


def _pre_commit_versions(tree: Tree, lint: PreCommitLint) -> dict[str, tuple[str, Path | None]]:
    """Each formatter's version from the tree's .pre-commit-config.yaml (configs found by the
    tools themselves from the tree root), or {} when the tree has none."""
    config = tree.root / ".pre-commit-config.yaml"
    if not config.exists():
        return {}
    text = config.read_text()
    found: dict[str, tuple[str, Path | None]] = {}
    for formatter in lint.formatters:
        match = re.search(rf"{re.escape(formatter.repo)}\s+rev:\s*v?([\w.]+)", text)
        if match:
            found[formatter.name] = (match[1], None)
    return found


def _written(workdir: Path, spec: LintTool) -> Path | None:
    """The card's config text for a tool, as the file the tool reads, or None."""
    if not spec.text:
        return None
    path = workdir / spec.config
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(spec.text)
    return path


def pinned(tree: Tree, file: str, pattern: str) -> str:
    path = tree.root / file
    match = re.search(pattern, path.read_text()) if path.exists() else None
    if not match:
        raise WorkspaceError(f"{file} of {tree.label} pins no linter version: lint by hand")
    return match[1]


def installed(layout: Layout, requirement: str) -> tuple[str, dict[str, str]]:
    """How to run `requirement`, installed once into the workspace cache: python, env."""
    return sys.executable, {"PYTHONPATH": str(tools.installed(layout, requirement))}
