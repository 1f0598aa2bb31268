"""Cap@k online: the agent loop's :class:`~raypipe.agents.hooks.StopController` for a fixed retrieval budget.

The online twin of :func:`raypipe.stopping.caps.cap`: after retrieval iteration ``k`` (the row that holds
the k-th search's documents and its probe) the trajectory stops with that iteration's probed answer; a
trajectory that ends by itself earlier keeps its natural answer. Online the controller decides before the
turn's own action is read, so a trajectory whose turn ``k`` answers gets probe ``k`` (the offline cap keeps
that natural answer). Its saving is certain whatever the predictors are worth: no turn after ``k`` runs.
"""

from __future__ import annotations

from raypipe.agents.hooks import CONTINUE, StopDecision
from raypipe.core.rows import OnlineRow


class CapController:
    """Stop after retrieval iteration ``k`` (``k = 0``: before any search) with that iteration's probe."""

    def __init__(self, k: int):
        if k < 0:
            raise ValueError(f"cap must be >= 0, got {k}")
        self.k = k

    async def decide(self, question: str, history: list[OnlineRow]) -> StopDecision:
        if history and int(history[-1]["iteration"]) >= self.k:
            return StopDecision(stop=True, reason=f"cap{self.k}")
        return CONTINUE
