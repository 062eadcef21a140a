"""Where the workspace keeps things: committed inputs beside ignored, regenerable work.

Each case has a folder of the same name under `patches/`, `repro/`, `profiles/` and
`issue_drafts/`, and its own clone and trees under `work/`. Downloads, releases and environments
are shared by every case.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path


def _root() -> Path:
    """`HOSTSYNC_ROOT`, else the checkout this package runs from, else the one pip installed it
    from (`pip install path/to/checkout` records it: PEP 610's direct_url.json)."""
    if os.environ.get("HOSTSYNC_ROOT"):
        return Path(os.environ["HOSTSYNC_ROOT"])
    here = Path(__file__).resolve().parents[3]
    if (here / "pin.toml").is_file():
        return here
    try:
        recorded = metadata.distribution("hostsync").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        recorded = None
    url = urllib.parse.urlparse(json.loads(recorded or "{}").get("url", ""))
    return Path(urllib.request.url2pathname(url.path)) if url.scheme == "file" else here


ROOT = _root()


@dataclass(frozen=True)
class Layout:
    """All paths derive from one root and one case, so tests can run the real code in a
    temporary workspace (`HOSTSYNC_ROOT` points a command at one)."""

    root: Path = ROOT
    case: str = ""

    def for_case(self, name: str) -> Layout:
        return dataclasses.replace(self, case=name)

    @property
    def pin_file(self) -> Path:
        return self.root / "pin.toml"

    @property
    def case_file(self) -> Path:
        return self.root / "cases" / f"{self.case}.toml"

    @property
    def patches(self) -> Path:
        return self.root / "patches" / self.case

    @property
    def repro(self) -> Path:
        """The case's scripts: what each rank runs, and its one-process snippet."""
        return self.root / "repro" / self.case

    @property
    def profiles(self) -> Path:
        return self.root / "profiles" / self.case

    @property
    def sites(self) -> Path:
        """Results about a site named on the command line, which belongs to no case."""
        return self.root / "profiles" / "sites"

    @property
    def watch(self) -> Path:
        """Results about every project and case at once."""
        return self.root / "profiles" / "watch"

    @property
    def issue_drafts(self) -> Path:
        return self.root / "issue_drafts" / self.case

    @property
    def known_sites(self) -> Path:
        """The sites accepted by design, and the candidates left as they are."""
        return self.root / "known_sites.toml"

    @property
    def remedies(self) -> Path:
        """What to change at each kind of host sync, for every report that names a remedy."""
        return self.root / "remedies.toml"

    @property
    def work(self) -> Path:
        """Ignored: everything fetched or built at run time lives here."""
        return self.root / "work"

    @property
    def clone(self) -> Path:
        """The case's pinned release as a git repository; contributors edit and commit here."""
        return self.work / "clones" / self.case

    @property
    def trees(self) -> Path:
        """Detached worktrees of the clone, one per tree under test."""
        return self.work / "trees" / self.case

    @property
    def stacks(self) -> Path:
        """Worktrees of one release carrying several cases' series at once, for every case."""
        return self.work / "stacks"

    @property
    def releases(self) -> Path:
        """Other releases as published (upstream's fix, `--release VERSION`), for every case."""
        return self.work / "releases"

    @property
    def envs(self) -> Path:
        """One Python environment per distinct dependency set, shared by every case."""
        return self.work / "envs"

    @property
    def unsaved(self) -> Path:
        """Where a finished run's result goes when profiles/ cannot take it."""
        return self.work / "unsaved"

    @property
    def cache(self) -> Path:
        """Downloads and compiled extensions that survive between runs."""
        return self.work / "cache"

    def new_run_dir(self, prefix: str) -> Path:
        """A fresh folder under work/runs/ for one run's logs and outputs, never reused."""
        runs = self.work / "runs"
        runs.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=runs))
