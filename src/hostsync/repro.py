"""`python -m hostsync repro`: the host syncs of `deepspeed_sp_compute_loss`, tree by tree.

For each tree under test and each sequence-parallel size, one torchrun of `repro/sp_loss.py`
runs every scenario on real DeepSpeed Ulysses groups and reports, per rank, the syncs inside the
loss aggregation (the model forward's own are allowed and reported apart), the loss against a
single-process reference, and the gradients after `engine.backward`. The ranks' reports are
merged into one row per (tree, sp_size, scenario), printed as a table and written to
`profiles/repro-<stamp>.json`.

The JSON is read by later sessions. Each entry of `runs` holds: tree, sp_size, world_size,
backend, device, scenario, label_tokens_per_rank, host_syncs (syncs per rank per call, the
largest over ranks) and host_syncs_per_rank, sync_sites and forward_syncs (lists of {file, line,
function, code, count, count_per_rank}; count is per rank per call, the largest over ranks),
cuda_syncs_per_rank (null on CPU), loss, loss_type, reference_loss, loss_abs_diff, loss_ok,
loss_is_graph_tensor, backward_error, grads_ok, grad_max_abs_diff, grad_scale. A loss over zero
label tokens is undefined: it is null, and so are the comparisons that need it. With
`--trainer`, `trainer` holds per tree the full Trainer path's per-step losses with and without
SP (`trainer_run.compare_losses`).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from hostsync import environment, results, table, trainer_run, upstream
from hostsync.errors import WorkspaceError
from hostsync.launch import Run, launch, torchrun_command
from hostsync.layout import Layout
from hostsync.options import add_device, add_timeout, comma_list

SCENARIOS = {
    "all_tokens": "every rank has label tokens",
    "prompt_only_rank": "rank 0 holds only prompt tokens (all -100): its local loss is NaN",
    "all_masked": "no rank has a label token: the loss is undefined",
    "uneven": "a different number of label tokens on each rank",
}
DEFAULT_TREES = ("pinned", upstream.PATCHED, "5.14.0")
DEFAULT_SP_SIZES = (2, 4)
# The tiny model's attention heads: Ulysses splits them across ranks, so sp_size must divide them.
ATTENTION_HEADS = 4
LOSS_TOLERANCE = 1e-5
DEFAULT_TIMEOUT_S = 600.0
COLUMNS = (
    "tree",
    "sp",
    "scenario",
    "syncs",
    "sites",
    "forward",
    "loss",
    "|loss - ref|",
    "grads ok",
)


def worker(layout: Layout) -> Path:
    return layout.root / "repro" / "sp_loss.py"


# --- running the worker ---------------------------------------------------------------------------


def run_worker(
    layout: Layout,
    tree: upstream.Tree,
    sp_size: int,
    scenarios: Sequence[str],
    *,
    device: str,
    timeout: float,
    detector: bool = True,
    env: Mapping[str, str] | None = None,
) -> list[dict]:
    """One torchrun of the worker on `tree`: every scenario in one engine; results by rank.

    The run folder is removed after a success and kept, with the launcher log and the failing
    rank's traceback, after a failure.
    """
    run_dir = layout.new_run_dir(f"repro-{tree.label}-sp{sp_size}")
    args = ["--scenarios", ",".join(scenarios), "--device", device]
    args += [] if detector else ["--no-detector"]
    env = environment.device_env(device) | dict(env or {})
    command = torchrun_command(worker(layout), sp_size, args)
    run = Run(run_dir, tree.src, layout)
    rank_results = launch(run, command, nprocs=sp_size, timeout=timeout, env=env)
    shutil.rmtree(run_dir)
    return rank_results


# --- merging the ranks' reports -------------------------------------------------------------------


def merge_sites(per_rank: list[list[dict]]) -> list[dict]:
    """One entry per source line: its count on each rank, and the largest as `count`."""
    merged: dict[tuple[str, int], dict] = {}
    for rank, sites in enumerate(per_rank):
        for site in sites:
            entry = merged.setdefault(
                (site["file"], site["line"]), site | {"count_per_rank": [0] * len(per_rank)}
            )
            entry["count_per_rank"][rank] = site["count"]
    for entry in merged.values():
        entry["count"] = max(entry["count_per_rank"])
    return [merged[key] for key in sorted(merged)]


def merge_ranks(tree: str, rank_results: list[dict]) -> list[dict]:
    """One row per scenario from every rank's report (ranks share the loss and the gradients)."""
    first = rank_results[0]
    rows = []
    for index, scenario in enumerate(first["scenarios"]):
        by_rank = [result["scenarios"][index] for result in rank_results]
        syncs = [entry.get("host_syncs") for entry in by_rank]
        diffs = [entry["loss_abs_diff"] for entry in by_rank]
        grads = [entry["grads_ok"] for entry in by_rank]
        grad_diffs = [entry["grad_max_abs_diff"] for entry in by_rank]
        loss_diff = None if None in diffs else max(diffs)
        rows.append(
            {
                "tree": tree,
                "sp_size": first["sp_size"],
                "world_size": first["world_size"],
                "backend": first["backend"],
                "device": first["device"],
                "scenario": scenario["scenario"],
                "label_tokens_per_rank": [entry["label_tokens"] for entry in by_rank],
                "host_syncs": None if None in syncs else max(syncs),
                "host_syncs_per_rank": syncs,
                "sync_sites": merge_sites([entry.get("sync_sites", []) for entry in by_rank]),
                "forward_syncs": merge_sites([entry.get("forward_syncs", []) for entry in by_rank]),
                "cuda_syncs_per_rank": [entry.get("cuda_syncs") for entry in by_rank],
                "loss": scenario["loss"],
                "loss_type": scenario["loss_type"],
                "reference_loss": scenario["reference_loss"],
                "loss_abs_diff": loss_diff,
                "loss_ok": None if loss_diff is None else loss_diff <= LOSS_TOLERANCE,
                "loss_is_graph_tensor": all(entry["loss_is_graph_tensor"] for entry in by_rank),
                "backward_error": per_rank_text([entry["backward_error"] for entry in by_rank]),
                "grads_ok": None if None in grads else all(grads),
                "grad_max_abs_diff": None if None in grad_diffs else max(grad_diffs),
                "grad_scale": scenario.get("grad_scale"),
            }
        )
    return rows


def per_rank_text(values: list[str | None]) -> str | None:
    """One message when every rank says the same, else each rank's own, prefixed by its rank."""
    if not any(values):
        return None
    if len(set(values)) == 1:
        return f"every rank: {values[0]}"
    return "; ".join(f"rank {rank}: {value}" for rank, value in enumerate(values) if value)


# --- presenting -----------------------------------------------------------------------------------


def table_row(run: dict) -> list[object]:
    per_rank = run["host_syncs_per_rank"]
    syncs = str(run["host_syncs"]) if len(set(per_rank)) == 1 else "/".join(map(str, per_rank))
    forward = sum(site["count"] for site in run["forward_syncs"])
    loss = run["loss"] if run["loss_type"] == "Tensor" else f"{run['loss']} ({run['loss_type']})"
    if run["backward_error"]:
        grads = "backward raised " + run["backward_error"].split(": ")[1]
    else:
        grads = {True: "yes", False: "NO", None: "-"}[run["grads_ok"]]
    return [
        run["tree"],
        run["sp_size"],
        run["scenario"],
        syncs,
        sites_cell(run["sync_sites"]),
        forward,
        loss,
        run["loss_abs_diff"],
        grads,
    ]


def sites_cell(sites: list[dict]) -> str:
    """`integrations/deepspeed.py:741 x2`: site paths are inside the transformers package."""
    return (
        ", ".join(
            f"{site['file'].removeprefix('transformers/')}:{site['line']} x{site['count']}"
            for site in sites
        )
        or "-"
    )


def anomalies(runs: list[dict]) -> list[str]:
    """What a reader must not miss: results that differ between ranks or from the reference."""
    found = []
    for run in runs:
        where = f"{run['tree']} sp{run['sp_size']} {run['scenario']}"
        if len(set(run["host_syncs_per_rank"])) > 1:
            found.append(f"{where}: ranks differ in sync count {run['host_syncs_per_rank']}")
        if run["loss_ok"] is False:
            found.append(f"{where}: loss differs from the reference by {run['loss_abs_diff']:.3g}")
        if run["grads_ok"] is False:
            found.append(f"{where}: gradients differ by up to {run['grad_max_abs_diff']:.3g}")
        if run["backward_error"]:
            found.append(f"{where}: backward failed ({run['backward_error']})")
    return found


def measure(
    layout: Layout,
    trees: list[upstream.Tree],
    sp_sizes: Sequence[int],
    scenarios: Sequence[str],
    *,
    device: str,
    timeout: float,
) -> dict:
    """Every (tree, sp_size) as one torchrun; the payload of the `repro` result file."""
    runs = []
    for tree in trees:
        for sp_size in sp_sizes:
            ranks = run_worker(layout, tree, sp_size, scenarios, device=device, timeout=timeout)
            runs += merge_ranks(tree.label, ranks)
    return {
        "environment": environment.describe()
        | {"world_sizes": list(sp_sizes), "backend": runs[0]["backend"]},
        "trees": upstream.describe_trees(layout, trees),
        "scenarios": {name: SCENARIOS[name] for name in scenarios},
        "loss_tolerance": LOSS_TOLERANCE,
        "runs": runs,
    }


TRAINER_COLUMNS = ("tree", "Trainer step", "loss with SP", "loss without SP", "|diff|")


def trainer_rows(comparisons: list[dict]) -> list[list[object]]:
    return [
        [compared["tree"], step, sp, no_sp, diff]
        for compared in comparisons
        for step, (sp, no_sp, diff) in enumerate(
            zip(compared["sp"], compared["no_sp"], compared["abs_diff"], strict=True), start=1
        )
    ]


def trainer_anomalies(comparisons: list[dict]) -> list[str]:
    found = []
    for compared in comparisons:
        if compared["max_abs_diff"] > LOSS_TOLERANCE:
            found.append(
                f"{compared['tree']} Trainer: SP loss differs from the run without SP by"
                f" {compared['max_abs_diff']:.3g}"
            )
        if not compared["sp_ranks_agree"]:
            found.append(f"{compared['tree']} Trainer: the SP ranks logged different losses")
    return found


def report(payload: dict) -> str:
    lines = [table.text(COLUMNS, [table_row(run) for run in payload["runs"]])]
    notes = anomalies(payload["runs"])
    if "trainer" in payload:
        lines += ["", table.text(TRAINER_COLUMNS, trainer_rows(payload["trainer"]))]
        notes += trainer_anomalies(payload["trainer"])
    lines += [f"note: {line}" for line in notes]
    return "\n".join(lines)


# --- command line ---------------------------------------------------------------------------------


def parse_sp_sizes(text: str) -> list[int]:
    sizes = []
    for item in comma_list(text, "--sp"):
        if not item.isdigit() or int(item) < 2 or ATTENTION_HEADS % int(item):
            raise WorkspaceError(
                f"--sp {item}: sequence parallelism needs sp_size >= 2 dividing the tiny model's"
                f" {ATTENTION_HEADS} attention heads: use 2 or 4"
            )
        sizes.append(int(item))
    return sizes


def parse_scenarios(text: str) -> list[str]:
    scenarios = comma_list(text, "--scenarios")
    unknown = [name for name in scenarios if name not in SCENARIOS]
    if unknown:
        raise WorkspaceError(
            f"unknown scenario(s) {', '.join(unknown)}: choose from {', '.join(SCENARIOS)}"
        )
    return scenarios


def parser() -> argparse.ArgumentParser:
    scenarios = "comma-separated (default: all). " + "; ".join(
        f"{name}: {text}" for name, text in SCENARIOS.items()
    )
    parser = argparse.ArgumentParser(
        prog="python -m hostsync repro",
        description="Count the host syncs of deepspeed_sp_compute_loss on real Ulysses groups and"
        " check its loss and gradients against a single process, tree by tree.",
    )
    parser.add_argument(
        "--trees",
        default=",".join(DEFAULT_TREES),
        help="pinned, patched, a release (5.14.0), NAME+tests, NAME+series (default: %(default)s)",
    )
    parser.add_argument(
        "--sp",
        default=",".join(map(str, DEFAULT_SP_SIZES)),
        help="sequence-parallel sizes, one torchrun each (default: %(default)s)",
    )
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=scenarios)
    add_device(parser)
    add_timeout(parser, DEFAULT_TIMEOUT_S, "one torchrun")
    parser.add_argument(
        "--trainer",
        action="store_true",
        help="also the full Trainer path: accelerate launch + DeepSpeed ZeRO 1 + Ulysses SP, two"
        " steps per tree, each step's loss against the same training without SP",
    )
    return parser


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    sp_sizes, scenarios = parse_sp_sizes(args.sp), parse_scenarios(args.scenarios)
    layout = Layout()
    device = environment.resolve_device(args.device, max(sp_sizes))
    trees = upstream.trees(layout, comma_list(args.trees, "--trees"))
    payload = measure(layout, trees, sp_sizes, scenarios, device=device, timeout=args.timeout)
    if args.trainer:
        payload["trainer"] = [
            trainer_run.compare_losses(layout, tree, timeout=args.timeout) for tree in trees
        ]
    print(report(payload))
    path = results.write(layout, "repro", payload)
    print(f"wrote {path.relative_to(layout.root)}", file=sys.stderr)
    return 0
