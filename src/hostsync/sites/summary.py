"""Ranks' records summed into sites. How often each site waits per step, and on which steps.
Its stalls and windows, and what a case or the known sites say of it.

The hunt, the census and the scan sum their ranks' steps here, once. A rank's step counts as
one. So every figure is per rank and step after the warm-up, the mean.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from hostsync.detector.records import Cost, Idle
from hostsync.detector.sites import DEVICE_COPY, AllowRule, Site
from hostsync.sites.known import reason
from hostsync.sites.records import HuntRank, HuntSite, TrainerRank
from hostsync.workspace.projects import PACKAGES


def rank_records(results: Sequence[TrainerRank]) -> list[HuntRank]:
    """Each rank's record of a Trainer worker run, with its rank and device: what `summarize`
    reads."""
    return [
        HuntRank(rank, result.device, result.backend, result.model, result.hunt)
        for rank, result in enumerate(results)
        if result.hunt is not None
    ]


def package(file: str) -> str:
    top = file.split("/", 1)[0]
    return top if top in PACKAGES else "other"


def summarize(
    ranks: Sequence[HuntRank], rules: Sequence[AllowRule], carried: Sequence[AllowRule] = ()
) -> list[HuntSite]:
    """One entry per site over all ranks and steps, most waits per step first. `carried` names
    the case whose fix removes a site, before any allow rule.

    `per_step` is the most waits one rank made there in one step. It counts after the warm-up,
    unless the site waits only then. `rate` is the mean per rank per step after the warm-up:
    the site's steady cost. `when` names the steps.
    """
    steady = sorted({s.step for rank in ranks for s in rank.hunt.steps if not s.warmup})
    logging_steps = sorted(
        {s.step for rank in ranks for s in rank.hunt.steps if s.logging and not s.warmup}
    )
    counts: dict[tuple[Site, str], Counter[tuple[int, int]]] = defaultdict(Counter)
    stalls: Counter[tuple[Site, str]] = Counter()
    kinds: dict[tuple[Site, str], set[str]] = defaultdict(set)
    idle: dict[Site, Idle] = defaultdict(Idle)
    for rank in ranks:
        for step in rank.hunt.steps:
            for found in step.sites:
                key = (found.site, found.caller)
                counts[key][(rank.rank, step.step)] += found.count
                if step.step in steady:
                    stalls[key] += found.stalls
                kinds[key].add(found.kind)
            if step.step in steady:
                for cost in step.cost.sites:
                    idle[cost.site] += cost.idle
    rank_steps = len(ranks) * len(steady)
    sites = []
    for key, by_rank_step in counts.items():
        site, caller = key
        steps = sorted({step for _, step in by_rank_step})
        in_steady = [n for (_, step), n in by_rank_step.items() if step in steady]
        carried_by = reason(carried, site, caller)
        # A line read from several callers: its windows are each caller's.
        windows = idle.get(site, Idle())
        sites.append(
            HuntSite(
                package=package(site.file),
                site=site,
                caller=caller,
                kinds=tuple(sorted(kinds[key])),
                steps=tuple(steps),
                when=when(steps, steady, logging_steps),
                per_step=max(in_steady or by_rank_step.values()),
                rate=sum(in_steady) / rank_steps if steady else 0.0,
                carried=carried_by,
                allowed=None if carried_by else reason(rules, site, caller),
                stall_rate=stalls[key] / rank_steps if steady else 0.0,
                idle=windows,
                idle_rate=round(sum(windows.windows_us) / rank_steps, 1) if steady else 0.0,
            )
        )
    return sorted(sites, key=rank_key)


def copies_rate(sites: Iterable[HuntSite]) -> float:
    """Of the sites' waits per rank and step, the blocking copies to the device."""
    return sum(site.rate for site in sites if DEVICE_COPY in site.kinds)


def steady_cost(ranks: Sequence[HuntRank]) -> Cost | None:
    """Every rank's waits, stalls, device work and idle time after the warm-up, over its steps.
    Each rank's step counts as one, so that the figures are per rank and step."""
    total = Cost.in_sequence(
        dataclasses.replace(step.cost, sites=())
        for rank in ranks
        for step in rank.hunt.steps
        if not step.warmup
    )
    return total if total.steps else None


def when(steps: list[int], steady: list[int], logging_steps: list[int]) -> str:
    """Which steps a site waits on, in words."""
    seen = [step for step in steps if step in steady]
    if not seen:
        return "warm-up only"
    if seen == steady:
        return "every step"
    if seen == logging_steps:
        return "logging steps"
    return "steps " + ", ".join(map(str, seen))


def rank_key(hunted: HuntSite) -> tuple[float, int, str, int]:
    """Most waits per step first; then transformers before the libraries under it."""
    order = PACKAGES.index(hunted.package) if hunted.package in PACKAGES else len(PACKAGES)
    return (-hunted.rate, order, hunted.site.file, hunted.site.line)
