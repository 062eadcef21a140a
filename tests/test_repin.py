"""`repin`: a card moved to a newer release of its project, against a local package index.

The sdist is fetched and checked against the index's sha256, and an environment found for it,
before the card changes; only the `[pin]` table changes, with a dated comment; the case's results
are stale from then on.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from local_index import make_sdist, serving

from hostsync.upstream import sdists
from hostsync.workspace.files import sha256

from conftest import hostsync, make_workspace, one_line_error, own_downloads

CASE = "ds-clip-norm"


def index(root: Path) -> Path:
    """DeepSpeed's pinned release and a newer one, each a small sdist."""
    for version, uploaded in (("0.19.8", "2026-10-20"), ("0.20.0", "2026-12-02")):
        make_sdist(
            root / "files" / "deepspeed",
            "deepspeed",
            version,
            {"deepspeed/__init__.py": f'__version__ = "{version}"\n'},
            requires=("torch", "numpy"),
            uploaded=uploaded,
        )
    return root


def test_a_card_moves_to_the_newest_release_and_keeps_everything_else(tmp_path: Path) -> None:
    layout = own_downloads(make_workspace(tmp_path / "workspace"))
    card = layout.root / "cases" / f"{CASE}.toml"
    before = card.read_text()
    edited = layout.root / "work" / "clones" / CASE / "an-edit.txt"
    edited.parent.mkdir(parents=True)
    edited.write_text("kept")
    with serving(index(tmp_path / "index")) as url:
        done = hostsync(layout, "repin", "--case", CASE, env_extra={sdists.INDEX_ENV: url})

    assert done.returncode == 0, done.stderr
    pin = tomllib.loads(card.read_text())["pin"]
    sdist = tmp_path / "index" / "files" / "deepspeed" / "deepspeed-0.20.0.tar.gz"
    assert (pin["version"], pin["tag"]) == ("0.20.0", "v0.20.0")
    assert (pin["sdist"]["sha256"], pin["sdist"]["size"]) == (sha256(sdist), sdist.stat().st_size)
    assert "from 0.19.8: 0.20.0, the newest final release on the index that day" in card.read_text()
    assert "(uploaded 2026-12-02)" in card.read_text()
    unchanged = tomllib.loads(before) | {"pin": pin}
    assert tomllib.loads(card.read_text()) == unchanged
    assert "every result is stale; rerun `python -m hostsync repro --case" in done.stderr
    # The clone of the release it left is kept aside, edits and all.
    assert (
        layout.root / "work" / "clones" / f"{CASE}-0.19.8" / "an-edit.txt"
    ).read_text() == "kept"
    assert not edited.parent.exists()


def test_a_card_pinned_to_the_newest_stays_and_an_older_release_is_refused(
    tmp_path: Path,
) -> None:
    layout = own_downloads(make_workspace(tmp_path / "workspace"))
    card = layout.root / "cases" / f"{CASE}.toml"
    before = card.read_text()
    with serving(index(tmp_path / "index")) as url:
        at = {sdists.INDEX_ENV: url}
        same = hostsync(layout, "repin", "--case", CASE, "--version", "0.19.8", env_extra=at)
        older = hostsync(layout, "repin", "--case", CASE, "--version", "0.1.0", env_extra=at)

    assert same.returncode == 0 and "pinned to 0.19.8 already" in same.stderr
    assert "has no final release deepspeed 0.1.0: check the number" in one_line_error(older)
    assert card.read_text() == before
