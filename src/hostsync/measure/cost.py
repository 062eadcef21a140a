"""A fix's verdict from what it does to the device: stalls saved against device work added.

A maintainer judges a fix by what it saves against what it adds, and a GPU pays for stalls, not
for reads (`hostsync.detector.accounting`). From the cost before and after, per step:

- *saves stalls*: stalls down, device work (kernels, bytes, FLOPs) up by no more than the bound:
  bytes and FLOPs by at most 1 %, kernels by at most 1 % or a few small ones per stall saved (a
  stall idles the device for a launch latency and the host's time to queue the next work; a small
  kernel runs for about as long as it takes to launch);
- *cleanup*: reads down, no stall saved, work within the bound;
- *costs more*: device work up beyond the bound (whether or not it saves a stall);
- *no change*: none of these.
"""

from __future__ import annotations

from collections.abc import Sequence

from hostsync.detector.records import Cost
from hostsync.measure import provenance
from hostsync.workspace import results, table
from hostsync.workspace.layout import Layout
from hostsync.workspace.records import (
    CostComparison,
    FixAssessment,
    FixVerdict,
    ReproResult,
    ScenarioRow,
)

# How much more device work per step a fix may add and still be judged by its stalls alone.
WORK_BOUND = 0.01
KERNELS_PER_STALL = 4
BOUND = (
    f"bytes and FLOPs per step up by at most {WORK_BOUND:.0%}, kernels by at most"
    f" {WORK_BOUND:.0%} or {KERNELS_PER_STALL} per stall saved"
)


def assess(before: Cost, after: Cost) -> FixAssessment:
    """The verdict of going from `before` to `after`, with the per-step figures it rests on."""

    def per_step(cost: Cost) -> tuple[float, ...]:
        work = cost.work
        figures = (cost.reads, cost.stalls, work.kernels, work.bytes, work.flops)
        return tuple(round(figure / cost.steps, 3) for figure in figures)

    reads, stalls, kernels, moved, flops = zip(per_step(before), per_step(after), strict=True)
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
    if grown:
        verdict = FixVerdict.COSTS_MORE
        reason = f"{' and '.join(grown)} up beyond the bound" + (
            f", though it saves {saved:g} stall(s) per step" if saved > 0 else ", no stall saved"
        )
    elif saved > 0:
        verdict, reason = FixVerdict.SAVES_STALLS, f"{saved:g} stall(s) per step saved"
    elif reads[1] < reads[0]:
        verdict = FixVerdict.CLEANUP
        reason = f"{reads[0] - reads[1]:g} read(s) per step fewer, each free: no stall saved"
    else:
        verdict, reason = FixVerdict.NO_CHANGE, "neither stalls nor reads down"
    return FixAssessment(verdict, reads, stalls, kernels, moved, flops, BOUND, reason)


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


COLUMNS = ("scenario", "ranks", "trees", "reads/step", "stalls/step", "kernels/step", "verdict")


def verdict_table(comparisons: Sequence[CostComparison]) -> str:
    """One line per fix compared, the bound it was held to below."""
    rows = [
        [
            c.scenario,
            c.ranks,
            f"{c.before} -> {c.after}",
            *(
                f"{old:g} -> {new:g}"
                for old, new in (c.judgement.reads, c.judgement.stalls, c.judgement.kernels)
            ),
            f"{c.judgement.verdict}: {c.judgement.reason}",
        ]
        for c in comparisons
    ]
    return f"{table.text(COLUMNS, rows)}\nper step, every rank's together; verdict bound: {BOUND}"


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
