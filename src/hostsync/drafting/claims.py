"""What a draft may claim about cost, given the fix's verdicts (`hostsync.measure.cost`).

A draft that says a read stalls ("waits for the device", "stall") where the accounting found no
stall removed, that says the fix saves a wait or idle time where the idle windows did not
shrink beyond their spread, that gives an idle time its verdicts do not hold, or says "faster"
with no GPU figure to show it, claims what its figures do not show. A figure stands with its
verdict: an idle time is cited only where it shrank beyond its spread, in a sentence that gives
that verdict and labels the figure "(host time, measured on CPU)"; one inside its spread is
never shown as a change. Where stalls drop but the windows do not shrink, the draft says that
the wait moves. A fix whose reads were all free is drafted as a cleanup; a fix that costs more
device work is not drafted at all. Where no result carries a verdict (its ranks did not
account), nothing is judged here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from hostsync.measure.records import CostComparison, FixVerdict
from hostsync.workspace.errors import WorkspaceError

STALL_CLAIM = re.compile(
    r"\bstall(?:s|ed|ing)?\b|\bwait(?:s|ed|ing)? for the (?:device|GPU|stream)\b"
    r"|\bdrains? the stream\b",
    re.IGNORECASE,
)
SPEED_CLAIM = re.compile(r"\bfaster\b|\bspeed-?ups?\b|\bspeeds? up\b", re.IGNORECASE)
CLEANUP_WORDS = re.compile(r"\bclean-?\s?up\b", re.IGNORECASE)
SAVING_CLAIM = re.compile(
    r"\bsav(?:es?|ed|ing)\b[^.\n]{0,40}?\b(?:waits?|stalls?|idle)\b", re.IGNORECASE
)
MOVES_SAID = re.compile(
    r"\bmoves?\s+the\s+wait\b|\bthe\s+wait\s+moves\b|\bwaits?\s+moved?\b", re.IGNORECASE
)
LABEL = "(host time, measured on CPU)"
# A time in microseconds, as drafts write idle figures.
MICROSECONDS = re.compile(r"(?<![\w.])(?P<us>\d[\d,]*(?:\.\d+)?) ?(?:us|µs)\b")
# Where a sentence ends: after its full stop, before the next one's capital, or at a blank line.
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(*])|\n\s*\n")
IDLE_CLAIM = re.compile(
    r"\bidles? while the host runs (?P<us>[\d,]+(?:\.\d+)?) (?:us|µs)(?P<label> \(host time,"
    r" measured on CPU\))?",
    re.IGNORECASE,
)


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
    judged = {v.judgement.verdict for v in verdicts}
    stall = STALL_CLAIM.search(text)
    if stall and not judged & {FixVerdict.SAVES_IDLE, FixVerdict.MOVES_WAIT}:
        raise WorkspaceError(
            f"{name} says {stall[0]!r}, but no read it removes stalls ({_shown(verdicts[0])}):"
            " say what the fix removes, not that it waits for the device"
        )
    saving = SAVING_CLAIM.search(text)
    if saving and FixVerdict.SAVES_IDLE not in judged:
        raise WorkspaceError(
            f"{name} says {saving[0]!r}, but the idle windows do not shrink beyond their spread"
            f" ({_shown(verdicts[0])}): say where the wait goes instead"
        )
    moved = [v for v in verdicts if v.judgement.verdict == FixVerdict.MOVES_WAIT]
    if moved and not MOVES_SAID.search(text):
        raise WorkspaceError(
            f"{name}: the stalls drop but the idle windows do not shrink beyond their spread"
            f" ({_shown(moved[0])}): say that the wait moves"
        )
    for claim in IDLE_CLAIM.finditer(text):
        _check_idle(name, claim, verdicts)
    for sentence in (" ".join(said.split()) for said in SENTENCE_END.split(text)):
        for figure in MICROSECONDS.finditer(sentence):
            _check_beside_verdict(name, sentence, figure["us"], verdicts)
    cleanup = all(v.judgement.verdict == FixVerdict.CLEANUP for v in verdicts)
    if cleanup and not CLEANUP_WORDS.search(text):
        raise WorkspaceError(
            f"{name}: the fix is a cleanup ({_shown(verdicts[0])}): draft it as one (say 'cleanup')"
        )


def _check_idle(name: str, claim: re.Match[str], verdicts: Sequence[CostComparison]) -> None:
    """An idle time in a draft is one of its verdicts' figures, labelled as host time."""
    if not claim["label"]:
        raise WorkspaceError(
            f"{name} says {claim[0]!r}: label it as its verdict is,"
            " 'N us (host time, measured on CPU)'"
        )
    figures = {us for v in verdicts for us in v.judgement.idle_us}
    if float(claim["us"].replace(",", "")) not in figures:
        shown = ", ".join(f"{us:g}" for us in sorted(figures)) or "none"
        raise WorkspaceError(
            f"{name} says the host runs {claim['us']} us, which no verdict measured (idle per"
            f" step: {shown}): write the figure from the result, with a placeholder"
        )


def _check_beside_verdict(
    name: str, sentence: str, said: str, verdicts: Sequence[CostComparison]
) -> None:
    """An idle figure of a verdict stands in a sentence that gives that verdict, labelled as
    host time; one whose windows did not shrink beyond their spread stands nowhere."""
    us = float(said.replace(",", ""))
    owners = [v for v in verdicts if us in v.judgement.idle_us or us == v.judgement.idle_spread_us]
    if not owners:
        return
    saving = [v for v in owners if v.judgement.verdict == FixVerdict.SAVES_IDLE]
    if not saving:
        raise WorkspaceError(
            f"{name} cites {said} us, an idle time inside its spread ({_shown(owners[0])}):"
            " a figure inside its spread is never a change: cite none, say that the wait moves"
        )
    verdict = saving[0].judgement.verdict
    if LABEL not in sentence or verdict.value not in sentence.lower():
        raise WorkspaceError(
            f"{name} cites {said} us away from its verdict: give it in a sentence that says"
            f" {verdict.value!r}, labelled {LABEL!r}"
        )


def _shown(compared: CostComparison) -> str:
    judgement = compared.judgement
    return (
        f"{compared.scenario} {compared.before} -> {compared.after}: {judgement.verdict},"
        f" {judgement.reason}"
    )
