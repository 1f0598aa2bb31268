"""What every agent protocol provides to the loop: prompt, actions, observations, probe prompts.

A protocol is plain text manipulation (no engine, no retrieval), so each one is tested with golden
strings. Two observation formats reproduce the two public implementations of each agent:

- ``original``: the agent's own reference code (Search-R1 ``search_r1/llm_agent/generation.py``,
  R1-Searcher ``evaluation/eval_search_loacl.py``). Model outputs are appended as they are
  (R1-Searcher strips them), actions and queries are parsed as that code parses them, its number of
  usable generations holds (:meth:`AgentProtocol.turn_plan`), and Search-R1 answers an invalid action
  with a correction message and goes on; R1-Searcher stops.
- ``pyterrier``: pyterrier-rag's agentic framework (the seed paper's setup): ``"\\n\\n"`` is inserted
  before every model output, an open tag is enough for an action, an invalid action stops the agent,
  and so does a search that returns no documents ("No retrieval results", ``frameworks/agentic/_base.py``).

The context the loop keeps is exactly the text the model is fed next, so every turn (and every probe)
extends the previous prompt and the engine's prefix cache serves it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from raypipe.core.config import AgentConfig
from raypipe.retrieval.types import SearchHit

ObservationFormat = Literal["original", "pyterrier"]
OBSERVATION_FORMATS: tuple[ObservationFormat, ...] = ("original", "pyterrier")

SEARCH, ANSWER, INVALID = "search", "answer", "invalid"


@dataclass(frozen=True)
class Action:
    kind: str  # SEARCH, ANSWER or INVALID
    content: str = ""  # the query or the answer


class AgentProtocol(ABC):
    """One agent's text protocol. Subclasses set the tags and implement the protocol-specific parts."""

    name: str
    search_open: str
    search_close: str
    answer_open: str = "<answer>"
    answer_close: str = "</answer>"

    def __init__(self, observation_format: ObservationFormat = "pyterrier"):
        if observation_format not in OBSERVATION_FORMATS:
            raise ValueError(f"unknown observation format {observation_format!r}; choose one of {OBSERVATION_FORMATS}")
        self.observation_format = observation_format

    def turn_plan(self, agent: AgentConfig) -> tuple[int, int]:
        """(generations, how many of them may search): the turn limit (``agent.max_turns``) for both in
        pyterrier-rag's loop (``_base.py`` ``for turn in range(self.max_turn)``); the original formats override it."""
        return agent.max_turns, agent.max_turns

    @property
    def stops_on_empty_results(self) -> bool:
        """A search with no documents ends the trajectory (pyterrier-rag: "No retrieval results")."""
        return self.observation_format == "pyterrier"

    # --- prompt -------------------------------------------------------------------------------
    @abstractmethod
    def prompt(self, question: str, chat_template) -> str:
        """The first context. ``chat_template(messages)`` renders chat messages with the generation prompt."""

    @property
    @abstractmethod
    def stop(self) -> tuple[str, ...]:
        """Stop strings of the agent's turns."""

    # --- turns --------------------------------------------------------------------------------
    @property
    def joiner(self) -> str:
        """Text inserted before every model output in the context."""
        return "\n\n" if self.observation_format == "pyterrier" else ""

    def clean_output(self, text: str) -> str:
        """The model's output as it enters the context (R1-Searcher's reference code strips it)."""
        return text

    def restore_stop(self, text: str, stop_string: str | None) -> str:
        """Put back the stop string the engine cut off, so the context holds the closing tag."""
        return text + stop_string if stop_string in (self.search_close, self.answer_close) else text

    def parse_action(self, output: str) -> Action:
        """The action in one turn's output (its stop string restored)."""
        if self.observation_format == "original":
            return self.parse_original(output)
        if self.answer_open in output:  # pyterrier checks the answer first
            return Action(ANSWER, self._answer_text(output))
        query = self.parse_query(output)
        return Action(SEARCH, query) if query else Action(INVALID)

    def _answer_text(self, output: str) -> str:
        return output.split(self.answer_open, 1)[1].split(self.answer_close, 1)[0].strip()

    @abstractmethod
    def parse_original(self, output: str) -> Action:
        """The action as the agent's own reference code reads it (``original`` format)."""

    def parse_query(self, output: str) -> str:
        """The text after the last search tag up to its closing tag (or the end), stripped."""
        if self.search_open not in output:
            return ""
        return output.rsplit(self.search_open, 1)[1].split(self.search_close, 1)[0].strip()

    def close_action(self, output: str, action: Action) -> str:
        """Text appended after an output whose closing tag is missing (pyterrier restores it)."""
        close = self.answer_close if action.kind == ANSWER else self.search_close
        return "" if action.kind == INVALID or output.endswith(close) else close

    def correction(self) -> str | None:
        """Text appended after an invalid action; None stops the agent."""
        return None

    # --- observations -------------------------------------------------------------------------
    @abstractmethod
    def observation(self, hits: Sequence[SearchHit]) -> str:
        """The text appended after a search: the top documents in the protocol's format."""

    # --- probes -------------------------------------------------------------------------------
    @abstractmethod
    def probe_prompt(self, context: str, output: str) -> str:
        """The forced-answer prompt after one turn (the seed paper's ``_build_probe_prompt``).

        ``context`` is the context the turn was generated from, ``output`` the turn's text.
        """

    def forced_answer_prompt(self, context: str) -> str:
        """The forced-answer prompt on a context that ends with an observation (no output yet)."""
        return self.probe_prompt(context, "")

    def parse_probe(self, text: str) -> str | None:
        """The answer in a probe's continuation (generation stopped at the closing answer tag)."""
        if not text:
            return None
        tail = text.split(self.answer_open, 1)[1] if self.answer_open in text else text
        return tail.split(self.answer_close, 1)[0].strip()

    # --- format enforcement -------------------------------------------------------------------
    @abstractmethod
    def turn_text(self, reasoning: str, kind: str, content: str) -> str:
        """One model turn in the protocol's format (as :meth:`enforcement_parts` allows it): the reasoning, then
        one closed action of ``kind`` (SEARCH or ANSWER) holding ``content``; supervised trajectories are made of
        these (:mod:`raypipe.agenttrain.trajectories`)."""

    @abstractmethod
    def enforcement_parts(self, agent: AgentConfig) -> tuple[str, str, str]:
        """The protocol's (reasoning, search, answer) regex pieces; a turn is reasoning then one action.

        ``agent.enforce_*_chars`` bound the repeats (characters after the first one).
        """

    def enforcement_regex(self, agent: AgentConfig, turn: int) -> str | None:
        """The structured-output regex of ``agent.enforcement`` for one turn; None when the turn is unconstrained."""
        if agent.enforcement == "none":
            return None
        think, search, answer = self.enforcement_parts(agent)
        if agent.enforcement == "first_search" and turn == 0:
            return think + search
        return f"{think}({search}|{answer})"

    def enforcement_regexes(self, agent: AgentConfig) -> list[str]:
        """Every distinct regex a run may use (to warm the grammar compiler up when the engine starts)."""
        regexes = [self.enforcement_regex(agent, turn) for turn in (0, 1)]
        return list(dict.fromkeys(r for r in regexes if r))
