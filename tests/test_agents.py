"""Protocols: golden prompts, observations (both formats), probe prompts, action parsing, enforcement."""

import re

import pytest

from raypipe.agents import R1Searcher, SearchR1, build_loop, build_protocol
from raypipe.agents.protocol import ANSWER, INVALID, SEARCH, Action
from raypipe.core.config import AgentConfig, load_config
from raypipe.testing.fakes import FakeEngine, FakeRetriever, hit

SEARCH_R1_USER = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get new "
    "information. After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query "
    "</search> and it will return the top searched results between <information> and </information>. You can search "
    "as many times as your want. If you find no further external knowledge needed, you can directly provide the "
    "answer inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: Who wrote Hamlet?\n"
)

R1_V1 = (
    "The User asks a question, and the Assistant solves it.\n"
    "The Assistant first thinks about the reasoning process in the mind and then provides the User with the final "
    "answer.\n"
    "The output format of reasoning process and final answer are enclosed within <think> </think> and <answer> "
    '</answer> tags, respectively, i.e., "<think> reasoning process here </think>\n\n<answer> final answer here '
    '</answer>".\n'
    "During the reasoning process, the Assistant will break down the original question into sub-questions and address "
    "them step by step.\n"
    "For each sub-question, **the Assistant can perform searching** for uncertain knowledge using the format: "
    '"<|begin_of_query|> keyword1\tkeyword2\t... <|end_of_query|>".\n'
    '**The query must consist of straightforward and essential keywords separated by "\t"**. Furthermore, **the query '
    "must involve only a single triple to address a sub-question**.\n"
    "Then, the search system will provide the Assistant with relevant information with the format of "
    '"<|begin_of_documents|> ...search results... <|end_of_documents|>".\n\n'
    "User:Who wrote Hamlet\nAssistant: <think>"
)

HITS = [hit("d1", "Hamlet", "A tragedy by Shakespeare."), hit("d2", "Shakespeare", "Shakespeare was a poet.")]
ENGINE = FakeEngine(lambda r: "")


def test_search_r1_prompt_is_the_published_one_through_the_chat_template():
    prompt = SearchR1().prompt("  Who wrote Hamlet ", ENGINE.apply_chat_template)
    assert prompt == f"<|user|>{SEARCH_R1_USER}<|assistant|>\n"
    assert SearchR1().prompt("Who wrote Hamlet?", ENGINE.apply_chat_template) == prompt  # '?' not doubled


def test_r1_searcher_prompts_are_raw_and_versioned():
    assert R1Searcher(prompt_version="v1").prompt("Who wrote Hamlet", ENGINE.apply_chat_template) == R1_V1
    v3 = R1Searcher(prompt_version="v3").prompt("Is it?", ENGINE.apply_chat_template)
    assert v3.startswith("The User asks a **Judgment question**, and the Assistant solves it. The Assistant first")
    assert v3.endswith("The final answer **must be yes or no**.\n\nUser:Is it?\nAssistant: <think>")
    for version in ("v0", "v2"):
        text = R1Searcher(prompt_version=version).prompt("Q", ENGINE.apply_chat_template)
        assert text.endswith('<|end_of_documents|>".\n\nUser:Q\nAssistant: <think>')
    with pytest.raises(ValueError, match="prompt version"):
        R1Searcher(prompt_version="v9")


def test_search_r1_observations_in_both_formats():
    assert SearchR1("original").observation(HITS) == (
        '\n\n<information>Doc 1(Title: "Hamlet") A tragedy by Shakespeare.\n'
        'Doc 2(Title: "Shakespeare") Shakespeare was a poet.</information>\n\n'
    )
    # pyterrier-rag removes the title from the start of the text
    assert SearchR1("pyterrier").observation(HITS) == (
        '\n\n<information>Doc 1(Title: "Hamlet") A tragedy by Shakespeare.\n'
        'Doc 2(Title: "Shakespeare") was a poet.</information>\n\n'
    )
    assert SearchR1("original").observation([]) == "\n\n<information></information>\n\n"


def test_r1_searcher_observation():
    """pyterrier-rag 0.3.0 ``frameworks/agentic/_r1searcher.py`` ``format_docs`` (lines 102-107):
    ``f"({idx}){doc.text}\\n"``, the text as its corpus reader split it from the title (no title prepended)."""
    assert R1Searcher("pyterrier").observation(HITS) == (
        "\n\n<|begin_of_documents|>\n(1)A tragedy by Shakespeare.\n(2)Shakespeare was a poet.\n<|end_of_documents|>\n\n"
    )
    assert R1Searcher("original").observation(HITS) == (
        "\n\n<|begin_of_documents|>\n(1)Hamlet A tragedy by Shakespeare.\n"
        "(2)Shakespeare was a poet.\n<|end_of_documents|>\n\n"
    )
    assert R1Searcher("original").observation([]) == "\n\n<|begin_of_documents|>\nNone<|end_of_documents|>\n\n"


@pytest.mark.parametrize(
    "output, fmt, expected",
    [
        ("<think> a </think>\n<answer> x", "pyterrier", "C\n\n<think> a </think>\n<answer>"),
        ("<think> a </think>\n<search> q </search>", "pyterrier", "C\n\n<think> a </think>\n\n<answer>"),
        ("no tags at all", "pyterrier", "C\n\n<answer>"),
        ("<think> a </think><think> b </think>", "pyterrier", "C\n\n<think> a </think>\n\n<answer>"),
        ("<think> a </think>\n<search> q </search>", "original", "C<think> a </think>\n\n<answer>"),
        ("", "original", "C\n\n<answer>"),
    ],
)
def test_search_r1_probe_prompts(output, fmt, expected):
    assert SearchR1(fmt).probe_prompt("C", output) == expected


@pytest.mark.parametrize(
    "output, fmt, expected",
    [
        (" a b  <|begin_of_query|> q <|end_of_query|>", "pyterrier", "C\n\n a b</think>\n\n<answer>"),
        (" reason </think>\n\n<answer> x", "pyterrier", "C\n\n reason </think>\n\n<answer>"),
        ("", "pyterrier", "C\n\n</think>\n\n<answer>"),
        ("a <|begin_of_query|> q", "original", "Ca</think>\n\n<answer>"),
    ],
)
def test_r1_searcher_probe_prompts(output, fmt, expected):
    assert R1Searcher(fmt).probe_prompt("C", output) == expected


@pytest.mark.parametrize(
    "output, expected",
    [
        ("<think> x </think>\n<search> first </search>", Action(SEARCH, "first")),
        ("<search> a <search> last one </search>", Action(SEARCH, "last one")),  # after the LAST <search>
        ("<think>x</think><search> no close", Action(SEARCH, "no close")),  # pyterrier: open tag is enough
        ("<search>   </search>", Action(INVALID)),  # empty query
        ("<think> x </think>\n<answer> Paris </answer>", Action(ANSWER, "Paris")),
        ("<search> q </search> <answer> a </answer>", Action(ANSWER, "a")),  # pyterrier checks the answer first
        ("<answer> open only", Action(ANSWER, "open only")),
        ("<think> just thinking </think>", Action(INVALID)),
        ("", Action(INVALID)),
    ],
)
def test_search_r1_action_parsing_pyterrier(output, expected):
    assert SearchR1("pyterrier").parse_action(output) == expected


@pytest.mark.parametrize(
    "output, expected",
    [
        ("<think>x</think><search> no close", Action(INVALID)),  # the reference regex needs the closing tag
        ("<search> q </search> <answer> a </answer>", Action(SEARCH, "q")),  # first complete action
        ("<answer> a </answer>", Action(ANSWER, "a")),
    ],
)
def test_search_r1_action_parsing_original(output, expected):
    assert SearchR1("original").parse_action(output) == expected


def test_r1_searcher_query_cleaning_and_answers():
    p = R1Searcher()
    assert p.parse_action(' x <|begin_of_query|> "Hamlet"\tauthor ... <|end_of_query|>') == Action(
        SEARCH, "Hamlet author"
    )
    assert p.parse_action("x </think>\n\n<answer> Shakespeare </answer>") == Action(ANSWER, "Shakespeare")
    assert p.parse_action("just text") == Action(INVALID)


@pytest.mark.parametrize(
    "output, expected",
    [
        ("a <|begin_of_query|> first <|end_of_query|> <|begin_of_query|> second", "first"),  # the FIRST span
        ("<|begin_of_query|> Hamlet.'.. author <|end_of_query|>", "Hamlet author"),  # ' removed before ...
        ("<|begin_of_query|> open\t\tonly", "open only"),  # no closing tag: to the end
        ('<|begin_of_query|> "" <|end_of_query|>', None),  # nothing left after cleaning
        ("<|begin_of_query|>   <|end_of_query|>", None),
    ],
)
def test_r1_searcher_pyterrier_query_extraction(output, expected):
    """pyterrier-rag 0.3.0 ``frameworks/agentic/_base.py`` ``extract_search_query`` (lines 202-223):
    ``output.find`` of the start tag (the first span), strip, then ``"``, ``'``, tab, ``...`` replaced in
    that order, strip, whitespace collapsed; an empty query is no search ("No answer, no search")."""
    action = R1Searcher("pyterrier").parse_action(output)
    assert action == (Action(SEARCH, expected) if expected else Action(INVALID))


@pytest.mark.parametrize(
    "output, expected",
    [
        ('a <|begin_of_query|> x <|begin_of_query|> "Ham"\tlet... <|end_of_query|>', Action(SEARCH, " Ham let ")),
        ("<|begin_of_query|> no close", Action(INVALID)),  # did not stop at <|end_of_query|>
        ("r </think>\n\n<answer> a <answer> b </answer>", Action(ANSWER, " b ")),  # after the LAST <answer>
        ("r </think>\n\n<answer> cut off", Action(INVALID)),  # did not stop at </answer>
        ("<|begin_of_query|>'...'<|end_of_query|>", Action(INVALID)),  # empty after the replacements
    ],
)
def test_r1_searcher_original_actions(output, expected):
    """R1-Searcher ``evaluation/eval_search_loacl.py`` (lines 215-260): an answer needs ``stop_reason ==
    "</answer>"`` and is ``split("<answer>")[-1]``; a search needs ``stop_reason == "<|end_of_query|>"``, the
    LAST query span with ``"``, ``'``, tab and ``...`` replaced and no strip; anything else stops."""
    assert R1Searcher("original").parse_action(output) == expected


@pytest.mark.parametrize(
    "output, expected",
    [
        ("<search> a <search> b </search>", Action(SEARCH, "a <search> b")),  # the first match, not the last tag
        ("<think> x </think><search> q </search> <answer> a </answer>", Action(SEARCH, "q")),
        ("<answer> a </answer> <search> q </search>", Action(ANSWER, "a")),  # the earliest match
        ("<answer> x </search> y </answer>", Action(INVALID)),  # cut after the first </search>: no match left
        ("<search>  </search>", Action(SEARCH, "")),  # an empty query is still a search there
    ],
)
def test_search_r1_original_actions(output, expected):
    """Search-R1 ``search_r1/llm_agent/generation.py``: ``_postprocess_responses`` (lines 54-75) cuts the
    output after its first ``</search>`` (else ``</answer>``); ``postprocess_predictions`` (lines 407-436)
    takes the first ``<(search|answer)>(.*?)</\\1>`` match, stripped."""
    assert SearchR1("original").parse_action(output) == expected


def test_stop_strings_and_restoring_them():
    assert SearchR1().stop == ("</search>", "</answer>")
    assert R1Searcher().stop == ("<|im_end|>", "<|endoftext|>", "<|end_of_query|>", "</answer>")
    p = SearchR1()
    assert p.restore_stop("<search> q ", "</search>") == "<search> q </search>"
    assert p.restore_stop("abc", None) == "abc"
    assert R1Searcher().restore_stop("abc", "<|im_end|>") == "abc"  # end-of-text markers are not restored
    assert p.close_action("<search> q", Action(SEARCH, "q")) == "</search>"
    assert p.close_action("<search> q </search>", Action(SEARCH, "q")) == ""


def test_joiner_and_correction_by_format():
    assert SearchR1("pyterrier").joiner == "\n\n" and SearchR1("original").joiner == ""
    assert SearchR1("pyterrier").correction() is None
    assert SearchR1("original").correction().startswith("\nMy previous action is invalid. If I want to search,")
    assert R1Searcher("original").correction() is None
    assert R1Searcher("original").clean_output("  a  ") == "a"
    assert R1Searcher("pyterrier").clean_output("  a  ") == "  a  "


def test_probe_answer_parsing():
    p = SearchR1()
    assert p.parse_probe(" Paris ") == "Paris"
    assert p.parse_probe("<answer> Lyon") == "Lyon"
    assert p.parse_probe("") is None


def test_enforcement_regexes_match_valid_turns_and_force_a_first_search():
    free_agent, first_agent = AgentConfig(enforcement="free"), AgentConfig(enforcement="first_search")
    p = SearchR1()
    free = p.enforcement_regex(free_agent, 0)
    assert free == (
        r"<think> ?[^\s<>][^<>]{0,398}</think>\n(<search> ?[^\s<>][^<>\n]{0,98}</search>|"
        r"<answer> ?[^\s<>][^<>\n]{0,58}</answer>)"
    )  # Search-R1's turn at the default bounds (agent.enforce_*_chars)
    first = p.enforcement_regex(first_agent, 0)
    assert re.fullmatch(first, "<think> x </think>\n<search> who </search>")
    assert not re.fullmatch(first, "<think> x </think>\n<answer> y </answer>")
    assert p.enforcement_regex(first_agent, 1) == free
    assert p.enforcement_regex(AgentConfig(), 0) is None
    # whatever the regex lets through parses as the action it encodes, closing tag cut by the stop string or not
    for text, stop in (
        ("<think> x </think>\n<search> who ", "</search>"),
        ("<think> x </think>\n<search> who </search>", None),
    ):
        assert p.parse_action(p.restore_stop(text, stop)) == Action(SEARCH, "who")
    r1 = R1Searcher()
    r1_first = r1.enforcement_regex(first_agent, 0)
    assert re.fullmatch(r1_first, " I should look. <|begin_of_query|> Hamlet author<|end_of_query|>")
    r1_free = r1.enforcement_regex(free_agent, 0)
    assert re.fullmatch(r1_free, " known. </think>\n\n<answer> yes </answer>")
    assert r1.enforcement_regexes(first_agent) == [r1_first, r1_free]


def test_enforcement_bounds_come_from_the_agent_section():
    agent = AgentConfig(enforcement="free", enforce_think_chars=10, enforce_query_chars=5, enforce_answer_chars=3)
    assert SearchR1().enforcement_regex(agent, 0) == (
        r"<think> ?[^\s<>][^<>]{0,10}</think>\n(<search> ?[^\s<>][^<>\n]{0,5}</search>|"
        r"<answer> ?[^\s<>][^<>\n]{0,3}</answer>)"
    )


def test_turn_plan_reads_the_resolved_turn_limit():
    config = load_config("embedded", ["agent.protocol=r1_searcher", "agent.max_turns=null"])
    assert build_protocol(config.agent).turn_plan(config.agent) == (10, 10)  # R1-Searcher's default under pyterrier
    config.agent.max_turns = 2
    assert build_protocol(config.agent).turn_plan(config.agent) == (2, 2)


def test_build_loop_reads_the_run_config():
    config = load_config("embedded", ["retrieval.top_k=5", "retrieval.deep_k=2", "seed=3"])
    loop = build_loop(config, ENGINE, FakeRetriever())
    assert (loop.top_k, loop.deep_k, loop.seed) == (5, 5, 3)
    assert loop.agent is config.agent and isinstance(loop.protocol, SearchR1)


def test_build_protocol_from_config():
    config = load_config(
        "embedded", ["agent.protocol=r1_searcher", "agent.prompt_version=v2", "agent.observation_format=original"]
    )
    p = build_protocol(config.agent)
    assert isinstance(p, R1Searcher) and p.prompt_version == "v2" and p.observation_format == "original"
    with pytest.raises(ValueError, match="observation format"):
        SearchR1("search_r1")


@pytest.mark.parametrize(
    "preset, temperature, new_tokens",
    [("searchr1-7b-gpu", 0.7, 1024), ("r1searcher-7b-gpu", 0.0, 512)],
)
def test_gpu_presets_are_the_seed_setup(preset, temperature, new_tokens):
    """DanielTian97/agentic_rag_predictions ``probing/run_probing.py`` (``build_agent`` top_k=3 for both
    agents) and ``probing/agents.py`` (``from_hf``: Search-R1 T=0.7 sampled, 1024 new tokens; R1-Searcher
    greedy, 512; the probes share the backend's max_new_tokens); pyterrier-rag 0.3.0 ``_searchr1.py`` /
    ``_r1searcher.py`` ``max_turn=10``; no final answer at the turn limit (``_base.py``)."""
    config = load_config(preset)
    agent = config.agent
    assert config.retrieval.top_k == 3 and agent.max_turns == 10
    assert (agent.temperature, agent.max_new_tokens, agent.probe_max_tokens) == (temperature, new_tokens, new_tokens)
    assert agent.observation_format == "pyterrier" and agent.at_limit == "none" and agent.enforcement == "none"


@pytest.mark.parametrize("preset", ["embedded", "r1searcher"])
def test_cpu_presets_mark_every_agent_deviation_from_the_seed(preset):
    from raypipe.core.config import PRESET_DIR

    gpu = load_config("searchr1-7b-gpu" if preset == "embedded" else "r1searcher-7b-gpu").agent.model_dump()
    lines = (PRESET_DIR / f"{preset}.yaml").read_text().splitlines()
    config = load_config(preset)
    for key, value in config.agent.model_dump().items():
        if value != gpu[key]:
            line = next(line for line in lines if line.strip().startswith(f"{key}:"))
            assert "seed:" in line, f"{preset}: agent.{key}={value!r} differs from the seed's {gpu[key]!r} unmarked"
    assert config.retrieval.top_k == 3
