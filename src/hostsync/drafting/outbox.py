"""`python -m hostsync outbox`: what would be sent upstream for a case, ready for its contributor.

Every outbox is made for one contributor: it is refused, for every case alike, until git's config
names a real one (`git config user.name` / `user.email`; no placeholder, no reserved domain).
`review` runs first, so a stale or failed result is refused there. Then
`issue_drafts/<case>/outbox/` holds either
- `nothing-to-send.md` alone, when nothing should be sent: upstream fixed the bug in a release;
  an open PR takes it on and the series does not carry that PR's own change (figures of another
  variant are no review of it); or the series saves a wait only once another open PR lands. It
  says why, and what was checked; or
- the drafts the upstream state asks for (an issue and a PR; a review comment on an open PR),
  without the note a template opens with for the contributor (an HTML comment), which moves to
  the checklist;
- with a PR: the series' upstream-bound patches (the card's `workspace_only` ones left out),
  applied again as the contributor's commits, with `Signed-off-by` where the project requires a
  DCO, and written by `git format-patch`. Where the project holds an assisted PR until a
  maintainer approves the work in the issue's thread (`Project.pr_after_approval`), the issue goes
  alone, and the PR with its patches only once the card's `[upstream] approved` links that
  approval;
- with a comment: the files the series' tests add, to attach (a test is attached, not pasted);
  the checklist's first step compares the patch carrying the PR's change (the card's
  `[upstream.pr_change]`, named where it is kept in the series) with the PR's current diff: the
  figures hold only for the change that was measured, and one taken from the PR's description
  may differ from its diff;
- `checklist.md`: what only the contributor can do before sending, written for what is sent: a
  rewrite in their own words, the project's way of disclosing assistance, their own system info
  for an issue, the project's PR steps for a PR.
The committed patches keep a neutral author; nothing is sent from here.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

from hostsync.detector.words import counted
from hostsync.drafting import drafts, review
from hostsync.measure.records import ReproResult
from hostsync.upstream.git import git
from hostsync.upstream.patchqueue import (
    added_files,
    base_of,
    clone,
    refuse_left_out,
    series,
    touches_only_tests,
)
from hostsync.workspace.cases import Case, PrChange
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import Layout
from hostsync.workspace.records import PrChangeSource, UpstreamState

OUTBOX = "outbox"
PATCHES = "patches"
CHECKLIST = "checklist.md"
NOTHING_TO_SEND = "nothing-to-send.md"
# The note a template opens with for its contributor (where to post it): not sent.
_NOTE = re.compile(r"\A<!--(?P<note>.*?)-->\n", re.DOTALL)


def contributor(root: Path) -> tuple[str, str]:
    """The name and address the contributor's git sends with; refused when unset or a
    placeholder, in one line saying how to set it."""
    found = [
        git(root, "config", "--get", key, check=False, isolated=False).stdout.strip()
        for key in ("user.name", "user.email")
    ]
    how = (
        "set yours with `git config --global user.name 'Your Name'` and"
        " `git config --global user.email your-address`"
    )
    if not all(found):
        raise WorkspaceError(f"no contributor identity in git's config: {how}")
    name, email = found
    if drafts.placeholder_identity(name) or drafts.placeholder_identity(email):
        raise WorkspaceError(f"`{name} <{email}>` stands for nobody: {how}")
    return name, email


def upstream_patches(layout: Layout, case: Case) -> list[Path]:
    """The series without the patches that stay in this workspace."""
    return [p for p in series(layout) if p.name not in case.card.tests.workspace_only]


def remake_patches(case: Case, identity: tuple[str, str], target: Path) -> None:
    """The upstream-bound patches, applied to the clone's base (the pinned tag, with upstream's
    tests where an sdist lacked them) as the contributor's commits (signed off where the project
    requires it), and written by `git format-patch`."""
    layout = case.layout
    said = clone(case)  # the clone's base, and a check that nothing there is left unexported
    if said:
        print(f"{layout.case}: {said}")
    refuse_left_out(case, "sending the series")
    base = base_of(layout.clone, case.pin.tag)
    name, email = identity
    as_contributor = {
        f"GIT_{role}_{key}": value
        for role in ("AUTHOR", "COMMITTER")
        for key, value in (("NAME", name), ("EMAIL", email))
    }
    sign_off = ["--signoff"] if case.project.sign_off else []
    with tempfile.TemporaryDirectory(dir=layout.work) as scratch:
        tree = Path(scratch) / "tree"
        git(layout.clone, "worktree", "add", "--quiet", "--detach", str(tree), base)
        try:
            for patch in upstream_patches(layout, case):
                git(tree, "am", "--quiet", "-3", str(patch), env=as_contributor)
                git(
                    tree,
                    "commit",
                    "--quiet",
                    "--amend",
                    "--no-edit",
                    "--reset-author",
                    *sign_off,
                    env=as_contributor,
                )
            git(
                tree,
                "format-patch",
                "--quiet",
                "--output-directory",
                str(target),
                f"{base}..HEAD",
            )
        finally:
            git(layout.clone, "worktree", "remove", "--force", str(tree))


def attachments(layout: Layout, case: Case, target: Path) -> list[Path]:
    """The files the series' upstream-bound test patches add, as files to attach."""
    written = []
    for patch in upstream_patches(layout, case):
        if touches_only_tests(patch):
            for path, text in added_files(patch).items():
                written.append(target / Path(path).name)
                written[-1].write_text(text)
    return written


def why_nothing(case: Case) -> str | None:
    """Why nothing should be sent for the case, or None when something should."""
    upstream = case.upstream
    if upstream.state == UpstreamState.FIXED:
        fixed = f", released in {case.project.name} {case.fixed.version}" if case.fixed else ""
        return f"upstream has fixed it (PR #{upstream.pull_request}{fixed})"
    if upstream.state == UpstreamState.OPEN_PR and upstream.pr_change is None:
        return (
            f"open PR #{upstream.pull_request} takes it on, and the series does not carry that"
            " PR's own change: figures of another variant are no review of it (carry its diff, or"
            " its description where no diff is on record, as a patch and name that patch in the"
            " card's `[upstream.pr_change]` to measure it)"
        )
    if upstream.gains_after_pr:
        return (
            f"with the defaults of {case.project.name}, the read the series removes comes right"
            f" after the one open PR #{upstream.gains_after_pr} removes, so until that PR lands"
            " it saves little (what the series measured, below). On CPU a read moved this way can"
            " only move the wait: send it once a GPU run, on that change or with the earlier read"
            " turned off, shows idle time per step dropping beyond its spread between steps"
        )
    return None


def pr_change_patch(case: Case, change: PrChange) -> Path:
    """The upstream-bound patch that carries the open PR's own change; refused when the series
    does not hold the one the card names."""
    found = [p for p in upstream_patches(case.layout, case) if p.name == change.patch]
    if not found:
        raise WorkspaceError(
            f"cases/{case.name}.toml: [upstream.pr_change] names {change.patch}, which is not in"
            f" patches/{case.name}/series: name the patch that carries"
            f" #{case.upstream.pull_request}'s change"
        )
    return found[0]


def compare_first(patch: Path, pull_request: int, change: PrChange) -> str:
    """The checklist's first step for a comment on a PR whose change was carried as a patch (in
    the series, not in the outbox: nothing there is for posting): the figures hold only for that
    change, so the PR's diff as it stands is compared first."""
    taken = {
        PrChangeSource.DIFF: "its diff as it was carried",
        PrChangeSource.DESCRIPTION: "the change as its description gives it (no diff on record)",
    }[change.follows]
    return (
        f"Compare {patch} (the change measured) with #{pull_request}'s current diff before"
        f" posting: the figures are of {taken}, and hold only if the two match; if they differ,"
        " carry the PR's diff as that patch and measure again"
    )


def held_pr(case: Case) -> str | None:
    """The checklist's step when the project holds the PR until a maintainer approves the work
    in its issue's thread and the card links no approval yet; None when the PR may go."""
    project = case.project
    if not project.pr_after_approval or case.upstream.approved:
        return None
    return (
        f"Open the issue, then wait before any PR, as {project.name} asks:"
        f" {project.pr_after_approval}. When a maintainer approves it in the issue's thread, put"
        f" the link to that comment as `approved` under [upstream] in cases/{case.name}.toml and"
        " make the outbox again: it then holds the PR and its patches"
    )


def measured(repro: ReproResult) -> list[str]:
    """Each scenario's verdict on the fix with the per-step figures it rests on, as the repro
    result holds them: what a reader of a nothing-to-send checks the answer against."""
    lines = []
    for compared in repro.verdicts:
        judged = compared.judgement
        stalls, kernels = (
            " → ".join(drafts.number(value) for value in pair)
            for pair in (judged.stalls, judged.kernels)
        )
        lines.append(
            f"- {compared.scenario} ({repro.scenarios[compared.scenario]};"
            f" {counted(compared.ranks, 'rank')}), {compared.before} → {compared.after}:"
            f" {judged.verdict}; per step, all"
            f" ranks together: stalls (reads and copies that found device work queued) {stalls},"
            f" device operators {kernels}"
        )
    return lines


def nothing_to_send(layout: Layout, case: Case, why: str, written: list[Path]) -> str:
    """The answer when nothing should be sent: why, what was checked, and what the series
    measured."""
    sources = review.latest_sources(layout, case)
    lines = [
        f"# Nothing to send: {case.title}",
        "",
        f"Why: {why}.",
        "",
        "What was checked:",
        "",
        f"- upstream's record, as of {case.upstream.seen}",
        f"- the results the drafts cite, fresh: {', '.join(s.path.name for s in sources.values())}",
        f"- the drafts, written for reading and not sent: {', '.join(p.name for p in written)}",
    ]
    repro = sources[ReproResult.KIND].result
    if isinstance(repro, ReproResult) and repro.verdicts:
        lines += ["", "What the series measured (counted on CPU; before → after):", ""]
        lines += measured(repro)
    if case.upstream.notes:
        lines += ["", "What the record says:", "", case.upstream.notes.strip()]
    return "\n".join(lines) + "\n"


def without_note(text: str) -> tuple[str, str]:
    """A filled draft as sent, and the note it opened with for its contributor ("" if none)."""
    found = _NOTE.match(text)
    return (text[found.end() :], " ".join(found["note"].split())) if found else (text, "")


def checklist(
    case: Case,
    kinds: set[str],
    notes: dict[str, str],
    sent: list[str],
    first: tuple[str, ...],
    identity: tuple[str, str],
    held: str | None,
    asks_system_info: bool,
) -> str:
    """What only the contributor can do, for what is sent, `first` before all: a comment gets a
    comment's list, an issue whose PR is `held` says what it waits for, and an issue whose
    template has a system-info section asks for the contributor's own."""
    project = case.project
    steps = [
        *([project.who_may_send] if project.who_may_send else []),
        *first,
        "Rewrite each draft in your own words; keep the figures, which are measured",
        f"Disclose any assistance the way {project.name} asks: {project.assistance}",
    ]
    if "issue" in kinds and case.card.repro.snippet:
        steps.append(
            "Run the quoted reproducer yourself and paste your own output in place of the quoted"
            " one (it names the versions it ran with)"
        )
    if asks_system_info:
        steps.append(
            f"Give your own system info where the issue asks for it: the output of"
            f" `{project.system_info}` on your machine"
        )
    if held:
        steps.append(held)
    if "pr" in kinds:
        name, email = identity
        signed = " and signed off" if project.sign_off else ""
        steps.append(
            f"The patches are authored{signed} as `{name} <{email}>`, the git identity this"
            " outbox was made with: if that is not you, make the outbox again under yours"
        )
        signed = " and sign them off again" if project.sign_off else ""
        steps.append(
            f"The patches apply to the release {case.pin.version}: rebase them onto"
            f" {project.name}'s default branch, rerun their tests there{signed}"
        )
        steps += project.before_sending
    steps += case.upstream.to_do
    what = "posting" if kinds <= drafts.COMMENTS else "sending"
    lines = [f"# Before {what} {', '.join(sent)}", ""]
    lines += [f"{name}: {note}" for name, note in notes.items()]
    lines += [""] if notes else []
    lines += [f"- [ ] {step}" for step in steps]
    return "\n".join(lines) + "\n"


def outbox(case: Case) -> Path:
    """Write the case's outbox; its folder. It is made aside and moved in place whole, so a
    refusal half-way leaves no outbox that the next run would refuse."""
    layout = case.layout
    identity = contributor(layout.root)
    written = review.review(case)  # refuses stale, failed or unchecked drafts first
    target = layout.issue_drafts / OUTBOX
    if target.exists():  # the contributor may have edited it: it is theirs now
        raise WorkspaceError(
            f"{target.relative_to(layout.root)} exists: move it aside (or remove it) to make it"
            " again"
        )
    staging = Path(tempfile.mkdtemp(prefix=f".{OUTBOX}-", dir=layout.issue_drafts))
    try:
        _fill(case, identity, written, staging)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _fill(case: Case, identity: tuple[str, str], written: list[Path], target: Path) -> None:
    """The outbox's files in `target`: the drafts to post, the patches, the attachments and the
    checklist; or the note saying why nothing is sent."""
    layout = case.layout
    why = why_nothing(case)
    if why is not None:
        (target / NOTHING_TO_SEND).write_text(nothing_to_send(layout, case, why, written))
        return
    kinds = {path.stem for path in written}
    held = held_pr(case) if "pr" in kinds else None
    if held:
        if "issue" not in kinds:
            raise WorkspaceError(
                f"{case.project.name} takes a PR only after a maintainer approves the work in an"
                f" issue, and cases/{case.name}/ drafts none: add an issue.md there, or link the"
                " approval as `approved` under [upstream]"
            )
        written = [path for path in written if path.stem != "pr"]
        kinds.discard("pr")
    sent, notes, asks_system_info = [], {}, False
    for path in written:
        text, note = without_note(path.read_text())
        (target / path.name).write_text(text)
        sent.append(path.name)
        if note:
            notes[path.name] = note
        if path.stem == "issue":
            asks_system_info = "system info" in text.lower()
    if "pr" in kinds:
        remake_patches(case, identity, target / PATCHES)
        sent.append("the patches")
    first: tuple[str, ...] = ()
    if kinds & drafts.COMMENTS:
        sent += [path.name for path in attachments(layout, case, target)]
        change = case.upstream.pr_change
        if change is not None:
            patch = pr_change_patch(case, change).relative_to(layout.root)
            first = (compare_first(patch, case.upstream.pull_request, change),)
    (target / CHECKLIST).write_text(
        checklist(case, kinds, notes, sent, first, identity, held, asks_system_info)
    )
