"""The files a person edits (the case cards, pin.toml, census.toml, surveys.toml,
known_sites.toml), each read whole by one strict loader before anything runs.

Each file is a `Strict` record, or a mapping of them, so the codec checks every key: a syntax
error, a missing field, an unknown key, a wrong type or a value outside its choices is refused
in one line naming the file and the field.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from hostsync.detector.codec import RecordError, T, load
from hostsync.workspace.errors import WorkspaceError


def load_toml(path: Path, kind: type[T], *, shown: str = "", what: str = "file") -> T:
    """What the TOML file `path` holds, as `kind` (a record, or `dict[str, Record]`), checked
    field by field so that a mistake is refused before anything runs.

    The error names the file as `shown` (default: its name) and ends `fix the {what}`.
    """
    shown = shown or path.name
    try:
        document = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise WorkspaceError(
            f"no {shown} at {path.parent}: restore it from version control"
        ) from None
    except tomllib.TOMLDecodeError as error:
        raise WorkspaceError(f"{shown} is not valid TOML ({error}): fix that line") from None
    try:
        loaded: T = load(kind, document, "")
        return loaded
    except RecordError as error:
        raise WorkspaceError(f"{shown}: {error}: fix the {what}") from None
