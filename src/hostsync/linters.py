"""Each project's own linters, at the versions its tree pins, with its own configuration.

Upstream's CI rejects a patch its linters reject, so the patches are checked with them: ruff for
transformers (`make style`) and accelerate (`make quality`), DeepSpeed's pre-commit formatters.
Each tool is installed once into the workspace cache from PyPI and run from the tree's root,
where it finds the tree's configuration.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from hostsync.errors import WorkspaceError, last_line
from hostsync.layout import Layout
from hostsync.upstream import Tree

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


def steps(layout: Layout, tree: Tree) -> list[Step]:
    """The lint steps of the tree's project."""
    if tree.project.name == "deepspeed":
        return _deepspeed(layout, tree)
    return _ruff(layout, tree)


# Where each ruff-linted project pins its ruff: the file, and the pattern whose group 1 is it.
RUFF_PINS = {
    "transformers": ("src/transformers/dependency_versions_table.py", r'"ruff": "ruff==([^"]+)"'),
    "accelerate": ("setup.py", r"ruff\s*==\s*([\w.]+)"),
}


def _ruff(layout: Layout, tree: Tree) -> list[Step]:
    """ruff check and ruff format --check, at the version the tree pins for its style job."""
    version = pinned(tree, *RUFF_PINS[tree.project.name])
    tool = f"ruff {version}"
    python, env = installed(layout, f"ruff=={version}")
    prefix = (python, "-m", "ruff")
    return [
        Step(f"{tool} check", tool, (*prefix, "check", "--no-cache"), env),
        Step(f"{tool} format --check", tool, (*prefix, "format", "--check", "--no-cache"), env),
    ]


def _deepspeed(layout: Layout, tree: Tree) -> list[Step]:
    """The formatters of DeepSpeed's .pre-commit-config.yaml that check Python files."""
    config = tree.root / ".pre-commit-config.yaml"
    text = config.read_text() if config.exists() else ""
    yapf = re.search(r"google/yapf\s+rev:\s*v?([\w.]+)", text)
    flake8 = re.search(r"flake8\s+rev:\s*v?([\w.]+)", text)
    if not (yapf and flake8):
        raise WorkspaceError(
            f"{tree.label} has no .pre-commit-config.yaml naming yapf and flake8 (a PyPI sdist"
            " lacks it): add it to the series' tooling or lint from a git clone"
        )
    found = []
    for name, version, args in (
        ("yapf", yapf[1], ("--diff",)),
        ("flake8", flake8[1], ()),
    ):
        python, env = installed(layout, f"{name}=={version}")
        tool = f"{name} {version}"
        found.append(Step(tool, tool, (python, "-m", name, *args), env))
    return found


def pinned(tree: Tree, file: str, pattern: str) -> str:
    path = tree.root / file
    match = re.search(pattern, path.read_text()) if path.exists() else None
    if not match:
        raise WorkspaceError(f"{file} of {tree.label} pins no linter version: lint by hand")
    return match[1]


def installed(layout: Layout, requirement: str) -> tuple[str, dict[str, str]]:
    """`requirement` installed once into the workspace cache; how to run it (python, env)."""
    target = layout.cache / "tools" / requirement.replace("==", "-")
    if not target.exists():
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        log.info("installing %s into %s", requirement, target)
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(partial),
             requirement],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if done.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            raise WorkspaceError(
                f"cannot install {requirement} ({last_line(done.stderr)}): check the network to"
                " PyPI and that pip is in this environment"
            )
        partial.rename(target)
    return sys.executable, {"PYTHONPATH": str(target)}
