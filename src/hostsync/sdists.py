"""Release sdists from PyPI, verified against the size and sha256 a case card pins.

The offline path to a release when `git clone` cannot reach the project's repository, and the
source of what a release declares it needs (its PKG-INFO).
"""

from __future__ import annotations

import logging
import tarfile
import urllib.request
from email.parser import HeaderParser
from pathlib import Path

from hostsync.cases import Sdist
from hostsync.errors import WorkspaceError
from hostsync.files import sha256
from hostsync.layout import Layout

log = logging.getLogger(__name__)


def fetch_sdist(layout: Layout, sdist: Sdist) -> Path:
    """The verified sdist from the cache, downloading it first if needed.

    A file that fails verification is deleted (it is only ever our own download) and refused.
    """
    cached = layout.cache / "sdists" / sdist.filename
    if not cached.exists():
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_name(cached.name + ".part")
        log.info("downloading %s", sdist.url)
        try:
            with urllib.request.urlopen(sdist.url, timeout=60) as response:
                partial.write_bytes(response.read())
        except OSError as error:
            partial.unlink(missing_ok=True)
            raise WorkspaceError(
                f"cannot download {sdist.filename} ({error}): check the network to PyPI, or put"
                f" the verified file at {cached}"
            ) from None
        partial.rename(cached)
    problem = _verify(cached, sdist)
    if problem:
        cached.unlink()
        raise WorkspaceError(
            f"refusing {sdist.filename}: {problem}; the file was removed,"
            " rerun to download it again"
        )
    return cached


def _verify(path: Path, sdist: Sdist) -> str | None:
    size = path.stat().st_size
    if size != sdist.size:
        return f"{size} bytes where {sdist.size} are expected (truncated or tampered)"
    digest = sha256(path)
    if digest != sdist.sha256:
        return f"sha256 {digest[:16]}... where {sdist.sha256[:16]}... is expected (tampered)"
    return None


def pkg_info(archive: Path) -> str:
    """The text of the sdist's top-level PKG-INFO."""
    with tarfile.open(archive) as tar:
        (top,) = {name.split("/", 1)[0] for name in tar.getnames()}
        member = tar.extractfile(f"{top}/PKG-INFO")
        return member.read().decode() if member else ""


def requires_dist(pkg_info_text: str) -> list[str]:
    """The Requires-Dist lines of a PKG-INFO."""
    return HeaderParser().parsestr(pkg_info_text).get_all("Requires-Dist") or []
