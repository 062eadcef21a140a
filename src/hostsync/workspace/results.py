"""Result files: written once and whole, never overwritten, read back checked field by field.

Every command that measures something writes one file per case and invocation,
`profiles/<case>/<kind>-<UTC time>.json`; a folder beside it, named like it without `.json`,
holds its attachments (traces, pictures). What a file holds is its kind's record, a `Result`
in its layer's `records` module; this module only stores and finds them.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from hostsync.detector.codec import RecordError
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.records import KINDS, SCHEMA_VERSION, Result

R = TypeVar("R", bound=Result)
_STAMP = re.compile(r"-(\d{8}T\d{6})Z(?:-(\d+))?$")


def write(folder: Path, result: Result, keep_elsewhere: Path) -> Path:
    """Write `result` into `folder` as `<kind>-<time>.json`, whole or not at all, next to no
    earlier file of the same name. When `folder` cannot take it, the result goes to
    `keep_elsewhere` instead and the error says where, so a finished run is never lost."""
    text = json.dumps(result.document(), indent=2) + "\n"
    stem = f"{result.KIND}-{result.stamp.time:%Y%m%dT%H%M%SZ}"
    try:
        return _write_new(folder, stem, text)
    except OSError as error:
        kept = _write_new(
            Path(tempfile.mkdtemp(prefix="result-", dir=_existing(keep_elsewhere))), stem, text
        )
        raise WorkspaceError(
            f"cannot write the {result.KIND} result into {folder} ({error.strerror or error}):"
            f" it is kept at {kept}; make the folder writable and move the file there"
        ) from None


def _existing(folder: Path) -> Path:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return Path(tempfile.gettempdir())
    return folder


def _write_new(folder: Path, stem: str, text: str) -> Path:
    """A new file holding `text`: written under a temporary name, then linked to its final
    name, which fails rather than replace a file that is already there."""
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(
        "w", dir=folder, prefix=".", suffix=".part", delete=False
    ) as partial:
        partial.write(text)
        partial.flush()
        os.fsync(partial.fileno())
    try:
        for attempt in range(1, 100):
            path = folder / (f"{stem}.json" if attempt == 1 else f"{stem}-{attempt}.json")
            try:
                os.link(partial.name, path)
            except FileExistsError:
                continue
            return path
        raise FileExistsError(f"{stem}: too many results written within one second")
    finally:
        Path(partial.name).unlink()


def read(path: Path, kind: type[R]) -> R:
    """The result at `path`, which must be a `kind` result of this schema, every field checked."""
    rerun = f"rerun {kind.made_by()} to replace it"
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise WorkspaceError(f"{path} is no readable result ({error}): {rerun}") from None
    problem = _header_problem(document, kind)
    if problem:
        raise WorkspaceError(f"{path} {problem}: {rerun}")
    try:
        return kind.from_json(document)
    except RecordError as error:
        raise WorkspaceError(f"{path} is no valid {kind.KIND} result ({error}): {rerun}") from None


def _header_problem(document: object, kind: type[Result]) -> str | None:
    if not isinstance(document, dict):
        return "is not a JSON object"
    found = document.get("kind")
    if found != kind.KIND:
        named = f"a {found!r} result" if found in KINDS else f"of kind {found!r}"
        return f"is {named}, not a {kind.KIND!r} one"
    if document.get("schema") != SCHEMA_VERSION:
        return f"has schema {document.get('schema')}, this workspace reads {SCHEMA_VERSION}"
    return None


def latest(folder: Path, kind: type[Result]) -> Path | None:
    """The newest result of `kind` in `folder`, or None when none was written yet."""
    found = sorted(folder.glob(f"{kind.KIND}-[0-9]*.json"), key=_sort_key)
    return found[-1] if found else None


def write_markdown(json_path: Path, kind: type[R], render: Callable[[R, Path], str]) -> list[Path]:
    """A result's Markdown beside it (never overwritten), and `<kind>.md` in its folder from
    the newest result of its kind, the report a reader opens first."""
    beside = json_path.with_suffix(".md")
    text = render(read(json_path, kind), json_path)
    with beside.open("x") as out:
        out.write(text)
    newest = latest(json_path.parent, kind) or json_path
    stable = json_path.parent / f"{kind.KIND}.md"
    stable.write_text(text if newest == json_path else render(read(newest, kind), newest))
    return [beside, stable]


def attachments(path: Path) -> Path:
    """The folder of a result's attachments: beside it, named like it."""
    return path.with_suffix("")


def _sort_key(path: Path) -> tuple[str, int]:
    match = _STAMP.search(path.stem)
    return (match[1], int(match[2] or 1)) if match else ("", 0)
