"""The probe job's crash ledger: how many engine or actor deaths each question was in flight for.

Ray Data reruns the batches of a generation actor that died, but keeps no account of which question
was running when it died, so a question that kills its engine every time would be retried without end.
The generation actors record here each trajectory's start and finish; a start without a finish is a
death the question was in flight for (the actor's process died, or the actor failed itself because its
engine died, recording the engine's error first). ``raypipe/stages/probe.py`` reads the counts when a
batch (re)starts and isolates or gives up on a question (``generation.max_question_crashes``).

One ledger per probe job: :class:`CrashLedger` in-process (tests, a stage without Ray), or one Ray actor
shared by every generation actor (:func:`start_crash_ledger`). Both have the same async methods.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CrashRecord:
    crashes: int  # deaths the question was in flight for
    error: str | None  # the last engine error recorded at one of them (None: the process died unannounced)


class CrashLedger:
    """Per question: trajectories started, finished, and the last engine error seen at a death."""

    def __init__(self) -> None:
        self._started: Counter[str] = Counter()
        self._finished: Counter[str] = Counter()
        self._errors: dict[str, str] = {}

    async def started(self, qid: str) -> None:
        self._started[qid] += 1

    async def finished(self, qid: str) -> None:
        self._finished[qid] += 1

    async def died(self, qids: list[str], error: str) -> None:
        """The engine of these in-flight questions died with ``error`` (their starts stay unfinished)."""
        for qid in qids:
            self._errors[qid] = error

    async def records(self, qids: list[str]) -> dict[str, CrashRecord]:
        """Deaths so far of the questions of a batch that is (re)starting; a batch reruns only after its
        actor died, so none of them is in flight elsewhere."""
        return {q: CrashRecord(self._started[q] - self._finished[q], self._errors.get(q)) for q in qids}


class RemoteCrashLedger:
    """The ledger actor behind :class:`CrashLedger`'s methods (picklable: it travels to the generation actors)."""

    def __init__(self, handle: Any):
        self.handle = handle

    async def started(self, qid: str) -> None:
        await self.handle.started.remote(qid)

    async def finished(self, qid: str) -> None:
        await self.handle.finished.remote(qid)

    async def died(self, qids: list[str], error: str) -> None:
        await self.handle.died.remote(qids, error)

    async def records(self, qids: list[str]) -> dict[str, CrashRecord]:
        return await self.handle.records.remote(qids)


def start_crash_ledger() -> RemoteCrashLedger:
    """The job's ledger actor: no CPU, restarted if its process dies (its counts then start again at 0)."""
    import ray

    actor = ray.remote(CrashLedger).options(num_cpus=0, max_restarts=-1, max_task_retries=-1)
    return RemoteCrashLedger(actor.remote())
