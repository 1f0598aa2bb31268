"""Search-R1 (PeterGriffinJin/Search-R1; pyterrier-rag ``frameworks/agentic/_searchr1.py``).

One user message through the chat template; ``<search>``/``<answer>`` actions; top-3 documents as
``Doc i(Title: "T") text``. The title is quoted in both formats: Search-R1 prints the first line of a
FlashRAG ``contents`` field, which is the quoted title; pyterrier-rag quotes it and removes the title
from the start of the text.
"""

from __future__ import annotations

from collections.abc import Sequence

from raypipe.agents.protocol import AgentProtocol
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

CORRECTION = (
    "\nMy previous action is invalid. "
    "If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.\n"
)


class SearchR1(AgentProtocol):
    name = "search_r1"
    search_open, search_close = "<search>", "</search>"
    default_top_k = 3
    default_max_turns = 4  # Search-R1's evaluation; pyterrier-rag allows 10

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

    def observation(self, hits: Sequence[SearchHit]) -> str:
        if self.observation_format == "original":
            docs = "".join(f'Doc {i}(Title: "{h.title}") {h.text}\n' for i, h in enumerate(hits, start=1))
            return f"\n\n<information>{docs.strip()}</information>\n\n"
        if not hits:
            return "<information></information>"
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

    def enforcement_parts(self, agent: AgentConfig) -> tuple[str, str, str]:
        think = rf"<think> ?[^\s<>][^<>]{{0,{agent.enforce_think_chars}}}</think>\n"
        search = rf"<search> ?[^\s<>][^<>\n]{{0,{agent.enforce_query_chars}}}</search>"
        answer = rf"<answer> ?[^\s<>][^<>\n]{{0,{agent.enforce_answer_chars}}}</answer>"
        return think, search, answer
