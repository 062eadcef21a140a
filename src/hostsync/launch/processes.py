"""How a run's process groups start, are waited on, and leave nothing behind.

Every launcher (`hostsync.launch.launchers`) starts its commands here. A group is started in a
session of its own, so that on a timeout, an error or Ctrl-C the whole group (launcher, ranks,
compilers they spawned) is killed and no rank outlives the run. The rank side
(`protocol.rank_entry`) writes each rank's result, or its traceback, into the run folder, so that
a failure is reported with its rank number.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from hostsync.detector.codec import R, RecordError, read_file
from hostsync.detector.words import counted
from hostsync.rank.protocol import RUN_DIR_ENV, TREE_PACKAGE_ENV, TREE_SRC_ENV
from hostsync.rank.records import RankReport
from hostsync.workspace import locks
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import Layout

if TYPE_CHECKING:
    from hostsync.upstream.trees import Tree

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
        # The workspace's ranks, two on two cores: one thread each, or they fight over the
        # cores. A user's own script (no tree) keeps the threads its user set.
        if self.tree:
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
        running = still_running(unfinished(run.run_dir, nprocs), nprocs)
        raise RunHung(f"{error}; {running}") from None
    if returncode != 0:
        raise RunFailed(describe_failure(run, returncode))
    return read_rank_results(run, run.run_dir, nprocs)


def unfinished(folder: Path, nprocs: int) -> list[int]:
    """The ranks of a run that have written neither a result nor an error."""
    return [
        rank
        for rank in range(nprocs)
        if not any((folder / f"rank-{rank}{suffix}").exists() for suffix in (".json", ".error"))
    ]


def still_running(ranks: list[int], nprocs: int) -> str:
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
                log.info("running %s (log: %s)", shlex.join(command), run.log_file)
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


def describe_failure(run: Run, returncode: int, folder: Path | None = None) -> str:
    """Name the rank that failed first (in `folder`, one world's, or anywhere in the run): the
    others often fail only because it left."""
    errors = sorted(
        (folder or run.run_dir).rglob("rank-*.error"),
        key=lambda path: (path.stat().st_mtime_ns, int(path.stem.split("-")[1])),
    )
    if not errors:
        reported = len(list(run.run_dir.rglob("rank-*.json")))
        return (
            f"launcher exited with status {returncode}, {counted(reported, 'rank')} having"
            f" reported a result and none an error; see {run.log_file}"
        )
    first = errors[0]
    rank = first.stem.split("-")[1]
    summary = first.read_text().splitlines()[0]
    more = len(errors) - 1
    others = f" ({counted(more, 'more rank')} failed after it)" if more else ""
    return f"rank {rank} raised {summary}{others}; traceback in {first}"


def read_ranks(results: RankResults, kind: type[R]) -> list[R]:
    """Each rank's payload as the record `kind` its command reads; a payload of another shape is
    refused in one line naming the rank and the field."""
    try:
        return [result.read(kind) for result in results]
    except RecordError as error:
        raise RunFailed(f"{error}: the rank script returned no {kind.__name__}") from None


def read_rank_results(run: Run, folder: Path, nprocs: int) -> RankResults:
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
