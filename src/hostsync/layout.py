"""Where the workspace keeps things: committed inputs beside ignored, regenerable work."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Layout:
    """All paths derive from one root, so tests can run the real code in a temporary workspace."""

    root: Path = ROOT

    @property
    def pin_file(self) -> Path:
        return self.root / "pin.toml"

    @property
    def patches(self) -> Path:
        return self.root / "patches"

    @property
    def profiles(self) -> Path:
        return self.root / "profiles"

    @property
    def issue_drafts(self) -> Path:
        return self.root / "issue_drafts"

    @property
    def work(self) -> Path:
        """Ignored: everything fetched or built at run time lives here."""
        return self.root / "work"

    @property
    def clone(self) -> Path:
        """The pinned transformers as a git repository; contributors edit and commit here."""
        return self.work / "transformers"

    @property
    def trees(self) -> Path:
        """Detached worktrees of the clone, one per tree under test."""
        return self.work / "trees"

    @property
    def releases(self) -> Path:
        """Other transformers releases (the upstream fix, `--transformers VERSION`)."""
        return self.work / "releases"

    def new_run_dir(self, prefix: str) -> Path:
        """A fresh folder under work/runs/ for one run's logs and outputs, never reused."""
        runs = self.work / "runs"
        runs.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=runs))

    @property
    def cache(self) -> Path:
        """Downloads and compiled extensions that survive between runs."""
        return self.work / "cache"
