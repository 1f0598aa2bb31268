"""A turn's probe beside the trajectory's next turns (``agent.probe_overlap``): off the critical path, and the
same trajectory, rows, observer calls and failures as the probe run before the next turn."""

import asyncio

import pytest

from raypipe.agents import AgentLoop, R1Searcher, SearchR1
from raypipe.core.config import AgentConfig
from raypipe.core.schema import conform
from raypipe.data.loaders import Question
from raypipe.llm.base import EngineDiedError, EngineUnavailableError
from raypipe.testing.fakes import FakeEngine, FakeRetriever, agent_turns

Q = Question(qid="q1", dataset="toy", question="Who wrote Hamlet", golden_answers=["William Shakespeare"])
SEARCH_1 = "<think> I need the author. </think>\n<search> Hamlet author </search>"
SEARCH_2 = "<think> Check again. </think>\n<search> Shakespeare </search>"
ANSWER = "<think> Found it. </think>\n<answer> William Shakespeare </answer>"
TIMES = {"wall_s", "retrieval_s", "queue_s", "engine_s"}


def by_evidence(prompt: str) -> str:
    if "passage 0 about Shakespeare" in prompt:
        return " William Shakespeare </answer>"
    if "passage 0 about Hamlet author" in prompt:
        return " Shakespeare </answer>"
    return " Marlowe </answer>"


def failing_after(searches: int, exc: Exception):
    """Probes that fail once the context holds ``searches`` searches' documents."""

    def probe(prompt: str) -> str:
        if prompt.count("passage 0 about") >= searches:
            raise exc
        return by_evidence(prompt)

    return probe


def run(turns, probe, overlap, agent=None, protocol=None, engine=None):
    agent = (agent or AgentConfig(max_turns=4)).model_copy(update={"probe_overlap": overlap})
    engine = engine or FakeEngine(agent_turns(turns, probe))
    loop = AgentLoop(engine, FakeRetriever(n=5), protocol or SearchR1("pyterrier"), agent, top_k=3, deep_k=5)
    told = []
    out = asyncio.run(loop.run(Q, told.append))
    return out, told


def without_times(rows):
    return [{k: v for k, v in row.items() if k not in TIMES} for row in rows]


CASES = {
    "answer after two searches": ([SEARCH_1, SEARCH_2, ANSWER], by_evidence, None, None),
    "turn limit": ([SEARCH_1, SEARCH_2, SEARCH_1], by_evidence, AgentConfig(max_turns=3), None),
    "turn limit, forced answer": ([SEARCH_1, SEARCH_2], by_evidence, AgentConfig(max_turns=2, at_limit="forced"), None),
    "probe 0 fails": ([SEARCH_1, SEARCH_2, ANSWER], failing_after(0, EngineUnavailableError("probe down")), None, None),
    "probe 1 fails": ([SEARCH_1, SEARCH_2, ANSWER], failing_after(1, EngineUnavailableError("probe down")), None, None),
    "probe 1 fails, then turn 2": (
        [SEARCH_1, SEARCH_2, EngineUnavailableError("turn down")],
        failing_after(1, EngineUnavailableError("probe down")),
        None,
        None,
    ),
    "probe fails unexpectedly": ([SEARCH_1, SEARCH_2, ANSWER], failing_after(2, RuntimeError("boom")), None, None),
    "the forced answer's probe fails": (
        [SEARCH_1, SEARCH_2],
        failing_after(2, EngineUnavailableError("probe down")),
        AgentConfig(max_turns=2, at_limit="forced"),
        None,
    ),
    "turn 2 fails": ([SEARCH_1, SEARCH_2, EngineUnavailableError("turn down")], by_evidence, None, None),
    "invalid action corrected": (["no tags at all", SEARCH_1, ANSWER], by_evidence, None, SearchR1("original")),
    "r1-searcher": (
        ["<|begin_of_query|> Hamlet author <|end_of_query|>", "The answer is \\boxed{Shakespeare}"],
        by_evidence,
        None,
        R1Searcher("pyterrier"),
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_the_same_trajectory_rows_and_observer_calls_as_probing_first(case):
    turns, probe, agent, protocol = CASES[case]
    first, first_told = run(turns, probe, overlap=False, agent=agent, protocol=protocol)
    beside, beside_told = run(turns, probe, overlap=True, agent=agent, protocol=protocol)
    assert without_times([beside.trajectory]) == without_times([first.trajectory])
    assert without_times(beside.iterations) == without_times(first.iterations)
    assert without_times(beside_told) == without_times(first_told)  # in order, each row with its probe
    assert len(first.iterations) == len(first_told)
    conform(beside.iterations, "iterations")


def test_failures_keep_the_rows_before_the_failed_probe():
    out, _ = run([SEARCH_1, SEARCH_2, ANSWER], failing_after(1, EngineUnavailableError("probe down")), overlap=True)
    traj = out.trajectory
    assert traj["stop_reason"] == "engine_error" and traj["error"] == "probe down"
    assert [r["iteration"] for r in out.iterations] == [0] and traj["n_iterations"] == 1
    # the context as the failed probe found it: turn 0 and its documents, not turn 1 (run meanwhile)
    assert "passage 0 about Hamlet author" in traj["transcript"] and "Check again" not in traj["transcript"]


class ProbeWaitsForNextTurn(FakeEngine):
    """The first probe ends only once the next turn's request has arrived: it deadlocks a probe-first loop."""

    def __init__(self, script, patience: float):
        super().__init__(script)
        self.patience = patience
        self.next_turn = asyncio.Event()
        self.order: list[str] = []

    async def generate(self, request):
        kind = "probe" if request.logprobs else "turn"
        self.order.append(f"{kind} starts")
        if kind == "turn" and self.order.count("turn starts") == 2:
            self.next_turn.set()
        if kind == "probe" and self.order.count("probe starts") == 1:
            await asyncio.wait_for(self.next_turn.wait(), timeout=self.patience)
        gen = await super().generate(request)
        self.order.append(f"{kind} ends")
        return gen


def test_the_next_turn_starts_before_the_probe_ends():
    engine = ProbeWaitsForNextTurn(agent_turns([SEARCH_1, SEARCH_2, ANSWER], by_evidence), patience=5)
    out, _ = run(None, None, overlap=True, engine=engine)
    assert out.trajectory["stop_reason"] == "answer" and out.trajectory["final_f1"] == 1.0
    second_turn = [i for i, event in enumerate(engine.order) if event == "turn starts"][1]
    assert second_turn < engine.order.index("probe ends")
    assert [round(r["probe_f1"], 3) for r in out.iterations] == [0.0, 0.667, 1.0]
    assert [r["utility"] is None for r in out.iterations] == [True, False, False]

    engine = ProbeWaitsForNextTurn(agent_turns([SEARCH_1, SEARCH_2, ANSWER], by_evidence), patience=0.2)
    out, _ = run(None, None, overlap=False, engine=engine)  # probe first: the probe waits in vain
    assert (
        out.trajectory["stop_reason"] == "internal_error" and "TimeoutError" in out.trajectory["error"]
    )  # outside the engine contract


def test_an_engine_death_cancels_the_probes_in_flight():
    cancelled = []

    class DiesOnTurn1(FakeEngine):
        async def generate(self, request):
            if request.logprobs:
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    cancelled.append(request.prompt)
                    raise
            elif "passage 0 about Hamlet author" in request.prompt:
                await asyncio.sleep(0.01)  # the probe of row 0 is running
                raise EngineDiedError("engine core died")
            return await super().generate(request)

    with pytest.raises(EngineDiedError):
        run(None, None, overlap=True, engine=DiesOnTurn1(agent_turns([SEARCH_1, SEARCH_2], by_evidence)))
    assert len(cancelled) == 1 and "passage 0 about" not in cancelled[0]  # row 0's probe, running when turn 1 died
