"""Auto-attach settings: ``auto`` (executable names), ``auto_cmdline`` (command lines),
``auto_label`` (a label template) and ``auto_trusted_users``, their checks, and the
compiled forms the scanner (:mod:`memagent.core.autoattach`) matches and renders with.

What a user writes is checked once, here, by the flag's type and the file's key alike: a
pattern or template that passes cannot fail or stall the daemon later. The keys
themselves are declared with the others in :mod:`memagent.config.sections`.

* A command-line pattern is matched against the process's argv joined by spaces, as
  ``ps`` shows it, cut to :data:`MAX_CMDLINE` characters. A plain pattern is a glob
  (``fnmatch``'s syntax) over that whole line: ``*serve.py*`` is "contains". A glob with
  no ``*`` in front is tried against the line and against each suffix of it starting at
  an argument (``serve.py*`` matches ``python3 serve.py --port 1``), so a glob names the
  arguments from one of them on. ``re:REGEX`` is a regular expression in RE2's syntax,
  searched (unanchored, as process-exporter's ``cmdline`` regexes); its groups feed the
  label.
* Both are matched by RE2 (Google's linear-time engine, the ``google-re2`` binding):
  the time of a match grows with the line's length times the pattern's compiled size,
  never exponentially, whatever the line. What RE2 cannot do in linear time
  (backreferences, lookaround) is refused when the pattern is read, with RE2's own
  reason; so is a pattern whose compiled program has more than :data:`MAX_PROGRAM`
  instructions (a bound of the time one match may take: ~10 ms on 1 KiB at the bound).
  No timing probe: the decision is the pattern's structure, the same on a busy box.
* A label template holds text and ``{placeholder}``\\ s (``{{`` and ``}}`` are braces):
  :data:`BUILTINS`, a regex group's number or name, or alternatives ``{container|unit}``
  (the first with a value). A placeholder with no value gives the process's ``comm``.
  Which rendered labels are trusted (counted in budgets) is :mod:`memagent.core.autoattach`'s
  rule: see :data:`ROOT_FACTS`.
"""

from __future__ import annotations

import functools
import pwd
import re
import string
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from memproto.text import label_problem

from ..errors import ConfigError

#: The command line is matched up to this many characters: 1 KiB holds the program, the
#: script and the options that name a model on every line we know of.
MAX_CMDLINE = 1024
#: A pattern or template is at most this long.
MAX_PATTERN = 512
#: A pattern's RE2 program has at most this many instructions: RE2's slowest path (its
#: NFA, when a pattern's DFA would need too many states) costs the line's length times
#: this, ~10 ms on a 1 KiB line; real patterns have 10 - 60 (``--model[= ](\\S+)``: 26).
MAX_PROGRAM = 300
#: All ``auto_cmdline`` patterns together: what one process's line may cost at most.
MAX_PROGRAM_TOTAL = 600
#: Placeholders every process has (``exe``, ``container`` and ``unit`` may have no value).
BUILTINS = ("comm", "exe", "container", "unit", "pid")
#: Placeholders whose value only root chooses, when the process's cgroup is outside every
#: user's systemd manager: the container's name or ID (a rootful engine's, Kubernetes')
#: and the systemd unit. Every other value (``comm``, ``exe``, ``pid``, a regex group) is
#: the user's to choose, and so is the match itself.
ROOT_FACTS = frozenset({"container", "unit"})
#: ``auto_wrappers``' default: programs that start another and wait for it (or exec it
#: later), whose command line holds their child's (``runuser -u models -- sh -c "exec
#: python3 serve.py"``).
DEFAULT_WRAPPERS = ("sh", "bash", "dash", "zsh", "su", "sudo", "runuser", "setpriv", "env", "timeout", "nice",
                    "ionice", "nohup", "stdbuf", "taskset", "chrt", "numactl", "tini", "dumb-init")
_NAME = re.compile(r"[0-9]+|[A-Za-z_][A-Za-z0-9_]*")
#: An ID that names no user (the kernel's (uid_t)-1 is "none").
MAX_UID = 2**32 - 2


# ----------------------------------------------------------------------------- patterns


@functools.cache
def _re2() -> ModuleType:
    """The RE2 binding, imported when a pattern is first compiled (~20 ms, ~3.5 MiB):
    a daemon or a command without ``auto_cmdline`` never loads it."""
    import re2  # type: ignore[import-not-found, unused-ignore]

    return re2  # type: ignore[no-any-return, unused-ignore]


def _options() -> Any:
    options = _re2().Options()
    options.log_errors = False  # RE2 would print its refusals on stderr: ours is one line
    return options


@dataclass(frozen=True)
class CmdlinePattern:
    """One compiled ``auto_cmdline`` pattern."""

    text: str
    #: A compiled RE2 pattern (``re2._Regexp``, with ``search``, ``groups``, ``groupindex``).
    regex: Any
    #: A glob: its match is its group 1 (the suffix from the argument it starts at).
    glob: bool = False

    def search(self, cmdline: str) -> dict[str, str] | None:
        """The groups (by number, ``"0"`` the whole match, and by name) where it matches
        ``cmdline`` (cut to :data:`MAX_CMDLINE`); None where it does not."""
        m = self.regex.search(cmdline[:MAX_CMDLINE])
        if m is None:
            return None
        if self.glob:
            return {"0": m.group(1)}
        groups = {str(i): g for i, g in enumerate((m.group(0), *m.groups())) if g is not None}
        groups.update({k: v for k, v in m.groupdict().items() if v is not None})
        return groups

    @property
    def group_names(self) -> set[str]:
        return {str(i) for i in range(self.regex.groups + 1)} | set(self.regex.groupindex)

    @property
    def size(self) -> int:
        """Instructions of its RE2 program: what a match costs per character at worst."""
        return int(self.regex.programsize)


def glob_regex(glob: str) -> str:
    """``glob`` (``*``, ``?``, ``[seq]``, ``[!seq]``, as fnmatch reads them) in RE2's
    syntax, as group 1; anchored at both ends, from the start or (no ``*`` in front) from
    an argument's start."""
    out: list[str] = []
    i, n = 0, len(glob)
    while i < n:
        c = glob[i]
        i += 1
        if c == "*":
            if not out or out[-1] != ".*":
                out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            j = i + (i < n and glob[i] == "!")
            j += j < n and glob[j] == "]"
            j = glob.find("]", j)
            if j < 0:
                out.append(r"\[")
                continue
            body, i = glob[i:j], j + 1
            negate = body.startswith("!")
            body = body[1:] if negate else body
            escaped = body.replace("\\", r"\\").replace("[", r"\[").replace("^", r"\^").replace("]", r"\]")
            out.append(f"[{'^' if negate else ''}{escaped}]")
        else:
            out.append(re.escape(c))
    start = "^" if glob.startswith("*") else "^(?:.* )?"
    return f"(?s){start}({''.join(out)})\\z"


@functools.lru_cache(maxsize=64)
def compile_cmdline(text: str) -> CmdlinePattern:
    """The compiled pattern (cached: the flag, the file, the cross-check and the scanner
    each ask); ValueError says why it is refused (one line)."""
    if not text:
        raise ValueError("an empty pattern")
    if len(text) > MAX_PATTERN:
        raise ValueError(f"a pattern has at most {MAX_PATTERN} characters (this one has {len(text)})")
    glob = not text.startswith("re:")
    re2 = _re2()
    try:
        regex = re2.compile(glob_regex(text) if glob else text[3:], _options())
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        what = "not a valid glob" if glob else "not a valid regular expression"
        hint = "" if glob else " (RE2 syntax: no backreferences, no lookaround)"
        raise ValueError(f"{what}: {reason}{hint}") from None
    pattern = CmdlinePattern(text, regex, glob=glob)
    clash = sorted(set(regex.groupindex) & set(BUILTINS))
    if clash and not glob:
        raise ValueError(f"a group may not be named {clash[0]!r} (a placeholder of every process)")
    if pattern.size > MAX_PROGRAM:
        raise ValueError(f"too large: {pattern.size} RE2 instructions (at most {MAX_PROGRAM}, the bound of the "
                         "time one match takes); use smaller counted repeats {n} or fewer alternatives")
    return pattern


def check_total(patterns: Iterable[CmdlinePattern]) -> None:
    """ValueError when the patterns together exceed :data:`MAX_PROGRAM_TOTAL`."""
    total = sum(p.size for p in patterns)
    if total > MAX_PROGRAM_TOTAL:
        raise ValueError(f"the patterns together have {total} RE2 instructions (at most {MAX_PROGRAM_TOTAL}: "
                         "the bound of the time one process's command line takes)")


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

    def made_of(self, values: Mapping[str, str | None], names: frozenset[str]) -> bool:
        """Whether what :meth:`render` gives is made of ``names``' values only: there is a
        placeholder, and each one's value (its first alternative with a value) is one of
        ``names``. Fixed text alone is not: the match that chose it is the user's doing."""
        chosen = [next((n for n in part if values.get(n) not in (None, "")), None)
                  for part in self.parts if isinstance(part, tuple)]
        return bool(chosen) and all(n is not None and n in names for n in chosen)


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
    checked = [check_cmdline_pattern(x, key) for x in items]
    try:
        check_total(compile_cmdline(x) for x in checked)
    except ValueError as exc:
        raise ConfigError(key, str(exc)) from None
    return checked


def check_users(v: object, key: str) -> list[str]:
    """string list: users that exist, or numeric UIDs"""
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
        raise ConfigError(key, "expected a list of strings (user names or UIDs)")
    resolve_users(items, key)
    return list(items)


def resolve_users(names: Iterable[str], key: str = "auto_trusted_users") -> frozenset[int]:
    """The UIDs of ``names`` (user names, looked up now, or numeric UIDs); ConfigError
    naming ``key`` for one that is neither."""
    uids = set()
    for name in names:
        if name.isascii() and name.isdigit():  # not "²": str.isdigit() says yes, int() no
            if int(name) > MAX_UID:
                raise ConfigError(key, f"not a UID: {name} (at most {MAX_UID})")
            uids.add(int(name))
            continue
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except (KeyError, ValueError):
            raise ConfigError(key, f"no such user: {name!r}") from None
    return frozenset(uids)


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
