"""The offline bundle and the install paths (README, "On a box"): ``make bundle`` builds the
archive (packaging/build_bundle.py), its ``install.sh`` installs it under tmp with no
network, and what it installed runs: ``memagent --version``, a daemon until "listening",
``memtop --version``; a daemon-only install has no TUI library and its ``memtop`` says what
to install; a bundle for Python 3.10 installs and runs under a real 3.10 (the floor).

No network during the installs: each runs in a network namespace of its own with no
interface up (``unshare -n``, where this user may), with ``PIP_NO_INDEX=1`` and proxies that
lead nowhere. Building needs the package index (pip fetches the wheels, and hatchling for
memagent's own): the dependencies' wheels are cached in ``~/.cache/memagent-test-wheels``
(``$MEMAGENT_WHEEL_CACHE``), keyed by memagent's requirements and the target, so only the
first run downloads them. ``MEMAGENT_TEST_NO_INDEX=1`` skips these tests where the index
cannot be reached.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("MEMAGENT_WHEEL_CACHE", Path.home() / ".cache" / "memagent-test-wheels"))
NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing answers there
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
CODE_SPAN = re.compile(r"`+[^`]*`+")

pytestmark = [
    pytest.mark.bundle,
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.environ.get("MEMAGENT_TEST_NO_INDEX") == "1",
                       reason="MEMAGENT_TEST_NO_INDEX=1: building a bundle needs the package index"),
]


def make_bundle(out: Path, *flags: str) -> Path:
    """``make bundle`` into ``out``; the archive it wrote."""
    bundle_flags = " ".join(["--cache", str(CACHE), *flags])
    subprocess.run(["make", "-s", "-C", str(ROOT), "bundle", f"PYTHON={sys.executable}", f"DIST={out}",
                    f"BUNDLE_FLAGS={bundle_flags}"], check=True, stdin=subprocess.DEVNULL)
    (archive,) = out.glob("memagent-*.tar.gz")
    return archive


def unpack(archive: Path, dest: Path) -> Path:
    with tarfile.open(archive) as tar:
        tops = {name.split("/")[0] for name in tar.getnames()}
        if hasattr(tarfile, "data_filter"):  # 3.10.12+, 3.11.4+
            tar.extractall(dest, filter="data")
        else:
            tar.extractall(dest)
    assert tops == {archive.name.removesuffix(".tar.gz")}, "one top directory, named as the archive"
    return dest / tops.pop()


def no_network_prefix() -> list[str]:
    """A command prefix that gives the command a network namespace with no interface up."""
    unshare = shutil.which("unshare")
    for flags in (["-n"], ["-r", "-n"]):
        if unshare and subprocess.run([unshare, *flags, "true"], capture_output=True).returncode == 0:
            return [unshare, *flags]
    return []


def offline_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "MEMAGENT_"))}
    env["PIP_NO_INDEX"] = "1"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = NOWHERE
    env.pop("NO_PROXY", None)
    env.pop("no_proxy", None)
    return env


def install(bundle: Path, prefix: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """``install.sh`` with no network; without ``--root`` in ``flags``, ``--no-service``."""
    service = [] if "--root" in flags else ["--no-service"]
    r = subprocess.run([*no_network_prefix(), str(bundle / "install.sh"), "--prefix", str(prefix), *service, *flags],
                       env=offline_env(), capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def run(command: Sequence[str | Path], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in command], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=60, cwd=cwd)


def daemon_listens_and_stops(memagent: Path, socket: Path) -> list[str]:
    """Start ``memagent daemon`` until it logs "listening on", SIGTERM it: its log lines."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMAGENT_")}
    config = socket.with_name("empty.toml")  # not /etc/memagent/memagent.toml, were there one
    config.write_text("")
    proc = subprocess.Popen([str(memagent), "daemon", "--socket", str(socket), "--config", str(config)],
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    log: list[str] = []
    try:
        while not any("listening on" in line for line in log):
            line = lines.get(timeout=30)
            assert line is not None, f"the daemon exited ({proc.wait()}): {log}"
            log.append(line)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log
        while (line := lines.get(timeout=30)) is not None:
            log.append(line)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return log


def broken_links(top: Path) -> list[str]:
    """Relative links of the README and the pages under ``top`` that lead nowhere."""
    broken = []
    for page in [top / "README.md", *sorted((top / "docs").glob("*.md"))]:
        for target in LINK.findall(CODE_SPAN.sub("", page.read_text())):  # `a[b](c)` in code is no link
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(top)}: {target}")
    return broken


@pytest.fixture(scope="session")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_bundle(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="session")
def bundle(archive: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack(archive, tmp_path_factory.mktemp("unpacked"))


@pytest.fixture(scope="session")
def installed(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The whole bundle (memagent[tui]) installed offline: its prefix; the links in ../links; as
    root, the service installed by ``memagent install-service --root ../root`` (not the system)."""
    prefix = tmp_path_factory.mktemp("opt") / "memagent"
    service = ["--root", str(prefix.parent / "root")] if os.geteuid() == 0 else []
    install(bundle, prefix, "--bindir", str(prefix.parent / "links"), *service)
    return prefix


def test_make_bundle_writes_one_archive_with_wheels_installer_unit_config_and_docs(archive: Path,
                                                                                   bundle: Path) -> None:
    tag = f"linux-{os.uname().machine}-py{sys.version_info[0]}{sys.version_info[1]}"
    assert re.fullmatch(rf"memagent-\d[^-]*-{tag}\.tar\.gz", archive.name), archive.name
    wheels = {p.name.split("-")[0].lower() for p in (bundle / "wheels").glob("*.whl")}
    assert {"memagent", "psutil", "msgpack", "py_spy", "austin_dist", "nvidia_ml_py", "textual", "rich"} <= wheels
    assert run(["sha256sum", "-c", "SHA256SUMS"], cwd=bundle).returncode == 0
    assert len((bundle / "SHA256SUMS").read_text().splitlines()) == len(list((bundle / "wheels").iterdir()))
    assert os.access(bundle / "install.sh", os.X_OK)
    for name in ("memagent.service", "memagent.toml"):
        assert (bundle / name).read_bytes() == (ROOT / "packaging" / name).read_bytes()
    readme = (bundle / "README.md").read_text()
    assert not re.search(r"@[A-Z]+@", readme + (bundle / "install.sh").read_text()), "a placeholder left unfilled"
    assert f"Python {sys.version_info[0]}.{sys.version_info[1]}" in readme and "./install.sh" in readme
    assert broken_links(bundle / "doc") == []


def test_the_bundle_installs_with_no_network_and_runs_memagent_its_daemon_and_memtop(installed: Path,
                                                                                     tmp_path: Path) -> None:
    links = installed.parent / "links"
    version = run([links / "memagent", "--version"])
    assert version.returncode == 0 and re.fullmatch(r"memagent \S+\n", version.stdout), version
    log = daemon_listens_and_stops(links / "memagent", tmp_path / "memagent.sock")
    assert any("stopped" in line for line in log), log
    memtop = run([links / "memtop", "--version"])
    assert memtop.returncode == 0 and memtop.stdout == version.stdout.replace("memagent", "memtop"), memtop


def test_as_root_install_sh_installs_the_service_with_memagent_install_service(installed: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("install.sh installs the service as root only")
    unit = installed.parent / "root" / "etc" / "systemd" / "system" / "memagent.service"
    assert f"\nExecStart={installed}/bin/memagent daemon " in unit.read_text()


def _private_above(path: str) -> str | None:
    """The first directory above ``path`` (resolved) that other users may not enter."""
    parts = os.path.realpath(path).split(os.sep)
    for i in range(2, len(parts)):
        here = os.sep.join(parts[:i])
        if not os.stat(here).st_mode & stat.S_IXOTH:
            return here
    return None


def test_as_root_the_interpreter_chosen_is_one_every_user_can_run(installed: Path) -> None:
    """With a pyenv under root's home first on PATH, install.sh takes the system's
    interpreter (issue 28: every non-root user got "Permission denied", exit 126)."""
    if os.geteuid() != 0:
        pytest.skip("the interpreter is checked as root only")
    assert _private_above(str(installed / "bin" / "python")) is None, os.path.realpath(installed / "bin" / "python")


def test_as_root_an_interpreter_other_users_cannot_run_is_refused(bundle: Path, tmp_path: Path) -> None:
    private = _private_above(sys.executable)
    if os.geteuid() != 0 or private is None:
        pytest.skip("needs root and an interpreter under a directory other users may not enter")
    r = subprocess.run([str(bundle / "install.sh"), "--prefix", str(tmp_path / "m"), "--no-service", "--python",
                        sys.executable], env=offline_env(), capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and not (tmp_path / "m").exists(), r.stdout + r.stderr
    assert f"cannot be run by other users ({os.path.realpath(sys.executable)} is under {private}" in r.stderr, r.stderr
    assert "--python" in r.stderr and "--private" in r.stderr


def test_the_installed_readme_and_its_links_are_in_the_environment(installed: Path) -> None:
    docs = installed / "share" / "doc" / "memagent"
    assert (docs / "README.md").read_text() == (ROOT / "README.md").read_text()
    assert broken_links(docs) == []
    assert LINK.findall((docs / "README.md").read_text()), "the README links to its pages"


def test_a_daemon_only_install_has_no_tui_library_and_memtop_says_what_to_install(bundle: Path,
                                                                                 tmp_path: Path) -> None:
    prefix = tmp_path / "memagent"
    install(bundle, prefix, "--daemon-only", "--bindir", "")
    python = prefix / "bin" / "python"
    for library in ("textual", "rich"):
        assert run([python, "-c", f"import {library}"]).returncode != 0, f"{library} installed"
    assert run([prefix / "bin" / "memagent", "--version"]).returncode == 0
    daemon_listens_and_stops(prefix / "bin" / "memagent", tmp_path / "memagent.sock")
    memtop = run([prefix / "bin" / "memtop", "--version"])
    assert memtop.returncode == 2 and memtop.stdout == "", memtop
    assert len(memtop.stderr.splitlines()) == 1 and "memagent[tui]" in memtop.stderr, memtop.stderr


def test_make_demo_installs_the_tui_extra_and_not_the_dev_tools(tmp_path: Path) -> None:
    def commands(target: str) -> str:
        return run(["make", "-n", "-C", ROOT, target, f"VENV={tmp_path / 'venv'}"]).stdout

    demo = commands("demo")
    assert "install --quiet -e '.[tui]'" in demo and "[dev]" not in demo, demo
    assert "install --quiet -e '.[dev]'" in commands("test")


def python_310() -> str | None:
    """A Python 3.10 on this machine: on PATH, or one pyenv or uv installed."""
    candidates = [shutil.which("python3.10")]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += [str(p) for p in sorted(pyenv.glob("versions/3.10.*/bin/python3.10"))]
    candidates += [str(p) for p in sorted(Path.home().glob(".local/share/uv/python/cpython-3.10.*/bin/python3.10"))]
    probe = "import sys, venv, ensurepip; assert sys.version_info[:2] == (3, 10)"
    for candidate in filter(None, candidates):
        if run([candidate, "-c", probe]).returncode == 0:
            return candidate
    return None


IMPORT_ALL = """
import importlib, pkgutil, sys
import memagent, memproto, memtop
names = [m.name for pkg in (memproto, memagent, memtop)
         for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".") if not m.name.endswith("__main__")
         and m.name not in ("memagent.recordings.plot_mpl", "memagent.gate.pytest_plugin")]
# plot_mpl: the plot extra's (matplotlib), not in a bundle; pytest_plugin: only pytest loads it
for name in names:
    importlib.import_module(name)
print(sys.version_info[:2], len(names))
"""


def test_a_bundle_for_python_3_10_installs_and_runs_under_python_3_10(tmp_path: Path) -> None:
    python = python_310()
    if python is None:
        pytest.skip("no Python 3.10 here (PATH, pyenv, uv): the floor is checked by mypy's python_version")
    bundle = unpack(make_bundle(tmp_path / "dist", "--python-version", "3.10"), tmp_path)
    assert bundle.name.endswith("-py310")
    prefix = tmp_path / "memagent"
    install(bundle, prefix, "--python", python, "--bindir", "", "--private")  # a pyenv's may be root's alone
    imported = run([prefix / "bin" / "python", "-c", IMPORT_ALL])
    assert imported.returncode == 0 and imported.stdout.startswith("(3, 10)"), imported.stderr
    # tomllib is 3.11's: the configuration is read with the tomli backport, a 3.10-only dependency.
    assert run([prefix / "bin" / "python", "-c", "import tomli"]).returncode == 0
    checked = run([prefix / "bin" / "memagent", "check-config", bundle / "memagent.toml"])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("interval = \n")
    refused = run([prefix / "bin" / "memagent", "check-config", bad])
    assert refused.returncode == 2 and "bad.toml" in refused.stderr, refused.stderr
    daemon_listens_and_stops(prefix / "bin" / "memagent", tmp_path / "memagent.sock")
    assert run([prefix / "bin" / "memtop", "--version"]).returncode == 0


def test_a_bundle_for_a_jetpack_box_built_here_holds_every_wheel_it_needs(tmp_path: Path) -> None:
    """aarch64, Python 3.10 (JetPack 6), built on this machine: pip resolves memagent[tui]
    for that target from its wheels alone, and nothing a marker asks for on 3.10 is missing."""
    target = ["--python-version", "3.10", "--platform", "manylinux2014_aarch64"]
    bundle = unpack(make_bundle(tmp_path / "dist", *target), tmp_path)
    assert bundle.name.endswith("-linux-aarch64-py310")
    env = offline_env() | {"PIP_CONFIG_FILE": os.devnull}
    resolved = subprocess.run(
        [*no_network_prefix(), sys.executable, "-m", "pip", "download", "--quiet", "--no-index", "--find-links",
         str(bundle / "wheels"), "--only-binary=:all:", "--implementation", "cp", *target, "--dest",
         str(tmp_path / "resolved"), "memagent[tui]"], env=env, capture_output=True, text=True)
    assert resolved.returncode == 0, resolved.stderr
    assert any((bundle / "wheels").glob("psutil-*aarch64*.whl")) and any((bundle / "wheels").glob("tomli-*.whl"))
    environment = '{"python_version": "3.10", "platform_machine": "aarch64", "sys_platform": "linux"}'
    closure = run([sys.executable, ROOT / "packaging" / "wheel_closure.py", environment, bundle / "wheels",
                   "memagent[tui]"])
    assert closure.returncode == 0 and closure.stdout.strip() == "[]", closure
