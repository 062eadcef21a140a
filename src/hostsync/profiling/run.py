"""A case's profile: its trees prepared, each captured, and the result published with its
summary and timeline."""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace

from hostsync.launch import devices
from hostsync.launch.nodes import node_0_first
from hostsync.measure import provenance
from hostsync.profiling.capture import ProfileSettings, capture_with_fallback, choose_profiler
from hostsync.profiling.records import ProfiledScenario, ProfileResult, RegionLabels
from hostsync.profiling.report import publish, summary_table
from hostsync.upstream.trees import infos, prepare_trees
from hostsync.workspace import table
from hostsync.workspace.results import attachments


def profile_case(settings: ProfileSettings) -> None:
    """Profile each tree the settings name; node 0 prints the summary and writes the result."""
    case = settings.case
    layout = case.layout
    measured_against = provenance.inputs(layout)
    trees = node_0_first(
        settings.nodes,
        f"trees of {case.name}",
        settings.timeout,
        lambda: prepare_trees(case, list(settings.trees)),
    )
    device = devices.resolve_device(
        settings.device, settings.nodes.ranks_here(settings.ranks), trees[0].python
    )
    # What `auto` resolved to on this machine, for the captures.
    settings = replace(settings, device=device, profiler=choose_profiler(settings.profiler, device))
    notes = [
        f"{name}: not profiled, the series is empty (the patched tree would equal pinned)"
        for name in settings.trees
        if case.tree_name(name) not in {tree.label for tree in trees}
    ]
    staging = layout.new_run_dir("profile")
    (staging / "artifacts").mkdir()
    captures = [capture_with_fallback(layout, tree, staging, settings, notes) for tree in trees]
    if not settings.nodes.writes_results:
        shutil.rmtree(staging)
        print(f"node {settings.nodes.rank}: node 0 writes the profile", file=sys.stderr)
        return
    result = ProfileResult(
        stamp=provenance.stamp(layout, measured_against),
        environment=devices.describe(trees[0].python),
        trees=infos(layout, trees),
        setting=ProfiledScenario(settings.scenario, settings.ranks),
        labels=RegionLabels(settings.profile.measured, settings.profile.excluded),
        warmup_steps=settings.warmup,
        steps=settings.steps,
        notes=tuple(notes),
        captures=tuple(captures),
    )
    path = publish(layout, result, staging)
    shutil.rmtree(staging)
    table_headers, rows = summary_table(result)
    print(table.text(table_headers, rows))
    for note in notes:
        print(f"note: {note}")
    folder = attachments(path).relative_to(layout.root)
    print(f"wrote {path.relative_to(layout.root)} and {folder}/", file=sys.stderr)
