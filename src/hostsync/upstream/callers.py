"""Who calls a function, read in a release's source: the calls that reach it, each at its line.

A draft says who gains from a fix by naming the callers of the changed function, each in the
release it was read in. Typed by hand, such a sentence is easily wrong: a project's trainers
may never call the function, or call it through another project's class. So the calls are
found on the syntax tree of the release's package, by the name they call.

For a method (`Accelerator.clip_grad_norm_`), `self.name(...)` and `super().name(...)` reach
it only where the class holding the call is the method's class, or inherits it unchanged (the
classes are followed by name through the package). A call on another receiver reaches it unless
the receiver is a module (`torch.nn.utils.clip_grad_norm_`). Its receiver's class is unknown:
where a class of the package outside the method's own defines that name too, the call is
marked unsure. For a function, `name(...)` and `module.name(...)` reach it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass

from hostsync.detector.codec import Record
from hostsync.upstream.presence import Sources, import_path
from hostsync.workspace.projects import Project

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclass(frozen=True)
class Call(Record):
    """One call of the function: its file (from the import root, as drafts cite it), line, the
    function holding it (`Class.method`) and its code; `sure` is False where the receiver may be
    of another class that has a method of that name; `passes`: the parameters it passes (`*`
    where it unpacks arguments, or passes some by position to a function not found)."""

    file: str
    line: int
    function: str
    code: str
    passes: tuple[str, ...]
    sure: bool = True


@dataclass(frozen=True)
class _Class:
    """A class of the package: its name, its bases' names and the methods it defines."""

    name: str
    bases: tuple[str, ...]
    methods: frozenset[str]


def calls(
    sources: Sources, project: Project, target: str, parameters: tuple[str, ...] = ()
) -> list[Call]:
    """The calls in `sources` (the package of `project`) that reach `target`, a function or
    `Class.method` whose `parameters` are known, in file and line order."""
    owner, _, name = target.rpartition(".")
    classes = _Classes(sources)
    found = []
    for path, text in sorted(sources.items()):
        tree = _parsed(text) if f"{name}(" in text else None
        if tree is None:
            continue
        file = import_path(path, project)
        lines, modules = text.splitlines(), _modules(tree)
        for call, scope, within in _calls_named(tree, name):
            reaches = _reaches(call, owner, within, classes, modules)
            if reaches is not None:
                code = lines[call.lineno - 1].strip()
                passes = _passes(call, parameters)
                found.append(Call(file, call.lineno, scope, code, passes, reaches))
    return found


def parameters(sources: Sources, target: str) -> tuple[str, ...] | None:
    """The parameters of `target` as a call passes them (a method's without `self`), from its
    definition in `sources`; None where `sources` do not define it."""
    owner, _, name = target.rpartition(".")
    for text in sources.values():
        if f"def {name}(" not in text or not (tree := _parsed(text)):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef if owner else ast.Module):
                continue
            if owner and getattr(node, "name", "") != owner:
                continue
            for function in getattr(node, "body", []):
                if isinstance(function, _FUNCTIONS) and function.name == name:
                    named = [a.arg for a in function.args.posonlyargs + function.args.args]
                    return tuple(named[1:] if owner else named)
    return None


def _passes(call: ast.Call, parameters: tuple[str, ...]) -> tuple[str, ...]:
    unpacked = any(isinstance(a, ast.Starred) for a in call.args)
    if unpacked or len(call.args) > len(parameters) or any(k.arg is None for k in call.keywords):
        return ("*",)
    return parameters[: len(call.args)] + tuple(k.arg for k in call.keywords if k.arg)


def _parsed(text: str) -> ast.Module | None:
    try:
        return ast.parse(text)
    except SyntaxError:  # a file of another grammar: no call of this release's Python is in it
        return None


def _calls_named(tree: ast.Module, name: str) -> Iterator[tuple[ast.Call, str, str]]:
    """Each call of `name` in `tree`, with the function holding it (`Class.method`, "" at the
    module's top) and the class holding that function ("" where none does)."""

    def visit(node: ast.AST, scope: str, within: str) -> Iterator[tuple[ast.Call, str, str]]:
        for child in ast.iter_child_nodes(node):
            inner, holder = scope, within
            if isinstance(child, ast.ClassDef):
                inner, holder = f"{scope}.{child.name}".lstrip("."), child.name
            elif isinstance(child, _FUNCTIONS):
                inner = f"{scope}.{child.name}".lstrip(".")
            elif isinstance(child, ast.Call) and _called(child) == name:
                yield child, scope, within
            yield from visit(child, inner, holder)

    yield from visit(tree, "", "")


def _called(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)


def _reaches(
    call: ast.Call, owner: str, within: str, classes: _Classes, modules: set[str]
) -> bool | None:
    """Whether the call reaches the target (a method of `owner`, or a function where `owner` is
    ""): True; False where it may, its receiver's class unknown; None where it does not."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return None if owner else True
    root = func.value
    while isinstance(root, ast.Attribute):
        root = root.value
    on_module = isinstance(root, ast.Name) and root.id in modules and root.id != owner
    if not owner:  # a function: called by its name, alone or through a module
        return True if on_module else None
    if on_module:
        return None
    own = isinstance(func.value, ast.Name) and func.value.id in ("self", "cls")
    parent = isinstance(func.value, ast.Call) and _called(func.value) == "super"
    if (own or parent) and within:
        start = classes(within) if own else _bases(classes(within), classes)
        definers, left = _definers(func.attr, start, classes)
        if owner in definers or (left and not definers and not classes(owner)):
            return True  # the method's class, or a base outside the package that may be it
        return None
    others = classes.defining(func.attr) - {owner}
    return all(owner in _ancestors(name, classes) for name in others)


class _Classes:
    """The package's classes by name, each file parsed when a class it may define is asked for
    (several files may define one name)."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources
        self._read: dict[str, list[_Class]] = {}
        self._parsed: set[str] = set()

    def __call__(self, name: str) -> list[_Class]:
        if name not in self._read:
            for path, text in self.sources.items():
                if path not in self._parsed and re.search(rf"^\s*class {name}\b", text, re.M):
                    self._parse(path, text)
            self._read.setdefault(name, [])
        return self._read[name]

    def defining(self, method: str) -> set[str]:
        """The names of the classes that define `method`."""
        for path, text in self.sources.items():
            if path not in self._parsed and f"def {method}(" in text:
                self._parse(path, text)
        return {
            name for name, found in self._read.items() if any(method in c.methods for c in found)
        }

    def _parse(self, path: str, text: str) -> None:
        self._parsed.add(path)
        for node in ast.walk(_parsed(text) or ast.Module(body=[], type_ignores=[])):
            if isinstance(node, ast.ClassDef):
                bases = tuple(_name(base) for base in node.bases)
                methods = frozenset(n.name for n in node.body if isinstance(n, _FUNCTIONS))
                self._read.setdefault(node.name, []).append(_Class(node.name, bases, methods))


def _name(node: ast.expr) -> str:
    """A base class's own name: `ZeROOptimizer` of `zero.ZeROOptimizer`."""
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")


def _bases(found: list[_Class], classes: _Classes) -> list[_Class]:
    """The classes `found` derive from, or one standing for a base outside the package."""
    return [base for c in found for b in c.bases for base in classes(b)] or [
        _Class("", (), frozenset())
    ]


def _definers(method: str, start: list[_Class], classes: _Classes) -> tuple[set[str], bool]:
    """The names of the nearest classes from `start` up that define `method`, and whether a
    line of bases leaves the package before one does."""
    definers: set[str] = set()
    left = False
    queue = list(start)
    seen: set[_Class] = set()
    while queue:
        current = queue.pop()
        if current in seen:
            continue
        seen.add(current)
        if method in current.methods:
            definers.add(current.name)
            continue
        inside = [c for b in current.bases for c in classes(b)]
        left = left or not inside
        queue += inside
    return definers, left


def _ancestors(name: str, classes: _Classes) -> set[str]:
    """The names of the classes `name` inherits from, within the package."""
    found: set[str] = set()
    queue = [name]
    while queue:
        for c in classes(queue.pop()):
            new = [b for b in c.bases if b not in found and classes(b)]
            found |= set(new)
            queue += new
    return found


def _modules(tree: ast.Module) -> set[str]:
    """The names a module binds to other modules by `import` (`torch`, `nn` of `from torch
    import nn` too: a name imported from a package may be a module)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names
