"""Whether a release's source carries a site, read straight from its sdist or a git revision.

A site is named as a case card's `[[carries]]` names it (`sites.AllowRule`: a file suffix, a
function, a code fragment, a caller), and judged on the source the way the hunt judges a
recorded site: each line holding the code, in the function it lies in, must match the rule.
A rule with a `caller` is a read inside a shared helper that counts only when that caller
calls it, so it is found where the caller calls the helper. Lines move between releases and
are ignored. Where the place the rule names is gone (its function is not in its file; for a rule
without one, its file lacks the code), the rest of the package is searched for its code (or its
function), since code moves: a method of the Trainer becomes a function of an integration module,
a loop is split into functions of other names. A function still in place without the code has
lost the site, whatever other files hold.

Code is matched on its syntax tree, not its text, where the rule's code parses: local names (a
function's parameters and the names it assigns) are abstracted, so `num_valid > 0` is also found
as `total_tokens > 0`, though not as `self.num_virtual_tokens > 0`. A call left open
(`self._metrics[mode]["entropy"].append(`) is its callee called with any arguments, and a local
name passed to it leads to the statement that assigned it: the read of `entropy = ....item()`
that a later line appends. A function renamed or moved
is followed by its body: given the body it has in a release that carries the site (`reference`),
the function of the package most like it stands in for it, and where none is like it, the
anchor's reads (its statements that call `.item()`, `.tolist()`, `float`, `int` or `bool`) are
looked for in the rule's file, where an inlined function left them.

Only the project's package is read (not its tests, which may quote the code), and nothing is
unpacked or built: sdists are read as they are cached, git revisions through `git archive`.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import difflib
import functools
import re
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TypeGuard

from hostsync.detector.sites import AllowRule, Site, suffix_matches
from hostsync.upstream.git import git
from hostsync.upstream.records import Finding, Presence
from hostsync.upstream.sdists import fetch_sdist
from hostsync.workspace.cases import Sdist
from hostsync.workspace.layout import Layout
from hostsync.workspace.projects import PROJECTS, Project

# The file of a package's source: its path from the tree's top, and its text.
Sources = dict[str, str]


def package_dir(project: Project) -> str:
    """Where the project's package lies in a tree: `src/transformers`, `deepspeed`."""
    return str(PurePosixPath(project.import_root) / project.name)


def read_package(tar: tarfile.TarFile, project: Project) -> Sources:
    """The package's Python files in `tar`, whose members lie in one top folder (as in an sdist,
    or a `git archive --prefix`), by their path below it."""
    prefix = package_dir(project) + "/"
    found = {}
    for member in tar:
        path = member.name.partition("/")[2]
        python = member.isfile() and path.startswith(prefix) and path.endswith(".py")
        if python and (data := tar.extractfile(member)):
            found[path] = data.read().decode(errors="replace")
    return found


def sdist_sources(layout: Layout, sdist: Sdist, project: Project) -> Sources:
    """The package's source in a release's sdist, downloaded once into the shared cache and
    verified against the index's sha256. The last four read are kept, shared read-only by their
    callers: a verified sdist never changes, and a transformers release's source is tens of
    megabytes."""
    return _verified_sources(fetch_sdist(layout, sdist).resolve(), sdist.sha256, project)


@functools.lru_cache(maxsize=4)
def _verified_sources(path: Path, sha256: str, project: Project) -> Sources:
    """The package's source in the sdist at `path`, whose content `sha256` names."""
    with tarfile.open(path) as tar:
        return read_package(tar, project)


def git_sources(repo: Path, revision: str, project: Project) -> Sources:
    """The package's source at `revision` of the git repository `repo` (a clone or mirror)."""
    folder = package_dir(project)
    if git(repo, "cat-file", "-e", f"{revision}:{folder}", check=False).returncode != 0:
        return {}
    with tempfile.NamedTemporaryFile(suffix=".tar") as archive:
        git(
            repo,
            "archive",
            "--format=tar",
            "--prefix=tree/",
            f"--output={archive.name}",
            revision,
            "--",
            folder,
        )
        with tarfile.open(archive.name) as tar:
            return read_package(tar, project)


# --- finding a site ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Scope:
    """A function of a file: its name, its name with its classes (`Trainer.train`), its lines,
    its syntax tree."""

    name: str
    qualname: str
    start: int
    end: int
    node: ast.FunctionDef | ast.AsyncFunctionDef = dataclasses.field(compare=False, repr=False)


@dataclass
class _Parsed:
    """One file of the package, as the search reads it."""

    path: str  # from the tree's top
    file: str  # from the import root, as the detector names a site's file
    lines: list[str]
    scopes: list[_Scope]
    calls: list[tuple[str, int]]  # (the name called, its line)
    module_names: frozenset[str]  # what the module defines or imports: never abstracted
    parses: bool  # False: the file is searched as text

    def scope_at(self, line: int) -> _Scope | None:
        """The innermost function holding `line`."""
        holding = [s for s in self.scopes if s.start <= line <= s.end]
        return min(holding, key=lambda s: s.end - s.start, default=None)

    def site(self, line: int) -> Site:
        scope = self.scope_at(line)
        return Site(self.file, line, scope.name if scope else "", self.lines[line - 1].strip())

    def location(self, line: int) -> Site:
        """The site at `line` as a finding names it: its file from the tree's top, its
        function as `Class.method`."""
        scope = self.scope_at(line)
        return Site(self.path, line, scope.qualname if scope else "", self.lines[line - 1].strip())


def import_path(path: str, project: Project) -> str:
    """A path from the tree's top as the detector names a site's file: from the import root."""
    return str(PurePosixPath(path).relative_to(PurePosixPath(project.import_root)))


def _parse(path: str, text: str, project: Project) -> _Parsed:
    scopes, calls, parses = [], [], True
    try:
        tree = ast.parse(text)
    except SyntaxError:  # Python 2 or a newer grammar: searched as text, without functions
        tree, parses = ast.Module(body=[], type_ignores=[]), False

    def visit(node: ast.AST, outer: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = outer
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                inner = f"{outer}.{child.name}" if outer else child.name
                if not isinstance(child, ast.ClassDef):
                    scopes.append(_Scope(child.name, inner, child.lineno, _end(child), child))
            elif isinstance(child, ast.Call):
                func = child.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
                if name:
                    calls.append((name, child.lineno))
            visit(child, inner)

    visit(tree, "")
    module_names = frozenset(_defined_names(tree.body) - {"__getattr__"})
    return _Parsed(
        path, import_path(path, project), text.splitlines(), scopes, calls, module_names, parses
    )


# --- code as a syntax tree, local names abstracted -----------------------------------------------

_LOCAL = "_"
_READS = frozenset({"item", "tolist"})
_READING_BUILTINS = frozenset({"float", "int", "bool"})
# How alike two bodies must be (difflib's ratio of their normalised tokens) to be one function.
SIMILAR = 0.75


@dataclass(frozen=True)
class _OpenCall:
    """A rule's code that is a call left open (`self._metrics[mode]["entropy"].append(`): that
    callee called with any arguments."""

    func: ast.AST


def _pattern(code: str | None) -> ast.expr | ast.stmt | _OpenCall | None:
    """The rule's code as a syntax tree (an expression left open after a call's parenthesis as
    that callee), or None where it is a fragment that does not parse (it is then matched as
    text)."""
    if not code:
        return None
    if code.rstrip().endswith("("):
        try:
            call = ast.parse(code.strip() + ")", mode="eval").body
        except SyntaxError:
            call = None
        if isinstance(call, ast.Call):
            return _OpenCall(call.func)
    try:
        return ast.parse(code.strip(), mode="eval").body
    except SyntaxError:
        pass
    try:
        body = ast.parse(code.strip()).body
    except SyntaxError:
        return None
    return body[0] if len(body) == 1 else None


def _local_names(function: ast.AST) -> set[str]:
    """A function's parameters and the names it binds."""
    names = {arg.arg for arg in ast.walk(function) if isinstance(arg, ast.arg)}
    names |= {
        node.id
        for node in ast.walk(function)
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load)
    }
    return names


class _Abstract(ast.NodeTransformer):
    def __init__(self, local: set[str] | None, keep: frozenset[str]) -> None:
        self.local, self.keep = local, keep

    def visit_Name(self, node: ast.Name) -> ast.AST:
        abstract = node.id in self.local if self.local is not None else node.id not in self.keep
        return ast.Name(_LOCAL, ast.Load()) if abstract else ast.Name(node.id, ast.Load())


def normalised(
    node: ast.AST, local: set[str] | None = None, keep: frozenset[str] = frozenset()
) -> str:
    """`node` without positions, its local names (`local`; for a fragment with no function
    around it, every name not in `keep` nor a builtin) replaced by one placeholder."""
    keep = keep | frozenset(dir(builtins))
    copied = _Abstract(local, keep).visit(ast.parse(ast.unparse(node)))
    return ast.dump(copied)


def _structural_lines(pattern: ast.expr | ast.stmt | _OpenCall, parsed: _Parsed) -> Iterator[int]:
    """The lines of `parsed`'s functions where a node has the pattern's normalised tree; for a
    call left open, each call of its callee and, for a local name passed to it, the statement
    that last assigned that name before (where a value is read, then passed on)."""
    if isinstance(pattern, _OpenCall):
        wanted = normalised(pattern.func, keep=parsed.module_names)
        for scope in parsed.scopes:
            local = _local_names(scope.node)
            for node in ast.walk(scope.node):
                if isinstance(node, ast.Call) and normalised(node.func, local) == wanted:
                    yield node.lineno
                    yield from _assigned_before(scope.node, node, local)
        return
    wanted = normalised(pattern, keep=parsed.module_names)
    kind = type(pattern)
    for scope in parsed.scopes:
        local = _local_names(scope.node)
        for node in ast.walk(scope.node):
            if isinstance(node, kind) and normalised(node, local) == wanted:
                yield node.lineno


def _assigned_before(function: ast.AST, call: ast.Call, local: set[str]) -> Iterator[int]:
    """The line of the last assignment before `call` to each local name it is passed."""
    for name in {arg.id for arg in call.args if isinstance(arg, ast.Name) and arg.id in local}:
        lines = [
            node.lineno
            for node in ast.walk(function)
            if isinstance(node, ast.Assign)
            and node.lineno < call.lineno
            and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
        ]
        if lines:
            yield max(lines)


def _candidates(rule: AllowRule, parsed: _Parsed, literal: bool = False) -> Iterator[int]:
    """The lines of `parsed` that may hold the rule's site: those holding its code (its syntax
    tree where it parses and not `literal`, else its text), else the first line of each
    function of its name (the rule names the whole function)."""
    pattern = _pattern(rule.code)
    if pattern is not None and parsed.parses and not literal:
        yield from sorted(set(_structural_lines(pattern, parsed)))
    elif rule.code:
        yield from (n for n, line in enumerate(parsed.lines, 1) if rule.code in line)
    elif rule.function:
        yield from (s.start for s in parsed.scopes if s.name == rule.function)


def _sites(rule: AllowRule, files: list[_Parsed], anywhere: bool) -> list[tuple[_Parsed, Site]]:
    """The lines of `files` the rule, its caller aside, accepts. `anywhere` looks past the place
    it names: its code's text in any file and function (its syntax tree, less particular, only
    in a function of the rule's name), or without code its function in any file."""
    found = []
    for parsed in files:
        # The candidates hold the code already, as text or as a syntax tree.
        own = dataclasses.replace(rule, caller=None, line=None, code=None)
        literal = False
        if anywhere:
            literal = bool(rule.code and any(rule.code in line for line in parsed.lines))
            function = None if literal else rule.function
            own = dataclasses.replace(own, file=parsed.file, function=function)
        found += [
            (parsed, site)
            for site in map(parsed.site, _candidates(rule, parsed, literal))
            if own.matches(site)
        ]
    return found


class _Tree:
    """One tree's sources, each file parsed when first needed."""

    def __init__(self, sources: Sources, project: Project) -> None:
        self.sources, self.project = sources, project
        self._parsed: dict[str, _Parsed] = {}

    def files(self, holding: str = "", suffix: str = "") -> list[_Parsed]:
        """The files whose text holds `holding` and whose import path ends with `suffix`."""
        paths = [
            path
            for path, text in sorted(self.sources.items())
            if holding in text
            and (not suffix or suffix_matches(import_path(path, self.project), suffix))
        ]
        for path in paths:
            if path not in self._parsed:
                self._parsed[path] = _parse(path, self.sources[path], self.project)
        return [self._parsed[path] for path in paths]


def _calls_from_caller(
    rule: AllowRule, sites: list[tuple[_Parsed, Site]], tree: _Tree
) -> list[Site]:
    """Where the rule's caller calls the functions `sites` lie in: a read inside a shared helper
    counts where that caller calls it."""
    helpers = {site.function: site for _, site in sites if site.function}
    found = []
    for helper, site in helpers.items():
        for parsed in tree.files(holding=f"{helper}("):
            for name, line in parsed.calls:
                scope = parsed.scope_at(line)
                if name == helper and scope and rule.matches(site, f"{parsed.file}:{scope.name}"):
                    found.append(parsed.location(line))
    return sorted(set(found), key=lambda at: (at.file, at.line))


def _code_under_test(rule: AllowRule, place: list[_Parsed], tree: _Tree) -> bool:
    """Whether the code the site lies in is there, so that the site's absence is a finding:
    the caller's function for a read inside a helper, else the rule's function in its file."""
    if rule.caller:
        file, _, function = rule.caller.rpartition(":")
        return any(
            scope.name == function
            for parsed in tree.files(holding=f"def {function}(", suffix=file)
            for scope in parsed.scopes
        )
    return bool(place) and (rule.function is None or _defines(place, rule.function))


def _defines(files: list[_Parsed], function: str | None) -> bool:
    return function is not None and any(s.name == function for p in files for s in p.scopes)


def locate(
    rule: AllowRule, sources: Sources, project: Project, reference: Body | None = None
) -> Finding:
    """Whether `sources` (one tree of `project`) carry the site `rule` names, and where; with
    `reference`, the body of the rule's function where the site is known, a function renamed,
    moved or inlined is followed."""
    tree = _Tree(sources, project)
    place = tree.files(suffix=rule.file)
    presence, sites = Presence.PRESENT, _sites(rule, place, anywhere=False)
    if not sites and not _defines(place, rule.function):
        holding = [text for text in (rule.code, rule.function and f"def {rule.function}(") if text]
        files = list({p.path: p for text in holding for p in tree.files(text)}.values())
        presence, sites = Presence.ELSEWHERE, _sites(rule, files, anywhere=True)
    if rule.caller:
        found = _calls_from_caller(rule, sites, tree)
    else:
        found = [parsed.location(site.line) for parsed, site in sites]
    if found:
        return Finding(presence, tuple(found))
    if reference is not None and rule.function and not rule.caller and not _defined(rule, tree):
        return _followed(rule, reference, tree, place)
    return Finding(Presence.ABSENT if _code_under_test(rule, place, tree) else Presence.MISSING)


def _defined(rule: AllowRule, tree: _Tree) -> bool:
    """Whether the package defines the rule's function under its own name, anywhere."""
    return _defines(tree.files(holding=f"def {rule.function}("), rule.function)


# --- following a function by its body -------------------------------------------------------------


@dataclass(frozen=True)
class Body:
    """A function's body in a release that carries the site: what a renamed, moved or inlined
    copy of it is recognised by."""

    tokens: tuple[str, ...]  # its normalised syntax tree, as tokens
    reads: frozenset[str]  # its statements that read a value on the host, normalised
    key: str  # its longest attribute or called name: the files that may hold a copy hold it
    lines: int  # how long it is: a function of another length is no copy of it


def _tokens(dump: str) -> tuple[str, ...]:
    return tuple(re.findall(r"\w+|[^\w\s]", dump))


def _reading(node: ast.AST) -> bool:
    """A call that reads a value on the host: `.item()`, `.tolist()`, `float(x)` of no literal."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr in _READS
    return (
        isinstance(func, ast.Name)
        and func.id in _READING_BUILTINS
        and len(node.args) == 1
        and not isinstance(node.args[0], ast.Constant)
    )


def _reads(function: ast.AST) -> Iterator[tuple[ast.stmt, str]]:
    """The function's statements that read on the host, each with the `if` it is the whole
    body of, and their normalised trees."""
    local = _local_names(function)
    parents = {child: node for node in ast.walk(function) for child in ast.iter_child_nodes(node)}
    seen = set()
    for node in ast.walk(function):
        if not _reading(node):
            continue
        while not isinstance(node, ast.stmt):
            node = parents[node]
        above = parents.get(node)
        if _guards_one(above):
            node = above
        if node not in seen:
            seen.add(node)
            yield node, normalised(node, local)


def _end(node: ast.stmt) -> int:
    """The statement's last line (parsed statements all have one)."""
    return node.end_lineno or node.lineno


def _guards_one(node: ast.AST | None) -> TypeGuard[ast.If]:
    """An `if` whose whole body is one statement: a read it guards is found as the `if`."""
    return isinstance(node, ast.If) and len(node.body) == 1 and not node.orelse


def lines_run(text: str, line: int) -> list[int]:
    """The lines that run the site found at `line` of a file's `text`: the body of a function
    found by its `def` (which runs at import, not when the function is called), the whole of an
    `if` guarding one statement (how an inlined read is found), the header of another compound
    statement, else the statement's lines."""
    try:
        tree = ast.parse(text)
    except SyntaxError:  # searched as text: the line alone
        return [line]
    starting = [n for n in ast.walk(tree) if isinstance(n, ast.stmt) and n.lineno == line]
    if not starting:
        return [line]
    node = max(starting, key=_end)
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return list(range(node.body[0].lineno, _end(node) + 1))
    body: list[ast.stmt] | None = getattr(node, "body", None)
    end = body[0].lineno - 1 if body and not _guards_one(node) else _end(node)
    return list(range(line, max(line, end) + 1))


def _body(scope: _Scope, at: set[int] | None = None) -> Body:
    """The function's body; its reads are those on the lines `at` (the site's), or all."""
    node = scope.node
    statements = node.body[1:] if ast.get_docstring(node) else node.body
    local = _local_names(node)
    dump = " ".join(normalised(statement, local) for statement in statements)
    names = [n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)]
    reads = frozenset(
        dump
        for statement, dump in _reads(node)
        if at is None or any(statement.lineno <= line <= _end(statement) for line in at)
    )
    return Body(_tokens(dump), reads, max(names or [scope.name], key=len), scope.end - scope.start)


def body_of(rule: AllowRule, sources: Sources, project: Project) -> Body | None:
    """The body of the rule's function in `sources` (in its file, else anywhere), or None. With
    the rule's code, only the reads at that code are the site's: the function's other reads
    found in an older release are not where this one began."""
    if not rule.function:
        return None
    tree = _Tree(sources, project)
    for files in (tree.files(suffix=rule.file), tree.files(holding=f"def {rule.function}(")):
        found = [
            (parsed, scope)
            for parsed in files
            for scope in parsed.scopes
            if scope.name == rule.function
        ]
        if found:
            parsed, scope = found[0]
            at = {site.line for _, site in _sites(rule, [parsed], False)} if rule.code else None
            return _body(scope, at)
    return None


def _followed(rule: AllowRule, reference: Body, tree: _Tree, place: list[_Parsed]) -> Finding:
    """The site in the function most like `reference` (renamed, moved), else the reference's
    reads where the rule's file has them (inlined); missing where neither is there."""
    best, best_ratio = None, SIMILAR
    for parsed in tree.files(holding=reference.key):
        for scope in parsed.scopes:
            if not reference.lines / 2 <= scope.end - scope.start <= reference.lines * 2:
                continue
            tokens = _body(scope).tokens
            matcher = difflib.SequenceMatcher(None, reference.tokens, tokens, autojunk=False)
            if matcher.real_quick_ratio() >= best_ratio and matcher.ratio() >= best_ratio:
                best, best_ratio = (parsed, scope), matcher.ratio()
    if best:
        parsed, scope = best
        renamed = dataclasses.replace(rule, file=parsed.file, function=scope.name)
        found = [parsed.location(site.line) for _, site in _sites(renamed, [parsed], False)]
        return Finding(Presence.ELSEWHERE if found else Presence.ABSENT, tuple(found))
    inlined = sorted(
        {
            parsed.location(node.lineno)
            for parsed in place
            for scope in parsed.scopes
            for node, dump in _reads(scope.node)
            if dump in reference.reads
        },
        key=lambda at: (at.file, at.line),
    )
    return Finding(Presence.ELSEWHERE, tuple(inlined)) if inlined else Finding(Presence.MISSING)


def project_of(rule: AllowRule, default: Project) -> Project:
    """The project whose tree holds a site: the one its file's package names (a case of
    transformers may carry a site of accelerate), else `default`."""
    return PROJECTS.get(PurePosixPath(rule.file).parts[0], default)


# --- what a test imports -------------------------------------------------------------------------


def undefined_imports(texts: list[str], sources: Sources, project: Project) -> list[str]:
    """What the test code `texts` imports from the project's modules that `sources` do not
    define, as `name from module`: code the tests exercise that this tree lacks. A package's
    names are not judged (its `__init__` may make them lazily), nor a module's with a
    `__getattr__`."""
    root = PurePosixPath(project.import_root)
    lacking = []
    for text in texts:
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            if node.module.split(".")[0] != project.name:
                continue
            module = root / node.module.replace(".", "/")
            if str(module / "__init__.py") in sources:
                continue
            text_of_module = sources.get(f"{module}.py")
            defined = _top_level_names(text_of_module) if text_of_module is not None else set()
            if defined is None:
                continue
            lacking += [
                f"{alias.name} from {node.module}"
                for alias in node.names
                if alias.name != "*" and alias.name not in defined
            ]
    return list(dict.fromkeys(lacking))


def _top_level_names(text: str) -> set[str] | None:
    """The names a module defines at import, or None when it makes names on demand (a module
    `__getattr__`)."""
    names = _defined_names(ast.parse(text).body)
    return None if "__getattr__" in names else names


def _defined_names(body: list[ast.stmt]) -> set[str]:
    """The names a module body defines at import, through its `if` and `try` blocks too."""
    names: set[str] = set()
    blocks = [body]
    while blocks:
        for node in blocks.pop():
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            elif isinstance(node, ast.Import | ast.ImportFrom):
                names |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, ast.If | ast.Try | ast.With):
                blocks += [getattr(node, name, []) for name in ("body", "orelse", "finalbody")]
                blocks += [handler.body for handler in getattr(node, "handlers", [])]
    return names


def described(rule: AllowRule) -> str:
    """A site in words, as a report names it: `code` in function() (file), called from X()."""
    words = " in ".join(
        part
        for part in (rule.code and f"`{rule.code}`", rule.function and f"{rule.function}()")
        if part
    )
    called = f", called from {rule.caller}()" if rule.caller else ""
    return f"{words} ({rule.file}){called}"


def located(site: Site) -> str:
    """Where a finding has a site, as a report names it: `file:line (Class.method)`."""
    return f"{site.file}:{site.line}" + (f" ({site.function})" if site.function else "")
