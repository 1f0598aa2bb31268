"""The ``serve_agent`` section: the agent loop as a Ray Serve application."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from raypipe.core.config.base import StrictModel


class ServeAgentConfig(StrictModel):
    """``raypipe serve-agent``: the agent loop as a Ray Serve application (docs/serve-agent.md)."""

    deployment: str = Field(default="raypipe-agent", description="Ray Serve application name.")
    route_prefix: str = Field(
        default="/", description="Where the routes start on Serve's proxy ('/agent' beside serve-retrieval's '/')."
    )
    replicas: int = Field(default=1, ge=1, description="Replicas, each with its own engine (ignored with autoscaling).")
    num_cpus: float = Field(
        default=0.5, ge=0, description="Per replica (its engine's work is in vLLM's own processes)."
    )
    num_gpus: float = Field(
        default=0.0, ge=0, description="Per replica: 1 places each replica and its engine on a GPU."
    )
    resources: dict[str, float] = Field(default_factory=dict, description="Custom Ray resources per replica.")
    autoscaling: dict[str, Any] | None = Field(
        default=None,
        description="Ray Serve's autoscaling_config, passed through (e.g. {min_replicas: 1, max_replicas: 4, "
        "target_ongoing_requests: 8}); None: a fixed number of replicas.",
    )
    max_in_flight: int = Field(
        default=16, ge=1, description="Questions one replica answers at once (its engine batches them); more: HTTP 429."
    )
    max_queued: int = Field(
        default=32,
        ge=-1,
        description="Requests Serve holds at each caller (its HTTP proxy) before a replica takes them; more: HTTP 503 "
        "(-1: no bound).",
    )
    timeout_s: float = Field(
        default=600.0, gt=0, description="Deadline of one question, arrival to answer (more: 408)."
    )
    max_body_bytes: int = Field(default=64 * 1024, ge=1024, description="Largest request body (more: HTTP 413).")
    max_question_chars: int = Field(default=4000, ge=1, description="Longest question (more: HTTP 422).")
    max_turns_limit: int = Field(default=10, ge=1, description="Largest max_turns a request may ask (more: HTTP 422).")
    model_name: str = Field(default="raypipe-agent", description="The model name /v1/chat/completions answers with.")
    start_timeout_s: float = Field(
        default=1800.0,
        gt=0,
        description="How long the command waits for its replicas to be placed and warm up their "
        "engines; past it, it deletes the application and stops with an error naming what each replica asks.",
    )
