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

Only the project's package is read (not its tests, which may quote the code), and nothing is
unpacked or built: sdists are read as they are cached, git revisions through `git archive`.
"""

from __future__ import annotations

import ast
import dataclasses
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from hostsync.cases import Sdist
from hostsync.layout import Layout
from hostsync.projects import PROJECTS, Project
from hostsync.records import Finding, Presence, SiteLocation
from hostsync.sites import AllowRule, Site, suffix_matches
from hostsync.upstream.git import git
from hostsync.upstream.sdists import fetch_sdist

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
        if member.isfile() and path.startswith(prefix) and path.endswith(".py"):
            found[path] = tar.extractfile(member).read().decode(errors="replace")
    return found


def sdist_sources(layout: Layout, sdist: Sdist, project: Project) -> Sources:
    """The package's source in a release's sdist, downloaded once into the shared cache and
    verified against the index's sha256."""
    with tarfile.open(fetch_sdist(layout, sdist)) as tar:
        return read_package(tar, project)


def git_sources(repo: Path, revision: str, project: Project) -> Sources:
    """The package's source at `revision` of the git repository `repo` (a clone or mirror)."""
    folder = package_dir(project)
    if git(repo, "cat-file", "-e", f"{revision}:{folder}", check=False).returncode != 0:
        return {}
    with tempfile.NamedTemporaryFile(suffix=".tar") as archive:
        git(repo, "archive", "--format=tar", "--prefix=tree/", f"--output={archive.name}",
            revision, "--", folder)  # fmt: skip
        with tarfile.open(archive.name) as tar:
            return read_package(tar, project)


# --- finding a site ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Scope:
    """A function of a file: its name, its name with its classes (`Trainer.train`), its lines."""

    name: str
    qualname: str
    start: int
    end: int


@dataclass
class _Parsed:
    """One file of the package, as the search reads it."""

    path: str  # from the tree's top
    file: str  # from the import root, as the detector names a site's file
    lines: list[str]
    scopes: list[_Scope]
    calls: list[tuple[str, int]]  # (the name called, its line)

    def scope_at(self, line: int) -> _Scope | None:
        """The innermost function holding `line`."""
        holding = [s for s in self.scopes if s.start <= line <= s.end]
        return min(holding, key=lambda s: s.end - s.start, default=None)

    def site(self, line: int) -> Site:
        scope = self.scope_at(line)
        return Site(self.file, line, scope.name if scope else "", self.lines[line - 1].strip())

    def location(self, line: int) -> SiteLocation:
        scope = self.scope_at(line)
        return SiteLocation(self.path, line, scope.qualname if scope else "",
                            self.lines[line - 1].strip())  # fmt: skip


def _import_path(path: str, project: Project) -> str:
    """A path from the tree's top as the detector names a site's file: from the import root."""
    return str(PurePosixPath(path).relative_to(PurePosixPath(project.import_root)))


def _parse(path: str, text: str, project: Project) -> _Parsed:
    scopes, calls = [], []
    try:
        tree = ast.parse(text)
    except SyntaxError:  # Python 2 or a newer grammar: searched as text, without functions
        tree = ast.Module(body=[], type_ignores=[])

    def visit(node: ast.AST, outer: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = outer
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                inner = f"{outer}.{child.name}" if outer else child.name
                if not isinstance(child, ast.ClassDef):
                    scopes.append(_Scope(child.name, inner, child.lineno, child.end_lineno))
            elif isinstance(child, ast.Call):
                func = child.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
                if name:
                    calls.append((name, child.lineno))
            visit(child, inner)

    visit(tree, "")
    return _Parsed(path, _import_path(path, project), text.splitlines(), scopes, calls)


def _candidates(rule: AllowRule, parsed: _Parsed) -> Iterator[int]:
    """The lines of `parsed` that may hold the rule's site: those holding its code, else the
    first line of each function of its name (the rule names the whole function)."""
    if rule.code:
        yield from (n for n, line in enumerate(parsed.lines, 1) if rule.code in line)
    elif rule.function:
        yield from (s.start for s in parsed.scopes if s.name == rule.function)


def _sites(rule: AllowRule, files: list[_Parsed], anywhere: bool) -> list[tuple[_Parsed, Site]]:
    """The lines of `files` the rule, its caller aside, accepts. `anywhere` looks past the place
    it names: its code in any file and function, or without code its function in any file."""
    found = []
    for parsed in files:
        own = dataclasses.replace(rule, caller=None, line=None)
        if anywhere:
            function = None if rule.code else rule.function
            own = dataclasses.replace(own, file=parsed.file, function=function)
        found += [(parsed, site) for site in map(parsed.site, _candidates(rule, parsed))
                  if own.matches(site)]  # fmt: skip
    return found


class _Tree:
    """One tree's sources, each file parsed when first needed."""

    def __init__(self, sources: Sources, project: Project) -> None:
        self.sources, self.project = sources, project
        self._parsed: dict[str, _Parsed] = {}

    def files(self, holding: str = "", suffix: str = "") -> list[_Parsed]:
        """The files whose text holds `holding` and whose import path ends with `suffix`."""
        paths = [path for path, text in sorted(self.sources.items()) if holding in text
                 and (not suffix or suffix_matches(_import_path(path, self.project), suffix))
                 ]  # fmt: skip
        for path in paths:
            if path not in self._parsed:
                self._parsed[path] = _parse(path, self.sources[path], self.project)
        return [self._parsed[path] for path in paths]


def _calls_from_caller(rule: AllowRule, sites: list[tuple[_Parsed, Site]],
                       tree: _Tree) -> list[SiteLocation]:  # fmt: skip
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
        return any(scope.name == function
                   for parsed in tree.files(holding=f"def {function}(", suffix=file)
                   for scope in parsed.scopes)  # fmt: skip
    return bool(place) and (rule.function is None or _defines(place, rule.function))


def _defines(files: list[_Parsed], function: str | None) -> bool:
    return function is not None and any(s.name == function for p in files for s in p.scopes)


def locate(rule: AllowRule, sources: Sources, project: Project) -> Finding:
    """Whether `sources` (one tree of `project`) carry the site `rule` names, and where."""
    tree = _Tree(sources, project)
    place = tree.files(suffix=rule.file)
    presence, sites = Presence.PRESENT, _sites(rule, place, anywhere=False)
    if not sites and not _defines(place, rule.function):
        holding = rule.code or f"def {rule.function}("
        presence, sites = Presence.ELSEWHERE, _sites(rule, tree.files(holding), anywhere=True)
    if rule.caller:
        found = _calls_from_caller(rule, sites, tree)
    else:
        found = [parsed.location(site.line) for parsed, site in sites]
    if found:
        return Finding(presence, tuple(found))
    return Finding(Presence.ABSENT if _code_under_test(rule, place, tree) else Presence.MISSING)


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
            lacking += [f"{alias.name} from {node.module}" for alias in node.names
                        if alias.name != "*" and alias.name not in defined]  # fmt: skip
    return list(dict.fromkeys(lacking))


def _top_level_names(text: str) -> set[str] | None:
    """The names a module defines at import (through its `if` and `try` blocks too), or None
    when it makes names on demand (a module `__getattr__`)."""
    names: set[str] = set()
    blocks = [ast.parse(text).body]
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
    return None if "__getattr__" in names else names


def described(rule: AllowRule) -> str:
    """A site in words, as a report names it: `code` in function() (file), called from X()."""
    words = " in ".join(
        part for part in (rule.code and f"`{rule.code}`", rule.function and f"{rule.function}()")
        if part
    )  # fmt: skip
    called = f", called from {rule.caller}()" if rule.caller else ""
    return f"{words} ({rule.file}){called}"
