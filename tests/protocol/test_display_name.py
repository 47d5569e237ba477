"""memproto.text.display_name: one rule for naming a process to a person (issue 28)."""

from __future__ import annotations

import pytest

from memproto.text import display_name, script_of


@pytest.mark.parametrize(("cmdline", "shown"), [
    (["/root/.pyenv/versions/3.11.7/bin/python3.11", "/srv/models/serve_yolo.py", "--port", "80"], "serve_yolo.py"),
    (["python3", "-u", "-X", "dev", "-W", "error", "train.py"], "train.py"),
    (["python", "-m", "torch.distributed.run", "x.py"], "-m torch.distributed.run"),
    (["python3", "-mpytest", "-q"], "-m pytest"),
    (["pypy3", "bench.py"], "bench.py"),
    (["python3", "-c", "import time; time.sleep(9)"], None),
    (["python3"], None),
    (["/usr/bin/sleep", "100"], None),
    (["pythonista", "x.py"], None),
    ([], None),
])
def test_the_script_of_an_interpreter(cmdline: list[str], shown: str | None) -> None:
    assert script_of(cmdline) == shown


def test_the_label_wins_then_the_script_then_comm() -> None:
    argv = ["python3", "serve.py"]
    assert display_name("resnet", "python3", argv) == "resnet"
    assert display_name(None, "python3", argv) == "serve.py"
    assert display_name("", "python3", ["python3", "-c", "pass"]) == "python3"
    assert display_name(None, "sleep", ["sleep", "9"]) == "sleep"
