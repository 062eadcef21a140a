"""The records that cross the engine's modules, and the result files made of them.

Each result kind (`ReproResult`, `TestPatchResult`, `ProfileResult`, `HuntResult`,
`BenchResult`, `BisectResult`, `WatchResult`) is a frozen dataclass, so its producer, its readers
and its file agree on one shape. `to_json()` gives the document; `from_json(data)` checks the
type of every field on the way in and raises `RecordError` naming the field (`runs[3].ranks:
...`), to which `results.read` adds the file. The schema version is written into every result
file.

What a case decides the shape of (the figures a rank script reports, a card's columns) stays
JSON (`Json`); everything the engine itself reads is typed. Built on `hostsync.detector.codec` and
`hostsync.detector.sites` alone, so every other module can import it.
"""

from __future__ import annotations

import dataclasses
import operator
import statistics
import typing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, ClassVar, Self

from hostsync.detector.codec import (
    FLAT,
    OPTIONAL,
    Json,
    R,
    Record,
    RecordError,
    Strict,
    dump,
    load,
    shown,
)
from hostsync.detector.records import Cost, DeviceWork, Idle
from hostsync.detector.sites import AllowRule, Site, SiteCount

SCHEMA_VERSION = 4

# --- the vocabulary ------------------------------------------------------------------------------


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


class Device(StrEnum):
    CPU = "cpu"
    CUDA = "cuda"


class Launcher(StrEnum):
    """How a case's reproducer, or a scanned script, starts its ranks (see
    `hostsync.launch.launchers`)."""

    PYTHON = "python"
    FORK = "fork"
    TORCHRUN = "torchrun"
    ACCELERATE = "accelerate"
    DEEPSPEED = "deepspeed"


class TreeRole(StrEnum):
    """What a tree under test is to its case: its pinned release, that release with the case's
    series, upstream's fixed release, or another release."""

    PINNED = "pinned"
    PATCHED = "patched"
    FIXED = "fixed"
    RELEASE = "release"


class Presence(StrEnum):
    """Whether a release's source carries a site (see `hostsync.upstream.presence`): at the
    place its rule names, only elsewhere in the package, not there though the code it lies in
    is (absent), or not there because that code is not (missing: nothing a test could judge)."""

    PRESENT = "present"
    ELSEWHERE = "elsewhere"
    ABSENT = "absent"
    MISSING = "missing"

    @property
    def carried(self) -> bool:
        return self in (Presence.PRESENT, Presence.ELSEWHERE)


class UpstreamState(StrEnum):
    """What upstream knows of a case's bug; it decides which drafts a case sends."""

    NONE = "none"
    ISSUE = "issue"
    OPEN_PR = "open-pr"
    FIXED = "fixed"


class PrChangeSource(StrEnum):
    """Where the patch carrying an open PR's own change was taken from: the PR's diff, or its
    description where no diff is on record (the figures then hold only while the two match)."""

    DIFF = "diff"
    DESCRIPTION = "description"


class ThreadKind(StrEnum):
    """What an upstream thread a card cites is."""

    ISSUE = "issue"
    PR = "pr"


class ThreadState(StrEnum):
    """Where an upstream thread stood when it was read; only a PR is merged."""

    OPEN = "open"
    CLOSED = "closed"
    MERGED = "merged"


# --- trees ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TreeInfo(Record):
    """What a result file says of a tree it measured."""

    project: str
    version: str
    commit: str
    origin: str
    src: str


@dataclass(frozen=True)
class TreeRef(Record):
    """A tree as a check names it."""

    version: str
    commit: str
    origin: str


@dataclass(frozen=True)
class UpstreamTests(Record):
    """Where the tests/ of trees made from an sdist came from: the git repository the user
    named, the commit taken (the release's tag where it has it, else its newest commit), that
    commit's date, how many files its tests/ holds, and the origin of the trees they went into
    (each tree gets those it lacks)."""

    repository: str
    commit: str
    committed: str
    ref: str
    files: int
    tree_origin: str


# --- side files: what one process leaves for another ---------------------------------------------


@dataclass(frozen=True)
class GitState(Record):
    """The workspace's bookkeeping in a clone's or a tree's git dir (`upstream.git`): where the
    clone came from; the commit and the patches/ files (by sha256) it was last seen to match; an
    apply under way, or the patch that failed; the base commit the patches apply on, and a
    tree's patches; the test patches left out for want of upstream's tests."""

    origin: str = field(default="", metadata=OPTIONAL)
    head: str = field(default="", metadata=OPTIONAL)
    series: dict[str, str] = field(default_factory=dict, metadata=OPTIONAL)
    applying: bool = field(default=False, metadata=OPTIONAL)
    failed: str | None = field(default=None, metadata=OPTIONAL)
    base: str = field(default="", metadata=OPTIONAL)
    patches: dict[str, str] = field(default_factory=dict, metadata=OPTIONAL)
    upstream_tests: str = field(default="", metadata=OPTIONAL)  # the commit they came from
    left_out: tuple[str, ...] = field(default=(), metadata=OPTIONAL)


@dataclass(frozen=True)
class LockHolder(Record):
    """Who holds a case's lock, as it wrote itself into the lock file (`locks`)."""

    pid: int
    command: str
    since: str


@dataclass(frozen=True)
class EnvRecord(Record):
    """What an environment under work/envs/ was built with (`upstream.envs`): its interpreter,
    relative to its folder (an older record's is absolute), the specs installed, and what that
    installed, by canonical name."""

    python: str
    specs: tuple[str, ...]
    installed: dict[str, str]


@dataclass(frozen=True)
class NodeNote(Record):
    """What a node leaves beside its share of a world's rank files (`nodes`): which node, on
    which host, ran which ranks of which world, or why it has no results."""

    node: int
    host: str
    world: str
    ranks: tuple[int, ...]
    failure: str | None = None


@dataclass(frozen=True)
class ForkWorld(Record):
    """One world the fork launcher runs: its rank count, run folder, arguments and variables."""

    ranks: int
    run_dir: str
    args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ForkSnippet(Record):
    """The case's snippet, run after the worlds from the same interpreter, its output in `log`."""

    script: str
    log: str
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ForkPlan(Record):
    """What `hostsync.rank.prefork` runs: the script it imports once, then each world of it, and
    the snippet; with `keep_going` a failed world does not stop the next ones."""

    script: str
    worlds: tuple[ForkWorld, ...]
    keep_going: bool = False
    snippet: ForkSnippet | None = None


@dataclass(frozen=True)
class ForkTree(Record):
    """One tree's plan in an interpreter the trees of one environment share: its `ForkPlan`, the
    tree's entries for the front of sys.path, its own variables, and where how it ended goes (a
    `SnippetExit`)."""

    plan: ForkPlan
    path: tuple[str, ...]
    env: dict[str, str]
    exit: str


@dataclass(frozen=True)
class SharedForkPlan(Record):
    """What `hostsync.rank.prefork` runs for trees of one environment: each in a fork of one
    interpreter that imported what their script imports before the project under test."""

    trees: tuple[ForkTree, ...]


@dataclass(frozen=True)
class SnippetExit(Record):
    """How a snippet, or a tree's plan in a shared interpreter, ended in a fork of the fork
    launcher's interpreter (`hostsync.rank.prefork`)."""

    exit_status: int
    seconds: float


@dataclass(frozen=True)
class RanOn(Record):
    """The node, and its host, that ran a rank of a world run across nodes."""

    node: int
    host: str


@dataclass(frozen=True)
class RankReport(Record):
    """What one rank returned, as `protocol.rank_entry` writes it into the run folder: its rank,
    the payload its script returned, which each command reads with its own record
    (`read`), and, once pooled across nodes, the node that ran it."""

    rank: int
    payload: dict[str, Json]
    ran_on: RanOn | None = field(default=None, metadata=OPTIONAL)

    def read(self, kind: type[R]) -> R:
        """The payload as the record `kind`, every field checked; a bad one names the rank."""
        return kind.from_json(self.payload, f"rank {self.rank}")


# --- what every result file holds ----------------------------------------------------------------


@dataclass(frozen=True)
class Provenance(Record):
    """The inputs a result depends on, by sha256: when one changes, the result is stale.
    `case_sha256` is the card less its `[upstream]` table (`provenance.card_digest`);
    `detector_sha256` is the detector and its op table (`provenance.detector_digest`), which
    decide what a measuring result counts; "" in a result that recorded none."""

    pin_sha256: str
    case_sha256: str
    patches: dict[str, str]
    scripts: dict[str, str]
    detector_sha256: str = field(default="", metadata=OPTIONAL)


@dataclass(frozen=True)
class Stamp(Record):
    """Who made a result, when, from what: the keys every result file starts with."""

    created: str
    command: str
    case: str
    provenance: Provenance

    @classmethod
    def now(cls, command: str, case: str, provenance: Provenance) -> Stamp:
        created = datetime.now(UTC).replace(microsecond=0)
        return cls(created.isoformat().replace("+00:00", "Z"), command, case, provenance)

    @property
    def time(self) -> datetime:
        return datetime.fromisoformat(self.created.replace("Z", "+00:00"))


@dataclass(frozen=True)
class Result(Record):
    """A result file: its stamp at the top level, then what its kind measured. `DETECTED`: its
    figures are what the detector counted, so another detector makes it stale."""

    KIND: ClassVar[str] = ""
    # What writes this kind of result, so what replaces a bad one; most kinds have a session.
    MADE_BY: ClassVar[str] = ""
    DETECTED: ClassVar[bool] = False
    stamp: Stamp = field(metadata=FLAT)

    @classmethod
    def made_by(cls) -> str:
        return cls.MADE_BY or f"`nox -s {cls.KIND}`"

    def document(self) -> dict[str, Json]:
        return {"kind": self.KIND, "schema": SCHEMA_VERSION, **self.to_json()}


@dataclass(frozen=True)
class Environment(Record):
    """What an interpreter offers: Python, the installed versions of the packages the
    projects name, the device and platform. The packages sit at the top level in the file."""

    python: str
    packages: dict[str, str] = field(metadata=FLAT)
    platform: str
    device: str  # the first GPU's name, or cpu
    device_count: int
    devices: tuple[str, ...] = field(default=(), metadata=OPTIONAL)

    def with_devices(self, devices: list[str]) -> Environment:
        """This environment, naming the devices a run used."""
        return dataclasses.replace(self, devices=tuple(devices))

    @property
    def versions(self) -> dict[str, str]:
        """Python and the packages: what a report lists as the versions it ran with."""
        return {"python": self.python, **self.packages}


@dataclass(frozen=True)
class NodeShare(Record):
    """Per-node provenance of a world run across nodes: which node, on which host, ran which of
    its ranks (global RANKs: torchrun's c10d rendezvous orders the nodes itself)."""

    world: str
    node_rank: int
    host: str
    ranks: tuple[int, ...]


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
class RankRow(Record):
    """One scenario as one rank's script reports it (`ReproRank`): the counts every case reports,
    typed (`host_syncs`, the reads no rule accepts, where the script counts them; `problems`;
    `cost`, where it accounts), its lists of sites by figure name (`site_lists`: the scope's
    `sync_sites()`, or sites the script picked), and the case's own figures (values, flags) as
    they are."""

    scenario: str
    host_syncs: int | None = field(default=None, metadata=OPTIONAL)
    problems: tuple[str, ...] = field(default=(), metadata=OPTIONAL)
    cost: Cost | None = field(default=None, metadata=OPTIONAL)
    site_lists: dict[str, tuple[SiteCount, ...]] = field(default_factory=dict, metadata=OPTIONAL)
    figures: dict[str, Json] = field(default_factory=dict, metadata=FLAT)


@dataclass(frozen=True)
class ReproRank(Record):
    """What a case's rank script returns to `repro`: one row per scenario asked, in order."""

    runs: tuple[RankRow, ...]


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
class TrainerComparison(Record):
    """The full Trainer path's per-step loss with SP against the same training without."""

    tree: str
    steps: int
    sp_size: int
    device: Device
    sp: tuple[float, ...]
    sp_ranks_agree: bool
    no_sp: tuple[float, ...]
    abs_diff: tuple[float, ...]
    max_abs_diff: float
    grad_norm: dict[str, tuple[float | None, ...]]


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


# --- test_patch ----------------------------------------------------------------------------------


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


# --- profile -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfiledRank(Record):
    """What a profile rank script returns (`rankkit.profiled_rank`): where the rank ran, the
    steps recorded, each measured range's seconds and its trace file (None under nsys, whose
    report is the record); `more`, the script's own figures."""

    rank: int
    world_size: int
    backend: str
    device: str  # the torch device the rank ran on, with its index (cuda:0)
    scenario: str
    warmup_steps: int
    steps: int
    range_seconds: tuple[float, ...]
    trace: str | None
    more: dict[str, Json] = field(default_factory=dict, metadata=FLAT)


@dataclass(frozen=True)
class Timeline(Record):
    """One step drawn: spans and marks in ms from the start of its measured range."""

    forward_ms: tuple[tuple[float, ...], ...]
    sync_ms: tuple[float, ...]
    gpu_busy_ms: tuple[tuple[float, ...], ...] | None
    dtoh_ms: tuple[float, ...] | None
    range_ms: float | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class StepFigures(Record):
    """What the PyTorch profiler saw inside one measured range (None: not on this device)."""

    range_ms: float
    ops: dict[str, float]
    ops_in_forward: dict[str, float]
    cuda_calls: dict[str, float] | None
    dtoh_copies: float | None
    dtoh_bytes: float | None
    gpu_idle_ms: float | None
    timeline: Timeline


@dataclass(frozen=True)
class NsysFigures(Record):
    """What `nsys stats` reports inside the measured ranges, per step (the largest over ranks of
    each rank's mean, as `StepFigures`); `ranges`: the measured ranges it saw over all ranks,
    `steps`: the most of one rank."""

    cuda_calls: dict[str, float]
    dtoh_copies: float
    dtoh_bytes: float
    range_ms: float
    ranges: int
    steps: int


@dataclass(frozen=True)
class Capture(Record):
    """One tree's profiled run: its per-step figures (PyTorch profiler) or nsys's."""

    tree: str
    version: str
    commit: str
    backend: str
    world_size: int
    device: str  # its first rank's, as `ProfiledRank` has it
    profiler: str
    command: str
    wall_s: float
    artifacts: tuple[str, ...]
    per_step: StepFigures | None = field(default=None, metadata=OPTIONAL)
    nsys: NsysFigures | None = field(default=None, metadata=OPTIONAL)
    nsys_version: str | None = field(default=None, metadata=OPTIONAL)
    nodes: tuple[NodeShare, ...] = field(default=(), metadata=OPTIONAL)

    @property
    def figures(self) -> StepFigures | NsysFigures:
        """The figures it holds: the PyTorch profiler's, else nsys's."""
        figures = self.per_step or self.nsys
        if figures is None:
            raise RecordError("per_step", "a capture holds the profiler's figures or nsys's")
        return figures


@dataclass(frozen=True)
class ProfiledScenario(Record):
    """The card's scenario a profile measured, and on how many ranks."""

    scenario: str
    ranks: int


@dataclass(frozen=True)
class RegionLabels(Record):
    """The card's words for the measured range and the part of it measured apart."""

    measured: str
    excluded: str


@dataclass(frozen=True)
class ProfileResult(Result):
    KIND: ClassVar[str] = "profile"
    environment: Environment
    trees: dict[str, TreeInfo]
    setting: ProfiledScenario
    labels: RegionLabels
    warmup_steps: int
    steps: int
    notes: tuple[str, ...]
    captures: tuple[Capture, ...]

    @property
    def on_gpu(self) -> bool:
        return any(c.device.startswith("cuda") for c in self.captures)


# --- GPU evidence --------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuTreeFigures(Record):
    """One tree's measured call on a GPU, per step: the host reads (PyTorch profiler), the
    device-to-host copies and synchronising CUDA calls it launched (CUDA profiler), the warnings
    of `torch.cuda.set_sync_debug_mode("warn")`, and Nsight Systems' count where it ran; for a
    case's profiled step, its wall time (CUDA events) and the GPU's idle time between kernels,
    medians in ms. The GPU's figures are None from a dry run on a CPU."""

    tree: str
    version: str
    host_reads: float
    dtoh_copies: float | None
    dtoh_bytes: float | None
    cuda_calls: dict[str, float] | None
    sync_warnings: float | None
    nsys: NsysFigures | None = field(default=None, metadata=OPTIONAL)
    step_ms: float | None = field(default=None, metadata=OPTIONAL)
    gpu_idle_ms: float | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class GpuResult(Result):
    """A case's call measured on one GPU (`gpu/case_on_gpu.py`), for the drafts' GPU evidence."""

    KIND: ClassVar[str] = "gpu"
    MADE_BY: ClassVar[str] = "`measure` of the `gpu/` script on a GPU machine"
    device: str  # the GPU's name, or cpu for a dry run
    torch: str
    dry_run: bool
    warmup_steps: int
    steps: int
    trees: dict[str, TreeInfo]
    figures: tuple[GpuTreeFigures, ...]


# --- hunt ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HuntPlan(Record):
    """Which steps the detector watched, which one the profiler watched, and its twin."""

    steps: int
    logging_steps: int
    profile: int
    twin: int


@dataclass(frozen=True)
class HuntSite(Record):
    """One host-sync site of a hunted tree, from one caller, over all ranks and steps, with its
    verdict."""

    package: str
    site: Site = field(metadata=FLAT)
    caller: str
    kinds: tuple[str, ...]
    steps: tuple[int, ...]
    when: str
    per_step: int
    rate: float
    carried: str | None
    allowed: str | None
    # Of `rate`, the reads that stalled: device work was queued since the host last waited.
    stall_rate: float = field(default=0.0, metadata=OPTIONAL)
    # The idle windows after the site's stalls in the steady steps, every rank's; `idle_rate`
    # their sum per rank per step (microseconds of host time, measured on CPU).
    idle: Idle = field(default=Idle(), metadata=OPTIONAL)
    idle_rate: float = field(default=0.0, metadata=OPTIONAL)

    @property
    def key(self) -> tuple[str, str, str, str]:
        """What names a hunted site across releases: its site's identity and its caller, as a
        read inside a shared helper is paid by each caller, and each is judged on its own."""
        return (*self.site.identity, self.caller)


@dataclass(frozen=True)
class ProfilerOnly(Record):
    """Scalar reads the profiler saw beyond what the detector saw in the same function."""

    package: str
    file: str
    function: str
    via: str
    count: int
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class CrossCheck(Record):
    rank: int
    profiler: int
    detector: int


@dataclass(frozen=True)
class StepSite(Record):
    """A sync site of one hunted step on one rank: the kind of wait, where, which function
    called it (a read in a shared helper is paid for by its caller), how often, and how many of
    those stalled."""

    kind: str
    site: Site = field(metadata=FLAT)
    caller: str
    count: int
    stalls: int


@dataclass(frozen=True)
class HuntStep(Record):
    """One optimizer step under the detector, on one rank: whether it is the warm-up or logs,
    its sites, its cost, and the reads of host memory (no wait on a GPU)."""

    step: int
    warmup: bool
    logging: bool
    sites: tuple[StepSite, ...]
    cost: Cost
    host_reads: int


@dataclass(frozen=True)
class ProfiledRead(Record):
    """Scalar reads the PyTorch profiler saw in the profiled step: the Python function that led
    to them and, where it was not a plain `.item()`, the kernel they were made in (`via`)."""

    step: int
    logging: bool
    file: str
    function: str
    via: str | None
    count: int


@dataclass(frozen=True)
class HuntRecording(Record):
    """What one rank of a hunted run recorded: its detected steps, the profiled step's reads,
    and, where its steps ran compiled, why they were not judged."""

    steps: tuple[HuntStep, ...]
    profiled: tuple[ProfiledRead, ...]
    not_judged: str | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class LoggedStep(Record):
    """What the Trainer (or the loop) logged at one optimizer step."""

    loss: float
    grad_norm: float | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class TrainerRank(Record):
    """What one rank of the engine's Trainer worker (`rank/workers/trainer.py`) returns: the
    groups it formed, where it ran, the model, what it logged by step, its seconds, and, when
    hunting, what it recorded."""

    world_size: int
    sp_size: int
    device: Device
    backend: str
    model: str
    logged: dict[str, LoggedStep]
    seconds: float
    hunt: HuntRecording | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class HuntRank(Record):
    """One rank's hunt record as a hunt or census result keeps it: its rank, where it ran, the
    model, and what it recorded."""

    rank: int
    device: Device
    backend: str
    model: str
    hunt: HuntRecording = field(metadata=FLAT)


@dataclass(frozen=True)
class HuntTree(Record):
    """One tree in one DeepSpeed setup: its sites, or why it could not be measured."""

    label: str
    tree: str
    setup: str
    info: TreeInfo = field(metadata=FLAT)
    stacked: tuple[str, ...]
    seconds: float
    error: str | None = field(default=None, metadata=OPTIONAL)
    # Why its steps were not judged though it ran (a torch.compile'd region): no sites then.
    not_judged: str | None = field(default=None, metadata=OPTIONAL)
    plan: HuntPlan | None = field(default=None, metadata=OPTIONAL)
    sites: tuple[HuntSite, ...] = ()
    profiler_only: tuple[ProfilerOnly, ...] = ()
    cross_check: tuple[CrossCheck, ...] = ()
    ranks: tuple[HuntRank, ...] = ()
    nodes: tuple[NodeShare, ...] = field(default=(), metadata=OPTIONAL)
    # Reads, stalls and device work over every rank's steps after the warm-up.
    cost: Cost | None = field(default=None, metadata=OPTIONAL)

    @property
    def measured(self) -> bool:
        return self.error is None and self.not_judged is None


@dataclass(frozen=True)
class HuntSetup(Record):
    world_size: int
    sp_size: int
    model: str
    device: Device
    backend: str
    versions: dict[str, str]


@dataclass(frozen=True)
class HuntResult(Result):
    KIND: ClassVar[str] = "hunt"
    DETECTED: ClassVar[bool] = True
    setup: HuntSetup
    allowlist: tuple[AllowRule, ...]
    trees: tuple[HuntTree, ...]

    @property
    def measured(self) -> tuple[HuntTree, ...]:
        return tuple(tree for tree in self.trees if tree.measured)


# --- census --------------------------------------------------------------------------------------


class TrainerKind(StrEnum):
    """Which training loop a census setup runs: the Trainer, one of TRL's trainers, or a loop
    of a user's own over accelerate (prepare, backward, clip_grad_norm_, step)."""

    TRAINER = "Trainer"
    SFT = "SFTTrainer"
    DPO = "DPOTrainer"
    REWARD = "RewardTrainer"
    GRPO = "GRPOTrainer"
    ACCELERATE_LOOP = "accelerate-loop"


class Precision(StrEnum):
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


@dataclass(frozen=True)
class CensusSetup(Strict):
    """One training setup users run, as `census.toml` describes it: the trainer, how many ranks,
    DeepSpeed's ZeRO stage (0: none; several ranks then train with DDP), the precision, and the
    options that change which code a step runs."""

    about: str
    trainer: TrainerKind = TrainerKind.TRAINER
    ranks: int = 1
    zero_stage: int = 0
    # FSDP2 (torch's fully_shard) over the ranks, as the Trainer or accelerate set it up.
    fsdp: bool = False
    precision: Precision = Precision.FP32
    sp: bool = False
    batch_size: int = 1
    gradient_accumulation_steps: int = 1
    gradient_checkpointing: bool = False
    packing: bool = False
    padding_free: bool = False
    lora: bool = False
    logging_steps: int = 1
    eval_steps: int = 0
    num_input_tokens_seen: bool = False
    # The Trainer compiles the model (torch.compile): reported as compiled, not judged.
    torch_compile: bool = False
    # Left out of the default matrix (`census --setups NAME` runs it).
    extra: bool = False


@dataclass(frozen=True)
class CensusTrees(Record):
    """What one column of the census ran: the tree under test, the trees imported beside it,
    and the cases whose series they carry (none: the releases as published)."""

    tree: TreeInfo
    stacked: tuple[TreeInfo, ...]
    cases: tuple[str, ...]


@dataclass(frozen=True)
class CensusResult(Result):
    """Every host sync of every census setup, on the releases as published (`today`) and with
    every carried fix applied (`fixed`): one hunt record per setup and column."""

    KIND: ClassVar[str] = "census"
    DETECTED: ClassVar[bool] = True
    environment: Environment
    steps: int
    setups: dict[str, CensusSetup]
    columns: dict[str, CensusTrees]
    allowlist: tuple[AllowRule, ...]
    runs: tuple[HuntTree, ...]
    wall_s: float


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


# --- bisect and watch ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding(Record):
    """One site in one source tree: whether it is there, and where (each `Site`'s file from the
    tree's top, its function as `Class.method`)."""

    presence: Presence
    found: tuple[Site, ...] = ()


@dataclass(frozen=True)
class ReleaseEvidence(Record):
    """One release a bisect read: its sdist, the site's finding in it, and, where the case's
    tests could be run on it (`--tests`), their checks."""

    version: str
    uploaded: str
    sdist_sha256: str
    finding: Finding = field(metadata=FLAT)
    judged: tuple[CheckRecord, ...] = field(default=(), metadata=OPTIONAL)


class ProbeVerdict(StrEnum):
    """What a probe of a site showed when run on one release: the line read a device value, it
    ran and read none (the value was a Python number there), or it could not be run."""

    READ = "device read"
    NO_READ = "line present, no device read"
    NOT_RUN = "not run"


@dataclass(frozen=True)
class CommitEvidence(Record):
    """One commit a narrowing read: the site's presence, and where it was run, the verdict."""

    commit: str
    date: str
    subject: str
    presence: Presence
    verdict: ProbeVerdict | None = field(default=None, metadata=OPTIONAL)


class Change(StrEnum):
    """What happened to a site between two releases."""

    ADDED = "added"
    REMOVED = "removed"
    READING = "made a device read"  # the line was there; its value became a device tensor


@dataclass(frozen=True)
class GitNarrowing(Record):
    """The commits between two releases, the site's state changing between them (the
    first-parent path of `older..newer`), bisected on presence down to the first commit in the
    newer state, and the pull request that commit names."""

    remote: str
    older: str
    newer: str
    change: Change
    commits: int
    probed: tuple[CommitEvidence, ...]
    first: CommitEvidence | None
    pull_request: int | None
    note: str = field(default="", metadata=OPTIONAL)


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


class Decided(StrEnum):
    """What a boundary of a site's history rests on."""

    TEXT = "text match"
    JUDGED = "judged run"


@dataclass(frozen=True)
class Boundary(Record):
    """Where a site's reads begin (`side` first) or end (last), between the releases `older`
    (None: the oldest searched) and `newer`, and how that was decided: a judged run on both
    sides, else the source's text (its syntax tree) alone, with the runs tried; `stated` is
    how a draft says it: the release and what it rests on."""

    side: str
    older: str | None
    newer: str
    decided: Decided
    stated: str
    judged: tuple[Judgement, ...] = ()


@dataclass(frozen=True)
class SiteHistory(Record):
    """Since which release a site is there, and until which: the releases searched (final
    ones with an sdist, oldest first), the one the search started from, the boundaries with
    their neighbours, and every release read."""

    project: str
    site: AllowRule
    searched: tuple[str, ...]
    anchor: str
    first: str
    last: str
    before_first: str | None
    after_last: str | None
    contiguous: bool
    notes: tuple[str, ...]
    releases: tuple[ReleaseEvidence, ...]
    narrowed: tuple[GitNarrowing, ...] = field(default=(), metadata=OPTIONAL)
    boundaries: tuple[Boundary, ...] = field(default=(), metadata=OPTIONAL)


@dataclass(frozen=True)
class BisectResult(Result):
    KIND: ClassVar[str] = "bisect"
    index: str
    sites: tuple[SiteHistory, ...]


@dataclass(frozen=True)
class ProjectWatch(Record):
    """A project's newest release on the index against the release pin.toml installs, and
    (asked for) the sites the hunt finds in the newest that it does not find in the pinned."""

    project: str
    pinned: str
    newest: str
    uploaded: str
    newer: tuple[str, ...]
    hunt: str = field(default="", metadata=OPTIONAL)
    new_sites: tuple[HuntSite, ...] = field(default=(), metadata=OPTIONAL)


@dataclass(frozen=True)
class SiteWatch(Record):
    """One of a case's sites in its project's newest release; judged by running there when
    asked (`watch --tests`), as bisect --judge judges a release."""

    project: str
    version: str
    site: AllowRule
    finding: Finding = field(metadata=FLAT)
    judged: Judgement | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class CaseWatch(Record):
    """One case against the newest releases: each of its sites in the newest release of its
    project, whether its series applies there, and (asked for) how its tests go there."""

    case: str
    project: str
    pinned: str
    newest: str
    provenance: Provenance
    fixed: str | None
    sites: tuple[SiteWatch, ...]
    series: str
    tests: tuple[CheckRecord, ...] = field(default=(), metadata=OPTIONAL)


@dataclass(frozen=True)
class WatchResult(Result):
    KIND: ClassVar[str] = "watch"
    index: str
    projects: tuple[ProjectWatch, ...]
    cases: tuple[CaseWatch, ...]


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


KINDS: dict[str, type[Result]] = {
    kind.KIND: kind
    for kind in (
        ReproResult,
        TestPatchResult,
        ProfileResult,
        HuntResult,
        CensusResult,
        BenchResult,
        BisectResult,
        WatchResult,
        GpuResult,
        SurveyResult,
        ScanResult,
    )
}
