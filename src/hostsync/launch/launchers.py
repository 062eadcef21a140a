"""How ranks start: one `LauncherBackend` per launcher, its command and what it can do.

Every command that runs ranks (repro, profile, bench, the hunt, the census) starts them through
`LAUNCHERS`, one `LauncherBackend` per way a case card can name (`workspace.records.Launcher`),
holding what it can do (one process, forked ranks, setting up SP itself) so that no caller
compares names:

- `python`: one process, `python SCRIPT ARGS`;
- `fork`: `hostsync.rank.prefork` imports the script once and forks every rank of every world from
  that interpreter, with the variables torchrun gives its ranks;
- `torchrun`: `torch.distributed.run --standalone`, one agent per world;
- `accelerate`: `accelerate launch` with a DeepSpeed config written at run time (its ZeRO stage
  and precision from `projects.DeepSpeedSetup`, accelerate's own config from
  `projects.accelerate_config`) and, with several ranks, DeepSpeed Ulysses SP over all of them;
  the script also gets `--output-dir`, `--backend` and `--precision`;
- `deepspeed`: DeepSpeed's own launcher (`deepspeed --num_gpus N`), one machine.

A user's own script (`scan`) starts as its users start it (`start_users`): `python`, torchrun,
`accelerate launch` or `deepspeed` with the user's own launcher options, nothing set up for it.

Across nodes (`LaunchPlan.nodes`, see `hostsync.launch.nodes`) torchrun and accelerate start this
node's share of each world's ranks on torchrun's c10d rendezvous, and the nodes pool their ranks'
results before the next world; `fork` is one machine, so its worlds go to torchrun then, and
`python` is one process. Without an endpoint every node's agent starts here, each in a folder of its
own.

The processes each command starts are run and stopped by `hostsync.launch.processes`.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hostsync.detector.codec import read_file, write_file
from hostsync.launch import nodes
from hostsync.launch.devices import device_env
from hostsync.launch.nodes import SINGLE, NodeLayout
from hostsync.launch.processes import (
    RankResults,
    Run,
    RunFailed,
    RunHung,
    describe_failure,
    python_path,
    read_rank_results,
    run_group,
    run_groups,
    run_ranks,
    still_running,
    unfinished,
)
from hostsync.rank.protocol import free_port
from hostsync.rank.records import (
    ForkPlan,
    ForkSnippet,
    ForkTree,
    ForkWorld,
    SharedForkPlan,
    SnippetExit,
)
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import Layout
from hostsync.workspace.projects import DEFAULT_SETUP, DeepSpeedSetup, accelerate_config
from hostsync.workspace.records import Device, Launcher

if TYPE_CHECKING:
    from hostsync.upstream.trees import Tree
    from hostsync.workspace.cases import Case

# Fields of `LaunchPlan.wrap`'s words, filled in for each wrapped command: the folder it runs
# for and its node (each node's agent has its own), e.g. where nsys writes that node's report.
RUN_DIR_FIELD, NODE_FIELD = "{run_dir}", "{node}"


# --- what a launch is asked to do ----------------------------------------------------------------


@dataclass(frozen=True)
class World:
    """One process group: how many ranks, the arguments each gets, and variables of its own
    (the fork launcher's worlds run from one interpreter, each with its own)."""

    ranks: int
    args: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Snippet:
    """A one-process script the fork launcher runs after its worlds, from the interpreter its
    ranks are forked from (`hostsync.rank.prefork`): its output in `log`, its own variables."""

    script: Path
    log: Path
    env: Mapping[str, str] = field(default_factory=dict)

    def ended(self) -> SnippetExit | None:
        """How it ended, or None where it never ran (a world before it failed)."""
        written = self.log.with_name(self.log.name + ".exit.json")
        if not written.exists():
            return None
        return read_file(SnippetExit, written)


@dataclass(frozen=True)
class LaunchPlan:
    """What to launch: a script, the worlds to run it in (in turn), on which device, how long
    each world may take, extra variables, a prefix around the launcher (nsys, say; see
    `RUN_DIR_FIELD`), the nodes the ranks span, and a snippet to run after the worlds (the fork
    launcher on one machine only)."""

    script: Path
    worlds: tuple[World, ...]
    device: Device
    timeout: float
    env: Mapping[str, str] = field(default_factory=dict)
    wrap: tuple[str, ...] = ()
    deepspeed: DeepSpeedSetup = field(default_factory=lambda: DEFAULT_SETUP)
    nodes: NodeLayout = SINGLE
    snippet: Snippet | None = None
    # The user's own options to the launcher, right after it (`start_users`): an accelerate
    # config file, `--use_deepspeed`, DeepSpeed's `--include`, an interpreter's `-X` options.
    launcher_args: tuple[str, ...] = ()

    def environment(self) -> dict[str, str]:
        return device_env(self.device) | dict(self.env)

    def wrapped(self, run: Run, command: Sequence[str]) -> list[str]:
        """`command` inside the wrap, filled in for `run` on this node."""
        fields = {RUN_DIR_FIELD: str(run.run_dir), NODE_FIELD: str(self.nodes.rank)}
        words = list(self.wrap)
        for name, value in fields.items():
            words = [word.replace(name, value) for word in words]
        return [*words, *command]

    def world_name(self, run: Run, world: World) -> str:
        """A world as every node names it: what it runs, not where (run folders differ)."""
        return shlex.join([run.label, self.script.name, f"x{world.ranks}", *world.args])


def run_worlds(launcher: Launcher, run: Run, what: LaunchPlan) -> list[RankResults]:
    """Run `what` with `launcher`: for each world, its ranks' results, by rank. Raises RunFailed
    naming the failing rank (with its traceback) or the timeout; either way every process of the
    run is gone when this returns."""
    if what.snippet and not LAUNCHERS[launcher].forks_here(what.nodes):
        raise WorkspaceError(f"only the fork launcher on one machine runs a snippet: {launcher}")
    return LAUNCHERS[launcher].run(run, what)


# --- the launchers -------------------------------------------------------------------------------


def world_dir(run_dir: Path, index: int, world: World) -> Path:
    """Where the ranks of the `index`th world of a run write their results and files."""
    return run_dir / f"world-{index}-ranks-{world.ranks}"


Command = Callable[[Run, World, LaunchPlan], list[str]]


def _each_world(command: Command) -> Callable[[Run, LaunchPlan], list[RankResults]]:
    """A launcher that starts one command per world, each in its world's folder."""

    def launch_worlds(run: Run, what: LaunchPlan) -> list[RankResults]:
        found = []
        for index, world in enumerate(what.worlds):
            inner = dataclasses.replace(run, run_dir=world_dir(run.run_dir, index, world))
            inner.run_dir.mkdir(parents=True, exist_ok=True)
            if what.nodes.spans_nodes:
                found.append(_across_nodes(command, inner, world, what))
                continue
            argv = what.wrapped(inner, command(inner, world, what))
            found.append(run_ranks(inner, argv, world.ranks, what.timeout, what.environment()))
        return found

    return launch_worlds


def _across_nodes(command: Command, run: Run, world: World, what: LaunchPlan) -> RankResults:
    """One world over several nodes: this node's agent (on this machine, every node's), each in
    a folder of its own, then the nodes' shares pooled into `run`'s folder. Each rank's result
    says which node ran it (`RankReport.ran_on`)."""
    layout = what.nodes
    per_node = layout.per_node(world.ranks, f"{what.script.name} x{world.ranks}")
    pool = nodes.pool_for(layout, run.run_dir, what.world_name(run, world), what.timeout)
    here = list(range(layout.count)) if layout.on_this_machine else [layout.rank]
    endpoint = f"127.0.0.1:{free_port()}" if layout.on_this_machine else layout.endpoint
    agents = []
    for node in here:
        agent = dataclasses.replace(run, run_dir=run.run_dir / f"node-{node}")
        its = dataclasses.replace(
            what, nodes=dataclasses.replace(layout, rank=node, endpoint=endpoint)
        )
        agent.run_dir.mkdir(parents=True, exist_ok=True)
        env = what.environment() | _visible_gpus(what.device, layout, node, per_node)
        agents.append((agent, its.wrapped(agent, command(agent, world, its)), env))
    failed: type[RunFailed] = RunFailed
    try:
        statuses = run_groups(agents, timeout=what.timeout)
        failures = [
            f"node {node}: {describe_failure(agent, status)}"
            for node, (agent, _, _), status in zip(here, agents, statuses, strict=True)
            if status
        ]
    except RunFailed as error:  # a hang: the other nodes must not wait for this one's share
        failed, failures = type(error), [f"node {', '.join(map(str, here))}: {error}"]
    failure = failures[0] if failures else None
    for node, (agent, _, _) in zip(here, agents, strict=True):
        nodes.leave_share(pool, node, agent.run_dir, failure=failure)
    if failure:
        raise failed(failure)
    try:
        where = nodes.gather(pool, layout, run.run_dir)
    except WorkspaceError as error:
        raise RunFailed(str(error)) from None
    results = read_rank_results(run, run.run_dir, world.ranks)
    return [dataclasses.replace(result, ran_on=where[result.rank]) for result in results]


def _visible_gpus(device: Device, layout: NodeLayout, node: int, per_node: int) -> dict[str, str]:
    """On this machine, each node's agent its own GPUs: every agent numbers its ranks' devices
    from 0 (LOCAL_RANK), as on a machine of its own."""
    if device != Device.CUDA or not layout.on_this_machine:
        return {}
    first = node * per_node
    return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(first, first + per_node)))}


def _python(run: Run, world: World, what: LaunchPlan) -> list[str]:
    if world.ranks != 1:
        raise WorkspaceError(f"the python launcher runs one process, not {world.ranks}")
    return [run.python, *what.launcher_args, str(what.script), *world.args]


def torchrun_command(
    python: str,
    script: Path,
    nprocs: int,
    args: Sequence[str],
    layout: NodeLayout = SINGLE,
    options: Sequence[str] = (),
) -> list[str]:
    """torchrun for one machine (`--standalone`), or this node's agent on the c10d rendezvous;
    `options`, a user's own, after those."""
    if not layout.spans_nodes:
        where = ["--standalone", f"--nproc-per-node={nprocs}"]
    else:
        where = [
            f"--nnodes={layout.count}",
            f"--node-rank={layout.rank}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={layout.endpoint}",
            f"--rdzv-id={layout.run_id}",
            f"--nproc-per-node={layout.per_node(nprocs, script.name)}",
            *(f"--rdzv-conf={conf}" for conf in _store_host(layout)),
        ]
    return [
        python,
        "-m",
        "torch.distributed.run",
        *where,
        *options,
        "--max-restarts=0",
        str(script),
        *args,
    ]


def _store_host(layout: NodeLayout) -> list[str]:
    """The rendezvous setting for one machine, where every agent's host matches the endpoint and
    each would try to host the rendezvous store: node 0 does, the others only connect."""
    return [f"is_host={int(layout.rank == 0)}"] if layout.on_this_machine else []


def _accelerate_nodes(layout: NodeLayout, ranks: int) -> list[str]:
    """accelerate's options for one machine (a free port), or for this node on the c10d
    rendezvous, started by DeepSpeed's "standard" multi-node launcher: torchrun, not pdsh."""
    if not layout.spans_nodes:
        return ["--main_process_port", str(free_port())]
    host, port = layout.endpoint_parts()
    layout.per_node(ranks, "accelerate launch")
    return [
        "--num_machines",
        str(layout.count),
        "--machine_rank",
        str(layout.rank),
        "--main_process_ip",
        host,
        "--main_process_port",
        str(port),
        "--rdzv_backend",
        "c10d",
        "--deepspeed_multinode_launcher",
        "standard",
        *(word for conf in _store_host(layout) for word in ("--rdzv_conf", conf)),
    ]


def _torchrun(run: Run, world: World, what: LaunchPlan) -> list[str]:
    return torchrun_command(
        run.python, what.script, world.ranks, world.args, what.nodes, what.launcher_args
    )


def _accelerate(run: Run, world: World, what: LaunchPlan) -> list[str]:
    deepspeed_file = run.run_dir / "deepspeed.json"
    deepspeed_file.write_text(json.dumps(what.deepspeed.config(), indent=2))
    accelerate_file = run.run_dir / "accelerate.json"
    config = accelerate_config(world.ranks, deepspeed_file)
    accelerate_file.write_text(json.dumps(config, indent=2))
    backend = "nccl" if what.device == Device.CUDA else "gloo"
    return [
        run.python,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(accelerate_file),
        *_accelerate_nodes(what.nodes, world.ranks),
        str(what.script),
        "--output-dir",
        str(run.run_dir / "output"),
        "--backend",
        backend,
        "--precision",
        what.deepspeed.precision.value,
        *world.args,
    ]


def _accelerate_as_users_run(run: Run, world: World, what: LaunchPlan) -> list[str]:
    """`accelerate launch` as a user runs it: their config (`launcher_args`), nothing written."""
    return [
        run.python,
        "-m",
        "accelerate.commands.launch",
        "--num_processes",
        str(world.ranks),
        *_accelerate_nodes(what.nodes, world.ranks),
        *what.launcher_args,
        str(what.script),
        *world.args,
    ]


def _deepspeed(run: Run, world: World, what: LaunchPlan) -> list[str]:
    """DeepSpeed's launcher on this machine (across nodes it takes a hostfile and pdsh)."""
    if what.nodes.spans_nodes:
        raise WorkspaceError(
            "the deepspeed launcher is run on one node here: across nodes, use torchrun"
            " (--nnodes without --launcher) or accelerate launch"
        )
    return [
        run.python,
        "-m",
        "deepspeed.launcher.runner",
        "--num_gpus",
        str(world.ranks),
        "--master_port",
        str(free_port()),
        *what.launcher_args,
        str(what.script),
        *world.args,
    ]


def _fork(run: Run, what: LaunchPlan) -> list[RankResults]:
    """Every world of `what` from one interpreter that imported the script once
    (`hostsync.rank.prefork`); `timeout` is per world. A fork is one machine: across nodes, torchrun
    starts the worlds."""
    if what.nodes.spans_nodes:
        return LAUNCHERS[Launcher.TORCHRUN].run(run, what)
    return [_raised(found) for found in fork_each(run, what, keep_going=False)]


def _snippet_plan(snippet: Snippet) -> ForkSnippet:
    return ForkSnippet(str(snippet.script), str(snippet.log), dict(snippet.env))


def _raised(found: RankResults | RunFailed) -> RankResults:
    if isinstance(found, RunFailed):
        raise found
    return found


def fork_each(
    run: Run,
    what: LaunchPlan,
    *,
    keep_going: bool = True,
) -> list[RankResults | RunFailed]:
    """Each world's rank results, or why it failed, from one interpreter that imported the script
    once (`hostsync.rank.prefork`); with `keep_going` a failed world does not stop the next ones
    (one import for many independent runs). `timeout` is per world; one machine only."""
    plan, folders = _fork_plan(run, what, keep_going)
    plan_file = _write_plan(run, plan)
    command = what.wrapped(run, [run.python, "-m", "hostsync.rank.prefork", str(plan_file)])
    timeout = what.timeout * len(what.worlds)
    try:
        returncode = run_group(run, command, timeout=timeout, env=what.environment())
    except RunHung as error:
        raise _which_hung(error, [(folders, what)]) from None
    if returncode != 0 and not keep_going:
        raise RunFailed(describe_failure(run, returncode))
    return _fork_results(run, what, folders, returncode)


def sharing_groups(trees: Sequence[Tree], layout: Layout) -> list[list[Tree]]:
    """The trees, in order, grouped where one forked interpreter can serve them all
    (`fork_trees`): the same environment and compiled extensions folder."""
    groups: dict[tuple[str, Path], list[Tree]] = {}
    for tree in trees:
        key = (tree.python, Run(Path(), tree, layout).extensions_dir)
        groups.setdefault(key, []).append(tree)
    return list(groups.values())


def fork_trees(jobs: Sequence[tuple[Run, LaunchPlan]]) -> list[tuple[list[RankResults], float]]:
    """`_fork`'s worlds for each (run, start) of trees that share an environment, script and
    device, from one interpreter: it imports what the script imports before the project once,
    and each tree's plan runs in a fork of it that imports the rest (`prefork.run_trees`).
    Each tree's worlds' results and the seconds its fork took. Raises at the first tree that
    fails, as `_fork` does; every process is gone either way."""
    if len({(run.python, run.extensions_dir) for run, _ in jobs}) != 1:
        raise WorkspaceError("trees of several environments cannot share one interpreter")
    first, what = jobs[0]
    shared = dataclasses.replace(
        first, run_dir=first.layout.new_run_dir(f"shared-{what.script.stem}")
    )
    base = first.environment(what.environment()) | {"PYTHONPATH": python_path(())}
    trees, folders = [], []
    for run, start in jobs:
        plan, its_folders = _fork_plan(run, start, keep_going=False)
        env = run.environment(start.environment())
        own = {name: value for name, value in env.items() if base.get(name) != value}
        trees.append(ForkTree(plan, tuple(map(str, run.tree_paths)), own, str(_tree_exit(run))))
        folders.append(its_folders)
        run.run_dir.mkdir(parents=True, exist_ok=True)
    plan_file = _write_plan(shared, SharedForkPlan(tuple(trees)))
    prefork = [first.python, "-m", "hostsync.rank.prefork", str(plan_file)]
    command = what.wrapped(shared, prefork)
    timeout = sum(start.timeout * len(start.worlds) for _, start in jobs)
    try:
        returncode = run_group(shared, command, timeout=timeout, env=base)
    except RunHung as error:
        raise _which_hung(
            error, [(f, start) for f, (_, start) in zip(folders, jobs, strict=True)]
        ) from None
    found = []
    for (run, start), its_folders in zip(jobs, folders, strict=True):
        ended = _tree_ended(run)
        if ended is None or ended.exit_status != 0:
            raise RunFailed(describe_failure(shared, returncode, run.run_dir))
        worlds = [_raised(one) for one in _fork_results(run, start, its_folders, 0)]
        found.append((worlds, ended.seconds))
    shutil.rmtree(shared.run_dir)
    return found


def _tree_exit(run: Run) -> Path:
    return run.run_dir / "tree.exit.json"


def _tree_ended(run: Run) -> SnippetExit | None:
    """How a tree's plan ended in a shared interpreter (`fork_trees`), or None where it never
    ran (a tree before it failed)."""
    written = _tree_exit(run)
    if not written.exists():
        return None
    return read_file(SnippetExit, written)


def _fork_plan(run: Run, what: LaunchPlan, keep_going: bool) -> tuple[ForkPlan, list[Path]]:
    """The prefork plan of one run (`hostsync.rank.prefork`), and each world's folder."""
    folders = [world_dir(run.run_dir, i, world) for i, world in enumerate(what.worlds)]
    plan = ForkPlan(
        str(what.script),
        tuple(
            ForkWorld(world.ranks, str(folder), tuple(world.args), dict(world.env))
            for folder, world in zip(folders, what.worlds, strict=True)
        ),
        keep_going,
        _snippet_plan(what.snippet) if what.snippet else None,
    )
    return plan, folders


def _write_plan(run: Run, plan: ForkPlan | SharedForkPlan) -> Path:
    run.run_dir.mkdir(parents=True, exist_ok=True)
    plan_file = run.run_dir / "plan.json"
    write_file(plan, plan_file)
    return plan_file


def _which_hung(error: RunHung, runs: Sequence[tuple[list[Path], LaunchPlan]]) -> RunHung:
    """The timeout, naming the first world whose ranks did not all write something."""
    for folders, what in runs:
        for folder, world in zip(folders, what.worlds, strict=True):
            ranks = unfinished(folder, world.ranks)
            if ranks:
                return RunHung(f"{error}; {still_running(ranks, world.ranks)}")
    return error


def _fork_results(
    run: Run,
    what: LaunchPlan,
    folders: list[Path],
    returncode: int,
) -> list[RankResults | RunFailed]:
    found: list[RankResults | RunFailed] = []
    for folder, world in zip(folders, what.worlds, strict=True):
        try:
            if any(folder.glob("rank-*.error")) or unfinished(folder, world.ranks):
                raise RunFailed(describe_failure(run, returncode, folder))
            found.append(read_rank_results(run, folder, world.ranks))
        except RunFailed as error:
            found.append(error)
    return found


@dataclass(frozen=True)
class LauncherBackend:
    """One launcher a card can name, with what it can do, so that callers ask for a capability
    rather than compare names. `command`: the one command it starts per world (what `profile`
    shows for a rerun by hand), None for the fork launcher, which starts one interpreter for
    every world; `one_process`: it runs no more than one rank; `forks`: its ranks are forked
    from one interpreter that imported the script once (one machine only; it alone runs a
    snippet after its worlds, and can run independent worlds past a failed one); `sets_up_sp`:
    it sets DeepSpeed up from `LaunchPlan.deepspeed` and Ulysses SP over a world's ranks itself (the
    script also gets `--output-dir`, `--backend` and `--precision`); `users`: how it starts a
    user's own script as they would (`start_users`), None where it cannot."""

    name: Launcher
    command: Command | None = None
    one_process: bool = False
    forks: bool = False
    sets_up_sp: bool = False
    users: Command | None = None

    def run(self, run: Run, what: LaunchPlan) -> list[RankResults]:
        """Each world's rank results; across nodes a forking launcher's worlds go to torchrun."""
        if self.command is not None:
            return _each_world(self.command)(run, what)
        return _fork(run, what)

    def forks_here(self, layout: NodeLayout) -> bool:
        """Its ranks fork from one interpreter on this machine: that interpreter runs a snippet
        after the worlds, and serves trees of one environment from one import."""
        return self.forks and not layout.spans_nodes


LAUNCHERS: dict[Launcher, LauncherBackend] = {
    entry.name: entry
    for entry in (
        LauncherBackend(Launcher.PYTHON, _python, one_process=True, users=_python),
        LauncherBackend(Launcher.FORK, forks=True),
        LauncherBackend(Launcher.TORCHRUN, _torchrun, users=_torchrun),
        LauncherBackend(
            Launcher.ACCELERATE, _accelerate, sets_up_sp=True, users=_accelerate_as_users_run
        ),
        LauncherBackend(Launcher.DEEPSPEED, _deepspeed, users=_deepspeed),
    )
}


def users_launchers() -> list[Launcher]:
    """The launchers that start a user's own script (`start_users`)."""
    return [name for name, entry in LAUNCHERS.items() if entry.users is not None]


def start_users(launcher: Launcher, run: Run, what: LaunchPlan) -> list[RankResults]:
    """Run a user's own script (`what.script`, each world's arguments after it) as its users
    start it with `launcher`, their options (`LaunchPlan.launcher_args`) after the launcher: each
    world's rank results. Raises RunFailed as `start` does; every process is gone either way."""
    command = LAUNCHERS[launcher].users
    if command is None:
        known = ", ".join(users_launchers())
        raise WorkspaceError(f"the {launcher} launcher runs no script of a user's: use {known}")
    return _each_world(command)(run, what)


def run_each_world(launcher: Launcher, run: Run, what: LaunchPlan) -> list[RankResults | RunFailed]:
    """Independent worlds, each one's rank results or why it failed, a failed world not stopping
    the next: a forking launcher runs them all from one import of the script (`fork_each`), the
    others one after another, each world in its own folder."""
    entry = LAUNCHERS[launcher]
    if entry.forks and not what.nodes.spans_nodes:
        return fork_each(run, what)
    found: list[RankResults | RunFailed] = []
    for index, world in enumerate(what.worlds):
        alone = (
            run
            if len(what.worlds) == 1
            else dataclasses.replace(run, run_dir=world_dir(run.run_dir, index, world))
        )
        try:
            (ranks,) = entry.run(alone, dataclasses.replace(what, worlds=(world,)))
            found.append(ranks)
        except RunFailed as error:
            found.append(error)
    return found


def with_capability(**wanted: bool) -> Launcher:
    """The first launcher with every capability `wanted` (`sets_up_sp=True`, ...)."""
    return next(
        name
        for name, entry in LAUNCHERS.items()
        if all(getattr(entry, key) == value for key, value in wanted.items())
    )


def check_launches(case: Case) -> None:
    """A card's launch of more ranks than its launcher starts, refused before anything runs."""
    for number, launch in enumerate(case.launches):
        if LAUNCHERS[launch.launcher].one_process and launch.ranks != (1,):
            raise WorkspaceError(
                f"cases/{case.name}.toml: repro.launch[{number}].ranks: a `{launch.launcher}`"
                " launch is one process: use [1]: fix the card"
            )
