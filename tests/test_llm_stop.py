"""LLM-Stop: the reference's prompt and parser, the tolerant parser option, the controller over a fake engine.

Reference: chosolbee/MHQA-SetVerify ``pipeline/stop_decider/prompts.py`` (commit e2da463) and
``pipeline/stop_decider/stop_decider.py`` (``StopDecider.extract_decision``, l.49-77).
"""

import asyncio
import hashlib

import pytest

from raypipe.llm.base import EngineError
from raypipe.stoprag.llm_stop import (
    SYSTEM_PROMPT,
    USER_INSTRUCTION,
    LLMStopController,
    Parsed,
    build_messages,
    judge_prefixes,
    parse_decision,
    parse_decision_tolerant,
)
from raypipe.stoprag.targets import Round
from raypipe.testing.fakes import FakeEngine, replies

# Each case as stop_decider.py l.49-77 decides it: the first line (after the output is stripped) that starts
# with "Decision:" (any case) and whose rest contains STOP (checked first) or CONTINUE decides; otherwise
# STOP without CONTINUE anywhere is stop, any CONTINUE is continue, neither is continue (the default).
REFERENCE_CASES = [
    ("Analysis: all known.\nDecision: <STOP>", Parsed("stop", "decision_line")),  # l.52-58
    ("Analysis: x\nDecision: <CONTINUE>", Parsed("continue", "decision_line")),  # l.59-62
    ("Decision: <STOP> or <CONTINUE>", Parsed("stop", "decision_line")),  # l.55: STOP is checked first
    ("Decision: Stop searching; no need to continue", Parsed("stop", "decision_line")),  # l.55
    ("decision:continue", Parsed("continue", "decision_line")),  # l.53: line.upper(), no space needed
    ("  Decision: <STOP>  ", Parsed("stop", "decision_line")),  # l.52: the output is stripped first
    ("Decision: not sure yet\nDecision: <STOP>", Parsed("stop", "decision_line")),  # a line naming neither is passed
    ("Decision: <CONTINUE>\nDecision: <STOP>", Parsed("continue", "decision_line")),  # the first deciding line wins
    ("DECISION: nonstop", Parsed("stop", "decision_line")),  # l.55: a substring test
    ("Stop searching; no need to continue", Parsed("continue", "text")),  # l.65-72: both named, no decision line
    ("stop", Parsed("stop", "text")),  # l.65: a bare stop
    ("We should stop here, I think.", Parsed("stop", "text")),
    ("<STOPPED>", Parsed("stop", "text")),
    ("continue", Parsed("continue", "text")),  # l.69
    ("**Decision:** <STOP>", Parsed("stop", "text")),  # markdown is not a decision line there (l.53)
    ("Analysis: x\n  Decision: <STOP>", Parsed("stop", "text")),  # an indented line is not either
    ("Decision : <STOP>\nI could also continue", Parsed("continue", "text")),  # "Decision :" is not "Decision:"
    ("I could <STOP> or <CONTINUE>.", Parsed("continue", "text")),
    ("", Parsed("continue", "default_neither")),  # l.73-77
    ("no idea", Parsed("continue", "default_neither")),
]


@pytest.mark.parametrize("text,expected", REFERENCE_CASES)
def test_reference_parser_decides_as_stop_decider_py(text, expected):
    """stop_decider.py l.49-77 (``extract_decision``), case by case."""
    assert parse_decision(text) == expected


def test_reference_parser_default_only_when_neither_is_named():
    """stop_decider.py l.73-77: the default applies to an output naming neither; both named is continue (l.69)."""
    assert parse_decision("no idea", default="stop") == Parsed("stop", "default_neither")
    assert parse_decision("<STOP><CONTINUE>", default="stop") == Parsed("continue", "text")


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Analysis: all known.\nDecision: <STOP>", Parsed("stop", "decision_line")),
        ("analysis: fine\n  decision :  < stop >", Parsed("stop", "decision_line")),
        ("**Decision:** STOP", Parsed("stop", "decision_line")),
        ("Decision: continue searching", Parsed("continue", "decision_line")),
        ("<Stop>", Parsed("stop", "token")),
        ("  <CONTINUE>\n", Parsed("continue", "token")),
        ("Decision: stop or continue?\n<STOP>", Parsed("stop", "token")),
        ("Decision: <CONTINUE>\nDecision: <STOP>", Parsed("continue", "decision_line")),
        ("I could <STOP> or <CONTINUE>.", Parsed("continue", "default_both")),
        ("We should stop here, I think.", Parsed("continue", "default_neither")),
        ("", Parsed("continue", "default_neither")),
        ("<STOPPED>", Parsed("continue", "default_neither")),
    ],
)
def test_tolerant_parser_option(text, expected):
    assert parse_decision_tolerant(text) == expected


def test_tolerant_default_is_configurable():
    assert parse_decision_tolerant("no idea", default="stop") == Parsed("stop", "default_neither")
    assert parse_decision_tolerant("<STOP><CONTINUE>", default="stop") == Parsed("stop", "default_both")


def test_system_prompt_is_the_reference_text():
    """prompts.py l.87-312 (STOP_DECISION_SYSTEM_PROMPT) and l.315 (STOP_DECISION_USER_PROMPT), verbatim: the
    digest is the reference string's at commit e2da463; it has seven worked examples over three questions."""
    assert (
        hashlib.sha256(SYSTEM_PROMPT.encode()).hexdigest()
        == "01bc6d25f6f4277521e740854d04ce4602a94fd45c9035bb183f37e9d8b9eebe"
    )
    assert SYSTEM_PROMPT.startswith("\nGiven an original question and a series of follow-up questions each paired")
    assert (
        "Format your response as:\nAnalysis: [Step-by-step reasoning about information completeness]\nDecision: "
        "<STOP> or <CONTINUE>\n" in SYSTEM_PROMPT
    )
    assert SYSTEM_PROMPT.count("## Input\nMain Question: ") == 7 and SYSTEM_PROMPT.count("## Output\nAnalysis: ") == 7
    assert SYSTEM_PROMPT.count("Decision: <STOP>\n") == 3 and SYSTEM_PROMPT.count("Decision: <CONTINUE>\n") == 4
    assert USER_INSTRUCTION == (
        "Based on the information provided, give a short analysis of whether the original question "
        "can be answered. Then, decide whether to stop or continue gathering information"
    )


ROUNDS = [
    Round(
        "who directed X", (("d1", "X (film)", "X is a film   by Ann Lee."), ("d2", "Other", "unused")), "r", "Ann Lee"
    ),
    Round(
        "where was Ann Lee born",
        (("d1", "X (film)", "X is a film   by Ann Lee."), ("d3", "Ann Lee", "Born in Oslo.")),
        "r",
        "Oslo",
    ),
]


def test_user_message_is_the_reference_trace():
    """prompts.py l.318-330 (``gen_stop_decision_prompt``) over the trace of pipeline_sep.py l.83-94: per round
    the follow-up query, its one selected document (l.77-83: the best one not seen before) and the answer."""
    system, user = build_messages("Where was the director of X born", ROUNDS)
    assert system == {"role": "system", "content": SYSTEM_PROMPT}
    assert user["content"] == (
        "Main question: Where was the director of X born\n\n"
        "Follow up: who directed X\nDocument: X (film): X is a film by Ann Lee.\nIntermediate answer: Ann Lee\n"
        "Follow up: where was Ann Lee born\nDocument: Ann Lee: Born in Oslo.\nIntermediate answer: Oslo\n\n"
        + USER_INSTRUCTION
    )
    _, cut = build_messages("Q", ROUNDS[:1], doc_chars=6)  # the option: documents cut to a few characters
    assert "Document: X (film): X is a\n" in cut["content"]


def _history(n):
    rows = [{"iteration": 0, "query": None, "doc_ids": [], "doc_titles": [], "doc_texts": [], "probe_answer": "a0"}]
    for i in range(1, n + 1):
        rows.append(
            {
                "iteration": i,
                "query": f"q{i}",
                "doc_ids": [f"d{i}"],
                "doc_titles": [f"T{i}"],
                "doc_texts": [f"text {i}"],
                "probe_answer": f"a{i}",
                "reasoning": "",
            }
        )
    return rows


def test_controller_online():
    engine = FakeEngine(replies(["Decision: <CONTINUE>", "Analysis: ok\nDecision: <STOP>", EngineError("boom")]))
    ctl = LLMStopController(engine, max_tokens=50)
    assert not asyncio.run(ctl.decide("Q", _history(0))).stop  # before any retrieval: no call
    assert engine.requests == []
    assert not asyncio.run(ctl.decide("Q", _history(1))).stop
    decision = asyncio.run(ctl.decide("Q", _history(2)))
    assert decision.stop and decision.answer_iteration is None and decision.reason == "llm_stop:decision_line"
    assert "Follow up: q2" in engine.requests[-1].prompt and "Intermediate answer: a1" in engine.requests[-1].prompt
    assert not asyncio.run(ctl.decide("Q", _history(3))).stop  # an engine error is the default verdict


def test_judge_prefixes_keys_results():
    engine = FakeEngine(replies(["<STOP>", "<CONTINUE>"]))
    ctl = LLMStopController(engine)
    items = [("a", 1, "Q", ROUNDS[:1]), ("a", 2, "Q", ROUNDS)]
    out = asyncio.run(judge_prefixes(ctl, items, concurrency=1))
    assert out["a"][1][0].verdict == "stop" and out["a"][2][0].verdict == "continue"


def test_enforced_format_is_parseable():
    import re

    from raypipe.stoprag.llm_stop import DECISION_REGEX

    engine = FakeEngine(replies(["Analysis: enough.\nDecision: <STOP>"]))
    ctl = LLMStopController(engine, enforce=True)
    assert asyncio.run(ctl.decide("Q", _history(1))).stop and [r.regex for r in engine.requests] == [DECISION_REGEX]
    for verdict in ("STOP", "CONTINUE"):
        text = f"Analysis: some reasoning, with commas.\nDecision: <{verdict}>"
        assert re.fullmatch(DECISION_REGEX, text)
        assert parse_decision(text) == Parsed(verdict.lower(), "decision_line")
        assert parse_decision_tolerant(text) == Parsed(verdict.lower(), "decision_line")


def test_controller_parser_choice():
    out = "We should stop here."
    engine = FakeEngine(replies([out, out]))
    assert asyncio.run(LLMStopController(engine).decide("Q", _history(1))).stop  # reference: "STOP" in text
    assert not asyncio.run(LLMStopController(engine, parser="tolerant").decide("Q", _history(1))).stop
    with pytest.raises(ValueError, match="unknown LLM-Stop parser"):
        LLMStopController(FakeEngine(replies([])), parser="strict")
    assert LLMStopController(FakeEngine(replies([]))).regex is None  # the faithful default: free text
