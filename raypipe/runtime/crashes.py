"""The probe job's crash ledger: how many engine or actor deaths each question was in flight for.

Ray Data reruns the batches of a generation actor that died, but keeps no account of which question
was running when it died, so a question that kills its engine every time would be retried without end.
The generation actors record here each trajectory's start and finish; a start without a finish is a
death the question was in flight for (the actor's process died, or the actor failed itself because its
engine died, recording the engine's error first). ``raypipe/runtime/generation.py`` reads the counts when a
batch (re)starts and isolates or gives up on a question (``generation.max_question_crashes``).

Hearing every start and finish, and each engine's start (``engine_starting`` / ``engine_ready``), the
ledger is also where the driver reads the job's progress (:meth:`CrashLedger.status`): the driver's
generation line (``raypipe/runtime/generation_progress.py``) comes from it while the work goes on, not
per finished part.

One ledger per probe job: :class:`CrashLedger` in-process (tests, a stage without Ray), or one Ray actor
shared by every generation actor (:func:`start_crash_ledger`). Both have the same async methods.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CrashRecord:
    crashes: int  # deaths the question was in flight for
    error: str | None  # the last engine error recorded at one of them (None: the process died unannounced)


@dataclass(frozen=True)
class GenerationStatus:
    """The job's generation as the ledger has heard it (durations in seconds, on the ledger's clock)."""

    started: int  # questions started at least once
    finished: int  # questions finished at least once
    in_flight: int
    turns_in_flight: int  # agent turns the trajectories in flight have completed
    running_s: float  # since the first trajectory started (0 before)
    engines_starting: int
    starting_s: float  # how long the longest-starting engine has been starting (0: none is)
    engines_ready: int
    last_start_s: float | None  # how long the engine that became ready last took to start
    deaths: int  # engine deaths the actors reported
    last_error: str | None  # the engine error of the last one


class CrashLedger:
    """Per question: trajectories started, finished, and the last engine error seen at a death; per
    generation actor, whether its engine is starting or ready."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._started: Counter[str] = Counter()
        self._finished: Counter[str] = Counter()
        self._errors: dict[str, str] = {}
        self._in_flight: set[str] = set()
        self._turns: Counter[str] = Counter()  # per question in flight: its turns completed
        self._first_start: float | None = None
        self._engines: dict[str, tuple[float, float | None]] = {}  # actor -> (start began, start seconds once ready)
        self._deaths = 0
        self._last_error: str | None = None

    async def started(self, qid: str) -> None:
        self._started[qid] += 1
        self._in_flight.add(qid)
        self._turns[qid] = 0
        if self._first_start is None:
            self._first_start = self._clock()

    async def finished(self, qid: str) -> None:
        self._finished[qid] += 1
        self._in_flight.discard(qid)
        self._turns.pop(qid, None)

    def turn_done(self, qid: str) -> None:
        """The trajectory of ``qid`` completed a turn (its iteration row): progress, not a crash record."""
        if qid in self._in_flight:
            self._turns[qid] += 1

    async def died(self, qids: list[str], error: str) -> None:
        """The engine of these in-flight questions died with ``error`` (their starts stay unfinished)."""
        for qid in qids:
            self._errors[qid] = error
        self._in_flight.difference_update(qids)
        self._deaths += 1
        self._last_error = error

    async def records(self, qids: list[str]) -> dict[str, CrashRecord]:
        """Deaths so far of the questions of a batch that is (re)starting; a batch reruns only after its
        actor died, so none of them is in flight elsewhere."""
        self._in_flight.difference_update(qids)  # a process that died unannounced left them here
        return {q: CrashRecord(self._started[q] - self._finished[q], self._errors.get(q)) for q in qids}

    async def engine_starting(self, actor: str) -> None:
        """The generation actor ``actor`` (a restarted actor keeps its name) is starting its engine."""
        self._engines[actor] = (self._clock(), None)

    async def engine_ready(self, actor: str, start_s: float) -> None:
        began, _ = self._engines.get(actor, (self._clock(), None))
        self._engines[actor] = (began, start_s)

    async def status(self) -> GenerationStatus:
        now = self._clock()
        starting = [began for began, ready in self._engines.values() if ready is None]
        ready = [(began + start_s, start_s) for began, start_s in self._engines.values() if start_s is not None]
        return GenerationStatus(
            started=len(self._started),
            finished=len(self._finished),
            in_flight=len(self._in_flight),
            turns_in_flight=sum(self._turns[qid] for qid in self._in_flight),
            running_s=0.0 if self._first_start is None else now - self._first_start,
            engines_starting=len(starting),
            starting_s=now - min(starting) if starting else 0.0,
            engines_ready=len(ready),
            last_start_s=max(ready)[1] if ready else None,
            deaths=self._deaths,
            last_error=self._last_error,
        )


class RemoteCrashLedger:
    """The ledger actor behind :class:`CrashLedger`'s methods (picklable: it travels to the generation actors)."""

    def __init__(self, handle: Any):
        self.handle = handle

    async def started(self, qid: str) -> None:
        await self.handle.started.remote(qid)

    async def finished(self, qid: str) -> None:
        await self.handle.finished.remote(qid)

    def turn_done(self, qid: str) -> None:
        self.handle.turn_done.remote(qid)  # not awaited: a progress count must not slow the trajectory

    async def died(self, qids: list[str], error: str) -> None:
        await self.handle.died.remote(qids, error)

    async def records(self, qids: list[str]) -> dict[str, CrashRecord]:
        return await self.handle.records.remote(qids)

    async def engine_starting(self, actor: str) -> None:
        await self.handle.engine_starting.remote(actor)

    async def engine_ready(self, actor: str, start_s: float) -> None:
        await self.handle.engine_ready.remote(actor, start_s)

    async def status(self) -> GenerationStatus:
        return await self.handle.status.remote()

    def read_status(self, timeout_s: float = 10.0) -> GenerationStatus:
        """:meth:`status` for the driver's progress thread, which has no event loop (blocking)."""
        import ray

        return ray.get(self.handle.status.remote(), timeout=timeout_s)


def start_crash_ledger() -> RemoteCrashLedger:
    """The job's ledger actor: no CPU, restarted if its process dies (its counts then start again at 0)."""
    import ray

    actor = ray.remote(CrashLedger).options(num_cpus=0, max_restarts=-1, max_task_retries=-1)
    return RemoteCrashLedger(actor.remote())
