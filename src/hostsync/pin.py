"""The pinned upstream state, read from pin.toml."""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass
from pathlib import Path

from hostsync.layout import Layout


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
    """One transformers release, reachable as a git tag or as its PyPI sdist."""

    version: str
    tag: str
    sdist: Sdist


@dataclass(frozen=True)
class Requirement:
    name: str
    install: str
    supported: str

    @property
    def install_spec(self) -> str:
        return f"{self.name}=={self.install}"


@dataclass(frozen=True)
class Pin:
    transformers: Release
    repository: str
    reference: Release
    issue: int
    pull_request: int
    requirements: tuple[Requirement, ...]
    digest: str

    def install_specs(self) -> list[str]:
        """What `pip install` gets in a fresh virtualenv."""
        return [r.install_spec for r in self.requirements]


def _release(table: dict) -> Release:
    return Release(version=table["version"], tag=table["tag"], sdist=Sdist(**table["sdist"]))


def load(path: Path | None = None) -> Pin:
    path = path or Layout().pin_file
    raw = path.read_bytes()
    data = tomllib.loads(raw.decode())
    return Pin(
        transformers=_release(data["transformers"]),
        repository=data["transformers"]["repository"],
        reference=_release(data["reference"]),
        issue=data["upstream"]["issue"],
        pull_request=data["upstream"]["pull_request"],
        requirements=tuple(
            Requirement(name=name, **spec) for name, spec in data["dependencies"].items()
        ),
        digest=hashlib.sha256(raw).hexdigest(),
    )
