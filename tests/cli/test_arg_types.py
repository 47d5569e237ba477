"""The shared argument types of ``cli/args.py``: one integer-range type behind ``--pid``,
``report --top`` and ``run --over-budget-status``, each message as it was; and the one
``--pid``/``--label`` helper of ``plot``, ``report`` and ``record``."""

from __future__ import annotations

import argparse

import pytest

from memagent.cli.args import Parser, add_selection_arguments, int_range_arg, pid_arg


@pytest.mark.parametrize(("parse", "text", "message"), [
    (pid_arg, "x", "not a PID: 'x'"),
    (pid_arg, "0", "not a PID: '0' (1 to 4194304)"),
    (int_range_arg(1, 100_000, "a count from 1 to 100000"), "0", "not a count from 1 to 100000: '0'"),
    (int_range_arg(1, 100_000, "a count from 1 to 100000"), "ten", "not a count from 1 to 100000: 'ten'"),
    (int_range_arg(0, 255, "an exit status", say_range=True), "256", "not an exit status: '256' (0 to 255)"),
    (int_range_arg(0, 255, "an exit status", say_range=True), "3.0", "not an exit status: '3.0'"),
])
def test_an_integer_out_of_its_range_is_one_message(parse: object, text: str, message: str) -> None:
    assert callable(parse)
    with pytest.raises(argparse.ArgumentTypeError) as exc:
        parse(text)
    assert str(exc.value) == message


def test_an_integer_in_range_is_itself() -> None:
    assert (pid_arg("4194304"), int_range_arg(0, 255, "an exit status")("0")) == (4194304, 0)


def test_the_selection_takes_repeated_pids_and_labels_or_pids_only() -> None:
    both, pids_only = Parser(prog="t"), Parser(prog="t")
    add_selection_arguments(both)
    add_selection_arguments(pids_only, label=False, pid_help="only")
    args = both.parse_args(["--pid", "3", "--pid", "4", "--label", "a"])
    assert (args.pid, args.label) == ([3, 4], ["a"])
    assert not hasattr(pids_only.parse_args([]), "label")
