"""The census: its setups read and checked, its report from a result, and one real setup run."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hostsync.census import report, setups
from hostsync.census.records import CensusResult, CensusSetup, CensusTrees
from hostsync.census.run import census_cases
from hostsync.detector.records import Cost, DeviceWork, HostSpan, Idle
from hostsync.detector.sites import DEVICE_COPY, Site
from hostsync.rank import rankkit
from hostsync.sites.dispositions import known_now
from hostsync.sites.records import HuntSite, HuntTree
from hostsync.workspace import cases, results, table
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import ROOT, Layout
from hostsync.workspace.records import Environment, Launcher, Precision, Provenance, Stamp, TreeInfo

from conftest import make_workspace


def test_every_setup_of_the_census_loads_and_the_default_matrix_leaves_the_extra_ones_out() -> None:
    matrix = setups.load(ROOT)

    default = matrix.chosen(None)
    assert "smoke" in matrix.setups and "smoke" not in default
    assert {s.trainer.value for s in default.values()} == {
        "Trainer",
        "SFTTrainer",
        "DPOTrainer",
        "RewardTrainer",
        "GRPOTrainer",
        "accelerate-loop",
    }
    assert {s.zero_stage for s in default.values()} == {0, 1, 2, 3}
    assert any(s.fsdp for s in default.values())
    assert not any(s.torch_compile for s in default.values())  # opt-in: it measures nothing


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('[setups.x]\nabout = "a"\nzero_stage = 4', "setups.x.zero_stage: must be 0"),
        ('[setups.x]\nabout = "a"\nsp = true', "setups.x.sp: Ulysses SP needs DeepSpeed"),
        (
            '[setups.x]\nabout = "a"\nranks = 2\nzero_stage = 2\nfsdp = true',
            "setups.x.fsdp: FSDP2 shards over 2 ranks, without DeepSpeed (zero 0)",
        ),
        ('[setups.x]\nabout = "a"\nranks = 2\nfsdp = true', "setups.x.fsdp: needs trainer = "),
        ('[setups.x]\nabout = "a"\ntrainer = "PPOTrainer"', "setups.x.trainer: expected one of"),
        ('[setups.x]\nabout = "a"\npacking = true', "setups.x.packing: is an SFTTrainer option"),
        ('[setups.x]\nabout = "a"\nzero = 2', "setups.x: has unknown keys ['zero']"),
        ('[setups.x]\nabout = "a"\nprecision = "fp8"', "setups.x.precision: expected one of"),
    ],
)
def test_a_wrong_setup_is_refused_naming_its_field(
    tmp_path: Path, table: str, message: str
) -> None:
    (tmp_path / setups.FILE).write_text(f"steps = 4\n{table}\n")

    with pytest.raises(WorkspaceError, match=re.escape(message)):
        setups.load(tmp_path)


def test_an_unknown_setup_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(WorkspaceError, match=r"no setup nope in census\.toml: the setups are"):
        setups.load(ROOT).chosen(["nope"])


def test_a_forked_deepspeed_setup_gets_the_variables_accelerate_launch_gives(
    tmp_path: Path,
) -> None:
    setup = CensusSetup(about="a", ranks=2, zero_stage=3, precision=Precision.BF16)

    world = setups.world(setup, 4, tmp_path)

    assert setups.launcher(setup) == Launcher.FORK
    assert world.env["ACCELERATE_USE_DEEPSPEED"] == "true"
    assert Path(world.env["ACCELERATE_DEEPSPEED_CONFIG_FILE"]).read_text().count('"stage": 3')
    assert "--precision" in world.args and world.ranks == 2
    assert setups.launcher(CensusSetup(about="a", ranks=2, zero_stage=1, sp=True)) == "accelerate"


def test_the_preference_texts_tokenize_to_real_words_as_trl_joins_them() -> None:
    """RewardTrainer joins prompt and completion as strings, DPOTrainer tokenizes them apart: every
    word must stay a word of the tiny vocabulary (an unknown one becomes <pad>), each completion
    ending in one <eos>."""
    tokenizer = rankkit.tiny_tokenizer()

    for row in rankkit.preference_samples(6):
        for completion in (row["chosen"], row["rejected"]):
            joined = tokenizer(row["prompt"] + completion)["input_ids"]
            apart = tokenizer(row["prompt"])["input_ids"] + tokenizer(completion)["input_ids"]
            assert joined == apart
            assert tokenizer.pad_token_id not in joined
            eos = tokenizer.eos_token_id
            assert joined.count(eos) == 1 and joined[-1] == eos


def test_the_fixed_column_stacks_every_case_at_the_newest_release_of_its_project() -> None:
    names = [case.name for case in census_cases(cases.every(ROOT))]

    assert names[0] in {"trainer-nan-filter", "trainer-grad-norm"}  # transformers first
    assert "sp-loss" not in names  # 5.13.1, fixed upstream since
    assert {"ds-clip-norm", "ds-ulysses-seqlen", "trl-sft-metrics"} <= set(names)


def _site(
    file: str,
    rate: float,
    carried: str | None = None,
    allowed: str | None = None,
    kinds: tuple[str, ...] = ("scalar_read",),
    idle: Idle | None = None,
):
    idle = idle or Idle()
    return HuntSite(
        package=file.split("/")[0],
        site=Site(file, 1, "f", "x.item()"),
        caller="",
        kinds=kinds,
        idle=idle,
        idle_rate=round(sum(idle.windows_us) / 2, 1),
        steps=(2, 3),
        when="every step",
        per_step=int(rate),
        rate=rate,
        carried=carried,
        allowed=allowed,
    )


def _run(
    setup: str,
    column: str,
    sites: tuple[HuntSite, ...],
    stalls: int = 0,
    idle: tuple[float, ...] = (),
) -> HuntTree:
    info = TreeInfo("transformers", "5.24.0", "abc", "a test", "src")
    reads = round(sum(site.rate for site in sites) * 2)
    work = DeviceWork(kernels=100, bytes=4000)
    cost = Cost(steps=2, reads=reads, stalls=stalls, work=work, idle_us=idle)
    return HuntTree(
        label=f"{setup} {column}",
        tree=column,
        setup=setup,
        info=info,
        stacked=(),
        seconds=1.0,
        sites=sites,
        cost=cost,
    )


def test_the_report_ranks_sites_by_reads_per_step_summed_over_the_setups(tmp_path: Path) -> None:
    workspace = make_workspace(tmp_path / "workspace")
    candidate, carried = _site("trl/a.py", 2.0), _site("transformers/b.py", 3.0, carried="case")
    accepted = _site("deepspeed/c.py", 1.0, allowed="by design")
    windows = Idle((200.0, 210.0), (HostSpan("transformers/trainer.py:10", 400.0),))
    copied = _site("accelerate/d.py", 1.0, kinds=(DEVICE_COPY,), idle=windows)
    info = TreeInfo("transformers", "5.24.0", "abc", "a test", "src")
    result = CensusResult(
        stamp=Stamp.now("census", "census", Provenance("", "", {}, {})),
        environment=Environment("3.11", {"torch": "2.13.0"}, "linux", "cpu", 0),
        steps=4,
        setups={name: CensusSetup(about=name) for name in ("one", "two")},
        columns={"today": CensusTrees(info, (), ()), "fixed": CensusTrees(info, (), ("case",))},
        allowlist=(),
        runs=(
            _run("one", "today", (carried, candidate, accepted), 4, (500.0, 300.0, 310.0)),
            _run("two", "today", (candidate, copied), 2, (500.0, 200.0, 210.0)),
            _run("one", "fixed", (candidate, accepted), 2, (500.0, 100.0, 105.0)),
            _run("two", "fixed", (candidate, copied), 2, (500.0, 200.0, 210.0)),
        ),
        wall_s=10.0,
    )
    layout = Layout(workspace.root, "census")
    path = results.write(layout.profiles, result, keep_elsewhere=layout.unsaved)

    written = report.write_reports(layout, path)

    ranked = [site.hunted.site.file for site in report.census_sites(result.runs)]
    # 4, 3, 1 and 1 a step
    assert ranked == ["trl/a.py", "transformers/b.py", "accelerate/d.py", "deepspeed/c.py"]
    assert report.per_setup(result, "today") == {"one": 6.0, "two": 3.0}
    assert report.per_setup(result, "fixed", unaccepted=True) == {"one": 2.0, "two": 3.0}
    text = written[0].read_text()
    assert "carried by case case" in text and "accepted: by design" in text
    assert report.stalls_per_setup(result, "today") == {"one": 2.0, "two": 1.0}
    assert report.copies_per_setup(result, "today") == {"one": 0.0, "two": 1.0}
    assert report.idle_per_setup(result, "fixed") == {"one": 102.5, "two": 205.0}
    assert report.fix_verdicts(result) == {
        "one": "saves idle time: idle 305 -> 102.5 us per step (host time, measured on CPU),"
        " a drop beyond the spread of 10 us between steps",
        "two": "no change: neither waits nor stalls down",
    }
    assert "| 2 -> 1 |" in text and "stalls/step today -> fixed" in text
    assert "| 305 -> 102.5 |" in text and "| 0 -> 0 |" in text
    (largest,) = report.largest_windows(result)
    assert (largest.setup, largest.hunted.site.file) == ("two", "accelerate/d.py")
    assert "transformers/trainer.py:10 (400)" in text
    assert "median idle us/step today -> fixed" in report.console_summary(result)
    assert written[1].suffix == ".png" and written[1].stat().st_size > 0
    assert results.read(path, CensusResult) == result


def test_a_compiled_setup_is_reported_compiled_not_judged_and_fails_nothing(
    tmp_path: Path,
) -> None:
    workspace = make_workspace(tmp_path / "workspace")
    info = TreeInfo("transformers", "5.24.0", "abc", "a test", "src")
    compiled = HuntTree(
        label="c today",
        tree="today",
        setup="c",
        info=info,
        stacked=(),
        seconds=1.0,
        not_judged="compiled, not judged: fused kernels",
    )
    result = CensusResult(
        stamp=Stamp.now("census", "census", Provenance("", "", {}, {})),
        environment=Environment("3.11", {"torch": "2.13.0"}, "linux", "cpu", 0),
        steps=4,
        setups={"one": CensusSetup(about="one"), "c": CensusSetup(about="c", torch_compile=True)},
        columns={"today": CensusTrees(info, (), ())},
        allowlist=(),
        runs=(_run("one", "today", (_site("trl/a.py", 2.0),)), compiled),
        wall_s=10.0,
    )
    layout = Layout(workspace.root, "census")
    path = results.write(layout.profiles, result, keep_elsewhere=layout.unsaved)

    text = report.write_reports(layout, path)[0].read_text()

    row = next(line for line in text.splitlines() if line.startswith("| c | c |"))  # the setups
    assert "compiled, not judged" in row and "failed" not in row
    assert "- c today: compiled, not judged: fused kernels" in text
    assert not compiled.measured and compiled.error is None
    assert results.read(path, CensusResult) == result


def test_a_candidate_shows_its_disposition_and_one_without_is_listed_apart(
    tmp_path: Path,
) -> None:
    workspace = make_workspace(tmp_path / "workspace")
    with workspace.known_sites.open("a") as rules:
        rules.write('\n[[not_carried]]\nfile = "trl/a.py"\nreason = "metrics only, see #1"\n')
    left, undecided = _site("trl/a.py", 2.0), _site("trl/b.py", 1.0)
    info = TreeInfo("transformers", "5.24.0", "abc", "a test", "src")
    result = CensusResult(
        stamp=Stamp.now("census", "census", Provenance("", "", {}, {})),
        environment=Environment("3.11", {"torch": "2.13.0"}, "linux", "cpu", 0),
        steps=4,
        setups={"one": CensusSetup(about="one")},
        columns={"today": CensusTrees(info, (), ())},
        allowlist=(),
        runs=(_run("one", "today", (left, undecided)),),
        wall_s=10.0,
    )
    layout = Layout(workspace.root, "census")
    path = results.write(layout.profiles, result, keep_elsewhere=layout.unsaved)

    text = report.write_reports(layout, path)[0].read_text()

    sites = report.census_sites(result.runs, known_now(layout))
    assert [s.hunted.site.file for s in report.undecided(sites)] == ["trl/b.py"]
    rows = {line.split(" | ")[2]: line for line in text.splitlines() if "| trl/" in line}
    assert "| not carried: metrics only, see #1 |" in rows["trl/a.py:1 `f`"]
    assert f"| {report.UNDECIDED} |" in rows["trl/b.py:1 `f`"]
    assert "## Candidates without a disposition\n\n- trl/b.py:1 `f` `x.item()`" in text


def test_each_reference_census_candidate_ends_somewhere_and_rebuilds_without_events() -> None:
    """The committed census result, with known_sites.toml as it is: each candidate carried,
    accepted or not carried with its reason, shown on its row; the report is the same from the
    result without the ranks' raw events, which the census no longer writes."""
    found = results.latest(ROOT / "profiles" / "census" / "reference", CensusResult)
    result = results.read(found, CensusResult)
    rules = known_now(Layout(ROOT, "census"))

    sites = report.census_sites(result.runs, rules)
    text = report.render(result, found.name, None, rules)

    assert not [
        f"{s.hunted.site.file} {s.hunted.site.function} {s.hunted.site.code}"
        for s in report.undecided(sites)
    ], "give each a case, an [[allow]] or a [[not_carried]] table in known_sites.toml"
    assert report.UNDECIDED not in text and "## Candidates without a disposition" not in text
    assert all(
        table.markdown(("disposition",), [(s.said(),)]).splitlines()[-1] in text for s in sites
    )
    events_left_out = dataclasses.replace(
        result, runs=tuple(dataclasses.replace(run, ranks=()) for run in result.runs)
    )
    assert report.render(events_left_out, found.name, None, rules) == text


@pytest.mark.distributed
@pytest.mark.network
def test_the_census_smoke_setup_runs_and_reports_a_compiled_one_as_not_judged(
    tmp_path: Path,
) -> None:
    """Two setups, three steps, today's column: the command end to end, as `nox -s census`; the
    compiled setup is reported, not a crash."""
    workspace = make_workspace(tmp_path / "workspace")

    # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hostsync",
            "census",
            "--setups",
            "smoke,trainer-compile",
            "--steps",
            "3",
            "--columns",
            "today",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        env={
            "PYTHONPATH": str(ROOT / "src"),
            "HOSTSYNC_ROOT": str(workspace.root),
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        },
    )

    assert done.returncode == 0, done.stderr[-2000:]
    assert "census wall time" in done.stderr
    found = results.latest(workspace.root / "profiles" / "census", CensusResult)
    runs = {run.setup: run for run in results.read(found, CensusResult).runs}
    assert runs["smoke"].measured and runs["smoke"].sites, runs["smoke"].error
    assert runs["smoke"].cost and not runs["smoke"].ranks  # per-site totals, no raw events
    compiled = runs["trainer-compile"]
    assert compiled.error is None and compiled.not_judged.startswith("compiled, not judged")
