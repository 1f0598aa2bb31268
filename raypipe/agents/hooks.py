"""The online stopping hook between the agent loop and any controller.

After each iteration's probe the agent loop calls ``decide`` with the history so far: one
:class:`~raypipe.core.rows.OnlineRow` per iteration (the iteration columns the agent knows online, never the
gold-based probe_f1/utility, and the titles and texts of the documents it read).
A controller that says stop names which iteration's probed answer the trajectory returns (the
4-state heuristic may roll back to an earlier one); the cost is counted up to the current iteration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from raypipe.core.rows import OnlineRow


@dataclass(frozen=True)
class StopDecision:
    stop: bool
    answer_iteration: int | None = None  # whose probed answer to return; None = the current one
    reason: str = ""


CONTINUE = StopDecision(stop=False)


class StopController(Protocol):
    async def decide(self, question: str, history: list[OnlineRow]) -> StopDecision: ...
