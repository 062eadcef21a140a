"""The words every report uses, each with one meaning, and the labels made of them.

A reader trips on a loose word more than on a figure. "Reads" held copies, "waits" were
stalls, and a site's disposition was a "verdict". So each word is defined here once. Every
renderer prints its figures under these labels. tests/test_words.py renders the reference set
and refuses any other. docs/glossary.md says the same words at length.
"""

from __future__ import annotations

# The words, each with the one thing it means.
WORDS = {
    "read": "a device-to-host value read",
    "copy": "a blocking host-to-device copy",
    "wait": "a read or a copy",
    "stall": "a wait with device work queued",
    "free": "a wait with none queued",
    "window": "the idle time after a stall",
    "disposition": "what a site is to us",
    "verdict": "a fix's judgement only",
}

# Per step: one rank's count in one step after the warm-up, the mean over ranks and steps.
PER_STEP = "per rank per step after the warm-up"
WAITS = "waits/step"
STALLS = "stalls/step"
COPIES = "copies/step"
KERNELS = "kernels/step"
# Idle time per step is the median over the steps; a site's is the mean of its windows.
IDLE_MEDIAN = "median idle us/step"
IDLE_MEAN = "mean idle us/step"
WINDOW_MEDIAN = "median window us"
# The most waits one rank made at a site in one step.
MOST_WAITS = "most waits in a step"
DISPOSITION = "disposition"
VERDICT = "verdict"

# Each label that counts, with what it counts.
LABELS = {
    WAITS: f"reads and blocking copies, {PER_STEP}, the mean",
    STALLS: f"waits with device work queued, {PER_STEP}, the mean",
    COPIES: f"blocking copies to the device, {PER_STEP}, the mean",
    KERNELS: f"device operations (counted on CPU, as a GPU would launch them), {PER_STEP}",
    IDLE_MEDIAN: "the windows of a step summed, host us measured on CPU, the median over steps",
    IDLE_MEAN: f"a site's windows summed, host us measured on CPU, {PER_STEP}, the mean",
    WINDOW_MEDIAN: "one window of a site, host us measured on CPU, the median",
    MOST_WAITS: "the most waits one rank made at the site in one step",
    DISPOSITION: WORDS["disposition"],
    "reads": WORDS["read"] + "s",
    "not accepted": f"waits the known sites do not accept, {PER_STEP}, the mean",
    VERDICT: WORDS["verdict"],
    "waits": "reads and blocking copies",
    "copies": WORDS["copy"],
    "stalls": WORDS["stall"],
    "free": WORDS["free"],
    "kernels": "device operations (counted on CPU, as a GPU would launch them)",
    "median idle us": "the windows of a step summed, host us measured on CPU, the median",
    "collectives": "collective operations launched on the device",
    "bytes": "bytes the device operations move",
    "FLOPs": "floating-point operations of the device operations",
    "host s": "host seconds a step took, with the detector",
    "run s": "seconds a run took",
    "hunt run (s)": "seconds a hunt run took",
    "waited-for kernels/step": f"device operations a site's stalls waited for, {PER_STEP}",
}

# The headers that name a thing rather than count one.
NAMES = frozenset(
    {
        "#",
        "across trees",
        "added by",
        "after last",
        "before first",
        "case",
        "change",
        "code",
        "commit",
        "compared",
        "contiguous",
        "ended",
        "error",
        "file",
        "first",
        "function",
        "host ran in the windows",
        "kinds",
        "last",
        "origin",
        "package",
        "per rank per step",
        "ran",
        "rank",
        "ranks",
        "reading",
        "reads since",
        "reason",
        "release",
        "removed by",
        "result",
        "scenario",
        "setup",
        "setups",
        "site",
        "stacked",
        "step",
        "steps",
        "tests",
        "tree",
        "trees",
        "uploaded",
        "via",
        "what",
        "what to do",
        "when",
        "where",
        "Trainer step",
        "loss with SP",
        "loss without SP",
        "|diff|",
    }
)

# What follows a label to say which figures it holds: a column, all ranks, a sum.
QUALIFIERS = ("(all ranks)", "sum", "->")

# Words that may count something per step in prose: the words above, and what the device does.
COUNTED = frozenset(
    {
        "read",
        "reads",
        "copy",
        "copies",
        "wait",
        "waits",
        "stall",
        "stalls",
        "free",
        "window",
        "windows",
        "us",
        "kernels",
        "collectives",
        "bytes",
        "FLOPs",
        "s",
        "work",
        "time",
        "idle",
    }
)


def figures_line(
    waits: str, copies: str, stalls: str, idle_us: str, kernels: str, seconds: str
) -> str:
    """A run's figures per step in one line, as the scan's summary prints them."""
    return (
        f"{PER_STEP} (the mean): {waits} waits ({copies} of them copies to the device),"
        f" {stalls} stalls, {idle_us} us idle after them (the median; host time, measured on"
        f" CPU), {kernels} kernels of device work, {seconds} s on the host (with the detector)"
    )
