"""A source line that makes the host wait, its syncs counted, and the rules that accept one.

Shared by the detector, which records sites in a rank, and the engine, which judges them
(`hostsync.sites`: the known sites, the sites a case's fix removes). The one matcher of a site,
`SiteRule`, lives here, so that the detector installs alone. Standard library and codec only.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field

from hostsync.detector.codec import FLAT, OPTIONAL, Record, RecordError

# The event kind of a compiled function's call in a scope that lets it run (the survey's, a
# baseline's): its syncs are not judged, the call is recorded where it was made.
COMPILED = "compiled"
# The event kind of a blocking copy of host memory to the device: a wait like a read (the copy
# queues behind the stream's work, and the host waits for it), told apart in reports.
DEVICE_COPY = "device_copy"


@dataclass(frozen=True, order=True)
class Site(Record):
    """A source line that caused host syncs: its file (relative to its package root, or, where a
    release's source is searched, to the tree's top), line, the function it lies in and the
    statement's code. Every record that names a site holds one, flat in its document."""

    file: str
    line: int
    function: str
    code: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"

    @property
    def identity(self) -> tuple[str, str, str]:
        """What names one site across releases and edits: its file, function and code. Its line
        is left out, as lines move when code above them changes. So is the caller, which is not
        the site's own: the hunt, which charges each caller of a shared helper apart, adds it
        (`HuntSite.key`); a baseline accepts a site whoever calls it."""
        return (self.file, self.function, self.code)


@dataclass(frozen=True)
class SiteCount(Record):
    """A site's syncs in one scope: how many, of which kinds; `caller` where they are counted
    per caller, `reason` where a rule accepted them."""

    site: Site = field(metadata=FLAT)
    count: int
    kinds: tuple[str, ...] = field(default=(), metadata=OPTIONAL)
    caller: str = field(default="", metadata=OPTIONAL)
    reason: str = field(default="", metadata=OPTIONAL)


@dataclass(frozen=True)
class SiteRule:
    """Which sites a rule names: a file (a path suffix), optionally one function or line, a
    statement containing `code`, and a caller (`function`, or `file suffix:function`). The one
    matcher: an allow rule is one with a reason, a card's carried site one without."""

    file: str
    _: KW_ONLY
    function: str | None = None
    line: int | None = None
    caller: str | None = None
    code: str | None = None

    def __post_init__(self) -> None:
        if not self.file.strip():
            raise RecordError("file", "is blank: name the file (a path suffix)")

    def matches(self, site: Site, caller: str = "") -> bool:
        return (
            suffix_matches(site.file, self.file)
            and self.function in (None, site.function)
            and self.line in (None, site.line)
            and (self.code is None or self.code in site.code)
            and (self.caller is None or called_from(caller, self.caller))
        )


@dataclass(frozen=True)
class AllowRule(SiteRule):
    """A known, accepted site: a `SiteRule` with the reason it is accepted. `host_memory`: the
    site reads host memory the detector cannot see being made (C++ state). Its reads are no
    waits; they count with the scope's host reads."""

    reason: str
    host_memory: bool = field(default=False, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        require_reason(self.reason)


def require_reason(reason: str) -> None:
    if not reason.strip():
        raise RecordError("reason", "an allowed sync needs a reason: say why this sync is accepted")


def suffix_matches(file: str, suffix: str) -> bool:
    """`file` is `suffix`, or ends with it after a `/`."""
    return file == suffix or file.endswith("/" + suffix)


def called_from(caller: str, wanted: str) -> bool:
    """`wanted` is a function name, or a file suffix and a function: `a/b.py:step`."""
    file, _, function = caller.rpartition(":")
    wanted_file, _, wanted_function = wanted.rpartition(":")
    return function == wanted_function and (not wanted_file or suffix_matches(file, wanted_file))
