"""Since when: releases built in the test and served on loopback, a git history with a planted
regression, and the real command on them."""

from __future__ import annotations

import argparse
import itertools
import json
import textwrap
import traceback
from pathlib import Path

import pytest
from local_index import make_sdist, serving

from hostsync.detector.sites import AllowRule
from hostsync.history import bisect
from hostsync.history.bisect import Reader, Target, bisect_run, pull_request
from hostsync.measure import probe
from hostsync.upstream import envs, presence, sdists
from hostsync.upstream.git import git
from hostsync.upstream.records import Presence
from hostsync.workspace import cases
from hostsync.workspace.files import sha256
from hostsync.workspace.layout import Layout
from hostsync.workspace.projects import get

from conftest import hostsync, make_workspace, one_line_error, own_downloads

STAGE = "deepspeed/runtime/zero/stage_1_and_2.py"
READ = "is_invalid_grad_norm(clip_norm)"

UTILS = """
    def is_invalid_grad_norm(norm):
        return norm.isinf() or norm.isnan()
"""
# unscale_and_clip_grads before the guard (the clamp of DeepSpeed #5632), with it, and fixed.
CLAMPED = """
    import torch

    from deepspeed.runtime.utils import is_invalid_grad_norm


    class DeepSpeedZeroOptimizer:
        def unscale_and_clip_grads(self, total_norm):
            clip = (total_norm / self.loss_scale + 1e-6) / self.clip_grad
            return torch.clamp(clip, min=1.0) * self.loss_scale
"""
GUARDED = CLAMPED.replace(
    "            clip = (total_norm",
    """            clip_norm = total_norm / self.loss_scale
            if is_invalid_grad_norm(clip_norm):
                clip_norm = torch.full_like(clip_norm, float("inf"))
            clip = (total_norm""",
)
FIXED = CLAMPED.replace(
    "            clip = (total_norm",
    """            clip_norm = total_norm / self.loss_scale
            clip_norm = torch.where(clip_norm.isfinite(), clip_norm, float("inf"))
            clip = (total_norm""",
)
# A test that quotes the read in every release: the package alone is searched.
QUOTING_TEST = f"def test_clip():\n    assert '{READ}'\n"


def deepspeed_files(version: str, stage: str) -> dict[str, str]:
    return {
        "version.txt": f"{version}\n",
        "deepspeed/__init__.py": "",
        "deepspeed/runtime/utils.py": textwrap.dedent(UTILS),
        STAGE: textwrap.dedent(stage),
        "tests/unit/test_clip.py": QUOTING_TEST,
    }


def deepspeed_index(root: Path, stages: dict[str, str]) -> Path:
    """A package index folder holding a DeepSpeed sdist per version, with `stages[version]`."""
    for version, stage in stages.items():
        make_sdist(
            root / "files" / "deepspeed", "deepspeed", version, deepspeed_files(version, stage)
        )
    return root


# DeepSpeed's history as the test plants it: the guard comes in #42, between v0.2.0 and v0.3.0,
# and leaves again in #50, in v0.5.0.
HISTORY = (
    ("Initial import", CLAMPED, "0.1.0"),
    ("Tidy the optimizer (#10)", CLAMPED.replace("clip =", "clip  ="), "0.2.0"),
    ("Document clipping (#11)", CLAMPED.replace("clip  =", "clip ="), None),
    ("Guard the clip norm (#42)", GUARDED, None),
    ("Log the loss scale (#43)", GUARDED + "\n\n# the loss scale is logged\n", "0.3.0"),
    ("Merge pull request #44 from someone/loader", GUARDED, "0.4.0"),
    ("Choose the clip on the device (#50)", FIXED, "0.5.0"),
)


@pytest.fixture
def planted(tmp_path: Path) -> tuple[Path, Path]:
    """The git repository of HISTORY with its release tags, and an index of its releases."""
    repo = tmp_path / "deepspeed.git"
    repo.mkdir()
    git(repo, "init", "--quiet", "--initial-branch=master")
    index = tmp_path / "index"
    for number, (subject, stage, version) in enumerate(HISTORY):
        commit(repo, index, number, subject, deepspeed_files(version or "0.0.0", stage), version)
    return repo, index


def commit(
    repo: Path,
    index: Path,
    number: int,
    subject: str,
    files: dict[str, str],
    version: str | None,
    requires: tuple[str, ...] = (),
) -> None:
    """Commit number `number` of a planted history, a day after the one before; a release is
    tagged and published to the index as an sdist declaring `requires`."""
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    date = f"@{1_700_000_000 + 86400 * number} +0000"
    git(repo, "add", "--all")
    git(
        repo,
        "commit",
        "--quiet",
        "--allow-empty",
        "-m",
        subject,
        env={"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date},
    )
    if version:
        git(repo, "tag", f"v{version}")
        make_sdist(index / "files" / "deepspeed", "deepspeed", version, files, requires=requires)


def history_of(result_path: Path, function: str | None = None) -> dict:
    """The one site searched, or the one in `function`."""
    (site,) = [
        site
        for site in json.loads(result_path.read_text())["sites"]
        if function in (None, site["site"].get("function"))
    ]
    return site


# --- the search ----------------------------------------------------------------------------------


def run_between(first: int, last: int, read: list[int]):
    def carried(index: int) -> bool:
        read.append(index)
        return first <= index <= last

    return carried


def test_bisecting_finds_both_ends_of_every_run_in_few_reads() -> None:
    for count in range(1, 13):
        for first, last in itertools.combinations_with_replacement(range(count), 2):
            for anchor in range(first, last + 1):
                read: list[int] = []

                assert bisect_run(count, anchor, run_between(first, last, read)) == (first, last)
                assert len(read) <= 2 * count.bit_length()


@pytest.mark.parametrize(
    ("subject", "number"),
    [
        ("Guard the clip norm (#42)", 42),
        ("Merge pull request #7816 from deepspeedai/fix", 7816),
        ("Fix #12 in the docs", None),
        ("Guard the clip norm", None),
    ],
)
def test_the_pull_request_is_read_from_the_subject(subject: str, number: int | None) -> None:
    assert pull_request(subject) == number


def test_the_package_alone_is_searched_and_code_that_moved_is_found(tmp_path: Path) -> None:
    deepspeed = get("deepspeed")
    moved = deepspeed_files("0.6.0", CLAMPED) | {
        "deepspeed/runtime/zero/clip.py": textwrap.dedent(GUARDED)
    }
    deepspeed_index(tmp_path / "index", {"0.1.0": CLAMPED})
    make_sdist(tmp_path / "index" / "files" / "deepspeed", "deepspeed", "0.6.0", moved)
    layout = Layout(tmp_path / "workspace")
    site = AllowRule(STAGE, "asked", code=READ)
    sources = {}
    for version in ("0.1.0", "0.6.0"):
        archive = tmp_path / "index" / "files" / "deepspeed" / f"deepspeed-{version}.tar.gz"
        sdist = cases.Sdist(archive.as_uri(), archive.stat().st_size, sha256(archive))
        sources[version] = presence.sdist_sources(layout, sdist, deepspeed)

    assert all("tests/unit/test_clip.py" not in found for found in sources.values())
    assert presence.locate(site, sources["0.1.0"], deepspeed).presence == Presence.ABSENT
    found = presence.locate(site, sources["0.6.0"], deepspeed)
    assert found.presence == Presence.ELSEWHERE
    (where,) = found.found
    assert (where.file, where.function) == (
        "deepspeed/runtime/zero/clip.py",
        "DeepSpeedZeroOptimizer.unscale_and_clip_grads",
    )
    assert where.code == f"if {READ}:"
    # Named in its function, which is still in place without it: the site is gone from there.
    in_place = AllowRule(STAGE, "asked", function="unscale_and_clip_grads", code=READ)
    assert presence.locate(in_place, sources["0.6.0"], deepspeed).presence == Presence.ABSENT


# --- the command ---------------------------------------------------------------------------------


def test_a_cases_site_is_found_since_the_release_that_added_it(tmp_path: Path) -> None:
    """ds-clip-norm's own card: a read in a shared helper, counted where the clip calls it."""
    layout = own_downloads(make_workspace(tmp_path / "workspace")).for_case("ds-clip-norm")
    stages = {"0.19.5": CLAMPED, "0.19.6": CLAMPED, "0.19.7": CLAMPED, "0.19.8": GUARDED}
    with serving(deepspeed_index(tmp_path / "index", stages)) as url:
        done = hostsync(
            layout,
            "bisect",
            "--case",
            "ds-clip-norm",
            "--since",
            "0.19.6",
            env_extra={sdists.INDEX_ENV: url},
        )

    assert done.returncode == 0, done.stderr
    (path,) = layout.profiles.glob("bisect-*.json")
    site = history_of(path)
    assert (site["first"], site["last"], site["before_first"], site["after_last"]) == (
        "0.19.8",
        "0.19.8",
        "0.19.7",
        None,
    )
    assert site["searched"] == ["0.19.6", "0.19.7", "0.19.8"]
    assert site["contiguous"] is True
    evidence = {release["version"]: release for release in site["releases"]}
    assert evidence["0.19.7"]["presence"] == "absent"
    (where,) = evidence["0.19.8"]["found"]
    assert (where["file"], where["line"], where["code"]) == (STAGE, 10, f"if {READ}:")
    assert where["function"] == "DeepSpeedZeroOptimizer.unscale_and_clip_grads"
    assert (layout.cache / "sdists" / "deepspeed-0.19.8.tar.gz.verified").exists()
    report = (layout.profiles / "bisect.md").read_text()
    assert "There since deepspeed 0.19.8" in report and "0.19.7 does not have it" in report


def test_a_site_named_on_the_command_line_is_narrowed_to_the_commits_and_pull_requests(
    tmp_path: Path, planted: tuple[Path, Path]
) -> None:
    repo, index = planted
    layout = own_downloads(make_workspace(tmp_path / "workspace"))
    with serving(index) as url:
        done = hostsync(
            layout,
            "bisect",
            "--project",
            "deepspeed",
            "--file",
            STAGE,
            "--code",
            READ,
            "--anchor",
            "0.4.0",
            "--remote",
            str(repo),
            env_extra={sdists.INDEX_ENV: url},
        )

    assert done.returncode == 0, done.stderr
    (path,) = layout.sites.glob("bisect-*.json")
    site = history_of(path)
    assert (site["first"], site["last"], site["before_first"], site["after_last"]) == (
        "0.3.0",
        "0.4.0",
        "0.2.0",
        "0.5.0",
    )
    added, removed = site["narrowed"]
    assert (added["older"], added["newer"], added["change"], added["commits"]) == (
        "v0.2.0",
        "v0.3.0",
        "added",
        3,
    )
    assert added["first"]["subject"] == "Guard the clip norm (#42)"
    assert added["first"]["commit"] == git(repo, "rev-parse", "v0.3.0~1").stdout.strip()
    assert added["pull_request"] == 42
    assert (removed["older"], removed["newer"], removed["change"]) == (
        "v0.4.0",
        "v0.5.0",
        "removed",
    )
    assert (removed["first"]["subject"], removed["pull_request"]) == (
        "Choose the clip on the device (#50)",
        50,
    )
    report = (layout.sites / "bisect.md").read_text()
    assert "the site was added by" in report and "pull request #42" in report
    assert "the site was removed by" in report and "pull request #50" in report
    assert "(#42)" in done.stdout


def test_a_site_that_came_and_went_is_noticed(tmp_path: Path, monkeypatch) -> None:
    stages = {
        "0.1.0": CLAMPED,
        "0.2.0": GUARDED,
        "0.3.0": CLAMPED,
        "0.4.0": GUARDED,
        "0.5.0": GUARDED,
    }
    site = AllowRule(STAGE, "asked", code=READ)
    target = Target(site, get("deepspeed"), None)
    with serving(deepspeed_index(tmp_path / "index", stages)) as url:
        monkeypatch.setenv(sdists.INDEX_ENV, url)
        reader = Reader(Layout(tmp_path / "workspace"), [target], get("deepspeed"))
        found = bisect.history(reader, target)

    assert (found.first, found.last, found.contiguous) == ("0.2.0", "0.5.0", False)
    assert any(
        note.startswith("0.3.0 lacks the site though it lies inside") for note in found.notes
    )


def test_a_start_without_the_site_is_refused_in_one_line(tmp_path: Path) -> None:
    layout = own_downloads(make_workspace(tmp_path / "workspace"))
    with serving(deepspeed_index(tmp_path / "index", {"0.1.0": CLAMPED, "0.2.0": FIXED})) as url:
        done = hostsync(
            layout,
            "bisect",
            "--project",
            "deepspeed",
            "--file",
            STAGE,
            "--code",
            READ,
            env_extra={sdists.INDEX_ENV: url},
        )

    line = one_line_error(done)
    assert "deepspeed 0.2.0 does not carry" in line and "with --anchor" in line
    assert not layout.sites.exists()


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["--project", "deepspeed", "--file", STAGE], "--project needs --file and --code"),
        (["--code", READ], "name a site of --project: add it"),
        (["--case", "sp-loss", "--project", "deepspeed"], "give one of them"),
        (
            ["--project", "deepspeed", "--file", STAGE, "--code", READ, "--tests"],
            "--tests runs a case's tests: add --case NAME",
        ),
        (["--case", "sp-loss", "--since", "five"], "--since 'five' is no version"),
        (["--case", "sp-loss", "--tag-format", "release"], "has no {version}"),
        (["--case", "sp-loss", "--remote", "/"], "--remote / is no git repository"),
        (["--case", "sp-loss", "--remote", "/nowhere"], "--remote /nowhere is no git repository"),
    ],
)
def test_a_bisect_asked_wrongly_is_refused_before_any_download(
    workspace: Layout, argv: list[str], complaint: str
) -> None:
    line = one_line_error(hostsync(workspace, "bisect", *argv))

    assert complaint in line
    assert not (workspace.root / "profiles" / "sites").exists()


# --- labelled site histories: the read followed by what it does, not by its text ---------------

METRICS = "trl/trainer/sft_trainer.py"
# Each release of a planted TRL: how the trainer reads its token accuracy, under which names.
ACCURACY = """
    class SFTTrainer:
        def {function}(self, model, inputs):
            correct = {counts}(inputs["correct"]).sum()
            {valid} = {counts}(inputs["mask"]).sum()
            self._metrics["accuracy"].append(
                (correct / {valid}).item() if {valid} > 0 else 0.0
            )
            return model(inputs)
"""


UNMEASURED = "class SFTTrainer:\n    def compute_loss(self, model, inputs):\n        return 0\n"


def trl_release(
    function: str = "compute_loss",
    valid: str = "num_valid",
    file: str = METRICS,
    counts: str = "self.accelerator.gather_for_metrics",
) -> dict[str, str]:
    """A TRL package whose trainer reads its accuracy in `function` of `file`."""
    text = ACCURACY.format(function=function, valid=valid, counts=counts)
    return {"trl/__init__.py": "", file: textwrap.dedent(text)}


def history_over(
    tmp_path: Path, monkeypatch, project: str, releases: dict[str, dict], site: AllowRule
):
    """The site's history over `releases` (version: files), served as sdists on loopback."""
    for version, files in releases.items():
        make_sdist(tmp_path / "index" / "files" / project, project, version, files)
    target = Target(site, get(project), None)
    with serving(tmp_path / "index") as url:
        monkeypatch.setenv(sdists.INDEX_ENV, url)
        reader = Reader(Layout(tmp_path / "workspace"), [target], get(project))
        return bisect.history(reader, target)


def test_a_read_under_other_local_names_is_the_same_read(tmp_path: Path, monkeypatch) -> None:
    elsewhere = textwrap.dedent("""
        class DPOTrainer:
            def __init__(self, smoothing):
                if smoothing > 0:
                    self.smoothing = smoothing

            def compute_loss(self, model, inputs):
                return 0
    """)
    releases = {
        # Before the trainer has the function: a local compared with 0 in another trainer is
        # no copy of the read (only its literal text would be).
        "0.0.1": {
            "trl/__init__.py": "",
            "trl/trainer/dpo_trainer.py": elsewhere,
            METRICS: "class SFTTrainer:\n    pass\n",
        },
        "0.1.0": trl_release(valid="self.valid"),
        "0.2.0": trl_release(valid="total_sum"),
        "0.3.0": trl_release(valid="total_tokens"),
        "1.0.0": trl_release(),
    }
    site = AllowRule(METRICS, "asked", function="compute_loss", code="num_valid > 0")
    found = history_over(tmp_path, monkeypatch, "trl", releases, site)

    # An attribute compared with 0 is no local value read: 0.1.0 lacks the read.
    assert (found.first, found.before_first, found.contiguous) == ("0.2.0", "0.1.0", True)
    evidence = {release.version: release.finding for release in found.releases}
    assert evidence["0.0.1"].presence == Presence.MISSING
    (where,) = evidence["0.2.0"].found
    assert where.function == "SFTTrainer.compute_loss"
    assert where.code == "(correct / total_sum).item() if total_sum > 0 else 0.0"


# How a planted TRL logs its entropy: read into a local that a later line appends (as TRL 0.22.0
# to 1.15.0 do, in two forms), or read inside the append (1.16.0).
ENTROPY = """
    class SFTTrainer:
        def compute_loss(self, model, inputs, mode="train"):
            entropy = inputs["entropy"]
            {logged}
            return model(inputs)
"""


def test_a_read_appended_through_a_local_is_found_by_the_call_it_feeds(
    tmp_path: Path, monkeypatch
) -> None:
    appended = 'self._metrics[mode]["entropy"].append(entropy)'
    then = f"\n            {appended}"
    logged = {
        "0.1.0": "self._metrics[mode]['loss'].append(0.0)",
        "0.2.0": f"entropy = self.accelerator.gather_for_metrics(entropy).mean().item(){then}",
        "0.3.0": f"entropy = (entropy / total).item() if total > 0 else 0.0{then}",
        "1.0.0": 'self._metrics[mode]["entropy"].append((entropy / n).item() if n > 0 else 0.0)',
    }
    releases = {
        version: {"trl/__init__.py": "", METRICS: textwrap.dedent(ENTROPY.format(logged=text))}
        for version, text in logged.items()
    }
    site = AllowRule(
        METRICS, "asked", function="compute_loss", code='self._metrics[mode]["entropy"].append('
    )
    found = history_over(tmp_path, monkeypatch, "trl", releases, site)

    assert (found.first, found.before_first, found.contiguous) == ("0.2.0", "0.1.0", True)
    evidence = {release.version: release.finding for release in found.releases}
    assert evidence["0.1.0"].presence == Presence.ABSENT
    # The read's own line comes with the append, so that a probe judges the line that reads.
    assert [at.code for at in evidence["0.2.0"].found] == [
        "entropy = self.accelerator.gather_for_metrics(entropy).mean().item()",
        appended,
    ]
    (inline,) = evidence["1.0.0"].found
    assert inline.code.startswith('self._metrics[mode]["entropy"].append((entropy / n).item()')


def test_a_renamed_function_is_followed_by_its_body(tmp_path: Path, monkeypatch) -> None:
    releases = {
        "0.1.0": {"trl/__init__.py": "", METRICS: UNMEASURED},
        "0.2.0": trl_release(function="_loss_and_metrics"),
        "0.3.0": trl_release(function="_loss_and_metrics"),
        "1.0.0": trl_release(),
    }
    site = AllowRule(METRICS, "asked", function="compute_loss", code="num_valid > 0")
    found = history_over(tmp_path, monkeypatch, "trl", releases, site)

    assert (found.first, found.before_first) == ("0.2.0", "0.1.0")
    evidence = {release.version: release.finding for release in found.releases}
    assert evidence["0.2.0"].presence == Presence.ELSEWHERE
    (where,) = evidence["0.2.0"].found
    assert where.function == "SFTTrainer._loss_and_metrics"


def test_a_function_moved_and_renamed_is_followed_to_its_file(tmp_path: Path, monkeypatch) -> None:
    moved = "trl/trainer/utils.py"
    releases = {
        "0.1.0": {"trl/__init__.py": "", METRICS: "class SFTTrainer:\n    pass\n"},
        "0.2.0": trl_release(function="metrics_of", file=moved) | {METRICS: "X = 1\n"},
        "1.0.0": trl_release(),
    }
    site = AllowRule(METRICS, "asked", function="compute_loss")
    found = history_over(tmp_path, monkeypatch, "trl", releases, site)

    assert (found.first, found.before_first) == ("0.2.0", "0.1.0")
    evidence = {release.version: release.finding for release in found.releases}
    (where,) = evidence["0.2.0"].found
    assert (where.file, where.function) == (moved, "SFTTrainer.metrics_of")
    assert evidence["0.1.0"].presence == Presence.MISSING


def test_a_read_of_an_inlined_function_is_found_in_its_caller(tmp_path: Path, monkeypatch) -> None:
    helper = """
        class Trainer:
            def train(self, model):
                for step in range(3):
                    norm = model.step()
                    {inline}
                    self.log(norm)

            {helper}
    """
    read = 'if hasattr(norm, "item"):\n                        norm = norm.item()'
    own = (
        "def _get_grad_norm(self, norm, model=None):\n                if model is None:\n"
        '                    return None\n                if hasattr(norm, "item"):\n'
        "                    norm = norm.item()\n                return norm"
    )
    file = "transformers/trainer.py"

    def release(inline: str, helper_text: str) -> dict[str, str]:
        text = textwrap.dedent(helper.format(inline=inline, helper=helper_text))
        return {"src/transformers/__init__.py": "", f"src/{file}": text}

    releases = {
        "4.38.0": release("norm = float(norm)", ""),
        "4.39.0": release(read, ""),
        "5.2.0": release(read, ""),
        "5.3.0": release("norm = self._get_grad_norm(norm, model)", own),
    }
    site = AllowRule(file, "asked", function="_get_grad_norm")
    found = history_over(tmp_path, monkeypatch, "transformers", releases, site)

    assert (found.first, found.before_first) == ("4.39.0", "4.38.0")
    evidence = {release.version: release.finding for release in found.releases}
    (where,) = evidence["4.39.0"].found
    assert (where.function, where.code) == ("Trainer.train", 'if hasattr(norm, "item"):')


def test_another_read_of_the_sites_function_is_not_where_the_site_began(
    tmp_path: Path, monkeypatch
) -> None:
    """An older release that inlines the function's other read, not the site's, lacks the site
    (transformers 4.6.0 counted floating-point operations with `float(...)` years before the
    nan/inf filter's check)."""
    loop = """
        class Trainer:
            def train(self, data):
                for inputs in data:
                    {body}

            {method}
    """
    flos = "self.flos += float(self.count(inputs))"
    site_read = "self.total += self.step(inputs).item()"
    method = f"def _run_epoch(self, inputs):\n                {flos}\n                {site_read}"
    file = "transformers/trainer.py"

    def release(body: str, method_text: str = "") -> dict[str, str]:
        text = textwrap.dedent(loop.format(body=body, method=method_text))
        return {"src/transformers/__init__.py": "", f"src/{file}": text}

    releases = {
        "4.5.0": release("self.step(inputs)"),
        "4.6.0": release(flos),
        "4.11.0": release(f"{flos}\n                    {site_read}"),
        "5.0.0": release("self._run_epoch(inputs)", method),
    }
    site = AllowRule(file, "asked", function="_run_epoch", code="self.step(inputs).item()")
    found = history_over(tmp_path, monkeypatch, "transformers", releases, site)

    assert (found.first, found.before_first) == ("4.11.0", "4.6.0")


# --- judged by running: a value that turns from a float into a tensor ---------------------------

CLIP_UTILS = "deepspeed/runtime/utils.py"
# The clip's check, as `bisect` is told of a site of no case.
CLIP_SITE = (
    "--project",
    "deepspeed",
    "--file",
    CLIP_UTILS,
    "--function",
    "clip_tensors_by_global_norm",
    "--code",
    "clip_coef < 1",
)
# The global norm is a Python float until the release that keeps it on the device (as before
# and after DeepSpeed #5125): the clip's `if clip_coef < 1` reads the device only after it.
NORMS = """
    import torch


    def get_global_norm_of_tensors(input_tensors):
        norm = torch.linalg.vector_norm(torch.stack([t.norm() for t in input_tensors]))
        return norm{item}


    def clip_tensors_by_global_norm(input_tensors, max_norm=1.0, global_norm=None, eps=1e-6):
        if global_norm is None:
            global_norm = get_global_norm_of_tensors(input_tensors)
        clip_coef = max_norm / (global_norm + eps)
        if clip_coef < 1:
            for tensor in input_tensors:
                tensor.mul_(clip_coef)
        return global_norm
"""


# A function TorchScript compiles at import, calling one the detector observes (as DeepSpeed's
# MoE gating does, which accelerate imports from within a probe's scope).
SCRIPTED = """
    import torch.nn.functional as F


    @torch.jit.script
    def _one_hot_to_float(x, num_classes: int):
        return F.one_hot(x, num_classes=num_classes).float()
"""


def clip_release(item: str | None) -> dict[str, str]:
    """The release's files; `item` "broken" fails at import, as an old release does with a
    newer torch; "scripted" keeps the norm on the device and scripts a function at import."""
    text = textwrap.dedent(NORMS.format(item=item)) if item is not None else "import torch\n"
    if item == "broken":
        text = "raise ImportError('an older torch')\n" + textwrap.dedent(NORMS.format(item=""))
    if item == "scripted":
        text = textwrap.dedent(NORMS.format(item="")) + textwrap.dedent(SCRIPTED)
    return {"deepspeed/__init__.py": "", "deepspeed/runtime/__init__.py": "", CLIP_UTILS: text}


def judged_history(tmp_path: Path, releases: dict[str, str | None]) -> dict:
    """`bisect --judge` of the clip's `clip_coef < 1` over `releases` (version: how the norm
    is returned; None: no clip), in the test's own interpreter as a prepared environment."""
    files = {version: clip_release(item) for version, item in releases.items()}
    return judged_site(tmp_path, files, CLIP_SITE)


def judged_site(tmp_path: Path, releases: dict[str, dict[str, str]], site: tuple[str, ...]) -> dict:
    """`bisect --judge` of `site` over DeepSpeed `releases` (version: its files), in the test's
    own interpreter as a prepared environment."""
    for version, files in releases.items():
        make_sdist(
            tmp_path / "index" / "files" / "deepspeed",
            "deepspeed",
            version,
            files,
            requires=("torch",),
        )
    layout = own_downloads(make_workspace(tmp_path / "workspace"))
    with serving(tmp_path / "index") as url:
        done = hostsync(
            layout,
            "bisect",
            *site,
            "--judge",
            env_extra={sdists.INDEX_ENV: url, "HOSTSYNC_PREPARED": "1"},
        )
    assert done.returncode == 0, done.stderr
    (path,) = layout.sites.glob("bisect-*.json")
    return history_of(path) | {"report": (layout.sites / "bisect.md").read_text()}


def test_an_older_release_is_judged_beside_the_pinned_projects_of_its_day(
    tmp_path: Path, monkeypatch
) -> None:
    days = {
        "trl": {"0.16.0": "2025-03-22", "1.16.0": "2026-10-15"},
        "transformers": {
            "4.50.0": "2025-03-21",
            "4.49.0": "2025-02-17",
            "4.51.0": "2025-04-05",
            "5.24.0": "2026-11-21",
        },
        "accelerate": {"1.5.2": "2025-03-14", "1.6.0": "2025-04-01", "1.15.0": "2026-09-09"},
        "deepspeed": {"0.16.4": "2025-02-26", "0.19.8": "2026-10-20"},
        "peft": {"0.21.2": "2026-10-01"},  # none of that day: the pin stays
        "datasets": {"3.4.1": "2025-03-18", "5.2.0": "2026-11-20"},  # pin.toml: of its day
    }
    for project, released in days.items():
        for version, day in released.items():
            make_sdist(tmp_path / "index" / "files" / project, project, version, {}, uploaded=day)
    layout = make_workspace(tmp_path / "workspace")
    monkeypatch.delenv("HOSTSYNC_PREPARED", raising=False)
    with serving(tmp_path / "index") as url:
        monkeypatch.setenv(sdists.INDEX_ENV, url)
        old = envs.companions_of_its_day(layout, get("trl"), "0.16.0")
        pinned = envs.companions_of_its_day(layout, get("trl"), "1.16.0")

    assert old == {
        "transformers": "4.50.0",
        "accelerate": "1.5.2",
        "deepspeed": "0.16.4",
        "datasets": "3.4.1",
    }
    assert pinned == {}


@pytest.mark.distributed  # a process per judged release
def test_a_value_that_turns_from_float_to_tensor_is_judged_by_running(tmp_path: Path) -> None:
    site = judged_history(
        tmp_path,
        {"0.1.0": None, "0.2.0": ".item()", "0.3.0": ".item()", "0.4.0": "", "0.5.0": "scripted"},
    )

    assert (site["first"], site["before_first"]) == ("0.2.0", "0.1.0")  # the text's boundary
    (boundary,) = site["boundaries"]
    assert (boundary["older"], boundary["newer"], boundary["decided"]) == (
        "0.3.0",
        "0.4.0",
        "judged run",
    )
    assert boundary["stated"] == "0.4.0"  # judged: the release alone
    verdicts = {run["version"]: run["verdict"] for run in boundary["judged"]}
    assert verdicts["0.3.0"] == "line present, no device read"
    assert verdicts["0.4.0"] == verdicts["0.5.0"] == "device read"
    assert "The reads begin between 0.3.0 and 0.4.0, by judged run" in site["report"]


@pytest.mark.distributed  # a process per judged release
def test_a_release_that_does_not_run_leaves_the_texts_boundary(tmp_path: Path) -> None:
    site = judged_history(
        tmp_path, {"0.1.0": None, "0.2.0": ".item()", "0.3.0": "broken", "0.4.0": "", "0.5.0": ""}
    )

    (boundary,) = site["boundaries"]
    assert (boundary["older"], boundary["newer"], boundary["decided"]) == (
        "0.1.0",
        "0.2.0",
        "text match",
    )
    assert boundary["stated"].startswith(
        "0.2.0 (by the source text; run under a sync detector, 0.4.0 reads"
    )
    (not_run,) = [run for run in boundary["judged"] if run["version"] == "0.3.0"]
    assert not_run["verdict"] == "not run"
    assert "ImportError: an older torch" in not_run["reason"]


@pytest.mark.distributed  # a process per judged release and commit
def test_the_commit_that_made_the_read_is_found_by_running(tmp_path: Path) -> None:
    repo, index = tmp_path / "deepspeed.git", tmp_path / "index"
    repo.mkdir()
    git(repo, "init", "--quiet", "--initial-branch=master")
    history = (
        ("Initial import", None, "0.1.0"),
        ("Add global norm clipping (#5)", ".item()", "0.2.0"),
        ("Tidy the clip (#6)", ".item()  # a float", None),
        ("Keep the global norm on the device (#77)", "", None),
        ("Log the clip (#78)", "  # a tensor", "0.3.0"),
        ("Release (#80)", "  # a tensor", "0.4.0"),
    )
    for number, (subject, item, version) in enumerate(history):
        commit(repo, index, number, subject, clip_release(item), version, requires=("torch",))
    layout = own_downloads(make_workspace(tmp_path / "workspace"))
    with serving(index) as url:
        done = hostsync(
            layout,
            "bisect",
            *CLIP_SITE,
            "--judge",
            "--remote",
            str(repo),
            env_extra={sdists.INDEX_ENV: url, "HOSTSYNC_PREPARED": "1"},
        )

    assert done.returncode == 0, done.stderr
    (path,) = layout.sites.glob("bisect-*.json")
    site = history_of(path)
    (boundary,) = site["boundaries"]
    assert (boundary["older"], boundary["newer"], boundary["decided"]) == (
        "0.2.0",
        "0.3.0",
        "judged run",
    )
    (reading,) = [n for n in site["narrowed"] if n["change"] == "made a device read"]
    assert (reading["older"], reading["newer"], reading["commits"]) == ("v0.2.0", "v0.3.0", 3)
    assert reading["first"]["subject"] == "Keep the global norm on the device (#77)"
    assert (reading["first"]["verdict"], reading["pull_request"]) == ("device read", 77)
    # The text's own narrowing finds the commit that added the line.
    (added,) = [n for n in site["narrowed"] if n["change"] == "added"]
    assert added["pull_request"] == 5


CALLS_A_HELPER = {
    "clipping/__init__.py": "",
    "clipping/helper.py": "def is_large(value):\n    return bool(value > 1)\n",
    "clipping/caller.py": textwrap.dedent(
        """
        import torch

        from clipping.helper import is_large


        def clip(norms):
            total = torch.stack(norms).sum()
            if is_large(total):
                return 1
            return 0
        """
    ),
}


def test_a_read_inside_a_helper_is_the_callers_read_at_the_line_that_called_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A site with a `caller` (ds-clip-norm's `is_invalid_grad_norm` called from
    `unscale_and_clip_grads`) is found in the caller's file: the probe watches that file's
    line, and the read made inside the helper while it runs is that line's."""
    for name, text in CALLS_A_HELPER.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    line = CALLS_A_HELPER["clipping/caller.py"].splitlines().index("    if is_large(total):") + 1
    args = argparse.Namespace(file="clipping/caller.py", lines=[line], function="clip")

    seen = probe._run(args)

    assert (seen.error, seen.reached) == ("", (line,))
    assert seen.reads == (f"clipping/caller.py:{line}",)


def test_a_line_that_reads_in_a_loop_is_one_read_of_the_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verdict's reason names each reading line once, however often it read."""
    (tmp_path / "counting").mkdir()
    (tmp_path / "counting" / "__init__.py").write_text("")
    (tmp_path / "counting" / "large.py").write_text(
        "def count(norms):\n    return sum(1 for n in norms[0] if n > 1)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    args = argparse.Namespace(file="counting/large.py", lines=[2], function="count")

    seen = probe._run(args)

    assert (seen.error, seen.reached, seen.reads) == ("", (2,), ("counting/large.py:2",))


# --- judged by running: a site named by its function, its read two calls below it ---------------

NORM_FILE = "deepspeed/runtime/norms.py"
# The site as a case's `[[carries]]` names a whole function: no code.
NORM_SITE = ("--project", "deepspeed", "--file", NORM_FILE, "--function", "global_grad_norm")
# The engine's norm, fetched through two helpers of another module (as the Trainer's
# `_clip_grad_norm` asks accelerate, which asks its DeepSpeed wrapper): a Python number until
# the release whose innermost helper reads the device tensor.
NORM = """
    import torch

    from deepspeed.utils.fetch import fetch


    def global_grad_norm(norms):
        total = torch.stack([n.sum() for n in norms]).sum()
        value = fetch(total)
        return value
"""
FETCH = """
    def fetch(value):
        return scalar(value)


    def scalar(value):
        return {scalar}
"""


def norm_release(scalar: str | None) -> dict[str, str]:
    """The release's files; `scalar` is what the innermost helper returns (None: no site;
    "broken": the package fails at import, as an old release does beside a newer torch)."""
    broken = scalar == "broken"
    scalar = "value.item()" if broken else scalar
    init = "raise ImportError('an older torch')\n" if broken else ""
    files = {"deepspeed/__init__.py": init, "deepspeed/runtime/__init__.py": ""}
    files["deepspeed/utils/__init__.py"] = ""
    files["deepspeed/utils/fetch.py"] = textwrap.dedent(FETCH.format(scalar=scalar or "value"))
    files[NORM_FILE] = textwrap.dedent(NORM) if scalar is not None else "import torch\n"
    return files


def judged_norm_boundary(tmp_path: Path, releases: dict[str, str | None]) -> dict:
    """The one boundary `bisect --judge` finds for the norm's site over `releases` (version:
    what its innermost helper returns, as `norm_release` takes it)."""
    files = {version: norm_release(scalar) for version, scalar in releases.items()}
    (boundary,) = judged_site(tmp_path, files, NORM_SITE)["boundaries"]
    return boundary


@pytest.mark.distributed  # a process per judged release
def test_a_function_whose_read_is_in_a_helper_of_a_helper_is_judged_by_its_body(
    tmp_path: Path,
) -> None:
    """A site named by its function reads where its body runs, not at its `def` (which runs at
    import): a read two helpers below the body, in another module, is the body's read."""
    releases = {"0.1.0": None, "0.2.0": "4.0", "0.3.0": "4.0", "0.4.0": "value.item()"}
    boundary = judged_norm_boundary(tmp_path, releases)
    verdicts = {run["version"]: run["verdict"] for run in boundary["judged"]}
    assert verdicts["0.4.0"] == "device read"
    assert verdicts["0.3.0"] == "line present, no device read"
    assert (boundary["older"], boundary["newer"], boundary["decided"]) == (
        "0.3.0",
        "0.4.0",
        "judged run",
    )


@pytest.mark.distributed  # a process per judged release
def test_reads_that_began_and_stopped_before_the_anchor_are_judged_where_they_began(
    tmp_path: Path,
) -> None:
    """The Trainer's `.item()` of DeepSpeed's norm: it read from the release that added it until
    accelerate began to hand it a float. The anchor runs the line without a read; the text's
    first release, run, reads: the reads began there, and the boundary says the anchor's line
    reads nothing."""
    releases = {"0.1.0": None, "0.2.0": "value.item()", "0.3.0": "value.item()", "0.4.0": "4.0"}
    boundary = judged_norm_boundary(tmp_path, releases)
    verdicts = {run["version"]: run["verdict"] for run in boundary["judged"]}
    assert verdicts == {"0.2.0": "device read", "0.4.0": "line present, no device read"}
    assert (boundary["older"], boundary["newer"], boundary["decided"]) == (
        "0.1.0",
        "0.2.0",
        "judged run",
    )
    assert boundary["stated"] == "0.2.0 (0.4.0 runs the line without a device read)"


@pytest.mark.distributed  # a process per judged release
def test_a_first_release_that_does_not_run_leaves_the_text_and_says_the_anchor_is_quiet(
    tmp_path: Path,
) -> None:
    releases = {"0.1.0": None, "0.2.0": "broken", "0.3.0": "value.item()", "0.4.0": "4.0"}
    boundary = judged_norm_boundary(tmp_path, releases)
    assert (boundary["older"], boundary["newer"], boundary["decided"]) == (
        "0.1.0",
        "0.2.0",
        "text match",
    )
    assert boundary["stated"] == (
        "0.2.0 (by the source text; run under a sync detector, 0.4.0 runs the line without a"
        " device read; 0.2.0: not run)"
    )


def test_a_probe_error_names_files_by_their_package_path_not_where_they_are_kept() -> None:
    """DeepSpeed 0.14.0's import on torch 2.13, as a probe of transformers 4.39 reports it."""
    with pytest.raises(ImportError) as raised:
        exec("from torch.distributed.elastic.agent.server.api import log")
    said = traceback.format_exception_only(raised.value)[-1].strip()
    assert "site-packages/torch/" in said  # where this environment keeps torch

    assert probe.without_machine_paths(said) == (
        "ImportError: cannot import name 'log' from 'torch.distributed.elastic.agent.server.api'"
        " (torch/distributed/elastic/agent/server/api.py)"
    )
