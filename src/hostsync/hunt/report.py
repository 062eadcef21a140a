"""The hunt's report: trees compared site by site, each tree's candidates, carried and accepted
sites, and the reads only the profiler saw, as Markdown (and a short table for the console)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hostsync.detector.records import Cost
from hostsync.measure.cost import BOUND, assess
from hostsync.workspace import results, table
from hostsync.workspace.layout import Layout
from hostsync.workspace.records import HuntResult, HuntSite, HuntTree


@dataclass
class SiteAcross:
    """One site from one caller (matched on `HuntSite.key`) and where each tree has it; `first`
    is the site as the first tree holding it has it (its package and verdict)."""

    first: HuntSite
    trees: dict[str, HuntSite] = field(default_factory=dict)
    change: str = ""


def compare(trees: Sequence[HuntTree]) -> list[SiteAcross]:
    """Every site of any tree, with each tree's line and cost there (absent where it has none).

    `change` says how the later trees differ from the first: "gone in X", "new in X".
    """
    labels = [tree.label for tree in trees]
    rows: dict[tuple[str, str, str, str], SiteAcross] = {}
    for tree in trees:
        for hunted in tree.sites:
            rows.setdefault(hunted.key, SiteAcross(hunted)).trees[tree.label] = hunted
    for row in rows.values():
        present = [label for label in labels if label in row.trees]
        if labels[0] in present:
            gone = [label for label in labels if label not in present]
            row.change = f"gone in {', '.join(gone)}" if gone else ""
        else:
            row.change = f"new in {', '.join(present)}"
    return sorted(
        rows.values(),
        key=lambda r: (
            r.change == "",
            r.first.allowed is not None,
            -max(s.rate for s in r.trees.values()),
            r.first.site.file,
            r.first.site.function,
        ),
    )


# --- one-line readings ---------------------------------------------------------------------------

# (pattern on the code line, why it syncs; the tensor-side alternative where one is obvious).
_READINGS = (
    (
        r"\b(max|min)\(",
        "Python `max`/`min` compares a tensor with a number on the host;"
        " `tensor.clamp(min=...)` stays on the device",
    ),
    (
        r"\.item\(\)",
        "`.item()` copies the value to the host; if it is only logged or summed later, keep"
        " the tensor and read it once when it is logged",
    ),
    (
        r"^\s*(if|elif|while|assert)\b|\b(and|or|not)\b|\bbool\(",
        "a Python truth test of a tensor waits for its value; to choose between values,"
        " `torch.where` keeps it on the device",
    ),
    (r"\b(int|float)\(", "`int()`/`float()` of a tensor copies it to the host"),
    (r"\.shape\b|!=|==|<|>", "a comparison with a tensor operand is read on the host"),
)
_KIND_READINGS = {
    "tolist": "`.tolist()` copies the tensor to the host",
    "cpu": "`.cpu()` copies a device tensor to the host and waits for it",
    "numpy": "`.numpy()` needs the tensor on the host",
    "nonzero": "the output size depends on the data, so the host waits for the count",
    "masked_select": "the output size depends on the data; `torch.where` keeps the shape fixed",
    "unique": "the output size depends on the data",
    "repeat_interleave": "without `output_size=` the host must read the repeats",
    "bool_index": "a boolean mask index has a data-dependent size; `torch.where`/`masked_fill`"
    " keep the shape fixed",
}


def reading(hunted: HuntSite) -> str:
    """Why this line syncs, from its kind and code; the obvious alternative where there is one."""
    for kind in hunted.kinds:
        if kind in _KIND_READINGS:
            return _KIND_READINGS[kind]
    for pattern, text in _READINGS:
        if re.search(pattern, hunted.site.code):
            return text
    return "reads a tensor value on the host"


# --- the Markdown --------------------------------------------------------------------------------


def render(result: HuntResult, source: str) -> str:
    """The Markdown report of one hunt result; `source` names the JSON it was made from."""
    trees = result.measured
    labels = [tree.label for tree in trees]
    out = [
        *_header(result, source),
        "## Trees",
        "",
        table.markdown(
            ("tree", "release", "origin", "commit", "stacked", "hunt run (s)", "result"),
            [
                (
                    tree.label,
                    tree.info.version,
                    tree.info.origin,
                    tree.info.commit[:12],
                    ", ".join(tree.stacked) or "-",
                    tree.seconds,
                    tree.error or "measured",
                )
                for tree in result.trees
            ],
        ),
        "",
        "## Sites compared across trees",
        "",
        "Each cell: line, most syncs per step on one rank, when. Sites are matched on file,"
        " function and code line; *change* is relative to the first tree.",
        "",
        table.markdown(
            ("package", "file", "function", *labels, "change", "verdict", "code"),
            [
                (
                    row.first.package,
                    row.first.site.file,
                    _function(row),
                    *_cells(row, labels),
                    _change(row),
                    _verdict(row),
                    f"`{row.first.site.code}`",
                )
                for row in compare(trees)
            ],
        ),
        "",
        "## Stalls and device work",
        "",
        f"Per rank and step after the warm-up; *verdict* against the first tree ({BOUND}).",
        "",
        table.markdown(COST_COLUMNS, cost_rows(trees)),
    ]
    for tree in result.trees:
        out += _tree_section(tree) if tree.measured else _failed_section(tree)
    return "\n".join(out) + "\n"


def _header(result: HuntResult, source: str) -> list[str]:
    setup = result.setup
    plan = next(plan for plan in (tree.plan for tree in result.measured) if plan is not None)
    versions = ", ".join(f"{name} {version}" for name, version in setup.versions.items())
    return [
        "# Host syncs in a full DeepSpeed Ulysses SP training step (Trainer)",
        "",
        f"> Generated by `python -m hostsync hunt` from `{source}` ({result.stamp.created})."
        " `hunt.md` beside it is regenerated from the newest hunt result on every run; each"
        " result keeps its own copy beside it as `hunt-<stamp>.md`.",
        "",
        "**What ran.** For each tree and DeepSpeed setup below (*bf16-zero2*: bf16 mixed"
        " precision, ZeRO stage 2; what users run is bf16, fp32 is a labelled variant):"
        f" `accelerate launch` on {setup.world_size} ranks forming one Ulysses"
        f" sequence-parallel group (sp_size {setup.sp_size}, sdpa attention), gradient"
        " clipping at the Trainer's default max_grad_norm 1.0, and `Trainer.train()` on a tiny"
        f" `LlamaForCausalLM` built from a config ({setup.model}), logging every"
        f" {plan.logging_steps} steps. Steps 1 to {plan.steps} ran under"
        " `hostsync.detector`, each from fetching its batch to the end of its logging: a"
        " `TorchDispatchMode` that records every op reading a device value on the host"
        " (`.item()`, `bool(t)`, `max(t, 1)`, `nonzero`, boolean masks, ...) with the Python"
        " line that caused it, plus `.tolist()`, `.cpu()` and `.numpy()`. Step 1 is the"
        f" warm-up. Step {plan.profile} ran under the PyTorch profiler instead, which also"
        f" sees reads made inside C++ kernels; it is compared with step {plan.twin}, in the"
        " same phase of the logging and data-refill cycles. No evaluation runs: the Trainer"
        " adapts only its training data loader to Ulysses SP.",
        "",
        f"**On.** {setup.device} ({setup.backend}); {versions}. Command: `{result.stamp.command}`.",
        "",
        "**Rerun.** `nox -s hunt`, or `python -m hostsync hunt --case NAME --trees"
        " pinned,patched --release VERSION --setups bf16-zero1,fp32-zero1 --stack CASE"
        " --steps N`.",
        "",
        "**Reading the tables.** *per step*: the most syncs one rank made at the site in one"
        " step; *when*: every step after the warm-up, logging steps only, some steps (the SP"
        " data loader refills every sp_size steps), or the warm-up only. The detector treats"
        " every tensor as a device tensor, so on CPU it also counts reads of tensors that stay"
        " on the host in a GPU run; `hunt_allowlist.toml` accepts those, and the syncs that are"
        " there by design, each with its reason. A site a case's fix removes is *carried* (its"
        " card's `[[carries]]`). A read inside a shared helper is listed once per caller"
        " (*from*): each caller is judged on its own.",
        "",
    ]


def _cells(row: SiteAcross, labels: list[str]) -> list[str]:
    cells = []
    for label in labels:
        hunted = row.trees.get(label)
        cells.append(
            "-" if hunted is None else f"{hunted.site.line}: {hunted.per_step}x, {hunted.when}"
        )
    return cells


def _change(row: SiteAcross) -> str:
    return row.change or ("accepted" if row.first.allowed else "")


def _function(row: SiteAcross) -> str:
    function, caller = row.first.site.function, row.first.caller
    return f"{function} (from {caller})" if caller else function


def _verdict(row: SiteAcross) -> str:
    """Where the site stands: carried by a case, accepted (why), or a candidate."""
    if row.first.carried:
        return f"carried by case {row.first.carried}"
    return f"accepted: {row.first.allowed}" if row.first.allowed else "candidate"


def _site(hunted: HuntSite) -> str:
    site = hunted.site
    called = f", called from `{hunted.caller}`" if hunted.caller else ""
    return f"{site.file}:{site.line} `{site.function}`{called}"


def _failed_section(tree: HuntTree) -> list[str]:
    return ["", f"## {tree.label}", "", f"Not measured: {tree.error}"]


def _sites_table(sites: list[HuntSite], heading: str, why: list[str | None]) -> str:
    """Sites set apart from the candidates, with what sets them apart last."""
    return table.markdown(
        ("package", "site", "when", "per step", heading),
        [
            (site.package, _site(site), site.when, site.per_step, reason)
            for site, reason in zip(sites, why, strict=True)
        ],
    )


def _tree_section(tree: HuntTree) -> list[str]:
    carried = [site for site in tree.sites if site.carried]
    accepted = [site for site in tree.sites if site.allowed is not None]
    candidates = [site for site in tree.sites if site not in carried + accepted]
    checks = "; ".join(
        f"rank {check.rank}: {check.profiler} vs {check.detector}" for check in tree.cross_check
    )
    return [
        "",
        f"## {tree.label}",
        "",
        f"### Candidates, most syncs per step first ({len(candidates)})",
        "",
        table.markdown(
            ("#", "package", "site", "when", "per step", "code", "reading"),
            [
                (
                    number,
                    site.package,
                    _site(site),
                    site.when,
                    site.per_step,
                    f"`{site.site.code}`",
                    reading(site),
                )
                for number, site in enumerate(candidates, start=1)
            ],
        ),
        "",
        f"### Carried by a case ({len(carried)}: its fix removes them)",
        "",
        _sites_table(carried, "case", [site.carried for site in carried]),
        "",
        f"### Accepted by design ({len(accepted)}, from hunt_allowlist.toml)",
        "",
        _sites_table(accepted, "reason", [site.allowed for site in accepted]),
        "",
        "### Seen only by the PyTorch profiler",
        "",
        "Scalar reads in the profiled step beyond what the detector saw in the same function in"
        " the twin step; *via* is the kernel that made the read inside C++. The profiler saw"
        " this run's device: a CPU kernel may read on the host what its CUDA counterpart reads"
        " on the device, so confirm these on a GPU before reporting them.",
        "",
        table.markdown(
            ("package", "file", "function", "via", "reads", "ranks"),
            [
                (
                    entry.package,
                    entry.file,
                    f"`{entry.function}`",
                    entry.via,
                    entry.count,
                    ", ".join(map(str, entry.ranks)),
                )
                for entry in tree.profiler_only
            ],
        ),
        "",
        f"Cross-check of the reads, profiled step vs the detector's twin: {checks}.",
    ]


def write_reports(layout: Layout, json_path: Path) -> list[Path]:
    """The Markdown beside the result (never overwritten), and hunt.md from the newest result."""
    return results.write_markdown(
        json_path,
        HuntResult,
        lambda result, path: render(result, str(path.relative_to(layout.root))),
    )


def console_summary(trees: Sequence[HuntTree]) -> str:
    labels = [tree.label for tree in trees]
    rows = [
        (
            row.first.site.file,
            _function(row),
            *_cells(row, labels),
            _change(row),
            _verdict(row)[:40],
        )
        for row in compare(trees)
    ]
    sites = table.text(("file", "function", *labels, "change", "verdict"), rows)
    return f"{sites}\n\n{table.text(COST_COLUMNS, cost_rows(trees))}\nverdict bound: {BOUND}"


COST_COLUMNS = ("tree", "waits/step", "stalls/step", "idle us/step", "kernels/step", "verdict")


def cost_rows(trees: Sequence[HuntTree]) -> list[tuple[object, ...]]:
    """Each accounted tree's waits, stalls, idle time (host us, measured on CPU) and kernels per
    rank and step after the warm-up, and its verdict against the first tree of its setup."""
    first: dict[str, tuple[HuntTree, Cost]] = {}
    rows: list[tuple[object, ...]] = []
    for tree in trees:
        if tree.cost is None:
            continue
        base, cost = first.setdefault(tree.setup, (tree, tree.cost))
        judgement = assess(cost, tree.cost)
        verdict = "-" if base is tree else f"{judgement.verdict}: {judgement.reason}"
        rows.append(
            (
                tree.label,
                judgement.reads[1],
                judgement.stalls[1],
                judgement.idle_us[1],
                judgement.kernels[1],
                verdict,
            )
        )
    return rows
