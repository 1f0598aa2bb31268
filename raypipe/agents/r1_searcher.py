"""R1-Searcher (RUCAIBox/R1-Searcher ``evaluation/eval_search_loacl.py``; pyterrier-rag ``_r1searcher.py``).

A raw prompt (no chat template) in four versions that ends inside ``<think>``; queries between
``<|begin_of_query|>`` and ``<|end_of_query|>``; the top-5 documents as ``(i)text`` lines.

The two formats read a turn as their code does:

- ``pyterrier`` (pyterrier-rag 0.3.0 ``_r1searcher.py`` ``format_docs``, ``_base.py``
  ``check_answers`` / ``extract_search_query``): observation lines ``(i){doc.text}``, the passage text
  without its title (its reader splits the corpus's ``contents`` at the first newline); an answer
  whenever ``<answer>`` appears; else the FIRST ``<|begin_of_query|>`` span, stripped, then cleaned in
  this order: ``"`` removed, ``'`` removed, tabs to spaces, ``...`` removed, stripped, whitespace runs
  to one space.
- ``original`` (R1-Searcher ``evaluation/eval_search_loacl.py``): an answer only when the turn stopped
  at ``</answer>`` (the text after the LAST ``<answer>``), a search only when it stopped at
  ``<|end_of_query|>`` (the LAST query span with ``"``, ``'``, ``...`` removed and tabs to spaces, not
  stripped); the generation of round ``k == 9`` is thrown away ("I don't know."), so of a limit of 10
  turns 9 are usable; documents are printed with their title in front when the text lacks it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from raypipe.agents.protocol import ANSWER, INVALID, SEARCH, Action, AgentProtocol, ObservationFormat
from raypipe.core.config import AgentConfig
from raypipe.retrieval.types import SearchHit

_FORMAT = (
    "The output format of reasoning process and final answer are enclosed within <think> </think> and <answer> "
    '</answer> tags, respectively, i.e., "<think> reasoning process here </think>\n\n<answer> final answer here '
)
_HEAD = "The User asks a question, and the Assistant solves it.\n"
_THINKS = (
    "The Assistant first thinks about the reasoning process in the mind and then provides the User with the final "
    "answer.\n"
)
_TAIL = "\n\nUser:{question}\nAssistant: <think>"

PROMPTS = {
    "v0": _HEAD + _THINKS + _FORMAT + '</answer>".\n'
    "During the thinking process, the Assistant can perform searching for uncertain knowledge if necessary with the "
    'format of "<|begin_of_query|> search query (only keywords) here <|end_of_query|>". **A query must involve only a '
    "single triple**.\n"
    'Then, the system will provide the Assistant with helpful information with the format of "<|begin_of_documents|> '
    '...search results... <|end_of_documents|>".' + _TAIL,
    "v1": _HEAD + _THINKS + _FORMAT + '</answer>".\n'
    "During the reasoning process, the Assistant will break down the original question into sub-questions and address "
    "them step by step.\n"
    "For each sub-question, **the Assistant can perform searching** for uncertain knowledge using the format: "
    '"<|begin_of_query|> keyword1\tkeyword2\t... <|end_of_query|>".\n'
    '**The query must consist of straightforward and essential keywords separated by "\t"**. Furthermore, **the query '
    "must involve only a single triple to address a sub-question**.\n"
    "Then, the search system will provide the Assistant with relevant information with the format of "
    '"<|begin_of_documents|> ...search results... <|end_of_documents|>".' + _TAIL,
    "v2": _HEAD + _THINKS + _FORMAT + '</answer>".\n'
    "During the thinking process, **the Assistant can perform searching** for uncertain knowledge if necessary with "
    'the format of "<|begin_of_query|> search query (only list keywords separated by "\t" instead of the complete '
    'sentence , such as **"keyword_1 \t keyword_2 \t..."**)<|end_of_query|>". **A query must involve only a single '
    "triple**.\n"
    "Then, the search system will provide the Assistant with the retrieval information with the format of "
    '"<|begin_of_documents|> ...search results... <|end_of_documents|>".' + _TAIL,
    "v3": "The User asks a **Judgment question**, and the Assistant solves it. "
    "The Assistant first thinks about the reasoning process in the mind and then provides the User with the final "
    "answer. " + _FORMAT + '(yes or no) </answer>". '
    "During the thinking process, the Assistant can perform searching for uncertain knowledge if necessary with the "
    'format of "<|begin_of_query|> search query (only keywords) here <|end_of_query|>". '
    'Then, the system will provide the Assistant with helpful information with the format of "<|begin_of_documents|> '
    '...search results... <|end_of_documents|>". The final answer **must be yes or no**.' + _TAIL,
}

_WHITESPACE = re.compile(r"\s+")


def _clean_query(query: str) -> str:
    """The replacements both implementations apply to a query, in their order."""
    return query.replace('"', "").replace("'", "").replace("\t", " ").replace("...", "")


class R1Searcher(AgentProtocol):
    name = "r1_searcher"
    search_open, search_close = "<|begin_of_query|>", "<|end_of_query|>"

    def __init__(self, observation_format: ObservationFormat = "pyterrier", prompt_version: str = "v1"):
        super().__init__(observation_format)
        if prompt_version not in PROMPTS:
            raise ValueError(f"unknown R1-Searcher prompt version {prompt_version!r}; choose one of {sorted(PROMPTS)}")
        self.prompt_version = prompt_version

    def prompt(self, question: str, chat_template) -> str:
        return PROMPTS[self.prompt_version].format(question=question)

    @property
    def stop(self) -> tuple[str, ...]:
        return ("<|im_end|>", "<|endoftext|>", self.search_close, self.answer_close)

    def clean_output(self, text: str) -> str:
        return text.strip() if self.observation_format == "original" else text

    def turn_plan(self, agent: AgentConfig) -> tuple[int, int]:
        if self.observation_format == "pyterrier":
            return super().turn_plan(agent)
        usable = max(agent.max_turns - 1, 1)  # the last round's output is discarded
        return usable, usable

    def parse_query(self, output: str) -> str:
        """pyterrier-rag's ``extract_search_query``: the FIRST query span, stripped, cleaned, whitespace collapsed."""
        start = output.find(self.search_open)
        if start < 0:
            return ""
        query = output[start + len(self.search_open) :].split(self.search_close, 1)[0].strip()
        return _WHITESPACE.sub(" ", _clean_query(query).strip()) if query else ""

    def parse_original(self, output: str) -> Action:
        if self.answer_open in output and output.endswith(self.answer_close):
            return Action(ANSWER, output.split(self.answer_open)[-1].split(self.answer_close)[0])
        if self.search_open in output and output.endswith(self.search_close):
            query = _clean_query(output.split(self.search_open)[-1].split(self.search_close)[0])
            return Action(SEARCH, query) if query else Action(INVALID)
        return Action(INVALID)

    def observation(self, hits: Sequence[SearchHit]) -> str:
        if self.observation_format == "pyterrier":
            docs = "".join(f"({i}){h.text}\n" for i, h in enumerate(hits, start=1))
        else:
            docs = "".join(f"({i}){_with_title(h)}\n" for i, h in enumerate(hits, start=1)) or "None"
        return f"\n\n<|begin_of_documents|>\n{docs}<|end_of_documents|>\n\n"

    def probe_prompt(self, context: str, output: str) -> str:
        if self.answer_open in output:
            return context + self.joiner + output.split(self.answer_open, 1)[0] + self.answer_open
        reasoning = output.split(self.search_open, 1)[0].rstrip()
        return context + self.joiner + reasoning + "</think>\n\n" + self.answer_open

    def turn_text(self, reasoning: str, kind: str, content: str) -> str:
        if kind == SEARCH:  # the reasoning goes on inside the prompt's open <think>
            return f" {reasoning} {self.search_open} {content} {self.search_close}"
        return f" {reasoning} </think>\n\n{self.answer_open} {content} {self.answer_close}"

    def enforcement_parts(self, agent: AgentConfig) -> tuple[str, str, str]:
        think = rf" ?[^\s<>][^<>]{{0,{agent.enforce_think_chars}}}"
        search = rf"<\|begin_of_query\|> ?[^\s<>][^<>\n]{{0,{agent.enforce_query_chars}}}<\|end_of_query\|>"
        answer = rf"</think>\n\n<answer> ?[^\s<>][^<>\n]{{0,{agent.enforce_answer_chars}}}</answer>"
        return think, search, answer


def _with_title(hit: SearchHit) -> str:
    return hit.text if hit.text.startswith(hit.title) else f"{hit.title} {hit.text}"
