"""Release sdists from PyPI, verified against the size and sha256 a case card pins.

The offline path to a release when `git clone` cannot reach the project's repository, and the
source of what a release declares it needs (its PKG-INFO).

The cache is shared by every case, so a file in it is only trusted for what it was verified
as: a download that matches the card is kept with a record of its digest beside it
(`<file>.verified`). Later, a card that disagrees with a verified file is a card error and the
file stays; a verified file that no longer matches its record is damaged and fetched again; a
fresh download that fails is discarded, since nothing else can have used it.
"""

from __future__ import annotations

import json
import logging
import os
import tarfile
import urllib.request
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from packaging.utils import InvalidSdistFilename, canonicalize_name, parse_sdist_filename

from hostsync.detector.codec import Json
from hostsync.workspace.cases import Sdist
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.files import sha256
from hostsync.workspace.layout import Layout
from hostsync.workspace.projects import Project

log = logging.getLogger(__name__)

_TIMEOUT_S = 60


def fetch_sdist(layout: Layout, sdist: Sdist) -> Path:
    """The verified sdist from the cache, downloading it first if needed."""
    cached = layout.cache / "sdists" / sdist.filename
    record = cached.with_name(cached.name + ".verified")
    if cached.exists():
        problem = _trusted_problem(cached, record, sdist)
        if problem is None:
            return cached
        if problem != _DAMAGED:
            raise WorkspaceError(problem)
        log.info(
            "%s no longer matches the digest it was verified with: fetching it again", cached.name
        )
        cached.unlink()
        record.unlink(missing_ok=True)
    _download(sdist, cached)
    problem = _mismatch(cached, sdist)
    if problem:
        cached.unlink()
        raise WorkspaceError(
            f"the download of {sdist.filename} has {problem}: it was discarded; check the card's"
            f" [pin] or [fixed] sdist against PyPI (`pip download --no-deps {sdist.filename}`)"
        )
    record.write_text(json.dumps({"size": sdist.size, "sha256": sdist.sha256}) + "\n")
    return cached


_DAMAGED = "damaged"


def _trusted_problem(cached: Path, record: Path, sdist: Sdist) -> str | None:
    """None when the cached file is the card's; `_DAMAGED` when it changed since it was
    verified; else why the card and the file disagree, as the one-line error to raise."""
    if record.exists():
        verified = json.loads(record.read_text())
        if sha256(cached) != verified["sha256"]:
            return _DAMAGED
        if (verified["size"], verified["sha256"]) == (sdist.size, sdist.sha256):
            return None
        return (
            f"the card pins {sdist.filename} at {sdist.size} bytes, sha256 {sdist.sha256[:16]}...,"
            f" but the file verified on download has {verified['size']} bytes, sha256"
            f" {verified['sha256'][:16]}...: fix the card's sdist (the file is kept)"
        )
    problem = _mismatch(cached, sdist)
    if problem:
        return (
            f"{cached} was not downloaded here and has {problem}: remove it, or fix the card's"
            " sdist if the file is the release"
        )
    record.write_text(json.dumps({"size": sdist.size, "sha256": sdist.sha256}) + "\n")
    return None


def _download(sdist: Sdist, cached: Path) -> None:
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_name(f"{cached.name}.{os.getpid()}.part")  # one per downloader
    log.info("downloading %s", sdist.url)
    try:
        with urllib.request.urlopen(sdist.url, timeout=_TIMEOUT_S) as response:
            partial.write_bytes(response.read())
    except OSError as error:
        partial.unlink(missing_ok=True)
        raise WorkspaceError(
            f"cannot download {sdist.filename} ({error}): check the network to PyPI, or put"
            f" the verified file at {cached}"
        ) from None
    partial.rename(cached)


def _mismatch(path: Path, sdist: Sdist) -> str | None:
    size = path.stat().st_size
    if size != sdist.size:
        return f"{size} bytes where the card says {sdist.size}"
    digest = sha256(path)
    if digest != sdist.sha256:
        return f"sha256 {digest[:16]}... where the card says {sdist.sha256[:16]}..."
    return None


def pypi_sdist(project: Project, version: str) -> Sdist:
    """The sdist of a release as PyPI's JSON simple index describes it."""
    wanted = f"{project.name}-{version}.tar.gz"
    for entry in pypi_files(project.name):
        if entry["filename"] == wanted:
            return _sdist(entry)
    raise WorkspaceError(f"{index_url()} has no sdist {wanted}: check the version number")


def _sdist(entry: Json) -> Sdist:
    return Sdist(entry["url"], entry["size"], entry["hashes"]["sha256"])


@dataclass(frozen=True)
class Published:
    """A final release on the index, with its sdist and the day it was uploaded ("" when the
    index does not say)."""

    version: str
    sdist: Sdist
    uploaded: str


def published(package: str) -> list[Published]:
    """A package's final releases with a `.tar.gz` sdist, oldest first: pre-, dev- and
    yanked releases are left out, as pip leaves them out of a plain install."""
    found = {}
    for entry in pypi_files(package):
        if not entry["filename"].endswith(".tar.gz") or entry.get("yanked"):
            continue
        try:
            name, version = parse_sdist_filename(entry["filename"])
        except InvalidSdistFilename:
            continue
        if name == canonicalize_name(package) and not version.is_prerelease:
            found[version] = Published(
                str(version), _sdist(entry), entry.get("upload-time", "")[:10]
            )
    return [found[version] for version in sorted(found)]


# The package index's simple API: PyPI, or a mirror or local index that serves its JSON form.
INDEX_ENV = "HOSTSYNC_INDEX_URL"
PYPI = "https://pypi.org/simple"


def index_url() -> str:
    return os.environ.get(INDEX_ENV, PYPI).rstrip("/")


def pypi_files(package: str) -> list[Json]:
    """Every file the package index lists for a package (PEP 691, JSON)."""
    request = urllib.request.Request(
        f"{index_url()}/{package}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
            files: list[Json] = json.load(response)["files"]
            return files
    except OSError as error:
        raise WorkspaceError(
            f"cannot read the package index for {package} at {index_url()} ({error}): check"
            f" the network, or set {INDEX_ENV}"
        ) from None


def pkg_info(archive: Path) -> str:
    """The text of the sdist's top-level PKG-INFO, read as the archive streams by: it comes
    first in an sdist, and the whole archive takes seconds to list."""
    with tarfile.open(archive) as tar:
        for member in tar:
            if member.name.partition("/")[2] == "PKG-INFO":
                found = tar.extractfile(member)
                return found.read().decode() if found else ""
    return ""


def egg_info_requires(archive: Path) -> str:
    """The text of the sdist's egg-info requires.txt, or "" when it has none."""
    with tarfile.open(archive) as tar:
        found = sorted(n for n in tar.getnames() if n.endswith(".egg-info/requires.txt"))
        member = tar.extractfile(found[0]) if found else None
        return member.read().decode() if member else ""


def requires_dist(pkg_info_text: str) -> list[str]:
    """The Requires-Dist lines of a PKG-INFO."""
    return HeaderParser().parsestr(pkg_info_text).get_all("Requires-Dist") or []
