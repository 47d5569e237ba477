"""Jetson's nvmap clients file: the parser on fixture files of several boards' shapes and
malformed ones, and the source the GPU sampler reads, on those files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from memagent.proc.nvmap import UUID, NvmapSource
from memagent.proc.parse import parse_nvmap_clients

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nvmap"
K = 1024

PARSED = {
    "xavier-r32-clients": ({5866: 17604 * K, 6452: 49860 * K, 5443: 80904 * K}, 148368 * K, 0),
    # One process with two clients: their sum; a client of 0K is a process holding none.
    "orin-r35-clients": ({2211: (1048576 + 32768) * K, 3120: 20480 * K, 2998: 0}, 1101824 * K, 0),
    # Process names with spaces: the PID and size are read from the right.
    "orin-r36-spaces-clients": ({4410: 8192 * K, 4502: 262144 * K}, 270336 * K, 0),
    "idle-clients": ({}, 0, 0),
    # PID not a number, size not a size, PID 0, a short row, an unknown unit: skipped, counted.
    "malformed-rows-clients": ({2211: 1048576 * K}, 1048576 * K, 5),
    "no-total-clients": ({2211: 2048 * K}, None, 0),
}
NOT_CLIENTS = ["no-header-not-clients", "empty-not-clients", "binary-not-clients", "other-header-not-clients"]


def test_every_fixture_is_covered() -> None:
    assert sorted(p.name for p in FIXTURES.iterdir()) == sorted([*PARSED, *NOT_CLIENTS])


@pytest.mark.parametrize("name", sorted(PARSED))
def test_parse(name: str) -> None:
    assert parse_nvmap_clients((FIXTURES / name).read_bytes()) == PARSED[name]


@pytest.mark.parametrize("name", NOT_CLIENTS)
def test_not_the_clients_file(name: str) -> None:
    with pytest.raises(ValueError):
        parse_nvmap_clients((FIXTURES / name).read_bytes())


def test_sizes_in_other_units() -> None:
    data = b"CLIENT PROCESS PID SIZE\nuser a 10 3M\nuser b 11 1G\nuser c 12 512\ntotal 3146240K\n"
    assert parse_nvmap_clients(data) == ({10: 3 << 20, 11: 1 << 30, 12: 512}, 3146240 * K, 0)


def test_the_source_on_a_fixture(tmp_path: Path) -> None:
    path = tmp_path / "clients"
    shutil.copy(FIXTURES / "orin-r35-clients", path)
    source = NvmapSource(str(path))
    source.start()
    assert source.available and source.note is None
    reading = source.read()
    assert reading.usage[2211] == [(0, (1048576 + 32768) * K)] and reading.failed == set()
    (device,) = reading.devices
    assert (device.index, device.uuid, device.used, device.total, device.accounting) == (0, UUID, 1101824 * K,
                                                                                         None, False)
    assert source.accounting_max(0, 2211) is None  # nvmap keeps no high-water mark
    path.write_bytes(b"garbage")  # a read that fails: this tick's figures unknown, not zero
    bad = source.read()
    assert bad.failed == {0} and bad.usage == {} and bad.devices[0].used is None
    shutil.copy(FIXTURES / "xavier-r32-clients", path)
    assert source.read().usage[5443] == [(0, 80904 * K)]


@pytest.mark.parametrize("name, note", [(None, "not found"), ("binary-not-clients", "not nvmap's clients file")])
def test_the_source_says_why_not(tmp_path: Path, name: str | None, note: str) -> None:
    path = tmp_path / "clients"
    if name:
        shutil.copy(FIXTURES / name, path)
    source = NvmapSource(str(path))
    source.start()
    assert not source.available and source.note is not None and note in source.note and str(path) in source.note


def test_a_directory_is_not_the_file(tmp_path: Path) -> None:
    source = NvmapSource(str(tmp_path))
    source.start()
    assert not source.available and source.note and str(tmp_path) in source.note
