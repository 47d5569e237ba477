"""What ``memagent install-service`` (:mod:`memagent.cli.install_cmd`) writes, removes and runs:
the unit, from the package's ``memagent/data/memagent.service`` with ``ExecStart=`` naming
the ``memagent`` being run; the configuration, from the example, only when absent; the
group; bash and zsh completion and the man page (:mod:`.shellfiles`); a link to the
docs the wheel installed (``PREFIX/share/doc/memagent``, pyproject's shared-data); then
``systemctl daemon-reload`` when a systemd manager runs. Every action is one line on
stdout; what cannot be done is :class:`InstallFailed`, one line.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from memproto.text import printable

from ..config import DEFAULT_PATH as CONFIG_PATH
from ..errors import MemagentError
from .shellfiles import SHELLS, CommandLine, CompletionUnavailable, completion, man_page

if TYPE_CHECKING:
    from importlib.abc import Traversable

UNIT_PATH = "/etc/systemd/system/memagent.service"
#: What ``systemctl enable`` makes (the unit's ``WantedBy=multi-user.target``).
WANTS_LINK = "/etc/systemd/system/multi-user.target.wants/memagent.service"
COMPLETION_PATHS = {"bash": "/usr/share/bash-completion/completions/memagent",
                    "zsh": "/usr/local/share/zsh/site-functions/_memagent"}
MAN_PATH = "/usr/local/share/man/man1/memagent.1"
#: A link to the docs the wheel installed in its environment (the unit's ``Documentation=``).
DOC_LINK = "/usr/share/doc/memagent"
GROUP = "memagent"
#: Present while systemd runs as the init system (what ``sd_booted()`` checks).
SYSTEMD_RUNNING = "/run/systemd/system"

#: A unit-file word that needs no quoting (systemd.service(5), "Command lines").
_PLAIN_WORD = re.compile(r"[A-Za-z0-9/._+,:@=-]+")
#: A line of the example configuration that sets an example value, not a default.
_EXAMPLE_LINE = re.compile(r"^[A-Za-z_][\w.-]*\s*=.*#\s*example\b")


class InstallFailed(MemagentError):
    """Something could not be written, removed or run: one line, exit 1."""


# --------------------------------------------------------------------------- what is written


def data_dir() -> Traversable:
    """The package's data: the unit and the example configuration."""
    from importlib import resources

    return resources.files("memagent") / "data"


def memagent_program() -> list[str]:
    """The command that runs this memagent: the ``memagent`` script it was started as, else
    the one beside the interpreter (a venv's or pipx's ``bin``), absolute with links
    resolved; else this interpreter with ``-m memagent.cli``."""
    candidates = [os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "memagent")]
    if sys.argv and os.path.basename(sys.argv[0]) == "memagent":
        candidates.insert(0, os.path.abspath(sys.argv[0]))
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return [os.path.realpath(path)]
    return [os.path.abspath(sys.executable), "-m", "memagent.cli"]


def unit_word(word: str, executable: bool = False) -> str:
    """``word`` as one word of a unit's command line: quoted where needed, ``%`` (specifiers)
    escaped, and ``$`` (variables) too, but in the executable, which systemd does not expand."""
    if not _PLAIN_WORD.fullmatch(word):
        word = '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'
    word = word.replace("%", "%%")
    return word if executable else word.replace("$", "$$")


def unit_text(template: str, program: Sequence[str]) -> str:
    """The packaged unit with ``ExecStart=``'s program replaced by ``program``."""
    out, found = [], False
    for line in template.splitlines(keepends=True):
        if line.startswith("ExecStart="):
            _, _, arguments = line.removeprefix("ExecStart=").partition(" ")
            words = [unit_word(program[0], executable=True), *map(unit_word, program[1:])]
            line, found = f"ExecStart={' '.join(words)} {arguments}", True
        out.append(line)
    if not found:
        raise InstallFailed("the packaged unit has no ExecStart= line (a broken package)")
    return "".join(out)


def config_text(example: str) -> str:
    """The example configuration as the installed default: its lines that set an example
    value (``# example``) commented out, so that every value set is the default."""
    return "".join(f"# {line}" if _EXAMPLE_LINE.match(line) else line for line in example.splitlines(keepends=True))


def exec_start(unit: str) -> str:
    return next(line for line in unit.splitlines() if line.startswith("ExecStart="))


@dataclass(frozen=True)
class File:
    path: str  # on the target system
    content: bytes
    what: str
    keep: bool = False  # an operator's file: written only when absent, removed only with --purge


def docs_source() -> str | None:
    """Where the wheel put the docs (its shared-data): this environment's
    ``share/doc/memagent`` (a venv, pipx, the bundle's), else the user base's; None if neither."""
    import site

    for base in (sys.prefix, site.getuserbase()):
        path = os.path.join(base, "share", "doc", "memagent")
        if os.path.isfile(os.path.join(path, "README.md")):
            return os.path.realpath(path)
    return None


def completion_files(command_line: CommandLine) -> tuple[list[File], list[str]]:
    """The completion files and, when they cannot be made, why (one line each)."""
    try:
        return [File(COMPLETION_PATHS[s], completion(command_line.parser, s).encode(), f"{s} completion")
                for s in SHELLS], []
    except CompletionUnavailable as exc:
        return [], [f"skipped {s} completion ({exc})" for s in SHELLS]


def man_file(command_line: CommandLine) -> File:
    files = [(CONFIG_PATH, "The configuration, read at start and on SIGHUP."),
             (UNIT_PATH, "The systemd unit, written by memagent install-service."),
             ("/run/memagent/memagent.sock", "The socket of the daemon run by the unit."),
             (DOC_LINK, "The docs (README.md, docs/), a link into the environment memagent is installed in.")]
    return File(MAN_PATH, man_page(command_line, files).encode(), "man page")


# --------------------------------------------------------------------------- doing it


class Installer:
    """Writes, removes and runs, one line each on ``out``; with ``dry_run`` only says what it
    would do; with ``root`` every path is under it, and nothing outside it is touched."""

    def __init__(self, root: str | None, dry_run: bool, out: TextIO) -> None:
        self.root, self.dry_run, self.out = root, dry_run, out

    def target(self, path: str) -> Path:
        return Path(self.root.rstrip("/") + path) if self.root else Path(path)

    def say(self, done: str, would: str, subject: str, note: str = "") -> None:
        line = f"{would if self.dry_run else done} {subject}" + (f" ({note})" if note else "")
        print(printable(line), file=self.out)

    def _current(self, path: Path) -> bytes | None:
        if not path.exists() and not path.is_symlink():
            return None
        try:
            return path.read_bytes()
        except OSError as exc:
            raise InstallFailed(f"cannot read {path}: {exc.strerror or exc}") from None

    def install(self, f: File, note: str = "") -> None:
        path = self.target(f.path)
        current = self._current(path)
        if current == f.content:
            return self.say("unchanged", "unchanged", str(path), f.what)
        if current is not None and f.keep:
            return self.say("kept", "would keep", str(path), f"{f.what}: exists, not overwritten")
        if not self.dry_run:
            _write(path, f.content)
        verb = ("written", "would write") if current is None else ("updated", "would update")
        self.say(*verb, str(path), f"{f.what}{'; ' + note if note else ''}")

    def remove(self, path_on_target: str, what: str) -> None:
        path = self.target(path_on_target)
        if not path.exists() and not path.is_symlink():
            return self.say("absent", "absent", str(path), what)
        if not self.dry_run:
            try:
                path.unlink()
            except OSError as exc:
                raise InstallFailed(f"cannot remove {path}: {exc.strerror or exc}") from None
        self.say("removed", "would remove", str(path), what)

    def link(self, path_on_target: str, source: str, what: str) -> None:
        """A symbolic link to ``source``: made, or pointed again; a file or directory that is
        not a link is someone else's, and stays."""
        path = self.target(path_on_target)
        if path.is_symlink() and str(path.readlink()) == source:
            return self.say("unchanged", "unchanged", str(path), f"{what} -> {source}")
        if path.exists() and not path.is_symlink():
            return self.say("kept", "would keep", str(path), f"{what}: exists and is not a link")
        verb = ("updated", "would update") if path.is_symlink() else ("linked", "would link")
        if not self.dry_run:
            temporary = path.with_name(f".{path.name}.memagent-new")
            try:
                _make_parents(path)
                temporary.unlink(missing_ok=True)
                temporary.symlink_to(source)
                os.replace(temporary, path)
            except OSError as exc:
                raise InstallFailed(f"cannot link {path}: {exc.strerror or exc}") from None
        self.say(*verb, str(path), f"{what} -> {source}")

    def unlink(self, path_on_target: str, what: str) -> None:
        """Remove a link :meth:`link` made; anything else there stays."""
        path = self.target(path_on_target)
        if path.exists() and not path.is_symlink():
            return self.say("kept", "would keep", str(path), f"{what}: not a link")
        self.remove(path_on_target, what)

    def run(self, argv: Sequence[str], why: str) -> None:
        """Run a system command (the group, systemd), unless under ``--root`` or dry."""
        import subprocess

        if not self.dry_run:
            try:
                r = subprocess.run(list(argv), capture_output=True, text=True, timeout=120)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise InstallFailed(f"{' '.join(argv)}: {exc}") from None
            if r.returncode != 0:
                reason = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
                raise InstallFailed(f"{' '.join(argv)} failed: {reason}")
        self.say("ran", "would run", " ".join(argv), why)

    def systemd(self) -> str | None:
        """Why systemd is left alone, or None when a systemd manager is there to tell."""
        if self.root:
            return "--root"
        return None if Path(SYSTEMD_RUNNING).is_dir() else "no systemd manager running"


def _write(path: Path, content: bytes, mode: int = 0o644) -> None:
    """Write ``path`` whole or not at all (a file beside it, renamed over it), creating its
    missing directories with mode 0755 whatever the umask."""
    temporary = path.with_name(f".{path.name}.memagent-new")
    try:
        _make_parents(path)
        temporary.write_bytes(content)
        temporary.chmod(mode)
        os.replace(temporary, path)
    except OSError as exc:
        if temporary.parent.is_dir():
            temporary.unlink(missing_ok=True)
        raise InstallFailed(f"cannot write {path}: {exc.strerror or exc}") from None


def _make_parents(path: Path) -> None:
    """Create the missing directories above ``path``, mode 0755 whatever the umask."""
    missing = []
    parent = path.parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    for directory in reversed(missing):
        directory.mkdir()
        directory.chmod(0o755)


def _group_exists(root: str | None) -> bool | None:
    """Whether the group exists on this box or, with ``root``, in ``root/etc/group``; None
    when ``root`` has no ``etc/group`` (a staging directory, not a system's root)."""
    if root is None:
        import grp

        try:
            grp.getgrnam(GROUP)
        except KeyError:
            return False
        return True
    group_file = Path(root.rstrip("/") + "/etc/group")
    if not group_file.is_file():
        return None
    try:
        return any(line.partition(":")[0] == GROUP for line in group_file.read_text().splitlines())
    except OSError as exc:
        raise InstallFailed(f"cannot read {group_file}: {exc.strerror or exc}") from None


def _group(box: Installer, add: bool) -> None:
    """Create (``add``) or delete the group: on this box, or with ``--root`` in its
    ``etc/group`` (``--prefix``; skipped where it has none)."""
    where = ["--prefix", box.root] if box.root else []
    subject = f"group {GROUP}" + (f" in {box.target('/etc/group')}" if box.root else "")
    exists = _group_exists(box.root)
    if exists is None:
        box.say("skipped", "would skip", f"group {GROUP}", f"--root: no {box.target('/etc/group')}")
    elif exists and add:
        box.say("exists", "exists", subject)
    elif add:
        box.run(["groupadd", *where, "--system", GROUP], "who may connect to the socket")
    elif exists:
        box.run(["groupdel", *where, GROUP], "--purge")
    else:
        box.say("absent", "absent", subject)


def install(box: Installer, command_line: CommandLine) -> None:
    """Everything, in order; ``command_line``: what the completion and the man page are made from."""
    template = (data_dir() / "memagent.service").read_text()
    unit = unit_text(template, memagent_program())
    box.install(File(UNIT_PATH, unit.encode(), "unit"), exec_start(unit))
    example = (data_dir() / "memagent.toml").read_text()
    box.install(File(CONFIG_PATH, config_text(example).encode(), "configuration", keep=True),
                "the example, its 'example' values commented out")
    _group(box, add=True)
    completions, skipped = completion_files(command_line)
    for f in completions:
        box.install(f)
    for line in skipped:
        print(printable(line), file=box.out)
    box.install(man_file(command_line))
    source = docs_source()
    if source is None:
        box.say("skipped", "would skip", str(box.target(DOC_LINK)), f"docs: none in {sys.prefix}/share/doc/memagent")
    else:
        box.link(DOC_LINK, source, "docs")
    why_not = box.systemd()
    if why_not is None:
        box.run(["systemctl", "daemon-reload"], "systemd reads the unit again")
    else:
        box.say("skipped", "would skip", "systemctl daemon-reload", why_not)
    if not box.dry_run:
        print(f"next: edit {CONFIG_PATH} (memagent check-config FILE), then systemctl enable --now memagent",
              file=box.out)


def uninstall(box: Installer, purge: bool) -> None:
    why_not = box.systemd()
    if why_not is None and box.target(UNIT_PATH).exists():
        box.run(["systemctl", "disable", "--now", "memagent.service"], "stopped, no longer started at boot")
    else:
        box.remove(WANTS_LINK, "no longer started at boot")
    box.remove(UNIT_PATH, "unit")
    for shell in SHELLS:
        box.remove(COMPLETION_PATHS[shell], f"{shell} completion")
    box.remove(MAN_PATH, "man page")
    box.unlink(DOC_LINK, "docs")
    if purge:
        box.remove(CONFIG_PATH, "configuration")
        config_dir = box.target(CONFIG_PATH).parent
        if not box.dry_run and config_dir.is_dir() and not any(config_dir.iterdir()):
            try:
                config_dir.rmdir()
            except OSError as exc:
                raise InstallFailed(f"cannot remove {config_dir}: {exc.strerror or exc}") from None
        _group(box, add=False)
    elif box.target(CONFIG_PATH).exists():
        box.say("kept", "would keep", str(box.target(CONFIG_PATH)), "configuration: --purge removes it")
    if why_not is None:
        box.run(["systemctl", "daemon-reload"], "systemd forgets the unit")
