"""The pinned tree and the patch queue, for real: a local bare repository, the real PyPI sdist."""

from __future__ import annotations

import dataclasses
import shutil
import textwrap
from pathlib import Path

import pytest

from hostsync.drafting import outbox
from hostsync.measure.records import Verdict
from hostsync.upstream import git as gitmodule
from hostsync.upstream import patchqueue, releases, trees
from hostsync.upstream.patchqueue import series
from hostsync.upstream.sdists import fetch_sdist
from hostsync.workspace import cases, results
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import ROOT, Layout

import made

CASE = cases.load(ROOT, "sp-loss")
PIN = CASE.pin
TAG = PIN.tag
DEEPSPEED_PY = "src/transformers/integrations/deepspeed.py"


def git(repo: Path, *args: str) -> str:
    return gitmodule.git(repo, *args).stdout.strip()


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


@pytest.fixture
def remote(tmp_path: Path) -> Path:
    """A bare repository shaped like transformers: the pinned tag, then a later commit."""
    source = tmp_path / "upstream-src"
    write(source / "src/transformers/__init__.py", f'__version__ = "{PIN.version}"\n')
    write(source / DEEPSPEED_PY, "def loss(x):\n    return max(x, 1)\n")
    write(source / "tests/test_loss.py", "def test_loss():\n    pass\n")
    git(source.parent, "init", "--quiet", "--initial-branch=main", str(source))
    git(source, "add", "--all")
    git(source, "commit", "--quiet", "--message", "release")
    git(source, "tag", "--annotate", "--message", "release", TAG)
    write(source / DEEPSPEED_PY, "def loss(x):\n    return x.clamp(min=1)  # after the release\n")
    git(source, "commit", "--quiet", "--all", "--message", "after the release")
    bare = tmp_path / "transformers.git"
    git(tmp_path, "clone", "--quiet", "--bare", str(source), str(bare))
    return bare


@pytest.fixture
def workspace(workspace: Layout) -> Layout:
    """The shared workspace fixture with an empty series: each test makes its own."""
    shutil.rmtree(workspace.patches)
    workspace.patches.mkdir()
    return workspace


def make_patches(layout: Layout, remote: Path, edits: dict[str, str]) -> list[Path]:
    """Commit each edit (subject -> new loss body) on the tag and export them as the series."""
    scratch = layout.root.parent / "scratch"
    git(layout.root.parent, "clone", "--quiet", "--branch", TAG, str(remote), str(scratch))
    git(scratch, "checkout", "--quiet", "-b", patchqueue.PATCHED)
    for subject, body in edits.items():
        write(scratch / DEEPSPEED_PY, f"def loss(x):\n    {body}\n")
        git(scratch, "commit", "--quiet", "--all", "--message", subject)
    shutil.move(scratch, layout.clone)
    patchqueue.export_patches(made.case_of(layout))
    shutil.rmtree(layout.clone)
    return series(layout)


def add_to_series(layout: Layout, patch: Path) -> None:
    with (layout.patches / "series").open("a") as out:
        out.write(f"{patch.name}\n")


def conflicting_series(layout: Layout, remote: Path) -> tuple[Path, dict[str, bytes]]:
    """A series whose second patch edits a line the release does not have; its bytes."""
    good = make_patches(layout, remote, {"Keep the count on the device": "return x.clamp(1)"})
    bad = layout.patches / "0002-Edit-a-line-the-release-does-not-have.patch"
    bad.write_text(good[0].read_text().replace("max(x, 1)", "x.clamp(min=1)  # after the release"))
    add_to_series(layout, bad)
    return bad, {p.name: p.read_bytes() for p in layout.patches.iterdir()}


def test_git_path_clones_the_tag_and_applies_the_series(workspace: Layout, remote: Path) -> None:
    make_patches(workspace, remote, {"Keep the count on the device": "return x.clamp(min=1)"})

    said = patchqueue.clone(made.case_of(workspace), remote=str(remote))

    repo = workspace.clone
    assert said.startswith(f"git clone of {remote} at tag {TAG}")
    assert git(repo, "branch", "--show-current") == patchqueue.PATCHED
    assert git(repo, "log", "--format=%s", f"{TAG}..HEAD") == "Keep the count on the device"
    assert "after the release" not in (repo / DEEPSPEED_PY).read_text()
    assert "max(x, 1)" in git(repo, "show", f"{TAG}:{DEEPSPEED_PY}")


def test_second_clone_does_nothing(workspace: Layout, remote: Path) -> None:
    make_patches(workspace, remote, {"Keep the count on the device": "return x.clamp(min=1)"})
    patchqueue.clone(made.case_of(workspace), remote=str(remote))
    head = git(workspace.clone, "rev-parse", "HEAD")

    assert patchqueue.clone(made.case_of(workspace), remote=str(remote)) is None
    assert git(workspace.clone, "rev-parse", "HEAD") == head


def test_patch_that_does_not_apply_names_itself_and_leaves_the_base(
    workspace: Layout, remote: Path
) -> None:
    bad, before = conflicting_series(workspace, remote)

    for _ in range(2):  # a failed apply is not remembered as done
        with pytest.raises(patchqueue.PatchDoesNotApply) as failure:
            patchqueue.clone(made.case_of(workspace), remote=str(remote))
        assert bad.name in str(failure.value)
        assert DEEPSPEED_PY in str(failure.value)

    repo = workspace.clone
    assert git(repo, "rev-parse", "HEAD") == git(repo, "rev-parse", f"{TAG}^{{commit}}")
    assert not (repo / git(repo, "rev-parse", "--git-path", "rebase-apply")).exists()
    assert {p.name: p.read_bytes() for p in workspace.patches.iterdir()} == before


def test_round_trip_without_edits_changes_no_byte(workspace: Layout, remote: Path) -> None:
    make_patches(
        workspace,
        remote,
        {"Keep the count on the device": "return x.clamp(min=1)", "Name it": "return x.clamp(1)"},
    )
    before = {p.name: p.read_bytes() for p in workspace.patches.iterdir()}
    patchqueue.clone(made.case_of(workspace), remote=str(remote))

    report = patchqueue.export_patches(made.case_of(workspace))

    assert report["unchanged"] == sorted(n for n in before if n != "series")
    assert not report["added"] + report["changed"] + report["removed"]
    assert {p.name: p.read_bytes() for p in workspace.patches.iterdir()} == before


def test_commit_in_the_clone_is_protected_then_exported(workspace: Layout, remote: Path) -> None:
    make_patches(workspace, remote, {"Keep the count on the device": "return x.clamp(min=1)"})
    patchqueue.clone(made.case_of(workspace), remote=str(remote))
    write(workspace.clone / "tests/test_loss.py", "def test_loss():\n    assert True\n")
    git(workspace.clone, "commit", "--quiet", "--all", "--message", "Test the loss")

    with pytest.raises(WorkspaceError, match="export_patches"):
        patchqueue.clone(made.case_of(workspace), remote=str(remote))
    report = patchqueue.export_patches(made.case_of(workspace))

    assert report["added"] == ["0002-Test-the-loss.patch"]
    assert not report["changed"] + report["removed"]
    assert series(workspace)[-1].name == "0002-Test-the-loss.patch"
    assert patchqueue.clone(made.case_of(workspace), remote=str(remote)) is None


def test_uncommitted_edits_stop_clone_and_export(workspace: Layout, remote: Path) -> None:
    make_patches(workspace, remote, {"Keep the count on the device": "return x.clamp(min=1)"})
    patchqueue.clone(made.case_of(workspace), remote=str(remote))
    edited = workspace.clone / DEEPSPEED_PY
    edited.write_text("# work in progress\n")

    with pytest.raises(WorkspaceError, match="uncommitted changes"):
        patchqueue.clone(made.case_of(workspace), remote=str(remote))
    with pytest.raises(WorkspaceError, match="uncommitted changes"):
        patchqueue.export_patches(made.case_of(workspace))
    assert edited.read_text() == "# work in progress\n"


def test_changed_series_is_reapplied(workspace: Layout, remote: Path) -> None:
    first = make_patches(workspace, remote, {"Keep the count on the device": "return x.clamp(1)"})
    patchqueue.clone(made.case_of(workspace), remote=str(remote))
    first[0].write_text(first[0].read_text().replace("x.clamp(1)", "x.clamp(min=1)"))

    assert "patches/ changed" in patchqueue.clone(made.case_of(workspace), remote=str(remote))
    assert "x.clamp(min=1)" in (workspace.clone / DEEPSPEED_PY).read_text()


@pytest.mark.network  # the tree's environment is chosen by its release's PKG-INFO
def test_trees_are_worktrees_of_the_tag_and_the_series(workspace: Layout, remote: Path) -> None:
    make_patches(workspace, remote, {"Keep the count on the device": "return x.clamp(min=1)"})
    test_patch = workspace.patches / "0002-Test-the-loss.patch"
    patchqueue.clone(made.case_of(workspace), remote=str(remote))
    write(workspace.clone / "tests/test_loss.py", "def test_loss():\n    assert False\n")
    git(workspace.clone, "commit", "--quiet", "--all", "--message", "Test the loss")
    patchqueue.export_patches(made.case_of(workspace))

    pinned = trees.prepare_tree(made.case_of(workspace), "pinned")
    patched = trees.prepare_tree(made.case_of(workspace), "patched")
    tests_only = trees.prepare_tree(made.case_of(workspace), "pinned+tests")

    assert patchqueue.touches_only_tests(test_patch)
    assert "max(x, 1)" in (pinned.src / "transformers/integrations/deepspeed.py").read_text()
    assert "clamp" in (patched.src / "transformers/integrations/deepspeed.py").read_text()
    assert "max(x, 1)" in (tests_only.src / "transformers/integrations/deepspeed.py").read_text()
    assert "assert False" in (tests_only.root / "tests/test_loss.py").read_text()
    assert patched.commit == git(workspace.clone, "rev-parse", "HEAD")
    assert trees.prepare_tree(made.case_of(workspace), "pinned+tests").commit == tests_only.commit


# --- the PyPI sdist path --------------------------------------------------------------------


@pytest.fixture
def sdist_cache(workspace: Layout) -> Path:
    """The real sdist, downloaded once into the workspace's own cache and shared by test runs."""
    fetch_sdist(workspace, PIN.sdist)
    return (workspace.cache / "sdists").resolve()


@pytest.mark.network
def test_sdist_path_when_the_remote_is_unreachable(workspace: Layout, sdist_cache: Path) -> None:
    said = patchqueue.clone(made.case_of(workspace), remote=str(workspace.root / "nowhere.git"))

    repo = workspace.clone
    assert said.startswith(f"PyPI sdist {PIN.sdist.filename}")
    assert PIN.sdist.sha256 in git(repo, "log", "-1", "--format=%B", TAG)
    assert "if good_tokens_per_rank[rank] > 0" in (repo / DEEPSPEED_PY).read_text()
    # Fixed identity and date: the same sdist gives the same base commit anywhere.
    other = Layout(workspace.root.parent / "other", workspace.case)
    other.work.mkdir(parents=True)
    (other.work / "cache").symlink_to(workspace.cache)
    nowhere = str(workspace.root / "nowhere")
    releases.materialise(other, CASE.project, PIN, other.clone, nowhere)
    assert git(other.clone, "rev-parse", TAG) == git(repo, "rev-parse", TAG)


@pytest.fixture
def untagged_mirror(tmp_path: Path) -> Path:
    """A bare repository of the project without the pinned tag: its tests/ at its newest commit."""
    source = tmp_path / "mirror-src"
    write(source / "tests/test_loss.py", "def test_loss():\n    pass\n")
    git(source.parent, "init", "--quiet", "--initial-branch=main", str(source))
    git(source, "add", "--all")
    git(source, "commit", "--quiet", "--message", "later work")
    bare = tmp_path / "mirror.git"
    git(tmp_path, "clone", "--quiet", "--bare", str(source), str(bare))
    return bare


def series_editing_upstream_tests(layout: Layout, mirror: Path) -> Path:
    """Export a series of one test patch that edits the mirror's tests/test_loss.py."""
    scratch = layout.root.parent / "scratch"
    git(layout.root.parent, "clone", "--quiet", str(mirror), str(scratch))
    git(scratch, "checkout", "--quiet", "-b", patchqueue.PATCHED)
    write(scratch / "tests/test_loss.py", "def test_loss():\n    assert True\n")
    git(scratch, "commit", "--quiet", "--all", "--message", "Test the loss")
    git(scratch, "tag", TAG, "HEAD~1")
    shutil.move(scratch, layout.clone)
    patchqueue.export_patches(made.case_of(layout))
    shutil.rmtree(layout.clone)
    (patch,) = series(layout)
    return patch


@pytest.mark.network
def test_a_clone_from_the_sdist_gets_upstream_tests_from_remote_for_the_series_to_edit(
    workspace: Layout, sdist_cache: Path, untagged_mirror: Path, tmp_path: Path
) -> None:
    patch = series_editing_upstream_tests(workspace, untagged_mirror)
    before = patch.read_bytes()

    said = patchqueue.clone(made.case_of(workspace), remote=str(untagged_mirror))

    repo = workspace.clone
    assert said.startswith(f"PyPI sdist {PIN.sdist.filename}")
    assert "upstream's tests/ from a local clone: applied 1 patch(es)" in said
    assert git(repo, "log", "--format=%s", f"{TAG}..HEAD").splitlines()[0] == "Test the loss"
    assert (repo / "tests/test_loss.py").read_text().endswith("assert True\n")
    assert gitmodule.read_state(repo).upstream_tests == git(untagged_mirror, "rev-parse", "HEAD")
    report = patchqueue.export_patches(made.case_of(workspace))
    assert report["unchanged"] == [patch.name] and patch.read_bytes() == before
    outbox.remake_patches(made.case_of(workspace), (ADA_NAME, ADA_EMAIL), tmp_path / "out")
    (sent,) = (tmp_path / "out").iterdir()
    assert sent.read_text().count("+    assert True") == 1, "sent as an edit of upstream's test"


@pytest.mark.network
def test_without_upstream_tests_their_patch_is_left_out_and_the_export_refused(
    workspace: Layout, sdist_cache: Path, untagged_mirror: Path
) -> None:
    patch = series_editing_upstream_tests(workspace, untagged_mirror)

    said = patchqueue.clone(made.case_of(workspace), remote=str(workspace.root / "nowhere.git"))

    assert said.endswith(
        f"applied 0 patch(es) from patches/{workspace.case}/series on patched, leaving out"
        f" {patch.name}: the clone lacks upstream's tests they edit (`nox -s clone -- --remote"
        " PATH` makes one with them)"
    )
    with pytest.raises(WorkspaceError, match=f"lacks upstream's tests that {patch.name} edit"):
        patchqueue.export_patches(made.case_of(workspace))
    assert series(workspace) == [patch]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[: len(b) // 2], "bytes where the card says"),
        (lambda b: b[:-1] + b"\0", "sha256 .* where the card says"),
    ],
    ids=["truncated", "tampered"],
)
@pytest.mark.network
def test_a_damaged_sdist_put_in_the_cache_is_refused_and_kept(
    workspace: Layout, sdist_cache: Path, damage, message: str
) -> None:
    (workspace.work / "cache").unlink()
    own_cache = workspace.cache / "sdists"
    own_cache.mkdir(parents=True)
    archive = own_cache / PIN.sdist.filename
    archive.write_bytes(damage((sdist_cache / archive.name).read_bytes()))

    with pytest.raises(WorkspaceError, match=f"{archive.name} was not downloaded here .*{message}"):
        patchqueue.clone(made.case_of(workspace), remote=str(workspace.root / "nowhere.git"))
    assert not workspace.clone.exists()
    assert archive.exists(), "a file the workspace did not download is never deleted"


# --- the patch queue loses nothing ----------------------------------------------------------------


def test_a_patch_added_to_the_series_by_hand_stops_the_export(
    workspace: Layout, remote: Path
) -> None:
    (first,) = make_patches(workspace, remote, {"Keep the count on device": "return x.clamp(1)"})
    patchqueue.clone(made.case_of(workspace), remote=str(remote))
    added = workspace.patches / "0002-new.patch"
    added.write_text(first.read_text().replace("x.clamp(1)", "x.clamp(2)"))
    add_to_series(workspace, added)
    before = {p.name: p.read_bytes() for p in workspace.patches.iterdir()}

    with pytest.raises(WorkspaceError, match=r"0002-new\.patch.*nox -s clone .*--force"):
        patchqueue.export_patches(made.case_of(workspace))

    assert {p.name: p.read_bytes() for p in workspace.patches.iterdir()} == before
    report = patchqueue.export_patches(made.case_of(workspace), force=True)  # said, and done
    assert report["removed"] == ["0002-new.patch"]


def test_a_hand_edit_of_a_patch_not_in_the_clone_stops_the_export(
    workspace: Layout, remote: Path
) -> None:
    (first,) = make_patches(workspace, remote, {"Keep the count on device": "return x.clamp(1)"})
    patchqueue.clone(made.case_of(workspace), remote=str(remote))
    edited = first.read_text().replace("x.clamp(1)", "x.clamp(min=1)")
    first.write_text(edited)

    with pytest.raises(WorkspaceError, match=f"has changed since the clone .*{first.name}"):
        patchqueue.export_patches(made.case_of(workspace))

    assert first.read_text() == edited


def test_after_a_conflict_the_export_does_not_empty_the_series(
    workspace: Layout, remote: Path
) -> None:
    bad, before = conflicting_series(workspace, remote)
    with pytest.raises(patchqueue.PatchDoesNotApply, match="apply the series there by hand"):
        patchqueue.clone(made.case_of(workspace), remote=str(remote))

    with pytest.raises(WorkspaceError, match=f"does not hold the series \\({bad.name} did not"):
        patchqueue.export_patches(made.case_of(workspace))  # what the old error advised

    assert {p.name: p.read_bytes() for p in workspace.patches.iterdir()} == before


def test_a_series_naming_a_missing_patch_is_refused_in_one_line(workspace: Layout) -> None:
    (workspace.patches / "series").write_text("0001-gone.patch\n")

    with pytest.raises(WorkspaceError, match=r"series names 0001-gone\.patch, which is not there"):
        series(workspace)


def test_an_interrupted_apply_is_undone_by_the_next_clone(workspace: Layout, remote: Path) -> None:
    (first,) = make_patches(workspace, remote, {"Keep the count on device": "return x.clamp(1)"})
    patchqueue.clone(made.case_of(workspace), remote=str(remote))
    # What Ctrl-C inside `git am` leaves: the apply begun, the clone back at the tag mid-way.
    repo = workspace.clone
    git(repo, "reset", "--quiet", "--hard", TAG)
    conflicting = first.read_text().replace("max(x, 1)", "max(x, 2)")
    (workspace.root / "half.patch").write_text(conflicting)
    gitmodule.git(repo, "am", "-3", str(workspace.root / "half.patch"), check=False)
    gitmodule.write_state(repo, applying=True)

    said = patchqueue.clone(made.case_of(workspace), remote=str(remote))

    assert said.startswith("an interrupted apply was undone")
    assert "x.clamp(1)" in (repo / DEEPSPEED_PY).read_text()
    assert not (repo / git(repo, "rev-parse", "--git-path", "rebase-apply")).exists()


# --- the outbox: the series as the contributor's commits ---------------------------------------


ADA_NAME, ADA_EMAIL = "Ada Lovelace", "ada@analytical-engine.org"
PR_TEMPLATE = "Reads per step: {{repro:runs[tree=pinned].host_syncs}}.\n"
COMMENT_TEMPLATE = (
    "<!-- Comment on huggingface/transformers#{{case:upstream.pull_request}}. -->\n"
    "Reads per step: {{repro:runs[tree=pinned].host_syncs}}.\n"
)
ADA = f"\tname = {ADA_NAME}\n\temail = {ADA_EMAIL}\n"
# A comment on an open PR whose change the series carries says which change its figures are of.
PR_CHANGE_COMMENT = (
    "<!-- Comment on huggingface/transformers#{{case:upstream.pull_request}}. -->\n"
    "Reads per step with its change as its {{case:upstream.pr_change.follows}} gives it:"
    " {{repro:runs[tree=pinned].host_syncs}}.\n"
)
PATCH = "0001-Keep-the-count-on-device.patch"
# transformers takes a PR only once a maintainer approved the work in its issue's thread.
APPROVED = 'approved = "https://github.com/huggingface/transformers/issues/1#issuecomment-2"'
ISSUE_TEMPLATE = (
    "### System Info\n\n(yours)\n\n### Reproduction\n\n"
    "Reads per step: {{repro:runs[tree=pinned].host_syncs}}.\n"
)


def pr_change(follows: str, patch: str = PATCH) -> str:
    """The card's `[upstream.pr_change]`, inline so that the `[upstream]` keys after it stay."""
    return f'pr_change = {{ patch = "{patch}", follows = "{follows}" }}'


def set_upstream(workspace: Layout, state: str, *extra: str) -> None:
    """The workspace's card with another upstream state (and `[upstream]` keys)."""
    card = workspace.root / "cases" / "sp-loss.toml"
    text = card.read_text().replace('state = "fixed"', "\n".join((f'state = "{state}"', *extra)))
    card.write_text(text)


def outbox_ready(
    workspace: Layout,
    remote: Path,
    tmp_path: Path,
    identity: str,
    monkeypatch: pytest.MonkeyPatch,
    templates: dict[str, str] | None = None,
    state: str = "none",
    upstream: tuple[str, ...] = (),
) -> None:
    """A clone with its series, results the drafts cite, templates (a PR's unless given), the
    card's upstream state, and git's config."""
    make_patches(workspace, remote, {"Keep the count on device": "return x.clamp(1)"})
    patchqueue.clone(made.case_of(workspace), remote=str(remote))
    set_upstream(workspace, state, *upstream)
    for old in (workspace.root / "cases" / "sp-loss").glob("*.md"):
        old.unlink()
    for name, text in (templates or {"pr.md": PR_TEMPLATE}).items():
        (workspace.root / "cases" / "sp-loss" / name).write_text(text)
    for result in (
        made.repro(
            workspace,
            (made.row("pinned", 2, 3),),
            verdicts=(made.verdict((7.75, 4.0), (614.0, 622.0)),),
        ),
        made.test_patch(workspace, made.check("patched", Verdict.OK)),
        made.profile(workspace, made.capture("pinned", 3)),
    ):
        results.write(workspace.profiles, result, workspace.unsaved)
    config = tmp_path / "gitconfig"
    config.write_text(f"[user]\n{identity}")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))


def test_the_outbox_sends_the_series_as_the_contributors_commits(
    workspace: Layout, remote: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outbox_ready(workspace, remote, tmp_path, ADA, monkeypatch, upstream=(APPROVED,))

    target = outbox.outbox(made.case_of(workspace))

    (patch,) = (target / "patches").glob("*.patch")
    text = patch.read_text()
    assert "From: Ada Lovelace <ada@analytical-engine.org>" in text
    assert "Signed-off-by" not in text, "transformers asks for no DCO"
    assert (target / "pr.md").read_text() == "Reads per step: 3.\n"
    checklist = (target / "checklist.md").read_text()
    assert checklist.startswith("# Before sending pr.md, the patches\n")
    assert "Rewrite each draft in your own words" in checklist
    assert checklist.startswith(
        "# Before sending pr.md, the patches\n\n- [ ] If you have not contributed to transformers"
    )
    assert "Disclose any assistance the way transformers asks: say that AI assistance" in checklist
    assert "make check-repo" in checklist, "a PR gets the project's PR steps"
    assert f"authored as `{ADA_NAME} <{ADA_EMAIL}>`, the git identity" in checklist
    with pytest.raises(WorkspaceError, match="outbox exists: move it aside"):
        outbox.outbox(made.case_of(workspace))


def test_a_pr_held_until_a_maintainer_approves_leaves_the_issue_to_go_alone(
    workspace: Layout, remote: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    templates = {"issue.md": ISSUE_TEMPLATE, "pr.md": PR_TEMPLATE}
    outbox_ready(workspace, remote, tmp_path, ADA, monkeypatch, templates)

    target = outbox.outbox(made.case_of(workspace))

    assert sorted(path.name for path in target.iterdir()) == ["checklist.md", "issue.md"]
    checklist = (target / "checklist.md").read_text()
    assert checklist.startswith("# Before sending issue.md\n")
    assert "Open the issue, then wait before any PR, as transformers asks: its agentic" in checklist
    assert "as `approved` under [upstream] in cases/sp-loss.toml" in checklist
    assert "Give your own system info where the issue asks for it: the output of" in checklist
    assert "make check-repo" not in checklist, "no PR steps for a PR that is not sent"


def test_a_held_pr_without_an_issue_to_open_is_refused_in_one_line(
    workspace: Layout, remote: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outbox_ready(workspace, remote, tmp_path, ADA, monkeypatch)

    for _ in range(2):  # nothing is left half-made that a second run would refuse
        with pytest.raises(WorkspaceError, match=r"cases/sp-loss/ drafts none: add an issue\.md"):
            outbox.outbox(made.case_of(workspace))
    assert [path.name for path in workspace.issue_drafts.iterdir() if path.is_dir()] == []


def test_a_dco_project_gets_the_contributors_sign_off(
    workspace: Layout, remote: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outbox_ready(workspace, remote, tmp_path, ADA, monkeypatch)
    case = cases.load(workspace.root, workspace.case)
    dco = dataclasses.replace(case, project=dataclasses.replace(case.project, sign_off=True))

    outbox.remake_patches(dco, (ADA_NAME, ADA_EMAIL), tmp_path / "out")

    (patch,) = (tmp_path / "out").glob("*.patch")
    assert "Signed-off-by: Ada Lovelace <ada@analytical-engine.org>" in patch.read_text()


@pytest.mark.parametrize(
    ("follows", "taken"),
    [
        ("diff", "the figures are of its diff as it was carried"),
        (
            "description",
            "the figures are of the change as its description gives it (no diff on record)",
        ),
    ],
)
def test_a_comment_is_sent_without_its_note_and_gets_a_comment_checklist(
    workspace: Layout,
    remote: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    follows: str,
    taken: str,
) -> None:
    """The note a template opens with is for the contributor: it moves to the checklist, whose
    first step compares the patch measured with the PR's diff as it stands."""
    outbox_ready(
        workspace,
        remote,
        tmp_path,
        ADA,
        monkeypatch,
        {"comment.md": PR_CHANGE_COMMENT},
        state="open-pr",
        upstream=(pr_change(follows),),
    )

    target = outbox.outbox(made.case_of(workspace))

    said = f"Reads per step with its change as its {follows} gives it: 3.\n"
    assert (target / "comment.md").read_text() == said
    checklist = (target / "checklist.md").read_text()
    assert checklist.startswith(
        "# Before posting comment.md\n\ncomment.md: Comment on huggingface/transformers#47073.\n"
        "\n- [ ] If you have not contributed to transformers before, do not send this"
    )
    assert (
        f"\n- [ ] Compare patches/sp-loss/{PATCH} (the change measured) with #47073's current diff"
        f" before posting: {taken}, and hold only if the two match"
    ) in checklist
    assert "Rewrite each draft in your own words" in checklist
    assert "make check-repo" not in checklist, "a comment gets no PR steps"
    assert "system info" not in checklist, "nothing sent asks for it"
    assert sorted(path.name for path in target.iterdir()) == ["checklist.md", "comment.md"]


def test_a_comment_naming_a_patch_the_series_lacks_is_refused(
    workspace: Layout, remote: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outbox_ready(
        workspace,
        remote,
        tmp_path,
        ADA,
        monkeypatch,
        {"comment.md": PR_CHANGE_COMMENT},
        state="open-pr",
        upstream=(pr_change("diff", patch="0009-Not-in-the-series.patch"),),
    )

    with pytest.raises(WorkspaceError, match=r"names 0009-Not-in-the-series\.patch, which is not"):
        outbox.outbox(made.case_of(workspace))


def test_a_comment_that_does_not_say_which_change_it_measured_is_refused(
    workspace: Layout, remote: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Figures of a change taken from a PR's description are not figures of its diff: the
    comment says which it measured, from the card."""
    outbox_ready(
        workspace,
        remote,
        tmp_path,
        ADA,
        monkeypatch,
        {"comment.md": COMMENT_TEMPLATE},
        state="open-pr",
        upstream=(pr_change("description"),),
    )

    with pytest.raises(WorkspaceError, match="does not say which change of #47073 its figures"):
        outbox.outbox(made.case_of(workspace))
    assert not (workspace.issue_drafts / "outbox").exists()


@pytest.mark.parametrize(
    ("state", "upstream", "why"),
    [
        ("fixed", (), "Why: upstream has fixed it (PR #47073, released in transformers 5.14.0)."),
        (
            "open-pr",
            (),
            "Why: open PR #47073 takes it on, and the series does not carry that PR's own",
        ),
        (
            "none",
            ("gains_after_pr = 44123",),
            "Why: with the defaults of transformers, the read the series removes comes right after"
            " the one open PR #44123 removes",
        ),
    ],
)
def test_nothing_to_send_is_an_answer_saying_why_and_what_was_checked(
    workspace: Layout,
    remote: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    state: str,
    upstream: tuple[str, ...],
    why: str,
) -> None:
    outbox_ready(
        workspace,
        remote,
        tmp_path,
        ADA,
        monkeypatch,
        {"comment.md": COMMENT_TEMPLATE},
        state=state,
        upstream=upstream,
    )

    target = outbox.outbox(made.case_of(workspace))

    assert [path.name for path in target.iterdir()] == ["nothing-to-send.md"]
    said = (target / "nothing-to-send.md").read_text()
    assert why in said
    assert f"- upstream's record, as of {CASE.upstream.seen}" in said
    assert "- the results the drafts cite, fresh: repro-" in said
    assert "- the drafts, written for reading and not sent: comment.md" in said
    assert (
        "- all_tokens (every rank; 2 ranks), pinned → patched: saves idle time; per step, all"
        " ranks together: stalls (reads and copies that found device work queued) 7.75 → 4,"
        " device operators 614 → 622"
    ) in said


@pytest.mark.parametrize(
    ("identity", "refusal"),
    [
        ("", "no contributor identity in git's config: set yours with `git config --global"),
        ("\tname = hostsync contributor\n\temail = contributor@example.com\n", "stands for nobody"),
        (
            "\tname = Seed maintainers\n\temail = maintainers@users.noreply.seed.example\n",
            "stands for nobody",
        ),
    ],
)
@pytest.mark.parametrize("state", ["none", "fixed"])
def test_an_outbox_without_a_real_identity_is_refused_whatever_it_would_hold(
    workspace: Layout,
    remote: Path,
    tmp_path: Path,
    identity: str,
    refusal: str,
    state: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One rule for every case: a comment, or nothing to send, needs the contributor too."""
    outbox_ready(
        workspace, remote, tmp_path, identity, monkeypatch, {"comment.md": PR_TEMPLATE}, state=state
    )

    with pytest.raises(WorkspaceError, match=refusal):
        outbox.outbox(made.case_of(workspace))
    assert not workspace.issue_drafts.exists(), "refused before anything is drafted"
