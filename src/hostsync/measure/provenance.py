"""What a result depends on, and whether it still describes the workspace.

A result records, by sha256, pin.toml and the case card as parsed (comments do not count; nor
does the card's `[upstream]` table, which only the drafts read: refreshing what upstream knows
leaves every measurement standing), each patch of
the series and each of the case's scripts (what its ranks run, the snippet an issue quotes) as
they were when the run started, and the detector with its op table. When any of them changed
since, the result is stale: the drafts refuse it. The detector counts only for results whose
figures it counted (`Result.DETECTED`: repro, hunt, census, bench).
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
import tomllib
from pathlib import Path

from hostsync import detector
from hostsync.upstream.patchqueue import series
from hostsync.workspace.files import sha256
from hostsync.workspace.layout import Layout
from hostsync.workspace.records import Provenance, Result, Stamp

# What decides what a measuring run counts: the detector's engine, its op table, its accounting.
DETECTOR_FILES = tuple(
    Path(detector.__file__).with_name(f"{name}.py")
    for name in ("scope", "observer", "frames", "host", "kernels", "patches", "ops", "accounting")
)


def detector_digest() -> str:
    """One sha256 over the detector's files, in order."""
    digest = hashlib.sha256()
    for path in DETECTOR_FILES:
        digest.update(sha256(path).encode())
    return digest.hexdigest()


def card_digest(card: Path) -> str:
    """One sha256 over what a card tells a run: its tables as parsed, less `[upstream]` (the
    drafts' record of upstream's state, which no run reads); comments do not count."""
    told = tomllib.loads(card.read_text(encoding="utf-8"))
    told.pop("upstream", None)
    return _digest(told)


def pin_digest(pin: Path) -> str:
    """One sha256 over pin.toml as parsed: comments do not count."""
    return _digest(tomllib.loads(pin.read_text(encoding="utf-8")))


def _digest(told: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(told, sort_keys=True).encode()).hexdigest()


def inputs(layout: Layout) -> Provenance:
    """The case's inputs now: take them when a run starts, so an edit during it makes the
    result stale rather than invisible."""
    return Provenance(
        pin_sha256=pin_digest(layout.pin_file),
        case_sha256=card_digest(layout.case_file),
        patches={path.name: sha256(path) for path in series(layout)},
        scripts={path.name: sha256(path) for path in sorted(layout.repro.glob("*.py"))},
        detector_sha256=detector_digest(),
    )


def workspace_inputs(layout: Layout) -> Provenance:
    """What a result that belongs to no one case depends on: pin.toml (each case it judges
    records its own inputs beside)."""
    return Provenance(
        pin_sha256=pin_digest(layout.pin_file),
        case_sha256="",
        patches={},
        scripts={},
        detector_sha256=detector_digest(),
    )


def stamp(layout: Layout, measured: Provenance) -> Stamp:
    """The stamp of a result finished now, measured against `measured`."""
    command = shlex.join(["python", "-m", "hostsync", *_without_clones(sys.argv[1:])])
    return Stamp.now(command, layout.case, measured)


def _without_clones(argv: list[str]) -> list[str]:
    """The command's words with a local clone given to `--remote` written `CLONE`: results are
    committed, and where this machine keeps a clone is no one else's concern."""
    words = list(argv)
    for index, word in enumerate(words):
        if word.startswith("--remote="):
            words[index] = "--remote=CLONE"
        elif word == "--remote" and index + 1 < len(words) and "://" not in words[index + 1]:
            words[index + 1] = "CLONE"
    return words


def stale_reasons(layout: Layout, result: Result) -> list[str]:
    """Why `result` no longer describes the workspace (empty when it still does)."""
    if result.stamp.case != layout.case:
        return [f"it is a result of case {result.stamp.case}, not of {layout.case}"]
    then, now = result.stamp.provenance, inputs(layout)
    reasons = []
    if then.pin_sha256 != now.pin_sha256:
        reasons.append("pin.toml changed")
    if then.case_sha256 != now.case_sha256:
        reasons.append(f"cases/{layout.case}.toml changed")
    if result.DETECTED and then.detector_sha256 != now.detector_sha256:
        reasons.append("it was measured by another detector (src/hostsync/detector/)")
    for folder, old, new in (
        ("patches", then.patches, now.patches),
        ("repro", then.scripts, now.scripts),
    ):
        for name in sorted(set(old) | set(new)):
            where = f"{folder}/{layout.case}/{name}"
            if name not in new:
                reasons.append(f"{where} was removed")
            elif name not in old:
                reasons.append(f"{where} was added")
            elif old[name] != new[name]:
                reasons.append(f"{where} changed")
    return reasons
