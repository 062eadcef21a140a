"""The engine's structure, read from its source: its import graph by the floors of
docs/architecture.md, the signatures that take or return untyped data, and what the cases' rank
scripts under repro/ import and return. `python tests/engine_structure.py` prints the figures;
tests/test_structure.py holds the floors and the cycles to zero."""

from __future__ import annotations

import ast
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "src" / "hostsync"
REPRO = ROOT / "repro"
TABLE_OPENS = "The engine, from the bottom of its imports up"
# All a rank script may import of the workspace (docs/adding-a-case.md): the launcher's
# git, download and environment code never loads in a rank.
RANK_SCRIPT_IMPORTS = ("hostsync.rank.protocol", "hostsync.rank.rankkit", "hostsync.detector")
# What a rank script's `main` returns: a repro script's rows, or a profile script's record.
RANK_RECORDS = ("ReproRank", "ProfiledRank")
# The packages that find sites: each stands on the site layer, and none imports another.
SITE_LAYER = "hostsync.sites"
SITE_FINDERS = ("hostsync.hunt", "hostsync.census", "hostsync.scan", "hostsync.history")


def module_name(path: Path) -> str:
    parts = path.relative_to(ENGINE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def engine_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(ENGINE.rglob("*.py"))}


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The engine modules `path` imports anywhere in it (functions included): `from a import b`
    names module `a.b` where that is a module, else `a`."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                inner = f"{node.module}.{alias.name}"
                found.add(inner if inner in modules else node.module)
    return {name for name in found if name in modules}


def import_graph() -> dict[str, set[str]]:
    modules = engine_modules()
    return {name: imports_of(path, set(modules)) - {name} for name, path in modules.items()}


def floors() -> list[list[str]]:
    """The first column of each row of the engine table, as module names or package prefixes
    (`upstream/` stands for every module under it), bottom floor first."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = text[text.index(TABLE_OPENS) :].split("\n\n")[1].splitlines()[2:]
    return [
        [
            "hostsync." + entry.removesuffix(".py").removesuffix("/").replace("/", ".")
            for entry in re.findall(r"`([^`]+)`", row.split("|")[1])
        ]
        for row in rows
    ]


def floor_of(module: str, table: list[list[str]]) -> int | None:
    """The floor of the most specific entry naming `module`; the package `hostsync` itself
    imports nothing and stands on the ground."""
    if module == "hostsync":
        return 0
    named = [
        (len(entry), level)
        for level, entries in enumerate(table)
        for entry in entries
        if module == entry or module.startswith(entry + ".")
    ]
    return max(named)[1] if named else None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One path round each import cycle found by a depth-first walk."""
    found, state = [], {}
    for start in sorted(graph):
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        state[start] = "open"
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = "done"
                stack.pop()
                path.pop()
            elif state.get(child) == "open":
                found.append([*path[path.index(child) :], child])
            elif child not in state:
                state[child] = "open"
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child)
    return found


# An annotation naming one of these takes or returns data whose shape no type states: `Any` and
# raw JSON anywhere; a mapping bare, or one whose values may be anything (`dict[str, object]`).
# A mapping whose keys and values are typed (`Mapping[str, str]`, `dict[Site, int]`) is typed.
ANYTHING = {"Any", "Json"}
MAPPINGS = {"dict", "Dict", "Mapping", "MutableMapping"}


def _annotation(annotation: ast.expr | None) -> ast.expr | None:
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return ast.parse(annotation.value, mode="eval").body
    return annotation


def _name(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)


def _names_in(annotation: ast.expr | None) -> set[str]:
    annotation = _annotation(annotation)
    if annotation is None:
        return set()
    return {name for node in ast.walk(annotation) if (name := _name(node))}


def _is_untyped(annotation: ast.expr | None, aliases: set[str]) -> bool:
    annotation = _annotation(annotation)
    if annotation is None:
        return False
    if _names_in(annotation) & (ANYTHING | aliases):
        return True
    typed_mappings = set()
    for node in ast.walk(annotation):
        if isinstance(node, ast.Subscript) and _name(node.value) in MAPPINGS:
            typed_mappings.add(id(node.value))
            if "object" in _names_in(node.slice):
                return True
    return any(
        _name(node) in MAPPINGS and id(node) not in typed_mappings for node in ast.walk(annotation)
    )


def _untyped_aliases(trees: list[ast.Module]) -> set[str]:
    """Module-level type aliases that stand for untyped data (`RankResults = list[dict]`)."""
    found: set[str] = set()
    for tree in trees:
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Subscript | ast.Name | ast.BinOp)
                and _is_untyped(node.value, found)
            ):
                found.add(node.targets[0].id)
    return found


def untyped_signatures(modules: dict[str, Path] | None = None) -> tuple[list[str], int]:
    """Every function of `modules` (the engine's, by default) whose parameters or return name
    untyped data, as `module:line name`, and how many functions there are in all."""
    modules = engine_modules() if modules is None else modules
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in modules.items()}
    aliases = _untyped_aliases(list(trees.values()))
    found, total = [], 0
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            total += 1
            arguments = node.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
            every += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
            annotations = [node.returns, *(a.annotation for a in every)]
            if any(_is_untyped(annotation, aliases) for annotation in annotations):
                found.append(f"{name}:{node.lineno} {node.name}")
    return found, total


# --- the rank scripts ----------------------------------------------------------------------------


def _rank_entry(tree: ast.Module) -> ast.FunctionDef | None:
    """The script's `main` decorated with `rank_entry`, if it has one."""
    return next(
        (
            node
            for node in tree.body
            if isinstance(node, ast.FunctionDef)
            and node.name == "main"
            and any(_name(decorator) == "rank_entry" for decorator in node.decorator_list)
        ),
        None,
    )


def rank_scripts() -> dict[str, Path]:
    """The cases' rank and profile scripts, by `case/script.py`: those whose `main` is a rank's
    entry (an issue's snippet is not one)."""
    return {
        path.relative_to(REPRO).as_posix(): path
        for path in sorted(REPRO.glob("*/*.py"))
        if _rank_entry(ast.parse(path.read_text(), str(path))) is not None
    }


def returned_record(source: str) -> str | None:
    """What the rank entry of `source` declares it returns, as written."""
    entry = _rank_entry(ast.parse(source))
    return ast.unparse(entry.returns) if entry is not None and entry.returns else None


def workspace_imports(source: str) -> list[tuple[int, str]]:
    """What `source` imports of the workspace beyond `RANK_SCRIPT_IMPORTS`, as (line, name);
    `from a import b` names `a.b`, a module or a name in one."""
    allowed = RANK_SCRIPT_IMPORTS
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [
            (node.lineno, name)
            for name in names
            if name.split(".")[0] == "hostsync"
            and not any(name == ok or name.startswith(ok + ".") for ok in allowed)
        ]
    return found


def rank_script_escapes() -> list[str]:
    """Each import of the workspace by a rank script that it may not make."""
    return [
        f"{name}:{line} imports {imported}"
        for name, path in rank_scripts().items()
        for line, imported in workspace_imports(path.read_text())
    ]


def unrecorded_rank_scripts() -> list[str]:
    """Each rank script whose `main` does not declare the record it returns."""
    return [
        f"{name} returns {returned}"
        for name, path in rank_scripts().items()
        if (returned := returned_record(path.read_text())) not in RANK_RECORDS
    ]


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the string constants that are docstrings: words about a thing, not data."""
    holders = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, holders)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def string_data(source: str, words: set[str]) -> list[tuple[int, str]]:
    """The string literals of `source`, docstrings aside, that are one of `words` (any case),
    as (line, literal): a name used as data, which comments and docstrings may still say."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.lower() in words
        and id(node) not in docstrings
    ]


def named_outside(words: set[str], home: str) -> list[tuple[str, int, str]]:
    """Each string literal naming one of `words` in an engine module other than `home`, as
    (module, line, literal)."""
    return [
        (name, line, literal)
        for name, path in engine_modules().items()
        if name != home
        for line, literal in string_data(path.read_text(), words)
    ]


def launcher_comparisons(source: str) -> list[int]:
    """The lines of `source` that compare a value with a member of `Launcher` (`==`, `!=`,
    `in`, `is`): a branch on a launcher's name rather than on what it can do."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Compare)
        and any(
            isinstance(side, ast.Attribute)
            and isinstance(side.value, ast.Name)
            and side.value.id == "Launcher"
            for side in [node.left, *node.comparators]
        )
    ]


def commands() -> set[str]:
    """The modules the command table of `__main__.py` names (`"hostsync.commands.repro:main"`)."""
    tree = ast.parse((ENGINE / "__main__.py").read_text())
    targets = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and ":" in node.value
    ]
    return {target.split(":")[0] for target in targets if target.startswith("hostsync.")}


def command_imports() -> list[str]:
    """Each import of one command by another: what two commands share belongs to a layer."""
    named, graph = commands(), import_graph()
    return [
        f"{module} imports {imported}"
        for module in sorted(named)
        for imported in sorted(graph.get(module, set()) & named)
    ]


def detector_escapes() -> list[str]:
    """Each import from the detector package into the rest of the workspace: the wheel's
    plugin loads the detector alone."""
    inside = "hostsync.detector"
    return [
        f"{module} imports {imported}"
        for module, imported_modules in sorted(import_graph().items())
        if module == inside or module.startswith(inside + ".")
        for imported in sorted(imported_modules)
        if not (imported == inside or imported.startswith(inside + ".")) and imported != "hostsync"
    ]


def _finder(module: str) -> str | None:
    """The site-finding package `module` lies in, if any."""
    return next((p for p in SITE_FINDERS if module == p or module.startswith(p + ".")), None)


def finder_imports(graph: dict[str, set[str]] | None = None) -> list[str]:
    """Each import from one site-finding package into another: what they share is the site
    layer's."""
    graph = import_graph() if graph is None else graph
    return [
        f"{module} imports {imported}"
        for module, imported_modules in sorted(graph.items())
        for imported in sorted(imported_modules)
        if _finder(module) and _finder(imported) and _finder(module) != _finder(imported)
    ]


def finders_off_the_site_layer(graph: dict[str, set[str]] | None = None) -> list[str]:
    """Each site-finding package no module of which imports the site layer."""
    graph = import_graph() if graph is None else graph
    return [
        package
        for package in SITE_FINDERS
        if not any(
            _finder(module) == package and any(i.startswith(SITE_LAYER) for i in imported)
            for module, imported in graph.items()
        )
    ]


def docstring_sentences(modules: dict[str, Path] | None = None) -> list[int]:
    """The length in words of each sentence of the engine's docstrings. A sentence ends at `.`,
    `!` or `?`; a code span counts as one word."""
    modules = engine_modules() if modules is None else modules
    holders = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    found = []
    for path in modules.values():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            text = ast.get_docstring(node) if isinstance(node, holders) else None
            spans = re.sub(r"`[^`]*`", "X", " ".join((text or "").split()))
            found += [len(s.split()) for s in re.split(r"(?<=[.!?])\s+", spans) if s.split()]
    return found


def back_edges() -> list[str]:
    """Each import that climbs from a module's floor to a higher one."""
    table = floors()
    floored = {m for m in engine_modules() if floor_of(m, table) is not None}
    return [
        f"{module} (floor {floor_of(module, table)}) imports {imported}"
        f" (floor {floor_of(imported, table)})"
        for module, imported_modules in sorted(import_graph().items())
        for imported in sorted(imported_modules & floored)
        if module in floored and floor_of(imported, table) > floor_of(module, table)
    ]


def main() -> int:
    graph = import_graph()
    untyped, total = untyped_signatures()
    scripts = rank_scripts()
    untyped_scripts, script_functions = untyped_signatures(scripts)
    if "--list" in sys.argv:
        print("\n".join(untyped + untyped_scripts))
    print(f"modules: {len(graph)}, imports between them: {sum(map(len, graph.values()))}")
    print(f"floors: {len(floors())}, back-edges: {len(back_edges())}, cycles: {len(cycles(graph))}")
    print(
        f"commands: {len(commands())}, imports between them: {len(command_imports())},"
        f" detector imports outside it: {len(detector_escapes())}"
    )
    print(
        f"site finders: {len(SITE_FINDERS)}, imports between them: {len(finder_imports(graph))},"
        f" not on the site layer: {len(finders_off_the_site_layer(graph))}"
    )
    print(f"untyped signatures: {len(untyped)} of {total} functions (--list names them)")
    sentences = docstring_sentences()
    print(f"docstring sentences: {len(sentences)}, median words: {statistics.median(sentences)}")
    print(
        f"rank scripts: {len(scripts)}, untyped signatures: {len(untyped_scripts)} of"
        f" {script_functions} functions, not returning their record: "
        f"{len(unrecorded_rank_scripts())}, imports beyond the allowed: "
        f"{len(rank_script_escapes())}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
