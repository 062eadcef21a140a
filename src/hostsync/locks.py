"""One command at a time per case: its clone, trees and results are not shared safely.

A command that works on a case holds `work/locks/<case>.lock` (an advisory lock, released by the
kernel when the process ends, however it ends) for as long as it works on it. A second command
on the same case is refused at once, naming the holder; commands on other cases run side by side.
Across nodes each node's command holds a lock of its own (`<case>.node<R>.lock` beyond node 0):
on a shared filesystem they would otherwise refuse each other.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime

from hostsync.errors import WorkspaceError
from hostsync.layout import Layout

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
        os.write(fd, json.dumps(_me()).encode())
        _held[key] = 1
        try:
            yield
        finally:
            del _held[key]
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)


def _me() -> dict[str, object]:
    return {
        "pid": os.getpid(),
        "command": shlex.join(["python", "-m", "hostsync", *sys.argv[1:]]),
        "since": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
    }


def _holder(fd: int) -> str:
    """Who holds the lock, as it wrote itself into the file (it may be writing just now)."""
    for _ in range(5):
        text = os.pread(fd, 4096, 0).decode(errors="replace")
        try:
            holder = json.loads(text)
        except ValueError:
            time.sleep(0.1)
            continue
        return f"pid {holder['pid']} (`{holder['command']}`, since {holder['since']})"
    return "another command"
