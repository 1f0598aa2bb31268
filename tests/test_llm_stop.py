"""LLM-Stop: robust parsing, the prompt's structure, the controller over a fake engine."""

import asyncio

import pytest

from raypipe.llm.base import EngineError, Generation
from raypipe.stoprag.llm_stop import (
    LLMStopController,
    Parsed,
    build_messages,
    judge_prefixes,
    parse_decision,
)
from raypipe.stoprag.targets import Round


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Analysis: all known.\nDecision: <STOP>", Parsed("stop", "decision_line")),
        ("Analysis: x\nDecision: <CONTINUE>", Parsed("continue", "decision_line")),
        ("analysis: fine\n  decision :  < stop >", Parsed("stop", "decision_line")),
        ("**Decision:** STOP", Parsed("stop", "decision_line")),
        ("Decision: continue searching", Parsed("continue", "decision_line")),
        ("<Stop>", Parsed("stop", "token")),
        ("  <CONTINUE>\n", Parsed("continue", "token")),
        # a decision line naming both is skipped; the tokens then decide
        ("Decision: stop or continue?\n<STOP>", Parsed("stop", "token")),
        # the first decision line that names exactly one wins
        ("Decision: <CONTINUE>\nDecision: <STOP>", Parsed("continue", "decision_line")),
        # both tokens and no usable decision line: the default
        ("I could <STOP> or <CONTINUE>.", Parsed("continue", "default_both")),
        # neither: the default; bare words in prose do not count
        ("We should stop here, I think.", Parsed("continue", "default_neither")),
        ("", Parsed("continue", "default_neither")),
        ("<STOPPED>", Parsed("continue", "default_neither")),
    ],
)
def test_parse_decision(text, expected):
    assert parse_decision(text) == expected


def test_parse_default_is_configurable():
    assert parse_decision("no idea", default="stop") == Parsed("stop", "default_neither")
    assert parse_decision("<STOP><CONTINUE>", default="stop") == Parsed("stop", "default_both")


ROUNDS = [
    Round("who directed X", (("d1", "X (film)", "X is a film   by Ann Lee."), ("d2", "Other", "unused")), "r", "Ann Lee"),
    Round("where was Ann Lee born", (("d3", "Ann Lee", "Born in Oslo."),), "r", "Oslo"),
]


def test_prompt_structure():
    system, user = build_messages("Where was the director of X born", ROUNDS, docs=1, doc_chars=12)
    assert system["role"] == "system" and "<STOP>" in system["content"] and "<CONTINUE>" in system["content"]
    text = user["content"]
    assert text.startswith("Main question: Where was the director of X born\n\nFollow up: who directed X\n")
    assert "Document: X (film): X is a film \n" in text  # squashed whitespace, cut to 12 characters
    assert "Other" not in text  # only the top document of each round
    assert "Intermediate answer: Ann Lee\nFollow up: where was Ann Lee born" in text
    assert text.index("Intermediate answer: Oslo") < text.index("Based on the information")


class FakeEngine:
    max_model_len = 4096

    def __init__(self, outputs):
        self.outputs = list(outputs)
        self.prompts, self.regexes = [], []

    def apply_chat_template(self, messages, add_generation_prompt=True):
        return "|".join(m["content"] for m in messages)

    async def generate(self, request):
        self.prompts.append(request.prompt)
        self.regexes.append(request.regex)
        out = self.outputs.pop(0)
        if isinstance(out, Exception):
            raise out
        return Generation(text=out)

    def count_tokens(self, text):
        return len(text.split())

    async def close(self):
        pass


def _history(n):
    rows = [{"iteration": 0, "query": None, "doc_ids": [], "doc_titles": [], "doc_texts": [], "probe_answer": "a0"}]
    for i in range(1, n + 1):
        rows.append({"iteration": i, "query": f"q{i}", "doc_ids": [f"d{i}"], "doc_titles": [f"T{i}"],
                     "doc_texts": [f"text {i}"], "probe_answer": f"a{i}", "reasoning": ""})
    return rows


def test_controller_online():
    engine = FakeEngine(["Decision: <CONTINUE>", "Analysis: ok\nDecision: <STOP>", EngineError("boom")])
    ctl = LLMStopController(engine, max_tokens=50)
    assert not asyncio.run(ctl.decide("Q", _history(0))).stop  # before any retrieval: no call
    assert engine.prompts == []
    assert not asyncio.run(ctl.decide("Q", _history(1))).stop
    decision = asyncio.run(ctl.decide("Q", _history(2)))
    assert decision.stop and decision.answer_iteration is None and decision.reason == "llm_stop:decision_line"
    assert "Follow up: q2" in engine.prompts[-1] and "Intermediate answer: a1" in engine.prompts[-1]
    assert not asyncio.run(ctl.decide("Q", _history(3))).stop  # an engine error is the default verdict


def test_judge_prefixes_keys_results():
    engine = FakeEngine(["<STOP>", "<CONTINUE>"])
    ctl = LLMStopController(engine)
    items = [("a", 1, "Q", ROUNDS[:1]), ("a", 2, "Q", ROUNDS)]
    out = asyncio.run(judge_prefixes(ctl, items, concurrency=1))
    assert out["a"][1][0].verdict == "stop" and out["a"][2][0].verdict == "continue"


def test_enforced_format_is_parseable():
    import re

    from raypipe.stoprag.llm_stop import DECISION_REGEX

    engine = FakeEngine(["Analysis: enough.\nDecision: <STOP>"])
    ctl = LLMStopController(engine, enforce=True)
    assert asyncio.run(ctl.decide("Q", _history(1))).stop and engine.regexes == [DECISION_REGEX]
    for verdict in ("STOP", "CONTINUE"):
        text = f"Analysis: some reasoning, with commas.\nDecision: <{verdict}>"
        assert re.fullmatch(DECISION_REGEX, text)
        assert parse_decision(text) == Parsed(verdict.lower(), "decision_line")
    assert LLMStopController(FakeEngine([])).regex is None  # the faithful default: free text
