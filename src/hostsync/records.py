"""The records that cross the engine's modules, and the result files made of them.

Each result kind (`ReproResult`, `TestPatchResult`, `ProfileResult`, `HuntResult`,
`BenchResult`, `BisectResult`, `WatchResult`) is a frozen dataclass, so its producer, its readers
and its file agree on one shape. `to_json()` gives the document; `from_json(data)` checks the
type of every field on the way in and raises `RecordError` naming the field (`runs[3].ranks:
...`), to which `results.read` adds the file. The schema version is written into every result
file.

What a case decides the shape of (the figures a rank script reports, a card's columns) stays
JSON (`Json`); everything the engine itself reads is typed. Standard library only: this module
sits at the bottom of the engine's imports.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Self

from hostsync.projects import Project
from hostsync.sites import AllowRule

SCHEMA_VERSION = 4
Json = Any  # None, bool, int, float, str, list of Json, or dict of str to Json
# A field's metadata: its keys sit at the top level of the enclosing document.
FLAT = {"flat": True}
# A field's metadata: left out of the document while it holds its default.
OPTIONAL = {"optional": True}


class RecordError(ValueError):
    """A document that does not hold a record: `where` is the field's path in it."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}" if where else problem)
        self.where, self.problem = where, problem


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
    """How a case's reproducer starts its ranks (see `hostsync.launchers`)."""

    PYTHON = "python"
    FORK = "fork"
    TORCHRUN = "torchrun"
    ACCELERATE = "accelerate"


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


# --- the JSON codec ------------------------------------------------------------------------------


class Record:
    """A frozen dataclass that reads and writes itself as JSON, field by field."""

    def to_json(self) -> dict[str, Json]:
        out: dict[str, Json] = {}
        for item in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, item.name)
            if item.metadata.get("optional") and value == _default(item):
                continue
            if item.metadata.get("flat"):
                out.update(dump(value))
            else:
                out[item.name] = dump(value)
        return out

    @classmethod
    def from_json(cls, data: Json, where: str = "") -> Self:
        if not isinstance(data, dict):
            raise RecordError(where, f"expected an object, got {_shown(data)}")
        hints = typing.get_type_hints(cls)
        values = {}
        for item in dataclasses.fields(cls):  # type: ignore[arg-type]
            inner = f"{where}.{item.name}" if where else item.name
            kind = hints[item.name]
            if item.metadata.get("flat"):
                # A flat record reads its own keys; a flat mapping the keys no field claims.
                unclaimed = {k: v for k, v in data.items() if k not in _claimed(cls)}
                values[item.name] = load(kind, data if _is_record(kind) else unclaimed, where)
            elif item.name in data:
                values[item.name] = load(kind, data[item.name], inner)
            elif _default(item) is dataclasses.MISSING:
                raise RecordError(inner, "is missing")
        return cls(**values)


class Strict(Record):
    """A table written by hand (a case card, a census setup): keys it does not know are refused,
    since a typo would otherwise be ignored."""

    @classmethod
    def from_json(cls, data: Json, where: str = "") -> Self:
        if isinstance(data, dict):
            known = {item.name for item in dataclasses.fields(cls)}  # type: ignore[arg-type]
            unknown = sorted(set(data) - known)
            if unknown:
                raise RecordError(where, f"has unknown keys {unknown}: use {sorted(known)}")
        return super().from_json(data, where)


def _is_record(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, Record)


def _claimed(cls: type) -> set[str]:
    """The keys of a document that `cls`'s fields read: its own names, and those of the records
    flattened into it."""
    hints = typing.get_type_hints(cls)
    found = set()
    for item in dataclasses.fields(cls):
        if not item.metadata.get("flat"):
            found.add(item.name)
        elif _is_record(hints[item.name]):
            found |= _claimed(hints[item.name])
    return found


def _default(item: dataclasses.Field) -> Any:
    if item.default is not dataclasses.MISSING:
        return item.default
    if item.default_factory is not dataclasses.MISSING:
        return item.default_factory()
    return dataclasses.MISSING


def dump(value: Any) -> Json:
    """A record, enum or container of them as plain JSON values."""
    if isinstance(value, Record):
        return value.to_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: dump(v) for k, v in dataclasses.asdict(value).items() if v is not None}
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, tuple | list):
        return [dump(item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): dump(item) for key, item in value.items()}
    if isinstance(value, Path):
        return str(value)
    return value


def load(kind: Any, data: Json, where: str) -> Any:
    """`data` as a value of type `kind`, checked all the way down."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return data
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        problems = []
        for option in (a for a in args if a is not type(None)):
            try:
                return load(option, data, where)
            except RecordError as error:
                problems.append(error.problem)
        raise RecordError(where, " or ".join(dict.fromkeys(problems)))
    if origin is tuple:
        if not isinstance(data, list):
            raise RecordError(where, f"expected a list, got {_shown(data)}")
        item = args[0]
        return tuple(load(item, value, f"{where}[{i}]") for i, value in enumerate(data))
    if origin in (dict, Mapping):
        if not isinstance(data, dict):
            raise RecordError(where, f"expected an object, got {_shown(data)}")
        return {key: load(args[1], value, f"{where}.{key}") for key, value in data.items()}
    if isinstance(kind, type) and issubclass(kind, StrEnum):
        if data not in {member.value for member in kind}:
            choices = ", ".join(repr(member.value) for member in kind)
            raise RecordError(where, f"expected one of {choices}, got {_shown(data)}")
        return kind(data)
    if isinstance(kind, type) and issubclass(kind, Record):
        return kind.from_json(data, where)
    if dataclasses.is_dataclass(kind):
        return _plain_dataclass(kind, data, where)
    return _scalar(kind, data, where)


def _plain_dataclass(kind: type, data: Json, where: str) -> Any:
    if not isinstance(data, dict):
        raise RecordError(where, f"expected an object, got {_shown(data)}")
    hints = typing.get_type_hints(kind)
    names = {item.name for item in dataclasses.fields(kind)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise RecordError(where, f"has unknown keys {unknown}")
    try:
        return kind(**{k: load(hints[k], v, f"{where}.{k}") for k, v in data.items()})
    except TypeError as error:
        raise RecordError(where, str(error)) from None


_SCALARS = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def _scalar(kind: type, data: Json, where: str) -> Any:
    if kind is float and isinstance(data, int) and not isinstance(data, bool):
        return data  # a JSON number; kept as written, so a file reads back byte for byte
    if kind in _SCALARS:
        if not isinstance(data, kind) or (kind is int and isinstance(data, bool)):
            raise RecordError(where, f"expected {_SCALARS[kind]}, got {_shown(data)}")
        return data
    if kind is type(None):
        if data is not None:
            raise RecordError(where, f"expected null, got {_shown(data)}")
        return None
    raise TypeError(f"records cannot hold {kind!r}")  # a programming error, not bad input


def _shown(data: Json) -> str:
    text = repr(data)
    return text if len(text) <= 40 else text[:37] + "..."


# --- trees ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tree:
    """One source tree under test, imported by path, run by the interpreter `python`."""

    label: str
    role: TreeRole
    root: Path
    version: str
    commit: str
    origin: str
    project: Project
    python: str = ""
    # Other cases' patched trees imported with it (other projects), e.g. to hunt with every
    # carried fix applied.
    stacked: tuple[Path, ...] = ()

    @property
    def src(self) -> Path:
        """What goes first on PYTHONPATH to import the project from this tree."""
        return (self.root / self.project.import_root).resolve()

    def info(self, workspace: Path) -> TreeInfo:
        return TreeInfo(
            project=self.project.name,
            version=self.version,
            commit=self.commit,
            origin=self.origin,
            src=str(self.src.relative_to(workspace.resolve())),
        )


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


# --- what every result file holds ----------------------------------------------------------------


@dataclass(frozen=True)
class Provenance(Record):
    """The inputs a result depends on, by sha256: when one changes, the result is stale."""

    pin_sha256: str
    case_sha256: str
    patches: dict[str, str]
    scripts: dict[str, str]


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
    """A result file: its stamp at the top level, then what its kind measured."""

    KIND: ClassVar[str] = ""
    stamp: Stamp = field(metadata=FLAT)

    def document(self) -> dict[str, Json]:
        return {"kind": self.KIND, "schema": SCHEMA_VERSION, **self.to_json()}


@dataclass(frozen=True)
class Environment(Record):
    """What an interpreter offers: Python, the installed versions of the packages the
    projects name, the device and platform. The packages sit at the top level in the file."""

    python: str
    packages: dict[str, str] = field(metadata=FLAT)
    platform: str
    device: str
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


# --- repro ---------------------------------------------------------------------------------------


def is_site_list(value: Json) -> bool:
    """A figure that lists host-sync sites: objects with a file and a line each."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(v, dict) and "file" in v and "line" in v for v in value)
    )


@dataclass(frozen=True)
class RunRow(Record):
    """One (tree, launch, rank count, scenario) of a repro: the figures the case's rank script
    reported, merged over the ranks. A figure the ranks disagree on keeps every rank's value
    in `per_rank`; the file holds it beside the figure as `<name>_per_rank`."""

    tree: str
    launch: str
    ranks: int
    scenario: str
    figures: dict[str, Json] = field(default_factory=dict)
    per_rank: dict[str, tuple[Json, ...]] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    _OWN: ClassVar = ("tree", "launch", "ranks", "scenario", "problems")

    def to_json(self) -> dict[str, Json]:
        out: dict[str, Json] = {
            "tree": self.tree, "launch": self.launch, "ranks": self.ranks,
            "scenario": self.scenario,
        }  # fmt: skip
        for name, value in self.figures.items():
            out[name] = value
            if name in self.per_rank:
                out[f"{name}_per_rank"] = list(self.per_rank[name])
        out["problems"] = list(self.problems)
        return out

    @classmethod
    def from_json(cls, data: Json, where: str = "") -> Self:
        if not isinstance(data, dict):
            raise RecordError(where, f"expected an object, got {_shown(data)}")
        hints = typing.get_type_hints(cls)
        own = {}
        for name in cls._OWN:
            inner = f"{where}.{name}" if where else name
            if name not in data and name != "problems":
                raise RecordError(inner, "is missing")
            if name in data:
                own[name] = load(hints[name], data[name], inner)
        rest = {k: v for k, v in data.items() if k not in cls._OWN}
        figures, per_rank = {}, {}
        for key, value in rest.items():
            figure = key.removesuffix("_per_rank")
            if figure != key and figure in rest:
                per_rank[figure] = load(tuple[Any, ...], value, f"{where}.{key}")
            else:
                figures[key] = value
        return cls(**own, figures=figures, per_rank=per_rank)

    def get(self, name: str, default: Json = None) -> Json:
        """A figure, or a field of the row, by name (what a card's columns name)."""
        if name in self._OWN:
            return getattr(self, name)
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
    device: str
    sp: tuple[float, ...]
    sp_ranks_agree: bool
    no_sp: tuple[float, ...]
    abs_diff: tuple[float, ...]
    max_abs_diff: float
    grad_norm: dict[str, tuple[float | None, ...]]


@dataclass(frozen=True)
class SnippetExit(Record):
    """How a snippet run in the fork launcher's interpreter ended (`hostsync.prefork`)."""

    exit_status: int
    seconds: float


@dataclass(frozen=True)
class SnippetRuns(Record):
    """The case's one-process snippet and the line it printed on each tree."""

    file: str | None
    sha256: str | None
    output: dict[str, str]


@dataclass(frozen=True)
class ReproResult(Result):
    KIND: ClassVar[str] = "repro"
    environment: Environment
    trees: dict[str, TreeInfo]
    scenarios: dict[str, str]
    runs: tuple[RunRow, ...]
    comparisons: tuple[Comparison, ...]
    trainer: tuple[TrainerComparison, ...] = field(default=(), metadata=OPTIONAL)
    snippet: SnippetRuns | None = field(default=None, metadata=OPTIONAL)
    nodes: tuple[NodeShare, ...] = field(default=(), metadata=OPTIONAL)


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


# --- profile -------------------------------------------------------------------------------------


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
    device: str
    profiler: str
    command: str
    wall_s: float
    artifacts: tuple[str, ...]
    per_step: StepFigures | None = field(default=None, metadata=OPTIONAL)
    nsys: NsysFigures | None = field(default=None, metadata=OPTIONAL)
    nsys_version: str | None = field(default=None, metadata=OPTIONAL)
    nodes: tuple[NodeShare, ...] = field(default=(), metadata=OPTIONAL)


@dataclass(frozen=True)
class ProfileSetting(Record):
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
    setting: ProfileSetting
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
    of `torch.cuda.set_sync_debug_mode("warn")`, and Nsight Systems' count where it ran. The
    GPU's figures are None from a dry run on a CPU."""

    tree: str
    version: str
    host_reads: float
    dtoh_copies: float | None
    dtoh_bytes: float | None
    cuda_calls: dict[str, float] | None
    sync_warnings: float | None
    nsys: NsysFigures | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class GpuResult(Result):
    """A case's call measured on one GPU (`gpu/`'s scripts), for the drafts' GPU evidence."""

    KIND: ClassVar[str] = "gpu"
    device: str
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
    """One host-sync site of a hunted tree, over all ranks and steps, with its verdict."""

    package: str
    file: str
    line: int
    function: str
    code: str
    caller: str
    kinds: tuple[str, ...]
    steps: tuple[int, ...]
    when: str
    per_step: int
    rate: float
    carried: str | None
    allowed: str | None

    @property
    def identity(self) -> tuple[str, str, str, str]:
        """What stays the same for one site across releases: its line number does not."""
        return (self.file, self.function, self.code, self.caller)


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
class HuntTree(Record):
    """One tree in one DeepSpeed setup: its sites, or why it could not be measured."""

    label: str
    tree: str
    setup: str
    info: TreeInfo = field(metadata=FLAT)
    stacked: tuple[str, ...]
    seconds: float
    error: str | None = field(default=None, metadata=OPTIONAL)
    plan: HuntPlan | None = field(default=None, metadata=OPTIONAL)
    sites: tuple[HuntSite, ...] = ()
    profiler_only: tuple[ProfilerOnly, ...] = ()
    cross_check: tuple[CrossCheck, ...] = ()
    ranks: tuple[Json, ...] = ()
    nodes: tuple[NodeShare, ...] = field(default=(), metadata=OPTIONAL)

    @property
    def measured(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class HuntSetup(Record):
    world_size: int
    sp_size: int
    model: str
    device: str
    backend: str
    versions: dict[str, str]


@dataclass(frozen=True)
class HuntResult(Result):
    KIND: ClassVar[str] = "hunt"
    setup: HuntSetup
    allowlist: tuple[AllowRule, ...]
    trees: tuple[HuntTree, ...]

    @property
    def measured(self) -> tuple[HuntTree, ...]:
        return tuple(tree for tree in self.trees if tree.measured)


# --- census --------------------------------------------------------------------------------------


class TrainerKind(StrEnum):
    TRAINER = "Trainer"
    SFT = "SFTTrainer"


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
    environment: Environment
    steps: int
    setups: dict[str, CensusSetup]
    columns: dict[str, CensusTrees]
    allowlist: tuple[AllowRule, ...]
    runs: tuple[HuntTree, ...]
    wall_s: float


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
    detector: DetectorTruth
    op_us: dict[str, dict[str, float]]
    environment: Environment | None = field(default=None, metadata=OPTIONAL)
    runs: dict[str, Json] = field(default_factory=dict, metadata=OPTIONAL)


# --- bisect and watch ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SiteLocation(Record):
    """Where a release's source has a site: the file from the tree's top, the line, the
    function it lies in (`Class.method`) and that line's code."""

    file: str
    line: int
    function: str
    code: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" + (f" ({self.function})" if self.function else "")


@dataclass(frozen=True)
class Finding(Record):
    """One site in one source tree: whether it is there, and where."""

    presence: Presence
    found: tuple[SiteLocation, ...] = ()


@dataclass(frozen=True)
class ReleaseEvidence(Record):
    """One release a bisect read: its sdist, the site's finding in it, and, where the case's
    tests could be run on it (`--judge`), their checks."""

    version: str
    uploaded: str
    sdist_sha256: str
    finding: Finding = field(metadata=FLAT)
    judged: tuple[CheckRecord, ...] = field(default=(), metadata=OPTIONAL)


@dataclass(frozen=True)
class CommitEvidence(Record):
    commit: str
    date: str
    subject: str
    presence: Presence


class Change(StrEnum):
    """What happened to a site between two releases."""

    ADDED = "added"
    REMOVED = "removed"


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
    project: str
    version: str
    site: AllowRule
    finding: Finding = field(metadata=FLAT)


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


KINDS: dict[str, type[Result]] = {
    kind.KIND: kind
    for kind in (
        ReproResult, TestPatchResult, ProfileResult, HuntResult, CensusResult, BenchResult,
        BisectResult, WatchResult, GpuResult,
    )
}  # fmt: skip
