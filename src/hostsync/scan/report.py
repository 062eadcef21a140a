"""What a scan shows: a one-screen summary, the Markdown report beside the result, an SVG heat map
of steps x sites (`sites.render`'s, on the census's scale and colours) and a Chrome trace per
rank (gzipped JSON, which Perfetto opens), each written in a small share of the scan's time.

Figures are per rank per step after the warm-up: a site's waits and stalls (the waits that found
device work queued since the host last waited: a GPU stalls there) and the device work those
waited for, in the words of `hostsync.workspace.vocabulary`. Each site's disposition is matched
again when the report is rendered: carried by a case, accepted by known_sites.toml, read and not
carried, or a candidate. Each site's remedy comes from remedies.toml. A torch.compile'd call is
listed apart, compiled and not judged.
"""

from __future__ import annotations

import gzip
import itertools
import json
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from hostsync.detector.records import DeviceWork
from hostsync.detector.sites import COMPILED, Site
from hostsync.detector.words import counted
from hostsync.measure.cost import idle_per_step
from hostsync.measure.records import ScanRank, ScanResult, ScanStep
from hostsync.scan.measure import hunt_ranks
from hostsync.sites.dispositions import Disposed, disposed, known_now
from hostsync.sites.known import KnownSites
from hostsync.sites.records import HuntSite, StepSite
from hostsync.sites.remedies import NONE, Remedies, Remedy, load_remedies
from hostsync.sites.render import (
    LABEL_COLOURS,
    figure_text,
    rate_text,
    spans_text,
    svg_heat_map,
    where_text,
)
from hostsync.sites.summary import copies_rate, summarize
from hostsync.workspace import results, table, vocabulary
from hostsync.workspace.layout import Layout
from hostsync.workspace.vocabulary import DISPOSITION, IDLE_MEAN, STALLS, WAITS

# How many sites the summary, the heat map and the report's table show; how many steps.
SUMMARY_SITES = 10
TOP = 25
STEP_ROWS = 40
COMPILED_VERDICT = "compiled, not judged"
# What the figures are, said once in every report.
MEASURED = (
    "Blocking copies of host memory to the device (`.to(device)` without `non_blocking=True`,"
    " `torch.tensor(data, device=...)`, `copy_` from the host) are waits like reads, kind"
    " `device_copy`. *median idle us*: the windows after the stalls of a step, each from the"
    " stall until the next kernel launch, summed per step, the median over the steps; *mean idle"
    " us/step* a site's windows summed, the mean per rank per step. Both are host time measured"
    " on this CPU, the detector's own time taken out: a GPU has nothing to run then."
)


@dataclass(frozen=True)
class ScanSite:
    """One site over the ranks, with its disposition, its waits per step on each rank, and the
    device work its stalls waited for, per rank per step."""

    disposed: Disposed
    per_rank: dict[int, float]
    work: DeviceWork

    @property
    def hunted(self) -> HuntSite:
        return self.disposed.hunted


def compiled_only(site: HuntSite) -> bool:
    return site.kinds == (COMPILED,)


def scan_sites(result: ScanResult, rules: KnownSites) -> list[ScanSite]:
    """Every judged site of the result, as summed up over the ranks, most waits first."""
    per_rank: dict[tuple[object, ...], dict[int, float]] = defaultdict(dict)
    for rank in hunt_ranks(result.ranks):
        for site in summarize([rank], ()):
            per_rank[site.key][rank.rank] = site.rate
    work = waited_for(result.ranks)
    return [
        ScanSite(
            disposed(site, rules),
            per_rank[site.key],
            work.get(site.site, DeviceWork()),
        )
        for site in result.sites
        if not compiled_only(site)
    ]


def waited_for(ranks: Sequence[ScanRank]) -> dict[Site, DeviceWork]:
    """The device work each source line's stalls waited for, per rank per step after the
    warm-up (a line read from several callers counts once)."""
    found: dict[Site, DeviceWork] = defaultdict(DeviceWork)
    steady = [step for rank in ranks for step in rank.steps if not step.hunt.warmup]
    for step in steady:
        for site in step.hunt.cost.sites:
            found[site.site] += site.waited_for
    count = max(len(steady), 1)
    return {
        key: DeviceWork(*(value // count for value in work.figures)) for key, work in found.items()
    }


def per_step(result: ScanResult) -> dict[str, float]:
    """Waits, stalls and device work per rank per step after the warm-up; seconds per step (the
    slowest rank's)."""
    cost = result.cost
    steady = [[s for s in rank.steps if not s.hunt.warmup] for rank in result.ranks]
    seconds = [sum(s.seconds for s in steps) / len(steps) for steps in steady if steps]
    if cost is None or not cost.steps:
        return {}
    return {
        "waits": cost.reads / cost.steps,
        "stalls": cost.stalls / cost.steps,
        "copies": copies_rate(result.sites),
        "idle_us": idle_per_step(cost)[0],
        "kernels": cost.work.kernels / cost.steps,
        "collectives": cost.work.collectives / cost.steps,
        "bytes": cost.work.bytes / cost.steps,
        "flops": cost.work.flops / cost.steps,
        "seconds": max(seconds, default=0.0),
    }


def measured_steps(result: ScanResult) -> int:
    return max((sum(not s.hunt.warmup for s in rank.steps) for rank in result.ranks), default=0)


def what_ran(result: ScanResult) -> str:
    ranks = f"{counted(result.world_size, 'rank')} under {result.launcher}"
    options = f" ({' '.join(result.launcher_args)})" if result.launcher_args else ""
    steps = f"each call of `{result.step_fn}`" if result.step_fn else "each optimizer step"
    return (
        f"`python {' '.join([result.script, *result.args])}` on {ranks}{options}, {steps} a"
        f" step under `hostsync.detector`; {counted(measured_steps(result), 'step')} measured"
        f" per rank after {counted(result.warmup, 'warm-up step')}; {threads_text(result)}"
    )


def threads_text(result: ScanResult) -> str:
    """The threads the ranks were given: the scan adds none unless `--threads` asks."""
    if result.threads is None:
        return "OMP_NUM_THREADS unset (torch's or the launcher's default)"
    return f"OMP_NUM_THREADS={result.threads}"


def summary(result: ScanResult, rules: KnownSites, remedies: Remedies) -> str:
    """One screen: what ran, the figures per step, the top sites with their dispositions and
    what to do, those made every step apart from the others."""
    figures = per_step(result)
    lines = [f"scan: {what_ran(result)}"]
    if result.partial:
        lines.append(f"PARTIAL: {result.partial}")
    if figures:
        lines.append(vocabulary.figures_line(*_waits_texts(figures), f"{figures['seconds']:.3f}"))
    every, apart = steps_apart(result, scan_sites(result, rules))
    after = after_training(result)
    used: dict[str, Remedy | None] = {}

    def to_do(kinds: tuple[str, ...], site: Site) -> str:
        remedy = remedies.remedy_for(kinds, site)
        name = remedy.name if remedy else "none"
        used[name] = remedy
        return name

    def where(site: Site) -> str:
        return _short(f"{site.file}:{site.line}  {site.code}", 60)

    def rates(s: ScanSite) -> tuple[str, str]:
        return rate_text(s.hunted.rate), rate_text(s.hunted.stall_rate)

    def known(s: ScanSite) -> tuple[str, str, str]:
        """Where it is, what it is to us, and what to do there."""
        site = s.hunted.site
        return where(site), _short(str(s.disposed), 40), to_do(s.hunted.kinds, site)

    if every:
        lines.append("every step (mean per rank per step after the warm-up):")
        rows = [
            (*rates(s), rate_text(s.hunted.idle_rate), *known(s)) for s in every[:SUMMARY_SITES]
        ]
        headers = (WAITS, STALLS, IDLE_MEAN, "site", DISPOSITION, WHAT_TO_DO)
        lines.append(table.text(headers, rows))
        if len(every) > SUMMARY_SITES:
            lines.append(
                f"... and {counted(len(every) - SUMMARY_SITES, 'more site')} in the report"
            )
    if apart or after:
        lines.append(f"{APART} (mean per rank per step over all the measured steps):")
        steady = steady_steps(result)
        rows = [(when_text(s.hunted, steady), *rates(s), *known(s)) for s in apart[:SUMMARY_SITES]]
        rows += [
            (
                f"{AFTER_TRAINING} ({counted(a.waits, 'wait')})",
                "-",
                "-",
                where(a.site),
                "",
                to_do(a.kinds, a.site),
            )
            for a in after[:SUMMARY_SITES]
        ]
        headers = ("when", WAITS, STALLS, "site", DISPOSITION, WHAT_TO_DO)
        lines.append(table.text(headers, rows))
        more = max(len(apart) - SUMMARY_SITES, 0) + max(len(after) - SUMMARY_SITES, 0)
        if more:
            lines.append(f"... and {counted(more, 'more site')} in the report")
    if not (every or apart or after):
        lines.append("no wait in the measured steps")
    lines += [
        f"{WHAT_TO_DO}: {name}: {remedy.change if remedy else NONE}"
        for name, remedy in used.items()
    ]
    compiled = [s for s in result.sites if compiled_only(s)]
    lines += [f"{COMPILED_VERDICT}: {where_text(s)}" for s in compiled]
    return "\n".join(lines)


# How the summary and the report name the sites not made every step.
APART = "not every step: logging, evaluation, after training"
EVERY_STEP = "every step"
AFTER_TRAINING = "after training"
# The column of a site's remedy.
WHAT_TO_DO = "what to do"


def steady_steps(result: ScanResult) -> list[int]:
    """The step numbers measured after the warm-up, on any rank."""
    return sorted({s.hunt.step for rank in result.ranks for s in rank.steps if not s.hunt.warmup})


def when_text(hunted: HuntSite, steady: Sequence[int]) -> str:
    """Which measured steps a site was made on, in words: every step, every Nth, which ones."""
    measured = set(steady)
    seen = [step for step in hunted.steps if step in measured]
    if not seen:
        return "warm-up only"
    if len(seen) == len(steady):
        return EVERY_STEP
    gaps = {later - earlier for earlier, later in itertools.pairwise(seen)}
    if len(seen) > 2 and len(gaps) == 1:
        return f"every {_ordinal(gaps.pop())} step ({len(seen)} of {len(steady)})"
    if len(seen) <= 3:
        return f"step{'s' * (len(seen) > 1)} {', '.join(map(str, seen))} of {len(steady)}"
    return f"{len(seen)} of {len(steady)} steps"


def _ordinal(number: int) -> str:
    teens = 10 <= number % 100 <= 20
    suffix = "th" if teens else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def steps_apart(result: ScanResult, sites: list[ScanSite]) -> tuple[list[ScanSite], list[ScanSite]]:
    """The sites made on every measured step, then the others (logging, evaluation, a site of
    the warm-up only): those cost a step now and then, not every step."""
    steady = steady_steps(result)
    every = [s for s in sites if when_text(s.hunted, steady) == EVERY_STEP]
    return every, [s for s in sites if s not in every]


@dataclass(frozen=True)
class AfterSite:
    """A site made only after the last step (a last evaluation, saving): its waits and stalls
    over the ranks, and the event kinds recorded there."""

    site: Site
    caller: str
    kinds: tuple[str, ...]
    waits: int
    stalls: int


def after_training(result: ScanResult) -> list[AfterSite]:
    """The sites of the ranks' waits after their last step that no step made, most waits first
    (a rank that never stepped has no training to be after: its waits are the whole run's)."""
    stepped = {site.key for site in result.sites}
    found: dict[tuple[str, ...], list[StepSite]] = defaultdict(list)
    for rank in result.ranks:
        after = rank.after_last_step if rank.steps else None
        for site in after.hunt.sites if after else ():
            key = (*site.site.identity, site.caller)
            if key not in stepped:
                found[key].append(site)
    return sorted(
        (
            AfterSite(
                sites[0].site,
                sites[0].caller,
                tuple(sorted({s.kind for s in sites})),
                sum(s.count for s in sites),
                sum(s.stalls for s in sites),
            )
            for sites in found.values()
        ),
        key=lambda a: (-a.waits, a.site.file, a.site.line),
    )


def _waits_texts(figures: dict[str, float]) -> tuple[str, str, str, str, str]:
    """Waits, copies, stalls, idle and kernels per step, as summary and report print them."""
    return (
        figure_text(figures["waits"]),
        figure_text(figures["copies"]),
        figure_text(figures["stalls"]),
        f"{figures['idle_us']:g}",
        f"{figures['kernels']:.0f}",
    )


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def render(
    result: ScanResult, source: str, picture: str | None, rules: KnownSites, remedies: Remedies
) -> str:
    sites = scan_sites(result, rules)
    figures = per_step(result)
    versions = ", ".join(f"{k} {v}" for k, v in result.environment.versions.items())
    out = [
        f"# Host syncs of `{result.script}`: the scan",
        "",
        f"> Generated by {ScanResult.made_by()} from `{source}` ({result.stamp.created})."
        " `scan.md` beside it is regenerated from the newest scan.",
        "",
        f"**What ran.** {what_ran(result)}. The script's setup runs unwatched; the watch"
        " begins as the first step does, and each later step runs from the end of the one"
        " before, so every wait after the first step falls in one.",
        "",
        f"**On.** {result.environment.device}; {versions}; wall time {result.wall_s:.0f} s."
        f" Command: `{result.stamp.command}`.",
        "",
    ]
    if result.partial:
        out += [f"**Partial.** {result.partial}", ""]
    if figures:
        out += [
            "## Per step",
            "",
            table.markdown(
                (
                    "per rank per step",
                    "waits",
                    "copies",
                    "stalls",
                    "median idle us",
                    "kernels",
                    "collectives",
                    "bytes",
                    "FLOPs",
                    "host s",
                ),
                [
                    (
                        "after the warm-up (the mean)",
                        *_waits_texts(figures),
                        f"{figures['collectives']:.0f}",
                        f"{figures['bytes']:.0f}",
                        f"{figures['flops']:.0f}",
                        f"{figures['seconds']:.4f}",
                    )
                ],
            ),
            "",
        ]
    out += [
        "## Ranks",
        "",
        table.markdown(
            ("rank", "ended", "steps", WAITS, STALLS, "error"),
            [_rank_row(rank) for rank in result.ranks],
        ),
        "",
        "## Sites",
        "",
        f"*{WAITS}*, *{STALLS}*: {vocabulary.PER_STEP}, the mean (as every figure here but the"
        " steps'). A wait is a read or a blocking copy; a stall a wait that found device work"
        " queued since the host last waited (a GPU stalls there); the other waits are free."
        " *waited-for kernels/step*: the kernels those stalls waited for, per rank per step."
        " *disposition*: carried by a case (its fix removes the site), accepted by"
        " known_sites.toml (with its reason), read and not carried (with why), or a candidate."
        " *when*: the steps it was made on. *what to do*: the first remedy of remedies.toml"
        " matching what the detector recorded there (its kinds, the statement), with its reason"
        f" and cost under *What to change*. {MEASURED}",
        "",
    ]
    numbered = list(enumerate(sites[:TOP], start=1))
    every, apart = steps_apart(result, sites[:TOP])
    after_sites = after_training(result)
    if every:
        out.append(_sites_table(result, [(n, s) for n, s in numbered if s in every], remedies))
    else:
        out.append("No wait on every measured step.")
    if len(sites) > TOP:
        out.append(f"\n... and {counted(len(sites) - TOP, 'more site')}: see the JSON result.")
    if apart or after_sites:
        out += [
            "",
            f"## {APART.capitalize()}",
            "",
            "Made on some steps only, or after the last one: a cost paid now and then, not"
            " every step. Their figures are means over every measured step, as above.",
            "",
        ]
        if apart:
            out.append(_sites_table(result, [(n, s) for n, s in numbered if s in apart], remedies))
        if after_sites:
            out += ["", f"*{AFTER_TRAINING}*: made after the last step (every rank's waits).", ""]
            out.append(
                table.markdown(
                    ("site", "waits", "stalls", "kinds", WHAT_TO_DO, "code"),
                    [
                        (
                            f"{a.site.file}:{a.site.line} `{a.site.function}`",
                            a.waits,
                            a.stalls,
                            ", ".join(a.kinds),
                            _remedy_text(remedies.remedy_for(a.kinds, a.site)),
                            f"`{a.site.code}`",
                        )
                        for a in after_sites
                    ],
                )
            )
    out += _what_to_change(numbered, after_sites, remedies)
    compiled = [s for s in result.sites if compiled_only(s)]
    if compiled:
        out += ["", f"## {COMPILED_VERDICT.capitalize()}", ""]
        out += [
            f"- {where_text(s)} `{s.site.code}`: a torch.compile'd call; its graphs run fused"
            " kernels the detector does not judge (waits after it in the same step may show as"
            " free)"
            for s in compiled
        ]
    if picture:
        out += ["", f"![steps x sites, waits per rank]({picture})"]
    out += ["", "## Steps", "", _steps_table(result)]
    after = [(rank.rank, rank.after_last_step) for rank in result.ranks if rank.after_last_step]
    if after:
        out += ["", "## After the last step", ""]
        for rank, step in after:
            where = ", ".join(f"{s.site.file}:{s.site.line} x{s.count}" for s in step.hunt.sites)
            where = where or "none"
            out.append(f"- rank {rank}: {counted(len(step.waits), 'wait')} ({where})")
    return "\n".join(out) + "\n"


def _sites_table(
    result: ScanResult, numbered: list[tuple[int, ScanSite]], remedies: Remedies
) -> str:
    """The sites as numbered in the report (the heat map's numbers), with what to do."""
    ranks = [rank.rank for rank in result.ranks]
    rank_columns = [f"rank {r}" for r in ranks] if len(ranks) > 1 else []
    steady = steady_steps(result)
    return table.markdown(
        (
            "#",
            "site",
            WAITS,
            STALLS,
            *rank_columns,
            "waited-for kernels/step",
            IDLE_MEAN,
            "host ran in the windows",
            "when",
            DISPOSITION,
            WHAT_TO_DO,
            "code",
        ),
        [
            (
                number,
                where_text(s.hunted),
                rate_text(s.hunted.rate),
                rate_text(s.hunted.stall_rate),
                *([rate_text(s.per_rank.get(r)) for r in ranks] if rank_columns else []),
                f"{s.work.kernels} kernels" if s.work.kernels else "-",
                rate_text(s.hunted.idle_rate),
                spans_text(s.hunted.idle) or "-",
                when_text(s.hunted, steady),
                str(s.disposed),
                _remedy_text(remedies.remedy_for(s.hunted.kinds, s.hunted.site)),
                f"`{s.hunted.site.code}`",
            )
            for number, s in numbered
        ],
    )


def _remedy_text(remedy: Remedy | None) -> str:
    return f"**{remedy.name}**: {remedy.change}" if remedy else NONE


def _what_to_change(
    numbered: list[tuple[int, ScanSite]], after: list[AfterSite], remedies: Remedies
) -> list[str]:
    """Each remedy the sites call for, once, with its reason and cost; then the sites none
    matches."""
    by_remedy: dict[str, list[str]] = defaultdict(list)
    found: dict[str, Remedy] = {}
    unmatched: list[str] = []
    named = [(f"#{n}", s.hunted.kinds, s.hunted.site) for n, s in numbered]
    named += [(f"{a.site.file}:{a.site.line}", a.kinds, a.site) for a in after]
    for name, kinds, site in named:
        remedy = remedies.remedy_for(kinds, site)
        if remedy is None:
            unmatched.append(f"{name} ({', '.join(kinds)})")
            continue
        found[remedy.name] = remedy
        by_remedy[remedy.name].append(name)
    if not named:
        return []
    out = ["", "## What to change", ""]
    out += [
        f"- **{name}** ({', '.join(by_remedy[name])}): {remedy.change}. *Why:* {remedy.reason}."
        f" *Cost:* {remedy.cost}."
        for name, remedy in found.items()
    ]
    if unmatched:
        out.append(
            f"- {NONE}: {', '.join(unmatched)}. Matched by the kinds the detector recorded and"
            " the statement's code; a `[[remedy]]` table there names a new one."
        )
    return out


def _rank_row(rank: ScanRank) -> tuple[object, ...]:
    steady = [s for s in rank.steps if not s.hunt.warmup]
    count = len(steady) or 1
    return (
        rank.rank,
        rank.ended.value,
        len(rank.steps),
        rate_text(sum(s.hunt.cost.reads for s in steady) / count) if steady else "-",
        rate_text(sum(s.hunt.cost.stalls for s in steady) / count) if steady else "-",
        rank.error or "",
    )


def _steps_table(result: ScanResult) -> str:
    """Each step, over the ranks: waits and stalls summed, kernels, the slowest rank's time."""
    by_step: dict[int, list[ScanStep]] = defaultdict(list)
    for rank in result.ranks:
        for step in rank.steps:
            by_step[step.hunt.step].append(step)
    rows = [
        (
            number,
            "warm-up" if steps[0].hunt.warmup else "",
            sum(s.hunt.cost.reads for s in steps),
            sum(s.hunt.cost.stalls for s in steps),
            sum(s.hunt.cost.work.kernels for s in steps),
            f"{max(s.seconds for s in steps):.4f}",
        )
        for number, steps in sorted(by_step.items())[:STEP_ROWS]
    ]
    shown = table.markdown(
        ("step", "", "waits (all ranks)", "stalls (all ranks)", "kernels", "host s"), rows
    )
    more = len(by_step) - STEP_ROWS
    return shown + (
        f"\n\n... and {counted(more, 'more step')}: see the JSON result." if more > 0 else ""
    )


def heat_map(result: ScanResult, path: Path, rules: KnownSites) -> bool:
    """Steps x the top sites, waits per rank at each step, as an SVG; False where there is
    nothing to draw."""
    sites = scan_sites(result, rules)[:TOP]
    numbers = sorted({s.hunt.step for rank in result.ranks for s in rank.steps})[:STEP_ROWS]
    if not sites or not numbers:
        return False
    waits: dict[tuple[int, tuple[object, ...]], int] = defaultdict(int)
    warmups = set()
    for rank in result.ranks:
        for step in rank.steps:
            if step.hunt.warmup:
                warmups.add(step.hunt.step)
            for site in step.hunt.sites:
                key = (*site.site.identity, site.caller)
                waits[step.hunt.step, key] += site.count
    world = max(len(result.ranks), 1)
    values = [[waits[n, s.hunted.key] / world for s in sites] for n in numbers]
    rows = [f"step {n}" + (" (warm-up)" if n in warmups else "") for n in numbers]
    title = f"Waits per rank at each step of {Path(result.script).name}; {LABEL_COLOURS}"
    path.write_text(svg_heat_map(rows, [s.disposed for s in sites], values, title))
    return True


def write_trace(rank: ScanRank, path: Path) -> None:
    """A Chrome trace of one rank's host timeline, gzipped JSON (Perfetto opens it), written
    event by event as it is made: a long run's trace is never held whole."""
    with gzip.open(path, "wt", compresslevel=6) as out:
        out.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
        for number, event in enumerate(trace_events(rank)):
            out.write(("," if number else "") + json.dumps(event) + "\n")
        out.write("]}\n")


def trace_events(rank: ScanRank) -> Iterator[dict[str, object]]:
    """Each step a span, each wait an instant at the moment it was made, named by its site,
    with the device work it waited for."""
    yield {
        "name": "process_name",
        "ph": "M",
        "pid": rank.rank,
        "args": {"name": f"rank {rank.rank}"},
    }
    yield {"name": "thread_name", "ph": "M", "pid": rank.rank, "tid": 0, "args": {"name": "host"}}
    steps = [*rank.steps, *([rank.after_last_step] if rank.after_last_step else [])]
    for step in steps:
        after = step is rank.after_last_step
        yield {
            "name": "after the last step" if after else f"step {step.hunt.step}",
            "cat": "warm-up" if step.hunt.warmup else "step",
            "ph": "X",
            "pid": rank.rank,
            "tid": 0,
            "ts": round(step.started_s * 1e6, 1),
            "dur": round(step.seconds * 1e6, 1),
            "args": {"waits": step.hunt.cost.reads, "stalls": step.hunt.cost.stalls},
        }
        for wait in step.waits:
            stalled = wait.waited_for.queued
            yield {
                "name": f"{Path(wait.site.file).name}:{wait.site.line}",
                "cat": COMPILED if wait.kind == COMPILED else "stall" if stalled else "free",
                "ph": "i",
                "s": "t",
                "pid": rank.rank,
                "tid": 0,
                "ts": round(wait.at_s * 1e6, 1),
                "args": {
                    "site": str(wait.site),
                    "code": wait.site.code,
                    "kind": wait.kind,
                    "waited for": wait.waited_for.to_json(),
                },
            }


def write_reports(layout: Layout, json_path: Path) -> list[Path]:
    """Beside the result: its heat map, its Markdown (and scan.md from the newest), a trace per
    rank in its attachments folder."""
    rules, remedies = known_now(layout), load_remedies(layout)
    result = results.read(json_path, ScanResult)
    svg = json_path.with_suffix(".svg")
    drawn = [svg] if heat_map(result, svg, rules) else []

    def rendered(one: ScanResult, path: Path) -> str:
        beside = path.with_suffix(".svg")
        shown = beside.name if beside.exists() else None
        return render(one, str(path.relative_to(layout.root)), shown, rules, remedies)

    written = [*drawn, *results.write_markdown(json_path, ScanResult, rendered)]
    folder = results.attachments(json_path)
    folder.mkdir(exist_ok=True)
    for rank in result.ranks:
        path = folder / f"rank-{rank.rank}.trace.json.gz"
        write_trace(rank, path)
        written.append(path)
    return written
