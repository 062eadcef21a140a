"""Where a repro's host waits are and what they wait for, as drafts cite them: per run, per site.

What a fix leaves and where a wait goes are the sites a run's accounting recorded (each rank's
`Cost`), never words typed into a draft. `run_sites` gives every run's sites, each rank's figures
per accounted step; review adds them to the repro's document as `sites`. A wait is a read or a
blocking copy to the device: the accounting counts them together, the run's site lists (the
scope's `sync_sites()`) say which kind a site is. So a draft counts each apart, and its
reducers list them:

    {{repro:sites[tree=patched,scenario=zero1]|reads}}      the sites that read (`2 reads`)
    {{repro:sites[tree=patched,scenario=zero1]|copies}}     the blocking copies (`2 copies`)
    {{repro:sites[tree=patched,scenario=zero1]|waits}}      both, each named as what it is
    {{repro:sites[tree=pinned,function=refill]|stalls}}     how many stall, and for what work

`reads` and `copies` are figures too (`sites[...].reads|sum`); a site whose kind no site list
records has neither, so a draft that counts it as one is refused. A figure the ranks disagree on
is cited as its range (`24 to 26 kernels`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from hostsync.detector.codec import FLAT, OPTIONAL, Record, RecordError, shown
from hostsync.detector.records import Cost, DeviceWork, SiteCost
from hostsync.detector.sites import DEVICE_COPY, Site
from hostsync.measure.records import ReproResult, ScenarioRow
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.records import TreeRole

WORK = tuple(item.name for item in dataclasses.fields(DeviceWork))
PINNED = TreeRole.PINNED.value


@dataclass(frozen=True)
class RunSite(Record):
    """One source line's host waits in one run (tree, launch, rank count, scenario): each rank's
    waits, stalls (the waits that found device work queued) and the device work those waited
    for, per step (a mean over the accounted steps; 0 where a rank has none there). `kinds`: what
    the run's site lists say its waits are; `reads` and `copies` split `waits` by them, where
    they can (None where no list names the site, or it both reads and copies)."""

    tree: str
    launch: str
    ranks: int
    scenario: str
    site: Site = field(metadata=FLAT)
    waits: tuple[float, ...]
    stalls: tuple[float, ...]
    waited_for: dict[str, tuple[float, ...]]
    kinds: tuple[str, ...] = ()
    reads: tuple[float, ...] | None = field(default=None, metadata=OPTIONAL)
    copies: tuple[float, ...] | None = field(default=None, metadata=OPTIONAL)
    pinned_line: int | None = field(default=None, metadata=OPTIONAL)

    @property
    def cited(self) -> str:
        """`file:line` as a draft cites it: the pinned release's line of the same statement,
        where a patched tree's line differs (a draft names releases, not its own trees)."""
        return f"{self.site.file}:{self.pinned_line or self.site.line}"

    @property
    def noun(self) -> str:
        """What its waits are: `read`, `copy`, or `sync` (either) where that is not known."""
        if self.copies is None:
            return "sync"
        return "copy" if max(self.copies) else "read"


def run_sites(result: ReproResult) -> list[RunSite]:
    """Every accounted run's sites, the most waited at first."""
    pinned = {
        site.identity: site.line
        for row in result.runs
        if row.tree == PINNED
        for cost in row.costs
        for site in (entry.site for entry in cost.sites)
    }
    return [site for row in result.runs for site in _row_sites(row, pinned)]


def _row_sites(row: ScenarioRow, pinned: dict[tuple[str, str, str], int]) -> list[RunSite]:
    ranks = [(cost.steps or 1, _by_site(cost)) for cost in row.costs]
    order = list(dict.fromkeys(site for _, sites in ranks for site in sites))

    def per_step(site: Site, figure: str) -> tuple[float, ...]:
        read = attrgetter(figure)
        return tuple(read(sites[site]) / steps if site in sites else 0.0 for steps, sites in ranks)

    listed = _kinds(row)

    def split(site: Site, waits: tuple[float, ...]) -> dict[str, Any]:
        kinds = listed.get((site.file, site.line), ())
        copying = DEVICE_COPY in kinds
        if not kinds or (copying and len(kinds) > 1):
            return {"kinds": kinds}
        none = tuple(0.0 for _ in waits)
        return {
            "kinds": kinds,
            "reads": none if copying else waits,
            "copies": waits if copying else none,
        }

    found = []
    for site in order:
        waits = per_step(site, "reads")
        found.append(
            RunSite(
                row.tree,
                row.launch,
                row.ranks,
                row.scenario,
                site,
                waits=waits,
                stalls=per_step(site, "stalls"),
                waited_for={name: per_step(site, f"waited_for.{name}") for name in WORK},
                **split(site, waits),
                pinned_line=None if row.tree == PINNED else pinned.get(site.identity),
            )
        )
    return sorted(found, key=lambda run_site: -max(run_site.waits))  # stable: ties keep order


def _kinds(row: ScenarioRow) -> dict[tuple[str, int], tuple[str, ...]]:
    """The kinds of wait each line holds, as the run's site lists record them."""
    found: dict[tuple[str, int], set[str]] = {}
    for merged in (entry for entries in row.site_lists.values() for entry in entries):
        site = merged.found.site
        found.setdefault((site.file, site.line), set()).update(merged.found.kinds)
    return {line: tuple(sorted(kinds)) for line, kinds in found.items()}


def _by_site(cost: Cost) -> dict[Site, SiteCost]:
    """One rank's cost by site, a site the accounting lists once per step added up."""
    merged: dict[Site, SiteCost] = {}
    for entry in cost.sites:
        had = merged.get(entry.site, SiteCost(entry.site, 0, 0, DeviceWork()))
        merged[entry.site] = SiteCost(
            entry.site,
            had.reads + entry.reads,
            had.stalls + entry.stalls,
            had.waited_for + entry.waited_for,
        )
    return merged


# --- as a draft lists them -----------------------------------------------------------------------


def reads(values: list[Any]) -> str:
    """The sites `values` holds that read, each with its reads: `file:line` `function` (2 reads)."""
    return _listed(values, lambda sites: _amount(_each(sites, _of("reads")), "read"), "reads")


def copies(values: list[Any]) -> str:
    """The sites `values` holds that copy host memory to the device and wait for it, each with
    its copies: `file:line` `function` (2 copies)."""
    return _listed(values, lambda sites: _amount(_each(sites, _of("copies")), "copy"), "copies")


def waits(values: list[Any]) -> str:
    """The sites `values` holds, each with its waits named as what they are: (2 reads), (2
    copies), or (2 syncs) where the run does not say which."""
    return _listed(values, lambda sites: _amount(_each(sites, _of("waits")), sites[0].noun))


def stalls(values: list[Any]) -> str:
    """The sites `values` holds, each with its waits, how many stall and the device work they
    wait for: `file:line` `function` (6 reads, 2 of them waiting for 11 kernels in all, 3
    collectives among them)."""
    return _listed(values, _stalled)


def _of(figure: str) -> Callable[[RunSite], tuple[float, ...]]:
    return lambda site: getattr(site, figure) or ()


def _stalled(sites: list[RunSite]) -> str:
    """`2 reads, none stalls`; `1 read, waiting for 4 kernels`; `6 reads, 2 of them waiting for
    11 kernels in all, 3 collectives among them`."""
    reading = _each(sites, _of("waits"))
    waiting = _each(sites, lambda site: site.stalls)
    counted = _amount(reading, sites[0].noun)
    if max(waiting) == 0:
        return f"{counted}, none stalls"
    said = f"{counted}, waiting for"
    if waiting != reading:
        said = f"{counted}, {_range(waiting)} of them waiting for"
    kernels = _each(sites, lambda site: site.waited_for["kernels"])
    said += f" {_amount(kernels, 'kernel')}"
    said += " in all" if max(reading) > 1 else ""
    collectives = _each(sites, lambda site: site.waited_for["collectives"])
    if max(collectives) > 0:
        said += f", {_amount(collectives, 'collective')} among them"
    return said


def _listed(values: list[Any], said: Callable[[list[RunSite]], str], kind: str = "") -> str:
    """Each site once, in the order given, with what `said` says of its figures (every rank's,
    of every run that matched); only those with a `kind` figure (reads, copies) where one is
    named, refused where a run does not record a site's kind."""
    grouped: dict[str, list[RunSite]] = {}
    for value in values:
        try:
            found = RunSite.from_json(value)
        except RecordError:
            raise WorkspaceError(
                f"`reads`, `copies`, `waits` and `stalls` list sites, not {shown(value)}: end the"
                " placeholder's path at `repro:sites[...]`"
            ) from None
        if kind and getattr(found, kind) is None:
            raise WorkspaceError(
                f"`{found.site.file}:{found.site.line}` is not known to hold {kind} alone (kinds"
                f" recorded: {', '.join(found.kinds) or 'none'}): list it with `|waits`, or have"
                " the case's script list the run's sites (`sync_sites()`)"
            )
        if not kind or max(getattr(found, kind), default=0.0) > 0:
            grouped.setdefault(found.cited, []).append(found)
    return "; ".join(
        f"`{cited}` `{runs[0].site.function}` ({said(runs)})" for cited, runs in grouped.items()
    )


def _each(sites: list[RunSite], figure: Callable[[RunSite], tuple[float, ...]]) -> list[float]:
    """Every rank's value of `figure`, over `sites`."""
    return [value for site in sites for value in figure(site)]


def _amount(values: Sequence[float], noun: str) -> str:
    """`2 reads`, `1 copy`, or the range the values span: `24 to 26 kernels`."""
    if min(values) == max(values) == 1:
        return f"1 {noun}"
    return f"{_range(values)} {noun[:-1] + 'ies' if noun.endswith('y') else noun + 's'}"


def _range(values: Sequence[float]) -> str:
    low, high = min(values), max(values)
    return _rounded(high) if low == high else f"{_rounded(low)} to {_rounded(high)}"


def _rounded(value: float) -> str:
    """A mean per step as a person writes it: whole from ten up, one decimal below."""
    if value >= 10:
        return str(int(value + 0.5))
    return f"{value:.1f}".rstrip("0").rstrip(".")
