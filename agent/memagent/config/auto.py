"""Auto-attach settings: ``auto`` (executable names), ``auto_cmdline`` (command lines)
and ``auto_label`` (a label template), their checks, and the compiled forms the scanner
(:mod:`memagent.core.autoattach`) matches and renders with.

What a user writes is checked once, here, by the flag's type and the file's key alike: a
pattern or template that passes cannot fail or stall the daemon later. The keys
themselves are declared with the others in :mod:`memagent.config.sections`.

* A command-line pattern is matched against the process's argv joined by spaces, as
  ``ps`` shows it, cut to :data:`MAX_CMDLINE` characters. A plain pattern is a glob
  (``fnmatch``) over that whole line: ``*serve.py*`` is "contains". A glob with no ``*``
  at either end is tried against the line and against each suffix of it starting at an
  argument (``serve.py*`` matches ``python3 serve.py --port 1``), so a glob names the
  arguments from one of them on. ``re:REGEX`` is a Python regular expression, searched
  (unanchored, as process-exporter's ``cmdline`` regexes); its groups feed the label.
* Python's regular expressions backtrack: a regex with a repeat inside a repeat
  (``(a+)+``) can take exponential time, and one that takes more than
  :data:`SLOW_S` on a probe of long command lines is refused too (see :func:`_too_slow`).
* A label template holds text and ``{placeholder}``\\ s (``{{`` and ``}}`` are braces):
  :data:`BUILTINS`, a regex group's number or name, or alternatives ``{container|unit}``
  (the first with a value). A placeholder with no value gives the process's ``comm``.
"""

from __future__ import annotations

import fnmatch
import functools
import re
import string
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

try:  # Python 3.11 on
    from re import _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse  # type: ignore[no-redef]

from memproto.text import label_problem

from ..errors import ConfigError

#: The command line is matched up to this many characters: a backtracking regex costs up
#: to the square of the length or more (see :func:`_too_slow`); 1 KiB holds the program,
#: the script and the options that name a model on every line we know of.
MAX_CMDLINE = 1024
#: A pattern or template is at most this long.
MAX_PATTERN = 512
#: A regex slower than this on a probe command line of :data:`MAX_CMDLINE` is refused.
SLOW_S = 0.02
#: Placeholders every process has (``exe``, ``container`` and ``unit`` may have no value).
BUILTINS = ("comm", "exe", "container", "unit", "pid")
_NAME = re.compile(r"[0-9]+|[A-Za-z_][A-Za-z0-9_]*")



# ----------------------------------------------------------------------------- patterns


@dataclass(frozen=True)
class CmdlinePattern:
    """One compiled ``auto_cmdline`` pattern."""

    text: str
    regex: re.Pattern[str]
    #: A glob tried at each argument too (no ``*`` in front).
    per_argument: bool = False

    def search(self, cmdline: str) -> dict[str, str] | None:
        """The groups (by number, ``"0"`` the whole match, and by name) where it matches
        ``cmdline`` (cut to :data:`MAX_CMDLINE`); None where it does not."""
        line = cmdline[:MAX_CMDLINE]
        if self.per_argument:
            starts = [0] + [i + 1 for i, c in enumerate(line) if c == " "]
            m = next((m for i in starts if (m := self.regex.match(line, i)) is not None), None)
        else:
            m = self.regex.search(line)
        if m is None:
            return None
        groups = {str(i): g for i, g in enumerate((m.group(0), *m.groups())) if g is not None}
        groups.update({k: v for k, v in m.groupdict().items() if v is not None})
        return groups

    @property
    def group_names(self) -> set[str]:
        return {str(i) for i in range(self.regex.groups + 1)} | set(self.regex.groupindex)


@functools.lru_cache(maxsize=64)
def compile_cmdline(text: str) -> CmdlinePattern:
    """The compiled pattern (cached: the flag, the file, the cross-check and the scanner
    each ask); ValueError says why it is refused (one line)."""
    if not text:
        raise ValueError("an empty pattern")
    if len(text) > MAX_PATTERN:
        raise ValueError(f"a pattern has at most {MAX_PATTERN} characters (this one has {len(text)})")
    if not text.startswith("re:"):
        glob = fnmatch.translate(text)  # (?s:...)\Z; its stars do not backtrack into each other
        return _fast(CmdlinePattern(text, re.compile(glob), per_argument=not text.startswith("*")))
    source = text[3:]
    try:
        regex = re.compile(source)
    except (re.error, RecursionError, OverflowError) as exc:
        if isinstance(exc, re.error):
            where = "" if exc.pos is None else f" at position {exc.pos + 3}"
            raise ValueError(f"not a valid regular expression: {exc.msg}{where}") from None
        raise ValueError(f"not a valid regular expression: {type(exc).__name__}") from None
    clash = sorted(set(regex.groupindex) & set(BUILTINS))
    if clash:
        raise ValueError(f"a group may not be named {clash[0]!r} (a placeholder of every process)")
    if _nested_repeat(sre_parse.parse(source)):
        raise ValueError("a repeat inside a repeat (like (a+)+) can take exponential time: write it without")
    return _fast(CmdlinePattern(text, regex))


def _fast(pattern: CmdlinePattern) -> CmdlinePattern:
    slow = _too_slow(pattern)
    if slow is not None:
        raise ValueError(f"too slow: {slow * 1000:.0f} ms on a long command line (at most {SLOW_S * 1000:.0f}); "
                         "start it with a literal or anchor it, e.g. 'serve_(\\w+)\\.py' or '/(\\w+)\\.py'")
    return pattern


def _nested_repeat(parsed: Any, inside: bool = False) -> bool:
    """Whether an unbounded repeat sits inside another repeat (sre_parse's tree)."""
    for op, arg in parsed:
        name = str(op)
        if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            _, hi, body = arg
            unbounded = hi == sre_parse.MAXREPEAT or hi > 100
            if unbounded and inside:
                return True
            if _nested_repeat(body, inside or (unbounded or hi > 1)):
                return True
        elif name in ("SUBPATTERN", "ATOMIC_GROUP"):
            if _nested_repeat(arg[-1], inside):
                return True
        elif name == "BRANCH":
            if any(_nested_repeat(b, inside) for b in arg[1]):
                return True
        elif name in ("ASSERT", "ASSERT_NOT"):
            if _nested_repeat(arg[1], inside):
                return True
        elif name == "GROUPREF_EXISTS":
            if any(b is not None and _nested_repeat(b, inside) for b in arg[1:]):
                return True
    return False


def _too_slow(pattern: CmdlinePattern) -> float | None:
    """Seconds of the slowest search of probe lines (each character of the pattern, and
    word characters, spaces, slashes..., repeated or between x's) growing to
    :data:`MAX_CMDLINE`, when one takes over :data:`SLOW_S`; else None. A search retried
    at every position of a line costs the square of its length where a repeat comes first
    (``(\\w+)\\.py``), more with more repeats. From 256 characters on, only the 4 slowest
    probes grow further: the check costs ~0.1 s at most, and stops at the first slow one."""
    chars = sorted({c for c in pattern.text if c.isprintable()} | set("x_1 /.-="))[:64]
    probes = [(c, alternate) for c in chars for alternate in (False, True)]
    length = 32
    while length <= MAX_CMDLINE:
        took: list[tuple[float, tuple[str, bool]]] = []
        for c, alternate in probes:
            line = ("x" + c) * (length // 2) if alternate else c * length
            start = time.perf_counter()
            pattern.search(line)
            took.append((time.perf_counter() - start, (c, alternate)))
            if took[-1][0] > SLOW_S:
                return took[-1][0]
        if length >= 256:
            probes = [probe for _, probe in sorted(took, reverse=True)[:4]]
        length *= 2
    return None


# ----------------------------------------------------------------------------- templates


@dataclass(frozen=True)
class Template:
    """A parsed label template: literal text and placeholders (each a tuple of
    alternatives, the first with a value wins)."""

    text: str
    parts: tuple[str | tuple[str, ...], ...]

    @property
    def names(self) -> set[str]:
        return {n for p in self.parts if isinstance(p, tuple) for n in p}

    def render(self, values: Mapping[str, str | None], comm: str) -> str:
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
            else:
                out.append(next((v for n in part if (v := values.get(n)) not in (None, "")), None) or comm)
        return "".join(out)


def parse_template(text: str) -> Template:
    """The parsed template; ValueError says why it is refused (one line)."""
    problem = label_problem(text)
    if problem is not None:
        raise ValueError(problem)
    parts: list[str | tuple[str, ...]] = []
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ValueError(f"not a label template: {exc} (a literal brace is written {{{{ or }}}})") from None
    for literal, name, spec, conversion in parsed:
        if literal:
            parts.append(literal)
        if name is None:
            continue
        if spec or conversion:
            raise ValueError(f"{{{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}: "
                             "a placeholder takes no conversion or format")
        alternatives = tuple(name.split("|"))
        bad = next((a for a in alternatives if not _NAME.fullmatch(a)), None)
        if bad is not None:
            raise ValueError(f"{{{name}}}: a placeholder is a name ({', '.join(BUILTINS)}), "
                             "a regex group's number or name, or alternatives a|b")
        parts.append(alternatives)
    return Template(text, tuple(parts))


def unknown_placeholder(template: Template, patterns: list[CmdlinePattern]) -> str | None:
    """A placeholder of ``template`` that is neither built in nor a group of a pattern."""
    known = set(BUILTINS).union(*(p.group_names for p in patterns if p.text.startswith("re:")))
    return next((n for n in sorted(template.names) if n not in known), None)


# ----------------------------------------------------------------------------- checks


def check_names_list(v: object, key: str) -> list[str]:
    """string list: executable name globs"""
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
        raise ConfigError(key, "expected a list of strings")
    if any("\0" in x for x in items):
        raise ConfigError(key, "a NUL character in a pattern")
    return list(items)


def _checked(v: object, key: str, parse: Callable[[str], object], say: Callable[[str, ValueError], str]) -> str:
    """``v`` if it is a string that ``parse`` takes; else ConfigError, worded by ``say``."""
    if not isinstance(v, str):
        raise ConfigError(key, f"expected a string, got {type(v).__name__}")
    try:
        parse(v)
    except ValueError as exc:
        raise ConfigError(key, say(v, exc)) from None
    return v


def check_cmdline_pattern(v: object, key: str) -> str:
    return _checked(v, key, compile_cmdline, lambda text, exc: f"{_short(text)}: {exc}")


def check_cmdline_patterns(v: object, key: str) -> list[str]:
    """string list: globs, or ``re:REGEX``"""
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list):
        raise ConfigError(key, "expected a list of strings")
    return [check_cmdline_pattern(x, key) for x in items]


def check_template(v: object, key: str) -> str:
    """string: a label template (1 – 128 printable characters)"""
    return _checked(v, key, parse_template,
                    lambda text, exc: str(exc) if label_problem(text) else f"{_short(text)}: {exc}")


def check_names(patterns: list[str], template: str | None) -> None:
    """Each placeholder of ``template`` has a source among ``patterns``; ConfigError
    (``auto_label``) names the one that has none."""
    if template is None:
        return
    name = unknown_placeholder(parse_template(template), [compile_cmdline(p) for p in patterns])
    if name is not None:
        raise ConfigError("auto_label", f"{{{name}}} is not a placeholder ({', '.join(BUILTINS)}) nor a group "
                                        "of an auto_cmdline 're:' pattern")


def check_file(values: dict[str, Any]) -> None:
    """:func:`check_names` for a file that holds both keys (else the flags may give them)."""
    if "auto_label" in values and "auto_cmdline" in values:
        check_names(values["auto_cmdline"], values["auto_label"])


def _short(text: str) -> str:
    return repr(text) if len(text) <= 60 else f"{text[:50]!r}…({len(text)} characters)"
