"""A scan as a CI gate: a baseline of what a run saw, in `hostsync.detector.baseline`'s format
with the script as its one test (sites matched on file, function and code, so a line that moves
still matches), the sites a later run finds that it does not hold, and a budget of stalls per step.

The script is keyed by its path in its repository, however it was typed. A new site fails only
where known_sites.toml does not accept it; a compiled call is no site. Each failure is one line
naming the site and its line. `sarif` writes every site as SARIF 2.1.0, which code scanning shows
on the pull request's lines, each with its remedy from remedies.toml.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hostsync.detector.baseline import Baseline
from hostsync.detector.codec import Json
from hostsync.detector.sites import Site, SiteCount
from hostsync.detector.words import counted
from hostsync.measure.records import ScanResult
from hostsync.scan.report import compiled_only, scan_sites
from hostsync.sites.dispositions import Disposed, Disposition
from hostsync.sites.known import KnownSites
from hostsync.sites.records import HuntSite
from hostsync.sites.remedies import NONE, Remedies, remedy_text

NEW = "new"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
RULE = "host-sync"
# Where code scanning finds a result's file: the repository's top.
SRCROOT = "%SRCROOT%"


def repository_of(path: Path) -> Path | None:
    """The top of the git repository holding `path`, if any."""
    return next((p for p in path.resolve().parents if (p / ".git").exists()), None)


def test_name(result: ScanResult) -> str:
    """What the baseline keys the script's sites by: its path in its repository (its name
    outside one), however it was typed."""
    script = Path(result.script).resolve()
    top = repository_of(script)
    return script.relative_to(top).as_posix() if top else script.name


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


def unmatched(result: ScanResult, baseline: Baseline, path: Path) -> str | None:
    """A warning when no entry of the baseline matches this run: its key, or every site of it."""
    key = test_name(result)
    entries = baseline.tests.get(key, ())
    if not entries:
        held = ", ".join(baseline.tests) or "none"
        return (
            f"no entry of the baseline {path} is for {key} (it holds: {held}): every site counts"
            " as new; write it again (--baseline without --fail-on)"
        )
    found = [_entry(site) for site in judged_sites(result)]
    if found and len(baseline.gone(key, found)) == len(entries):
        return (
            f"no entry of the baseline {path} for {key} matches a site of this run: every site"
            " counts as new; write it again (--baseline without --fail-on)"
        )
    return None


def rate_text(site: HuntSite) -> str:
    if site.when == "warm-up only":
        return f"{counted(site.per_step, 'wait')} in the warm-up"
    return f"{counted(round(site.rate, 2), 'wait')} per step, {site.when}"


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


# --- SARIF ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """A site as the gate annotates it: its file in the repository (None: not in it), its rate
    and disposition, whether the baseline lacks it, and what to change there."""

    disposed: Disposed
    uri: str | None
    new: bool = False
    remedy: str = NONE

    @property
    def hunted(self) -> HuntSite:
        return self.disposed.hunted

    @property
    def disposition(self) -> str:
        return str(self.disposed)

    @property
    def level(self) -> str:
        """error: new to the baseline; warning: a candidate; note: known."""
        if self.new:
            return "error"
        return "warning" if self.disposed.disposition == Disposition.CANDIDATE else "note"


def findings(
    result: ScanResult, rules: KnownSites, remedies: Remedies, baseline: Baseline | None = None
) -> list[Finding]:
    """Every judged site of the run as a finding, in the order the report lists them, with the
    first remedy of remedies.toml that matches it."""
    script = Path(result.script).resolve()
    new = set()
    if baseline is not None:
        known = baseline.new(test_name(result), [_entry(s) for s in judged_sites(result)])
        new = {entry.site for entry in known}
    return [
        Finding(
            site.disposed,
            uri_of(site.hunted.site, script),
            site.hunted.site in new and site.hunted.allowed is None,
            remedy_text(remedies.remedy_for(site.hunted.kinds, site.hunted.site)),
        )
        for site in scan_sites(result, rules)
    ]


def uri_of(site: Site, script: Path) -> str | None:
    """The site's file in the script's repository: found beside the script or on the user's
    PYTHONPATH, where the runner's `sys.path` named it from."""
    top = repository_of(script)
    if top is None:
        return None
    roots = [
        script.parent,
        *map(Path, filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))),
    ]
    for root in roots:
        found = (root / site.file).resolve()
        if found.is_file() and found.is_relative_to(top):
            return found.relative_to(top).as_posix()
    return None


def sarif(found: Sequence[Finding]) -> Json:
    """SARIF 2.1.0: one result per finding, at its line, with its rate, disposition and remedy
    in its message and its properties."""
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "hostsync",
                        "rules": [
                            {
                                "id": RULE,
                                "name": "HostSync",
                                "shortDescription": {
                                    "text": "A host sync in a training step: the host waits"
                                    " for the device"
                                },
                            }
                        ],
                    }
                },
                "results": [_result(finding) for finding in found],
            }
        ],
    }


def _result(finding: Finding) -> Json:
    site = finding.hunted.site
    where: Json = {"uri": finding.uri, "uriBaseId": SRCROOT} if finding.uri else {"uri": site.file}
    new = "new to the baseline; " if finding.new else ""
    return {
        "ruleId": RULE,
        "level": finding.level,
        "message": {
            "text": f"`{site.code}`: {rate_text(finding.hunted)}; {new}{finding.disposition}."
            f" What to do: {finding.remedy}"
        },
        "locations": [
            {
                "physicalLocation": {
                    "artifactLocation": where,
                    "region": {"startLine": site.line},
                }
            }
        ],
        "properties": {
            "function": site.function,
            "kinds": list(finding.hunted.kinds),
            "waitsPerStep": finding.hunted.rate,
            "stallsPerStep": finding.hunted.stall_rate,
            "when": finding.hunted.when,
            "disposition": finding.disposition,
            "new": finding.new,
            "remedy": finding.remedy,
        },
    }
