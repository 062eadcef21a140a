"""A census run: every setup of census.toml on the newest release each case pins. Each runs as
published (today) and with every carried fix (fixed): one hunt record per setup and column."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence

from packaging.version import Version

from hostsync.census import setups
from hostsync.census.records import CensusResult, CensusTrees
from hostsync.census.report import FIXED
from hostsync.census.setups import Matrix
from hostsync.detector.sites import AllowRule
from hostsync.launch import devices, launchers, processes, trainer_step
from hostsync.launch.launchers import LaunchPlan
from hostsync.launch.processes import RankResults, RunFailed, read_ranks
from hostsync.measure.provenance import detector_digest, pin_digest
from hostsync.sites.known import carried_rules, host_memory_args, load_known_sites
from hostsync.sites.records import HuntTree, TrainerRank
from hostsync.sites.summary import rank_records, steady_cost, summarize
from hostsync.upstream.patchqueue import series
from hostsync.upstream.trees import Tree, by_project, stack_trees
from hostsync.workspace.cases import Case
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.files import sha256
from hostsync.workspace.layout import Layout
from hostsync.workspace.projects import DEFAULT_SETUP, trainer_project
from hostsync.workspace.records import Device, Provenance, Stamp

# The folder of profiles/ the census writes into, and the name its results are stamped with.
CENSUS = "census"
# The tree under test: the project of the Trainer, whose tree the ranks import first and check.
TREE_UNDER_TEST = trainer_project()


def census_cases(everyone: Sequence[Case]) -> list[Case]:
    """The cases pinning the newest release any case pins of their project, the tree under
    test's first: what the fixed column applies. An older pin (a bug fixed since) is left out."""
    newest: dict[str, Version] = {}
    for case in everyone:
        version = Version(case.pin.version)
        newest[case.project.name] = max(newest.get(case.project.name, version), version)
    found = [c for c in everyone if Version(c.pin.version) == newest[c.project.name]]
    if not any(c.project.name == TREE_UNDER_TEST for c in found):
        raise WorkspaceError(f"no case pins {TREE_UNDER_TEST}: the census needs its release")
    found.sort(key=lambda c: c.project.name != TREE_UNDER_TEST)
    return found


def column_tree(layout: Layout, stacked: list[Case], column: str) -> tuple[Tree, CensusTrees]:
    """The column's tree under test with the other projects' trees beside it: one case per
    project as published (today), or every case's series (fixed)."""
    fixed = column == FIXED
    if not fixed:
        stacked = [group[0] for group in by_project(stacked)]
    first, *others = stack_trees(layout, stacked, fixes=fixed)
    tree = dataclasses.replace(first, stacked=tuple(other.src for other in others))
    described = CensusTrees(
        tree=first.info(layout.root),
        stacked=tuple(other.info(layout.root) for other in others),
        cases=tuple(case.name for case in stacked) if fixed else (),
    )
    return tree, described


def run_census(
    layout: Layout,
    matrix: Matrix,
    columns: list[str],
    stacked: list[Case],
    everyone: Sequence[Case],
    timeout: float,
    started: float,
) -> CensusResult:
    rules = load_known_sites(layout.known_sites).allow
    carried = carried_rules(everyone)
    measured_against = inputs(layout, stacked)
    runs, described, python = [], {}, ""
    for column in columns:
        tree, described[column] = column_tree(layout, stacked, column)
        python = tree.python
        device = devices.resolve_device(
            "auto", max(s.ranks for s in matrix.setups.values()), tree.python
        )
        runs += run_column(layout, tree, column, matrix, device, timeout, rules, carried)
    return CensusResult(
        stamp=Stamp.now(
            " ".join(["python", "-m", "hostsync", *sys.argv[1:]]), CENSUS, measured_against
        ),
        environment=devices.describe(python),
        steps=matrix.steps,
        setups=matrix.setups,
        columns=described,
        allowlist=rules,
        runs=tuple(runs),
        wall_s=round(time.monotonic() - started, 1),
    )


def run_column(
    layout: Layout,
    tree: Tree,
    column: str,
    matrix: Matrix,
    device: Device,
    timeout: float,
    rules: tuple[AllowRule, ...],
    carried: tuple[AllowRule, ...],
) -> list[HuntTree]:
    """Every setup on `tree`: the forked ones from one import of the worker, the SP ones each
    through the launcher that sets SP up; a setup that fails is kept with its error."""
    run = processes.Run(layout.new_run_dir(f"census-{column}"), tree, layout)
    worker = trainer_step.WORKER
    forked = {
        n: s for n, s in matrix.setups.items() if launchers.LAUNCHERS[setups.launcher(s)].forks
    }
    host_memory = host_memory_args(rules)
    worlds = tuple(setups.world(s, matrix.steps, run.run_dir, host_memory) for s in forked.values())
    what = LaunchPlan(worker, worlds, device, timeout)
    outcomes = dict(
        zip(
            forked,
            launchers.run_each_world(setups.FORKED, run, what) if worlds else [],
            strict=True,
        )
    )
    for name, setup in matrix.setups.items():
        if name in forked:
            continue
        alone = dataclasses.replace(run, run_dir=run.run_dir / name)
        what = LaunchPlan(
            worker,
            (setups.world(setup, matrix.steps, alone.run_dir, host_memory),),
            device,
            timeout,
            deepspeed=setups.deepspeed(setup) or DEFAULT_SETUP,  # read by DeepSpeed's launch
        )
        (outcomes[name],) = launchers.run_each_world(setups.launcher(setup), alone, what)
    return [
        hunted(layout, tree, column, name, outcomes[name], rules, carried) for name in matrix.setups
    ]


def hunted(
    layout: Layout,
    tree: Tree,
    column: str,
    name: str,
    outcome: RankResults | RunFailed,
    rules: tuple[AllowRule, ...],
    carried: tuple[AllowRule, ...],
) -> HuntTree:
    """One setup's run in one column as the hunt records a tree: its sites, or its error. The
    ranks' raw step events stay out: the report and the heat map need only the per-site rates and
    the steady cost, and every setup's events would make the result megabytes."""
    record = HuntTree(
        label=f"{name} {column}",
        tree=column,
        setup=name,
        info=tree.info(layout.root),
        stacked=tuple(str(path.relative_to(layout.root.resolve())) for path in tree.stacked),
        seconds=0.0,
    )
    if isinstance(outcome, RunFailed):
        return dataclasses.replace(record, error=str(outcome))
    trained = read_ranks(outcome, TrainerRank)
    ranks = rank_records(trained)
    not_judged = next((r.hunt.not_judged for r in ranks if r.hunt.not_judged), None)
    if not_judged:
        return dataclasses.replace(record, not_judged=not_judged)
    return dataclasses.replace(
        record,
        seconds=max(result.seconds for result in trained),
        sites=tuple(summarize(ranks, rules, carried)),
        cost=steady_cost(ranks),
    )


def inputs(layout: Layout, stacked: list[Case]) -> Provenance:
    """What a census result depends on: pin.toml, census.toml, the series it stacks and the
    worker, by sha256."""
    return Provenance(
        pin_sha256=pin_digest(layout.pin_file),
        case_sha256=sha256(layout.root / setups.FILE),
        patches={
            f"{case.name}/{patch.name}": sha256(patch)
            for case in stacked
            for patch in series(case.layout)
        },
        scripts={trainer_step.WORKER.name: sha256(trainer_step.WORKER)},
        detector_sha256=detector_digest(),
    )
