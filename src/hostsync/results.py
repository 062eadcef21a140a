"""Result files under profiles/: written once, never overwritten, each saying what produced it.

Every session that measures something writes one JSON file per invocation. The review drafts
are filled only from these files, so each carries its provenance: the pin and the patch series
it was measured against. When either changed since, the result is stale.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path

from hostsync.layout import Layout
from hostsync.pin import load as load_pin

SCHEMA_VERSION = 1


def series(layout: Layout) -> list[Path]:
    """The patch files of patches/series, in order (blank lines and # comments skipped)."""
    series_file = layout.patches / "series"
    if not series_file.exists():
        return []
    names = [line.strip() for line in series_file.read_text().splitlines()]
    return [layout.patches / name for name in names if name and not name.startswith("#")]


def provenance(layout: Layout) -> dict:
    """The inputs a result depends on: the pin and each patch of the series, by sha256."""
    return {
        "pin_sha256": load_pin(layout.pin_file).digest,
        "patches": {path.name: _sha256(path) for path in series(layout)},
    }


def stale_reasons(layout: Layout, result: dict) -> list[str]:
    """Why `result` no longer describes the workspace (empty when it still does)."""
    then, now = result["provenance"], provenance(layout)
    reasons = []
    if then["pin_sha256"] != now["pin_sha256"]:
        reasons.append("pin.toml changed")
    for name in sorted(set(then["patches"]) | set(now["patches"])):
        if name not in now["patches"]:
            reasons.append(f"patches/{name} was removed")
        elif name not in then["patches"]:
            reasons.append(f"patches/{name} was added")
        elif then["patches"][name] != now["patches"][name]:
            reasons.append(f"patches/{name} changed")
    return reasons


def write(layout: Layout, kind: str, payload: dict) -> Path:
    """Write `payload` as profiles/<kind>-<UTC time>.json; an existing file is never replaced."""
    created = datetime.now(UTC).replace(microsecond=0)
    document = {
        "kind": kind,
        "schema": SCHEMA_VERSION,
        "created": created.isoformat().replace("+00:00", "Z"),
        "command": shlex.join(["python", "-m", "hostsync", *sys.argv[1:]]),
        "provenance": provenance(layout),
        **payload,
    }
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


def latest(layout: Layout, kind: str) -> Path | None:
    """The newest result of `kind`, or None when that session has not run yet."""
    found = sorted(layout.profiles.glob(f"{kind}-[0-9]*.json"), key=_sort_key)
    return found[-1] if found else None


_STAMP = re.compile(r"-(\d{8}T\d{6})Z(?:-(\d+))?$")


def _sort_key(path: Path) -> tuple[str, int]:
    match = _STAMP.search(path.stem)
    return (match[1], int(match[2] or 1)) if match else ("", 0)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
