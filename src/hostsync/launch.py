"""Multi-process runs that leave nothing behind: both sides of the launcher/rank protocol.

The launcher side starts `torchrun`, `accelerate launch` or `hostsync.prefork` in a session of its
own, so that on a timeout, an error or Ctrl-C the whole process group (launcher, ranks, compilers
they spawned) is killed and no rank outlives the run. The rank side (`protocol.rank_entry`)
writes each rank's result, or its traceback, into the run folder, so that a failure is reported
with its rank number.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hostsync.errors import WorkspaceError
from hostsync.layout import Layout
from hostsync.protocol import RUN_DIR_ENV, TREE_PACKAGE_ENV, TREE_SRC_ENV
from hostsync.upstream import Tree

log = logging.getLogger(__name__)

_KILL_GRACE_S = 10.0
# Where the hostsync package is imported from: the ranks import its protocol and detector.
ENGINE_SRC = Path(__file__).resolve().parents[1]


class RunFailed(WorkspaceError):
    """A rank raised, a launcher exited non-zero, or a run hung and was killed."""


@dataclass(frozen=True)
class Run:
    """Where one multi-process run reads its inputs and leaves its outputs."""

    run_dir: Path
    tree: Tree
    layout: Layout = field(default_factory=Layout)

    @property
    def extensions_dir(self) -> Path:
        where = Path(self.tree.python).parent.parent.name
        if self.tree.project.name == "deepspeed":
            where += f"-{self.layout.case}-{self.tree.label}"
        return self.layout.cache / "torch_extensions" / where

    @property
    def log_file(self) -> Path:
        return self.run_dir / "launcher.log"

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The ranks import the project from the tree under test and hostsync from here, and
        find the tree's environment's own tools (torchrun, accelerate) first on the PATH."""
        env = dict(os.environ)
        paths = [self.tree.src, *self.tree.stacked, ENGINE_SRC]
        env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
        env["PATH"] = os.pathsep.join([str(Path(self.tree.python).parent), env.get("PATH", "")])
        env[RUN_DIR_ENV] = str(self.run_dir)
        env[TREE_SRC_ENV] = str(self.tree.src)
        env[TREE_PACKAGE_ENV] = self.tree.project.name
        # Two ranks on two cores: one thread each, or they fight over the cores.
        env.setdefault("OMP_NUM_THREADS", "1")
        # Each rank imports the tree under test from source: let Python keep the bytecode it
        # compiles (in the tree, under work/), or every rank compiles transformers again.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        # DeepSpeed JIT-compiles its shared-memory op once per source and torch: keep it between
        # runs, apart per environment and per DeepSpeed tree, or each would rebuild the other's.
        env.setdefault("TORCH_EXTENSIONS_DIR", str(self.extensions_dir))
        env.update(extra or {})
        return env


def torchrun_command(python: str, script: Path, nprocs: int, args: Sequence[str]) -> list[str]:
    return [
        python, "-m", "torch.distributed.run",
        "--standalone", f"--nproc-per-node={nprocs}", "--max-restarts=0",
        str(script), *args,
    ]  # fmt: skip


def launch(run: Run, command: Sequence[str], *, nprocs: int, timeout: float,
           env: Mapping[str, str] | None = None) -> list[dict]:  # fmt: skip
    """Run `command` as one process group and return the result each rank wrote, by rank.

    Raises RunFailed naming the failing rank (with its traceback) or the timeout; either way
    every process of the group is gone when this returns.
    """
    returncode = run_group(run, command, timeout=timeout, env=env)
    if returncode != 0:
        raise RunFailed(_describe_failure(run, returncode))
    return _read_rank_results(run, run.run_dir, nprocs)


def prefork(run: Run, script: Path, worlds: Sequence[tuple[int, Sequence[str]]], *,
            timeout: float, env: Mapping[str, str] | None = None) -> list[list[dict]]:  # fmt: skip
    """Run `script` once per (rank count, arguments) of `worlds`, in turn, every rank forked from
    one interpreter that imported it (`hostsync.prefork`); for each world, its ranks' results.

    `timeout` is per world. Failures are raised and cleaned up as by `launch`.
    """
    folders = [run.run_dir / f"world-{i}-ranks-{ranks}" for i, (ranks, _) in enumerate(worlds)]
    plan = {
        "script": str(script),
        "worlds": [
            {"ranks": ranks, "run_dir": str(folder), "args": list(args)}
            for folder, (ranks, args) in zip(folders, worlds, strict=True)
        ],
    }
    run.run_dir.mkdir(parents=True, exist_ok=True)
    plan_file = run.run_dir / "plan.json"
    plan_file.write_text(json.dumps(plan, indent=2) + "\n")
    command = [run.tree.python, "-m", "hostsync.prefork", str(plan_file)]
    returncode = run_group(run, command, timeout=timeout * len(worlds), env=env)
    if returncode != 0:
        raise RunFailed(_describe_failure(run, returncode))
    return [
        _read_rank_results(run, folder, ranks)
        for folder, (ranks, _) in zip(folders, worlds, strict=True)
    ]


def run_group(run: Run, command: Sequence[str], *, timeout: float, cwd: Path | None = None,
              env: Mapping[str, str] | None = None) -> int:  # fmt: skip
    """Run `command` as one process group, output in the run's log, and return its exit status.

    For commands whose exit status is an answer (pytest's 1: tests failed). Raises RunFailed on
    the timeout; either way every process of the group is gone when this returns.
    """
    run.run_dir.mkdir(parents=True, exist_ok=True)
    log.info("running %s (log: %s)", " ".join(command[:6]), run.log_file)
    with run.log_file.open("w") as output:
        process = subprocess.Popen(
            command, cwd=cwd, env=run.environment(env), stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            raise RunFailed(
                f"run hung: no exit after {timeout:.0f} s, killed it and every process it started;"
                f" see {run.log_file} and raise the timeout if the machine is just slow"
            ) from None
        except BaseException:
            _kill_group(process)
            raise
        finally:
            _kill_group(process)


def _kill_group(process: subprocess.Popen) -> None:
    """SIGTERM the group, then SIGKILL what is left: the launcher may already be gone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + _KILL_GRACE_S
        while time.monotonic() < deadline and _group_alive(process.pid):
            time.sleep(0.1)
        if not _group_alive(process.pid):
            break
    if process.poll() is None:
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


def _describe_failure(run: Run, returncode: int) -> str:
    """Name the rank that failed first: the others often fail only because it left."""
    errors = sorted(
        run.run_dir.rglob("rank-*.error"),
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


def _read_rank_results(run: Run, folder: Path, nprocs: int) -> list[dict]:
    results = []
    for rank in range(nprocs):
        path = folder / f"rank-{rank}.json"
        if not path.exists():
            raise RunFailed(f"rank {rank} exited cleanly but wrote no result; see {run.log_file}")
        results.append(json.loads(path.read_text()))
    return results
