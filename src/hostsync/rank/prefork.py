"""`python -m hostsync.rank.prefork PLAN`: import a rank script once, then fork its ranks.

Under torchrun each rank imports torch, DeepSpeed and the tree under test on its own: about 7 s
of CPU per rank, where the measured steps take a second, and 4 ranks on 2 cores wait for four
such imports. Here one interpreter imports the script (its top-level imports are the expensive
part) and each rank is a fork of it, given the variables torchrun gives its ranks (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): the `env://` rendezvous, the process group
and everything the script does after its imports happen in each rank as under torchrun. The
plan's worlds run in turn, so one import serves every rank count of a launch.

Nothing but imports happens before a fork: a rank script starts no process group and touches
no GPU at import, and PYTORCH_NVML_BASED_CUDA_CHECK keeps torch's CUDA probe (DeepSpeed picks
its accelerator at import) from creating a CUDA context that a fork cannot inherit. One more
import is DeepSpeed's CPU comm op, which each rank's `init_distributed` would otherwise load
itself, running ninja and the compiler's checks first (`load_deepspeed_ops`). Where the script
measures under the detector, what its first scope builds is built here (`detector.prepare`).

The plan, written by `hostsync.launch.launchers`, is a `records.ForkPlan`: the script, its worlds
(ranks, run folder, arguments, variables), whether to keep going, the snippet. Each rank calls
the script's `main` (its `rank_entry`) with its world's variables set. A failed world stops the
plan unless `keep_going` (independent runs, such as the census's setups). Exit status: 0, or
the first failing rank's.

Trees that share an environment share one interpreter too (`shared_imports`): a
`records.SharedForkPlan` (each tree's `ForkPlan`, with the tree's entries for the front of sys.path,
its own variables, and where how it ended goes) imports once what the script imports before the
project under test (torch, DeepSpeed, accelerate for sp-loss: most of the 7 s), and the torch
modules projects import lazily (`LAZY_TORCH`), then forks one child per tree, which puts the tree on
sys.path and imports the script: the import order is the script's own, and no tree's project is
ever imported where another tree runs. The forks import side by side, then run their plans in turn;
a failed one stops the next.

The snippet, a one-process script an issue quotes, runs last, as `python SNIPPET` would run it
(as `__main__`, its output in its log) but forked from this interpreter, whose imports it
shares: it would otherwise import torch and the tree again. How it ended goes beside its log
(`records.SnippetExit`); its exit status is not the plan's.
Standard library and the records only, like `hostsync.rank.protocol`: the script brings torch.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import runpy
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from hostsync import detector
from hostsync.detector.codec import load, write_file
from hostsync.rank.protocol import RUN_DIR_ENV, TREE_PACKAGE_ENV, free_port
from hostsync.rank.records import (
    ForkPlan,
    ForkSnippet,
    ForkTree,
    ForkWorld,
    SharedForkPlan,
    SnippetExit,
)

# torch's modules that the projects under test import lazily, after torch: transformers' models
# and DeepSpeed both import dynamo, about 3 s of CPU that each tree would otherwise spend again.
LAZY_TORCH = ("torch._dynamo",)


def import_script(path: Path) -> ModuleType:
    """The script as a module named after its file, its folder first on sys.path, as
    `python path` would have it, but without running its `__main__` block."""
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python script: the fork launcher imports a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def load_deepspeed_ops() -> None:
    """Load DeepSpeed's shared-memory comm op here, where DeepSpeed is imported: its loader
    keeps what it loaded, so each forked rank finds the op loaded instead of checking its build
    again (ninja and a compiler probe, per rank). A no-op without DeepSpeed, or on an
    accelerator with no such op."""
    if "deepspeed.comm" in sys.modules:
        from deepspeed.comm.torch import build_shm_op

        build_shm_op()


def run_world(main: Callable[[], object], script: str, world: ForkWorld) -> int:
    """Fork `world.ranks` ranks running `main`; 0, or the first failure's exit status, once
    every rank is gone (the others are stopped: they would wait in a collective for ever)."""
    rendezvous = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": str(world.ranks),
        "LOCAL_WORLD_SIZE": str(world.ranks),
        RUN_DIR_ENV: world.run_dir,
    }
    ranks = {}
    for rank in range(world.ranks):
        pid = os.fork()
        if pid == 0:
            ranked = {"RANK": str(rank), "LOCAL_RANK": str(rank)}
            os.environ.update(rendezvous | world.env | ranked)
            sys.argv = [script, *world.args]
            _run_rank(main)
        ranks[pid] = rank
    failed = 0
    while ranks:
        pid, status = os.wait()
        del ranks[pid]
        code = os.waitstatus_to_exitcode(status)
        if code != 0 and not failed:
            failed = code if code > 0 else 128 - code
            for other in ranks:
                os.kill(other, signal.SIGTERM)
    return failed


def run_snippet(snippet: ForkSnippet) -> None:
    """Fork the snippet as `python SNIPPET` with its output in its log; write how it ended."""
    started = time.monotonic()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        with Path(snippet.log).open("wb") as log:
            os.dup2(log.fileno(), sys.stdout.fileno())
            os.dup2(log.fileno(), sys.stderr.fileno())
        os.environ.update(snippet.env)
        sys.argv = [snippet.script]
        _run_rank(lambda: runpy.run_path(snippet.script, run_name="__main__"))
    _, status = os.waitpid(pid, 0)
    ended = SnippetExit(os.waitstatus_to_exitcode(status), time.monotonic() - started)
    write_file(ended, Path(snippet.log + ".exit.json"))


def _run_rank(main: Callable[[], object]) -> None:
    """Run `main` in a forked rank (or the snippet) and leave with its status, never returning
    into the parent's loop (`rank_entry` has already written a failure's traceback into the run
    folder)."""
    code = 1
    try:
        main()
        code = 0
    except SystemExit as error:
        code = error.code if isinstance(error.code, int) else 1
        if isinstance(error.code, str):
            print(error.code, file=sys.stderr)  # what `sys.exit(message)` says at top level
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def shared_imports(script: Path, package: str) -> list[str]:
    """The modules the script's leading top-level imports name, up to the first of `package`
    (the project under test), of hostsync or of the script's folder: what every tree's import
    of it shares."""
    found = []
    for statement in ast.parse(script.read_text()).body:
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue  # the docstring
        if isinstance(statement, ast.Import):
            names = [alias.name for alias in statement.names]
        elif isinstance(statement, ast.ImportFrom) and statement.module and not statement.level:
            names = [statement.module]
        else:
            break
        roots = [name.split(".")[0] for name in names]
        if any(root in (package, "hostsync") or _beside(script, root) for root in roots):
            break
        found += [name for name in names if name != "__future__"]
    return found


def _beside(script: Path, name: str) -> bool:
    """A module of the script's own folder (another rank script): only the tree's child, which
    puts that folder on sys.path, can import it."""
    return (script.parent / f"{name}.py").exists() or (script.parent / name).is_dir()


def run_trees(plan: SharedForkPlan) -> int:
    """Each tree's plan in a fork of one interpreter that imported the script's shared modules
    once; how each ended beside its plan. 0, or the first failing tree's status.

    The forks import their trees side by side, on every core; then they measure one at a time,
    each after the one before has ended, on a machine where nothing else of the run works."""
    script, package = Path(plan.trees[0].plan.script), os.environ[TREE_PACKAGE_ENV]
    for name in shared_imports(script, package):
        importlib.import_module(name)
    if "torch" in sys.modules:
        for name in LAZY_TORCH:
            importlib.import_module(name)
    if package in sys.modules:
        sys.exit(
            f"importing what {script} imports before {package} imported {package}"
            " itself: its trees cannot share one interpreter (give each tree its own launch)"
        )
    load_deepspeed_ops()
    forks: list[_TreeFork] = []
    for tree in plan.trees:
        forks.append(_TreeFork(tree, forks))
    for fork in forks:
        fork.imported()
    for index, fork in enumerate(forks):
        code = fork.run()
        if code:
            for later in forks[index + 1 :]:
                later.stop()
            return code if code > 0 else 128 - code
    return 0


class _TreeFork:
    """A fork that puts its tree on sys.path, imports the script, says so, and runs the tree's
    plan when the parent lets it (one byte on its pipe); a closed pipe ends it unrun. It closes
    the parent's ends of the `earlier` forks' pipes: only the parent may let those run or end."""

    def __init__(self, tree: ForkTree, earlier: list[_TreeFork]) -> None:
        self.tree = tree
        self.alive = False
        self.ready, ready = os.pipe()
        turn, self.turn = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:
            for fork in [*earlier, self]:
                os.close(fork.ready)
                os.close(fork.turn)
            engine = sys.path.index(str(Path(__file__).resolve().parents[2]))  # hostsync's folder
            sys.path[engine:engine] = tree.path
            os.environ.update(tree.env)

            def rank() -> None:
                entry = imported_main(tree.plan)
                os.write(ready, b"1")
                if os.read(turn, 1):
                    sys.exit(run_plan(tree.plan, entry))

            _run_rank(rank)
        os.close(ready)
        os.close(turn)

    def imported(self) -> None:
        """Wait until the fork has imported its script, or has ended trying."""
        self.alive = os.read(self.ready, 1) == b"1"

    def run(self) -> int:
        """Let the fork run its plan; its exit status, written beside the plan too."""
        started = time.monotonic()
        if self.alive:
            os.write(self.turn, b"1")
        code = self._ended()
        write_file(SnippetExit(code, time.monotonic() - started), Path(self.tree.exit))
        return code

    def stop(self) -> None:
        """End the fork without running its plan (a tree before it failed)."""
        os.close(self.turn)
        self._ended()

    def _ended(self) -> int:
        _, status = os.waitpid(self.pid, 0)
        return os.waitstatus_to_exitcode(status)


def imported_main(plan: ForkPlan) -> Callable[[], object]:
    """The script's `main`, from one import of it, with what its ranks share built first."""
    script = import_script(Path(plan.script))
    load_deepspeed_ops()
    if "hostsync.detector.scope" in sys.modules:  # the script measures under the detector
        detector.prepare()
    entry = getattr(script, "main", None)
    if entry is None:
        sys.exit(f"{plan.script} has no main(): the fork launcher runs the script's main")
    return entry  # type: ignore[no-any-return]


def run_plan(plan: ForkPlan, entry: Callable[[], object]) -> int:
    """One tree's worlds, then its snippet, each rank calling `entry`."""
    first_failure = 0
    for world in plan.worlds:
        Path(world.run_dir).mkdir(parents=True, exist_ok=True)
        failed = run_world(entry, plan.script, world)
        first_failure = first_failure or failed
        if failed and not plan.keep_going:
            return first_failure
    if plan.snippet:
        run_snippet(plan.snippet)
    return first_failure


def main(argv: list[str]) -> int:
    (plan_file,) = argv
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    data = json.loads(Path(plan_file).read_text())
    plan = load(SharedForkPlan if "trees" in data else ForkPlan, data, plan_file)
    if isinstance(plan, SharedForkPlan):
        return run_trees(plan)
    return run_plan(plan, imported_main(plan))


if __name__ == "__main__":
    status = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # every fork has ended; tearing torch and DeepSpeed down takes a second
