"""One Python environment per distinct dependency set, shared by every session, case and tree.

A tree runs with the dependencies its own release declares (transformers 5.24.0 needs a newer
tokenizers than 5.13.1). An environment is a virtualenv under `work/envs/` holding pin.toml's
pins, with the tree's own project at the tree's release so that pip brings what that release
needs. A tree uses the first environment that satisfies both its release's requirements and
pin.toml's pins; a new one is built only when none does. The tree itself is always imported by
path, never from the environment.

With `nox --no-venv` (a prepared environment, e.g. a GPU box with its own CUDA torch) the running
interpreter is the only environment: it is checked against `supported` and the tree's
requirements, never changed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from hostsync.detector.codec import RecordError, read_file, write_file
from hostsync.upstream.records import EnvRecord
from hostsync.upstream.sdists import (
    egg_info_requires,
    fetch_sdist,
    index_url,
    pkg_info,
    published,
    requires_dist,
)
from hostsync.workspace import locks
from hostsync.workspace import pin as pinning
from hostsync.workspace.cases import Release
from hostsync.workspace.errors import WorkspaceError, last_line
from hostsync.workspace.layout import Layout
from hostsync.workspace.projects import PROJECTS, Project

log = logging.getLogger(__name__)

PREPARED_ENV = "HOSTSYNC_PREPARED"
RECORD = "hostsync-env.json"
_INSTALL_TIMEOUT_S = 1800


def prepared() -> bool:
    """Set by the nox sessions under `--no-venv`: use this interpreter, install nothing."""
    return os.environ.get(PREPARED_ENV) == "1"


# --- what a release needs ------------------------------------------------------------------------


def declared(
    layout: Layout,
    project: Project,
    release: Release,
    root: Path | None = None,
) -> list[str]:
    """The requirements a release declares: its PKG-INFO's Requires-Dist, or for a release
    built before sdists carried them, its egg-info's requires.txt; from the tree (a tree made
    from the sdist has both), else from the verified sdist. Extras are left out."""
    if root is not None and (root / "PKG-INFO").exists():
        metadata_text = (root / "PKG-INFO").read_text()
        eggs = [*root.glob("*.egg-info/requires.txt"), *root.glob("*/*.egg-info/requires.txt")]
        requires_txt = min(eggs, default=None)
        legacy = requires_txt.read_text() if requires_txt else ""
    else:
        archive = fetch_sdist(layout, release.sdist)
        metadata_text = pkg_info(archive)
        # Listing the whole archive for requires.txt takes seconds: only where it is needed.
        legacy = "" if requires_dist(metadata_text) else egg_info_requires(archive)
    found = requires_dist(metadata_text) or legacy_requirements(legacy)
    if not found:
        raise WorkspaceError(
            f"{project.name} {release.version} declares no requirements (no Requires-Dist in its"
            " PKG-INFO, no egg-info requires.txt): no environment can be chosen for it here"
        )
    return [line for line in found if _applies(Requirement(line))]


def legacy_requirements(text: str) -> list[str]:
    """requires.txt's lines as requirements: those before any `[section]` apply always, those
    of a `[:marker]` section where the marker holds; `[extra]` sections are extras."""
    found, section = [], ""
    for line in (line.strip() for line in text.splitlines()):
        if line.startswith("["):
            section = line.strip("[]")
        elif line and (not section or section.startswith(":")):
            marker = section.removeprefix(":")
            found.append(f"{line}; {marker}" if marker else line)
    return found


def _applies(requirement: Requirement) -> bool:
    return requirement.marker is None or requirement.marker.evaluate({"extra": ""})


# --- what an environment holds -------------------------------------------------------------------


def installed_in(site_packages: list[str] | None = None) -> dict[str, str]:
    """Installed distributions by canonical name: of `site_packages`, or of this interpreter."""
    found = (
        metadata.distributions(path=site_packages) if site_packages else metadata.distributions()
    )
    return {canonicalize_name(d.metadata["Name"]): d.version for d in found if d.metadata["Name"]}


def problems(
    installed: dict[str, str],
    pin: pinning.Pin,
    project: Project,
    requires: list[str],
    *,
    exact: bool,
    companions: dict[str, str] | None = None,
) -> list[str]:
    """Why an environment holding `installed` cannot run the tree (empty when it can).

    `exact`: pin.toml's `install` versions (a managed environment; `companions` in place of
    some), else its `supported` ranges (a prepared one). The tree's own project is imported from
    the tree: only its needs count.
    """
    companions = companions or {}
    found = []
    for name, dependency in pin.dependencies.items():
        if name == project.name:
            continue
        install = companions.get(name, dependency.install)
        wanted = f"=={install}" if exact else dependency.supported
        found += _unmet(installed, name, SpecifierSet(wanted, prereleases=True))
    for text in requires:
        requirement = Requirement(text)
        found += _unmet(installed, requirement.name, requirement.specifier)
    return found


def _unmet(installed: dict[str, str], name: str, specifier: SpecifierSet) -> list[str]:
    version = installed.get(canonicalize_name(name))
    if version is None:
        return [f"{name} is not installed"]
    if specifier and Version(version) not in specifier:
        return [f"{name} {version} is outside {specifier}"]
    return []


# --- choosing and building -----------------------------------------------------------------------


def companions_of_its_day(layout: Layout, project: Project, version: str) -> dict[str, str]:
    """For a release older than pin.toml's own pin of its project, the other projects pin.toml
    pins, and the packages it marks `of_its_day`, at their newest release uploaded by that
    release's day: what it was made to run with (TRL 0.16.0 with transformers 4.50, not 5.24).
    None for the pinned release or a newer one, or a project pin.toml does not pin, or in a
    prepared environment (it is what it is)."""
    if prepared():
        return {}
    pin = pinning.load(layout.pin_file)
    pinned = pin.installs
    if project.name not in pinned or Version(version) >= Version(pinned[project.name]):
        return {}
    days = {r.version: r.uploaded for r in published(project.name)}
    day = days.get(version)
    if not day:
        raise WorkspaceError(
            f"{index_url()} gives no upload day of {project.name} {version}: its companions of"
            " that day cannot be chosen"
        )
    companions = {}
    for name in ((pinned.keys() & PROJECTS.keys()) | pin.of_its_day) - {project.name}:
        before = [r.version for r in published(name) if r.uploaded and r.uploaded <= day]
        if before and before[-1] != pinned[name]:
            companions[name] = before[-1]
    return companions


def python_for(
    layout: Layout,
    project: Project,
    release: Release,
    root: Path | None = None,
    companions: dict[str, str] | None = None,
) -> str:
    """The interpreter that runs a tree of `project` at `release`: an environment that fits,
    built first if none does; `companions`: other versions of pinned projects than the pins."""
    pin = pinning.load(layout.pin_file)
    version = release.version
    requires = declared(layout, project, release, root)
    if prepared():
        unmet = problems(installed_in(), pin, project, requires, exact=False)
        if unmet:
            raise WorkspaceError(
                f"the prepared environment {sys.executable} cannot run {project.name} {version}:"
                f" {'; '.join(unmet)} (install them there, or drop --no-venv)"
            )
        return sys.executable
    for record_file in sorted(layout.envs.glob("*/" + RECORD)):
        try:
            record = read_file(EnvRecord, record_file)
        except RecordError as error:
            raise WorkspaceError(
                f"{error}: remove {record_file.parent} and rerun, it is rebuilt"
            ) from None
        if not problems(
            record.installed, pin, project, requires, exact=True, companions=companions
        ):
            return usable_python(record_file.parent, record)
    return build(layout, pin, project, version, requires, companions or {})


def usable_python(env: Path, record: EnvRecord) -> str:
    """The interpreter of the environment `env`, which its record names relative to the
    folder; a record naming one elsewhere, or one that is gone, is refused in one line.

    Named by the folder's real path: the paths a run takes from its interpreter (DeepSpeed's
    headers, in the build file of the op it compiles) are then the same from every workspace
    that reaches the environment through a link, and the op is built once, not once per path.
    """
    python = env.resolve() / record.python  # an older record's absolute path stays as it is
    inside = python.parent.resolve().is_relative_to(env.resolve())  # bin/python is a link
    if not inside or not python.exists():
        raise WorkspaceError(
            f"the environment {env.name} has no interpreter of its own at {python}"
            f" (it names {record.python}): remove {env} and rerun, it is rebuilt"
        )
    return str(python)


def folder(layout: Layout, project: Project, version: str, specs: list[str]) -> Path:
    """Where the environment installing `specs` lives.

    Named by release and by the digest of what it installs, so that an environment built for
    other pins (a checkout of another pin.toml sharing work/envs/) is never in the way. At its
    real path: scripts it installs name their interpreter by path, and a workspace reached
    through a link (a test's) may be gone when the environment is used."""
    digest = hashlib.sha256(" ".join(specs).encode()).hexdigest()[:8]
    return (layout.envs / f"{project.name}-{version}-{digest}").resolve()


def build(
    layout: Layout,
    pin: pinning.Pin,
    project: Project,
    version: str,
    requires: list[str],
    companions: dict[str, str],
) -> str:
    """A new environment: pin.toml's pins (`companions` in place of some) with `project` at
    `version`, checked after install; or the one a build beside this one made meanwhile."""
    specs = pin.install_specs(replace={**companions, project.name: version})
    target = folder(layout, project, version, specs)

    def unmet(installed: dict[str, str]) -> list[str]:
        return problems(installed, pin, project, requires, exact=True, companions=companions)

    with locks.building(target):
        if not (target / RECORD).exists():
            return _build(target, specs, project, version, unmet)
        record = read_file(EnvRecord, target / RECORD)  # built beside this one while it waited
        if unmet(record.installed):
            raise WorkspaceError(
                f"{target} exists but does not fit {project.name} {version} (edited by hand?):"
                " remove it and rerun"
            )
        return usable_python(target, record)


def _build(
    target: Path,
    specs: list[str],
    project: Project,
    version: str,
    unmet: Callable[[dict[str, str]], list[str]],
) -> str:
    """Build `target`, whose lock the caller holds: installed, checked, then recorded."""
    shutil.rmtree(target, ignore_errors=True)  # a build that was interrupted
    log.info("building the environment %s: %s", target.name, " ".join(specs))
    # Built where it stays (console scripts such as torchrun name their interpreter by path);
    # only an environment with its record counts, so a failed build is never used.
    python = target / "bin" / "python"
    for command in (
        [sys.executable, "-m", "venv", str(target)],
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *specs],
    ):
        done = subprocess.run(command, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT_S)
        if done.returncode != 0:
            shutil.rmtree(target, ignore_errors=True)
            raise WorkspaceError(
                f"cannot build the environment for {project.name} {version}"
                f" ({last_line(done.stderr)}): check the network to PyPI and pin.toml"
            )
    site = [str(p) for p in target.glob("lib/python*/site-packages")]
    installed = installed_in(site)
    left = unmet(installed)
    if left:
        raise WorkspaceError(
            f"the new environment {target.name} does not fit its own release: {'; '.join(left)}:"
            " pin.toml's pins conflict with what that release needs"
        )
    record = EnvRecord(python="bin/python", specs=tuple(specs), installed=installed)
    write_file(record, target / RECORD)
    return usable_python(target, record)
