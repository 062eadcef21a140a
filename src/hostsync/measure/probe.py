"""A site run under the detector on one release: does its line read a device value there?

Run in the environment built for that release, with the release's source first on the path
(`python -m hostsync.measure.probe`): a generated call of the site's function where it is a function
of its module (each parameter without a default gets a device value: a list of one tensor for a
plural name, a 0-d tensor otherwise), else the case's snippet. The lines of the site's file that ran
are traced, so a probe that never reached the site says so rather than "no read"; each read is the
line of the site's file that was running when it was made, however deep below it
(`upstream.presence.lines_run` gives the lines that are the site's). The engine side (`judge`)
prepares the tree and the environment and turns the run into a verdict; a release that does not
install, or a probe that fails there, is "not run" with its reason."""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import re
import runpy
import sys
import tarfile
import traceback
from pathlib import Path, PurePosixPath
from types import FrameType
from typing import TYPE_CHECKING, Any

from hostsync.detector.sites import suffix_matches
from hostsync.measure.records import ProbeReport

if TYPE_CHECKING:
    from _typeshed import TraceFunction

    from hostsync.detector import SyncScope

_OUT = "probe.json"


def generated_call(module: str, function: str) -> str | None:
    """The call the probe makes of `module.function`, as text, or None where it is no plain
    function of its module (a method needs an object the probe cannot make)."""
    target = getattr(importlib.import_module(module), function, None)
    if not inspect.isfunction(target):
        return None
    required = [
        p.name
        for p in inspect.signature(target).parameters.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    values = [
        "[torch.full((4,), 4.0)]" if name.endswith("s") else "torch.tensor(4.0)"
        for name in required
    ]
    return f"{function}({', '.join(values)})"


def _scope_noting_lines(file: str) -> tuple[SyncScope, list[int]]:
    """A sync scope that also notes, for each read, the line of `file` that was running when it
    was made: the innermost frame of the file on the stack (0 where none is), however deep below
    it the read is: a read inside helpers the file calls, through other packages too, is that
    line's (accelerate's `.item()` under the Trainer's `_clip_grad_norm`). The lines come with
    it."""
    from hostsync.detector import SyncScope  # imports torch: only in the probe's process

    class NotingScope(SyncScope):
        def __init__(self) -> None:
            super().__init__()
            self.at_line: list[int] = []

        def add(self, *args: Any, **kwargs: Any) -> None:
            super().add(*args, **kwargs)
            frame: FrameType | None = sys._getframe(1)
            while frame is not None and not suffix_matches(frame.f_code.co_filename, file):
                frame = frame.f_back
            self.at_line.append(frame.f_lineno if frame else 0)

    scope = NotingScope()
    return scope, scope.at_line


# Where this machine keeps an installed package or a tree's sources, up to the package's folder.
_WHERE_KEPT = re.compile(r"/[^\s'\"()]*?/(?:site-packages|dist-packages|src)/")


def without_machine_paths(text: str) -> str:
    """An error line as anyone reads it: a file by its path in its package, not where this
    machine keeps it (the line goes into committed results)."""
    return _WHERE_KEPT.sub("", text)


def _run(args: argparse.Namespace) -> ProbeReport:
    import torch

    reached: set[int] = set()

    def trace(frame: FrameType, event: str, arg: object) -> TraceFunction | None:
        if suffix_matches(frame.f_code.co_filename, args.file):
            if event == "line" and frame.f_lineno in args.lines:
                reached.add(frame.f_lineno)
            return trace
        return None

    module = str(PurePosixPath(args.file).with_suffix("")).replace("/", ".")
    what = args.function or Path(args.snippet).name
    scope, at_line = _scope_noting_lines(args.file)
    try:  # old releases fail anywhere here: at import, in the call
        call = generated_call(module, args.function) if args.function else None
        namespace = vars(importlib.import_module(module)) | {"torch": torch} if call else {}
        what = call or what
        sys.settrace(trace)
        with scope:
            if call:
                eval(call, namespace)
            else:
                runpy.run_path(args.snippet, run_name="__main__")
    except BaseException as error:
        sys.settrace(None)
        line = without_machine_paths(traceback.format_exception_only(error)[-1].strip())
        return ProbeReport(tuple(sorted(reached)), (), f"{what}: {line}")
    sys.settrace(None)
    # Each line once, in the order it first read: a loop's reads are one line's.
    reads = dict.fromkeys(
        f"{args.file}:{line}"
        for event, line in zip(scope.events, at_line, strict=True)
        if event.allowed is None and line
    )
    return ProbeReport(tuple(sorted(reached)), tuple(reads), "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hostsync.measure.probe")
    parser.add_argument("--file", required=True, help="the site's file from the import root")
    parser.add_argument("--lines", type=int, nargs="+", required=True)
    parser.add_argument("--function", help="call this function of the file's module")
    parser.add_argument("--snippet", help="else run this script")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.write_text(json.dumps(_run(args).to_json()))
    return 0


def unpacked(sdist: Path, dest: Path) -> Path:
    """The sdist's files under `dest` (once): the tree the probe imports."""
    if not dest.exists():
        partial = dest.with_name(dest.name + ".partial")
        with tarfile.open(sdist) as tar:
            tar.extractall(partial, filter="data")
        (top,) = partial.iterdir()
        top.rename(dest)
        partial.rmdir()
    return dest


if __name__ == "__main__":
    sys.exit(main())
