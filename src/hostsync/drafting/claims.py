"""What a draft may claim about cost, given the fix's verdicts (`hostsync.measure.cost`).

A draft that says a read stalls ("waits for the device", "stall") where the accounting found no
stall saved, or says "faster" with no GPU figure to show it, claims what its figures do not
show; a fix whose reads were all free is drafted as a cleanup; a fix that costs more device work
is not drafted at all. Where no result carries a verdict (its ranks did not account), nothing
is judged here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.records import CostComparison, FixVerdict

STALL_CLAIM = re.compile(
    r"\bstall(?:s|ed|ing)?\b|\bwait(?:s|ed|ing)? for the (?:device|GPU|stream)\b"
    r"|\bdrains? the stream\b",
    re.IGNORECASE,
)
SPEED_CLAIM = re.compile(r"\bfaster\b|\bspeed-?ups?\b|\bspeeds? up\b", re.IGNORECASE)
CLEANUP_WORDS = re.compile(r"\bclean-?\s?up\b", re.IGNORECASE)


def check_claims(
    name: str, text: str, verdicts: Sequence[CostComparison], gpu_figures: bool
) -> None:
    """Refuse `text` (the draft `name`) where it claims more than `verdicts` show."""
    costly = [v for v in verdicts if v.judgement.verdict == FixVerdict.COSTS_MORE]
    if costly:
        raise WorkspaceError(
            f"{name}: the fix costs more ({_shown(costly[0])}): it is not drafted; redo it so"
            " that it adds no device work where the read it removes was free, or drop it"
        )
    speed = SPEED_CLAIM.search(text)
    if speed and not gpu_figures:
        raise WorkspaceError(
            f"{name} says {speed[0]!r} with no GPU figure: measure on a GPU (gpu/) and cite it,"
            " or say what the fix removes instead"
        )
    if not verdicts:
        return
    saves = any(v.judgement.verdict == FixVerdict.SAVES_STALLS for v in verdicts)
    stall = STALL_CLAIM.search(text)
    if stall and not saves:
        raise WorkspaceError(
            f"{name} says {stall[0]!r}, but no read it removes stalls ({_shown(verdicts[0])}):"
            " say what the fix removes, not that it waits for the device"
        )
    cleanup = all(v.judgement.verdict == FixVerdict.CLEANUP for v in verdicts)
    if cleanup and not CLEANUP_WORDS.search(text):
        raise WorkspaceError(
            f"{name}: the fix is a cleanup ({_shown(verdicts[0])}): draft it as one (say 'cleanup')"
        )


def _shown(compared: CostComparison) -> str:
    judgement = compared.judgement
    return (
        f"{compared.scenario} {compared.before} -> {compared.after}: {judgement.verdict},"
        f" {judgement.reason}"
    )
