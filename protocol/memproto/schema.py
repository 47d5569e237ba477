"""Validation of decoded msgpack maps against frame dataclasses.

Each wire dataclass is described once, by its type hints; they are compiled into
checkers at the class's first decode, so decoding costs a dict lookup and a type check
per field. Errors carry the path of the offending field (``pids[2]``,
``process.rss_bytes``). Keys a class does not know are ignored: a newer peer may add
optional fields without breaking an older one.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from .errors import ProtocolError

Checker = Callable[[Any, str], Any]
T = TypeVar("T")

_MISSING = dataclasses.MISSING


class _Spec(typing.NamedTuple):
    name: str
    check: Checker
    required: bool
    default: Any
    default_factory: Any


def _type_name(value: object) -> str:
    return "nil" if value is None else type(value).__name__


def _fail(path: str, expected: str, value: object) -> typing.NoReturn:
    raise ProtocolError(f"expected {expected}, got {_type_name(value)}", field=path)


def _check_int(value: Any, path: str) -> int:
    if type(value) is not int:
        _fail(path, "int", value)
    return value


def _check_float(value: Any, path: str) -> float:
    if type(value) is float:
        return value
    if type(value) is int:
        return float(value)
    _fail(path, "float", value)


def _check_str(value: Any, path: str) -> str:
    if type(value) is not str:
        _fail(path, "str", value)
    return value


def _check_bool(value: Any, path: str) -> bool:
    if type(value) is not bool:
        _fail(path, "bool", value)
    return value


def _check_scalar(value: Any, path: str) -> Any:
    if type(value) in (int, float, bool, str) or value is None:
        return value
    _fail(path, "int, float, bool, str or nil", value)


def _check_any(value: Any, path: str) -> Any:
    """``Any``: the frame's own ``validate()`` checks these values (sample rows)."""
    return value


_SCALARS: dict[Any, Checker] = {
    int: _check_int,
    float: _check_float,
    str: _check_str,
    bool: _check_bool,
    object: _check_scalar,
    Any: _check_any,
}


def _optional(inner: Checker) -> Checker:
    def check(value: Any, path: str) -> Any:
        return None if value is None else inner(value, path)

    return check


def _list_of(inner: Checker) -> Checker:
    if inner is _check_any:
        def check_shallow(value: Any, path: str) -> list[Any]:
            if type(value) is not list:
                _fail(path, "array", value)
            return value

        return check_shallow

    def check(value: Any, path: str) -> list[Any]:
        if type(value) is not list:
            _fail(path, "array", value)
        return [inner(item, f"{path}[{i}]") for i, item in enumerate(value)]

    return check


def _nested(cls: type) -> Checker:
    def check(value: Any, path: str) -> Any:
        if type(value) is not dict:
            _fail(path, "map", value)
        return from_wire(cls, value, prefix=f"{path}.")

    return check


def _checker_for(tp: Any) -> Checker:
    if tp in _SCALARS:
        return _SCALARS[tp]
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise TypeError(f"unsupported union {tp!r}")
        return _optional(_checker_for(rest[0]))
    if origin is list:
        return _list_of(_checker_for(args[0]))
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _nested(tp)
    raise TypeError(f"unsupported wire type {tp!r}")


def wire(cls: type[T]) -> type[T]:
    """Class decorator: mark a dataclass as a wire type. Its fields are compiled into a
    decoding spec at its first decode (:func:`_spec_of`), not here: a command that decodes
    three kinds of frame does not pay for the other forty (issue 26, the CLI's start)."""
    _WIRE.add(cls)
    return cls


_WIRE: set[type] = set()
_SPECS: dict[type, tuple[_Spec, ...]] = {}


def _spec_of(cls: type) -> tuple[_Spec, ...]:
    spec = _SPECS.get(cls)
    if spec is None:
        if cls not in _WIRE:
            raise TypeError(f"{cls.__name__} is not a wire type (@wire)")
        hints = typing.get_type_hints(cls)
        specs = []
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            required = f.default is _MISSING and f.default_factory is _MISSING
            specs.append(_Spec(f.name, _checker_for(hints[f.name]), required, f.default, f.default_factory))
        spec = _SPECS[cls] = tuple(specs)
    return spec


def compile_all() -> None:
    """Compile every wire type's spec now (a daemon before its first client; a test that
    every declared type compiles)."""
    for cls in list(_WIRE):
        _spec_of(cls)


def from_wire(cls: type[T], data: dict[Any, Any], prefix: str = "") -> T:
    """Build ``cls`` from a decoded map, raising :class:`ProtocolError` naming the field."""
    kwargs: dict[str, Any] = {}
    for spec in _SPECS.get(cls) or _spec_of(cls):
        if spec.name in data:
            kwargs[spec.name] = spec.check(data[spec.name], prefix + spec.name)
        elif spec.required:
            raise ProtocolError("missing required field", field=prefix + spec.name)
        elif spec.default_factory is not _MISSING:
            kwargs[spec.name] = spec.default_factory()
        else:
            kwargs[spec.name] = spec.default
    return cls(**kwargs)


def to_wire(obj: Any) -> Any:
    """Turn a wire dataclass (and what it nests) into plain msgpack-able values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_wire(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list | tuple):
        # Lists are homogeneous in this protocol: a list of scalars needs no walk
        # (a history series holds 600 ints per process).
        if not obj or type(obj[0]) in _PLAIN:
            return obj
        return [to_wire(item) for item in obj]
    return obj


_PLAIN = (int, float, str, bool, type(None))
