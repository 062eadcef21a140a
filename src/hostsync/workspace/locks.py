"""One command at a time per case: its clone, trees and results are not shared safely; one
builder at a time per shared folder; and build locks of compiled extensions removed only when
their builders are dead.

A command that works on a case holds `work/locks/<case>.lock` (an advisory lock, released by the
kernel when the process ends, however it ends) for as long as it works on it. A second command
on the same case is refused at once, naming the holder; commands on other cases run side by side.
Across nodes each node's command holds a lock of its own (`<case>.node<R>.lock` beyond node 0):
on a shared filesystem they would otherwise refuse each other.

torch's extension builder (`FileBaton`) takes a folder's `lock` file and removes it when the
build ends: a builder killed midway leaves it, and every later build of that op waits for it for
ever. The file names no owner, and runs of other commands (other cases, the suite) share one
extensions folder per environment. So every process group that may build into a folder inherits
a shared advisory lock on the folder's `.builders` file (`extension_builders`): while any member
of any such group lives, the lock is held; when nobody holds it, no builder is alive and a
`lock` left there is stale.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import Layout
from hostsync.workspace.records import LockHolder

log = logging.getLogger(__name__)

_held: dict[str, int] = {}  # lock file -> how many times this process holds it


@contextlib.contextmanager
def case(layout: Layout, node: int = 0) -> Iterator[None]:
    """Hold the case's lock (node `node`'s) while the block runs (re-entrant within one
    process)."""
    name = layout.case if node == 0 else f"{layout.case}.node{node}"
    path = layout.work / "locks" / f"{name}.lock"
    key = str(path)
    if key in _held:
        _held[key] += 1
        try:
            yield
        finally:
            _held[key] -= 1
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WorkspaceError(
                f"case {layout.case} is in use by {_holder(fd)}: wait for it to finish, or stop"
                " it (Ctrl-C) if it is your own"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(_me().to_json()).encode())
        _held[key] = 1
        try:
            yield
        finally:
            del _held[key]
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)


@contextlib.contextmanager
def building(target: Path) -> Iterator[None]:
    """Hold `target`'s build lock while the block runs, waiting for a builder that holds it.

    Commands side by side (and the suite's workers) share work/envs/: the second to need an
    environment waits for the first to build it, then finds it built."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target.with_name(f"{target.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _me() -> LockHolder:
    return LockHolder(
        pid=os.getpid(),
        command=shlex.join(["python", "-m", "hostsync", *sys.argv[1:]]),
        since=datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
    )


def _holder(fd: int) -> str:
    """Who holds the lock, as it wrote itself into the file (it may be writing just now)."""
    for _ in range(5):
        text = os.pread(fd, 4096, 0).decode(errors="replace")
        try:
            holder = LockHolder.from_json(json.loads(text))
        except ValueError:  # half written (a RecordError is one too)
            time.sleep(0.1)  # the holder writes itself in just after it locks: read it again
            continue
        return f"pid {holder.pid} (`{holder.command}`, since {holder.since})"
    return "another command"


# --- compiled extensions' build locks -------------------------------------------------------------

BUILDERS = ".builders"


@contextlib.contextmanager
def extension_builders(folders: Sequence[Path]) -> Iterator[tuple[int, ...]]:
    """Join the builders of each extensions folder while the block runs: the descriptors it
    yields hold a shared lock on each folder's builders file, for the process groups the block
    starts to inherit (`pass_fds`), so that the lock lasts as long as any of their processes.
    Build locks nobody can own any more are removed on the way in and on the way out."""
    descriptors: list[int] = []
    try:
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
            descriptors.append(os.open(folder / BUILDERS, os.O_RDWR | os.O_CREAT, 0o644))
            _drop_stale_build_locks(descriptors[-1], folder)
            fcntl.flock(descriptors[-1], fcntl.LOCK_SH)
        yield tuple(descriptors)
    finally:
        for descriptor in descriptors:
            os.close(descriptor)
        for folder in folders[: len(descriptors)]:
            descriptor = os.open(folder / BUILDERS, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                _drop_stale_build_locks(descriptor, folder)
            finally:
                os.close(descriptor)


def _drop_stale_build_locks(descriptor: int, folder: Path) -> None:
    """Remove the build locks in `folder` if no process holds its builders file (`descriptor`
    then holds it alone, exclusively, until the caller shares or closes it)."""
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return  # a live group may be building: its locks are its own
    for lock in folder.glob("*/lock"):
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()
            log.info("removed %s, left by a build that was stopped", lock)
