"""Supervised agent trajectories from the training questions' supporting paragraphs, in the agent's own protocol.

A trajectory is planned with the real retriever, then rendered by the real agent loop
(:class:`~raypipe.agents.loop.AgentLoop`) driven by a :class:`ScriptedEngine` that replies with the planned
turns: the prompt, the chat template, the joiners and the observation blocks are the loop's and the
protocol's own, and every observation is what the retriever returns for the query (the loop searches).

The plan of one question (its supporting paragraphs are those of its ``supporting_titles``):

1. the first search is the question itself (cut to the enforcement regex's query bound);
2. while a supporting title has not been shown, the next query names a missing supporting title's entity
   (the title without its parenthesised qualifier) that the question or an earlier observation mentions:
   the first such entity whose search shows its paragraph; none: the question is rejected
   (``entity_not_seen``, or ``not_retrieved`` when no such search shows a missing paragraph), as it is when
   ``max_searches`` searches do not show every supporting paragraph;
3. a share of the trajectories (``extra_search_percent``, by a hash of the qid) searches once more than it
   needs (the last entity found, looked up again) when the turn budget allows;
4. the answer is the first golden answer that fits the answer bound, once every supporting paragraph has
   been shown.

No query contains a golden answer unless the question or an earlier observation shows it (a comparison
question names its candidates). Every turn is ``<think> short reasoning </think>\\n`` and one action, as the
preset's format enforcement regex allows; the reasoning says what the results showed and what is missing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raypipe.agents.factory import build_loop, build_protocol
from raypipe.agents.protocol import ANSWER, SEARCH, AgentProtocol
from raypipe.core.config import RunConfig
from raypipe.core.metrics import normalize_answer
from raypipe.data.loaders import Passage, Question
from raypipe.llm.base import Generation, GenerationRequest
from raypipe.retrieval.index import file_sha256
from raypipe.retrieval.types import Retriever, SearchHit

TRAJECTORIES_FILE = "trajectories.jsonl"
PROMPT, AGENT, CONTEXT = "prompt", "agent", "context"  # segment kinds: the loss is on AGENT segments only
REJECT_ENTITY_NOT_SEEN = "entity_not_seen"  # a missing paragraph's entity is named nowhere the agent has read
REJECT_NOT_RETRIEVED = "not_retrieved"  # no search the agent could write shows a missing paragraph
REJECT_TOO_MANY_SEARCHES = "too_many_searches"  # the search budget ran out first
REJECT_NO_SUPPORT = "no_support"  # the question names no supporting paragraph found in the corpus
REJECT_LONG_ANSWER = "long_answer"  # no golden answer fits the enforcement regex's answer bound
REJECT_FORMAT = "format"  # a turn the enforcement regex would not allow (a reasoning over its bound)
_PARENTHESIS = re.compile(r"\s*\([^)]*\)\s*$")
_TAG_CHARS = re.compile(r"[<>\n]")


def entity(title: str) -> str:
    """A title's entity name: without a trailing parenthesised qualifier (``Kiss and Tell (1945 film)``)."""
    return _TAG_CHARS.sub(" ", _PARENTHESIS.sub("", title)).strip()


def bucket(qid: str, salt: str) -> int:
    """A stable bucket 0..99 of a qid (a hash, not a random state)."""
    return int(hashlib.sha256(f"{salt}:{qid}".encode()).hexdigest()[:8], 16) % 100


def contains(text: str, phrase: str) -> bool:
    """Whether ``phrase`` occurs in ``text`` as whole words after SQuAD normalisation."""
    phrase = normalize_answer(phrase)
    return bool(phrase) and f" {phrase} " in f" {normalize_answer(text)} "


def hit_text(hit: SearchHit) -> str:
    return f"{hit.title} {hit.text}"


@dataclass
class Step:
    query: str
    hits: list[SearchHit]  # what the agent reads (the top ``top_k``)
    found: list[str]  # supporting titles this search showed first
    extra: bool = False  # a search after everything was found


@dataclass
class Plan:
    question: Question
    steps: list[Step] = field(default_factory=list)
    answer: str | None = None
    reject: str | None = None
    supporting: list[str] = field(default_factory=list)

    @property
    def searches(self) -> int:
        return len(self.steps)


def supporting_titles(question: Question, corpus: dict[str, Passage]) -> list[str]:
    """The question's supporting titles that its own paragraphs carry in the corpus."""
    titles = question.extra.get("supporting_titles") or []
    own = {corpus[p].title for p in question.extra.get("paragraph_ids") or [] if p in corpus}
    return [t for t in dict.fromkeys(titles) if t in own]


def query_bound(text: str, chars: int) -> str:
    """``text`` as a query the enforcement regex allows: one line, at most ``chars`` characters, cut at a word."""
    text = " ".join(_TAG_CHARS.sub(" ", text).split())
    if len(text) <= chars:
        return text
    return text[:chars].rsplit(" ", 1)[0]


class Planner:
    """Plans trajectories for one run config with one retriever (the agent's depths: deep_k searched, top_k read)."""

    def __init__(self, config: RunConfig, retriever: Retriever, corpus: dict[str, Passage]):
        self.config, self.retriever, self.corpus = config, retriever, corpus
        self.protocol = build_protocol(config.agent)
        self.top_k = config.retrieval.top_k
        self.deep_k = max(config.retrieval.deep_k, self.top_k)
        agent = config.agent
        self.max_searches = min(config.agent_train.max_searches, self.protocol.turn_plan(agent)[1] - 1)
        # the regex allows a first character and enforce_*_chars more, the space before the closing tag included
        self.query_chars = agent.enforce_query_chars
        self.answer_chars = agent.enforce_answer_chars

    def as_read(self, text: str, chars: int) -> str:
        """``text`` as a query (:func:`query_bound`) the way the loop reads it back from the agent's turn (the
        R1-Searcher reader drops quotes), so that the plan searches what the loop will."""
        query = query_bound(text, chars)
        return self.protocol.parse_action(self.protocol.turn_text("", SEARCH, query)).content

    async def search(self, query: str) -> list[SearchHit]:
        result = (await self.retriever.search([query], self.deep_k))[0]
        return list(result.hits[: self.top_k])

    def seen_text(self, question: Question, steps: Sequence[Step]) -> str:
        return " ".join([question.question, *(hit_text(h) for s in steps for h in s.hits)])

    def allowed(self, query: str, question: Question, steps: Sequence[Step]) -> bool:
        """A query may name a golden answer only where the question or an earlier observation shows it."""
        seen = self.seen_text(question, steps)
        return all(contains(seen, g) for g in question.golden_answers if contains(query, g))

    async def plan(self, question: Question) -> Plan:
        support = supporting_titles(question, self.corpus)
        plan = Plan(question, supporting=support)
        if not support:
            plan.reject = REJECT_NO_SUPPORT
            return plan
        answer = next((g for g in question.golden_answers if 0 < len(query_bound(g, 10**6)) <= self.answer_chars), None)
        if answer is None:
            plan.reject = REJECT_LONG_ANSWER
            return plan
        missing = list(support)
        query = self.as_read(question.question, self.query_chars)
        while True:
            if plan.searches >= self.max_searches:
                plan.reject = REJECT_TOO_MANY_SEARCHES
                return plan
            if not query or not self.allowed(query, question, plan.steps):
                plan.reject = REJECT_ENTITY_NOT_SEEN
                return plan
            hits = await self.search(query)
            found = [t for t in missing if any(h.title == t for h in hits)]
            plan.steps.append(Step(query, hits, found))
            missing = [t for t in missing if t not in found]
            if not missing:
                break
            query, reason = await self.next_query(question, plan.steps, missing)
            if query is None:
                plan.reject = reason
                return plan
        extra = bucket(question.qid, "extra") < self.config.agent_train.extra_search_percent
        if extra and plan.searches < self.max_searches:
            again = self.as_read(entity(plan.steps[-1].found[-1]), self.query_chars)
            if again and self.allowed(again, question, plan.steps):
                plan.steps.append(Step(again, await self.search(again), [], extra=True))
        plan.answer = query_bound(answer, self.answer_chars)
        return plan

    async def next_query(self, question: Question, steps: Sequence[Step], missing: list[str]) -> tuple[str | None, str]:
        """The first missing entity named in what the agent has read whose search shows a missing paragraph."""
        seen = self.seen_text(question, steps)
        candidates = [entity(t) for t in missing if entity(t) and contains(seen, entity(t))]
        candidates = [self.as_read(c, self.query_chars) for c in dict.fromkeys(candidates)]
        asked = {s.query for s in steps}
        candidates = [c for c in candidates if c and c not in asked and self.allowed(c, question, steps)]
        if not candidates:
            return None, REJECT_ENTITY_NOT_SEEN
        for query in candidates:
            if any(h.title in missing for h in await self.search(query)):
                return query, ""
        return None, REJECT_NOT_RETRIEVED


def _names(titles: Iterable[str]) -> str:
    names = [entity(t) for t in titles]
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]


def turn_outputs(plan: Plan, protocol: AgentProtocol) -> list[str]:
    """The agent's turns (each a short reasoning and one closed action, in ``protocol``'s format) for a complete
    plan."""
    outputs = []
    for i, step in enumerate(plan.steps):
        if i == 0:
            think = "I have no information yet. Let me search for the question."
        else:
            before = plan.steps[i - 1]
            shown = f"The results show {_names(before.found)}." if before.found else "The results do not help yet."
            need = (
                f"Let me check {step.query} once more."
                if step.extra
                else (f"I still need information about {step.query}.")
            )
            think = f"{shown} {need}"
        outputs.append(protocol.turn_text(think, SEARCH, step.query))
    found = [t for s in plan.steps for t in s.found]
    think = f"The results show {_names(found)}. That is enough to answer."
    outputs.append(protocol.turn_text(think, ANSWER, plan.answer or ""))
    return outputs


class FormatError(ValueError):
    """A planned turn that the preset's enforcement regex does not allow."""


class ScriptedEngine:
    """An :class:`~raypipe.llm.base.Engine` that answers the loop's turns with given outputs (the prompts it is
    sent are kept): the chat template is the model's tokenizer's."""

    supports_regex = True

    def __init__(self, tokenizer, outputs: Sequence[str], stop: Sequence[str], max_model_len: int):
        self.tokenizer, self.max_model_len = tokenizer, max_model_len
        self.outputs, self.stop = list(outputs), tuple(stop)
        self.prompts: list[str] = []

    async def generate(self, request: GenerationRequest) -> Generation:
        if len(self.prompts) >= len(self.outputs):
            raise RuntimeError("the agent loop asked for more turns than the trajectory has")
        text = self.outputs[len(self.prompts)]
        self.prompts.append(request.prompt)
        close = next(s for s in self.stop if text.endswith(s))
        return Generation(text=text[: -len(close)], stop_string=close)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt)

    def count_tokens(self, text: str) -> int:
        return self.tokenizer.count_tokens(text)

    async def warmup(self, regexes: Iterable[str] = ()) -> dict[str, float]:
        return {}

    async def reset_prefix_cache(self) -> bool:
        return False

    def describe(self) -> dict[str, Any]:
        return {"backend": "scripted"}

    async def close(self) -> None:
        return None


def check_enforcement(protocol: AgentProtocol, config: RunConfig, outputs: Sequence[str]) -> None:
    """Every turn matches the preset's enforcement regex for its turn (when the preset enforces a format)."""
    for turn, output in enumerate(outputs):
        regex = protocol.enforcement_regex(config.agent, turn)
        if regex is not None and re.fullmatch(regex, output) is None:
            raise FormatError(f"turn {turn} does not match the enforcement regex: {output!r}")


def loop_setup(config: RunConfig) -> tuple[RunConfig, AgentProtocol]:
    """The config a trajectory is rendered with (the run's, probing off) and its protocol."""
    loop_config = config.model_copy(deep=True)
    loop_config.agent.probe = False
    return loop_config, build_protocol(loop_config.agent)


def segments_of(qid: str, prompts: Sequence[str], outputs: Sequence[str], transcript: str, protocol) -> list[dict]:
    """The loop's text (its first prompt and ``transcript``) cut into segments: the prompt, each turn's output
    (``outputs``, placed after the context it was sent, ``prompts``, and the joiner) and the context between."""
    prompt = prompts[0]
    text = prompt + transcript
    segments, at = [{"kind": PROMPT, "text": prompt}], len(prompt)
    for sent, output in zip(prompts, outputs):
        start = len(sent) + len(protocol.joiner)
        if text[start : start + len(output)] != output:
            raise RuntimeError(f"{qid}: turn text not found where the loop put it")
        if start > at:
            segments.append({"kind": CONTEXT, "text": text[at:start]})
        segments.append({"kind": AGENT, "text": output})
        at = start + len(output)
    if at != len(text):
        segments.append({"kind": CONTEXT, "text": text[at:]})
    return segments


async def render(plan: Plan, config: RunConfig, retriever: Retriever, tokenizer) -> dict[str, Any]:
    """The planned trajectory run through the agent loop (probing off): one row with its text as segments."""
    loop_config, protocol = loop_setup(config)
    outputs = turn_outputs(plan, protocol)
    check_enforcement(protocol, loop_config, outputs)
    engine = ScriptedEngine(tokenizer, outputs, protocol.stop, config.engine.max_model_len)
    out = await build_loop(loop_config, engine, retriever, protocol).run(plan.question)
    traj = out.trajectory
    if traj["stop_reason"] != "answer" or traj["final_answer"] != plan.answer:
        raise RuntimeError(f"{plan.question.qid}: the loop ended with {traj['stop_reason']} ({traj['error']})")
    shown = [row["doc_ids"][: len(step.hits)] for row, step in zip(out.iterations[1:], plan.steps)]
    if shown != [[h.doc_id for h in step.hits] for step in plan.steps]:
        raise RuntimeError(f"{plan.question.qid}: the loop's searches returned other documents than the plan's")
    q = plan.question
    return {
        "qid": q.qid,
        "dataset": q.dataset,
        "type": q.extra.get("type"),
        "question": q.question,
        "answer": plan.answer,
        "searches": plan.searches,
        "needed_searches": sum(not s.extra for s in plan.steps),
        "extra_search": any(s.extra for s in plan.steps),
        "first_search_found_all": len(plan.steps[0].found) == len(plan.supporting),
        "queries": [s.query for s in plan.steps],
        "doc_ids": [[h.doc_id for h in s.hits] for s in plan.steps],
        "supporting_titles": plan.supporting,
        "segments": segments_of(q.qid, engine.prompts, outputs, traj["transcript"], protocol),
    }


def rejected_row(plan: Plan) -> dict[str, Any]:
    q = plan.question
    return {
        "qid": q.qid,
        "dataset": q.dataset,
        "type": q.extra.get("type"),
        "reason": plan.reject,
        "queries": [s.query for s in plan.steps],
        "supporting_titles": plan.supporting,
        "found": [t for s in plan.steps for t in s.found],
    }


async def build_trajectories(
    questions: Sequence[Question],
    config: RunConfig,
    retriever: Retriever,
    corpus: dict[str, Passage],
    tokenizer,
    progress=None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(kept trajectories, rejected questions) for ``questions``, in their order; ``progress(done, total)``
    is called after each question."""
    planner = Planner(config, retriever, corpus)
    kept, rejected = [], []
    for i, question in enumerate(questions):
        plan = await planner.plan(question)
        if plan.reject is None:
            try:
                kept.append(await render(plan, config, retriever, tokenizer))
            except FormatError:
                plan.reject = REJECT_FORMAT
        if plan.reject is not None:
            rejected.append(rejected_row(plan))
        if progress is not None:
            progress(i + 1, len(questions))
    return kept, rejected


def summarize(kept: Sequence[dict[str, Any]], rejected: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts: kept and rejected by dataset, searches per kept trajectory, extra searches, rejections by reason."""

    def count(rows, key):
        out: dict[str, int] = {}
        for row in rows:
            out[str(row[key])] = out.get(str(row[key]), 0) + 1
        return dict(sorted(out.items()))

    planned = [r for r in kept if "needed_searches" in r]  # own samples (a second round's) have no plan
    return {
        "questions": len(kept) + len(rejected),
        "kept": len(kept),
        "rejected": len(rejected),
        "kept_by_dataset": count(kept, "dataset"),
        "rejected_by_dataset": count(rejected, "dataset"),
        "searches": count(kept, "searches"),
        "needed_searches": count(planned, "needed_searches"),
        "extra_search": sum(bool(r["extra_search"]) for r in planned),
        "first_search_found_all": sum(bool(r["first_search_found_all"]) for r in planned),
        "rejected_by_reason": count(rejected, "reason"),
    }


def run_build(questions, config, retriever, corpus, tokenizer, progress=None):
    """:func:`build_trajectories` from synchronous code."""
    return asyncio.run(build_trajectories(questions, config, retriever, corpus, tokenizer, progress))


def write_outputs(
    out: Path, kept: Sequence[dict[str, Any]], rejected: Sequence[dict[str, Any]], split_info: dict[str, Any]
) -> dict[str, Any]:
    """``out``/trajectories.jsonl and .parquet, rejected.parquet, split.json, summary.json/.md; returns the summary."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    with (out / TRAJECTORIES_FILE).open("w") as f:
        for row in kept:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    if kept:
        pq.write_table(pa.Table.from_pylist(list(kept)), out / "trajectories.parquet")
    if rejected:
        pq.write_table(pa.Table.from_pylist(list(rejected)), out / "rejected.parquet")
    (out / "split.json").write_text(json.dumps(split_info, indent=1))
    summary = {**summarize(kept, rejected), "data_sha256": file_sha256(out / TRAJECTORIES_FILE)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    lines = [f"# Agent trajectories: {summary['kept']} kept of {summary['questions']} training questions", ""]
    for key in ("kept_by_dataset", "rejected_by_dataset", "searches", "needed_searches", "rejected_by_reason"):
        if summary[key]:
            lines.append(f"- {key}: " + ", ".join(f"{k}: {v}" for k, v in summary[key].items()))
    if summary["needed_searches"]:  # planned trajectories (not a run's own)
        lines.append(
            f"- searched once more than needed: {summary['extra_search']}; first search found everything: "
            f"{summary['first_search_found_all']}"
        )
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    return summary


def read_trajectories(folder: Path) -> list[dict[str, Any]]:
    path = Path(folder) / TRAJECTORIES_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: make it with `raypipe agent-data`")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
