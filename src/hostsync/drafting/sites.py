"""Where a repro's host reads are and what they wait for, as drafts cite them: per run, per site.

What a fix leaves and where a wait goes are the sites a run's accounting recorded (each rank's
`Cost`), never words typed into a draft. `run_sites` gives every run's sites, each rank's figures
per accounted step; review adds them to the repro's document as `sites`, and its reducers `reads`
and `waits` list them:

    {{repro:sites[tree=patched,scenario=zero1]|reads}}
        `deepspeed/runtime/utils.py:898` `mask_nan_or_inf_with_val_inplace` (2 waits); ...
    {{repro:sites[tree=pinned,function=clip_tensors_by_global_norm]|waits}}
        `deepspeed/runtime/utils.py:988` `clip_tensors_by_global_norm` (1 read waits, for 4 kernels)

A figure the ranks disagree on is cited as its range (`24 to 26 kernels`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from hostsync.detector.codec import FLAT, Record, RecordError, shown
from hostsync.detector.records import Cost, DeviceWork, SiteCost
from hostsync.detector.sites import Site
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.records import ReproResult, ScenarioRow

WORK = tuple(item.name for item in dataclasses.fields(DeviceWork))


@dataclass(frozen=True)
class RunSite(Record):
    """One source line's host reads in one run (tree, launch, rank count, scenario): each rank's
    reads, stalls (the reads that waited) and the device work those waited for, per step (a
    mean over the accounted steps; 0 where a rank has no read there)."""

    tree: str
    launch: str
    ranks: int
    scenario: str
    site: Site = field(metadata=FLAT)
    reads: tuple[float, ...]
    stalls: tuple[float, ...]
    waited_for: dict[str, tuple[float, ...]]


def run_sites(result: ReproResult) -> list[RunSite]:
    """Every accounted run's sites, the most read first."""
    return [site for row in result.runs for site in _row_sites(row)]


def _row_sites(row: ScenarioRow) -> list[RunSite]:
    ranks = [(cost.steps or 1, _by_site(cost)) for cost in row.costs]
    order = list(dict.fromkeys(site for _, sites in ranks for site in sites))

    def per_step(site: Site, figure: str) -> tuple[float, ...]:
        read = attrgetter(figure)
        return tuple(read(sites[site]) / steps if site in sites else 0.0 for steps, sites in ranks)

    found = [
        RunSite(
            row.tree,
            row.launch,
            row.ranks,
            row.scenario,
            site,
            reads=per_step(site, "reads"),
            stalls=per_step(site, "stalls"),
            waited_for={name: per_step(site, f"waited_for.{name}") for name in WORK},
        )
        for site in order
    ]
    return sorted(found, key=lambda run_site: -max(run_site.reads))  # stable: ties keep order


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
    """The sites `values` holds, each with its waits (reads and blocking copies to the device,
    which the accounting does not tell apart): `file:line` `function` (2 waits)."""
    return _listed(values, lambda sites: _amount(_each(sites, lambda site: site.reads), "wait"))


def waits(values: list[Any]) -> str:
    """The sites `values` holds, each with its waits, how many stall and the device work they
    wait for: `file:line` `function` (2 of 6 waits stall, for 11 kernels in all, 3 collectives
    among them)."""
    return _listed(values, _waited)


def _waited(sites: list[RunSite]) -> str:
    reading = _each(sites, lambda site: site.reads)
    waiting = _each(sites, lambda site: site.stalls)
    counted = _amount(reading, "wait")
    if max(waiting) == 0:
        return f"{counted}, none stalls"
    if waiting != reading:
        counted = f"{_range(waiting)} of {counted}"
    said = f"{counted} {'stalls' if max(waiting) == 1 else 'stall'}"
    kernels = _each(sites, lambda site: site.waited_for["kernels"])
    said += f", for {_amount(kernels, 'kernel')}"
    said += " in all" if max(waiting) > 1 else ""
    collectives = _each(sites, lambda site: site.waited_for["collectives"])
    if max(collectives) > 0:
        said += f", {_amount(collectives, 'collective')} among them"
    return said


def _listed(values: list[Any], said: Callable[[list[RunSite]], str]) -> str:
    """Each site once, in the order given, with what `said` says of its figures (every rank's,
    of every run that matched)."""
    grouped: dict[Site, list[RunSite]] = {}
    for value in values:
        try:
            found = RunSite.from_json(value)
        except RecordError:
            raise WorkspaceError(
                f"`reads` and `waits` list sites, not {shown(value)}: end the placeholder's path"
                " at `repro:sites[...]`"
            ) from None
        grouped.setdefault(found.site, []).append(found)
    return "; ".join(
        f"`{site.file}:{site.line}` `{site.function}` ({said(runs)})"
        for site, runs in grouped.items()
    )


def _each(sites: list[RunSite], figure: Callable[[RunSite], tuple[float, ...]]) -> list[float]:
    """Every rank's value of `figure`, over `sites`."""
    return [value for site in sites for value in figure(site)]


def _amount(values: Sequence[float], noun: str) -> str:
    """`2 reads`, `1 read`, or the range the values span: `24 to 26 kernels`."""
    return f"{_range(values)} {noun}" + ("" if min(values) == max(values) == 1 else "s")


def _range(values: Sequence[float]) -> str:
    low, high = min(values), max(values)
    return _rounded(high) if low == high else f"{_rounded(low)} to {_rounded(high)}"


def _rounded(value: float) -> str:
    """A mean per step as a person writes it: whole from ten up, one decimal below."""
    if value >= 10:
        return str(int(value + 0.5))
    return f"{value:.1f}".rstrip("0").rstrip(".")
