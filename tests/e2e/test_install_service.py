"""``memagent install-service`` and ``memagent completion`` (docs/service.md, "Installing").

Every run is the real command in a subprocess, with ``--root`` (a temporary directory, as
DESTDIR): nothing here writes the box's own /etc or /usr, adds a group to it or talks to
systemd. The files written are then judged by their own readers: ``systemd-analyze verify``
the unit, ``check-config`` the configuration, bash (and zsh, where installed) the
completion, ``man``/``groff`` the man page.
"""

from __future__ import annotations

import contextlib
import grp
import importlib.util
import io
import os
import pwd
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import as_user
from test_cli_hostile import HOSTILE, check

import memagent.install.installer as installer
from memagent.cli.main import build_parser, main
from memagent.config import load
from memagent.install.shellfiles import subcommands

ROOT = Path(__file__).resolve().parents[2]
PACKAGED_UNIT = ROOT / "packaging" / "memagent.service"
PACKAGED_CONFIG = ROOT / "packaging" / "memagent.toml"
#: The memagent the unit must start: the console script beside this interpreter.
SCRIPT = Path(sys.executable).parent / "memagent"

UNIT = "etc/systemd/system/memagent.service"
CONFIG = "etc/memagent/memagent.toml"
BASH = "usr/share/bash-completion/completions/memagent"
ZSH = "usr/local/share/zsh/site-functions/_memagent"
MAN = "usr/local/share/man/man1/memagent.1"
DOCS = "usr/share/doc/memagent"
WRITTEN = (UNIT, CONFIG, BASH, ZSH, MAN)
#: Where the wheel's shared-data put the docs (pyproject.toml): what DOCS links to.
INSTALLED_DOCS = Path(sys.prefix) / "share" / "doc" / "memagent"
#: The example's lines that set an example value, not a default (commented out when installed).
EXAMPLE_KEYS = ("auto", "host.capacity", "host.reserve", "gpu.reserve")


def memagent(*argv: str, umask: int = 0o022, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memagent.cli", *argv], capture_output=True, text=True,
                          timeout=60, umask=umask, cwd=cwd)


def install(root: Path, *flags: str) -> list[str]:
    r = memagent("install-service", "--root", str(root), *flags)
    assert r.returncode == 0 and r.stderr == "", r.stdout + r.stderr
    return r.stdout.splitlines()


def line_of(lines: Sequence[str], path: str) -> str:
    (line,) = [x for x in lines if f" {path} (" in x or x.endswith(f" {path}")]
    return line


def service_lines(text: str) -> list[str]:
    return [x for x in text.splitlines() if not x.startswith("ExecStart=")]


# --------------------------------------------------------------------------- install


def group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def test_installs_the_unit_naming_this_memagent_and_every_file_under_root(tmp_path: Path) -> None:
    had_group = group_exists("memagent")
    lines = install(tmp_path)
    for rel in WRITTEN:
        path = tmp_path / rel
        assert path.is_file() and path.stat().st_mode & 0o777 == 0o644, rel
    for rel in WRITTEN:
        assert line_of(lines, str(tmp_path / rel)).startswith("written "), lines
    assert any(x.startswith("skipped group memagent") for x in lines), lines
    assert group_exists("memagent") == had_group  # --root: the box's groups are left alone
    assert any(x.startswith("skipped systemctl daemon-reload (--root)") for x in lines), lines

    unit = (tmp_path / UNIT).read_text()
    (exec_start,) = [x for x in unit.splitlines() if x.startswith("ExecStart=")]
    program, *arguments = shlex.split(exec_start.removeprefix("ExecStart="))
    assert program == os.path.realpath(SCRIPT), exec_start  # the memagent being run, absolute, not /usr/local/bin
    assert arguments[0] == "daemon" and "--config" in arguments
    assert service_lines(unit) == service_lines(PACKAGED_UNIT.read_text())  # the rest: the packaged unit
    r = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.startswith("memagent "), r
    assert INSTALLED_DOCS.is_dir(), f"no docs in {INSTALLED_DOCS}: reinstall (pip install -e '.[dev]')"
    assert line_of(lines, str(tmp_path / DOCS)).startswith("linked "), lines
    assert (tmp_path / DOCS).readlink() == INSTALLED_DOCS.resolve()
    assert (tmp_path / DOCS / "docs" / "service.md").is_file()  # the unit's Documentation=


def test_the_installed_configuration_is_valid_and_sets_only_defaults(tmp_path: Path) -> None:
    install(tmp_path)
    config = tmp_path / CONFIG
    r = memagent("check-config", str(config))
    assert r.returncode == 0, r.stderr
    example, installed = load(str(PACKAGED_CONFIG)), load(str(config))
    for key in EXAMPLE_KEYS:
        assert key in example and key not in installed, key
    assert {k: v for k, v in example.items() if k not in EXAMPLE_KEYS} == installed


def test_directories_are_0755_whatever_the_umask(tmp_path: Path) -> None:
    r = memagent("install-service", "--root", str(tmp_path), umask=0o077)
    assert r.returncode == 0, r.stderr
    for rel in (*WRITTEN, "etc/memagent", "usr/share/bash-completion/completions", "usr/share/doc"):
        mode = (tmp_path / rel).stat().st_mode & 0o777
        assert mode == (0o755 if (tmp_path / rel).is_dir() else 0o644), (rel, oct(mode))


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_verifies_the_written_unit(tmp_path: Path) -> None:
    install(tmp_path)
    r = verify(tmp_path / UNIT)
    assert r.returncode == 0 and r.stdout == r.stderr == "", r.stdout + r.stderr


def verify(unit: Path) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "SYSTEMD_LOG_TARGET": "console"})
    if "System has not been booted with systemd" in r.stderr or "Failed to connect" in r.stderr:
        pytest.skip(f"systemd-analyze verify needs a running systemd here: {r.stderr.strip()}")
    return r


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_a_program_path_systemd_would_misread_is_quoted(tmp_path: Path) -> None:
    """A space, a specifier (%i) and a variable ($HOME) in the venv's path: systemd reads
    back exactly that path (its complaint, once the file is gone, names it)."""
    program = tmp_path / "with space %i $HOME" / "memagent"
    program.parent.mkdir()
    shutil.copy(SCRIPT, program)
    unit = tmp_path / "memagent.service"
    unit.write_text(installer.unit_text(PACKAGED_UNIT.read_text(), [str(program)]))
    r = verify(unit)
    assert r.returncode == 0 and r.stdout == r.stderr == "", r.stdout + r.stderr
    program.unlink()
    r = verify(unit)
    assert r.returncode != 0 and f"Command {program} is not executable" in r.stderr, r.stderr


def test_a_second_run_says_unchanged_and_never_overwrites_the_configuration(tmp_path: Path) -> None:
    install(tmp_path)
    lines = install(tmp_path)
    for rel in (UNIT, CONFIG, BASH, ZSH, MAN, DOCS):
        assert line_of(lines, str(tmp_path / rel)).startswith("unchanged "), lines
    config, unit = tmp_path / CONFIG, tmp_path / UNIT
    config.write_text("interval = 2.0  # the operator's\n")
    unit.write_text(unit.read_text().replace("MemoryMax=256M", "MemoryMax=1G"))
    lines = install(tmp_path)
    assert line_of(lines, str(config)).startswith("kept "), lines
    assert config.read_text() == "interval = 2.0  # the operator's\n"
    assert line_of(lines, str(unit)).startswith("updated "), lines
    assert "MemoryMax=256M" in unit.read_text()  # the unit is the package's: changes go in drop-ins


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    lines = install(root, "--dry-run")
    assert line_of(lines, str(root / UNIT)).startswith("would write "), lines
    assert f"ExecStart={os.path.realpath(SCRIPT)} daemon" in line_of(lines, str(root / UNIT))
    assert line_of(lines, str(root / MAN)).startswith("would write "), lines
    assert not root.exists()
    install(root)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    lines = install(root, "--uninstall", "--purge", "--dry-run")
    assert line_of(lines, str(root / UNIT)).startswith("would remove "), lines
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


# --------------------------------------------------------------------------- uninstall


def test_uninstall_removes_what_it_installed_and_keeps_the_configuration(tmp_path: Path) -> None:
    install(tmp_path)
    wants = tmp_path / "etc/systemd/system/multi-user.target.wants/memagent.service"
    wants.parent.mkdir(parents=True)
    wants.symlink_to("/etc/systemd/system/memagent.service")  # as systemctl enable leaves it
    lines = install(tmp_path, "--uninstall")
    for rel in (UNIT, BASH, ZSH, MAN, DOCS):
        assert line_of(lines, str(tmp_path / rel)).startswith("removed "), lines
        assert not (tmp_path / rel).exists(), rel
    assert not wants.is_symlink()
    assert line_of(lines, str(tmp_path / CONFIG)).startswith("kept "), lines
    assert (tmp_path / CONFIG).is_file()

    lines = install(tmp_path, "--uninstall")  # again: nothing left to remove
    for rel in (UNIT, BASH, ZSH, MAN, DOCS):
        assert line_of(lines, str(tmp_path / rel)).startswith("absent "), lines

    lines = install(tmp_path, "--uninstall", "--purge")
    assert line_of(lines, str(tmp_path / CONFIG)).startswith("removed "), lines
    assert not (tmp_path / "etc/memagent").exists()


@pytest.mark.skipif(shutil.which("groupadd") is None, reason="groupadd is not installed")
def test_the_group_is_made_in_the_roots_etc_group_and_purged(tmp_path: Path) -> None:
    """A root with an etc/group (a system image) gets the group there (groupadd --prefix),
    once; --purge deletes it; the box's own groups never change."""
    if os.geteuid() != 0:
        pytest.skip("groupadd needs root")
    (tmp_path / "etc").mkdir()
    for name in ("group", "gshadow", "passwd", "shadow"):  # this box's, less a group memagent
        lines = Path(f"/etc/{name}").read_text().splitlines(keepends=True)
        (tmp_path / "etc" / name).write_text("".join(x for x in lines if not x.startswith("memagent:")))
    had_group = group_exists("memagent")

    def members() -> list[str]:
        return [x for x in (tmp_path / "etc/group").read_text().splitlines() if x.startswith("memagent:")]

    assert f"ran groupadd --prefix {tmp_path} --system memagent (who may connect to the socket)" in install(tmp_path)
    assert len(members()) == 1
    assert f"exists group memagent in {tmp_path}/etc/group" in install(tmp_path)
    assert f"ran groupdel --prefix {tmp_path} memagent (--purge)" in install(tmp_path, "--uninstall", "--purge")
    assert members() == [] and group_exists("memagent") == had_group


def test_a_docs_directory_that_is_not_its_link_is_left_alone(tmp_path: Path) -> None:
    """A distribution's package may own /usr/share/doc/memagent: never replaced, never removed."""
    theirs = tmp_path / DOCS / "README.md"
    theirs.parent.mkdir(parents=True)
    theirs.write_text("a package's\n")
    assert line_of(install(tmp_path), str(tmp_path / DOCS)).startswith("kept "), theirs
    assert line_of(install(tmp_path, "--uninstall"), str(tmp_path / DOCS)).startswith("kept ")
    assert theirs.read_text() == "a package's\n"


def test_a_path_that_cannot_be_written_is_one_line_exit_1(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = memagent("install-service", "--root", str(blocker))
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"memagent install-service: cannot write {blocker}/etc/systemd/system/"), r.stderr


# --------------------------------------------------------------------------- completion, man page


def test_bash_completion_registers_and_completes_commands_and_options(tmp_path: Path) -> None:
    assert importlib.util.find_spec("shtab"), "shtab, a dependency of memagent (pyproject.toml), is not installed"
    install(tmp_path)
    script = tmp_path / BASH
    assert memagent("completion", "bash").stdout == script.read_text()  # one generator
    probe = f"""source {shlex.quote(str(script))}
complete -p memagent
for line in 'memagent ins' 'memagent install-service --ro' 'memagent completion '; do
  read -ra COMP_WORDS <<< "$line"; [[ $line == *' ' ]] && COMP_WORDS+=('')
  COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); COMPREPLY=(); _shtab_memagent; echo "${{COMPREPLY[*]}}"
done"""
    r = subprocess.run(["bash", "--norc", "-c", probe], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    registered, command, option, shells = r.stdout.splitlines()
    assert registered.startswith("complete ") and registered.endswith(" memagent"), registered
    assert (command, option, shells) == ("install-service", "--root", "bash zsh"), r.stdout


def test_zsh_completion_is_found_by_compinit(tmp_path: Path) -> None:
    install(tmp_path)
    script = tmp_path / ZSH
    assert script.read_text().startswith("#compdef memagent\n")
    if shutil.which("zsh") is None:
        pytest.skip("zsh is not installed")
    probe = f"""fpath=({shlex.quote(str(script.parent))} $fpath); autoload -Uz compinit
compinit -u -d {shlex.quote(str(tmp_path / 'zcompdump'))}; print -r -- $_comps[memagent]; autoload -Uz +X _memagent"""
    r = subprocess.run(["zsh", "-f", "-c", probe], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout == "_memagent\n" and r.stderr == "", r.stdout + r.stderr


def test_the_man_page_renders_cleanly_and_names_every_command(tmp_path: Path) -> None:
    install(tmp_path)
    page = tmp_path / MAN
    if shutil.which("man"):
        argv = ["man", "--warnings", "-l", str(page)]
    elif shutil.which("groff"):
        argv = ["groff", "-man", "-Tutf8", "-ww", str(page)]
    else:
        pytest.skip("neither man nor groff is installed")
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "MANWIDTH": "200", "MANPAGER": "cat", "PAGER": "cat"})
    assert r.returncode == 0 and r.stderr == "", r.stderr  # a roff warning is a line on stderr
    text = r.stdout.replace("\u2010", "-").replace("\u2212", "-")
    names = [name for name, _, _ in subcommands(build_parser())]
    assert {"install-service", "completion", "daemon", "status"} <= set(names)
    for name in names:
        assert f"memagent {name}" in text, name
    for section in ("SYNOPSIS", "EXIT STATUS", "FILES", "--uninstall", "/etc/memagent/memagent.toml"):
        assert section in text, section


# --------------------------------------------------------------------------- who, and hostile arguments


def test_refused_without_root_in_one_line_and_dry_run_allowed(test_user: pwd.struct_passwd, shared_dir: str) -> None:
    """The child runs ``main`` in the test's own process image: the interpreter's files lie in
    root's 0700 home, so what it imports is imported first, by a dry run as root."""
    target = Path(shared_dir) / "root"

    def run(*argv: str) -> dict[str, object]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["install-service", "--root", str(target), *argv])
        return {"code": code, "out": out.getvalue(), "err": err.getvalue()}

    assert run("--dry-run")["code"] == 0
    refused = as_user(test_user, run)
    assert isinstance(refused, dict)
    assert refused["code"] == 1 and refused["out"] == "", refused
    assert refused["err"] == "memagent install-service: must be run as root (see what it would do with --dry-run)\n"
    dry = as_user(test_user, lambda: run("--dry-run"))
    assert isinstance(dry, dict) and dry["code"] == 0 and dry["err"] == "", dry
    assert f"would write {target}/{UNIT} (unit; ExecStart=" in str(dry["out"])
    assert not target.exists()


def test_hostile_arguments(tmp_path: Path) -> None:
    """As every other command (test_cli_hostile.py): never a traceback, one printable line,
    exit 0, 1 or 2. ``--root`` is always a temporary directory or refused (relative, empty),
    and the command runs in one, so no hostile value reaches the box's own files."""
    root = tmp_path / "root"
    cases = [["--json", "install-service", "--root", str(root)], ["install-service", "--purge", "--root", str(root)],
             ["install-service", "--root", str(tmp_path / "esc\x1b[2J\nx")], ["completion"]]
    for n, value in enumerate(HOSTILE):
        cases += [["install-service", "--root", value], ["completion", value],
                  ["install-service", "--uninstall", "--dry-run", "--root", str(root), value] if n % 2 else
                  ["install-service", "--dry-run", "--root", str(root), value]]
    with ThreadPoolExecutor(max_workers=4) as pool:
        for argv, r in zip(cases, pool.map(lambda argv: memagent(*argv, cwd=tmp_path), cases), strict=True):
            check(argv, r)
            assert all(line.isprintable() for line in r.stdout.splitlines()), r.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["esc\x1b[2J\nx"])  # nothing else written


def test_the_packaged_files_are_the_package_data() -> None:
    """One copy: packaging/ points into the package, which the wheel carries."""
    data = Path(str(installer.data_dir()))
    assert PACKAGED_UNIT.is_symlink() and PACKAGED_UNIT.resolve() == (data / "memagent.service").resolve()
    assert PACKAGED_CONFIG.is_symlink() and PACKAGED_CONFIG.resolve() == (data / "memagent.toml").resolve()
