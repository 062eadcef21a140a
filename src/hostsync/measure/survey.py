"""The `survey` command: a project's own test suite, which nobody here wrote, run without the
pytest plugin, in report mode and gated by the baseline the report wrote.

What a project sees before it adopts the gate: the outcomes must not change (compared test by
test over every run; a difference fails the command), the plugin's cost, and the sites the suite
syncs at most. On a shared machine one run's wall time swings more than the cost measured, so the
modes run interleaved, round after round (off, report, gate, off, ...), and each mode's cost is
the median over the rounds of its ratio to the run without the plugin of its own round, in wall
time and in the CPU time (user + system) of pytest and what it started. The suite comes from the
project's sha256-verified PyPI sdist (`surveys.toml`), unpacked under work/surveys/ and imported
from there.
"""

from __future__ import annotations

import dataclasses
import hashlib
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hostsync import detector
from hostsync.detector.baseline import Baseline
from hostsync.detector.codec import Strict
from hostsync.detector.sites import COMPILED, Site
from hostsync.detector.words import counted
from hostsync.launch import devices, processes
from hostsync.measure.provenance import pin_digest
from hostsync.measure.records import SurveyMode, SurveyPass, SurveyResult, SurveySite, TestOutcome
from hostsync.measure.test_patch import read_junit
from hostsync.upstream.sdists import fetch_sdist
from hostsync.upstream.trees import Tree
from hostsync.workspace import projects
from hostsync.workspace.cases import Sdist
from hostsync.workspace.config import load_toml
from hostsync.workspace.errors import WorkspaceError, last_line
from hostsync.workspace.files import sha256
from hostsync.workspace.layout import Layout
from hostsync.workspace.records import Provenance, Stamp, TreeRole

FILE = "surveys.toml"
SURVEY = "survey"  # the folder of profiles/ the results go into
TOP = 10  # sites in the report
# Interleaved rounds by default: with the unmeasured run, 16 runs of the slice of surveys.toml,
# about 4 minutes on 2 idle cores.
ROUNDS = 5
# The cost the plugin may add to a suite, as a ratio of wall time over the run without it.
BOUNDS = {SurveyMode.REPORT: 1.15, SurveyMode.GATE: 1.10}
PLUGIN = "hostsync.detector.pytest_plugin"
ENGINE = Path(detector.__file__).parent


@dataclass(frozen=True)
class SurveySpec(Strict):
    """One project's entry of surveys.toml."""

    version: str
    sdist: Sdist
    options: tuple[str, ...]
    tests: tuple[str, ...]
    requires: tuple[str, ...] = ()


def load_spec(root: Path, project: str) -> SurveySpec:
    """The project's entry of surveys.toml, every entry checked field by field."""
    specs = load_toml(root / FILE, dict[str, SurveySpec])
    if project not in specs:
        raise WorkspaceError(
            f"{FILE} has no [{project}]: survey one of {', '.join(specs)}, or add its table"
        )
    return specs[project]


def origin(sdist: Sdist) -> str:
    return f"PyPI sdist {sdist.filename} (sha256 {sdist.sha256})"


def release_tree(layout: Layout, name: str, spec: SurveySpec) -> Tree:
    """The surveyed release as a tree: its verified sdist unpacked, run by this interpreter."""
    project = projects.get(name)
    return Tree(
        label=f"{project.name}-{spec.version}",
        role=TreeRole.RELEASE,
        root=unpacked(layout, name, spec),
        version=spec.version,
        commit="",
        origin=origin(spec.sdist),
        project=project,
        python=sys.executable,
    )


def unpacked(layout: Layout, name: str, spec: SurveySpec) -> Path:
    """The verified sdist unpacked under work/surveys/, once (built beside, then renamed)."""
    dest = layout.work / "surveys" / f"{name}-{spec.version}-{spec.sdist.sha256[:12]}"
    if dest.exists():
        return dest
    archive = fetch_sdist(layout, spec.sdist)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as partial, tarfile.open(archive) as tar:
        tar.extractall(partial, filter="data")
        (top,) = Path(partial).iterdir()
        top.rename(dest)
    return dest


def test_requirements(layout: Layout, spec: SurveySpec) -> Path | None:
    """What the suite imports beyond the workspace's environment, installed once into a folder
    of its own (put on PYTHONPATH for the runs only, so no environment changes)."""
    if not spec.requires:
        return None
    digest = hashlib.sha256("\n".join(spec.requires).encode()).hexdigest()[:12]
    dest = layout.work / "surveys" / f"requires-{digest}"
    if dest.exists():
        return dest
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    install = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-deps",
        "--target",
        str(partial),
        *spec.requires,
    ]
    done = subprocess.run(install, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise WorkspaceError(
            f"cannot install the suite's requirements {', '.join(spec.requires)}"
            f" ({last_line(done.stderr)}): check the network to PyPI, or fix {FILE}'s requires"
        )
    partial.rename(dest)
    return dest


def survey(
    layout: Layout,
    tree: Tree,
    spec: SurveySpec,
    tests: Sequence[str],
    timeout: float,
    rounds: int = ROUNDS,
) -> SurveyResult:
    run_dir = layout.new_run_dir(f"survey-{tree.label}")
    requirements = test_requirements(layout, spec)
    env = dict(tree.project.test_env)
    if requirements is not None:
        tree = dataclasses.replace(tree, stacked=(requirements,))
    # The first report run writes the baseline every gated run reads; each later report run
    # writes one of its own, so that every report run does the same work.
    baseline = run_dir / "baseline.json"

    def arguments(mode: SurveyMode, index: int) -> tuple[str, ...]:
        # The baseline as one argument: pytest takes an existing path among its arguments into
        # its choice of rootdir, which names the tests the baseline is keyed by.
        if mode is SurveyMode.OFF:
            return ("-p", f"no:{PLUGIN}")
        if mode is SurveyMode.GATE:
            return ("-p", PLUGIN, f"--host-sync-baseline={baseline}", "--host-sync-gate", "all")
        written = baseline if index == 1 else run_dir / f"report-{index}" / baseline.name
        return ("-p", PLUGIN, f"--host-sync-baseline={written}", "--host-sync-report")

    def pytest(folder: str, extra: tuple[str, ...]) -> tuple[processes.Run, list[str], Path]:
        run = processes.Run(run_dir / folder, tree, layout)
        report = run.run_dir / "junit.xml"
        command = [
            tree.python,
            "-m",
            "pytest",
            *tests,
            *spec.options,
            *extra,
            f"--junitxml={report}",
            f"--rootdir={tree.root}",
            "-p",
            "no:cacheprovider",
            "-q",
        ]
        return run, command, report

    # One unmeasured run first takes the cold start (imports, inductor's kernel cache), so that
    # it counts for no measured run.
    warmup, command, _ = pytest("warmup", arguments(SurveyMode.OFF, 0))
    processes.run_group(warmup, command, timeout=timeout, cwd=tree.root, env=env)
    runs, outcomes = [], {}
    for index in range(1, rounds + 1):
        for mode in (SurveyMode.OFF, SurveyMode.REPORT, SurveyMode.GATE):
            run, command, report = pytest(f"{mode.value}-{index}", arguments(mode, index))
            started, cpu_before = time.monotonic(), _children_cpu_s()
            returncode = processes.run_group(run, command, timeout=timeout, cwd=tree.root, env=env)
            wall_s, cpu_s = time.monotonic() - started, _children_cpu_s() - cpu_before
            if not report.exists():
                raise WorkspaceError(
                    f"pytest exited with status {returncode} and wrote no report ({mode.value} run"
                    f" of round {index}): see {run.log_file}"
                )
            outcomes[mode, index] = read_junit(report)
            counted = Counter(test.outcome.value for test in outcomes[mode, index])
            runs.append(
                SurveyPass(
                    mode,
                    round(wall_s, 2),
                    round(cpu_s, 2),
                    returncode,
                    dict(sorted(counted.items())),
                    index,
                )
            )
    written = Baseline.read(baseline) if baseline.exists() else Baseline.of({})
    return SurveyResult(
        stamp=Stamp.now(
            " ".join(["python", "-m", "hostsync", *sys.argv[1:]]), SURVEY, inputs(layout)
        ),
        environment=devices.describe(tree.python),
        project=tree.project.name,
        version=tree.version,
        origin=tree.origin,
        tests=tuple(tests),
        options=spec.options,
        runs=tuple(runs),
        collected=len(outcomes[SurveyMode.OFF, 1]),
        differences=tuple(differences(outcomes)),
        surveyed_tests=len(outcomes[SurveyMode.REPORT, 1]),
        syncing_tests=len(written.tests),
        compiled_tests=sum(
            any(COMPILED in entry.kinds for entry in entries) for entries in written.tests.values()
        ),
        sites=top_sites(written),
    )


def _children_cpu_s() -> float:
    """User and system time of every child process this one has waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def inputs(layout: Layout) -> Provenance:
    """What a survey depends on: pin.toml, surveys.toml and the plugin's modules."""
    engine: tuple[str, ...] = ("pytest_plugin.py", "baseline.py", "scope.py", "observer.py")
    engine += ("frames.py", "host.py", "kernels.py", "patches.py", "ops.py")
    return Provenance(
        pin_sha256=pin_digest(layout.pin_file),
        case_sha256=sha256(layout.root / FILE),
        patches={},
        scripts={name: sha256(ENGINE / name) for name in engine},
    )


def differences(outcomes: dict[tuple[SurveyMode, int], list[TestOutcome]]) -> list[str]:
    """Each outcome a run does not share with the first run without the plugin (a test counted
    by name and outcome: two modules may hold tests of one name), naming the rounds it differs
    in where there are several."""
    first = (SurveyMode.OFF, 1)
    without = Counter((test.test, test.outcome.value) for test in outcomes[first])
    found: dict[str, list[int]] = {}
    for (mode, index), tests in outcomes.items():
        if (mode, index) == first:
            continue
        run = "a later run without the plugin" if mode is SurveyMode.OFF else f"{mode.value} mode"
        within = Counter((test.test, test.outcome.value) for test in tests)
        lost = [
            f"{test}: {outcome} without the plugin, not in {run}"
            for test, outcome in without - within
        ]
        new = [
            f"{test}: {outcome} in {run}, not without the plugin"
            for test, outcome in within - without
        ]
        for difference in sorted(lost) + sorted(new):
            found.setdefault(difference, []).append(index)
    several = max(index for _, index in outcomes) > 1
    return [
        f"{difference} (round{'s' * (len(indices) > 1)} {', '.join(map(str, indices))})"
        if several
        else difference
        for difference, indices in found.items()
    ]


def top_sites(baseline: Baseline) -> tuple[SurveySite, ...]:
    """The sites of the slice by syncs summed over its tests, most first; each at the line of
    the first test that made it."""
    counts: Counter[tuple[str, str, str]] = Counter()
    tests: Counter[tuple[str, str, str]] = Counter()
    first: dict[tuple[str, str, str], Site] = {}
    kinds: dict[tuple[str, str, str], set[str]] = {}
    for entries in baseline.tests.values():
        for entry in entries:
            key = entry.site.identity
            counts[key] += entry.count
            tests[key] += 1
            first.setdefault(key, entry.site)
            kinds.setdefault(key, set()).update(entry.kinds)
    return tuple(
        SurveySite(first[key], tuple(sorted(kinds[key])), count, tests[key])
        for key, count in counts.most_common(TOP)
    )


def summary(result: SurveyResult) -> str:
    ratios = ", ".join(
        f"{mode.value} {result.ratio(mode):.3f}x (CPU {result.cpu_ratio(mode):.3f}x)"
        for mode in (SurveyMode.REPORT, SurveyMode.GATE)
    )
    same = "identical" if not result.differences else f"{len(result.differences)} differ"
    off = statistics.median(run.wall_s for run in result.runs if run.mode is SurveyMode.OFF)
    return (
        f"{result.project} {result.version}: {result.collected} tests, outcomes {same} over"
        f" {len(result.runs)} runs; wall time {off:.1f} s without the plugin (median of"
        f" {result.rounds}), median ratios {ratios}; {result.syncing_tests} of"
        f" {result.surveyed_tests} tests sync"
    )


def render(result: SurveyResult, path: Path) -> str:
    """The survey as Markdown: what ran, the outcomes, the ratios, the top sites."""
    lines = [
        f"# Host syncs in {result.project} {result.version}'s own tests: a survey",
        "",
        f"> Generated by `python -m hostsync survey` from `{path.name}` ({result.stamp.created}).",
        "",
        f"**What ran.** `{shlex.join(result.tests)}` of the {result.origin}, at its root with its"
        f" package imported from there (`{shlex.join(result.options)}`), in"
        f" {counted(result.rounds, 'round')} after one unmeasured run that takes the cold start;"
        " each round runs it without the plugin, with `--host-sync-report` (writing a baseline)"
        " and with `--host-sync-gate all` against the baseline of the first round, one after the"
        " other.",
        "",
        "**How the cost is measured.** Each run's ratio is over the run without the plugin of its"
        " own round (runs side by side share the machine's load); a mode's cost is the median of"
        f" its {result.rounds} ratio(s). Wall time, and CPU time: the user and system time of"
        " pytest and the processes it started, steadier than wall time where other jobs share"
        " the machine.",
        "",
        f"**On.** {result.environment.device}; Python {result.environment.python},"
        f" torch {result.environment.packages.get('torch', '?')}.",
        "",
        "| mode | median wall ratio | wall ratios | median CPU ratio | CPU ratios | bound (wall) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for mode, bound in BOUNDS.items():
        wall = ", ".join(f"{ratio:.3f}" for ratio in result.ratios(mode))
        cpu = ", ".join(f"{ratio:.3f}" for ratio in result.ratios(mode, cpu=True))
        within = "within" if result.ratio(mode) <= bound else "over"
        lines.append(
            f"| {mode.value} | {result.ratio(mode):.3f} | {wall} | {result.cpu_ratio(mode):.3f} |"
            f" {cpu} | {bound:.2f}: {within} |"
        )
    lines += [
        "",
        "| round | run | wall time | CPU time | exit | outcomes |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for run in result.runs:
        outcomes = ", ".join(f"{n} {outcome}" for outcome, n in run.outcomes.items())
        lines.append(
            f"| {run.round} | {run.mode.value} | {run.wall_s:.1f} s | {run.cpu_s:.1f} s |"
            f" {run.returncode} | {outcomes} |"
        )
    lines += ["", f"**Outcomes.** {result.collected} tests;"]
    if result.differences:
        lines[-1] += f" {len(result.differences)} differ with the plugin or between runs:"
        lines += [f"- {difference}" for difference in result.differences]
    else:
        lines[-1] += f" every test has the same outcome in the {len(result.runs)} runs."
    lines += [
        "",
        f"**Sites.** {result.syncing_tests} of {result.surveyed_tests} tests sync;"
        f" {result.compiled_tests} call compiled code, recorded at its line and not judged. The"
        " sites with the most syncs over the slice (matched on file, function and code):",
        "",
        "| file:line | function | code | kinds | syncs | tests |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for found in result.sites:
        site = found.site
        code = site.code.replace("|", "\\|")
        lines.append(
            f"| {site.file}:{site.line} | {site.function} | `{code}` | {', '.join(found.kinds)} |"
            f" {found.count} | {found.tests} |"
        )
    return "\n".join(lines) + "\n"
