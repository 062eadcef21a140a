"""A repro result in words. The console table of each run, the trees compared and the fix's
verdicts. The Trainer's losses, and what a reader must not miss. `hostsync.measure.repro`
measures; this module only renders what it recorded."""

from __future__ import annotations

from collections.abc import Sequence

from hostsync.launch.records import TrainerComparison
from hostsync.measure import cost
from hostsync.measure.records import ReproResult, ScenarioRow
from hostsync.workspace import table
from hostsync.workspace.cases import Case


def cell(run: ScenarioRow, key: str) -> object:
    """A column of the case card, shown: sites as `file:line xN`, rank differences as `a/b`."""
    if key in run.site_lists:
        return ", ".join(
            f"{_short(merged.found.site.file)}:{merged.found.site.line} x{merged.found.count}"
            for merged in run.site_lists[key]
        )
    value = run.get(key)
    if key in run.per_rank:
        return "/".join(table.cell(v) for v in run.per_rank[key])
    if isinstance(value, list):
        return " ".join(table.cell(v) for v in value) or "-"
    return value


def _short(file: str) -> str:
    """A site path without its package folder: the table names the project once."""
    return file.split("/", 1)[1] if "/" in file else file


def anomalies(runs: Sequence[ScenarioRow], columns: Sequence[str]) -> list[str]:
    """What a reader must not miss: ranks that disagree, and what the ranks found wrong."""
    found = []
    for run in runs:
        where = f"{run.tree} x{run.ranks} {run.scenario}"
        for key in columns:
            if key in run.per_rank:
                found.append(f"{where}: ranks differ in {key} {list(run.per_rank[key])}")
        found += [f"{where}: {problem}" for problem in run.problems if problem]
    return found


TRAINER_COLUMNS = ("tree", "Trainer step", "loss with SP", "loss without SP", "|diff|")
# The Trainer's SP loss must equal the loss without SP to float precision.
TRAINER_TOLERANCE = 1e-5


def trainer_rows(comparisons: Sequence[TrainerComparison]) -> list[list[object]]:
    return [
        [compared.tree, step, sp, no_sp, diff]
        for compared in comparisons
        for step, (sp, no_sp, diff) in enumerate(
            zip(compared.sp, compared.no_sp, compared.abs_diff, strict=True), start=1
        )
    ]


def trainer_anomalies(comparisons: Sequence[TrainerComparison]) -> list[str]:
    found = []
    for compared in comparisons:
        if compared.max_abs_diff > TRAINER_TOLERANCE:
            found.append(
                f"{compared.tree} Trainer: SP loss differs from the run without SP by"
                f" {compared.max_abs_diff:.3g}"
            )
        if not compared.sp_ranks_agree:
            found.append(f"{compared.tree} Trainer: the SP ranks logged different losses")
    return found


def report(case: Case, result: ReproResult) -> str:
    columns = ("tree", "ranks", *case.columns)
    rows = [[cell(run, key) for key in columns] for run in result.runs]
    lines = [table.text(columns, rows)]
    if result.comparisons:
        headers = ("scenario", "ranks", "compared", "across trees")
        compared = [[c.scenario, c.ranks, c.key, c.verdict] for c in result.comparisons]
        lines += ["", table.text(headers, compared)]
    if result.verdicts:
        lines += ["", cost.verdict_table(result.verdicts)]
    if result.trainer:
        lines += ["", table.text(TRAINER_COLUMNS, trainer_rows(result.trainer))]
        lines += [f"note: {line}" for line in trainer_anomalies(result.trainer)]
    lines += [f"note: {line}" for line in anomalies(result.runs, case.columns)]
    lines += [
        f"note: {c.scenario} x{c.ranks}: {c.key} {c.verdict}"
        for c in result.comparisons
        if not c.same
    ]
    return "\n".join(lines)
