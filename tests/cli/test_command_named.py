"""``memagent``'s first pass (cli/main.py): a command line that plainly names its command
skips the pass over 20 stub parsers (issue 26), and must then find the very command that
pass finds; anything else is left to it."""

from __future__ import annotations

import itertools

import pytest

from memagent.cli.args import UsageError
from memagent.cli.main import NO_COMMAND, build_parser, command_named
from memagent.cli.table import TABLE

PREFIXES = ([], ["--json"], ["--socket", "/tmp/s"], ["--socket=/tmp/s"], ["--socket", "ls"],
            ["--json", "--socket", "/tmp/s"], ["--sock", "/tmp/s"], ["--js"], ["-h"], ["--help"], ["--version"],
            ["--socket"], ["--bogus"], ["--"])
WORDS = (["ls"], ["status", "--json"], ["attach", "1"], ["run", "--", "python", "-c", "pass"], ["nosuch"], [],
         ["ls", "--socket", "x"], ["report", "--help"])


def _stub_pass(argv: list[str]) -> str | None:
    try:
        return build_parser(only=NO_COMMAND).parse_known_args(argv)[0].command  # type: ignore[no-any-return]
    except (UsageError, SystemExit):
        return None


@pytest.mark.parametrize("argv", [a + b for a, b in itertools.product(PREFIXES, WORDS)], ids=" ".join)
def test_a_command_named_at_once_is_the_one_the_stub_pass_finds(argv: list[str]) -> None:
    named = command_named(argv)
    if named is not None:
        assert named == _stub_pass(argv)


def test_plain_command_lines_skip_the_stub_pass() -> None:
    assert command_named(["ls"]) == "ls"
    assert command_named(["--socket", "ls", "status"]) == "status"
    assert command_named(["--json", "--socket=/s", "attach", "1"]) == "attach"
    for unclear in (["--help"], ["--sock", "/s", "ls"], ["nosuch"], [], ["--socket"], ["--version", "ls"]):
        assert command_named(unclear) is None
    assert set(TABLE) >= {"ls", "status", "attach", "run"}
