"""memproto.frames and memproto.records serve their names from submodules imported at
first use (issue 26: a command creates the classes it uses). The indexes that make that
possible are a second list of what the modules declare: these tests keep them true."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import pkgutil
from pathlib import Path

import memproto
from memproto import frames, records
from memproto.frames import FRAME_TYPES, FRAMES, Frame


def _declared(package: object) -> dict[str, str]:
    """Every public class and constant each submodule of ``package`` declares itself."""
    out: dict[str, str] = {}
    for info in pkgutil.iter_modules(package.__path__):  # type: ignore[attr-defined]
        module = importlib.import_module(f"{package.__name__}.{info.name}")  # type: ignore[attr-defined]
        for name, value in vars(module).items():
            own = getattr(value, "__module__", None) == module.__name__ or (name.isupper() and name in module.__dict__
                                                                           and not inspect.ismodule(value))
            if not name.startswith("_") and own and (inspect.isclass(value) or name.isupper()):
                out.setdefault(name, module.__name__)
    return out


def _type_checking_names(package: object) -> set[str]:
    """The names the package's ``if TYPE_CHECKING:`` block re-exports (what mypy sees)."""
    tree = ast.parse(Path(package.__file__).read_text())  # type: ignore[attr-defined]
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    return {alias.asname or alias.name for n in block.body if isinstance(n, ast.ImportFrom) for alias in n.names}


def test_every_frame_is_in_the_index_under_its_own_tag_and_module() -> None:
    declared = {name: home for name, home in _declared(frames).items()
                if inspect.isclass(getattr(importlib.import_module(home), name))}
    frame_classes = {name for name, home in declared.items()
                     if issubclass(getattr(importlib.import_module(home), name), Frame) and name != "Frame"}
    assert frame_classes == {entry.name for entry in FRAMES}
    for entry in FRAMES:
        cls = FRAME_TYPES[entry.tag]
        assert (cls.__name__, cls.TYPE, cls.__module__) == (entry.name, entry.tag, f"memproto.frames{entry.module}")
    assert len({entry.tag for entry in FRAMES}) == len(FRAMES) == len(FRAME_TYPES)


def test_the_roles_list_requests_replies_and_events() -> None:
    assert {cls.TYPE for cls in frames.REQUESTS} == {"attach", "detach", "reset_peaks", "list", "subscribe",
                                                      "unsubscribe", "history", "status", "stack"}
    assert all(cls.TYPE.endswith("_ok") or cls.TYPE in ("ack", "error") for cls in frames.REPLIES)
    assert {cls.TYPE for cls in (*frames.REQUESTS, *frames.REPLIES, *frames.EVENTS)} == set(FRAME_TYPES) - {"hello"}


def test_every_record_is_served_from_where_it_is_declared() -> None:
    declared = _declared(records)
    assert records._HOMES == declared
    assert _type_checking_names(records) == set(declared)


def test_memproto_and_frames_serve_every_frame_and_record() -> None:
    every = {entry.name for entry in FRAMES} | set(records._HOMES) | {"Frame"}
    assert set(frames._HOMES) == every
    assert _type_checking_names(frames) == {entry.name for entry in FRAMES} | {"Frame"}
    for name in every:
        assert getattr(memproto, name) is getattr(frames, name) is getattr(
            importlib.import_module(frames._HOMES[name]), name)
        assert name in dir(memproto)


def test_a_name_nobody_declares_is_an_attribute_error() -> None:
    for module in (memproto, frames, records):
        try:
            module.NoSuchFrame  # type: ignore[attr-defined]  # noqa: B018
        except AttributeError as exc:
            assert "NoSuchFrame" in str(exc)
        else:
            raise AssertionError(f"{module.__name__} served a name it does not have")


def test_frame_types_is_a_mapping_of_every_tag() -> None:
    assert "hello" in FRAME_TYPES and "nonsense" not in FRAME_TYPES
    assert FRAME_TYPES.get("nonsense") is None
    assert dataclasses.is_dataclass(FRAME_TYPES.get("sample"))
    assert list(FRAME_TYPES) == [entry.tag for entry in FRAMES]
