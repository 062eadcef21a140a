"""`python -m hostsync review`: the issue and PR drafts and a bundle to attach, from result files.

The drafts are filled only from the latest `repro`, `test_patch` and `profile` results, each
named next to the figures it gave. Results measured against another pin.toml or patch series
(or, for `profile`, another `repro/issue_snippet.py`, whose output the issue quotes) are stale:
`review` names them and refuses, or reruns their commands with `--rerun`.

It writes `issue_drafts/issue.md` (transformers' bug-report template), `issue_drafts/pr.md` (its
PR template) and `issue_drafts/review-bundle.tar.gz` (drafts, results, profile summary and
timeline, patch series), and makes `profiles/reference/` hold exactly the results the drafts
cite, so that they can be committed together. Nothing depends on when `review` runs: the same
results give byte-identical drafts and bundle.
"""

from __future__ import annotations

import argparse
import email
import gzip
import io
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hostsync import profiling, results, table, upstream
from hostsync.errors import WorkspaceError, last_line
from hostsync.layout import Layout
from hostsync.pin import Pin
from hostsync.pin import load as load_pin

log = logging.getLogger(__name__)

# The result kinds the drafts are made of; each is written by the nox session of that name.
KINDS = ("repro", "test_patch", "profile")
REFERENCE = "reference"
BUNDLE = "review-bundle"
# Who to tag when the tree carries no .github/ to read it from (a PyPI sdist does not).
DEFAULT_HANDLES = ("@SunMarc",)
DEFAULT_HANDLES_SOURCE = (
    "the `trainer` entry of transformers' .github/PULL_REQUEST_TEMPLATE.md on GitHub; the pinned"
    " tree is a PyPI sdist, which has no .github/ to check it against: confirm before posting"
)
TEMPLATE_TOPICS = re.compile(r"^\s*-\s*(?:deepspeed|trainer)\b[^:]*:(.*)$", re.IGNORECASE)


@dataclass(frozen=True)
class Source:
    """One result file the drafts cite."""

    kind: str
    path: Path
    data: dict

    @property
    def cited(self) -> str:
        """Where the drafts say it lies: the committed reference set."""
        return f"profiles/{REFERENCE}/{self.path.name}"

    def line(self) -> str:
        return (
            f"<sub>Source: `{self.cited}` ({self.data['created']}, `{self.data['command']}`).</sub>"
        )


@dataclass(frozen=True)
class Patch:
    name: str
    subject: str
    body: str
    files: tuple[str, ...]
    tests_only: bool


@dataclass(frozen=True)
class Drafting:
    """Everything the drafts are made of, gathered before any text is written."""

    pin: Pin
    repro: Source
    test_patch: Source
    profile: Source
    patches: tuple[Patch, ...]
    snippet: str
    system_info: str
    handles: tuple[str, ...]
    handles_source: str


# --- the results, fresh --------------------------------------------------------------------------


def latest_sources(layout: Layout) -> dict[str, Source]:
    found = {}
    for kind in KINDS:
        path = results.latest(layout, kind)
        if path is None:
            raise WorkspaceError(f"no {kind} result in profiles/: run `nox -s {kind}` first")
        found[kind] = Source(kind, path, json.loads(path.read_text()))
    return found


def stale(layout: Layout, sources: dict[str, Source]) -> dict[str, list[str]]:
    """Each stale source's reasons: pin or series changed; for profile, also the snippet."""
    found = {}
    for kind, source in sources.items():
        reasons = results.stale_reasons(layout, source.data)
        if kind == "profile" and source.data["snippet"]["sha256"] != profiling.snippet_digest(
            layout
        ):
            reasons.append(f"{profiling.SNIPPET} changed")
        if reasons:
            found[kind] = reasons
    return found


def fresh_sources(layout: Layout, rerun: bool) -> dict[str, Source]:
    """The latest results, refused when stale, or first rerun with the commands that made them."""
    sources = latest_sources(layout)
    outdated = stale(layout, sources)
    if outdated and rerun:
        for kind in outdated:
            rerun_command(sources[kind])
        sources = latest_sources(layout)
        outdated = stale(layout, sources)
    if outdated:
        said = "; ".join(
            f"profiles/{sources[kind].path.name} ({', '.join(reasons)})"
            for kind, reasons in outdated.items()
        )
        sessions = " ".join(outdated)
        raise WorkspaceError(
            f"stale results: {said}: rerun `nox -s {sessions}`, or `nox -s review -- --rerun`"
        )
    return sources


def rerun_command(source: Source) -> None:
    """Run the command recorded in `source` again, as its own process so that the new result
    records that command (a failure shows in its output and leaves the result stale)."""
    argv = shlex.split(source.data["command"])[3:]  # after `python -m hostsync`
    log.info("rerunning stale %s: python -m hostsync %s", source.path.name, shlex.join(argv))
    status = subprocess.run([sys.executable, "-m", "hostsync", *argv]).returncode
    if status != 0:
        log.warning("`python -m hostsync %s` exited with status %d", shlex.join(argv), status)


# --- what else the drafts need -------------------------------------------------------------------


def read_patches(layout: Layout) -> tuple[Patch, ...]:
    """Each patch of the series: its subject, the message body, the files it changes."""
    found = []
    for path in results.series(layout):
        text = path.read_text()
        message = email.message_from_string(text)
        body = str(message.get_payload()).split("\n---\n", 1)[0].strip()
        subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", " ".join(str(message["Subject"]).split()))
        files = tuple(upstream.touched_files(path))
        found.append(Patch(path.name, subject, body, files, upstream.touches_only_tests(path)))
    return tuple(found)


def system_info(tree: upstream.Tree, repro: dict) -> str:
    """`transformers env` of the pinned tree, its `<fill in>` answered from the repro run."""
    # The function `transformers env` runs; the CLI entry point would also import its chat
    # command's dependencies, which a training environment does not need.
    command = [sys.executable, "-c", "from transformers.cli.system import env; env()"]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(tree.src)),
    )
    if done.returncode != 0:
        raise WorkspaceError(
            f"`transformers env` failed on the pinned tree: {last_line(done.stderr)}"
        )
    setup = repro["environment"]
    answers = {
        "Using distributed or parallel set-up in script?": (
            f"yes: torchrun, {'/'.join(map(str, setup['world_sizes']))} processes"
            f" ({setup['backend']}), DeepSpeed Ulysses sequence parallelism, one SP group"
        ),
        "Using GPU in script?": "yes" if setup["device"] != "cpu" else "no",
    }
    lines = [line for line in done.stdout.splitlines() if line.startswith("- ")]
    return "\n".join(_answer(line, answers) for line in lines)


def _answer(line: str, answers: dict[str, str]) -> str:
    question = line[2:].split(": ", 1)[0]
    return f"- {question}: {answers[question]}" if question in answers else line


def handles(tree_root: Path) -> tuple[tuple[str, ...], str]:
    """Who to tag for the Trainer's DeepSpeed integration, and where that comes from."""
    template = tree_root / ".github" / "ISSUE_TEMPLATE" / "bug-report.yml"
    if template.exists():
        lines = [
            m[1] for line in template.read_text().splitlines() if (m := TEMPLATE_TOPICS.match(line))
        ]
        found = tuple(dict.fromkeys(re.findall(r"@[\w-]+", " ".join(lines))))[:2]
        if found:
            return (
                found,
                "the pinned tree's .github/ISSUE_TEMPLATE/bug-report.yml (trainer, deepspeed)",
            )
    return DEFAULT_HANDLES, DEFAULT_HANDLES_SOURCE


def gather(layout: Layout, rerun: bool) -> Drafting:
    sources = fresh_sources(layout, rerun)
    pinned = upstream.tree(layout, "pinned")
    found, source = handles(pinned.root)
    return Drafting(
        pin=load_pin(layout.pin_file),
        repro=sources["repro"],
        test_patch=sources["test_patch"],
        profile=sources["profile"],
        patches=read_patches(layout),
        snippet=(layout.root / profiling.SNIPPET).read_text(),
        system_info=system_info(pinned, sources["repro"].data),
        handles=found,
        handles_source=source,
    )


# --- the figures, as tables ----------------------------------------------------------------------


def runs_of(repro: dict, tree: str) -> list[dict]:
    return [run for run in repro["runs"] if run["tree"] == tree]


def sp_sizes(repro: dict) -> list[int]:
    return sorted({run["sp_size"] for run in repro["runs"]})


def span(values: Iterable[object]) -> str:
    """One value when all agree, else `low-high`."""
    distinct = sorted(set(values), key=lambda v: (v is None, v))
    return str(distinct[0]) if len(distinct) == 1 else f"{distinct[0]}-{distinct[-1]}"


def syncs_by_sp(repro: dict, trees: Sequence[str] | None = None) -> str:
    """Per tree: host syncs per rank per loss call by sp_size, loss and gradient agreement."""
    sizes = sp_sizes(repro)
    headers = ["tree", "transformers", *(f"host syncs/step, sp_size {n}" for n in sizes)]
    headers += ["loss = single-process reference", "backward and gradients"]
    rows = []
    for tree, described in repro["trees"].items():
        if trees is not None and tree not in trees:
            continue
        runs = runs_of(repro, tree)
        cells = [span(r["host_syncs"] for r in runs if r["sp_size"] == n) for n in sizes]
        rows.append([tree, described["version"], *cells, loss_cell(runs), grads_cell(runs)])
    return table.markdown(headers, rows)


def loss_cell(runs: list[dict]) -> str:
    defined = [r for r in runs if r["loss_ok"] is not None]
    agreeing = sum(r["loss_ok"] for r in defined)
    worst = max((r["loss_abs_diff"] for r in defined), default=None)
    text = f"{agreeing}/{len(defined)} runs (max diff {worst:.2g})"
    undefined = sorted({r["scenario"] for r in runs if r["loss_ok"] is None})
    return text + (f"; undefined in {', '.join(undefined)}" if undefined else "")


def grads_cell(runs: list[dict]) -> str:
    ok = sum(r["grads_ok"] is True for r in runs)
    failed = sorted(
        {
            f"{r['scenario']} ({first_sentence(r['backward_error'])})"
            for r in runs
            if r["backward_error"]
        }
    )
    text = f"{ok}/{len(runs)} runs match"
    return text + (f"; backward raised in {'; '.join(failed)}" if failed else "")


def first_sentence(text: str) -> str:
    return text.split(". ", 1)[0]


def unwrap(message: str) -> str:
    """A commit message's hard-wrapped paragraphs as single lines: GitHub keeps line breaks."""
    paragraphs = message.split("\n\n")
    keep = ("- ", "* ", "    ", "```")
    return "\n\n".join(
        p if any(line.startswith(keep) for line in p.splitlines()) else " ".join(p.split("\n"))
        for p in paragraphs
    )


def backward_findings(repro: dict, tree: str) -> list[str]:
    """The scenarios where `tree`'s loss could not be backpropagated, in words."""
    failed = {}
    for run in runs_of(repro, tree):
        if run["backward_error"]:
            failed.setdefault(run["scenario"], run)
    return [
        f"In scenario `{name}` ({repro['scenarios'][name]}) the function returns a Python"
        f" `{run['loss_type']}` ({run['loss']}), and `engine.backward` raises on"
        f" {first_sentence(run['backward_error'])}."
        for name, run in failed.items()
    ]


def sync_sites(repro: dict, tree: str) -> str:
    """Each line of `tree` that reads a device value, with its reads per rank per call."""
    sizes = sp_sizes(repro)
    counts: dict[tuple, dict[int, int]] = {}
    for run in runs_of(repro, tree):
        for site in run["sync_sites"]:
            key = (site["file"], site["line"], site["function"], site["code"])
            by_size = counts.setdefault(key, {})
            by_size[run["sp_size"]] = max(by_size.get(run["sp_size"], 0), site["count"])
    headers = ["line", "code", *(f"reads/step, sp_size {n}" for n in sizes)]
    rows = [
        [f"`{file}:{line}`", f"`{code}`", *(by_size.get(n, 0) for n in sizes)]
        for (file, line, _, code), by_size in sorted(counts.items())
    ]
    return table.markdown(headers, rows)


def profile_table(profile: dict) -> str:
    headers, rows = profiling.summary_table(profile)
    return table.markdown(headers, rows)


def tests_table(test_patch: dict) -> str:
    headers = ["check", "tree", "passed", "failed", "skipped", "expected", "verdict"]
    rows = [
        [
            check["check"],
            f"{check['label']} ({check['tree']['version']})" if check["tree"] else check["label"],
            check["counts"].get("passed", 0),
            check["counts"].get("failed", 0) + check["counts"].get("error", 0),
            check["counts"].get("skipped", 0),
            check["expected"],
            check["verdict"],
        ]
        for check in test_patch["checks"]
    ]
    return table.markdown(headers, rows)


def failures(test_patch: dict) -> list[str]:
    return [
        f"- `{check['label']}` `{test['test']}`: {test['message']}"
        for check in test_patch["checks"]
        for test in check["tests"]
        if test["outcome"] in ("failed", "error")
    ]


def not_applicable(test_patch: dict) -> list[str]:
    return [
        f"- {check['check']} on `{check['label']}`: {check['reason']}"
        for check in test_patch["checks"]
        if check["verdict"] == "n/a"
    ]


def snippet_outputs(profile: dict, trees: Sequence[str]) -> str:
    """What `repro/issue_snippet.py` printed on each of `trees`, as the profile run recorded it."""
    outputs = profile["snippet"]["output"]
    return "\n".join(f"# {tree}\n{outputs[tree]}" for tree in trees if tree in outputs)


def timeline(profile: Source) -> str | None:
    """The timeline PNG of the profile, as the reference set holds it."""
    folder = profiling.artifacts_dir(profile.path)
    pngs = sorted(folder.glob("timeline-*.png"))
    return f"profiles/{REFERENCE}/{folder.name}/{pngs[0].name}" if pngs else None


# --- the drafts ----------------------------------------------------------------------------------


def header(d: Drafting) -> str:
    cited = ", ".join(f"`{s.cited}`" for s in (d.repro, d.test_patch, d.profile))
    return (
        f"<!-- Draft written by `nox -s review` from {cited}. Upstream: issue"
        f" #{d.pin.issue}, fixed by PR #{d.pin.pull_request} in transformers"
        f" {d.pin.reference.version}. Read it through and make it yours before posting. -->"
    )


def checkbox(ticked: bool, text: str) -> str:
    return f"- [{'x' if ticked else ' '}] {text}"


def headline(d: Drafting) -> str:
    """The measured syncs of the pinned tree, by sp_size, in words."""
    pinned = runs_of(d.repro.data, "pinned")
    per_size = [
        f"{span(r['host_syncs'] for r in pinned if r['sp_size'] == n)} at sp_size {n}"
        for n in sp_sizes(d.repro.data)
    ]
    return ", ".join(per_size)


def render_issue(d: Drafting) -> str:
    repro, profile = d.repro.data, d.profile.data
    version = d.pin.transformers.version
    lines = [
        header(d),
        "",
        "### System Info",
        "",
        f"Output of `transformers env` (transformers {version}):",
        "",
        "```",
        d.system_info,
        "```",
        "",
        "### Who can help?",
        "",
        f"{' '.join(d.handles)}",
        "",
        f"<!-- From {d.handles_source}. -->",
        "",
        "### Information",
        "",
        checkbox(False, "The official example scripts"),
        checkbox(True, "My own modified scripts"),
        "",
        "### Tasks",
        "",
        checkbox(
            False, "An officially supported task in the `examples` folder (such as GLUE/SQuAD, ...)"
        ),
        checkbox(True, "My own task or dataset (give details below)"),
        "",
        "### Reproduction",
        "",
        'Under DeepSpeed Ulysses sequence parallelism (`sp_backend="deepspeed"`,'
        " `sp_size > 1`), `deepspeed_sp_compute_loss` in"
        " `src/transformers/integrations/deepspeed.py` combines the per-rank losses with Python"
        " control flow on device tensors. Each such read copies a value to the host and waits"
        " for the device, so the stream stalls on every training step, while the loss itself"
        " matches a single-process run (below). Host reads per rank per step on transformers"
        f" {version}: {headline(d)}.",
        "",
        "A minimal snippet (one process, CPU or one GPU) that calls the function and counts"
        " the reads:",
        "",
        "```python",
        d.snippet.rstrip(),
        "```",
        "",
        "Its output (recorded by `nox -s profile`):",
        "",
        "```",
        snippet_outputs(profile, ["pinned"]),
        "```",
        "",
        d.profile.line(),
        "",
        f"The lines, counted on real SP ranks (torchrun, {repro['environment']['backend']},"
        " real DeepSpeed Ulysses groups, a tiny Llama built from a config):",
        "",
        sync_sites(repro, "pinned"),
        "",
        d.repro.line(),
        "",
        "Every scenario (host syncs per rank per loss call; loss against a single-process"
        " run over the whole sequence; gradients after `engine.backward`):",
        "",
        syncs_by_sp(repro, ["pinned"]),
        "",
        d.repro.line(),
        "",
        *(f"{finding}\n" for finding in backward_findings(repro, "pinned")),
        "The full multi-rank reproducer is one command in the workspace these drafts come"
        " from: `nox -s repro`.",
        "",
        "### Expected behavior",
        "",
        "The loss aggregation stays on the device (e.g. `torch.stack` the gathered losses and"
        " token counts, mask ranks without label tokens with `torch.where`, divide by"
        " `clamp(min=1)` of the token total): no host sync per step, the same token-weighted"
        " mean, and a loss tensor that backpropagates even when no rank has a label token.",
        "",
    ]
    return "\n".join(lines)


def render_pr(d: Drafting) -> str:
    repro, test_patch, profile = d.repro.data, d.test_patch.data, d.profile.data
    fixes = [p for p in d.patches if not p.tests_only]
    tests = [p for p in d.patches if p.tests_only]
    png = timeline(d.profile)
    lines = [header(d), ""]
    lines += readiness(d)
    lines += ["# What does this PR do?", ""]
    for patch in fixes:
        body = re.sub(r"\n*^Fixes #\d+\s*$", "", patch.body, flags=re.MULTILINE).strip()
        lines += [f"**{patch.subject}**", "", unwrap(body), ""]
    lines += [f"Fixes #{d.pin.issue}", ""]
    lines += [
        "## Before / after",
        "",
        "Host syncs per rank per loss call, by sp_size, on real DeepSpeed Ulysses groups"
        f" ({repro['environment']['backend']}, {repro['environment']['device']}):",
        "",
        syncs_by_sp(repro),
        "",
        d.repro.line(),
        "",
        f"Profile, {profiling.setting(profile)}:",
        "",
        profile_table(profile),
        "",
        d.profile.line(),
        "",
        *profiling.caveats(profile),
        "The issue's snippet on each tree:",
        "",
        "```",
        snippet_outputs(profile, list(profile["snippet"]["output"])),
        "```",
        "",
        d.profile.line(),
        "",
    ]
    if png:
        lines += [f"![compute_loss timeline, before above after]({png})", ""]
        lines += [
            f"<!-- GitHub shows only uploaded images: drag issue_drafts/{Path(png).name} here"
            " in place of the link. -->",
            "",
        ]
    lines += [
        "## Tests",
        "",
        *(f"- `{name}` ({p.subject})" for p in tests for name in p.files),
        "",
        tests_table(test_patch),
        "",
        d.test_patch.line(),
        "",
    ]
    red = failures(test_patch)
    lines += (
        ["Failing assertions (expected where the tree has the bug):", "", *red, ""] if red else []
    )
    skipped = not_applicable(test_patch)
    lines += ["Not run:", "", *skipped, ""] if skipped else []
    lines += code_agent_policy() + before_submitting(d, tests) + who_can_review(d)
    return "\n".join(lines)


def readiness(d: Drafting) -> list[str]:
    """What a reader must know before trusting the drafts: no patch, a wrong verdict."""
    problems = []
    if not d.patches:
        problems.append("patches/series is empty: there is no change to propose yet")
    if not d.test_patch.data["ok"]:
        problems.append(f"`test_patch` has wrong verdicts (see Tests and `{d.test_patch.cited}`)")
    if "patched" not in d.repro.data["trees"]:
        problems.append("the reproducer did not run on a patched tree")
    return [f"> **Not ready:** {problem}." for problem in problems] + [""] * bool(problems)


def code_agent_policy() -> list[str]:
    return [
        "## Code Agent Policy",
        "",
        checkbox(False, "I confirm that this is not a pure code agent PR."),
        "",
        "<!-- Left unticked on purpose: only the person submitting can confirm it. The policy"
        " also asks for a description written by that person: rewrite the text above in your"
        " own words. -->",
        "",
    ]


def before_submitting(d: Drafting, tests: Sequence[Patch]) -> list[str]:
    docs = any(name.startswith("docs/") for p in d.patches for name in p.files)
    tests_green = bool(tests) and d.test_patch.data["ok"]
    return [
        "## Before submitting",
        "",
        checkbox(
            False,
            "This PR fixes a typo or improves the docs (you can dismiss the other"
            " checks if that's the case).",
        ),
        checkbox(
            False,
            "Did you read the [contributor guideline]"
            "(https://huggingface.co/docs/transformers/contributing) and the"
            " [Pull Request](https://huggingface.co/docs/transformers/pr_checks) checks?"
            " <!-- the submitter's to tick -->",
        ),
        checkbox(
            True,
            "Was this discussed/approved via a Github issue or the"
            f" [forum](https://discuss.huggingface.co/)? #{d.pin.issue}",
        ),
        checkbox(
            docs,
            "Did you make sure to update the documentation with your changes?"
            + ("" if docs else " <!-- the series changes no docs/ file -->"),
        ),
        checkbox(
            tests_green,
            "Did you write any new necessary tests?"
            + (
                f" <!-- {', '.join(n for p in tests for n in p.files)}: red on the pinned"
                " release, green with the fix; see Tests -->"
                if tests_green
                else ""
            ),
        ),
        "",
    ]


def who_can_review(d: Drafting) -> list[str]:
    return [
        "## Who can review?",
        "",
        f"{' '.join(d.handles)}",
        "",
        f"<!-- From {d.handles_source}. -->",
        "",
    ]


# --- writing -------------------------------------------------------------------------------------


def refresh_reference(layout: Layout, d: Drafting) -> list[str]:
    """Make profiles/reference/ hold exactly what the drafts cite (no raw traces); say what
    changed."""
    reference = layout.profiles / REFERENCE
    reference.mkdir(parents=True, exist_ok=True)
    sources = (d.repro, d.test_patch, d.profile)
    folder = profiling.artifacts_dir(d.profile.path)
    kept = [folder / "summary.md", *sorted(folder.glob("timeline-*.png"))]
    wanted = {s.path.name for s in sources} | {folder.name}
    changes = []
    for entry in sorted(reference.iterdir()):
        if entry.name not in wanted:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            changes.append(f"dropped {entry.name}")
    for source in sources:
        if not (reference / source.path.name).exists():
            shutil.copyfile(source.path, reference / source.path.name)
            changes.append(f"added {source.path.name}")
    (reference / folder.name).mkdir(exist_ok=True)
    for path in kept:
        if path.exists():
            shutil.copyfile(path, reference / folder.name / path.name)
    return changes


def bundle(layout: Layout, d: Drafting, drafts: dict[str, str]) -> Path:
    """A tar.gz to attach: the drafts, the cited results and profile summary, the patch series.
    Fixed times and owners: the same inputs give the same bytes."""
    reference = layout.profiles / REFERENCE
    members: list[tuple[str, bytes]] = [(name, text.encode()) for name, text in drafts.items()]
    for path in sorted(reference.rglob("*")):
        if path.is_file():
            members.append((f"results/{path.relative_to(reference)}", path.read_bytes()))
    series_file = layout.patches / "series"
    for path in [series_file] * series_file.exists() + results.series(layout):
        members.append((f"patches/{path.name}", path.read_bytes()))
    layout.issue_drafts.mkdir(parents=True, exist_ok=True)
    target = layout.issue_drafts / f"{BUNDLE}.tar.gz"
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as archive,
    ):
        for name, data in members:
            info = tarfile.TarInfo(f"{BUNDLE}/{name}")
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    target.write_bytes(buffer.getvalue())
    return target


def review(layout: Layout, rerun: bool = False) -> list[Path]:
    d = gather(layout, rerun)
    for change in refresh_reference(layout, d):
        log.info("profiles/%s: %s", REFERENCE, change)
    drafts = {"issue.md": render_issue(d), "pr.md": render_pr(d)}
    bundled = bundle(layout, d, drafts)
    for name, text in drafts.items():
        (layout.issue_drafts / name).write_text(text)
    return [*(layout.issue_drafts / name for name in drafts), *copy_timeline(layout, d), bundled]


def copy_timeline(layout: Layout, d: Drafting) -> list[Path]:
    """The profile's timeline beside the drafts, ready to drag into the PR (none left over from
    an earlier profile)."""
    for old in layout.issue_drafts.glob("timeline-*.png"):
        old.unlink()
    pngs = sorted(profiling.artifacts_dir(d.profile.path).glob("timeline-*.png"))
    for png in pngs:
        shutil.copyfile(png, layout.issue_drafts / png.name)
    return [layout.issue_drafts / png.name for png in pngs]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hostsync review",
        description="Write the issue and PR drafts and the review bundle into issue_drafts/,"
        " from the latest repro, test_patch and profile results only.",
    )
    parser.add_argument(
        "--rerun",
        action="store_true",
        help="rerun the commands of stale results (pin.toml or patches/ changed) first",
    )
    args = parser.parse_args(argv)
    layout = Layout()
    for path in review(layout, rerun=args.rerun):
        print(f"wrote {path.relative_to(layout.root)}")
    return 0
