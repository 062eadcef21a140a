"""Review: refusing stale results in a real temporary workspace, `transformers env` on the real
pinned tree, and the drafts and bundle rendered from small hand-made results (test inputs: the
real ones come from `nox -s repro test_patch profile`)."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest

from hostsync import profiling, results, review, upstream
from hostsync.errors import WorkspaceError
from hostsync.layout import ROOT, Layout
from hostsync.pin import load as load_pin

FIX = "0001-Keep-the-loss-aggregation-on-the-device.patch"
TEST = "0002-Add-a-regression-test.patch"


def patch_text(subject: str, path: str, body: str) -> str:
    return (
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: A Contributor <contributor@example.com>\n"
        f"Subject: [PATCH] {subject}\n\n{body}\n---\n {path} | 1 +\n\n"
        f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-a\n+b\n"
    )


@pytest.fixture
def workspace(tmp_path: Path) -> Layout:
    """pin.toml, a two-patch series and the issue snippet: what the results depend on."""
    layout = Layout(tmp_path / "workspace")
    layout.patches.mkdir(parents=True)
    shutil.copy(ROOT / "pin.toml", layout.pin_file)
    (layout.root / "repro").mkdir()
    shutil.copy(ROOT / profiling.SNIPPET, layout.root / profiling.SNIPPET)
    body = "Stack the losses instead of reading them on the host,\none per rank.\n\nFixes #47068"
    (layout.patches / FIX).write_text(
        patch_text("Keep the loss aggregation on the device", "src/transformers/x.py", body)
    )
    (layout.patches / TEST).write_text(
        patch_text("Add a regression test", "tests/deepspeed/test_x.py", "The test.")
    )
    (layout.patches / "series").write_text(f"{FIX}\n{TEST}\n")
    return layout


# --- hand-made results (test inputs) -------------------------------------------------------------


def run(tree: str, sp_size: int, scenario: str, syncs: int) -> dict:
    masked = scenario == "all_masked"
    sites = [
        {"file": "transformers/integrations/deepspeed.py", "line": 741, "function": "<genexpr>",
         "code": "if good_tokens_per_rank[rank] > 0", "count": sp_size},
        {"file": "transformers/integrations/deepspeed.py", "line": 744,
         "function": "deepspeed_sp_compute_loss",
         "code": "loss = total_loss / max(total_good_tokens, 1)", "count": 1},
    ] if syncs else []  # fmt: skip
    failed = masked and syncs
    return {
        "tree": tree, "sp_size": sp_size, "world_size": sp_size, "backend": "gloo",
        "device": "cpu", "scenario": scenario, "host_syncs": syncs,
        "host_syncs_per_rank": [syncs] * sp_size, "sync_sites": sites, "forward_syncs": [],
        "loss": 0.0 if masked else 4.9, "loss_type": "float" if failed else "Tensor",
        "reference_loss": None if masked else 4.9, "loss_abs_diff": None if masked else 4.8e-07,
        "loss_ok": None if masked else True, "loss_is_graph_tensor": not failed,
        "backward_error": "every rank: AssertionError: loss must be a scalar tensor. More"
        if failed else None,
        "grads_ok": None if failed else True, "grad_max_abs_diff": None if failed else 3e-08,
    }  # fmt: skip


def repro_payload(trees: tuple[str, ...] = ("pinned", "patched", "5.14.0")) -> dict:
    runs = [
        run(tree, sp, scenario, sp + 1 if tree == "pinned" else 0)
        for tree in trees
        for sp in (2, 4)
        for scenario in ("all_tokens", "all_masked")
    ]
    described = {t: {"version": "5.14.0" if t == "5.14.0" else "5.13.1", "commit": "0" * 40,
                     "origin": "test", "src": f"work/trees/{t}/src"} for t in trees}  # fmt: skip
    return {
        "environment": {"device": "cpu", "world_sizes": [2, 4], "backend": "gloo"},
        "trees": described,
        "scenarios": {
            "all_tokens": "every rank has label tokens",
            "all_masked": "no rank has a label token",
        },
        "runs": runs,
    }


def patch_proof_payload(ok: bool = True) -> dict:
    def check(label: str, version: str, expected: str, failed: int) -> dict:
        tests = [{"test": "T::test_no_host_sync", "outcome": "failed" if failed else "passed",
                  "message": "AssertionError: 3 != 0" if failed else ""}]  # fmt: skip
        return {"check": "series tests", "label": label,
                "tree": {"version": version, "commit": "1" * 40, "origin": "test"},
                "expected": expected, "verdict": "ok", "reason": "",
                "counts": {"failed" if failed else "passed": 1}, "tests": tests}  # fmt: skip

    return {
        "reference": "5.14.0",
        "ok": ok,
        "checks": [
            check("pinned+tests", "5.13.1", "1 fail", 1),
            check("patched", "5.13.1", "all pass", 0),
            check("5.14.0+tests", "5.14.0", "all pass", 0),
        ],
    }


def profile_payload(layout: Layout) -> dict:
    step = {"range_ms": 12.5, "ops": dict.fromkeys(profiling.SYNC_OPS, 4),
            "ops_in_forward": dict.fromkeys(profiling.SYNC_OPS, 1), "cuda_calls": None,
            "dtoh_copies": None, "dtoh_bytes": None, "gpu_idle_ms": None,
            "timeline": {"forward_ms": [[0, 10]], "sync_ms": [1, 11, 11.1, 11.2],
                         "gpu_busy_ms": None, "dtoh_ms": None, "range_ms": 12.5}}  # fmt: skip
    capture = {"tree": "pinned", "version": "5.13.1", "commit": "0" * 40, "backend": "gloo",
               "world_size": 2, "device": "cpu", "profiler": "torch", "command": "python x",
               "wall_s": 1.0, "artifacts": [], "per_step": step}  # fmt: skip
    return {
        "scenario": "all_tokens", "sp_size": 2, "warmup_steps": 1, "steps": 2, "notes": [],
        "captures": [capture],
        "snippet": {"file": str(profiling.SNIPPET), "sha256": profiling.snippet_digest(layout),
                    "output": {"pinned": "transformers 5.13.1: 2 host syncs, loss 2.5000",
                               "patched": "transformers 5.13.1: 0 host syncs, loss 2.5000"}},
    }  # fmt: skip


def write_results(layout: Layout, **overrides: dict) -> dict[str, Path]:
    payloads = {"repro": repro_payload(), "test_patch": patch_proof_payload(),
                "profile": profile_payload(layout)} | overrides  # fmt: skip
    written = {kind: results.write(layout, kind, payload) for kind, payload in payloads.items()}
    folder = profiling.artifacts_dir(written["profile"])
    folder.mkdir()
    (folder / "summary.md").write_text("# summary\n")
    (folder / "timeline-gloo-ws2.png").write_bytes(b"\x89PNG test")
    return written


def drafting(
    layout: Layout, system_info: str = "- `transformers` version: 5.13.1"
) -> review.Drafting:
    sources = review.fresh_sources(layout, rerun=False)
    return review.Drafting(
        pin=load_pin(layout.pin_file),
        repro=sources["repro"],
        test_patch=sources["test_patch"],
        profile=sources["profile"],
        patches=review.read_patches(layout),
        snippet=(layout.root / profiling.SNIPPET).read_text(),
        system_info=system_info,
        handles=review.DEFAULT_HANDLES,
        handles_source=review.DEFAULT_HANDLES_SOURCE,
    )


# --- stale results -------------------------------------------------------------------------------


def test_a_changed_patch_makes_review_refuse_naming_the_results_and_the_change(
    workspace: Layout,
) -> None:
    written = write_results(workspace)
    review.fresh_sources(workspace, rerun=False)  # fresh: accepted

    fix = workspace.patches / FIX
    fix.write_text(fix.read_text().replace("+b\n", "+c\n"))

    with pytest.raises(WorkspaceError) as refused:
        review.review(workspace)
    message = str(refused.value)
    assert "\n" not in message
    for path in written.values():
        assert path.name in message
    assert f"patches/{FIX} changed" in message
    assert "nox -s repro test_patch profile" in message and "--rerun" in message
    assert not workspace.issue_drafts.exists()


def test_a_changed_snippet_makes_only_the_profile_stale(workspace: Layout) -> None:
    written = write_results(workspace)
    snippet = workspace.root / profiling.SNIPPET
    snippet.write_text(snippet.read_text() + "\n# edited\n")

    with pytest.raises(WorkspaceError, match=f"{written['profile'].name}") as refused:
        review.fresh_sources(workspace, rerun=False)
    assert written["repro"].name not in str(refused.value)
    assert "nox -s profile`" in str(refused.value)


def test_a_missing_result_names_the_session_to_run(workspace: Layout) -> None:
    results.write(workspace, "repro", repro_payload())
    with pytest.raises(
        WorkspaceError, match="no test_patch result in profiles/: run `nox -s test_patch`"
    ):
        review.fresh_sources(workspace, rerun=False)


# --- the drafts ----------------------------------------------------------------------------------


def test_drafts_follow_the_templates_and_cite_a_result_file_under_every_table(
    workspace: Layout,
) -> None:
    written = write_results(workspace)
    d = drafting(workspace)
    issue, pr = review.render_issue(d), review.render_pr(d)

    for heading in ("### System Info", "### Who can help?", "### Information", "### Tasks",
                    "### Reproduction", "### Expected behavior"):  # fmt: skip
        assert heading in issue
    assert "- [x] My own modified scripts" in issue
    assert (
        "if good_tokens_per_rank[rank] > 0" in issue and "3 at sp_size 2, 5 at sp_size 4" in issue
    )
    assert "transformers 5.13.1: 2 host syncs" in issue
    assert d.snippet.strip() in issue
    assert "returns a Python `float`" in issue
    for text in (issue, pr):
        blocks = text.split("\n\n")
        tables = [i for i, block in enumerate(blocks) if block.startswith("| ")]
        assert tables
        for i in tables:  # every table is followed by the file its figures come from
            assert blocks[i + 1].startswith("<sub>Source: `profiles/reference/"), blocks[i]
    for path in written.values():
        assert f"profiles/reference/{path.name}" in pr

    assert "Fixes #47068" in pr and pr.count("Fixes #47068") == 1
    assert "Stack the losses instead of reading them on the host, one per rank." in pr
    assert "- [ ] I confirm that this is not a pure code agent PR." in pr
    assert "Left unticked on purpose" in pr
    assert "- [x] Was this discussed/approved via a Github issue" in pr
    assert "- [x] Did you write any new necessary tests?" in pr
    assert "- [ ] Did you make sure to update the documentation" in pr
    assert "Not ready" not in pr
    assert "| pinned | 5.13.1 | 3 | 5 |" in pr and "| patched | 5.13.1 | 0 | 0 |" in pr
    assert "`pinned+tests` `T::test_no_host_sync`: AssertionError: 3 != 0" in pr
    assert str(ROOT) not in issue + pr


def test_the_pr_says_it_is_not_ready_when_nothing_was_patched(workspace: Layout) -> None:
    (workspace.patches / "series").write_text("")
    write_results(workspace, repro=repro_payload(("pinned", "5.14.0")),
                  test_patch=patch_proof_payload(ok=False))  # fmt: skip

    pr = review.render_pr(drafting(workspace))

    assert "> **Not ready:** patches/series is empty" in pr
    assert "> **Not ready:** `test_patch` has wrong verdicts" in pr
    assert "> **Not ready:** the reproducer did not run on a patched tree" in pr
    assert "- [ ] Did you write any new necessary tests?" in pr


def test_the_same_results_give_byte_identical_drafts_and_bundle(workspace: Layout) -> None:
    write_results(workspace)
    first = drafting(workspace)
    review.refresh_reference(workspace, first)
    drafts = {"issue.md": review.render_issue(first), "pr.md": review.render_pr(first)}
    bundle = review.bundle(workspace, first, drafts).read_bytes()

    again = drafting(workspace)
    assert review.render_issue(again) == drafts["issue.md"]
    assert review.render_pr(again) == drafts["pr.md"]
    assert review.refresh_reference(workspace, again) == []
    assert review.bundle(workspace, again, drafts).read_bytes() == bundle

    (png,) = review.copy_timeline(workspace, again)
    assert png == workspace.issue_drafts / "timeline-gloo-ws2.png" and png.exists()

    with tarfile.open(workspace.issue_drafts / "review-bundle.tar.gz") as archive:
        names = archive.getnames()
    stem = first.profile.path.stem
    assert {"review-bundle/issue.md", "review-bundle/pr.md", "review-bundle/patches/series",
            f"review-bundle/patches/{FIX}", f"review-bundle/patches/{TEST}",
            f"review-bundle/results/{first.repro.path.name}",
            f"review-bundle/results/{stem}/timeline-gloo-ws2.png"} <= set(names)  # fmt: skip


def test_the_reference_set_follows_the_cited_results_and_drops_older_ones(
    workspace: Layout,
) -> None:
    write_results(workspace)
    older = drafting(workspace)
    review.refresh_reference(workspace, older)
    write_results(workspace)  # newer results, in a later file each
    newer = drafting(workspace)

    changes = review.refresh_reference(workspace, newer)

    reference = workspace.profiles / review.REFERENCE
    names = sorted(p.name for p in reference.iterdir())
    assert names == sorted([newer.repro.path.name, newer.test_patch.path.name,
                            newer.profile.path.name, newer.profile.path.stem])  # fmt: skip
    assert f"dropped {older.repro.path.name}" in changes
    assert not list(reference.rglob("*.trace.json.gz"))


def test_who_to_tag_comes_from_the_tree_template_when_it_has_one(tmp_path: Path) -> None:
    assert review.handles(tmp_path) == (review.DEFAULT_HANDLES, review.DEFAULT_HANDLES_SOURCE)

    template = tmp_path / ".github" / "ISSUE_TEMPLATE" / "bug-report.yml"
    template.parent.mkdir(parents=True)
    template.write_text(
        "        Library:\n          - generate: @someone\n"
        "          - trainer: @trainer-person\n"
        "        Integrations:\n          - deepspeed: HF Trainer/Accelerate: @ds-person\n"
    )
    found, source = review.handles(tmp_path)
    assert found == ("@trainer-person", "@ds-person")
    assert "bug-report.yml" in source


def test_system_info_is_transformers_env_of_the_pinned_tree_with_the_setup_filled_in() -> None:
    pinned = upstream.tree(Layout(), "pinned")

    info = review.system_info(pinned, repro_payload())

    assert f"- `transformers` version: {load_pin().transformers.version}" in info
    assert ("- Using distributed or parallel set-up in script?: yes: torchrun, 2/4 processes"
            " (gloo)") in info  # fmt: skip
    assert "<fill in>" not in info
    assert json.dumps(info)  # plain text, one line per item
