#!/usr/bin/env python3
"""Build the offline bundle (``make bundle``): one archive that installs memagent on a box
with no network.

    python3 packaging/build_bundle.py [--out dist] [--python-version 3.10]
                                      [--platform manylinux2014_aarch64 ...] [--cache DIR]

It writes ``OUT/memagent-VERSION-linux-ARCH-pyXY.tar.gz`` holding ``wheels/`` (memagent and
every dependency of ``memagent[tui]`` for that Python and platform, binary wheels only),
``install.sh`` and ``README.md`` (from ``packaging/bundle/``), the systemd unit, the example
configuration, ``doc/`` (the project's README with the pages it links to, laid out as in
the repository) and ``SHA256SUMS``. The package index is used here, at build time, only:
``install.sh`` runs ``pip install --no-index --find-links wheels``.

By default the bundle is for the Python running this script, on this machine. With
``--python-version`` and ``--platform`` pip fetches the wheels of another target (a
JetPack 6 box: ``--python-version 3.10 --platform manylinux2014_aarch64``); memagent's own
wheel is pure Python. ``--cache DIR`` keeps the dependencies' wheels under a key made of
memagent's requirements and the target, so a second build with the same requirements
downloads nothing (the tests use it). Standard library only: it runs with a bare Python.
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUNDLE_FILES = ROOT / "packaging" / "bundle"
CLOSURE = ROOT / "packaging" / "wheel_closure.py"
UNIT = ROOT / "packaging" / "memagent.service"
CONFIG = ROOT / "packaging" / "memagent.toml"
ARCHES = ("x86_64", "aarch64", "armv7l", "ppc64le", "s390x", "i686")


@dataclass(frozen=True)
class Target:
    python: str  # "3.10"
    platforms: tuple[str, ...]  # pip's --platform tags; empty: this machine
    arch: str

    @property
    def tag(self) -> str:
        return f"linux-{self.arch}-py{self.python.replace('.', '')}"

    def environment(self) -> dict[str, str]:
        """The environment markers' values on the target."""
        running = "{}.{}".format(*sys.version_info[:2]) == self.python
        full = platform.python_version() if running else f"{self.python}.0"
        return {"python_version": self.python, "python_full_version": full, "implementation_name": "cpython",
                "implementation_version": full, "platform_python_implementation": "CPython",
                "platform_machine": self.arch, "platform_system": "Linux", "sys_platform": "linux", "os_name": "posix"}

    def pip_flags(self) -> list[str]:
        flags = ["--only-binary=:all:", "--python-version", self.python, "--implementation", "cp"]
        for tag in self.platforms:
            flags += ["--platform", tag]
        return flags


def target_of(python: str | None, platforms: list[str]) -> Target:
    version = python or "{}.{}".format(*sys.version_info[:2])
    if platforms:
        arches = {arch for tag in platforms for arch in ARCHES if tag.endswith("_" + arch)}
        if len(arches) != 1 or not all(tag.startswith(("manylinux", "musllinux", "linux")) for tag in platforms):
            sys.exit(f"build_bundle: --platform: Linux tags of one architecture, not {' '.join(platforms)}")
        return Target(version, tuple(platforms), arches.pop())
    if not sys.platform.startswith("linux"):
        sys.exit("build_bundle: builds for Linux: on another system, give --platform (e.g. manylinux2014_x86_64)")
    return Target(version, (), platform.machine())


def pip_command(scratch: Path) -> list[str]:
    """This Python's pip; where it has none (a bare distribution Python), one in a venv."""
    probe = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True)
    if probe.returncode == 0:
        return [sys.executable, "-m", "pip"]
    venv = scratch / "pip-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    return [str(venv / "bin" / "python"), "-m", "pip"]


def run(command: list[str]) -> None:
    subprocess.run(command, check=True, env=_pip_env())


def _pip_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    return env


def build_memagent_wheel(pip: list[str], dest: Path) -> Path:
    run([*pip, "wheel", "--quiet", "--no-deps", "--wheel-dir", str(dest), str(ROOT)])
    (wheel,) = dest.glob("memagent-*.whl")
    return wheel


def wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = (n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.BytesParser().parsebytes(archive.read(name))


def cache_key(metadata: email.message.Message, target: Target) -> str:
    lines = sorted(metadata.get_all("Requires-Dist") or [])
    text = "\n".join([*lines, target.python, *target.platforms, target.arch])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def dependency_wheels(pip: list[str], wheel: Path, target: Target, scratch: Path, cache: Path | None,
                      key: str) -> list[Path]:
    """Every wheel ``memagent[tui]`` needs on the target, memagent's own left out."""
    if cache is not None and (cache / key / ".complete").is_file():
        cached = scratch / "cached"
        cached.mkdir()
        for path in [wheel, *(cache / key).glob("*.whl")]:
            (cached / path.name).symlink_to(path)
        if not lacking(pip, cached, target):
            return sorted((cache / key).glob("*.whl"))
    dest = scratch / "deps"
    run([*pip, "download", "--quiet", "--dest", str(dest), *target.pip_flags(), f"memagent[tui] @ {wheel.as_uri()}"])
    complete(pip, dest, target)
    for own in dest.glob("memagent-*.whl"):
        own.unlink()
    if cache is None:
        return sorted(dest.glob("*.whl"))
    cache.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=cache))
    for path in dest.glob("*.whl"):
        shutil.copy2(path, fresh / path.name)
    (fresh / ".complete").touch()
    final = cache / key
    shutil.rmtree(final, ignore_errors=True)  # an interrupted build's, or lacking a wheel
    try:
        fresh.rename(final)
    except OSError:  # another build filled it meanwhile
        shutil.rmtree(fresh)
    return sorted(final.glob("*.whl"))


def lacking(pip: list[str], wheels: Path, target: Target) -> list[str]:
    """What ``memagent[tui]`` needs on the target that no wheel in ``wheels`` gives (wheel_closure.py)."""
    found = subprocess.run([pip[0], str(CLOSURE), json.dumps(target.environment()), str(wheels), "memagent[tui]"],
                           check=True, capture_output=True, text=True)
    names: list[str] = json.loads(found.stdout)
    return names


def complete(pip: list[str], dest: Path, target: Target) -> None:
    """Download what pip left out by evaluating markers for its own Python, not the target's."""
    for _ in range(5):
        names = lacking(pip, dest, target)
        if not names:
            return
        run([*pip, "download", "--quiet", "--dest", str(dest), *target.pip_flags(), *names])
    sys.exit(f"build_bundle: no wheels for Python {target.python} satisfy {' '.join(names)}")


def doc_files() -> Iterator[tuple[Path, str]]:
    """The README and what its links reach, at their paths in the repository."""
    yield ROOT / "README.md", "README.md"
    for page in sorted((ROOT / "docs").glob("*.md")):
        yield page, f"docs/{page.name}"
    yield UNIT, "packaging/memagent.service"
    yield CONFIG, "packaging/memagent.toml"
    # For the fleet's Prometheus and Grafana (docs/alerting-prometheus.md links them).
    for extra in sorted([*(ROOT / "packaging" / "prometheus").glob("*.yml"),
                         *(ROOT / "packaging" / "grafana").glob("*.json")]):
        yield extra, extra.relative_to(ROOT).as_posix()


def fill(text: str, version: str, target: Target, wheels: int) -> str:
    return (text.replace("@VERSION@", version).replace("@PYTHON@", target.python)
            .replace("@PLATFORM@", f"linux-{target.arch}").replace("@WHEELS@", str(wheels)))


def stage(top: Path, version: str, target: Target, wheels: list[Path]) -> None:
    (top / "wheels").mkdir(parents=True)
    for wheel in wheels:
        shutil.copy2(wheel, top / "wheels" / wheel.name)
    for name in ("install.sh", "README.md"):
        (top / name).write_text(fill((BUNDLE_FILES / name).read_text(), version, target, len(wheels)))
    (top / "install.sh").chmod(0o755)
    (top / "bundle.env").write_text(
        f"MEMAGENT_VERSION={version}\nBUNDLE_PYTHON={target.python}\nBUNDLE_PLATFORM=linux-{target.arch}\n")
    shutil.copyfile(UNIT, top / "memagent.service")
    shutil.copyfile(CONFIG, top / "memagent.toml")
    for source, relative in doc_files():
        (top / "doc" / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, top / "doc" / relative)
    sums = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  wheels/{p.name}" for p in sorted(wheels)]
    (top / "SHA256SUMS").write_text("\n".join(sums) + "\n")


def _normalised(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def build(out: Path, target: Target, cache: Path | None) -> Path:
    with tempfile.TemporaryDirectory(prefix="memagent-bundle.") as tmp:
        scratch = Path(tmp)
        pip = pip_command(scratch)
        own = build_memagent_wheel(pip, scratch / "own")
        metadata = wheel_metadata(own)
        version = str(metadata["Version"])
        deps = dependency_wheels(pip, own, target, scratch, cache, cache_key(metadata, target))
        name = f"memagent-{version}-{target.tag}"
        stage(scratch / name, version, target, [own, *deps])
        out.mkdir(parents=True, exist_ok=True)
        archive = out / f"{name}.tar.gz"
        partial = out / f".{name}.tar.gz.partial"
        with tarfile.open(partial, "w:gz") as tar:
            tar.add(scratch / name, arcname=name, filter=_normalised)
        partial.replace(archive)
    return archive


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="build_bundle.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="where the archive goes (dist)")
    parser.add_argument("--python-version", metavar="X.Y", help="the target's Python (default: this one's)")
    parser.add_argument("--platform", action="append", default=[], metavar="TAG",
                        help="a wheel platform tag of the target, e.g. manylinux2014_aarch64 (default: this machine)")
    parser.add_argument("--cache", type=Path, metavar="DIR", help="keep and reuse the dependencies' wheels here")
    args = parser.parse_args(argv)
    target = target_of(args.python_version, args.platform)
    archive = build(args.out, target, args.cache)
    print(f"{archive} ({archive.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
