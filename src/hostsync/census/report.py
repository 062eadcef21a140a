"""The census's report, in the words of `workspace.vocabulary`. Every site is ranked by its
waits per optimizer step summed over the setups, with its disposition. The setups show their
waits, stalls, copies and idle time per step, today and with every carried fix. The largest
idle windows show where the host works most after a stall. A heat map shows setups x sites.

Every candidate ends somewhere: carried by a case, accepted, or not carried with its reason. The
known sites are matched again when the report is rendered: a rule added since needs no new run.
A candidate with none of these is listed apart, as one without a disposition."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hostsync.census.records import CensusResult, CensusTrees
from hostsync.measure.cost import BOUND, assess, idle_per_step
from hostsync.sites.dispositions import Disposed, Disposition, disposed, known_now
from hostsync.sites.known import NONE_KNOWN, KnownSites
from hostsync.sites.records import HuntSite, HuntTree
from hostsync.sites.render import (
    LABEL_COLOURS,
    draw_heat_map,
    figure_text,
    rate_text,
    reading,
    spans_text,
    where_text,
)
from hostsync.sites.summary import copies_rate
from hostsync.workspace import results, table
from hostsync.workspace.layout import Layout
from hostsync.workspace.vocabulary import (
    COPIES,
    DISPOSITION,
    IDLE_MEAN,
    IDLE_MEDIAN,
    STALLS,
    VERDICT,
    WAITS,
    WINDOW_MEDIAN,
)

# The columns of the census: the releases as published, and with every carried fix.
TODAY, FIXED = "today", "fixed"
# How many sites the heat map and the setups x sites table show; how many idle windows.
TOP = 25
TOP_IN_TABLE = 10
TOP_WINDOWS = 10
# The dispositions whose sites still wait: the report says why each line waits.
UNCARRIED = (Disposition.CANDIDATE, Disposition.NOT_CARRIED)
# The words of a candidate no case carries, no allow rule accepts and no reason leaves.
UNDECIDED = (
    "candidate without a disposition: carry it in a case, or give it an [[allow]] or a"
    " [[not_carried]] table with its reason in known_sites.toml"
)


@dataclass
class CensusSite:
    """One site (file, function, code, caller) over the setups, with its disposition: its waits
    per optimizer step in each (mean per rank after the warm-up), in each column."""

    disposed: Disposed
    rates: dict[str, dict[str, float]] = field(default_factory=dict)  # column -> setup -> rate

    @property
    def hunted(self) -> HuntSite:
        return self.disposed.hunted

    @property
    def disposition(self) -> Disposition:
        return self.disposed.disposition

    def total(self, column: str) -> float:
        return sum(self.rates.get(column, {}).values())

    def said(self) -> str:
        """Its disposition in words; a candidate's says what would give it one."""
        return UNDECIDED if self.disposition is Disposition.CANDIDATE else str(self.disposed)


def census_sites(runs: Sequence[HuntTree], rules: KnownSites = NONE_KNOWN) -> list[CensusSite]:
    """Every site of any run, ranked by its waits per step summed over the setups today (then
    with every fix), candidates first among equals; each site the census left a candidate with
    the reason of the first of `rules` matching it, if any."""
    found: dict[tuple[str, str, str, str], CensusSite] = {}
    for run in runs:
        for hunted in run.sites:
            if hunted.key not in found:
                found[hunted.key] = CensusSite(disposed(hunted, rules))
            found[hunted.key].rates.setdefault(run.tree, {})[run.setup] = hunted.rate
    return sorted(
        found.values(),
        key=lambda s: (
            -s.total(TODAY),
            -s.total(FIXED),
            s.disposition is not Disposition.CANDIDATE,
            s.hunted.site.file,
        ),
    )


def per_setup(result: CensusResult, column: str, *, unaccepted: bool = False) -> dict[str, float]:
    """Waits per optimizer step of each measured setup in `column`: every wait, or only those
    the known sites do not accept (`unaccepted`)."""
    found = {}
    for run in result.runs:
        if run.tree == column and run.measured:
            sites = [s for s in run.sites if not (unaccepted and s.allowed)]
            found[run.setup] = round(sum(site.rate for site in sites), 2)
    return found


def stalls_per_setup(result: CensusResult, column: str) -> dict[str, float]:
    """Stalls per optimizer step of each setup measured with accounting in `column`."""
    return {
        run.setup: round(run.cost.stalls / run.cost.steps, 2)
        for run in result.runs
        if run.tree == column and run.measured and run.cost is not None
    }


def copies_per_setup(result: CensusResult, column: str) -> dict[str, float]:
    """Blocking copies to the device per optimizer step of each measured setup in `column`."""
    return {
        run.setup: round(copies_rate(run.sites), 2)
        for run in result.runs
        if run.tree == column and run.measured
    }


def idle_per_setup(result: CensusResult, column: str) -> dict[str, float]:
    """Idle time per optimizer step (us of host time, the median over the steady steps) of each
    setup measured with accounting in `column`."""
    return {
        run.setup: idle_per_step(run.cost)[0]
        for run in result.runs
        if run.tree == column and run.measured and run.cost is not None
    }


@dataclass(frozen=True)
class IdleSite:
    """A site's idle windows in one setup: the host time after its drains, per step."""

    setup: str
    hunted: HuntSite


def largest_windows(result: CensusResult, column: str = TODAY) -> list[IdleSite]:
    """The sites after whose drains the host does the most work, per step, in `column`: each
    line once, in the setup where its windows are longest."""
    found: dict[tuple[str, str, str], IdleSite] = {}
    for run in result.runs:
        if run.tree != column or not run.measured:
            continue
        for hunted in run.sites:
            kept = found.get(hunted.site.identity)
            if hunted.idle_rate and (kept is None or hunted.idle_rate > kept.hunted.idle_rate):
                found[hunted.site.identity] = IdleSite(run.setup, hunted)
    ranked = sorted(found.values(), key=lambda w: -w.hunted.idle_rate)
    return ranked[:TOP_WINDOWS]


def fix_verdicts(result: CensusResult) -> dict[str, str]:
    """Each setup's verdict on the carried fixes together: today's cost against the fixed one."""
    costs = {(run.setup, run.tree): run.cost for run in result.runs if run.cost is not None}
    return {
        name: f"{judgement.verdict}: {judgement.reason}"
        for name in result.setups
        if (name, TODAY) in costs and (name, FIXED) in costs
        for judgement in [assess(costs[name, TODAY], costs[name, FIXED])]
    }


def undecided(sites: Sequence[CensusSite]) -> list[CensusSite]:
    """The candidates without a disposition: what a finished census report has none of."""
    return [site for site in sites if site.disposition is Disposition.CANDIDATE]


def render(
    result: CensusResult, source: str, png: str | None, rules: KnownSites = NONE_KNOWN
) -> str:
    setups = list(result.setups)
    sites = census_sites(result.runs, rules)
    columns = list(result.columns)
    totals = {column: per_setup(result, column) for column in columns}
    open_reads = {column: per_setup(result, column, unaccepted=True) for column in columns}
    stalls = {column: stalls_per_setup(result, column) for column in columns}
    copies = {column: copies_per_setup(result, column) for column in columns}
    idle = {column: idle_per_setup(result, column) for column in columns}
    verdicts = fix_verdicts(result)
    seconds = {(run.setup, run.tree): run.seconds for run in result.runs}
    unmeasured = {(r.setup, r.tree): "compiled, not judged" for r in result.runs if r.not_judged}
    versions = ", ".join(f"{k} {v}" for k, v in result.environment.versions.items())
    out = [
        "# Host syncs in the training steps users run: the census",
        "",
        f"> Generated by `python -m hostsync census` from `{source}` ({result.stamp.created})."
        " `census.md` beside it is regenerated from the newest census result.",
        "",
        f"**What ran.** Each setup of `census.toml` trained a tiny `LlamaForCausalLM` for"
        f" {result.steps} optimizer steps with the Trainer, one of TRL's trainers or a plain"
        " accelerate loop (a reward model: a one-label scoring head), every step"
        " under `hostsync.detector` from fetching its batch to the end of its logging (and"
        " evaluation); step 1 is the warm-up. *waits/step*: the waits (reads and blocking copies)"
        " one rank made in an optimizer step after the warm-up, the mean over ranks and steps"
        " (micro-batches of an accumulation window count in their optimizer step). Sites are"
        " matched on file, function, code line and caller.",
        "",
        f"**On.** {result.environment.device}; {versions}; census wall time {result.wall_s:.0f} s."
        f" Command: `{result.stamp.command}`.",
        "",
        "**Columns.** "
        + "; ".join(_column_text(name, trees) for name, trees in result.columns.items()),
        "",
        "## Setups",
        "",
        table.markdown(
            (
                "setup",
                "what",
                *[f"{WAITS} {c}" for c in columns],
                f"{STALLS} " + " -> ".join(columns),
                f"{COPIES} " + " -> ".join(columns),
                f"{IDLE_MEDIAN} " + " -> ".join(columns),
                *[f"not accepted {c}" for c in columns],
                *[f"run s {c}" for c in columns],
                VERDICT,
            ),
            [
                (
                    name,
                    result.setups[name].about,
                    *[
                        rate_text(totals[c].get(name))
                        if name in totals[c]
                        else unmeasured.get((name, c), "failed")
                        for c in columns
                    ],
                    " -> ".join(_figure(stalls[c].get(name)) for c in columns),
                    " -> ".join(_figure(copies[c].get(name)) for c in columns),
                    " -> ".join(_figure(idle[c].get(name)) for c in columns),
                    *[
                        rate_text(open_reads[c].get(name))
                        if name in totals[c]
                        else unmeasured.get((name, c), "failed")
                        for c in columns
                    ],
                    *[seconds.get((name, c)) for c in columns],
                    verdicts.get(name, "-"),
                )
                for name in setups
            ],
        ),
        "",
        "*not accepted*: the waits per step left when the accepted ones"
        f" ({len(result.allowlist)} rules of known_sites.toml, each with its reason) are set"
        " aside: candidates and carried."
        " *stalls/step*: the waits (reads and blocking copies to the device) that waited for"
        " device work queued since the host last waited. *copies/step*: the blocking copies of"
        " host memory to the device among the waits. *median idle us/step*: the windows after"
        " the stalls, from each stall's return to the next kernel launch, summed per step, the"
        " median over the steady steps: host time in microseconds measured on this CPU, the"
        " detector's own time taken out, during which a GPU would have nothing to run."
        f" *verdict*: the carried fixes together, {TODAY} against {FIXED} ({BOUND}).",
        "",
    ]
    windows = largest_windows(result)
    if windows:
        out += [
            f"## The largest idle windows ({TODAY}): where the host works most after a stall",
            "",
            table.markdown(
                ("setup", "site", STALLS, IDLE_MEAN, WINDOW_MEDIAN, "ran"),
                [
                    (
                        w.setup,
                        where_text(w.hunted),
                        rate_text(w.hunted.stall_rate),
                        rate_text(w.hunted.idle_rate),
                        rate_text(w.hunted.idle.median_us),
                        spans_text(w.hunted.idle),
                    )
                    for w in windows
                ],
            ),
            "",
            "*ran*: the statements the host reached in those windows, with the host time (us, over"
            " all of the site's steady windows on every rank) that ran before each: the time"
            " before a torch call is charged to it. *mean idle us/step*: the site's windows summed,"
            " the mean per rank per step. Each line is shown"
            " once, in the setup where its windows are longest; every one is a candidate for"
            " moving host work out of the window (before the wait, or off the step).",
            "",
        ]
    top = sites[:TOP_IN_TABLE]
    if top:
        out += [
            f"## Setups x top sites (waits per optimizer step, {TODAY})",
            "",
            table.markdown(
                ("setup", *[f"#{n}" for n in range(1, len(top) + 1)]),
                [
                    (name, *[rate_text(s.rates.get(TODAY, {}).get(name)) for s in top])
                    for name in setups
                ],
            ),
            "",
        ]
    if png:
        out += [f"![setups x sites, waits per optimizer step]({png})", ""]
    kinds = {kind: sum(s.disposition is kind for s in sites) for kind in Disposition}
    out += [
        "## Every site, ranked by waits per step summed over the setups",
        "",
        "*when*: the steps of its first setup that waited there (every step, logging steps, some"
        " steps, or one step: a one-off averaged over the steady steps). *disposition*: carried"
        " by a case, accepted by an allow rule, or not carried with its reason (known_sites.toml's"
        " `[[allow]]` and `[[not_carried]]`, matched again when this report was rendered): "
        + ", ".join(f"{n} {kind}" for kind, n in kinds.items() if kind != Disposition.CANDIDATE)
        + f", {kinds[Disposition.CANDIDATE]} without a disposition.",
        "",
        table.markdown(
            (
                "#",
                "package",
                "site",
                *[f"{WAITS} sum {c}" for c in columns],
                "setups",
                DISPOSITION,
                "code",
                "reading",
            ),
            [
                (
                    number,
                    s.hunted.package,
                    where_text(s.hunted),
                    *[rate_text(s.total(c)) for c in columns],
                    len(s.rates.get(TODAY, s.rates.get(FIXED, {}))),
                    s.said(),
                    f"`{s.hunted.site.code}`",
                    reading(s.hunted) if s.disposition in UNCARRIED else "",
                )
                for number, s in enumerate(sites, start=1)
            ],
        ),
    ]
    if undecided(sites):
        out += ["", "## Candidates without a disposition", ""]
        out += [f"- {where_text(s.hunted)} `{s.hunted.site.code}`" for s in undecided(sites)]
    failed = [run for run in result.runs if not run.measured]
    if failed:
        out += ["", "## Not measured", ""]
        out += [f"- {run.label}: {run.error or run.not_judged}" for run in failed]
    return "\n".join(out) + "\n"


def _column_text(name: str, trees: CensusTrees) -> str:
    every = [trees.tree, *trees.stacked]
    shown = ", ".join(f"{t.project} {t.version}" for t in every)
    carried = f" with the series of {', '.join(trees.cases)}" if trees.cases else " as published"
    return f"*{name}*: {shown}{carried}"


def heat_map(result: CensusResult, path: Path, rules: KnownSites = NONE_KNOWN) -> None:
    """Setups x the top sites, waits per optimizer step today, each cell written in; the
    site labels coloured by disposition (carried, accepted, not carried, candidate)."""
    setups = list(result.setups)
    sites = census_sites(result.runs, rules)[:TOP]
    values = [[s.rates.get(TODAY, {}).get(name, 0.0) for s in sites] for name in setups]
    draw_heat_map(
        path,
        setups,
        [s.disposed for s in sites],
        values,
        f"Waits per optimizer step ({TODAY}); {LABEL_COLOURS}",
    )


def write_reports(layout: Layout, json_path: Path) -> list[Path]:
    """The Markdown and the heat map beside the result, and census.md from the newest."""
    png = json_path.with_suffix(".png")
    known = known_now(layout)
    heat_map(results.read(json_path, CensusResult), png, known)

    def rendered(result: CensusResult, path: Path) -> str:
        drawn = path.with_suffix(".png")
        shown = drawn.name if drawn.exists() else None
        return render(result, str(path.relative_to(layout.root)), shown, known)

    beside, stable = results.write_markdown(json_path, CensusResult, rendered)
    return [beside, png, stable]


def console_summary(result: CensusResult) -> str:
    columns = list(result.columns)
    totals = {column: per_setup(result, column) for column in columns}
    stalls = {column: stalls_per_setup(result, column) for column in columns}
    idle = {column: idle_per_setup(result, column) for column in columns}
    verdicts = fix_verdicts(result)
    rows = [
        (
            name,
            *[rate_text(totals[c][name]) if name in totals[c] else "failed" for c in columns],
            " -> ".join(_figure(stalls[c].get(name)) for c in columns),
            " -> ".join(_figure(idle[c].get(name)) for c in columns),
            verdicts.get(name, "-"),
        )
        for name in result.setups
    ]
    headers = (
        "setup",
        *[f"{WAITS} {c}" for c in columns],
        f"{STALLS} " + " -> ".join(columns),
        f"{IDLE_MEDIAN} " + " -> ".join(columns),
        VERDICT,
    )
    return f"{table.text(headers, rows)}\nverdict bound: {BOUND}"


def _figure(value: float | None) -> str:
    """A figure per step, 0 shown as 0 (unlike a rate, where none shows as "-")."""
    return "?" if value is None else figure_text(value)
