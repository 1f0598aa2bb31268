"""LLM-Stop: the engine itself is asked whether to stop, the prompting baseline of Stop-RAG.

The prompt follows the structure of the public one (chosolbee/MHQA-SetVerify
``pipeline/stop_decider/prompts.py``), in our own words: a system message that describes the input
(the main question, then rounds of follow-up query, top document snippet and intermediate answer), asks
for a short step-by-step analysis and ends with ``Decision: <STOP>`` or ``Decision: <CONTINUE>``, with
worked examples; a user message with the main question, the rounds and a closing instruction. Our
rounds are the agent's retrieval iterations: its query, the top ``docs`` documents it saw and that
iteration's probed answer as the intermediate answer.

Parsing (:func:`parse_decision`) is tolerant of case, whitespace and markdown: the first ``Decision:``
line naming exactly one of stop/continue decides; otherwise the whole output's ``<STOP>``/``<CONTINUE>``
tokens (with any spacing or case) decide when only one kind appears; when both or neither appear the
configured default holds (``continue``, as the public parser's fallback). Bare words outside a
decision line are ignored: an analysis often says "continue" or "stop" in passing.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from raypipe.agents.hooks import CONTINUE, StopDecision
from raypipe.llm.base import Engine, EngineError, GenerationRequest
from raypipe.stoprag.targets import Round, rounds_from_history

SYSTEM_PROMPT = """\
You decide whether a multi-step search has gathered enough information to answer a question.

Input:
- Main question: <the original question>
- One or more rounds of:
  - Follow up: <a search query>
  - Document: <the top snippet it found>
  - Intermediate answer: <the answer given after reading it>

Think step by step: which facts does the main question need, which of them the rounds have found, and
whether anything essential is still missing. Then decide.

Answer in exactly this format:
Analysis: <your step-by-step reasoning>
Decision: <STOP> or <CONTINUE>

<STOP>: every part of the main question can be answered from the information gathered so far.
<CONTINUE>: some information needed for the answer is still missing.

Examples:

## Input
Main question: Which river flows through the city where the composer of "The Moldau" was born?

Follow up: Who composed "The Moldau"?
Document: Bedřich Smetana: a Czech composer, born in Litomyšl in 1824, wrote the cycle "Má vlast", which includes "Vltava" ("The Moldau").
Intermediate answer: Bedřich Smetana
## Output
Analysis: The question needs (1) the composer, found: Smetana, born in Litomyšl, and (2) the river through Litomyšl, not found yet.
Decision: <CONTINUE>

## Input
Main question: Which river flows through the city where the composer of "The Moldau" was born?

Follow up: Who composed "The Moldau"?
Document: Bedřich Smetana: a Czech composer, born in Litomyšl in 1824, wrote the cycle "Má vlast", which includes "Vltava" ("The Moldau").
Intermediate answer: Bedřich Smetana
Follow up: Which river flows through Litomyšl?
Document: Litomyšl: a town in the Pardubice Region of the Czech Republic, on the Loučná river.
Intermediate answer: Loučná
## Output
Analysis: The composer is Smetana, born in Litomyšl, and Litomyšl lies on the Loučná. Both facts are known.
Decision: <STOP>"""

USER_INSTRUCTION = (
    "Based on the information above, give a short analysis of whether the main question can be answered, "
    "then decide whether to stop or continue gathering information."
)

Verdict = Literal["stop", "continue"]
# The named option ``enforce``: the output format as a bounded regex (vLLM structured outputs).
DECISION_REGEX = r"Analysis: [^\n<>]{1,400}\nDecision: <(STOP|CONTINUE)>"


def format_rounds(rounds: Sequence[Round], docs: int = 1, doc_chars: int = 300) -> str:
    """The rounds as the prompt shows them (the top ``docs`` documents of each, cut to ``doc_chars``)."""
    lines: list[str] = []
    for rnd in rounds:
        lines.append(f"Follow up: {(rnd.query or '').strip()}")
        for _, title, text in rnd.docs[:docs]:
            lines.append(f"Document: {title}: {' '.join(text.split())[:doc_chars]}")
        lines.append(f"Intermediate answer: {(rnd.answer or '').strip()}")
    return "\n".join(lines)


def build_messages(question: str, rounds: Sequence[Round], docs: int = 1, doc_chars: int = 300) -> list[dict[str, str]]:
    user = f"Main question: {question.strip()}\n\n{format_rounds(rounds, docs, doc_chars)}\n\n{USER_INSTRUCTION}"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


@dataclass(frozen=True)
class Parsed:
    verdict: Verdict
    source: Literal["decision_line", "token", "default_both", "default_neither"]


_TOKEN = re.compile(r"<\s*(stop|continue)\s*>", re.IGNORECASE)
_WORD = re.compile(r"\b(stop|continue)\b", re.IGNORECASE)
_DECISION_LINE = re.compile(r"^[\s>*_#-]*decision[\s*_]*:(.*)$", re.IGNORECASE | re.MULTILINE)


def parse_decision(text: str, default: Verdict = "continue") -> Parsed:
    """The verdict of one output (rules in the module docstring)."""
    for line in _DECISION_LINE.findall(text):
        kinds = {m.lower() for m in _WORD.findall(line)}
        if len(kinds) == 1:
            return Parsed(kinds.pop(), "decision_line")  # type: ignore[arg-type]
    kinds = {m.lower() for m in _TOKEN.findall(text)}
    if len(kinds) == 1:
        return Parsed(kinds.pop(), "token")  # type: ignore[arg-type]
    return Parsed(default, "default_both" if kinds else "default_neither")


class LLMStopController:
    """LLM-Stop as an online controller (:class:`raypipe.agents.hooks.StopController`) over an Engine.

    Iterations before ``first_decision`` always continue (0: the probe before any retrieval). An engine
    error on the decision prompt is the default verdict, not a failed trajectory. ``enforce`` constrains
    the output to :data:`DECISION_REGEX` (needs an engine with structured outputs).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        max_tokens: int = 200,
        temperature: float = 0.0,
        docs: int = 1,
        doc_chars: int = 300,
        default: Verdict = "continue",
        first_decision: int = 1,
        seed: int | None = None,
        enforce: bool = False,
    ):
        self.engine = engine
        self.max_tokens, self.temperature, self.seed = max_tokens, temperature, seed
        self.regex = DECISION_REGEX if enforce else None
        self.docs, self.doc_chars, self.default, self.first_decision = docs, doc_chars, default, first_decision

    async def judge(self, question: str, rounds: Sequence[Round]) -> tuple[Parsed, str]:
        """The parsed verdict and the raw output for a state given by its rounds."""
        prompt = self.engine.apply_chat_template(build_messages(question, rounds, self.docs, self.doc_chars))
        request = GenerationRequest(
            prompt=prompt, max_tokens=self.max_tokens, temperature=self.temperature, seed=self.seed, regex=self.regex
        )
        try:
            gen = await self.engine.generate(request)
        except EngineError as exc:
            return Parsed(self.default, "default_neither"), f"<engine error: {exc}>"
        return parse_decision(gen.text, self.default), gen.text

    async def decide(self, question: str, history: list[dict[str, Any]]) -> StopDecision:
        rounds = rounds_from_history(history)
        if len(rounds) < max(self.first_decision, 1):
            return CONTINUE
        parsed, _ = await self.judge(question, rounds)
        if parsed.verdict == "stop":
            return StopDecision(stop=True, reason=f"llm_stop:{parsed.source}")
        return CONTINUE


async def judge_prefixes(
    controller: LLMStopController, items: Sequence[tuple[str, int, str, Sequence[Round]]], concurrency: int = 64
) -> dict[str, dict[int, tuple[Parsed, str]]]:
    """Offline: judge many states at once (the engine batches them). ``items`` = (qid, iteration,
    question, rounds up to that iteration); returns qid -> iteration -> (verdict, raw output)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(question: str, rounds: Sequence[Round]):
        async with gate:
            return await controller.judge(question, rounds)

    results = await asyncio.gather(*(one(q, r) for _, _, q, r in items))
    out: dict[str, dict[int, tuple[Parsed, str]]] = {}
    for (qid, it, _, _), res in zip(items, results):
        out.setdefault(qid, {})[it] = res
    return out
