"""A turn barrier: the peers' turn-synchronous schedule for the agent loop (a benchmark's baseline, not the default).

pyterrier-rag's agents (``frameworks/agentic/_base.py``) and Search-R1's ``generation.py`` advance all
live trajectories in lock-step: every trajectory generates its turn as one batch, then all searches run
as one batch, then the next turn starts. Given to :class:`~raypipe.agents.loop.AgentLoop`, this barrier
holds each trajectory at the end of every phase of a turn (generation, search, probe) until all live
trajectories have reached it; a trajectory that ends leaves, so the others need not wait for it. It is a
:class:`~raypipe.agents.schedule.Schedule` beside the loop's own :class:`~raypipe.agents.schedule.Concurrent`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


class TurnBarrier:
    """An asyncio barrier over ``parties`` trajectories whose number shrinks as they end.

    Every party calls :meth:`wait` at the same points of its turns (the loop does, three times a turn)
    and :meth:`leave` once when it ends. Use one barrier per batch of trajectories started together.
    """

    probes_may_overlap = False  # a turn's probes are a phase of that turn

    def __init__(self, parties: int):
        if parties < 1:
            raise ValueError(f"a barrier needs at least one party, got {parties}")
        self.parties = parties
        self.phases = 0  # phases completed (for tests and stats)
        self._arrived = 0
        self._open = asyncio.Event()

    async def wait(self) -> None:
        """Return once every live party has reached this point."""
        if self.parties < 1:
            raise RuntimeError("every party has left the barrier")
        released = self._open
        self._arrived += 1
        if self._arrived >= self.parties:
            self._release()
        else:
            await released.wait()

    async def turn_generated(self) -> None:
        """Every live trajectory's turn is generated before any searches."""
        await self.wait()

    async def search_and_probe(
        self, search: asyncio.Future[Any] | None, probe: Callable[[], Awaitable[object]] | None
    ) -> None:
        """Every live trajectory's search ends before any probes, and every probe before the next turn."""
        try:
            if search is not None:
                await search
            await self.wait()
            if probe is not None:
                await probe()
            await self.wait()
        finally:
            if search is not None:
                await search

    def leave(self) -> None:
        """A party ends: the others no longer wait for it."""
        if self.parties < 1:
            raise RuntimeError("more parties left the barrier than it had")
        self.parties -= 1
        if self._arrived and self._arrived >= self.parties:
            self._release()

    def _release(self) -> None:
        released, self._open = self._open, asyncio.Event()
        self._arrived = 0
        self.phases += 1
        released.set()
