"""Stop-RAG rewards: one answer generator for every state, the terminal one included.

Reference: chosolbee/MHQA-SetVerify ``Training/preprocessing/compute_metrics.py`` l.68-100 (``--repeat-size``
answers per state, their mean F1; ``--use-docs-only``) and ``pipeline/answer_generator/prompts.py`` l.336-429.
"""

import asyncio
import hashlib

import pandas as pd
import pytest

from raypipe.core.config import StopRagConfig, load_config
from raypipe.core.rundir import RunDir
from raypipe.core.schema import conform
from raypipe.llm.base import EngineError
from raypipe.stopping.caps import cap, natural
from raypipe.stopping.replay import Trajectory, load_trajectories, replay
from raypipe.stoprag.episodes import load_histories, state_rewards
from raypipe.stoprag.rewards import (
    FINAL_ANSWER_DOCS_PROMPT,
    FINAL_ANSWER_USER_PROMPT,
    StateScores,
    answer_messages,
    generator_rewards,
    rescore,
    state_documents,
)
from raypipe.stoprag.targets import Round
from raypipe.testing.fakes import FakeEngine, replies
from tests.helpers.runs import write_stoprag_run


def test_answer_prompt_is_the_reference_docs_only_prompt():
    """prompts.py l.336-383 and l.385 verbatim (digest of the reference string at commit e2da463); the user
    message as gen_final_answer_docs_only_prompt (l.417-429) over compute_metrics.py l.72-74's lines."""
    assert (
        hashlib.sha256(FINAL_ANSWER_DOCS_PROMPT.encode()).hexdigest()
        == "32d21faa991643b2f6e5f1dd3b5f45ffa1133088f151efada5711ab196f4d592"
    )
    assert FINAL_ANSWER_USER_PROMPT.startswith("Now, please provide the final answer to the main question.")
    system, user = answer_messages(" Who? ", ["A: x", "B: y"])
    assert system == {"role": "system", "content": FINAL_ANSWER_DOCS_PROMPT}
    assert user["content"] == "Main question: Who?\n\nDocument: A: x\nDocument: B: y\n\n" + FINAL_ANSWER_USER_PROMPT


def test_state_documents_are_the_deduplicated_history():
    """extract_partial_traces.py l.40-50: the history up to the state, each document once."""
    a, b = ("a", "A", "x  1"), ("b", "B", "y")
    assert state_documents([Round("q", (a, b)), Round("q", (a,)), Round("q", (b, a))]) == ["A: x 1", "B: y"]


def test_generator_rewards_are_the_mean_over_samples():
    """compute_metrics.py l.93-94: the mean F1 (and EM) of ``repeat_size`` answers per state; a failed answer
    scores 0. "The Paris Region" is half right in F1 and not exact."""
    engine = FakeEngine(replies(["Paris", "Lyon", "The Paris Region", EngineError("down")]))
    cfg = StopRagConfig(reward_source="generator", reward_samples=2, reward_temperature=0.7)
    states = {
        ("q1", 0): ("Capital of France?", []),
        ("q1", 1): ("Capital of France?", ["France: Paris is its capital."]),
    }
    golden = {"q1": ["Paris"]}
    scores, rows = asyncio.run(generator_rewards(engine, states, golden, cfg, "hotpotqa", concurrency=1))
    assert scores == {"q1": StateScores(f1={0: 0.5, 1: pytest.approx(1 / 3)}, em={0: 0.5, 1: 0.0})}
    answers = [(r["f1"], r["em"]) for r in rows]
    assert answers == [(1.0, 1.0), (0.0, 0.0), (pytest.approx(2 / 3), 0.0), (0.0, 0.0)]
    assert "Document: France: Paris is its capital." in engine.requests[2].prompt


def test_probe_rewards_take_no_samples():
    with pytest.raises(ValueError, match="need reward_source=generator"):
        StopRagConfig(reward_samples=8)


def test_rescore_scores_the_natural_ending_like_every_state():
    """The terminal state's scores replace the agent's own final answer's, F1 and EM alike, so one generator
    scores all."""
    t = Trajectory(
        "q", "d", (0.0, 0.5, 0.5), (1, 1, 1), final_f1=1.0, total_tokens=3, probe_em=(0.0, 0.0, 0.0), final_em=1.0
    )
    again = rescore(t, StateScores({0: 0.2, 1: 1.0, 2: 0.3}, {0: 0.0, 1: 1.0, 2: 0.0}))
    assert again.probe_f1 == (0.2, 1.0, 0.3) and again.final_f1 == 0.3 and again.iteration_tokens == t.iteration_tokens
    assert again.probe_em == (0.0, 1.0, 0.0) and again.final_em == 0.0
    with pytest.raises(ValueError, match=r"no reward for iterations \[1, 2\]"):
        rescore(t, StateScores({0: 0.2}, {0: 0.0}))
    with pytest.raises(ValueError, match=r"no reward for iterations \[2\]"):
        rescore(t, StateScores({0: 0.2, 1: 0.4, 2: 0.3}, {0: 0.0, 1: 0.0}))


def test_stage_rewards_from_probes_and_from_the_generator(tmp_path):
    run = write_stoprag_run(tmp_path / "run", n_questions=6, max_iterations=3)
    trajectories, _ = load_trajectories(run)
    config = load_config()
    questions, histories = load_histories(run, config, {t.qid for t in trajectories})
    scores, note = state_rewards(run, config, questions, histories, lambda _: FakeEngine(replies([])), tmp_path)
    assert all(
        scores[t.qid] == StateScores(dict(enumerate(t.probe_f1)), dict(enumerate(t.probe_em))) for t in trajectories
    )
    assert "probed answer" in note and config.engine.model in note
    gen = config.model_copy(
        update={"stoprag": config.stoprag.model_copy(update={"reward_source": "generator", "reward_samples": 3})}
    )
    n_states = sum(len(rows) for rows in histories.values())
    engine = FakeEngine(replies(["something"] * (3 * n_states)))
    scores, note = state_rewards(run, gen, questions, histories, lambda _: engine, tmp_path)
    assert len(engine.requests) == 3 * n_states and "mean F1 of 3" in note
    assert sum(len(s.f1) for s in scores.values()) == sum(len(s.em) for s in scores.values()) == n_states
    assert len(pd.read_parquet(tmp_path / "rewards.parquet")) == 3 * n_states


def _exact_final_wrong_probes(path) -> RunDir:
    """A run whose every final answer is exact while every probed answer is wrong."""
    run = write_stoprag_run(path, n_questions=6, max_iterations=3)
    trajectories = run.read("trajectories").to_pylist()
    iterations = run.read("iterations").to_pylist()
    for t in trajectories:
        t.update(final_answer=t["golden_answers"][0], final_f1=1.0)
    for row in iterations:
        row.update(probe_answer="something else", probe_f1=0.0)
    for name, rows in (("trajectories", trajectories), ("iterations", iterations)):
        for part in run.table_dir(name).glob("*.parquet"):
            part.unlink()
        run.write_part(name, conform(rows, name), "part-0")
    return run


@pytest.mark.parametrize("source", ["probe", "generator"])
def test_em_and_f1_of_the_comparison_score_one_answer(tmp_path, source):
    """Issue 41: natural stopping returns the terminal state's answer under the reward source; its EM was the
    agent's own final answer's (exact here) while its F1 was the wrong probe's (or generator's), so each
    question replayed as f1=0.0 em=1.0 for one answer."""
    run = _exact_final_wrong_probes(tmp_path / "run")
    recorded, _ = load_trajectories(run)
    assert all(t.final_em == 1.0 and t.final_f1 == 1.0 for t in recorded)  # the agent's own final answer
    config = load_config()
    config = config.model_copy(update={"stoprag": config.stoprag.model_copy(update={"reward_source": source})})
    questions, histories = load_histories(run, config, {t.qid for t in recorded})
    n_states = sum(len(rows) for rows in histories.values())
    engine = FakeEngine(replies(["something else"] * n_states))
    scores, _ = state_rewards(run, config, questions, histories, lambda _: engine, tmp_path)
    rescored = [rescore(t, scores[t.qid]) for t in recorded]
    for outcome in replay(rescored, natural) + replay(rescored, cap(1)):
        assert (outcome.f1, outcome.em) == (0.0, 0.0), outcome
        assert (outcome.natural_f1, outcome.natural_em) == (0.0, 0.0), outcome
