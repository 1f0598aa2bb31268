"""The online stopping hook between the agent loop and any controller.

After each iteration's probe the agent loop calls ``decide`` with the history so far (iteration rows
as dicts with the ITERATIONS columns the agent knows online: qid, dataset, iteration, query, doc_ids,
doc_scores, reasoning, probe_answer, probe_token_logprobs, tokens_generated, probe_tokens — never the
gold-based probe_f1/utility) plus the visible documents' texts under ``doc_titles``/``doc_texts``.
A controller that says stop names which iteration's probed answer the trajectory returns (the
4-state heuristic may roll back to an earlier one); the cost is counted up to the current iteration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class StopDecision:
    stop: bool
    answer_iteration: int | None = None  # whose probed answer to return; None = the current one
    reason: str = ""


CONTINUE = StopDecision(stop=False)


class StopController(Protocol):
    async def decide(self, question: str, history: list[dict[str, Any]]) -> StopDecision: ...
