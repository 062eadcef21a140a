"""`python -m hostsync bench`: how long the reproducer takes, and what the sync detector costs.

A benchmark, not a test: it prints figures (kept in profiles/<case>/bench-<stamp>.json with --write)
and asserts nothing. Each run is what `repro` starts for the case's first launch at its first rank
count: one run through every scenario of that launch. The cold run starts with an empty DeepSpeed
extensions cache, so it includes the one-time JIT compile of DeepSpeed's shared-memory op (the OS
file cache is left as it is); warm runs reuse the cache. The detector's overhead is measured on the
whole run, and on the measured call itself where the rank script times it (`call_seconds` of its
rows; a step waits for its slowest rank, so each call counts at its slowest rank's time; each run's
first call, a warm-up, is left out)."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

from hostsync import cases, environment, repro, results, table, upstream
from hostsync.options import add_case, add_device, add_timeout, case_layouts


def call_seconds(rank_results: list[dict]) -> list[float]:
    """Each call's time at its slowest rank, the run's first call (warm-up) left out."""
    rows = repro.merge_ranks(rank_results)
    return [row["call_seconds"] for row in rows if "call_seconds" in row][1:]


def overhead(with_detector: float, without: float, unit: str) -> str:
    return f"{with_detector - without:+.3g} {unit} ({with_detector / without - 1:+.0%})"


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hostsync bench",
        description="Print the reproducer's wall time, cold and warm, and the sync detector's"
        " overhead against the same runs without it.",
    )
    add_case(parser)
    parser.add_argument("--tree", default="pinned", help="tree to run (default: %(default)s)")
    parser.add_argument(
        "--warm-runs",
        type=int,
        default=3,
        help="warm runs with the detector, and as many without (default: %(default)s)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="times each run goes through the scenarios, for more loss calls (default: 1)",
    )
    add_device(parser)
    add_timeout(parser, "one run")
    parser.add_argument("--write", action="store_true", help="keep the figures in profiles/")
    return parser


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    (layout,) = case_layouts(args.case)
    case = cases.load(layout.root, layout.case)
    spec = case.launches[0]
    sp_size = spec.ranks[0]
    tree = upstream.tree(layout, args.tree)
    device = environment.resolve_device(args.device, sp_size, tree.python)
    scenarios = list(spec.scenarios) * args.repeat

    def run(detector: bool, env: dict[str, str] | None = None) -> tuple[float, list[dict]]:
        started = time.perf_counter()
        ranks = repro.run_launch(
            layout, tree, spec, sp_size, scenarios, device=device, timeout=args.timeout,
            detector=detector, env=env,
        )  # fmt: skip
        return time.perf_counter() - started, ranks

    layout.cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=layout.cache) as empty_cache:
        cold_s, _ = run(detector=True, env={"TORCH_EXTENSIONS_DIR": empty_cache})
    wall_s: dict[bool, list[float]] = {True: [], False: []}
    call_s: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.warm_runs):
        for detector in (True, False):  # interleaved, so drift on a shared machine hits both
            seconds, ranks = run(detector)
            wall_s[detector].append(seconds)
            call_s[detector] += call_seconds(ranks)

    wall = {detector: statistics.median(s) for detector, s in wall_s.items()}
    call_ms = {d: 1000 * statistics.median(s) if s else None for d, s in call_s.items()}
    print(
        f"bench: {case.name}, {tree.label} ({tree.project.name} {tree.version}), {sp_size}"
        f" rank(s), {device}, {len(scenarios)} scenario(s) per run, {args.warm_runs} warm run(s)"
        f" each way, {len(call_s[True])} timed calls each way"
    )
    print(f"cold run (empty extensions cache, detector on): {cold_s:.1f} s")
    print(
        table.text(
            ["median", "with detector", "without", "overhead"],
            [
                ["warm run, wall (s)", f"{wall[True]:.2f}", f"{wall[False]:.2f}",
                 overhead(wall[True], wall[False], "s")],
                *([["measured call (ms)", f"{call_ms[True]:.2f}", f"{call_ms[False]:.2f}",
                   overhead(call_ms[True], call_ms[False], "ms")]] if call_s[True] else []),
            ],
        )
    )  # fmt: skip
    if args.write:
        payload = {
            "environment": environment.describe(tree.python) | {"ranks": [sp_size]},
            "trees": upstream.describe_trees(layout, [tree]),
            "sp_size": sp_size,
            "device_kind": device,
            "scenarios": scenarios,
            "cold_run_s": cold_s,
            "warm_run_s": {"with_detector": wall_s[True], "without_detector": wall_s[False]},
            "loss_call_s": {"with_detector": call_s[True], "without_detector": call_s[False]},
            "median_loss_call_ms": {
                "with_detector": call_ms[True],
                "without_detector": call_ms[False],
            },
        }
        path = results.write(layout, "bench", payload)
        print(f"wrote {path.relative_to(layout.root)}", file=sys.stderr)
    return 0
