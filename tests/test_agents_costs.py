"""Cost accounting of the agent loop and its schedules (search beside the probe, the turn barrier), with fakes."""

import asyncio
import re

import pytest

from raypipe.agents import AgentLoop, SearchR1
from raypipe.agents.barrier import TurnBarrier
from raypipe.core.config import AgentConfig
from raypipe.core.schema import COST_COLUMNS, TRAJECTORY_COSTS, conform
from raypipe.data.loaders import Question
from raypipe.llm.base import Generation, GenerationRequest
from raypipe.testing.fakes import FakeEngine, FakeRetriever, ScriptedController

BLOCK = 4  # words per cached block of the fake prefix cache
HOPS = [0, 1, 2, 3, 1, 2]  # searches before each question's answer
QUESTIONS = [
    Question(qid=f"q{i}", dataset="toy", question=f"Question number {i}", golden_answers=[f"answer {i}"])
    for i in range(len(HOPS))
]
TIMES = {"wall_s", "retrieval_s", "queue_s", "engine_s"}  # vary from run to run


def scripted(request: GenerationRequest) -> str:
    """Question i searches HOPS[i] times, then answers; probes answer with the number of documents read."""
    index = int(re.search(r"Question number (\d+)", request.prompt).group(1))
    read = request.prompt.count("<information>Doc")
    if request.prompt.endswith("<answer>"):
        return f" answer {read} </answer>"
    if read < HOPS[index]:
        return f"<think> hop {read} of {index} </think>\n<search> q{index} hop {read} </search>"
    return f"<think> done {index} </think>\n<answer> answer {index} </answer>"


class PrefixCacheEngine(FakeEngine):
    """A fake engine with a prefix cache: a prompt's leading words that an earlier prompt shares, in whole
    blocks of ``BLOCK`` words, are served from the cache; it reports queue and engine seconds."""

    def __init__(self, script=scripted, report_cache: bool = True):
        super().__init__(script)
        self.report_cache = report_cache
        self.seen: list[list[str]] = []

    async def generate(self, request: GenerationRequest) -> Generation:
        gen = await super().generate(request)
        words = request.prompt.split()
        shared = max((_common_prefix(words, old) for old in self.seen), default=0)
        self.seen.append(words)
        cached = min(shared, len(words) - 1) // BLOCK * BLOCK
        return Generation(
            text=gen.text,
            token_ids=gen.token_ids,
            token_logprobs=gen.token_logprobs,
            stop_string=gen.stop_string,
            prompt_tokens=gen.prompt_tokens,
            cached_prompt_tokens=cached if self.report_cache else None,
            queue_s=0.001,
            engine_s=0.01 * (1 + len(gen.token_ids)),
        )


def _common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class SlowRetriever(FakeRetriever):
    """A retriever that yields to the event loop while it searches (as a remote service does)."""

    async def search(self, queries, k):
        await asyncio.sleep(0.002)
        return await super().search(queries, k)


def make_loop(engine, retriever=None, controller=None, barrier=None, agent=None):
    return AgentLoop(
        engine,
        retriever or SlowRetriever(n=5),
        SearchR1("pyterrier"),
        agent or AgentConfig(max_turns=5),
        top_k=3,
        deep_k=5,
        controller=controller,
        barrier=barrier,
    )


async def _run_all(loop, questions):
    return list(await asyncio.gather(*(loop.run(q) for q in questions)))


def test_cost_columns_add_up_per_iteration_and_per_trajectory():
    engine = PrefixCacheEngine()
    outputs = asyncio.run(_run_all(make_loop(engine), QUESTIONS))
    requests_by_qid: dict[str, list[GenerationRequest]] = {}
    for request in engine.requests:
        qid = "q" + re.search(r"Question number (\d+)", request.prompt).group(1)
        requests_by_qid.setdefault(qid, []).append(request)
    for out, hops in zip(outputs, HOPS):
        traj, rows = out.trajectory, out.iterations
        assert traj["stop_reason"] == "answer" and traj["n_iterations"] == hops
        conform(rows, "iterations")
        conform([traj], "trajectories")
        for row in rows:
            assert row["prompt_tokens"] == row["prefilled_tokens"] + row["cached_tokens"]
            assert row["probe_prompt_tokens"] <= row["prompt_tokens"]
            assert row["probe_cached_tokens"] <= row["cached_tokens"]
        assert traj["prompt_tokens"] == traj["prefilled_tokens"] + traj["cached_tokens"]
        for field in TRAJECTORY_COSTS:
            source = "search_dropped" if field.name == "searches_dropped" else field.name
            total = sum(r[source] or 0 for r in rows)
            assert traj[field.name] == pytest.approx(total), field.name
        # every prompt token the engine was sent is charged to exactly one row of its trajectory
        sent = requests_by_qid[traj["qid"]]
        assert traj["prompt_tokens"] == sum(engine.count_tokens(r.prompt) for r in sent)
        assert traj["probe_prompt_tokens"] == sum(engine.count_tokens(r.prompt) for r in sent if r.logprobs)
        # the searches this trajectory issued: one per searching row, timed
        assert sum(r["retrieval_s"] is not None for r in rows) == hops
        assert all((r["retrieval_s"] is not None) == (r["iteration"] < hops) for r in rows)
    cached = sum(o.trajectory["cached_tokens"] for o in outputs)
    assert 0 < cached < sum(o.trajectory["prompt_tokens"] for o in outputs)  # probes and later turns reuse prefixes


def test_unreported_cache_and_timings_are_null_not_zero():
    class Plain(FakeEngine):  # reports neither cache hits nor timings, like an HTTP server without them
        pass

    out = asyncio.run(make_loop(Plain(scripted)).run(QUESTIONS[2]))
    for record in [*out.iterations, out.trajectory]:
        assert record["prompt_tokens"] > 0
        assert record["cached_tokens"] is None and record["prefilled_tokens"] is None
        assert record["probe_cached_tokens"] is None
        assert record["queue_s"] is None and record["engine_s"] is None
    conform(out.iterations, "iterations")
    conform([out.trajectory], "trajectories")


@pytest.mark.parametrize("overlap", [True, False], ids=["probe beside the next turns", "probe before them"])
def test_the_search_runs_while_the_probe_is_generated(overlap):
    probes_in_flight = 0

    class ProbeWaits(FakeEngine):
        async def generate(self, request):
            nonlocal probes_in_flight
            if not request.logprobs:
                return await super().generate(request)
            probes_in_flight += 1
            await asyncio.sleep(0.01)
            probes_in_flight -= 1
            return await super().generate(request)

    class NeedsProbeInFlight(FakeRetriever):
        async def search(self, queries, k):
            await asyncio.sleep(0.002)
            self.overlapped = getattr(self, "overlapped", []) + [probes_in_flight > 0]
            return await super().search(queries, k)

    retriever = NeedsProbeInFlight(n=5)
    agent = AgentConfig(max_turns=5, probe_overlap=overlap)
    out = asyncio.run(make_loop(ProbeWaits(scripted), retriever, agent=agent).run(QUESTIONS[3]))
    assert out.trajectory["n_iterations"] == 3
    assert retriever.overlapped == [True, True, True]  # each search ran while its turn's probe did


def test_a_search_the_controller_makes_moot_is_dropped_and_counted():
    retriever = SlowRetriever(n=5)
    controller = ScriptedController(at=1)
    out = asyncio.run(make_loop(PrefixCacheEngine(), retriever, controller).run(QUESTIONS[3]))
    rows, traj = out.iterations, out.trajectory
    assert traj["stop_reason"] == "controller" and traj["final_answer"] == "answer 1"
    assert [r["iteration"] for r in rows] == [0, 1]
    assert [q for call, _ in retriever.calls for q in call] == ["q3 hop 0", "q3 hop 1"]  # the second was issued
    assert traj["n_iterations"] == 1  # ... but never read
    assert [r["search_dropped"] for r in rows] == [False, True]
    assert rows[1]["retrieval_s"] is not None and traj["searches_dropped"] == 1
    assert traj["retrieval_s"] == pytest.approx(rows[0]["retrieval_s"] + rows[1]["retrieval_s"])
    assert "q3 hop 1-0" not in traj["transcript"]  # its documents never entered the context


def test_a_failed_search_the_controller_makes_moot_does_not_end_the_trajectory_as_an_error():
    retriever = FakeRetriever(n=5, fail_on=["q3 hop 1"])
    out = asyncio.run(make_loop(PrefixCacheEngine(), retriever, ScriptedController(at=1)).run(QUESTIONS[3]))
    assert out.trajectory["stop_reason"] == "controller" and out.trajectory["error"] is None
    failed = asyncio.run(make_loop(PrefixCacheEngine(), FakeRetriever(n=5, fail_on=["q3 hop 1"])).run(QUESTIONS[3]))
    assert failed.trajectory["stop_reason"] == "retrieval_error" and "q3 hop 1" in failed.trajectory["error"]
    assert [r["iteration"] for r in failed.iterations] == [0, 1]


def _without_times(outputs):
    def strip(record):
        return {k: v for k, v in record.items() if k not in TIMES}

    return [(strip(o.trajectory), [strip(r) for r in o.iterations]) for o in outputs]


@pytest.mark.parametrize(
    "agent",
    [AgentConfig(max_turns=5), AgentConfig(max_turns=3, at_limit="forced"), AgentConfig(max_turns=5, probe=False)],
    ids=["probe", "forced", "no-probe"],
)
def test_every_schedule_gives_the_same_trajectories(agent):
    """Concurrent with search beside probe, turn-synchronous, and one question at a time: same rows."""
    concurrent = asyncio.run(_run_all(make_loop(PrefixCacheEngine(), agent=agent), QUESTIONS))

    async def turn_synchronous():
        return await _run_all(
            make_loop(PrefixCacheEngine(), barrier=TurnBarrier(len(QUESTIONS)), agent=agent), QUESTIONS
        )

    async def one_at_a_time():
        loop = make_loop(PrefixCacheEngine(), agent=agent)
        return [await loop.run(q) for q in QUESTIONS]

    synchronous, sequential = asyncio.run(turn_synchronous()), asyncio.run(one_at_a_time())

    # the prefix cache sees other prompts first under other schedules: compare everything else
    def uncached(outputs):
        cache = {"cached_tokens", "prefilled_tokens", "probe_cached_tokens"}
        return [
            (
                {k: v for k, v in t.items() if k not in cache},
                [{k: v for k, v in r.items() if k not in cache} for r in its],
            )
            for t, its in _without_times(outputs)
        ]

    assert uncached(concurrent) == uncached(synchronous) == uncached(sequential)
    assert max(o.trajectory["n_iterations"] for o in concurrent) >= 2  # real multi-turn trajectories


def test_the_turn_barrier_runs_every_generation_then_every_search_then_every_probe():
    events: list[tuple[str, str]] = []

    class Logged(PrefixCacheEngine):
        async def generate(self, request):
            await asyncio.sleep(0)  # let the others submit too, as a real engine would
            events.append(("probe" if request.logprobs else "turn", request.prompt.count("<information>Doc")))
            return await super().generate(request)

    class LoggedRetriever(SlowRetriever):
        async def search(self, queries, k):
            events.append(("search", int(queries[0].split()[-1])))
            return await super().search(queries, k)

    barrier = TurnBarrier(len(QUESTIONS))
    outputs = asyncio.run(_run_all(make_loop(Logged(), LoggedRetriever(n=5), barrier=barrier), QUESTIONS))
    assert all(o.trajectory["stop_reason"] == "answer" for o in outputs)
    phases = [kind for kind, _ in events]
    collapsed = [k for i, k in enumerate(phases) if i == 0 or phases[i - 1] != k]
    # each turn: one block of generations, one block of searches (while some still search), one of probes
    assert collapsed == [
        "turn",
        "search",
        "probe",
        "turn",
        "search",
        "probe",
        "turn",
        "search",
        "probe",
        "turn",
        "probe",
    ]
    assert barrier.parties == 0 and barrier.phases == 3 * 4  # 4 turns of 3 phases (the longest trajectory's)


def test_turn_barrier_releases_waiters_when_a_party_leaves():
    async def scenario():
        barrier = TurnBarrier(3)
        order = []

        async def party(name, rounds):
            for r in range(rounds):
                await barrier.wait()
                order.append((name, r))
            barrier.leave()

        await asyncio.wait_for(asyncio.gather(party("a", 1), party("b", 3), party("c", 2)), timeout=1)
        return order, barrier

    order, barrier = asyncio.run(scenario())
    assert sorted(order) == [("a", 0), ("b", 0), ("b", 1), ("b", 2), ("c", 0), ("c", 1)]
    assert barrier.parties == 0
    with pytest.raises(ValueError, match="at least one party"):
        TurnBarrier(0)


def test_cost_columns_are_optional_for_hand_built_tables():
    row = {
        "qid": "a",
        "dataset": "d",
        "iteration": 0,
        "query": None,
        "doc_ids": None,
        "doc_scores": None,
        "reasoning": "r",
        "probe_answer": "x",
        "probe_token_logprobs": [-1.0],
        "probe_f1": 0.0,
        "utility": None,
        "tokens_generated": 3,
        "probe_tokens": 1,
    }
    table = conform([row], "iterations")
    assert all(table.column(c).null_count == 1 for c in COST_COLUMNS)
    with pytest.raises(ValueError, match="missing \\['probe_tokens'\\]"):
        conform([{k: v for k, v in row.items() if k != "probe_tokens"}], "iterations")
