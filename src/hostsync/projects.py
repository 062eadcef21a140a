"""The upstream projects a case can pin: where each keeps its package, version and lint rules.

A tree under test is imported by path: `Project.import_root` is the folder that goes first on
`PYTHONPATH` (transformers and accelerate keep their package under `src/`, DeepSpeed at the top
together with its `accelerator` and `op_builder` packages).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from hostsync.errors import WorkspaceError


@dataclass(frozen=True)
class Project:
    name: str  # on PyPI, and the import name
    repository: str
    import_root: str  # relative to the tree root
    version_file: str  # relative to the tree root
    version_pattern: str  # its group 1 is the version

    def version_in(self, root: Path) -> str:
        """The version the tree at `root` says it is, or "unknown"."""
        path = root / self.version_file
        match = (
            re.search(self.version_pattern, path.read_text(), re.MULTILINE)
            if path.exists()
            else None
        )
        return match[1] if match else "unknown"

    @property
    def pypi_simple(self) -> str:
        return f"https://pypi.org/simple/{self.name}/"


_DUNDER_VERSION = r'^__version__ = "([^"]+)"'

PROJECTS = {
    project.name: project
    for project in (
        Project(
            "transformers", "https://github.com/huggingface/transformers", "src",
            "src/transformers/__init__.py", _DUNDER_VERSION,
        ),
        Project(
            "accelerate", "https://github.com/huggingface/accelerate", "src",
            "src/accelerate/__init__.py", _DUNDER_VERSION,
        ),
        Project(
            "deepspeed", "https://github.com/deepspeedai/DeepSpeed", ".",
            "version.txt", r"^(\S+)\s*$",
        ),
    )
}  # fmt: skip


def get(name: str) -> Project:
    if name not in PROJECTS:
        raise WorkspaceError(f"unknown project {name!r}: use one of {', '.join(PROJECTS)}")
    return PROJECTS[name]
