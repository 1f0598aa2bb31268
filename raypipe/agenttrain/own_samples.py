"""A second round's trajectories: the tuned agent's own successful trajectories on training questions
(rejection sampling), taken from a probe run and replayed through the agent loop.

A run's trajectory is kept when it ended with its own answer and its final F1 is at least ``min_f1``. Its turns
are not parsed out of the transcript by hand: a :class:`ReplayEngine` answers each of the loop's turns with what
the recorded run wrote after the context the loop sends, the loop searches with the real retriever, and the
trajectory is kept only if the replayed transcript equals the recorded one (so every observation is what the
retriever returns, and the segments are cut exactly as :func:`~raypipe.agenttrain.trajectories.render` cuts a
planned trajectory's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from raypipe.agents.factory import build_loop
from raypipe.agenttrain.trajectories import (
    FormatError,
    ScriptedEngine,
    check_enforcement,
    loop_setup,
    segments_of,
)
from raypipe.core.config import RunConfig
from raypipe.core.schema import STOP_ANSWER
from raypipe.data.loaders import Question
from raypipe.llm.base import Generation, GenerationRequest
from raypipe.retrieval.types import Retriever

REJECT_NOT_ANSWERED = "not_answered"  # the run's agent did not end with its own answer
REJECT_LOW_F1 = "low_f1"  # its final answer's F1 is under min_f1
REJECT_REPLAY = "replay"  # the loop, replayed, did not write the recorded transcript (other settings or documents)
RUN_COLUMNS = ["qid", "final_answer", "final_f1", "stop_reason", "transcript", "n_iterations"]


class ReplayError(RuntimeError):
    """The replayed loop left the recorded transcript."""


class ReplayEngine(ScriptedEngine):
    """Answers each turn with the recorded agent's output at that point: the recorded text after the context it
    is sent and the protocol's joiner, up to its first stop string (the recorded text: the loop's first prompt
    followed by ``transcript``)."""

    def __init__(self, tokenizer, transcript: str, joiner: str, stop: Sequence[str], max_model_len: int):
        super().__init__(tokenizer, [], stop, max_model_len)
        self.transcript, self.joiner = transcript, joiner
        self.recorded: str | None = None

    async def generate(self, request: GenerationRequest) -> Generation:
        if self.recorded is None:
            self.recorded = request.prompt + self.transcript
        head = request.prompt + self.joiner
        if not self.recorded.startswith(head):
            raise ReplayError("the loop's context is not the recorded one")
        rest = self.recorded[len(head) :]
        ends = [rest.index(s) + len(s) for s in self.stop if s in rest]
        if not ends:
            raise ReplayError("a recorded turn without a stop string")
        self.outputs.append(rest[: min(ends)])
        return await super().generate(request)


def selected(run_rows: Sequence[dict[str, Any]], min_f1: float) -> tuple[list[dict], list[tuple[dict, str]]]:
    """(the run's trajectories kept for replay, (row, reason) of the others)."""
    kept, rejected = [], []
    for row in run_rows:
        if row["stop_reason"] != STOP_ANSWER:
            rejected.append((row, REJECT_NOT_ANSWERED))
        elif (row["final_f1"] or 0.0) < min_f1:
            rejected.append((row, REJECT_LOW_F1))
        else:
            kept.append(row)
    return kept, rejected


async def replay(question: Question, run_row: dict[str, Any], config: RunConfig, retriever: Retriever, tokenizer):
    """The run's trajectory of ``question`` rendered again through the agent loop: a trajectories.jsonl row."""
    loop_config, protocol = loop_setup(config)
    engine = ReplayEngine(tokenizer, run_row["transcript"], protocol.joiner, protocol.stop, config.engine.max_model_len)
    out = await build_loop(loop_config, engine, retriever, protocol).run(question)
    traj = out.trajectory
    if traj["transcript"] != run_row["transcript"] or traj["final_answer"] != run_row["final_answer"]:
        raise ReplayError(f"{question.qid}: the replayed transcript differs from the run's")
    check_enforcement(protocol, loop_config, engine.outputs)
    searched = [row for row in out.iterations[1:] if row["query"] is not None]
    top_k = loop_config.retrieval.top_k  # what the agent read of each search's deep list
    return {
        "qid": question.qid,
        "dataset": question.dataset,
        "type": question.extra.get("type"),
        "question": question.question,
        "answer": traj["final_answer"],
        "final_f1": run_row["final_f1"],
        "searches": len(searched),
        "queries": [row["query"] for row in searched],
        "doc_ids": [list(row["doc_ids"][:top_k]) for row in searched],
        "segments": segments_of(question.qid, engine.prompts, engine.outputs, traj["transcript"], protocol),
    }


async def own_trajectories(
    questions: dict[str, Question],
    run_rows: Sequence[dict[str, Any]],
    config: RunConfig,
    retriever: Retriever,
    tokenizer,
    min_f1: float,
    progress=None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(kept rows, rejected rows: qid, dataset, reason) of a run's trajectories, in the run's order."""
    keep, dropped = selected(run_rows, min_f1)
    rejected = [{"qid": r["qid"], "dataset": questions[r["qid"]].dataset, "reason": why} for r, why in dropped]
    kept = []
    for i, row in enumerate(keep):
        question = questions[row["qid"]]
        try:
            kept.append(await replay(question, row, config, retriever, tokenizer))
        except (ReplayError, FormatError):
            rejected.append({"qid": question.qid, "dataset": question.dataset, "reason": REJECT_REPLAY})
        if progress is not None:
            progress(i + 1, len(keep))
    return kept, rejected
