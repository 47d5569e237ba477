"""A demo fleet: small Python processes with distinct memory shapes, labelled.

Shapes: ``steady`` (holds 120 MiB), ``sawtooth`` (grows to 150 MiB, drops, again),
``leak`` (grows ~3 MiB/s), ``spike`` (30 MiB, with a 250 MiB spike lasting 0.1 s every
5 s: invisible to periodic RSS sampling, caught by the kernel's peak), and ``forked``
(a parent holding a 200 MiB buffer and 3 forked workers sharing it copy-on-write, each
with 20 MiB of its own: naive ΣRSS counts the buffer four times).

Workers die with their parent (``PR_SET_PDEATHSIG``), so stopping the demo, or killing
it, stops the fleet. ``python -m memagent.demo_fleet worker SHAPE`` runs one worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import MemagentError

if TYPE_CHECKING:
    from .config import AgentConfig
    from .core.registry import Registry

MiB = 1024 * 1024
SHAPES = ("steady", "sawtooth", "leak", "spike", "forked")
#: The demo's own host capacity, so that a newcomer sees the danger whatever the box's RAM:
#: the fleet's Σ peaks reach about 910 MiB in its first ten seconds, past 90 % of it (a
#: warning), and its leak (3 MiB/s) takes it past 100 % (critical) within about a minute.
DEMO_CAPACITY = 1024 * MiB
_PR_SET_PDEATHSIG = 1
#: The PID a worker's parent had (the environment variable): another one means it died.
_PARENT = "MEMAGENT_DEMO_PARENT"


def demo_config(socket: str, interval: float) -> AgentConfig:
    """The agent the demo runs under (memtop --demo, memagent demo): no auto-attach (its own
    fleet only) and :data:`DEMO_CAPACITY`. The configuration is imported here, not at the
    top: every worker imports this module too, and its memory is the demo's figures."""
    from .config import AgentConfig, HeadroomConfig

    return AgentConfig(socket=socket, interval=interval, headroom=HeadroomConfig(host_capacity=DEMO_CAPACITY))


def touched(n_bytes: int) -> bytearray:
    """``n_bytes`` really resident: every page written (a fresh bytearray is untouched)."""
    return bytearray(b"\x01") * n_bytes


def die_with_parent(parent: int | None = None) -> None:
    """SIGTERM when the parent (PID ``parent``, else whoever it is now) ends."""
    expected = os.getppid() if parent is None else parent
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    # The parent died before prctl took effect: adopted by init or a subreaper.
    if os.getppid() != expected or (parent is None and expected == 1):
        sys.exit(0)


def _steady() -> None:
    hold = touched(120 * MiB)  # noqa: F841 - held on purpose
    while True:
        time.sleep(3600)


def _sawtooth() -> None:
    chunks: list[bytearray] = []
    while True:
        for _ in range(15):
            chunks.append(touched(10 * MiB))
            time.sleep(0.3)
        chunks.clear()
        time.sleep(1.0)


def _leak() -> None:
    leaked: list[bytearray] = []
    while True:
        leaked.append(touched(3 * MiB))
        if len(leaked) > 150:  # keep the demo bounded (~450 MiB), then "restart"
            leaked.clear()
        time.sleep(1.0)


def _spike() -> None:
    base = touched(30 * MiB)  # noqa: F841 - held on purpose
    while True:
        time.sleep(5.0)
        burst = touched(250 * MiB)
        time.sleep(0.1)
        del burst


def _forked() -> None:
    shared = touched(200 * MiB)
    children = []
    me = os.getpid()
    for _ in range(3):
        pid = os.fork()
        if pid == 0:
            die_with_parent(me)
            own = touched(20 * MiB)  # noqa: F841 - held on purpose
            total = 0
            while True:  # read the shared buffer: shared pages stay shared
                total += shared[total % len(shared)]
                time.sleep(1.0)
        children.append(pid)
    with contextlib.suppress(ChildProcessError):
        while True:
            os.wait()


_WORKERS = {"steady": _steady, "sawtooth": _sawtooth, "leak": _leak, "spike": _spike, "forked": _forked}


@dataclass(frozen=True)
class Member:
    label: str
    shape: str
    process: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.process.pid


class Fleet:
    """Start and stop the demo processes."""

    def __init__(self, shapes: tuple[str, ...] = SHAPES) -> None:
        self.shapes = shapes
        self.members: list[Member] = []

    def start(self) -> list[Member]:
        for shape in self.shapes:
            proc = subprocess.Popen(
                [sys.executable, "-m", "memagent.demo_fleet", "worker", shape],
                stdin=subprocess.DEVNULL, env={**os.environ, _PARENT: str(os.getpid())},
            )
            self.members.append(Member(f"demo-{shape}", shape, proc))
        return self.members

    def stop(self) -> None:
        for m in self.members:
            with contextlib.suppress(ProcessLookupError):
                m.process.terminate()
        for m in self.members:
            try:
                m.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                m.process.kill()
                m.process.wait()
        self.members.clear()

    def __enter__(self) -> Fleet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def attach_fleet(fleet: Fleet, registry: Registry) -> list[str]:
    """Attach every member, labelled (the forked one with its workers, once it has forked
    them); returns why a member could not be attached, if any could not."""
    await asyncio.sleep(0.5)  # let the forked member fork its workers before attaching
    problems = []
    for m in fleet.members:
        try:
            registry.attach(m.pid, label=m.label, children=m.shape == "forked")
        except MemagentError as exc:
            problems.append(str(exc))
    return problems


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "worker" and argv[1] in _WORKERS:
        die_with_parent(int(os.environ[_PARENT]) if os.environ.get(_PARENT, "").isdigit() else None)
        # At once: a second SIGTERM (stop, then the parent's death) must not land in the
        # interpreter's shutdown, where it prints a traceback on the demo's terminal.
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        _WORKERS[argv[1]]()
        return 0
    print(f"usage: python -m memagent.demo_fleet worker {{{','.join(SHAPES)}}}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
