"""The hunt's measurement: the SP Trainer run under the detector and the profiler, per tree and
DeepSpeed setup, summed up into sites.

The ranks record (`rank/workers/trainer.py`) every host sync of steps 1..N with the detector, each
step from fetching its batch to the end of its logging, and one later step with the PyTorch
profiler, which also sees reads made inside C++ kernels. The site layer sums those records into
sites (`hostsync.sites.summary`); here is what only the profiler saw.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hostsync.detector.sites import AllowRule
from hostsync.launch import trainer_step
from hostsync.launch.nodes import SINGLE, NodeLayout, shares_of
from hostsync.launch.processes import DEFAULT_TIMEOUT_S, RunFailed, read_ranks
from hostsync.sites.known import host_memory_args
from hostsync.sites.records import (
    CrossCheck,
    HuntPlan,
    HuntRank,
    HuntTree,
    ProfilerOnly,
    TrainerRank,
)
from hostsync.sites.summary import package, rank_records, steady_cost, summarize
from hostsync.upstream.trees import Tree
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import Layout
from hostsync.workspace.projects import DEFAULT_SETUP, DeepSpeedSetup
from hostsync.workspace.records import NodeShare

LOGGING_STEPS = 3


def hunt_plan(steps: int, logging_steps: int) -> HuntPlan:
    """Which steps the detector watches and which one the profiler watches, and its twin.

    The detector watches steps 1..`steps`. The profiler watches the next logging step alone (the
    detector's own re-dispatch would show in its trace); its `twin` is the watched step one
    common period earlier, in the same phase of both the logging cycle and the SP data refill
    (every `SP_SIZE` steps), so the two see the same kinds of work.
    """
    period = math.lcm(logging_steps, trainer_step.SP_SIZE)
    profile = (steps // logging_steps + 1) * logging_steps
    twin = profile - period
    if twin < 2:
        fewest = math.ceil((period + 2) / logging_steps) * logging_steps - logging_steps
        raise WorkspaceError(
            f"--steps {steps} is too few: the profiled step {profile} needs a watched twin"
            f" {period} steps earlier, after the warm-up step; use --steps {fewest} or more"
        )
    return HuntPlan(steps=steps, logging_steps=logging_steps, profile=profile, twin=twin)


@dataclass(frozen=True)
class HuntOutcome:
    """One hunted Trainer run: its plan, each rank's record, and which node ran which ranks."""

    plan: HuntPlan
    ranks: list[HuntRank]
    nodes: tuple[NodeShare, ...]


def hunt_run(
    layout: Layout,
    tree: Tree,
    steps: int,
    logging_steps: int = LOGGING_STEPS,
    timeout: float = DEFAULT_TIMEOUT_S,
    setup: DeepSpeedSetup = DEFAULT_SETUP,
    nodes: NodeLayout = SINGLE,
    host_memory: Sequence[str] = (),
) -> HuntOutcome:
    """The SP Trainer run under the sync detector and the profiler.

    Logging every 3 steps while SP refills data every 2: a site tied to either cycle shows as such.
    """
    plan = hunt_plan(steps, logging_steps)
    results = trainer_step.run_trainer(
        layout,
        tree,
        sp=True,
        steps=plan.profile,
        logging_steps=logging_steps,
        worker_args=[
            "--detect-steps",
            str(steps),
            "--profile-step",
            str(plan.profile),
            *host_memory,
        ],
        timeout=timeout,
        setup=setup,
        nodes=nodes,
    )
    ranks = rank_records(read_ranks(results, TrainerRank))
    return HuntOutcome(plan, ranks, shares_of(f"{tree.label} {setup.label}", results))


# --- what only the profiler saw ----------------------------------------------------------------


def profiler_only(ranks: Sequence[HuntRank], twin: int) -> list[ProfilerOnly]:
    """The profiled step's scalar reads the detector did not see in the twin step.

    Matched per (file, function): the profiler names a function by its first line, not the
    line of the call. A surplus made inside a kernel (`via`) is a read no dispatch mode sees.
    """
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for rank in ranks:
        detected: Counter[tuple[str, str]] = Counter()
        for step in rank.hunt.steps:
            if step.step == twin:
                for seen in step.sites:
                    if seen.kind == "scalar_read":
                        detected[(seen.site.file, seen.site.function)] += seen.count
        profiled: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        for read in rank.hunt.profiled:
            profiled[(read.file, read.function)][read.via or ""] += read.count
        for (file, function), by_via in profiled.items():
            surplus = sum(by_via.values()) - detected[(file, function)]
            if surplus <= 0:
                continue
            vias = sorted(via for via in by_via if via) or ["(Python level, missed)"]
            entry = found.setdefault(
                (file, function),
                {
                    "package": package(file),
                    "file": file,
                    "function": function,
                    "via": ", ".join(vias),
                    "count": 0,
                    "ranks": (),
                },
            )
            entry["count"] = max(entry["count"], surplus)
            entry["ranks"] += (rank.rank,)
    return sorted(
        (ProfilerOnly(**entry) for entry in found.values()),
        key=lambda e: (-e.count, e.file, e.function),
    )


def cross_check(ranks: Sequence[HuntRank], twin: int) -> list[CrossCheck]:
    """Per rank: the reads the profiler saw in its step against the detector's twin. Both see
    a read inside an op (`masked_fill_` with a tensor value, a fused optimizer's step) too: the
    profiler names the op, the detector the dispatch of its line. The profiler also sees the
    scalar reads of host memory, which the detector counts apart (no wait on a GPU)."""
    return [
        CrossCheck(
            rank=rank.rank,
            profiler=sum(read.count for read in rank.hunt.profiled),
            detector=sum(
                sum(site.count for site in step.sites if site.kind == "scalar_read")
                + step.host_reads
                for step in rank.hunt.steps
                if step.step == twin
            ),
        )
        for rank in ranks
    ]


def hunt_tree(
    layout: Layout,
    tree: Tree,
    steps: int,
    rules: tuple[AllowRule, ...],
    timeout: float,
    setup: DeepSpeedSetup = DEFAULT_SETUP,
    carried: tuple[AllowRule, ...] = (),
    nodes: NodeLayout = SINGLE,
) -> HuntTree:
    """One tree's hunt in one DeepSpeed setup: its sites, the profiler-only reads, and every
    rank's raw record, labelled `<tree> <setup>`.

    A failed run is kept as the tree's `error`, so that one tree that cannot run (a release
    needing newer dependencies than the pin) does not throw away the others' results.
    """
    started = time.monotonic()
    hunted = HuntTree(
        label=f"{tree.label} {setup.label}",
        tree=tree.label,
        setup=setup.label,
        info=tree.info(layout.root),
        stacked=tuple(str(path.relative_to(layout.root.resolve())) for path in tree.stacked),
        seconds=0.0,
    )
    try:
        run = hunt_run(
            layout,
            tree,
            steps,
            LOGGING_STEPS,
            timeout=timeout,
            setup=setup,
            nodes=nodes,
            host_memory=host_memory_args(rules),
        )
    except RunFailed as error:
        seconds = round(time.monotonic() - started, 1)
        return dataclasses.replace(hunted, seconds=seconds, error=str(error))
    return dataclasses.replace(
        hunted,
        seconds=round(time.monotonic() - started, 1),
        plan=run.plan,
        sites=tuple(summarize(run.ranks, rules, carried)),
        cost=steady_cost(run.ranks),
        profiler_only=tuple(profiler_only(run.ranks, run.plan.twin)),
        cross_check=tuple(cross_check(run.ranks, run.plan.twin)),
        ranks=tuple(run.ranks),
        nodes=run.nodes,
    )
