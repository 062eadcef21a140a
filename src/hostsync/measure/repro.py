"""`python -m hostsync repro`: a case's reproducer on real processes, tree by tree.

The case card says how: each `[[repro.launch]]` names a script of `repro/<case>/`, its launcher
(`python`, `fork`, `torchrun` or `accelerate`, see `hostsync.launch.launchers`), the rank counts to
run it at and its scenarios. Every (tree, launch, rank count) is one run; `fork` starts the ranks of
all of a launch's rank counts from one import of the script (`hostsync.rank.prefork`). A rank script
takes `--scenarios a,b --device D` (and `--no-detector`, to time the detector) and returns a
`rank.records.ReproRank`, one `RankRow` per scenario: `scenario`, the figures, site lists
(`SiteCount`s by figure name), and `problems`, what the rank found wrong (a loss off its
reference, say). The
ranks' rows are merged here (`merge_ranks`): a site list by line; a figure every rank agrees on is
kept as it is; where they differ, the row holds the largest number (or all() of flags, or each
rank's message) and every rank's value beside it, and the report says so.

With `--trainer`, `trainer` holds per tree the full Trainer path's per-step losses with and
without SP (`trainer_step.compare_losses`). The card's `compare` keys are compared across trees:
for each (launch, rank count, scenario), whether every tree gave the value the first one gave
(the fix must not change the loss, say).

Writes `profiles/<case>/repro-<stamp>.json` (`records.ReproResult`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from hostsync.detector.codec import Json, RecordError
from hostsync.detector.sites import SiteCount
from hostsync.launch import devices, launchers, processes, trainer_step
from hostsync.launch.launchers import LaunchPlan, Snippet, World
from hostsync.launch.nodes import SINGLE, NodeLayout, node_0_first, shares_of
from hostsync.launch.processes import RankResults, Run, RunFailed, run_group
from hostsync.measure import cost, provenance
from hostsync.measure.records import Comparison, MergedSite, ReproResult, ScenarioRow, SnippetRuns
from hostsync.rank.protocol import free_port
from hostsync.rank.records import RankRow, ReproRank, SnippetExit
from hostsync.upstream.trees import Tree, infos, prepare_trees
from hostsync.workspace.cases import Case, Launch
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.files import sha256
from hostsync.workspace.layout import Layout
from hostsync.workspace.records import Device, NodeShare
from hostsync.workspace.values import comma_list

T = TypeVar("T")


@dataclass(frozen=True)
class TreeLaunch:
    """One tree's share of a launch: (ranks, device, each rank's result) per rank count, and the
    seconds it took (its fork's, where trees share an interpreter)."""

    runs: list[tuple[int, Device, RankResults]]
    seconds: float


def launch_trees(
    layout: Layout,
    trees: Sequence[Tree],
    spec: Launch,
    counts: Sequence[int],
    scenarios: Sequence[str],
    *,
    device: str,
    timeout: float,
    detector: bool = True,
    env: Mapping[str, str] | None = None,
    nodes: NodeLayout = SINGLE,
    snippets: Mapping[str, IssueSnippet] | None = None,
) -> list[TreeLaunch]:
    """A launch on each of `trees` (of one environment) at each rank count of `counts`.

    Each rank count gets its own device (`auto` uses GPUs only where there is one per rank on
    each machine); the rank counts that share a device go to the launcher together (`fork` runs
    them all from one import of its script, and then the tree's snippet of `snippets`, where its
    device is theirs). Several trees of a `fork` launch on one machine share one interpreter
    (`launchers.fork_trees`); other launches run tree after tree. Run folders are removed after
    a success and kept, with the launcher log and the failing rank's traceback, after a failure.
    """
    script = layout.repro / spec.script
    by_device: dict[Device, list[int]] = {}
    for ranks in counts:
        used = devices.resolve_device(device, nodes.ranks_here(ranks), trees[0].python)
        by_device.setdefault(used, []).append(ranks)
    done: list[dict[int, tuple[Device, RankResults]]] = [{} for _ in trees]
    seconds = [0.0] * len(trees)
    for used, group in by_device.items():
        args = ("--scenarios", ",".join(scenarios), "--device", used.value, *spec.args)
        args += () if detector else ("--no-detector",)
        worlds = tuple(World(n, args) for n in group)
        jobs = []
        for tree in trees:
            name = f"repro-{tree.label}-{spec.script.removesuffix('.py')}"
            run = Run(layout.new_run_dir(name), tree, layout)
            snippet = (snippets or {}).get(tree.label)
            carried = snippet.snippet if snippet and snippet.device == used else None
            what = LaunchPlan(
                script, worlds, used, timeout, env or {}, nodes=nodes, snippet=carried
            )
            jobs.append((run, what))
        if len(jobs) > 1 and launchers.LAUNCHERS[spec.launcher].forks_here(nodes):
            launched = launchers.fork_trees(jobs)
        else:
            launched = [
                _timed(functools.partial(launchers.run_worlds, spec.launcher, run, what))
                for run, what in jobs
            ]
        for index, ((run, _), (found, took)) in enumerate(zip(jobs, launched, strict=True)):
            for rank_results in found:
                check_contract(rank_results, scenarios, run.run_dir)
            shutil.rmtree(run.run_dir)
            done[index] |= dict(zip(group, ((used, results) for results in found), strict=True))
            seconds[index] += took
    return [
        TreeLaunch([(ranks, *tree_done[ranks]) for ranks in counts], took)
        for tree_done, took in zip(done, seconds, strict=True)
    ]


def _timed(call: Callable[[], T]) -> tuple[T, float]:
    started = time.perf_counter()
    return call(), time.perf_counter() - started


def check_contract(rank_results: RankResults, scenarios: Sequence[str], where: Path) -> None:
    """Refuse what a rank returned unless it is a `ReproRank`, one row per scenario asked, in
    order; the run folder, with each rank's result, is kept for a look."""
    contract = (
        f"not one row for each of {list(scenarios)} (its result is under {where}): a rank script"
        " returns a `ReproRank`, one `RankRow` for each scenario asked, in order"
    )
    for result in rank_results:
        if not isinstance(result.payload.get("runs"), list):
            raise RunFailed(f"rank {result.rank} returned no `runs` list, {contract}")
        try:
            found = [row.scenario for row in result.read(ReproRank).runs]
        except RecordError as error:
            raise RunFailed(f"{error}; {contract}") from None
        if found != list(scenarios):
            raise RunFailed(f"rank {result.rank} returned rows for {found}, {contract}")


# --- merging the ranks' rows ----------------------------------------------------------------------


def merge_sites(per_rank: Sequence[Sequence[SiteCount]]) -> tuple[MergedSite, ...]:
    """One entry per source line: as the first rank that found it reports it, with its count on
    each rank, and the largest as its count; by file and line."""
    first: dict[tuple[str, int], SiteCount] = {}
    counts: dict[tuple[str, int], list[int]] = {}
    for rank, found in enumerate(per_rank):
        for synced in found:
            line = (synced.site.file, synced.site.line)
            first.setdefault(line, synced)
            counts.setdefault(line, [0] * len(per_rank))[rank] = synced.count
    return tuple(
        MergedSite(dataclasses.replace(first[line], count=max(counts[line])), tuple(counts[line]))
        for line in sorted(first)
    )


def per_rank_text(values: list[Any]) -> str | None:
    """One message when every rank says the same, else each rank's own, prefixed by its rank."""
    if not any(values):
        return None
    if len({str(v) for v in values}) == 1:
        return f"every rank: {values[0]}"
    return "; ".join(f"rank {rank}: {value}" for rank, value in enumerate(values) if value)


def disagreement(values: list[Any]) -> Any:
    """What a merged row shows where the ranks differ: all() of flags, the largest number, each
    rank's message, or, for lists and tables, the ranks' own values in rank order."""
    if all(isinstance(v, bool) for v in values):
        return all(values)
    if all(isinstance(v, int | float) for v in values):
        return max(values)
    if None in values and all(v is None or isinstance(v, int | float) for v in values):
        return None
    if all(v is None or isinstance(v, str) for v in values):
        return per_rank_text(values)
    return values


def merge_ranks(rank_results: RankResults, tree: str, launch: str, ranks: int) -> list[ScenarioRow]:
    """One row per scenario from every rank's rows (`merge_rows`)."""
    read = [result.read(ReproRank).runs for result in rank_results]
    return [merge_rows(rows, tree, launch, ranks) for rows in zip(*read, strict=True)]


def merge_rows(rows: Sequence[RankRow], tree: str, launch: str, ranks: int) -> ScenarioRow:
    """One scenario's row from each rank's: site lists merged by line (`merge_sites`), problems
    pooled, the count and the other figures kept where the ranks agree and set apart
    (`disagreement`) where not."""
    values = {"host_syncs": [row.host_syncs for row in rows]}
    for key in dict.fromkeys(key for row in rows for key in row.figures):
        values[key] = [row.figures.get(key) for row in rows]
    merged = {key: merge_values(found) for key, found in values.items()}
    figures = {key: value for key, (value, _) in merged.items()}
    names = dict.fromkeys(name for row in rows for name in row.site_lists)
    lists = {name: [row.site_lists.get(name, ()) for row in rows] for name in names}
    return ScenarioRow(
        tree=tree,
        launch=launch,
        ranks=ranks,
        scenario=rows[0].scenario,
        host_syncs=figures.pop("host_syncs"),
        # A list no rank found a site in is a figure every rank agrees on.
        figures=figures | {name: [] for name, found in lists.items() if not any(found)},
        per_rank={key: each for key, (_, each) in merged.items() if each is not None},
        problems=tuple(sorted({problem for row in rows for problem in row.problems})),
        costs=tuple(row.cost for row in rows if row.cost is not None),
        site_lists={name: merge_sites(found) for name, found in lists.items() if any(found)},
    )


def merge_values(values: list[Json]) -> tuple[Json, tuple[Json, ...] | None]:
    """What the ranks' values of one figure merge to, and, where they differ, each rank's."""
    if all(value == values[0] for value in values):
        return values[0], None
    return disagreement(values), tuple(values)


# --- across trees ---------------------------------------------------------------------------------


def compare_trees(runs: Sequence[ScenarioRow], keys: Sequence[str]) -> list[Comparison]:
    """For each key and (launch, ranks, scenario): the same value on every tree, or where not."""
    groups: dict[tuple[str, int, str], list[ScenarioRow]] = {}
    for run in runs:
        groups.setdefault((run.launch, run.ranks, run.scenario), []).append(run)
    found = []
    for key in keys:
        for (launch, ranks, scenario), group in groups.items():
            first = group[0]
            differ = [run.tree for run in group[1:] if run.get(key) != first.get(key)]
            verdict = (
                "identical" if not differ else f"differs from {first.tree} on {', '.join(differ)}"
            )
            trees = tuple(run.tree for run in group)
            found.append(Comparison(launch, ranks, scenario, key, trees, not differ, verdict))
    return found


@dataclass(frozen=True)
class ReproSettings:
    """What `repro` was asked, read once from the command line."""

    trees: tuple[str, ...] | None
    scenarios: str | None
    ranks: str | None
    device: str
    timeout: float
    trainer: bool
    nodes: NodeLayout = SINGLE


def planned(
    case: Case, scenarios: Sequence[str], only_ranks: Sequence[int] = ()
) -> list[tuple[Launch, list[str], list[int]]]:
    """Each launch to run: its scenarios asked for and its rank counts kept by `only_ranks`."""
    found = []
    for spec in case.launches:
        wanted = [name for name in scenarios if name in spec.scenarios]
        counts = [n for n in spec.ranks if not only_ranks or n in only_ranks]
        if wanted and counts:
            found.append((spec, wanted, counts))
    return found


@dataclass(frozen=True)
class Measured:
    """Every run's merged rows, the devices they used, which node ran which ranks, the line the
    snippet printed on each tree, and how long each phase took (seconds, in the order run)."""

    runs: list[ScenarioRow] = field(default_factory=list)
    used: set[Device] = field(default_factory=set)
    nodes: list[NodeShare] = field(default_factory=list)
    snippets: dict[str, str] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)


def measure(
    layout: Layout,
    case: Case,
    trees: list[Tree],
    scenarios: Sequence[str],
    *,
    device: str,
    timeout: float,
    only_ranks: Sequence[int] = (),
    nodes: NodeLayout = SINGLE,
    snippets: bool = False,
    snippets_apart: bool = False,
    trees_at_once: int | None = None,
    share: bool = True,
) -> Measured:
    """Every (tree, launch, rank count) as one run, and with `snippets` the case's snippet on
    each tree: in the interpreter a fork launch on its device imported (the same calls, without
    importing torch and the tree again), else, or with `snippets_apart`, in one of its own.
    `only_ranks` keeps the runs at those rank counts. The trees run side by side where the cores
    hold every rank of them (ranks beyond the cores wait in each collective for one that is not
    running: two trees of 4 ranks on 2 cores take twice as long side by side), unless
    `trees_at_once` says otherwise; across nodes one after another, as every node pools its
    worlds in the same order. Trees that run one after another in one environment share one
    interpreter per fork launch (`launchers.fork_trees`: torch and DeepSpeed imported once),
    unless `share` is off or the snippets run apart (the paths `bench` compares)."""
    snippets = snippets and bool(case.card.repro.snippet)
    widest = max((max(counts) for _, _, counts in planned(case, scenarios, only_ranks)), default=1)
    fit = max(1, (os.cpu_count() or 1) // widest)
    at_once = 1 if nodes.spans_nodes else trees_at_once or fit
    shared = share and at_once == 1 and not snippets_apart

    def some_trees(group: list[Tree]) -> Measured:
        found = Measured()
        started = time.perf_counter()
        issued = {t.label: IssueSnippet.of(layout, case, t, device) for t in group if snippets}
        runs: dict[str, list[ScenarioRow]] = {tree.label: [] for tree in group}
        seconds = dict.fromkeys(runs, 0.0)
        for spec, wanted, counts in planned(case, scenarios, only_ranks):
            carries = {
                label: snippet
                for label, snippet in issued.items()
                if not snippets_apart
                and not snippet.snippet.ended()
                and launchers.LAUNCHERS[spec.launcher].forks_here(nodes)
            }
            done = launch_trees(
                layout,
                group,
                spec,
                counts,
                wanted,
                device=device,
                timeout=timeout,
                nodes=nodes,
                snippets=carries,
            )
            for tree, launched in zip(group, done, strict=True):
                seconds[tree.label] += launched.seconds
                for ranks, device_used, rank_results in launched.runs:
                    found.used.add(device_used)
                    runs[tree.label].extend(
                        merge_ranks(rank_results, tree.label, spec.script, ranks)
                    )
                    found.nodes.extend(
                        shares_of(f"{tree.label} {spec.script} x{ranks}", rank_results)
                    )
        if len(group) > 1:
            names = ", ".join(runs)
            found.phases[f"imports shared by {names}"] = (
                time.perf_counter() - started - sum(seconds.values())
            )
        else:
            seconds = {group[0].label: time.perf_counter() - started}
        for tree in group:
            found.runs.extend(runs[tree.label])
            found.phases[f"tree {tree.label}"] = seconds[tree.label]
            if tree.label in issued:
                snippet = issued[tree.label]
                ended = snippet.snippet.ended() or snippet.run_apart()
                found.snippets[tree.label] = snippet.line(case, ended)
                found.phases[f"snippet {tree.label}"] = ended.seconds
        return found

    groups = launchers.sharing_groups(trees, layout) if shared else [[tree] for tree in trees]
    found = Measured()
    for one in processes.side_by_side(
        [functools.partial(some_trees, group) for group in groups], at_once
    ):
        found.runs.extend(one.runs)
        found.used.update(one.used)
        found.nodes.extend(one.nodes)
        found.snippets.update(one.snippets)
        found.phases.update(one.phases)
    return found


def check_nodes(
    case: Case, settings: ReproSettings, scenarios: Sequence[str], only_ranks: Sequence[int]
) -> None:
    """Refuse, before anything runs, what the nodes cannot share."""
    if not settings.nodes.spans_nodes:
        return
    if settings.trainer:
        raise WorkspaceError(
            "--trainer compares with a run of one process, which cannot span nodes: run it on"
            " one node"
        )
    for spec, _, counts in planned(case, scenarios, only_ranks):
        for ranks in counts:
            settings.nodes.per_node(ranks, f"{case.name}'s {spec.script} x{ranks}")


@dataclass(frozen=True)
class IssueSnippet:
    """The case's one-process snippet on one tree: where its output goes, on which device."""

    snippet: Snippet
    device: Device
    run: Run

    @classmethod
    def of(cls, layout: Layout, case: Case, tree: Tree, device: str) -> IssueSnippet:
        run = Run(layout.new_run_dir(f"snippet-{tree.label}"), tree, layout)
        used = devices.resolve_device(device, 1, tree.python)
        env = {"MASTER_PORT": str(free_port())} | devices.device_env(used)
        return cls(Snippet(layout.repro / case.card.repro.snippet, run.log_file, env), used, run)

    def run_apart(self) -> SnippetExit:
        """As a user runs it: a fresh interpreter, which imports torch and the tree itself."""
        started = time.perf_counter()
        command = [self.run.python, str(self.snippet.script)]
        status = run_group(self.run, command, timeout=SNIPPET_TIMEOUT_S, env=self.snippet.env)
        return SnippetExit(status, time.perf_counter() - started)

    def line(self, case: Case, ended: SnippetExit) -> str:
        """The line it printed (its `snippet_output`): what an issue quotes, with the versions
        it ran on."""
        log = self.snippet.log
        found = re.findall(case.card.repro.snippet_output, log.read_text(), re.MULTILINE)
        if ended.exit_status != 0 or not found:
            raise WorkspaceError(
                f"{self.snippet.script.name} failed on {self.run.label} (exit status"
                f" {ended.exit_status}): see {log}"
            )
        shutil.rmtree(self.run.run_dir)
        line: str = found[-1]
        return line


# How long the snippet, one call of one function, may take in an interpreter of its own.
SNIPPET_TIMEOUT_S = 300.0


def snippet_runs(case: Case, layout: Layout, outputs: Mapping[str, str]) -> SnippetRuns | None:
    if not case.card.repro.snippet:
        return None
    snippet = layout.repro / case.card.repro.snippet
    return SnippetRuns(file=snippet.name, sha256=sha256(snippet), output=dict(outputs))


def repro_case(case: Case, settings: ReproSettings) -> ReproResult:
    layout = case.layout
    scenarios = parse_scenarios(case, settings.scenarios)
    only_ranks = parse_ranks(case, settings.ranks)
    check_nodes(case, settings, scenarios, only_ranks)
    measured_against = provenance.inputs(layout)
    names = list(settings.trees or case.trees)
    trees = node_0_first(
        settings.nodes,
        f"trees of {case.name}",
        settings.timeout,
        lambda: prepare_trees(case, names),
    )
    # The snippet is one process, as a user runs it: once, on the node that writes the result.
    measured = measure(
        layout,
        case,
        trees,
        scenarios,
        device=settings.device,
        timeout=settings.timeout,
        only_ranks=only_ranks,
        nodes=settings.nodes,
        snippets=settings.nodes.writes_results,
    )
    runs, used = measured.runs, measured.used
    trainer = tuple(
        trainer_step.compare_losses(layout, tree, timeout=settings.timeout, device=settings.device)
        for tree in (trees if settings.trainer else ())
    )
    environment = devices.describe(trees[0].python)
    return ReproResult(
        stamp=provenance.stamp(layout, measured_against),
        environment=environment.with_devices(sorted(used)),
        trees=infos(layout, trees),
        scenarios={name: case.scenarios[name] for name in scenarios},
        runs=tuple(runs),
        comparisons=tuple(compare_trees(runs, case.compare)),
        trainer=trainer,
        snippet=snippet_runs(case, layout, measured.snippets)
        if settings.nodes.writes_results
        else None,
        nodes=tuple(measured.nodes),
        verdicts=tuple(cost.compare_costs(runs)),
    )


# --- the scenarios and rank counts asked for ------------------------------------------------------


def parse_scenarios(case: Case, text: str | None) -> list[str]:
    if text is None:
        return list(case.scenarios)
    scenarios = comma_list(text, "--scenarios")
    unknown = [name for name in scenarios if name not in case.scenarios]
    if unknown:
        raise WorkspaceError(
            f"case {case.name} has no scenario {', '.join(unknown)}: choose from"
            f" {', '.join(case.scenarios)}"
        )
    return scenarios


def parse_ranks(case: Case, text: str | None) -> list[int]:
    if text is None:
        return []
    declared = sorted({n for spec in case.launches for n in spec.ranks})
    found = comma_list(text, "--ranks")
    wrong = [item for item in found if not item.isdigit() or int(item) not in declared]
    if wrong:
        raise WorkspaceError(
            f"--ranks {', '.join(wrong)}: case {case.name} runs at {', '.join(map(str, declared))}"
            " processes (its card's repro.launch.ranks)"
        )
    return [int(item) for item in found]
