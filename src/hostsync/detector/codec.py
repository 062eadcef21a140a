"""JSON in and out of frozen dataclasses, field by field: the codec every record and card uses.

`load` checks the type of every field on the way in and raises `RecordError` naming the field's
path (`runs[3].ranks: ...`), so a bad document is refused where it is read. What types cannot
say, a record's `__post_init__` refuses with a `RecordError` naming its own field, and `load`
names it at the record's path. Standard library only: this module is the ground floor of the
engine's imports.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, Self, TypeVar

Json = Any  # None, bool, int, float, str, list of Json, or dict of str to Json
R = TypeVar("R", bound="Record")
T = TypeVar("T")
# A field's metadata: its keys sit at the top level of the enclosing document.
FLAT = {"flat": True}
# A field's metadata: left out of the document while it holds its default.
OPTIONAL = {"optional": True}


class RecordError(ValueError):
    """A document that does not hold a record: `where` is the field's path in it."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}" if where else problem)
        self.where, self.problem = where, problem


class Record:
    """A frozen dataclass that reads and writes itself as JSON, field by field."""

    def to_json(self) -> dict[str, Json]:
        out: dict[str, Json] = {}
        for item in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, item.name)
            if item.metadata.get("optional") and value == _default(item):
                continue
            if item.metadata.get("flat"):
                out.update(dump(value))
            else:
                out[item.name] = dump(value)
        return out

    @classmethod
    def from_json(cls, data: Json, where: str = "") -> Self:
        if not isinstance(data, dict):
            raise RecordError(where, f"expected an object, got {shown(data)}")
        return _made(cls, data, where)


def read_file(kind: type[R], path: Path) -> R:
    """The record a side file holds (a lock's holder, a rank's result, ...): a file that is no
    JSON, or not that record, is refused naming the file and the field."""
    try:
        document = json.loads(path.read_text())
    except ValueError as error:
        raise RecordError(str(path), f"is not JSON ({error})") from None
    try:
        return kind.from_json(document)
    except RecordError as error:
        raise RecordError(str(path), str(error)) from None


def write_file(record: Record, path: Path) -> None:
    """`record` as the JSON document `read_file` reads back."""
    path.write_text(json.dumps(record.to_json(), indent=2) + "\n")


class Strict(Record):
    """A table written by hand (a case card, a census setup): keys it does not know are refused,
    since a typo would otherwise be ignored."""

    @classmethod
    def from_json(cls, data: Json, where: str = "") -> Self:
        if isinstance(data, dict):
            _refuse_unknown(cls, data, where)
        return super().from_json(data, where)


def _inner(where: str, path: str) -> str:
    """The path `path` (a field, `launch[0].ranks`) inside the field at `where`."""
    return f"{where}.{path}" if where and path else where or path


def _made(kind: type[T], data: dict[str, Json], where: str) -> T:
    """A dataclass from the keys of `data` its fields read, each checked; what its own
    `__post_init__` refuses (a `RecordError` naming a field of its own) is named at `where`."""
    hints = _hints(kind)
    values = {}
    for item in dataclasses.fields(kind):  # type: ignore[arg-type]
        field_kind = hints[item.name]
        if item.metadata.get("flat"):
            # A flat record reads its own keys; a flat mapping the keys no field claims.
            unclaimed = {k: v for k, v in data.items() if k not in _claimed(kind)}
            values[item.name] = load(
                field_kind, data if _is_record(field_kind) else unclaimed, where
            )
        elif item.name in data:
            values[item.name] = load(field_kind, data[item.name], _inner(where, item.name))
        elif _default(item) is dataclasses.MISSING:
            raise RecordError(_inner(where, item.name), "is missing")
    try:
        return kind(**values)
    except RecordError as error:
        raise RecordError(_inner(where, error.where), error.problem) from None


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(kind: type) -> dict[str, Any]:
    """A record's field types, resolved once per class: resolving them compiles each
    annotation's text again, which costs more than reading the record."""
    if kind not in _HINTS:
        _HINTS[kind] = typing.get_type_hints(kind)
    return _HINTS[kind]


def _refuse_unknown(kind: type, data: dict[str, Json], where: str) -> None:
    """Keys no field of `kind` reads are refused: in a table written by hand, a typo."""
    known = {item.name for item in dataclasses.fields(kind)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise RecordError(where, f"has unknown keys {unknown}: use {sorted(known)}")


def _is_record(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, Record)


def _claimed(cls: type) -> set[str]:
    """The keys of a document that `cls`'s fields read: its own names, and those of the records
    flattened into it."""
    hints = _hints(cls)
    found = set()
    for item in dataclasses.fields(cls):
        if not item.metadata.get("flat"):
            found.add(item.name)
        elif _is_record(hints[item.name]):
            found |= _claimed(hints[item.name])
    return found


def _default(item: dataclasses.Field) -> Any:
    if item.default is not dataclasses.MISSING:
        return item.default
    if item.default_factory is not dataclasses.MISSING:
        return item.default_factory()
    return dataclasses.MISSING


def dump(value: Any) -> Json:
    """A record, enum or container of them as plain JSON values."""
    if isinstance(value, Record):
        return value.to_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: dump(v) for k, v in dataclasses.asdict(value).items() if v is not None}
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, tuple | list):
        return [dump(item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): dump(item) for key, item in value.items()}
    if isinstance(value, Path):
        return str(value)
    return value


def load(kind: Any, data: Json, where: str) -> Any:
    """`data` as a value of type `kind`, checked all the way down."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return data
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        problems = []
        for option in (a for a in args if a is not type(None)):
            try:
                return load(option, data, where)
            except RecordError as error:
                problems.append(error.problem)
        raise RecordError(where, " or ".join(dict.fromkeys(problems)))
    if origin is tuple:
        if not isinstance(data, list):
            raise RecordError(where, f"expected a list, got {shown(data)}")
        item = args[0]
        return tuple(load(item, value, f"{where}[{i}]") for i, value in enumerate(data))
    if origin in (dict, Mapping):
        if not isinstance(data, dict):
            raise RecordError(where, f"expected an object, got {shown(data)}")
        return {key: load(args[1], value, _inner(where, key)) for key, value in data.items()}
    if isinstance(kind, type) and issubclass(kind, StrEnum):
        if data not in {member.value for member in kind}:
            choices = ", ".join(repr(member.value) for member in kind)
            raise RecordError(where, f"expected one of {choices}, got {shown(data)}")
        return kind(data)
    if isinstance(kind, type) and issubclass(kind, Record):
        return kind.from_json(data, where)
    if dataclasses.is_dataclass(kind):
        return _plain_dataclass(kind, data, where)
    return _scalar(kind, data, where)


def _plain_dataclass(kind: type, data: Json, where: str) -> Any:
    """A dataclass that is no record (an allow rule) reads as a `Strict` one does."""
    if not isinstance(data, dict):
        raise RecordError(where, f"expected an object, got {shown(data)}")
    _refuse_unknown(kind, data, where)
    return _made(kind, data, where)


_SCALARS = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def _scalar(kind: type, data: Json, where: str) -> Any:
    if kind is float and isinstance(data, int) and not isinstance(data, bool):
        return data  # a JSON number; kept as written, so a file reads back byte for byte
    if kind in _SCALARS:
        if not isinstance(data, kind) or (kind is int and isinstance(data, bool)):
            raise RecordError(where, f"expected {_SCALARS[kind]}, got {shown(data)}")
        return data
    if kind is type(None):
        if data is not None:
            raise RecordError(where, f"expected null, got {shown(data)}")
        return None
    raise TypeError(f"records cannot hold {kind!r}")  # a programming error, not bad input


def shown(data: Json) -> str:
    text = repr(data)
    return text if len(text) <= 40 else text[:37] + "..."
