"""A package index on loopback, serving sdists built in the test: the real HTTP path of the
workspace's downloads and release lookups, with no network."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import tarfile
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def make_sdist(
    folder: Path,
    name: str,
    version: str,
    files: dict[str, str],
    requires: tuple[str, ...] = (),
    uploaded: str | None = None,
) -> Path:
    """`name-version.tar.gz` holding `files` (paths relative to the release's top folder) and a
    PKG-INFO declaring `requires`; the index gives `uploaded` (an ISO date) as its upload time."""
    folder.mkdir(parents=True, exist_ok=True)
    top = f"{name}-{version}"
    pkg_info = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {line}\n" for line in requires
    )
    archive = folder / f"{top}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for path, text in {"PKG-INFO": pkg_info, **files}.items():
            data = text.encode()
            member = tarfile.TarInfo(f"{top}/{path}")
            member.size, member.mtime = len(data), 1_700_000_000
            tar.addfile(member, io.BytesIO(data))
    if uploaded:
        _uploaded(archive).write_text(uploaded)
    return archive


def _uploaded(sdist: Path) -> Path:
    return sdist.with_name(sdist.name + ".uploaded")


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def serving(root: Path) -> Iterator[str]:
    """Serve `root/files/<project>/*.tar.gz` as a PEP 691 JSON simple index; yields its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=root))
    base = f"http://127.0.0.1:{server.server_address[1]}"
    for project in sorted(p for p in (root / "files").iterdir() if p.is_dir()):
        entries = [
            {
                "filename": sdist.name,
                "url": f"{base}/files/{project.name}/{sdist.name}",
                "size": sdist.stat().st_size,
                "hashes": {"sha256": hashlib.sha256(sdist.read_bytes()).hexdigest()},
            }
            | (
                {"upload-time": f"{_uploaded(sdist).read_text()}T12:00:00Z"}
                if _uploaded(sdist).exists()
                else {}
            )
            for sdist in sorted(project.glob("*.tar.gz"))
        ]
        page = root / "simple" / project.name / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(json.dumps({"name": project.name, "files": entries}))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{base}/simple"
    finally:
        server.shutdown()
        server.server_close()
