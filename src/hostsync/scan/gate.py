"""A scan as a CI gate: a baseline of what a run saw, in `hostsync.detector.baseline`'s format
with the script as its one test (sites matched on file, function and code, so a line that moves
still matches), the sites a later run finds that it does not hold, and a budget of stalls per step.

A new site fails only where known_sites.toml does not accept it; a compiled call is no site.
Each failure is one line naming the site and its line.
"""

from __future__ import annotations

from pathlib import Path

from hostsync.detector.baseline import Baseline
from hostsync.detector.sites import SiteCount
from hostsync.scan.report import compiled_only
from hostsync.workspace.records import HuntSite, ScanResult

NEW = "new"


def test_name(result: ScanResult) -> str:
    """What the baseline keys the script's sites by: its path as it was given."""
    return Path(result.script).as_posix()


def _entry(hunted: HuntSite) -> SiteCount:
    return SiteCount(hunted.site, hunted.per_step, hunted.kinds)


def judged_sites(result: ScanResult) -> list[HuntSite]:
    return [site for site in result.sites if not compiled_only(site)]


def baseline_of(result: ScanResult) -> Baseline:
    """What the run saw, every judged site of its watched steps, under the script's name."""
    return Baseline.of({test_name(result): [_entry(site) for site in judged_sites(result)]})


def new_sites(result: ScanResult, baseline: Baseline) -> list[str]:
    """One line for each site the baseline does not hold and the allow-list does not accept."""
    new = {
        entry.site
        for entry in baseline.new(test_name(result), [_entry(s) for s in judged_sites(result)])
    }
    return [
        f"new host sync at {hunted.site}: `{hunted.site.code}`"
        f" ({rate_text(hunted)}): remove it, or accept it by writing the baseline again"
        " (--baseline without --fail-on) or with an [[allow]] in known_sites.toml"
        for hunted in judged_sites(result)
        if hunted.site in new and hunted.allowed is None
    ]


def rate_text(site: HuntSite) -> str:
    if site.when == "warm-up only":
        return f"{site.per_step} wait(s) in the warm-up"
    return f"{site.rate:.2f}".rstrip("0").rstrip(".") + f" wait(s) per step, {site.when}"


def over_budget(result: ScanResult, max_waits: int) -> list[str]:
    """One line for the step after the warm-up that stalled most, where it stalled more than
    `max_waits` times: the rank, the step, and the site that stalled most in it."""
    worst = max(
        (
            (step.hunt.cost.stalls, rank.rank, step)
            for rank in result.ranks
            for step in rank.steps
            if not step.hunt.warmup
        ),
        key=lambda found: found[0],
        default=None,
    )
    if worst is None or worst[0] <= max_waits:
        return []
    stalls, rank, step = worst
    site = max(step.hunt.sites, key=lambda s: s.stalls)
    return [
        f"rank {rank} stalled {stalls} times in step {step.hunt.step}, over the budget of"
        f" {max_waits} stalls per step (--max-waits): most at {site.site} ({site.stalls} stalls):"
        f" `{site.site.code}`"
    ]
