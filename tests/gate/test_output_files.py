"""How ``memagent run`` opens its ``--report``/``--junit`` files
(:func:`memagent.gate.outputs.open_output`), on real files: what another user could plant is
refused with one reason, what is ours is written. (The planted link as the second user:
tests/e2e/test_run_cmd.py.)"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from memagent.errors import CommandFailed
from memagent.gate.outputs import check_writable, write_text


@pytest.fixture
def sticky(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o1777)
    yield d


def test_a_new_file_is_created_and_an_own_file_truncated(sticky: Path) -> None:
    out = sticky / "report.json"
    check_writable(str(out))
    assert not out.exists()  # the probe removes what it created
    write_text(str(out), "a long first report\n")
    write_text(str(out), "short\n")
    assert out.read_text() == "short\n"
    write_text(str(out), "more\n", append=True)
    assert out.read_text() == "short\nmore\n"


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "report.json"
    os.mkfifo(fifo)
    with pytest.raises(CommandFailed, match="not a regular file"):
        check_writable(str(fifo))
    with pytest.raises(OSError, match="not a regular file"):
        write_text(str(fifo), "x")


def test_a_link_is_not_followed_anywhere(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = tmp_path / "report.json"
    link.symlink_to(victim)
    with pytest.raises(OSError, match="symbolic link"):
        write_text(str(link), "x")
    assert victim.read_text() == "precious\n"


def test_a_hard_link_in_a_shared_directory_is_refused(sticky: Path, tmp_path: Path) -> None:
    """A second name of a file of ours (a victim's, where hard links to it can be made:
    fs.protected_hardlinks = 0) is not truncated through a directory others write to."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.link(victim, sticky / "junit.xml")
    with pytest.raises(OSError, match="other names"):
        write_text(str(sticky / "junit.xml"), "x")
    assert victim.read_text() == "precious\n"


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CommandFailed, match="cannot write"):
        check_writable(str(tmp_path))
    with pytest.raises(CommandFailed, match="directory"):
        check_writable(str(tmp_path) + "/")
