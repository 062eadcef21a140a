"""`python -m hostsync review`: a case's upstream drafts, filled only from its result files.

The drafts are the case's own templates (`cases/<case>/*.md`, named after what they draft: issue,
pr, comment, review-comment; the shape upstream's state asks for, in the project's own
template), with every figure a query over the latest results:

    {{repro:runs[tree=pinned,ranks=2].host_syncs|max}}      a field of the matching rows, reduced
    {{repro:snippet.output.'5.14.0'}}                       a value by its path (quote odd keys)
    {{case:upstream.pull_request}}                          the case card
    {{series:added[path=tests/test_x.py].text}}             a file the series adds, whole
    {{snippet:code}}                                        the case's one-process snippet
    {{bisect:sites[project=deepspeed].first}}              the first release with the site
    {{gpu:figures[tree=pinned].dtoh_copies}}                GPU evidence, where there is some
    {{repro:sites[tree=patched,scenario=zero1]|reads}}      the reads a run leaves, by site
    {{repro:sites[tree=patched,scenario=zero1]|copies}}     its blocking copies to the device
    {{repro:sites[tree=patched,scenario=zero1]|waits}}      both, each named as what it is
    {{repro:sites[tree=pinned,function=step]|stalls}}       which stall, and for what, by site
    {{callers:'Accelerator.clip_grad_norm_'|callers}}       who calls the changed function

A path walks dicts by key and maps over lists; `[key=value,...]` keeps the list items that
match (`[code^=value]`: those whose code starts with the value, where a line moves between
trees). Reducers: first (the default), last, max, min, sum, count, join, and a number n: the
n-th value (`|2`); `reads`, `copies`, `waits` and `stalls` list a repro's sites
(`hostsync.drafting.sites`), so that what a fix leaves and where a wait goes are the
accounting's, not a draft's, and a read is never counted as a copy. Who calls the function a
fix changes is never typed either: `callers` lists, for each function of the card's
`[[upstream.callers]]`, its calls in each project's release the repro ran beside
(`hostsync.upstream.callers`), and refuses a call that passes what the card says none passes.
Results measured against another pin.toml, card, patch series or case script (the snippet an
issue quotes among them) are stale: `review` names them and refuses, or reruns their commands
with `--rerun`; a result of another case, one that measured nothing or a proof that failed is
refused outright, and so is a proof whose new test passes on the pinned release, unless the card
names it a guard. A bisect and
GPU evidence (`gpu` results, made by `gpu/case_on_gpu.py` on a GPU machine and copied into
profiles/<case>/) are optional: cited when fresh, left out with a warning when stale. Each draft
is checked before it is written (`hostsync.drafting.drafts`): its length, no word of this workspace,
no figure typed by hand or missing from the results, no thread its card's `[[upstream.threads]]`
lacks; and its claims against the fix's verdict
(`hostsync.drafting.claims`). A comment on an open PR whose change the series carries says which
change its figures are of, the PR's diff or its description (`{{case:upstream.pr_change.follows}}`).
The same results give byte-identical drafts. `--refresh-reference` also makes
`profiles/<case>/reference/` hold exactly the results the drafts cite, for committing together;
without it nothing tracked is touched. Where profiles/<case>/ holds no result of its own (a fresh
clone), the drafts cite the committed reference set, and say so. A figure no result holds is refused
naming what produces it (`nox -s bisect`, ...).
"""

from __future__ import annotations

import ast
import logging
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from hostsync.detector.codec import dump
from hostsync.detector.sites import Site, suffix_matches
from hostsync.drafting import drafts, sites
from hostsync.drafting.claims import check_claims
from hostsync.drafting.lines import check_lines
from hostsync.history.records import BisectResult
from hostsync.measure import provenance
from hostsync.measure.records import Outcome, ReproResult, TestPatchResult, Verdict
from hostsync.measure.test_patch import RED_TREE, SERIES
from hostsync.profiling.records import GpuResult, ProfileResult
from hostsync.upstream import patchqueue
from hostsync.upstream.callers import calls, parameters
from hostsync.upstream.presence import Sources, sdist_sources
from hostsync.upstream.sdists import pypi_sdist
from hostsync.workspace import results
from hostsync.workspace.cases import Case
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import Layout
from hostsync.workspace.projects import PROJECTS, trainer_project
from hostsync.workspace.records import Result

log = logging.getLogger(__name__)

KINDS: tuple[type[Result], ...] = (ReproResult, TestPatchResult, ProfileResult)
# Cited where the case has one; a draft that cites a figure none holds fails its self-check.
OPTIONAL_KINDS: tuple[type[Result], ...] = (BisectResult, GpuResult)
# Made on a GPU machine: left out with a warning when stale, as no CPU session can remake it.
MADE_ELSEWHERE: tuple[type[Result], ...] = (GpuResult,)
# What a placeholder can cite: the results above, the card, the snippet, the series' new files.
SOURCES = (
    *(kind.KIND for kind in KINDS + OPTIONAL_KINDS),
    "case",
    "snippet",
    "series",
    "defaults",
    "callers",
)
REFERENCE = "reference"
# What a comment on an open PR cites to say which of the PR's changes its figures are of.
PR_CHANGE_FOLLOWS = "upstream.pr_change.follows"
PLACEHOLDER = re.compile(r"\{\{\s*(?P<source>\w+):(?P<path>[^|}]+?)(?:\|(?P<reduce>\w+))?\s*\}\}")
SEGMENT = re.compile(r"(?:'(?P<quoted>[^']*)'|(?P<name>[^.\[\]']+))(?:\[(?P<filters>[^\]]*)\])?\.?")
# A run's settings beside the Trainer's defaults they differ from (the `defaults` source).
SETTINGS, DEFAULTS, TRAINER_ARGUMENTS = "settings", "defaults", "TrainingArguments"
# Who calls the function a fix changes, read in the releases (the `callers` source and reducer).
CALLERS = "callers"
REDUCERS: dict[str, Callable[[list[Any]], Any]] = {
    "max": max,
    "min": min,
    "sum": sum,
    "first": lambda values: values[0],
    "last": lambda values: values[-1],
    "count": len,
    "join": lambda values: ", ".join(str(v) for v in values),
    "reads": sites.reads,
    "copies": sites.copies,
    "waits": sites.waits,
    "stalls": sites.stalls,
    SETTINGS: lambda values: values,
    CALLERS: lambda releases: said_callers(releases),
}


@dataclass(frozen=True)
class Source:
    """One result file the drafts cite."""

    kind: str
    path: Path
    result: Result

    @property
    def data(self) -> dict[str, Any]:
        """The result as its file holds it, and a repro's runs by site (`sites`): what the
        placeholders query."""
        document = self.result.document()
        if isinstance(self.result, ReproResult):
            document["sites"] = dump(sites.run_sites(self.result))
        return document


# --- the results, fresh --------------------------------------------------------------------------


def results_folder(layout: Layout) -> Path:
    """Where the drafts' results are read: profiles/<case>/, or, when it holds none of the
    results every draft needs (a fresh clone), the committed reference set, whole."""
    reference = layout.profiles / REFERENCE
    own = any(results.latest(layout.profiles, kind) for kind in KINDS)
    return reference if not own and reference.is_dir() else layout.profiles


def latest_sources(layout: Layout, case: Case) -> dict[str, Source]:
    """The newest result of each kind the drafts cite (a profile only where the card has one,
    an optional kind where there is one)."""
    found = {}
    folder = results_folder(layout)
    required = KINDS if case.profile else tuple(k for k in KINDS if k is not ProfileResult)
    for kind in required + OPTIONAL_KINDS:
        path = results.latest(folder, kind)
        if path is None and kind in OPTIONAL_KINDS:
            continue
        if path is None:
            raise WorkspaceError(
                f"no {kind.KIND} result in {folder.relative_to(layout.root)}/: run"
                f" `nox -s {kind.KIND} -- --case {layout.case}` first"
            )
        found[kind.KIND] = _source(layout, kind, path)
    return found


def _source(layout: Layout, kind: type[Result], path: Path) -> Source:
    source = Source(kind.KIND, path, results.read(path, kind))
    if source.result.stamp.case != layout.case:  # and its command is that case's: no rerun
        raise WorkspaceError(
            f"profiles/{layout.case}/{path.name} is a result of case"
            f" {source.result.stamp.case}, not {layout.case}: move it to"
            f" profiles/{source.result.stamp.case}/"
        )
    return source


def refuse_unusable(layout: Layout, source: Source) -> None:
    """What a fresh result can still hold that no draft may cite: no runs at all, or a proof
    that failed or was judged WRONG."""
    where = f"profiles/{layout.case}/{source.path.name}"
    result = source.result
    if isinstance(result, ReproResult) and not result.runs:
        raise WorkspaceError(f"{where} holds no runs: rerun `nox -s repro -- --case {layout.case}`")
    if isinstance(result, TestPatchResult):
        wrong = [
            f"{c.check} on {c.label}: {c.reason}"
            for c in result.checks
            if c.verdict == Verdict.WRONG
        ]
        if not result.checks or wrong or not result.ok:
            said = "; ".join(wrong) or "no check passed"
            raise WorkspaceError(
                f"{where} is no passing proof ({said}): mend that and rerun `nox -s test_patch --"
                f" --case {layout.case}`; a draft never says a failed check passed"
            )


def refuse_unguarded(case: Case, proof: TestPatchResult) -> None:
    """A new test fails without the fix: one that passes on the pinned release proves nothing,
    unless the card names it a guard (`[[upstream.guards]]`, with what it keeps); a guard that
    fails there catches the bug, and belongs in `red_on_pinned`."""
    guards = {guard.test for guard in case.upstream.guards}
    ran = [
        test for c in proof.checks if (c.check, c.label) == (SERIES, RED_TREE) for test in c.tests
    ]
    passing = sorted(t.test for t in ran if t.outcome == Outcome.PASSED and t.test not in guards)
    failing = sorted(t.test for t in ran if t.outcome == Outcome.FAILED and t.test in guards)
    version = case.card.pin.version
    if passing:
        raise WorkspaceError(
            f"{', '.join(passing)} {'pass' if len(passing) > 1 else 'passes'} without the fix"
            f" ({RED_TREE}, {version}): it proves nothing; assert the new contract, fold it into"
            " a test that fails, or name it in the card's [[upstream.guards]] with the behaviour"
            " it keeps"
        )
    if failing:
        raise WorkspaceError(
            f"{', '.join(failing)} {'fail' if len(failing) > 1 else 'fails'} without the fix"
            f" ({RED_TREE}, {version}), yet the card's [[upstream.guards]] names it: it catches"
            " the bug; move it to red_on_pinned"
        )


def stale(layout: Layout, sources: dict[str, Source]) -> dict[str, list[str]]:
    """Each stale source's reasons: pin, card, series or the case's scripts changed."""
    found = {}
    for kind, source in sources.items():
        reasons = provenance.stale_reasons(layout, source.result)
        if reasons:
            found[kind] = reasons
    return found


def without_stale_made_elsewhere(layout: Layout, sources: dict[str, Source]) -> dict[str, Source]:
    """The sources less those made elsewhere gone stale (no session here can rerun them)."""
    kept = dict(sources)
    for kind in MADE_ELSEWHERE:
        source = kept.get(kind.KIND)
        reasons = provenance.stale_reasons(layout, source.result) if source else []
        if source and reasons:
            log.warning("not citing stale %s (%s)", source.path.name, ", ".join(reasons))
            del kept[kind.KIND]
    return kept


def fresh_sources(layout: Layout, case: Case, rerun: bool) -> dict[str, Source]:
    """The latest results, refused when stale, or first rerun with the commands that made them."""
    sources = without_stale_made_elsewhere(layout, latest_sources(layout, case))
    outdated = stale(layout, sources)
    if outdated and rerun:
        for kind in outdated:
            rerun_command(sources[kind])
        sources = without_stale_made_elsewhere(layout, latest_sources(layout, case))
        outdated = stale(layout, sources)
    if outdated:
        said = "; ".join(
            f"{sources[kind].path.name} ({', '.join(reasons)})"
            for kind, reasons in outdated.items()
        )
        sessions = " ".join(outdated)
        raise WorkspaceError(
            f"stale results of {case.name}: {said}: rerun `nox -s {sessions} -- --case"
            f" {case.name}`, or `nox -s review -- --case {case.name} --rerun`"
        )
    for source in sources.values():
        refuse_unusable(layout, source)
        if isinstance(source.result, TestPatchResult):
            refuse_unguarded(case, source.result)
    return sources


def rerun_command(source: Source) -> None:
    """Run the command recorded in `source` again, as its own process so that the new result
    records that command (a failure shows in its output and leaves the result stale)."""
    argv = shlex.split(source.result.stamp.command)[3:]  # after `python -m hostsync`
    log.info("rerunning stale %s: python -m hostsync %s", source.path.name, shlex.join(argv))
    status = subprocess.run([sys.executable, "-m", "hostsync", *argv]).returncode
    if status != 0:
        log.warning("`python -m hostsync %s` exited with status %d", shlex.join(argv), status)


# --- filling the templates -----------------------------------------------------------------------


def segments(path: str) -> list[tuple[str, dict[str, str]]]:
    """`runs[tree=pinned].host_syncs` as [("runs", {"tree": "pinned"}), ("host_syncs", {})]."""
    found, position = [], 0
    while position < len(path):
        match = SEGMENT.match(path, position)
        if not match or match.end() == position:
            raise WorkspaceError(f"cannot read the placeholder path {path!r} at {position}")
        filters = dict(
            part.split("=", 1) for part in (match["filters"] or "").split(",") if "=" in part
        )
        name = match["quoted"] if match["quoted"] is not None else match["name"]
        found.append((name, filters))
        position = match.end()
    return found


def lookup(value: Any, path: list[tuple[str, dict[str, str]]]) -> list[Any]:
    """The values at `path` under `value`, mapping over lists on the way."""
    if isinstance(value, list):
        return [found for item in value for found in lookup(item, path)]
    if not path:
        return [] if value is None else [value]
    (name, filters), rest = path[0], path[1:]
    if not isinstance(value, dict) or name not in value:
        return []
    child = value[name]
    if filters:
        items = child if isinstance(child, list) else [child]
        child = [item for item in items if _matches(item, filters)]
    return lookup(child, rest)


def _matches(item: Any, filters: dict[str, str]) -> bool:
    """`key=value` keeps the items whose key is the value; `key^=value`, whose key starts so."""
    return isinstance(item, dict) and all(
        str(item.get(key.removesuffix("^"))).startswith(value)
        if key.endswith("^")
        else str(item.get(key)) == value
        for key, value in filters.items()
    )


def figure(match: re.Match[str], documents: dict[str, Any]) -> str:
    """One placeholder's text; "not measured" when no result holds it."""
    source, reduce = match["source"], match["reduce"] or "first"
    if source not in documents or not (reduce in REDUCERS or reduce.isdecimal()):
        raise WorkspaceError(
            f"unknown placeholder {match[0]}: sources are {', '.join(documents)}, reducers"
            f" {', '.join(REDUCERS)} or a number"
        )
    values = lookup(documents[source], segments(match["path"].strip()))
    if reduce.isdecimal():
        values = values[int(reduce) - 1 : int(reduce)] if int(reduce) else []
        reduce = "first"
    if not values and reduce != "count":
        return drafts.NOT_MEASURED
    if reduce == SETTINGS:
        return settings(values[0], documents.get(DEFAULTS, {}).get(TRAINER_ARGUMENTS, {}))
    return drafts.number(REDUCERS[reduce](values))


def settings(run: Any, defaults: dict[str, Any]) -> str:
    """A scenario's settings where they differ from the Trainer's defaults, each beside its
    default: "`logging_steps=1` (the default is 500)"; "the Trainer's defaults" where none do.
    Two values that both mean none (`False`, `None`, `0`) do not differ."""
    if not isinstance(run, dict):
        raise WorkspaceError(
            f"`{SETTINGS}` renders a run's settings, not {run!r}: cite `runs[...]`"
        )
    differ = [
        f"`{name}={_shown(value)}` (the default is {_shown(defaults[name])})"
        for name, value in run.items()
        if name in defaults and value != defaults[name] and (value or defaults[name])
    ]
    return ", ".join(differ) or "the Trainer's defaults"


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else drafts.number(value)


def said_callers(releases: list[Any]) -> str:
    """Where each release searched calls the function: "in transformers 5.24.0 at
    `transformers/trainer.py:2787` (`_clip_grad_norm`); in trl 1.16.0 nowhere". A call whose
    receiver's class is not known is said only where no call is sure: a maintainer disproves a
    "maybe" in a minute where another class's method of that name is what it calls."""
    said = []
    for release in releases:
        sure = [call for call in release["calls"] if call["sure"]]
        unsure = [call for call in release["calls"] if not call["sure"]]
        if sure:
            where = f"at {_listed(sure)}"
        elif unsure:
            where = f"maybe at {_listed(unsure)}, on a receiver of unknown class"
        else:
            where = "nowhere"
        said.append(f"in {release['project']} {release['version']} {where}")
    return "; ".join(said)


def _listed(calls: list[Any]) -> str:
    """`a.py:1`, `a.py:9` (`f`) and `b.py:4` (`g`): the calls in one function together, named
    as a repro's sites name theirs (`step`, not `Class.step`)."""
    functions: dict[str, list[str]] = {}
    for call in calls:
        function = call["function"].rpartition(".")[2]
        functions.setdefault(function, []).append(f"`{call['file']}:{call['line']}`")
    named = [
        ", ".join(lines) + (f" (`{function}`)" if function else "")
        for function, lines in functions.items()
    ]
    return " and ".join([", ".join(named[:-1]), named[-1]] if len(named) > 1 else named)


def shortest(path: str, files: Iterable[str]) -> str:
    """The shortest end of `path` that no other of `files` ends with: `stage_1_and_2.py`."""
    parts = PurePosixPath(path).parts
    for n in range(1, len(parts)):
        end = "/".join(parts[-n:])
        if sum(1 for file in files if suffix_matches(file, end)) == 1:
            return end
    return path


def trainer_defaults(source: Sources, version: str) -> dict[str, Any]:
    """The defaults of `TrainingArguments` fields, read from a transformers release's source."""
    text = source.get("src/transformers/training_args.py", "")
    found: dict[str, Any] = {}
    for node in ast.walk(ast.parse(text)):
        if not (isinstance(node, ast.ClassDef) and node.name == TRAINER_ARGUMENTS):
            continue
        for field in node.body:
            if not (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)):
                continue
            value = field.value
            if isinstance(value, ast.Call):
                value = next((k.value for k in value.keywords if k.arg == "default"), None)
            try:
                found[field.target.id] = ast.literal_eval(value) if value else None
            except ValueError:
                continue
    if not found:
        raise WorkspaceError(
            f"transformers {version} has no {TRAINER_ARGUMENTS} to read defaults from"
        )
    return found


def fill(template: str, documents: dict[str, Any], margin: int = 0) -> str:
    """The template with each placeholder's figure, `margin` characters wider where asked."""
    return PLACEHOLDER.sub(lambda match: figure(match, documents) + "_" * margin, template)


def made_by(source: str, case: str) -> str:
    """What produces a source's figures: a session, a GPU machine, or the card and series."""
    if source == GpuResult.KIND:
        return "gpu/'s script on a GPU machine (docs/gpu.md)"
    if source in (kind.KIND for kind in KINDS + OPTIONAL_KINDS):
        return f"`nox -s {source} -- --case {case}`"
    return f"nothing: the {source} holds no such value, mend the placeholder"


def refuse_unmeasured(template: Path, text: str, found: dict[str, Any], case: str) -> None:
    """Refuse a template citing a figure no result holds, naming what would produce it."""
    lacking = sorted(
        {
            match["source"]
            for match in PLACEHOLDER.finditer(text)
            if figure(match, found) == drafts.NOT_MEASURED
        }
    )
    if lacking:
        raise WorkspaceError(
            f"{template.name} cites {', '.join(lacking)} figures no result holds: run"
            f" {'; '.join(made_by(source, case) for source in lacking)}; or drop them from the"
            " template"
        )


def refuse_waits_as_reads(template: Path, text: str) -> None:
    """A count of reads counts reads: a verdict's `reads` are its waits, reads and blocking
    copies together, so a template cites `sites[...].reads`, `.copies` or `.waits` instead."""
    for match in PLACEHOLDER.finditer(text):
        if match["source"] == "repro" and re.search(r"\bjudgement\.reads\b", match["path"]):
            raise WorkspaceError(
                f"{template.name} cites {match[0]}: a verdict's `reads` count reads and copies"
                " together; cite `repro:sites[...].reads`, `.copies` or `.waits`"
            )


def refuse_unsaid_pr_change(template: Path, text: str, case: Case) -> None:
    """A comment on an open PR whose change the series carries says which change its figures
    are of: the PR's diff, or its description where no diff is on record."""
    if case.upstream.pr_change is None or drafts.kind(template) not in drafts.COMMENTS:
        return
    if not any(
        match["source"] == "case" and match["path"].strip() == PR_CHANGE_FOLLOWS
        for match in PLACEHOLDER.finditer(text)
    ):
        raise WorkspaceError(
            f"{template.name} does not say which change of #{case.upstream.pull_request} its"
            f" figures are of: cite {{{{case:{PR_CHANGE_FOLLOWS}}}}} (the card's"
            " `[upstream.pr_change]`: its diff, or its description)"
        )


def templates(layout: Layout) -> list[Path]:
    folder = layout.root / "cases" / layout.case
    found = sorted(folder.glob("*.md"))
    if not found:
        raise WorkspaceError(f"cases/{layout.case}/ holds no draft template (*.md): add them")
    return found


def documents(layout: Layout, case: Case, sources: dict[str, Source]) -> dict[str, Any]:
    """What the placeholders can query: each result by kind, the card, the snippet's code, and
    the files the upstream-bound patches add (a new test, shown whole in a draft)."""
    snippet = layout.repro / case.card.repro.snippet if case.card.repro.snippet else None
    added = [
        {"patch": patch.name, "path": path, "text": text}
        for patch in patchqueue.series(layout)
        if patch.name not in case.card.tests.workspace_only
        for path, text in patchqueue.added_files(patch).items()
    ]
    absent: dict[str, Any] = {kind.KIND: {} for kind in OPTIONAL_KINDS} | {CALLERS: {}}
    return (
        absent
        | {kind: source.data for kind, source in sources.items()}
        | {
            "case": case.card.to_json(),
            "snippet": {"code": snippet.read_text().rstrip() if snippet else None},
            "series": {"added": added},
        }
    )


def defaults(
    case: Case, sources: dict[str, Source], release: Callable[[str, str], Sources]
) -> dict[str, Any]:
    """The `defaults` source: the `TrainingArguments` defaults of the transformers release the
    repro ran, where it ran one (read from its sdist only where a template cites them)."""
    repro = sources.get(ReproResult.KIND)
    if repro is None:
        return {}
    document = repro.result.document()
    pinned = document.get("trees", {}).get("pinned", {})
    trainer = trainer_project()
    version = (
        pinned.get("version")
        if case.project.name == trainer
        else document.get("environment", {}).get(trainer)
    )
    if not version:
        return {}
    return {TRAINER_ARGUMENTS: trainer_defaults(release(trainer, version), version)}


def found_callers(
    case: Case, sources: dict[str, Source], release: Callable[[str, str], Sources]
) -> dict[str, Any]:
    """The `callers` source: for each function of the card's `[[upstream.callers]]`, the calls
    of it in each project's release the repro ran beside (the case's own at its pin)."""
    repro = sources.get(ReproResult.KIND)
    environment = repro.result.document().get("environment", {}) if repro else {}
    own, pinned = case.project.name, case.card.pin.version
    card = f"cases/{case.name}.toml's [[upstream.callers]]"
    found: dict[str, Any] = {}
    for entry in case.upstream.callers:
        signature = parameters(release(own, pinned), entry.function)
        if signature is None:
            raise WorkspaceError(
                f"{card} names {entry.function}, which {own} {pinned} does not define: name a"
                " function or `Class.method` of the pinned release"
            )
        releases = []
        for project in entry.projects:
            version = pinned if project == own else environment.get(project)
            if not version:
                raise WorkspaceError(
                    f"{card} searches {project}, which the repro did not run beside: drop it, or"
                    f" install it in the case's environment and rerun `nox -s repro -- --case"
                    f" {case.name}`"
                )
            found_calls = calls(
                release(project, version), PROJECTS[project], entry.function, signature
            )
            for call in found_calls:
                passed = sorted(set(call.passes) & {"*", *entry.without}) if entry.without else []
                if passed:
                    raise WorkspaceError(
                        f"{project} {version}'s `{call.file}:{call.line}` passes"
                        f" {', '.join(passed)} to {entry.function}, which {card} says no caller"
                        " passes (`without`): mend the card and the drafts that say so"
                    )
            cited = dump(found_calls)
            if project == own:  # a draft cites its own project's files as short as they stay one
                for call in cited:
                    call["file"] = shortest(call["file"], release(project, version))
            releases.append({"project": project, "version": version, "calls": cited})
        found[entry.function] = releases
    return found


def release_source(case: Case) -> Callable[[str, str], Sources]:
    """A release's package source, from its sdist: the card's where it pins or names the
    release as fixed, else the index's (verified against its sha256), each read once."""
    cards = {(case.project.name, s.version): s.sdist for s in (case.card.pin, case.card.fixed) if s}
    read: dict[tuple[str, str], Sources] = {}

    def source(project: str, version: str) -> Sources:
        if (project, version) not in read:
            sdist = cards.get((project, version)) or pypi_sdist(PROJECTS[project], version)
            read[project, version] = sdist_sources(case.layout, sdist, PROJECTS[project])
        return read[project, version]

    return source


def recorded_sites(found: dict[str, Any]) -> list[Site]:
    """The sites the draft's repro recorded, on every tree."""
    items = found.get(ReproResult.KIND, {}).get("sites", [])
    return [sites.RunSite.from_json(item).site for item in items]


# --- writing -------------------------------------------------------------------------------------


def refresh_reference(layout: Layout, sources: dict[str, Source]) -> list[str]:
    """Make profiles/<case>/reference/ hold exactly what the drafts cite (no raw traces); say
    what changed."""
    reference = layout.profiles / REFERENCE
    reference.mkdir(parents=True, exist_ok=True)
    profile = sources.get(ProfileResult.KIND)
    folder = results.attachments(profile.path) if profile else None
    kept = [folder / "summary.md", *sorted(folder.glob("timeline-*.png"))] if folder else []
    wanted = {s.path.name for s in sources.values()} | ({folder.name} if folder else set())
    changes = []
    for entry in sorted(reference.iterdir()):
        if entry.name not in wanted:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            changes.append(f"dropped {entry.name}")
    for source in sources.values():
        if not (reference / source.path.name).exists():
            shutil.copyfile(source.path, reference / source.path.name)
            changes.append(f"added {source.path.name}")
    for path in kept:
        if path.exists():
            (reference / path.parent.name).mkdir(exist_ok=True)
            shutil.copyfile(path, reference / path.parent.name / path.name)
    return changes


def review(case: Case, rerun: bool = False, refresh: bool = False) -> list[Path]:
    layout = case.layout
    sources = fresh_sources(layout, case, rerun)
    own_results = results_folder(layout) == layout.profiles
    if not own_results:
        where = f"profiles/{layout.case}/"
        log.info(
            "%s holds no result of its own: citing the committed reference set, %s%s/",
            where,
            where,
            REFERENCE,
        )
    source = release_source(case)
    found = documents(layout, case, sources)
    if any(
        f"|{SETTINGS}" in t.read_text() or f"{{{DEFAULTS}:" in t.read_text()
        for t in templates(layout)
    ):
        found[DEFAULTS] = defaults(case, sources, source)
    if case.upstream.callers:
        found[CALLERS] = found_callers(case, sources, source)
    repro = sources.get(ReproResult.KIND)
    verdicts = repro.result.verdicts if repro and isinstance(repro.result, ReproResult) else ()
    filled = {}
    for template in templates(layout):
        text = template.read_text()
        drafts.check_template(template, text)
        refuse_waits_as_reads(template, text)
        refuse_unmeasured(template, text, found, layout.case)
        refuse_unsaid_pr_change(template, text, case)
        filled[template.name] = drafts.reflow(fill(text, found))
        drafts.check_draft(template.name, drafts.kind(template), filled[template.name])
        wider = drafts.reflow(fill(text, found, drafts.MARGIN))
        drafts.check_length(template.name, drafts.kind(template), wider, widened=True)
        drafts.check_threads(template.name, filled[template.name], case.upstream.cited)
        check_lines(
            template.name, filled[template.name], case.project.name, source, recorded_sites(found)
        )
        check_claims(template.name, filled[template.name], verdicts, GpuResult.KIND in sources)
    if own_results and refresh:  # only a set whose drafts passed becomes the reference
        for change in refresh_reference(layout, sources):
            log.info("profiles/%s/%s: %s", layout.case, REFERENCE, change)
    layout.issue_drafts.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in filled.items():
        target = layout.issue_drafts / name
        target.write_text(text.replace(drafts.TEMPLATE_MARK + "\n", ""))
        written.append(target)
    return written
