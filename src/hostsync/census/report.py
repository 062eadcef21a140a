"""The census's report: every site ranked by its reads per optimizer step summed over the
setups, with its verdict; the setups with their waits, blocking copies and idle time per step
today and with every carried fix; the largest idle windows, where the host does the most work
after a drain; a heat map of setups x sites. Markdown and PNG beside the JSON result.

Every candidate ends somewhere: carried by a case, accepted by an allow rule, or not carried
with its reason (hunt_allowlist.toml's `[[not_carried]]`). The allow-list is matched again when
the report is rendered, so a rule or reason added since the census ran needs no new run. A
candidate with none of these is listed apart, as one without a disposition."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hostsync.detector.records import Idle
from hostsync.hunt.allowlist import AllowList, load_allowlist, reason
from hostsync.hunt.measure import copies_rate
from hostsync.hunt.report import reading
from hostsync.measure.cost import BOUND, assess, idle_per_step
from hostsync.workspace import results, table
from hostsync.workspace.layout import Layout
from hostsync.workspace.records import CensusResult, HuntSite, HuntTree

# The columns of the census: the releases as published, and with every carried fix.
TODAY, FIXED = "today", "fixed"
# How many sites the heat map and the setups x sites table show; how many idle windows.
TOP = 25
TOP_IN_TABLE = 10
TOP_WINDOWS = 10
# A site's kind of verdict, and its label's colour in the heat map.
KIND_COLOURS = {  # matplotlib's tab:green, tab:gray, tab:blue, tab:red, as SVG reads them too
    "carried": "#2ca02c",
    "accepted": "#7f7f7f",
    "not carried": "#1f77b4",
    "candidate": "#d62728",
}
# What the colours of the heat map's site labels mean.
LABEL_COLOURS = (
    "site labels: green carried, grey accepted, blue not carried, red without a disposition"
)
# The verdict of a candidate no case carries, no allow rule accepts and no reason leaves.
UNDECIDED = (
    "candidate without a disposition: carry it in a case, or give it an [[allow]] or a"
    " [[not_carried]] table with its reason in hunt_allowlist.toml"
)


# What a report matches candidates on without an allow-list: nothing.
NO_RULES = AllowList()


def dispositions(layout: Layout) -> AllowList:
    """hunt_allowlist.toml's rules as they are now: what the report matches each candidate on."""
    return load_allowlist(layout.allowlist)


@dataclass
class CensusSite:
    """One site (file, function, code, caller) over the setups: its reads per optimizer step in
    each (mean per rank after the warm-up), in each column."""

    hunted: HuntSite
    rates: dict[str, dict[str, float]] = field(default_factory=dict)  # column -> setup -> rate
    # For a site the census left a candidate, the reason of the allow-list's rule matching it
    # now: an [[allow]] (`accepted`), else a [[not_carried]].
    accepted: str | None = None
    not_carried: str | None = None

    def total(self, column: str) -> float:
        return sum(self.rates.get(column, {}).values())

    @property
    def verdict(self) -> str:
        if self.hunted.carried:
            return f"carried by case {self.hunted.carried}"
        if self.hunted.allowed or self.accepted:
            return f"accepted: {self.hunted.allowed or self.accepted}"
        return f"not carried: {self.not_carried}" if self.not_carried else UNDECIDED

    @property
    def kind(self) -> str:
        if self.hunted.carried:
            return "carried"
        if self.hunted.allowed or self.accepted:
            return "accepted"
        return "not carried" if self.not_carried else "candidate"


def disposed(hunted: HuntSite, rules: AllowList = NO_RULES) -> CensusSite:
    """`hunted`, where its run left it a candidate, with the reason of the first of `rules`
    matching it now, if any."""
    entry = CensusSite(hunted)
    if not (hunted.carried or hunted.allowed):
        entry.accepted = reason(rules.allow, hunted.site, hunted.caller)
        entry.not_carried = reason(rules.not_carried, hunted.site, hunted.caller)
    return entry


def census_sites(runs: Sequence[HuntTree], rules: AllowList = NO_RULES) -> list[CensusSite]:
    """Every site of any run, ranked by its reads per step summed over the setups today (then
    with every fix), candidates first among equals; each site the census left a candidate with
    the reason of the first of `rules` matching it, if any."""
    found: dict[tuple[str, str, str, str], CensusSite] = {}
    for run in runs:
        for hunted in run.sites:
            if hunted.key not in found:
                found[hunted.key] = disposed(hunted, rules)
            found[hunted.key].rates.setdefault(run.tree, {})[run.setup] = hunted.rate
    return sorted(
        found.values(),
        key=lambda s: (-s.total(TODAY), -s.total(FIXED), s.kind != "candidate", s.hunted.site.file),
    )


def per_setup(result: CensusResult, column: str, *, unaccepted: bool = False) -> dict[str, float]:
    """Reads per optimizer step of each measured setup in `column`: every read, or only those
    the allow-list does not accept (`unaccepted`)."""
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


def spans_text(idle: Idle) -> str:
    """Where a site's windows went: each statement with the host time (us) that ran before it."""
    return "; ".join(f"{span.statement} ({span.us:g})" for span in idle.lines)


def rate_text(value: float | None) -> str:
    return "-" if not value else f"{value:.2f}".rstrip("0").rstrip(".")


def where_text(hunted: HuntSite) -> str:
    site = hunted.site
    called = f" (from `{hunted.caller}`)" if hunted.caller else ""
    return f"{site.file}:{site.line} `{site.function}`{called}"


def undecided(sites: Sequence[CensusSite]) -> list[CensusSite]:
    """The candidates without a disposition: what a finished census report has none of."""
    return [site for site in sites if site.kind == "candidate"]


def render(result: CensusResult, source: str, png: str | None, rules: AllowList = NO_RULES) -> str:
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
        " evaluation); step 1 is the warm-up. *Reads per step*: the host reads one rank made in"
        " an optimizer step after the warm-up, averaged over ranks and steps (micro-batches of"
        " an accumulation window count in their optimizer step). Sites are matched on file,"
        " function, code line and caller.",
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
                *[f"reads/step {c}" for c in columns],
                "stalls/step " + " -> ".join(columns),
                "copies/step " + " -> ".join(columns),
                "idle us/step " + " -> ".join(columns),
                *[f"not accepted {c}" for c in columns],
                *[f"run s {c}" for c in columns],
                "verdict",
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
                    " -> ".join(_stalls(stalls[c].get(name)) for c in columns),
                    " -> ".join(_stalls(copies[c].get(name)) for c in columns),
                    " -> ".join(_stalls(idle[c].get(name)) for c in columns),
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
        f"*not accepted*: the reads left when the accepted ones ({len(result.allowlist)} rules of"
        " hunt_allowlist.toml, each with its reason) are set aside: candidates and carried."
        " *stalls/step*: the waits (reads and blocking copies to the device) that waited for"
        " device work queued since the host last waited. *copies/step*: the blocking copies of"
        " host memory to the device among the waits. *idle us/step*: the windows after the"
        " stalls, from each stall's return to the next kernel launch, summed per step (the"
        " median over the steady steps): host time in microseconds measured on this CPU, the"
        " detector's own time taken out, during which a GPU would have nothing to run."
        f" *verdict*: the carried fixes together, {TODAY} against {FIXED} ({BOUND}).",
        "",
    ]
    windows = largest_windows(result)
    if windows:
        out += [
            f"## The largest idle windows ({TODAY}): where the host works most after a drain",
            "",
            table.markdown(
                ("setup", "site", "stalls/step", "idle us/step", "median window us", "ran"),
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
            " before a torch call is charged to it. Each line is shown"
            " once, in the setup where its windows are longest; every one is a candidate for"
            " moving host work out of the window (before the wait, or off the step).",
            "",
        ]
    top = sites[:TOP_IN_TABLE]
    if top:
        out += [
            f"## Setups x top sites (reads per optimizer step, {TODAY})",
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
        out += [f"![setups x sites, reads per optimizer step]({png})", ""]
    kinds = {kind: sum(s.kind == kind for s in sites) for kind in KIND_COLOURS}
    out += [
        "## Every site, ranked by reads per step summed over the setups",
        "",
        "*when*: the steps of its first setup that read there (every step, logging steps, some"
        " steps, or one step: a one-off averaged over the steady steps). *verdict*: carried by a"
        " case, accepted by an allow rule, or not carried with its reason (hunt_allowlist.toml's"
        " `[[allow]]` and `[[not_carried]]`, matched again when this report was rendered): "
        + ", ".join(f"{n} {kind}" for kind, n in kinds.items() if kind != "candidate")
        + f", {kinds['candidate']} without a disposition.",
        "",
        table.markdown(
            (
                "#",
                "package",
                "site",
                *[f"sum {c}" for c in columns],
                "setups",
                "verdict",
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
                    s.verdict,
                    f"`{s.hunted.site.code}`",
                    reading(s.hunted) if s.kind in ("candidate", "not carried") else "",
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


def _column_text(name: str, trees) -> str:
    every = [trees.tree, *trees.stacked]
    shown = ", ".join(f"{t.project} {t.version}" for t in every)
    carried = f" with the series of {', '.join(trees.cases)}" if trees.cases else " as published"
    return f"*{name}*: {shown}{carried}"


def heat_map(result: CensusResult, path: Path, rules: AllowList = NO_RULES) -> None:
    """Setups x the top sites, reads per optimizer step today, each cell written in; the
    site labels coloured by verdict (carried, accepted, not carried, candidate)."""
    setups = list(result.setups)
    sites = census_sites(result.runs, rules)[:TOP]
    values = [[s.rates.get(TODAY, {}).get(name, 0.0) for s in sites] for name in setups]
    draw_heat_map(
        path, setups, sites, values, f"Host reads per optimizer step ({TODAY}); {LABEL_COLOURS}"
    )


def draw_heat_map(
    path: Path,
    rows: Sequence[str],
    sites: Sequence[CensusSite],
    values: Sequence[Sequence[float]],
    title: str,
) -> None:
    """`rows` x `sites`, each cell written in, on a square-root scale; the site labels coloured
    by verdict (carried, accepted, not carried, candidate). A PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import PowerNorm

    width = 2.2 + 0.55 * len(sites)
    figure, axes = plt.subplots(figsize=(width, 1.6 + 0.42 * len(rows)))
    # A square-root scale: a one-off burst (ZeRO 3's trace check) must not wash out the rest.
    image = axes.imshow(values, cmap="Reds", aspect="auto", norm=PowerNorm(0.5, vmin=0))
    axes.set_yticks(range(len(rows)), rows, fontsize=8)
    labels = [
        f"#{n} {s.hunted.site.file.rsplit('/', 1)[-1]}:{s.hunted.site.line}"
        for n, s in enumerate(sites, start=1)
    ]
    axes.set_xticks(range(len(sites)), labels, rotation=70, ha="right", fontsize=7)
    for tick, site in zip(axes.get_xticklabels(), sites, strict=True):
        tick.set_color(KIND_COLOURS[site.kind])
    for row, line in enumerate(values):
        for column, value in enumerate(line):
            if value:
                axes.text(column, row, rate_text(value), ha="center", va="center", fontsize=6)
    # Wrapped to the figure's width (about 12 characters an inch at this size).
    axes.set_title("\n".join(textwrap.wrap(title, int(12 * width))), fontsize=9)
    figure.colorbar(image, ax=axes, fraction=0.02)
    figure.tight_layout()
    figure.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(figure)


def write_reports(layout: Layout, json_path: Path) -> list[Path]:
    """The Markdown and the heat map beside the result, and census.md from the newest."""
    png = json_path.with_suffix(".png")
    heat_map(results.read(json_path, CensusResult), png, dispositions(layout))
    beside = json_path.with_suffix(".md")
    with beside.open("x") as out:
        out.write(render_file(layout, json_path))
    newest = results.latest(layout.profiles, CensusResult)
    stable = layout.profiles / f"{CensusResult.KIND}.md"
    stable.write_text(render_file(layout, newest))
    return [beside, png, stable]


def render_file(layout: Layout, json_path: Path) -> str:
    result = results.read(json_path, CensusResult)
    png = json_path.with_suffix(".png")
    return render(
        result,
        str(json_path.relative_to(layout.root)),
        png.name if png.exists() else None,
        dispositions(layout),
    )


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
            " -> ".join(_stalls(stalls[c].get(name)) for c in columns),
            " -> ".join(_stalls(idle[c].get(name)) for c in columns),
            verdicts.get(name, "-"),
        )
        for name in result.setups
    ]
    headers = (
        "setup",
        *[f"reads/step {c}" for c in columns],
        "stalls/step " + " -> ".join(columns),
        "idle us/step " + " -> ".join(columns),
        "verdict",
    )
    return f"{table.text(headers, rows)}\nverdict bound: {BOUND}"


def _stalls(value: float | None) -> str:
    """Stalls per step, 0 shown as 0 (unlike a rate, where no reads shows as "-")."""
    return "?" if value is None else f"{value:.2f}".rstrip("0").rstrip(".")
