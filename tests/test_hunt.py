"""The hunt: a real 2-rank accelerate + Trainer + DeepSpeed Ulysses run on the pinned tree, then
the summarising, ranking, allow-list and comparison logic on small hand-made records.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hostsync.commands import hunt as hunt_command
from hostsync.detector.records import Cost, DeviceWork
from hostsync.detector.sites import AllowRule, Site
from hostsync.hunt import measure, report
from hostsync.hunt.records import HuntResult
from hostsync.hunt.run import check_stack, stacked
from hostsync.launch import trainer_step
from hostsync.sites import known, render, summary
from hostsync.sites.records import CrossCheck, HuntRank, HuntSite, HuntTree
from hostsync.upstream.git import git
from hostsync.upstream.patchqueue import series
from hostsync.upstream.trees import Tree, prepare_tree, stack_trees
from hostsync.workspace import cases, projects, results
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import ROOT, Layout
from hostsync.workspace.projects import DeepSpeedSetup
from hostsync.workspace.records import TreeRole

import made
from bug_sites import DEEPSPEED_PY, IF_PER_RANK, MAX_OF_TOTAL, source_line
from conftest import make_workspace

SP_SIZE = trainer_step.SP_SIZE


# --- the real run ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Layout:
    return make_workspace(tmp_path_factory.mktemp("hunt") / "workspace")


@pytest.fixture(scope="module")
def pinned(layout: Layout) -> Tree:
    return prepare_tree(made.case_of(layout), "pinned")


@pytest.fixture(scope="module")
def hunted(layout: Layout, pinned: Tree) -> HuntTree:
    rules = known.load_known_sites(layout.known_sites).allow
    # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
    return measure.hunt_tree(layout, pinned, steps=6, rules=rules, timeout=600)


@pytest.mark.distributed
def test_pinned_step_syncs_at_both_lines_of_the_loss_aggregation_on_every_step(
    hunted: HuntTree, pinned: Tree
) -> None:
    if_line = source_line(pinned, IF_PER_RANK)
    max_line = source_line(pinned, MAX_OF_TOTAL)
    found = {s.site.line: s for s in hunted.sites if s.site.file == DEEPSPEED_PY}

    assert set(found) == {if_line, max_line}
    assert found[if_line].per_step == SP_SIZE
    assert found[max_line].per_step == 1
    for site in found.values():
        assert site.when == "every step"
        assert site.allowed is None
        assert site.package == "transformers"


@pytest.mark.distributed
def test_each_step_is_accounted_reads_stalls_and_device_work(hunted: HuntTree) -> None:
    cost = hunted.cost
    steady_steps = hunted.plan.steps - 1  # step 1 is the warm-up
    assert cost.steps == SP_SIZE * steady_steps
    assert cost.reads == round(sum(site.rate for site in hunted.sites) * cost.steps)
    assert 0 < cost.stalls <= cost.reads
    assert cost.work.kernels > 0 and cost.work.collectives > 0 and cost.work.flops > 0
    assert sum(site.stall_rate for site in hunted.sites) == pytest.approx(cost.stalls / cost.steps)


@pytest.mark.distributed
def test_logging_syncs_are_told_apart_from_every_step_ones(hunted: HuntTree) -> None:
    by_function = {s.site.function: s for s in hunted.sites}

    logged = by_function["_maybe_log_save_evaluate"]
    assert logged.when == "logging steps"
    assert logged.steps == (3, 6)
    assert logged.allowed


@pytest.mark.distributed
def test_the_profiler_and_the_detector_agree_on_every_read(hunted: HuntTree) -> None:
    """Every read, apart from those a CPU kernel makes inside itself where the accounting judges
    the op as its CUDA kernel (fused AdamW reads its step counters on the CPU, not on a GPU):
    the hunt lists those apart, by the op they were made in."""
    assert hunted.cross_check, "every rank is cross-checked"
    for check in hunted.cross_check:
        inside = sum(
            entry.count for entry in hunted.profiler_only if entry.via and check.rank in entry.ranks
        )
        assert check.profiler == check.detector + inside > 0, (check, hunted.profiler_only)


@pytest.mark.heavy
@pytest.mark.distributed
def test_trainer_loss_with_sp_equals_the_loss_without(layout: Layout, pinned: Tree) -> None:
    # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
    compared = trainer_step.compare_losses(layout, pinned, steps=2, timeout=600)

    assert compared.sp_ranks_agree
    assert compared.max_abs_diff < 1e-5, compared


# --- hand-made records ---------------------------------------------------------------------------


def site(
    file: str,
    line: int,
    function: str,
    code: str,
    count: int = 1,
    kind: str = "scalar_read",
    stalls: int = 1,
) -> dict:
    """`stalls` of the `count` reads waited for device work (the first, by default)."""
    return {
        "kind": kind,
        "file": file,
        "line": line,
        "function": function,
        "code": code,
        "caller": "",
        "count": count,
        "stalls": stalls,
    }


EVERY_PLACE = ("transformers/integrations/deepspeed.py", 741, "<genexpr>", "if t > 0")
EVERY = site(*EVERY_PLACE, count=2)
LOGGING = site("transformers/trainer.py", 2074, "_maybe_log_save_evaluate", "x.item()")
WARMUP = site("accelerate/data_loader.py", 583, "__iter__", "it = iter(dl)")
REFILL = site("deepspeed/runtime/sequence_parallel/ulysses_sp.py", 684, "refill", "if a != b:", 3)


def step(number: int, *sites: dict, logging: bool = False) -> dict:
    """One step, its cost what its sites read and stalled, after 10 kernels of work each."""
    reads, stalls = sum(s["count"] for s in sites), sum(s["stalls"] for s in sites)
    cost = Cost(1, reads, stalls, DeviceWork(kernels=10 * len(sites)))
    return {
        "step": number,
        "warmup": number == 1,
        "logging": logging,
        "sites": list(sites),
        "cost": cost.to_json(),
        "host_reads": 0,
    }


def rank(number: int) -> dict:
    """Steps 1 to 5, logging at 3, refilling data at 1, 3 and 5, like a real record."""
    return {
        "rank": number,
        "steps": [
            step(1, EVERY, WARMUP, REFILL),
            step(2, EVERY),
            step(3, EVERY, LOGGING, REFILL, logging=True),
            step(4, EVERY),
            step(5, EVERY, REFILL),
        ],
        "profiled": [],
    }


def as_read(*ranks: dict) -> list[HuntRank]:
    """Hand-made rank records as the hunt reads them, through their record's reader."""
    where = {"device": "cpu", "backend": "gloo", "model": "tiny"}
    return [HuntRank.from_json(record | where) for record in ranks]


ACCEPT_LOGGING = AllowRule("transformers/trainer.py", "logged", function="_maybe_log_save_evaluate")


def test_sites_say_when_they_occur_and_rank_by_syncs_per_step() -> None:
    sites = summary.summarize(as_read(rank(0), rank(1)), (ACCEPT_LOGGING,))

    assert [(s.site.function, s.when, s.per_step) for s in sites] == [
        ("<genexpr>", "every step", 2),
        ("refill", "steps 3, 5", 3),
        ("_maybe_log_save_evaluate", "logging steps", 1),
        ("__iter__", "warm-up only", 1),
    ]
    assert [s.rate for s in sites] == [2.0, 1.5, 0.25, 0.0]
    assert [s.stall_rate for s in sites] == [1.0, 0.5, 0.25, 0.0]
    assert [s.package for s in sites] == ["transformers", "deepspeed", "transformers", "accelerate"]


def test_a_trees_cost_is_every_ranks_steps_after_the_warm_up_and_judged_against_the_first() -> None:
    pinned = summary.steady_cost(as_read(rank(0), rank(1)))
    assert (pinned.steps, pinned.reads, pinned.stalls, pinned.work.kernels) == (8, 30, 14, 140)

    lighter = rank(0)
    for number in range(1, 5):
        lighter["steps"][number] = step(number + 1, site(*EVERY_PLACE, count=2, stalls=0))
    base = dataclasses.replace(hunt_tree("pinned", ()), cost=pinned)
    fixed_cost = summary.steady_cost(as_read(lighter))
    fixed = dataclasses.replace(hunt_tree("patched", ()), cost=fixed_cost)
    rows = report.cost_rows([base, fixed])

    assert rows[0] == ("pinned", 3.75, 1.75, 0.0, 17.5, "-")
    assert rows[1][:5] == ("patched", 2.0, 0.0, 0.0, 10.0)
    assert rows[1][5] == (
        "moves the wait: 1.75 stalls per step fewer, but idle 0 -> 0 us per step (host time,"
        " measured on CPU), idle time not measured"
    )


def test_the_allow_list_accepts_by_file_and_function_with_its_reason() -> None:
    sites = {s.site.function: s for s in summary.summarize(as_read(rank(0)), (ACCEPT_LOGGING,))}

    assert sites["_maybe_log_save_evaluate"].allowed == "logged"
    assert sites["<genexpr>"].allowed is None


def test_a_site_only_one_rank_saw_is_kept() -> None:
    lonely = rank(1)
    lonely["steps"][1]["sites"].append(site("other.py", 5, "f", "bool(t)"))

    sites = {s.site.function: s for s in summary.summarize(as_read(rank(0), lonely), ())}

    assert sites["f"].steps == (2,)
    assert sites["f"].package == "other"


def test_trees_are_compared_on_code_not_line_numbers() -> None:
    moved = dict(LOGGING, line=2080)
    first = hunt_tree("pinned", summary.summarize(as_read(rank(0)), ()))
    fixed_rank = rank(0)
    for record in fixed_rank["steps"]:
        record["sites"] = [moved if s is LOGGING else s for s in record["sites"] if s is not EVERY]
    new_site = site("transformers/trainer.py", 10, "f", "int(t)")
    fixed_rank["steps"][1]["sites"].append(new_site)
    second = hunt_tree("fixed", summary.summarize(as_read(fixed_rank), ()))

    rows = {row.first.site.function: row for row in report.compare([first, second])}

    assert rows["<genexpr>"].change == "gone in fixed"
    assert rows["f"].change == "new in fixed"
    assert rows["_maybe_log_save_evaluate"].change == ""
    assert rows["_maybe_log_save_evaluate"].trees["fixed"].site.line == 2080
    assert rows["_maybe_log_save_evaluate"].trees["pinned"].site.line == 2074


def test_profiler_reads_beyond_the_twin_step_are_listed_with_their_kernel() -> None:
    record = rank(0)
    record["profiled"] = [
        {
            "step": 6,
            "logging": True,
            "file": EVERY["file"],
            "function": "<genexpr>",
            "via": None,
            "count": 2,
        },
        {
            "step": 6,
            "logging": True,
            "file": "torch/optim/adam.py",
            "function": "_fused_adam",
            "via": "aten::_fused_adamw_",
            "count": 2,
        },
    ]

    only = measure.profiler_only(as_read(record), twin=3)

    assert [(e.function, e.via, e.count) for e in only] == [
        ("_fused_adam", "aten::_fused_adamw_", 2)
    ]
    checked = measure.cross_check(as_read(record), twin=3)
    assert checked == [CrossCheck(rank=0, profiler=4, detector=6)]
    # A read of host memory (AdamW's step counter): the profiler sees it, the detector apart.
    record["steps"][2]["host_reads"] = 1
    checked = measure.cross_check(as_read(record), twin=3)
    assert checked == [CrossCheck(rank=0, profiler=4, detector=7)]


@pytest.mark.parametrize(
    ("code", "kinds", "expected"),
    [
        ("loss = total / max(count, 1)", ["scalar_read"], "clamp"),
        ("return norm.item()", ["scalar_read"], "keep the tensor"),
        ("if good_tokens_per_rank[rank] > 0", ["scalar_read"], "torch.where"),
        ("ids = mask.nonzero()", ["nonzero"], "output size depends on the data"),
        ("x = batch.to(device)", ["device_copy"], "a blocking copy, not a read"),
    ],
)
def test_each_reading_names_why_it_syncs(code: str, kinds: list[str], expected: str) -> None:
    where = Site("a.py", 1, "f", code)
    site = HuntSite("torch", where, "", tuple(kinds), (2,), "every step", 1, 1.0, None, None)
    assert expected in render.reading(site)


def test_the_committed_allow_list_gives_every_rule_a_reason() -> None:
    rules = known.load_known_sites(Layout(ROOT).known_sites).allow

    assert rules
    assert all(rule.reason.strip() for rule in rules)


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ('[[allow]]\nfile = "a.py"\n', "known_sites.toml: allow[0].reason: is missing"),
        ('[[allow]]\nfile = "a.py"\nreason = "r"\nkind = "cpu"\n', "unknown keys ['kind']"),
        ("[[allow]\n", "not valid TOML"),
    ],
)
def test_a_bad_allow_list_is_refused_in_one_line(tmp_path: Path, text: str, complaint: str) -> None:
    path = tmp_path / "known_sites.toml"
    path.write_text(text)

    with pytest.raises(WorkspaceError, match=complaint.replace("[", r"\[").replace("]", r"\]")):
        known.load_known_sites(path)


def test_too_few_steps_are_refused_before_anything_runs() -> None:
    with pytest.raises(WorkspaceError, match="use --steps 6 or more"):
        hunt_command.main(["--steps", "3"])


def test_the_profiled_step_and_its_twin_share_both_cycles() -> None:
    plan = measure.hunt_plan(steps=7, logging_steps=3)

    assert plan.profile > plan.steps >= plan.twin >= 2
    assert plan.profile % 3 == plan.twin % 3 == 0
    assert (plan.profile - plan.twin) % SP_SIZE == 0


def hunt_tree(label: str, sites: list[HuntSite]) -> HuntTree:
    return HuntTree(
        label=label,
        tree=label,
        setup="bf16-zero1",
        info=made.info("5.13.1"),
        stacked=(),
        seconds=1.0,
        plan=measure.hunt_plan(7, 3),
        sites=tuple(sites),
        cross_check=(CrossCheck(rank=0, profiler=2, detector=2),),
    )


def document(workspace: Layout, label: str) -> HuntResult:
    tree = hunt_tree(label, summary.summarize(as_read(rank(0)), (ACCEPT_LOGGING,)))
    return dataclasses.replace(made.hunt(workspace, tree), allowlist=(ACCEPT_LOGGING,))


def test_reports_are_never_overwritten_and_hunt_md_follows_the_newest(workspace: Layout) -> None:
    older = results.write(workspace.profiles, document(workspace, "older"), workspace.unsaved)
    report.write_reports(workspace, older)
    newer = results.write(workspace.profiles, document(workspace, "newer"), workspace.unsaved)
    report.write_reports(workspace, newer)

    stable = (workspace.profiles / "hunt.md").read_text()
    assert newer.name in stable and "## newer" in stable
    assert "## older" in older.with_suffix(".md").read_text()
    with pytest.raises(FileExistsError):
        report.write_reports(workspace, newer)


def test_the_report_separates_candidates_accepted_and_profiler_only(workspace: Layout) -> None:
    text = report.render(document(workspace, "pinned"), "profiles/x.json")

    candidates = text.index("### Candidates")
    accepted = text.index("### Accepted by design")
    profiler = text.index("### Seen only by the PyTorch profiler")
    assert candidates < text.index("`<genexpr>`", candidates) < accepted
    assert accepted < text.index("`_maybe_log_save_evaluate`", accepted) < profiler
    assert "nox -s hunt" in text


def test_a_tree_that_could_not_run_is_reported_but_not_compared(workspace: Layout) -> None:
    failing = HuntTree(
        label="5.99.0",
        tree="5.99.0",
        setup="bf16-zero1",
        info=made.info("5.99.0"),
        stacked=(),
        seconds=2.0,
        error="rank 0 raised ImportError: tokenizers>=9",
    )
    result = document(workspace, "pinned")
    result = dataclasses.replace(result, trees=(*result.trees, failing))
    path = results.write(workspace.profiles, result, workspace.unsaved)

    text = report.render(results.read(path, HuntResult), "profiles/x.json")

    assert "Not measured: rank 0 raised ImportError" in text
    assert "| 5.99.0 |" in text
    assert "gone in 5.99.0" not in text


def test_a_site_a_case_carries_is_labelled_with_the_case_not_accepted() -> None:
    carried = (AllowRule("transformers/integrations/deepspeed.py", "c", code="t > 0"),)

    sites = summary.summarize(as_read(rank(0)), (ACCEPT_LOGGING,), carried)

    by_function = {s.site.function: s for s in sites}
    assert (by_function["<genexpr>"].carried, by_function["<genexpr>"].allowed) == ("c", None)
    assert by_function["_maybe_log_save_evaluate"].carried is None


def test_every_case_carries_sites_the_hunt_matches_by_its_rules() -> None:
    carried = known.carried_rules(cases.every(ROOT))

    assert {rule.reason for rule in carried} == set(cases.names(ROOT))


def test_setups_are_a_precision_and_a_zero_stage() -> None:
    setup = DeepSpeedSetup.parse("bf16-zero2")

    assert (setup.precision, setup.zero_stage, setup.label) == ("bf16", 2, "bf16-zero2")
    config = setup.config()
    assert (config["zero_optimization"]["stage"], config["bf16"]["enabled"]) == (2, True)
    assert DeepSpeedSetup.parse("fp16-zero1").config()["fp16"]["enabled"] is True
    with pytest.raises(WorkspaceError, match="PRECISION-zeroSTAGE"):
        DeepSpeedSetup.parse("fp8-zero1")


def test_cases_of_two_releases_are_not_stacked_on_one_tree(workspace: Layout) -> None:
    tree = Tree(
        "patched",
        TreeRole.PATCHED,
        workspace.root,
        "5.13.1",
        "",
        "a test",
        projects.get("transformers"),
    )

    # sp-loss pins transformers 5.13.1, trainer-nan-filter a 5.2x: refused before any download.
    with pytest.raises(WorkspaceError, match="trainer-nan-filter pin another project or release"):
        stacked(made.case_of(workspace), tree, [cases.load(ROOT, "trainer-nan-filter")])


def test_a_stack_of_the_same_project_without_the_patched_tree_is_refused(
    workspace: Layout,
) -> None:
    args = hunt_command.parser().parse_args(["--trees", "pinned", "--stack", "trainer-grad-norm"])
    case = cases.load(workspace.root, "trainer-nan-filter")
    stack = [cases.load(workspace.root, "trainer-grad-norm")]

    with pytest.raises(WorkspaceError, match="add patched to --trees"):
        check_stack(case, stack, hunt_command.settings_from(args))


def test_the_hunt_reads_every_card_once(workspace: Layout) -> None:
    """Its case, the cases it stacks and every case's carried sites: each card read once, up to
    the refusal of a stack without the patched tree (before anything is downloaded)."""
    args = ["--case", "trainer-nan-filter", "--trees", "pinned", "--stack", "trainer-grad-norm"]

    status, reads = made.card_reads(workspace, "hunt", *args)

    assert status == 2
    assert sorted(reads) == cases.names(workspace.root)


@pytest.mark.network
def test_two_series_of_one_release_stack_on_one_tree(workspace: Layout) -> None:
    names = ["trainer-nan-filter", "trainer-grad-norm"]

    tree = stack_trees(workspace, [cases.load(workspace.root, name) for name in names])[0]

    applied = git(tree.root, "log", "--format=%s", f"{cases.load(ROOT, names[0]).pin.tag}..HEAD")
    expected = [p for name in names for p in series(workspace.for_case(name))]
    assert len(applied.stdout.splitlines()) == len(expected)
    pinned = cases.load(ROOT, names[0]).pin.version
    assert tree.label == f"transformers-{pinned}+trainer-nan-filter+trainer-grad-norm"
    assert tree.role == TreeRole.PATCHED


@pytest.mark.network
def test_two_projects_pinned_at_one_version_stack_on_a_tree_each(workspace: Layout) -> None:
    """accelerate and TRL both at 1.16.0: neither tree replaces the other."""
    loaded = [
        cases.load(workspace.root, name) for name in ("accelerate-grad-norm", "trl-sft-metrics")
    ]
    assert len({case.pin.version for case in loaded}) == 1

    trees = stack_trees(workspace, loaded, fixes=False)

    assert [tree.label for tree in trees] == [
        f"{case.project.name}-{case.pin.version}" for case in loaded
    ]
    assert (trees[0].src / "accelerate").is_dir()
    assert (trees[1].src / "trl").is_dir()
