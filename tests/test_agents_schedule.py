"""The agent loop's schedules: the loop's own (Concurrent) and the peers' lock-step one (TurnBarrier)."""

import asyncio

import pytest

from raypipe.agents import AgentLoop, SearchR1
from raypipe.agents.barrier import TurnBarrier
from raypipe.agents.schedule import Concurrent
from raypipe.core.config import AgentConfig
from raypipe.testing.fakes import FakeEngine, FakeRetriever, ScriptedController


def loop_with(agent=None, controller=None, barrier=None) -> AgentLoop:
    return AgentLoop(
        FakeEngine(lambda request: " x </answer>"),
        FakeRetriever(n=3),
        SearchR1("pyterrier"),
        agent or AgentConfig(max_turns=3),
        top_k=3,
        deep_k=3,
        controller=controller,
        barrier=barrier,
    )


def test_the_loop_runs_its_own_schedule_unless_given_a_barrier():
    assert isinstance(loop_with().schedule, Concurrent)
    barrier = TurnBarrier(2)
    assert loop_with(barrier=barrier).schedule is barrier


@pytest.mark.parametrize(
    ("agent", "controller", "barrier", "beside"),
    [
        (AgentConfig(), None, None, True),
        (AgentConfig(probe_overlap=False), None, None, False),
        (AgentConfig(probe=False), None, None, False),
        (AgentConfig(), ScriptedController(at=9), None, False),
        (AgentConfig(), None, TurnBarrier(1), False),
    ],
    ids=["default", "overlap-off", "no-probe", "controller", "barrier"],
)
def test_probes_run_beside_the_next_turns_only_in_the_loops_schedule_without_a_controller(
    agent, controller, barrier, beside
):
    assert loop_with(agent, controller, barrier).probes_beside is beside


@pytest.mark.parametrize("schedule", [Concurrent(), TurnBarrier(1)], ids=["concurrent", "lock-step"])
def test_a_failed_probe_still_waits_for_its_search(schedule):
    finished = []

    async def search():
        await asyncio.sleep(0.01)
        finished.append("search")

    async def probe():
        raise RuntimeError("probe failed")

    async def turn():
        await schedule.search_and_probe(asyncio.ensure_future(search()), probe)

    with pytest.raises(RuntimeError, match="probe failed"):
        asyncio.run(turn())
    assert finished == ["search"]


def test_the_lock_step_schedule_searches_before_it_probes():
    events = []

    async def search():
        await asyncio.sleep(0.01)
        events.append("search")

    async def probe():
        events.append("probe")

    async def turn():
        barrier = TurnBarrier(1)
        await barrier.search_and_probe(asyncio.ensure_future(search()), probe)
        return barrier.phases

    assert asyncio.run(turn()) == 2 and events == ["search", "probe"]
