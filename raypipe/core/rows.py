"""Typed rows of the agent loop's tables: one iteration row, one trajectory row, and what an online
controller sees of an iteration.

They are ``TypedDict`` s: a row stays the plain dict that Arrow writes (keys in the schema's order), and a
type checker reads its fields. Their fields, order and types are those of :data:`raypipe.core.schema.ITERATIONS`
and :data:`raypipe.core.schema.TRAJECTORIES` (``tests/test_rows.py`` compares them); a hint without ``None``
on a nullable column says that its writers never leave it null.
"""

from __future__ import annotations

from typing import TypedDict


class IterationCosts(TypedDict):
    """The cost columns of an iteration (:data:`raypipe.core.schema.ITERATION_COSTS`); null where a request
    of the iteration did not report it, ``decision_s`` without a controller, ``retrieval_s`` without a search."""

    prompt_tokens: int
    cached_tokens: int | None
    prefilled_tokens: int | None
    probe_prompt_tokens: int
    probe_cached_tokens: int | None
    retrieval_s: float | None
    search_dropped: bool
    queue_s: float | None
    engine_s: float | None
    decision_s: float | None


class _IterationFields(TypedDict):
    qid: str
    dataset: str
    iteration: int
    query: str | None
    doc_ids: list[str] | None
    doc_scores: list[float] | None
    reasoning: str
    probe_answer: str | None
    probe_token_logprobs: list[float] | None
    probe_f1: float | None
    utility: float | None
    tokens_generated: int
    probe_tokens: int


class IterationRow(_IterationFields, IterationCosts):
    """One row of ``iterations/`` (:data:`raypipe.core.schema.ITERATIONS`)."""


class OnlineRow(TypedDict):
    """What an online controller sees of one iteration: its columns the agent knows online (never the
    gold-based ``probe_f1`` / ``utility``) and the titles and texts of the documents the agent read."""

    qid: str
    dataset: str
    iteration: int
    query: str | None
    doc_ids: list[str] | None
    doc_scores: list[float] | None
    reasoning: str
    probe_answer: str | None
    probe_token_logprobs: list[float] | None
    tokens_generated: int
    probe_tokens: int
    doc_titles: list[str]
    doc_texts: list[str]


class TrajectoryCosts(TypedDict):
    """The cost columns of a trajectory (:data:`raypipe.core.schema.TRAJECTORY_COSTS`): its iterations' summed;
    null in the row of a question that crashed its engine."""

    prompt_tokens: int | None
    cached_tokens: int | None
    prefilled_tokens: int | None
    probe_prompt_tokens: int | None
    probe_cached_tokens: int | None
    retrieval_s: float | None
    queue_s: float | None
    engine_s: float | None
    searches_dropped: int | None


class _TrajectoryFields(TypedDict):
    qid: str
    dataset: str
    question: str
    golden_answers: list[str]
    final_answer: str | None
    final_f1: float | None
    n_iterations: int
    stop_reason: str
    error: str | None
    tokens_generated: int
    probe_tokens: int
    wall_s: float | None
    transcript: str


class TrajectoryRow(_TrajectoryFields, TrajectoryCosts):
    """One row of ``trajectories/`` (:data:`raypipe.core.schema.TRAJECTORIES`)."""
