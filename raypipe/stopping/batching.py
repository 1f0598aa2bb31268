"""One prediction for every trajectory waiting on a decision: the online controller's micro-batcher.

Trajectories reach their decisions at different moments; each ``await batcher.predict(rows, question)`` is
queued, and a drain task hands everything queued to the predictor's ``predict_many`` in one call on one worker
thread (the predictor is not meant for concurrent use; the event loop keeps serving the other trajectories).
Decisions that arrive while a call runs form the next batch. There is no waiting window: a lone trajectory
is predicted at once, so batching costs nothing when nothing else is waiting. The predictor is built by
``factory`` on the worker thread at first use (a bundle loads its models there).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from raypipe.predict.bundle import History


class Predictor(Protocol):
    def predict_many(self, histories: Sequence[History]) -> list[tuple[float, float]]:
        """(P̂, Û) of each trajectory's last iteration."""
        ...


class OneByOne:
    """Base of a predictor that predicts one trajectory at a time: ``predict_many`` calls ``predict`` on each."""

    def predict(self, history_rows: Sequence[Mapping[str, Any]], question: str) -> tuple[float, float]:
        raise NotImplementedError

    def predict_many(self, histories: Sequence[History]) -> list[tuple[float, float]]:
        return [self.predict(rows, question) for rows, question in histories]


@dataclass
class _Waiting:
    history: History
    future: asyncio.Future = field(repr=False)


class PredictionBatcher:
    """Coalesces concurrent ``predict`` calls into ``predict_many`` calls of the predictor (module docstring);
    ``max_batch``: the most trajectories in one call."""

    def __init__(self, factory: Callable[[], Predictor], max_batch: int = 64):
        self.factory, self.max_batch = factory, max_batch
        self._predictor: Predictor | None = None
        self._waiting: list[_Waiting] = []
        self._drainer: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stop-controller")
        self.calls = 0  # predict_many calls made (for tests and stats)
        self.predicted = 0  # trajectories predicted

    async def predict(self, history_rows: Sequence[Mapping[str, Any]], question: str) -> tuple[float, float]:
        waiting = _Waiting((history_rows, question), asyncio.get_running_loop().create_future())
        self._waiting.append(waiting)
        if self._drainer is None:
            self._drainer = asyncio.create_task(self._drain())
        return await waiting.future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._waiting:
                batch, self._waiting = self._waiting[: self.max_batch], self._waiting[self.max_batch :]
                try:
                    results = await loop.run_in_executor(self._executor, self._predict_many, [w.history for w in batch])
                except Exception as exc:  # noqa: BLE001 - handed to every trajectory of the batch
                    for w in batch:
                        if not w.future.done():
                            w.future.set_exception(exc)
                    continue
                for w, result in zip(batch, results):
                    if not w.future.done():
                        w.future.set_result(result)
        finally:
            self._drainer = None

    def _predict_many(self, histories: list[History]) -> list[tuple[float, float]]:
        if self._predictor is None:
            self._predictor = self.factory()
        results = self._predictor.predict_many(histories)
        self.calls += 1
        self.predicted += len(histories)
        return [(float(p), float(u)) for p, u in results]
