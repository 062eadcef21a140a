"""The watch on releases built in the test and served on loopback: the newest release of each
project against pin.toml, and a case's site and series there, through the real command."""

from __future__ import annotations

import json
import re
import shutil
import textwrap
from pathlib import Path

import pytest
from local_index import make_sdist, serving

from hostsync.upstream import releases, sdists
from hostsync.upstream.git import git
from hostsync.workspace import cases
from hostsync.workspace.layout import Layout

from conftest import hostsync, make_workspace, one_line_error, own_downloads

CASE = "trainer-nan-filter"
TRAINER = """
    import torch


    class Trainer:
        def _run_epoch(self, args, tr_loss, tr_loss_step):
            if args.logging_nan_inf_filter and (
                torch.isnan(tr_loss_step) or torch.isinf(tr_loss_step)
            ):
                return tr_loss + tr_loss / (1 + self.state.global_step)
            return tr_loss + tr_loss_step
"""
# 5.25.0 moves the read down three lines; or drops it.
MOVED = TRAINER.replace("    class Trainer:", "    # The Trainer.\n\n\n    class Trainer:")
FIXED = TRAINER.replace("torch.isnan(tr_loss_step) or torch.isinf(tr_loss_step)", "False")


def transformers_files(version: str, trainer: str) -> dict[str, str]:
    return {
        "src/transformers/__init__.py": f'__version__ = "{version}"\n',
        "src/transformers/trainer.py": textwrap.dedent(trainer),
    }


@pytest.fixture
def watched(tmp_path: Path):
    """A workspace holding the trainer-nan-filter case only, with downloads of its own, and an
    index of transformers 5.24.0 and 5.25.0 (the card and pin.toml at 5.24.0) and every other
    project as pinned; yields the workspace and a function that serves the index with 5.25.0's
    trainer.py given."""
    layout = own_downloads(make_workspace(tmp_path / "workspace")).for_case(CASE)
    for other in cases.names(layout.root):
        if other != CASE:
            (layout.root / "cases" / f"{other}.toml").unlink()
    pinned_at(layout.root / "cases" / f"{CASE}.toml", "5.24.0")
    pin = layout.root / "pin.toml"
    pin.write_text(
        re.sub(r'(?m)^(transformers = \{ install = )"[^"]*"', r'\1"5.24.0"', pin.read_text())
    )
    files = tmp_path / "index" / "files"
    make_sdist(
        files / "transformers", "transformers", "5.24.0", transformers_files("5.24.0", TRAINER)
    )
    make_sdist(files / "accelerate", "accelerate", "1.16.0", {"src/accelerate/__init__.py": ""})
    make_sdist(files / "deepspeed", "deepspeed", "0.19.8", {"version.txt": "0.19.8\n"})
    make_sdist(files / "trl", "trl", "1.16.0", {"trl/__init__.py": ""})
    make_sdist(files / "peft", "peft", "0.21.2", {"src/peft/__init__.py": ""})

    def serve(trainer: str):
        make_sdist(
            files / "transformers", "transformers", "5.25.0", transformers_files("5.25.0", trainer)
        )
        return serving(tmp_path / "index")

    return layout, serve


def pinned_at(card: Path, version: str) -> None:
    """The card pinned to `version`, whatever release the case pins today: the index here
    serves the releases the test names."""
    text = re.sub(
        r'^version = ".*"$', f'version = "{version}"', card.read_text(), count=1, flags=re.M
    )
    card.write_text(re.sub(r'^tag = ".*"$', f'tag = "v{version}"', text, count=1, flags=re.M))


def release_repository(layout: Layout, url: str) -> Path:
    """transformers 5.25.0 as a git repository from its sdist, as `materialise` makes it when
    the project's remote does not answer (a test asks no remote off this machine)."""
    case = cases.load(layout.root, CASE)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(sdists.INDEX_ENV, url)
        release = releases.release_for(case, "5.25.0")
    repo = layout.releases / "transformers-5.25.0"
    releases.materialise(layout, case.project, release, repo, remote=str(layout.root / "none"))
    return repo


def test_the_digest_names_the_newest_releases_and_where_a_cases_read_still_is(watched) -> None:
    layout, serve = watched
    with serve(MOVED) as url:
        release_repository(layout, url)
        done = hostsync(layout, "watch", env_extra={sdists.INDEX_ENV: url})

    assert done.returncode == 0, done.stderr
    (path,) = layout.watch.glob("watch-*.json")
    result = json.loads(path.read_text())
    assert result["kind"] == "watch"
    (case,) = result["cases"]
    assert (case["case"], case["pinned"], case["newest"]) == (CASE, "5.24.0", "5.25.0")
    digest = (layout.watch / "watch.md").read_text()
    assert "- transformers 5.25.0 (" in digest
    assert "pin.toml installs 5.24.0; 1 newer: 5.25.0." in digest
    assert "- accelerate 1.16.0 (" in digest and "): as pinned." in digest
    assert (
        f"- **{CASE}** (transformers 5.25.0, pinned 5.24.0;"
        f" behind: `nox -s repin -- --case {CASE}`):"
    ) in digest
    assert (
        "transformers 5.25.0: `torch.isnan(tr_loss_step)` in _run_epoch() (transformers/trainer.py)"
        " still present at src/transformers/trainer.py:11 (Trainer._run_epoch)."
    ) in digest
    # The case's own series was made against the real 5.24.0, not this one.
    assert "series on 5.25.0: does not apply:" in digest
    assert "(conflict in src/transformers/trainer.py)" in digest
    assert digest in done.stdout


def test_a_release_that_drops_the_read_says_gone_and_a_series_that_applies_says_so(
    watched, tmp_path: Path
) -> None:
    layout, serve = watched
    with serve(FIXED) as url:
        repo = release_repository(layout, url)
        scratch = tmp_path / "scratch"
        git(repo, "worktree", "add", "--quiet", "--detach", str(scratch), "v5.25.0")
        trainer = scratch / "src" / "transformers" / "trainer.py"
        trainer.write_text(trainer.read_text().replace("False", "torch.tensor(False)"))
        git(scratch, "commit", "--quiet", "--all", "-m", "A change the series makes")
        shutil.rmtree(layout.patches)
        layout.patches.mkdir()
        git(scratch, "format-patch", "--quiet", "-1", "-o", str(layout.patches))
        (layout.patches / "series").write_text(
            "\n".join(p.name for p in layout.patches.glob("*.patch")) + "\n"
        )
        git(repo, "worktree", "remove", "--force", str(scratch))
        done = hostsync(layout, "watch", env_extra={sdists.INDEX_ENV: url})

    assert done.returncode == 0, done.stderr
    digest = (layout.watch / "watch.md").read_text()
    assert "`torch.isnan(tr_loss_step)` in _run_epoch() (transformers/trainer.py) gone." in digest
    assert "series on 5.25.0: applies." in digest


def test_setups_without_the_hunt_are_refused(workspace: Layout) -> None:
    line = one_line_error(hostsync(workspace, "watch", "--setups", "fp32-zero1"))

    assert "--setups chooses what --hunt runs: add --hunt" in line
