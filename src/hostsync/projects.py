"""The upstream projects a case can pin: where each keeps its package and version, and how its
CI runs its tests.

A tree under test is imported by path: `Project.import_root` is the folder that goes first on
`PYTHONPATH` (transformers and accelerate keep their package under `src/`, DeepSpeed at the top
together with its `accelerator` and `op_builder` packages). DeepSpeed's unit tests need its own
harness (`tests/unit/common.py`), which the PyPI sdist lacks: `harness` names the stand-in under
`hostsync/harness/` that takes its place there.
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
    test_env: tuple[tuple[str, str], ...] = ()  # as the project's CPU CI sets it
    harness: str = ""  # a stand-in for test infrastructure an sdist lacks
    harness_marker: str = ""  # the tree file whose absence calls for the stand-in

    def version_in(self, root: Path) -> str:
        """The version the tree at `root` says it is, or "unknown"."""
        path = root / self.version_file
        match = (
            re.search(self.version_pattern, path.read_text(), re.MULTILINE)
            if path.exists()
            else None
        )
        return match[1] if match else "unknown"

    def harness_for(self, root: Path) -> Path | None:
        """The stand-in harness a tree at `root` needs, or None when it has its own."""
        if not self.harness or (root / self.harness_marker).exists():
            return None
        return Path(__file__).parent / "harness" / self.harness

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
            # Its cpu-torch-latest workflow: `cd tests; DS_ACCELERATOR=cpu pytest unit/...`.
            test_env=(("DS_ACCELERATOR", "cpu"),),
            harness="deepspeed", harness_marker="tests/unit/common.py",
        ),
    )
}  # fmt: skip


def get(name: str) -> Project:
    if name not in PROJECTS:
        raise WorkspaceError(f"unknown project {name!r}: use one of {', '.join(PROJECTS)}")
    return PROJECTS[name]
