"""The controller's micro-batcher: trajectories waiting on a decision are predicted together, with the decisions
they would get one at a time."""

import asyncio
import threading

import pytest

from raypipe.stopping.batching import OneByOne, PredictionBatcher
from raypipe.stopping.heuristic import Thresholds
from raypipe.stopping.online import OnlineController


class GatedPredictor(OneByOne):
    """P̂ = the trajectory's number / 10 + iteration / 100; its first call waits for ``gate``, so the
    trajectories that arrive meanwhile queue; records each call's batch size."""

    def __init__(self):
        self.gate = threading.Event()
        self.batches: list[int] = []

    def predict(self, history_rows, question):
        last = history_rows[-1]
        return int(last["qid"][1:]) / 10 + last["iteration"] / 100, 0.05

    def predict_many(self, histories):
        if not self.batches:
            self.gate.wait(5)
        self.batches.append(len(histories))
        return super().predict_many(histories)


def rows(qid, n):
    return [{"qid": qid, "dataset": "toy", "iteration": i, "probe_answer": f"{qid}-{i}"} for i in range(n + 1)]


def test_decisions_that_arrive_during_a_call_run_together_in_the_next():
    predictor = GatedPredictor()
    batcher = PredictionBatcher(lambda: predictor)

    async def scenario():
        first = asyncio.ensure_future(batcher.predict(rows("q1", 1), "Q1"))
        await asyncio.sleep(0.05)  # the first call is running (held at the gate)
        rest = [asyncio.ensure_future(batcher.predict(rows(f"q{k}", 2), f"Q{k}")) for k in (2, 3, 4)]
        await asyncio.sleep(0.05)
        predictor.gate.set()
        return await first, await asyncio.gather(*rest)

    first, rest = asyncio.run(scenario())
    assert predictor.batches == [1, 3] and (batcher.calls, batcher.predicted) == (2, 4)
    assert first == pytest.approx((0.11, 0.05))
    assert rest == [pytest.approx((k / 10 + 0.02, 0.05)) for k in (2, 3, 4)]  # each its own, in order


def test_a_failed_call_fails_every_trajectory_of_its_batch_and_the_next_batch_runs():
    class Failing(OneByOne):
        def predict(self, history_rows, question):
            if question == "bad":
                raise RuntimeError("no prediction")
            return 0.5, 0.0

    batcher = PredictionBatcher(Failing)

    async def scenario():
        calls = [batcher.predict(rows("q1", 1), q) for q in ("bad", "good")]
        results = await asyncio.gather(*calls, return_exceptions=True)
        return results, await batcher.predict(rows("q2", 1), "good")

    results, later = asyncio.run(scenario())
    assert all(isinstance(r, RuntimeError) for r in results)
    assert later == (0.5, 0.0)


def test_concurrent_trajectories_get_the_decisions_they_get_one_at_a_time():
    """Eight trajectories deciding concurrently through one controller (batched) and one after another."""

    class Table(OneByOne):
        def predict(self, history_rows, question):
            k, i = int(history_rows[-1]["qid"][1:]), history_rows[-1]["iteration"]
            return (0.1 * k + 0.2 * i) % 1.0, (0.3 * k - 0.1 * i) % 0.4 - 0.2

    async def trajectory(controller, qid, depth=5):
        history = rows(qid, depth)
        for i in range(depth + 1):
            decision = await controller.decide("Q?", history[: i + 1])
            await asyncio.sleep(0)  # the agent's next turn: the others reach their decisions
            if decision.stop:
                return i, decision.answer_iteration
        return None

    qids = [f"q{k}" for k in range(8)]

    async def together():
        controller = OnlineController(None, Thresholds(0.5, 0.0), predictor_factory=Table)
        results = await asyncio.gather(*(trajectory(controller, q) for q in qids))
        return results, controller.source.batcher

    async def alone():
        controller = OnlineController(None, Thresholds(0.5, 0.0), predictor_factory=Table)
        return [await trajectory(controller, q) for q in qids]

    batched, batcher = asyncio.run(together())
    assert batched == asyncio.run(alone())
    assert any(r is not None for r in batched) and any(r is None for r in batched)  # both outcomes occur
    assert batcher.calls < batcher.predicted  # some decisions shared a call
