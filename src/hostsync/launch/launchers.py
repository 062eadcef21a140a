"""How ranks start, and multi-process runs that leave nothing behind.

Every command that runs ranks (repro, profile, bench, the hunt, the census) starts them through
`LAUNCHERS`, one `LauncherBackend` per way a case card can name (`records.Launcher`), holding what
it can do (one process, forked ranks, setting up SP itself) so that no caller compares names:

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

A launch is started in a session of its own, so that on a timeout, an error or Ctrl-C the whole
process group (launcher, ranks, compilers they spawned) is killed and no rank outlives the run.
The rank side (`protocol.rank_entry`) writes each rank's result, or its traceback, into the run
folder, so that a failure is reported with its rank number.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from hostsync.detector.codec import R, RecordError, read_file, write_file
from hostsync.launch import nodes
from hostsync.launch.devices import device_env
from hostsync.launch.nodes import SINGLE, NodeLayout
from hostsync.rank.protocol import RUN_DIR_ENV, TREE_PACKAGE_ENV, TREE_SRC_ENV, free_port
from hostsync.upstream.trees import Tree
from hostsync.workspace import locks
from hostsync.workspace.cases import Case
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import Layout
from hostsync.workspace.projects import DEFAULT_SETUP, DeepSpeedSetup, accelerate_config
from hostsync.workspace.records import (
    Device,
    ForkPlan,
    ForkSnippet,
    ForkTree,
    ForkWorld,
    Launcher,
    RankReport,
    SharedForkPlan,
    SnippetExit,
)

log = logging.getLogger(__name__)

# How long one launched run (a torchrun, a pytest, a training) may take before it counts as hung.
DEFAULT_TIMEOUT_S = 900.0
# How long a process group has to end on SIGTERM before SIGKILL: a Ctrl-C must end every rank
# within seconds, and nox waits for this process only so long.
_KILL_GRACE_S = 3.0
# How often a running group is looked at: its end is noticed within this.
_POLL_S = 0.2
# Where the hostsync package is imported from: the ranks import its protocol and detector.
ENGINE_SRC = Path(__file__).resolve().parents[2]
RankResults = list[RankReport]
T = TypeVar("T")
# Fields of `LaunchPlan.wrap`'s words, filled in for each wrapped command: the folder it runs
# for and its node (each node's agent has its own), e.g. where nsys writes that node's report.
RUN_DIR_FIELD, NODE_FIELD = "{run_dir}", "{node}"


class RunFailed(WorkspaceError):
    """A rank raised, a launcher exited non-zero, or a run hung and was killed."""


class RunHung(RunFailed):
    """A run passed its timeout and was killed."""


class RunStopped(RunFailed):
    """A run stopped because one beside it failed, or on Ctrl-C (`side_by_side`)."""


@dataclass(frozen=True)
class Run:
    """Where one multi-process run reads its inputs and leaves its outputs."""

    run_dir: Path
    # None: a user's own script (`scan`), run by this interpreter with the packages it has.
    tree: Tree | None
    layout: Layout = field(default_factory=Layout)

    @property
    def python(self) -> str:
        """The interpreter the ranks run: the tree's environment's, else this one."""
        return self.tree.python if self.tree else sys.executable

    @property
    def label(self) -> str:
        return self.tree.label if self.tree else "script"

    @property
    def extensions_dir(self) -> Path:
        """Compiled extensions, apart per environment, and per tree where the tree (or one
        stacked beside it, say DeepSpeed's under the census) compiles from its own sources."""
        where = Path(self.python).parent.parent.name
        if self.tree and (self.tree.project.extensions_per_tree or self.tree.stacked):
            where += f"-{self.layout.case}-{self.tree.label}"
        return self.layout.cache / "torch_extensions" / where

    @property
    def tree_paths(self) -> tuple[Path, ...]:
        """What goes first on sys.path to import the tree under test (and any stacked beside it)."""
        return (self.tree.src, *self.tree.stacked) if self.tree else ()

    @property
    def log_file(self) -> Path:
        return self.run_dir / "launcher.log"

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The ranks import the project from the tree under test and hostsync from here, and
        find the tree's environment's own tools (torchrun, accelerate) first on the PATH."""
        env = dict(os.environ)
        env["PYTHONPATH"] = python_path(self.tree_paths)
        env["PATH"] = os.pathsep.join([str(Path(self.python).parent), env.get("PATH", "")])
        env[RUN_DIR_ENV] = str(self.run_dir)
        if self.tree:
            env[TREE_SRC_ENV] = str(self.tree.src)
            env[TREE_PACKAGE_ENV] = self.tree.project.name
        # Two ranks on two cores: one thread each, or they fight over the cores.
        env.setdefault("OMP_NUM_THREADS", "1")
        # Each rank imports the tree under test from source: let Python keep the bytecode it
        # compiles (in the tree, under work/), or every rank compiles transformers again.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        # Compiled extensions are kept between runs, apart per environment (and per tree where
        # the project compiles from its own sources), or each would rebuild the other's.
        env.setdefault("TORCH_EXTENSIONS_DIR", str(self.extensions_dir))
        env.update(extra or {})
        return env


def python_path(first: Sequence[Path]) -> str:
    """PYTHONPATH for a launch: `first`, then hostsync, then what the caller had."""
    paths = [*map(str, first), str(ENGINE_SRC), os.environ.get("PYTHONPATH", "")]
    return os.pathsep.join(paths).rstrip(os.pathsep)


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
            f"node {node}: {_describe_failure(agent, status)}"
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
    results = _read_rank_results(run, run.run_dir, world.ranks)
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
        raise RunFailed(_describe_failure(run, returncode))
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
            raise RunFailed(_describe_failure(shared, returncode, run.run_dir))
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
                return RunHung(f"{error}; {_still_running(ranks, world.ranks)}")
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
                raise RunFailed(_describe_failure(run, returncode, folder))
            found.append(_read_rank_results(run, folder, world.ranks))
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


# --- running a process group ---------------------------------------------------------------------


def run_ranks(
    run: Run,
    command: Sequence[str],
    nprocs: int,
    timeout: float,
    env: Mapping[str, str] | None = None,
) -> RankResults:
    """Run `command` as one process group and return the result each rank wrote, by rank."""
    try:
        returncode = run_group(run, command, timeout=timeout, env=env)
    except RunHung as error:
        running = _still_running(unfinished(run.run_dir, nprocs), nprocs)
        raise RunHung(f"{error}; {running}") from None
    if returncode != 0:
        raise RunFailed(_describe_failure(run, returncode))
    return _read_rank_results(run, run.run_dir, nprocs)


def unfinished(folder: Path, nprocs: int) -> list[int]:
    """The ranks of a run that have written neither a result nor an error."""
    return [
        rank
        for rank in range(nprocs)
        if not any((folder / f"rank-{rank}{suffix}").exists() for suffix in (".json", ".error"))
    ]


def _still_running(ranks: list[int], nprocs: int) -> str:
    if not ranks:
        return f"all {nprocs} ranks had finished"
    return f"rank {', '.join(map(str, ranks))} of {nprocs} had not finished"


def run_group(
    run: Run,
    command: Sequence[str],
    *,
    timeout: float,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """Run `command` as one process group, output in the run's log, and return its exit status.

    For commands whose exit status is an answer (pytest's 1: tests failed). Raises RunFailed on
    the timeout; either way every process of the group is gone when this returns.
    """
    (status,) = run_groups([(run, command, env)], timeout=timeout, cwd=cwd)
    return status


def run_groups(
    commands: Sequence[tuple[Run, Sequence[str], Mapping[str, str] | None]],
    *,
    timeout: float,
    cwd: Path | None = None,
) -> list[int]:
    """Run each (run, command, variables) as a process group of its own, all at once, output in
    its run's log; their exit statuses once every one has exited, or as soon as one fails (the
    others, which would wait for it for ever, are ended). Raises RunHung on the timeout; either
    way every process of every group is gone when this returns."""
    environments = [run.environment(env) for run, _, env in commands]
    extensions = {environment.get("TORCH_EXTENSIONS_DIR") for environment in environments}
    processes: list[subprocess.Popen[bytes]] = []
    with locks.extension_builders(sorted(Path(f) for f in extensions if f)) as builders:
        try:
            for (run, command, _), environment in zip(commands, environments, strict=True):
                run.run_dir.mkdir(parents=True, exist_ok=True)
                log.info("running %s (log: %s)", " ".join(command[:6]), run.log_file)
                with run.log_file.open("w") as output:
                    processes.append(
                        subprocess.Popen(
                            command,
                            cwd=cwd,
                            env=environment,
                            stdout=output,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                            pass_fds=builders,
                        )
                    )
            _wait_for_groups(processes, timeout, [run for run, _, _ in commands])
        finally:
            with _uninterrupted():
                for process in processes:
                    _kill_group(process)
    return [process.returncode for process in processes]


# Set while the calls of a `side_by_side` batch are being stopped: each stops its groups.
_stopping = threading.Event()


def side_by_side(calls: Sequence[Callable[[], T]], at_once: int) -> list[T]:
    """Each call (which runs process groups) in a thread of its own, `at_once` at a time; their
    results in order. On the first failure, or Ctrl-C, the other calls stop their groups, and
    this raises only once every process of every call is gone."""
    if at_once <= 1 or len(calls) <= 1:
        return [call() for call in calls]
    with concurrent.futures.ThreadPoolExecutor(at_once) as pool:
        futures = [pool.submit(call) for call in calls]
        try:
            concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
            for future in futures:
                if future.done() and future.exception():
                    future.result()
            return [future.result() for future in futures]
        except BaseException:
            _stopping.set()
            with _uninterrupted():
                for future in futures:
                    future.cancel()
                concurrent.futures.wait(futures)
            raise
        finally:
            _stopping.clear()


def _wait_for_groups(
    processes: Sequence[subprocess.Popen[bytes]], timeout: float, runs: Sequence[Run]
) -> None:
    """Until every process has exited, or one has failed; RunHung past the timeout, RunStopped
    when the runs beside it are stopped."""
    deadline = time.monotonic() + timeout
    while any(_exit_status(process) is None for process in processes):
        if any(_exit_status(process) not in (None, 0) for process in processes):
            return
        if _stopping.is_set():
            raise RunStopped("stopped: a run beside it failed, or Ctrl-C")
        if time.monotonic() > deadline:
            logs = ", ".join(str(run.log_file) for run in runs)
            raise RunHung(
                f"run hung: no exit after {timeout:.0f} s, killed it and every process it"
                f" started; see {logs} and raise the timeout if the machine is just slow"
            )
        time.sleep(_POLL_S)


@contextlib.contextmanager
def _uninterrupted() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM back while the block runs: a second Ctrl-C, or nox's SIGTERM after
    its own wait, must not cut the stopping of the groups short and leave ranks behind. A signal
    held back is delivered when the block ends."""
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _exit_status(process: subprocess.Popen[bytes]) -> int | None:
    """The launcher's exit status once it has exited, without reaping it: while it is a zombie
    its pid, its group's id, cannot be given to another process, whose group `_kill_group` would
    otherwise stop (pids come round again within minutes on a busy machine)."""
    found = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    if found is None:
        return None
    return found.si_status if found.si_code == os.CLD_EXITED else -found.si_status


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the group, then SIGKILL what is left: the launcher may already be gone (not
    reaped: see `_exit_status`), and is reaped last."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + _KILL_GRACE_S
        while time.monotonic() < deadline and _group_alive(process.pid):
            time.sleep(0.1)  # polls for the group's end, which has no event to wait on
        if not _group_alive(process.pid):
            break
    process.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies answer signal 0 too; a group whose members have all exited counts as gone.
    return any(_is_live_member(pid, pgid) for pid in _pids())


def _pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _is_live_member(pid: int, pgid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[1].split()
    state, process_group = fields[0], int(fields[2])
    return process_group == pgid and state != "Z"


def _describe_failure(run: Run, returncode: int, folder: Path | None = None) -> str:
    """Name the rank that failed first (in `folder`, one world's, or anywhere in the run): the
    others often fail only because it left."""
    errors = sorted(
        (folder or run.run_dir).rglob("rank-*.error"),
        key=lambda path: (path.stat().st_mtime_ns, int(path.stem.split("-")[1])),
    )
    if not errors:
        reported = len(list(run.run_dir.rglob("rank-*.json")))
        return (
            f"launcher exited with status {returncode}, {reported} rank(s) having reported a"
            f" result and none an error; see {run.log_file}"
        )
    first = errors[0]
    rank = first.stem.split("-")[1]
    summary = first.read_text().splitlines()[0]
    others = f" ({len(errors) - 1} more rank(s) failed after it)" if len(errors) > 1 else ""
    return f"rank {rank} raised {summary}{others}; traceback in {first}"


def read_ranks(results: RankResults, kind: type[R]) -> list[R]:
    """Each rank's payload as the record `kind` its command reads; a payload of another shape is
    refused in one line naming the rank and the field."""
    try:
        return [result.read(kind) for result in results]
    except RecordError as error:
        raise RunFailed(f"{error}: the rank script returned no {kind.__name__}") from None


def _read_rank_results(run: Run, folder: Path, nprocs: int) -> RankResults:
    results = []
    for rank in range(nprocs):
        path = folder / f"rank-{rank}.json"
        if not path.exists():
            raise RunFailed(f"rank {rank} exited cleanly but wrote no result; see {run.log_file}")
        try:
            results.append(read_file(RankReport, path))
        except RecordError as error:
            raise RunFailed(
                f"rank {rank} wrote no rank report ({error}): its script returns through"
                " `protocol.rank_entry`"
            ) from None
    return results
