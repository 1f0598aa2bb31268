"""The agent service's HTTP contract, without Ray: requests parsed and checked, answers, events and chat replies.

``raypipe serve-agent`` (:mod:`raypipe.runtime.serve_agent`) answers ``POST /v1/answer`` and the
OpenAI-compatible ``POST /v1/chat/completions`` with one trajectory of the agent loop per request. This
module says what a request may hold (:class:`AnswerRequest`, :class:`Policy`, :class:`ChatRequest`), refuses
what it may not with an :class:`ApiError` (an HTTP status and a one-line ``detail``), and builds what goes
back from the loop's :class:`~raypipe.agents.loop.TrajectoryOutput`: the answer, the stop reason, the
retrieval iterations, the cost (the trajectory row's cost columns, ``raypipe.core.schema.TRAJECTORY_COSTS``)
and, on request, the trajectory (queries, the ids of the documents the agent read, reasoning, probed answers
and the P̂/Û a predictor controller made; null where none did).

A question sent without ``golden_answers`` is not scored: its F1 columns are null in the answer and in the
request log, never a made-up 0. What goes back names no local path and carries no traceback: a trajectory's
``error`` is its first line with paths and URLs replaced (:func:`public_error`; the request log keeps it whole).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from raypipe.agents.loop import TrajectoryOutput
from raypipe.core.config import ServeAgentConfig
from raypipe.core.http import one_line
from raypipe.core.rows import IterationRow, TrajectoryRow
from raypipe.data.loaders import Question


class ApiError(Exception):
    """A request answered with HTTP ``status`` and a one-line ``detail`` instead of an answer."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.status, self.detail, self.headers = status, detail, headers or {}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Policy(_Strict):
    """How the request's trajectory may stop early (``"cap"`` alone is short for ``{"name": "cap"}``): the wire
    format, every setting's type. Which policies exist and which settings each takes: the registry,
    :mod:`raypipe.stopping.policies`, which checks a parsed request's policy."""

    name: str = "natural"
    theta_p: float | None = Field(default=None, allow_inf_nan=False)
    theta_u: float | None = Field(default=None, allow_inf_nan=False)
    preset: str | None = None
    variant: str | None = None
    k: int | None = Field(default=None, ge=0)


class AnswerRequest(_Strict):
    question: str
    policy: Policy = Field(default_factory=Policy)
    max_turns: int | None = Field(default=None, ge=1)
    return_trajectory: bool = False
    stream: bool = False
    golden_answers: list[str] | None = None  # scores the answer and the probes (F1), as in a probe run
    dataset: str = "serve"  # the dataset name the rows carry (the request log's dataset column); nothing else reads it

    @field_validator("policy", mode="before")
    @classmethod
    def _policy_by_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @property
    def scored(self) -> bool:
        return bool(self.golden_answers)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):  # OpenAI's content parts: the text parts joined
            return "".join(str(part.get("text", "")) for part in self.content if part.get("type") == "text")
        return self.content or ""


class ChatRequest(BaseModel):
    """An OpenAI chat request; fields raypipe does not use (temperature, max_tokens, ...) are ignored: the
    server's agent settings decide. ``policy`` and ``max_turns`` are raypipe's extras."""

    model_config = ConfigDict(extra="allow")

    messages: list[ChatMessage]
    model: str | None = None
    stream: bool = False
    policy: Policy = Field(default_factory=Policy)
    max_turns: int | None = Field(default=None, ge=1)

    @field_validator("policy", mode="before")
    @classmethod
    def _policy_by_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    def answer_request(self) -> AnswerRequest:
        """The last user message as the question, the trajectory returned (the reply's extra field)."""
        questions = [m.text() for m in self.messages if m.role == "user"]
        if not questions:
            raise ApiError(422, "messages holds no user message: the last one is the question")
        return AnswerRequest(
            question=questions[-1], policy=self.policy, max_turns=self.max_turns, return_trajectory=True
        )


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the body is not JSON: {one_line(str(exc))}") from None
    if not isinstance(data, dict):
        raise ApiError(422, "the body must be a JSON object")
    return data


def _validation_detail(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "body"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    if first["type"] == "extra_forbidden":
        return f"{where}: unknown field{more}"
    return f"{where}: {one_line(first['msg'])}{more}"


def parse_answer_request(body: bytes, limits: ServeAgentConfig) -> AnswerRequest:
    """``POST /v1/answer``'s body, checked (:class:`ApiError` with a one-line detail otherwise)."""
    try:
        request = AnswerRequest.model_validate(_json_object(body))
    except ValidationError as exc:
        raise ApiError(422, _validation_detail(exc)) from None
    check_request(request, limits)
    return request


def parse_chat_request(body: bytes, limits: ServeAgentConfig) -> tuple[ChatRequest, AnswerRequest]:
    """``POST /v1/chat/completions``'s body and the answer request it stands for."""
    try:
        chat = ChatRequest.model_validate(_json_object(body))
    except ValidationError as exc:
        raise ApiError(422, _validation_detail(exc)) from None
    request = chat.answer_request()
    check_request(request, limits)
    return chat, request


def check_request(request: AnswerRequest, limits: ServeAgentConfig) -> None:
    """What the models cannot say alone: a question to answer, within the server's limits (the policy's settings:
    :func:`raypipe.stopping.policies.check_policy`, which the service calls next)."""
    request.question = request.question.strip()
    if not request.question:
        raise ApiError(422, "question is empty")
    if len(request.question) > limits.max_question_chars:
        raise ApiError(
            422,
            f"question has {len(request.question)} characters, over this server's limit of "
            f"{limits.max_question_chars} (serve_agent.max_question_chars)",
        )
    if request.max_turns is not None and request.max_turns > limits.max_turns_limit:
        raise ApiError(
            422,
            f"max_turns {request.max_turns} is over this server's limit of {limits.max_turns_limit} "
            "(serve_agent.max_turns_limit)",
        )
    if request.golden_answers is not None and not any(g.strip() for g in request.golden_answers):
        raise ApiError(422, "golden_answers is empty: leave it out for an unscored question")


def request_question(request: AnswerRequest, qid: str) -> Question:
    """The loop's question: a unique ``qid`` per request (controllers keep per-trajectory state by qid)."""
    golds = list(request.golden_answers or [])  # none: the loop leaves every F1 column null
    return Question(qid=qid, dataset=request.dataset, question=request.question, golden_answers=golds)


Predictions = dict[int, tuple[float, float]]  # iteration -> (P̂, Û), as a predictor controller made them


@dataclass
class Answer:
    """One answered request: the loop's output (F1 columns null when unscored) and how it stopped."""

    request: AnswerRequest
    output: TrajectoryOutput
    policy: str  # the policy as run, e.g. heuristic(θ_P=0.3, θ_U=0.2, paper)
    predictions: Predictions
    visible: int  # documents the agent read per search
    iterations_left: int  # the turn limit's searching turns minus the iterations run, where the policy stopped it


LOCAL_NAME = re.compile(r"[a-z][a-z0-9+.-]*://\S+|(?<![\w.])(?:~|\.{1,2})?(?:/[^\s/'\"`:,;()<>\[\]]+){2,}/?", re.I)


def public_error(error: str | None) -> str | None:
    """A trajectory's error as a reply shows it: its first line, with every URL and file path (two parts or more)
    replaced by ``<hidden>``; the request log and the replica's log keep it whole."""
    if error is None:
        return None
    first = error.strip().splitlines()[0] if error.strip() else ""
    return one_line(LOCAL_NAME.sub("<hidden>", first))


def cost(trajectory: TrajectoryRow) -> dict[str, Any]:
    """The trajectory's cost: tokens (prompt, of which cached and prefilled; generated by the turns and probes)
    and seconds (retrieval, engine queue and engine, wall), searches a controller made moot."""
    turn, probe = trajectory["tokens_generated"] or 0, trajectory["probe_tokens"] or 0
    return {
        "prompt_tokens": trajectory["prompt_tokens"],
        "cached_tokens": trajectory["cached_tokens"],
        "prefilled_tokens": trajectory["prefilled_tokens"],
        "generated_tokens": turn + probe,
        "turn_tokens": turn,
        "probe_tokens": probe,
        "retrieval_s": trajectory["retrieval_s"],
        "queue_s": trajectory["queue_s"],
        "engine_s": trajectory["engine_s"],
        "wall_s": trajectory["wall_s"],
        "searches_dropped": trajectory["searches_dropped"],
    }


def iteration_view(row: IterationRow, visible: int, prediction: tuple[float, float] | None = None) -> dict[str, Any]:
    """One iteration as the API shows it (a streamed event, an entry of the trajectory)."""
    return {
        "iteration": row["iteration"],
        "query": row["query"],
        "doc_ids": None if row["doc_ids"] is None else list(row["doc_ids"][:visible]),
        "reasoning": row["reasoning"],
        "probe_answer": row["probe_answer"],
        "probe_f1": row["probe_f1"],
        "p_hat": None if prediction is None else prediction[0],
        "u_hat": None if prediction is None else prediction[1],
    }


def answer_body(answer: Answer) -> dict[str, Any]:
    """``POST /v1/answer``'s reply (the last event of a stream)."""
    trajectory = answer.output.trajectory
    body = {
        "qid": trajectory["qid"],
        "answer": trajectory["final_answer"],
        "stop_reason": trajectory["stop_reason"],
        "error": public_error(trajectory["error"]),
        "iterations": trajectory["n_iterations"],
        "iterations_left": answer.iterations_left,
        "policy": answer.policy,
        "f1": trajectory["final_f1"],
        "cost": cost(trajectory),
    }
    if answer.request.return_trajectory:
        body["trajectory"] = {
            "iterations": [
                iteration_view(r, answer.visible, answer.predictions.get(r["iteration"]))
                for r in answer.output.iterations
            ],
            "transcript": trajectory["transcript"],
        }
    return body


def chat_body(body: dict[str, Any], model: str, reply_id: str, created: int) -> dict[str, Any]:
    """The OpenAI ``chat.completion`` for an answer: the final answer as the message, raypipe's reply (the
    trajectory included) under ``raypipe``."""
    spent = body["cost"]
    return {
        "id": reply_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": body["answer"] or ""}, "finish_reason": "stop"}
        ],
        "usage": {
            "prompt_tokens": spent["prompt_tokens"],
            "completion_tokens": spent["generated_tokens"],
            "total_tokens": spent["prompt_tokens"] + spent["generated_tokens"],
        },
        "raypipe": body,
    }


def chat_chunks(reply: dict[str, Any]) -> list[dict[str, Any]]:
    """A ``chat.completion`` as OpenAI's stream sends it: the role, the content, the finish (with raypipe's extra)."""
    base = {k: reply[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    content = reply["choices"][0]["message"]["content"]
    deltas = [({"role": "assistant"}, None), ({"content": content}, None), ({}, "stop")]
    chunks = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": f}]} for d, f in deltas]
    chunks[-1]["raypipe"] = reply["raypipe"]
    return chunks


def sse(data: dict[str, Any] | str, event: str | None = None) -> str:
    """One server-sent event (``data`` as JSON unless it is a string already)."""
    text = data if isinstance(data, str) else json.dumps(data)
    return (f"event: {event}\n" if event else "") + f"data: {text}\n\n"
