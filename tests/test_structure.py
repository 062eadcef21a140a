"""The engine's imports, read from its source: each module imports only from its own floor and
the floors below it (docs/architecture.md, bottom up), no import cycle exists, no command imports
another and the detector imports nothing outside its package, so that a lower floor can be read,
tested and changed without the ones above it. The hunt, the census, the scan and the history
share the site layer and never import one another. The cases' rank scripts import only what
docs/adding-a-case.md allows them, and return their record."""

from __future__ import annotations

import ast
from pathlib import Path

from engine_structure import (
    back_edges,
    command_imports,
    commands,
    cycles,
    detector_escapes,
    engine_modules,
    finder_imports,
    finders_off_the_site_layer,
    floor_of,
    floors,
    import_graph,
    launcher_comparisons,
    named_outside,
    rank_script_escapes,
    rank_scripts,
    returned_record,
    string_data,
    unrecorded_rank_scripts,
    untyped_signatures,
    workspace_imports,
)

import hostsync.detector as detector
from hostsync.workspace.projects import PROJECTS
from hostsync.workspace.records import Launcher


def test_every_engine_module_has_a_floor_in_the_readme() -> None:
    table = floors()
    assert [m for m in engine_modules() if floor_of(m, table) is None] == []


def test_no_engine_module_imports_from_a_floor_above_its_own() -> None:
    assert back_edges() == []


def test_the_engine_has_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_no_command_imports_another() -> None:
    assert len(commands()) >= 10
    assert command_imports() == []


def test_the_detector_imports_nothing_outside_its_package() -> None:
    assert detector_escapes() == []


def test_the_detectors_lazy_names_are_the_names_the_type_checker_sees() -> None:
    """`hostsync.detector` lists its names twice: in `_HOMES`, read at run time, and in the
    `TYPE_CHECKING` imports mypy reads. Each name comes from the same module in both."""
    tree = ast.parse(Path(detector.__file__).read_text())
    (checked,) = [n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.dump(n)]
    seen = {
        alias.name: node.module.rsplit(".", 1)[-1]
        for node in checked.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }
    assert seen == detector._HOMES


def test_hunt_census_scan_and_history_import_one_another_never_and_the_site_layer_each() -> None:
    assert finder_imports() == []
    assert finders_off_the_site_layer() == []


def test_the_checks_see_a_finder_importing_another_and_one_off_the_site_layer() -> None:
    """The measure itself: the census reading the hunt's summary is caught, and so is a history
    that reaches no site but through the hunt."""
    graph = {
        "hostsync.census.run": {"hostsync.hunt.measure", "hostsync.sites.known"},
        "hostsync.hunt.measure": {"hostsync.sites.summary"},
        "hostsync.scan.report": {"hostsync.sites.render", "hostsync.scan.measure"},
        "hostsync.history.watch": {"hostsync.hunt.measure"},
    }
    assert finder_imports(graph) == [
        "hostsync.census.run imports hostsync.hunt.measure",
        "hostsync.history.watch imports hostsync.hunt.measure",
    ]
    assert finders_off_the_site_layer(graph) == ["hostsync.history"]


def test_the_checks_see_a_back_edge_and_a_cycle() -> None:
    """The measure itself: a graph with a loop and an import that climbs are both caught."""
    looped = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(looped) == [["a", "b", "c", "a"]]
    table = [["hostsync.detector.codec"], ["hostsync.workspace.records"], ["hostsync.upstream"]]
    assert floor_of("hostsync.upstream.trees", table) == 2
    assert floor_of("hostsync.detector.codec", table) < floor_of(
        "hostsync.workspace.records", table
    )


def test_no_engine_module_but_the_table_names_a_project_as_data() -> None:
    """Projects live in projects.py's table; the launcher of the same name as a project
    (`accelerate`), which cards name, is a launcher's name."""
    launchers = {launcher.value for launcher in Launcher}
    found = named_outside(set(PROJECTS), "hostsync.workspace.projects")
    assert [
        f for f in found if not (f[0] == "hostsync.workspace.records" and f[2] in launchers)
    ] == []


def test_no_engine_module_but_the_registry_branches_on_a_launcher_name() -> None:
    found = [
        f"{name}:{line}"
        for name, path in engine_modules().items()
        if name != "hostsync.launch.launchers"
        for line in launcher_comparisons(path.read_text())
    ]
    assert found == []


def test_the_scans_see_a_name_used_as_data_and_a_launcher_compared() -> None:
    """The measures themselves: a literal counts, a docstring does not; a comparison counts."""
    source = '''def f(x):
    """Runs DeepSpeed."""
    return x == Launcher.FORK or x == "DeepSpeed"
'''
    assert string_data(source, {"deepspeed"}) == [(3, "DeepSpeed")]
    assert launcher_comparisons(source) == [3]


def test_every_rank_script_declares_the_record_it_returns() -> None:
    """A repro script returns a `ReproRank`, a profile script a `ProfiledRank`: what the engine
    reads back from the run folder, each field checked."""
    assert len(rank_scripts()) >= 17
    assert unrecorded_rank_scripts() == []
    untyped, _ = untyped_signatures(rank_scripts())
    assert [name for name in untyped if name.endswith(" main")] == []


def test_rank_scripts_import_only_what_the_readme_allows() -> None:
    assert rank_script_escapes() == []


def test_the_rank_script_scans_see_an_import_beyond_the_readme_and_a_main_untyped() -> None:
    """The measures themselves: a rank's records come through the protocol, not past it."""
    source = """from hostsync.detector import SyncScope
from hostsync.rank.protocol import ReproRank, rank_entry
from hostsync.rank.records import RankRow
import hostsync.measure.repro


@rank_entry
def main() -> dict:
    return {}
"""
    assert workspace_imports(source) == [
        (3, "hostsync.rank.records.RankRow"),
        (4, "hostsync.measure.repro"),
    ]
    assert returned_record(source) == "dict"
