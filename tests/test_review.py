"""Review: drafts filled from result files in a real temporary workspace, refusing stale ones,
byte-stable, touching nothing tracked unless asked. The results are small hand-made ones (test
inputs: the real ones come from `nox -s repro test_patch profile`)."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import subprocess
from pathlib import Path

import pytest

from hostsync.detector.records import Cost, DeviceWork, SiteCost
from hostsync.detector.sites import DEVICE_COPY, Site, SiteCount
from hostsync.drafting import drafts, review
from hostsync.drafting.claims import check_claims
from hostsync.drafting.lines import check_lines
from hostsync.history.records import BisectResult
from hostsync.measure.records import (
    CostComparison,
    FixAssessment,
    FixVerdict,
    MergedSite,
    Outcome,
    ScenarioRow,
    TestOutcome,
    Verdict,
)
from hostsync.profiling.records import ProfileResult
from hostsync.workspace import cases, results
from hostsync.workspace.cases import load as load_case
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import ROOT, Layout

import made

TEMPLATE = """\
Host reads per step on transformers {{repro:trees.pinned.version}}: \
{{repro:runs[tree=pinned,ranks=2].host_syncs}} at {{repro:runs[tree=pinned,ranks=2].ranks}} ranks, \
{{repro:runs[tree=pinned,ranks=4].host_syncs}} at {{repro:runs[tree=pinned,ranks=4].ranks}}; \
with the fix {{repro:runs[tree=patched].host_syncs|max}}.

Red on the release: {{test_patch:checks[label=pinned+tests].tests[outcome=failed].message}}
```
{{repro:snippet.output.pinned}}
```
"""


def write_results(layout: Layout, *passing: str) -> dict[str, Path]:
    """One result of each kind; `passing`: tests of the series that pass without the fix."""
    runs = (made.row("pinned", 2, 3), made.row("pinned", 4, 5), made.row("patched", 2, 0))
    repro = made.repro(layout, runs, {"pinned": "transformers 5.13.1: 2 host syncs"})
    kept = (TestOutcome(test, Outcome.PASSED) for test in passing)
    red = made.check("pinned+tests", Verdict.OK, made.failed("AssertionError: 3 != 0"), *kept)
    written = {
        result.KIND: results.write(layout.profiles, result, layout.unsaved)
        for result in (
            repro,
            made.test_patch(layout, red),
            made.profile(layout, made.capture("pinned", 3)),
        )
    }
    folder = results.attachments(written["profile"])
    folder.mkdir()
    (folder / "summary.md").write_text("# summary\n")
    return written


def draft(layout: Layout, text: str, name: str = "issue.md") -> None:
    templates = layout.root / "cases" / layout.case
    for old in templates.glob("*.md"):
        old.unlink()
    templates.mkdir(exist_ok=True)
    (templates / name).write_text(text)


@pytest.fixture
def drafted(workspace: Layout) -> Layout:
    draft(workspace, TEMPLATE)
    write_results(workspace)
    return workspace


def test_review_reads_its_case_card_once(drafted: Layout) -> None:
    status, reads = made.card_reads(drafted, "review", "--case", "sp-loss")

    assert status == 0
    assert reads == ["sp-loss"]


def test_drafts_are_filled_from_the_results(drafted: Layout) -> None:
    (path,) = review.review(made.case_of(drafted))

    assert path == drafted.root / "issue_drafts" / "sp-loss" / "issue.md"
    assert path.read_text() == (
        "Host reads per step on transformers 5.13.1: 3 at 2 ranks, 5 at 4; with the fix 0.\n\n"
        "Red on the release: AssertionError: 3 != 0\n"
        "```\ntransformers 5.13.1: 2 host syncs\n```\n"
    )


@pytest.mark.parametrize(
    ("template", "name", "refusal"),
    [
        (
            "GPU idle: {{profile:captures.per_step.gpu_idle_ms}}\n",
            "issue.md",
            "cites profile figures no result holds: run `nox -s profile -- --case sp-loss`",
        ),
        (
            "Since {{bisect:sites[project=transformers].first}}.\n",
            "issue.md",
            "cites bisect figures no result holds: run `nox -s bisect -- --case sp-loss`",
        ),
        (
            "Measured on Linux-6.18.44-fc-x86_64-with-glibc2.36.\n",
            "issue.md",
            "gives the platform 'Linux-6.18.44-fc-x86_64-with-glibc2.36', the machine",
        ),
        ("With the fix, 3 fewer reads.\n", "issue.md", r"types 1 figure by hand \(3\)"),
        ("Run `nox -s repro` to see it.\n", "issue.md", "a word of this workspace"),
        (
            "As #47073 did, and #12345.\n",
            "issue.md",
            r"issue.md cites #12345, which the card's \[\[upstream.threads\]\] lacks: read",
        ),
        ("{{repro:trees.pinned.version}}\n\n" * 16, "comment.md", "over the 30 of a comment"),
        ("```python\n" + "pass\n" * 31 + "```\n", "issue.md", "code block of 31 lines"),
        ("Fine.\n", "notes.md", "name a draft template after what it drafts"),
    ],
)
def test_a_draft_upstream_should_not_get_is_refused_before_anything_is_written(
    drafted: Layout, template: str, name: str, refusal: str
) -> None:
    draft(drafted, template, name)

    with pytest.raises(WorkspaceError, match=refusal):
        review.review(made.case_of(drafted))

    assert not drafted.issue_drafts.exists()


def test_a_draft_says_what_a_thread_does_with_its_cards_line(drafted: Layout) -> None:
    draft(drafted, "Fixed by #47073, which {{case:upstream.threads[number=47073].does}}.\n")
    case = made.case_of(drafted)
    (thread,) = [thread for thread in case.upstream.threads if thread.number == 47073]

    (path,) = review.review(case)

    assert " ".join(path.read_text().split()) == f"Fixed by #47073, which {thread.does}."


def test_filled_paragraphs_are_rewrapped_and_nothing_else_is() -> None:
    verbatim = "```\nkeep\nthis\n```\n| a | b |\n| - | - |\n<!-- note\nkept -->\n"
    text = (
        "---\nname: Bug\nabout: a\n---\n\nA line\nthat was short.\n\n- an item\n  continued\n"
        + verbatim
        + "word " * 30
        + "\n"
        + drafts.TEMPLATE_MARK
        + "\nthe\nproject's\n"
    )

    assert drafts.reflow(text) == (
        "---\nname: Bug\nabout: a\n---\n\nA line that was short.\n\n- an item continued\n"
        + verbatim
        + ("word " * 20).strip()
        + "\n"
        + ("word " * 10).strip()
        + "\n"
        + drafts.TEMPLATE_MARK
        + "\nthe\nproject's\n"
    )


def test_the_same_results_give_byte_identical_drafts(drafted: Layout) -> None:
    (first,) = review.review(made.case_of(drafted))
    text = first.read_bytes()
    (second,) = review.review(made.case_of(drafted))

    assert second.read_bytes() == text


def test_a_new_test_that_passes_without_the_fix_is_refused_unless_the_card_names_it_a_guard(
    workspace: Layout,
) -> None:
    """A test that passes on the release without the fix proves nothing, unless it guards
    behaviour the fix keeps and the card says which; a guard that fails there is no guard. The
    card's `[upstream]` is outside the results' digest: naming one stales nothing."""
    draft(workspace, TEMPLATE)
    write_results(workspace, "T::test_keeps_the_mean")

    with pytest.raises(WorkspaceError, match=r"T::test_keeps_the_mean passes without the fix"):
        review.review(made.case_of(workspace))
    guard = '\n[[upstream.guards]]\ntest = "{}"\nkeeps = "the mean of the ranks"\n'
    with workspace.case_file.open("a") as card:
        card.write(guard.format("T::test_keeps_the_mean"))
    assert review.review(made.case_of(workspace))
    with workspace.case_file.open("a") as card:
        card.write(guard.format("T::test_sync"))
    with pytest.raises(
        WorkspaceError, match=r"T::test_sync fails without the fix .* red_on_pinned"
    ):
        review.review(made.case_of(workspace))


def test_a_changed_patch_makes_review_refuse_naming_the_results_and_the_change(
    drafted: Layout,
) -> None:
    patch = sorted(drafted.patches.glob("0001-*.patch"))[0]
    patch.write_text(patch.read_text() + "\n")

    with pytest.raises(WorkspaceError) as refused:
        review.review(made.case_of(drafted))

    said = str(refused.value)
    assert f"patches/sp-loss/{patch.name} changed" in said
    assert "nox -s repro test_patch profile -- --case sp-loss" in said


def test_a_changed_case_script_makes_the_results_stale(drafted: Layout) -> None:
    """The snippet an issue quotes, or what the ranks run: results made with another are old."""
    case = load_case(drafted.root, drafted.case)
    snippet = drafted.repro / case.card.repro.snippet
    snippet.write_text(snippet.read_text() + "# changed\n")

    with pytest.raises(WorkspaceError) as refused:
        review.review(made.case_of(drafted))

    said = str(refused.value)
    assert said.count("repro/sp-loss/issue_snippet.py changed") == len(review.KINDS)


def test_a_fresh_clone_drafts_from_the_committed_reference_set_and_says_so(
    drafted: Layout, caplog: pytest.LogCaptureFixture
) -> None:
    reference = drafted.profiles / review.REFERENCE
    reference.mkdir()
    for path in list(drafted.profiles.iterdir()):
        if path != reference:
            path.rename(reference / path.name)

    with caplog.at_level(logging.INFO, logger=review.__name__):
        (path,) = review.review(made.case_of(drafted), refresh=True)

    assert path.read_text().startswith("Host reads per step on transformers 5.13.1: 3 at 2 ranks")
    assert "profiles/sp-loss/ holds no result of its own: citing the committed reference set" in (
        caplog.text
    )
    assert "dropped" not in caplog.text and "added" not in caplog.text, "the set is left as is"


def test_with_no_result_anywhere_review_names_the_session_to_run(workspace: Layout) -> None:
    with pytest.raises(WorkspaceError, match=r"run `nox -s repro -- --case sp-loss` first"):
        review.review(made.case_of(workspace))


def test_the_reference_set_changes_only_when_asked(drafted: Layout) -> None:
    reference = drafted.profiles / review.REFERENCE

    review.review(made.case_of(drafted))
    assert not reference.exists()

    review.review(made.case_of(drafted), refresh=True)
    cited = {results.latest(drafted.profiles, kind).name for kind in review.KINDS}
    folder = results.attachments(results.latest(drafted.profiles, ProfileResult)).name
    assert {p.name for p in reference.iterdir()} == cited | {folder}


def test_a_refused_draft_leaves_the_reference_as_it_was(drafted: Layout) -> None:
    draft(drafted, TEMPLATE + "A line.\n\n" * 40)

    with pytest.raises(WorkspaceError, match="lines besides its code, over the"):
        review.review(made.case_of(drafted), refresh=True)
    assert not (drafted.profiles / review.REFERENCE).exists()


@pytest.mark.parametrize("case", cases.names(ROOT))
def test_every_committed_draft_passes_its_checks_on_the_committed_reference_set(
    case: str, workspace: Layout
) -> None:
    """What a fresh clone drafts: a template that outgrows its limit or cites a figure the
    committed results lack fails here, not in a contributor's hands."""
    reference = Path("profiles", case, review.REFERENCE)
    shutil.copytree(ROOT / reference, workspace.root / reference)

    written = review.review(load_case(workspace.root, case))

    assert written and {path.stem for path in written} <= set(drafts.LIMITS)


@pytest.mark.parametrize("case", cases.names(ROOT))
def test_the_committed_templates_use_only_known_sources_and_reducers(case: str) -> None:
    """Every placeholder of every committed template parses and names a known source."""
    layout = Layout(ROOT, case)
    for template in review.templates(layout):
        found = list(review.PLACEHOLDER.finditer(template.read_text()))
        assert found, f"{template.name} cites no result"
        for match in found:
            assert match["source"] in review.SOURCES, (template.name, match[0])
            reduce = match["reduce"] or "first"
            assert reduce in review.REDUCERS or reduce.isdecimal(), (template.name, match[0])
            review.segments(match["path"].strip())


@pytest.mark.parametrize("case", cases.names(ROOT))
def test_every_thread_a_committed_card_or_template_cites_is_in_its_table(case: str) -> None:
    """What upstream is told of a thread was read in the record: every `#N` of the card and of
    its templates, and every thread a template queries, is in the card's `[[upstream.threads]]`."""
    card = load_case(ROOT, case)
    known = {"case": card.card.to_json()}
    for path in (cases.card_path(ROOT, case), *review.templates(Layout(ROOT, case))):
        text = path.read_text()
        cited = {int(number) for number in drafts.THREAD.findall(text)}
        assert cited <= card.upstream.cited, (path.name, sorted(cited - card.upstream.cited))
        for match in review.PLACEHOLDER.finditer(text):
            if match["source"] == "case" and "threads" in match["path"]:
                assert review.figure(match, known) != drafts.NOT_MEASURED, (path.name, match[0])


def test_a_number_reducer_cites_that_value_of_the_matching_ones() -> None:
    sites = {"sites": [{"first": "0.16.0"}, {"first": "0.22.0"}, {"first": "0.16.1"}]}
    filled = review.fill("{{bisect:sites.first|2}} {{bisect:sites.first|4}}", {"bisect": sites})

    assert filled == f"0.22.0 {drafts.NOT_MEASURED}"


def test_a_site_is_found_by_how_its_code_starts_where_its_line_moves() -> None:
    """A patch moves the log's read from line 2257 to 2259: its code names it in both trees."""
    sites = [
        {"tree": "pinned", "line": 2257, "code": "tr_loss_scalar = nested_gather(tr_loss)"},
        {"tree": "patched", "line": 2259, "code": "tr_loss_scalar = nested_gather(tr_loss)"},
        {"tree": "patched", "line": 2266, "code": "logs['grad_norm'] = grad_norm.item()"},
    ]
    template = "{{repro:sites[tree=patched,code^=tr_loss_scalar].line|join}}"

    assert review.fill(template, {"repro": {"sites": sites}}) == "2259"


def test_a_mean_per_step_is_cited_to_the_hundredth_and_a_whole_one_as_a_whole_number() -> None:
    verdicts = {"verdicts": [{"kernels": [299.0, 279.0]}, {"kernels": [311.75, 0.125]}]}
    template = " ".join(f"{{{{repro:verdicts.kernels|{n}}}}}" for n in ("first", "2", "3", "last"))

    assert review.fill(template, {"repro": verdicts}) == "299 279 311.75 0.12"


CLIP = Site("pkg/utils.py", 233, "is_invalid", "return bool(norm < 0)")
MASK = Site("pkg/utils.py", 888, "mask_nan", "input.masked_fill_(inf_or_nan, err)")
COPY = Site("pkg/utils.py", 887, "mask_nan", "err = torch.tensor(-1.0, device=device)")


def accounted(tree: str, *ranks: tuple[SiteCost, ...]) -> ScenarioRow:
    """A two-step run whose ranks accounted for `ranks`' sites (a site listed once per step),
    its site list saying which wait each is (MASK: none)."""
    costs = tuple(Cost(2, 0, 0, DeviceWork(), sites) for sites in ranks)
    kinds = {CLIP: ("scalar_read",), COPY: (DEVICE_COPY,)}
    listed = tuple(
        MergedSite(SiteCount(site, 1, kinds[site]), (1,) * len(ranks))
        for site in dict.fromkeys(cost.site for sites in ranks for cost in sites)
        if site in kinds
    )
    return ScenarioRow(tree, "clip.py", len(ranks), "zero1", costs=costs, site_lists={"s": listed})


def test_what_a_fix_leaves_and_where_its_waits_stall_are_listed_from_the_accounting(
    workspace: Layout,
) -> None:
    """`sites` is each run's sites, every rank's figures per step; `reads`, `copies`, `waits`
    and `stalls` list them, the most waited first, a figure the ranks disagree on as its range;
    a read is never counted as a copy, nor a wait of unknown kind as either."""
    pinned = accounted("pinned", (SiteCost(CLIP, 6, 4, DeviceWork(30)),))
    waited = (SiteCost(MASK, 1, 1, DeviceWork(12, 1)), SiteCost(MASK, 1, 1, DeviceWork(12, 1)))
    patched = accounted(
        "patched",
        (SiteCost(CLIP, 2, 0, DeviceWork()), SiteCost(COPY, 4, 2, DeviceWork(3)), *waited),
        (SiteCost(CLIP, 2, 0, DeviceWork()), SiteCost(MASK, 4, 4, DeviceWork(52, 2))),
    )
    result = made.repro(workspace, (pinned, patched))
    found = {"repro": review.Source("repro", Path("repro.json"), result).data}

    def filled(template: str) -> str:
        return review.fill(template, found)

    assert filled("{{repro:sites[tree=patched,function=is_invalid]|reads}}") == (
        "`pkg/utils.py:233` `is_invalid` (1 read)"
    )
    assert filled("{{repro:sites[tree=patched,line=887]|copies}}") == (
        "`pkg/utils.py:887` `mask_nan` (0 to 2 copies)"
    )
    assert filled("{{repro:sites[tree=patched,scenario=zero1]|waits}}") == (
        "`pkg/utils.py:887` `mask_nan` (0 to 2 copies); `pkg/utils.py:888` `mask_nan` (1 to 2"
        " syncs); `pkg/utils.py:233` `is_invalid` (1 read)"
    )
    assert filled("{{repro:sites[tree=patched,file=pkg/utils.py].reads|sum}}") == "2"
    assert filled("{{repro:sites[tree=patched,line=887].waits|sum}}") == "2"
    assert filled("{{repro:sites[tree=patched,line=888].reads|sum}}") == drafts.NOT_MEASURED
    with pytest.raises(WorkspaceError, match=r"`pkg/utils.py:888` is not known to hold reads"):
        filled("{{repro:sites[tree=patched]|reads}}")
    assert filled("{{repro:sites[tree=patched,line=888]|stalls}}") == (
        "`pkg/utils.py:888` `mask_nan` (1 to 2 syncs, waiting for 12 to 26 kernels in all,"
        " 1 collective among them)"
    )
    assert filled("{{repro:sites[tree=pinned,function=is_invalid]|stalls}}") == (
        "`pkg/utils.py:233` `is_invalid` (3 reads, 2 of them waiting for 15 kernels in all)"
    )
    assert filled("{{repro:sites[tree=patched,function=is_invalid]|stalls}}") == (
        "`pkg/utils.py:233` `is_invalid` (1 read, none stalls)"
    )
    assert filled("{{repro:sites[tree=patched,line=888].waited_for.kernels|max}}") == "26"
    assert filled("{{repro:sites[tree=patched].line|count}}") == "3"
    assert filled("{{repro:sites[tree=fixed]|reads}}") == drafts.NOT_MEASURED
    with pytest.raises(WorkspaceError, match="`reads`, `copies`, `waits` and `stalls` list sites"):
        filled("{{repro:runs.tree|reads}}")


def test_a_verdict_s_waits_are_never_cited_as_reads(drafted: Layout) -> None:
    """Counts say what they count: a verdict's `reads` are reads and copies together."""
    draft(drafted, "Reads: {{repro:verdicts[scenario=zero1].judgement.reads|first}}.\n")

    with pytest.raises(WorkspaceError, match=r"a verdict's `reads` count reads and copies"):
        review.review(load_case(drafted.root, drafted.case))


def judged(verdict: FixVerdict, before: float, after: float, spread: float) -> CostComparison:
    """A scenario's fix judged: 4 stalls per step fewer, idle time per step `before` -> `after`."""
    figures = dict.fromkeys(("reads", "stalls", "kernels", "bytes", "flops"), (8.0, 4.0))
    judgement = FixAssessment(verdict, **figures, bound="", reason="", idle_us=(before, after))
    judgement = dataclasses.replace(judgement, idle_spread_us=spread)
    return CostComparison("step.py", 2, "zero1", "pinned", "patched", judgement)


LABEL = "(host time, measured on CPU)"


def test_a_figure_stands_with_its_verdict() -> None:
    """An idle time is cited only beside the verdict it belongs to, labelled; one inside its
    spread is never a change; where stalls drop but the windows do not shrink, the wait moves."""
    moves = [judged(FixVerdict.MOVES_WAIT, 1076.7, 833.4, 906.3)]
    saves = [judged(FixVerdict.SAVES_IDLE, 6866.6, 3990.2, 1589.3)]

    check_claims("issue.md", "Four stalls fewer: the wait moves to the next read.", moves, False)
    with pytest.raises(WorkspaceError, match=r"issue.md: the stalls drop .* say that the wait"):
        check_claims("issue.md", "Four stalls fewer per step.", moves, False)
    within = "The wait moves. Idle time: 1076.7 us, then 833.4 us."
    with pytest.raises(WorkspaceError, match=r"cites 1076.7 us, an idle time inside its spread"):
        check_claims("issue.md", within, moves, False)
    beside = f"The fix saves idle time: 6866.6 us, then 3990.2 us per step {LABEL}."
    check_claims("pr.md", beside, saves, False)
    with pytest.raises(WorkspaceError, match=r"cites 3990.2 us away from its verdict"):
        check_claims("pr.md", f"The fix saves idle time. It idles 3990.2 us {LABEL}.", saves, False)
    with pytest.raises(WorkspaceError, match=r"cites 6866.6 us away from its verdict"):
        check_claims("pr.md", "The fix saves idle time: 6866.6 us before.", saves, False)


RELEASES = {
    ("deepspeed", "0.19.8"): {"deepspeed/runtime/utils.py": f"a = 1\n\n{COPY.code}\n"},
    ("accelerate", "1.16.0"): {"src/accelerate/utils/operations.py": "x = 1\nt.to(device)\n"},
}


def release(project: str, version: str) -> dict[str, str]:
    return RELEASES[project, version]


def test_a_line_a_draft_cites_is_a_line_of_the_release_it_names() -> None:
    """Every `file:line` is read in the release the draft names beside it: a patched tree's
    line, another release's, a blank one or one of no named release is refused."""
    sites = [Site("deepspeed/runtime/utils.py", 3, "f", COPY.code)]
    good = "In DeepSpeed 0.19.8, `deepspeed/runtime/utils.py:3` copies; `utils.py:1` assigns."
    check_lines("issue.md", good, "deepspeed", release, sites)
    patched = [Site("deepspeed/runtime/utils.py", 1, "f", COPY.code)]
    with pytest.raises(WorkspaceError, match=r"cites `utils.py:1` for `err = .*`, but that line"):
        check_lines("pr.md", "DeepSpeed 0.19.8: `utils.py:1`.", "deepspeed", release, patched)
    with pytest.raises(WorkspaceError, match=r"`utils.py:2`, which holds no code in deepspeed"):
        check_lines("pr.md", "DeepSpeed 0.19.8: `utils.py:2`.", "deepspeed", release, ())
    unnamed = "The copy is at `accelerate/utils/operations.py:2`."
    with pytest.raises(WorkspaceError, match="names no accelerate release"):
        check_lines("c.md", unnamed, "transformers", release, ())
    check_lines("c.md", "accelerate 1.16.0: " + unnamed, "transformers", release, ())


def test_a_draft_that_a_rerun_s_wider_figures_would_push_over_its_length_is_refused(
    drafted: Layout,
) -> None:
    """A draft's shape must not hang on run-to-run noise: it fits with every figure wider."""
    item = "- " + "x" * 96 + " {{repro:runs[tree=pinned,ranks=2].host_syncs}}"  # 100 wide
    draft(drafted, "\n".join([item] * drafts.LIMITS["issue"]) + "\n")

    with pytest.raises(WorkspaceError, match=r"issue\.md has 80 lines besides its code with every"):
        review.review(load_case(drafted.root, drafted.case))


def test_running_review_twice_leaves_git_status_clean(drafted: Layout) -> None:
    subprocess.run(["git", "init", "-q", str(drafted.root)], check=True)
    subprocess.run(["git", "-C", str(drafted.root), "add", "-A"], check=True)
    before = subprocess.run(
        ["git", "-C", str(drafted.root), "status", "--porcelain"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout

    review.review(made.case_of(drafted))
    review.review(made.case_of(drafted))

    after = subprocess.run(
        ["git", "-C", str(drafted.root), "status", "--porcelain"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    new = set(after.splitlines()) - set(before.splitlines())
    assert all("issue_drafts/" in line for line in new), new


def test_a_bisect_is_cited_where_the_case_has_one(workspace: Layout) -> None:
    """Optional: a case without one still drafts, its figures not measured."""
    write_results(workspace)
    case = load_case(workspace.root, workspace.case)
    template = "Since {{bisect:sites[project=transformers].first}}."

    before = review.documents(workspace, case, review.latest_sources(workspace, case))
    results.write(workspace.profiles, made.bisect(workspace, first="5.0.0"), workspace.unsaved)
    sources = review.latest_sources(workspace, case)

    assert review.fill(template, before) == "Since not measured."
    assert isinstance(sources["bisect"].result, BisectResult)
    assert review.fill(template, review.documents(workspace, case, sources)) == "Since 5.0.0."


TRAINING_ARGS = """
@dataclass
class TrainingArguments:
    logging_steps: float = field(default=500, metadata={"help": "..."})
    logging_nan_inf_filter: bool = field(default=True)
    include_num_input_tokens_seen: str | bool = "no"
"""


def test_a_scenario_s_settings_are_rendered_beside_the_defaults_they_differ_from() -> None:
    """Scope is derived: a run's settings that differ from the release's `TrainingArguments`
    defaults, each beside its default; none typed into the draft."""
    source = {"src/transformers/training_args.py": TRAINING_ARGS}
    found = {
        "repro": {
            "runs": [{"scenario": "nan", "logging_steps": 1, "logging_nan_inf_filter": True}]
        },
        review.DEFAULTS: {review.TRAINER_ARGUMENTS: review.trainer_defaults(source, "5.24.0")},
    }

    assert review.fill("{{repro:runs[scenario=nan]|settings}}", found) == (
        "`logging_steps=1` (the default is 500)"
    )
    found["repro"]["runs"][0]["logging_steps"] = 500
    assert review.fill("{{repro:runs[scenario=nan]|settings}}", found) == "the Trainer's defaults"
    with pytest.raises(WorkspaceError, match="has no TrainingArguments"):
        review.trainer_defaults({}, "5.24.0")


def test_a_patched_tree_s_site_is_cited_at_the_pinned_release_s_line(workspace: Layout) -> None:
    """A draft names releases, not its own trees: a statement the patch moved is cited at its
    line in the pinned release, one the patch added at the patched tree's."""
    moved = Site(CLIP.file, CLIP.line + 10, CLIP.function, CLIP.code)
    added = Site(CLIP.file, 250, "to_inf", "return torch.where(norm >= 0, norm, inf)")
    pinned = accounted("pinned", (SiteCost(CLIP, 2, 2, DeviceWork(3)),))
    patched = accounted(
        "patched", (SiteCost(moved, 2, 0, DeviceWork()), SiteCost(added, 2, 0, DeviceWork()))
    )
    result = made.repro(workspace, (pinned, patched))
    found = {"repro": review.Source("repro", Path("repro.json"), result).data}

    assert review.fill("{{repro:sites[tree=patched]|stalls}}", found) == (
        "`pkg/utils.py:233` `is_invalid` (1 sync, none stalls);"
        " `pkg/utils.py:250` `to_inf` (1 sync, none stalls)"
    )


def with_callers(layout: Layout, table: str) -> None:
    """The workspace's card with one `[[upstream.callers]]` table more (no result goes stale)."""
    card = cases.card_path(layout.root, layout.case)
    card.write_text(card.read_text() + "\n[[upstream.callers]]\n" + table)


def test_a_draft_names_the_callers_the_release_holds_not_typed_ones(drafted: Layout) -> None:
    """Who calls the changed function is read in the release (its own project's files cited
    by their shortest unique path), and every line cited is checked there like any other."""
    with_callers(drafted, 'function = "Trainer.compute_loss"\nprojects = ["transformers"]\n')
    draft(
        drafted, TEMPLATE + "`compute_loss` is called {{callers:'Trainer.compute_loss'|callers}}.\n"
    )

    (path,) = review.review(made.case_of(drafted))

    assert path.read_text().endswith(
        "`compute_loss` is called in transformers 5.13.1 at `trainer.py:1915` (`training_step`)"
        " and\n`trainer.py:2982` (`prediction_step`).\n"
    )


@pytest.mark.parametrize(
    ("table", "refusal"),
    [
        (
            'function = "Trainer.compute_loss"\nprojects = ["transformers"]\n'
            'without = ["num_items_in_batch"]\n',
            r"transformers 5.13.1's `transformers/trainer.py:1915` passes num_items_in_batch to"
            r" Trainer.compute_loss, which cases/sp-loss.toml's \[\[upstream.callers\]\] says no"
            " caller passes",
        ),
        (
            'function = "Trainer.compute_los"\nprojects = ["transformers"]\n',
            "names Trainer.compute_los, which transformers 5.13.1 does not define",
        ),
        (
            'function = "Trainer.compute_loss"\nprojects = ["trl"]\n',
            "searches trl, which the repro did not run beside",
        ),
    ],
)
def test_a_card_s_callers_the_release_contradicts_are_refused(
    drafted: Layout, table: str, refusal: str
) -> None:
    """What the card says of the callers is checked in the release: an argument it says no
    caller passes, a function the release lacks, a project the repro did not run beside."""
    with_callers(drafted, table)

    with pytest.raises(WorkspaceError, match=refusal):
        review.review(made.case_of(drafted))


def test_calls_are_said_by_release_the_unsure_only_without_a_sure_one() -> None:
    call = {"file": "pkg/a.py", "function": "A.step", "sure": True}
    unsure = call | {"line": 20, "function": "loop", "sure": False}
    releases = [
        {"project": "deepspeed", "version": "0.19.8", "calls": [call | {"line": 3}, unsure]},
        {"project": "accelerate", "version": "1.16.0", "calls": [unsure]},
        {"project": "trl", "version": "1.16.0", "calls": []},
    ]

    assert review.fill("{{callers:f|callers}}", {"callers": {"f": releases}}) == (
        "in deepspeed 0.19.8 at `pkg/a.py:3` (`step`); in accelerate 1.16.0 maybe at"
        " `pkg/a.py:20` (`loop`), on a receiver of unknown class; in trl 1.16.0 nowhere"
    )
