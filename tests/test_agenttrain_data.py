"""Supervised agent trajectories (issue 43): the agent loop's prompt and observations, the retriever's documents,
no golden answer in a query before the agent has seen it."""

from __future__ import annotations

import asyncio
import re

import pytest

from raypipe.agents.factory import build_protocol
from raypipe.agenttrain.trajectories import AGENT, CONTEXT, PROMPT, contains, run_build, summarize, write_outputs
from raypipe.core.config import load_config
from raypipe.data.loaders import load_corpus
from raypipe.data.split import bundled_split
from tests.helpers.agent_data import retriever_and_tokenizer


@pytest.fixture(scope="module")
def built():
    config = load_config("embedded")
    retriever, tokenizer = retriever_and_tokenizer(config)
    train = bundled_split(config.agent_train.dev_percent).train
    questions = train[:12] + train[230:242] + train[-6:]  # each dataset
    kept, rejected = run_build(questions, config, retriever, {p.doc_id: p for p in load_corpus()}, tokenizer)
    return config, retriever, tokenizer, questions, kept, rejected


def observations(row):
    """The context segments after each search (each starts with that search's observation block)."""
    segments = row["segments"]
    return [s["text"] for prev, s in zip(segments, segments[1:]) if s["kind"] == CONTEXT and prev["kind"] == AGENT]


def test_prompts_are_the_agent_loops(built):
    config, _, tokenizer, questions, kept, _ = built
    protocol = build_protocol(config.agent)
    by_qid = {q.qid: q for q in questions}
    assert kept
    for row in kept:
        assert row["segments"][0]["kind"] == PROMPT
        assert row["segments"][0]["text"] == protocol.prompt(by_qid[row["qid"]].question, tokenizer.apply_chat_template)
        agent = [s["text"] for s in row["segments"] if s["kind"] == AGENT]
        assert len(agent) == row["searches"] + 1 and agent[-1].endswith(f"<answer> {row['answer']} </answer>")
        assert row["answer"] in by_qid[row["qid"]].golden_answers
        for turn, text in enumerate(agent):  # the preset's enforced format
            assert re.fullmatch(protocol.enforcement_regex(config.agent, turn), text), text


def test_observations_are_what_the_retriever_returns(built):
    config, retriever, _, _, kept, _ = built
    protocol = build_protocol(config.agent)
    top_k = config.retrieval.top_k
    for row in kept:
        blocks = observations(row)
        assert len(blocks) == row["searches"]
        for query, block, doc_ids in zip(row["queries"], blocks, row["doc_ids"]):
            hits = asyncio.run(retriever.search([query], config.retrieval.deep_k))[0].hits[:top_k]
            assert [h.doc_id for h in hits] == doc_ids
            assert block.startswith(protocol.observation(hits))


def test_no_golden_answer_in_a_query_before_the_agent_has_seen_it(built):
    _, _, _, questions, kept, _ = built
    golds = {q.qid: (q.question, q.golden_answers) for q in questions}
    for row in kept:
        question, answers = golds[row["qid"]]
        seen = question
        for query, block in zip(row["queries"], observations(row)):
            for gold in answers:
                assert not contains(query, gold) or contains(seen, gold), (row["qid"], query, gold)
            seen += " " + block


def test_a_trajectory_answers_once_its_supporting_paragraphs_are_shown(built, tmp_path):
    config, _, _, questions, kept, rejected = built
    corpus = {p.doc_id: p for p in load_corpus()}
    for row in kept:
        shown = {corpus[d].title for ids in row["doc_ids"] for d in ids}
        assert set(row["supporting_titles"]) <= shown
        if not row["extra_search"]:  # the search before the last one had not shown them all
            before = {corpus[d].title for ids in row["doc_ids"][:-1] for d in ids}
            assert not set(row["supporting_titles"]) <= before
    summary = write_outputs(tmp_path, kept, rejected, {"rule": "test"})
    assert summary == {**summarize(kept, rejected), "data_sha256": summary["data_sha256"]}
    assert summary["kept"] + summary["rejected"] == len(questions) and summary["rejected_by_reason"]
    assert (tmp_path / "trajectories.parquet").exists() and (tmp_path / "rejected.parquet").exists()
    assert (tmp_path / "summary.md").read_text().startswith(f"# Agent trajectories: {len(kept)} kept")


def test_trajectories_in_the_r1_searcher_format_follow_its_prompt_tags_and_enforcement(built):
    _, retriever, tokenizer, questions, _, _ = built
    config = load_config("embedded", ["agent.protocol=r1_searcher"])
    protocol = build_protocol(config.agent)
    # the last: a question with quotes, which R1-Searcher's reader drops from a query (the plan searches as it reads)
    quoted = next(q for q in bundled_split(config.agent_train.dev_percent).train if q.qid == "5a8a3e745542996c9b8d5e70")
    assert '"' in quoted.question
    asked = [*questions[:8], quoted]
    kept, rejected = run_build(asked, config, retriever, {p.doc_id: p for p in load_corpus()}, tokenizer)
    assert kept and all(r["reason"] != "format" for r in rejected) and quoted.qid in {r["qid"] for r in kept}
    top_k = config.retrieval.top_k
    for row in kept:
        assert row["segments"][0]["text"] == protocol.prompt(row["question"], tokenizer.apply_chat_template)
        agent = [s["text"] for s in row["segments"] if s["kind"] == AGENT]
        for turn, text in enumerate(agent):
            assert re.fullmatch(protocol.enforcement_regex(config.agent, turn), text), text
        assert all(t.endswith("<|end_of_query|>") for t in agent[:-1]) and agent[-1].endswith("</answer>")
        for query, block in zip(row["queries"], observations(row)):
            hits = asyncio.run(retriever.search([query], config.retrieval.deep_k))[0].hits[:top_k]
            assert block.startswith(protocol.observation(hits)) and "<|begin_of_documents|>" in block
