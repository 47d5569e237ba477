"""What a directory of wheels lacks to install some requirements on a target Python.

    python wheel_closure.py TARGET_ENV_JSON WHEEL_DIR REQUIREMENT...

Prints one JSON list: the requirements (``name[extras]specifier``) that no wheel in WHEEL_DIR
satisfies, following every wheel's ``Requires-Dist`` with its environment markers evaluated
for the target (TARGET_ENV_JSON: ``python_version``, ``platform_machine``, ...). build_bundle.py
needs it because ``pip download --python-version X.Y`` evaluates markers for the Python
running pip, not for X.Y: a bundle for 3.10 built under 3.11 would lack ``tomli``
(``python_version < "3.11"``). It runs under the pip that downloads, for pip's own copy of
``packaging`` (nothing else to install).
"""

from __future__ import annotations

import email.parser
import json
import sys
import zipfile
from pathlib import Path

from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename


def requirements_of(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = (n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.BytesParser().parsebytes(archive.read(name))
    return [Requirement(line) for line in metadata.get_all("Requires-Dist") or []]


def missing(environment: dict[str, str], wheels: Path, roots: list[str]) -> list[str]:
    have = {}
    for wheel in wheels.glob("*.whl"):
        name, version, _, _ = parse_wheel_filename(wheel.name)
        have[canonicalize_name(name)] = (version, wheel)
    lacking: list[str] = []
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(root) for root in roots]
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        key = (name, frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        found = have.get(name)
        if found is None or not requirement.specifier.contains(found[0], prereleases=True):
            extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
            lacking.append(f"{requirement.name}{extras}{requirement.specifier}")
            continue
        for dependency in requirements_of(found[1]):
            wanted = dependency.marker is None or any(
                dependency.marker.evaluate({**environment, "extra": extra}) for extra in ("", *requirement.extras))
            if wanted:
                todo.append(dependency)
    return sorted(set(lacking))


if __name__ == "__main__":
    print(json.dumps(missing(json.loads(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])))
