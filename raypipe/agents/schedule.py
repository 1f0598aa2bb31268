"""The agent loop's schedules: where a turn's requests wait for other trajectories' requests.

A schedule changes only the order of independent requests, never the outputs. :class:`Concurrent` is the
loop's own: no trajectory waits for another, and a turn's probe may run beside the trajectory's next turns
(``agent.probe_overlap``). The peers' lock-step schedule, a benchmark's baseline, is
:class:`~raypipe.agents.barrier.TurnBarrier`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol


class Schedule(Protocol):
    """Called by the agent loop at fixed points of every trajectory's turns."""

    # whether a turn's probe may run beside the trajectory's next turns (else it runs before them)
    probes_may_overlap: bool

    async def turn_generated(self) -> None:
        """A trajectory's turn has been generated (before its search and probe)."""

    async def search_and_probe(
        self, search: asyncio.Future[Any] | None, probe: Callable[[], Awaitable[object]] | None
    ) -> None:
        """Wait for the turn's search (already started; None if it issued none) and run its probe (None if not
        probing) before the trajectory goes on; the search is awaited even when the probe fails."""

    def leave(self) -> None:
        """A trajectory has ended."""


class Concurrent:
    """The loop's own schedule: a turn's search and probe run together, and no trajectory waits for another."""

    probes_may_overlap = True

    async def turn_generated(self) -> None:
        return None

    async def search_and_probe(
        self, search: asyncio.Future[Any] | None, probe: Callable[[], Awaitable[object]] | None
    ) -> None:
        try:
            if probe is not None:
                await probe()
        finally:
            if search is not None:
                await search

    def leave(self) -> None:
        return None
