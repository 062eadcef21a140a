"""The records of the runs that measure a case, a release, the detector or a script.

One `Result` per kind, with the records it is made of: test_patch's checks, a fix's cost, repro,
a site judged on one release, bench, survey. The scan's records sit here too: the bench times
the scan and reads its results back.
"""

from __future__ import annotations

import operator
import statistics
import typing
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Self

from hostsync.detector.codec import FLAT, OPTIONAL, Json, Record, RecordError, dump, load, shown
from hostsync.detector.records import Cost, DeviceWork
from hostsync.detector.sites import AllowRule, Site, SiteCount
from hostsync.launch.records import TrainerComparison
from hostsync.sites.records import HuntSite, HuntStep
from hostsync.upstream.records import UpstreamTests
from hostsync.workspace.records import Environment, Launcher, NodeShare, Result, TreeInfo

# --- checks --------------------------------------------------------------------------------------


class Verdict(StrEnum):
    """What a check concluded; only OK is a pass, and only WRONG fails the command."""

    OK = "ok"
    WRONG = "WRONG"
    NOT_APPLICABLE = "n/a"
    NOT_COMPARABLE = "not comparable"


class Outcome(StrEnum):
    """One test's outcome in a pytest report."""

    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class TreeRef(Record):
    """A tree as a check names it."""

    version: str
    commit: str
    origin: str


@dataclass(frozen=True)
class TestOutcome(Record):
    """One test case of a pytest run (or one linter step): `test` is `Class::method`, as a
    card's red_on_pinned names it; `message` the failure's first line or why it was skipped."""

    __test__: ClassVar = False  # pytest: not a test class
    test: str
    outcome: Outcome
    message: str = ""


@dataclass(frozen=True)
class CheckRecord(Record):
    """One row of test_patch's summary: what ran on which tree, what it had to show, whether
    it did (the verdict) and why."""

    check: str
    label: str
    tree: TreeRef | None
    expected: str
    verdict: Verdict
    reason: str
    counts: dict[str, int]
    tests: tuple[TestOutcome, ...]
    seconds: float


@dataclass(frozen=True)
class TestPatchResult(Result):
    KIND: ClassVar[str] = "test_patch"
    __test__: ClassVar = False
    ok: bool
    checks: tuple[CheckRecord, ...]
    upstream_tests: UpstreamTests | None = field(default=None, metadata=OPTIONAL)


# --- cost ----------------------------------------------------------------------------------------


class FixVerdict(StrEnum):
    """What a fix does to the device, judged from the cost before and after."""

    SAVES_IDLE = "saves idle time"
    MOVES_WAIT = "moves the wait"
    CLEANUP = "cleanup"
    COSTS_MORE = "costs more"
    NO_CHANGE = "no change"


@dataclass(frozen=True)
class FixAssessment(Record):
    """A fix's verdict, the figures it rests on (per step), and the bound it was held to.
    `idle_us`: the idle windows summed per step, the median over the steps judged (host time in
    microseconds, measured on CPU); `idle_spread_us`: how far those sums spread, the larger of
    the two trees' (None where a tree was measured over one step: no spread to judge by)."""

    verdict: FixVerdict
    reads: tuple[float, float]
    stalls: tuple[float, float]
    kernels: tuple[float, float]
    bytes: tuple[float, float]
    flops: tuple[float, float]
    bound: str
    reason: str
    idle_us: tuple[float, float] = (0.0, 0.0)
    idle_spread_us: float | None = None


@dataclass(frozen=True)
class CostComparison(Record):
    """One scenario's fix judged: the cost on tree `before` against the cost on tree `after`."""

    launch: str
    ranks: int
    scenario: str
    before: str
    after: str
    judgement: FixAssessment


# --- repro ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MergedSite(Record):
    """One site of a site list over the ranks of a run: as the first rank that found it reports
    it, its count the largest of any rank's, and each rank's count (0: none there)."""

    found: SiteCount = field(metadata=FLAT)
    count_per_rank: tuple[int, ...]


@dataclass(frozen=True)
class ScenarioRow(Record):
    """One (tree, launch, rank count, scenario) of a repro: the figures the case's rank script
    reported, merged over the ranks. A figure the ranks disagree on keeps every rank's value
    in `per_rank`; the file holds it beside the figure as `<name>_per_rank`. `site_lists`: the
    lists of sites some rank found sites in, merged by line; one no rank found a site in is the
    figure `[]`, as every rank agrees on it. `costs`: each rank's reads, stalls and device work,
    where its script accounted for them (`cost` in its row). `host_syncs`, where the script
    counts them, is typed: a file holding anything but a count there is refused.

    The file holds the site lists among the figures, by name: a list of objects that each carry
    `count_per_rank`, which only merging writes, is read as one."""

    tree: str
    launch: str
    ranks: int
    scenario: str
    figures: dict[str, Json] = field(default_factory=dict)
    per_rank: dict[str, tuple[Json, ...]] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    costs: tuple[Cost, ...] = ()
    host_syncs: int | None = None
    site_lists: dict[str, tuple[MergedSite, ...]] = field(default_factory=dict)

    _OWN: ClassVar = ("tree", "launch", "ranks", "scenario", "problems", "costs", "host_syncs")

    def to_json(self) -> dict[str, Json]:
        out: dict[str, Json] = {
            "tree": self.tree,
            "launch": self.launch,
            "ranks": self.ranks,
            "scenario": self.scenario,
        }
        figures = self.figures | {name: dump(sites) for name, sites in self.site_lists.items()}
        if self.host_syncs is not None:
            figures = {"host_syncs": self.host_syncs} | figures
        for name, value in figures.items():
            out[name] = value
            if name in self.per_rank:
                out[f"{name}_per_rank"] = list(self.per_rank[name])
        out["problems"] = list(self.problems)
        if self.costs:
            out["costs"] = dump(self.costs)
        return out

    @classmethod
    def from_json(cls, data: Json, where: str = "") -> Self:
        if not isinstance(data, dict):
            raise RecordError(where, f"expected an object, got {shown(data)}")
        hints = typing.get_type_hints(cls)
        own = {}
        for name in cls._OWN:
            inner = f"{where}.{name}" if where else name
            if name not in data and name not in ("problems", "costs", "host_syncs"):
                raise RecordError(inner, "is missing")
            if name in data:
                own[name] = load(hints[name], data[name], inner)
        rest = {k: v for k, v in data.items() if k not in cls._OWN}
        figures, per_rank, site_lists = {}, {}, {}
        for key, value in rest.items():
            inner = f"{where}.{key}" if where else key
            figure = key.removesuffix("_per_rank")
            if figure != key and figure in data:
                per_rank[figure] = load(tuple[Any, ...], value, inner)
            elif cls._merged_sites(value):
                site_lists[key] = load(tuple[MergedSite, ...], value, inner)
            else:
                figures[key] = value
        return cls(**own, figures=figures, per_rank=per_rank, site_lists=site_lists)

    @staticmethod
    def _merged_sites(value: Json) -> bool:
        return (
            isinstance(value, list)
            and bool(value)
            and all(isinstance(item, dict) and "count_per_rank" in item for item in value)
        )

    @property
    def cost(self) -> Cost:
        """Every rank's cost together."""
        first, *others = self.costs
        return sum(others, first)

    def get(self, name: str, default: Json = None) -> Json:
        """A figure, a site list or a field of the row, by name (what a card's columns name)."""
        if name in self._OWN:
            return getattr(self, name)
        if name in self.site_lists:
            return self.site_lists[name]
        return self.figures.get(name, default)


@dataclass(frozen=True)
class Comparison(Record):
    """One figure compared across trees for one (launch, rank count, scenario)."""

    launch: str
    ranks: int
    scenario: str
    key: str
    trees: tuple[str, ...]
    same: bool
    verdict: str


@dataclass(frozen=True)
class SnippetRuns(Record):
    """The case's one-process snippet and the line it printed on each tree."""

    file: str | None
    sha256: str | None
    output: dict[str, str]


@dataclass(frozen=True)
class ReproResult(Result):
    KIND: ClassVar[str] = "repro"
    DETECTED: ClassVar[bool] = True
    environment: Environment
    trees: dict[str, TreeInfo]
    scenarios: dict[str, str]
    runs: tuple[ScenarioRow, ...]
    comparisons: tuple[Comparison, ...]
    trainer: tuple[TrainerComparison, ...] = field(default=(), metadata=OPTIONAL)
    snippet: SnippetRuns | None = field(default=None, metadata=OPTIONAL)
    nodes: tuple[NodeShare, ...] = field(default=(), metadata=OPTIONAL)
    verdicts: tuple[CostComparison, ...] = field(default=(), metadata=OPTIONAL)


# --- a site judged on one release ----------------------------------------------------------------


class ProbeVerdict(StrEnum):
    """What a probe of a site showed when run on one release: the line read a device value, it
    ran and read none (the value was a Python number there), or it could not be run."""

    READ = "device read"
    NO_READ = "line present, no device read"
    NOT_RUN = "not run"


@dataclass(frozen=True)
class Judgement(Record):
    """One release's site run under the detector: the verdict, what ran, and why it reads that
    way (the reads it saw, or why it did not run), and the pinned projects it ran beside at
    other releases than the pins (`transformers 4.50.0`: those of an older release's day)."""

    version: str
    verdict: ProbeVerdict
    probe: str
    reason: str
    beside: tuple[str, ...] = field(default=(), metadata=OPTIONAL)


@dataclass(frozen=True)
class ProbeReport(Record):
    """What `hostsync.measure.probe` saw in the release's environment: whether the site's lines ran,
    the reads the detector recorded in the site's file (`file:line`), and the error that
    stopped the probe, if one did."""

    reached: tuple[int, ...]
    reads: tuple[str, ...]
    error: str


# --- bench ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FamilyTruth(Record):
    """One family of the labelled suite (scalar reads, formatting, ...): its cases and syncs."""

    cases: int
    syncs: int
    found: int


@dataclass(frozen=True)
class DetectorTruth(Record):
    """The detector on its labelled suite: syncs found at their line, false and missed, by
    family; the undecided cases are left out of the score."""

    cases: int
    syncs_found: int
    false_events: int
    syncs_missed: int
    precision: float
    recall: float
    wrong_lines: tuple[str, ...]
    misses: tuple[str, ...]
    families: dict[str, FamilyTruth]
    undecided: int


@dataclass(frozen=True)
class BenchResult(Result):
    """The detector's truth and cost; with the runs, the reproducer's wall times too."""

    KIND: ClassVar[str] = "bench"
    DETECTED: ClassVar[bool] = True
    detector: DetectorTruth
    op_us: dict[str, dict[str, float]]
    environment: Environment | None = field(default=None, metadata=OPTIONAL)
    runs: dict[str, Json] = field(default_factory=dict, metadata=OPTIONAL)


# --- survey --------------------------------------------------------------------------------------


class SurveyMode(StrEnum):
    """How one run of a project's suite met the pytest plugin."""

    OFF = "off"  # without the plugin
    REPORT = "report"  # --host-sync-report, writing the baseline
    GATE = "gate"  # --host-sync-gate all against that baseline


@dataclass(frozen=True)
class SurveyPass(Record):
    """One run of the slice: its wall time, the CPU time of its processes (steadier than wall
    time on a shared machine), pytest's exit status, its outcomes counted, and the round of
    interleaved runs it belongs to (a result of one round leaves it out)."""

    mode: SurveyMode
    wall_s: float
    cpu_s: float
    returncode: int
    outcomes: dict[str, int]
    round: int = field(default=1, metadata=OPTIONAL)


@dataclass(frozen=True)
class SurveySite(Record):
    """One site over the slice's tests (matched on `Site.identity`, as a baseline)."""

    site: Site = field(metadata=FLAT)
    kinds: tuple[str, ...]
    count: int
    tests: int


@dataclass(frozen=True)
class SurveyResult(Result):
    """A project's own tests run without the plugin, in report mode and gated by the baseline
    the first report wrote, in interleaved rounds: outcomes compared test by test over every
    run, each mode's cost as the median over the rounds of its ratio to the run without the
    plugin of the same round, and the sites the report found."""

    KIND: ClassVar[str] = "survey"
    environment: Environment
    project: str
    version: str
    origin: str
    tests: tuple[str, ...]
    options: tuple[str, ...]
    runs: tuple[SurveyPass, ...]
    collected: int
    differences: tuple[str, ...]
    surveyed_tests: int
    syncing_tests: int
    compiled_tests: int
    sites: tuple[SurveySite, ...]

    @property
    def rounds(self) -> int:
        return max(run.round for run in self.runs)

    def run(self, mode: SurveyMode, round: int = 1) -> SurveyPass:
        return next(run for run in self.runs if (run.mode, run.round) == (mode, round))

    def ratios(self, mode: SurveyMode, cpu: bool = False) -> list[float]:
        """`mode`'s wall (or CPU) time over the run without the plugin, round by round: runs
        next to each other share the machine's load."""
        time = operator.attrgetter("cpu_s" if cpu else "wall_s")
        return [
            time(self.run(mode, round)) / time(self.run(SurveyMode.OFF, round))
            for round in range(1, self.rounds + 1)
        ]

    def ratio(self, mode: SurveyMode) -> float:
        """The median over the rounds of `mode`'s wall-time ratio."""
        return statistics.median(self.ratios(mode))

    def cpu_ratio(self, mode: SurveyMode) -> float:
        """The median over the rounds of `mode`'s CPU-time ratio."""
        return statistics.median(self.ratios(mode, cpu=True))


# --- scan ----------------------------------------------------------------------------------------


class ScanEnd(StrEnum):
    """How a scanned rank's script ended, or that it had not ended (its last snapshot)."""

    RUNNING = "running"  # the rank died, hung or was stopped after this snapshot
    FINISHED = "finished"  # the script ran to its end
    STOPPED = "stopped"  # stopped once it had run the steps `--steps` asked for
    RAISED = "raised"  # the script raised: the rank's `error` says what, and where


@dataclass(frozen=True)
class ScanWait(Record):
    """One host read on a rank's timeline: when (seconds since the rank's script started), its
    kind, where, and the device work it waited for (none: a free read)."""

    at_s: float
    kind: str
    site: Site = field(metadata=FLAT)
    waited_for: DeviceWork


@dataclass(frozen=True)
class ScanStep(Record):
    """One step of a scanned script on one rank: its record as the hunt keeps one (sites, cost,
    the warm-up flag), when it began on the rank's timeline, its host seconds, its reads in
    order. A step runs from the end of the one before (the first, from the script's start)."""

    hunt: HuntStep = field(metadata=FLAT)
    started_s: float
    seconds: float
    waits: tuple[ScanWait, ...]


@dataclass(frozen=True)
class ScanRank(Record):
    """What one rank of a scanned script recorded: its place in the world, how it ended, its
    seconds, its steps, and the reads after its last step (of the whole run where it never
    stepped), which no step holds."""

    rank: int
    world_size: int
    ended: ScanEnd
    seconds: float
    steps: tuple[ScanStep, ...]
    after_last_step: ScanStep | None = field(default=None, metadata=OPTIONAL)
    error: str | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class ScanResult(Result):
    """A user's training script run unchanged under the detector, how it was started, each
    rank's steps, the sites over the ranks and the steps after the warm-up (each with its
    disposition: carried by a case, accepted by known_sites.toml, or a candidate) and the
    cost per step; `partial` says why a run that did not end cleanly is incomplete."""

    KIND: ClassVar[str] = "scan"
    MADE_BY: ClassVar[str] = "`nox -s scan -- SCRIPT`"
    DETECTED: ClassVar[bool] = True
    environment: Environment
    script: str
    args: tuple[str, ...]
    launcher: Launcher
    launcher_args: tuple[str, ...]
    world_size: int
    warmup: int
    steps_asked: int | None
    step_fn: str | None
    allowlist: tuple[AllowRule, ...]
    sites: tuple[HuntSite, ...]
    cost: Cost | None
    ranks: tuple[ScanRank, ...]
    wall_s: float
    partial: str | None = field(default=None, metadata=OPTIONAL)
    # OMP_NUM_THREADS as the ranks were given it (the user's, or `--threads`); None: unset.
    threads: str | None = field(default=None, metadata=OPTIONAL)
