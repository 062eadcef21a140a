"""`python -m hostsync outbox`: what would be sent upstream for a case, ready for its contributor.

`issue_drafts/<case>/outbox/` holds, made from the drafts `review` writes (it runs first, so a
stale or failed result is refused there):
- the drafts the upstream state asks for: an issue and a PR; a review comment on an open PR; a
  comment on the merged PR of a fixed bug;
- with a PR: the series' upstream-bound patches (the card's `workspace_only` ones left out),
  applied again as commits of the contributor (`git config user.name` / `user.email`), with
  `Signed-off-by` where the project requires a DCO, and written by `git format-patch`;
- with a comment: the files the series' tests add, to attach (a test is attached, not pasted);
- `checklist.md`: what only the contributor can do before sending.
The committed patches keep a neutral author; nothing is sent from here.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from hostsync import cases, drafts, locks, review
from hostsync.cases import Case
from hostsync.errors import WorkspaceError
from hostsync.layout import Layout
from hostsync.options import add_case, case_layouts
from hostsync.upstream.git import git
from hostsync.upstream.patchqueue import added_files, clone, series, touches_only_tests

OUTBOX = "outbox"
PATCHES = "patches"
CHECKLIST = "checklist.md"


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


def remake_patches(layout: Layout, case: Case, identity: tuple[str, str], target: Path) -> None:
    """The upstream-bound patches, applied to the pinned tag as the contributor's commits
    (signed off where the project requires it), and written by `git format-patch`."""
    said = clone(layout)  # the clone's tag, and a check that nothing there is left unexported
    if said:
        print(f"{layout.case}: {said}")
    name, email = identity
    as_contributor = {f"GIT_{role}_{key}": value for role in ("AUTHOR", "COMMITTER")
                      for key, value in (("NAME", name), ("EMAIL", email))}  # fmt: skip
    sign_off = ["--signoff"] if case.project.sign_off else []
    with tempfile.TemporaryDirectory(dir=layout.work) as scratch:
        tree = Path(scratch) / "tree"
        git(layout.clone, "worktree", "add", "--quiet", "--detach", str(tree), case.pin.tag)
        try:
            for patch in upstream_patches(layout, case):
                git(tree, "am", "--quiet", "-3", str(patch), env=as_contributor)
                git(tree, "commit", "--quiet", "--amend", "--no-edit", "--reset-author",
                    *sign_off, env=as_contributor)  # fmt: skip
            git(tree, "format-patch", "--quiet", "--output-directory", str(target),
                f"{case.pin.tag}..HEAD")  # fmt: skip
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


def checklist(case: Case, sent: list[str]) -> str:
    """What only the contributor can do: the project's steps before sending, the case's."""
    steps = [*case.project.before_sending, *case.upstream.to_do]
    lines = [f"# Before sending {', '.join(sent)}", ""]
    lines += [f"- [ ] {step}" for step in steps]
    return "\n".join(lines) + "\n"


def outbox(layout: Layout) -> Path:
    """Write the case's outbox; its folder."""
    case = cases.load(layout.root, layout.case)
    written = review.review(layout)  # refuses stale, failed or unchecked drafts first
    kinds = {path.stem for path in written}
    identity = contributor(layout.root) if "pr" in kinds else None
    target = layout.issue_drafts / OUTBOX
    if target.exists():  # the contributor may have edited it: it is theirs now
        raise WorkspaceError(
            f"{target.relative_to(layout.root)} exists: move it aside (or remove it) to make it"
            " again"
        )
    target.mkdir(parents=True)
    sent = []
    for path in written:
        shutil.copyfile(path, target / path.name)
        sent.append(path.name)
    if identity is not None:
        remake_patches(layout, case, identity, target / PATCHES)
        sent.append("the patches")
    if kinds & {"comment", "review-comment"}:
        sent += [path.name for path in attachments(layout, case, target)]
    (target / CHECKLIST).write_text(checklist(case, sent))
    return target


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hostsync outbox",
        description="Write what would be sent upstream for a case into issue_drafts/<case>/outbox/:"
        " its drafts, its patches as the contributor's commits, the files to attach, and what"
        " only the contributor can do.",
    )
    add_case(parser)
    args = parser.parse_args(argv)
    for layout in case_layouts(args.case):
        with locks.case(layout):
            target = outbox(layout)
        for path in sorted(target.rglob("*")):
            if path.is_file():
                print(f"wrote {path.relative_to(layout.root)}")
    return 0
