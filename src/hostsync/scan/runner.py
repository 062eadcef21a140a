"""`python -m hostsync.scan.runner [OPTIONS] SCRIPT [ARGS...]`: a user's training script run
unchanged, as `python SCRIPT ARGS` runs it, each of its steps under the detector.

Like `python -m cProfile`: the script's folder goes first on `sys.path`, `sys.argv` is
`[SCRIPT, *ARGS]` and its code runs as `__main__`. Launchers start this file on every rank in the
script's place (`torchrun ... runner.py SCRIPT ARGS`), so the script sees what they give it
(DeepSpeed's `--local_rank=N` is passed on where DeepSpeed puts it, first).

A step ends where the script's optimizer step ends (torch's global step hooks fire for every
`torch.optim.Optimizer`, also the one DeepSpeed ZeRO steps inside its own; where optimizer steps
nest, at the outermost), or where each call of `--step-fn MODULE:FUNCTION` returns (`__main__`:
a function of the script itself, wrapped as its code is compiled). The script's setup
(imports, model loading, a launcher's own set-up) runs unwatched, but for host memory, known
as the setup makes it (`HostTracking`): the watch begins as the first step does (its
optimizer step, or the first call of the step function), and that step is the warm-up
(`--warmup` is at least 1). Each later step runs from
the end of the one before, in a scope of its own (`SyncScope(account=True,
refuse_compiled=False)`), inside one scope over the rest of the run that keeps the detector's
instrumentation in place between steps.

Each rank writes into the run folder (`HOSTSYNC_RUN_DIR`, or `--out`): a line per step to
`rank-<R>.partial.jsonl` as it goes (what stays of a rank that dies or hangs), then
`rank-<R>.json` when the script ends, raises, or has run the steps `--steps` asked for (it is
then stopped, its record complete); on a raise, also `rank-<R>.error`, its first line naming the
exception and the script's line. A rank stopped by SIGTERM (a launcher stops every rank when one
fails) writes `rank-<R>.stopped` first, with the signal: so the rank that stopped first is told
from those stopped because of it, however busy the machine.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import dataclasses
import functools
import importlib
import json
import os
import signal
import sys
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import cast

from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from hostsync.detector import HostTracking, SyncScope
from hostsync.detector.codec import dump, write_file
from hostsync.detector.events import SyncEvent
from hostsync.detector.records import Cost, DeviceWork
from hostsync.detector.sites import COMPILED
from hostsync.measure.records import ScanEnd, ScanRank, ScanStep, ScanWait
from hostsync.rank.protocol import RUN_DIR_ENV
from hostsync.rank.rankkit import hunt_step
from hostsync.rank.records import RankReport
from hostsync.sites.records import HuntStep

# The name a function of the script itself is wrapped by, as its code is compiled.
_STEP_DECORATOR = "__hostsync_scan_step__"
MAIN = "__main__"


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hostsync.scan.runner",
        description="Run a training script unchanged, each of its steps under the host-sync"
        " detector; each rank writes what it saw into the run folder.",
        allow_abbrev=False,
    )
    parser.add_argument("--warmup", type=int, default=1, help="steps left out of the figures")
    parser.add_argument("--steps", type=int, help="stop the script after this many more steps")
    parser.add_argument("--step-fn", metavar="MODULE:FUNCTION", help="each call is a step")
    parser.add_argument("--no-detector", action="store_true", help="time the steps only")
    parser.add_argument("--out", type=Path, help=f"the run folder (default: ${RUN_DIR_ENV})")
    # DeepSpeed's launcher puts it before the script: it is the script's, passed on first.
    parser.add_argument("--local_rank", "--local-rank", dest="local_rank", help=argparse.SUPPRESS)
    parser.add_argument("script", type=Path)
    parser.add_argument("args", nargs=argparse.REMAINDER)
    return parser


class _Stamped(list[SyncEvent]):
    """A scope's event list that keeps when each event came: the scope appends them as they
    happen."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def append(self, event: SyncEvent) -> None:
        self.times.append(time.perf_counter())
        super().append(event)


class Recorder:
    """The steps of one rank: each in a scope of its own, kept as `ScanStep`s and written out.

    Nothing is watched before the first step begins (`step_begins`). From then on
    `step_ended` closes each step's scope and opens the next; the scope over the rest of the
    run keeps the detector's instrumentation in place between them (the last scope to close
    would remove it).
    """

    def __init__(self, out: Path, warmup: int, steps: int | None, detect: bool) -> None:
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.out, self.warmup, self.steps_asked, self.detect = out, warmup, steps, detect
        self.steps: list[ScanStep] = []
        self.started = self.step_started = time.perf_counter()
        self.run_scope: SyncScope | None = None
        self.step_scope: SyncScope | None = None
        self.tracking = HostTracking() if detect else None
        self.partial = out / f"rank-{self.rank}.partial.jsonl"

    def open(self) -> None:
        """The run begins: host memory is known as the setup makes it."""
        header = {"rank": self.rank, "world_size": self.world_size}
        self.partial.write_text(json.dumps(header) + "\n")
        if self.tracking is not None:
            self.tracking.__enter__()

    def step_begins(self) -> None:
        """A step begins: the first one opens the watch."""
        if self.detect and self.run_scope is None:
            self._open_step()

    def _open_step(self) -> None:
        if self.detect:
            if self.run_scope is None:
                self.run_scope = SyncScope(account=True, refuse_compiled=False).__enter__()
            self.step_scope = SyncScope(account=True, refuse_compiled=False)
            self.step_scope.events = _Stamped()
            self.step_scope.__enter__()
        self.step_started = time.perf_counter()

    def step_ended(self) -> None:
        """The script finished a step: keep it and open the next, or stop the script once it
        has run the steps asked for."""
        step = self._close_step(len(self.steps) + 1)
        self.steps.append(step)
        if self.run_scope is not None:
            self.run_scope.events.clear()  # each event is kept by its step
        with self.partial.open("a") as out:
            out.write(json.dumps(step.to_json()) + "\n")
        if self.steps_asked is not None and len(self.steps) == self.warmup + self.steps_asked:
            self.finish(ScanEnd.STOPPED)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)  # the result is complete: nothing the script does next is measured
        self._open_step()

    def _close_step(self, number: int) -> ScanStep:
        """The step ending now: what its scope saw (nothing where none watched it)."""
        ended = time.perf_counter()
        scope, self.step_scope = self.step_scope, None
        warmup = number <= self.warmup
        waits: tuple[ScanWait, ...] = ()
        if scope is None:
            nothing = Cost(1, 0, 0, DeviceWork())
            hunted = HuntStep(number, warmup, False, (), nothing, 0)
        else:
            scope.__exit__(None, None, None)
            hunted = top_level(judged(hunt_step(number, warmup, False, scope), scope))
            waits = tuple(
                ScanWait(
                    round(at - self.started, 6),
                    event.kind,
                    event.site,
                    event.waited_for or DeviceWork(),
                )
                for event, at in zip(scope.events, cast(_Stamped, scope.events).times, strict=True)
            )
        began = round(self.step_started - self.started, 6)
        return ScanStep(hunted, began, round(ended - self.step_started, 6), waits)

    def finish(self, ended: ScanEnd, error: str | None = None) -> None:
        """The rank's whole record, with the reads after its last step."""
        after = self._close_step(len(self.steps) + 1) if self.step_scope else None
        if self.run_scope is not None:
            self.run_scope.__exit__(None, None, None)
            self.run_scope = None
        if self.tracking is not None:
            self.tracking.__exit__(None, None, None)
            self.tracking = None
        record = ScanRank(
            rank=self.rank,
            world_size=self.world_size,
            ended=ended,
            seconds=round(time.perf_counter() - self.started, 3),
            steps=tuple(self.steps),
            after_last_step=after if after and after.waits else None,
            error=error,
        )
        write_file(RankReport(self.rank, dump(record)), self.out / f"rank-{self.rank}.json")
        if error is not None:
            (self.out / f"rank-{self.rank}.error").write_text(
                f"{error}\n\n{traceback.format_exc()}"
            )
        self.partial.unlink(missing_ok=True)


def judged(step: HuntStep, scope: SyncScope) -> HuntStep:
    """The step less its compiled calls: recorded where they are made (kind `COMPILED`), they
    are calls not judged, no reads, and cost nothing here."""
    compiled = [event for event in scope.events if event.kind == COMPILED]
    if not compiled:
        return step
    where = {event.site for event in compiled}
    cost = dataclasses.replace(
        step.cost,
        reads=step.cost.reads - len(compiled),
        stalls=step.cost.stalls - sum(event.stall for event in compiled),
        sites=tuple(s for s in step.cost.sites if s.site not in where),
    )
    return dataclasses.replace(step, cost=cost)


def top_level(step: HuntStep) -> HuntStep:
    """The step with the script's top-level code called by no one, as under `python SCRIPT`
    (here `run_script` runs it)."""
    runner = f"{Path(__file__).name}:{run_script.__name__}"
    return dataclasses.replace(
        step,
        sites=tuple(
            dataclasses.replace(site, caller="") if site.caller.endswith(runner) else site
            for site in step.sites
        ),
    )


# --- finding the steps ----------------------------------------------------------------------------


def watch_optimizer_steps(recorder: Recorder) -> None:
    """Tell `recorder` where each outermost optimizer step begins and ends."""
    depth = 0

    def before(optimizer: object, args: object, kwargs: object) -> None:
        nonlocal depth
        depth += 1
        if depth == 1:
            recorder.step_begins()

    def after(optimizer: object, args: object, kwargs: object) -> None:
        nonlocal depth
        depth -= 1
        if depth == 0:
            recorder.step_ended()

    register_optimizer_step_pre_hook(before)
    register_optimizer_step_post_hook(after)


def counting(function: Callable[..., object], recorder: Recorder) -> Callable[..., object]:
    """`function`, each outermost call of it a step, which ends as it returns."""
    depth = 0

    @functools.wraps(function)
    def step(*args: object, **kwargs: object) -> object:
        nonlocal depth
        depth += 1
        if depth == 1:
            recorder.step_begins()
        try:
            result = function(*args, **kwargs)
        finally:
            depth -= 1
        if depth == 0:
            recorder.step_ended()
        return result

    return step


def wrap_library_function(target: str, recorder: Recorder) -> None:
    """`MODULE:QUALNAME` of an importable module, replaced where it is looked up."""
    module_name, _, qualname = target.partition(":")
    owner: object = importlib.import_module(module_name)
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    setattr(owner, name, counting(getattr(owner, name), recorder))


def with_step_decorator(tree: ast.Module, qualname: str) -> ast.Module:
    """The script's syntax tree with `qualname`'s definition wrapped by `_STEP_DECORATOR`, outside
    its own decorators (a compiled step is wrapped, not traced); lines stay where they are."""
    body, *path = tree.body, *qualname.split(".")
    found = None
    for index, name in enumerate(path):
        found = next(
            (
                node
                for node in body
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                and node.name == name
            ),
            None,
        )
        if found is None:
            raise SystemExit(f"--step-fn: the script defines no {'.'.join(path[: index + 1])}")
        body = found.body
    if not isinstance(found, ast.FunctionDef | ast.AsyncFunctionDef):
        raise SystemExit(f"--step-fn: {qualname} is no function of the script")
    decorator = ast.copy_location(ast.Name(_STEP_DECORATOR, ast.Load()), found)
    found.decorator_list.insert(0, decorator)
    return tree


# --- running the script ---------------------------------------------------------------------------


def note_stops(out: Path, rank: int) -> None:
    """On SIGTERM, write the rank's stop note, then end as the signal ends it."""

    def stopped(signum: int, frame: object) -> None:
        (out / f"rank-{rank}.stopped").write_text(signal.Signals(signum).name + "\n")
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, stopped)


def as_python_would(script: Path, args: list[str]) -> None:
    """`sys.argv` as the script expects it, its folder first on sys.path (where the runner's
    own, or the current folder, was): what it imports beside itself is found."""
    sys.argv = [str(script), *args]
    sys.path[0] = str(script.resolve().parent)


def run_script(script: Path, step_fn: str | None, recorder: Recorder) -> None:
    """The script's code as `__main__` (whose functions pickle by that name), its function
    `--step-fn __main__:NAME` wrapped as it is compiled."""
    source = script.read_bytes()
    namespace = {"__name__": MAIN, "__file__": str(script), "__builtins__": builtins}
    module_name, _, qualname = (step_fn or "").partition(":")
    if step_fn and module_name == MAIN:
        tree = with_step_decorator(ast.parse(source, str(script)), qualname)
        code = compile(tree, str(script), "exec")
        namespace[_STEP_DECORATOR] = functools.partial(counting, recorder=recorder)
    else:
        code = compile(source, str(script), "exec")
    module = types.ModuleType(MAIN)
    module.__dict__.update(namespace, __spec__=None, __cached__=None, __package__=None)
    sys.modules[MAIN] = module
    exec(code, module.__dict__)


def failure(error: BaseException, script: Path) -> str:
    """One line: the exception, and the script's line it went through last, if it did."""
    summary = traceback.format_exception_only(error)[-1].strip()
    frames = traceback.extract_tb(error.__traceback__)
    own = [frame for frame in frames if Path(frame.filename).resolve() == script.resolve()]
    if not own:
        return summary
    return f"{summary} ({script.name}:{own[-1].lineno} in {own[-1].name})"


def main(argv: list[str] | None = None) -> int:
    options = parser().parse_args(argv)
    if options.warmup < 1:
        parser().error("--warmup: give 1 or more: the first step runs unwatched")
    if options.out is None and RUN_DIR_ENV not in os.environ:
        parser().error(f"give --out DIR, the folder each rank writes into (or set {RUN_DIR_ENV})")
    out = options.out or Path(os.environ[RUN_DIR_ENV])
    out.mkdir(parents=True, exist_ok=True)
    args = [f"--local_rank={options.local_rank}"] if options.local_rank else []
    args += options.args
    recorder = Recorder(out, options.warmup, options.steps, not options.no_detector)
    recorder.open()
    note_stops(out, recorder.rank)
    as_python_would(options.script, args)
    module_name, _, _ = (options.step_fn or "").partition(":")
    try:
        if not options.step_fn:
            watch_optimizer_steps(recorder)
        elif module_name != MAIN:
            wrap_library_function(options.step_fn, recorder)
        run_script(options.script, options.step_fn, recorder)
    except SystemExit as exit:
        if exit.code not in (None, 0):
            status = exit.code if isinstance(exit.code, int) else 1
            said = exit.code if isinstance(exit.code, str) else f"exited with status {status}"
            recorder.finish(ScanEnd.RAISED, f"SystemExit: {said}")
            raise
    except BaseException as error:
        recorder.finish(ScanEnd.RAISED, failure(error, options.script))
        raise
    recorder.finish(ScanEnd.FINISHED)
    return 0


if __name__ == MAIN:
    sys.exit(main())
