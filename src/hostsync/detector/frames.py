"""From a Python frame to the site a person reads: file, line, function and statement.

A sync is counted at the innermost frame outside torch and the detector's engine, so that a
read inside torch's own Python is paid for by the code that called it. Naming a file walks
`sys.path`, so sites are kept by code object while `sys.path` is unchanged.
"""

from __future__ import annotations

import linecache
import os
import sys
from collections.abc import Sequence
from itertools import islice
from pathlib import Path
from types import CodeType, FrameType

import torch

from hostsync.detector.sites import Site

_TORCH_DIR = str(Path(torch.__file__).parent) + os.sep
# The detector's engine: its frames are never a site (the labelled suite's are).
_ENGINE = frozenset(
    str(Path(__file__).with_name(f"{name}.py"))
    for name in ("scope", "observer", "frames", "host", "kernels", "patches", "ops", "accounting")
)
_NO_PYTHON_CALLER = Site("<no Python frame>", 0, "", "")
_MAX_SOURCE_LINES = 8


def package_path(filename: str, search_path: Sequence[str] | None = None) -> str:
    """`filename` relative to the longest `sys.path` entry holding it, else its basename."""
    path = Path(filename).absolute()
    roots = [
        Path(entry or os.curdir).absolute()
        for entry in (sys.path if search_path is None else search_path)
    ]
    holding = [root for root in roots if path.is_relative_to(root)]
    if not holding:
        return path.name
    return path.relative_to(max(holding, key=lambda root: len(root.parts))).as_posix()


def _site(frame: FrameType | None) -> Site:
    if frame is None:
        return _NO_PYTHON_CALLER
    code = frame.f_code
    return Site(package_path(code.co_filename), frame.f_lineno, code.co_name, _source(frame))


def _source(frame: FrameType) -> str:
    """The statement that read the tensor, all of an `if (...)` spread over lines, not its body.

    Python 3.11 locates the instruction (the span may cover a whole `if` with its body); the
    lines are taken from its start until the brackets opened on them are closed again.
    """
    code = frame.f_code
    start, end, *_ = next(islice(code.co_positions(), frame.f_lasti // 2, None), (None, None))
    start = start or frame.f_lineno
    lines, depth = [], 0
    for number in range(start, max(end or start, start) + 1)[:_MAX_SOURCE_LINES]:
        line = linecache.getline(code.co_filename, number, frame.f_globals).strip()
        lines.append(line)
        depth += sum(map(line.count, "([{")) - sum(map(line.count, ")]}"))
        if depth <= 0:
            break
    return " ".join(line for line in lines if line)


def caller_frame() -> FrameType | None:
    """The innermost frame outside torch and the detector (else the innermost outside it)."""
    frame: FrameType | None = sys._getframe(1)
    fallback: FrameType | None = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename not in _ENGINE:
            if not filename.startswith(_TORCH_DIR):
                return frame
            fallback = fallback or frame
        frame = frame.f_back
    return fallback


class _Names:
    """Sites and callers by code object, kept across scopes while sys.path is unchanged: naming
    a file walks sys.path (50 us), and a scope is often opened once per training step."""

    def __init__(self) -> None:
        self.sites: dict[tuple[CodeType, int] | None, Site] = {}
        self.callers: dict[CodeType, str] = {}
        self._search_path: list[str] = []

    def follow(self, search_path: list[str]) -> None:
        if search_path != self._search_path:
            self.sites.clear()
            self.callers.clear()
            self._search_path = list(search_path)


_names = _Names()


def follow_search_path() -> None:
    """Names found from now on follow `sys.path` as it is now."""
    _names.follow(sys.path)


def site_of(frame: FrameType | None) -> Site:
    key = (frame.f_code, frame.f_lineno) if frame else None
    site = _names.sites.get(key)
    if site is None:
        site = _names.sites[key] = _site(frame)
    return site


def caller_site() -> tuple[FrameType | None, Site]:
    """The frame a sync is counted at, and its site."""
    frame = caller_frame()
    return frame, site_of(frame)


def statement() -> tuple[FrameType | None, Site]:
    """The innermost frame outside the detector, inside torch or not, and its statement."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename in _ENGINE:
        frame = frame.f_back
    return frame, site_of(frame)


def caller(frame: FrameType | None) -> str:
    """`file:function` of the frame that called `frame`'s function ("" for none)."""
    calling = frame.f_back if frame else None
    if calling is None:
        return ""
    code = calling.f_code
    found = _names.callers.get(code)
    if found is None:
        found = _names.callers[code] = f"{package_path(code.co_filename)}:{code.co_name}"
    return found
