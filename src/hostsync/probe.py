"""A site run under the detector on one release: does its line read a device value there?

Run in the environment built for that release, with the release's source first on the path
(`python -m hostsync.probe`): a generated call of the site's function where it is a function of
its module (each parameter without a default gets a device value: a list of one tensor for a
plural name, a 0-d tensor otherwise), else the case's snippet. The lines of the site's file that
ran are traced, so a probe that never reached the site says so rather than "no read". The
engine side (`judge`) prepares the tree and the environment and turns the run into a verdict;
a release that does not install, or a probe that fails there, is "not run" with its reason.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import runpy
import sys
import tarfile
import traceback
from pathlib import Path, PurePosixPath

from hostsync.records import ProbeRun

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


def _run(args: argparse.Namespace) -> ProbeRun:
    import torch

    from hostsync.detector import SyncScope
    from hostsync.sites import suffix_matches

    reached: set[int] = set()
    # A read inside a helper the file calls (a site with a `caller`) is the file's read at the
    # line that was running when it was made: each new event takes the file's current line.
    running = {"line": 0}
    at_line: list[int] = []
    scope = SyncScope()

    def attribute() -> None:
        at_line.extend([running["line"]] * (len(scope.events) - len(at_line)))

    def trace(frame, event, arg):
        attribute()
        if suffix_matches(frame.f_code.co_filename, args.file):
            if event == "line":
                running["line"] = frame.f_lineno
                if frame.f_lineno in args.lines:
                    reached.add(frame.f_lineno)
            return trace
        return None

    module = str(PurePosixPath(args.file).with_suffix("")).replace("/", ".")
    what = args.function or Path(args.snippet).name
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
        line = traceback.format_exception_only(error)[-1].strip()
        return ProbeRun(tuple(sorted(reached)), (), f"{what}: {line}")
    sys.settrace(None)
    attribute()
    # Each line once, in the order it first read: a loop's reads are one line's.
    reads = dict.fromkeys(
        f"{event.site.file}:{event.site.line}"
        if suffix_matches(event.site.file, args.file)
        else f"{args.file}:{line}"
        for event, line in zip(scope.events, at_line, strict=True)
        if event.allowed is None
        and (
            suffix_matches(event.site.file, args.file)
            or suffix_matches(event.caller.partition(":")[0], args.file)
        )
    )
    return ProbeRun(tuple(sorted(reached)), tuple(reads), "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hostsync.probe")
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
