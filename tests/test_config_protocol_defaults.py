"""The agent protocol's defaults (turn limit, documents read) are filled in once, when the run config is built."""

import re
from pathlib import Path

import pytest
import yaml

from raypipe.core.config import AgentConfig, RetrievalConfig, RunConfig, dump_config, load_config

RAYPIPE = Path(__file__).resolve().parents[1] / "raypipe"


@pytest.mark.parametrize(
    "protocol, observation_format, max_turns, top_k",
    [
        ("search_r1", "original", 4, 3),  # Search-R1's evaluate.sh max_turns=4, its server's --topk 3
        ("search_r1", "pyterrier", 10, 3),  # pyterrier-rag 0.3.0 max_turn=10
        ("r1_searcher", "original", 10, 5),  # R1-Searcher's eval: 10 rounds, top 5
        ("r1_searcher", "pyterrier", 10, 5),
    ],
)
def test_each_protocol_default_is_filled_in(protocol, observation_format, max_turns, top_k):
    sets = [f"agent.protocol={protocol}", f"agent.observation_format={observation_format}"]
    config = load_config("embedded", [*sets, "agent.max_turns=null", "retrieval.top_k=null"])
    assert (config.agent.max_turns, config.retrieval.top_k) == (max_turns, top_k)
    built = RunConfig.model_validate({"agent": {"protocol": protocol, "observation_format": observation_format}})
    assert (built.agent.max_turns, built.retrieval.top_k) == (max_turns, top_k)  # keys absent: the same
    agent = AgentConfig(protocol=protocol, observation_format=observation_format)
    assert agent.max_turns == max_turns  # a section built alone resolves its own turn limit
    from_sections = RunConfig(agent=agent)  # a built agent section: its protocol gives the top_k
    assert from_sections.retrieval.top_k == top_k


def test_explicit_values_win():
    config = load_config("embedded", ["agent.protocol=r1_searcher", "agent.max_turns=2", "retrieval.top_k=7"])
    assert (config.agent.max_turns, config.retrieval.top_k) == (2, 7)
    assert load_config("embedded").agent.max_turns == 4  # the preset's own value, not the protocol's 10
    sections = RunConfig(agent=AgentConfig(max_turns=3), retrieval=RetrievalConfig(top_k=9))
    assert (sections.agent.max_turns, sections.retrieval.top_k) == (3, 9)


def test_a_saved_config_loads_with_the_same_numbers(tmp_path):
    """A run's config.yaml as written before (resolved numbers) or by hand with nulls loads to the same numbers."""
    saved = load_config("embedded", ["agent.protocol=r1_searcher", "agent.max_turns=null", "retrieval.top_k=null"])
    path = tmp_path / "config.yaml"
    dump_config(saved, path)
    tree = yaml.safe_load(path.read_text())
    assert (tree["agent"]["max_turns"], tree["retrieval"]["top_k"]) == (10, 5)  # written as numbers
    assert load_config(path) == saved
    tree["agent"]["max_turns"] = tree["retrieval"]["top_k"] = None  # an older file's nulls
    path.write_text(yaml.safe_dump(tree))
    assert load_config(path) == saved


def test_a_bad_section_is_reported_not_crashed_on():
    with pytest.raises(ValueError, match="agent\n.*valid dictionary"):
        RunConfig.model_validate({"agent": 3})


def test_one_place_computes_the_protocol_defaults():
    """Only the config's agent and run modules read PROTOCOL_DEFAULTS (the two validators); no consumer falls back
    to a default of its own."""
    fallbacks = re.compile(r"visible_docs|turn_limit\(|default_top_k|DEFAULT_TOPK|max_turns_by_format")
    assert [str(p) for p in RAYPIPE.rglob("*.py") if fallbacks.search(p.read_text())] == []
    readers = sorted(
        str(path.relative_to(RAYPIPE)) for path in RAYPIPE.rglob("*.py") if "PROTOCOL_DEFAULTS.get(" in path.read_text()
    )
    assert readers == ["core/config/agent.py", "core/config/run.py"]
