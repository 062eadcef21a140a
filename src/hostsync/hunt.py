"""`python -m hostsync hunt`: every host sync of a full SP training step, tree by tree.

Runs the real `accelerate launch` + `Trainer` + DeepSpeed Ulysses step (`trainer_run.hunt_run`)
once per tree under test and sums up what the ranks recorded into sites: where (package, file,
line, function, code), how often per step, and on which steps (every step, logging steps, SP
data refills, the warm-up only). Sites that `hunt_allowlist.toml` accepts by design are kept
apart; the rest are ranked by syncs per step. The reads only the PyTorch profiler sees (made
inside C++ kernels) form a separate list. Trees are compared site by site, matched on file,
function and code line, since line numbers move between releases.

Writes profiles/<case>/hunt-<stamp>.json (never overwritten) with the Markdown report beside
it, and regenerates profiles/<case>/hunt.md from the newest result. The case chooses the trees:
its project's pinned and patched trees, the other packages from the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
import tomllib
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from hostsync import cases, environment, results, table, trainer_run, upstream
from hostsync.errors import WorkspaceError
from hostsync.launch import RunFailed
from hostsync.layout import Layout
from hostsync.options import add_case, add_timeout, case_layouts, comma_list

KIND = "hunt"
DEFAULT_TREES = ("pinned", "patched")
DEFAULT_STEPS = 7
LOGGING_STEPS = 3
PACKAGES = ("transformers", "accelerate", "deepspeed", "torch")
_RULE_KEYS = {"file", "function", "line", "caller", "code", "reason"}
# What users run: bf16 mixed precision in every ZeRO stage (fp32 is a labelled variant).
DEFAULT_SETUPS = ("bf16-zero1", "bf16-zero2", "bf16-zero3")

# --- the allow-list ------------------------------------------------------------------------------


def load_allowlist(path: Path) -> list[dict[str, Any]]:
    """The accepted sites: [[allow]] tables with file, reason, and optionally function, line,
    caller (for a read inside a shared helper: which of its callers is accepted)."""
    if not path.exists():
        raise WorkspaceError(f"no allow-list at {path}: restore it from version control")
    try:
        entries = tomllib.loads(path.read_text()).get("allow", [])
    except tomllib.TOMLDecodeError as error:
        raise WorkspaceError(f"{path.name} is not valid TOML ({error}): fix that line") from None
    for number, entry in enumerate(entries, start=1):
        unknown = sorted(set(entry) - _RULE_KEYS)
        where = f"{path.name}, [[allow]] #{number}"
        if unknown:
            raise WorkspaceError(f"{where} has unknown keys {unknown}: use {sorted(_RULE_KEYS)}")
        if not str(entry.get("file", "")).strip() or not str(entry.get("reason", "")).strip():
            raise WorkspaceError(f"{where} needs a file and a reason saying why it is accepted")
    return entries


def allow_reason(rules: list[dict[str, Any]], site: dict[str, Any]) -> str | None:
    """The reason of the first rule accepting `site`, matched by the detector's own rules."""
    from hostsync.detector import AllowRule, Site

    where = Site(site["file"], site["line"], site["function"], site["code"])
    for rule in rules:
        if AllowRule(**rule).matches(where, site.get("caller", "")):
            return rule["reason"]
    return None


def carried_sites(root: Path) -> list[dict[str, Any]]:
    """Every case's `[[carries]]`, as rules whose reason is the case's name."""
    return [
        site | {"reason": name}
        for name in cases.names(root)
        for site in cases.load(root, name).carries
    ]


# --- from rank records to sites ------------------------------------------------------------------


def package(file: str) -> str:
    top = file.split("/", 1)[0]
    return top if top in PACKAGES else "other"


def summarize(ranks: list[dict], rules: list[dict[str, Any]],
              carried: list[dict[str, Any]] = ()) -> list[dict[str, Any]]:  # fmt: skip
    """One entry per sync site over all ranks and steps, ranked: candidates by syncs per step.
    `carried` names the case whose fix removes a site (`carried`), before any allow rule.

    `per_step` is the most syncs one rank made there in one step (after the warm-up, unless it
    occurs only then); `rate` the mean per rank per step after the warm-up (what the site costs
    in the steady state); `when` names the steps.
    """
    steady = sorted({s["step"] for rank in ranks for s in rank["steps"] if not s["warmup"]})
    logging_steps = sorted(
        {s["step"] for rank in ranks for s in rank["steps"] if s["logging"] and not s["warmup"]}
    )
    counts: dict[tuple, Counter] = defaultdict(Counter)
    kinds: dict[tuple, set[str]] = defaultdict(set)
    for rank in ranks:
        for step in rank["steps"]:
            for site in step["sites"]:
                key = (site["file"], site["line"], site["function"], site["code"],
                       site.get("caller", ""))  # fmt: skip
                counts[key][(rank["rank"], step["step"])] += site["count"]
                kinds[key].add(site["kind"])
    sites = []
    for key, by_rank_step in counts.items():
        file, line, function, code, caller = key
        steps = sorted({step for _, step in by_rank_step})
        in_steady = [n for (_, step), n in by_rank_step.items() if step in steady]
        site = {
            "package": package(file), "file": file, "line": line, "function": function,
            "code": code, "caller": caller, "kinds": sorted(kinds[key]), "steps": steps,
            "when": when(steps, steady, logging_steps),
            "per_step": max(in_steady or by_rank_step.values()),
            "rate": sum(in_steady) / (len(ranks) * len(steady)) if steady else 0.0,
        }  # fmt: skip
        site["carried"] = allow_reason(carried, site)
        site["allowed"] = None if site["carried"] else allow_reason(rules, site)
        sites.append(site)
    return sorted(sites, key=rank_key)


def when(steps: list[int], steady: list[int], logging_steps: list[int]) -> str:
    """Which steps a site occurs on, in words."""
    seen = [step for step in steps if step in steady]
    if not seen:
        return "warm-up only"
    if seen == steady:
        return "every step"
    if seen == logging_steps:
        return "logging steps"
    return "steps " + ", ".join(map(str, seen))


def rank_key(site: dict[str, Any]) -> tuple:
    """Most syncs per step first; then transformers before the libraries under it."""
    return (-site["rate"], PACKAGES.index(site["package"]) if site["package"] in PACKAGES else 9,
            site["file"], site["line"])  # fmt: skip


def profiler_only(ranks: list[dict], twin: int) -> list[dict[str, Any]]:
    """The profiled step's scalar reads the detector did not see in the twin step.

    Matched per (file, function): the profiler names a function by its first line, not the
    line of the call. A surplus made inside a kernel (`via`) is a read no dispatch mode sees.
    """
    found: dict[tuple, dict[str, Any]] = {}
    for rank in ranks:
        detected = Counter()
        for step in rank["steps"]:
            if step["step"] == twin:
                for site in step["sites"]:
                    if site["kind"] == "scalar_read":
                        detected[(site["file"], site["function"])] += site["count"]
        profiled: dict[tuple, Counter] = defaultdict(Counter)
        for entry in rank["profiled"]:
            profiled[(entry["file"], entry["function"])][entry["via"]] += entry["count"]
        for (file, function), by_via in profiled.items():
            surplus = sum(by_via.values()) - detected[(file, function)]
            if surplus <= 0:
                continue
            vias = sorted(via for via in by_via if via) or ["(Python level, missed)"]
            entry = found.setdefault((file, function), {
                "package": package(file), "file": file, "function": function,
                "via": ", ".join(vias), "count": 0, "ranks": [],
            })  # fmt: skip
            entry["count"] = max(entry["count"], surplus)
            entry["ranks"].append(rank["rank"])
    return sorted(found.values(), key=lambda e: (-e["count"], e["file"], e["function"]))


def cross_check(ranks: list[dict], twin: int) -> list[dict[str, int]]:
    """Per rank: Python-level reads the profiler saw in its step against the detector's twin."""
    return [
        {
            "rank": rank["rank"],
            "profiler": sum(e["count"] for e in rank["profiled"] if e["via"] is None),
            "detector": sum(
                site["count"]
                for step in rank["steps"]
                if step["step"] == twin
                for site in step["sites"]
                if site["kind"] == "scalar_read"
            ),
        }
        for rank in ranks
    ]


# --- comparing trees -----------------------------------------------------------------------------


def site_identity(site: dict[str, Any]) -> tuple[str, str, str, str]:
    """What stays the same for one site across releases: its line number does not."""
    return (site["file"], site["function"], site["code"], site.get("caller", ""))


def compare(trees: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every site of any tree, with each tree's line and cost there (None where it is absent).

    `change` says how the later trees differ from the first: "gone in X", "new in X".
    """
    first = trees[0]["label"]
    rows: dict[tuple, dict[str, Any]] = {}
    for tree in trees:
        for site in tree["sites"]:
            row = rows.setdefault(site_identity(site), {
                "package": site["package"], "file": site["file"], "function": site["function"],
                "caller": site.get("caller", ""), "code": site["code"],
                "allowed": site["allowed"], "carried": site.get("carried"), "trees": {},
            })  # fmt: skip
            row["trees"][tree["label"]] = {k: site[k] for k in ("line", "per_step", "when", "rate")}
    for row in rows.values():
        present = [tree["label"] for tree in trees if tree["label"] in row["trees"]]
        if first in present:
            gone = [label for label in (t["label"] for t in trees) if label not in present]
            row["change"] = f"gone in {', '.join(gone)}" if gone else ""
        else:
            row["change"] = f"new in {', '.join(present)}"
    return sorted(rows.values(), key=lambda r: (r["change"] == "", r["allowed"] is not None,
                                                 -max(t["rate"] for t in r["trees"].values()),
                                                 r["file"], r["function"]))  # fmt: skip


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


def reading(site: dict[str, Any]) -> str:
    """Why this line syncs, from its kind and code; the obvious alternative where there is one."""
    for kind in site["kinds"]:
        if kind in _KIND_READINGS:
            return _KIND_READINGS[kind]
    for pattern, text in _READINGS:
        if re.search(pattern, site["code"]):
            return text
    return "reads a tensor value on the host"


# --- the run and the report ----------------------------------------------------------------------


def hunt_tree(layout: Layout, tree: upstream.Tree, steps: int, rules: list[dict[str, Any]],
              timeout: float, setup: trainer_run.Setup = trainer_run.DEFAULT_SETUP,
              carried: list[dict[str, Any]] = ()) -> dict[str, Any]:  # fmt: skip
    """One tree's hunt in one DeepSpeed setup: its sites, the profiler-only reads, and every
    rank's raw record, labelled `<tree> <setup>`.

    A failed run is kept as the tree's `error`, so that one tree that cannot run (a release
    needing newer dependencies than the pin) does not throw away the others' results.
    """
    started = time.monotonic()
    hunted = {
        **upstream.describe_trees(layout, [tree])[tree.label],
        "label": f"{tree.label} {setup.label}",
        "tree": tree.label,
        "setup": setup.label,
        "stacked": [str(path.relative_to(layout.root.resolve())) for path in tree.stacked],
    }
    try:
        plan, ranks = trainer_run.hunt_run(
            layout, tree, steps, LOGGING_STEPS, timeout=timeout, setup=setup
        )
    except RunFailed as error:
        return hunted | {"seconds": round(time.monotonic() - started, 1), "error": str(error)}
    return hunted | {
        "seconds": round(time.monotonic() - started, 1),
        "plan": plan,
        "sites": summarize(ranks, rules, carried),
        "profiler_only": profiler_only(ranks, plan["twin"]),
        "cross_check": cross_check(ranks, plan["twin"]),
        "ranks": ranks,
    }


def measured(trees: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [tree for tree in trees if "error" not in tree]


def render(document: dict[str, Any], source: str) -> str:
    """The Markdown report of one hunt result; `source` names the JSON it was made from."""
    trees = measured(document["trees"])
    labels = [tree["label"] for tree in trees]
    out = [
        *_header(document, source),
        "## Trees",
        "",
        table.markdown(
            ("tree", "release", "origin", "commit", "stacked", "hunt run (s)", "result"),
            [
                (tree["label"], tree["version"], tree["origin"], tree["commit"][:12],
                 ", ".join(tree.get("stacked", [])) or "-", tree["seconds"],
                 tree.get("error", "measured"))
                for tree in document["trees"]
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
                (row["package"], row["file"], _function(row), *_cells(row, labels),
                 _change(row), _verdict(row), f"`{row['code']}`")
                for row in compare(trees)
            ],
        ),
    ]  # fmt: skip
    for tree in document["trees"]:
        out += _failed_section(tree) if "error" in tree else _tree_section(tree)
    return "\n".join(out) + "\n"


def _header(document: dict[str, Any], source: str) -> list[str]:
    setup, plan = document["setup"], measured(document["trees"])[0]["plan"]
    versions = ", ".join(f"{name} {version}" for name, version in setup["versions"].items())
    return [
        "# Host syncs in a full DeepSpeed Ulysses SP training step (Trainer)",
        "",
        f"> Generated by `python -m hostsync hunt` from `{source}` ({document['created']})."
        " `hunt.md` beside it is regenerated from the newest hunt result on every run; each"
        " result keeps its own copy beside it as `hunt-<stamp>.md`.",
        "",
        "**What ran.** For each tree and DeepSpeed setup below (*bf16-zero2*: bf16 mixed"
        " precision, ZeRO stage 2; what users run is bf16, fp32 is a labelled variant):"
        f" `accelerate launch` on {setup['world_size']} ranks forming one Ulysses"
        f" sequence-parallel group (sp_size {setup['sp_size']}, sdpa attention), gradient"
        " clipping at the Trainer's default max_grad_norm 1.0, and `Trainer.train()` on a tiny"
        f" `LlamaForCausalLM` built from a config ({setup['model']}), logging every"
        f" {plan['logging_steps']} steps. Steps 1 to {plan['steps']} ran under"
        " `hostsync.detector`, each from fetching its batch to the end of its logging: a"
        " `TorchDispatchMode` that records every op reading a device value on the host"
        " (`.item()`, `bool(t)`, `max(t, 1)`, `nonzero`, boolean masks, ...) with the Python"
        " line that caused it, plus `.tolist()`, `.cpu()` and `.numpy()`. Step 1 is the"
        f" warm-up. Step {plan['profile']} ran under the PyTorch profiler instead, which also"
        f" sees reads made inside C++ kernels; it is compared with step {plan['twin']}, in the"
        " same phase of the logging and data-refill cycles. No evaluation runs: the Trainer"
        " adapts only its training data loader to Ulysses SP.",
        "",
        f"**On.** {setup['device']} ({setup['backend']}); {versions}."
        f" Command: `{document['command']}`.",
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


def _cells(row: dict[str, Any], labels: list[str]) -> list[str]:
    cells = []
    for label in labels:
        entry = row["trees"].get(label)
        cells.append(
            "-" if entry is None else f"{entry['line']}: {entry['per_step']}x, {entry['when']}"
        )
    return cells


def _change(row: dict[str, Any]) -> str:
    return row["change"] or ("accepted" if row["allowed"] else "")


def _function(row: dict[str, Any]) -> str:
    return f"{row['function']} (from {row['caller']})" if row.get("caller") else row["function"]


def _verdict(row: dict[str, Any]) -> str:
    """Where the site stands: carried by a case, accepted (why), or a candidate."""
    if row.get("carried"):
        return f"carried by case {row['carried']}"
    return f"accepted: {row['allowed']}" if row["allowed"] else "candidate"


def _site(site: dict[str, Any]) -> str:
    called = f", called from `{site['caller']}`" if site.get("caller") else ""
    return f"{site['file']}:{site['line']} `{site['function']}`{called}"


def _failed_section(tree: dict[str, Any]) -> list[str]:
    return ["", f"## {tree['label']}", "", f"Not measured: {tree['error']}"]


def _sites_table(sites: list[dict[str, Any]], heading: str, key: str) -> str:
    """Sites set apart from the candidates, with what sets them apart (`key`) last."""
    return table.markdown(
        ("package", "site", "when", "per step", heading),
        [
            (site["package"], _site(site), site["when"], site["per_step"], site[key])
            for site in sites
        ],
    )


def _tree_section(tree: dict[str, Any]) -> list[str]:
    carried = [site for site in tree["sites"] if site.get("carried")]
    accepted = [site for site in tree["sites"] if site["allowed"] is not None]
    candidates = [site for site in tree["sites"] if site not in carried + accepted]
    checks = "; ".join(
        f"rank {check['rank']}: {check['profiler']} vs {check['detector']}"
        for check in tree["cross_check"]
    )
    return [
        "",
        f"## {tree['label']}",
        "",
        f"### Candidates, most syncs per step first ({len(candidates)})",
        "",
        table.markdown(
            ("#", "package", "site", "when", "per step", "code", "reading"),
            [
                (number, site["package"], _site(site), site["when"], site["per_step"],
                 f"`{site['code']}`", reading(site))
                for number, site in enumerate(candidates, start=1)
            ],
        ),
        "",
        f"### Carried by a case ({len(carried)}: its fix removes them)",
        "",
        _sites_table(carried, "case", "carried"),
        "",
        f"### Accepted by design ({len(accepted)}, from hunt_allowlist.toml)",
        "",
        _sites_table(accepted, "reason", "allowed"),
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
                (entry["package"], entry["file"], f"`{entry['function']}`", entry["via"],
                 entry["count"], ", ".join(map(str, entry["ranks"])))
                for entry in tree["profiler_only"]
            ],
        ),
        "",
        f"Cross-check of the Python-level reads, profiled step vs the detector's twin: {checks}.",
    ]  # fmt: skip


def write_reports(layout: Layout, json_path: Path) -> list[Path]:
    """The Markdown beside the result (never overwritten), and hunt.md from the newest result."""
    beside = json_path.with_suffix(".md")
    with beside.open("x") as out:
        out.write(render_file(layout, json_path))
    stable = layout.profiles / f"{KIND}.md"
    stable.write_text(render_file(layout, results.latest(layout, KIND)))
    return [beside, stable]


def render_file(layout: Layout, json_path: Path) -> str:
    return render(json.loads(json_path.read_text()), str(json_path.relative_to(layout.root)))


def console_summary(trees: list[dict[str, Any]]) -> str:
    labels = [tree["label"] for tree in trees]
    rows = [
        (row["file"], _function(row), *_cells(row, labels), _change(row), _verdict(row)[:40])
        for row in compare(trees)
    ]
    return table.text(("file", "function", *labels, "change", "verdict"), rows)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hostsync hunt",
        description="Record every host sync of a full accelerate + Trainer + DeepSpeed Ulysses"
        " training step on 2 ranks, per tree, and compare the trees.",
    )
    add_case(parser)
    parser.add_argument("--trees", default=",".join(DEFAULT_TREES),
                        help="pinned, patched, a release like 5.14.0, NAME+tests, NAME+series"
                        " (default: %(default)s)")  # fmt: skip
    parser.add_argument("--release", "--transformers", dest="releases", action="append",
                        default=[], metavar="VERSION",
                        help="also hunt this release of the case's project as published on PyPI"
                        " (repeatable), e.g. the newest")  # fmt: skip
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                        help="steps under the detector, the first being the warm-up"
                        " (default: %(default)s)")  # fmt: skip
    parser.add_argument("--setups", default=",".join(DEFAULT_SETUPS),
                        help="DeepSpeed setups, PRECISION-zeroSTAGE each, one run per tree"
                        " and setup (default: %(default)s; fp32-zero1: the labelled variant)",
                        )  # fmt: skip
    parser.add_argument("--stack", action="append", default=[], metavar="CASE",
                        help="also import this case's patched tree (another project) in every"
                        " run: a hunt with every carried fix applied (repeatable)")  # fmt: skip
    add_timeout(parser, "one training run")
    return parser


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    names = list(dict.fromkeys(comma_list(args.trees, "--trees") + args.releases))
    trainer_run.hunt_plan(args.steps, LOGGING_STEPS)  # refuse bad --steps before any download
    args.setups = [trainer_run.Setup.parse(text) for text in comma_list(args.setups, "--setups")]
    status = 0
    for layout in case_layouts(args.case):
        status = max(status, hunt_case(layout, names, args))
    return status


def stacked(layout: Layout, tree: upstream.Tree, names: list[str]) -> upstream.Tree:
    """`tree` with the patched trees of the cases `names` imported beside it."""
    clash = [name for name in names if cases.load(layout.root, name).project == tree.project]
    if clash:
        raise WorkspaceError(
            f"--stack {', '.join(clash)}: a case of {tree.project.name} cannot be stacked on a"
            f" {tree.project.name} tree; stack cases of other projects"
        )
    others = [upstream.tree(layout.for_case(name), upstream.PATCHED) for name in names]
    return dataclasses.replace(tree, stacked=tuple(other.src for other in others))


def hunt_case(layout: Layout, names: list[str], args: argparse.Namespace) -> int:
    rules = load_allowlist(layout.allowlist)
    carried = carried_sites(layout.root)
    trees = [stacked(layout, tree, args.stack) for tree in upstream.trees(layout, names)]
    hunted = [
        hunt_tree(layout, tree, args.steps, rules, args.timeout, setup, carried)
        for tree in trees
        for setup in args.setups
    ]
    failed = [tree for tree in hunted if "error" in tree]
    for tree in failed:
        print(f"error: {tree['label']}: {tree['error']}", file=sys.stderr)
    if len(failed) == len(hunted):
        raise WorkspaceError("no tree could be hunted: see the errors above")
    ranks = measured(hunted)[0]["ranks"]
    payload = {
        "setup": {
            "world_size": len(ranks),
            "sp_size": trainer_run.SP_SIZE,
            **{key: ranks[0][key] for key in ("model", "device", "backend")},
            "versions": {
                key: value
                for key, value in environment.describe(trees[0].python).items()
                if key not in ("platform", "device", "device_count")
            },
        },
        "allowlist": rules,
        "trees": hunted,
    }
    json_path = results.write(layout, KIND, payload)
    print(console_summary(measured(hunted)))
    for path in [json_path, *write_reports(layout, json_path)]:
        print(f"wrote {path.relative_to(layout.root)}", file=sys.stderr)
    return 1 if failed else 0
