"""The patch queue: `patches/<case>/` on the case's clone, and back.

`work/clones/<case>` is where a contributor edits. Its base is the release tag the case card
pins (`releases.materialise`); a clone made from an sdist with `--remote PATH` has upstream's
tests/ committed on the tag first (`harness`), and that commit is its base. The branch `patched`
holds `patches/<case>/` applied in `series` order on the base, one commit per patch;
`export_patches` writes it back with `git format-patch`, byte for byte reproducibly. Neither
ever loses work: with uncommitted edits in the clone, or commits there that are not in
`patches/`, they stop and say how to keep or discard them.
"""

from __future__ import annotations

import logging
import re
import tempfile
from pathlib import Path

from hostsync.upstream import harness
from hostsync.upstream.git import (
    git,
    read_state,
    refuse_to_lose_work,
    rev,
    write_state,
)
from hostsync.upstream.records import GitState
from hostsync.upstream.releases import from_sdist, materialise
from hostsync.workspace.cases import Case
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.files import sha256
from hostsync.workspace.layout import Layout

log = logging.getLogger(__name__)

PATCHED = "patched"
SERIES_HEADER = "# Applied in this order by `nox -s clone`; rewritten by `nox -s export_patches`.\n"


class PatchDoesNotApply(WorkspaceError):
    """A patch of the series conflicts with the tree it is applied to."""

    def __init__(self, patch: Path, where: str, files: list[str], remedy: str = "") -> None:
        super().__init__(
            f"{patch.parent.name}/{patch.name} does not apply to {where}"
            f" (conflict in {', '.join(files) or 'an unknown file'})"
            + (f": {remedy}" if remedy else "")
        )
        self.patch, self.where, self.files = patch, where, files


def series(layout: Layout) -> list[Path]:
    """The case's patches in patches/<case>/series order (blank lines and # comments skipped);
    a name without its file is refused."""
    series_file = layout.patches / "series"
    if not series_file.exists():
        return []
    names = [line.strip() for line in series_file.read_text().splitlines()]
    patches = [layout.patches / name for name in names if name and not name.startswith("#")]
    missing = [patch.name for patch in patches if not patch.is_file()]
    if missing:
        raise WorkspaceError(
            f"patches/{layout.case}/series names {', '.join(missing)}, which is not there:"
            " add the file, or remove its line from the series"
        )
    return patches


def touched_files(patch: Path) -> list[str]:
    """The files a patch changes, both names of a rename."""
    pairs = re.findall(r"^diff --git a/(\S+) b/(\S+)$", patch.read_text(), re.MULTILINE)
    return sorted({path for pair in pairs for path in pair})


def added_files(patch: Path) -> dict[str, str]:
    """The files a patch creates, with their whole text (its `+` lines)."""
    found = {}
    for diff in re.split(r"^diff --git ", patch.read_text(), flags=re.MULTILINE)[1:]:
        if "\nnew file mode" not in diff.split("@@", 1)[0]:
            continue
        named = re.search(r"^\+\+\+ b/(\S+)$", diff, re.MULTILINE)
        if named is None:
            raise WorkspaceError(f"{patch}: a new file without a `+++ b/` line: export it again")
        path = named[1]
        body = diff.split("\n@@", 1)[1].split("\n", 1)[1]
        lines = [line[1:] for line in body.splitlines() if line.startswith("+")]
        found[path] = "\n".join(lines) + "\n"
    return found


def touches_only_tests(patch: Path) -> bool:
    """A test patch: every file it changes lies under tests/ (applies to any release)."""
    files = touched_files(patch)
    return bool(files) and all(path.startswith("tests/") for path in files)


def lacks_upstream_tests(patch: Path, root: Path) -> list[str]:
    """The files a test patch edits that the tree at `root` lacks: upstream's tests, which a tree
    made from an sdist does not have (`test_patch --remote` copies them in)."""
    if not touches_only_tests(patch):
        return []
    edited = set(touched_files(patch)) - set(added_files(patch))
    return sorted(path for path in edited if not (root / path).exists())


def apply_patches(repo: Path, patches: list[Path], base: str, where: str) -> list[str]:
    """`git am -3` each patch onto HEAD (already at `base`); on a conflict, back to `base`.
    A test patch editing upstream's tests the tree lacks is left out, saying so: the names of
    those left out."""
    left_out = []
    for patch in patches:
        lacking = lacks_upstream_tests(patch, repo)
        if lacking:
            log.info("%s: leaving out %s (%s not here)", where, patch.name, ", ".join(lacking))
            left_out.append(patch.name)
            continue
        result = git(repo, "am", "-3", "--committer-date-is-author-date", str(patch), check=False)
        if result.returncode != 0:
            files = _failing_files(result.stdout + result.stderr)
            git(repo, "am", "--abort", check=False)
            git(repo, "reset", "--quiet", "--hard", base)
            raise PatchDoesNotApply(patch, where, files)
    return left_out


def _failing_files(output: str) -> list[str]:
    patterns = (
        r"^error: patch failed: (\S+?):\d+$",
        r"^CONFLICT \([^)]*\): Merge conflict in (\S+)$",
        r"^error: (\S+): does not exist in index$",
        r"^error: (\S+): already exists in (?:index|working directory)$",
        # A tree imported from an sdist holds no blob the patch was made against.
        r"^error: invalid object \S+ \S+ for '(\S+)'$",
    )
    found = [m for p in patterns for m in re.findall(p, output, re.MULTILINE)]
    return sorted(set(found))


SERIES = "series"


def _series_state(layout: Layout) -> dict[str, str]:
    """What patches/<case>/ holds, by sha256: each patch of the series, and the series file."""
    found = {p.name: sha256(p) for p in series(layout)}
    series_file = layout.patches / SERIES
    return found | ({SERIES: sha256(series_file)} if series_file.exists() else {})


def clone(case: Case, remote: str | None = None) -> str | None:
    """Make the case's clone its pinned tag plus its patches on `patched`; say what was done.

    Idempotent: None when there was nothing to do. Refuses, naming the way out, whenever going
    on could lose work in the clone.
    """
    layout = case.layout
    repo, tag = layout.clone, case.pin.tag
    where = f"{case.project.name} {tag}"
    if not repo.exists():
        materialise(layout, case.project, case.pin, repo, remote)
        git(repo, "checkout", "--quiet", "-B", PATCHED, tag)
        origin = read_state(repo).origin
        if remote and from_sdist(origin) and Path(remote).is_dir():
            tests = harness.source(Path(remote), tag, origin)
            harness.copy_into(tests, repo)
            origin += f" + upstream's tests/ from {harness.shown(remote)}"
            write_state(repo, upstream_tests=tests.commit)
        write_state(repo, base=rev(repo, "HEAD"))
        return f"{origin}: " + _apply_queue(layout, repo, tag, where)

    if not (repo / ".git").exists() or not rev(repo, tag):
        raise WorkspaceError(
            f"{repo} is not a clone of {where} (the case card changed?): move it aside and rerun"
        )
    base = base_of(repo, tag)
    if read_state(repo).applying:
        # Our own apply was interrupted (Ctrl-C): nothing on top of the base is the user's.
        git(repo, "am", "--abort", check=False)
        git(repo, "reset", "--quiet", "--hard", base)
        return "an interrupted apply was undone: " + _apply_queue(layout, repo, tag, where)
    refuse_to_lose_work(repo, where="the clone")
    branch = git(repo, "branch", "--show-current").stdout.strip()
    if branch != PATCHED:
        raise WorkspaceError(
            f"the clone has {branch or 'a detached HEAD'} checked out, not {PATCHED}:"
            f" run `git -C {shown(layout, repo)} switch {PATCHED}` first"
        )
    state, head = read_state(repo), rev(repo, "HEAD")
    if head == state.head:
        if state.series == _series_state(layout):
            return None
        git(repo, "reset", "--quiet", "--hard", base)
        return "patches/ changed since the last run: " + _apply_queue(layout, repo, tag, where)
    if _format_patches(repo, base) == _read_patches(layout):
        write_state(repo, head=head, series=_series_state(layout))
        return None
    commits = git(repo, "rev-list", "--count", f"{base}..{PATCHED}").stdout.strip()
    raise WorkspaceError(
        f"{PATCHED} in {shown(layout, repo)} ({commits} commits on {tag}) differs from patches/:"
        " keep it with `nox -s export_patches`, or discard it with"
        f" `git -C {shown(layout, repo)} reset --hard {state.head or base}`"
    )


def base_of(repo: Path, tag: str) -> str:
    """What the series applies on in the clone: the tag, or the tag with upstream's tests."""
    return read_state(repo).base or rev(repo, tag)


def _apply_queue(layout: Layout, repo: Path, tag: str, where: str) -> str:
    """Apply the series on the clone's base; the recorded state says what is applied."""
    patches, base = series(layout), base_of(repo, tag)
    write_state(repo, applying=True)
    try:
        left_out = apply_patches(repo, patches, base, where)
    except PatchDoesNotApply as error:
        write_state(
            repo, head=rev(repo, "HEAD"), series={}, applying=False, failed=error.patch.name
        )
        clone = shown(layout, repo)
        raise PatchDoesNotApply(
            error.patch,
            error.where,
            error.files,
            f"the clone is left at its base; apply the series there by hand (`git -C {clone} am -3"
            f" ../../../patches/{layout.case}/*.patch`, resolve, `git am --continue`), then"
            f" `nox -s export_patches -- --case {layout.case} --force`; or drop the patch from"
            " the series",
        ) from None
    write_state(
        repo,
        head=rev(repo, "HEAD"),
        series=_series_state(layout),
        applying=False,
        failed=None,
        left_out=tuple(left_out),
    )
    applied = len(patches) - len(left_out)
    return f"applied {applied} patch(es) from patches/{layout.case}/series on {PATCHED}" + (
        f", leaving out {', '.join(left_out)}: the clone lacks upstream's tests they edit"
        " (`nox -s clone -- --remote PATH` makes one with them)"
        if left_out
        else ""
    )


def shown(layout: Layout, path: Path) -> str:
    """`path` as a user types it from the workspace root."""
    return str(path.relative_to(layout.root)) if path.is_relative_to(layout.root) else str(path)


# --- exporting the branch back into patches/ -----------------------------------------------------


def _format_patches(repo: Path, base: str) -> dict[str, bytes]:
    """The commits of `patched` as patch files, byte-stable across machines and git configs."""
    with tempfile.TemporaryDirectory() as out:
        git(
            repo,
            "format-patch",
            f"{base}..{PATCHED}",
            "--quiet",
            "--output-directory",
            out,
            "--no-signature",
            "--zero-commit",
            "--full-index",
            "--no-numbered",
            "--diff-algorithm=myers",
            "--stat=72",
            "--summary",
        )
        return {p.name: p.read_bytes() for p in sorted(Path(out).iterdir())}


def _read_patches(layout: Layout) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in series(layout)}


def export_patches(case: Case, force: bool = False) -> dict[str, list[str]]:
    """Write the clone's `patched` commits into patches/<case>/; return the names by change.

    Only files the clone was last seen to match are replaced or removed: a patch added to the
    series, or edited, since then is not in the clone, and exporting would lose it. Then the
    export refuses, unless `force` says to replace patches/ with the clone's commits.
    """
    layout = case.layout
    repo, tag = layout.clone, case.pin.tag
    if not repo.exists():
        raise WorkspaceError(f"no clone at {shown(layout, repo)}: run `nox -s clone` first")
    refuse_to_lose_work(repo, where="the clone")
    refuse_left_out(case, "exporting")
    if not force:
        _refuse_to_overwrite(layout, read_state(repo))
    new, old = _format_patches(repo, base_of(repo, tag)), _read_patches(layout)
    report = {
        "added": sorted(set(new) - set(old)),
        "changed": sorted(n for n in set(new) & set(old) if new[n] != old[n]),
        "removed": sorted(set(old) - set(new)),
        "unchanged": sorted(n for n in set(new) & set(old) if new[n] == old[n]),
    }
    layout.patches.mkdir(parents=True, exist_ok=True)
    for name in report["added"] + report["changed"]:
        (layout.patches / name).write_bytes(new[name])
    for name in report["removed"]:
        (layout.patches / name).unlink()
    (layout.patches / "series").write_text(SERIES_HEADER + "".join(f"{n}\n" for n in sorted(new)))
    write_state(repo, head=rev(repo, "HEAD"), series=_series_state(layout), failed=None)
    return report


def refuse_left_out(case: Case, doing: str) -> None:
    """Refuse when the clone left test patches out for want of upstream's tests: `doing` would
    drop them."""
    layout = case.layout
    left_out = read_state(layout.clone).left_out
    if left_out:
        raise WorkspaceError(
            f"the clone lacks upstream's tests that {', '.join(left_out)} edit (made from an"
            f" sdist): {doing} would drop them; move {shown(layout, layout.clone)} aside and make"
            f" it again with `nox -s clone -- --case {layout.case} --remote PATH` (a clone of"
            f" {case.project.repository}), then run this again"
        )


def _refuse_to_overwrite(layout: Layout, state: GitState) -> None:
    """Refuse when patches/<case>/ holds what the clone does not: the export would lose it."""
    unseen = [
        name for name, digest in _series_state(layout).items() if state.series.get(name) != digest
    ]
    if not unseen:
        return
    force = f"`nox -s export_patches -- --case {layout.case} --force`"
    if state.failed:
        raise WorkspaceError(
            f"the clone does not hold the series ({state.failed} did not apply to it): apply"
            f" the series by hand in {shown(layout, layout.clone)}, then {force}"
        )
    raise WorkspaceError(
        f"patches/{layout.case}/ has changed since the clone last matched it ({', '.join(unseen)}):"
        f" exporting would lose that; run `nox -s clone -- --case {layout.case}` to bring it into"
        f" the clone first, or {force} to replace patches/{layout.case}/ with the clone's commits"
    )
