"""The ``agent`` section, and the protocols' defaults a config is built with."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, model_validator

from raypipe.core.config.base import StrictModel

# Enforcement bounds vs max_new_tokens: the protocols' tags around a think and an action, and English BPE's
# usual characters per token.
ENFORCED_TAG_CHARS = 64
CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class ProtocolDefaults:
    """What an agent protocol does unless the config says otherwise."""

    top_k: int  # documents read per search
    max_turns: dict[str, int]  # the turn limit of each implementation an observation format follows


# The one table of the protocols' defaults; a config is built with them filled in (agent.max_turns, retrieval.top_k).
PROTOCOL_DEFAULTS = {
    # Search-R1's evaluation (scripts/nq_hotpotqa/evaluate.sh max_turns=4, retrieval_server.py --topk 3);
    # pyterrier-rag 0.3.0's max_turn=10
    "search_r1": ProtocolDefaults(top_k=3, max_turns={"original": 4, "pyterrier": 10}),
    # R1-Searcher's eval (top 5; the k == 9 cut: 10 rounds); pyterrier-rag 0.3.0's max_turn=10
    "r1_searcher": ProtocolDefaults(top_k=5, max_turns={"original": 10, "pyterrier": 10}),
}


def fill_missing(section: Any, key: str, value: int | None) -> Any:
    """A section's input with ``key`` set to ``value`` where it is None or absent (a built section has it)."""
    if isinstance(section, dict) and section.get(key) is None and value is not None:
        return {**section, key: value}
    return section


class AgentConfig(StrictModel):
    protocol: Literal["search_r1", "r1_searcher"] = "search_r1"
    prompt_version: Literal["v0", "v1", "v2", "v3"] = Field(default="v1", description="R1-Searcher prompt version.")
    observation_format: Literal["original", "pyterrier"] = Field(
        default="pyterrier",
        description="'original': the agent's own reference code; 'pyterrier': pyterrier-rag (the seed paper's setup).",
    )
    max_turns: int = Field(
        ge=1,
        description="Agent turns; None or absent: the protocol's default for the observation format "
        "(PROTOCOL_DEFAULTS, filled in when the config is built).",
    )
    max_new_tokens: int = Field(default=1024, ge=1)
    temperature: float = Field(default=0.0, ge=0)
    enforcement: Literal["none", "first_search", "free"] = Field(
        default="none",
        description="Structured-output regex over the protocol's tags: 'free' = think then search or answer; "
        "'first_search' = the first turn must search, later turns free. The prompt text never changes.",
    )
    enforce_think_chars: int = Field(default=398, ge=1, description="Enforcement regex bound on the reasoning.")
    enforce_query_chars: int = Field(default=98, ge=1, description="Enforcement regex bound on a query.")
    enforce_answer_chars: int = Field(default=58, ge=1, description="Enforcement regex bound on an answer.")
    probe: bool = Field(default=True, description="Force an answer after every turn (the seed paper's probing).")
    probe_max_tokens: int = Field(default=64, ge=1)
    probe_overlap: bool = Field(
        default=True,
        description="A turn's probe runs beside the trajectory's next turns (off its critical path) instead of "
        "before them; the same requests and outputs. Not with an online controller (it reads the probe before "
        "the next turn) nor under a turn barrier (the peers' schedule).",
    )
    at_limit: Literal["none", "forced"] = Field(
        default="none",
        description="When the turn limit ends a trajectory after a search: none = no final answer (F1 0) and "
        "no generation after that search, as pyterrier-rag and the seed paper; forced = one forced answer reads "
        "the last documents (its probe row and the final answer).",
    )
    metric: Literal["squad", "hotpotqa", "r1searcher"] = Field(default="hotpotqa", description="F1 rule for P_i.")

    @model_validator(mode="before")
    @classmethod
    def _resolve_max_turns(cls, data: Any) -> Any:
        """A max_turns of None (or none given) becomes the protocol's default for the observation format."""
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        defaults = PROTOCOL_DEFAULTS.get(data.get("protocol", fields["protocol"].default))
        fmt = data.get("observation_format", fields["observation_format"].default)
        return fill_missing(data, "max_turns", defaults.max_turns.get(fmt) if defaults else None)

    @model_validator(mode="after")
    def _check_enforced_turn_fits(self) -> AgentConfig:
        """The longest turn the grammar allows must fit in max_new_tokens: a turn cut inside its tags is no valid
        action."""
        if self.enforcement == "none":
            return self
        longest = (
            self.enforce_think_chars + max(self.enforce_query_chars, self.enforce_answer_chars) + ENFORCED_TAG_CHARS
        )
        needed = math.ceil(longest / CHARS_PER_TOKEN)
        if self.max_new_tokens < needed:
            raise ValueError(
                f"max_new_tokens={self.max_new_tokens} cannot hold the longest turn "
                f"agent.enforcement={self.enforcement} allows (about {longest} characters, {needed} tokens at "
                f"{CHARS_PER_TOKEN} characters per token): raise max_new_tokens or lower enforce_think_chars / "
                "enforce_query_chars / enforce_answer_chars"
            )
        return self
