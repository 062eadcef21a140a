"""`python -m hostsync bench`: how long the reproducer takes, and what the sync detector costs.

A benchmark, not a test: it prints figures (kept in profiles/<case>/bench-<stamp>.json with
--write) and asserts nothing. Each run is what `repro` starts for the case's first launch at its
first rank count: one run through every scenario of that launch. The cold run starts with an
empty DeepSpeed extensions cache, so it includes the one-time JIT compile of DeepSpeed's
shared-memory op (the OS file cache is left as it is); warm runs reuse the cache. The detector's
overhead is measured on the whole run, and on the measured call itself where the rank script
times it (`call_seconds` of its rows; a step waits for its slowest rank, so each call counts at
its slowest rank's time; each run's first call, a warm-up, is left out). Last, warm `repro`s
of the whole case as the command runs them (the environment check nox makes first, the trees
brought up to date, the imports the trees share, every tree's launches and its snippet), each
way `repro` has run them (`PATHS`: each snippet in an interpreter of its own; an interpreter per
tree; the trees of one environment in one), in one run, as ratios, phase by phase, so that the
next slowdown shows where it is.

The detector's precision and recall come from its labelled suite (`hostsync.detector.truth`),
per family too, with its cost per operation; `--detector-only` prints those alone, without any
run.

`--scan [SCRIPT ...]` prints instead what `scan` adds to each script's whole run (three example
loops of different sizes where none is named): `python -m hostsync scan SCRIPT`, its result and
reports written, against `python SCRIPT`, and where the difference goes: the runner finding and
timing the steps (`--no-detector`), the detector, the command's own start and summing up, and
the writing, which the command times itself. Interleaved runs, medians; each step's time too.
"""

from __future__ import annotations

import functools
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hostsync.detector.codec import read_file
from hostsync.detector.words import counted
from hostsync.launch import devices
from hostsync.launch.processes import ENGINE_SRC, RankResults, Run, run_group
from hostsync.measure import provenance, repro
from hostsync.measure.records import BenchResult, DetectorTruth, FamilyTruth, ScanRank, ScanResult
from hostsync.rank.records import RankReport
from hostsync.upstream.trees import infos, prepare_tree, prepare_trees
from hostsync.workspace import cases, results, table
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import Layout
from hostsync.workspace.records import Provenance


def call_seconds(rank_results: RankResults) -> list[float]:
    """Each call's time at its slowest rank, the run's first call (warm-up) left out."""
    rows = repro.merge_ranks(rank_results, tree="", launch="", ranks=len(rank_results))
    return [row.figures["call_seconds"] for row in rows if "call_seconds" in row.figures][1:]


def overhead(with_detector: float, without: float, unit: str) -> str:
    return f"{with_detector - without:+.3g} {unit} ({with_detector / without - 1:+.0%})"


def detector_truth() -> DetectorTruth:
    """Precision and recall of the detector on its suite: syncs matched at their source line."""
    from hostsync.detector import truth

    result = truth.score()
    return DetectorTruth(
        cases=result.cases,
        syncs_found=result.true,
        false_events=result.false,
        syncs_missed=result.missed,
        precision=result.precision,
        recall=result.recall,
        wrong_lines=tuple(result.wrong_lines),
        misses=tuple(result.misses),
        families={
            family: FamilyTruth(cases=one.cases, syncs=one.true + one.missed, found=one.true)
            for family, one in truth.score_by_family().items()
        },
        undecided=len(truth.UNDECIDED),
    )


# The gate's budget on a loss call: a scope per call may add at most this much.
GATE_BUDGET = 0.10
LOSS_CALL = "loss call in an open gate scope"
WINDOW_STEP = "a step with one idle window of 100 host calls"


def intercepted_op_us(ops: int = 2000, repeats: int = 5) -> dict[str, dict[str, float]]:
    """Median CPU time of one small aten call with a scope open, with an accounting scope open
    and without, in microseconds: one that cannot sync (it falls through the detector's key in
    C++) and one the detector judges; then the gate on a loss call (`LOSS_CALL`)."""
    import torch

    from hostsync.detector import SyncScope

    t = torch.ones(4)
    calls = {"add": lambda: torch.add(t, t), "nonzero": lambda: torch.nonzero(t)}

    def timed(call: Callable[[], object], count: int = ops) -> float:
        started = time.thread_time()
        for _ in range(count):
            call()
        return (time.thread_time() - started) / count * 1e6

    figures = {}
    for name, call in calls.items():
        without, with_scope, accounting = [], [], []
        for _ in range(repeats):
            without.append(timed(call))
            with SyncScope():
                with_scope.append(timed(call))
            with SyncScope(account=True):
                accounting.append(timed(call))
        figures[name] = {
            "with_detector": statistics.median(with_scope),
            "without": statistics.median(without),
            "with_accounting": statistics.median(accounting),
        }
    figures[LOSS_CALL] = gate_on_a_loss_call(timed, repeats)
    figures[WINDOW_STEP] = recording_a_window(timed, repeats)
    return figures


def recording_a_window(
    timed: Callable[[Callable[[], object], int], float], repeats: int
) -> dict[str, float]:
    """What recording idle windows costs per step: a step whose read stalls and then does 100
    calls on host memory before its next kernel (one window, 100 spans), against the same step
    with the read at its end (the same calls, no window open), both with accounting."""
    import torch

    from hostsync.detector import SyncScope

    t = torch.ones(32, 32)

    def step(host: torch.Tensor, read_first: bool) -> None:
        total = (t @ t).sum()
        if read_first:
            total.item()
        for _ in range(100):
            host.add_(1.0)
        t.add_(0.0)
        if not read_first:
            total.item()

    with_window, without = [], []
    for _ in range(repeats):
        with SyncScope(account=True):
            host = torch.zeros(4)  # no device named: host memory
            with_window.append(timed(functools.partial(step, host, True), 50))
            without.append(timed(functools.partial(step, host, False), 50))
    return {"with_window": statistics.median(with_window), "without": statistics.median(without)}


def gate_on_a_loss_call(
    timed: Callable[[Callable[[], object], int], float], repeats: int
) -> dict[str, float]:
    """A tiny model's forward and loss without a scope and inside an open gate scope,
    interleaved in one process, so that the ratio is measured in one run; and what opening and
    closing a scope costs (once per gated test or step, whatever it holds)."""
    import torch

    from hostsync.detector import SyncScope

    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    inputs, labels = torch.randn(16, 32), torch.randint(0, 8, (16,))

    def loss() -> torch.Tensor:
        return torch.nn.functional.cross_entropy(model(inputs), labels)

    def open_and_close() -> None:
        with SyncScope():
            pass

    without, with_gate, scopes = [], [], []
    for _ in range(repeats):
        without.append(timed(loss, 200))
        with SyncScope():
            with_gate.append(timed(loss, 200))
        scopes.append(timed(open_and_close, 50))
    return {
        "with_detector": statistics.median(with_gate),
        "without": statistics.median(without),
        "scope_open_close": statistics.median(scopes),
    }


def print_detector(truth: DetectorTruth, op_us: dict[str, dict[str, float]]) -> None:
    print(
        f"detector on its labelled suite ({truth.cases} cases, {truth.undecided} undecided"
        f" left out): precision {truth.precision:.3f}, recall {truth.recall:.3f}"
        f" ({truth.syncs_found} syncs found at their line, {truth.false_events} false,"
        f" {truth.syncs_missed} missed)"
    )
    for line in truth.wrong_lines + truth.misses:
        print(f"  {line}")
    print(
        "  per family: "
        + ", ".join(
            f"{family} {one.found}/{one.syncs} ({one.cases} cases)"
            for family, one in sorted(truth.families.items())
        )
    )
    for name, figures in op_us.items():
        if name == WINDOW_STEP:
            print(
                f"{name}: {figures['with_window']:.0f} us CPU with its window recorded,"
                f" {figures['without']:.0f} us with the same calls outside a window"
                f" ({overhead(figures['with_window'], figures['without'], 'us')})"
            )
            continue
        if name == LOSS_CALL:
            ratio = figures["with_detector"] / figures["without"] - 1
            within = "within" if ratio <= GATE_BUDGET else "OVER"
            print(
                f"{name}: {figures['with_detector']:.1f} us CPU with the gate,"
                f" {figures['without']:.1f} us without ({ratio:+.0%}, {within} the"
                f" {GATE_BUDGET:.0%} budget); opening and closing a scope:"
                f" {figures['scope_open_close']:.0f} us"
            )
            continue
        print(
            f"one aten call ({name}): {figures['with_detector']:.1f} us CPU with the detector,"
            f" {figures['without']:.1f} us without"
            f" ({overhead(figures['with_detector'], figures['without'], 'us')});"
            f" {figures['with_accounting']:.1f} us with the accounting mode"
            f" ({overhead(figures['with_accounting'], figures['without'], 'us')})"
        )


# The scan's rank side and command, started by module name as `scan` starts them (no import: they
# sit above).
SCAN_RUNNER = "hostsync.scan.runner"
SCAN_COMMAND = ("hostsync", "scan")
# What `bench --scan` runs when it is given no script: three training loops of different sizes,
# each seconds long on a CPU.
SCAN_EXAMPLES = (
    "examples/tiny_training.py",
    "examples/small_cnn.py",
    "examples/tiny_transformer.py",
)
# How the scan command says how long it took to write its result and reports.
WRITTEN = re.compile(r"wrote the result and its reports in ([0-9.]+) s")
# Each way a script is run: as `python SCRIPT`, under the runner timing its steps only, under scan.
PYTHON, STEPS_ONLY, SCAN = "python", "steps only", "scan"


@dataclass
class ScanTimes:
    """One script's runs, seconds: each way's whole runs; inside the scan, its run (from the
    launch to the ranks' end) and its writing; the steps after the warm-up each way."""

    whole: dict[str, list[float]] = field(
        default_factory=lambda: {PYTHON: [], STEPS_ONLY: [], SCAN: []}
    )
    run: list[float] = field(default_factory=list)
    writing: list[float] = field(default_factory=list)
    steps: dict[str, list[float]] = field(default_factory=lambda: {STEPS_ONLY: [], SCAN: []})


def shadow_root(layout: Layout, folder: Path) -> Path:
    """A workspace at `folder` reading `layout`'s inputs (linked), with a profiles/ of its own:
    the scans a bench makes are no one's results."""
    for entry in layout.root.iterdir():
        if entry.name != "profiles":
            (folder / entry.name).symlink_to(entry)
    return folder


def scan_overhead(
    layout: Layout, scripts: list[Path], args: list[str], runs: int, timeout: float
) -> dict[Path, ScanTimes]:
    """Each script `runs` times each way (`PYTHON`, `STEPS_ONLY`, `SCAN`: the whole command,
    its result and reports written), interleaved over the scripts and the ways."""
    found = {script: ScanTimes() for script in scripts}
    with tempfile.TemporaryDirectory(dir=layout.work) as folder:
        shadow = shadow_root(layout, Path(folder))
        for _ in range(runs):
            for script, times in found.items():
                for way, command in (
                    (PYTHON, [str(script)]),
                    (STEPS_ONLY, ["-m", SCAN_RUNNER, "--no-detector", str(script)]),
                    (SCAN, ["-m", *SCAN_COMMAND, str(script)]),
                ):
                    run = Run(layout.new_run_dir("bench-scan"), None, layout)
                    env = {"HOSTSYNC_ROOT": str(shadow)}
                    started = time.perf_counter()
                    status = run_group(
                        run, [sys.executable, *command, *args], timeout=timeout, env=env
                    )
                    if status != 0:
                        raise WorkspaceError(f"{script} failed under `{way}`: see {run.log_file}")
                    times.whole[way].append(time.perf_counter() - started)
                    if way == STEPS_ONLY:
                        rank = read_file(RankReport, run.run_dir / "rank-0.json").read(ScanRank)
                        times.steps[way] += [s.seconds for s in rank.steps if not s.hunt.warmup]
                    if way == SCAN:
                        scanned = _scanned(shadow, run.log_file)
                        times.run.append(scanned.wall_s)
                        times.writing.append(_writing(run.log_file))
                        times.steps[way] += [
                            s.seconds for r in scanned.ranks for s in r.steps if not s.hunt.warmup
                        ]
    return found


def _scanned(root: Path, log: Path) -> ScanResult:
    newest = results.latest(root / "profiles" / "scan", ScanResult)
    if newest is None:
        raise WorkspaceError(f"the scan wrote no result: see {log}")
    return results.read(newest, ScanResult)


def _writing(log: Path) -> float:
    said = WRITTEN.search(log.read_text())
    if said is None:
        raise WorkspaceError(f"the scan did not say how long it wrote: see {log}")
    return float(said[1])


def print_scan_overhead(found: dict[Path, ScanTimes], runs: int) -> None:
    """Per script: the whole run under scan against `python SCRIPT`, and where the difference
    goes: the runner finding and timing the steps, the detector, the command's own start,
    summing up and writing (of which writing, also as a share of the scan)."""
    median = statistics.median
    rows = []
    for script, times in found.items():
        if not times.steps[SCAN]:
            raise WorkspaceError(f"{script} made no step after the warm-up: give it more steps")
        whole = {way: median(seconds) for way, seconds in times.whole.items()}
        run, writing = median(times.run), median(times.writing)
        step_ms = {way: 1000 * median(seconds) for way, seconds in times.steps.items()}
        rows.append(
            [
                script.name,
                len(times.steps[SCAN]) // runs,
                f"{whole[PYTHON]:.2f}",
                f"{whole[SCAN]:.2f}",
                f"x{whole[SCAN] / whole[PYTHON]:.2f}",
                f"{whole[STEPS_ONLY] - whole[PYTHON]:+.2f}",
                f"{run - whole[STEPS_ONLY]:+.2f}",
                f"{whole[SCAN] - run - writing:+.2f}",
                f"{writing:.2f} ({writing / whole[SCAN]:.0%})",
                f"{step_ms[STEPS_ONLY]:.1f} / {step_ms[SCAN]:.1f}",
            ]
        )
    print(
        f"scan against `python SCRIPT`, whole runs: {counted(runs, 'run')} each way, interleaved"
        " over the scripts and the ways, on a machine shared with other work (medians)"
    )
    print(
        table.text(
            [
                "script",
                "steps",
                "python s",
                "scan s",
                "ratio",
                "runner s",
                "detector s",
                "command s",
                "writing s",
                "step ms: timed only / detector",
            ],
            rows,
        )
    )
    print(
        "  runner: the runner finding and timing the steps, over python; detector: the scan's"
        " run over that; command: the scan command's own start and summing up; writing: its"
        " result, summary and reports (share of the whole scan)"
    )


ENV_CHECK, TREES_UP_TO_DATE, TOTAL = "environment check", "trees brought up to date", "total"
# The ways `repro` has run a case's trees, oldest first (`repro.measure`'s options): each snippet
# in an interpreter of its own; an interpreter per tree, the snippet forked from it; the trees of
# one environment in one interpreter, each tree's project in a fork of its own (now).
PATHS: dict[str, dict[str, Any]] = {
    "snippets apart": {"snippets_apart": True, "trees_at_once": 1, "share": False},
    "per tree": {"share": False},
    "now": {},
}


def whole_repro_phases(
    layout: Layout, case: cases.Case, device: str, timeout: float, *, path: str
) -> dict[str, float]:
    """One warm `repro` of the case as `nox -s repro` runs it, the way `PATHS[path]` says,
    seconds per phase and in all: the environment check (`python -m hostsync env`, which nox
    runs first), the trees brought up to date, then the imports the trees share, each tree's
    launches and its snippet."""
    started = time.perf_counter()
    env = os.environ | {"PYTHONPATH": str(ENGINE_SRC), "HOSTSYNC_ROOT": str(layout.root)}
    subprocess.run(
        [sys.executable, "-m", "hostsync", "env"],
        check=True,
        env=env,
        capture_output=True,
        timeout=timeout,
    )
    phases = {ENV_CHECK: time.perf_counter() - started}
    trees = prepare_trees(case, list(case.trees))
    phases[TREES_UP_TO_DATE] = time.perf_counter() - started - phases[ENV_CHECK]
    measured = repro.measure(
        layout,
        case,
        trees,
        list(case.scenarios),
        device=device,
        timeout=timeout,
        snippets=True,
        **PATHS[path],
    )
    return phases | measured.phases | {TOTAL: time.perf_counter() - started}


def print_whole_repro(case: cases.Case, by_path: dict[str, dict[str, float]]) -> None:
    now = by_path["now"]
    ratios = ", ".join(
        f"now/{path} {now[TOTAL] / phases[TOTAL]:.2f}"
        for path, phases in by_path.items()
        if path != "now"
    )
    print(
        f"warm repro of the whole case ({len(case.trees)} trees, every launch, the snippet on"
        f" each): {', '.join(f'{path} {p[TOTAL]:.1f} s' for path, p in by_path.items())};"
        f" {ratios}"
    )
    names = list(dict.fromkeys(name for phases in reversed(by_path.values()) for name in phases))
    names.append(names.pop(names.index(TOTAL)))  # now's phases first, in the order they ran
    rows = [
        [name, *(f"{p[name]:.1f}" if name in p else "-" for p in by_path.values())]
        for name in names
    ]
    print(table.text(["phase (s)", *by_path], rows))
    print(
        "  snippets apart: trees one after another, each snippet in an interpreter of its own;"
        " per tree: an interpreter per tree, its snippet forked from it after its ranks; now:"
        " the trees of one environment in one interpreter, which imports what they share once"
        " (a tree's time holds its snippet's)"
    )


@dataclass(frozen=True)
class BenchSettings:
    """What `bench` was asked, read once from the command line."""

    tree: str
    warm_runs: int
    repeat: int
    device: str
    timeout: float
    write: bool


def bench_runs(
    case: cases.Case,
    settings: BenchSettings,
    truth: DetectorTruth,
    op_us: dict[str, dict[str, float]],
    measured_against: Provenance,
) -> int:
    """The reproducer's wall times, cold and warm, with the detector and without."""
    layout = case.layout
    spec = case.launches[0]
    sp_size = spec.ranks[0]
    tree = prepare_tree(case, settings.tree)
    device = devices.resolve_device(settings.device, sp_size, tree.python)
    scenarios = list(spec.scenarios) * settings.repeat

    def run(detector: bool, env: dict[str, str] | None = None) -> tuple[float, RankResults]:
        started = time.perf_counter()
        (launched,) = repro.launch_trees(
            layout,
            [tree],
            spec,
            [sp_size],
            scenarios,
            device=device,
            timeout=settings.timeout,
            detector=detector,
            env=env,
        )
        [(_, _, ranks)] = launched.runs
        return time.perf_counter() - started, ranks

    layout.cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=layout.cache) as empty_cache:
        cold_s, _ = run(detector=True, env={"TORCH_EXTENSIONS_DIR": empty_cache})
    wall_s: dict[bool, list[float]] = {True: [], False: []}
    call_s: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(settings.warm_runs):
        for detector in (True, False):  # interleaved, so drift on a shared machine hits both
            seconds, ranks = run(detector)
            wall_s[detector].append(seconds)
            call_s[detector] += call_seconds(ranks)

    by_path = {
        path: whole_repro_phases(layout, case, settings.device, settings.timeout, path=path)
        for path in PATHS
    }
    wall = {detector: statistics.median(s) for detector, s in wall_s.items()}
    call_ms = {d: 1000 * statistics.median(s) for d, s in call_s.items() if s}
    print(
        f"bench: {case.name}, {tree.label} ({tree.project.name} {tree.version}),"
        f" {counted(sp_size, 'rank')}, {device}, {counted(len(scenarios), 'scenario')} per run,"
        f" {counted(settings.warm_runs, 'warm run')} each way, {len(call_s[True])} timed calls"
        " each way"
    )
    print(f"cold run (empty extensions cache, detector on): {cold_s:.1f} s")
    print_whole_repro(case, by_path)
    print(
        table.text(
            ["median", "with detector", "without", "overhead"],
            [
                [
                    "warm run, wall (s)",
                    f"{wall[True]:.2f}",
                    f"{wall[False]:.2f}",
                    overhead(wall[True], wall[False], "s"),
                ],
                *(
                    [
                        [
                            "measured call (ms)",
                            f"{call_ms[True]:.2f}",
                            f"{call_ms[False]:.2f}",
                            overhead(call_ms[True], call_ms[False], "ms"),
                        ]
                    ]
                    if call_s[True]
                    else []
                ),
            ],
        )
    )
    print_detector(truth, op_us)
    if settings.write:
        runs = {
            "trees": {label: info.to_json() for label, info in infos(layout, [tree]).items()},
            "ranks": sp_size,
            "device": device.value,
            "scenarios": scenarios,
            "cold_run_s": cold_s,
            "whole_repro_s": by_path["now"][TOTAL],
            "whole_repro_phases_s": by_path,
            "warm_run_s": {"with_detector": wall_s[True], "without_detector": wall_s[False]},
            "loss_call_s": {"with_detector": call_s[True], "without_detector": call_s[False]},
            "median_loss_call_ms": {
                "with_detector": call_ms[True],
                "without_detector": call_ms[False],
            },
        }
        result = BenchResult(
            provenance.stamp(layout, measured_against),
            truth,
            op_us,
            environment=devices.describe(tree.python),
            runs=runs,
        )
        path = results.write(layout.profiles, result, keep_elsewhere=layout.unsaved)
        print(f"wrote {path.relative_to(layout.root)}", file=sys.stderr)
    return 0
