"""A fix's verdict from what it does to the device: idle time saved against device work added.

A maintainer judges a fix by what it saves against what it adds. A GPU pays for a wait with the
window after it, idle until the host launches its next kernel (`hostsync.detector.accounting`);
a removed wait often just moves: the next wait takes its work, and the window after that one
grows. From the cost before and after, per step:

- *costs more*: device work up beyond the bound (whether or not it saves anything): bytes and
  FLOPs by more than 1 %, kernels by more than 1 % or a few small ones per stall saved (a small
  kernel runs for about as long as it takes to launch);
- *saves idle time*: stalls down, and the idle windows per step (their median over the steps
  judged; the first step, which pays first-call costs, left out where three or more were
  measured) drop by more than they spread from step to step in either tree, and by more than a
  kernel launch takes (a fix that removes no stall leaves every window where it was);
- *moves the wait*: stalls down, but the windows do not shrink beyond their spread;
- *cleanup*: waits down, no stall saved;
- *no change*: none of these.

Idle time is host time measured on CPU: a verdict on it says where the host keeps a GPU idle,
not how long a GPU takes.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from hostsync.detector.records import Cost
from hostsync.detector.words import counted
from hostsync.measure import provenance
from hostsync.measure.records import (
    CostComparison,
    FixAssessment,
    FixVerdict,
    ReproResult,
    ScenarioRow,
)
from hostsync.workspace import results, table
from hostsync.workspace.layout import Layout
from hostsync.workspace.vocabulary import IDLE_MEDIAN, KERNELS, STALLS, VERDICT, WAITS

# How much more device work per step a fix may add and still be judged by its waits alone.
WORK_BOUND = 0.01
KERNELS_PER_STALL = 4
# A drop in idle time below this (us) is within what a kernel launch costs: not a saving.
IDLE_FLOOR_US = 10.0
BOUND = (
    f"bytes and FLOPs per step up by at most {WORK_BOUND:.0%}, kernels by at most"
    f" {WORK_BOUND:.0%} or {KERNELS_PER_STALL} per stall saved"
)


def judged_steps(cost: Cost) -> tuple[float, ...]:
    """The idle time of each step a verdict judges: every step's, less the first where three or
    more were measured."""
    return cost.idle_us[1:] if len(cost.idle_us) >= 3 else cost.idle_us


def idle_per_step(cost: Cost) -> tuple[float, float | None]:
    """The median of the judged steps' idle time, and how far they spread (None for one step;
    a region that marked no step gives its mean)."""
    steps = judged_steps(cost)
    if not steps:
        return 0.0, None
    if len(steps) == 1:
        return round(steps[0] / cost.steps, 1), None
    spread = max(steps) - min(steps) if len(steps) > 1 else None
    return round(statistics.median(steps), 1), spread


def assess(before: Cost, after: Cost) -> FixAssessment:
    """The verdict of going from `before` to `after`, with the per-step figures it rests on."""

    def per_step(cost: Cost) -> tuple[float, ...]:
        work = cost.work
        figures = (cost.reads, cost.stalls, work.kernels, work.bytes, work.flops)
        return tuple(round(figure / cost.steps, 3) for figure in figures)

    reads, stalls, kernels, moved, flops = zip(per_step(before), per_step(after), strict=True)
    (idle_before, spread_before), (idle_after, spread_after) = map(idle_per_step, (before, after))
    spread = (
        None
        if spread_before is None or spread_after is None
        else round(max(spread_before, spread_after), 1)
    )
    idle = (idle_before, idle_after)
    saved = stalls[0] - stalls[1]
    allowed = {
        "kernels": max(kernels[0] * WORK_BOUND, KERNELS_PER_STALL * saved),
        "bytes": moved[0] * WORK_BOUND,
        "FLOPs": flops[0] * WORK_BOUND,
    }
    grown = [
        name
        for name, (old, new) in (("kernels", kernels), ("bytes", moved), ("FLOPs", flops))
        if new - old > allowed[name]
    ]
    windows = f"idle {idle_before:g} -> {idle_after:g} us per step (host time, measured on CPU)"
    if grown:
        verdict = FixVerdict.COSTS_MORE
        reason = f"{' and '.join(grown)} up beyond the bound" + (
            f", though it saves {counted(saved, 'stall')} per step"
            if saved > 0
            else ", no stall saved"
        )
    elif saved > 0 and spread is not None and idle_before - idle_after > max(spread, IDLE_FLOOR_US):
        verdict = FixVerdict.SAVES_IDLE
        reason = f"{windows}, a drop beyond the spread of {spread:g} us between steps"
    elif saved > 0:
        verdict = FixVerdict.MOVES_WAIT
        if not (before.idle_us and after.idle_us):
            beyond = "idle time not measured"
        elif spread is None:
            beyond = "one step measured, no spread to judge by"
        else:
            beyond = f"within the spread of {spread:g} us between steps"
        reason = f"{counted(saved, 'stall')} per step fewer, but {windows}, {beyond}"
    elif reads[1] < reads[0]:
        verdict = FixVerdict.CLEANUP
        reason = f"{counted(reads[0] - reads[1], 'wait')} per step fewer, each free: no stall saved"
    else:
        verdict, reason = FixVerdict.NO_CHANGE, "neither waits nor stalls down"
    return FixAssessment(verdict, reads, stalls, kernels, moved, flops, BOUND, reason, idle, spread)


def compare_costs(runs: Sequence[ScenarioRow]) -> list[CostComparison]:
    """For each (launch, ranks, scenario) the first tree's cost against each other tree's (all
    ranks together), where the ranks reported their cost."""
    groups: dict[tuple[str, int, str], list[ScenarioRow]] = {}
    for run in runs:
        if run.costs:
            groups.setdefault((run.launch, run.ranks, run.scenario), []).append(run)
    return [
        CostComparison(launch, ranks, scenario, first.tree, run.tree, assess(first.cost, run.cost))
        for (launch, ranks, scenario), (first, *others) in groups.items()
        for run in others
    ]


COLUMNS = ("scenario", "ranks", "trees", WAITS, STALLS, IDLE_MEDIAN, KERNELS, VERDICT)


def verdict_table(comparisons: Sequence[CostComparison]) -> str:
    """One line per fix compared, the bound it was held to below."""
    rows = [
        [
            c.scenario,
            c.ranks,
            f"{c.before} -> {c.after}",
            *(
                f"{old:g} -> {new:g}"
                for old, new in (
                    c.judgement.reads,
                    c.judgement.stalls,
                    c.judgement.idle_us,
                    c.judgement.kernels,
                )
            ),
            f"{c.judgement.verdict}: {c.judgement.reason}",
        ]
        for c in comparisons
    ]
    return (
        f"{table.text(COLUMNS, rows)}\nper step, every rank's together; idle: host time after the"
        f" stalls until the next kernel, measured on CPU; verdict bound: {BOUND}"
    )


def case_verdicts(layout: Layout) -> str:
    """The case's fix verdicts from its newest repro result, or why there are none."""
    path = results.latest(layout.profiles, ReproResult)
    rerun = f"run `nox -s repro -- --case {layout.case}`"
    if path is None:
        return f"fix verdict: no repro result yet; {rerun}"
    result = results.read(path, ReproResult)
    stale = provenance.stale_reasons(layout, result)
    if stale:
        return f"fix verdict: {path.name} is stale ({', '.join(stale)}); {rerun}"
    verdicts = result.verdicts
    if not verdicts:
        return f"fix verdict: {path.name} holds no costs (its ranks did not account)"
    return f"fix verdicts, from {path.name}:\n{verdict_table(verdicts)}"
