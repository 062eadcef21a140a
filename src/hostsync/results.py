"""Result files under profiles/<case>/: written once, never overwritten, each saying what made it.

Every session that measures something writes one JSON file per invocation. The drafts are filled
only from these files, so each carries its provenance: pin.toml, the case card, the patch series
and the case's scripts it was measured with. When any changed since, the result is stale.

Each kind has a schema: the keys its producer writes and its readers rely on, and the schema
version. `read` refuses a file that lacks them, in one line naming the file, never a traceback.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hostsync.errors import WorkspaceError
from hostsync.files import sha256
from hostsync.layout import Layout
from hostsync.upstream import series

SCHEMA_VERSION = 3
_COMMON = ("kind", "schema", "created", "command", "case", "provenance")
# What each kind holds beyond the common keys; `runs`/`checks` entries must hold their keys too.
SCHEMAS: dict[str, dict[str, tuple[str, ...]]] = {
    "repro": {"top": ("environment", "trees", "scenarios", "runs"), "runs": ("tree", "scenario")},
    "test_patch": {"top": ("ok", "checks"), "checks": ("check", "label", "verdict", "tests")},
    "profile": {"top": ("setting", "trees", "snippet"), "trees": ()},
    "hunt": {"top": ("setup", "allowlist", "trees"), "trees": ("label",)},
    "bench": {"top": ("environment",)},
}


def provenance(layout: Layout) -> dict:
    """The inputs a result depends on: pin.toml, the case card, each patch and each of the
    case's scripts (what its ranks run, the snippet an issue quotes), by sha256."""
    return {
        "pin_sha256": sha256(layout.pin_file),
        "case_sha256": sha256(layout.case_file),
        "patches": {path.name: sha256(path) for path in series(layout)},
        "scripts": {path.name: sha256(path) for path in sorted(layout.repro.glob("*.py"))},
    }


def stale_reasons(layout: Layout, result: dict) -> list[str]:
    """Why `result` no longer describes the workspace (empty when it still does)."""
    then, now = result["provenance"], provenance(layout)
    reasons = []
    if then["pin_sha256"] != now["pin_sha256"]:
        reasons.append("pin.toml changed")
    if then["case_sha256"] != now["case_sha256"]:
        reasons.append(f"cases/{layout.case}.toml changed")
    for folder, kind in (("patches", "patches"), ("repro", "scripts")):
        old, new = then[kind], now[kind]
        for name in sorted(set(old) | set(new)):
            where = f"{folder}/{layout.case}/{name}"
            if name not in new:
                reasons.append(f"{where} was removed")
            elif name not in old:
                reasons.append(f"{where} was added")
            elif old[name] != new[name]:
                reasons.append(f"{where} changed")
    return reasons


def write(layout: Layout, kind: str, payload: dict) -> Path:
    """Write `payload` as profiles/<case>/<kind>-<UTC time>.json; never replaces a file."""
    created = datetime.now(UTC).replace(microsecond=0)
    document = {
        "kind": kind,
        "schema": SCHEMA_VERSION,
        "created": created.isoformat().replace("+00:00", "Z"),
        "command": shlex.join(["python", "-m", "hostsync", *sys.argv[1:]]),
        "case": layout.case,
        "provenance": provenance(layout),
        **payload,
    }
    problem = schema_problem(document, kind)
    if problem:
        raise ValueError(f"a {kind} result about to be written {problem}")
    layout.profiles.mkdir(parents=True, exist_ok=True)
    stem = f"{kind}-{created:%Y%m%dT%H%M%SZ}"
    for attempt in range(1, 100):
        path = layout.profiles / (f"{stem}.json" if attempt == 1 else f"{stem}-{attempt}.json")
        try:
            with path.open("x") as out:
                json.dump(document, out, indent=2)
                out.write("\n")
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"{stem}: too many results written within one second")


def read(path: Path, kind: str) -> dict[str, Any]:
    """A result of `kind`, checked against its schema."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise WorkspaceError(f"{path} is no readable result ({error}): rerun its session") from None
    problem = schema_problem(document, kind)
    if problem:
        raise WorkspaceError(f"{path} {problem}: rerun `nox -s {kind}` to replace it")
    return document


def schema_problem(document: Any, kind: str) -> str | None:
    """What keeps `document` from being a `kind` result of this schema, or None."""
    if not isinstance(document, dict):
        return "is not a JSON object"
    if document.get("kind") != kind:
        return f"is a {document.get('kind')!r} result, not {kind!r}"
    if document.get("schema") != SCHEMA_VERSION:
        return f"has schema {document.get('schema')}, this workspace reads {SCHEMA_VERSION}"
    schema = SCHEMAS[kind]
    missing = [key for key in (*_COMMON, *schema["top"]) if key not in document]
    for part, keys in schema.items():
        if part == "top":
            continue
        entries = document.get(part, [])
        entries = entries.values() if isinstance(entries, dict) else entries
        for entry in entries:
            missing += [f"{part}[].{key}" for key in keys if key not in entry]
    return f"lacks {', '.join(sorted(set(missing)))}" if missing else None


def latest(layout: Layout, kind: str) -> Path | None:
    """The newest result of `kind`, or None when that session has not run yet."""
    found = sorted(layout.profiles.glob(f"{kind}-[0-9]*.json"), key=_sort_key)
    return found[-1] if found else None


_STAMP = re.compile(r"-(\d{8}T\d{6})Z(?:-(\d+))?$")


def _sort_key(path: Path) -> tuple[str, int]:
    match = _STAMP.search(path.stem)
    return (match[1], int(match[2] or 1)) if match else ("", 0)
