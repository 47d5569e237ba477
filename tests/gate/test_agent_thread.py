"""The run's own agent (memagent.agent_thread): readiness is the agent's event, awaited
while its thread lives, with no deadline a loaded box could pass (issue 26: `memagent run`
failed before CMD started, "no answer in time"); an agent that dies says so at once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from memagent.agent_thread import AgentStopped, AgentThread
from memagent.config import AgentConfig
from memagent.errors import MemagentError


class SlowToListen(AgentThread):
    """Its readiness comes later than any fixed wait of the old code would allow, in the
    old code's proportion: a tenth of the wait stands for a box ten times slower."""

    delay = 1.0

    async def on_ready(self) -> None:
        await asyncio.sleep(self.delay)


def _agent(kind: type[AgentThread], tmp_path: Path) -> AgentThread:
    return kind(lambda socket: AgentConfig(socket=socket, interval=0.1), prefix=f"{tmp_path}/t-", name="test-agent")


def test_start_returns_once_the_agent_listens_however_long_it_takes(tmp_path: Path) -> None:
    agent = _agent(SlowToListen, tmp_path)
    try:
        began = time.monotonic()
        socket = agent.start()
        assert time.monotonic() - began >= SlowToListen.delay  # it waited for the event itself
        assert Path(socket).exists() and agent.running

        ran: list[bool] = []

        async def work() -> None:
            await asyncio.sleep(SlowToListen.delay)
            ran.append(True)

        agent.call(work)  # as long as the work takes: no deadline either
        assert ran == [True]
    finally:
        agent.stop()
    assert not agent.running


class DiesAtStart(AgentThread):
    async def on_ready(self) -> None:
        raise MemagentError("cannot listen: the disk is gone")


def test_an_agent_that_fails_to_start_raises_its_own_error_at_once(tmp_path: Path) -> None:
    agent = _agent(DiesAtStart, tmp_path)
    try:
        with pytest.raises(MemagentError, match="the disk is gone"):
            agent.start()
    finally:
        agent.stop()


def test_work_for_an_agent_that_stopped_meanwhile_is_an_error_not_a_hang(tmp_path: Path) -> None:
    agent = _agent(AgentThread, tmp_path)
    agent.start()

    async def stop_it() -> None:
        assert agent._stop is not None
        agent._stop.set()
        await asyncio.Event().wait()  # never ends by itself: only the thread's end ends the wait

    try:
        with pytest.raises(AgentStopped):
            agent.call(stop_it)
    finally:
        agent.stop()
