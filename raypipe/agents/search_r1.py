"""Search-R1 (PeterGriffinJin/Search-R1; pyterrier-rag ``frameworks/agentic/_searchr1.py``).

One user message through the chat template; ``<search>``/``<answer>`` actions; top-3 documents as
``Doc i(Title: "T") text``. The title is quoted in both formats: Search-R1 prints the first line of a
FlashRAG ``contents`` field, which is the quoted title; pyterrier-rag quotes it and removes the title
from the start of the text.

In the original format a turn's action is Search-R1's own reading (``generation.py``
``_postprocess_responses`` and ``postprocess_predictions``): the output cut after its first
``</search>`` (else its first ``</answer>``), then the first ``<(search|answer)>(.*?)</\1>`` match,
stripped; ``max_turns`` turns may search and one final rollout follows without search (``run_llm_loop``'s
"final LLM rollout", ``do_search=False``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from raypipe.agents.protocol import ANSWER, INVALID, SEARCH, Action, AgentProtocol
from raypipe.core.config import AgentConfig
from raypipe.retrieval.types import SearchHit

PROMPT = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query </search> "
    "and it will return the top searched results between <information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside <answer> and "
    "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)

_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)

CORRECTION = (
    "\nMy previous action is invalid. "
    "If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.\n"
)


class SearchR1(AgentProtocol):
    name = "search_r1"
    search_open, search_close = "<search>", "</search>"

    def prompt(self, question: str, chat_template) -> str:
        question = question.strip()
        if not question.endswith("?"):
            question += "?"  # Search-R1 was trained on questions preprocessed this way
        return chat_template([{"role": "user", "content": PROMPT.format(question=question)}])

    @property
    def stop(self) -> tuple[str, ...]:
        return (self.search_close, self.answer_close)

    def correction(self) -> str | None:
        return CORRECTION if self.observation_format == "original" else None

    def turn_plan(self, agent: AgentConfig) -> tuple[int, int]:
        limit = agent.max_turns
        return (limit + 1, limit) if self.observation_format == "original" else (limit, limit)

    def parse_original(self, output: str) -> Action:
        for close in (self.search_close, self.answer_close):
            if close in output:
                output = output.split(close, 1)[0] + close
                break
        match = _ACTION.search(output)
        if match is None:
            return Action(INVALID)
        return Action(SEARCH if match.group(1) == "search" else ANSWER, match.group(2).strip())

    def observation(self, hits: Sequence[SearchHit]) -> str:
        if self.observation_format == "original":
            docs = "".join(f'Doc {i}(Title: "{h.title}") {h.text}\n' for i, h in enumerate(hits, start=1))
            return f"\n\n<information>{docs.strip()}</information>\n\n"
        docs = "\n".join(
            f'Doc {i}(Title: "{h.title}") {h.text.removeprefix(h.title).lstrip()}' for i, h in enumerate(hits, start=1)
        )
        return f"\n\n<information>{docs}</information>\n\n"

    def probe_prompt(self, context: str, output: str) -> str:
        if self.answer_open in output:
            return context + self.joiner + output.split(self.answer_open, 1)[0] + self.answer_open
        end = output.find("</think>")
        if end >= 0:
            return context + self.joiner + output[: end + len("</think>")] + "\n\n" + self.answer_open
        return context + "\n\n" + self.answer_open

    def turn_text(self, reasoning: str, kind: str, content: str) -> str:
        tag = "search" if kind == SEARCH else "answer"
        return f"<think> {reasoning} </think>\n<{tag}> {content} </{tag}>"

    def enforcement_parts(self, agent: AgentConfig) -> tuple[str, str, str]:
        think = rf"<think> ?[^\s<>][^<>]{{0,{agent.enforce_think_chars}}}</think>\n"
        search = rf"<search> ?[^\s<>][^<>\n]{{0,{agent.enforce_query_chars}}}</search>"
        answer = rf"<answer> ?[^\s<>][^<>\n]{{0,{agent.enforce_answer_chars}}}</answer>"
        return think, search, answer
