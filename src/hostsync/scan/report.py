"""What a scan shows: a one-screen summary, the Markdown report beside the result, a heat map of
steps x sites (drawn as the census draws its own) and a Chrome trace per rank (Perfetto opens it).

Figures are per rank per step after the warm-up: a site's waits and stalls (the waits that found
device work queued since the host last waited: a GPU stalls there) and the device work those
waited for, in the words of `hostsync.workspace.vocabulary`. Each site's disposition is matched
again when the report is rendered: carried by a case, accepted by known_sites.toml, read and not
carried, or a candidate. A torch.compile'd call is listed apart, compiled and not judged.
"""

from __future__ import annotations

import importlib.util
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hostsync.detector.records import DeviceWork
from hostsync.detector.sites import COMPILED, Site
from hostsync.measure.cost import idle_per_step
from hostsync.scan.measure import hunt_ranks
from hostsync.sites.dispositions import Disposed, disposed, known_now
from hostsync.sites.known import KnownSites
from hostsync.sites.render import (
    LABEL_COLOURS,
    draw_heat_map,
    figure_text,
    rate_text,
    spans_text,
    where_text,
)
from hostsync.sites.summary import copies_rate, summarize
from hostsync.workspace import results, table, vocabulary
from hostsync.workspace.layout import Layout
from hostsync.workspace.records import HuntSite, ScanRank, ScanResult
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
    per_rank: dict[tuple, dict[int, float]] = defaultdict(dict)
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
    ranks = f"{result.world_size} rank(s) under {result.launcher}"
    options = f" ({' '.join(result.launcher_args)})" if result.launcher_args else ""
    steps = f"each call of `{result.step_fn}`" if result.step_fn else "each optimizer step"
    return (
        f"`python {' '.join([result.script, *result.args])}` on {ranks}{options}, {steps} a"
        f" step under `hostsync.detector`; {measured_steps(result)} step(s) measured per rank"
        f" after {result.warmup} warm-up step(s); {threads_text(result)}"
    )


def threads_text(result: ScanResult) -> str:
    """The threads the ranks were given: the scan adds none unless `--threads` asks."""
    if result.threads is None:
        return "OMP_NUM_THREADS unset (torch's or the launcher's default)"
    return f"OMP_NUM_THREADS={result.threads}"


def summary(result: ScanResult, rules: KnownSites) -> str:
    """One screen: what ran, the figures per step, the top sites with their dispositions."""
    figures = per_step(result)
    lines = [f"scan: {what_ran(result)}"]
    if result.partial:
        lines.append(f"PARTIAL: {result.partial}")
    if figures:
        lines.append(
            vocabulary.figures_line(
                figure_text(figures["waits"]),
                figure_text(figures["copies"]),
                figure_text(figures["stalls"]),
                f"{figures['idle_us']:g}",
                f"{figures['kernels']:.0f}",
                f"{figures['seconds']:.3f}",
            )
        )
    sites = scan_sites(result, rules)
    rows = [
        (
            rate_text(s.hunted.rate),
            rate_text(s.hunted.stall_rate),
            rate_text(s.hunted.idle_rate),
            _short(f"{s.hunted.site.file}:{s.hunted.site.line}  {s.hunted.site.code}", 70),
            _short(str(s.disposed), 45),
        )
        for s in sites[:SUMMARY_SITES]
    ]
    if rows:
        headers = (WAITS, STALLS, IDLE_MEAN, "site", DISPOSITION)
        lines.append(table.text(headers, rows))
        if len(sites) > SUMMARY_SITES:
            lines.append(f"... and {len(sites) - SUMMARY_SITES} more site(s) in the report")
    else:
        lines.append("no wait in the measured steps")
    compiled = [s for s in result.sites if compiled_only(s)]
    lines += [f"{COMPILED_VERDICT}: {where_text(s)}" for s in compiled]
    return "\n".join(lines)


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def render(result: ScanResult, source: str, png: str | None, rules: KnownSites) -> str:
    sites = scan_sites(result, rules)
    figures = per_step(result)
    versions = ", ".join(f"{k} {v}" for k, v in result.environment.versions.items())
    ranks = [rank.rank for rank in result.ranks]
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
                        figure_text(figures["waits"]),
                        figure_text(figures["copies"]),
                        figure_text(figures["stalls"]),
                        f"{figures['idle_us']:g}",
                        f"{figures['kernels']:.0f}",
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
        f"*{WAITS}*, *{STALLS}*: {vocabulary.PER_STEP}, the mean. A wait is a read or a"
        " blocking copy; a stall a wait that found device work queued since the host last waited"
        " (a GPU stalls there); the other waits are free. *waited-for kernels/step*: the"
        " kernels those stalls waited for, per rank per step. *disposition*: carried by a case"
        " (its fix removes the site), accepted by known_sites.toml (with its reason), read and"
        " not carried (with why), or a candidate."
        f" {MEASURED}",
        "",
    ]
    if sites:
        rank_columns = [f"rank {r}" for r in ranks] if len(ranks) > 1 else []
        out.append(
            table.markdown(
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
                        s.hunted.when,
                        str(s.disposed),
                        f"`{s.hunted.site.code}`",
                    )
                    for number, s in enumerate(sites[:TOP], start=1)
                ],
            )
        )
        if len(sites) > TOP:
            out.append(f"\n... and {len(sites) - TOP} more site(s): see the JSON result.")
    else:
        out.append("No wait in the measured steps.")
    compiled = [s for s in result.sites if compiled_only(s)]
    if compiled:
        out += ["", f"## {COMPILED_VERDICT.capitalize()}", ""]
        out += [
            f"- {where_text(s)} `{s.site.code}`: a torch.compile'd call; its graphs run fused"
            " kernels the detector does not judge (waits after it in the same step may show as"
            " free)"
            for s in compiled
        ]
    if png:
        out += ["", f"![steps x sites, waits per rank]({png})"]
    out += ["", "## Steps", "", _steps_table(result)]
    after = [(rank.rank, rank.after_last_step) for rank in result.ranks if rank.after_last_step]
    if after:
        out += ["", "## After the last step", ""]
        for rank, step in after:
            where = ", ".join(f"{s.site.file}:{s.site.line} x{s.count}" for s in step.hunt.sites)
            where = where or "none"
            out.append(f"- rank {rank}: {len(step.waits)} wait(s) ({where})")
    return "\n".join(out) + "\n"


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
    by_step: dict[int, list] = defaultdict(list)
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
    return shown + (f"\n\n... and {more} more step(s): see the JSON result." if more > 0 else "")


def heat_map(result: ScanResult, path: Path, rules: KnownSites) -> bool:
    """Steps x the top sites, waits per rank at each step; False where there is nothing to draw,
    or no matplotlib to draw it with (a user's own environment need not have it)."""
    sites = scan_sites(result, rules)[:TOP]
    numbers = sorted({s.hunt.step for rank in result.ranks for s in rank.steps})[:STEP_ROWS]
    if not sites or not numbers or importlib.util.find_spec("matplotlib") is None:
        return False
    reads: dict[tuple[int, tuple[object, ...]], int] = defaultdict(int)
    warmups = set()
    for rank in result.ranks:
        for step in rank.steps:
            if step.hunt.warmup:
                warmups.add(step.hunt.step)
            for site in step.hunt.sites:
                key = (*site.site.identity, site.caller)
                reads[step.hunt.step, key] += site.count
    world = max(len(result.ranks), 1)
    values = [[reads[n, s.hunted.key] / world for s in sites] for n in numbers]
    rows = [f"step {n}" + (" (warm-up)" if n in warmups else "") for n in numbers]
    draw_heat_map(
        path,
        rows,
        [s.disposed for s in sites],
        values,
        f"Waits per rank at each step of {Path(result.script).name}; {LABEL_COLOURS}",
    )
    return True


def trace(rank: ScanRank, result: ScanResult) -> str:
    """A Chrome trace of one rank's host timeline, as JSON: each step a span, each read an
    instant at the moment it was made, named by its site, with the device work it waited for."""
    events: list[dict[str, object]] = [
        {
            "name": "process_name",
            "ph": "M",
            "pid": rank.rank,
            "args": {"name": f"rank {rank.rank}"},
        },
        {"name": "thread_name", "ph": "M", "pid": rank.rank, "tid": 0, "args": {"name": "host"}},
    ]
    steps = [*rank.steps, *([rank.after_last_step] if rank.after_last_step else [])]
    for step in steps:
        after = step is rank.after_last_step
        events.append(
            {
                "name": "after the last step" if after else f"step {step.hunt.step}",
                "cat": "warm-up" if step.hunt.warmup else "step",
                "ph": "X",
                "pid": rank.rank,
                "tid": 0,
                "ts": round(step.started_s * 1e6, 1),
                "dur": round(step.seconds * 1e6, 1),
                "args": {"waits": step.hunt.cost.reads, "stalls": step.hunt.cost.stalls},
            }
        )
        for wait in step.waits:
            stalled = wait.waited_for.queued
            events.append(
                {
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
            )
    return json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}) + "\n"


def write_reports(layout: Layout, json_path: Path) -> list[Path]:
    """Beside the result: its heat map, its Markdown (and scan.md from the newest), a trace per
    rank in its attachments folder."""
    rules = known_now(layout)
    result = results.read(json_path, ScanResult)
    png = json_path.with_suffix(".png")
    drawn = [png] if heat_map(result, png, rules) else []

    def rendered(one: ScanResult, path: Path) -> str:
        beside = path.with_suffix(".png")
        shown = beside.name if beside.exists() else None
        return render(one, str(path.relative_to(layout.root)), shown, rules)

    written = [*drawn, *results.write_markdown(json_path, ScanResult, rendered)]
    folder = results.attachments(json_path)
    folder.mkdir(exist_ok=True)
    for rank in result.ranks:
        path = folder / f"rank-{rank.rank}.trace.json"
        path.write_text(trace(rank, result))
        written.append(path)
    return written
