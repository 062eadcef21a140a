"""The workspace's own pins, read from pin.toml: the dependencies every environment starts
from, and the case that commands run when none is named."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hostsync.detector.codec import Strict
from hostsync.workspace.config import load_toml
from hostsync.workspace.layout import Layout


@dataclass(frozen=True)
class Dependency(Strict):
    """What a fresh environment installs of a package, and the range a prepared one must meet."""

    install: str  # the release a fresh environment installs
    supported: str  # the range a prepared environment must meet
    # Beside an older release of a project, this package's release of that release's day (as
    # the projects themselves are), not `install`: an older project cannot take the newest.
    of_its_day: bool = False


@dataclass(frozen=True)
class Pin(Strict):
    """pin.toml: the case commands run when none is named, and every environment's dependencies."""

    default_case: str
    dependencies: dict[str, Dependency]

    @property
    def installs(self) -> dict[str, str]:
        """The version a fresh environment installs, by project."""
        return {name: dependency.install for name, dependency in self.dependencies.items()}

    @property
    def of_its_day(self) -> set[str]:
        """The packages whose release of an older project's day goes beside it."""
        return {name for name, dependency in self.dependencies.items() if dependency.of_its_day}

    def install_specs(self, replace: dict[str, str] | None = None) -> list[str]:
        """What `pip install` gets in a fresh environment; `replace` pins other versions."""
        replace = replace or {}
        return [f"{name}=={replace.get(name, version)}" for name, version in self.installs.items()]


def load(path: Path | None = None) -> Pin:
    return load_toml(path or Layout().pin_file, Pin)
