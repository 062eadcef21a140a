"""The workspace's own pins, read from pin.toml: the dependencies every environment starts
from, and the case that commands run when none is named."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from hostsync.workspace.layout import Layout


@dataclass(frozen=True)
class Requirement:
    name: str
    install: str
    supported: str


@dataclass(frozen=True)
class Pin:
    default_case: str
    requirements: tuple[Requirement, ...]

    def install_specs(self, replace: dict[str, str] | None = None) -> list[str]:
        """What `pip install` gets in a fresh environment; `replace` pins other versions."""
        replace = replace or {}
        return [f"{r.name}=={replace.get(r.name, r.install)}" for r in self.requirements]


def load(path: Path | None = None) -> Pin:
    path = path or Layout().pin_file
    data = tomllib.loads(path.read_text())
    return Pin(
        default_case=data["default_case"],
        requirements=tuple(
            Requirement(name=name, **spec) for name, spec in data["dependencies"].items()
        ),
    )
